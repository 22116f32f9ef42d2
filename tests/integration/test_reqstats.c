/* tests/integration/test_reqstats.c — what Stats says about the prompts a
 * tenant asked for and how long the daemon took to answer it.
 *
 * Scenario (an operator sizing a cache, as vLLM reports its prefix-cache
 * hit rate by tokens, not by queries): tenants (uids 2001 and 2002, each a
 * process of its own) commit prompts and match longer ones of which only
 * the first pages are cached, and ping. Each asks for Stats on the client
 * socket; then the admin does.
 *
 *   token counts  a prompt of N tokens whose first K pages are cached
 *                 counts N queried tokens, N / page_tokens queried pages,
 *                 K * page_tokens matched tokens and K matched pages; a
 *                 miss counts its tokens and pages too; a prompt longer
 *                 than one request (the smallest message cap, some 760
 *                 tokens a request, no whole number of pages) counts the
 *                 pages of the whole prompt, not those of each request,
 *                 also when the match stops in its first request and the
 *                 library sends no more (the first says the prompt's
 *                 length)
 *   latencies     every request type served appears once under its name
 *                 in kvpalace.proto ("Hello" — kvp_ping is a Hello —
 *                 "MatchPrefix", "ListCheckpoints", answered later by a
 *                 worker), with the tenant's own count, its buckets adding
 *                 up to the count, a positive sum and a mean inside the
 *                 buckets it fills; a type never served is absent; the
 *                 daemon's version is there
 *   tenants       a tenant sees its own counts only; the admin sees every
 *                 tenant's, summed
 *
 * Runs as root (tenants need other uids); skips otherwise.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define BT	16u
#define UID_A	2001u
#define UID_B	2002u
#define PINGS_A 5u
#define PINGS_B 9u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: one 4 KiB page. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static int setup(void **state)
{
	/* The smallest message cap: long prompts take several requests. */
	static const char *const extra[] = {
		"--host-tier-size",
		"256M",
		"--host-pool-size",
		"8M",
		"--max-message-bytes",
		"4096",
		NULL,
	};

	if (geteuid() != 0) {
		print_message("not root: tenants need other uids\n");
		*state = NULL;
		return 0;
	}
	return harness_setup_args(state, extra);
}

static int teardown(void **state)
{
	return *state ? harness_teardown(state) : 0;
}

#define NEED_ROOT()                                                                                \
	do {                                                                                       \
		if (!*state)                                                                       \
			skip();                                                                    \
	} while (0)

struct as_call {
	uid_t uid;
	int (*fn)(const struct harness *);
	const struct harness *h;
};

static int as_user(void *arg)
{
	const struct as_call *a = arg;

	CHILD_CHECK_EQ(harness_become(a->uid), 0);
	return a->fn(a->h);
}

/* Runs fn(h) in a child process of tenant uid; returns its status. */
static int run_as(uid_t uid, int (*fn)(const struct harness *), const struct harness *h)
{
	struct as_call a = {uid, fn, h};

	return harness_run_child(as_user, &a);
}

static const struct kvp_latency *find_latency(const struct kvp_stats *st, const char *name)
{
	for (size_t i = 0; i < st->n_latencies; i++)
		if (!strcmp(st->latencies[i].request, name))
			return &st->latencies[i];
	return NULL;
}

/* Every entry is well formed: a name, unique, buckets adding up to its
 * count, a positive sum, and a mean no lower than the lowest filled
 * bucket's lower bound nor above the highest's upper bound. Returns 0
 * or the line that failed (a child cannot use cmocka). */
static int check_latencies(const struct kvp_stats *st)
{
	for (size_t i = 0; i < st->n_latencies; i++) {
		const struct kvp_latency *l = &st->latencies[i];
		uint64_t sum = 0, mean;
		int lo = -1, hi = -1;

		if (!l->request[0] || find_latency(st, l->request) != l || !l->count || !l->sum_ns)
			return __LINE__;
		for (int b = 0; b < KVP_LATENCY_BUCKETS; b++) {
			sum += l->buckets[b];
			if (l->buckets[b] && lo < 0)
				lo = b;
			if (l->buckets[b])
				hi = b;
		}
		if (sum != l->count)
			return __LINE__;
		mean = l->sum_ns / l->count;
		if ((lo > 0 && mean < kvp_latency_bound_ns((unsigned int)lo - 1)) ||
		    mean > kvp_latency_bound_ns((unsigned int)hi)) {
			fprintf(stderr,
				"%s: count %" PRIu64 " sum %" PRIu64 " ns, buckets %d..%d\n",
				l->request, l->count, l->sum_ns, lo, hi);
			return __LINE__;
		}
	}
	return 0;
}

/* ---- token and page counts ---------------------------------------------- */

#define K_PAGES	 3u
#define N_PROMPT (7u * BT + 5u) /* 117 tokens: 7 whole pages and 5 tokens */
#define N_MISS	 40u		/* 2 whole pages */
#define N_LONG	 2000u		/* 125 pages, committed */
#define N_LONGQ	 (N_LONG + 5u)	/* asked: 3 requests of ~760 tokens */

static int stats_counts(kvp_client *c, uint64_t qt, uint64_t qp, uint64_t mt, uint64_t mp)
{
	struct kvp_stats *st = NULL;

	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->queried_tokens, qt);
	CHILD_CHECK_EQ(st->queried_pages, qp);
	CHILD_CHECK_EQ(st->matched_tokens, mt);
	CHILD_CHECK_EQ(st->matched_pages, mp);
	kvp_stats_free(st);
	return 0;
}

static int match(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t want)
{
	kvp_lease *l = NULL;

	CHILD_CHECK_EQ(kvp_match_prefix(p, tokens, n, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), want);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	return 0;
}

static int tenant_counts(const struct harness *h)
{
	static uint32_t tokens[N_LONGQ];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *s2, *s3;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "reqstats-model", &page4k, &p), 0);
	/* Only the first K pages of the prompt are cached. */
	harness_tokens(tokens, N_PROMPT, 1, 0);
	CHILD_CHECK_EQ(harness_commit_session(p, tokens, K_PAGES * BT, &s), 0);
	CHILD_CHECK_EQ(stats_counts(c, 0, 0, 0, 0), 0);

	CHILD_CHECK_EQ(match(p, tokens, N_PROMPT, K_PAGES * BT), 0);
	CHILD_CHECK_EQ(stats_counts(c, N_PROMPT, N_PROMPT / BT, K_PAGES * BT, K_PAGES), 0);

	/* A miss asks for its tokens too. */
	harness_tokens(tokens, N_MISS, 2, 0);
	CHILD_CHECK_EQ(match(p, tokens, N_MISS, 0), 0);
	CHILD_CHECK_EQ(stats_counts(c, N_PROMPT + N_MISS, N_PROMPT / BT + N_MISS / BT, K_PAGES * BT,
				    K_PAGES),
		       0);

	/* Longer than one request, cached but for its last 5 tokens: the
	 * request boundaries cut pages, the whole prompt's pages count. */
	harness_tokens(tokens, N_LONGQ, 3, 0);
	CHILD_CHECK_EQ(harness_commit_session(p, tokens, N_LONG, &s2), 0);
	CHILD_CHECK_EQ(match(p, tokens, N_LONGQ, N_LONG), 0);
	CHILD_CHECK_EQ(stats_counts(c, N_PROMPT + N_MISS + N_LONGQ,
				    N_PROMPT / BT + N_MISS / BT + N_LONGQ / BT,
				    K_PAGES * BT + N_LONG, K_PAGES + N_LONG / BT),
		       0);

	/* As long, but only its first K pages are cached: the match stops
	 * in the first request and the library sends no more, yet the
	 * whole prompt was asked about. */
	harness_tokens(tokens, N_LONGQ, 4, 0);
	CHILD_CHECK_EQ(harness_commit_session(p, tokens, K_PAGES * BT, &s3), 0);
	CHILD_CHECK_EQ(match(p, tokens, N_LONGQ, K_PAGES * BT), 0);
	CHILD_CHECK_EQ(stats_counts(c, N_PROMPT + N_MISS + 2 * N_LONGQ,
				    N_PROMPT / BT + N_MISS / BT + 2 * (N_LONGQ / BT),
				    2 * K_PAGES * BT + N_LONG, 2 * K_PAGES + N_LONG / BT),
		       0);

	CHILD_CHECK_EQ(kvp_session_close(s3), 0);
	CHILD_CHECK_EQ(kvp_session_close(s2), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	kvp_pool_close(p);
	kvp_disconnect(c);
	return 0;
}

/* Tenant B asks for one prompt, all missed. */
static int tenant_other_counts(const struct harness *h)
{
	uint32_t tokens[N_MISS];
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "reqstats-model", &page4k, &p), 0);
	CHILD_CHECK_EQ(stats_counts(c, 0, 0, 0, 0), 0); /* none of A's */
	harness_tokens(tokens, N_MISS, 1, 0);		/* A's tokens: B misses them */
	CHILD_CHECK_EQ(match(p, tokens, N_MISS, 0), 0);
	CHILD_CHECK_EQ(stats_counts(c, N_MISS, N_MISS / BT, 0, 0), 0);
	kvp_pool_close(p);
	kvp_disconnect(c);
	return 0;
}

#define N_LIE (63u * BT) /* 1008 tokens, all cached */
#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

/* One raw MatchPrefix of tokens[0..n): the first chunk (lease 0, with
 * prompt_tokens when has_prompt) or a later one of lease. Returns the
 * reply's status; *ret_lease gets its lease. */
static int raw_match(struct raw *r, uint64_t pool_id, uint32_t *tokens, size_t n, uint64_t lease,
		     int has_prompt, uint64_t prompt, uint64_t *ret_lease)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Response *resp;

	raw_req_match(&req, &mp, pool_id, tokens, n);
	mp.has_lease_id = lease != 0;
	mp.lease_id = lease;
	mp.has_prompt_tokens = has_prompt;
	mp.prompt_tokens = prompt;
	if (raw_call(r, &req, &resp, NULL) != 1)
		return -1;
	if (resp->status == ST(OK) && ret_lease)
		*ret_lease = resp->match_prefix->lease_id;
	return resp->status;
}

/* A tenant that lies about its prompts' lengths moves the hit ratio no
 * further than prompts it really sends would: prompt_tokens past
 * max-session-tokens is refused, and a first chunk that claims less than
 * its later chunks bring counts what they brought, so the ratio never
 * passes 100 % and the counters never go back. */
static int tenant_lies(const struct harness *h)
{
	static uint32_t tokens[N_LIE];
	struct kvp_stats *st = NULL;
	uint64_t lease = 0, qt0;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	struct raw r;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "reqstats-lies", &page4k, &p), 0);
	harness_tokens(tokens, N_LIE, 7, 0);
	CHILD_CHECK_EQ(harness_commit_session(p, tokens, N_LIE, &s), 0);
	CHILD_CHECK_EQ(raw_open(&r, h->sock), 0);

	/* Claims of 2^64 - 1 and 2^63 tokens: refused, nothing counted. */
	CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens, BT, 0, 1, UINT64_MAX, NULL),
		       ST(INVALID));
	CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens, BT, 0, 1, 1ull << 63, NULL),
		       ST(INVALID));
	CHILD_CHECK_EQ(stats_counts(c, 0, 0, 0, 0), 0);

	/* 16 tokens claimed, then the lease extended to all 1008. */
	for (int round = 0; round < 3; round++) {
		CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens, BT, 0, 1, BT, &lease), ST(OK));
		CHILD_CHECK(lease != 0);
		for (uint32_t at = BT; at < N_LIE; at += 8 * BT)
			CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens + at,
						 N_LIE - at < 8 * BT ? N_LIE - at : 8 * BT, lease,
						 0, 0, NULL),
				       ST(OK));
		CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
		CHILD_CHECK(st->matched_tokens <= st->queried_tokens);
		CHILD_CHECK(st->matched_pages <= st->queried_pages);
		CHILD_CHECK_EQ(st->queried_tokens, (uint64_t)(round + 1) * N_LIE);
		kvp_stats_free(st);
	}
	/* A claim larger than what follows counts the claim, once. */
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	qt0 = st->queried_tokens;
	kvp_stats_free(st);
	CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens, BT, 0, 1, 10 * N_LIE, &lease), ST(OK));
	CHILD_CHECK_EQ(raw_match(&r, kvp_pool_id(p), tokens + BT, BT, lease, 0, 0, NULL), ST(OK));
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->queried_tokens, qt0 + 10 * N_LIE);
	kvp_stats_free(st);

	raw_close(&r);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_lying_prompt_lengths(void **state)
{
	NEED_ROOT();
	assert_int_equal(run_as(UID_A + 10, tenant_lies, *state), 0);
}

static void test_token_and_page_counts(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st = NULL;
	kvp_client *adm;

	NEED_ROOT();
	assert_int_equal(run_as(UID_A, tenant_counts, h), 0);
	assert_int_equal(run_as(UID_B, tenant_other_counts, h), 0);

	/* The admin: both tenants, summed. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_stats(adm, &st), 0);
	assert_int_equal(st->queried_tokens, N_PROMPT + N_MISS + 2 * N_LONGQ + N_MISS);
	assert_int_equal(st->queried_pages,
			 N_PROMPT / BT + N_MISS / BT + 2 * (N_LONGQ / BT) + N_MISS / BT);
	assert_int_equal(st->matched_tokens, 2 * K_PAGES * BT + N_LONG);
	assert_int_equal(st->matched_pages, 2 * K_PAGES + N_LONG / BT);
	kvp_stats_free(st);
	kvp_disconnect(adm);
}

/* ---- latencies ---------------------------------------------------------- */

/* A: PINGS_A pings, two matches, a checkpoint listing (a worker answers
 * it, through a ticket). */
static int tenant_a_requests(const struct harness *h)
{
	uint32_t tokens[2 * BT];
	struct kvp_checkpoint_list *cl = NULL;
	struct kvp_stats *st = NULL;
	const struct kvp_latency *l;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0); /* a Hello */
	for (unsigned int i = 0; i < PINGS_A; i++)
		CHILD_CHECK_EQ(kvp_ping(c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "reqstats-model", &page4k, &p), 0);
	harness_tokens(tokens, 2 * BT, 5, 0);
	CHILD_CHECK_EQ(match(p, tokens, 2 * BT, 0), 0);
	CHILD_CHECK_EQ(match(p, tokens, BT, 0), 0);
	CHILD_CHECK_EQ(kvp_list_checkpoints(c, 0, 0, &cl), 0);
	kvp_checkpoint_list_free(cl);

	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(check_latencies(st), 0);
	CHILD_CHECK(st->version[0] != '\0');
	CHILD_CHECK((l = find_latency(st, "Hello")) != NULL);
	CHILD_CHECK_EQ(l->count, PINGS_A + 1);
	CHILD_CHECK((l = find_latency(st, "MatchPrefix")) != NULL);
	CHILD_CHECK_EQ(l->count, 2);
	CHILD_CHECK((l = find_latency(st, "OpenPool")) != NULL);
	CHILD_CHECK_EQ(l->count, 1);
	CHILD_CHECK((l = find_latency(st, "ListCheckpoints")) != NULL);
	CHILD_CHECK_EQ(l->count, 1);
	/* Not served yet: this Stats is counted once answered. */
	CHILD_CHECK(find_latency(st, "Stats") == NULL);
	CHILD_CHECK(find_latency(st, "ListSessions") == NULL);
	kvp_stats_free(st);
	kvp_pool_close(p);
	kvp_disconnect(c);
	return 0;
}

/* B: PINGS_B pings, a ListSessions, one match. */
static int tenant_b_requests(const struct harness *h)
{
	uint32_t tokens[BT];
	struct kvp_session_info *si = NULL;
	struct kvp_stats *st = NULL;
	const struct kvp_latency *l;
	kvp_client *c;
	kvp_pool *p;
	size_t n;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	for (unsigned int i = 0; i < PINGS_B; i++)
		CHILD_CHECK_EQ(kvp_ping(c), 0);
	CHILD_CHECK_EQ(kvp_list_sessions(c, 0, &si, &n), 0);
	free(si);
	CHILD_CHECK_EQ(kvp_pool_open(c, "reqstats-model", &page4k, &p), 0);
	harness_tokens(tokens, BT, 6, 0);
	CHILD_CHECK_EQ(match(p, tokens, BT, 0), 0);

	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(check_latencies(st), 0);
	CHILD_CHECK((l = find_latency(st, "Hello")) != NULL);
	CHILD_CHECK_EQ(l->count, PINGS_B + 1); /* none of A's */
	CHILD_CHECK((l = find_latency(st, "MatchPrefix")) != NULL);
	CHILD_CHECK_EQ(l->count, 1);
	CHILD_CHECK((l = find_latency(st, "ListSessions")) != NULL);
	CHILD_CHECK_EQ(l->count, 1);
	CHILD_CHECK(find_latency(st, "ListCheckpoints") == NULL); /* A's */
	CHILD_CHECK(find_latency(st, "Stats") == NULL);		  /* A's */
	kvp_stats_free(st);
	kvp_pool_close(p);
	kvp_disconnect(c);
	return 0;
}

/* A again, on a new connection: still its own counts, now with its Stats. */
static int tenant_a_again(const struct harness *h)
{
	struct kvp_stats *st = NULL;
	const struct kvp_latency *l;
	kvp_client *c;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(check_latencies(st), 0);
	CHILD_CHECK((l = find_latency(st, "Hello")) != NULL);
	CHILD_CHECK_EQ(l->count, PINGS_A + 2);
	CHILD_CHECK((l = find_latency(st, "Stats")) != NULL);
	CHILD_CHECK_EQ(l->count, 1);
	CHILD_CHECK((l = find_latency(st, "MatchPrefix")) != NULL);
	CHILD_CHECK_EQ(l->count, 2);
	CHILD_CHECK(find_latency(st, "ListSessions") == NULL); /* B's */
	kvp_stats_free(st);
	kvp_disconnect(c);
	return 0;
}

static void test_latencies_per_tenant(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st = NULL;
	const struct kvp_latency *l;
	kvp_client *adm;

	NEED_ROOT();
	assert_int_equal(run_as(UID_A, tenant_a_requests, h), 0);
	assert_int_equal(run_as(UID_B, tenant_b_requests, h), 0);
	assert_int_equal(run_as(UID_A, tenant_a_again, h), 0);

	/* The admin: every tenant's, its own Hello included. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_stats(adm, &st), 0);
	assert_int_equal(check_latencies(st), 0);
	assert_string_equal(st->version, KVP_VERSION);
	/* io_uring where the machine allows it (test_seccomp checks epoll). */
	assert_true(!strcmp(st->event_loop, "io_uring") || !strcmp(st->event_loop, "epoll"));
	assert_non_null(l = find_latency(st, "Hello"));
	assert_int_equal(l->count, (PINGS_A + 2) + (PINGS_B + 1) + 1);
	assert_non_null(l = find_latency(st, "MatchPrefix"));
	assert_int_equal(l->count, 3);
	assert_non_null(l = find_latency(st, "Stats"));
	assert_int_equal(l->count, 3);
	assert_non_null(l = find_latency(st, "ListSessions"));
	assert_int_equal(l->count, 1);
	assert_non_null(l = find_latency(st, "ListCheckpoints"));
	assert_int_equal(l->count, 1);
	assert_null(find_latency(st, "Checkpoint"));
	kvp_stats_free(st);
	kvp_disconnect(adm);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_token_and_page_counts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_latencies_per_tenant, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lying_prompt_lengths, setup, teardown),
	};

	return cmocka_run_group_tests_name("reqstats", tests, NULL, NULL);
}
