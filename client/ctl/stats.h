/* client/ctl/stats.h — kvpalacectl's views of the daemon as a whole:
 * status, ping, stats, pools, metrics and sessions.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_STATS_H
#define KVPCTL_STATS_H

#include "common.h"

/* `ping`: one timed Hello. */
int cmd_ping(kvp_client *c, const struct args *a);

/* `status`, `stats`, `pools` and `metrics` (a->name says which): views of
 * one Stats reply. */
int cmd_stats(kvp_client *c, const struct args *a);

/* `sessions [--pool ID]`: one row per session. */
int cmd_sessions(kvp_client *c, const struct args *a);

#endif
