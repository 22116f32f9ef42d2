/* daemon/server/server.h — the daemon's top level: listeners, connections,
 * signals and the periodic timer, all on one event loop.
 *
 * The server owns the loop, the metadata cache and the one unpacking arena
 * every connection shares (messages are handled one at a time, so one
 * arena suffices). Event-loop thread only.
 */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <linux/time_types.h>
#include <stdint.h>

#include "aio.h"
#include "cache.h"
#include "config.h"
#include "confview.h"
#include "conn.h"
#include "frame.h"
#include "list.h"
#include "loop.h"
#include "notify.h"
#include "remote.h"
#include "worker.h"

struct listener {
	struct server *srv;
	struct loop_op op;
	int fd;
	int admin;
	int armed;     /* an accept is in flight */
	int activated; /* passed by systemd: never unlinked */
	char path[CONFIG_SOCKET_PATH_MAX];
};

struct server {
	struct config *cfg; /* SIGHUP updates what may change live */
	int argc;	    /* the command line, for reloads */
	char **argv;
	/* server_reload_config, handed to the connections (conn.c) for the
	 * admin socket's ConfigReload: they are below this file. */
	int (*reload)(struct server *s, const char *who, struct confview_reload *ret, char *err,
		      size_t errlen);
	struct loop loop;
	struct worker worker; /* blocking work: checkpoints, pread/pwrite I/O */
	struct aio aio;	      /* disk I/O of the spill files */
	int have_aio;
	struct remote remote; /* the remote tier (remote-tier), when have_remote */
	int have_remote;
	struct cache cache;
	struct frame_arena arena;
	void *arena_buf;
	struct conn_rx rx;
	struct listener client, admin;
	struct list conns;	   /* struct conn.link */
	struct list subscribers;   /* struct conn.ev_link: KV event subscribers */
	uint64_t events_pushed;	   /* events.next_seq when they were last all pushed */
	struct conn_census census; /* for admission (conn.h) */
	uint64_t next_conn_id;

	int sigfd;
	struct loop_op sig_op;
	unsigned char siginfo[128];

	struct loop_op timer_op;
	uint64_t ticks;

	struct notify notify;
	struct loop_op watchdog_op; /* armed only under a watchdog */
	uint64_t watchdog_ns;
	/* The drain after a stop: when it last asked the service manager for
	 * more time, and the disk requests completed by then. */
	uint64_t stop_extended_ns;
	uint64_t stop_completed;
};

/* Takes the sockets systemd passed (named "client" and "admin"), creates
 * the others itself (removing stale ones), sets up the loop and starts
 * accepting. Returns 0 or a negative errno (logged). */
int server_init(struct server *s, struct config *cfg, int argc, char **argv);
/* Tells the service manager READY=1 and serves until SIGINT or SIGTERM
 * (STOPPING=1); SIGHUP reloads (RELOADING=1, then READY=1). Returns 0 or a
 * negative errno. */
int server_run(struct server *s);
/* Re-reads the configuration as at start (file, preset, command line)
 * and applies what may change while serving (config_reload), for SIGHUP
 * and for the admin socket's ConfigReload alike: tells the service
 * manager RELOADING=1 then READY=1, sets the log level, logs the outcome
 * naming who asked (e.g. "SIGHUP"). Returns 0 and, when ret is not NULL,
 * what changed (short of memory, the lists may be incomplete; the reload
 * still took effect); or -EINVAL with the reason in err (errlen bytes) and
 * the running configuration unchanged, or -ENOMEM before anything was
 * read. */
int server_reload_config(struct server *s, const char *who, struct confview_reload *ret, char *err,
			 size_t errlen);
/* Closes every connection, frees the cache and removes the socket files
 * the daemon created (not those systemd passed). */
void server_fini(struct server *s);

#endif
