/* tests/unit/test_tier.c — the host tier's watermarks (daemon/core/tier.h)
 * with no disk tier and no GPU tier, driven through tier_make_room and
 * the appends that call it.
 *
 * What a user of the daemon sees: a pool fills with cached pages (full
 * pages only the prefix index holds) up to its high watermark and no
 * further; a request that would pass it evicts down to the low watermark,
 * so the next appends find free pages; the victims go leaves first (a
 * chain shrinks from its end, so what stays is whole prefixes) and least
 * recently used first (a match makes a chain recent), permanent pages
 * last; pages a session holds or a lease pins never go, and a request
 * that cannot get its pages evicts nothing (-ENOSPC). Pages are 4 tokens;
 * the pool has 20, high mark 0.8 (16 pages), low mark 0.5 (10).
 * cache_check agrees after every step. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "core_fixture.h"
#include "match.h"
#include "prefix_index.h"
#include "tier.h"

#define N_PAGES 20u
#define HIGH	16u
#define LOW	10u

/* Four chains of four pages, cached in this order (A oldest). */
#define A 0u
#define B 1000u
#define C 2000u
#define D 3000u

static int setup(void **state)
{
	return core_fixture_setup(state, N_PAGES, 0.8, 0.5);
}

static int teardown(void **state)
{
	return core_fixture_teardown(state);
}

/* How many of the four pages of chain base are still in the host tier;
 * asserts they are a prefix (a chain never loses a page before its
 * children). */
static uint32_t cached(const struct core_fixture *f, uint32_t base)
{
	uint32_t n = 0;

	while (n < 4 && core_indexed(f, base, n))
		n++;
	for (uint32_t i = n; i < 4; i++)
		assert_false(core_indexed(f, base, i));
	return n;
}

/* Fills the pool to its high mark with four cached chains. */
static void fill_to_high(struct core_fixture *f)
{
	core_cached_chain(f, A, 16);
	core_cached_chain(f, B, 16);
	core_cached_chain(f, C, 16);
	core_cached_chain(f, D, 16);
	assert_int_equal(f->p->pa.n_free, N_PAGES - HIGH);
	assert_int_equal(f->p->ix.n_idle, HIGH);
	assert_int_equal(f->p->ix.evictions, 0);
}

/* An append as client b of n tokens base.. into a new session; returns
 * the session. */
static struct session *append_new(struct core_fixture *f, uint32_t base, uint32_t n)
{
	struct session *s = core_session(f, &f->b);
	uint32_t *ids = malloc(n * sizeof(*ids));

	assert_non_null(ids);
	core_tokens(ids, n, base);
	core_append(f, &f->b, s, ids, n);
	free(ids);
	return s;
}

static void test_mark_pages(void **state)
{
	(void)state;
	assert_int_equal(tier_mark_pages(0.57, 100), 57); /* 0.57 · 100 is 56.99... */
	assert_int_equal(tier_mark_pages(0.8, N_PAGES), HIGH);
	assert_int_equal(tier_mark_pages(0.5, N_PAGES), LOW);
	assert_int_equal(tier_mark_pages(0.95, 20), 19);
	assert_int_equal(tier_mark_pages(1.0, 20), 20);
	assert_int_equal(tier_mark_pages(1.5, 20), 20);
	assert_int_equal(tier_mark_pages(0.0, 20), 0);
	assert_int_equal(tier_mark_pages(-1.0, 20), 0);
}

/* Up to the high mark nothing goes; the first page past it evicts down
 * to the low mark: the oldest chain whole, leaf to root, then the leaves
 * of the next. */
static void test_past_high_mark_evicts_to_low_mark_oldest_leaves_first(void **state)
{
	struct core_fixture *f = *state;

	fill_to_high(f);
	assert_int_equal(tier_make_room(&f->c, f->p, 0, &f->pk), 0);
	assert_int_equal(f->p->ix.evictions, 0);
	/* One more page: 17 > 16. */
	(void)append_new(f, 9000, 1);
	assert_int_equal(f->p->ix.evictions, HIGH - LOW);
	assert_int_equal(f->p->pa.n_free, LOW - 1);
	assert_int_equal(cached(f, A), 0);
	assert_int_equal(cached(f, B), 2);
	assert_int_equal(cached(f, C), 4);
	assert_int_equal(cached(f, D), 4);
	/* Room below the mark again: the next pages come free. */
	(void)append_new(f, 9100, 8);
	assert_int_equal(f->p->ix.evictions, HIGH - LOW);
	assert_int_equal(f->p->pa.n_free, LOW - 3);
}

/* A chain matched lately is recent: the next eviction takes the other
 * chains first, however old the matched one was. Matching only the head
 * of a chain does not keep the head when its tail is the coldest: a
 * parent whose last child left is as cold as that child and goes next
 * (prefix_index.h), so what stays is whole prefixes of warm chains. */
static void test_matched_chain_is_evicted_last(void **state)
{
	struct core_fixture *f = *state;

	fill_to_high(f);
	assert_int_equal(core_match_tokens(f, A, 16), 16);
	assert_int_equal(core_match_tokens(f, B, 8), 8);
	(void)append_new(f, 9000, 1);
	assert_int_equal(f->p->ix.evictions, HIGH - LOW);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(cached(f, B), 0);
	assert_int_equal(cached(f, C), 2);
	assert_int_equal(cached(f, D), 4);
}

/* A lease pins the oldest chain: eviction goes round it, and after the
 * release it is next. */
static void test_leased_pages_are_never_evicted(void **state)
{
	struct core_fixture *f = *state;
	struct match_result mr;
	struct lease *l = NULL;
	uint32_t ids[16];

	fill_to_high(f);
	core_tokens(ids, 16, A);
	assert_int_equal(match_start(&f->c, f->p, f->p->root, &f->a, &f->a.leases, ids, 16, NULL, 0,
				     0, &l, &mr),
			 1);
	core_check(f);
	assert_int_equal(f->p->ix.n_idle, HIGH - 4);
	(void)append_new(f, 9000, 1);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(cached(f, B), 0);
	assert_int_equal(cached(f, C), 2);
	assert_int_equal(cached(f, D), 4);
	/* Everything but the lease asked for: refused, nothing goes. */
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES - 3, &f->pk), -ENOSPC);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(cached(f, D), 4);
	assert_int_equal(f->p->ix.evictions, HIGH - LOW);
	lease_release(&f->c, l);
	core_check(f);
	/* Released: A is the most recent now; C's head and D go before it,
	 * then A from its leaf. */
	assert_int_equal(tier_make_room(&f->c, f->p, f->p->pa.n_free + 5, &f->pk), 0);
	core_check(f);
	assert_int_equal(cached(f, C), 0);
	assert_int_equal(cached(f, D), 1);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(tier_make_room(&f->c, f->p, f->p->pa.n_free + 2, &f->pk), 0);
	core_check(f);
	assert_int_equal(cached(f, D), 0);
	assert_int_equal(cached(f, A), 3);
}

/* Pages held by sessions are not the index's to give: a request needing
 * more than the free and cached pages together is refused and evicts
 * nothing (issue 13: a failed Append evicted an unrelated chain). */
static void test_request_that_cannot_be_met_evicts_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *held = core_session(f, &f->a), *s;
	uint32_t ids[28];
	uint64_t first;

	core_append_commit(f, &f->a, held, 5000, 56); /* 14 pages, held by the session */
	core_cached_chain(f, A, 16);		      /* 4 cached */
	assert_int_equal(f->p->pa.n_free, 2);
	assert_int_equal(f->p->ix.n_idle, 4);
	/* 7 pages wanted, 2 free + 4 evictable. */
	assert_int_equal(tier_make_room(&f->c, f->p, 7, &f->pk), -ENOSPC);
	s = core_session(f, &f->b);
	core_tokens(ids, 28, 9000);
	assert_int_equal(
		session_append(&f->c, s, &f->b, &f->b.writing, ids, 28, NULL, &f->pk, &first),
		-ENOSPC);
	core_check(f);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->n_pages, 0);
	assert_null(s->writer);
	assert_int_equal(f->b.writing.reserved_pages, 0);
	assert_int_equal(f->p->ix.evictions, 0);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(cached(f, 5000), 4);
	/* 6 fit: the cached chain goes, leaf to root, the held pages stay,
	 * even though that leaves the pool above its low mark. */
	assert_int_equal(
		session_append(&f->c, s, &f->b, &f->b.writing, ids, 24, NULL, &f->pk, &first), 0);
	core_check(f);
	assert_int_equal(cached(f, A), 0);
	assert_int_equal(f->p->pa.n_free, 0);
	assert_int_equal(held->n_pages, 14);
	assert_int_equal(core_match_tokens(f, 5000, 56), 56);
	/* Nothing more at all: more pages than the pool has, and a full
	 * pool. */
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES + 1, &f->pk), -ENOSPC);
	assert_int_equal(tier_make_room(&f->c, f->p, 1, &f->pk), -ENOSPC);
	core_check(f);
}

/* Pages of a span tagged permanent (a system prompt) leave the host tier
 * after every other cached page, however old. */
static void test_permanent_pages_leave_last(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct session_tag tag = {.flags = TOKEN_PERMANENT};
	uint32_t ids[16], filled;
	uint64_t first;

	core_tokens(ids, 16, A);
	assert_int_equal(
		session_append(&f->c, s, &f->a, &f->a.writing, ids, 16, &tag, &f->pk, &first), 0);
	assert_int_equal(session_commit(&f->c, s, &f->a, 16, &filled), 0);
	session_close(&f->c, s);
	core_check(f);
	assert_int_equal(f->p->ix.n_permanent, 4);
	core_cached_chain(f, B, 16);
	core_cached_chain(f, C, 16);
	core_cached_chain(f, D, 16);
	(void)append_new(f, 9000, 1);
	assert_int_equal(cached(f, A), 4);
	assert_int_equal(cached(f, B), 0);
	assert_int_equal(cached(f, C), 2);
	/* Only when nothing else is left. */
	assert_int_equal(tier_make_room(&f->c, f->p, f->p->pa.n_free + 7, &f->pk), 0);
	core_check(f);
	assert_int_equal(cached(f, C), 0);
	assert_int_equal(cached(f, D), 0);
	assert_int_equal(cached(f, A), 3);
}

/* A fork or a truncate that needs a page for its copy of a shared last
 * page, in a pool whose every page is held: -ENOSPC, and nothing changed
 * (no half-made fork left, the session as it was). */
static void test_copy_without_room_changes_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *fk = NULL;
	uint64_t charged, n_sessions;
	int copied = -1;

	core_append_commit(f, &f->a, s, 0, 78); /* 20 pages, the last half full */
	assert_int_equal(f->p->pa.n_free, 0);
	charged = cache_tenant(&f->c, CORE_UID)->meta_tokens;
	n_sessions = f->c.sessions.n;
	assert_int_equal(session_fork(&f->c, s, 78, &f->pk, &fk), -ENOSPC);
	core_check(f);
	assert_null(fk);
	assert_int_equal(f->c.sessions.n, n_sessions);
	assert_int_equal(f->p->n_sessions, n_sessions);
	assert_int_equal(cache_tenant(&f->c, CORE_UID)->meta_tokens, charged);
	/* At a page boundary a fork needs no page. */
	assert_int_equal(session_fork(&f->c, s, 76, &f->pk, &fk), 0);
	core_check(f);
	session_close(&f->c, fk);
	core_check(f);
	/* Page 1 is shared with the index: cutting inside it needs a copy. */
	assert_int_equal(session_truncate(&f->c, s, NULL, 6, &f->pk, &copied), -ENOSPC);
	core_check(f);
	assert_int_equal(s->n_tokens, 78);
	assert_int_equal(s->n_pages, 20);
	assert_int_equal(core_match_tokens(f, 0, 78), 76);
}

/* An append refused with -EDQUOT for max-tenant-tokens, in a pool at its
 * high mark: nothing is evicted (tier.h: a request that could not get its
 * pages evicts nothing, issue 13). session_append used to make room
 * before it charged the tenant's token slots (prepare_tokens,
 * reserve_pages), so the refused append had already evicted the cached
 * pages down to the low mark — 6 pages here; it checks the charge first
 * now. */
static void test_append_refused_for_tenant_tokens_evicts_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *s;
	uint32_t id = 9000;
	uint64_t first;
	int ret;

	fill_to_high(f);
	s = core_session(f, &f->b);
	f->cfg.max_tenant_tokens = cache_tenant(&f->c, CORE_UID)->meta_tokens;
	ret = session_append(&f->c, s, &f->b, &f->b.writing, &id, 1, NULL, &f->pk, &first);
	core_check(f);
	assert_int_equal(ret, -EDQUOT);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(f->b.writing.reserved_pages, 0);
	assert_int_equal(f->p->ix.evictions, 0);
	assert_int_equal(cached(f, A), 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mark_pages),
		cmocka_unit_test_setup_teardown(
			test_past_high_mark_evicts_to_low_mark_oldest_leaves_first, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_matched_chain_is_evicted_last, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_leased_pages_are_never_evicted, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_request_that_cannot_be_met_evicts_nothing,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_permanent_pages_leave_last, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_without_room_changes_nothing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_append_refused_for_tenant_tokens_evicts_nothing, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
