/* daemon/server/server.c — listeners, signals, timers, service-manager
 * notifications and shutdown (see server.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptop.h"
#include "clock.h"
#include "confview.h"
#include "conn.h"
#include "evpub.h"
#include "faults.h"
#include "guard.h"
#include "list.h"
#include "listen.h"
#include "log.h"
#include "pool.h"
#include "prewarm.h"
#include "server.h"
#include "session.h"

#define SERVER_TICK_S	      1
#define SERVER_RING_ENTRIES   1024
#define SERVER_WORKER_THREADS 2
/* Descriptors the daemon keeps for itself besides connections and pools:
 * the ring, listeners, signalfd, eventfds, stdio, the checkpoint files
 * and directories its workers open, the refusal of a connection. */
#define SERVER_FD_SLACK 64u

/* Takes the hard RLIMIT_NOFILE (systemd's soft 1024 is a select() era
 * default) and leaves the admin socket and the daemon their share of it,
 * so that clients running the daemon out of descriptors cannot lock the
 * administrator out. */
static void fd_limits(struct server *s)
{
	uint64_t reserve = CONN_MAX_ADMIN + SERVER_FD_SLACK;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? 1u << 20 : rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	s->cache.fd_room = rl.rlim_cur > reserve + 1 ? rl.rlim_cur - reserve : 1;
	if (s->cache.fd_room < s->cfg->max_connections)
		log_notice("RLIMIT_NOFILE %llu: at most %llu client connections and pools (%u "
			   "descriptors kept for the admin socket and the daemon)",
			   (unsigned long long)rl.rlim_cur, (unsigned long long)s->cache.fd_room,
			   (unsigned)reserve);
}

static void arm_accept(struct listener *ls)
{
	loop_accept(&ls->srv->loop, &ls->op, ls->fd, SOCK_CLOEXEC);
	ls->armed = 1;
}

static void on_accept(struct loop_op *op, int res, unsigned int flags)
{
	struct listener *ls = container_of(op, struct listener, op);
	struct server *s = ls->srv;

	(void)flags;
	ls->armed = 0;
	if (s->loop.stop) {
		if (res >= 0)
			close(res);
		return;
	}
	if (res < 0) {
		if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
			/* Out of descriptors: the timer re-arms us in a second. */
			log_warn("accept on %s: %s", ls->path, strerror(-res));
			return;
		}
		if (res != -EINTR && res != -ECONNABORTED && res != -EAGAIN)
			log_warn("accept on %s: %s", ls->path, strerror(-res));
	} else {
		/* conn_start admits it or refuses it (connection limits). */
		int ret = conn_start(s, res, ls->admin);

		if (ret < 0 && ret != -EDQUOT)
			log_warn("cannot start a connection: %s", strerror(-ret));
	}
	arm_accept(ls);
}

static void arm_signal_read(struct server *s)
{
	loop_read(&s->loop, &s->sig_op, s->sigfd, s->siginfo, sizeof(struct signalfd_siginfo));
}

static void on_signal(struct loop_op *op, int res, unsigned int flags)
{
	struct server *s = container_of(op, struct server, sig_op);
	struct signalfd_siginfo si;

	(void)flags;
	if (res != (int)sizeof(si)) {
		arm_signal_read(s);
		return;
	}
	loop_kernel_wrote(s->siginfo, sizeof(si));
	memcpy(&si, s->siginfo, sizeof(si));
	if (si.ssi_signo == SIGHUP) {
		char err[256];

		/* Logged there, with the reason when the file is bad. */
		(void)server_reload_config(s, "SIGHUP", NULL, err, sizeof(err));
		arm_signal_read(s);
		return;
	}
	log_notice("signal %s received: shutting down", strsignal((int)si.ssi_signo));
	notify_stopping(&s->notify);
	loop_stop(&s->loop);
}

struct key_list {
	uint32_t *n;
	char (*names)[CONFVIEW_KEY_NAME_MAX];
};

static void add_key(void *arg, const char *key)
{
	struct key_list *l = arg;

	if (*l->n < CONFIG_MAX_KEYS)
		snprintf(l->names[(*l->n)++], CONFVIEW_KEY_NAME_MAX, "%s", key);
}

/* "a, b, c" of n names into buf. */
static void join_keys(char (*names)[CONFVIEW_KEY_NAME_MAX], uint32_t n, char *buf, size_t cap)
{
	size_t at = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < n && at < cap; i++) {
		int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", names[i]);

		if (w < 0)
			break;
		at += (size_t)w;
	}
}

int server_reload_config(struct server *s, const char *who, struct confview_reload *ret, char *err,
			 size_t errlen)
{
	struct confview_reload local;
	struct confview_reload *r = ret ? ret : &local;
	char *before = NULL, *after = NULL, *file = NULL;
	struct key_list changed = {&r->n_changed, r->changed};
	struct key_list restart = {&r->n_restart_needed, r->restart_needed};
	char keys[256], later[256], ignored[256];
	enum config_action act;
	struct config next;
	size_t len;
	int rc;

	memset(r, 0, sizeof(*r));
	notify_reloading(&s->notify);
	rc = confview_text(s->cfg, &before, &len);
	if (rc < 0) {
		snprintf(err, errlen, "out of memory");
		log_err("%s: configuration not reloaded: out of memory", who);
		goto out;
	}
	rc = config_reload(s->cfg, s->argc, s->argv, err, errlen);
	if (rc < 0) {
		log_err("%s: configuration not reloaded, keeping the old one: %s", who, err);
		goto out;
	}
	log_set_level(s->cfg->log_level);
	/* What changed, and what the file asks for that only a restart
	 * applies (the configuration read afresh against the running one).
	 * The reload took effect either way: running short of memory here
	 * only leaves the lists incomplete. */
	if (confview_text(s->cfg, &after, &len) == 0) {
		(void)confview_diff(before, after, 1, add_key, &changed);
		config_defaults(&next);
		if (config_parse_args(&next, s->argc, s->argv, &act, ignored, sizeof(ignored)) ==
			    0 &&
		    confview_text(&next, &file, &len) == 0)
			(void)confview_diff(file, after, 0, add_key, &restart);
	}
	join_keys(r->changed, r->n_changed, keys, sizeof(keys));
	join_keys(r->restart_needed, r->n_restart_needed, later, sizeof(later));
	log_notice("%s: configuration reloaded (log level, watermarks, limits): %s%s%s%s", who,
		   r->n_changed ? "changed " : "nothing changed", keys,
		   r->n_restart_needed ? "; a restart is needed for " : "", later);
out:
	notify_ready(&s->notify, &s->cache);
	free(before);
	free(after);
	free(file);
	return rc;
}

static void arm_timer(struct server *s)
{
	loop_timeout(&s->loop, &s->timer_op, SERVER_TICK_S * 1000000000ull);
}

/* The cache file system's free space, for disk-reserve (tier.c). */
static void disk_refresh(struct server *s)
{
	struct statvfs sv;

	if (!s->cfg->disk_pool_bytes)
		return;
	if (statvfs(s->cfg->cache_dir, &sv) == 0)
		s->cache.disk_avail_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
	else
		s->cache.disk_avail_bytes = UINT64_MAX;
}

static void on_timer(struct loop_op *op, int res, unsigned int flags)
{
	struct server *s = container_of(op, struct server, timer_op);

	(void)res;
	(void)flags;
	if (s->loop.stop)
		return;
	s->ticks++;
	/* Listeners that stopped on descriptor exhaustion try again. */
	if (!s->client.armed)
		arm_accept(&s->client);
	if (!s->admin.armed)
		arm_accept(&s->admin);
	notify_status(&s->notify, &s->cache, 0);
	conn_census_tick(&s->census);
	conn_park_tick(s);
	conn_push_events(s);
	disk_refresh(s);
	/* Free pages cost no memory (issue 14: what one tenant freed, or
	 * had reclaimed for another, must not stay resident). */
	for (struct list *it = s->cache.pool_list.next; it != &s->cache.pool_list; it = it->next) {
		struct pool *p = list_entry(it, struct pool, link);

		pool_release_free(p);
		/* ...but those a writer will take next are ready. */
		pool_warm(&s->cache, p);
		/* Disk pages used last come back while there is room. */
		prewarm_pool(&s->cache, p);
	}
	/* Persistent sessions their clients left behind and forgot. */
	if (s->cfg->session_idle_timeout_s)
		session_expire_idle(&s->cache, clock_now_ns(),
				    s->cfg->session_idle_timeout_s * 1000000000ull);
	if (s->ticks % 60 == 0)
		log_debug("%llu connections, %llu requests, %llu errors",
			  (unsigned long long)s->cache.ctr.connections,
			  (unsigned long long)s->cache.ctr.requests,
			  (unsigned long long)s->cache.ctr.errors);
	arm_timer(s);
}

static void arm_watchdog(struct server *s)
{
	loop_timeout(&s->loop, &s->watchdog_op, s->watchdog_ns);
}

/* WATCHDOG=1 from the event loop itself, so a stuck loop stops it. */
static void on_watchdog(struct loop_op *op, int res, unsigned int flags)
{
	struct server *s = container_of(op, struct server, watchdog_op);

	(void)res;
	(void)flags;
	if (s->loop.stop)
		return;
	notify_watchdog(&s->notify);
	arm_watchdog(s);
}

/* Uses the socket systemd passed (fd ≥ 0), else binds path itself. */
static int open_listener(struct server *s, struct listener *ls, int fd, const char *path,
			 mode_t mode, int admin)
{
	ls->srv = s;
	ls->admin = admin;
	ls->op.cb = on_accept;
	if (fd >= 0) {
		/* For log messages only: the file belongs to systemd. */
		snprintf(ls->path, sizeof(ls->path), "%s socket from systemd",
			 admin ? "admin" : "client");
		ls->fd = fd;
		ls->activated = 1;
		return 0;
	}
	snprintf(ls->path, sizeof(ls->path), "%s", path);
	ls->fd = listen_unix(path, mode);
	if (ls->fd < 0) {
		log_err("cannot listen on %s: %s%s", path, strerror(-ls->fd),
			ls->fd == -EADDRINUSE ? " (is another kvpalaced running?)" : "");
		return ls->fd;
	}
	return 0;
}

/* The event loop on the backend event-loop asks for; with auto, epoll
 * where io_uring is denied, said once, with why: the disk tier's auto
 * then finds no ring and takes the threads (aio_init). */
static int start_loop(struct server *s)
{
	static const char denied[] = " (denied by a seccomp profile, or kernel.io_uring_disabled "
				     "set? event-loop = auto falls back to epoll)";
	int want = s->cfg->event_loop, ret;

	ret = loop_init(&s->loop, SERVER_RING_ENTRIES, (enum loop_want)want);
	if (ret < 0) {
		if (want == LOOP_WANT_EPOLL)
			log_err("cannot set up the epoll event loop: %s", strerror(-ret));
		else
			log_err("cannot set up io_uring: %s%s", strerror(-ret),
				ret == -EPERM || ret == -ENOSYS ? denied : "");
		return ret;
	}
	if (s->loop.uring_err)
		log_warn("io_uring unavailable (%s: %s): using epoll%s",
			 strerror(-s->loop.uring_err),
			 s->loop.uring_err == -EPERM
				 ? "a container's seccomp profile, or kernel.io_uring_disabled?"
				 : "a kernel without io_uring?",
			 s->cfg->io_backend == AIO_URING ? "" : " and the threads disk backend");
	else if (want == LOOP_WANT_EPOLL)
		log_info("event loop: epoll (event-loop = epoll)");
	return 0;
}

/* The remote tier (remote-tier): its credentials read, its slot map asked
 * for once, its threads started. A cluster that does not answer is no
 * error (pages stay local until it does); a configuration it refuses
 * (credentials, nodes) stops the start with the reason. */
static int start_remote(struct server *s)
{
	const struct config *cfg = s->cfg;
	char nodes_buf[CONFIG_REMOTE_MAX], secret[1024], err[256];
	const char *nodes[CONFIG_REMOTE_NODES];
	struct remote_config rc = {0};
	int n = config_remote_nodes(cfg, nodes_buf, nodes, CONFIG_REMOTE_NODES), ret;

	if (n <= 0)
		return n; /* none configured (or refused when the file was read) */
	if (cfg->remote_password_file[0]) {
		ret = config_read_secret(cfg->remote_password_file, secret, sizeof(secret), err,
					 sizeof(err));
		if (ret < 0) {
			log_err("remote tier: %s", err);
			return ret;
		}
		rc.password = secret;
	}
	rc.nodes = nodes;
	rc.n_nodes = (unsigned int)n;
	rc.user = cfg->remote_user[0] ? cfg->remote_user : NULL;
	rc.timeout_ms = cfg->remote_timeout_ms;
	rc.threads = cfg->remote_threads;
	rc.max_inflight_bytes = cfg->remote_max_inflight_bytes;
	/* A page is at most a pool's arena. */
	rc.max_page_bytes = cfg->host_pool_bytes;
	ret = remote_init(&s->remote, &s->loop, &rc);
	explicit_bzero(secret, sizeof(secret));
	if (ret < 0) {
		log_err("remote tier %s: %s", cfg->remote_tier, remote_why(&s->remote));
		remote_fini(&s->remote);
		return ret;
	}
	if (remote_why(&s->remote)[0])
		log_warn("remote tier %s: %s; pages stay local until it answers", cfg->remote_tier,
			 remote_why(&s->remote));
	else
		log_info("remote tier: %s, %u threads, tenants %s", cfg->remote_tier,
			 cfg->remote_threads,
			 cfg->remote_tenants[0] ? cfg->remote_tenants : "none");
	if (!cfg->remote_tenants[0])
		log_warn("remote tier: remote-tenants is empty, so no pool takes part");
	s->have_remote = 1;
	s->cache.remote = &s->remote;
	ret = evpub_start(&s->cache);
	if (ret < 0) {
		log_err("remote-events: %s", strerror(-ret));
		return ret;
	}
	if (cfg->remote_events[0])
		log_info("KV events of remote-tier pools go to the stream %s", cfg->remote_events);
	return 0;
}

int server_init(struct server *s, struct config *cfg, int argc, char **argv)
{
	struct listen_activated act;
	sigset_t mask;
	int ret;

	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->reload = server_reload_config;
	s->argc = argc;
	s->argv = argv;
	s->client.fd = s->admin.fd = s->sigfd = -1;
	list_init(&s->conns);
	list_init(&s->subscribers);
	cache_init(&s->cache, cfg);
	fd_limits(s);
	disk_refresh(s);
	ret = guard_init();
	if (ret < 0) {
		log_err("cannot install the SIGBUS guard: %s", strerror(-ret));
		return ret;
	}
	notify_init(&s->notify);
	s->arena_buf = malloc(frame_arena_bytes(cfg->max_message_bytes));
	if (!s->arena_buf)
		return -ENOMEM;
	frame_arena_init(&s->arena, s->arena_buf, frame_arena_bytes(cfg->max_message_bytes));
	if (conn_rx_init(&s->rx, cfg->max_message_bytes) < 0)
		return -ENOMEM;

	ret = start_loop(s);
	if (ret < 0)
		return ret;
	s->cache.loop = &s->loop;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* A write or fallocate past RLIMIT_FSIZE fails with EFBIG (a spill
	 * file capped, a checkpoint refused) instead of killing the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (s->sigfd < 0) {
		ret = -errno;
		log_err("signalfd: %s", strerror(-ret));
		return ret;
	}
	ret = worker_init(&s->worker, &s->loop, SERVER_WORKER_THREADS);
	if (ret < 0) {
		log_err("cannot start worker threads: %s", strerror(-ret));
		return ret;
	}
	ret = aio_init(&s->aio, &s->loop, &s->worker, (enum aio_mode)cfg->io_backend);
	if (ret < 0) {
		log_err("no disk I/O (%s backend): %s%s; running without a disk tier",
			cfg->io_backend == AIO_URING ? "io_uring" : "auto", strerror(-ret),
			cfg->io_backend == AIO_URING && loop_kind(&s->loop) == LOOP_EPOLL
				? " (the event loop is epoll: io-backend = threads works there)"
				: "");
		ckpt_uring = 0;
	} else {
		s->have_aio = 1;
		s->cache.aio = &s->aio;
		/* Checkpoints use a ring of their own only where disk I/O is
		 * on io_uring here too. */
		ckpt_uring = s->aio.mode == AIO_URING;
		if (cfg->disk_pool_bytes)
			log_info("disk tier: up to %llu MiB per pool in %s, I/O through %s",
				 (unsigned long long)(cfg->disk_pool_bytes >> 20), cfg->cache_dir,
				 aio_mode_name(&s->aio));
	}
	s->cache.worker = &s->worker;
	ret = start_remote(s);
	if (ret < 0)
		return ret;
	/* Before any pool opens (warm-up opens some) and before the sockets
	 * listen: spill files that hold nothing to restart from are junk,
	 * reclaimed. */
	tier_reclaim(&s->cache);
	/* The device tier: decided once, here; any CUDA error means host
	 * and disk tiers only (logged once by gpu_init). */
	ret = gpu_init(&s->cache.gpu, cfg, &s->loop);
	if (ret < 0) {
		log_err("cannot set up the device tier: %s", strerror(-ret));
		return ret;
	}
	/* Tests only: $KVPALACED_FAULTS (kvpalaced(8), TESTING). */
	ret = faults_init(s->have_aio ? &s->aio : NULL);
	if (ret < 0)
		return ret;
	ckptop_init(&s->cache);
	s->sig_op.cb = on_signal;
	s->timer_op.cb = on_timer;
	s->watchdog_op.cb = on_watchdog;

	ret = listen_activated(&act);
	if (ret < 0) {
		log_err("unusable sockets from systemd: %s (expected listening seqpacket Unix "
			"sockets named client and admin)",
			strerror(-ret));
		return ret;
	}
	if (ret > 0)
		log_info("socket activation: client socket %s, admin socket %s",
			 act.client >= 0 ? "passed" : "bound here",
			 act.admin >= 0 ? "passed" : "bound here");
	ret = open_listener(s, &s->client, act.client, cfg->socket_path, cfg->socket_mode, 0);
	if (ret < 0) {
		if (act.admin >= 0)
			close(act.admin);
		return ret;
	}
	ret = open_listener(s, &s->admin, act.admin, cfg->admin_socket_path, cfg->admin_socket_mode,
			    1);
	if (ret < 0)
		return ret;
	arm_accept(&s->client);
	arm_accept(&s->admin);
	arm_signal_read(s);
	arm_timer(s);
	s->watchdog_ns = notify_watchdog_interval_ns(&s->notify);
	if (s->watchdog_ns)
		arm_watchdog(s);
	return 0;
}

static int server_busy(void *arg)
{
	struct server *s = arg;

	return (s->have_aio && aio_in_flight(&s->aio)) || s->worker.n_pending ||
	       gpu_busy(s->cache.gpu) || (s->have_remote && remote_busy(&s->remote)) ||
	       evpub_busy(&s->cache);
}

/* A stop that writes a large host tier to disk takes longer than
 * TimeoutStopSec= (issue 16 saw about 0.5 GB/s): while its writes complete, ask for
 * SERVER_STOP_EXTEND_NS more every SERVER_STOP_EXTEND_NS / 3. A drain
 * that made no progress since the last ask gets no more, so a wedged disk
 * still ends in the manager's timeout. */
#define SERVER_STOP_EXTEND_NS (15ull * 1000000000ull)

static void stop_extend(struct server *s, int first)
{
	uint64_t now = clock_now_ns(), done = s->have_aio ? s->aio.ctr.completed : 0;

	if (!first &&
	    (now - s->stop_extended_ns < SERVER_STOP_EXTEND_NS / 3 || done == s->stop_completed))
		return;
	notify_extend_timeout(&s->notify, SERVER_STOP_EXTEND_NS / 1000);
	s->stop_extended_ns = now;
	s->stop_completed = done;
}

static int server_draining(void *arg)
{
	struct server *s = arg;
	int busy = server_busy(s);

	if (busy)
		stop_extend(s, 0);
	return busy;
}

int server_run(struct server *s)
{
	int ret;

	log_notice("kvpalaced %s serving on %s (admin %s); host tier %llu MiB, pool arenas "
		   "%llu MiB; %s event loop",
		   KVP_VERSION, s->client.path, s->admin.path,
		   (unsigned long long)(s->cfg->host_tier_bytes >> 20),
		   (unsigned long long)(s->cfg->host_pool_bytes >> 20), loop_kind_name(&s->loop));
	/* Cache pre-warming: common openings are matchable before the first
	 * request (and before systemd hears READY=1). */
	ret = ckptop_warmup_dir(&s->cache);
	if (ret > 0)
		log_notice("warm-up: %d checkpoints loaded into the prefix index", ret);
	/* Everything is set up and accepts are armed: connections that
	 * arrive now are served as soon as the loop turns. */
	notify_ready(&s->notify, &s->cache);
	ret = loop_run(&s->loop);
	s->cache.stopping = 1;
	if (ret == 0 && s->have_aio) {
		/* A clean stop keeps the cache: cached pages not on disk yet are
		 * written so the next start finds them (warm restart). */
		uint32_t n = 0;

		for (struct list *it = s->cache.pool_list.next; it != &s->cache.pool_list;
		     it = it->next)
			n += tier_flush(&s->cache, list_entry(it, struct pool, link));
		if (n)
			log_notice("writing %u cached pages to the disk tier before stopping", n);
	}
	if (ret == 0 && server_busy(s)) {
		/* Disk reads and writes in flight target the arenas: let them
		 * finish (requests parked on them are answered too). */
		log_info("finishing disk I/O in flight");
		stop_extend(s, 1);
		ret = loop_run_while(&s->loop, server_draining, s);
	}
	return ret;
}

void server_fini(struct server *s)
{
	struct list *it, *tmp;

	if (s->client.fd >= 0) {
		close(s->client.fd);
		if (!s->client.activated)
			unlink(s->client.path);
	}
	if (s->admin.fd >= 0) {
		close(s->admin.fd);
		if (!s->admin.activated)
			unlink(s->admin.path);
	}
	/* Tear the ring down before freeing connections: their buffers may
	 * still be targets of receives in flight. */
	list_for_each_safe (it, tmp, &s->conns)
		shutdown(list_entry(it, struct conn, link)->fd, SHUT_RDWR);
	if (s->have_aio) {
		s->cache.aio = NULL; /* pools closed after this use no aio */
		aio_fini(&s->aio);
	}
	if (s->have_remote) {
		evpub_stop(&s->cache);
		s->cache.remote = NULL;
		remote_fini(&s->remote); /* the drain left nothing in flight */
	}
	worker_fini(&s->worker);
	faults_fini(s->have_aio ? &s->aio : NULL); /* no checkpoint I/O is left */
	loop_fini(&s->loop);
	while (!list_empty(&s->conns)) {
		struct conn *c = list_entry(s->conns.next, struct conn, link);

		c->receiving = c->sending = 0;
		conn_close(c, 0);
	}
	conn_census_fini(&s->census);
	if (s->sigfd >= 0)
		close(s->sigfd);
	ckptop_fini(&s->cache);
	cache_fini(&s->cache);
	gpu_fini(s->cache.gpu);
	s->cache.gpu = NULL;
	conn_rx_fini(&s->rx);
	free(s->arena_buf);
}
