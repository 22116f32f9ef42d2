/* daemon/server/notify.c — sd_notify messages to the service manager (see
 * notify.h). Type=notify units wait for READY=1; WatchdogSec= units
 * restart the daemon when WATCHDOG=1 stops coming. The watchdog keep-alive
 * is sent from a timer on the event loop, so it proves the loop turns.
 * Event-loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "clock.h"
#include "log.h"
#include "notify.h"

static void send_state(struct notify *n, const char *state)
{
	int ret = sd_notify(0, state);

	if (ret < 0 && !n->failed) {
		n->failed = 1;
		log_warn("cannot notify the service manager: %s", strerror(-ret));
	}
}

void notify_init(struct notify *n)
{
	uint64_t usec = 0;

	memset(n, 0, sizeof(*n));
	if (sd_watchdog_enabled(0, &usec) > 0)
		n->watchdog_usec = usec;
}

uint64_t notify_watchdog_interval_ns(const struct notify *n)
{
	return n->watchdog_usec * 1000ull / 2;
}

void notify_format_status(const struct cache *c, char *buf, size_t size)
{
	/* Of the prompt tokens MatchPrefix asked about, those served from
	 * the cache: what a hit saves, where a count of queries that found
	 * a page at all says little. */
	uint64_t hits = c->ctr.matched_tokens, total = c->ctr.queried_tokens;

	if (total)
		snprintf(buf, size,
			 "%zu pools, %zu sessions, %llu connections, %llu MiB host, "
			 "token hit ratio %.1f%% (%llu/%llu)",
			 c->pools.n, c->sessions.n, (unsigned long long)c->ctr.connections,
			 (unsigned long long)(c->host_bytes >> 20),
			 100.0 * (double)hits / (double)total, (unsigned long long)hits,
			 (unsigned long long)total);
	else
		snprintf(buf, size,
			 "%zu pools, %zu sessions, %llu connections, %llu MiB host, "
			 "token hit ratio n/a",
			 c->pools.n, c->sessions.n, (unsigned long long)c->ctr.connections,
			 (unsigned long long)(c->host_bytes >> 20));
}

static void send_status(struct notify *n, const char *prefix, const struct cache *c)
{
	char msg[320];
	int len;

	/* The drain after a stop still turns the loop, its timer and admin
	 * requests: a summary (or a reload's READY=1) would replace
	 * "stopping" in systemctl status, or tell the manager the daemon is
	 * ready again. */
	if (n->stopping)
		return;
	len = snprintf(msg, sizeof(msg), "%sSTATUS=", prefix);

	notify_format_status(c, msg + len, sizeof(msg) - (size_t)len);
	send_state(n, msg);
	n->last_status_ns = clock_now_ns();
}

void notify_ready(struct notify *n, const struct cache *c)
{
	send_status(n, "READY=1\n", c);
}

void notify_status(struct notify *n, const struct cache *c, int force)
{
	if (!force && clock_now_ns() - n->last_status_ns < NOTIFY_STATUS_INTERVAL_NS)
		return;
	send_status(n, "", c);
}

void notify_watchdog(struct notify *n)
{
	send_state(n, "WATCHDOG=1");
}

void notify_reloading(struct notify *n)
{
	if (n->stopping)
		return;
	send_state(n, "RELOADING=1\nSTATUS=reloading");
}

void notify_stopping(struct notify *n)
{
	n->stopping = 1;
	send_state(n, "STOPPING=1\nSTATUS=stopping");
}

void notify_extend_timeout(struct notify *n, uint64_t usec)
{
	char msg[64];

	snprintf(msg, sizeof(msg), "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
	send_state(n, msg);
}
