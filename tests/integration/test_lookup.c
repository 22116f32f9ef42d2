/* tests/integration/test_lookup.c — kvp_lookup and kvp_lookup_batch:
 * how much of a prompt a pool holds, asked the way an engine's scheduler
 * asks, many times per request, without changing anything (issue 18).
 *
 *  - The answer is what kvp_match_prefix would find at that moment, for
 *    a whole prefix, a partial one, a diverging one, a miss, a prompt
 *    shorter than a page; a batch gives what single calls give, also
 *    past the 64 queries of one request and for prompts longer than one
 *    request (split into pieces that continue the hash chain), and mixed
 *    lengths in one batch.
 *  - Salts: the handle's, a per-query one, an explicit empty one; a salt
 *    over 64 bytes is refused.
 *  - Side-effect free: no hit, miss or queried token counted, nothing
 *    leased, and recency untouched: after many lookups of the older of
 *    two prefixes, an eviction still takes the older one, while one
 *    match + release of it (the control) makes the eviction take the
 *    other. With a disk tier: pages only on disk count as matched but not
 *    host, and the lookup reads none of them back (promoted_pages
 *    unchanged) where a match does.
 *  - Another user's pool of the same model and layout holds nothing of
 *    this user's, and another user's pool id is not found.
 *  - Raw requests the library never sends are refused with a clear
 *    status, and the connection goes on.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "kvpalace.pb-c.h"

#define MODEL "lookup-model"
#define BT    16

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

static const struct kvp_layout layout = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* What kvp_match_prefix finds for tokens[0..n) under the handle's salt. */
static uint64_t matched(kvp_pool *p, const uint32_t *tokens, size_t n)
{
	kvp_lease *l = NULL;
	uint64_t got;

	assert_int_equal(kvp_match_prefix(p, tokens, n, &l), 0);
	if (!l)
		return 0;
	got = kvp_lease_tokens(l);
	assert_int_equal(kvp_lease_release(l), 0);
	return got;
}

static uint64_t looked_up(kvp_pool *p, const uint32_t *tokens, size_t n)
{
	uint64_t got = 12345;

	assert_int_equal(kvp_lookup(p, tokens, n, &got), 0);
	return got;
}

static void commit(kvp_pool *p, const uint32_t *tokens, size_t n)
{
	kvp_session *s;

	assert_int_equal(harness_commit_session(p, tokens, n, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

static void test_equals_match(void **state)
{
	struct harness *h = *state;
	uint32_t a[100], diverge[100], other[100];
	struct kvp_lookup_query q[6];
	struct kvp_lookup_result r[6];
	size_t lens[6] = {100, 40, 100, 100, 15, 0};
	const uint32_t *ts[6] = {a, a, diverge, other, a, a};
	kvp_client *c;
	kvp_pool *p;

	harness_tokens(a, 100, 1, 0);
	memcpy(diverge, a, sizeof(a));
	diverge[50] ^= 0x5a5a; /* inside page 3: pages 0-2 match */
	harness_tokens(other, 100, 2, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);

	/* An empty pool: every answer 0. */
	assert_int_equal(looked_up(p, a, 100), 0);
	commit(p, a, 100);

	for (int i = 0; i < 6; i++) {
		q[i] = (struct kvp_lookup_query){.tokens = ts[i], .n_tokens = lens[i]};
		assert_int_equal(looked_up(p, ts[i], lens[i]), matched(p, ts[i], lens[i]));
	}
	assert_int_equal(looked_up(p, a, 100), 96);
	assert_int_equal(looked_up(p, a, 40), 32);
	assert_int_equal(looked_up(p, diverge, 100), 48);
	assert_int_equal(looked_up(p, other, 100), 0);
	assert_int_equal(looked_up(p, a, 15), 0);

	memset(r, 0xff, sizeof(r));
	assert_int_equal(kvp_lookup_batch(p, q, 6, r), 0);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(r[i].matched_tokens, looked_up(p, ts[i], lens[i]));
		assert_int_equal(r[i].host_tokens, r[i].matched_tokens); /* no disk tier */
	}
	assert_int_equal(kvp_lookup_batch(p, NULL, 0, NULL), 0);

	/* What the library refuses before asking. */
	assert_int_equal(kvp_lookup_batch(NULL, q, 1, r), -EINVAL);
	assert_int_equal(kvp_lookup_batch(p, NULL, 1, r), -EINVAL);
	assert_int_equal(kvp_lookup_batch(p, q, 1, NULL), -EINVAL);
	q[0] = (struct kvp_lookup_query){.tokens = NULL, .n_tokens = 3};
	assert_int_equal(kvp_lookup_batch(p, q, 1, r), -EINVAL);
	assert_int_equal(kvp_lookup(p, a, 100, NULL), -EINVAL);
	kvp_disconnect(c);
}

static void test_salts(void **state)
{
	struct harness *h = *state;
	uint32_t a[64];
	unsigned char long_salt[65];
	struct kvp_lookup_query q[4];
	struct kvp_lookup_result r[4];
	kvp_client *c;
	kvp_pool *p;

	harness_tokens(a, 64, 3, 0);
	memset(long_salt, 7, sizeof(long_salt));
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_pool_set_salt(p, "tenant-a", 8), 0);
	commit(p, a, 64);
	assert_int_equal(looked_up(p, a, 64), 64); /* the handle's salt */

	q[0] = (struct kvp_lookup_query){.tokens = a, .n_tokens = 64}; /* handle's */
	q[1] = (struct kvp_lookup_query){
		.tokens = a, .n_tokens = 64, .salt = "tenant-a", .salt_len = 8};
	q[2] = (struct kvp_lookup_query){
		.tokens = a, .n_tokens = 64, .salt = "tenant-b", .salt_len = 8};
	q[3] = (struct kvp_lookup_query){.tokens = a, .n_tokens = 64, .salt = "", .salt_len = 0};
	assert_int_equal(kvp_lookup_batch(p, q, 4, r), 0);
	assert_int_equal(r[0].matched_tokens, 64);
	assert_int_equal(r[1].matched_tokens, 64);
	assert_int_equal(r[2].matched_tokens, 0);
	assert_int_equal(r[3].matched_tokens, 0); /* explicitly unsalted */

	assert_int_equal(kvp_pool_set_salt(p, NULL, 0), 0);
	assert_int_equal(looked_up(p, a, 64), 0);
	assert_int_equal(matched(p, a, 64), 0);

	q[0] = (struct kvp_lookup_query){
		.tokens = a, .n_tokens = 64, .salt = long_salt, .salt_len = 65};
	assert_int_equal(kvp_lookup_batch(p, q, 1, r), -EINVAL);
	assert_non_null(strstr(kvp_strerror(c, -EINVAL), "salt"));
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

/* 4000 tokens a prompt: several requests at 4096-byte messages. */
#define LONG_N 4000

static int setup_small_messages(void **state)
{
	static const char *const args[] = {"--max-message-bytes", "4096", NULL};

	return harness_setup_args(state, args);
}

static void test_long_and_many(void **state)
{
	struct harness *h = *state;
	enum { N_Q = 150 };
	uint32_t *a = calloc(LONG_N, sizeof(*a)), *b = calloc(LONG_N, sizeof(*b));
	struct kvp_lookup_query *q = calloc(N_Q, sizeof(*q));
	struct kvp_lookup_result *r = calloc(N_Q, sizeof(*r));
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(q);
	assert_non_null(r);
	harness_tokens(a, LONG_N, 4, 0);
	memcpy(b, a, LONG_N * sizeof(*a));
	b[2500] ^= 1; /* page 156 differs */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	commit(p, a, LONG_N - 300);

	assert_int_equal(looked_up(p, a, LONG_N), harness_whole(LONG_N - 300, BT));
	assert_int_equal(looked_up(p, a, LONG_N), matched(p, a, LONG_N));
	assert_int_equal(looked_up(p, b, LONG_N), 2496);
	assert_int_equal(looked_up(p, b, LONG_N), matched(p, b, LONG_N));

	/* More queries than one request carries, of every length, long and
	 * short ones mixed, so that pieces of several share requests. */
	for (int i = 0; i < N_Q; i++) {
		size_t n = (size_t)(i * 37) % LONG_N;

		q[i] = (struct kvp_lookup_query){.tokens = i % 3 ? a : b, .n_tokens = n};
	}
	assert_int_equal(kvp_lookup_batch(p, q, N_Q, r), 0);
	for (int i = 0; i < N_Q; i++) {
		uint64_t want = matched(p, q[i].tokens, q[i].n_tokens);

		if (r[i].matched_tokens != want)
			fail_msg("query %d (%zu tokens): lookup %llu, match %llu", i, q[i].n_tokens,
				 (unsigned long long)r[i].matched_tokens, (unsigned long long)want);
		assert_int_equal(r[i].host_tokens, want);
	}
	kvp_disconnect(c);
	free(r);
	free(q);
	free(b);
	free(a);
}

/* Stats a lookup must leave as they were. */
struct counters {
	uint64_t hits, misses, queried, matched, requests;
	uint32_t leased;
};

static struct counters counters(kvp_client *c, kvp_pool *p)
{
	struct kvp_stats *st;
	struct counters n;
	const struct kvp_pool_stats *ps;

	assert_int_equal(kvp_stats(c, &st), 0);
	ps = harness_find_pool(st, kvp_pool_id(p));
	assert_non_null(ps);
	n = (struct counters){st->match_hits,	  st->match_misses, st->queried_tokens,
			      st->matched_tokens, st->requests,	    ps->leased_pages};
	kvp_stats_free(st);
	return n;
}

static uint64_t evict_host(struct harness *h, kvp_pool *p, uint64_t pages)
{
	struct kvp_evict_result *res;
	kvp_client *admin;
	uint64_t got;

	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_evict_flags(admin, KVP_TIER_HOST, kvp_pool_id(p),
					       pages * kvp_pool_page_bytes(p), 0, KVP_EVICT_DISCARD,
					       &res),
			 0);
	got = res->pages;
	free(res);
	kvp_disconnect(admin);
	return got;
}

static void test_changes_nothing(void **state)
{
	struct harness *h = *state;
	uint32_t a[64], b[64];
	struct counters before, after;
	kvp_client *c;
	kvp_pool *p, *control;
	kvp_lease *l;

	harness_tokens(a, 64, 5, 0);
	harness_tokens(b, 64, 6, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, "lookup-control", &layout, &control), 0);
	commit(p, a, 64); /* a is older than b */
	commit(p, b, 64);
	commit(control, a, 64);
	commit(control, b, 64);

	/* Counters: a lookup counts nothing but the request. */
	before = counters(c, p);
	for (int i = 0; i < 50; i++)
		assert_int_equal(looked_up(p, a, 64), 64);
	after = counters(c, p);
	assert_int_equal(after.hits, before.hits);
	assert_int_equal(after.misses, before.misses);
	assert_int_equal(after.queried, before.queried);
	assert_int_equal(after.matched, before.matched);
	assert_int_equal(after.leased, 0);
	assert_true(after.requests >= before.requests + 50);

	/* Recency: looking a up did not make it newer than b; matching it
	 * (the control pool) does. */
	assert_int_equal(kvp_match_prefix(control, a, 64, &l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(evict_host(h, p, 4), 4);
	assert_int_equal(evict_host(h, control, 4), 4);
	assert_int_equal(looked_up(p, a, 64), 0);
	assert_int_equal(looked_up(p, b, 64), 64);
	assert_int_equal(looked_up(control, a, 64), 64);
	assert_int_equal(looked_up(control, b, 64), 0);
	kvp_disconnect(c);
}

static int setup_disk(void **state)
{
	static const char *const args[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M",
					   NULL};

	return harness_setup_args(state, args);
}

static void test_disk_pages(void **state)
{
	struct harness *h = *state;
	uint32_t a[64];
	struct kvp_lookup_query q = {.tokens = a, .n_tokens = 64};
	struct kvp_lookup_result r;
	struct kvp_evict_result *res;
	struct kvp_pool_stats ps;
	kvp_client *c, *admin;
	kvp_pool *p;
	uint64_t promoted;

	harness_tokens(a, 64, 7, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &layout, &p), 0);
	commit(p, a, 64);
	/* The last two pages down to disk (leaves go first). */
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_evict(admin, KVP_TIER_HOST, kvp_pool_id(p),
					 2 * kvp_pool_page_bytes(p), 0, &res),
			 0);
	assert_int_equal(res->pages, 2);
	free(res);
	kvp_disconnect(admin);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	promoted = ps.promoted_pages;
	for (int i = 0; i < 5; i++) {
		assert_int_equal(kvp_lookup_batch(p, &q, 1, &r), 0);
		assert_int_equal(r.matched_tokens, 64);
		assert_int_equal(r.host_tokens, 32);
	}
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.promoted_pages, promoted);

	/* A match brings them back; then the lookup sees them in host. */
	assert_int_equal(matched(p, a, 64), 64);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.promoted_pages, promoted + 2);
	assert_int_equal(kvp_lookup_batch(p, &q, 1, &r), 0);
	assert_int_equal(r.host_tokens, 64);
	kvp_disconnect(c);
}

struct other_user {
	struct harness *h;
	uint64_t foreign_pool;
	uint32_t a[64];
};

static int lookup_as_nobody(void *arg)
{
	struct other_user *o = arg;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LookupRequest lr = KVPALACE__V1__LOOKUP_REQUEST__INIT;
	Kvpalace__V1__LookupQuery q = KVPALACE__V1__LOOKUP_QUERY__INIT, *qp = &q;
	Kvpalace__V1__Response *resp;
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t got = 1;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(prctl(PR_SET_PDEATHSIG, SIGKILL), 0);
	CHILD_CHECK_EQ(kvp_connect(o->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_id(p) != o->foreign_pool, 1);
	CHILD_CHECK_EQ(kvp_lookup(p, o->a, 64, &got), 0);
	CHILD_CHECK_EQ(got, 0);
	kvp_disconnect(c);

	/* The other user's pool by id: not found. */
	CHILD_CHECK_EQ(r != NULL, 1);
	CHILD_CHECK_EQ(raw_open(r, o->h->sock), 0);
	CHILD_CHECK_EQ(raw_hello(r), 0);
	q.has_tokens_le = 1;
	q.tokens_le.data = (uint8_t *)o->a;
	q.tokens_le.len = sizeof(o->a);
	lr.pool_id = o->foreign_pool;
	lr.n_queries = 1;
	lr.queries = &qp;
	req.id = 9;
	req.op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lr;
	CHILD_CHECK_EQ(raw_call(r, &req, &resp, NULL), 1);
	CHILD_CHECK_EQ(resp->status, ST(NOT_FOUND));
	raw_close(r);
	free(r);
	return 0;
}

static void test_other_user(void **state)
{
	struct other_user *o = calloc(1, sizeof(*o));
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(o);
	o->h = *state;
	harness_tokens(o->a, 64, 8, 0);
	assert_int_equal(kvp_connect(o->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	commit(p, o->a, 64);
	assert_int_equal(looked_up(p, o->a, 64), 64);
	o->foreign_pool = kvp_pool_id(p);
	assert_int_equal(harness_run_child(lookup_as_nobody, o), 0);
	kvp_disconnect(c);
	free(o);
}

/* One raw Lookup of n queries built by fill; the reply's status. */
static int raw_lookup(struct raw *r, uint64_t pool_id, size_t n,
		      void (*fill)(Kvpalace__V1__LookupQuery *q, size_t i))
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LookupRequest lr = KVPALACE__V1__LOOKUP_REQUEST__INIT;
	Kvpalace__V1__LookupQuery *qs = calloc(n, sizeof(*qs)), **qp = calloc(n, sizeof(*qp));
	Kvpalace__V1__Response *resp;
	static uint64_t id = 100;
	int status;

	assert_non_null(qs);
	assert_non_null(qp);
	for (size_t i = 0; i < n; i++) {
		kvpalace__v1__lookup_query__init(&qs[i]);
		fill(&qs[i], i);
		qp[i] = &qs[i];
	}
	lr.pool_id = pool_id;
	lr.n_queries = n;
	lr.queries = qp;
	req.id = id++;
	req.op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lr;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	status = (int)resp->status;
	if (status != ST(OK)) {
		assert_non_null(resp->error);
		assert_true(strlen(resp->error) > 0);
	}
	free(qp);
	free(qs);
	return status;
}

static uint8_t raw_tokens[64 * 4 + 1];
static uint8_t raw_bytes[80];

static void q_page(Kvpalace__V1__LookupQuery *q, size_t i)
{
	(void)i;
	q->has_tokens_le = 1;
	q->tokens_le.data = raw_tokens;
	q->tokens_le.len = 16 * 4;
}

static void q_odd_bytes(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_page(q, i);
	q->tokens_le.len = 16 * 4 + 1;
}

static void q_short_chain(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_page(q, i);
	q->has_chain = 1;
	q->chain.data = raw_bytes;
	q->chain.len = 15;
}

static void q_chain_and_salt(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_short_chain(q, i);
	q->chain.len = 16;
	q->has_cache_salt = 1;
	q->cache_salt.data = raw_bytes;
	q->cache_salt.len = 4;
}

static void q_long_salt(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_page(q, i);
	q->has_cache_salt = 1;
	q->cache_salt.data = raw_bytes;
	q->cache_salt.len = 65;
}

static void q_chain(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_short_chain(q, i);
	q->chain.len = 16;
}

static void q_unaligned(Kvpalace__V1__LookupQuery *q, size_t i)
{
	q_page(q, i);
	q->tokens_le.data = raw_tokens + 1;
}

static void test_raw_requests(void **state)
{
	struct harness *h = *state;
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t pool_id;

	assert_non_null(r);
	assert_int_equal(raw_open(r, h->sock), 0);
	assert_int_equal(raw_open_pool(r, MODEL, &layout, &pool_id), 0);

	assert_int_equal(raw_lookup(r, pool_id, 64, q_page), ST(OK));
	assert_int_equal(raw_lookup(r, pool_id, 65, q_page), ST(TOO_BIG));
	assert_int_equal(raw_lookup(r, pool_id, 1, q_odd_bytes), ST(INVALID));
	assert_int_equal(raw_lookup(r, pool_id, 1, q_short_chain), ST(INVALID));
	assert_int_equal(raw_lookup(r, pool_id, 1, q_chain_and_salt), ST(INVALID));
	assert_int_equal(raw_lookup(r, pool_id, 1, q_long_salt), ST(INVALID));
	assert_int_equal(raw_lookup(r, pool_id + 1000, 1, q_page), ST(NOT_FOUND));
	/* A made-up chain is a miss, not an error; unaligned token bytes
	 * are read as well as aligned ones. */
	assert_int_equal(raw_lookup(r, pool_id, 3, q_chain), ST(OK));
	assert_int_equal(raw_lookup(r, pool_id, 2, q_unaligned), ST(OK));
	assert_int_equal(raw_lookup(r, pool_id, 0, q_page), ST(OK));
	/* Still serving. */
	assert_int_equal(raw_lookup(r, pool_id, 1, q_page), ST(OK));
	raw_close(r);
	free(r);
	assert_true(harness_daemon_alive(h));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_equals_match, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_salts, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_long_and_many, setup_small_messages,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_changes_nothing, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_disk_pages, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_other_user, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_raw_requests, harness_setup, harness_teardown),
	};
	harness_eviction = "lru"; /* the assertions spell out LRU's order */

	return cmocka_run_group_tests_name("lookup", tests, NULL, NULL);
}
