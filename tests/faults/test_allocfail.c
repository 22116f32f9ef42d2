/* tests/faults/test_allocfail.c — allocation failures through every request
 * path of a real daemon.
 *
 * kvpalaced runs with the allocfail module preloaded (allocfail.h). For
 * each request type, for N = 1, 2, ... the test prepares what the request
 * needs (nothing armed), arms the module to fail the Nth allocation the
 * daemon makes from then on, sends the request, waits for the reply and
 * disarms. It goes on until a request gets through without reaching the
 * Nth allocation: every allocation of that path has then failed once.
 * After each one:
 *  - the reply is an error only when an allocation failed, a success
 *    (the failure absorbed: a page left out of the index, a reply sent
 *    without its lists) is of the right kind, and a closed connection
 *    (where no reply could be made) happens only after a failure too;
 *  - a request that failed leaves nothing behind: sent again, it gets the
 *    answer it would have got the first time (a reservation, a commit, a
 *    lease's carried tokens, a pool, a session, a checkpoint);
 *  - the daemon is alive and serves a fresh client;
 * and after each request type every session is closed and every lease
 * released, and the pool's pages balance: free + indexed = all. One
 * daemon serves every N of every request type; it must stop with status
 * 0 (under ASan that includes no leak). The -Ddebug-checks build also
 * checks page accounting after every request.
 *
 * The test prints, per request type, the allocations it failed and what
 * came of them. $KVP_ALLOCFAIL_VERBOSE=1 prints each failed allocation's
 * caller (object + offset, for addr2line).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "allocfail.h"
#include "harness.h"
#include "status.h"

#define MODEL	 "af-model"
#define BT	 16u
#define MAX_N	 400u /* allocations one request may make before the test gives up */
#define N_LONG	 640u /* 40 pages, matched in three chunks */
#define N_CKPT	 200u
#define SEQ_M	 11u /* 64 tokens indexed: single-chunk matches */
#define SEQ_LONG 12u
#define SEQ_DUP	 13u /* 40 tokens indexed: commits that dedup */
#define SEQ_CKPT 14u
#define SEQ_MISS 15u

typedef Kvpalace__V1__Request Req;
typedef Kvpalace__V1__Response Resp;

static const char *const daemon_args[] = {
	"--host-pool-size", "8M", "--disk-pool-size", "0", "--log-level", "notice", NULL};

/* One armed request: what the module saw. */
struct shot {
	uint64_t n;
	int fired;
	uint64_t count;
	char what[16];
	char caller[300];
};

/* Outcomes of one request type over every N. */
struct tally {
	const char *name;
	uint64_t points; /* allocations failed (N values that fired) */
	uint32_t errors, closed, absorbed, retried;
	uint32_t shorter;      /* matches cut short by a failure (a miss, not an error) */
	uint32_t statuses[32]; /* error replies by status */
};

struct fx {
	struct harness h;
	struct allocfail_ctl *ctl;
	char ctl_path[128];
	uint64_t pool_id;
	uint32_t tok_m[64], tok_long[N_LONG], tok_dup[40], tok_ckpt[N_CKPT];
	uint64_t salt;	/* makes each N's fresh tokens differ */
	uint32_t *conv; /* disk group: N_CONV conversations of CONV tokens */
	kvp_client *kc; /* disk group: a library client */
	kvp_pool *kp;
	int verbose;
	int ineffective; /* the daemon's allocations do not reach the module */
	struct tally *t;
	uint64_t total_points;
	uint32_t n_types;
};

#define FAIL(x, ...)                                                                               \
	do {                                                                                       \
		fprintf(stderr, "%s, N=%llu: ", (x)->t ? (x)->t->name : "setup",                   \
			(unsigned long long)cur_n);                                                \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);                                 \
		return -1;                                                                         \
	} while (0)

#define CHECK(x, cond)                                                                             \
	do {                                                                                       \
		if (!(cond))                                                                       \
			FAIL(x, "check failed: %s", #cond);                                        \
	} while (0)

#define CHECK_EQ(x, a, b)                                                                          \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		if (a_ != b_)                                                                      \
			FAIL(x, "%s == %s failed: %lld != %lld", #a, #b, a_, b_);                  \
	} while (0)

static uint64_t cur_n; /* for messages */

/* ---- the control block ---------------------------------------------------- */

static void arm(struct fx *x, uint64_t n)
{
	struct allocfail_ctl *c = x->ctl;

	__atomic_store_n(&c->armed, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&c->fired, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&c->count, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&c->target, n, __ATOMIC_SEQ_CST);
	if (n)
		__atomic_store_n(&c->armed, 1, __ATOMIC_SEQ_CST);
}

static void disarm(struct fx *x, struct shot *s)
{
	struct allocfail_ctl *c = x->ctl;

	__atomic_store_n(&c->armed, 0, __ATOMIC_SEQ_CST);
	if (!s)
		return;
	s->fired = (int)__atomic_load_n(&c->fired, __ATOMIC_SEQ_CST);
	s->count = __atomic_load_n(&c->count, __ATOMIC_SEQ_CST);
	s->caller[0] = s->what[0] = '\0';
	if (s->fired) {
		snprintf(s->what, sizeof(s->what), "%.15s", c->what);
		snprintf(s->caller, sizeof(s->caller), "%.255s+0x%llx", c->caller_obj,
			 (unsigned long long)c->caller_off);
	}
}

static int make_ctl(struct fx *x)
{
	const char *tmp = getenv("TMPDIR");
	int fd;
	void *m;

	if (!tmp || strlen(tmp) > 80)
		tmp = "/tmp";
	snprintf(x->ctl_path, sizeof(x->ctl_path), "%s/kvp-allocfail-XXXXXX", tmp);
	fd = mkstemp(x->ctl_path);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, ALLOCFAIL_CTL_BYTES) < 0) {
		close(fd);
		return -1;
	}
	m = mmap(NULL, ALLOCFAIL_CTL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return -1;
	x->ctl = m;
	x->ctl->magic = ALLOCFAIL_MAGIC;
	return 0;
}

/* Starts kvpalaced with the module preloaded (and, under ASan, told that
 * the sanitizer runtime is not first in the library list). */
static int start_daemon(struct fx *x, const char *const *args)
{
	const char *so = getenv("KVP_ALLOCFAIL_SO");
	const char *asan = getenv("ASAN_OPTIONS");
	char *old = asan ? strdup(asan) : NULL;
	char opts[1024];
	int ret;

	if (!so || !*so) {
		fprintf(stderr, "$KVP_ALLOCFAIL_SO is not set (meson sets it)\n");
		return -1;
	}
	snprintf(opts, sizeof(opts), "%s%sverify_asan_link_order=0", old ? old : "",
		 old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", opts, 1);
	setenv("LD_PRELOAD", so, 1);
	setenv(ALLOCFAIL_ENV, x->ctl_path, 1);
	x->ctl->loaded = 0;
	ret = harness_start(&x->h, args);
	unsetenv("LD_PRELOAD");
	unsetenv(ALLOCFAIL_ENV);
	if (old)
		setenv("ASAN_OPTIONS", old, 1);
	else
		unsetenv("ASAN_OPTIONS");
	free(old);
	if (ret == 0 && !__atomic_load_n(&x->ctl->loaded, __ATOMIC_SEQ_CST)) {
		fprintf(stderr, "the allocfail module did not load into kvpalaced\n");
		return -1;
	}
	if (ret == 0) {
		/* Its first allocation for a new connection must reach the
		 * module (not so where a tool replaces malloc underneath). */
		struct raw r;
		struct shot s;

		arm(x, 1);
		if (raw_open(&r, x->h.sock) == 0) {
			(void)raw_hello(&r);
			raw_close(&r);
		}
		disarm(x, &s);
		x->ineffective = !s.fired;
		if (x->ineffective)
			fprintf(stderr, "kvpalaced's allocations do not reach the allocfail module "
					"(does a tool replace malloc?): skipping\n");
	}
	return ret;
}

/* ---- raw requests ------------------------------------------------------- */

static void req_init(Req *req, Kvpalace__V1__Request__OpCase op)
{
	static uint64_t next_id = 1u << 20;

	kvpalace__v1__request__init(req);
	req->id = next_id++;
	req->op_case = op;
}

/* Sends req and waits for its reply. Returns the reply's status as a
 * negative errno (0: OK) with *ret_resp, or -ECONNRESET, -EAGAIN, ... */
static int call(struct raw *r, Req *req, Resp **ret_resp)
{
	Resp *resp;
	int n = raw_call(r, req, &resp, NULL);

	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	if (ret_resp)
		*ret_resp = resp;
	return status_to_errno(resp->status) ? -status_to_errno(resp->status) : 0;
}

static int append(struct raw *r, uint64_t sid, uint32_t *tokens, size_t n)
{
	Req req;
	Kvpalace__V1__AppendRequest op;

	raw_req_append(&req, &op, sid, tokens, n);
	return call(r, &req, NULL);
}

static int commit(struct raw *r, uint64_t sid, uint64_t n)
{
	Req req;
	Kvpalace__V1__CommitRequest op;

	raw_req_commit(&req, &op, sid, n);
	return call(r, &req, NULL);
}

/* A session of the pool holding tokens[0..n), committed when `commit_it`. */
static int session_with(struct raw *r, uint64_t pool, uint32_t *tokens, size_t n, int commit_it,
			uint64_t *ret_sid)
{
	int ret = raw_create_session(r, pool, ret_sid);

	if (ret == 0 && n)
		ret = append(r, *ret_sid, tokens, n);
	if (ret == 0 && n && commit_it)
		ret = commit(r, *ret_sid, n);
	return ret;
}

static void req_match(Req *req, Kvpalace__V1__MatchPrefixRequest *op, uint64_t pool,
		      uint32_t *tokens, size_t n, uint64_t lease_id)
{
	raw_req_match(req, op, pool, tokens, n);
	if (lease_id) {
		op->has_lease_id = 1;
		op->lease_id = lease_id;
	}
}

/* MatchPrefix; returns 0 with the lease (0 for none) and tokens matched. */
static int match(struct raw *r, uint64_t pool, uint32_t *tokens, size_t n, uint64_t lease_id,
		 uint64_t *ret_lease, uint64_t *ret_matched)
{
	Req req;
	Kvpalace__V1__MatchPrefixRequest op;
	Resp *resp;
	int ret;

	req_match(&req, &op, pool, tokens, n, lease_id);
	ret = call(r, &req, &resp);
	if (ret < 0)
		return ret;
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX)
		return -EBADMSG;
	*ret_lease = resp->match_prefix->lease_id;
	*ret_matched = resp->match_prefix->matched_tokens;
	return 0;
}

static void req_checkpoint(Req *req, Kvpalace__V1__CheckpointRequest *op, uint64_t sid,
			   const char *name)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_CHECKPOINT);
	kvpalace__v1__checkpoint_request__init(op);
	op->session_id = sid;
	op->name = (char *)name;
	req->checkpoint = op;
}

static void req_restore(Req *req, Kvpalace__V1__RestoreRequest *op, uint64_t pool, const char *name)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_RESTORE);
	kvpalace__v1__restore_request__init(op);
	op->has_pool_id = 1;
	op->pool_id = pool;
	op->name = (char *)name;
	req->restore = op;
}

/* Restore; returns 0 with the new session and its tokens. */
static int restore(struct raw *r, uint64_t pool, const char *name, uint64_t *ret_sid,
		   uint64_t *ret_tokens)
{
	Req req;
	Kvpalace__V1__RestoreRequest op;
	Resp *resp;
	int ret;

	req_restore(&req, &op, pool, name);
	ret = call(r, &req, &resp);
	if (ret < 0)
		return ret;
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_RESTORE)
		return -EBADMSG;
	*ret_sid = resp->restore->session_id;
	*ret_tokens = resp->restore->n_tokens;
	return 0;
}

static int drop_pool(struct fx *x, uint64_t pool)
{
	struct raw a;
	Req req;
	Kvpalace__V1__DropPoolRequest op;
	int ret = raw_open(&a, x->h.admin_sock);

	if (ret < 0)
		return ret;
	req_init(&req, KVPALACE__V1__REQUEST__OP_DROP_POOL);
	kvpalace__v1__drop_pool_request__init(&op);
	op.pool_id = pool;
	op.has_force = op.force = 1;
	req.drop_pool = &op;
	ret = raw_hello(&a);
	if (ret == 0)
		ret = call(&a, &req, NULL);
	raw_close(&a);
	return ret;
}

/* Pools the daemon lists. */
static int count_pools(struct fx *x, uint32_t *ret)
{
	struct raw a;
	Req req;
	Kvpalace__V1__StatsRequest op;
	Resp *resp;
	int ret2 = raw_open(&a, x->h.admin_sock);

	if (ret2 < 0)
		return ret2;
	raw_req_stats(&req, &op);
	ret2 = raw_hello(&a);
	if (ret2 == 0)
		ret2 = call(&a, &req, &resp);
	if (ret2 == 0)
		*ret = (uint32_t)resp->stats->n_pools;
	raw_close(&a);
	return ret2;
}

/* ---- one armed request ---------------------------------------------------- */

/* Sends req on r with the nth allocation armed to fail, waits for what
 * comes back and disarms. Returns 1 with the reply in *ret_resp (and its
 * fd in *ret_fd when not NULL), 0 when the daemon closed the connection,
 * or -1 after printing why (no answer within the timeout, garbage). */
static int shoot(struct fx *x, struct raw *r, Req *req, uint64_t n, struct shot *s, Resp **ret_resp,
		 int *ret_fd)
{
	int ret;

	s->n = n;
	arm(x, n);
	ret = raw_send(r, req);
	if (ret >= 0)
		ret = raw_recv(r, ret_resp, ret_fd);
	disarm(x, s);
	if (ret == -EPIPE || ret == -ECONNRESET)
		ret = 0;
	if (ret == 1 && (*ret_resp)->id != req->id)
		FAIL(x, "reply %llu to request %llu", (unsigned long long)(*ret_resp)->id,
		     (unsigned long long)req->id);
	if (ret < 0)
		FAIL(x, "no reply: %s (a hang?)%s%s", strerror(-ret), s->fired ? "; failed " : "",
		     s->fired ? s->caller : "");
	return ret;
}

/* Judges what came of an armed request: an error or a closed connection
 * only after an allocation failed. Returns 0 (*ret_ok says whether the
 * reply was a success) or -1. */
static int judge(struct fx *x, int got, const Resp *resp, const struct shot *s, int *ret_ok)
{
	struct tally *t = x->t;

	*ret_ok = 0;
	if (s->fired) {
		t->points++;
		if (x->verbose)
			fprintf(stderr, "  %s N=%llu: failed %s called from %s -> %s\n", t->name,
				(unsigned long long)s->n, s->what, s->caller,
				got == 0       ? "connection closed"
				: resp->status ? resp->error ? resp->error : "error"
					       : "ok");
	}
	if (got == 0) {
		if (!s->fired)
			FAIL(x, "connection closed though no allocation failed");
		t->closed++;
		return 0;
	}
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK) {
		if (!s->fired)
			FAIL(x, "error reply (%s) though no allocation failed",
			     resp->error ? resp->error : "no reason");
		t->errors++;
		if ((unsigned)resp->status < 32)
			t->statuses[resp->status]++;
		return 0;
	}
	if (s->fired)
		t->absorbed++;
	*ret_ok = 1;
	return 0;
}

/* The daemon is alive and a fresh client gets Hello and Stats answered. */
static int still_serving(struct fx *x)
{
	struct harness_pool_info info;
	struct raw r;
	int ret;

	CHECK(x, harness_daemon_alive(&x->h));
	ret = raw_open(&r, x->h.sock);
	CHECK_EQ(x, ret, 0);
	ret = raw_hello(&r);
	if (ret == 0)
		ret = raw_pool_info(&r, x->pool_id, &info);
	raw_close(&r);
	CHECK_EQ(x, ret, 0);
	return 0;
}

/* ---- the request types ------------------------------------------------------ */

/* Each runs one N: prepares (nothing armed), shoots, judges, checks a
 * success, retries a failure, cleans up. Returns 0, or -1 after printing.
 * *fired says whether the Nth allocation was reached. */
typedef int (*case_fn)(struct fx *x, uint64_t n, int *fired);

static int case_connect(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__HelloRequest op;
	Resp *resp = NULL;
	int got, ok;

	/* The allocations of accepting come first: arm before connecting. */
	s.n = n;
	arm(x, n);
	got = raw_open(&r, x->h.sock);
	if (got == 0) {
		raw_req_hello(&req, &op, KVP_PROTOCOL_VERSION);
		got = raw_send(&r, &req);
		if (got >= 0)
			got = raw_recv(&r, &resp, NULL);
	}
	disarm(x, &s);
	*fired = s.fired;
	if (got == -EPIPE || got == -ECONNRESET)
		got = 0;
	CHECK(x, got >= 0);
	if (judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok)
		CHECK(x, resp->op_case == KVPALACE__V1__RESPONSE__OP_HELLO);
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	return -1;
}

static int case_hello(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__HelloRequest op;
	Resp *resp;
	int got, ok;

	/* A first Hello, unarmed: the daemon has accepted the connection. */
	CHECK_EQ(x, raw_open(&r, x->h.sock), 0);
	if (raw_hello(&r) != 0)
		goto fail;
	raw_req_hello(&req, &op, KVP_PROTOCOL_VERSION);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok && resp->op_case != KVPALACE__V1__RESPONSE__OP_HELLO)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	return -1;
}

/* OpenPool of the existing pool, or (fresh) of a new model: a new pool
 * arena, which is dropped again afterwards. */
static int open_pool(struct fx *x, uint64_t n, int *fired, int fresh)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__HelloRequest hop;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	Resp *resp;
	char model[48];
	uint32_t before = 0, after = 0;
	uint64_t pool = 0;
	int got, ok, fd = -1;

	snprintf(model, sizeof(model), fresh ? "af-fresh-%llu" : MODEL, (unsigned long long)n);
	CHECK_EQ(x, count_pools(x, &before), 0);
	CHECK_EQ(x, raw_open(&r, x->h.sock), 0);
	raw_req_hello(&req, &hop, KVP_PROTOCOL_VERSION);
	if (call(&r, &req, NULL) != 0)
		goto fail;
	raw_req_open_pool(&req, &op, &lay, model, &harness_layout);
	got = shoot(x, &r, &req, n, &s, &resp, &fd);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok) {
		if (resp->op_case != KVPALACE__V1__RESPONSE__OP_OPEN_POOL || fd < 0)
			goto fail;
		pool = resp->open_pool->pool_id;
		if (!fresh && pool != x->pool_id)
			goto fail;
	} else if (got == 1 && fresh) {
		/* Nothing was left behind: the pool did not appear, and
		 * asking again makes it. */
		CHECK_EQ(x, count_pools(x, &after), 0);
		CHECK_EQ(x, after, before);
		if (fd >= 0)
			close(fd);
		fd = -1;
		x->t->retried++;
		if (call(&r, &req, &resp) != 0 ||
		    resp->op_case != KVPALACE__V1__RESPONSE__OP_OPEN_POOL)
			goto fail;
		pool = resp->open_pool->pool_id;
	}
	if (fd >= 0)
		close(fd);
	raw_close(&r);
	if (fresh && pool) {
		CHECK_EQ(x, drop_pool(x, pool), 0);
		CHECK_EQ(x, count_pools(x, &after), 0);
		CHECK_EQ(x, after, before);
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	raw_close(&r);
	FAIL(x, "open pool");
}

static int case_open_pool(struct fx *x, uint64_t n, int *fired)
{
	return open_pool(x, n, fired, 0);
}

static int case_open_new_pool(struct fx *x, uint64_t n, int *fired)
{
	return open_pool(x, n, fired, 1);
}

/* A connection with Hello and OpenPool done. */
static int client(struct fx *x, struct raw *r)
{
	uint64_t pool;

	CHECK_EQ(x, raw_open(r, x->h.sock), 0);
	if (raw_open_pool(r, MODEL, &harness_layout, &pool) != 0 || pool != x->pool_id) {
		raw_close(r);
		FAIL(x, "cannot open the pool");
	}
	return 0;
}

static int case_create_session(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__CreateSessionRequest op;
	Resp *resp;
	int got, ok;
	uint64_t sid = 0;

	if (client(x, &r) < 0)
		return -1;
	raw_req_create_session(&req, &op, x->pool_id);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok) {
		if (resp->op_case != KVPALACE__V1__RESPONSE__OP_CREATE_SESSION)
			goto fail;
		sid = resp->create_session->session_id;
	} else if (got == 1) {
		x->t->retried++;
		if (raw_create_session(&r, x->pool_id, &sid) != 0)
			goto fail;
	}
	if (sid && raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "create session");
}

/* Fresh tokens for this N (never indexed before). */
static void fresh_tokens(struct fx *x, uint32_t *tokens, size_t n)
{
	harness_tokens(tokens, n, (uint32_t)(1000 + x->salt++), 0);
}

static int case_append(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__AppendRequest op;
	uint32_t tokens[40];
	Resp *resp;
	int got, ok;
	uint64_t sid;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (raw_create_session(&r, x->pool_id, &sid) != 0)
		goto fail;
	raw_req_append(&req, &op, sid, tokens, 40);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (!ok && got == 1) {
		/* Nothing was reserved: the same append starts at token 0. */
		x->t->retried++;
		raw_req_append(&req, &op, sid, tokens, 40);
		if (call(&r, &req, &resp) != 0)
			goto fail;
		ok = 1;
	}
	if (ok && (resp->op_case != KVPALACE__V1__RESPONSE__OP_APPEND ||
		   resp->append->first_token != 0 || resp->append->n_page_slots != 3))
		goto fail;
	if (got == 1 && raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "append");
}

/* Commit of 40 tokens: fresh ones (their two full pages enter the index)
 * or ones indexed already (dedup). */
static int commit_case(struct fx *x, uint64_t n, int *fired, int dup)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__CommitRequest op;
	uint32_t tokens[40];
	Resp *resp;
	int got, ok;
	uint64_t sid;

	if (dup)
		memcpy(tokens, x->tok_dup, sizeof(tokens));
	else
		fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (session_with(&r, x->pool_id, tokens, 40, 0, &sid) != 0)
		goto fail;
	raw_req_commit(&req, &op, sid, 40);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (!ok && got == 1) {
		/* Nothing was committed: committing again does it. */
		x->t->retried++;
		raw_req_commit(&req, &op, sid, 40);
		if (call(&r, &req, &resp) != 0)
			goto fail;
		ok = 1;
	}
	if (ok && (resp->op_case != KVPALACE__V1__RESPONSE__OP_COMMIT ||
		   resp->commit->committed_tokens != 40))
		goto fail;
	if (got == 1 && raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "commit");
}

static int case_commit(struct fx *x, uint64_t n, int *fired)
{
	return commit_case(x, n, fired, 0);
}

static int case_commit_dedup(struct fx *x, uint64_t n, int *fired)
{
	return commit_case(x, n, fired, 1);
}

static int case_close_session(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__CloseSessionRequest op;
	uint32_t tokens[40];
	Resp *resp;
	int got, ok;
	uint64_t sid;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (session_with(&r, x->pool_id, tokens, 40, 1, &sid) != 0)
		goto fail;
	raw_req_close_session(&req, &op, sid);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (!ok && got == 1 && raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "close session");
}

/* MatchPrefix of 64 indexed tokens (a lease of 4 pages), of 64 unknown
 * ones (a miss, no lease). */
static int match_case(struct fx *x, uint64_t n, int *fired, int miss)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__MatchPrefixRequest op;
	uint32_t tokens[64];
	Resp *resp;
	uint64_t lease = 0, matched = 0, want = miss ? 0 : 64;
	int got, ok;

	if (miss)
		harness_tokens(tokens, 64, SEQ_MISS, 0);
	else
		memcpy(tokens, x->tok_m, sizeof(tokens));
	if (client(x, &r) < 0)
		return -1;
	req_match(&req, &op, x->pool_id, tokens, 64, 0);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok) {
		if (resp->op_case != KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX)
			goto fail;
		lease = resp->match_prefix->lease_id;
		matched = resp->match_prefix->matched_tokens;
	} else if (got == 1) {
		x->t->retried++;
		if (match(&r, x->pool_id, tokens, 64, 0, &lease, &matched) != 0)
			goto fail;
	}
	if (got == 1 && matched != want) {
		raw_close(&r);
		FAIL(x, "matched %llu tokens, want %llu", (unsigned long long)matched,
		     (unsigned long long)want);
	}
	raw_close(&r); /* releases the lease */
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "match");
}

static int case_match(struct fx *x, uint64_t n, int *fired)
{
	return match_case(x, n, fired, 0);
}

static int case_match_miss(struct fx *x, uint64_t n, int *fired)
{
	return match_case(x, n, fired, 1);
}

/* A long prompt matched in three chunks, the second armed: 264 tokens
 * (16 pages and 8 carried), 264 more (the carry completes page 17, whose
 * pin grows the lease's tables: 33 pages), then the last 112: all 640
 * match. A failed second chunk sent again must give what it would have. */
static int case_match_chunks(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__MatchPrefixRequest op;
	Resp *resp;
	uint64_t lease = 0, matched = 0, l2;
	int got, ok;

	if (client(x, &r) < 0)
		return -1;
	if (match(&r, x->pool_id, x->tok_long, 264, 0, &lease, &matched) != 0 || matched != 256)
		goto fail;
	req_match(&req, &op, x->pool_id, x->tok_long + 264, 264, lease);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (got == 0) {
		raw_close(&r);
		return 0;
	}
	if (ok) {
		matched = resp->match_prefix->matched_tokens;
	} else {
		x->t->retried++;
		if (match(&r, x->pool_id, x->tok_long + 264, 264, lease, &l2, &matched) != 0)
			goto fail;
	}
	if (matched != 528) {
		raw_close(&r);
		FAIL(x, "second chunk matched %llu tokens in all, want 528",
		     (unsigned long long)matched);
	}
	if (match(&r, x->pool_id, x->tok_long + 528, N_LONG - 528, lease, &l2, &matched) != 0 ||
	    matched != N_LONG) {
		raw_close(&r);
		FAIL(x, "third chunk: %llu tokens in all, want %u", (unsigned long long)matched,
		     N_LONG);
	}
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "chunked match");
}

static int case_release(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__ReleaseRequest op;
	Resp *resp;
	uint64_t lease, matched;
	int got, ok;

	if (client(x, &r) < 0)
		return -1;
	if (match(&r, x->pool_id, x->tok_m, 64, 0, &lease, &matched) != 0 || !lease)
		goto fail;
	raw_req_release(&req, &op, lease);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "release");
}

/* Fork of a session of 40 committed tokens (two shared pages and a copy
 * of the partial third), or ForkLease of a 64-token lease. */
static int fork_case(struct fx *x, uint64_t n, int *fired, int of_lease)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__ForkRequest op;
	Kvpalace__V1__ForkLeaseRequest lop;
	uint32_t tokens[40];
	Resp *resp;
	uint64_t sid = 0, fid = 0, lease = 0, matched;
	int got, ok;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (of_lease) {
		if (match(&r, x->pool_id, x->tok_m, 64, 0, &lease, &matched) != 0 || !lease)
			goto fail;
		req_init(&req, KVPALACE__V1__REQUEST__OP_FORK_LEASE);
		kvpalace__v1__fork_lease_request__init(&lop);
		lop.lease_id = lease;
		lop.n_tokens = 40;
		req.fork_lease = &lop;
	} else {
		if (session_with(&r, x->pool_id, tokens, 40, 1, &sid) != 0)
			goto fail;
		raw_req_fork(&req, &op, sid, 40);
	}
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (got == 0) {
		raw_close(&r);
		return 0;
	}
	if (!ok) {
		x->t->retried++;
		req.id += 1u << 30; /* a new request, the same operation */
		if (call(&r, &req, &resp) != 0)
			goto fail;
	}
	if (resp->op_case !=
	    (of_lease ? KVPALACE__V1__RESPONSE__OP_FORK_LEASE : KVPALACE__V1__RESPONSE__OP_FORK))
		goto fail;
	fid = of_lease ? resp->fork_lease->session_id : resp->fork->session_id;
	if ((of_lease ? resp->fork_lease->n_tokens : resp->fork->n_tokens) != 40)
		goto fail;
	if (raw_close_session(&r, fid) != 0 || (sid && raw_close_session(&r, sid) != 0))
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "fork");
}

static int case_fork(struct fx *x, uint64_t n, int *fired)
{
	return fork_case(x, n, fired, 0);
}

static int case_fork_lease(struct fx *x, uint64_t n, int *fired)
{
	return fork_case(x, n, fired, 1);
}

/* Truncate to 24 tokens of a session whose pages a fork shares: the new
 * last page is copied first. */
static int case_truncate(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__TruncateRequest op;
	Kvpalace__V1__ForkRequest fop;
	uint32_t tokens[40];
	Resp *resp;
	uint64_t sid, fid;
	int got, ok;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (session_with(&r, x->pool_id, tokens, 40, 1, &sid) != 0)
		goto fail;
	raw_req_fork(&req, &fop, sid, 32);
	if (call(&r, &req, &resp) != 0)
		goto fail;
	fid = resp->fork->session_id;
	raw_req_truncate(&req, &op, sid, 24);
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (got == 0) {
		raw_close(&r);
		return 0;
	}
	if (!ok) {
		x->t->retried++;
		raw_req_truncate(&req, &op, sid, 24);
		if (call(&r, &req, &resp) != 0)
			goto fail;
	}
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_TRUNCATE || resp->truncate->n_tokens != 24)
		goto fail;
	if (raw_close_session(&r, sid) != 0 || raw_close_session(&r, fid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "truncate");
}

/* Requests that change nothing: Stats, ListSessions, SessionPages,
 * Prefetch, ListCheckpoints (on a connection with a session open). */
static int readonly_case(struct fx *x, uint64_t n, int *fired, Kvpalace__V1__Request__OpCase what)
{
	struct raw r;
	struct shot s;
	Req req;
	union {
		Kvpalace__V1__StatsRequest stats;
		Kvpalace__V1__ListSessionsRequest list;
		Kvpalace__V1__SessionPagesRequest pages;
		Kvpalace__V1__PrefetchRequest prefetch;
		Kvpalace__V1__ListCheckpointsRequest ckpts;
	} op;
	uint32_t tokens[40];
	Resp *resp;
	uint64_t sid;
	int got, ok;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (session_with(&r, x->pool_id, tokens, 40, 1, &sid) != 0)
		goto fail;
	switch (what) {
	case KVPALACE__V1__REQUEST__OP_STATS:
		raw_req_stats(&req, &op.stats);
		break;
	case KVPALACE__V1__REQUEST__OP_LIST_SESSIONS:
		raw_req_list_sessions(&req, &op.list, x->pool_id);
		break;
	case KVPALACE__V1__REQUEST__OP_SESSION_PAGES:
		raw_req_session_pages(&req, &op.pages, sid, 0);
		break;
	case KVPALACE__V1__REQUEST__OP_PREFETCH:
		req_init(&req, what);
		kvpalace__v1__prefetch_request__init(&op.prefetch);
		op.prefetch.pool_id = x->pool_id;
		op.prefetch.tokens = x->tok_m;
		op.prefetch.n_tokens = 64;
		req.prefetch = &op.prefetch;
		break;
	default:
		req_init(&req, KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS);
		kvpalace__v1__list_checkpoints_request__init(&op.ckpts);
		req.list_checkpoints = &op.ckpts;
		break;
	}
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok && (int)resp->op_case != (int)req.op_case)
		goto fail;
	if (got == 1 && raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "read-only request %d", (int)what);
}

static int case_stats(struct fx *x, uint64_t n, int *fired)
{
	return readonly_case(x, n, fired, KVPALACE__V1__REQUEST__OP_STATS);
}

static int case_list_sessions(struct fx *x, uint64_t n, int *fired)
{
	return readonly_case(x, n, fired, KVPALACE__V1__REQUEST__OP_LIST_SESSIONS);
}

static int case_session_pages(struct fx *x, uint64_t n, int *fired)
{
	return readonly_case(x, n, fired, KVPALACE__V1__REQUEST__OP_SESSION_PAGES);
}

static int case_prefetch(struct fx *x, uint64_t n, int *fired)
{
	return readonly_case(x, n, fired, KVPALACE__V1__REQUEST__OP_PREFETCH);
}

static int case_list_checkpoints(struct fx *x, uint64_t n, int *fired)
{
	return readonly_case(x, n, fired, KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS);
}

/* Checkpoint of a 200-token session under the name "af-ck", rewritten at
 * every N: a success restores to 200 tokens; a failure sent again
 * succeeds. */
static int case_checkpoint(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__CheckpointRequest op;
	Resp *resp;
	uint64_t sid, rid, nt;
	int got, ok;

	if (client(x, &r) < 0)
		return -1;
	if (session_with(&r, x->pool_id, x->tok_ckpt, N_CKPT, 1, &sid) != 0)
		goto fail;
	req_checkpoint(&req, &op, sid, "af-ck");
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (got == 0) {
		raw_close(&r);
		return 0;
	}
	if (!ok) {
		x->t->retried++;
		req_checkpoint(&req, &op, sid, "af-ck");
		if (call(&r, &req, &resp) != 0)
			goto fail;
	}
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_CHECKPOINT ||
	    resp->checkpoint->n_tokens != N_CKPT)
		goto fail;
	if (restore(&r, x->pool_id, "af-ck", &rid, &nt) != 0 || nt != N_CKPT)
		goto fail;
	if (raw_close_session(&r, rid) != 0 || raw_close_session(&r, sid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "checkpoint");
}

static int case_restore(struct fx *x, uint64_t n, int *fired)
{
	struct raw r;
	struct shot s;
	Req req;
	Kvpalace__V1__RestoreRequest op;
	Resp *resp;
	uint64_t rid = 0, nt = 0;
	int got, ok;

	if (client(x, &r) < 0)
		return -1;
	req_restore(&req, &op, x->pool_id, "af-rs");
	got = shoot(x, &r, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (got == 0) {
		raw_close(&r);
		return 0;
	}
	if (ok) {
		if (resp->op_case != KVPALACE__V1__RESPONSE__OP_RESTORE)
			goto fail;
		rid = resp->restore->session_id;
		nt = resp->restore->n_tokens;
	} else {
		x->t->retried++;
		if (restore(&r, x->pool_id, "af-rs", &rid, &nt) != 0)
			goto fail;
	}
	if (nt != N_CKPT || raw_close_session(&r, rid) != 0)
		goto fail;
	raw_close(&r);
	return 0;
fail:
	raw_close(&r);
	FAIL(x, "restore");
}

/* Admin operations on the admin socket: Stats (every tenant),
 * ConfigShow, ConfigReload, ShowSession, Evict (the host tier, one page
 * at most: indexed pages of a closed session), DropSession, DropPool (of
 * a pool made for it) and Warmup (of the tenant's checkpoint "af-rs"). A
 * failed DropPool or Warmup sent again succeeds. */
static int admin_case(struct fx *x, uint64_t n, int *fired, Kvpalace__V1__Request__OpCase what)
{
	struct raw r, a;
	struct shot s;
	Req req;
	union {
		Kvpalace__V1__StatsRequest stats;
		Kvpalace__V1__ConfigShowRequest show;
		Kvpalace__V1__ConfigReloadRequest reload;
		Kvpalace__V1__ShowSessionRequest session;
		Kvpalace__V1__EvictRequest evict;
		Kvpalace__V1__DropSessionRequest drop;
		Kvpalace__V1__DropPoolRequest drop_pool;
		Kvpalace__V1__WarmupRequest warmup;
	} op;
	uint32_t tokens[40], before = 0, after = 0;
	Resp *resp;
	uint64_t sid, pool = 0;
	int got, ok;

	fresh_tokens(x, tokens, 40);
	if (client(x, &r) < 0)
		return -1;
	if (raw_open(&a, x->h.admin_sock) != 0) {
		raw_close(&r);
		FAIL(x, "admin socket");
	}
	if (raw_hello(&a) != 0 || session_with(&r, x->pool_id, tokens, 40, 1, &sid) != 0)
		goto fail;
	req_init(&req, what);
	switch (what) {
	case KVPALACE__V1__REQUEST__OP_STATS:
		kvpalace__v1__stats_request__init(&op.stats);
		req.stats = &op.stats;
		break;
	case KVPALACE__V1__REQUEST__OP_CONFIG_SHOW:
		kvpalace__v1__config_show_request__init(&op.show);
		req.config_show = &op.show;
		break;
	case KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD:
		kvpalace__v1__config_reload_request__init(&op.reload);
		req.config_reload = &op.reload;
		break;
	case KVPALACE__V1__REQUEST__OP_SHOW_SESSION:
		kvpalace__v1__show_session_request__init(&op.session);
		op.session.session_id = sid;
		req.show_session = &op.session;
		break;
	case KVPALACE__V1__REQUEST__OP_EVICT:
		kvpalace__v1__evict_request__init(&op.evict);
		op.evict.tier = KVPALACE__V1__TIER__TIER_HOST;
		op.evict.has_pool_id = 1;
		op.evict.pool_id = x->pool_id;
		op.evict.has_max_pages = 1;
		op.evict.max_pages = 1;
		req.evict = &op.evict;
		break;
	case KVPALACE__V1__REQUEST__OP_DROP_POOL: {
		struct raw o;
		char model[48];

		snprintf(model, sizeof(model), "af-drop-%llu", (unsigned long long)n);
		if (count_pools(x, &before) != 0 || raw_open(&o, x->h.sock) != 0)
			goto fail;
		got = raw_open_pool(&o, model, &harness_layout, &pool);
		raw_close(&o);
		if (got != 0)
			goto fail;
		kvpalace__v1__drop_pool_request__init(&op.drop_pool);
		op.drop_pool.pool_id = pool;
		op.drop_pool.has_force = op.drop_pool.force = 1;
		req.drop_pool = &op.drop_pool;
		break;
	}
	case KVPALACE__V1__REQUEST__OP_WARMUP:
		kvpalace__v1__warmup_request__init(&op.warmup);
		op.warmup.name = "af-rs";
		op.warmup.has_uid = 1;
		op.warmup.uid = (uint32_t)getuid();
		req.warmup = &op.warmup;
		break;
	default:
		kvpalace__v1__drop_session_request__init(&op.drop);
		op.drop.session_id = sid;
		op.drop.has_force = op.drop.force = 1;
		req.drop_session = &op.drop;
		break;
	}
	got = shoot(x, &a, &req, n, &s, &resp, NULL);
	*fired = s.fired;
	if (got < 0 || judge(x, got, resp, &s, &ok) < 0)
		goto fail;
	if (ok && (int)resp->op_case != (int)req.op_case)
		goto fail;
	if (!ok && got == 1 &&
	    (what == KVPALACE__V1__REQUEST__OP_DROP_POOL ||
	     what == KVPALACE__V1__REQUEST__OP_WARMUP)) {
		x->t->retried++;
		req.id += 1u << 30;
		if (call(&a, &req, &resp) != 0 || (int)resp->op_case != (int)req.op_case)
			goto fail;
	}
	if (what == KVPALACE__V1__REQUEST__OP_DROP_POOL) {
		if (count_pools(x, &after) != 0 || after != before)
			goto fail;
	}
	if (what == KVPALACE__V1__REQUEST__OP_DROP_SESSION && ok)
		sid = 0;
	if (sid) {
		int ret = raw_close_session(&r, sid);

		/* A drop that failed may still have happened (the reply lost). */
		if (ret != 0 && !(what == KVPALACE__V1__REQUEST__OP_DROP_SESSION && ret == -ENOENT))
			goto fail;
	}
	raw_close(&a);
	raw_close(&r);
	return 0;
fail:
	raw_close(&a);
	raw_close(&r);
	FAIL(x, "admin request %d", (int)what);
}

static int case_admin_stats(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_STATS);
}

static int case_config_show(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_CONFIG_SHOW);
}

static int case_config_reload(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD);
}

static int case_show_session(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_SHOW_SESSION);
}

static int case_drop_pool(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_DROP_POOL);
}

static int case_warmup(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_WARMUP);
}

static int case_evict(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_EVICT);
}

static int case_drop_session(struct fx *x, uint64_t n, int *fired)
{
	return admin_case(x, n, fired, KVPALACE__V1__REQUEST__OP_DROP_SESSION);
}

/* ---- the driver --------------------------------------------------------- */

/* Once every client is gone: no session, no lease, no reservation, and
 * every page is free or held by the index alone. */
static int pages_balance(struct fx *x)
{
	struct harness_pool_info info;
	struct raw r;
	int ret;

	if (x->kc)
		return 0; /* the disk group's client holds the pool open */
	CHECK_EQ(x, raw_open(&r, x->h.sock), 0);
	ret = raw_hello(&r);
	if (ret == 0)
		ret = raw_wait_connections(&r, 1);
	if (ret == 0)
		ret = raw_pool_info(&r, x->pool_id, &info);
	raw_close(&r);
	CHECK_EQ(x, ret, 0);
	CHECK_EQ(x, info.n_sessions, 0);
	CHECK_EQ(x, info.reserved_pages, 0);
	CHECK_EQ(x, info.leased_pages, 0);
	CHECK_EQ(x, info.free_pages + info.indexed_pages, info.n_pages);
	return 0;
}

static void drive(struct fx *x, const char *name, case_fn fn)
{
	struct tally t = {.name = name};
	uint64_t n;
	int fired = 1;
	char statuses[160] = "";
	size_t at = 0;

	x->t = &t;
	for (n = 1; n <= MAX_N && fired; n++) {
		cur_n = n;
		fired = 0;
		assert_int_equal(fn(x, n, &fired), 0);
		assert_int_equal(still_serving(x), 0);
	}
	cur_n = 0;
	if (fired) {
		fprintf(stderr, "%s: still failing allocations at N=%u\n", name, MAX_N);
		fail();
	}
	assert_int_equal(pages_balance(x), 0);
	for (int i = 1; i < 32 && at < sizeof(statuses); i++)
		if (t.statuses[i])
			at += (size_t)snprintf(statuses + at, sizeof(statuses) - at, " %s×%u",
					       protobuf_c_enum_descriptor_get_value(
						       &kvpalace__v1__status__descriptor, i)
						       ->name,
					       t.statuses[i]);
	fprintf(stderr,
		"%-18s %3llu allocations failed: %3u error replies, %2u closed, %3u absorbed "
		"(%u shorter matches), %3u retried fine;%s\n",
		name, (unsigned long long)t.points, t.errors, t.closed, t.absorbed, t.shorter,
		t.retried, statuses);
	x->total_points += t.points;
	x->n_types++;
	x->t = NULL;
}

/* ---- fixture -------------------------------------------------------------- */

static int setup(void **state)
{
	struct fx *x = calloc(1, sizeof(*x));
	const char *v = getenv("KVP_ALLOCFAIL_VERBOSE");
	struct raw r;
	uint64_t sid;
	Req req;
	Kvpalace__V1__CheckpointRequest op;

	*state = x;
	if (!x || make_ctl(x) < 0)
		return -1;
	x->verbose = v && *v == '1';
	harness_tokens(x->tok_m, 64, SEQ_M, 0);
	harness_tokens(x->tok_long, N_LONG, SEQ_LONG, 0);
	harness_tokens(x->tok_dup, 40, SEQ_DUP, 0);
	harness_tokens(x->tok_ckpt, N_CKPT, SEQ_CKPT, 0);
	if (start_daemon(x, daemon_args) < 0)
		return -1;
	if (x->ineffective)
		return 0;
	/* Indexed content (sessions closed: the index alone holds it) and a
	 * checkpoint to restore. */
	if (raw_open(&r, x->h.sock) < 0)
		return -1;
	if (raw_open_pool(&r, MODEL, &harness_layout, &x->pool_id) < 0 ||
	    session_with(&r, x->pool_id, x->tok_m, 64, 1, &sid) < 0 ||
	    raw_close_session(&r, sid) < 0 ||
	    session_with(&r, x->pool_id, x->tok_long, N_LONG, 1, &sid) < 0 ||
	    raw_close_session(&r, sid) < 0 ||
	    session_with(&r, x->pool_id, x->tok_dup, 40, 1, &sid) < 0 ||
	    raw_close_session(&r, sid) < 0 ||
	    session_with(&r, x->pool_id, x->tok_ckpt, N_CKPT, 1, &sid) < 0)
		return -1;
	req_checkpoint(&req, &op, sid, "af-rs");
	if (call(&r, &req, NULL) < 0 || raw_close_session(&r, sid) < 0)
		return -1;
	raw_close(&r);
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fx *x = *state;
	int ret;

	if (!x)
		return 0;
	if (x->kc)
		kvp_disconnect(x->kc);
	ret = harness_stop(&x->h);
	if (x->ctl) {
		munmap(x->ctl, ALLOCFAIL_CTL_BYTES);
		unlink(x->ctl_path);
	}
	free(x->conv);
	free(x);
	*state = NULL;
	return ret;
}

/* The module works, and an idle daemon allocates nothing. */
static void test_module(void **state)
{
	struct fx *x = *state;
	struct shot s;

	if (x->ineffective)
		skip();

	/* What the set-up's last requests left (a checkpoint job's debug
	 * check after its reply) is over. */
	usleep(200 * 1000);
	arm(x, 1u << 30);
	sleep(2); /* timer ticks */
	disarm(x, &s);
	fprintf(stderr, "idle for 2 s: %llu allocations\n", (unsigned long long)s.count);
	assert_int_equal(s.count, 0);
	assert_int_equal(still_serving(x), 0);
}

static void test_client_requests(void **state)
{
	struct fx *x = *state;
	struct timespec t0, t1;

	if (x->ineffective)
		skip();

	clock_gettime(CLOCK_MONOTONIC, &t0);
	drive(x, "Connect", case_connect);
	drive(x, "Hello", case_hello);
	drive(x, "OpenPool", case_open_pool);
	drive(x, "OpenPool (new)", case_open_new_pool);
	drive(x, "CreateSession", case_create_session);
	drive(x, "Append", case_append);
	drive(x, "Commit", case_commit);
	drive(x, "Commit (dedup)", case_commit_dedup);
	drive(x, "MatchPrefix", case_match);
	drive(x, "MatchPrefix (miss)", case_match_miss);
	drive(x, "MatchPrefix chunks", case_match_chunks);
	drive(x, "Release", case_release);
	drive(x, "Fork", case_fork);
	drive(x, "ForkLease", case_fork_lease);
	drive(x, "Truncate", case_truncate);
	drive(x, "CloseSession", case_close_session);
	drive(x, "SessionPages", case_session_pages);
	drive(x, "Prefetch", case_prefetch);
	drive(x, "Stats", case_stats);
	drive(x, "ListSessions", case_list_sessions);
	drive(x, "Checkpoint", case_checkpoint);
	drive(x, "Restore", case_restore);
	drive(x, "ListCheckpoints", case_list_checkpoints);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "client socket: %u request types, %llu allocation failures, %.1f s\n",
		x->n_types, (unsigned long long)x->total_points,
		(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
}

static void test_admin_requests(void **state)
{
	struct fx *x = *state;

	if (x->ineffective)
		skip();

	x->n_types = 0;
	x->total_points = 0;
	drive(x, "Stats (admin)", case_admin_stats);
	drive(x, "ConfigShow", case_config_show);
	drive(x, "ConfigReload", case_config_reload);
	drive(x, "ShowSession", case_show_session);
	drive(x, "Evict", case_evict);
	drive(x, "DropSession", case_drop_session);
	drive(x, "DropPool", case_drop_pool);
	drive(x, "Warmup", case_warmup);
	fprintf(stderr, "admin socket: %u request types, %llu allocation failures\n", x->n_types,
		(unsigned long long)x->total_points);
}

/* ---- the disk tier and start-up ------------------------------------------------- */

#define D_MODEL	   "af-disk"
#define CONV_PAGES 16u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   48u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: one 4096-byte page. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* 256 host pages over a 4096-page spill file: 48 conversations of 16
 * pages are 3 times the host tier. */
static const char *const disk_args[] = {
	"--host-pool-size", "1M", "--disk-pool-size", "16M", "--log-level", "notice", NULL};

static const uint32_t *conv(const struct fx *x, uint64_t i)
{
	return x->conv + (size_t)(i % N_CONV) * CONV;
}

static int disk_client(struct fx *x)
{
	if (x->kc)
		return 0;
	CHECK_EQ(x, kvp_connect(x->h.sock, &x->kc), 0);
	CHECK_EQ(x, kvp_pool_open(x->kc, D_MODEL, &page4k, &x->kp), 0);
	return 0;
}

static void disk_disconnect(struct fx *x)
{
	kvp_disconnect(x->kc);
	x->kc = NULL;
	x->kp = NULL;
}

/* Judges what a library call returned (as judge()); a lost connection is
 * told apart from an error reply by a ping, and reconnected later. */
static int judge_lib(struct fx *x, int ret, const struct shot *s, int *ret_ok)
{
	struct tally *t = x->t;
	int st;

	*ret_ok = 0;
	if (s->fired) {
		t->points++;
		if (x->verbose)
			fprintf(stderr, "  %s N=%llu: failed %s called from %s -> %s\n", t->name,
				(unsigned long long)s->n, s->what, s->caller,
				ret ? strerror(-ret) : "ok");
	}
	if (ret == 0) {
		if (s->fired)
			t->absorbed++;
		*ret_ok = 1;
		return 0;
	}
	if (!s->fired)
		FAIL(x, "error %s though no allocation failed", strerror(-ret));
	if (kvp_ping(x->kc) < 0) {
		t->closed++;
		disk_disconnect(x);
		return 0;
	}
	t->errors++;
	st = (int)status_from_errno(ret);
	if (st > 0 && st < 32)
		t->statuses[st]++;
	return 0;
}

/* MatchPrefix (library) of one of the first 24 conversations, which the
 * 24 after them pushed out to disk: pages are read back (a parked
 * request, reads and the writes that make room). Matched bytes are
 * checked; only a failure may cut the match short. */
static int case_disk_match(struct fx *x, uint64_t n, int *fired)
{
	const uint32_t *t = conv(x, (n - 1) % (N_CONV / 2));
	struct shot s = {.n = n};
	kvp_lease *l = NULL;
	uint64_t m;
	int ret, ok;

	if (disk_client(x) < 0)
		return -1;
	arm(x, n);
	ret = kvp_match_prefix(x->kp, t, CONV, &l);
	disarm(x, &s);
	*fired = s.fired;
	if (judge_lib(x, ret, &s, &ok) < 0)
		return -1;
	if (!ok) {
		if (disk_client(x) < 0)
			return -1;
		x->t->retried++;
		CHECK_EQ(x, kvp_match_prefix(x->kp, t, CONV, &l), 0);
	}
	m = kvp_lease_tokens(l);
	CHECK(x, m <= CONV && m % BT == 0);
	CHECK_EQ(x, harness_pkv_check_lease(l, x->kp, t, m), 0);
	if (m < CONV) {
		if (!s.fired)
			FAIL(x, "matched %llu of %u tokens though no allocation failed",
			     (unsigned long long)m, CONV);
		x->t->shorter++;
	}
	CHECK_EQ(x, kvp_lease_release(l), 0);
	return 0;
}

/* One datagram of MatchPrefix (of a conversation on disk: it parks) and
 * Stats, which waits behind it: a held copy of its frame. */
static int case_disk_batch(struct fx *x, uint64_t n, int *fired)
{
	uint32_t tokens[CONV];
	struct raw r;
	struct shot s = {.n = n};
	Req m, st;
	Req *both[2] = {&m, &st};
	Kvpalace__V1__MatchPrefixRequest mop;
	Kvpalace__V1__StatsRequest sop;
	uint64_t pool;
	int got = 1, replies = 0, errors = 0, cut = 0, ret = 0;

	memcpy(tokens, conv(x, (n + 11) % (N_CONV / 2)), sizeof(tokens));
	CHECK_EQ(x, raw_open(&r, x->h.sock), 0);
	if (raw_open_pool(&r, D_MODEL, &page4k, &pool) != 0) {
		raw_close(&r);
		FAIL(x, "cannot open the pool");
	}
	r.batched_ok = 1;
	req_match(&m, &mop, pool, tokens, CONV, 0);
	raw_req_stats(&st, &sop);
	arm(x, n);
	got = raw_send_batch(&r, both, 2);
	while (got >= 0 && replies < 2) {
		Resp *resp;

		got = raw_recv(&r, &resp, NULL);
		if (got != 1)
			break;
		replies++;
		if (resp->id != m.id && resp->id != st.id && resp->id != 0) {
			ret = -1;
			break;
		}
		if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
			errors++;
		else if (resp->id == m.id && resp->match_prefix->matched_tokens != CONV)
			cut = 1;
	}
	disarm(x, &s);
	*fired = s.fired;
	raw_close(&r);
	if (got == -EPIPE || got == -ECONNRESET)
		got = 0;
	if (s.fired) {
		x->t->points++;
		if (x->verbose)
			fprintf(stderr,
				"  %s N=%llu: failed %s called from %s -> %d replies, %d "
				"errors%s\n",
				x->t->name, (unsigned long long)n, s.what, s.caller, replies,
				errors, replies < 2 ? ", closed" : "");
	}
	if (ret < 0)
		FAIL(x, "a reply to neither request");
	if (got < 0)
		FAIL(x, "no reply: %s (a hang?)", strerror(-got));
	if ((errors || replies < 2 || cut) && !s.fired)
		FAIL(x, "%d errors, %d replies%s, though no allocation failed", errors, replies,
		     cut ? ", a short match" : "");
	x->t->shorter += cut;
	if (replies < 2)
		x->t->closed++;
	else if (errors)
		x->t->errors++;
	else if (s.fired)
		x->t->absorbed++;
	return 0;
}

static int setup_disk(void **state)
{
	struct fx *x = calloc(1, sizeof(*x));
	const char *v = getenv("KVP_ALLOCFAIL_VERBOSE");
	int ret;

	*state = x;
	if (!x || make_ctl(x) < 0)
		return -1;
	x->verbose = v && *v == '1';
	x->conv = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));
	if (!x->conv || start_daemon(x, disk_args) < 0)
		return -1;
	if (x->ineffective)
		return 0;
	if (disk_client(x) < 0)
		return -1;
	x->pool_id = kvp_pool_id(x->kp);
	for (uint32_t i = 0; i < N_CONV; i++) {
		kvp_session *s;

		harness_tokens(x->conv + (size_t)i * CONV, CONV, 700 + i, 0);
		ret = harness_pkv_commit_session(x->kp, conv(x, i), CONV, &s);
		if (ret == 0)
			ret = kvp_session_close(s);
		if (ret < 0)
			return -1;
	}
	*state = x;
	return 0;
}

static void test_disk_match(void **state)
{
	struct fx *x = *state;
	struct kvp_pool_stats ps;

	if (x->ineffective)
		skip();

	assert_int_equal(harness_pool_stats(x->kc, x->pool_id, &ps, NULL), 0);
	fprintf(stderr, "before: %llu pages spilled, %u on disk\n",
		(unsigned long long)ps.spilled_pages, ps.disk_pages);
	assert_true(ps.spilled_pages >= (N_CONV - 16) * CONV_PAGES);
	drive(x, "MatchPrefix (disk)", case_disk_match);
	drive(x, "batch (disk)", case_disk_batch);
	assert_int_equal(disk_client(x), 0);
	assert_int_equal(harness_pool_stats(x->kc, x->pool_id, &ps, NULL), 0);
	fprintf(stderr, "after: %llu promoted, %llu verify failures, %llu I/O errors\n",
		(unsigned long long)ps.promoted_pages, (unsigned long long)ps.verify_failures,
		(unsigned long long)ps.io_errors);
	assert_int_equal(ps.verify_failures, 0);
	assert_int_equal(ps.io_errors, 0);
}

/* ---- start-up ------------------------------------------------------------- */

static int can_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int ok;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* Starts kvpalaced in x->h.dir (as the harness does) with the module
 * armed from its first allocation to fail the nth. Returns 1 when it
 * serves (its pid in x->h.pid, still armed), 0 when it exited by itself
 * with *ret_status, or -1 when it neither served nor exited in 30 s. */
static int armed_start(struct fx *x, uint64_t n, const char *const *extra, int *ret_status)
{
	const char *so = getenv("KVP_ALLOCFAIL_SO"), *daemon = getenv("KVPALACED");
	const char *asan = getenv("ASAN_OPTIONS");
	char state[160], cache[160], opts[1024];
	const char *argv[32];
	int argc = 0;
	pid_t parent = getpid(), pid;

	snprintf(state, sizeof(state), "%s/state", x->h.dir);
	snprintf(cache, sizeof(cache), "%s/cache", x->h.dir);
	snprintf(opts, sizeof(opts), "%s%sverify_asan_link_order=0", asan ? asan : "",
		 asan && *asan ? ":" : "");
	argv[argc++] = daemon;
	argv[argc++] = "--socket";
	argv[argc++] = x->h.sock;
	argv[argc++] = "--admin-socket";
	argv[argc++] = x->h.admin_sock;
	argv[argc++] = "--state-dir";
	argv[argc++] = state;
	argv[argc++] = "--cache-dir";
	argv[argc++] = cache;
	for (int i = 0; extra[i] && argc < 30; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;
	arm(x, n);
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		setenv("LD_PRELOAD", so, 1);
		setenv(ALLOCFAIL_ENV, x->ctl_path, 1);
		setenv("ASAN_OPTIONS", opts, 1);
		execv(daemon, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 6000; i++) {
		int status;

		if (waitpid(pid, &status, WNOHANG) == pid) {
			*ret_status = status;
			return 0;
		}
		/* Serving: a Hello is answered (the sockets take connections
		 * before the warm-up is over). The probe's own allocations
		 * count too; one that fails ends the probe, and we try again. */
		if (can_connect(x->h.admin_sock)) {
			struct raw r;
			int ok = raw_open(&r, x->h.sock) == 0 && raw_hello(&r) == 0;

			raw_close(&r);
			if (ok) {
				x->h.pid = pid;
				return 1;
			}
		}
		usleep(5000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* Under ASan the sanitizer runtime calls libc functions that allocate
 * (pthread_getattr_np, as a thread starts) and aborts when they fail: no
 * fault of the daemon's, and only possible in that build. */
static int sanitizer_abort(const struct shot *s, int status)
{
	return SANITIZED && s->fired && strstr(s->caller, "/libc.so") &&
	       (!WIFEXITED(status) || WEXITSTATUS(status) != 0);
}

/* The CUDA runtime, which a CUDA build loads when it probes the GPU at
 * start (kernels/cudart_dl.c), runs initializers that use an allocation
 * without checking it: failed, the process dies by a signal. Not the
 * daemon's code, and unreachable before it loaded the runtime itself (a
 * linked runtime ran them before this module counted). */
static int cudart_crash(const struct shot *s, int status)
{
	return s->fired && strstr(s->caller, "/libcudart.so") && WIFSIGNALED(status);
}

/* Stops the daemon with SIGTERM without removing its directory. Returns
 * its exit status as harness_wait. */
static int stop_in_place(struct fx *x)
{
	int st;

	kill(x->h.pid, SIGTERM);
	st = harness_wait(x->h.pid, 20);
	x->h.pid = 0;
	return st;
}

/* Every allocation of a warm start (configuration, sockets, io_uring,
 * workers, checkpoint directory, a warm-up checkpoint loaded into a pool
 * whose spill file is scanned): the daemon either starts and serves
 * (and then stops cleanly) or exits by itself with status 1 and a
 * message, never by a signal, never hanging. */
static void test_startup(void **state)
{
	struct fx *x = *state;
	struct tally t = {.name = "start-up"};
	char from[200], to[200], cmd[800];
	uint64_t n, started = 0, exited = 0, sanitizer = 0, cudart = 0;
	struct timespec t0, t1;
	int fired = 1;
	kvp_session *s;

	if (x->ineffective)
		skip();

	/* A fresh daemon with three conversations and a warm-up checkpoint
	 * of the first, then a clean stop: its spill file holds every page
	 * (a small one: the start-up restores each page of it). */
	if (x->kc)
		disk_disconnect(x);
	assert_int_equal(harness_stop(&x->h), 0);
	assert_int_equal(start_daemon(x, disk_args), 0);
	assert_int_equal(disk_client(x), 0);
	for (uint32_t i = 1; i < 3; i++) {
		assert_int_equal(harness_pkv_commit_session(x->kp, conv(x, i), CONV, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	assert_int_equal(harness_pkv_commit_session(x->kp, conv(x, 0), CONV, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "af-warm", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	disk_disconnect(x);
	snprintf(from, sizeof(from), "%.100s/state/checkpoints/%u/af-warm", x->h.dir,
		 (unsigned)getuid());
	snprintf(to, sizeof(to), "%.100s/state/warmup", x->h.dir);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp '%s' '%s/'", to, from, to);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(stop_in_place(x), 0);

	x->t = &t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (n = 1; n <= 4 * MAX_N && fired; n++) {
		struct shot sh;
		int status = 0, ret;

		cur_n = n;
		ret = armed_start(x, n, disk_args, &status);
		disarm(x, &sh);
		fired = sh.fired;
		if (ret < 0) {
			fprintf(stderr,
				"start-up, N=%llu: neither served nor exited (failed %s from %s)\n",
				(unsigned long long)n, sh.what, sh.caller);
			fail();
		}
		if (fired)
			t.points++;
		if (ret == 0 && sanitizer_abort(&sh, status)) {
			sanitizer++;
			continue;
		}
		if (ret == 0 && cudart_crash(&sh, status)) {
			cudart++;
			continue;
		}
		if (ret == 0) {
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || !fired) {
				fprintf(stderr,
					"start-up, N=%llu: the daemon ended with status %#x "
					"(failed %s "
					"from %s)\n",
					(unsigned long long)n, status, fired ? sh.what : "nothing",
					sh.caller);
				fail();
			}
			exited++;
			continue;
		}
		started++;
		/* It serves: the warm-up checkpoint and the spilled pages are
		 * found, with their bytes (unless the failure cost them: then a
		 * shorter match). */
		if (SANITIZED && fired && strstr(sh.caller, "/libc.so")) {
			/* It may be aborting (sanitizer_abort): a thread it
			 * starts after serving can be the one, so watch it a
			 * while. */
			int gone = 0;

			for (int w = 0; w < 40 && !gone; w++) {
				usleep(50 * 1000);
				gone = waitpid(x->h.pid, &status, WNOHANG) == x->h.pid;
			}
			if (gone) {
				x->h.pid = 0;
				if (sanitizer_abort(&sh, status)) {
					sanitizer++;
					continue;
				}
			}
		}
		assert_int_equal(disk_client(x), 0);
		/* The pages come as the restart's scan lists them. */
		assert_int_equal(harness_wait_scans(&x->h), 0);
		for (uint32_t i = 0; i < 3; i++) {
			kvp_lease *l;
			uint64_t m;

			assert_int_equal(kvp_match_prefix(x->kp, conv(x, i), CONV, &l), 0);
			m = kvp_lease_tokens(l);
			assert_int_equal(harness_pkv_check_lease(l, x->kp, conv(x, i), m), 0);
			if (!fired)
				assert_int_equal(m, CONV);
			t.shorter += m < CONV;
			assert_int_equal(kvp_lease_release(l), 0);
		}
		disk_disconnect(x);
		if (stop_in_place(x) != 0 &&
		    !(SANITIZED && fired && strstr(sh.caller, "/libc.so"))) {
			fprintf(stderr,
				"start-up, N=%llu: a daemon that started (after failing %s from "
				"%s) did not stop cleanly\n",
				(unsigned long long)n, sh.what, sh.caller);
			fail();
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cur_n = 0;
	x->t = NULL;
	assert_false(fired);
	fprintf(stderr,
		"start-up: %llu allocations failed: %llu exits with status 1, %llu starts "
		"(%u served a shorter match), %llu sanitizer aborts, %llu in the CUDA "
		"runtime's initializers; %.1f s\n",
		(unsigned long long)t.points, (unsigned long long)exited,
		(unsigned long long)started - 1, t.shorter, (unsigned long long)sanitizer,
		(unsigned long long)cudart,
		(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	/* The last start reached no failure: leave it running for teardown. */
	assert_int_equal(armed_start(x, 0, disk_args, &(int){0}), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_module),
		cmocka_unit_test(test_client_requests),
		cmocka_unit_test(test_admin_requests),
	};
	const struct CMUnitTest disk_tests[] = {
		cmocka_unit_test(test_disk_match),
		cmocka_unit_test(test_startup),
	};
	int failed;

	signal(SIGPIPE, SIG_IGN);
	failed = cmocka_run_group_tests_name("allocfail", tests, setup, teardown);
	failed += cmocka_run_group_tests_name("allocfail-disk", disk_tests, setup_disk, teardown);
	return failed;
}
