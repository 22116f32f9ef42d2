/* tests/integration/test_tierorder.c — the order in which pages leave the
 * host tier, with and without a disk tier, and what a request sees while
 * they do (issue 13, found by peer suites: vLLM, SGLang, LMCache, Mooncake
 * and llama.cpp scenarios). Pools of 4 KiB pages:
 *  - LMCache: a spill at the high mark writes and frees only what reaches
 *    the low mark, from the chain's end; the chain's parents stay in the
 *    host tier and match without a disk read; a crash right after leaves
 *    nothing that cannot be matched whole, a clean stop keeps everything;
 *  - vLLM: an Append that fails with -ENOSPC evicts nobody's cache, with a
 *    disk tier and without;
 *  - the watermark is a page count: 0.57 of 100 pages is 57, reached
 *    without an eviction (binary floating point made it 56);
 *  - SGLang: a match parked on disk reads waits for all of them, however
 *    often other I/O wakes it, and gets the whole chain back under every
 *    --eviction order (none evicts the pages the match just read);
 *  - Mooncake: a page whose spill write is in flight is still matched from
 *    the host tier, and the write finishing keeps the leased page there.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "tierorder-model"
#define BT    16u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* A 40-page pool over a spill file: default marks, 38 and 36 pages. */
static const char *const disk40[] = {"--host-pool-size", "160K", "--disk-pool-size", "16M", NULL};
static const char *const host40[] = {"--host-pool-size", "160K", "--disk-pool-size", "0", NULL};

static struct kvp_pool_stats stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps;
}

/* Tokens matched now for tokens[0..n), every byte checked. */
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

/* Waits (up to 10 s) until n pages were written to disk: writes that no
 * request waits for finish after the reply. */
static struct kvp_pool_stats wait_spilled(kvp_client *c, kvp_pool *p, uint64_t n)
{
	struct kvp_pool_stats ps = stats(c, p);

	for (int i = 0; i < 10000 && ps.spilled_pages < n; i++) {
		usleep(1000);
		ps = stats(c, p);
	}
	return ps;
}

/* A closed conversation of pages pages of sequence seq: only the index
 * holds it. */
static void cache_conv(kvp_pool *p, uint32_t *tokens, uint32_t pages, uint32_t seq)
{
	kvp_session *s;

	harness_tokens(tokens, (size_t)pages * BT, seq, 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, (size_t)pages * BT, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

/* An open session holding pages committed pages of sequence seq. */
static kvp_session *hold_pages(kvp_pool *p, uint32_t pages, uint32_t seq)
{
	uint32_t *t = calloc((size_t)pages * BT, sizeof(uint32_t));
	kvp_session *s;

	assert_non_null(t);
	harness_tokens(t, (size_t)pages * BT, seq, 0);
	assert_int_equal(harness_pkv_commit_session(p, t, (size_t)pages * BT, &s), 0);
	free(t);
	return s;
}

/* LMCache: one append at 38 of 40 pages (the high mark) spilled a whole
 * 10-page chain, parents included while nothing else needed them, where 2
 * pages reached the low mark; matching the chain then read its parents
 * back from disk. Spilling takes eviction's victims: the chain's last two
 * pages, down to the low mark (36 pages, then the new page). */
static void test_spill_reaches_low_mark_and_keeps_parents(void **state)
{
	struct harness *h = *state;
	uint32_t a[10 * BT], more[BT];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *w;
	uint64_t promoted;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 40);
	cache_conv(p, a, 10, 1);
	w = hold_pages(p, 28, 2);
	ps = stats(c, p);
	assert_true(ps.has_disk);
	assert_int_equal(ps.free_pages, 2);
	assert_int_equal(ps.spilled_pages, 0);

	harness_tokens(more, BT, 3, 0);
	assert_int_equal(kvp_append(w, more, BT), 0);
	ps = wait_spilled(c, p, 2);
	if (ps.spilled_pages != 2 || ps.free_pages != 3)
		fail_msg("the append past the high mark spilled %llu pages and left %u free; the "
			 "low mark needs 2 spilled, 3 free",
			 (unsigned long long)ps.spilled_pages, ps.free_pages);
	assert_int_equal(ps.host_indexed_pages, 8 + 28);
	promoted = ps.promoted_pages;
	/* The chain's first 8 pages match from the host tier: no read. */
	assert_int_equal(matched(p, a, 8 * BT), 8 * BT);
	assert_int_equal(stats(c, p).promoted_pages, promoted);
	assert_int_equal(kvp_session_close(w), 0);
	/* The whole chain matches: its two last pages come back. */
	assert_int_equal(matched(p, a, 10 * BT), 10 * BT);
	ps = stats(c, p);
	assert_int_equal(ps.promoted_pages, promoted + 2);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
}

/* The spill above, then a crash (SIGKILL): the two pages on disk have
 * their parents only in memory, which a crash loses, so the restarted
 * daemon discards them (a child is useless without its parent) and lists
 * nothing it could not match whole; what it serves is right. A clean stop
 * instead writes the parents too, and everything comes back. */
static void crash_after_partial_spill(struct harness *h, int sig)
{
	uint32_t a[10 * BT], more[BT];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *w;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	cache_conv(p, a, 10, 1);
	w = hold_pages(p, 28, 2);
	harness_tokens(more, BT, 3, 0);
	assert_int_equal(kvp_append(w, more, BT), 0);
	assert_int_equal(wait_spilled(c, p, 2).spilled_pages, 2);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, sig, disk40), 0);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = stats(c, p);
	if (sig == SIGKILL) {
		/* Whatever is listed matches whole, with the right bytes. */
		assert_int_equal(ps.restored_pages, ps.indexed_pages);
		assert_int_equal(matched(p, a, 10 * BT), (uint64_t)ps.indexed_pages * BT);
	} else {
		/* The chain (and the session's pages if its close came first). */
		assert_true(ps.restored_pages >= 10);
		assert_int_equal(matched(p, a, 10 * BT), 10 * BT);
	}
	ps = stats(c, p);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
}

static void test_crash_after_partial_spill(void **state)
{
	crash_after_partial_spill(*state, SIGKILL);
}

static void test_stop_after_partial_spill(void **state)
{
	crash_after_partial_spill(*state, SIGTERM);
}

/* vLLM: an Append that ended in -ENOSPC left holders, reservations and
 * leases alone but first evicted two cached pages of an unrelated chain
 * (8 free where 6 was right; that chain then matched nothing). A request
 * that cannot succeed evicts nothing. */
static void failed_append_evicts_nothing(struct harness *h)
{
	uint32_t x[2 * BT], big[9 * BT];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *held, *w;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	cache_conv(p, x, 2, 10);
	held = hold_pages(p, 32, 11);
	ps = stats(c, p);
	assert_int_equal(ps.free_pages, 6);
	/* 9 pages: 6 free and 2 cached are not enough. */
	harness_tokens(big, 9 * BT, 12, 0);
	assert_int_equal(kvp_session_create(p, &w), 0);
	assert_int_equal(kvp_append(w, big, 9 * BT), -ENOSPC);
	assert_int_equal(kvp_session_tokens(w), 0);
	ps = stats(c, p);
	assert_int_equal(ps.free_pages, 6);
	assert_int_equal(ps.evictions, 0);
	assert_int_equal(ps.spilled_pages, 0);
	assert_int_equal(matched(p, x, 2 * BT), 2 * BT);
	/* 8 pages fit (6 free, the cached chain evicted for them). */
	assert_int_equal(kvp_append(w, big, 8 * BT), 0);
	assert_int_equal(kvp_session_close(w), 0);
	assert_int_equal(kvp_session_close(held), 0);
	kvp_disconnect(c);
}

static void test_failed_append_evicts_nothing(void **state)
{
	failed_append_evicts_nothing(*state);
}

static void test_failed_append_evicts_nothing_disk(void **state)
{
	failed_append_evicts_nothing(*state);
}

/* Peer suites set fractional marks and fill to them: 0.57 of a 100-page
 * pool is 57 pages, which fill without an eviction (the daemon computed
 * 0.57 · 100 = 56.99... and evicted at 57); the request that would take
 * the pool past them evicts, down to the low mark (0.50: 50 pages). */
static void test_watermark_is_exact(void **state)
{
	struct harness *h = *state;
	uint32_t t[BT];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 100);
	for (uint32_t i = 0; i < 57; i++)
		cache_conv(p, t, 1, 100 + i);
	ps = stats(c, p);
	assert_int_equal(ps.free_pages, 43);
	assert_int_equal(ps.evictions, 0);
	cache_conv(p, t, 1, 200);
	ps = stats(c, p);
	assert_int_equal(ps.evictions, 7);
	assert_int_equal(ps.free_pages, 100 - 51);
	kvp_disconnect(c);
}

/* SGLang: a match parked on disk reads answered a miss after 64 wake-ups
 * while its pages were still coming (a rematch right after found them).
 * Here a full pool (marks at 1.0) of pages never written makes every
 * page of a 100-page chain on disk wait for a write and then a read, two
 * wake-ups each: the match waits for all of them. */
static void test_parked_match_waits_for_all_reads(void **state)
{
	struct harness *h = *state;
	uint32_t *chain = calloc(100 * BT, sizeof(uint32_t)), one[BT];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(chain);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 256);
	cache_conv(p, chain, 100, 300);
	/* 300 one-page conversations push the chain to disk and fill the
	 * pool with pages that have no disk copy. */
	for (uint32_t i = 0; i < 300; i++)
		cache_conv(p, one, 1, 1000 + i);
	ps = stats(c, p);
	assert_int_equal(ps.host_indexed_pages, 256);
	assert_true(ps.disk_pages >= 100);
	assert_int_equal(matched(p, chain, 100 * BT), 100 * BT);
	ps = stats(c, p);
	assert_true(ps.promoted_pages >= 100);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
	free(chain);
}

/* Mooncake: right after pressure a session's own prefix matched short, at
 * the first page whose spill write was in flight (a retry 200 ms later
 * found everything). The page is still in its host slot: it is matched,
 * and the write finishing leaves the leased slot alone. The Append and
 * the MatchPrefix travel in one datagram, so the match runs while the
 * append's writes are in flight. */
static void test_page_being_written_is_matched(void **state)
{
	struct harness *h = *state;
	uint32_t a[10 * BT], fill[28 * BT], more[BT];
	Kvpalace__V1__Request r1, r2, *batch[2] = {&r1, &r2};
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Response *resp;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__ReleaseRequest rl;
	Kvpalace__V1__Request req;
	struct kvp_pool_stats ps;
	uint64_t pool_id, sid, lease = 0;
	struct raw *raw = calloc(1, sizeof(*raw));
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(raw);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	cache_conv(p, a, 10, 20);
	/* A raw client holds 28 pages: 38 used, the high mark. */
	assert_int_equal(raw_open(raw, h->sock), 0);
	raw->batched_ok = 1;
	assert_int_equal(raw_open_pool(raw, MODEL, &page4k, &pool_id), 0);
	assert_int_equal(pool_id, kvp_pool_id(p));
	assert_int_equal(raw_create_session(raw, pool_id, &sid), 0);
	harness_tokens(fill, 28 * BT, 21, 0);
	raw_req_append(&req, &ap, sid, fill, 28 * BT);
	assert_int_equal(raw_call(raw, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	raw_req_commit(&req, &cm, sid, 28 * BT);
	assert_int_equal(raw_call(raw, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	ps = stats(c, p);
	assert_int_equal(ps.free_pages, 2);

	/* One page more takes the pool past the mark: the chain's last two
	 * pages start for disk and the append is answered at once (there
	 * is room); the match behind it in the datagram finds them. */
	harness_tokens(more, BT, 22, 0);
	raw_req_append(&r1, &ap, sid, more, BT);
	raw_req_match(&r2, &mp, pool_id, a, 10 * BT);
	assert_int_equal(raw_send_batch(raw, batch, 2), 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(raw_recv(raw, &resp, NULL), 1);
		assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
		if (resp->id == r2.id) {
			assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX);
			if (resp->match_prefix->matched_tokens != 10 * BT)
				fail_msg("matched %llu of %u tokens while their pages were being "
					 "written",
					 (unsigned long long)resp->match_prefix->matched_tokens,
					 10 * BT);
			lease = resp->match_prefix->lease_id;
		}
	}
	assert_true(lease != 0);
	/* The writes finish (the pages now have disk copies); the leased
	 * pages stay where the lease says. */
	ps = wait_spilled(c, p, 2);
	assert_int_equal(ps.spilled_pages, 2);
	assert_int_equal(ps.leased_pages, 10);
	assert_int_equal(ps.host_indexed_pages, 10 + 28);
	raw_req_release(&req, &rl, lease);
	assert_int_equal(raw_call(raw, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	/* And read right. */
	assert_int_equal(matched(p, a, 10 * BT), 10 * BT);
	assert_int_equal(stats(c, p).verify_failures, 0);
	raw_close(raw);
	free(raw);
	kvp_disconnect(c);
}

static int setup_disk40(void **state)
{
	return harness_setup_args(state, disk40);
}

static int setup_host40(void **state)
{
	return harness_setup_args(state, host40);
}

static int setup_marks(void **state)
{
	static const char *const extra[] = {"--host-pool-size",
					    "400K",
					    "--disk-pool-size",
					    "0",
					    "--host-high-watermark",
					    "0.57",
					    "--host-low-watermark",
					    "0.50",
					    NULL};

	return harness_setup_args(state, extra);
}

/* A 256-page pool at full marks, a 16 MiB disk tier, and eviction's
 * victim order (NULL: the daemon's default). */
static int setup_full_marks_evicting(void **state, const char *eviction)
{
	const char *extra[] = {"--host-pool-size",
			       "1M",
			       "--disk-pool-size",
			       "16M",
			       "--host-high-watermark",
			       "1.0",
			       "--host-low-watermark",
			       "1.0",
			       eviction ? "--eviction" : NULL,
			       eviction,
			       NULL};

	return harness_setup_args(state, extra);
}

static int setup_full_marks(void **state)
{
	return setup_full_marks_evicting(state, NULL);
}

/* Every victim order: under window the promoted chain joins main, which
 * went first while probation was under its share, and the match evicted
 * the pages it had just read until its park limit (the walk now keeps
 * what it used: prefix_index_keep_walk). */
static int setup_full_marks_lru(void **state)
{
	return setup_full_marks_evicting(state, "lru");
}

static int setup_full_marks_lfu(void **state)
{
	return setup_full_marks_evicting(state, "lfu");
}

static int setup_full_marks_window(void **state)
{
	return setup_full_marks_evicting(state, "window");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_spill_reaches_low_mark_and_keeps_parents,
						setup_disk40, harness_teardown),
		cmocka_unit_test_setup_teardown(test_crash_after_partial_spill, setup_disk40,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_stop_after_partial_spill, setup_disk40,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_failed_append_evicts_nothing, setup_host40,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_failed_append_evicts_nothing_disk,
						setup_disk40, harness_teardown),
		cmocka_unit_test_setup_teardown(test_watermark_is_exact, setup_marks,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_parked_match_waits_for_all_reads,
						setup_full_marks, harness_teardown),
		cmocka_unit_test_setup_teardown(test_parked_match_waits_for_all_reads,
						setup_full_marks_lru, harness_teardown),
		cmocka_unit_test_setup_teardown(test_parked_match_waits_for_all_reads,
						setup_full_marks_lfu, harness_teardown),
		cmocka_unit_test_setup_teardown(test_parked_match_waits_for_all_reads,
						setup_full_marks_window, harness_teardown),
		cmocka_unit_test_setup_teardown(test_page_being_written_is_matched, setup_disk40,
						harness_teardown),
	};
	return cmocka_run_group_tests_name("tierorder", tests, NULL, NULL);
}
