/* tests/unit/test_lease.c — read leases (daemon/lease.h) and their
 * lifetimes, called directly as the service layer calls them.
 *
 * What a reader relies on between MatchPrefix and Release: the pages of
 * its lease stay allocated with the bytes it matched whatever the session
 * that wrote them does (truncated, closed), and no eviction takes them;
 * releasing makes them evictable again and leaves no pin behind; a lease
 * is its owner's alone (another owner presenting its id gets not found);
 * dropping the pages of a failed chunk unpins the newest first; a session
 * forked from a lease shares its full pages and writes its own; whatever
 * is still held when the daemon stops is freed by cache_fini (ASan in
 * build-asan). cache_check agrees after every step. Single-threaded.
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

#define N_PAGES 16u

static int setup(void **state)
{
	return core_fixture_setup(state, N_PAGES, 1.0, 1.0);
}

static int teardown(void **state)
{
	return core_fixture_teardown(state);
}

/* A lease of client a on the first n tokens base.. of the pool's chain. */
static struct lease *lease_on(struct core_fixture *f, uint32_t base, uint32_t n)
{
	uint32_t *ids = malloc(n * sizeof(*ids));
	struct match_result mr;
	struct lease *l = NULL;

	assert_non_null(ids);
	core_tokens(ids, n, base);
	assert_int_equal(match_start(&f->c, f->p, f->p->root, &f->a, &f->a.leases, ids, n, NULL, 0,
				     0, &l, &mr),
			 1);
	core_check(f);
	free(ids);
	return l;
}

/* A session's truncate and close take nothing from a reader's lease: the
 * pages and their bytes stay; no eviction takes them while leased, and
 * all of them once released. */
static void test_lease_pins_pages_until_released(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct lease *l;
	uint32_t pp[3];
	int copied;

	core_append_commit(f, &f->a, s, 0, 12);
	for (uint32_t i = 0; i < 3; i++) {
		pp[i] = s->pages[i];
		core_fill_slot(f, pp[i], (uint8_t)(0x40 + i));
	}
	l = lease_on(f, 0, 12);
	assert_int_equal(l->n_pages, 3);
	assert_int_equal(l->n_tokens, 12);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(l->pages[i], pp[i]);
		assert_int_equal(f->p->pa.pins[pp[i]], 1);
		assert_int_equal(f->p->pa.refs[pp[i]], 3); /* session, index, lease */
	}
	assert_int_equal(session_truncate(&f->c, s, NULL, 0, &f->pk, &copied), 0);
	core_check(f);
	session_close(&f->c, s);
	core_check(f);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(f->p->pa.refs[pp[i]], 2);
		assert_true(core_slot_all(f, l->pages[i], (uint8_t)(0x40 + i)));
	}
	/* Every page of the pool asked for: only leased pages are left to
	 * take, so nothing goes. */
	assert_int_equal(f->p->ix.n_idle, 0);
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES, &f->pk), -ENOSPC);
	core_check(f);
	assert_int_equal(f->p->ix.n_entries, 3);
	assert_int_equal(f->p->ix.evictions, 0);
	assert_int_equal(f->p->pa.n_free, N_PAGES - 3);

	lease_release(&f->c, l);
	core_check(f);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(f->p->pa.pins[pp[i]], 0);
		assert_int_equal(f->p->pa.refs[pp[i]], 1);
	}
	assert_true(list_empty(&f->a.leases));
	assert_int_equal(f->c.leases.n, 0);
	assert_int_equal(f->p->ix.n_idle, 3);
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES, &f->pk), 0);
	core_check(f);
	assert_int_equal(f->p->pa.n_free, N_PAGES);
	assert_int_equal(f->p->ix.n_entries, 0);
	assert_int_equal(core_match_tokens(f, 0, 12), 0);
}

/* A lease's tables outgrow the room inside it (14 pages of 4 tokens) and
 * move to the heap with what they hold: after a match of every page of
 * the pool, in chunks cut inside pages, each page's slot, chain hash and
 * tokens are still the session's (ForkLease rebuilds a session from
 * them). */
static void test_tables_grow_with_what_they_hold(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t ids[N_PAGES * 4], bt = f->p->layout.block_tokens;
	static const uint32_t cuts[] = {7, 13, 30, N_PAGES * 4};
	struct match_result mr;
	XXH128_hash_t h = f->p->root;
	struct lease *l = NULL;
	uint32_t at = 0;

	assert_int_equal(bt, 4);
	core_append_commit(f, &f->a, s, 0, N_PAGES * 4);
	core_tokens(ids, N_PAGES * 4, 0);
	for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
		if (!at)
			assert_int_equal(match_start(&f->c, f->p, f->p->root, &f->a, &f->a.leases,
						     ids, cuts[c], NULL, 0, 0, &l, &mr),
					 1);
		else
			assert_int_equal(match_extend(&f->c, l, ids + at, cuts[c] - at, &mr), 0);
		at = cuts[c];
		assert_int_equal(l->n_tokens, at / bt * bt);
		core_check(f);
	}
	assert_int_equal(l->n_pages, N_PAGES);
	assert_true(l->cap_pages > 14);
	assert_non_null(l->tables);
	for (uint32_t i = 0; i < N_PAGES; i++) {
		h = prefix_index_hash_page(h, ids + i * bt, bt);
		assert_int_equal(l->pages[i], s->pages[i]);
		assert_true(XXH128_isEqual(l->hashes[i], h));
		assert_memory_equal(l->tokens + i * bt, ids + i * bt, bt * sizeof(uint32_t));
	}
	lease_release(&f->c, l);
	core_check(f);
	session_close(&f->c, s);
	core_check(f);
}

/* Only the owner finds its lease; a released id is gone for good. */
static void test_lease_belongs_to_its_owner(void **state)
{
	struct core_fixture *f = *state;
	struct lease *l, *l2;
	uint64_t id;

	core_cached_chain(f, 0, 8);
	l = lease_on(f, 0, 8);
	l2 = lease_on(f, 0, 4);
	id = l->id;
	assert_int_not_equal(id, 0);
	assert_int_not_equal(l2->id, id);
	assert_ptr_equal(lease_get(&f->c, id, &f->a), l);
	assert_null(lease_get(&f->c, id, &f->b));
	assert_null(lease_get(&f->c, 0, &f->a));
	/* Two leases on one page: two pins. */
	assert_int_equal(f->p->pa.pins[l->pages[0]], 2);
	lease_release(&f->c, l);
	core_check(f);
	assert_null(lease_get(&f->c, id, &f->a));
	assert_int_equal(f->p->pa.pins[l2->pages[0]], 1);
	lease_release(&f->c, NULL); /* accepted */
	lease_release(&f->c, l2);
	core_check(f);
	assert_int_equal(f->p->ix.n_idle, 2);
}

/* A chunk whose match failed half-way gives its pages back newest
 * first: the pages kept are the prefix matched before, still pinned. */
static void test_drop_pages_keeps_the_prefix(void **state)
{
	struct core_fixture *f = *state;
	struct lease *l;
	uint32_t pp[3];

	core_cached_chain(f, 0, 12);
	l = lease_on(f, 0, 12);
	memcpy(pp, l->pages, sizeof(pp));
	lease_drop_pages(l, 1);
	core_check(f);
	assert_int_equal(l->n_pages, 1);
	assert_int_equal(f->p->pa.pins[pp[0]], 1);
	assert_int_equal(f->p->pa.pins[pp[1]], 0);
	assert_int_equal(f->p->pa.pins[pp[2]], 0);
	/* Those two can leave (the leaf first), the kept one not. */
	assert_int_equal(f->p->ix.n_idle, 2);
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES - 1, &f->pk), 0);
	core_check(f);
	assert_true(core_indexed(f, 0, 0));
	assert_false(core_indexed(f, 0, 1));
	assert_false(core_indexed(f, 0, 2));
	assert_int_equal(tier_make_room(&f->c, f->p, N_PAGES, &f->pk), -ENOSPC);
	assert_true(core_indexed(f, 0, 0));
	lease_release(&f->c, l);
	core_check(f);
}

/* A session forked from a lease (decoding goes on from a matched
 * prefix) shares its full pages, copies the partial one, and what it
 * writes leaves the leased pages alone. */
static void test_fork_from_lease(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = NULL;
	struct lease *l;
	uint32_t tail[2] = {70, 71}, free_before;

	core_cached_chain(f, 0, 12);
	l = lease_on(f, 0, 12);
	for (uint32_t i = 0; i < 3; i++)
		core_fill_slot(f, l->pages[i], (uint8_t)(0x60 + i));
	assert_int_equal(session_fork_lease(&f->c, l, 13, &f->pk, &s), -ERANGE);
	assert_null(s);
	free_before = f->p->pa.n_free;
	assert_int_equal(session_fork_lease(&f->c, l, 6, &f->pk, &s), 0);
	session_own(&f->c, s, &f->b.sessions, 0);
	core_check(f);
	assert_int_equal(s->n_committed, 6);
	assert_int_equal(s->n_pages, 2);
	assert_int_equal(s->pages[0], l->pages[0]);
	assert_int_not_equal(s->pages[1], l->pages[1]);
	assert_true(core_slot_all(f, s->pages[1], 0x61));
	assert_int_equal(f->p->pa.n_free, free_before - 1);
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(tokvec_id(&s->tok, i), i);

	assert_int_equal(core_append(f, &f->b, s, tail, 2), 6);
	core_fill_slot(f, s->pages[1], 0xFF);
	core_commit(f, &f->b, s, 2);
	assert_true(core_slot_all(f, l->pages[1], 0x61));
	/* The fork's page is its own chain; the leased chain still matches
	 * whole. */
	assert_int_equal(core_match_tokens(f, 0, 12), 12);
	assert_int_equal(f->p->ix.n_entries, 4);
	lease_release(&f->c, l);
	core_check(f);
}

/* The daemon stops with leases held, a writer's uncommitted tokens, a
 * fork and a persistent session nobody owns: cache_fini frees them all
 * (the teardown runs it; ASan reports what it would leak). */
static void test_fini_frees_what_is_held(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *fk, *kept = core_session(f, &f->b);
	uint32_t ids[5];

	core_append_commit(f, &f->a, s, 0, 10);
	(void)lease_on(f, 0, 10);
	(void)lease_on(f, 0, 4);
	assert_int_equal(session_fork(&f->c, s, 10, &f->pk, &fk), 0);
	core_check(f);
	core_tokens(ids, 5, 10);
	assert_int_equal(core_append(f, &f->a, s, ids, 5), 10);
	core_append_commit(f, &f->b, kept, 300, 9);
	session_own(&f->c, kept, NULL, 1);
	core_check(f);
	assert_int_equal(f->c.leases.n, 2);
	assert_int_equal(f->c.sessions.n, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lease_pins_pages_until_released, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_tables_grow_with_what_they_hold, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_lease_belongs_to_its_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drop_pages_keeps_the_prefix, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork_from_lease, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fini_frees_what_is_held, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
