/* tests/unit/test_session.c — sessions (daemon/session.h) called directly,
 * as the service layer calls them, with no daemon, socket or io_uring.
 *
 * What a client of the daemon relies on: appending reserves page slots
 * that only a commit publishes; the full pages a commit fills enter the
 * prefix index, and a second session committing the same tokens ends up on
 * the very same slots (dedup) while a different prefix shares nothing; one
 * writer at a time holds uncommitted tokens; a fork shares the parent's
 * full pages and copies its partial last page, so writing into the fork
 * never changes the bytes the parent reads; truncate drops pages and their
 * references and copies a shared new last page before it can be written;
 * closing keeps what the index holds; persistent sessions outlive their
 * owner until the idle timeout; ids of another uid are not found; limits
 * refuse without changing anything. cache_check (every page's reference
 * count against the sessions, leases and index naming it) agrees after
 * every step, and cache_fini frees everything (ASan in build-asan).
 * Single-threaded.
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
	/* Watermarks at the top: nothing is evicted in these tests. */
	return core_fixture_setup(state, N_PAGES, 1.0, 1.0);
}

static int teardown(void **state)
{
	return core_fixture_teardown(state);
}

static uint32_t refs(const struct core_fixture *f, uint32_t slot)
{
	return f->p->pa.refs[slot];
}

/* A client appends 10 tokens (two full pages and half a third), writes
 * K/V into the slots it got and commits; a second client then computes
 * the same prompt: after its commit it reads the first client's pages. */
static void test_commit_indexes_full_pages_and_dedups(void **state)
{
	struct core_fixture *f = *state;
	struct session *s1 = core_session(f, &f->a), *s2, *s3;
	uint32_t ids[10], other[8], p1[3];

	core_tokens(ids, 10, 100);
	assert_int_equal(core_append(f, &f->a, s1, ids, 10), 0);
	assert_int_equal(s1->n_pages, 3);
	assert_int_equal(f->p->pa.n_free, N_PAGES - 3);
	assert_int_equal(session_reserved_pages(s1), 3);
	assert_int_equal(f->a.writing.reserved_pages, 3);
	/* Reserved is not published: nobody matches it yet. */
	assert_int_equal(core_match_tokens(f, 100, 10), 0);
	for (uint32_t i = 0; i < 3; i++) {
		p1[i] = s1->pages[i];
		core_fill_slot(f, p1[i], (uint8_t)(0x11 + i));
	}
	core_commit(f, &f->a, s1, 10);
	assert_null(s1->writer);
	assert_int_equal(f->a.writing.reserved_pages, 0);
	assert_int_equal(s1->n_hashes, 2);
	assert_true(core_indexed(f, 100, 0) && core_indexed(f, 100, 1));
	/* Full pages: the session's and the index's; the partial one is
	 * the session's alone. */
	assert_int_equal(refs(f, p1[0]), 2);
	assert_int_equal(refs(f, p1[1]), 2);
	assert_int_equal(refs(f, p1[2]), 1);
	assert_int_equal(core_match_tokens(f, 100, 10), 8);

	/* The same prompt from another client: fresh slots until its
	 * commit, then the first client's. */
	s2 = core_session(f, &f->b);
	assert_int_equal(core_append(f, &f->b, s2, ids, 10), 0);
	assert_int_equal(f->p->pa.n_free, N_PAGES - 6);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_not_equal(s2->pages[i], p1[i]);
		core_fill_slot(f, s2->pages[i], 0x77);
	}
	core_commit(f, &f->b, s2, 10);
	assert_int_equal(s2->pages[0], p1[0]);
	assert_int_equal(s2->pages[1], p1[1]);
	assert_int_not_equal(s2->pages[2], p1[2]);
	assert_int_equal(f->p->ix.dedup_pages, 2);
	/* Its own two copies went back to the free lists. */
	assert_int_equal(f->p->pa.n_free, N_PAGES - 4);
	assert_int_equal(refs(f, p1[0]), 3);
	assert_int_equal(session_shared_pages(s2), 2);
	assert_true(core_slot_all(f, s2->pages[0], 0x11));
	assert_true(core_slot_all(f, s2->pages[1], 0x12));
	assert_true(core_slot_all(f, s2->pages[2], 0x77));

	/* The same tokens after another first page are another chain:
	 * nothing shared. */
	s3 = core_session(f, &f->b);
	core_tokens(other, 4, 500);
	core_tokens(other + 4, 4, 104); /* s1's second page */
	assert_int_equal(core_append(f, &f->b, s3, other, 8), 0);
	core_commit(f, &f->b, s3, 8);
	assert_int_not_equal(s3->pages[0], p1[0]);
	assert_int_not_equal(s3->pages[1], p1[1]);
	assert_int_equal(f->p->ix.dedup_pages, 2);
	assert_int_equal(f->p->ix.n_entries, 4);

	/* Closing keeps the index's pages (and frees the partial ones). */
	session_close(&f->c, s1);
	core_check(f);
	session_close(&f->c, s2);
	core_check(f);
	session_close(&f->c, s3);
	core_check(f);
	assert_int_equal(refs(f, p1[0]), 1);
	assert_int_equal(f->p->pa.n_free, N_PAGES - 4);
	assert_int_equal(core_match_tokens(f, 100, 10), 8);
}

/* Two-phase append and the one-writer rule: another client can neither
 * append nor commit while tokens are uncommitted; a commit of more than
 * is reserved changes nothing; a rollback gives back exactly the pages
 * only the uncommitted tail used. */
static void test_append_is_two_phase_with_one_writer(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t ids[6], more[3];
	uint64_t first;
	uint32_t filled;

	core_tokens(ids, 6, 0);
	core_tokens(more, 3, 6);
	assert_int_equal(core_append(f, &f->a, s, ids, 6), 0);
	assert_int_equal(s->n_pages, 2);
	assert_int_equal(
		session_append(&f->c, s, &f->b, &f->b.writing, more, 3, NULL, &f->pk, &first),
		-EBUSY);
	assert_int_equal(session_commit(&f->c, s, &f->b, 6, &filled), -EBUSY);
	assert_int_equal(session_commit(&f->c, s, &f->a, 7, &filled), -ERANGE);
	assert_int_equal(s->n_tokens, 6);
	assert_int_equal(s->n_committed, 0);
	assert_int_equal(f->b.writing.reserved_pages, 0);
	core_check(f);

	/* A commit in two steps; the writer's hold ends with the last. */
	core_commit(f, &f->a, s, 4);
	assert_ptr_equal(s->writer, &f->a);
	assert_int_equal(f->a.writing.reserved_pages, 1);
	assert_int_equal(core_match_tokens(f, 0, 6), 4);
	core_commit(f, &f->a, s, 2);
	assert_null(s->writer);
	assert_int_equal(f->a.writing.reserved_pages, 0);
	assert_int_equal(session_commit(&f->c, s, &f->a, 1, &filled), -ERANGE);

	/* Now the other client may write; its rollback frees the page its
	 * tail took and keeps the shared partial one. */
	assert_int_equal(core_append(f, &f->b, s, more, 3), 6);
	assert_int_equal(s->n_pages, 3);
	assert_int_equal(f->b.writing.reserved_pages, 1);
	session_rollback(&f->c, s);
	core_check(f);
	assert_null(s->writer);
	assert_int_equal(s->n_tokens, 6);
	assert_int_equal(s->n_pages, 2);
	assert_int_equal(f->b.writing.reserved_pages, 0);
	assert_int_equal(f->p->pa.n_free, N_PAGES - 2);
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(tokvec_id(&s->tok, i), i);
}

/* A fork of a committed session (a beam, a branch of a conversation)
 * shares the full pages, gets its own copy of the partial last page, and
 * what it writes from there on never shows in the parent's pages. */
static void test_fork_shares_pages_and_its_writes_stay_private(void **state)
{
	struct core_fixture *f = *state;
	struct session *par = core_session(f, &f->a), *fk = NULL, *fk2 = NULL;
	uint32_t pp[3], tail[2] = {900, 901}, ptail[2] = {10, 11}, one = 12, free_before;
	int copied;

	core_append_commit(f, &f->a, par, 0, 10);
	for (uint32_t i = 0; i < 3; i++) {
		pp[i] = par->pages[i];
		core_fill_slot(f, pp[i], (uint8_t)(0xA0 + i));
	}
	free_before = f->p->pa.n_free;
	assert_int_equal(session_fork(&f->c, par, 10, &f->pk, &fk), 0);
	session_own(&f->c, fk, &f->b.sessions, 0);
	core_check(f);
	assert_int_equal(fk->n_tokens, 10);
	assert_int_equal(fk->n_committed, 10);
	assert_null(fk->writer);
	assert_int_equal(fk->n_pages, 3);
	assert_int_equal(fk->pages[0], pp[0]);
	assert_int_equal(fk->pages[1], pp[1]);
	assert_int_not_equal(fk->pages[2], pp[2]);
	/* One page more, a copy of the parent's partial page. */
	assert_int_equal(f->p->pa.n_free, free_before - 1);
	assert_true(core_slot_all(f, fk->pages[2], 0xA2));
	assert_int_equal(refs(f, pp[0]), 3);
	assert_int_equal(refs(f, pp[2]), 1);
	for (uint32_t i = 0; i < 10; i++)
		assert_int_equal(tokvec_id(&fk->tok, i), i);

	/* The fork goes on with other tokens, written into its own slot. */
	assert_int_equal(core_append(f, &f->b, fk, tail, 2), 10);
	assert_int_equal(fk->n_pages, 3);
	core_fill_slot(f, fk->pages[2], 0xEE);
	core_commit(f, &f->b, fk, 2);
	assert_true(core_slot_all(f, pp[0], 0xA0));
	assert_true(core_slot_all(f, pp[1], 0xA1));
	assert_true(core_slot_all(f, pp[2], 0xA2));
	assert_int_equal(par->n_tokens, 10);
	assert_int_equal(tokvec_id(&par->tok, 9), 9);
	assert_int_equal(tokvec_id(&fk->tok, 11), 901);

	/* The parent goes on its own way in its own page. */
	assert_int_equal(core_append(f, &f->a, par, ptail, 2), 10);
	assert_int_equal(par->pages[2], pp[2]);
	core_commit(f, &f->a, par, 2);
	assert_int_not_equal(par->pages[2], fk->pages[2]);
	assert_int_equal(core_match_tokens(f, 0, 12), 12);
	assert_true(core_slot_all(f, fk->pages[2], 0xEE));

	/* Only committed tokens can be forked. */
	assert_int_equal(core_append(f, &f->a, par, &one, 1), 12);
	assert_int_equal(session_fork(&f->c, par, 13, &f->pk, &fk2), -ERANGE);
	assert_null(fk2);
	session_rollback(&f->c, par);
	core_check(f);

	/* A fork at a page boundary copies nothing. */
	free_before = f->p->pa.n_free;
	assert_int_equal(session_fork(&f->c, par, 8, &f->pk, &fk2), 0);
	core_check(f);
	assert_int_equal(fk2->n_pages, 2);
	assert_int_equal(f->p->pa.n_free, free_before);
	assert_int_equal(session_shared_pages(fk2), 2);

	/* The parent goes; what the forks share stays theirs. */
	session_close(&f->c, par);
	core_check(f);
	assert_true(core_slot_all(f, fk->pages[0], 0xA0));
	assert_int_equal(refs(f, pp[0]), 3); /* index, fk, fk2 */
	assert_int_equal(session_truncate(&f->c, fk2, NULL, 0, &f->pk, &copied), 0);
	assert_int_equal(copied, 0);
	core_check(f);
	session_close(&f->c, fk2);
	core_check(f);
	assert_int_equal(refs(f, pp[0]), 2);
}

/* Truncate (a client rewinding a conversation) drops the pages past the
 * new end and their references; a new last page shared with the index is
 * copied first, so writing it never changes what others match. */
static void test_truncate_drops_pages_and_references(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t pp[3], ids[2] = {600, 601}, more[8];
	uint32_t free_before;
	int copied = -1;

	core_append_commit(f, &f->a, s, 0, 12);
	for (uint32_t i = 0; i < 3; i++) {
		pp[i] = s->pages[i];
		core_fill_slot(f, pp[i], (uint8_t)(0xB0 + i));
		assert_int_equal(refs(f, pp[i]), 2);
	}
	free_before = f->p->pa.n_free;
	assert_int_equal(session_truncate(&f->c, s, NULL, 6, &f->pk, &copied), 0);
	core_check(f);
	assert_int_equal(copied, 1);
	assert_int_equal(s->n_tokens, 6);
	assert_int_equal(s->n_committed, 6);
	assert_int_equal(s->n_pages, 2);
	assert_int_equal(s->n_hashes, 1);
	assert_int_equal(s->pages[0], pp[0]);
	assert_int_not_equal(s->pages[1], pp[1]);
	assert_true(core_slot_all(f, s->pages[1], 0xB1));
	assert_int_equal(refs(f, s->pages[1]), 1);
	/* The index keeps the old pages, each now its own alone. */
	assert_int_equal(refs(f, pp[1]), 1);
	assert_int_equal(refs(f, pp[2]), 1);
	assert_int_equal(f->p->pa.n_free, free_before - 1);
	assert_int_equal(core_match_tokens(f, 0, 12), 12);

	/* Writing the new tail changes the copy only. */
	assert_int_equal(core_append(f, &f->a, s, ids, 2), 6);
	core_fill_slot(f, s->pages[1], 0xCC);
	core_commit(f, &f->a, s, 2);
	assert_true(core_slot_all(f, pp[1], 0xB1));
	assert_int_equal(core_match_tokens(f, 0, 12), 12);

	/* At a page boundary nothing is copied. */
	assert_int_equal(session_truncate(&f->c, s, NULL, 4, &f->pk, &copied), 0);
	core_check(f);
	assert_int_equal(copied, 0);
	assert_int_equal(s->n_pages, 1);
	assert_int_equal(session_truncate(&f->c, s, NULL, 5, &f->pk, &copied), -ERANGE);

	/* An uncommitted tail: only its writer may cut it; the cut frees
	 * the page only the tail used and the writer's count follows. */
	core_tokens(more, 8, 4);
	assert_int_equal(core_append(f, &f->a, s, more, 8), 4);
	assert_int_equal(s->n_pages, 3);
	assert_int_equal(session_truncate(&f->c, s, &f->b, 6, &f->pk, &copied), -EBUSY);
	free_before = f->p->pa.n_free;
	assert_int_equal(session_truncate(&f->c, s, &f->a, 6, &f->pk, &copied), 0);
	core_check(f);
	assert_int_equal(s->n_pages, 2);
	assert_int_equal(f->p->pa.n_free, free_before + 1);
	assert_ptr_equal(s->writer, &f->a);
	assert_int_equal(f->a.writing.reserved_pages, 1);
	assert_int_equal(session_truncate(&f->c, s, &f->a, 4, &f->pk, &copied), 0);
	core_check(f);
	assert_null(s->writer);
	assert_int_equal(f->a.writing.reserved_pages, 0);

	/* To nothing: the session holds no page, the index its own. */
	assert_int_equal(session_truncate(&f->c, s, NULL, 0, &f->pk, &copied), 0);
	core_check(f);
	assert_int_equal(s->n_pages, 0);
	assert_int_equal(f->p->pa.n_free, N_PAGES - f->p->ix.n_host);
}

/* A connection closes: its sessions close with it (uncommitted tokens
 * rolled back, committed full pages kept by the index), except the
 * persistent ones, which nobody owns until the idle timeout closes them. */
static void test_owner_release_and_idle_expiry(void **state)
{
	struct core_fixture *f = *state;
	struct session *gone = core_session(f, &f->a), *kept = core_session(f, &f->a);
	struct session_left left = {0};
	uint32_t ids[5];
	uint64_t kept_id = kept->id, gone_id = gone->id, t;

	session_own(&f->c, kept, &f->a.sessions, 1);
	core_append_commit(f, &f->a, gone, 0, 6);
	core_tokens(ids, 5, 6);
	assert_int_equal(core_append(f, &f->a, gone, ids, 5), 6);
	core_append_commit(f, &f->a, kept, 1000, 8);
	assert_int_equal(f->a.sessions.n_sessions, 2);
	session_owner_release(&f->c, &f->a.sessions, &left);
	core_check(f);
	assert_int_equal(left.closed, 1);
	assert_int_equal(left.persistent, 1);
	assert_int_equal(left.tokens, 11);
	assert_int_equal(f->a.writing.reserved_pages, 0);
	assert_null(session_get(&f->c, gone_id, CORE_UID, 0));
	assert_ptr_equal(session_get(&f->c, kept_id, CORE_UID, 0), kept);
	assert_null(kept->owner);
	assert_int_equal(f->p->n_unowned, 1);
	/* The closed one's full page is still matched. */
	assert_int_equal(core_match_tokens(f, 0, 11), 4);

	/* Not yet idle long enough; then closed. */
	t = kept->last_use_ns;
	assert_int_equal(session_expire_idle(&f->c, t + 999, 1000), 0);
	assert_ptr_equal(session_get(&f->c, kept_id, CORE_UID, 0), kept);
	t = kept->last_use_ns;
	assert_int_equal(session_expire_idle(&f->c, t + 1000, 1000), 1);
	core_check(f);
	assert_null(session_get(&f->c, kept_id, CORE_UID, 0));
	assert_int_equal(f->p->n_persistent, 0);
	assert_int_equal(core_match_tokens(f, 1000, 8), 8);
}

/* Ids are per tenant: another uid presenting a pool's or session's id
 * gets "not found", an admin finds it; another uid's pool for the same
 * model is its own, and nothing is shared with it. */
static void test_ids_of_another_uid_are_not_found(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *s2;
	struct pool *q = NULL;
	struct match_result mr;
	struct lease *l = NULL;
	struct list owner;
	uint32_t ids[8];

	core_append_commit(f, &f->a, s, 0, 8);
	assert_ptr_equal(pool_get(&f->c, f->p->id, CORE_UID, 0), f->p);
	assert_null(pool_get(&f->c, f->p->id, CORE_UID + 1, 0));
	assert_ptr_equal(pool_get(&f->c, f->p->id, CORE_UID + 1, 1), f->p);
	assert_ptr_equal(session_get(&f->c, s->id, CORE_UID, 0), s);
	assert_null(session_get(&f->c, s->id, CORE_UID + 1, 0));
	assert_ptr_equal(session_get(&f->c, s->id, CORE_UID + 1, 1), s);
	assert_null(session_get(&f->c, 0, CORE_UID, 0));
	assert_null(pool_get(&f->c, s->id, CORE_UID, 0)); /* a session id is no pool id */

	assert_int_equal(pool_open(&f->c, CORE_UID + 1, "unit-model", &f->p->layout, &q), 0);
	core_check(f);
	assert_ptr_not_equal(q, f->p);
	assert_int_not_equal(q->id, f->p->id);
	assert_int_not_equal(q->arena_fd, f->p->arena_fd);
	/* The same prompt in the other tenant's pool: no match, no dedup. */
	core_tokens(ids, 8, 0);
	list_init(&owner);
	assert_int_equal(
		match_start(&f->c, q, q->root, &owner, &owner, ids, 8, NULL, 0, 0, &l, &mr), 0);
	assert_int_equal(session_create(&f->c, q, q->root, &s2), 0);
	assert_null(session_get(&f->c, s2->id, CORE_UID, 0));
	assert_int_equal(core_append(f, &f->b, s2, ids, 8), 0);
	core_commit(f, &f->b, s2, 8);
	assert_int_equal(q->ix.dedup_pages, 0);
	assert_int_equal(f->p->ix.dedup_pages, 0);
	/* Still one pool per (uid, model, layout). */
	{
		struct pool *again = NULL;

		assert_int_equal(pool_open(&f->c, CORE_UID, "unit-model", &f->p->layout, &again),
				 0);
		assert_ptr_equal(again, f->p);
	}
	/* Left open: cache_fini closes it with its pool. */
}

/* Sessions share the configured policy while the configuration says the
 * same; one made after a reload gets the new one and those made before
 * keep theirs; a fork shares its source's; a policy a client sets is the
 * session's alone. */
static void test_policy_shared_until_changed(void **state)
{
	struct core_fixture *f = *state;
	struct session *s1 = core_session(f, &f->a), *s2 = core_session(f, &f->a), *s3, *fk;
	struct policy own;

	assert_ptr_equal(s1->pol, s2->pol);
	assert_int_equal(s1->pol->kind, POLICY_NONE);
	f->cfg.session_policy = POLICY_WINDOW;
	f->cfg.session_budget = 100;
	s3 = core_session(f, &f->a);
	assert_ptr_not_equal(s3->pol, s1->pol);
	assert_int_equal(s3->pol->kind, POLICY_WINDOW);
	assert_int_equal(s3->pol->budget, 100);
	assert_int_equal(s1->pol->kind, POLICY_NONE);
	core_append_commit(f, &f->a, s3, 0, 8);
	assert_int_equal(session_fork(&f->c, s3, 8, &f->pk, &fk), 0);
	assert_ptr_equal(fk->pol, s3->pol);
	policy_defaults(&own, POLICY_SINKS);
	own.budget = 50;
	assert_int_equal(session_set_policy(s3, &own), 0);
	assert_int_equal(s3->pol->kind, POLICY_SINKS);
	assert_int_equal(fk->pol->kind, POLICY_WINDOW);
	assert_int_equal(s2->pol->kind, POLICY_NONE);
	session_close(&f->c, fk);
	session_close(&f->c, s1);
	core_check(f);
	/* The rest are closed with the fixture (ASan sees a leak or a
	 * double free of a shared policy). */
}

/* Limits refuse before anything changes. */
static void test_limits_refuse_and_change_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *t = NULL;
	uint32_t ids[12];
	uint64_t first;

	core_tokens(ids, 12, 0);
	f->cfg.max_session_tokens = 10;
	assert_int_equal(
		session_append(&f->c, s, &f->a, &f->a.writing, ids, 11, NULL, &f->pk, &first),
		-EDQUOT);
	f->cfg.max_session_tokens = 1000;
	f->cfg.max_reserved_pages = 2;
	assert_int_equal(
		session_append(&f->c, s, &f->a, &f->a.writing, ids, 12, NULL, &f->pk, &first),
		-EDQUOT);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->n_pages, 0);
	assert_null(s->writer);
	assert_int_equal(f->p->pa.n_free, N_PAGES);
	core_check(f);
	assert_int_equal(core_append(f, &f->a, s, ids, 8), 0);
	assert_int_equal(
		session_append(&f->c, s, &f->a, &f->a.writing, ids, 1, NULL, &f->pk, &first),
		-EDQUOT);
	core_commit(f, &f->a, s, 8);
	f->cfg.max_sessions_per_pool = f->p->n_sessions;
	assert_int_equal(session_create(&f->c, f->p, f->p->root, &t), -EDQUOT);
	assert_null(t);
	assert_int_equal(session_fork(&f->c, s, 8, &f->pk, &t), -EDQUOT);
	assert_null(t);
	core_check(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_indexes_full_pages_and_dedups, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_append_is_two_phase_with_one_writer, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fork_shares_pages_and_its_writes_stay_private,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncate_drops_pages_and_references, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_owner_release_and_idle_expiry, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ids_of_another_uid_are_not_found, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_policy_shared_until_changed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_limits_refuse_and_change_nothing, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
