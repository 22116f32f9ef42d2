/* tests/unit/test_match.c — MatchPrefix's walk of the prefix index
 * (daemon/match.h), called directly as the service layer calls it.
 *
 * What a client relies on: a match reports whole committed pages only,
 * from the first page on, with the very slots the writer's session holds
 * (it reads their K/V there); it stops at the first page whose chain
 * differs, so a page with equal tokens after a different prefix is never
 * served; a prompt sent in chunks cut anywhere matches what it would in
 * one piece, chunk by chunk; a miss at once leaves no lease behind; a
 * cache salt separates chains; uncommitted tokens are never matched.
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

#define N_PAGES 32u

static int setup(void **state)
{
	return core_fixture_setup(state, N_PAGES, 1.0, 1.0);
}

static int teardown(void **state)
{
	return core_fixture_teardown(state);
}

/* match_start on ids[0..n) from root as client a; returns what it
 * returned, the lease in *l. */
static int start(struct core_fixture *f, XXH128_hash_t root, const uint32_t *ids, size_t n,
		 struct lease **l, struct match_result *mr)
{
	int ret;

	*l = NULL;
	ret = match_start(&f->c, f->p, root, &f->a, &f->a.leases, ids, n, NULL, 0, 0, l, mr);
	core_check(f);
	return ret;
}

/* The committed full pages, with the writer's slots, and no more. */
static void test_match_finds_full_pages_with_the_writers_slots(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct match_result mr;
	struct lease *l;
	uint32_t ids[16];

	core_append_commit(f, &f->a, s, 0, 14);
	core_tokens(ids, 16, 0);
	assert_int_equal(start(f, f->p->root, ids, 14, &l, &mr), 1);
	assert_non_null(l);
	assert_int_equal(mr.first_page, 0);
	assert_int_equal(mr.n_slots, 3);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(mr.slots[i], s->pages[i]);
	assert_int_equal(l->n_tokens, 12);
	/* Two tokens left over: the next chunk may complete the page. */
	assert_int_equal(l->n_carry, 2);
	assert_false(l->complete);
	/* They do, but page 3 was never committed whole: the walk ends. */
	assert_int_equal(match_extend(&f->c, l, ids + 14, 2, &mr), 0);
	core_check(f);
	assert_true(l->complete);
	assert_int_equal(mr.n_slots, 0);
	assert_int_equal(l->n_tokens, 12);
	assert_int_equal(f->c.leases.n, 1);
	lease_release(&f->c, l);
	core_check(f);
	/* A prompt ending inside a page matches the pages before it. */
	assert_int_equal(core_match_tokens(f, 0, 11), 8);
	assert_int_equal(core_match_tokens(f, 0, 3), 0);
}

/* Nothing found at all: no lease, nothing pinned. */
static void test_miss_leaves_no_lease(void **state)
{
	struct core_fixture *f = *state;
	struct match_result mr;
	struct lease *l;
	uint32_t ids[8];

	core_cached_chain(f, 0, 8);
	core_tokens(ids, 8, 5000);
	assert_int_equal(start(f, f->p->root, ids, 8, &l, &mr), 0);
	assert_null(l);
	assert_int_equal(f->c.leases.n, 0);
	assert_true(list_empty(&f->a.leases));
	/* The first page's tokens alone, one off. */
	core_tokens(ids, 8, 0);
	ids[3] = 77;
	assert_int_equal(start(f, f->p->root, ids, 8, &l, &mr), 0);
	assert_int_equal(f->c.leases.n, 0);
	for (uint32_t i = 0; i < N_PAGES; i++)
		assert_int_equal(f->p->pa.pins[i], 0);
}

/* The walk follows the chain: after the first page that differs,
 * nothing more is matched, even a page whose own tokens are equal. */
static void test_walk_stops_at_the_first_differing_page(void **state)
{
	struct core_fixture *f = *state;
	struct match_result mr;
	struct lease *l;
	uint32_t ids[12];

	core_cached_chain(f, 0, 12);
	core_tokens(ids, 12, 0);
	ids[5] = 9999; /* page 1 differs; page 2 is as committed */
	assert_int_equal(start(f, f->p->root, ids, 12, &l, &mr), 1);
	assert_int_equal(l->n_pages, 1);
	assert_int_equal(l->n_tokens, 4);
	assert_true(l->complete);
	assert_int_equal(mr.n_slots, 1);
	/* A complete lease takes nothing more. */
	assert_int_equal(match_extend(&f->c, l, ids, 4, &mr), 0);
	assert_int_equal(mr.n_slots, 0);
	assert_int_equal(l->n_pages, 1);
	lease_release(&f->c, l);
	core_check(f);
}

/* A long prompt sent in chunks cut inside pages matches what it matches
 * in one piece: the same slots in the same order, each chunk reporting
 * the pages it added from where the last one stopped. */
static void test_chunks_match_as_one_piece(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	static const size_t cuts[] = {3, 5, 7, 1, 4};
	struct match_result mr;
	struct lease *l;
	uint32_t ids[24];
	size_t at = 0;
	uint64_t seen = 0;

	core_append_commit(f, &f->a, s, 0, 20);
	core_tokens(ids, 24, 0);
	assert_int_equal(start(f, f->p->root, ids, 3, &l, &mr), 1);
	/* Less than a page: a lease with nothing yet, the tokens carried. */
	assert_non_null(l);
	assert_int_equal(l->n_pages, 0);
	assert_int_equal(mr.n_slots, 0);
	assert_null(mr.slots);
	assert_false(l->complete);
	at = cuts[0];
	for (size_t k = 1; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
		assert_int_equal(match_extend(&f->c, l, ids + at, cuts[k], &mr), 0);
		core_check(f);
		at += cuts[k];
		assert_int_equal(mr.first_page, seen);
		for (uint32_t i = 0; i < mr.n_slots; i++)
			assert_int_equal(mr.slots[i], s->pages[seen + i]);
		seen += mr.n_slots;
		assert_int_equal(l->n_tokens, at / CORE_BT * CORE_BT);
	}
	assert_int_equal(at, 20);
	assert_int_equal(seen, 5);
	assert_false(l->complete);
	/* Past what was committed: complete, nothing added. */
	assert_int_equal(match_extend(&f->c, l, ids + 20, 4, &mr), 0);
	assert_true(l->complete);
	assert_int_equal(mr.n_slots, 0);
	assert_int_equal(memcmp(l->pages, s->pages, 5 * sizeof(uint32_t)), 0);
	lease_release(&f->c, l);
	core_check(f);
}

/* A cache salt is another chain: its pages match only with the salt,
 * and the same tokens without it share nothing. */
static void test_salt_separates_chains(void **state)
{
	struct core_fixture *f = *state;
	XXH128_hash_t salted = prefix_index_root(f->p->model_id, &f->p->layout, "tenant-x", 8);
	struct session *s = NULL, *plain;
	struct match_result mr;
	struct lease *l;
	uint32_t ids[8];

	assert_int_equal(session_create(&f->c, f->p, salted, &s), 0);
	core_append_commit(f, &f->a, s, 0, 8);
	core_tokens(ids, 8, 0);
	assert_int_equal(start(f, f->p->root, ids, 8, &l, &mr), 0);
	assert_int_equal(start(f, salted, ids, 8, &l, &mr), 1);
	assert_int_equal(l->n_tokens, 8);
	assert_int_equal(mr.slots[0], s->pages[0]);
	lease_release(&f->c, l);
	core_check(f);
	plain = core_session(f, &f->b);
	core_append_commit(f, &f->b, plain, 0, 8);
	assert_int_not_equal(plain->pages[0], s->pages[0]);
	assert_int_equal(f->p->ix.dedup_pages, 0);
	assert_int_equal(f->p->ix.n_entries, 4);
}

/* Reserved but uncommitted tokens, and the committed part of a page, are
 * not served. */
static void test_uncommitted_is_not_matched(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t ids[12];

	core_tokens(ids, 12, 0);
	assert_int_equal(core_append(f, &f->a, s, ids, 12), 0);
	assert_int_equal(core_match_tokens(f, 0, 12), 0);
	core_commit(f, &f->a, s, 6);
	assert_int_equal(core_match_tokens(f, 0, 12), 4);
	core_commit(f, &f->a, s, 6);
	assert_int_equal(core_match_tokens(f, 0, 12), 12);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_match_finds_full_pages_with_the_writers_slots,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_miss_leaves_no_lease, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_stops_at_the_first_differing_page, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_chunks_match_as_one_piece, setup, teardown),
		cmocka_unit_test_setup_teardown(test_salt_separates_chains, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uncommitted_is_not_matched, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
