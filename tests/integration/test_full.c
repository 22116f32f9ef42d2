/* tests/integration/test_full.c — a full host arena.
 *
 * With a 1 MiB pool arena (256 pages of 4096 bytes), appends succeed until
 * every page is reserved and then fail with -ENOSPC, changing nothing; the
 * daemon keeps serving: the full pool's data is matched and read by
 * another process, other pools work. Pages whose session closed and whose
 * lease ended stay in the prefix index (still matchable) until an append
 * needs them: then they are evicted and reserved again, and -ENOSPC comes
 * only when every page is held or pinned. Leased pages are never handed to
 * another session while the lease lasts, and one append split over several
 * requests keeps the chunks that fit.
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

#define MODEL "full-model"

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

struct full_ctx {
	struct harness *h;
	uint32_t *tokens; /* what the filler committed */
	size_t n_tokens;
};

static int start(void **state)
{
	static const char *const extra[] = {"--disk-pool-size", "0", "--host-pool-size", "1M",
					    NULL};

	return harness_setup_args(state, extra);
}

static uint32_t pool_free(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps.free_pages;
}

/* Every Stats figure of the pool, the index's included. */
static struct harness_pool_info info(struct harness *h, kvp_pool *p)
{
	struct harness_pool_info pi;

	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &pi), 0);
	return pi;
}

/* Another process: the full pool refuses it room but serves its reads;
 * other pools are unaffected. */
static int other_client(void *arg)
{
	struct full_ctx *f = arg;
	uint32_t more[16];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s;
	kvp_lease *l;

	harness_tokens(more, 16, 31, 0);
	CHILD_CHECK_EQ(kvp_connect(f->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_ping(c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, more, 16), -ENOSPC);
	CHILD_CHECK_EQ(kvp_session_tokens(s), 0);
	CHILD_CHECK(strlen(kvp_strerror(c, -ENOSPC)) > 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, f->tokens, f->n_tokens, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), f->n_tokens);
	CHILD_CHECK_EQ(harness_check_lease(l, p, f->tokens, f->n_tokens), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);

	/* Another pool has its own arena. */
	CHILD_CHECK_EQ(kvp_pool_open(c, "full-model-other", &page4k, &q), 0);
	CHILD_CHECK_EQ(harness_commit_session(q, more, 16, &s), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(q, more, 16, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 16);
	CHILD_CHECK_EQ(harness_check_lease(l, q, more, 16), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_append_until_enospc(void **state)
{
	struct full_ctx f = {.h = *state};
	struct harness_pool_info pi;
	uint32_t n_pages, appended = 0;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	uint32_t big[1000];
	int ret;

	assert_int_equal(kvp_connect(f.h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_page_bytes(p), 4096);
	n_pages = kvp_pool_n_pages(p);
	assert_int_equal(n_pages, 256);
	assert_int_equal(pool_free(c, p), n_pages);

	f.n_tokens = (size_t)(n_pages + 1) * 16;
	f.tokens = calloc(f.n_tokens, sizeof(uint32_t));
	assert_non_null(f.tokens);
	harness_tokens(f.tokens, f.n_tokens, 30, 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	/* One page per append until the arena is full. */
	for (;;) {
		ret = kvp_append(s, f.tokens + (size_t)appended * 16, 16);
		if (ret < 0)
			break;
		appended++;
		assert_true(appended <= n_pages);
	}
	assert_int_equal(ret, -ENOSPC);
	assert_int_equal(appended, n_pages);
	assert_int_equal(kvp_session_tokens(s), (uint64_t)n_pages * 16);
	assert_int_equal(pool_free(c, p), 0);
	/* A bigger failing append changes nothing either. */
	harness_tokens(big, 1000, 32, 0);
	assert_int_equal(kvp_append(s, big, 1000), -ENOSPC);
	assert_int_equal(kvp_session_tokens(s), (uint64_t)n_pages * 16);

	/* What was reserved can still be written and committed. */
	f.n_tokens = (size_t)n_pages * 16;
	assert_int_equal(harness_write_session(p, s, 0, f.tokens, f.n_tokens), 0);
	assert_int_equal(kvp_commit(s, f.n_tokens), 0);
	assert_int_equal(kvp_session_committed(s), f.n_tokens);

	/* Others are served. */
	assert_int_equal(harness_run_child(other_client, &f), 0);

	/* A lease keeps the pages after the session closes... */
	assert_int_equal(kvp_match_prefix(p, f.tokens, f.n_tokens, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), f.n_tokens);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(pool_free(c, p), 0);
	assert_int_equal(harness_check_lease(l, p, f.tokens, f.n_tokens), 0);
	/* ...and once it ends the prefix index alone holds them: still
	 * matchable, evictable from the chain's last page back. */
	assert_int_equal(kvp_lease_release(l), 0);
	pi = info(f.h, p);
	assert_int_equal(pi.free_pages, 0);
	assert_int_equal(pi.indexed_pages, n_pages);
	assert_int_equal(pi.evictable_pages, 1);
	assert_int_equal(pi.leased_pages, 0);
	assert_int_equal(pi.evictions, 0);
	assert_int_equal(kvp_match_prefix(p, f.tokens, f.n_tokens, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), f.n_tokens);
	assert_int_equal(harness_check_lease(l, p, f.tokens, f.n_tokens), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* An append that needs the whole arena evicts all of it. */
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, f.tokens, f.n_tokens), 0);
	pi = info(f.h, p);
	assert_int_equal(pi.evictions, n_pages);
	assert_int_equal(pi.indexed_pages, 0);
	assert_int_equal(pi.reserved_pages, n_pages);
	/* Now everything is held: no room, whatever the index once had. */
	assert_int_equal(kvp_append(s, big, 1), -ENOSPC);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(pool_free(c, p), n_pages);
	assert_int_equal(kvp_match_prefix(p, f.tokens, f.n_tokens, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	free(f.tokens);
}

/* Pages pinned by a lease are never handed to another session, even after
 * their own session closed and the rest of the arena filled up: the lease
 * keeps reading the bytes it matched. Once it ends they are the only
 * evictable pages, and the next appends take them. */
static void test_leased_pages_not_reused(void **state)
{
	struct harness *h = *state;
	size_t n_rest = (256 - 6) * 16;
	uint32_t first[100], *rest = calloc(n_rest + 6 * 16 + 1, sizeof(uint32_t));
	struct harness_pool_info pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s1, *s2;
	kvp_lease *l;

	assert_non_null(rest);
	harness_tokens(first, 100, 34, 0);
	harness_tokens(rest, n_rest + 6 * 16 + 1, 35, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	/* 100 tokens: 6 full pages and a partial one. */
	assert_int_equal(harness_commit_session(p, first, 100, &s1), 0);
	assert_int_equal(kvp_match_prefix(p, first, 100, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 96);
	assert_int_equal(kvp_session_close(s1), 0);

	/* The partial page came back; everything else fills the arena. */
	assert_int_equal(pool_free(c, p), 256 - 6);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, rest, n_rest), 0);
	assert_int_equal(kvp_append(s2, rest + n_rest, 1), -ENOSPC);
	pi = info(h, p);
	assert_int_equal(pi.evictions, 0);
	assert_int_equal(pi.leased_pages, 6);
	assert_int_equal(pi.evictable_pages, 0);
	assert_int_equal(harness_write_session(p, s2, 0, rest, n_rest), 0);
	assert_int_equal(kvp_commit(s2, n_rest), 0);
	assert_int_equal(harness_check_lease(l, p, first, 96), 0);

	/* The closed session's full pages are still in the index. */
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, first, 100, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 96);
	assert_int_equal(harness_check_lease(l, p, first, 96), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	pi = info(h, p);
	assert_int_equal(pi.free_pages, 0);
	assert_int_equal(pi.evictable_pages, 1);
	/* Appending evicts them (the chain from its end, all six: the pool
	 * is above its watermark) and reuses their slots. */
	assert_int_equal(kvp_append(s2, rest + n_rest, 16), 0);
	pi = info(h, p);
	assert_int_equal(pi.evictions, 6);
	assert_int_equal(pi.free_pages, 5);
	assert_int_equal(kvp_append(s2, rest + n_rest + 16, 5 * 16), 0);
	assert_int_equal(kvp_append(s2, rest + n_rest + 6 * 16, 1), -ENOSPC);
	assert_int_equal(kvp_match_prefix(p, first, 100, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* Closing s2 frees its reservation; its committed pages stay
	 * indexed. */
	assert_int_equal(kvp_session_close(s2), 0);
	pi = info(h, p);
	assert_int_equal(pi.free_pages, 6);
	assert_int_equal(pi.indexed_pages, 250);
	kvp_disconnect(c);
	free(rest);
}

static int start_small_messages(void **state)
{
	static const char *const extra[] = {"--disk-pool-size",
					    "0",
					    "--host-pool-size",
					    "1M",
					    "--max-message-bytes",
					    "4096",
					    NULL};

	return harness_setup_args(state, extra);
}

/* One kvp_append of more tokens than the arena holds, sent in several
 * requests: the chunks that fit stay reserved (kvp_session_tokens() says
 * how many), and they can be written, committed and read back. */
static void test_chunked_append_fills_arena(void **state)
{
	struct harness *h = *state;
	size_t n = 256 * 16 + 100;
	uint32_t *tokens = calloc(n, sizeof(uint32_t));
	uint64_t got;
	uint32_t pages;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	assert_non_null(tokens);
	harness_tokens(tokens, n, 33, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 256);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, n), -ENOSPC);
	got = kvp_session_tokens(s);
	/* About 760 tokens go in one request at this cap: several made it. */
	assert_true(got >= 1000 && got <= 256 * 16);
	pages = (uint32_t)((got + 15) / 16);
	assert_int_equal(pool_free(c, p), 256 - pages);
	assert_int_equal(harness_write_session(p, s, 0, tokens, got), 0);
	assert_int_equal(kvp_commit(s, got), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, n, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), got / 16 * 16);
	assert_int_equal(harness_check_lease(l, p, tokens, got / 16 * 16), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_session_close(s), 0);
	/* Its full pages stay in the index; the partial one came back. */
	assert_int_equal(pool_free(c, p), 256 - got / 16);
	kvp_disconnect(c);
	free(tokens);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_append_until_enospc, start, harness_teardown),
		cmocka_unit_test_setup_teardown(test_leased_pages_not_reused, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_chunked_append_fills_arena,
						start_small_messages, harness_teardown),
	};

	return cmocka_run_group_tests_name("full", tests, NULL, NULL);
}
