/* tests/integration/test_prefix.c — sharing prefixes across processes
 * through the prefix index: cross-process reuse with fork, dedup, salts,
 * tenants, the hash chain, fork and truncate, and kvp_list_sessions.
 *
 * K/V here is a function of the whole token prefix (harness_pkv_*), as a
 * model's is: a page shared wrongly — of another branch, another salt,
 * another parent — reads wrong even when its own tokens agree.
 *
 *  - Process A commits a 4,000-token conversation and stays. Process B
 *    matches it and gets every full page (3,968 tokens at 64 a page), forks
 *    a session of its own from the lease at token 2,500 (kvp_lease_fork:
 *    pages shared, the cut page copied, nothing recomputed), appends its own
 *    turn. A's bytes are unchanged, B's are right, and the pool holds one
 *    copy of the shared pages (Stats and kvp_list_sessions say so).
 *  - Two processes that commit the same prefix end up sharing it
 *    (dedup_pages, free pages), also when their commits interleave page by
 *    page.
 *  - A different cache salt, or another user, never matches; a salt is
 *    taken at session creation, inherited by forks, and cleared with n = 0.
 *  - The chain: the same page after a different parent is another page.
 *  - Fork at and between page boundaries, and at 0; truncate for
 *    speculative-decoding rollback and to the middle of a shared page.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "prefix-model"

/* 2 layers, 2 KV heads of 16, 64 tokens a page: 16 KiB pages. */
static const struct kvp_layout big_pages = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 16,
	.block_tokens = 64,
	.dtype = KVP_DTYPE_F16,
};

/* harness_layout: 16 tokens a page. */
#define BT 16u

static struct harness_pool_info info(const struct harness *h, kvp_pool *p)
{
	struct harness_pool_info pi;

	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &pi), 0);
	return pi;
}

/* The kvp_list_sessions entry of session id (through c), copied. */
static int session_info(kvp_client *c, uint64_t pool_id, uint64_t id, struct kvp_session_info *ret)
{
	struct kvp_session_info *all;
	size_t n;
	int found = 0;

	if (kvp_list_sessions(c, pool_id, &all, &n) < 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (all[i].session_id == id) {
			*ret = all[i];
			found = 1;
		}
	free(all);
	return found ? 0 : -1;
}

/* ---- cross-process: a 4,000-token conversation ---------------------------- */

#define CONV_TOKENS 4000u
#define CONV_FULL   3968u /* 62 pages of 64 */
#define FORK_AT	    2500u
#define TURN_TOKENS 300u
#define B_TOKENS    (FORK_AT + TURN_TOKENS)

struct conv {
	struct harness *h;
	uint32_t a[CONV_TOKENS];
	uint32_t b[B_TOKENS]; /* A's first 2,500 tokens, then B's turn */
	int to_parent, from_parent;
	uint64_t a_session, b_session;
};

static int child_say(int fd, uint64_t v)
{
	return write(fd, &v, sizeof(v)) == (ssize_t)sizeof(v) ? 0 : -1;
}

static int child_hear(int fd, uint64_t *v)
{
	return read(fd, v, sizeof(*v)) == (ssize_t)sizeof(*v) ? 0 : -1;
}

static int conv_a(void *arg)
{
	struct conv *cv = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	uint64_t go;

	CHILD_CHECK_EQ(kvp_connect(cv->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &big_pages, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, cv->a, CONV_TOKENS, &s), 0);
	CHILD_CHECK_EQ(child_say(cv->to_parent, kvp_session_id(s)), 0);
	/* B works now; then A reads everything it has again. */
	CHILD_CHECK_EQ(child_hear(cv->from_parent, &go), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, cv->a, 0, CONV_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, cv->a, CONV_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), CONV_FULL);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, cv->a, CONV_FULL), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(child_say(cv->to_parent, 1), 0);
	CHILD_CHECK_EQ(child_hear(cv->from_parent, &go), 0);
	kvp_disconnect(c);
	return 0;
}

static int conv_b(void *arg)
{
	struct conv *cv = arg;
	struct harness_pool_info before, after;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *f;
	kvp_lease *l;
	uint64_t go;

	CHILD_CHECK_EQ(kvp_connect(cv->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &big_pages, &p), 0);
	/* Every full page of A's conversation, with A's bytes. */
	CHILD_CHECK_EQ(kvp_match_prefix(p, cv->a, CONV_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), CONV_FULL);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, cv->a, CONV_FULL), 0);

	/* Continue from A's prefix without copying: a session of B's own
	 * from the lease, at 2,500 (inside page 39, which it copies). */
	CHILD_CHECK_EQ(harness_pool_info(cv->h, kvp_pool_id(p), &before), 0);
	CHILD_CHECK_EQ(kvp_lease_fork(l, CONV_FULL + 1, &f), -ERANGE);
	CHILD_CHECK_EQ(kvp_lease_fork(l, FORK_AT, &f), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(harness_pool_info(cv->h, kvp_pool_id(p), &after), 0);
	CHILD_CHECK_EQ(before.free_pages - after.free_pages, 1); /* the copied page */
	CHILD_CHECK_EQ(after.dedup_pages, before.dedup_pages);
	CHILD_CHECK_EQ(kvp_session_tokens(f), FORK_AT);
	CHILD_CHECK_EQ(kvp_session_committed(f), FORK_AT);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, f, cv->b, 0, FORK_AT), 0);
	CHILD_CHECK_EQ(kvp_append(f, cv->b + FORK_AT, TURN_TOKENS), 0);
	CHILD_CHECK_EQ(harness_pkv_write_session(p, f, cv->b, FORK_AT, B_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_commit(f, TURN_TOKENS), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, f, cv->b, 0, B_TOKENS), 0);
	CHILD_CHECK_EQ(child_say(cv->to_parent, kvp_session_id(f)), 0);
	CHILD_CHECK_EQ(child_hear(cv->from_parent, &go), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_cross_process_fork(void **state)
{
	struct conv *cv = calloc(1, sizeof(*cv));
	int up[2], down_a[2], down_b[2];
	struct harness_pool_info pi;
	struct kvp_session_info si;
	pid_t pa, pb;
	uint64_t v;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	assert_non_null(cv);
	cv->h = *state;
	harness_tokens(cv->a, CONV_TOKENS, 200, 0);
	memcpy(cv->b, cv->a, FORK_AT * sizeof(uint32_t));
	harness_tokens(cv->b + FORK_AT, TURN_TOKENS, 201, 0);
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down_a), 0);
	assert_int_equal(pipe(down_b), 0);
	assert_int_equal(kvp_connect(cv->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &big_pages, &p), 0);

	cv->to_parent = up[1];
	cv->from_parent = down_a[0];
	pa = harness_fork(conv_a, cv);
	assert_true(pa > 0);
	assert_int_equal(read(up[0], &cv->a_session, sizeof(v)), sizeof(v));
	pi = info(cv->h, p);
	assert_int_equal(pi.indexed_pages, 62);
	assert_int_equal(pi.n_pages - pi.free_pages, 63);

	cv->from_parent = down_b[0];
	pb = harness_fork(conv_b, cv);
	assert_true(pb > 0);
	assert_int_equal(read(up[0], &cv->b_session, sizeof(v)), sizeof(v));

	/* One copy of what they share: A's 63 pages, and B's own pages 39
	 * (its copy of A's partial-to-B page, now full) to 43 — not the 107
	 * the two sessions' tables list. */
	pi = info(cv->h, p);
	assert_int_equal(pi.n_pages - pi.free_pages, 63 + 5);
	assert_int_equal(pi.indexed_pages, 62 + 4);
	assert_int_equal(pi.dedup_pages, 0);
	assert_int_equal(pi.n_sessions, 2);
	assert_int_equal(session_info(c, kvp_pool_id(p), cv->a_session, &si), 0);
	assert_int_equal(si.n_tokens, CONV_TOKENS);
	assert_int_equal(si.n_pages, 63);
	assert_int_equal(si.shared_pages, 62);
	assert_int_equal(session_info(c, kvp_pool_id(p), cv->b_session, &si), 0);
	assert_int_equal(si.n_tokens, B_TOKENS);
	assert_int_equal(si.committed_tokens, B_TOKENS);
	assert_int_equal(si.n_pages, 44);
	assert_int_equal(si.shared_pages, 43);
	assert_false(si.writing);

	/* A's bytes are unchanged, seen by A itself. */
	v = 1;
	assert_int_equal(write(down_a[1], &v, sizeof(v)), sizeof(v));
	assert_int_equal(read(up[0], &v, sizeof(v)), sizeof(v));

	/* A third party finds both conversations, each with its own bytes. */
	assert_int_equal(kvp_match_prefix(p, cv->b, B_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), B_TOKENS / 64 * 64);
	assert_int_equal(harness_pkv_check_lease(l, p, cv->b, B_TOKENS / 64 * 64), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, cv->a, CONV_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), CONV_FULL);
	assert_int_equal(harness_pkv_check_lease(l, p, cv->a, CONV_FULL), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	assert_int_equal(write(down_a[1], &v, sizeof(v)), sizeof(v));
	assert_int_equal(write(down_b[1], &v, sizeof(v)), sizeof(v));
	assert_int_equal(harness_wait(pa, 60), 0);
	assert_int_equal(harness_wait(pb, 60), 0);
	kvp_disconnect(c);
	for (int i = 0; i < 2; i++) {
		close(up[i]);
		close(down_a[i]);
		close(down_b[i]);
	}
	free(cv);
}

/* ---- dedup ------------------------------------------------------------------- */

#define DEDUP_TOKENS 1000u /* 62 full pages of 16 and 8 tokens */

struct dedup_ctx {
	struct harness *h;
	uint32_t tokens[DEDUP_TOKENS];
	int to_parent, from_parent;
};

/* Commits the shared prefix in a session of its own, checks it reads its
 * bytes (through the indexed copies when it came second), reports, and
 * waits before leaving. */
static int dedup_child(void *arg)
{
	struct dedup_ctx *d = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	uint64_t go;

	CHILD_CHECK_EQ(kvp_connect(d->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, d->tokens, DEDUP_TOKENS, &s), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, d->tokens, 0, DEDUP_TOKENS), 0);
	CHILD_CHECK_EQ(child_say(d->to_parent, kvp_session_id(s)), 0);
	CHILD_CHECK_EQ(child_hear(d->from_parent, &go), 0);
	/* The other one has closed its session by now. */
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, d->tokens, 0, DEDUP_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_dedup_two_processes(void **state)
{
	struct dedup_ctx *d = calloc(1, sizeof(*d));
	int up[2], down1[2], down2[2];
	struct harness_pool_info pi;
	struct kvp_session_info si;
	uint64_t id1, id2, v = 1;
	pid_t p1, p2;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	assert_non_null(d);
	d->h = *state;
	harness_tokens(d->tokens, DEDUP_TOKENS, 210, 0);
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down1), 0);
	assert_int_equal(pipe(down2), 0);
	assert_int_equal(kvp_connect(d->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);

	d->to_parent = up[1];
	d->from_parent = down1[0];
	p1 = harness_fork(dedup_child, d);
	assert_int_equal(read(up[0], &id1, sizeof(v)), sizeof(v));
	d->from_parent = down2[0];
	p2 = harness_fork(dedup_child, d);
	assert_int_equal(read(up[0], &id2, sizeof(v)), sizeof(v));

	/* 63 + 63 pages in their tables, 64 in the pool: the second one's
	 * 62 full pages were replaced by the first one's. */
	pi = info(d->h, p);
	assert_int_equal(pi.dedup_pages, 62);
	assert_int_equal(pi.n_pages - pi.free_pages, 64);
	assert_int_equal(pi.indexed_pages, 62);
	assert_int_equal(pi.reserved_pages, 0);
	assert_int_equal(session_info(c, kvp_pool_id(p), id1, &si), 0);
	assert_int_equal(si.shared_pages, 62);
	assert_int_equal(session_info(c, kvp_pool_id(p), id2, &si), 0);
	assert_int_equal(si.shared_pages, 62);
	assert_int_equal(si.n_pages, 63);

	/* The first one goes; the second keeps reading the shared pages. */
	assert_int_equal(write(down1[1], &v, sizeof(v)), sizeof(v));
	assert_int_equal(harness_wait(p1, 60), 0);
	assert_int_equal(write(down2[1], &v, sizeof(v)), sizeof(v));
	assert_int_equal(harness_wait(p2, 60), 0);

	/* Both gone: the index keeps one copy. */
	pi = info(d->h, p);
	assert_int_equal(pi.n_pages - pi.free_pages, 62);
	assert_int_equal(pi.n_sessions, 0);
	assert_int_equal(kvp_match_prefix(p, d->tokens, DEDUP_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 992);
	assert_int_equal(harness_pkv_check_lease(l, p, d->tokens, 992), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	/* A third commits 500 of them and a tail of its own: the 31 pages
	 * inside the 500 are shared. */
	{
		uint32_t mixed[700];
		kvp_session *s;

		memcpy(mixed, d->tokens, 500 * sizeof(uint32_t));
		harness_tokens(mixed + 500, 200, 211, 0);
		assert_int_equal(harness_pkv_commit_session(p, mixed, 700, &s), 0);
		pi = info(d->h, p);
		assert_int_equal(pi.dedup_pages, 62 + 31);
		assert_int_equal(pi.n_pages - pi.free_pages, 62 + 44 - 31);
		assert_int_equal(harness_pkv_check_session(p, s, mixed, 0, 700), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	kvp_disconnect(c);
	for (int i = 0; i < 2; i++) {
		close(up[i]);
		close(down1[i]);
		close(down2[i]);
	}
	free(d);
}

/* Two clients write the same tokens page by page, taking turns at being
 * first to commit each page: every page is stored once, each session
 * reads right through whichever copy it ended up with. */
static void test_dedup_interleaved(void **state)
{
	struct harness *h = *state;
	enum { PAGES = 40 };
	uint32_t tokens[PAGES * BT];
	struct harness_pool_info before, pi;
	kvp_client *c1, *c2;
	kvp_pool *p1, *p2;
	kvp_session *s1, *s2;

	harness_tokens(tokens, PAGES * BT, 212, 0);
	assert_int_equal(kvp_connect(h->sock, &c1), 0);
	assert_int_equal(kvp_connect(h->sock, &c2), 0);
	assert_int_equal(kvp_pool_open(c1, MODEL, &harness_layout, &p1), 0);
	assert_int_equal(kvp_pool_open(c2, MODEL, &harness_layout, &p2), 0);
	before = info(h, p1);
	assert_int_equal(kvp_session_create(p1, &s1), 0);
	assert_int_equal(kvp_session_create(p2, &s2), 0);
	for (uint32_t i = 0; i < PAGES; i++) {
		kvp_session *first = i % 2 ? s2 : s1, *second = i % 2 ? s1 : s2;
		kvp_pool *pf = i % 2 ? p2 : p1, *ps = i % 2 ? p1 : p2;
		const uint32_t *page = tokens + i * BT;

		/* Both reserve and write before either commits. */
		assert_int_equal(kvp_append(first, page, BT), 0);
		assert_int_equal(kvp_append(second, page, BT), 0);
		assert_int_equal(harness_pkv_write_session(pf, first, tokens, i * BT, (i + 1) * BT),
				 0);
		assert_int_equal(
			harness_pkv_write_session(ps, second, tokens, i * BT, (i + 1) * BT), 0);
		/* The first commits in two steps: the page enters the index
		 * when its last token does. */
		assert_int_equal(kvp_commit(first, BT / 2), 0);
		assert_int_equal(kvp_commit(first, BT / 2), 0);
		assert_int_equal(kvp_commit(second, BT), 0);
	}
	pi = info(h, p1);
	assert_int_equal(pi.dedup_pages - before.dedup_pages, PAGES);
	assert_int_equal(before.free_pages - pi.free_pages, PAGES);
	assert_int_equal(harness_pkv_check_session(p1, s1, tokens, 0, PAGES * BT), 0);
	assert_int_equal(harness_pkv_check_session(p2, s2, tokens, 0, PAGES * BT), 0);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
}

/* ---- the hash chain ------------------------------------------------------------ */

/* The same tokens after a different first page are a different page: not
 * deduplicated, not matched, and they read their own bytes. */
static void test_chain_parent_matters(void **state)
{
	struct harness *h = *state;
	uint32_t x[2 * BT], y[2 * BT], z[2 * BT];
	struct harness_pool_info before, pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *sx, *sy, *sz;
	kvp_lease *l;

	harness_tokens(x, 2 * BT, 220, 0);
	memcpy(y, x, sizeof(y));
	y[3] ^= 1; /* another first page, the same second page */
	memcpy(z, x, sizeof(z));
	z[BT + 3] ^= 1; /* the same first page, another second page */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	before = info(h, p);
	assert_int_equal(harness_pkv_commit_session(p, x, 2 * BT, &sx), 0);
	assert_int_equal(kvp_match_prefix(p, y, 2 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(harness_pkv_commit_session(p, y, 2 * BT, &sy), 0);
	pi = info(h, p);
	assert_int_equal(pi.dedup_pages, before.dedup_pages);
	assert_int_equal(pi.indexed_pages - before.indexed_pages, 4);
	assert_int_equal(harness_pkv_commit_session(p, z, 2 * BT, &sz), 0);
	pi = info(h, p);
	assert_int_equal(pi.dedup_pages - before.dedup_pages, 1);
	assert_int_equal(pi.indexed_pages - before.indexed_pages, 5);
	assert_int_equal(kvp_match_prefix(p, y, 2 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 2 * BT);
	assert_int_equal(harness_pkv_check_lease(l, p, y, 2 * BT), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, z, 2 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 2 * BT);
	assert_int_equal(harness_pkv_check_lease(l, p, z, 2 * BT), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
}

/* ---- salts and tenants -------------------------------------------------------- */

static void expect_match(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t want)
{
	kvp_lease *l;

	assert_int_equal(kvp_match_prefix(p, tokens, n, &l), 0);
	if (kvp_lease_tokens(l) != want)
		fail_msg("matched %llu of %zu tokens, expected %llu",
			 (unsigned long long)kvp_lease_tokens(l), n, (unsigned long long)want);
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, want), 0);
	assert_int_equal(kvp_lease_release(l), 0);
}

static void test_salts(void **state)
{
	struct harness *h = *state;
	static const char salt_a[] = "tenant-a", salt_b[] = "tenant-b";
	uint8_t salt65[65];
	uint32_t x[200], fx[240];
	struct harness_pool_info before, pi;
	kvp_client *c, *d;
	kvp_pool *p0, *pa, *pb, *qa;
	kvp_session *s0, *sa, *sf;

	memset(salt65, 7, sizeof(salt65));
	harness_tokens(x, 200, 230, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p0), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &pa), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &pb), 0);
	assert_int_equal(kvp_pool_id(pa), kvp_pool_id(p0));
	assert_int_equal(kvp_pool_set_salt(pa, salt_a, strlen(salt_a)), 0);
	assert_int_equal(kvp_pool_set_salt(pb, salt_b, strlen(salt_b)), 0);
	assert_int_equal(kvp_pool_set_salt(pb, salt65, 65), -EINVAL);

	/* Unsalted pages: not found under a salt, even one page of them. */
	assert_int_equal(harness_pkv_commit_session(p0, x, 200, &s0), 0);
	expect_match(p0, x, 200, 192);
	expect_match(pa, x, 200, 0);
	expect_match(pb, x, 16, 0);

	/* The same tokens under salt a (another client): a copy of their
	 * own, not deduplicated against the unsalted one. */
	before = info(h, p0);
	assert_int_equal(kvp_connect(h->sock, &d), 0);
	assert_int_equal(kvp_pool_open(d, MODEL, &harness_layout, &qa), 0);
	assert_int_equal(kvp_pool_set_salt(qa, salt_a, strlen(salt_a)), 0);
	assert_int_equal(harness_pkv_commit_session(qa, x, 200, &sa), 0);
	pi = info(h, p0);
	assert_int_equal(pi.dedup_pages, before.dedup_pages);
	assert_int_equal(pi.indexed_pages - before.indexed_pages, 12);
	expect_match(pa, x, 200, 192);
	expect_match(qa, x, 200, 192);
	expect_match(pb, x, 200, 0);
	expect_match(p0, x, 200, 192);
	/* pb kept salt b after the refused 65-byte salt. */
	assert_int_equal(kvp_pool_set_salt(pb, salt65, 64), 0);
	expect_match(pb, x, 200, 0);
	/* n = 0 clears the salt: unsalted again. */
	assert_int_equal(kvp_pool_set_salt(pb, NULL, 0), 0);
	expect_match(pb, x, 200, 192);

	/* A session keeps the salt it was created with; its forks too. */
	assert_int_equal(kvp_session_create(qa, &sf), 0);
	assert_int_equal(kvp_pool_set_salt(qa, salt_b, strlen(salt_b)), 0);
	memcpy(fx, x, 100 * sizeof(uint32_t));
	harness_tokens(fx + 100, 140, 231, 0);
	assert_int_equal(kvp_append(sf, fx, 100), 0);
	assert_int_equal(harness_pkv_write_session(qa, sf, fx, 0, 100), 0);
	assert_int_equal(kvp_commit(sf, 100), 0);
	{
		kvp_session *fork;

		assert_int_equal(kvp_session_fork(sf, 100, &fork), 0);
		assert_int_equal(kvp_append(fork, fx + 100, 140), 0);
		assert_int_equal(harness_pkv_write_session(qa, fork, fx, 100, 240), 0);
		assert_int_equal(kvp_commit(fork, 140), 0);
		assert_int_equal(kvp_session_close(fork), 0);
	}
	expect_match(pa, fx, 240, 240);
	expect_match(qa, fx, 240, 0); /* qa is on salt b now */
	expect_match(p0, fx, 240, 96);
	kvp_disconnect(d);
	kvp_disconnect(c);
}

struct tenant_ctx {
	struct harness *h;
	uint32_t x[200];
	uint64_t root_pool, root_session;
};

/* As uid 65534: the same model, layout, tokens and salt as root's
 * session, and nothing of root's is found, deduplicated or reachable. */
static int other_tenant(void *arg)
{
	struct tenant_ctx *t = arg;
	struct kvp_session_info *all;
	kvp_client *c;
	kvp_pool *p, *ps;
	kvp_session *s;
	kvp_lease *l;
	struct raw r;
	size_t n;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &ps), 0);
	CHILD_CHECK(kvp_pool_id(p) != t->root_pool);
	CHILD_CHECK_EQ(kvp_pool_set_salt(ps, "shared-salt", 11), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, t->x, 200, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(ps, t->x, 200, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	/* Its own copy, in its own pool: no dedup against root's. */
	CHILD_CHECK_EQ(harness_pkv_commit_session(ps, t->x, 200, &s), 0);
	{
		struct harness_pool_info pi;

		CHILD_CHECK_EQ(harness_pool_info(t->h, kvp_pool_id(p), &pi), 0);
		CHILD_CHECK_EQ(pi.dedup_pages, 0);
		CHILD_CHECK_EQ(pi.indexed_pages, 12);
		CHILD_CHECK_EQ(harness_pool_info(t->h, t->root_pool, &pi), -ENOENT);
	}
	/* Only its own sessions are listed, whatever pool it names. */
	CHILD_CHECK_EQ(kvp_list_sessions(c, 0, &all, &n), 0);
	CHILD_CHECK_EQ(n, 1);
	CHILD_CHECK_EQ(all[0].session_id, kvp_session_id(s));
	free(all);
	CHILD_CHECK_EQ(kvp_list_sessions(c, t->root_pool, &all, &n), 0);
	CHILD_CHECK_EQ(n, 0);
	free(all);
	kvp_disconnect(c);

	/* Root's session by id: not there. */
	CHILD_CHECK_EQ(raw_open(&r, t->h->sock), 0);
	CHILD_CHECK_EQ(raw_hello(&r), 0);
	{
		Kvpalace__V1__Request req;
		Kvpalace__V1__ForkRequest fk;
		Kvpalace__V1__TruncateRequest tr;
		Kvpalace__V1__SessionPagesRequest sp;
		Kvpalace__V1__Response *resp;

		raw_req_fork(&req, &fk, t->root_session, 16);
		CHILD_CHECK_EQ(raw_call(&r, &req, &resp, NULL), 1);
		CHILD_CHECK_EQ(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
		raw_req_truncate(&req, &tr, t->root_session, 0);
		CHILD_CHECK_EQ(raw_call(&r, &req, &resp, NULL), 1);
		CHILD_CHECK_EQ(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
		raw_req_session_pages(&req, &sp, t->root_session, 0);
		CHILD_CHECK_EQ(raw_call(&r, &req, &resp, NULL), 1);
		CHILD_CHECK_EQ(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
	}
	CHILD_CHECK_EQ(raw_close_session(&r, t->root_session), -ENOENT);
	raw_close(&r);
	return 0;
}

static void test_other_uid_never_matches(void **state)
{
	struct tenant_ctx t = {.h = *state};
	struct harness_pool_info before, pi;
	kvp_client *c;
	kvp_pool *p, *ps;
	kvp_session *s, *ss;

	if (geteuid() != 0)
		skip(); /* needs root to become another user */
	harness_tokens(t.x, 200, 240, 0);
	assert_int_equal(kvp_connect(t.h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &ps), 0);
	assert_int_equal(kvp_pool_set_salt(ps, "shared-salt", 11), 0);
	assert_int_equal(harness_pkv_commit_session(p, t.x, 200, &s), 0);
	assert_int_equal(harness_pkv_commit_session(ps, t.x, 200, &ss), 0);
	t.root_pool = kvp_pool_id(p);
	t.root_session = kvp_session_id(s);
	before = info(t.h, p);
	assert_int_equal(harness_run_child(other_tenant, &t), 0);
	/* Root's pool did not change; its data is still root's. */
	pi = info(t.h, p);
	assert_int_equal(pi.dedup_pages, before.dedup_pages);
	assert_int_equal(pi.indexed_pages, before.indexed_pages);
	assert_int_equal(pi.n_sessions, 2);
	expect_match(p, t.x, 200, 192);
	expect_match(ps, t.x, 200, 192);
	kvp_disconnect(c);
}

/* ---- fork and truncate ----------------------------------------------------- */

static void test_fork(void **state)
{
	struct harness *h = *state;
	uint32_t x[130], y[130], z[80];
	struct harness_pool_info before, pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *f, *g, *e;

	harness_tokens(x, 130, 250, 0);
	memcpy(y, x, 100 * sizeof(uint32_t));
	harness_tokens(y + 100, 30, 251, 0);
	memcpy(z, x, 50 * sizeof(uint32_t));
	harness_tokens(z + 50, 30, 252, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	/* 100 committed tokens: 6 full pages and 4 tokens. */
	assert_int_equal(harness_pkv_commit_session(p, x, 100, &s), 0);
	before = info(h, p);

	/* At a page boundary: nothing is copied. */
	assert_int_equal(kvp_session_fork(s, 96, &f), 0);
	pi = info(h, p);
	assert_int_equal(pi.free_pages, before.free_pages);
	assert_int_equal(pi.n_sessions, before.n_sessions + 1);
	assert_int_equal(harness_pkv_check_session(p, f, x, 0, 96), 0);
	assert_null(kvp_session_kv(f, 96, 0, 0, 0));
	assert_int_equal(kvp_session_close(f), 0);

	/* Inside the partial last page: that page is copied. Both go on
	 * differently from token 100; neither sees the other's tokens. */
	assert_int_equal(kvp_session_fork(s, 100, &f), 0);
	pi = info(h, p);
	assert_int_equal(before.free_pages - pi.free_pages, 1);
	assert_int_equal(kvp_append(f, y + 100, 30), 0);
	assert_int_equal(harness_pkv_write_session(p, f, y, 100, 130), 0);
	assert_int_equal(kvp_append(s, x + 100, 30), 0);
	assert_int_equal(harness_pkv_write_session(p, s, x, 100, 130), 0);
	assert_int_equal(kvp_commit(f, 30), 0);
	assert_int_equal(kvp_commit(s, 30), 0);
	assert_int_equal(harness_pkv_check_session(p, f, y, 0, 130), 0);
	assert_int_equal(harness_pkv_check_session(p, s, x, 0, 130), 0);
	expect_match(p, x, 130, 128);
	expect_match(p, y, 130, 128);

	/* Inside a full, indexed page: the fork writes its copy, never the
	 * indexed page. */
	assert_int_equal(kvp_session_fork(s, 50, &g), 0);
	assert_int_equal(kvp_append(g, z + 50, 30), 0);
	assert_int_equal(harness_pkv_write_session(p, g, z, 50, 80), 0);
	assert_int_equal(kvp_commit(g, 30), 0);
	assert_int_equal(harness_pkv_check_session(p, g, z, 0, 80), 0);
	assert_int_equal(harness_pkv_check_session(p, s, x, 0, 130), 0);
	expect_match(p, x, 130, 128);
	expect_match(p, z, 80, 80);

	/* At 0: an empty session; past the committed tokens: -ERANGE. */
	assert_int_equal(kvp_session_fork(s, 0, &e), 0);
	assert_int_equal(kvp_session_tokens(e), 0);
	assert_int_equal(kvp_append(e, z, 20), 0);
	assert_int_equal(harness_pkv_write_session(p, e, z, 0, 20), 0);
	assert_int_equal(kvp_commit(e, 20), 0);
	assert_int_equal(kvp_session_fork(s, 131, &f), -ERANGE);
	assert_int_equal(kvp_append(e, z + 20, 10), 0);
	assert_int_equal(kvp_session_fork(e, 21, &f), -ERANGE);
	assert_int_equal(kvp_session_fork(e, 20, &f), 0);
	assert_int_equal(kvp_session_committed(f), 20);
	assert_int_equal(kvp_session_close(f), 0);
	/* A session that never held a token forks too. */
	{
		kvp_session *empty, *ef;

		assert_int_equal(kvp_session_create(p, &empty), 0);
		assert_int_equal(kvp_session_fork(empty, 0, &ef), 0);
		assert_int_equal(kvp_session_tokens(ef), 0);
		assert_int_equal(kvp_session_close(ef), 0);
		assert_int_equal(kvp_session_close(empty), 0);
	}

	/* The source goes; the forks keep reading their shared pages. */
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_pkv_check_session(p, g, z, 0, 80), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

static void test_truncate(void **state)
{
	struct harness *h = *state;
	uint32_t x[120], y[120], draft[8];
	struct harness_pool_info before, pi;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(x, 120, 260, 0);
	memcpy(y, x, 40 * sizeof(uint32_t));
	harness_tokens(y + 40, 80, 261, 0);
	harness_tokens(draft, 8, 262, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, x, 100, &s), 0);
	before = info(h, p);

	/* Speculative decoding: 8 draft tokens, 3 accepted. */
	{
		uint32_t seq[108];

		memcpy(seq, x, 100 * sizeof(uint32_t));
		memcpy(seq + 100, draft, sizeof(draft));
		assert_int_equal(kvp_append(s, draft, 8), 0);
		assert_int_equal(harness_pkv_write_session(p, s, seq, 100, 108), 0);
		assert_int_equal(kvp_truncate(s, 103), 0);
		assert_int_equal(kvp_session_tokens(s), 103);
		assert_int_equal(kvp_session_committed(s), 100);
		assert_null(kvp_session_kv(s, 103, 0, 0, 0));
		assert_int_equal(kvp_commit(s, 3), 0);
		assert_int_equal(harness_pkv_check_session(p, s, seq, 0, 103), 0);
		/* Rolling back everything uncommitted and more. */
		assert_int_equal(kvp_append(s, draft, 5), 0);
		assert_int_equal(kvp_truncate(s, 100), 0);
		assert_int_equal(kvp_session_committed(s), 100);
		pi = info(h, p);
		assert_int_equal(pi.free_pages, before.free_pages);
		assert_int_equal(pi.reserved_pages, 0);
		assert_int_equal(harness_pkv_check_session(p, s, x, 0, 100), 0);
	}

	/* An edit at token 40, inside the full (indexed) page 2: that page
	 * is copied, the index keeps the original chain, and the edited
	 * conversation is a branch of its own. */
	assert_int_equal(kvp_truncate(s, 40), 0);
	assert_int_equal(kvp_session_committed(s), 40);
	pi = info(h, p);
	/* 7 pages held before; now 3 (page 2 a copy) plus pages 2..5 the
	 * index keeps; page 6 (partial) came back. */
	assert_int_equal(pi.free_pages, before.free_pages);
	assert_int_equal(pi.indexed_pages, before.indexed_pages);
	expect_match(p, x, 100, 96);
	assert_int_equal(harness_pkv_check_session(p, s, x, 0, 40), 0);
	assert_int_equal(kvp_append(s, y + 40, 80), 0);
	assert_int_equal(harness_pkv_write_session(p, s, y, 40, 120), 0);
	assert_int_equal(kvp_commit(s, 80), 0);
	assert_int_equal(harness_pkv_check_session(p, s, y, 0, 120), 0);
	expect_match(p, y, 120, 112);
	expect_match(p, x, 100, 96);

	/* At a page boundary nothing is copied; to 0 nothing is left. */
	pi = info(h, p);
	assert_int_equal(kvp_truncate(s, 32), 0);
	assert_int_equal(info(h, p).free_pages, pi.free_pages + 1); /* its partial page 7 */
	assert_int_equal(kvp_truncate(s, 33), -ERANGE);
	assert_int_equal(kvp_truncate(s, 0), 0);
	assert_int_equal(kvp_session_tokens(s), 0);
	assert_null(kvp_session_kv(s, 0, 0, 0, 0));
	assert_int_equal(kvp_append(s, x, 20), 0);
	assert_int_equal(harness_pkv_write_session(p, s, x, 0, 20), 0);
	assert_int_equal(kvp_commit(s, 20), 0);
	/* The first page came back from the index (dedup). */
	assert_int_equal(harness_pkv_check_session(p, s, x, 0, 20), 0);
	kvp_disconnect(c);
}

/* kvp_list_sessions: every field, the pool filter, id order. */
/* ---- a long prompt through the default message cap ----------------------- */

/* 40,007 tokens: 2,500 full pages and 7 tokens more, matched in four
 * chunks of the default cap (some 13,000 tokens each) that the library
 * keeps in flight together. */
#define LONG_TOKENS 40007u
#define LONG_FULL   40000u
#define LONG_EXTRA  5000u

/* A query that agrees with A's prompt up to token `at` (and differs there)
 * matches the whole pages before the page holding `at`, each with A's
 * bytes: never a page past the first difference, wherever it falls
 * relative to the chunks. */
static void long_mismatch(kvp_pool *p, const uint32_t *a, uint32_t *q, size_t at)
{
	kvp_lease *l;

	memcpy(q, a, LONG_TOKENS * sizeof(uint32_t));
	q[at] ^= 0x5555;
	assert_int_equal(kvp_match_prefix(p, q, LONG_TOKENS, &l), 0);
	if (kvp_lease_tokens(l) != at / BT * BT)
		fail_msg("a difference at token %zu matched %llu tokens", at,
			 (unsigned long long)kvp_lease_tokens(l));
	assert_int_equal(harness_pkv_check_lease(l, p, q, at / BT * BT), 0);
	assert_int_equal(kvp_lease_release(l), 0);
}

static void test_long_prompt(void **state)
{
	/* Inside chunk 1, at the first token of chunk 2 (13,052 tokens a
	 * chunk), inside chunk 2, inside the last chunk and in the last
	 * full page. */
	static const size_t at[] = {13060, 26104, 30001, 39160, 39999};
	struct harness *h = *state;
	uint32_t *a = malloc((LONG_TOKENS + LONG_EXTRA) * sizeof(uint32_t));
	uint32_t *q = malloc(LONG_TOKENS * sizeof(uint32_t));
	kvp_client *ca, *cb;
	kvp_pool *pa, *pb;
	kvp_session *s, *f;
	kvp_lease *l;

	assert_non_null(a);
	assert_non_null(q);
	harness_tokens(a, LONG_TOKENS + LONG_EXTRA, 23, 0);
	assert_int_equal(kvp_connect(h->sock, &ca), 0);
	assert_int_equal(kvp_pool_open(ca, MODEL, &harness_layout, &pa), 0);
	assert_int_equal(harness_pkv_commit_session(pa, a, LONG_TOKENS, &s), 0);

	/* Another client matches the whole prompt and more: every full page,
	 * the 7 tokens of the last one left out, nothing of what follows. */
	assert_int_equal(kvp_connect(h->sock, &cb), 0);
	assert_int_equal(kvp_pool_open(cb, MODEL, &harness_layout, &pb), 0);
	assert_int_equal(kvp_match_prefix(pb, a, LONG_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), LONG_FULL);
	assert_int_equal(harness_pkv_check_lease(l, pb, a, LONG_FULL), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(pb, a, LONG_TOKENS + LONG_EXTRA, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), LONG_FULL);
	assert_int_equal(harness_pkv_check_lease(l, pb, a, LONG_FULL), 0);

	/* A session forked from the lease late in the prompt has the
	 * prompt's tokens (the lease kept them) and bytes; what it appends
	 * is matched after them. */
	assert_int_equal(kvp_lease_fork(l, 33333, &f), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_session_tokens(f), 33333);
	assert_int_equal(harness_pkv_check_session(pb, f, a, 0, 33333), 0);
	memcpy(q, a, 33333 * sizeof(uint32_t));
	harness_tokens(q + 33333, 35, 24, 33333);
	assert_int_equal(kvp_append(f, q + 33333, 35), 0);
	assert_int_equal(harness_pkv_write_session(pb, f, q, 33333, 33368), 0);
	assert_int_equal(kvp_commit(f, 35), 0);
	assert_int_equal(kvp_match_prefix(pa, q, 33368, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 33360);
	assert_int_equal(harness_pkv_check_lease(l, pa, q, 33360), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_session_close(f), 0);

	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
		long_mismatch(pb, a, q, at[i]);

	assert_int_equal(kvp_session_close(s), 0);
	kvp_pool_close(pb);
	kvp_disconnect(cb);
	kvp_pool_close(pa);
	kvp_disconnect(ca);
	free(a);
	free(q);
}

static void test_list_sessions(void **state)
{
	struct harness *h = *state;
	uint32_t x[40];
	struct kvp_session_info *all;
	size_t n;
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s1, *s2, *s3;

	harness_tokens(x, 40, 270, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, "prefix-model-2", &harness_layout, &q), 0);
	assert_int_equal(harness_pkv_commit_session(p, x, 40, &s1), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, x, 40), 0);
	assert_int_equal(harness_pkv_write_session(p, s2, x, 0, 40), 0);
	assert_int_equal(kvp_commit(s2, 20), 0);
	assert_int_equal(kvp_session_create(q, &s3), 0);

	assert_int_equal(kvp_list_sessions(c, kvp_pool_id(p), &all, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(all[0].session_id, kvp_session_id(s1));
	assert_int_equal(all[0].pool_id, kvp_pool_id(p));
	assert_int_equal(all[0].uid, getuid());
	assert_int_equal(all[0].n_tokens, 40);
	assert_int_equal(all[0].committed_tokens, 40);
	assert_int_equal(all[0].n_pages, 3);
	assert_int_equal(all[0].shared_pages, 2);
	assert_false(all[0].writing);
	assert_int_equal(all[1].session_id, kvp_session_id(s2));
	assert_int_equal(all[1].n_tokens, 40);
	assert_int_equal(all[1].committed_tokens, 20);
	assert_int_equal(all[1].n_pages, 3);
	assert_int_equal(all[1].shared_pages, 1); /* its first page, deduplicated */
	assert_true(all[1].writing);
	assert_true(all[1].idle_ms < 60000);
	free(all);
	assert_int_equal(kvp_list_sessions(c, 0, &all, &n), 0);
	assert_int_equal(n, 3);
	for (size_t i = 1; i < n; i++)
		assert_true(all[i].session_id > all[i - 1].session_id);
	assert_int_equal(all[2].pool_id, kvp_pool_id(q));
	assert_int_equal(all[2].n_tokens, 0);
	free(all);
	/* idle_ms counts from the last use. */
	usleep(30000);
	assert_int_equal(kvp_list_sessions(c, kvp_pool_id(q), &all, &n), 0);
	assert_int_equal(n, 1);
	assert_true(all[0].idle_ms >= 20);
	free(all);
	kvp_disconnect(c);
}

/* 16384 pages of 4 KiB: room for every test, and a quick page-accounting
 * check after every request in the -Ddebug-checks build. */
static int start(void **state)
{
	static const char *const extra[] = {"--host-pool-size", "64M", NULL};

	return harness_setup_args(state, extra);
}

#define T(f) cmocka_unit_test_setup_teardown(f, start, harness_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_cross_process_fork),
		T(test_dedup_two_processes),
		T(test_dedup_interleaved),
		T(test_chain_parent_matters),
		T(test_salts),
		T(test_other_uid_never_matches),
		T(test_fork),
		T(test_truncate),
		T(test_list_sessions),
		T(test_long_prompt),
	};

	return cmocka_run_group_tests_name("prefix", tests, NULL, NULL);
}
