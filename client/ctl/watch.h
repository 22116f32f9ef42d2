/* client/ctl/watch.h — `--watch [SECONDS]` and `--count N`: a view
 * command run again and again on one connection.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_WATCH_H
#define KVPCTL_WATCH_H

#include "common.h"

#define WATCH_DEFAULT_MS 2000

/* Runs run(c, a) every a->watch_ms until a->count snapshots were shown
 * (0: no end) or SIGINT/SIGTERM comes. On a terminal (and without
 * --json) each snapshot replaces the last, under a line naming the
 * command, interval and time; otherwise snapshots are appended, text
 * ones each after a "--- TIME ---" line (none with --no-headers: rows
 * only), JSON ones one object a line (JSON Lines). Returns 0 when stopped by count or signal (Ctrl-C is how
 * a watch ends), else the first failing run's exit status. */
int watch_run(kvp_client *c, const struct args *a, int (*run)(kvp_client *, const struct args *));

#endif
