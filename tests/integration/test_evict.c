/* tests/integration/test_evict.c — eviction of the host tier.
 *
 * A 1 MiB pool of 4 KiB pages (256 pages; high watermark 95 % = 243 pages,
 * low 90 % = 230). Full pages whose sessions closed stay in the prefix
 * index until an allocation needs them:
 *  - a workload of 30 conversations of 20 pages (600 pages) keeps running
 *    in the 256-page pool: no -ENOSPC; the least recently used
 *    conversations go first, each from its last page back (the index stays
 *    a set of whole prefixes: no page outlives its parent); a conversation
 *    matched recently outlives older ones; a leased conversation and one an
 *    open session holds are never evicted, and read right afterwards;
 *    Stats' evictions, indexed and evictable pages agree with what still
 *    matches;
 *  - the watermarks: nothing is evicted until a request would take the pool
 *    past the high mark, then down to about the low mark, then nothing
 *    again for a while; other marks given on the command line; marks that
 *    make no sense stop the daemon at start;
 *  - when every page is held or pinned, Append fails with -ENOSPC; fork and
 *    truncate copies evict like appends do;
 *  - four processes at once commit, fork, truncate and match overlapping
 *    conversations in the small pool for a second and a half, every byte
 *    they read checked; afterwards only the index holds pages.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	   "evict-model"
#define BT	   16u
#define N_PAGES	   256u
#define CONV_PAGES 20u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   30

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static int start(void **state)
{
	static const char *const extra[] = {"--disk-pool-size", "0", "--host-pool-size", "1M",
					    NULL};

	return harness_setup_args(state, extra);
}

static struct harness_pool_info info(const struct harness *h, kvp_pool *p)
{
	struct harness_pool_info pi;

	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &pi), 0);
	return pi;
}

static uint32_t used(const struct harness_pool_info *pi)
{
	return pi->n_pages - pi->free_pages;
}

/* Tokens matched now for tokens[0..n) (through p), checking the bytes. */
static uint64_t matched(kvp_pool *p, const uint32_t *tokens, size_t n)
{
	kvp_lease *l;
	uint64_t m;

	assert_int_equal(kvp_match_prefix(p, tokens, n, &l), 0);
	m = kvp_lease_tokens(l);
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, m), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	return m;
}

static void test_workload_larger_than_pool(void **state)
{
	struct harness *h = *state;
	uint32_t *all = calloc(N_CONV * CONV, sizeof(uint32_t)), *conv[N_CONV];
	uint64_t m[N_CONV], evicted = 0, indexed = 0, evictable = 0;
	struct harness_pool_info pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *held;
	kvp_lease *pinned;

	assert_non_null(all);
	for (int i = 0; i < N_CONV; i++) {
		conv[i] = all + (size_t)i * CONV;
		harness_tokens(conv[i], CONV, 300 + (uint32_t)i, 0);
	}
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), N_PAGES);

	/* Conversation 0: its session closes, a lease keeps it pinned.
	 * Conversation 1: its session stays open. 2..9: closed. */
	assert_int_equal(harness_pkv_commit_session(p, conv[0], CONV, &s), 0);
	assert_int_equal(kvp_match_prefix(p, conv[0], CONV, &pinned), 0);
	assert_int_equal(kvp_lease_tokens(pinned), CONV);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_pkv_commit_session(p, conv[1], CONV, &held), 0);
	for (int i = 2; i < 10; i++) {
		assert_int_equal(harness_pkv_commit_session(p, conv[i], CONV, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	pi = info(h, p);
	assert_int_equal(used(&pi), 10 * CONV_PAGES);
	assert_int_equal(pi.evictions, 0);
	assert_int_equal(pi.indexed_pages, 10 * CONV_PAGES);
	assert_int_equal(pi.evictable_pages, 8); /* the last page of each of 2..9 */
	assert_int_equal(pi.leased_pages, CONV_PAGES);

	/* Conversation 3 is used again: it becomes the most recent of 2..9. */
	assert_int_equal(matched(p, conv[3], CONV), CONV);

	/* Twenty more conversations: 400 pages into the 56 left. */
	for (int i = 10; i < N_CONV; i++) {
		int ret = harness_pkv_commit_session(p, conv[i], CONV, &s);

		if (ret != 0)
			fail_msg("conversation %d: %d (%s)", i, ret, kvp_strerror(c, ret));
		assert_int_equal(kvp_session_close(s), 0);
		pi = info(h, p);
		assert_true(used(&pi) <= N_PAGES);
	}

	/* Pinned and held conversations are whole, and read right. */
	assert_int_equal(harness_pkv_check_lease(pinned, p, conv[0], CONV), 0);
	assert_int_equal(harness_pkv_check_session(p, held, conv[1], 0, CONV), 0);
	assert_int_equal(kvp_lease_release(pinned), 0);

	pi = info(h, p);
	for (int i = 0; i < N_CONV; i++) {
		m[i] = matched(p, conv[i], CONV);
		assert_int_equal(m[i] % BT, 0);
		evicted += CONV_PAGES - m[i] / BT;
		indexed += m[i] / BT;
		evictable += i != 1 && m[i] > 0;
	}
	assert_int_equal(m[0], CONV);
	assert_int_equal(m[1], CONV);
	/* Stats agree with what still matches: every indexed page is part
	 * of a whole prefix (no page outlived its parent), every missing
	 * page was counted as an eviction. */
	assert_int_equal(pi.evictions, evicted);
	assert_int_equal(pi.indexed_pages, indexed);
	assert_int_equal(pi.evictable_pages, evictable);
	assert_true(pi.evictions >= (N_CONV * CONV_PAGES) - N_PAGES);
	/* Least recently used first: older conversations lose pages before
	 * newer ones; the one used again sits after 9 and before 10; the
	 * newest is whole. */
	for (int i = 2; i + 1 < N_CONV; i++) {
		int j = i + 1 == 3 ? i + 2 : i + 1;

		if (i == 3)
			continue;
		if (m[i] > m[j])
			fail_msg("conversation %d (older) keeps %llu tokens, %d (newer) %llu", i,
				 (unsigned long long)m[i], j, (unsigned long long)m[j]);
	}
	if (m[3] < m[9] || m[3] > m[10])
		fail_msg("the conversation matched again keeps %llu tokens; 9 keeps %llu, 10 "
			 "keeps %llu",
			 (unsigned long long)m[3], (unsigned long long)m[9],
			 (unsigned long long)m[10]);
	assert_int_equal(m[N_CONV - 1], CONV);
	assert_int_equal(m[2], 0);
	/* At most one conversation is partly evicted at a time. */
	{
		int partial = 0;

		for (int i = 2; i < N_CONV; i++)
			partial += m[i] != 0 && m[i] != CONV;
		assert_true(partial <= 1);
	}
	assert_int_equal(kvp_session_close(held), 0);
	kvp_disconnect(c);
	free(all);
}

/* Appends one page at a time to a session of p; returns the evictions
 * counter after it. */
static uint64_t append_page(struct harness *h, kvp_pool *p, kvp_session *s, uint32_t seq)
{
	uint32_t tokens[BT];

	harness_tokens(tokens, BT, seq, kvp_session_tokens(s));
	assert_int_equal(kvp_append(s, tokens, BT), 0);
	return info(h, p).evictions;
}

/* Fills p with closed conversations until `pages` pages are used. */
static void fill_index(kvp_pool *p, uint32_t pages, uint32_t seq)
{
	uint32_t tokens[CONV];
	kvp_session *s;

	for (uint32_t i = 0; i < pages / CONV_PAGES; i++) {
		harness_tokens(tokens, CONV, seq + i, 0);
		assert_int_equal(harness_pkv_commit_session(p, tokens, CONV, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
}

/* Nothing is evicted while a request keeps the pool at or below the high
 * mark; the request that would pass it evicts down to about the low mark
 * (the daemon may count the request's page in or not); then single pages
 * go in without eviction until the high mark again. */
static void check_watermarks(struct harness *h, uint32_t high, uint32_t low)
{
	struct harness_pool_info pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *w;
	uint64_t ev;
	uint32_t u;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	fill_index(p, high / CONV_PAGES * CONV_PAGES, 400);
	assert_int_equal(kvp_session_create(p, &w), 0);
	pi = info(h, p);
	for (u = used(&pi); u < high; u++)
		assert_int_equal(append_page(h, p, w, 500), 0);
	pi = info(h, p);
	assert_int_equal(used(&pi), high);
	assert_int_equal(pi.evictions, 0);
	/* One page more than the high mark allows. */
	ev = append_page(h, p, w, 500);
	pi = info(h, p);
	if (used(&pi) < low || used(&pi) > low + 1)
		fail_msg("after passing the high mark (%u pages) the pool uses %u pages (%llu "
			 "evicted), the low mark is %u",
			 high, used(&pi), (unsigned long long)ev, low);
	assert_int_equal(used(&pi) + ev, high + 1);
	/* Up to the high mark again without another eviction. */
	for (u = used(&pi); u < high; u++)
		assert_int_equal(append_page(h, p, w, 500), ev);
	assert_int_equal(kvp_session_close(w), 0);
	kvp_disconnect(c);
}

static void test_watermarks_default(void **state)
{
	/* 95 % and 90 % of 256 pages. */
	check_watermarks(*state, 243, 230);
}

static int start_marks(void **state)
{
	static const char *const extra[] = {"--disk-pool-size",
					    "0",
					    "--host-pool-size",
					    "1M",
					    "--host-high-watermark",
					    "0.5",
					    "--host-low-watermark",
					    "0.25",
					    NULL};

	return harness_setup_args(state, extra);
}

static void test_watermarks_from_command_line(void **state)
{
	check_watermarks(*state, 128, 64);
}

/* Watermarks outside (0, 1], or low above high, stop the daemon at start
 * with an error instead of serving with nonsense. */
static void test_bad_watermarks(void **state)
{
	static const char *const bad[][5] = {
		{"--host-high-watermark", "0.5", "--host-low-watermark", "0.9", NULL},
		{"--host-high-watermark", "1.5", NULL},
		{"--host-low-watermark", "0", NULL},
		{"--host-high-watermark", "-0.1", NULL},
		{"--host-low-watermark", "half", NULL},
		{"--host-high-watermark", "", NULL},
	};
	struct harness h2;
	char out[4096];
	char *argv[] = {getenv("KVPALACED"), "--host-high-watermark", "1.5", NULL};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (harness_start(&h2, bad[i]) == 0) {
			harness_stop(&h2);
			fail_msg("kvpalaced started with %s %s", bad[i][0], bad[i][1]);
		}
	}
	/* The message names the option. */
	assert_non_null(argv[0]);
	assert_int_equal(harness_run_capture(argv, NULL, out, sizeof(out)), 2);
	if (!strstr(out, "--host-high-watermark"))
		fail_msg("kvpalaced says: %s", out);
}

/* Everything held or pinned: -ENOSPC with a message; a lease ended makes
 * room again. Fork and truncate copies evict like appends. */
static void test_held_and_pinned_are_never_evicted(void **state)
{
	struct harness *h = *state;
	uint32_t a[100 * BT], b[100 * BT], more[60 * BT];
	struct harness_pool_info pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *sa, *sb, *w, *f;
	kvp_lease *l;
	int ret;

	harness_tokens(a, 100 * BT, 600, 0);
	harness_tokens(b, 100 * BT, 601, 0);
	harness_tokens(more, 60 * BT, 602, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	/* 100 pages held by a session, 100 pinned by a lease, 56 free. */
	assert_int_equal(harness_pkv_commit_session(p, a, 100 * BT, &sa), 0);
	assert_int_equal(harness_pkv_commit_session(p, b, 100 * BT, &sb), 0);
	assert_int_equal(kvp_match_prefix(p, b, 100 * BT, &l), 0);
	assert_int_equal(kvp_session_close(sb), 0);
	pi = info(h, p);
	assert_int_equal(pi.free_pages, 56);
	assert_int_equal(pi.evictable_pages, 0);

	/* 60 pages do not fit; nothing is reserved. */
	assert_int_equal(kvp_session_create(p, &w), 0);
	ret = kvp_append(w, more, 60 * BT);
	assert_int_equal(ret, -ENOSPC);
	assert_true(strlen(kvp_strerror(c, ret)) > 0);
	assert_int_equal(kvp_session_tokens(w), 0);
	pi = info(h, p);
	assert_int_equal(pi.evictions, 0);
	assert_int_equal(pi.free_pages, 56);
	/* 56 do; then the pool is full of held and pinned pages. */
	assert_int_equal(kvp_append(w, more, 56 * BT), 0);
	assert_int_equal(kvp_append(w, more, 1), -ENOSPC);
	/* A fork needing a copy has no room either; one that shares only
	 * whole pages needs none. */
	assert_int_equal(kvp_session_fork(sa, 50, &f), -ENOSPC);
	assert_int_equal(kvp_session_fork(sa, 48, &f), 0);
	assert_int_equal(kvp_truncate(f, 40), -ENOSPC);
	assert_int_equal(kvp_session_tokens(f), 48);
	assert_int_equal(harness_pkv_check_lease(l, p, b, 100 * BT), 0);
	assert_int_equal(harness_pkv_check_session(p, sa, a, 0, 100 * BT), 0);

	/* The lease ends: its 100 pages are the index's alone, and the next
	 * requests evict them, from the chain's end. */
	assert_int_equal(kvp_lease_release(l), 0);
	pi = info(h, p);
	assert_int_equal(pi.evictable_pages, 1);
	assert_int_equal(pi.free_pages, 0);
	assert_int_equal(kvp_truncate(f, 40), 0);
	assert_int_equal(harness_pkv_check_session(p, f, a, 0, 40), 0);
	pi = info(h, p);
	assert_true(pi.evictions >= 1);
	assert_int_equal(kvp_session_fork(sa, 50, &f), 0);
	assert_int_equal(harness_pkv_check_session(p, f, a, 0, 50), 0);
	assert_int_equal(kvp_append(w, more, 4 * BT), 0);
	pi = info(h, p);
	/* Only b's pages went, and only from its end. */
	{
		uint64_t mb = matched(p, b, 100 * BT);

		assert_int_equal(mb / BT + pi.evictions, 100);
		assert_int_equal(matched(p, a, 100 * BT), 100 * BT);
	}
	assert_int_equal(harness_pkv_check_session(p, sa, a, 0, 100 * BT), 0);
	kvp_disconnect(c);
}

/* ---- several processes at once ----------------------------------------- */

#define STRESS_PROCS 4
#define STRESS_MAX   600

struct stress {
	struct harness *h;
	int id;
	double seconds;
};

static uint64_t stress_rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Conversations that follow one of three stems and leave it somewhere:
 * commit, read back, fork and go on, truncate, match others' — every byte
 * checked, -ENOSPC the only error allowed (the pool is small). */
static int stress_child(void *arg)
{
	struct stress *st = arg;
	uint32_t tok[STRESS_MAX + 100], q[STRESS_MAX + 100];
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(st->id + 1), ops = 0;
	struct timespec t0, t1;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(kvp_connect(st->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		uint32_t n = 50 + (uint32_t)(stress_rnd(&x) % (STRESS_MAX - 50));
		uint32_t leave = (uint32_t)(stress_rnd(&x) % n),
			 stem = (uint32_t)(stress_rnd(&x) % 3);
		kvp_session *s, *f;
		kvp_lease *l;
		int ret;

		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9 >
		    st->seconds)
			break;
		harness_tokens(tok, n, 700 + stem, 0);
		harness_tokens(tok + leave, n - leave, 800 + (uint32_t)st->id, ops << 20);
		/* What is cached of it already, read through a lease. */
		CHILD_CHECK_EQ(kvp_match_prefix(p, tok, n, &l), 0);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, tok, kvp_lease_tokens(l)), 0);
		ret = harness_pkv_commit_session(p, tok, n, &s);
		CHILD_CHECK(ret == 0 || ret == -ENOSPC);
		if (ret == 0) {
			uint32_t at = (uint32_t)(stress_rnd(&x) % (n + 1));

			CHILD_CHECK_EQ(harness_pkv_check_session(p, s, tok, 0, n), 0);
			ret = kvp_session_fork(s, at, &f);
			CHILD_CHECK(ret == 0 || ret == -ENOSPC);
			if (ret == 0) {
				memcpy(q, tok, at * sizeof(uint32_t));
				harness_tokens(q + at, 100, 900 + (uint32_t)st->id, ops << 20);
				ret = kvp_append(f, q + at, 100);
				CHILD_CHECK(ret == 0 || ret == -ENOSPC);
				if (ret == 0) {
					CHILD_CHECK_EQ(
						harness_pkv_write_session(p, f, q, at, at + 100),
						0);
					CHILD_CHECK_EQ(kvp_commit(f, 100), 0);
					CHILD_CHECK_EQ(
						harness_pkv_check_session(p, f, q, 0, at + 100), 0);
				}
				CHILD_CHECK_EQ(kvp_session_close(f), 0);
			}
			ret = kvp_truncate(s, at);
			CHILD_CHECK(ret == 0 || ret == -ENOSPC);
			CHILD_CHECK_EQ(
				harness_pkv_check_session(p, s, tok, 0, kvp_session_tokens(s)), 0);
			CHILD_CHECK_EQ(kvp_session_close(s), 0);
		}
		/* The lease outlived all that unchanged. */
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, tok, kvp_lease_tokens(l)), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
		ops++;
	}
	kvp_disconnect(c);
	fprintf(stderr, "stress %d: %llu conversations\n", st->id, (unsigned long long)ops);
	return ops > 0 ? 0 : 1;
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

static void test_processes_under_pressure(void **state)
{
	struct harness *h = *state;
	struct stress st[STRESS_PROCS];
	struct harness_pool_info pi;
	pid_t pid[STRESS_PROCS];
	kvp_client *c;
	kvp_pool *p;

	for (int i = 0; i < STRESS_PROCS; i++) {
		st[i] = (struct stress){.h = h, .id = i, .seconds = 1.5};
		pid[i] = harness_fork(stress_child, &st[i]);
		assert_true(pid[i] > 0);
	}
	for (int i = 0; i < STRESS_PROCS; i++)
		assert_int_equal(harness_wait(pid[i], 120), 0);
	/* Everything was closed: the index alone holds pages, whole
	 * prefixes of them. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	pi = info(h, p);
	assert_int_equal(pi.n_sessions, 0);
	assert_int_equal(pi.reserved_pages, 0);
	assert_int_equal(pi.leased_pages, 0);
	assert_int_equal(pi.free_pages + pi.indexed_pages, N_PAGES);
	assert_true(pi.evictions > 0);
	assert_true(pi.dedup_pages > 0);
	kvp_disconnect(c);
}

#define T(f) cmocka_unit_test_setup_teardown(f, start, harness_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_workload_larger_than_pool),
		T(test_watermarks_default),
		cmocka_unit_test_setup_teardown(test_watermarks_from_command_line, start_marks,
						harness_teardown),
		cmocka_unit_test(test_bad_watermarks),
		T(test_held_and_pinned_are_never_evicted),
		cmocka_unit_test_setup_teardown(test_processes_under_pressure, start_small_messages,
						harness_teardown),
	};
	harness_eviction = "lru"; /* the assertions spell out LRU's order */

	return cmocka_run_group_tests_name("evict", tests, NULL, NULL);
}
