/* bench/rpc_bench.c — round trips of the control protocol, and the data path.
 *
 * Measures the three requests of the hot path, each request type on its own,
 * against a running kvpalaced (bench/run starts one on a temporary socket;
 * this program starts nothing):
 *
 *  - one client, unpipelined, through the real library (libkvpalace):
 *    Append of 1 token, Commit of 1 token, MatchPrefix of a short prompt that
 *    hits; ops/s and p50/p99 round-trip latency;
 *  - several client processes, each keeping `depth` requests in flight on the
 *    raw protocol (proto/frame.h), since the library is synchronous; every
 *    request is a real one that the daemon executes;
 *  - the client's in-place write bandwidth of page K/V into the shared arena
 *    through kvp_session_kv(), against a plain memcpy of the same bytes, then
 *    a second process that reads the same bytes back through a MatchPrefix
 *    lease: the data path is the mapped arena, the daemon copies nothing.
 *
 * The daemon's Stats counters (appended and committed tokens, match hits)
 * must grow by at least what the clients counted, so every timed op is a
 * request the daemon executed.
 *
 * Only the requests under test are timed. Set-up between bursts (a new
 * session every SESSION_TOKENS tokens, releasing the leases a burst of
 * matches took) is not. One invocation is one repetition: it prints
 * "sample NAME VALUE" lines on stdout, which bench/run turns into medians and
 * ratios against Redis measured in the same run. Progress and errors go to
 * stderr; any failure exits 1 (a benchmark that cannot run must not pass
 * silently). Single-threaded; the pipelined part forks one process per
 * client, which report through a shared anonymous mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
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
#include "status.h"

#define RPC_MODEL "kvp-bench-rpc"
#define BW_MODEL  "kvp-bench-bw"
/* A session is closed and replaced after this many tokens, so a long run
 * never meets the arena size or a per-session limit. */
#define SESSION_TOKENS 4096u
/* The prompt MatchPrefix looks up: four full pages of the rpc layout. */
#define PROMPT_TOKENS 64u
#define PROMPT_BASE   1000000u
/* Leases one pipelined client takes in a burst of matches before it
 * releases them (untimed). */
#define MATCH_BURST 128u
#define MAX_DEPTH   256u
#define MAX_CLIENTS 64u
/* Latency samples kept per pipelined client; ops beyond it still count. */
#define LAT_CAP_PER_CLIENT (8u << 20)
/* Request buffer of one in-flight pipelined request (they are all small). */
#define TX_SLOT_BYTES 4096u
#define BW_PASSES     7

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
	double seconds;
	unsigned clients;
	unsigned depth;
	unsigned bw_mib;
	int do_unpipelined;
	int do_pipelined;
	int do_bw;
};

static uint32_t prompt[PROMPT_TOKENS];

/* Dies with the daemon's reason when a library call failed. */
static void check(kvp_client *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s (%d)", what, kvp_strerror(c, r), r);
}

/* ---- latency samples ------------------------------------------------------ */

struct lat {
	uint64_t *ns;
	size_t n;
	size_t cap;
	int fixed; /* ns is caller memory of cap entries: drop samples past it */
};

static void lat_push(struct lat *l, uint64_t v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 65536;
		uint64_t *ns;

		if (l->fixed)
			return;
		ns = realloc(l->ns, cap * sizeof(*ns));
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

/* Prints the rate, p50 and p99 samples of one measurement. */
static void report(const char *name, uint64_t ops, uint64_t timed_ns, uint64_t *ns, size_t n)
{
	char key[96];
	double rate = timed_ns ? (double)ops * 1e9 / (double)timed_ns : 0;
	double p50, p99;

	qsort(ns, n, sizeof(*ns), cmp_u64);
	p50 = lat_pct_us(ns, n, 50);
	p99 = lat_pct_us(ns, n, 99);
	sample(name, rate);
	snprintf(key, sizeof(key), "%s_p50", name);
	sample(key, p50);
	snprintf(key, sizeof(key), "%s_p99", name);
	sample(key, p99);
	fprintf(stderr, "  %-24s %10.0f ops/s  p50 %7.1f us  p99 %7.1f us  (%" PRIu64 " ops)\n",
		name, rate, p50, p99, ops);
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
			   int which, uint64_t ops)
{
	uint64_t d = which == 0	  ? b->appended - a->appended
		     : which == 1 ? b->committed - a->committed
				  : b->hits - a->hits;

	if (d < ops)
		die("%s: the daemon counted %" PRIu64 " where the client made %" PRIu64 " requests",
		    name, d, ops);
}

/* Closes s and returns a new session of p holding `reserve` uncommitted
 * tokens (not timed by callers). */
static kvp_session *lib_rotate(kvp_client *c, kvp_pool *p, kvp_session *s, uint32_t reserve)
{
	static uint32_t toks[SESSION_TOKENS];

	if (s) {
		uint64_t left = kvp_session_tokens(s) - kvp_session_committed(s);

		if (left)
			check(c, kvp_commit(s, left), "kvp_commit (rotate)");
		check(c, kvp_session_close(s), "kvp_session_close");
	}
	s = lib_session(c, p);
	if (reserve) {
		for (uint32_t i = 0; i < reserve; i++)
			toks[i] = i;
		check(c, kvp_append(s, toks, reserve), "kvp_append (reserve)");
	}
	return s;
}

static uint64_t lib_append(kvp_client *c, kvp_pool *p, double seconds)
{
	kvp_session *s = lib_rotate(c, p, NULL, 0);
	struct lat l = {0};
	uint64_t ops = 0, timed = 0, stop = now_ns() + (uint64_t)(seconds * 1e9), t1 = 0;

	while (t1 < stop) {
		uint32_t tok = (uint32_t)ops & 0xffffu;
		uint64_t t0;
		int r;

		if (kvp_session_tokens(s) >= SESSION_TOKENS)
			s = lib_rotate(c, p, s, 0);
		t0 = now_ns();
		r = kvp_append(s, &tok, 1);
		t1 = now_ns();
		check(c, r, "kvp_append");
		lat_push(&l, t1 - t0);
		timed += t1 - t0;
		ops++;
	}
	check(c, kvp_session_close(s), "kvp_session_close");
	report("rpc.append", ops, timed, l.ns, l.n);
	free(l.ns);
	return ops;
}

static uint64_t lib_commit(kvp_client *c, kvp_pool *p, double seconds)
{
	kvp_session *s = lib_rotate(c, p, NULL, SESSION_TOKENS);
	struct lat l = {0};
	uint64_t ops = 0, timed = 0, stop = now_ns() + (uint64_t)(seconds * 1e9), t1 = 0;

	while (t1 < stop) {
		uint64_t t0;
		int r;

		if (kvp_session_committed(s) == kvp_session_tokens(s))
			s = lib_rotate(c, p, s, SESSION_TOKENS);
		t0 = now_ns();
		r = kvp_commit(s, 1);
		t1 = now_ns();
		check(c, r, "kvp_commit");
		lat_push(&l, t1 - t0);
		timed += t1 - t0;
		ops++;
	}
	check(c, kvp_session_close(s), "kvp_session_close");
	report("rpc.commit", ops, timed, l.ns, l.n);
	free(l.ns);
	return ops;
}

static uint64_t lib_match(kvp_client *c, kvp_pool *p, double seconds)
{
	kvp_session *s = lib_session(c, p);
	struct lat l = {0};
	uint64_t ops = 0, timed = 0, stop = now_ns() + (uint64_t)(seconds * 1e9), t1 = 0;

	check(c, kvp_append(s, prompt, PROMPT_TOKENS), "kvp_append (prompt)");
	check(c, kvp_commit(s, PROMPT_TOKENS), "kvp_commit (prompt)");
	while (t1 < stop) {
		kvp_lease *lease;
		uint64_t t0;
		int r;

		t0 = now_ns();
		r = kvp_match_prefix(p, prompt, PROMPT_TOKENS, &lease);
		t1 = now_ns();
		check(c, r, "kvp_match_prefix");
		if (kvp_lease_tokens(lease) != PROMPT_TOKENS)
			die("kvp_match_prefix matched %" PRIu64 " of %u committed tokens",
			    kvp_lease_tokens(lease), PROMPT_TOKENS);
		check(c, kvp_lease_release(lease), "kvp_lease_release");
		lat_push(&l, t1 - t0);
		timed += t1 - t0;
		ops++;
	}
	check(c, kvp_session_close(s), "kvp_session_close");
	report("rpc.match", ops, timed, l.ns, l.n);
	free(l.ns);
	return ops;
}

static void bench_unpipelined(const struct opts *o)
{
	kvp_client *c = lib_connect(o->socket);
	struct counters a, b;
	kvp_pool *p;
	uint64_t ops;

	fprintf(stderr, "rpc: 1 client, unpipelined, libkvpalace\n");
	check(c, kvp_pool_open(c, RPC_MODEL, &rpc_layout, &p), "kvp_pool_open");
	counters_get(c, &a);
	ops = lib_append(c, p, o->seconds);
	counters_get(c, &b);
	check_executed("rpc.append", &a, &b, 0, ops);
	ops = lib_commit(c, p, o->seconds);
	counters_get(c, &a);
	check_executed("rpc.commit", &b, &a, 1, ops);
	ops = lib_match(c, p, o->seconds);
	counters_get(c, &b);
	check_executed("rpc.match", &a, &b, 2, ops);
	kvp_pool_close(p);
	kvp_disconnect(c);
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
	uint64_t *leases; /* match: lease of the k-th request; release: lease to end */
};

static void burst_fill(struct burst *b, uint32_t k)
{
	switch (b->op) {
	case KVPALACE__V1__REQUEST__OP_APPEND:
		b->token = k;
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
 * find their slot. Records each request's round trip in lat when given and
 * returns the elapsed time of the burst. */
static uint64_t raw_pipeline(struct raw *r, struct burst *b, uint32_t n, unsigned depth,
			     struct lat *lat)
{
	uint64_t sent_at[MAX_DEPTH];
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
		uint64_t t;
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
		t = now_ns();
		if (m) {
			struct msghdr h = {.msg_iov = iov, .msg_iovlen = m};
			ssize_t s;

			do
				s = sendmsg(r->fd, &h, MSG_NOSIGNAL);
			while (s < 0 && errno == EINTR);
			if (s <= 0)
				die("sendmsg: %s", s < 0 ? strerror(errno) : "sent nothing");
			for (unsigned i = 0; i < m; i++)
				sent_at[((uint8_t *)iov[i].iov_base - r->tx) / TX_SLOT_BYTES] = t;
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
		t = now_ns();
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
				if (lat)
					lat_push(lat, t - sent_at[slot]);
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

enum pipe_kind { PIPE_APPEND, PIPE_COMMIT, PIPE_MATCH };

static const char *const pipe_names[] = {
	[PIPE_APPEND] = "rpc.append_pipelined",
	[PIPE_COMMIT] = "rpc.commit_pipelined",
	[PIPE_MATCH] = "rpc.match_pipelined",
};

/* What a pipelined client leaves for the parent in the shared mapping; its
 * latency samples follow it. */
struct child_result {
	uint64_t ops;
	uint64_t timed_ns;
	uint64_t n_lat;
	int ok;
};

static size_t child_stride(void)
{
	return sizeof(struct child_result) + (size_t)LAT_CAP_PER_CLIENT * sizeof(uint64_t);
}

/* One pipelined client: sets up, tells the parent it is ready, waits for
 * the start (EOF on go_fd), runs bursts for o->seconds, stores its result. */
static void pipe_child(const struct opts *o, enum pipe_kind kind, struct child_result *res,
		       int ready_fd, int go_fd)
{
	static uint32_t toks[SESSION_TOKENS];
	static uint64_t leases[MATCH_BURST];
	struct lat lat = {
		.ns = (uint64_t *)(res + 1),
		.cap = LAT_CAP_PER_CLIENT,
		.fixed = 1,
	};
	struct burst b = {.req = KVPALACE__V1__REQUEST__INIT};
	struct burst rel = {.req = KVPALACE__V1__REQUEST__INIT};
	struct raw r;
	uint64_t session, ops = 0, timed = 0, stop;
	char c;

	for (uint32_t i = 0; i < SESSION_TOKENS; i++)
		toks[i] = i;
	raw_open(&r, o->socket, RPC_MODEL, &rpc_layout, o->depth);
	session = raw_session_create(&r);
	b.append = (Kvpalace__V1__AppendRequest)KVPALACE__V1__APPEND_REQUEST__INIT;
	b.commit = (Kvpalace__V1__CommitRequest)KVPALACE__V1__COMMIT_REQUEST__INIT;
	b.match = (Kvpalace__V1__MatchPrefixRequest)KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;
	b.leases = leases;
	switch (kind) {
	case PIPE_APPEND:
		b.op = KVPALACE__V1__REQUEST__OP_APPEND;
		b.req.append = &b.append;
		b.append.session_id = session;
		b.append.tokens = &b.token;
		b.append.n_tokens = 1;
		break;
	case PIPE_COMMIT:
		b.op = KVPALACE__V1__REQUEST__OP_COMMIT;
		b.req.commit = &b.commit;
		b.commit.session_id = session;
		b.commit.n_tokens = 1;
		raw_append_sync(&r, session, toks, SESSION_TOKENS);
		break;
	case PIPE_MATCH:
		b.op = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
		b.req.match_prefix = &b.match;
		b.match.pool_id = r.pool_id;
		b.match.tokens = prompt;
		b.match.n_tokens = PROMPT_TOKENS;
		raw_append_sync(&r, session, prompt, PROMPT_TOKENS);
		raw_commit_sync(&r, session, PROMPT_TOKENS);
		rel.op = KVPALACE__V1__REQUEST__OP_RELEASE;
		rel.release = (Kvpalace__V1__ReleaseRequest)KVPALACE__V1__RELEASE_REQUEST__INIT;
		rel.req.release = &rel.release;
		rel.req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
		rel.leases = leases;
		break;
	}
	b.req.op_case = (Kvpalace__V1__Request__OpCase)b.op;

	if (write(ready_fd, "r", 1) != 1)
		die("ready pipe: %s", strerror(errno));
	close(ready_fd);
	if (read(go_fd, &c, 1) != 0)
		die("go pipe");
	close(go_fd);

	stop = now_ns() + (uint64_t)(o->seconds * 1e9);
	while (now_ns() < stop) {
		uint32_t n = kind == PIPE_MATCH ? MATCH_BURST : SESSION_TOKENS;

		timed += raw_pipeline(&r, &b, n, o->depth, &lat);
		ops += n;
		/* untimed: a fresh session, or the burst's leases released */
		switch (kind) {
		case PIPE_APPEND:
			raw_commit_sync(&r, session, SESSION_TOKENS);
			raw_session_close(&r, session);
			session = raw_session_create(&r);
			b.append.session_id = session;
			break;
		case PIPE_COMMIT:
			raw_session_close(&r, session);
			session = raw_session_create(&r);
			b.commit.session_id = session;
			raw_append_sync(&r, session, toks, SESSION_TOKENS);
			break;
		case PIPE_MATCH:
			raw_pipeline(&r, &rel, n, o->depth, NULL);
			break;
		}
	}
	raw_session_close(&r, session);
	raw_close(&r);
	res->ops = ops;
	res->timed_ns = timed;
	res->n_lat = lat.n;
	res->ok = 1;
}

static void bench_pipelined_kind(const struct opts *o, enum pipe_kind kind)
{
	size_t stride = child_stride();
	uint8_t *shared;
	pid_t pids[MAX_CLIENTS];
	int ready[2], go[2];
	unsigned n_ready = 0;
	uint64_t ops = 0, n_lat = 0, *all;
	double rate = 0;
	char ch;
	int failed = 0;
	struct counters before, after;
	kvp_client *c = lib_connect(o->socket);

	/* no connection of ours is open while the clients run */
	counters_get(c, &before);
	kvp_disconnect(c);
	shared = mmap(NULL, stride * o->clients, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (shared == MAP_FAILED)
		die("mmap: %s", strerror(errno));
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
			pipe_child(o, kind, (struct child_result *)(shared + i * stride), ready[1],
				   go[0]);
			fflush(stderr);
			_exit(0);
		}
	}
	close(ready[1]);
	close(go[0]);
	while (read(ready[0], &ch, 1) == 1)
		n_ready++;
	close(ready[0]);
	close(go[1]); /* start: every child's read returns 0 */
	for (unsigned i = 0; i < o->clients; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	if (failed || n_ready != o->clients)
		die("%s: a client failed", pipe_names[kind]);

	for (unsigned i = 0; i < o->clients; i++) {
		struct child_result *res = (struct child_result *)(shared + i * stride);

		if (!res->ok || !res->timed_ns)
			die("%s: client %u reported nothing", pipe_names[kind], i);
		ops += res->ops;
		rate += (double)res->ops * 1e9 / (double)res->timed_ns;
		n_lat += res->n_lat;
	}
	c = lib_connect(o->socket);
	counters_get(c, &after);
	kvp_disconnect(c);
	check_executed(pipe_names[kind], &before, &after, (int)kind, ops);
	all = malloc(n_lat * sizeof(*all) + 1);
	if (!all)
		die("out of memory");
	n_lat = 0;
	for (unsigned i = 0; i < o->clients; i++) {
		struct child_result *res = (struct child_result *)(shared + i * stride);

		memcpy(all + n_lat, res + 1, res->n_lat * sizeof(*all));
		n_lat += res->n_lat;
	}
	/* the aggregate rate is the sum of each client's rate over its timed
	 * bursts; report() derives the same figure from ops and time */
	report(pipe_names[kind], ops, (uint64_t)((double)ops * 1e9 / rate), all, n_lat);
	free(all);
	munmap(shared, stride * o->clients);
}

static void bench_pipelined(const struct opts *o)
{
	fprintf(stderr, "rpc: %u clients (processes), %u requests in flight each, raw protocol\n",
		o->clients, o->depth);
	bench_pipelined_kind(o, PIPE_APPEND);
	bench_pipelined_kind(o, PIPE_COMMIT);
	bench_pipelined_kind(o, PIPE_MATCH);
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

static double median(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

static void bench_page_write(const struct opts *o)
{
	kvp_client *c = lib_connect(o->socket);
	kvp_pool *p;
	kvp_session *s;
	uint32_t *toks, n_tok, n_pages;
	size_t row, total, page_data;
	uint8_t *src, *dst;
	uint64_t t_arena[BW_PASSES], t_copy[BW_PASSES], x = 0x9e3779b97f4a7c15u;
	double arena_bw, copy_bw;
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
	for (int i = 0; i < BW_PASSES; i++) {
		t_arena[i] = write_in_place(s, &bw_layout, n_tok, src, row);
		t_copy[i] = write_memcpy(dst, src, total, page_data);
	}
	arena_bw = (double)total / median(t_arena, BW_PASSES);
	copy_bw = (double)total / median(t_copy, BW_PASSES);
	sample("rpc.page_write_bw", arena_bw);
	sample("ref.memcpy_bw", copy_bw);
	fprintf(stderr, "  %-24s %10.2f GB/s   memcpy %.2f GB/s\n", "rpc.page_write_bw", arena_bw,
		copy_bw);

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
	fputs("usage: kvp-bench-rpc --socket PATH [--seconds S] [--clients N] [--depth D]\n"
	      "                     [--bw-mib M] [--only unpipelined,pipelined,bw]\n"
	      "Measures Append, Commit and MatchPrefix round trips against a running\n"
	      "kvpalaced and the in-place page write bandwidth; prints 'sample NAME VALUE'\n"
	      "lines (rates in ops/s or bytes/ns = GB/s, latencies in microseconds).\n",
	      f);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"seconds", required_argument, NULL, 't'},
		{"clients", required_argument, NULL, 'c'},
		{"depth", required_argument, NULL, 'd'},
		{"bw-mib", required_argument, NULL, 'b'},
		{"only", required_argument, NULL, 'o'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct opts o = {
		.seconds = 2,
		.clients = 4,
		.depth = 16,
		.bw_mib = 64,
		.do_unpipelined = 1,
		.do_pipelined = 1,
		.do_bw = 1,
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (ch) {
		case 's':
			o.socket = optarg;
			break;
		case 't':
			o.seconds = strtod(optarg, NULL);
			break;
		case 'c':
			o.clients = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'd':
			o.depth = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'b':
			o.bw_mib = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'o':
			o.do_unpipelined = strstr(optarg, "unpipelined") != NULL;
			o.do_pipelined = strstr(optarg, ",pipelined") != NULL ||
					 strncmp(optarg, "pipelined", 9) == 0;
			o.do_bw = strstr(optarg, "bw") != NULL;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!o.socket || optind != argc || !(o.seconds > 0 && o.seconds < 3600) || o.clients < 1 ||
	    o.clients > MAX_CLIENTS || o.depth < 1 || o.depth > MAX_DEPTH || o.bw_mib < 1 ||
	    o.bw_mib > 4096) {
		usage(stderr);
		return 2;
	}
	for (uint32_t i = 0; i < PROMPT_TOKENS; i++)
		prompt[i] = PROMPT_BASE + i;

	if (o.do_unpipelined)
		bench_unpipelined(&o);
	if (o.do_pipelined)
		bench_pipelined(&o);
	if (o.do_bw)
		bench_page_write(&o);
	return 0;
}
