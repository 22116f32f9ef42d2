/* daemon/server/notify.h — telling the service manager how the daemon is doing
 * (sd_notify): READY=1 once serving, STATUS= summaries, WATCHDOG=1 keep-
 * alives, RELOADING=1 on SIGHUP and STOPPING=1 on shutdown.
 *
 * Without $NOTIFY_SOCKET (not started by systemd) every call is a no-op.
 * Failures to notify are logged once and otherwise ignored: the daemon
 * serves the same with or without a service manager. Event-loop thread
 * only.
 */
#ifndef KVPD_NOTIFY_H
#define KVPD_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"

/* How often the STATUS= line is refreshed. */
#define NOTIFY_STATUS_INTERVAL_NS (5ull * 1000000000ull)

struct notify {
	uint64_t watchdog_usec; /* $WATCHDOG_USEC for us, 0 when no watchdog */
	uint64_t last_status_ns;
	int failed;   /* a send failed: logged once */
	int stopping; /* STOPPING=1 sent: no STATUS= replaces its "stopping" */
};

/* Reads the watchdog setting (sd_watchdog_enabled, which checks
 * $WATCHDOG_PID too). Always succeeds. */
void notify_init(struct notify *n);

/* The interval at which notify_watchdog should be called: half of
 * $WATCHDOG_USEC, in nanoseconds; 0 when there is no watchdog. */
uint64_t notify_watchdog_interval_ns(const struct notify *n);

/* READY=1 together with a STATUS= summary of c. */
void notify_ready(struct notify *n, const struct cache *c);
/* STATUS= summary of c, when NOTIFY_STATUS_INTERVAL_NS passed since the
 * last one (or force is set). */
void notify_status(struct notify *n, const struct cache *c, int force);
/* WATCHDOG=1: the event loop is alive. */
void notify_watchdog(struct notify *n);
/* RELOADING=1 with a STATUS= line saying so. */
void notify_reloading(struct notify *n);
/* STOPPING=1 with a STATUS= line saying so. */
void notify_stopping(struct notify *n);
/* Asks the service manager for usec more before its stop timeout
 * (TimeoutStopSec=) kills the daemon: for a stop that is still making
 * progress writing the host tier to disk. */
void notify_extend_timeout(struct notify *n, uint64_t usec);

/* Writes the one-line summary of c into buf (always NUL-terminated):
 * pools, sessions, open connections, host memory in use and the token
 * hit ratio (matched_tokens / queried_tokens of MatchPrefix). */
void notify_format_status(const struct cache *c, char *buf, size_t size);

#endif
