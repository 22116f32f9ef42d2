/* tests/fuzz/fuzz_conn.c — fuzz target: client connections through the
 * daemon's real connection path.
 *
 * fuzz_request calls the request path itself, one frame at a time, with
 * no worker threads and no disk tier, so it never reaches what happens
 * around a request: frames held behind a parked one, worker jobs answered
 * later through a ticket (service/peer.h: ticket_start, ticket_deliver), requests
 * parked on spill reads, replies queued when a client does not read, and
 * a connection closed while any of that is in flight (a use-after-free
 * there went unseen: tests/integration/test_pipeline.c). This target runs
 * one in-process daemon, a struct server from server_init as kvpalaced
 * runs it: a temporary state and cache directory (under $TMPDIR, else
 * /dev/shm, else /tmp),
 * a 2 MiB host tier of 1 MiB pools and 4 MiB spill files (so pages spill
 * and are read back), worker threads, the io_uring disk backend (or the
 * threads one, FUZZ_CONN_THREADS), admission limits of 3 client
 * connections. The fuzzer is its event-loop thread: it turns the loop
 * itself, never blocking longer than FUZZ_CONN_WAIT_MS at a time.
 *
 * The input is byte 0 (FUZZ_CONN_FRESH, FUZZ_CONN_THREADS), then a
 * sequence of actions (fuzz.h): open connection k (a socketpair of
 * SOCK_SEQPACKET, the daemon's socket type, whose server end goes to
 * conn_start on the client or admin side), send a datagram on k (any
 * bytes: one frame or many; optionally with a descriptor passed), read
 * k's replies, turn the loop a few times without waiting, wait until no
 * worker job or disk I/O is in flight, close k's end, shut its writing
 * side, send an empty datagram, send the last datagram again (pipelining
 * a request is one byte away). After the last action every reply waiting
 * is read, every client end closed, and the loop turns until the daemon
 * holds no connection and no job or I/O is in flight.
 *
 * Aborts (a finding) when cache_check fails after a wait or at the end of
 * an input; when a reply is over the message cap, truncated, or a frame
 * of it does not decode or lacks a required field; when the daemon does
 * not settle (connections, jobs or I/O still there) within
 * FUZZ_CONN_SETTLE_NS, the one time bound (half the daemon's own
 * PEER_MAX_PARK_NS); when descriptors are left open once the server is
 * torn down (server_fini, before a rebuild); and on anything the
 * sanitizers or the daemon's own assertions catch.
 *
 * The daemon outlives an input; it is rebuilt (directories emptied) every
 * FUZZ_CONN_RESET_EVERY inputs and before an input with FUZZ_CONN_FRESH
 * (every seed has it, so each corpus file replays alone, ids from 1).
 * Replays are as deterministic as the daemon allows: what the loop does in
 * a STEP depends on what the worker threads and the disk have finished by
 * then, but nothing that counts as a finding depends on timing, and a
 * WAIT (or the end of the input) always lets everything finish.
 * FUZZ_CONN_VERBOSE=1 prints each action and each reply to stderr.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "clock.h"
#include "config.h"
#include "conn.h"
#include "frame.h"
#include "fuzz.h"
#include "gpu.h"
#include "log.h"
#include "server.h"

#define FUZZ_CONN_RESET_EVERY 256u
/* A wait of the loop for one completion, in milliseconds, and how long
 * the daemon gets to settle. A request waits for disk I/O at most
 * PEER_MAX_PARK_NS (10 s, then it takes a miss); this daemon's I/O is a
 * few MiB on a tmpfs, done in milliseconds, so half of that is already a
 * hang or a livelock (one was: a match reading the same pages back for
 * 10 s, crash-match-reread-livelock). The one time bound here; libFuzzer's
 * -timeout (tests/fuzz/run: 20 s) is above it. */
#define FUZZ_CONN_WAIT_MS   10
#define FUZZ_CONN_SETTLE_NS (PEER_MAX_PARK_NS / 2)
/* Under valgrind, which runs one thread at a time 20-50 times slower, a
 * replay that settles in 0.1 s natively took 1 to 6 s on an idle 2-core
 * machine and over 5 s beside the other tests (CI, stop 30): the bound
 * scales by this much there, still far below meson's timeout. */
#define FUZZ_CONN_VALGRIND_SLOWDOWN 20u

/* Loop turns a send gets for the daemon to make room before the datagram
 * is dropped (a daemon that stopped reading a client that floods it). */
#define FUZZ_CONN_SEND_TRIES 8u
#define FUZZ_CONN_ARGS	     24

static struct {
	int ready;   /* the process set up (directories, buffers) */
	int live;    /* the server is initialised */
	int threads; /* its io-backend is threads */
	int verbose;
	unsigned long inputs;
	char dir[256]; /* the temporary directory */
	char state_dir[300], cache_dir[300];
	char args[FUZZ_CONN_ARGS][340];
	char *argv[FUZZ_CONN_ARGS + 1];
	int argc;
	struct config cfg;
	struct server srv;
	int client[FUZZ_CONN_SLOTS]; /* client ends, -1: none */
	int devnull;
	int base_fds;	     /* open before the server came up */
	unsigned char *rbuf; /* max_message_bytes + 1 */
	void *check_buf;
	struct frame_arena check_arena;
} st = {.client = {-1, -1, -1, -1}, .devnull = -1, .base_fds = -1};

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz_conn: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	va_list ap;

	if (!st.verbose)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "  ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

static void arg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void arg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(st.args[st.argc], sizeof(st.args[0]), fmt, ap);
	va_end(ap);
	st.argv[st.argc] = st.args[st.argc];
	st.argc++;
}

/* The command line of the daemon: hermetic (no configuration file, every
 * path in the temporary directory), small, and the same for ConfigReload,
 * so a reload changes nothing. */
static void build_args(int threads)
{
	st.argc = 0;
	arg("kvpalaced");
	arg("--config=/dev/null");
	arg("--socket=%s/client.sock", st.dir);
	arg("--admin-socket=%s/admin.sock", st.dir);
	arg("--state-dir=%s", st.state_dir);
	arg("--cache-dir=%s", st.cache_dir);
	arg("--host-tier-size=2M");
	arg("--host-pool-size=1M");
	arg("--disk-pool-size=4M");
	arg("--disk-tier-size=16M");
	arg("--disk-reserve=0");
	arg("--io-backend=%s", threads ? "threads" : "io_uring");
	arg("--gpu-pool-size=0");
	arg("--max-pools-per-tenant=4");
	arg("--max-sessions-per-pool=64");
	arg("--max-leases-per-client=64");
	arg("--max-session-tokens=65536");
	arg("--max-connections=3");
	arg("--max-connections-per-user=3");
	arg("--max-requests-in-flight=32");
	arg("--log-level=crit");
	st.argv[st.argc] = NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)type;
	if (ftw->level > 0)
		remove(path);
	return 0;
}

/* Empties dir (keeps dir itself). */
static void empty_dir(const char *dir)
{
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_dirs(void)
{
	if ((mkdir(st.state_dir, 0750) < 0 && errno != EEXIST) ||
	    (mkdir(st.cache_dir, 0750) < 0 && errno != EEXIST))
		die("cannot create %s: %s", st.dir, strerror(errno));
}

/* ---- turning the loop ------------------------------------------------------ */

/* One turn of the event loop, as loop_run_while makes it, but waiting for
 * a completion at most FUZZ_CONN_WAIT_MS (wait) or not at all. Returns
 * the completions handled. */
static unsigned int turn(int wait)
{
	struct io_uring *ring = &st.srv.loop.ring;
	struct io_uring_cqe *cqe;
	unsigned int head, n = 0;
	int ret;

	if (wait) {
		struct __kernel_timespec ts = {.tv_nsec = FUZZ_CONN_WAIT_MS * 1000000L};

		ret = io_uring_submit_and_wait_timeout(ring, &cqe, 1, &ts, NULL);
#ifdef RUNNING_ON_VALGRIND
		/* As daemon/io/loop.c: valgrind runs one thread at a time, and
		 * the worker threads need a turn. */
		if (RUNNING_ON_VALGRIND)
			sched_yield();
#endif
	} else {
		ret = io_uring_submit_and_get_events(ring);
	}
	if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
		die("io_uring: %s", strerror(-ret));
	io_uring_for_each_cqe (ring, head, cqe) {
		struct loop_op *op = io_uring_cqe_get_data(cqe);

		n++;
		if (op)
			op->cb(op, cqe->res, cqe->flags);
	}
	io_uring_cq_advance(ring, n);
	return n;
}

static int work_in_flight(void)
{
	return st.srv.worker.n_pending || (st.srv.have_aio && aio_in_flight(&st.srv.aio)) ||
	       gpu_busy(st.srv.cache.gpu);
}

static unsigned int n_conns(void)
{
	unsigned int n = 0;

	for (struct list *it = st.srv.conns.next; it != &st.srv.conns; it = it->next)
		n++;
	return n;
}

static void check_cache(const char *after)
{
	if (cache_check(&st.srv.cache) == -EUCLEAN)
		die("cache_check failed after %s", after);
}

/* Turns the loop until no worker job or disk I/O is in flight (and, with
 * no_conns, no connection is left) and nothing more completes at once. */
static uint64_t settle_bound_ns(void)
{
#ifdef RUNNING_ON_VALGRIND
	if (RUNNING_ON_VALGRIND)
		return FUZZ_CONN_SETTLE_NS * FUZZ_CONN_VALGRIND_SLOWDOWN;
#endif
	return FUZZ_CONN_SETTLE_NS;
}

static void settle(int no_conns, const char *after)
{
	uint64_t start = clock_now_ns();

	while (work_in_flight() || (no_conns && n_conns() > 0) || turn(0) > 0) {
		if (clock_now_ns() - start > settle_bound_ns())
			die("hang after %s: the daemon did not settle in %llu s: %u worker "
			    "jobs, %llu disk I/Os in flight (%llu done), %u connections open",
			    after, settle_bound_ns() / 1000000000ull, st.srv.worker.n_pending,
			    st.srv.have_aio ? (unsigned long long)aio_in_flight(&st.srv.aio) : 0ull,
			    st.srv.have_aio ? (unsigned long long)st.srv.aio.ctr.completed : 0ull,
			    n_conns());
		turn(1);
	}
	check_cache(after);
}

/* ---- the daemon ------------------------------------------------------------ */

static void close_client(unsigned int k)
{
	if (st.client[k] >= 0)
		close(st.client[k]);
	st.client[k] = -1;
}

/* Descriptors of the kinds the daemon opens (sockets, eventfds and
 * rings, memfds, files in the temporary directory) open in this process;
 * with show, each is printed. Not the fuzzer's own (its corpus files). */
static int count_fds(int show)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char path[300], to[400];
		ssize_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		len = readlink(path, to, sizeof(to) - 1);
		if (len < 0)
			continue;
		to[len] = '\0';
		if (strncmp(to, "socket:", 7) && strncmp(to, "anon_inode:", 11) &&
		    strncmp(to, "/memfd:", 7) && strncmp(to, st.dir, strlen(st.dir)))
			continue;
		if (show)
			fprintf(stderr, "fuzz_conn: fd %s -> %s\n", de->d_name, to);
		n++;
	}
	closedir(d);
	return n;
}

static void server_down(void)
{
	int n;

	if (!st.live)
		return;
	for (unsigned int k = 0; k < FUZZ_CONN_SLOTS; k++)
		close_client(k);
	settle(1, "closing every connection");
	server_fini(&st.srv);
	st.live = 0;
	/* Whatever the clients passed or were passed, the daemon's own
	 * descriptors, its pools' and their spill files': all closed. */
	n = count_fds(0);
	if (st.base_fds >= 0 && n >= 0 && n != st.base_fds && count_fds(1) >= 0)
		die("%d descriptors open after server_fini, %d before server_init", n, st.base_fds);
}

static void server_up(int threads)
{
	enum config_action act;
	char err[256];
	int ret;

	empty_dir(st.dir);
	make_dirs();
	st.base_fds = count_fds(0);
	build_args(threads);
	config_defaults(&st.cfg);
	if (config_parse_args(&st.cfg, st.argc, st.argv, &act, err, sizeof(err)) < 0)
		die("configuration: %s", err);
	log_set_level(st.cfg.log_level);
	ret = server_init(&st.srv, &st.cfg, st.argc, st.argv);
	if (ret < 0)
		die("server_init: %s", strerror(-ret));
	if (!st.srv.have_aio)
		die("no disk I/O backend (%s)", threads ? "threads" : "io_uring");
	st.live = 1;
	st.threads = threads;
}

static void teardown(void)
{
	if (!st.ready)
		return;
	server_down();
	empty_dir(st.dir);
	rmdir(st.dir);
	free(st.rbuf);
	free(st.check_buf);
	if (st.devnull >= 0)
		close(st.devnull);
	st.ready = 0;
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	size_t arena = frame_arena_bytes(FRAME_MAX_MAX_BYTES);

	/* A tmpfs where there is one: checkpoints fsync their file and
	 * directory, which on a disk took two thirds of an input's time. */
	if (!tmp || !*tmp)
		tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(st.dir, sizeof(st.dir), "%s/kvp-fuzz-conn-XXXXXX", tmp);
	if (!mkdtemp(st.dir))
		die("mkdtemp %s: %s", st.dir, strerror(errno));
	snprintf(st.state_dir, sizeof(st.state_dir), "%s/state", st.dir);
	snprintf(st.cache_dir, sizeof(st.cache_dir), "%s/cache", st.dir);
	st.rbuf = malloc(FRAME_MAX_MAX_BYTES + 1);
	st.check_buf = malloc(arena);
	st.devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (!st.rbuf || !st.check_buf || st.devnull < 0)
		die("setup: %s", strerror(errno));
	frame_arena_init(&st.check_arena, st.check_buf, arena);
	st.verbose = getenv("FUZZ_CONN_VERBOSE") && *getenv("FUZZ_CONN_VERBOSE") == '1';
	st.ready = 1;
	atexit(teardown);
}

/* ---- the client side --------------------------------------------------------- */

static void do_open(unsigned int k, int admin)
{
	int sv[2], ret;

	close_client(k);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	st.client[k] = sv[0];
	/* Refused (admission), answered and closed there: the client end
	 * reads the refusal. */
	ret = conn_start(&st.srv, sv[1], admin);
	say("open %u%s: %d", k, admin ? " (admin)" : "", ret);
	if (ret < 0 && ret != -EDQUOT)
		die("conn_start: %s", strerror(-ret));
}

/* One received reply datagram: within the cap, every frame decodes. */
static void check_reply(const unsigned char *buf, size_t n)
{
	uint32_t max_bytes = st.cfg.max_message_bytes;
	const uint8_t *payload;
	size_t off = 0, len;
	int ret;

	if (n > max_bytes)
		die("a reply of %zu bytes, over the %u-byte cap", n, max_bytes);
	while ((ret = frame_next(buf, n, &off, max_bytes, &payload, &len)) > 0) {
		Kvpalace__V1__Response *resp;

		frame_arena_reset(&st.check_arena);
		resp = frame_unpack_response(&st.check_arena, payload, len);
		if (!resp)
			die("a reply frame of %zu bytes does not decode", len);
		if (!protobuf_c_message_check(&resp->base))
			die("reply %llu lacks a required field", (unsigned long long)resp->id);
		say("reply %llu: status %d op %d%s%s", (unsigned long long)resp->id,
		    (int)resp->status, (int)resp->op_case, resp->error ? ": " : "",
		    resp->error ? resp->error : "");
	}
	if (ret < 0)
		die("a reply datagram of %zu bytes is not a sequence of frames (%s)", n,
		    strerror(-ret));
}

static void do_read(unsigned int k)
{
	int fd = st.client[k];

	if (fd < 0)
		return;
	for (;;) {
		unsigned char cbuf[FRAME_CMSG_BYTES];
		struct iovec iov = {.iov_base = st.rbuf, .iov_len = FRAME_MAX_MAX_BYTES + 1};
		struct msghdr msg = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = cbuf,
			.msg_controllen = sizeof(cbuf),
		};
		ssize_t got = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		int passed;

		if (got < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNRESET)
				die("recvmsg: %s", strerror(errno));
			return;
		}
		passed = frame_cmsg_fd(&msg);
		if (passed >= 0)
			close(passed); /* a pool's arena, say */
		if (got == 0)
			return; /* the daemon closed it */
		if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
			die("a reply truncated (over %u bytes, or its control data)",
			    FRAME_MAX_MAX_BYTES);
		check_reply(st.rbuf, (size_t)got);
	}
}

static void do_send(unsigned int k, const uint8_t *buf, size_t n, int with_fd)
{
	unsigned char cbuf[FRAME_CMSG_BYTES];
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

	if (st.client[k] < 0)
		return;
	if (with_fd)
		frame_cmsg_put_fd(&msg, cbuf, st.devnull);
	for (unsigned int i = 0; i < FUZZ_CONN_SEND_TRIES; i++) {
		ssize_t sent = sendmsg(st.client[k], &msg, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (sent >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
			say("send %u: %zu bytes%s: %s", k, n, with_fd ? " and an fd" : "",
			    sent >= 0 ? "sent" : strerror(errno));
			return;
		}
		turn(0);
	}
	say("send %u: %zu bytes: no room, dropped", k, n);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Runs the actions of data[0..size). */
static void run_actions(const uint8_t *data, size_t size)
{
	const uint8_t *last = NULL; /* the last datagram sent, in data */
	size_t at = 0, last_len = 0;

	while (at < size) {
		unsigned int b = data[at++];
		unsigned int op = (b >> 4) % FUZZ_CONN_N_OPS, mod = b & 0xfu, k = mod & 3u;
		size_t n;

		switch (op) {
		case FUZZ_CONN_OPEN:
			do_open(k, !!(mod & FUZZ_CONN_ADMIN));
			break;
		case FUZZ_CONN_SEND:
			if (size - at < 2)
				return;
			n = get16(data + at);
			at += 2;
			if (n > size - at)
				n = size - at;
			do_send(k, data + at, n, !!(mod & FUZZ_CONN_WITH_FD));
			last = data + at;
			last_len = n;
			at += n;
			break;
		case FUZZ_CONN_SEND_AGAIN:
			if (last)
				do_send(k, last, last_len, 0);
			break;
		case FUZZ_CONN_READ:
			do_read(k);
			break;
		case FUZZ_CONN_STEP:
			n = at < size ? data[at++] : 0;
			for (size_t i = 0; i <= n; i++)
				if (turn(0) == 0)
					break;
			break;
		case FUZZ_CONN_WAIT:
			say("wait");
			settle(0, "a wait");
			break;
		case FUZZ_CONN_CLOSE:
			say("close %u", k);
			close_client(k);
			break;
		case FUZZ_CONN_SHUT_WR:
			say("shutdown %u", k);
			if (st.client[k] >= 0)
				shutdown(st.client[k], SHUT_WR);
			break;
		case FUZZ_CONN_SEND_EOF:
			do_send(k, (const uint8_t *)"", 0, 0);
			break;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned int flags;
	int threads;

	if (!st.ready)
		setup();
	if (size < 1)
		return 0;
	flags = data[0];
	threads = !!(flags & FUZZ_CONN_THREADS);
	if (st.live && ((flags & FUZZ_CONN_FRESH) || threads != st.threads ||
			++st.inputs % FUZZ_CONN_RESET_EVERY == 0))
		server_down();
	if (!st.live)
		server_up(threads);
	run_actions(data + 1, size - 1);
	/* What every reply said, then the clients go, whatever is in flight. */
	for (unsigned int k = 0; k < FUZZ_CONN_SLOTS; k++) {
		do_read(k);
		close_client(k);
	}
	settle(1, "the end of the input");
	say("disk I/O so far: %llu requests, %llu bytes read, %llu written",
	    (unsigned long long)st.srv.aio.ctr.submitted,
	    (unsigned long long)st.srv.aio.ctr.bytes_read,
	    (unsigned long long)st.srv.aio.ctr.bytes_written);
	return 0;
}
