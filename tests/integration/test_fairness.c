/* tests/integration/test_fairness.c — one tenant's heavy requests neither
 * stall another tenant nor leave anything behind (issue 14 item 7).
 *
 * A ReportImportance query at its work cap (COMPACT_MAX_QUERY_WORK,
 * tens of milliseconds of attention) used to run on the event-loop
 * thread: a tenant looping on it raised another tenant's ping from
 * 0.014 ms to about 20 ms at the median. The daemon now scores on a
 * worker; the light tenant's pings beside the heavy one must stay near
 * what they are alone. As root the two tenants are uids 2001 (heavy) and
 * 2002 (light), as test_isolation.c does; otherwise both are this uid in
 * separate processes and connections, which the loop serves the same way.
 *
 * The scoring job holds references on the session's pages while it reads
 * them: a session closed, or a connection closed, while its job runs must
 * leave no page held once the job is done, and the daemon alive.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#if defined(KVP_DEBUG_CHECKS) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define INSTRUMENTED 1
#else
#define INSTRUMENTED 0
#endif

#define MODEL_HEAVY "fair-heavy"
#define MODEL_LIGHT "fair-light"
#define UID_HEAVY   2001
#define UID_LIGHT   2002
#define N_HEAVY	    2 /* heavy processes */
/* Query heads: 64 per KV head, the most a query may have. */
#define N_Q_HEADS (64u * 2u)
/* Tokens at the work cap: N_Q_HEADS * head_dim (32) multiply-adds each,
 * 2^26 in all; 8 short of whole pages, so the last page is the session's
 * own (not in the prefix index) and a reference left on it shows in
 * free_pages. */
#define N_TOKENS (16384u - 8u)
#define N_SOLO	 2000u /* pings alone */
#define N_BESIDE 8000u /* pings beside the heavy tenant, at most */
/* Pings beside the heavy tenant go on for BESIDE_S seconds at least, half
 * a millisecond apart: each one meets the loop at another moment of the
 * heavy tenant's work. */
#define BESIDE_S 2.0

/* What the processes share (MAP_SHARED). */
struct shared {
	volatile int go;		   /* heavy: start scoring */
	volatile int stop;		   /* heavy: stop */
	volatile int ready;		   /* heavy processes with their session built */
	volatile uint64_t scored[N_HEAVY]; /* queries each answered OK */
	volatile uint64_t uncompacted;	   /* commits that left a session past its budget */
	double solo[N_SOLO];		   /* light: ping times, ms */
	double beside[N_BESIDE];
	volatile uint32_t n_beside;
	volatile uint64_t scored_before, scored_after; /* around the beside pings */
};

static int as_root(void)
{
	return geteuid() == 0;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

static uint64_t total_scored(const struct shared *sh)
{
	uint64_t n = 0;

	for (int i = 0; i < N_HEAVY; i++)
		n += sh->scored[i];
	return n;
}

/* A query for harness_layout: every head the same, unremarkable. */
static float *make_query(void)
{
	float *q = malloc((size_t)N_Q_HEADS * harness_layout.head_dim * sizeof(float));

	for (size_t i = 0; q && i < (size_t)N_Q_HEADS * harness_layout.head_dim; i++)
		q[i] = (float)((i % 7) + 1) * 0.01f;
	return q;
}

/* What the heavy tenant does in a loop. */
enum heavy_mode {
	HEAVY_QUERY,	    /* ReportImportance queries at the work cap */
	HEAVY_AUTO_COMPACT, /* commits, each compacting a session past its budget */
};

struct heavy_arg {
	struct harness *h;
	struct shared *sh;
	int idx;
	enum heavy_mode mode;
};

/* Auto-compaction: a sinks session of AC_BUDGET tokens takes AC_STEP more
 * at each commit, which compacts it back, copying AC_BUDGET tokens of K/V
 * (32 MiB of harness_layout) to fresh pages. */
#define AC_BUDGET 65536u
#define AC_STEP	  512u

/* One step of the heavy tenant's work on s: 0 (done: scored, or
 * compacted), 1 (a check failed) or 2 (committed, not compacted). */
static int heavy_step(const struct heavy_arg *a, kvp_session *s, const uint32_t *tokens,
		      const float *q)
{
	if (a->mode == HEAVY_QUERY) {
		CHILD_CHECK_EQ(kvp_session_score_query(s, 1, q, N_Q_HEADS), 0);
		return 0;
	}
	CHILD_CHECK_EQ(kvp_append(s, tokens, AC_STEP), 0);
	CHILD_CHECK_EQ(kvp_commit(s, AC_STEP), 0);
	/* While the tenant's other process has its compaction on the worker
	 * (one job per tenant), this commit leaves the session past its
	 * budget; a later one compacts it. */
	return kvp_session_tokens(s) == AC_BUDGET ? 0 : 2;
}

/* The heavy tenant: builds a session at the work cap (or its budget),
 * then works on it in a loop until told to stop. */
static int heavy_main(void *arg)
{
	struct heavy_arg *a = arg;
	uint32_t n = a->mode == HEAVY_QUERY ? N_TOKENS : AC_BUDGET;
	uint32_t *tokens = malloc(n * sizeof(uint32_t));
	float *q = make_query();
	struct kvp_policy pol;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK(tokens && q);
	if (as_root())
		CHILD_CHECK(harness_become(UID_HEAVY) == 0);
	harness_tokens(tokens, n, 3 + (uint32_t)a->idx, 0);
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL_HEAVY, &harness_layout, &p) == 0);
	if (a->mode == HEAVY_QUERY) {
		CHILD_CHECK(harness_commit_session(p, tokens, n, &s) == 0);
	} else {
		kvp_policy_init(&pol, KVP_POLICY_SINKS, AC_BUDGET);
		pol.sinks = 4;
		pol.auto_compact = 1;
		CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
		CHILD_CHECK_EQ(kvp_session_set_policy(s, &pol, NULL), 0);
		CHILD_CHECK_EQ(kvp_append(s, tokens, n), 0);
		CHILD_CHECK_EQ(harness_write_session(p, s, 0, tokens, n), 0);
		CHILD_CHECK_EQ(kvp_commit(s, n), 0);
	}
	/* At the cap (or the budget), not past it. */
	CHILD_CHECK(heavy_step(a, s, tokens, q) != 1);
	__sync_fetch_and_add(&a->sh->ready, 1);
	while (!a->sh->go)
		sleep_ms(1);
	while (!a->sh->stop) {
		int ret = heavy_step(a, s, tokens, q);

		CHILD_CHECK(ret != 1);
		if (ret == 0)
			a->sh->scored[a->idx]++;
		else
			__sync_fetch_and_add(&a->sh->uncompacted, 1);
	}
	CHILD_CHECK(kvp_session_close(s) == 0);
	kvp_disconnect(c);
	free(tokens);
	free(q);
	return 0;
}

struct light_arg {
	struct harness *h;
	struct shared *sh;
};

/* The light tenant: pings alone, then (once the heavy tenant scores)
 * beside it. */
static int light_main(void *arg)
{
	struct light_arg *a = arg;
	struct shared *sh = a->sh;
	kvp_client *c;
	kvp_pool *p;
	double t0;
	uint32_t n = 0;

	if (as_root())
		CHILD_CHECK(harness_become(UID_LIGHT) == 0);
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL_LIGHT, &harness_layout, &p) == 0);
	for (int i = 0; i < 200; i++) /* warm up */
		CHILD_CHECK(kvp_ping(c) == 0);
	for (uint32_t i = 0; i < N_SOLO; i++) {
		double t = now_ms();

		CHILD_CHECK(kvp_ping(c) == 0);
		sh->solo[i] = now_ms() - t;
	}
	sh->go = 1;
	/* Until the heavy tenant is at it. */
	while (total_scored(sh) < 2 * N_HEAVY)
		sleep_ms(1);
	sh->scored_before = total_scored(sh);
	t0 = now_ms();
	/* BESIDE_S at least, and until the heavy tenant answered 10 more
	 * queries (a slow build, say with sanitizers, takes longer). */
	while ((now_ms() - t0 < BESIDE_S * 1e3 || total_scored(sh) < sh->scored_before + 10) &&
	       now_ms() - t0 < 60e3) {
		double t = now_ms();

		if (n == N_BESIDE) {
			sleep_ms(1);
			continue;
		}
		CHILD_CHECK(kvp_ping(c) == 0);
		sh->beside[n++] = now_ms() - t;
		usleep(500);
	}
	sh->n_beside = n;
	sh->scored_after = total_scored(sh);
	kvp_disconnect(c);
	return 0;
}

/* A heavy tenant loops on ReportImportance queries at the work cap (or
 * on commits that each auto-compact a 64K-token session); the light
 * tenant's ping beside it must stay within bounds far below what the
 * loop-thread work gave (for queries p50 about 20 ms, p99 45-79 ms on a
 * 2-core machine): the median under 10 times its solo median plus 2 ms,
 * and p99 under 20 ms or 4 times its solo p99 plus 2 ms, whichever is
 * more (the machine may be loaded by other work, which the solo figures
 * measure too). */
static void ping_beside_heavy(struct harness *h, enum heavy_mode mode)
{
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct heavy_arg ha[N_HEAVY];
	struct light_arg la = {.h = h};
	pid_t heavy[N_HEAVY], light;
	double solo50, solo99, bes50, bes99, bound, rate;
	uint32_t n;

	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	la.sh = sh;
	print_message("tenants: %s\n", as_root() ? "uids 2001 (heavy) and 2002 (light)"
						 : "not root: two processes of this uid");
	for (int i = 0; i < N_HEAVY; i++) {
		ha[i] = (struct heavy_arg){.h = h, .sh = sh, .idx = i, .mode = mode};
		heavy[i] = harness_fork(heavy_main, &ha[i]);
		assert_true(heavy[i] > 0);
	}
	for (int i = 0; i < 60000 && sh->ready < N_HEAVY; i++)
		sleep_ms(1);
	assert_int_equal(sh->ready, N_HEAVY);
	light = harness_fork(light_main, &la);
	assert_true(light > 0);
	assert_int_equal(harness_wait(light, 120), 0);
	sh->stop = 1;
	for (int i = 0; i < N_HEAVY; i++)
		assert_int_equal(harness_wait(heavy[i], 120), 0);

	n = sh->n_beside;
	assert_true(n > 0);
	solo50 = harness_quantile(sh->solo, N_SOLO, 0.5);
	solo99 = harness_quantile(sh->solo, N_SOLO, 0.99);
	bes50 = harness_quantile(sh->beside, n, 0.5);
	bes99 = harness_quantile(sh->beside, n, 0.99);
	rate = (double)(sh->scored_after - sh->scored_before);
	print_message("ping alone: p50 %.3f ms p99 %.3f ms (%u pings)\n", solo50, solo99, N_SOLO);
	print_message("ping beside the heavy tenant: p50 %.3f ms p99 %.3f ms (%u pings, %.0f "
		      "%s answered meanwhile)\n",
		      bes50, bes99, n, rate,
		      mode == HEAVY_QUERY ? "queries at the cap" : "commits that compacted");
	/* The heavy tenant really was at work while the light one pinged. */
	assert_true(rate >= 10);
	/* A commit due for compaction waits while the tenant's other one
	 * compacts (it used to go through and leave its session past the
	 * budget, commit after commit): none goes uncompacted unless it
	 * waited PEER_MAX_PARK_NS, which only an instrumented daemon does. */
	print_message("commits that left a session past its budget: %llu\n",
		      (unsigned long long)sh->uncompacted);
	if (!INSTRUMENTED)
		assert_int_equal(sh->uncompacted, 0);
	/* A daemon built with -Ddebug-checks (a whole-cache check after
	 * every request, on the loop) or a sanitizer, or run under valgrind,
	 * spends its time on the instruments: the figures then measure
	 * them, not the heavy tenant's work. Valgrind shows as a ping alone
	 * taking milliseconds. */
	if (solo50 >= 1.0 || INSTRUMENTED) {
		print_message("a ping alone takes %.3f ms: an instrumented daemon; bounds not "
			      "checked\n",
			      solo50);
		assert_true(harness_daemon_alive(h));
		munmap(sh, sizeof(*sh));
		return;
	}
	bound = 4 * solo99 + 2;
	if (bound < 20)
		bound = 20;
	print_message("bounds beside: p50 %.3f ms, p99 %.3f ms\n", 10 * solo50 + 2, bound);
	assert_true(bes50 < 10 * solo50 + 2);
	assert_true(bes99 < bound);
	/* And enough pings went through to say so. */
	assert_true(n >= 20);
	assert_true(harness_daemon_alive(h));
	munmap(sh, sizeof(*sh));
}

static void test_ping_beside_heavy(void **state)
{
	ping_beside_heavy(*state, HEAVY_QUERY);
}

/* Issue 14 item 7: auto-compaction at commit ran on the event loop. */
static void test_ping_beside_auto_compaction(void **state)
{
	ping_beside_heavy(*state, HEAVY_AUTO_COMPACT);
}

/* free_pages of pool_id, as c's Stats say; -1 on error. */
static long free_pages(kvp_client *c, uint64_t pool_id)
{
	struct kvp_pool_stats ps;

	return harness_pool_stats(c, pool_id, &ps, NULL) < 0 ? -1 : (long)ps.free_pages;
}

/* Waits (up to 20 s) until pool_id has want free pages; returns them. */
static long wait_free(kvp_client *c, uint64_t pool_id, long want)
{
	long n = -1;

	for (int i = 0; i < 2000 && (n = free_pages(c, pool_id)) != want; i++)
		sleep_ms(10);
	return n;
}

/* Sends a ReportImportance query for session_id through r without
 * waiting for the answer; returns the request's id (0 on error). */
static uint64_t send_query(struct raw *r, uint64_t session_id, float *q)
{
	static uint64_t id = 1000000;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ReportImportanceRequest ri = KVPALACE__V1__REPORT_IMPORTANCE_REQUEST__INIT;

	req.id = ++id;
	req.op_case = KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE;
	req.report_importance = &ri;
	ri.session_id = session_id;
	ri.has_layer = ri.has_n_q_heads = 1;
	ri.layer = 1;
	ri.n_q_heads = N_Q_HEADS;
	ri.query = q;
	ri.n_query = (size_t)N_Q_HEADS * harness_layout.head_dim;
	return raw_send(r, &req) < 0 ? 0 : req.id;
}

/* Sends a Compact of session_id through r without waiting; returns the
 * request's id (0 on error). */
static uint64_t send_compact(struct raw *r, uint64_t session_id)
{
	static uint64_t id = 2000000;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CompactRequest cr = KVPALACE__V1__COMPACT_REQUEST__INIT;

	req.id = ++id;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	cr.session_id = session_id;
	return raw_send(r, &req) < 0 ? 0 : req.id;
}

/* A session closed while its scoring job runs, and a connection closed
 * while its job runs, and the same for a compaction's copy: once the jobs
 * are done every page the jobs held (and the fresh pages a compaction
 * took) is free again — a client whose engine closes a session, or dies,
 * mid-score must not leak the pool —, the answer to the first says what
 * happened, and the daemon serves on. */
static void test_close_while_scoring(void **state)
{
	struct harness *h = *state;
	uint32_t *tokens = malloc(N_TOKENS * sizeof(uint32_t));
	float *q = make_query();
	Kvpalace__V1__Response *resp;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	struct raw r;
	uint64_t pool_id, sid, id;
	long base;

	assert_non_null(tokens);
	assert_non_null(q);
	harness_tokens(tokens, N_TOKENS, 9, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL_HEAVY, &harness_layout, &p), 0);
	pool_id = kvp_pool_id(p);
	/* The free pages with these tokens' full pages in the index. */
	assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	base = free_pages(c, pool_id);
	assert_true(base > 0);

	/* The session closed while its job runs. */
	assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
	sid = kvp_session_id(s);
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_hello(&r), 0);
	id = send_query(&r, sid, q);
	assert_true(id != 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(raw_recv(&r, &resp, NULL), 1);
	assert_true(resp->id == id);
	/* Closed before or while it was scored, or scored first. */
	print_message("query beside CloseSession: status %d (%s)\n", (int)resp->status,
		      resp->error ? resp->error : "ok");
	assert_true(resp->status == KVPALACE__V1__STATUS__STATUS_OK ||
		    resp->status == KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(wait_free(c, pool_id, base), base);

	/* The connection closed while its job runs, then the session. */
	assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
	sid = kvp_session_id(s);
	assert_true(send_query(&r, sid, q) != 0);
	raw_close(&r);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(wait_free(c, pool_id, base), base);

	/* Several at once, every one cut short by a close. */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
		assert_int_equal(raw_open(&r, h->sock), 0);
		assert_int_equal(raw_hello(&r), 0);
		assert_true(send_query(&r, kvp_session_id(s), q) != 0);
		assert_int_equal(kvp_session_close(s), 0);
		raw_close(&r);
	}
	assert_int_equal(wait_free(c, pool_id, base), base);

	/* A compaction (keep the last 4096 tokens) cut short the same ways. */
	for (int i = 0; i < 2; i++) {
		struct kvp_policy pol;

		assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
		kvp_policy_init(&pol, KVP_POLICY_WINDOW, 4096);
		assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
		assert_int_equal(raw_open(&r, h->sock), 0);
		assert_int_equal(raw_hello(&r), 0);
		id = send_compact(&r, kvp_session_id(s));
		assert_true(id != 0);
		assert_int_equal(kvp_session_close(s), 0);
		if (i == 0) {
			assert_int_equal(raw_recv(&r, &resp, NULL), 1);
			assert_true(resp->id == id);
			print_message("compact beside CloseSession: status %d (%s)\n",
				      (int)resp->status, resp->error ? resp->error : "ok");
			assert_true(resp->status == KVPALACE__V1__STATUS__STATUS_OK ||
				    resp->status == KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
		}
		raw_close(&r);
	}
	assert_int_equal(wait_free(c, pool_id, base), base);
	assert_int_equal(kvp_ping(c), 0);
	assert_true(harness_daemon_alive(h));
	kvp_disconnect(c);
	free(tokens);
	free(q);
}

/* ---- the workers' share -------------------------------------------------- */

#define N_GREEDY 6 /* connections of the greedy tenant, one query each */

struct share {
	volatile int sent;		  /* the greedy tenant's queries are out */
	volatile int ready;		  /* children with their session built */
	volatile double greedy[N_GREEDY]; /* when each greedy answer came, ms */
	volatile double other;		  /* when the other tenant's came */
	volatile int status[N_GREEDY + 1];
};

struct share_arg {
	struct harness *h;
	struct share *sh;
	int greedy;
};

static int share_main(void *arg)
{
	struct share_arg *a = arg;
	int n = a->greedy ? N_GREEDY : 1;
	uint32_t *tokens = malloc(N_TOKENS * sizeof(uint32_t));
	float *q = make_query();
	Kvpalace__V1__Response *resp;
	struct raw r[N_GREEDY];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK(tokens && q);
	CHILD_CHECK(harness_become(a->greedy ? UID_HEAVY : UID_LIGHT) == 0);
	harness_tokens(tokens, N_TOKENS, a->greedy ? 4 : 5, 0);
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, a->greedy ? MODEL_HEAVY : MODEL_LIGHT, &harness_layout, &p) ==
		    0);
	CHILD_CHECK(harness_commit_session(p, tokens, N_TOKENS, &s) == 0);
	for (int i = 0; i < n; i++) {
		CHILD_CHECK(raw_open(&r[i], a->h->sock) == 0);
		CHILD_CHECK(raw_hello(&r[i]) == 0);
	}
	__sync_fetch_and_add(&a->sh->ready, 1);
	while (a->sh->ready < 2)
		sleep_ms(1);
	if (a->greedy) {
		for (int i = 0; i < n; i++)
			CHILD_CHECK(send_query(&r[i], kvp_session_id(s), q) != 0);
		/* The daemon has read them all once it answers a ping sent
		 * after them (frames are taken in the order they come). */
		CHILD_CHECK(kvp_ping(c) == 0);
		a->sh->sent = 1;
	} else {
		while (!a->sh->sent)
			sleep_ms(1);
		CHILD_CHECK(send_query(&r[0], kvp_session_id(s), q) != 0);
	}
	for (int i = 0; i < n; i++) {
		CHILD_CHECK(raw_recv(&r[i], &resp, NULL) == 1);
		if (a->greedy) {
			a->sh->greedy[i] = now_ms();
			a->sh->status[i] = (int)resp->status;
		} else {
			a->sh->other = now_ms();
			a->sh->status[N_GREEDY] = (int)resp->status;
		}
		raw_close(&r[i]);
	}
	CHILD_CHECK(kvp_session_close(s) == 0);
	kvp_disconnect(c);
	free(tokens);
	free(q);
	return 0;
}

/* A tenant that sends many scoring queries at once (one per connection)
 * gets one worker at a time: another tenant's query sent after all of
 * them is answered before the greedy tenant's last — where the greedy
 * one's queries filled the queue (or the loop scored them in arrival
 * order), the other's came after every one of them. Fair, it comes about
 * one query's time after it was sent, while the greedy tenant's last
 * comes N_GREEDY queries' time after its first (here each query takes
 * ~45 ms: a margin of ~200 ms for a loaded machine's scheduling, where
 * comparing with the third answer left ~100 ms and failed once). */
static void test_worker_share(void **state)
{
	struct harness *h = *state;
	struct share *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct share_arg ga = {.h = h, .greedy = 1}, oa = {.h = h};
	double sorted[N_GREEDY];
	pid_t g, o;

	if (!as_root())
		skip(); /* two tenants need two uids */
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	ga.sh = oa.sh = sh;
	g = harness_fork(share_main, &ga);
	o = harness_fork(share_main, &oa);
	assert_true(g > 0 && o > 0);
	assert_int_equal(harness_wait(g, 120), 0);
	assert_int_equal(harness_wait(o, 120), 0);
	for (int i = 0; i <= N_GREEDY; i++)
		assert_int_equal(sh->status[i], KVPALACE__V1__STATUS__STATUS_OK);
	for (int i = 0; i < N_GREEDY; i++)
		sorted[i] = sh->greedy[i];
	(void)harness_quantile(sorted, N_GREEDY, 0.0); /* sorts them */
	print_message("greedy tenant's answers at");
	for (int i = 0; i < N_GREEDY; i++)
		print_message(" +%.1f", sorted[i] - sorted[0]);
	print_message(" ms, the other's at +%.1f ms\n", sh->other - sorted[0]);
	assert_true(sh->other < sorted[N_GREEDY - 1]);
	munmap(sh, sizeof(*sh));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ping_beside_heavy, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_ping_beside_auto_compaction, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_close_while_scoring, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_worker_share, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
