/* tests/integration/test_chunking.c — token lists longer than one message.
 *
 * The daemon runs with the smallest message cap (4096 bytes, some 760
 * tokens per request). A writer appends 50,000 tokens in one call and in
 * calls of awkward sizes around the per-request limit; a reader in another
 * process matches 50,000 tokens in one call, a list that diverges deep
 * inside, and a list longer than what is cached — all invisibly chunked,
 * all with the right bytes, and always whole pages of 64 (the daemon keeps
 * the tokens of a page cut by a request boundary for the next request).
 * When two sessions share a prefix longer than one request, they share its
 * pages (dedup) and a query follows whichever branch it takes, wherever the
 * branches part relative to the request boundaries.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	"chunk-model"
#define N_LONG	50000
#define N_EXTRA 10000

/* 1 layer, 1 head, 8-wide f16 rows, 64 tokens a page: 782 pages. */
#define BT	 64
#define WHOLE(n) ((n) / BT * BT)
static const struct kvp_layout small = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = 64,
	.dtype = KVP_DTYPE_F16,
};

struct chunk_ctx {
	struct harness *h;
	uint32_t *a; /* N_LONG + N_EXTRA tokens of sequence 40 */
	uint32_t *b; /* sequence 41, appended in odd-sized pieces */
	size_t n_b;
};

static int start(void **state)
{
	/* 32768 pages: room for everything, and few enough that the
	 * -Ddebug-checks build's check after every request stays quick. */
	static const char *const extra[] = {"--max-message-bytes", "4096", "--host-pool-size",
					    "128M", NULL};

	return harness_setup_args(state, extra);
}

static int check_match(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t want)
{
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_match_prefix(p, tokens, n, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), want);
	CHILD_CHECK_EQ(harness_check_lease(l, p, tokens, want), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	return 0;
}

static int reader(void *arg)
{
	struct chunk_ctx *k = arg;
	uint32_t *q = malloc((N_LONG + N_EXTRA) * sizeof(uint32_t));
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK(q != NULL);
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &small, &p), 0);
	/* 50,000 tokens are 781 full pages and 16 tokens more. */
	CHILD_CHECK_EQ(check_match(p, k->a, N_LONG, WHOLE(N_LONG)), 0);
	CHILD_CHECK_EQ(WHOLE(N_LONG), 49984);
	CHILD_CHECK_EQ(check_match(p, k->a, N_LONG + N_EXTRA, WHOLE(N_LONG)), 0);
	CHILD_CHECK_EQ(check_match(p, k->b, k->n_b, WHOLE(k->n_b)), 0);
	/* Diverging deep inside, at a position that is no chunk or page
	 * boundary: the pages before the one that differs. */
	memcpy(q, k->a, N_LONG * sizeof(uint32_t));
	q[40001] ^= 0x5a5a;
	CHILD_CHECK_EQ(check_match(p, q, N_LONG, 40000), 0);
	/* Diverging around the end of the first request's tokens, in the
	 * page that request cuts and in the pages beside it. */
	memcpy(q, k->a, N_LONG * sizeof(uint32_t));
	for (size_t at = 700; at < 840; at += 3) {
		uint32_t saved = q[at];

		q[at] = 7;
		CHILD_CHECK_EQ(check_match(p, q, N_LONG, WHOLE(at)), 0);
		q[at] = saved;
	}
	kvp_disconnect(c);
	free(q);
	return 0;
}

static void test_long_lists(void **state)
{
	static const size_t pieces[] = {1, 763, 764, 765, 1529, 3000, 17, 7000};
	struct chunk_ctx k = {.h = *state};
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *sa, *sb;
	size_t at = 0;

	k.a = malloc((N_LONG + N_EXTRA) * sizeof(uint32_t));
	assert_non_null(k.a);
	harness_tokens(k.a, N_LONG + N_EXTRA, 40, 0);
	for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++)
		k.n_b += pieces[i];
	k.b = malloc(k.n_b * sizeof(uint32_t));
	assert_non_null(k.b);
	harness_tokens(k.b, k.n_b, 41, 0);

	assert_int_equal(kvp_connect(k.h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);

	/* 50,000 tokens in one call. */
	assert_int_equal(kvp_session_create(p, &sa), 0);
	assert_int_equal(kvp_append(sa, k.a, N_LONG), 0);
	assert_int_equal(kvp_session_tokens(sa), N_LONG);
	assert_int_equal(harness_write_session(p, sa, 0, k.a, N_LONG), 0);
	assert_int_equal(kvp_commit(sa, N_LONG), 0);
	assert_int_equal(kvp_session_committed(sa), N_LONG);

	/* Odd pieces, each written right after it is reserved. */
	assert_int_equal(kvp_session_create(p, &sb), 0);
	for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
		assert_int_equal(kvp_append(sb, k.b + at, pieces[i]), 0);
		assert_int_equal(kvp_session_tokens(sb), at + pieces[i]);
		assert_int_equal(harness_write_session(p, sb, at, k.b + at, pieces[i]), 0);
		at += pieces[i];
	}
	assert_int_equal(kvp_commit(sb, k.n_b), 0);

	assert_int_equal(harness_run_child(reader, &k), 0);

	assert_int_equal(kvp_stats(c, &st), 0);
	assert_true(st->appended_tokens >= N_LONG + k.n_b);
	assert_true(st->committed_tokens >= N_LONG + k.n_b);
	kvp_stats_free(st);
	kvp_disconnect(c);
	free(k.a);
	free(k.b);
}

/* Two sessions share a prefix of `shared` tokens and then diverge. With
 * the prefix index they share the pages of the common prefix (the second
 * commit adopts the first one's copies), and a query follows whichever
 * branch it takes, whether or not it needs more than one request: chunking
 * must stay invisible. The K/V depends on the whole prefix, so a page of the
 * wrong branch would read wrong. */
static void check_longest_of_two(struct harness *h, size_t shared, size_t tail, uint32_t seq)
{
	size_t n = shared + tail;
	uint32_t *x = malloc(n * sizeof(uint32_t));
	uint32_t *y = malloc(n * sizeof(uint32_t));
	struct harness_pool_info before, after;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *sx, *sy;
	kvp_lease *l;

	assert_non_null(x);
	assert_non_null(y);
	harness_tokens(x, n, seq, 0);
	memcpy(y, x, shared * sizeof(uint32_t));
	harness_tokens(y + shared, tail, seq + 1, 0);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, x, n, &sx), 0);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &before), 0);
	assert_int_equal(harness_pkv_commit_session(p, y, n, &sy), 0);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &after), 0);
	/* The shared full pages are stored once. */
	assert_int_equal(after.dedup_pages - before.dedup_pages, shared / BT);
	assert_int_equal(before.free_pages - after.free_pages, (n + BT - 1) / BT - shared / BT);
	assert_int_equal(harness_pkv_check_session(p, sy, y, 0, n), 0);

	assert_int_equal(kvp_match_prefix(p, y, n, &l), 0);
	if (kvp_lease_tokens(l) != WHOLE(n))
		fail_msg("query of %zu tokens (%zu shared with an older session): matched "
			 "%llu, the index holds %zu",
			 n, shared, (unsigned long long)kvp_lease_tokens(l), (size_t)WHOLE(n));
	assert_int_equal(harness_pkv_check_lease(l, p, y, WHOLE(n)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* The other way round, too. */
	assert_int_equal(kvp_match_prefix(p, x, n, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), WHOLE(n));
	assert_int_equal(harness_pkv_check_lease(l, p, x, WHOLE(n)), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	assert_int_equal(kvp_session_close(sx), 0);
	assert_int_equal(kvp_session_close(sy), 0);
	/* Closed sessions' full pages stay matchable through the index. */
	assert_int_equal(kvp_match_prefix(p, y, n, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), WHOLE(n));
	assert_int_equal(harness_pkv_check_lease(l, p, y, WHOLE(n)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	free(x);
	free(y);
}

static void test_longest_match_in_one_request(void **state)
{
	/* 700 tokens fit one request (about 760 at this cap). */
	check_longest_of_two(*state, 500, 200, 70);
}

static void test_longest_match_across_chunks(void **state)
{
	/* The shared part fills the first request; the sessions differ only
	 * in what later requests carry. */
	check_longest_of_two(*state, 1600, 400, 72);
}

/* Like the above with the divergence swept across the first two request
 * boundaries: the branch point falls in every position of the page a
 * request cuts, and in the pages beside it. The lease must take each page
 * from the query's own branch, wherever the request ended. */
static void test_divergence_near_request_boundaries(void **state)
{
	struct harness *h = *state;
	enum { TAIL = 100, MAX_N = 1700 + TAIL };
	uint32_t *x = malloc(MAX_N * sizeof(uint32_t));
	uint32_t *y = malloc(MAX_N * sizeof(uint32_t));
	struct harness_pool_info before, after;
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(x);
	assert_non_null(y);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	for (size_t d = 700; d < 1700; d += d < 840 || d >= 1460 ? 1 : 20) {
		size_t n = d + TAIL;
		kvp_session *sx, *sy;
		kvp_lease *l;

		harness_tokens(x, n, 74, d << 8);
		memcpy(y, x, d * sizeof(uint32_t));
		harness_tokens(y + d, TAIL, 75, d << 8);
		assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &before), 0);
		assert_int_equal(harness_pkv_commit_session(p, x, n, &sx), 0);
		assert_int_equal(harness_pkv_commit_session(p, y, n, &sy), 0);
		assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &after), 0);
		if (after.dedup_pages - before.dedup_pages != d / BT)
			fail_msg("shared prefix %zu: %llu pages deduplicated, %zu expected", d,
				 (unsigned long long)(after.dedup_pages - before.dedup_pages),
				 d / BT);

		assert_int_equal(kvp_match_prefix(p, y, n, &l), 0);
		if (kvp_lease_tokens(l) != WHOLE(n) || harness_pkv_check_lease(l, p, y, WHOLE(n)))
			fail_msg("shared prefix %zu: matched %llu of %zu", d,
				 (unsigned long long)kvp_lease_tokens(l), (size_t)WHOLE(n));
		assert_int_equal(kvp_lease_release(l), 0);
		/* A query that leaves both branches one token before they
		 * part gets the pages before that token only. */
		{
			uint32_t saved = y[d - 1];

			y[d - 1] ^= 0x5a5a;
			assert_int_equal(kvp_match_prefix(p, y, n, &l), 0);
			if (kvp_lease_tokens(l) != WHOLE(d - 1))
				fail_msg("diverging at %zu: matched %llu", d - 1,
					 (unsigned long long)kvp_lease_tokens(l));
			assert_int_equal(kvp_lease_release(l), 0);
			y[d - 1] = saved;
		}
		assert_int_equal(kvp_session_close(sx), 0);
		assert_int_equal(kvp_session_close(sy), 0);
	}
	kvp_disconnect(c);
	free(x);
	free(y);
}

/* 16 tokens a page, so a few thousand pages take little memory. */
static const struct kvp_layout small16 = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

/* A commit that fills more pages than one reply can list the slots of
 * (some 760 at this cap) is split by the library; when every page is
 * deduplicated, each reply moves its pages to the indexed copies, and the
 * session must read through the new slots even after its own old copies
 * were handed out again and overwritten. A fork of such a session fetches
 * its page table in several SessionPages requests. */
static void test_commit_and_fork_beyond_one_reply(void **state)
{
	struct harness *h = *state;
	enum { N = 20000 }; /* 1250 pages */
	uint32_t *x = malloc(N * sizeof(uint32_t)), *z = malloc(N * sizeof(uint32_t));
	struct harness_pool_info before, after;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s1, *s2, *s3, *f;

	assert_non_null(x);
	assert_non_null(z);
	harness_tokens(x, N, 76, 0);
	harness_tokens(z, N, 77, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL "-16", &small16, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, x, N, &s1), 0);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &before), 0);
	/* The same tokens again, committed in one call. */
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, x, N), 0);
	assert_int_equal(harness_pkv_write_session(p, s2, x, 0, N), 0);
	assert_int_equal(kvp_commit(s2, N), 0);
	assert_int_equal(kvp_session_committed(s2), N);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &after), 0);
	assert_int_equal(after.dedup_pages - before.dedup_pages, N / 16);
	assert_int_equal(after.free_pages, before.free_pages);
	/* s2's own copies went back to the pool: fill them with other
	 * bytes, then s2 must still read its own. */
	assert_int_equal(harness_pkv_commit_session(p, z, N, &s3), 0);
	assert_int_equal(harness_pkv_check_session(p, s2, x, 0, N), 0);
	assert_int_equal(harness_pkv_check_session(p, s1, x, 0, N), 0);
	/* A fork of 1249 pages and a bit. */
	assert_int_equal(kvp_session_fork(s2, N - 5, &f), 0);
	assert_int_equal(harness_pkv_check_session(p, f, x, 0, N - 5), 0);
	assert_int_equal(kvp_session_close(f), 0);
	assert_int_equal(kvp_session_close(s1), 0);
	assert_int_equal(kvp_session_close(s2), 0);
	assert_int_equal(kvp_session_close(s3), 0);
	kvp_disconnect(c);
	free(x);
	free(z);
}

/* More sessions than one ListSessions reply holds: all listed, in id
 * order, once. */
static void test_list_many_sessions(void **state)
{
	struct harness *h = *state;
	enum { N = 300 };
	struct kvp_session_info *all;
	kvp_session *s[N];
	kvp_client *c;
	kvp_pool *p;
	size_t n;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(kvp_session_create(p, &s[i]), 0);
	assert_int_equal(kvp_list_sessions(c, kvp_pool_id(p), &all, &n), 0);
	assert_int_equal(n, N);
	for (int i = 0; i < N; i++)
		assert_int_equal(all[i].session_id, kvp_session_id(s[i]));
	free(all);
	kvp_disconnect(c);
}

/* Sends a MatchPrefix of tokens[0..n) on r with the given id: a first
 * chunk, or with cont a later one that continues it, or with lease a later
 * one naming that lease. */
static void send_chunk(struct raw *r, uint64_t id, uint64_t pool_id, uint32_t *tokens, size_t n,
		       int cont, uint64_t lease)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__MatchPrefixRequest mp;

	raw_req_match(&req, &mp, pool_id, tokens, n);
	req.id = id;
	mp.has_continues = cont;
	mp.continues = cont;
	mp.has_lease_id = lease != 0;
	mp.lease_id = lease;
	assert_int_equal(raw_send(r, &req), 0);
}

/* Receives the reply to request id on r: its status, lease, matched
 * tokens and completeness. */
static int recv_chunk(struct raw *r, uint64_t id, uint64_t *lease, uint64_t *matched, int *complete)
{
	Kvpalace__V1__Response *resp;

	assert_int_equal(raw_recv(r, &resp, NULL), 1);
	assert_int_equal(resp->id, id);
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return resp->status;
	assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX);
	*lease = resp->match_prefix->lease_id;
	*matched = resp->match_prefix->matched_tokens;
	*complete = resp->match_prefix->complete;
	return 0;
}

/* A long match sent whole before any reply (Hello's match_continues): the
 * later chunks extend the lease of the first without knowing its id, on
 * that connection only; every way of getting it wrong is a clear error,
 * and a first chunk that missed makes its later ones misses. */
static void test_continued_chunks(void **state)
{
	enum { CH = 600, N = 4 * CH };
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__Response *resp;
	uint32_t *t = malloc(N * sizeof(uint32_t)), other[CH];
	uint64_t pool_id, lease, first_lease = 0, matched;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	struct raw r, r2;
	int complete;

	assert_non_null(t);
	harness_tokens(t, N, 60, 0);
	harness_tokens(other, CH, 61, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, t, N - 100, &s), 0);

	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &small, &pool_id), 0);
	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_true(resp->hello->has_match_continues && resp->hello->match_continues);

	/* Four chunks at once; the replies grow one lease by whole pages up
	 * to what the session holds. */
	for (int i = 0; i < 4; i++)
		send_chunk(&r, 10 + i, pool_id, t + i * CH, CH, i > 0, 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(recv_chunk(&r, 10 + i, &lease, &matched, &complete), 0);
		if (i == 0)
			first_lease = lease;
		assert_true(lease != 0);
		assert_int_equal(lease, first_lease);
		assert_int_equal(matched, WHOLE((i + 1) * CH < N - 100 ? (i + 1) * CH : N - 100));
		assert_int_equal(complete, i == 3);
	}

	/* Both a lease id and continues; and a chunk that follows a released
	 * lease. */
	send_chunk(&r, 20, pool_id, t, CH, 1, first_lease);
	assert_int_equal(recv_chunk(&r, 20, &lease, &matched, &complete),
			 KVPALACE__V1__STATUS__STATUS_INVALID);
	{
		Kvpalace__V1__ReleaseRequest rel;

		raw_req_release(&req, &rel, first_lease);
		assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
		assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	}
	send_chunk(&r, 21, pool_id, t + CH, CH, 1, 0);
	assert_int_equal(recv_chunk(&r, 21, &lease, &matched, &complete),
			 KVPALACE__V1__STATUS__STATUS_NOT_FOUND);

	/* Another connection has no match to continue, and cannot reach this
	 * one's. */
	send_chunk(&r, 30, pool_id, t, CH, 0, 0);
	assert_int_equal(recv_chunk(&r, 30, &first_lease, &matched, &complete), 0);
	assert_int_equal(raw_open(&r2, h->sock), 0);
	assert_int_equal(raw_hello(&r2), 0);
	send_chunk(&r2, 31, pool_id, t + CH, CH, 1, 0);
	assert_int_equal(recv_chunk(&r2, 31, &lease, &matched, &complete),
			 KVPALACE__V1__STATUS__STATUS_INVALID);
	raw_close(&r2);

	/* A first chunk that matched nothing: its later chunks are misses,
	 * though the tokens they carry are cached. */
	send_chunk(&r, 40, pool_id, other, CH, 0, 0);
	send_chunk(&r, 41, pool_id, t + CH, CH, 1, 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(recv_chunk(&r, 40 + i, &lease, &matched, &complete), 0);
		assert_int_equal(lease, 0);
		assert_int_equal(matched, 0);
		assert_true(complete);
	}

	/* A first chunk that failed (no such pool): nothing to continue. */
	send_chunk(&r, 50, pool_id + 1000, t, CH, 0, 0);
	send_chunk(&r, 51, pool_id, t + CH, CH, 1, 0);
	assert_int_equal(recv_chunk(&r, 50, &lease, &matched, &complete),
			 KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(recv_chunk(&r, 51, &lease, &matched, &complete),
			 KVPALACE__V1__STATUS__STATUS_INVALID);

	/* The library matches the same list in continued chunks. */
	{
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, t, N, &l), 0);
		assert_int_equal(kvp_lease_tokens(l), WHOLE(N - 100));
		kvp_lease_release(l);
	}
	kvp_disconnect(c);
	raw_close(&r);
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_long_lists, start, harness_teardown),
		cmocka_unit_test_setup_teardown(test_longest_match_in_one_request, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_longest_match_across_chunks, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_divergence_near_request_boundaries, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_commit_and_fork_beyond_one_reply, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_list_many_sessions, start, harness_teardown),
		cmocka_unit_test_setup_teardown(test_continued_chunks, start, harness_teardown),
	};

	return cmocka_run_group_tests_name("chunking", tests, NULL, NULL);
}
