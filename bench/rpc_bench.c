/* bench/rpc_bench.c — round trips of the control protocol against Redis,
 * interleaved, and the data path.
 *
 * Against a running kvpalaced and a redis-server on a Unix socket (bench/run
 * starts both; this program starts neither). Round trips on a shared
 * machine swing several-fold from one moment to the next, so kvpalace and
 * its Redis reference are never timed in separate windows: they run in the
 * same process, with the same clock, in short bursts (--burst-ms, 50 ms by
 * default) ordered A B B A (ours, Redis, Redis, ours), and each such block
 * gives one ratio, printed as a sample NAME:pair; bench/run reports the
 * median of those ratios and their spread. Figures:
 *
 *  - write: Append of 1 token then Commit of it, against Redis SET of a
 *    value as long as our Append request; read: MatchPrefix of a 64-token
 *    prompt that hits, then Release of its lease, against Redis GET of a
 *    value as long as our MatchPrefix request. Rates count requests (an
 *    Append+Commit cycle is two), so a ratio of 1 is a round trip as fast
 *    as Redis's;
 *  - unpipelined: one client through the real library (libkvpalace), and
 *    one RESP connection, both in this process; ops/s and p50/p99 latency;
 *  - pipelined: several client processes, each keeping `depth` requests in
 *    flight on the raw protocol (proto/frame.h; the library is
 *    synchronous), and each with its own Redis connection pipelined as
 *    redis-benchmark -P does (write `depth` commands, read `depth`
 *    replies); the clients switch between the two at the same instants
 *    (bursts end at fixed times from a common start);
 *  - the client's in-place write bandwidth of page K/V into the shared arena
 *    through kvp_session_kv(), against a plain memcpy of the same bytes
 *    (passes A B B A), then a second process that reads the same bytes back
 *    through a MatchPrefix lease and checks every one (untimed): the data
 *    path is the mapped arena, the daemon copies nothing.
 *
 * Every reply is checked: a failed request, a MatchPrefix that does not hit
 * the whole prompt, a Redis reply other than the one expected (bench/resp.h
 * parses strictly) or a GET value other than the one SET (compared after
 * the clock stops) ends the run with an error. The daemon's Stats counters
 * (appended and committed tokens, match hits) must grow by at least what
 * the clients counted, so every timed op is a request the daemon executed.
 * Set-up between bursts (a new session every SESSION_TOKENS tokens) is not
 * timed.
 *
 * One invocation is one repetition: it prints "sample NAME VALUE" lines on
 * stdout (rates in requests/s, latencies in microseconds, bandwidths in
 * GB/s, ratios ours/Redis). Progress and errors go to stderr; any failure
 * exits 1 (a benchmark that cannot run must not pass silently).
 * Single-threaded; the pipelined part forks one process per client, which
 * report through a shared anonymous mapping.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#define BENCH_PROG "kvp-bench-rpc"
#include "bench_util.h"
#include "kvpalace.h"
#include "resp.h"
#include "status.h"

#define RPC_MODEL "kvp-bench-rpc"
#define BW_MODEL  "kvp-bench-bw"
/* A session is closed and replaced after this many tokens, so a long run
 * never meets the arena size or a per-session limit. */
#define SESSION_TOKENS 4096u
/* The prompt MatchPrefix looks up: four full pages of the rpc layout. */
#define PROMPT_TOKENS 64u
#define PROMPT_BASE   1000000u
/* Requests of one kind a pipelined client sends before switching to the
 * other of its pair (Append then Commit, MatchPrefix then Release). */
#define WRITE_BURST 512u
#define MATCH_BURST 128u
#define MAX_DEPTH   256u
#define MAX_CLIENTS 64u
/* A B B A blocks per figure and repetition, at most. */
#define MAX_BLOCKS 512u
/* Request buffer of one in-flight pipelined request (they are all small). */
#define TX_SLOT_BYTES 4096u
#define BW_BLOCKS     5

/* A tiny page (4 KiB) so that millions of appended tokens fit the arena. */
static const struct kvp_layout rpc_layout = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

/* A Llama-3-8B-like page: 32 layers, 8 KV heads of 128, 16 tokens, f16 =
 * 2 MiB per page. */
static const struct kvp_layout bw_layout = {
	.n_layers = 32,
	.n_kv_heads = 8,
	.head_dim = 128,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

struct opts {
	const char *socket;
	const char *redis;
	double seconds; /* ours' share of one figure; Redis gets as much */
	unsigned burst_ms;
	int cpu; /* unpipelined: the CPU of client and servers; -1 any, -2 none */
	unsigned clients;
	unsigned depth;
	unsigned bw_mib;
	int do_unpipelined;
	int do_pipelined;
	int do_bw;
};

static uint32_t prompt[PROMPT_TOKENS];

/* The Redis values: as long as our Append (SET) and MatchPrefix (GET)
 * requests, so each side moves as many request bytes. */
static uint8_t *set_val, *get_val;
static size_t set_bytes, get_bytes;

/* Dies with the daemon's reason when a library call failed. */
static void check(kvp_client *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s (%d)", what, kvp_strerror(c, r), r);
}

/* ---- latency samples and A B B A blocks ------------------------------------- */

struct lat {
	uint64_t *ns;
	size_t n;
	size_t cap;
};

static void lat_push(struct lat *l, uint64_t v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 65536;
		uint64_t *ns = realloc(l->ns, cap * sizeof(*ns));

		if (!ns)
			die("out of memory");
		l->ns = ns;
		l->cap = cap;
	}
	l->ns[l->n++] = v;
}

/* Percentile p (0..100) in microseconds of sorted samples. */
static double lat_pct_us(const uint64_t *ns, size_t n, double p)
{
	size_t i;

	if (n == 0)
		return 0;
	i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
	return (double)ns[i] / 1000.0;
}

/* Prints NAME_p50 and NAME_p99 of l's samples and frees them. */
static void report_lat(const char *name, struct lat *l)
{
	char key[96];
	double p50, p99;

	qsort(l->ns, l->n, sizeof(*l->ns), cmp_u64);
	p50 = lat_pct_us(l->ns, l->n, 50);
	p99 = lat_pct_us(l->ns, l->n, 99);
	snprintf(key, sizeof(key), "%s_p50", name);
	sample(key, p50);
	snprintf(key, sizeof(key), "%s_p99", name);
	sample(key, p99);
	fprintf(stderr, "  %-24s p50 %7.1f us  p99 %7.1f us  (%zu requests)\n", name, p50, p99,
		l->n);
	free(l->ns);
	*l = (struct lat){0};
}

/* What one side did in one burst (or a sum of bursts): requests of the
 * first and second kind of its pair (Append, Commit; MatchPrefix, Release;
 * Redis has one kind) and the time they took. */
struct tally {
	uint64_t ops[2];
	uint64_t ns[2];
};

static void tally_add(struct tally *t, const struct tally *u)
{
	for (int i = 0; i < 2; i++) {
		t->ops[i] += u->ops[i];
		t->ns[i] += u->ns[i];
	}
}

/* Requests per second, both kinds together (kind -1) or one. */
static double tally_rate(const struct tally *t, int kind)
{
	uint64_t ops = kind < 0 ? t->ops[0] + t->ops[1] : t->ops[kind];
	uint64_t ns = kind < 0 ? t->ns[0] + t->ns[1] : t->ns[kind];

	return ns ? (double)ops * 1e9 / (double)ns : 0;
}

/* Bursts 0 and 3 of a block are ours, 1 and 2 Redis's. */
static int phase_is_ours(unsigned phase)
{
	return phase % 4 == 0 || phase % 4 == 3;
}

static unsigned n_blocks(const struct opts *o)
{
	double b = o->seconds * 1000.0 / (2.0 * o->burst_ms);

	return b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)(b + 0.5);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One figure's blocks: the rates of both sides and their ratio per block.
 * Prints a sample of each per block, and a line on stderr. */
struct pairs {
	const char *name;     /* ours, e.g. rpc.write */
	const char *ref_name; /* Redis's, e.g. redis.c1.set */
	const char *kind_names[2];
	double ratio[MAX_BLOCKS];
	unsigned n;
};

/* One block: ours and Redis's rates (requests/s), and ours per kind. */
static void pairs_add(struct pairs *p, double a, double b, const double kind_rate[2])
{
	char key[96];

	if (!(a > 0) || !(b > 0))
		die("%s: a burst did nothing (ours %.0f/s, Redis %.0f/s)", p->name, a, b);
	if (p->n == MAX_BLOCKS)
		die("%s: too many blocks", p->name);
	p->ratio[p->n++] = a / b;
	sample(p->name, a);
	sample(p->ref_name, b);
	for (int k = 0; k < 2 && kind_rate; k++)
		sample(p->kind_names[k], kind_rate[k]);
	snprintf(key, sizeof(key), "%s:pair", p->name);
	sample(key, a / b);
}

static void pairs_print(struct pairs *p)
{
	double v[MAX_BLOCKS];

	memcpy(v, p->ratio, p->n * sizeof(*v));
	qsort(v, p->n, sizeof(*v), cmp_double);
	fprintf(stderr, "  %-24s %u A B B A blocks: ratio median %.2f, min %.2f, max %.2f\n",
		p->name, p->n, p->n % 2 ? v[p->n / 2] : (v[p->n / 2 - 1] + v[p->n / 2]) / 2, v[0],
		v[p->n - 1]);
}

/* The prompt as libkvpalace sends it: 4-byte little-endian tokens
 * (tokens_le), not varints. */
static void match_tokens(Kvpalace__V1__MatchPrefixRequest *mp)
{
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvp-bench-rpc sends the prompt's tokens as they lie in memory: little-endian only"
#endif
	mp->has_tokens_le = 1;
	mp->tokens_le.data = (uint8_t *)prompt;
	mp->tokens_le.len = sizeof(prompt);
}

/* The Redis values, and the request sizes they copy. */
static void ref_values(void)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest ap = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest mp = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;
	static uint8_t buf[4096];
	uint32_t tok = 4095;
	int n;

	/* ids of the size a run of a few seconds reaches */
	req.id = 1u << 20;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	ap.session_id = 1000;
	ap.tokens = &tok;
	ap.n_tokens = 1;
	n = frame_pack_request(&req, buf, sizeof(buf), FRAME_DEFAULT_MAX_BYTES);
	if (n <= 0)
		die("frame_pack_request (Append): %s", strerror(-n));
	set_bytes = (size_t)n;
	req.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	req.append = NULL;
	req.match_prefix = &mp;
	mp.pool_id = 1;
	match_tokens(&mp);
	n = frame_pack_request(&req, buf, sizeof(buf), FRAME_DEFAULT_MAX_BYTES);
	if (n <= 0)
		die("frame_pack_request (MatchPrefix): %s", strerror(-n));
	get_bytes = (size_t)n;
	set_val = malloc(set_bytes);
	get_val = malloc(get_bytes);
	if (!set_val || !get_val)
		die("out of memory");
	for (size_t i = 0; i < set_bytes; i++)
		set_val[i] = (uint8_t)('a' + i % 26);
	for (size_t i = 0; i < get_bytes; i++)
		get_val[i] = (uint8_t)('A' + (i * 7) % 26);
}

/* Stores the GET value under key (untimed set-up) and checks it reads back. */
static void ref_put_get_value(struct resp *rs, const char *key)
{
	struct resp_cmd set = resp_cmd_set(key, get_val, get_bytes);
	struct resp_cmd get = resp_cmd_get(key);
	uint8_t *got = malloc(get_bytes);

	if (!got)
		die("out of memory");
	resp_send(rs, &set);
	resp_expect_ok(rs, "SET (set-up)");
	resp_send(rs, &get);
	resp_expect_bulk(rs, got, get_bytes, "GET (set-up)");
	resp_expect_drained(rs, "GET (set-up)");
	if (memcmp(got, get_val, get_bytes))
		die("redis GET %s: other bytes than were SET", key);
	free(got);
	free(set.bytes);
	free(get.bytes);
}

/* ---- one client through the library --------------------------------------- */

static kvp_client *lib_connect(const char *path)
{
	uint64_t deadline = now_ns() + 10000000000u;
	kvp_client *c;
	int r;

	for (;;) {
		r = kvp_connect(path, &c);
		if (r == 0)
			return c;
		if ((r != -ENOENT && r != -ECONNREFUSED) || now_ns() > deadline)
			die("kvp_connect %s: %s", path, strerror(-r));
		usleep(20000);
	}
}

static kvp_session *lib_session(kvp_client *c, kvp_pool *p)
{
	kvp_session *s;

	check(c, kvp_session_create(p, &s), "kvp_session_create");
	return s;
}

/* The daemon's own counters of what it executed. */
struct counters {
	uint64_t appended;  /* tokens */
	uint64_t committed; /* tokens */
	uint64_t hits;	    /* MatchPrefix requests that matched */
};

static void counters_get(kvp_client *c, struct counters *ret)
{
	struct kvp_stats *st;

	check(c, kvp_stats(c, &st), "kvp_stats");
	ret->appended = st->appended_tokens;
	ret->committed = st->committed_tokens;
	ret->hits = st->match_hits;
	kvp_stats_free(st);
}

/* Dies unless the daemon's counters grew by at least the ops the client
 * counted: every timed op must be a request the daemon executed. */
static void check_executed(const char *name, const struct counters *a, const struct counters *b,
			   int is_write, const struct tally *ours)
{
	if (is_write && (b->appended - a->appended < ours->ops[0] ||
			 b->committed - a->committed < ours->ops[1]))
		die("%s: the daemon counted %" PRIu64 " appended and %" PRIu64
		    " committed tokens where the clients made %" PRIu64 " and %" PRIu64
		    " requests of 1 token",
		    name, b->appended - a->appended, b->committed - a->committed, ours->ops[0],
		    ours->ops[1]);
	if (!is_write && b->hits - a->hits < ours->ops[0])
		die("%s: the daemon counted %" PRIu64 " hits where the clients made %" PRIu64
		    " matches",
		    name, b->hits - a->hits, ours->ops[0]);
}

/* One unpipelined client of each kind, in this process. */
struct unpip {
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	struct resp rs;
	struct resp_cmd cmd; /* SET or GET */
	uint8_t *got;	     /* a GET's value */
	uint32_t next_tok;   /* tokens differ across sessions: no dedup */
	struct lat lat[2];   /* ours: Append/MatchPrefix, Commit/Release */
	struct lat ref_lat;
};

/* Counts one cycle of two requests, timed t0..t1 (first) and t1..t2. */
static void up_count(struct unpip *u, struct tally *t, uint64_t t0, uint64_t t1, uint64_t t2)
{
	lat_push(&u->lat[0], t1 - t0);
	lat_push(&u->lat[1], t2 - t1);
	t->ns[0] += t1 - t0;
	t->ns[1] += t2 - t1;
	t->ops[0]++;
	t->ops[1]++;
}

/* Append of 1 token then Commit of it, until `end`. */
static void up_write(struct unpip *u, uint64_t end, struct tally *t)
{
	uint64_t t0, t1 = 0, t2;

	while (t1 < end) {
		uint32_t tok = u->next_tok++ & 0xffffffu;
		int r;

		if (kvp_session_tokens(u->s) >= SESSION_TOKENS) {
			check(u->c, kvp_session_close(u->s), "kvp_session_close");
			u->s = lib_session(u->c, u->p);
		}
		t0 = now_ns();
		r = kvp_append(u->s, &tok, 1);
		t1 = now_ns();
		check(u->c, r, "kvp_append");
		r = kvp_commit(u->s, 1);
		t2 = now_ns();
		check(u->c, r, "kvp_commit");
		up_count(u, t, t0, t1, t2);
		t1 = t2;
	}
}

/* MatchPrefix of the committed prompt then Release of its lease. */
static void up_read(struct unpip *u, uint64_t end, struct tally *t)
{
	uint64_t t0, t1 = 0, t2;

	while (t1 < end) {
		kvp_lease *lease;
		uint64_t got;
		int r;

		t0 = now_ns();
		r = kvp_match_prefix(u->p, prompt, PROMPT_TOKENS, &lease);
		t1 = now_ns();
		check(u->c, r, "kvp_match_prefix");
		got = kvp_lease_tokens(lease);
		r = kvp_lease_release(lease);
		t2 = now_ns();
		check(u->c, r, "kvp_lease_release");
		if (got != PROMPT_TOKENS)
			die("kvp_match_prefix matched %" PRIu64 " of %u committed tokens", got,
			    PROMPT_TOKENS);
		up_count(u, t, t0, t1, t2);
		t1 = t2;
	}
}

/* Redis SET (write) or GET (read), one at a time. */
static void up_ref(struct unpip *u, int is_write, uint64_t end, struct tally *t)
{
	uint64_t t0, t1 = 0;

	while (t1 < end) {
		t0 = now_ns();
		resp_send(&u->rs, &u->cmd);
		if (is_write)
			resp_expect_ok(&u->rs, "SET");
		else
			resp_expect_bulk(&u->rs, u->got, get_bytes, "GET");
		t1 = now_ns();
		resp_expect_drained(&u->rs, is_write ? "SET" : "GET");
		if (!is_write && memcmp(u->got, get_val, get_bytes))
			die("redis GET: other bytes than were SET");
		lat_push(&u->ref_lat, t1 - t0);
		t->ns[0] += t1 - t0;
		t->ops[0]++;
	}
}

static void bench_unpipelined_kind(const struct opts *o, int is_write)
{
	struct pairs pr = {
		.name = is_write ? "rpc.write" : "rpc.read",
		.ref_name = is_write ? "redis.c1.set" : "redis.c1.get",
		.kind_names = {is_write ? "rpc.append" : "rpc.match",
			       is_write ? "rpc.commit" : "rpc.release"},
	};
	struct unpip u = {0};
	struct tally all = {0};
	struct counters a, b;
	uint64_t burst_ns = (uint64_t)o->burst_ms * 1000000u;
	unsigned blocks = n_blocks(o);
	char key[96];

	u.c = lib_connect(o->socket);
	check(u.c, kvp_pool_open(u.c, RPC_MODEL, &rpc_layout, &u.p), "kvp_pool_open");
	resp_connect(&u.rs, o->redis);
	snprintf(key, sizeof(key), "kvp-bench-rpc:%s:%d", is_write ? "set" : "get", (int)getpid());
	u.s = lib_session(u.c, u.p);
	if (is_write) {
		u.cmd = resp_cmd_set(key, set_val, set_bytes);
	} else {
		check(u.c, kvp_append(u.s, prompt, PROMPT_TOKENS), "kvp_append (prompt)");
		check(u.c, kvp_commit(u.s, PROMPT_TOKENS), "kvp_commit (prompt)");
		ref_put_get_value(&u.rs, key);
		u.cmd = resp_cmd_get(key);
		u.got = malloc(get_bytes);
		if (!u.got)
			die("out of memory");
	}
	counters_get(u.c, &a);
	for (unsigned blk = 0; blk < blocks; blk++) {
		struct tally ours = {0}, ref = {0};

		for (unsigned ph = 0; ph < 4; ph++) {
			uint64_t end = now_ns() + burst_ns;

			if (!phase_is_ours(ph))
				up_ref(&u, is_write, end, &ref);
			else if (is_write)
				up_write(&u, end, &ours);
			else
				up_read(&u, end, &ours);
		}
		pairs_add(&pr, tally_rate(&ours, -1), tally_rate(&ref, -1),
			  (double[]){tally_rate(&ours, 0), tally_rate(&ours, 1)});
		tally_add(&all, &ours);
	}
	counters_get(u.c, &b);
	check_executed(pr.name, &a, &b, is_write, &all);
	pairs_print(&pr);
	report_lat(pr.kind_names[0], &u.lat[0]);
	report_lat(pr.kind_names[1], &u.lat[1]);
	report_lat(pr.ref_name, &u.ref_lat);
	check(u.c, kvp_session_close(u.s), "kvp_session_close");
	kvp_pool_close(u.p);
	kvp_disconnect(u.c);
	resp_close(&u.rs);
	free(u.cmd.bytes);
	free(u.got);
}

/* ---- pinning the unpipelined client and both servers to one CPU ------------ */

/* On this project's VMs a wake-up from one vCPU to the other is slow (an
 * IPI through the hypervisor) and one on the same vCPU is not: an
 * unpipelined round trip is 12-15 us or 40-110 us depending on where the
 * scheduler happens to have put client and server, and it keeps a placement
 * for seconds, differently for kvpalaced and for redis-server, so even
 * interleaved bursts compare placements rather than servers. With the
 * client and both servers on one CPU every round trip is two context
 * switches there, the same for both, and the ratio compares the work each
 * server does. The servers' previous masks are put back afterwards. */

#define PIN_MAX_THREADS 256

struct pinned {
	pid_t tid[PIN_MAX_THREADS];
	cpu_set_t old[PIN_MAX_THREADS];
	unsigned n;
	cpu_set_t self_old;
	int active;
};

/* The pid of the process listening at the other end of fd. */
static pid_t peer_pid(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || cr.pid <= 0)
		return -1;
	return cr.pid;
}

/* Pins every thread of pid to set; returns 0 or -errno. */
static int pin_process(struct pinned *p, pid_t pid, const cpu_set_t *set)
{
	char path[64];
	struct dirent *de;
	DIR *d;
	int ret = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((de = readdir(d)) && ret == 0) {
		pid_t tid = (pid_t)atoi(de->d_name);

		if (tid <= 0)
			continue;
		if (p->n == PIN_MAX_THREADS) {
			ret = -E2BIG;
			break;
		}
		if (sched_getaffinity(tid, sizeof(cpu_set_t), &p->old[p->n]) < 0 ||
		    sched_setaffinity(tid, sizeof(cpu_set_t), set) < 0) {
			/* a thread that ended meanwhile, or one the kernel
			 * keeps where it is (io_uring's workers): not ours to
			 * place */
			if (errno == ESRCH || errno == EINVAL)
				continue;
			ret = -errno;
			break;
		}
		p->tid[p->n++] = tid;
	}
	closedir(d);
	return ret;
}

static void unpin(struct pinned *p)
{
	for (unsigned i = 0; i < p->n; i++)
		sched_setaffinity(p->tid[i], sizeof(cpu_set_t), &p->old[i]);
	if (p->active)
		sched_setaffinity(0, sizeof(cpu_set_t), &p->self_old);
	p->n = 0;
	p->active = 0;
}

/* Pins this process, kvpalaced and redis-server to CPU o->cpu (the first
 * CPU this process may use when o->cpu is -1; not at all when -2). Says on
 * stderr what it did; a server it may not pin leaves everything unpinned. */
static void pin_all(const struct opts *o, struct pinned *p)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	pid_t daemon_pid = -1, redis_pid;
	struct resp rs;
	cpu_set_t set;
	int cpu = o->cpu, fd, r;

	memset(p, 0, sizeof(*p));
	if (cpu == -2)
		return;
	if (sched_getaffinity(0, sizeof(cpu_set_t), &p->self_old) < 0)
		die("sched_getaffinity: %s", strerror(errno));
	for (int i = 0; cpu == -1 && i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &p->self_old))
			cpu = i;
	if (cpu < 0 || cpu >= CPU_SETSIZE)
		die("no CPU to pin to");
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd >= 0 && strlen(o->socket) < sizeof(sa.sun_path)) {
		strcpy(sa.sun_path, o->socket);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			daemon_pid = peer_pid(fd);
	}
	if (fd >= 0)
		close(fd);
	resp_connect(&rs, o->redis);
	redis_pid = peer_pid(rs.fd);
	resp_close(&rs);
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (daemon_pid < 0 || redis_pid < 0) {
		fprintf(stderr, "  not pinned: no pid of kvpalaced (%d) or redis-server (%d)\n",
			(int)daemon_pid, (int)redis_pid);
		return;
	}
	r = pin_process(p, daemon_pid, &set);
	if (r == 0)
		r = pin_process(p, redis_pid, &set);
	if (r == 0 && sched_setaffinity(0, sizeof(cpu_set_t), &set) < 0)
		r = -errno;
	p->active = 1;
	if (r < 0) {
		unpin(p);
		fprintf(stderr, "  not pinned: %s\n", strerror(-r));
		return;
	}
	fprintf(stderr, "  client, kvpalaced (pid %d) and redis-server (pid %d) pinned to CPU %d\n",
		(int)daemon_pid, (int)redis_pid, cpu);
}

static void bench_unpipelined(const struct opts *o)
{
	struct pinned p;

	fprintf(stderr,
		"rpc: 1 client, unpipelined, libkvpalace, against Redis in the same process "
		"(%u ms bursts, A B B A)\n",
		o->burst_ms);
	pin_all(o, &p);
	bench_unpipelined_kind(o, 1);
	bench_unpipelined_kind(o, 0);
	unpin(&p);
}

/* ---- the raw protocol, for pipelining -------------------------------------- */

struct raw {
	int fd;
	uint32_t max_bytes;  /* the daemon's message cap, from Hello */
	uint32_t max_tokens; /* tokens per Append/MatchPrefix, from Hello */
	uint64_t next_id;
	uint64_t pool_id;
	uint8_t *buf; /* one message of up to FRAME_MAX_MAX_BYTES */
	void *amem;
	struct frame_arena arena;
	/* pipelining: one request buffer and one reply buffer per slot */
	uint8_t *tx;
	uint8_t *rx;
	uint32_t rx_bytes;
};

static void raw_connect(struct raw *r, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 30};
	uint64_t deadline = now_ns() + 10000000000u;

	if (strlen(path) >= sizeof(sa.sun_path))
		die("socket path too long: %s", path);
	strcpy(sa.sun_path, path);
	for (;;) {
		r->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (r->fd < 0)
			die("socket: %s", strerror(errno));
		if (connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if ((errno != ENOENT && errno != ECONNREFUSED) || now_ns() > deadline)
			die("connect %s: %s", path, strerror(errno));
		close(r->fd);
		usleep(20000);
	}
	/* A daemon that stops answering fails the run instead of hanging it. */
	if (setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		die("SO_RCVTIMEO: %s", strerror(errno));
}

/* Receives one reply into buf and unpacks it; it stays valid until the next
 * receive. An fd that comes with it is stored in *ret_fd (-1 if none). */
static Kvpalace__V1__Response *raw_recv_one(struct raw *r, int *ret_fd)
{
	Kvpalace__V1__Response *resp;
	int n, len;

	n = frame_recv(r->fd, r->buf, FRAME_MAX_MAX_BYTES, ret_fd);
	if (n == 0)
		die("the daemon closed the connection");
	if (n < 0)
		die("frame_recv: %s", strerror(-n));
	len = frame_header_check(r->buf, (size_t)n, FRAME_MAX_MAX_BYTES);
	if (len < 0)
		die("bad reply frame: %s", strerror(-len));
	frame_arena_reset(&r->arena);
	resp = frame_unpack_response(&r->arena, r->buf + FRAME_HEADER_BYTES, (size_t)len);
	if (!resp)
		die("reply does not unpack");
	return resp;
}

static const char *status_text(const Kvpalace__V1__Response *resp)
{
	if (resp->error)
		return resp->error;
	return strerror(-status_to_errno(resp->status));
}

/* One synchronous request (nothing else in flight): sends req, waits for its
 * reply, dies unless it is OK and of the expected operation. */
static Kvpalace__V1__Response *raw_call(struct raw *r, Kvpalace__V1__Request *req, int op,
					int *ret_fd)
{
	Kvpalace__V1__Response *resp;
	int n, err, fd;

	req->id = ++r->next_id;
	n = frame_pack_request(req, r->buf, FRAME_MAX_MAX_BYTES, r->max_bytes);
	if (n < 0)
		die("frame_pack_request: %s", strerror(-n));
	err = frame_send(r->fd, r->buf, (size_t)n, -1);
	if (err < 0)
		die("frame_send: %s", strerror(-err));
	resp = raw_recv_one(r, &fd);
	if (ret_fd)
		*ret_fd = fd;
	else if (fd >= 0)
		close(fd);
	if (resp->id != req->id)
		die("reply to request %" PRIu64 " while %" PRIu64 " was the only one in flight",
		    resp->id, req->id);
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		die("request op %d failed: %s", op, status_text(resp));
	if ((int)resp->op_case != op)
		die("reply op %d to request op %d", (int)resp->op_case, op);
	return resp;
}

/* Connects, says Hello, opens the pool of `layout` (closing the arena fd:
 * the pipelined clients never touch pages) and sets up `depth` slots. */
static void raw_open(struct raw *r, const char *path, const char *model,
		     const struct kvp_layout *layout, unsigned depth)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__HelloRequest hello = KVPALACE__V1__HELLO_REQUEST__INIT;
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Layout lay = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__Response *resp;
	size_t abytes = frame_arena_bytes(FRAME_MAX_MAX_BYTES);
	int fd;

	memset(r, 0, sizeof(*r));
	r->max_bytes = FRAME_DEFAULT_MAX_BYTES;
	r->buf = malloc(FRAME_MAX_MAX_BYTES);
	r->amem = malloc(abytes);
	if (!r->buf || !r->amem)
		die("out of memory");
	frame_arena_init(&r->arena, r->amem, abytes);
	raw_connect(r, path);

	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = (char *)"kvp-bench-rpc";
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	resp = raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_HELLO, NULL);
	if (resp->hello->max_message_bytes < FRAME_MIN_MAX_BYTES ||
	    resp->hello->max_message_bytes > FRAME_MAX_MAX_BYTES ||
	    resp->hello->max_tokens_per_request == 0)
		die("Hello reply with a message cap of %u bytes, %u tokens per request",
		    resp->hello->max_message_bytes, resp->hello->max_tokens_per_request);
	r->max_bytes = resp->hello->max_message_bytes;
	r->max_tokens = resp->hello->max_tokens_per_request;

	lay.n_layers = layout->n_layers;
	lay.n_kv_heads = layout->n_kv_heads;
	lay.head_dim = layout->head_dim;
	lay.block_tokens = layout->block_tokens;
	lay.dtype = (Kvpalace__V1__DType)layout->dtype;
	op.model_id = (char *)model;
	op.layout = &lay;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;
	resp = raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_OPEN_POOL, &fd);
	r->pool_id = resp->open_pool->pool_id;
	if (fd >= 0)
		close(fd);

	r->rx_bytes = r->max_bytes;
	r->tx = malloc((size_t)depth * TX_SLOT_BYTES);
	r->rx = malloc((size_t)depth * r->rx_bytes);
	if (!r->tx || !r->rx)
		die("out of memory");
}

static void raw_close(struct raw *r)
{
	close(r->fd);
	free(r->buf);
	free(r->amem);
	free(r->tx);
	free(r->rx);
}

static uint64_t raw_session_create(struct raw *r)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;

	cs.pool_id = r->pool_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	req.create_session = &cs;
	return raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_CREATE_SESSION, NULL)
		->create_session->session_id;
}

static void raw_session_close(struct raw *r, uint64_t session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CloseSessionRequest cs = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;

	cs.session_id = session;
	req.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
	req.close_session = &cs;
	raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_CLOSE_SESSION, NULL);
}

/* Reserves tokens[0..n) in the session, in as many requests as the daemon's
 * per-request limit needs. */
static void raw_append_sync(struct raw *r, uint64_t session, uint32_t *tokens, uint32_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest ap = KVPALACE__V1__APPEND_REQUEST__INIT;
	/* a packed uint32 takes at most 5 bytes; keep well inside the cap */
	uint32_t per = (r->max_bytes - 256) / 5;

	if (per > r->max_tokens)
		per = r->max_tokens;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	ap.session_id = session;
	for (uint32_t done = 0; done < n;) {
		uint32_t k = n - done < per ? n - done : per;

		ap.tokens = tokens + done;
		ap.n_tokens = k;
		raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_APPEND, NULL);
		done += k;
	}
}

static void raw_commit_sync(struct raw *r, uint64_t session, uint64_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CommitRequest cm = KVPALACE__V1__COMMIT_REQUEST__INIT;

	cm.session_id = session;
	cm.n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = &cm;
	raw_call(r, &req, KVPALACE__V1__RESPONSE__OP_COMMIT, NULL);
}

/* What a pipelined burst sends and how it checks each answer. */
struct burst {
	int op; /* the Request/Response op case */
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest append;
	Kvpalace__V1__CommitRequest commit;
	Kvpalace__V1__MatchPrefixRequest match;
	Kvpalace__V1__ReleaseRequest release;
	uint32_t token;
	uint32_t token_base; /* append: the k-th request appends token_base + k */
	uint64_t *leases;    /* match: lease of the k-th request; release: lease to end */
};

static void burst_fill(struct burst *b, uint32_t k)
{
	switch (b->op) {
	case KVPALACE__V1__REQUEST__OP_APPEND:
		b->token = b->token_base + k;
		break;
	case KVPALACE__V1__REQUEST__OP_RELEASE:
		b->release.lease_id = b->leases[k];
		break;
	default:
		break;
	}
}

static void burst_check(struct burst *b, uint32_t k, const Kvpalace__V1__Response *resp)
{
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		die("pipelined request op %d failed: %s", b->op, status_text(resp));
	if ((int)resp->op_case != b->op)
		die("reply op %d to pipelined request op %d", (int)resp->op_case, b->op);
	if (b->op == KVPALACE__V1__REQUEST__OP_MATCH_PREFIX) {
		if (resp->match_prefix->matched_tokens != PROMPT_TOKENS ||
		    resp->match_prefix->lease_id == 0)
			die("MatchPrefix matched %" PRIu64 " of %u committed tokens",
			    resp->match_prefix->matched_tokens, PROMPT_TOKENS);
		b->leases[k] = resp->match_prefix->lease_id;
	}
}

/* Sends n requests of burst b keeping up to depth in flight, sending the
 * freed slots' next requests together, as back-to-back frames in one
 * datagram, after each batch of replies (recvmmsg; a reply datagram may
 * gather several frames). Request ids encode (k << 8 | slot) so out-of-order replies
 * find their slot. Returns the elapsed time of the burst. */
static uint64_t raw_pipeline(struct raw *r, struct burst *b, uint32_t n, unsigned depth)
{
	uint32_t slot_k[MAX_DEPTH];
	uint32_t free_slots[MAX_DEPTH];
	struct mmsghdr msgs[MAX_DEPTH];
	struct iovec iov[MAX_DEPTH];
	uint32_t n_free = 0, sent = 0, done = 0;
	uint64_t t0 = now_ns();

	for (unsigned i = 0; i < depth; i++) {
		free_slots[n_free++] = depth - 1 - i;
		slot_k[i] = UINT32_MAX;
	}
	while (done < n) {
		unsigned m = 0;
		int got;

		/* refill every free slot */
		while (n_free && sent < n) {
			uint32_t slot = free_slots[--n_free];
			uint8_t *buf = r->tx + (size_t)slot * TX_SLOT_BYTES;
			int len;

			burst_fill(b, sent);
			b->req.id = (uint64_t)sent << 8 | slot;
			len = frame_pack_request(&b->req, buf, TX_SLOT_BYTES, r->max_bytes);
			if (len < 0)
				die("frame_pack_request: %s", strerror(-len));
			iov[m] = (struct iovec){.iov_base = buf, .iov_len = (size_t)len};
			slot_k[slot] = sent++;
			m++;
		}
		/* All refilled requests go in one datagram of back-to-back frames,
		 * as redis-benchmark -P writes its commands in one write(). */
		if (m) {
			struct msghdr h = {.msg_iov = iov, .msg_iovlen = m};
			ssize_t s;

			do
				s = sendmsg(r->fd, &h, MSG_NOSIGNAL);
			while (s < 0 && errno == EINTR);
			if (s <= 0)
				die("sendmsg: %s", s < 0 ? strerror(errno) : "sent nothing");
		}

		/* wait for at least one reply, take every one that is there */
		m = depth - n_free;
		for (unsigned i = 0; i < m; i++) {
			iov[i] = (struct iovec){.iov_base = r->rx + (size_t)i * r->rx_bytes,
						.iov_len = r->rx_bytes};
			msgs[i] =
				(struct mmsghdr){.msg_hdr = {.msg_iov = &iov[i], .msg_iovlen = 1}};
		}
		do
			got = recvmmsg(r->fd, msgs, m, MSG_WAITFORONE | MSG_CMSG_CLOEXEC, NULL);
		while (got < 0 && errno == EINTR);
		if (got < 0)
			die("recvmmsg: %s", strerror(errno));
		if (got == 0)
			die("the daemon closed the connection");
		for (int i = 0; i < got; i++) {
			const uint8_t *payload;
			size_t off = 0, plen;
			int ret;

			if (msgs[i].msg_len == 0)
				die("the daemon closed the connection");
			if (msgs[i].msg_hdr.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
				die("reply truncated");
			/* The daemon may gather the replies to one datagram. */
			while ((ret = frame_next(iov[i].iov_base, msgs[i].msg_len, &off,
						 r->max_bytes, &payload, &plen)) > 0) {
				Kvpalace__V1__Response *resp;
				uint32_t slot;

				frame_arena_reset(&r->arena);
				resp = frame_unpack_response(&r->arena, payload, plen);
				if (!resp)
					die("reply does not unpack");
				slot = (uint32_t)(resp->id & 0xff);
				if (slot >= depth || slot_k[slot] != resp->id >> 8 ||
				    slot_k[slot] == UINT32_MAX)
					die("reply with unknown id %" PRIu64, resp->id);
				burst_check(b, slot_k[slot], resp);
				slot_k[slot] = UINT32_MAX;
				free_slots[n_free++] = slot;
				done++;
			}
			if (ret < 0)
				die("bad reply frame: %s", strerror(-ret));
		}
	}
	return now_ns() - t0;
}

/* ---- pipelined: several client processes ------------------------------------ */

/* What the clients share with the parent: the common start, then each
 * client's tallies per burst. */
struct pipe_shared {
	uint64_t t0_ns; /* written by the parent before the start */
};

struct child_result {
	int ok;
	struct tally phase[4 * MAX_BLOCKS];
};

/* Sets up the two bursts of one pipelined client's pair: Append then Commit
 * of 1 token each (write) or MatchPrefix of the prompt then Release (read). */
static void pipe_bursts(struct raw *r, int is_write, uint64_t session, struct burst *b1,
			struct burst *b2, uint64_t *leases, uint32_t token_base)
{
	*b1 = (struct burst){.req = KVPALACE__V1__REQUEST__INIT};
	*b2 = (struct burst){.req = KVPALACE__V1__REQUEST__INIT};
	if (is_write) {
		b1->op = KVPALACE__V1__REQUEST__OP_APPEND;
		b1->append = (Kvpalace__V1__AppendRequest)KVPALACE__V1__APPEND_REQUEST__INIT;
		b1->req.append = &b1->append;
		b1->append.session_id = session;
		b1->append.tokens = &b1->token;
		b1->append.n_tokens = 1;
		b1->token_base = token_base;
		b2->op = KVPALACE__V1__REQUEST__OP_COMMIT;
		b2->commit = (Kvpalace__V1__CommitRequest)KVPALACE__V1__COMMIT_REQUEST__INIT;
		b2->req.commit = &b2->commit;
		b2->commit.session_id = session;
		b2->commit.n_tokens = 1;
	} else {
		b1->op = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
		b1->match =
			(Kvpalace__V1__MatchPrefixRequest)KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;
		b1->req.match_prefix = &b1->match;
		b1->match.pool_id = r->pool_id;
		match_tokens(&b1->match);
		b1->leases = leases;
		b2->op = KVPALACE__V1__REQUEST__OP_RELEASE;
		b2->release = (Kvpalace__V1__ReleaseRequest)KVPALACE__V1__RELEASE_REQUEST__INIT;
		b2->req.release = &b2->release;
		b2->leases = leases;
	}
	b1->req.op_case = (Kvpalace__V1__Request__OpCase)b1->op;
	b2->req.op_case = (Kvpalace__V1__Request__OpCase)b2->op;
}

/* One pipelined client: sets up, tells the parent it is ready, waits for
 * the start (EOF on go_fd), then runs the bursts, each until its fixed end
 * (t0 + (k + 1) bursts), so that every client switches at the same
 * instants; stores its tallies. */
static void pipe_child(const struct opts *o, int is_write, unsigned index,
		       const volatile struct pipe_shared *sh, struct child_result *res,
		       int ready_fd, int go_fd)
{
	static uint64_t leases[MATCH_BURST];
	uint64_t burst_ns = (uint64_t)o->burst_ms * 1000000u, t0, session;
	unsigned phases = 4 * n_blocks(o), depth = o->depth;
	struct resp_cmd one, batch;
	struct burst b1, b2;
	uint32_t in_session = 0;
	struct resp rs;
	struct raw r;
	uint8_t *got;
	char key[96], c;

	raw_open(&r, o->socket, RPC_MODEL, &rpc_layout, depth);
	session = raw_session_create(&r);
	resp_connect(&rs, o->redis);
	snprintf(key, sizeof(key), "kvp-bench-rpc:p%s:%u:%d", is_write ? "set" : "get", index,
		 (int)getpid());
	if (is_write) {
		one = resp_cmd_set(key, set_val, set_bytes);
	} else {
		raw_append_sync(&r, session, prompt, PROMPT_TOKENS);
		raw_commit_sync(&r, session, PROMPT_TOKENS);
		ref_put_get_value(&rs, key);
		one = resp_cmd_get(key);
	}
	batch = resp_cmd_repeat(&one, depth);
	got = malloc((size_t)depth * get_bytes);
	if (!got)
		die("out of memory");
	/* tokens of one client never repeat, nor another client's */
	pipe_bursts(&r, is_write, session, &b1, &b2, leases, index << 24);

	if (write(ready_fd, "r", 1) != 1)
		die("ready pipe: %s", strerror(errno));
	close(ready_fd);
	if (read(go_fd, &c, 1) != 0)
		die("go pipe");
	close(go_fd);
	t0 = sh->t0_ns;
	{
		struct timespec ts = {.tv_sec = (time_t)(t0 / 1000000000u),
				      .tv_nsec = (long)(t0 % 1000000000u)};

		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}

	for (unsigned ph = 0; ph < phases; ph++) {
		uint64_t end = t0 + (ph + 1) * burst_ns;
		struct tally *t = &res->phase[ph];

		/* at least one batch a burst: a client the scheduler held past
		 * a whole burst still takes part in it */
		do {
			if (!phase_is_ours(ph)) {
				uint64_t a = now_ns(), z;

				resp_send(&rs, &batch);
				for (unsigned i = 0; i < depth; i++)
					if (is_write)
						resp_expect_ok(&rs, "SET");
					else
						resp_expect_bulk(&rs, got + (size_t)i * get_bytes,
								 get_bytes, "GET");
				z = now_ns();
				resp_expect_drained(&rs, is_write ? "SET" : "GET");
				for (unsigned i = 0; !is_write && i < depth; i++)
					if (memcmp(got + (size_t)i * get_bytes, get_val, get_bytes))
						die("redis GET: other bytes than were SET");
				t->ns[0] += z - a;
				t->ops[0] += depth;
			} else if (is_write) {
				if (in_session + WRITE_BURST > SESSION_TOKENS) {
					/* untimed: a fresh session */
					raw_session_close(&r, session);
					session = raw_session_create(&r);
					b1.append.session_id = session;
					b2.commit.session_id = session;
					in_session = 0;
				}
				t->ns[0] += raw_pipeline(&r, &b1, WRITE_BURST, depth);
				t->ns[1] += raw_pipeline(&r, &b2, WRITE_BURST, depth);
				t->ops[0] += WRITE_BURST;
				t->ops[1] += WRITE_BURST;
				b1.token_base += WRITE_BURST;
				in_session += WRITE_BURST;
			} else {
				t->ns[0] += raw_pipeline(&r, &b1, MATCH_BURST, depth);
				t->ns[1] += raw_pipeline(&r, &b2, MATCH_BURST, depth);
				t->ops[0] += MATCH_BURST;
				t->ops[1] += MATCH_BURST;
			}
		} while (now_ns() < end);
	}
	raw_session_close(&r, session);
	raw_close(&r);
	resp_close(&rs);
	free(one.bytes);
	free(batch.bytes);
	free(got);
	res->ok = 1;
}

static void bench_pipelined_kind(const struct opts *o, int is_write)
{
	struct pairs pr = {
		.name = is_write ? "rpc.write_pipelined" : "rpc.read_pipelined",
		.ref_name = is_write ? "redis.p16.set" : "redis.p16.get",
		.kind_names = {is_write ? "rpc.append_pipelined" : "rpc.match_pipelined",
			       is_write ? "rpc.commit_pipelined" : "rpc.release_pipelined"},
	};
	size_t bytes = sizeof(struct pipe_shared) + o->clients * sizeof(struct child_result);
	unsigned blocks = n_blocks(o), n_ready = 0;
	struct child_result *results;
	struct counters before, after;
	struct pipe_shared *sh;
	struct tally all = {0};
	pid_t pids[MAX_CLIENTS];
	int ready[2], go[2], failed = 0;
	kvp_client *c = lib_connect(o->socket);
	char ch;

	/* no connection of ours is open while the clients run */
	counters_get(c, &before);
	kvp_disconnect(c);
	sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	results = (struct child_result *)(sh + 1);
	if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	for (unsigned i = 0; i < o->clients; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (pids[i] == 0) {
			/* a client outlives no interrupted run */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			close(ready[0]);
			close(go[1]);
			pipe_child(o, is_write, i, sh, &results[i], ready[1], go[0]);
			fflush(stderr);
			_exit(0);
		}
	}
	close(ready[1]);
	close(go[0]);
	while (read(ready[0], &ch, 1) == 1)
		n_ready++;
	close(ready[0]);
	/* everyone starts at the same instant, a little after the go */
	sh->t0_ns = now_ns() + 5000000u;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	close(go[1]); /* start: every child's read returns 0 */
	for (unsigned i = 0; i < o->clients; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	if (failed || n_ready != o->clients)
		die("%s: a client failed", pr.name);
	for (unsigned i = 0; i < o->clients; i++)
		if (!results[i].ok)
			die("%s: client %u reported nothing", pr.name, i);

	/* Per block, the aggregate rate of each side is the sum of each
	 * client's rate over its bursts of that side. */
	for (unsigned blk = 0; blk < blocks; blk++) {
		double r_all = 0, r_kind[2] = {0, 0}, r_ref = 0;

		for (unsigned i = 0; i < o->clients; i++) {
			struct tally a = {0}, b = {0};

			for (unsigned ph = 4 * blk; ph < 4 * blk + 4; ph++)
				tally_add(phase_is_ours(ph) ? &a : &b, &results[i].phase[ph]);
			if (!a.ns[0] || !a.ns[1] || !b.ns[0])
				die("%s: client %u did nothing in a burst of block %u", pr.name, i,
				    blk);
			r_all += tally_rate(&a, -1);
			r_kind[0] += tally_rate(&a, 0);
			r_kind[1] += tally_rate(&a, 1);
			r_ref += tally_rate(&b, 0);
			tally_add(&all, &a);
		}
		pairs_add(&pr, r_all, r_ref, r_kind);
	}
	c = lib_connect(o->socket);
	counters_get(c, &after);
	kvp_disconnect(c);
	check_executed(pr.name, &before, &after, is_write, &all);
	pairs_print(&pr);
	munmap(sh, bytes);
}

static void bench_pipelined(const struct opts *o)
{
	fprintf(stderr,
		"rpc: %u clients (processes), %u requests in flight each, raw protocol; Redis "
		"pipelined %u deep on a connection of each client (%u ms bursts, A B B A)\n",
		o->clients, o->depth, o->depth, o->burst_ms);
	bench_pipelined_kind(o, 1);
	bench_pipelined_kind(o, 0);
}
/* ---- the data path: writing page K/V in place ------------------------------ */

/* Writes the K/V of every (layer, kv, head, position) of s from src, one
 * head_dim row at a time through kvp_session_kv(): what a model does after a
 * prefill. Returns the elapsed ns. */
static uint64_t write_in_place(kvp_session *s, const struct kvp_layout *l, uint32_t n_tok,
			       const uint8_t *src, size_t row)
{
	uint64_t t0 = now_ns();

	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++)
				for (uint32_t pos = 0; pos < n_tok; pos++) {
					void *dst = kvp_session_kv(s, pos, layer, kv, h);

					if (!dst)
						die("kvp_session_kv(%u, %u, %u, %u) is NULL", pos,
						    layer, kv, h);
					memcpy(dst, src, row);
					src += row;
				}
	return now_ns() - t0;
}

/* The same bytes as write_in_place, a whole (layer, kv, head) run of the
 * page at a time (block_tokens rows, contiguous in the arena) through the
 * page's view from kvp_session_page(): what an engine that copies runs
 * does. Returns the elapsed ns. */
static uint64_t write_runs(kvp_session *s, const struct kvp_layout *l, uint32_t n_tok,
			   const uint8_t *src, size_t row)
{
	uint64_t t0 = now_ns();
	size_t run = (size_t)l->block_tokens * row;

	for (uint32_t pg = 0; pg < n_tok / l->block_tokens; pg++) {
		struct kvp_page_view v;

		if (kvp_session_page(s, pg, &v) < 0)
			die("kvp_session_page(%u) failed", pg);
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++) {
					size_t at = (((size_t)layer * 2 + kv) * l->n_kv_heads + h) *
							    n_tok +
						    (size_t)pg * l->block_tokens;

					memcpy((uint8_t *)v.base + layer * v.layer_stride +
						       kv * v.kv_stride + h * v.head_stride,
					       src + at * row, run);
				}
	}
	return now_ns() - t0;
}

/* The reference: the same bytes with plain memcpy, one page-sized block at a
 * time, into private memory. */
static uint64_t write_memcpy(uint8_t *dst, const uint8_t *src, size_t total, size_t block)
{
	uint64_t t0 = now_ns();

	for (size_t at = 0; at < total; at += block)
		memcpy(dst + at, src + at, total - at < block ? total - at : block);
	return now_ns() - t0;
}

/* In a second process: matches the tokens, checks that every row reads back
 * as src through the lease. Exits 0 when it does. */
static void read_back_child(const struct opts *o, const uint32_t *toks, uint32_t n_tok,
			    const uint8_t *src, size_t row)
{
	kvp_client *c = lib_connect(o->socket);
	kvp_pool *p;
	kvp_lease *lease;

	check(c, kvp_pool_open(c, BW_MODEL, &bw_layout, &p), "kvp_pool_open (reader)");
	check(c, kvp_match_prefix(p, toks, n_tok, &lease), "kvp_match_prefix (reader)");
	if (kvp_lease_tokens(lease) != n_tok)
		die("reader matched %" PRIu64 " of %u tokens", kvp_lease_tokens(lease), n_tok);
	for (uint32_t layer = 0; layer < bw_layout.n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < bw_layout.n_kv_heads; h++)
				for (uint32_t pos = 0; pos < n_tok; pos++) {
					const void *at = kvp_lease_kv(lease, pos, layer, kv, h);

					if (!at || memcmp(at, src, row) != 0)
						die("reader: row (%u, %u, %u, %u) differs", pos,
						    layer, kv, h);
					src += row;
				}
	check(c, kvp_lease_release(lease), "kvp_lease_release (reader)");
	kvp_pool_close(p);
	kvp_disconnect(c);
}

/* BW_BLOCKS blocks of A B B A: write (the session's pages from src),
 * memcpy, memcpy, write; bytes per ns = GB/s, their ratio added to pr. */
static void bw_blocks(struct pairs *pr,
		      uint64_t (*write)(kvp_session *, const struct kvp_layout *, uint32_t,
					const uint8_t *, size_t),
		      kvp_session *s, uint32_t n_tok, const uint8_t *src, size_t row, uint8_t *dst,
		      size_t total, size_t page_data)
{
	for (int blk = 0; blk < BW_BLOCKS; blk++) {
		uint64_t ta = write(s, &bw_layout, n_tok, src, row);
		uint64_t tc = write_memcpy(dst, src, total, page_data);
		double a, b;

		tc += write_memcpy(dst, src, total, page_data);
		ta += write(s, &bw_layout, n_tok, src, row);
		a = 2.0 * (double)total / (double)ta;
		b = 2.0 * (double)total / (double)tc;
		pairs_add(pr, a, b, NULL);
		fprintf(stderr, "  %-24s %10.2f GB/s   memcpy %.2f GB/s\n", pr->name, a, b);
	}
	pairs_print(pr);
}

static void bench_page_write(const struct opts *o)
{
	kvp_client *c = lib_connect(o->socket);
	kvp_pool *p;
	kvp_session *s;
	uint32_t *toks, n_tok, n_pages;
	size_t row, total, page_data;
	uint8_t *src, *dst;
	struct pairs pr = {
		.name = "rpc.page_write_bw",
		.ref_name = "ref.memcpy_bw",
	};
	struct pairs pr_runs = {
		.name = "rpc.page_write_runs_bw",
		.ref_name = "ref.memcpy_runs_bw",
	};
	uint64_t x = 0x9e3779b97f4a7c15u;
	pid_t pid;
	int st;

	check(c, kvp_pool_open(c, BW_MODEL, &bw_layout, &p), "kvp_pool_open (bw)");
	row = kvp_pool_row_bytes(p);
	page_data = (size_t)bw_layout.n_layers * 2 * bw_layout.n_kv_heads * bw_layout.block_tokens *
		    row;
	n_pages = (uint32_t)(((size_t)o->bw_mib << 20) / page_data);
	if (n_pages == 0)
		n_pages = 1;
	if (n_pages > kvp_pool_n_pages(p) / 2)
		die("the arena holds %u pages of %zu bytes: too small for a %u MiB write",
		    kvp_pool_n_pages(p), kvp_pool_page_bytes(p), o->bw_mib);
	n_tok = n_pages * bw_layout.block_tokens;
	total = (size_t)n_pages * page_data;
	fprintf(stderr, "rpc: page K/V written in place, %u pages of %zu bytes (%.0f MiB)\n",
		n_pages, kvp_pool_page_bytes(p), (double)total / 1048576.0);

	toks = malloc(n_tok * sizeof(*toks));
	src = aligned_alloc(4096, total);
	dst = aligned_alloc(4096, total);
	if (!toks || !src || !dst)
		die("out of memory");
	for (uint32_t i = 0; i < n_tok; i++)
		toks[i] = 2000000u + i;
	for (size_t i = 0; i < total; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(src + i, &x, 8);
	}
	memset(dst, 0, total);

	s = lib_session(c, p);
	check(c, kvp_append(s, toks, n_tok), "kvp_append (bw)");
	/* untimed first passes: fault the pages in on both sides */
	write_in_place(s, &bw_layout, n_tok, src, row);
	write_memcpy(dst, src, total, page_data);
	/* Rows, then runs of a page's rows per memcpy (the same bytes, so
	 * the read-back below checks both). */
	bw_blocks(&pr, write_in_place, s, n_tok, src, row, dst, total, page_data);
	bw_blocks(&pr_runs, write_runs, s, n_tok, src, row, dst, total, page_data);
	if (memcmp(dst, src, total))
		die("memcpy reference: the copy differs");

	/* publish, then read the same bytes back from another process */
	check(c, kvp_commit(s, n_tok), "kvp_commit (bw)");
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		read_back_child(o, toks, n_tok, src, row);
		fflush(stderr);
		_exit(0);
	}
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("the reading process did not see the written bytes");
	fprintf(stderr, "  another process matched the %u tokens and read identical bytes\n",
		n_tok);

	check(c, kvp_session_close(s), "kvp_session_close (bw)");
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(toks);
	free(src);
	free(dst);
}

/* ---- main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: kvp-bench-rpc --socket PATH --redis PATH [--seconds S] [--burst-ms MS]\n"
	      "                     [--cpu N|any|none] [--clients N] [--depth D] [--bw-mib M]\n"
	      "                     [--only unpipelined,pipelined,bw]\n"
	      "Measures Append+Commit and MatchPrefix+Release round trips against a running\n"
	      "kvpalaced, interleaved with Redis SET and GET on its Unix socket (bursts of\n"
	      "MS ms, A B B A; S seconds of ours per figure), and the in-place page write\n"
	      "bandwidth against memcpy; prints 'sample NAME VALUE' lines (rates in\n"
	      "requests/s, bytes/ns = GB/s, latencies in microseconds, NAME:pair ratios).\n"
	      "The unpipelined client, kvpalaced and redis-server run pinned to CPU N (any:\n"
	      "the first this process may use, the default) unless --cpu none.\n",
	      f);
}

int main(int argc, char **argv)
{
	struct opts o = {
		.seconds = 2,
		.burst_ms = 50,
		.clients = 4,
		.depth = 16,
		.bw_mib = 64,
	};
	const char *only = "unpipelined,pipelined,bw", *cpu = "any";
	const struct bench_opt opts[] = {
		{"socket", BENCH_OPT_STR, &o.socket, 0, 0},
		{"redis", BENCH_OPT_STR, &o.redis, 0, 0},
		{"seconds", BENCH_OPT_DOUBLE, &o.seconds, 0.001, 3600},
		{"burst-ms", BENCH_OPT_UINT, &o.burst_ms, 5, 10000},
		{"cpu", BENCH_OPT_STR, &cpu, 0, 0},
		{"clients", BENCH_OPT_UINT, &o.clients, 1, MAX_CLIENTS},
		{"depth", BENCH_OPT_UINT, &o.depth, 1, MAX_DEPTH},
		{"bw-mib", BENCH_OPT_UINT, &o.bw_mib, 1, 4096},
		{"only", BENCH_OPT_STR, &only, 0, 0},
	};
	struct bench_opt cpu_opt = {"cpu", BENCH_OPT_INT, &o.cpu, 0, CPU_SETSIZE - 1};
	char *parts, *part, *save;

	bench_parse_opts(argc, argv, opts, (int)(sizeof(opts) / sizeof(opts[0])), usage);
	parts = strdup(only);
	for (part = strtok_r(parts, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
		if (!strcmp(part, "unpipelined"))
			o.do_unpipelined = 1;
		else if (!strcmp(part, "pipelined"))
			o.do_pipelined = 1;
		else if (!strcmp(part, "bw"))
			o.do_bw = 1;
		else
			o.do_bw = -1; /* marks a usage error */
	}
	free(parts);
	if (!strcmp(cpu, "none"))
		o.cpu = -2;
	else if (!strcmp(cpu, "any"))
		o.cpu = -1;
	else if (bench_opt_set(&cpu_opt, cpu) < 0)
		o.do_bw = -1;
	if (!o.socket || (!o.redis && (o.do_unpipelined || o.do_pipelined)) || o.do_bw < 0) {
		usage(stderr);
		return 2;
	}
	for (uint32_t i = 0; i < PROMPT_TOKENS; i++)
		prompt[i] = PROMPT_BASE + i;
	ref_values();
	fprintf(stderr,
		"rpc: Redis values of %zu bytes (SET, as our Append) and %zu (GET, as our "
		"MatchPrefix)\n",
		set_bytes, get_bytes);

	if (o.do_unpipelined)
		bench_unpipelined(&o);
	if (o.do_pipelined)
		bench_pipelined(&o);
	if (o.do_bw)
		bench_page_write(&o);
	return 0;
}
