/* tests/unit/test_compact.c — token policies applied to a session
 * (daemon/core/compact.h) on the core alone: no service layer, no server,
 * no worker threads.
 *
 * The fixture's cache has no worker (c->worker is NULL), so compaction
 * runs as the daemon's event loop runs it then: compact_session, which is
 * compact_gather_start, compact_job_run and compact_job_finish on the
 * calling thread (service/polop.c's do_compact takes that path when
 * cache->worker is NULL), and compact_after_commit for auto_compact. One
 * test also drives the three steps apart, as a worker would see them, and
 * changes the session in between.
 *
 * What a client of a compacted session relies on: it keeps exactly the
 * tokens daemon/base/policy.h's policy_select chooses from the same
 * metadata under the same budget (window, sinks + window, importance,
 * hierarchy, role limits), each kept token's K and V bytes in the arena
 * are the bytes its original position had and its meta[].pos is that
 * position; the old pages' references go back (the pages only the session
 * held return to the free lists, the index keeps its own); a fork sharing
 * pages and tokens with the compacted session, and a lease taken before
 * the compaction, read what they read before; a compaction that cannot
 * run (no policy, uncommitted tokens, no room) changes nothing.
 * cache_check (every page's references against sessions, leases, index
 * and jobs) agrees after every step. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "compact.h"
#include "core_fixture.h"
#include "match.h"
#include "policy.h"
#include "prefix_index.h"

#define N_PAGES 64u

static int setup(void **state)
{
	/* Watermarks at the top: nothing is evicted behind the tests' back. */
	return core_fixture_setup(state, N_PAGES, 1.0, 1.0);
}

/* A pool for a session longer than two chunks of tokens (tokvec.h). */
static int setup_large(void **state)
{
	return core_fixture_setup(state, 3072, 1.0, 1.0);
}

/* A pool of 8 pages, for the test that runs out of them. */
static int setup_small(void **state)
{
	return core_fixture_setup(state, 8, 1.0, 1.0);
}

static int teardown(void **state)
{
	return core_fixture_teardown(state);
}

/* ---- K/V bytes ---------------------------------------------------------- */

static uint64_t row_bytes(const struct core_fixture *f)
{
	return shm_row_bytes(&f->p->layout);
}

/* The row of K (kv 0) or V (kv 1) of session index i in the page table
 * pages (layer 0, head 0: the fixture's layout has one of each). */
static uint8_t *kv_row(const struct core_fixture *f, const uint32_t *pages, uint64_t i, uint32_t kv)
{
	uint32_t slot = pages[i / CORE_BT];

	assert_true(slot < f->p->pa.n_pages);
	return (uint8_t *)f->p->arena + (uint64_t)slot * f->p->page_bytes +
	       shm_kv_offset(&f->p->layout, 0, kv, 0, (uint32_t)(i % CORE_BT));
}

/* What a client writes for the token at original position pos: bytes no
 * other position or the other of K/V has. */
static uint8_t pattern(uint32_t pos, uint32_t kv, uint64_t j)
{
	switch (j) {
	case 0:
		return (uint8_t)pos;
	case 1:
		return (uint8_t)(pos >> 8);
	case 2:
		return (uint8_t)(0xA0 + kv);
	default:
		return (uint8_t)(pos * 7 + j * 13 + kv * 5 + 1);
	}
}

/* Writes every reserved, uncommitted token's K and V (what the client
 * does between Append and Commit), by its original position. */
static void write_kv(struct core_fixture *f, struct session *s)
{
	for (uint64_t i = s->n_committed; i < s->n_tokens; i++) {
		uint32_t pos = tokvec_meta(&s->tok, i).pos;

		for (uint32_t kv = 0; kv < 2; kv++) {
			uint8_t *row = kv_row(f, s->pages, i, kv);

			for (uint64_t j = 0; j < row_bytes(f); j++)
				row[j] = pattern(pos, kv, j);
		}
	}
}

/* Whether session index i of page table pages holds the bytes written for
 * original position pos. */
static int row_is(const struct core_fixture *f, const uint32_t *pages, uint64_t i, uint32_t pos)
{
	for (uint32_t kv = 0; kv < 2; kv++) {
		const uint8_t *row = kv_row(f, pages, i, kv);

		for (uint64_t j = 0; j < row_bytes(f); j++)
			if (row[j] != pattern(pos, kv, j))
				return 0;
	}
	return 1;
}

/* Appends tokens base.. base+n-1 as client a, writes their K/V and
 * commits them. */
static void append_write_commit(struct core_fixture *f, struct session *s, uint32_t base,
				uint32_t n)
{
	uint32_t *ids = malloc(n * sizeof(*ids));

	assert_non_null(ids);
	core_tokens(ids, n, base);
	core_append(f, &f->a, s, ids, n);
	write_kv(f, s);
	core_commit(f, &f->a, s, n);
	free(ids);
}

/* ---- what a session held before ----------------------------------------- */

struct snap {
	uint64_t n;
	uint32_t *ids;
	struct token_meta *meta;
	uint32_t *pages;
	uint32_t n_pages;
	uint32_t *page_refs; /* refs of each of pages[] */
	uint8_t *bytes;	     /* [n_pages][page_bytes] */
	uint32_t n_free;
};

static void snap_take(const struct core_fixture *f, const struct session *s, struct snap *sn)
{
	uint64_t pb = f->p->page_bytes;

	sn->n = s->n_tokens;
	sn->ids = malloc((sn->n + 1) * sizeof(*sn->ids));
	sn->meta = malloc((sn->n + 1) * sizeof(*sn->meta));
	sn->n_pages = s->n_pages;
	sn->pages = malloc((sn->n_pages + 1) * sizeof(*sn->pages));
	sn->page_refs = malloc((sn->n_pages + 1) * sizeof(*sn->page_refs));
	sn->bytes = malloc((sn->n_pages + 1) * pb);
	assert_true(sn->ids && sn->meta && sn->pages && sn->page_refs && sn->bytes);
	tokvec_get(&s->tok, 0, sn->n, sn->ids, sn->meta);
	memcpy(sn->pages, s->pages, sn->n_pages * sizeof(*sn->pages));
	for (uint32_t i = 0; i < sn->n_pages; i++) {
		sn->page_refs[i] = f->p->pa.refs[sn->pages[i]];
		memcpy(sn->bytes + i * pb, (uint8_t *)f->p->arena + (uint64_t)sn->pages[i] * pb,
		       pb);
	}
	sn->n_free = f->p->pa.n_free;
}

static void snap_free(struct snap *sn)
{
	free(sn->ids);
	free(sn->meta);
	free(sn->pages);
	free(sn->page_refs);
	free(sn->bytes);
	memset(sn, 0, sizeof(*sn));
}

/* s holds exactly what sn says: same tokens, metadata, slots and bytes. */
static void assert_unchanged(const struct core_fixture *f, const struct session *s,
			     const struct snap *sn)
{
	uint64_t pb = f->p->page_bytes;

	assert_int_equal(s->n_tokens, sn->n);
	assert_int_equal(s->n_pages, sn->n_pages);
	assert_memory_equal(s->pages, sn->pages, sn->n_pages * sizeof(*sn->pages));
	for (uint64_t i = 0; i < sn->n; i++) {
		struct token_meta m = tokvec_meta(&s->tok, i);

		assert_int_equal(tokvec_id(&s->tok, i), sn->ids[i]);
		assert_memory_equal(&m, &sn->meta[i], sizeof(m));
	}
	for (uint32_t i = 0; i < sn->n_pages; i++)
		assert_memory_equal((uint8_t *)f->p->arena + (uint64_t)sn->pages[i] * pb,
				    sn->bytes + i * pb, pb);
}

/* What policy.h's pure function keeps of the snapshot's tokens under s's
 * policy and the budget it gives for their number. Returns k; keep[]
 * [sn->n] gets the indexes. */
static size_t expected_keep(const struct session *s, const struct snap *sn, uint32_t *keep)
{
	uint32_t *scratch = malloc((sn->n + 1) * sizeof(*scratch));
	size_t k;

	assert_non_null(scratch);
	k = policy_select(s->pol, sn->meta, sn->n, policy_budget(s->pol, sn->n), keep, scratch);
	free(scratch);
	return k;
}

/* After compact_session dropped some of sn's tokens: s holds exactly
 * sn's tokens keep[0..k), in order, with their ids, metadata (original
 * positions included) and K/V bytes, in fresh private pages; the old
 * pages each lost the session's one reference, and those only it held
 * are free again. */
static void assert_compacted(const struct core_fixture *f, const struct session *s,
			     const struct snap *sn, const uint32_t *keep, size_t k)
{
	uint32_t used = (uint32_t)((k + CORE_BT - 1) / CORE_BT), freed = 0;

	assert_int_equal(s->n_tokens, k);
	assert_int_equal(s->n_committed, k);
	assert_int_equal(s->n_pages, used);
	assert_true(s->compacted);
	assert_int_equal(s->n_hashes, 0); /* private: never indexed */
	for (size_t i = 0; i < k; i++) {
		const struct token_meta m_ = tokvec_meta(&s->tok, i), *m = &m_;

		assert_int_equal(tokvec_id(&s->tok, i), sn->ids[keep[i]]);
		assert_int_equal(m->pos, sn->meta[keep[i]].pos);
		assert_int_equal(m->turn, sn->meta[keep[i]].turn);
		assert_int_equal(m->role, sn->meta[keep[i]].role);
		assert_int_equal(m->flags, sn->meta[keep[i]].flags);
		assert_true(m->score == sn->meta[keep[i]].score);
		/* The bytes of the original position, in the new page table. */
		assert_true(row_is(f, s->pages, i, sn->meta[keep[i]].pos));
	}
	for (uint32_t i = 0; i < sn->n_pages; i++) {
		assert_int_equal(f->p->pa.refs[sn->pages[i]], sn->page_refs[i] - 1);
		freed += sn->page_refs[i] == 1;
	}
	for (uint32_t i = 0; i < used; i++) {
		assert_int_equal(f->p->pa.refs[s->pages[i]], 1);
		for (uint32_t o = 0; o < sn->n_pages; o++)
			if (sn->page_refs[o] > 1)
				assert_int_not_equal(s->pages[i], sn->pages[o]);
	}
	assert_int_equal(f->p->pa.n_free, sn->n_free + freed - used);
	assert_int_equal(pagealloc_check(&f->p->pa), 0);
}

/* Compacts s with compact_session and checks the result against
 * policy_select on what s held before. Returns the tokens kept. */
static size_t compact_and_check(struct core_fixture *f, struct session *s, uint32_t *keep)
{
	struct snap sn;
	uint64_t dropped = UINT64_MAX;
	size_t k;

	snap_take(f, s, &sn);
	k = expected_keep(s, &sn, keep);
	assert_true(k < sn.n); /* the callers make the policy drop some */
	assert_int_equal(compact_session(&f->c, s, &f->pk, &dropped), 0);
	core_check(f);
	assert_int_equal(dropped, sn.n - k);
	assert_compacted(f, s, &sn, keep, k);
	snap_free(&sn);
	return k;
}

static void set_policy(struct session *s, const struct policy *pol)
{
	const char *why = NULL;
	uint32_t budget = 0;

	assert_int_equal(compact_set_policy(s, pol, &budget, &why), 0);
	assert_int_equal(budget, policy_budget(pol, s->n_tokens));
}

static void tag(struct core_fixture *f, struct session *s, uint64_t first, uint64_t n, uint8_t role,
		uint32_t turn, uint8_t flags)
{
	struct session_tag t = {.role = role, .flags = flags, .has_turn = 1, .turn = turn};

	assert_int_equal(compact_tag(&f->c, s, first, n, &t), 0);
	core_check(f);
}

/* ---- the policies --------------------------------------------------------- */

/* A sliding window of 8 over 30 tokens: the last 8 stay, with the bytes
 * and positions 22..29 had. */
static void test_window_keeps_the_last_tokens(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct policy pol;
	uint32_t keep[30];

	append_write_commit(f, s, 1000, 30);
	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 8;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 8);
	for (uint32_t i = 0; i < 8; i++) {
		assert_int_equal(keep[i], 22 + i);
		assert_int_equal(tokvec_id(&s->tok, i), 1000 + 22 + i);
	}
	assert_int_equal(s->dropped_tokens, 22);
	/* The index still finds the first full pages (its own references). */
	assert_int_equal(core_match_tokens(f, 1000, 30), 28);
	session_close(&f->c, s);
	core_check(f);
}

/* Attention sinks + window: the first 4 and the last 8 of 30, a budget
 * that is not a multiple of the page (the spare fresh page goes back). */
static void test_sinks_keep_the_first_and_last_tokens(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct policy pol;
	uint32_t keep[30];

	append_write_commit(f, s, 2000, 30);
	policy_defaults(&pol, POLICY_SINKS);
	pol.budget = 11;
	pol.sinks = 4;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 11);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(keep[i], i);
	for (uint32_t i = 4; i < 11; i++)
		assert_int_equal(keep[i], 30 - 11 + i);
	session_close(&f->c, s);
	core_check(f);
}

/* Importance: sinks 2, recent 4 and the 4 tokens with the most attention
 * mass the client reported (two reports: decay applies). */
static void test_importance_keeps_heavy_hitters(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	static const uint32_t heavy[] = {7, 13, 19, 25};
	uint32_t keep[32], want[10] = {0, 1, 7, 13, 19, 25, 28, 29, 30, 31};
	float mass[32];
	struct policy pol;

	append_write_commit(f, s, 3000, 32);
	policy_defaults(&pol, POLICY_IMPORTANCE);
	pol.budget = 10;
	pol.sinks = 2;
	pol.recent = 4;
	set_policy(s, &pol);
	for (uint32_t i = 0; i < 32; i++)
		mass[i] = 0.01f * (float)(i % 5);
	for (uint32_t i = 0; i < 4; i++)
		mass[heavy[i]] = 1.0f + (float)i;
	assert_int_equal(compact_add_mass(&f->c, s, 0, mass, 32), 0);
	/* A second report for token 7 alone: every score decays first. */
	assert_int_equal(compact_add_mass(&f->c, s, 7, mass + 7, 1), 0);
	core_check(f);
	assert_int_equal(compact_and_check(f, s, keep), 10);
	assert_memory_equal(keep, want, sizeof(want));
	session_close(&f->c, s);
	core_check(f);
}

/* Hierarchy over tagged turns: a permanent system prompt, the hot last
 * turn, and the rest of the budget by score. */
static void test_hierarchy_keeps_permanent_and_hot_turns(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t keep[36];
	float mass[36] = {0};
	struct policy pol;
	size_t k;

	append_write_commit(f, s, 4000, 36);
	tag(f, s, 0, 4, ROLE_SYSTEM, 0, TOKEN_PERMANENT);
	tag(f, s, 4, 8, ROLE_USER, 1, 0);
	tag(f, s, 12, 8, ROLE_ASSISTANT, 1, 0);
	tag(f, s, 20, 8, ROLE_USER, 2, 0);
	tag(f, s, 28, 8, ROLE_ASSISTANT, 2, 0);
	mass[9] = 5.0f;
	mass[15] = 4.0f;
	assert_int_equal(compact_add_mass(&f->c, s, 0, mass, 36), 0);
	policy_defaults(&pol, POLICY_HIERARCHY);
	pol.budget = 24;
	pol.hot_turns = 1;
	pol.share_permanent = 20;
	pol.share_hot = 70;
	set_policy(s, &pol);
	k = compact_and_check(f, s, keep);
	assert_int_equal(k, 24);
	/* The system prompt, turn 2 whole (16 tokens) and the two heavy
	 * tokens of turn 1. */
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(keep[i], i);
	assert_int_equal(keep[4], 9);
	assert_int_equal(keep[5], 15);
	for (uint32_t i = 6; i < 24; i++)
		assert_true(keep[i] >= 14); /* all of it from turn 1's tail or turn 2 */
	for (uint32_t i = 20; i < 36; i++) {
		int found = 0;

		for (size_t j = 0; j < k; j++)
			found |= keep[j] == i;
		assert_true(found);
	}
	assert_true(tokvec_meta(&s->tok, 0).flags & TOKEN_PERMANENT);
	session_close(&f->c, s);
	core_check(f);
}

/* A role limit drops tokens although the budget holds every token: the
 * fresh pages are taken after the choice (compact.c's late path). */
static void test_role_limit_under_a_large_budget(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t keep[14], want[10] = {0, 1, 2, 3, 8, 9, 10, 11, 12, 13};
	struct policy pol;

	append_write_commit(f, s, 5000, 14);
	tag(f, s, 0, 4, ROLE_SYSTEM, 0, 0);
	tag(f, s, 4, 6, ROLE_USER, 1, 0);
	tag(f, s, 10, 4, ROLE_ASSISTANT, 1, 0);
	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 100;
	pol.role_limit[ROLE_USER] = 2;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 10);
	assert_memory_equal(keep, want, sizeof(want));
	session_close(&f->c, s);
	core_check(f);
}

/* A compacted session grows and compacts again: the tokens appended
 * after the first compaction get positions after the last kept one, and
 * the second compaction still hands every kept token the bytes of its
 * original position. Then the auto_compact path a commit takes without
 * workers (compact_after_commit). */
static void test_compact_twice_and_after_commit(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t keep[32];
	struct policy pol;
	struct snap sn;

	append_write_commit(f, s, 6000, 20);
	policy_defaults(&pol, POLICY_SINKS);
	pol.budget = 8;
	pol.sinks = 2;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 8);
	assert_int_equal(session_next_pos(s), 20);
	append_write_commit(f, s, 7000, 10);
	assert_int_equal(tokvec_meta(&s->tok, 8).pos, 20);
	assert_int_equal(tokvec_meta(&s->tok, 17).pos, 29);
	assert_int_equal(compact_and_check(f, s, keep), 8);
	/* Sinks 0 and 1, then positions 24..29. */
	assert_int_equal(tokvec_meta(&s->tok, 0).pos, 0);
	assert_int_equal(tokvec_meta(&s->tok, 1).pos, 1);
	for (uint32_t i = 2; i < 8; i++) {
		assert_int_equal(tokvec_meta(&s->tok, i).pos, 22 + i);
		assert_int_equal(tokvec_id(&s->tok, i), 7000 + 2 + i);
	}

	/* auto_compact: the commit that takes the session past its budget
	 * compacts it, here on the calling thread. */
	pol.auto_compact = 1;
	set_policy(s, &pol);
	append_write_commit(f, s, 8000, 6);
	snap_take(f, s, &sn);
	assert_int_equal(compact_due(s, 0), 1);
	{
		size_t k = expected_keep(s, &sn, keep);

		assert_int_equal(compact_after_commit(&f->c, s), 1);
		core_check(f);
		assert_compacted(f, s, &sn, keep, k);
	}
	assert_int_equal(compact_due(s, 0), 0);
	assert_int_equal(compact_after_commit(&f->c, s), 0); /* nothing to do */
	snap_free(&sn);
	session_close(&f->c, s);
	core_check(f);
}

/* ---- what others hold ------------------------------------------------------ */

/* A fork shares the session's pages and, copy-on-write, its tokens and
 * metadata. Scoring and compacting the session leaves the fork's tokens,
 * metadata, page table and bytes as they were. */
static void test_fork_is_not_changed(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *fk = NULL;
	uint32_t keep[26];
	float mass[26];
	struct policy pol;
	struct snap before;

	append_write_commit(f, s, 9000, 26);
	assert_int_equal(session_fork(&f->c, s, 26, &f->pk, &fk), 0);
	session_own(&f->c, fk, &f->b.sessions, 0);
	core_check(f);
	snap_take(f, fk, &before);
	/* Full pages shared, the partial last one copied. */
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(fk->pages[i], s->pages[i]);
	tag(f, s, 0, 26, ROLE_ASSISTANT, 3, 0);
	for (uint32_t i = 0; i < 26; i++)
		mass[i] = (float)((i * 7) % 11);
	assert_int_equal(compact_add_mass(&f->c, s, 0, mass, 26), 0);
	policy_defaults(&pol, POLICY_IMPORTANCE);
	pol.budget = 9;
	pol.sinks = 1;
	pol.recent = 2;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 9);
	assert_unchanged(f, fk, &before);
	assert_false(fk->compacted);
	assert_int_equal(fk->n_hashes, 6);
	for (uint64_t i = 0; i < 26; i++)
		assert_true(row_is(f, fk->pages, i, (uint32_t)i));
	/* The fork outlives the compacted session unchanged too. */
	session_close(&f->c, s);
	core_check(f);
	assert_unchanged(f, fk, &before);
	session_close(&f->c, fk);
	core_check(f);
	snap_free(&before);
}

/* The same with a fork whose metadata nobody wrote since: the
 * compaction itself takes the session's own copy of the tokens it
 * rewrites (compact_job_finish's session_own_meta), never the fork's. */
static void test_fork_sharing_tokens_is_not_changed(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *fk = NULL;
	uint32_t keep[22];
	struct policy pol;
	struct snap before;

	append_write_commit(f, s, 9500, 22);
	assert_int_equal(session_fork(&f->c, s, 20, &f->pk, &fk), 0);
	session_own(&f->c, fk, &f->b.sessions, 0);
	core_check(f);
	snap_take(f, fk, &before);
	policy_defaults(&pol, POLICY_SINKS);
	pol.budget = 7;
	pol.sinks = 3;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 7);
	assert_unchanged(f, fk, &before);
	for (uint64_t i = 0; i < 20; i++)
		assert_true(row_is(f, fk->pages, i, (uint32_t)i));
	session_close(&f->c, fk);
	core_check(f);
	session_close(&f->c, s);
	core_check(f);
	snap_free(&before);
}

/* A lease taken before the compaction pins the matched pages: they keep
 * their slots and bytes, and none of them becomes a page of the
 * compacted session. */
static void test_lease_reads_the_old_bytes(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint64_t pb = f->p->page_bytes;
	uint32_t ids[24], keep[24], pinned[6];
	struct match_result mr;
	struct lease *l = NULL;
	struct policy pol;
	uint8_t *bytes;

	append_write_commit(f, s, 10000, 24);
	core_tokens(ids, 24, 10000);
	assert_int_equal(match_start(&f->c, f->p, f->p->root, &f->b, &f->b.leases, ids, 24, NULL, 0,
				     0, &l, &mr),
			 1);
	core_check(f);
	assert_int_equal(l->n_tokens, 24);
	assert_int_equal(l->n_pages, 6);
	memcpy(pinned, l->pages, sizeof(pinned));
	bytes = malloc(6 * pb);
	assert_non_null(bytes);
	for (uint32_t i = 0; i < 6; i++)
		memcpy(bytes + i * pb, (uint8_t *)f->p->arena + (uint64_t)pinned[i] * pb, pb);

	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 5;
	set_policy(s, &pol);
	assert_int_equal(compact_and_check(f, s, keep), 5);
	assert_int_equal(l->n_pages, 6);
	assert_memory_equal(l->pages, pinned, sizeof(pinned));
	for (uint32_t i = 0; i < 6; i++) {
		assert_memory_equal((uint8_t *)f->p->arena + (uint64_t)pinned[i] * pb,
				    bytes + i * pb, pb);
		for (uint32_t j = 0; j < s->n_pages; j++)
			assert_int_not_equal(s->pages[j], pinned[i]);
	}
	/* The client writes into its compacted session: the lease still
	 * reads the old bytes. */
	for (uint32_t j = 0; j < s->n_pages; j++)
		core_fill_slot(f, s->pages[j], 0xEE);
	for (uint32_t i = 0; i < 6; i++)
		assert_memory_equal((uint8_t *)f->p->arena + (uint64_t)pinned[i] * pb,
				    bytes + i * pb, pb);
	session_close(&f->c, s);
	core_check(f);
	for (uint32_t i = 0; i < 6; i++)
		assert_memory_equal((uint8_t *)f->p->arena + (uint64_t)pinned[i] * pb,
				    bytes + i * pb, pb);
	lease_release(&f->c, l);
	core_check(f);
	free(bytes);
}

/* A session of 9000 tokens spans three chunks of its token vector
 * (TOKVEC_CHUNK_TOKENS 4096), shared with a fork: importance reports
 * across a chunk boundary give every token the score policy_add_mass
 * gives over the whole array, and the compaction (kept tokens gathered
 * from every chunk into the first) keeps what policy_select keeps, bytes
 * included, while the fork reads what it read. */
static void test_long_session_across_chunks(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *fk = NULL;
	const uint32_t n = 9000, budget = 300;
	struct token_meta *want = malloc(n * sizeof(*want));
	uint32_t *ids = malloc(n * sizeof(*ids)), *keep = malloc(n * sizeof(*keep));
	float *mass = malloc(n * sizeof(*mass));
	struct policy pol;
	struct snap before;

	assert_true(want && ids && keep && mass);
	core_tokens(ids, n, 20000);
	for (uint32_t at = 0; at < n; at += 1000) {
		core_append(f, &f->a, s, ids + at, 1000);
		write_kv(f, s);
		core_commit(f, &f->a, s, 1000);
	}
	assert_int_equal(session_fork(&f->c, s, n, &f->pk, &fk), 0);
	session_own(&f->c, fk, &f->b.sessions, 0);
	core_check(f);
	snap_take(f, fk, &before);

	policy_defaults(&pol, POLICY_IMPORTANCE);
	pol.budget = budget;
	pol.sinks = 8;
	pol.recent = 64;
	pol.decay = 0.05f;
	set_policy(s, &pol);
	tokvec_get(&s->tok, 0, n, NULL, want);
	/* Report 1: tokens 4000..4199, across the first chunk boundary. */
	for (uint32_t i = 0; i < 200; i++)
		mass[i] = (float)((i * 37) % 101) / 10.0f;
	assert_int_equal(compact_add_mass(&f->c, s, 4000, mass, 200), 0);
	policy_add_mass(want, n, pol.decay, 4000, mass, 200);
	/* Report 2: every token, heavier every 97th. */
	for (uint32_t i = 0; i < n; i++)
		mass[i] = i % 97 == 0 ? 50.0f + (float)(i % 13) : (float)(i % 7) / 100.0f;
	assert_int_equal(compact_add_mass(&f->c, s, 0, mass, n), 0);
	policy_add_mass(want, n, pol.decay, 0, mass, n);
	core_check(f);
	for (uint32_t i = 0; i < n; i++) {
		const struct token_meta m_ = tokvec_meta(&s->tok, i), *m = &m_;

		assert_int_equal(m->pos, want[i].pos);
		assert_true(m->score == want[i].score);
	}
	assert_int_equal(compact_and_check(f, s, keep), budget);
	/* Every heavy token of the middle made it. */
	for (uint32_t i = 97; i < n - 64; i += 97) {
		int found = 0;

		for (uint32_t j = 0; j < budget; j++)
			found |= keep[j] == i;
		assert_true(found);
	}
	assert_unchanged(f, fk, &before);
	session_close(&f->c, s);
	core_check(f);
	session_close(&f->c, fk);
	core_check(f);
	snap_free(&before);
	free(want);
	free(ids);
	free(keep);
	free(mass);
}

/* ---- what cannot run changes nothing ----------------------------------- */

static void assert_refused(struct core_fixture *f, struct session *s, int err)
{
	struct snap sn;
	uint64_t dropped = 77;

	snap_take(f, s, &sn);
	assert_int_equal(compact_session(&f->c, s, &f->pk, &dropped), err);
	core_check(f);
	assert_int_equal(dropped, 0);
	assert_unchanged(f, s, &sn);
	assert_int_equal(f->p->pa.n_free, sn.n_free);
	for (uint32_t i = 0; i < sn.n_pages; i++)
		assert_int_equal(f->p->pa.refs[sn.pages[i]], sn.page_refs[i]);
	assert_false(s->compacted);
	snap_free(&sn);
}

/* No policy (-EINVAL), uncommitted tokens (-EBUSY), and a budget that
 * holds every token (0 dropped: the session stays exact and indexed). */
static void test_refusals_change_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	struct policy pol;
	uint32_t ids[3];
	struct snap sn;
	uint64_t dropped = 77;

	append_write_commit(f, s, 11000, 18);
	assert_refused(f, s, -EINVAL);

	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 4;
	set_policy(s, &pol);
	core_tokens(ids, 3, 11500);
	core_append(f, &f->a, s, ids, 3);
	assert_refused(f, s, -EBUSY);
	session_rollback(&f->c, s);
	core_check(f);

	pol.budget = 18;
	set_policy(s, &pol);
	snap_take(f, s, &sn);
	assert_int_equal(compact_session(&f->c, s, &f->pk, &dropped), 0);
	core_check(f);
	assert_int_equal(dropped, 0);
	assert_unchanged(f, s, &sn);
	assert_int_equal(f->p->pa.n_free, sn.n_free);
	assert_false(s->compacted);
	assert_int_equal(s->n_hashes, 4);
	snap_free(&sn);
	session_close(&f->c, s);
	core_check(f);
}

/* Eight pages, all held by sessions: the two fresh pages a budget of 5
 * needs do not exist (-ENOSPC), and nothing changed. */
static void test_no_room_changes_nothing(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a), *t = core_session(f, &f->a),
		       *u = core_session(f, &f->a);
	struct policy pol;

	append_write_commit(f, s, 12000, 24); /* 6 pages */
	append_write_commit(f, t, 13000, 3);  /* 1 partial page, not indexed */
	append_write_commit(f, u, 13100, 3);  /* another */
	assert_int_equal(f->p->pa.n_free, 0);
	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 5;
	set_policy(s, &pol);
	assert_refused(f, s, -ENOSPC);
	/* With room (and nothing to evict for it) it goes through. */
	session_close(&f->c, t);
	session_close(&f->c, u);
	core_check(f);
	assert_int_equal(f->p->pa.n_free, 2);
	{
		uint32_t keep[24];

		assert_int_equal(compact_and_check(f, s, keep), 5);
	}
	session_close(&f->c, s);
	core_check(f);
}

/* The three steps a worker's compaction takes, apart: while the job holds
 * its snapshot, cache_check counts its references; a session that changed
 * meanwhile is left alone (-EBUSY), a closed one is -ENOENT; either way
 * the job's references all go back. */
static void test_job_on_a_changed_or_closed_session(void **state)
{
	struct core_fixture *f = *state;
	struct session *s = core_session(f, &f->a);
	uint32_t n_free = f->p->pa.n_free;
	struct compact_job j;
	struct policy pol;
	const char *why = NULL;
	uint64_t n = 0, id;
	struct snap sn;

	append_write_commit(f, s, 14000, 20);
	policy_defaults(&pol, POLICY_WINDOW);
	pol.budget = 6;
	set_policy(s, &pol);

	assert_int_equal(compact_gather_start(&f->c, s, &f->pk, &j), 0);
	core_check(f);
	assert_int_equal(f->p->n_compact_jobs, 1);
	assert_int_equal(compact_jobs(&f->c, CORE_UID), 1);
	compact_job_run(&j);
	append_write_commit(f, s, 14500, 2); /* the session changed */
	snap_take(f, s, &sn);
	assert_int_equal(compact_job_finish(&f->c, &j, &n, &why), -EBUSY);
	assert_non_null(why);
	core_check(f);
	assert_int_equal(f->p->n_compact_jobs, 0);
	assert_unchanged(f, s, &sn);
	assert_false(s->compacted);
	assert_int_equal(f->p->pa.n_free, sn.n_free + 2); /* the job's fresh pages */
	snap_free(&sn);

	assert_int_equal(compact_gather_start(&f->c, s, &f->pk, &j), 0);
	core_check(f);
	id = s->id;
	session_close(&f->c, s);
	core_check(f);
	compact_job_run(&j);
	assert_int_equal(compact_job_finish(&f->c, &j, &n, &why), -ENOENT);
	core_check(f);
	assert_null(session_get(&f->c, id, CORE_UID, 0));
	assert_int_equal(f->p->n_compact_jobs, 0);
	/* Only the index's full pages are left of it (5 pages of 22). */
	assert_int_equal(f->p->pa.n_free, n_free - 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_window_keeps_the_last_tokens, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sinks_keep_the_first_and_last_tokens, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_importance_keeps_heavy_hitters, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_hierarchy_keeps_permanent_and_hot_turns, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_role_limit_under_a_large_budget, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_compact_twice_and_after_commit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fork_is_not_changed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork_sharing_tokens_is_not_changed, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_lease_reads_the_old_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_long_session_across_chunks, setup_large,
						teardown),
		cmocka_unit_test_setup_teardown(test_refusals_change_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_room_changes_nothing, setup_small,
						teardown),
		cmocka_unit_test_setup_teardown(test_job_on_a_changed_or_closed_session, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
