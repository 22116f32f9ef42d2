/* tests/integration/test_policy.c — context-cache policies on a real
 * daemon: window, sinks, importance (reported and computed by the daemon),
 * the permanent/hot/temporary hierarchy with tags, per-role limits,
 * auto-compaction at commit, and what a compacted session does with
 * forks, checkpoints and the prefix index.
 *
 * K/V rows are keyed by (token id, original position) (harness_kv_fill),
 * so after a compaction the row at index i must be the one written for the
 * original position kvp_session_meta reports for i: a token copied from the
 * wrong place, or a wrong position, reads wrong. Every expectation of which
 * tokens are kept is computed here by hand from the rules in
 * daemon/base/policy.h, not by calling the daemon's code.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "policy-model"
#define BT    16u /* harness_layout */
#define N     200u

struct fixture {
	struct harness *h;
	kvp_client *c;
	kvp_pool *p;
	uint32_t tokens[4096];
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f || harness_setup((void **)&f->h) < 0)
		return -1;
	if (kvp_connect(f->h->sock, &f->c) < 0 ||
	    kvp_pool_open(f->c, MODEL, &harness_layout, &f->p) < 0)
		return -1;
	harness_tokens(f->tokens, 4096, 7, 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	int ret;

	kvp_disconnect(f->c);
	ret = harness_teardown((void **)&f->h);
	free(f);
	return ret;
}

/* A session of f->tokens[0..n), K/V written and committed. */
static kvp_session *make_session(struct fixture *f, uint32_t n)
{
	kvp_session *s;

	assert_int_equal(harness_commit_session(f->p, f->tokens, n, &s), 0);
	return s;
}

/* Asserts that s holds exactly the original positions want[0..n_want), in
 * order, and that every row of every kept token is the one written for
 * its original position. */
static void assert_kept(struct fixture *f, kvp_session *s, const uint32_t *want, size_t n_want)
{
	struct kvp_token_info *m = calloc(n_want ? n_want : 1, sizeof(*m));
	const struct kvp_layout *l = &harness_layout;

	assert_non_null(m);
	assert_int_equal(kvp_session_tokens(s), n_want);
	assert_int_equal(kvp_session_committed(s), n_want);
	assert_int_equal(kvp_session_meta(s, 0, n_want, m), 0);
	for (size_t i = 0; i < n_want; i++) {
		if (m[i].pos != want[i])
			fail_msg("kept token %zu: position %u, expected %u", i, m[i].pos, want[i]);
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t hd = 0; hd < l->n_kv_heads; hd++) {
					const uint16_t *row = kvp_session_kv(s, i, layer, kv, hd);

					assert_non_null(row);
					if (harness_kv_check(row, l->head_dim, f->tokens[want[i]],
							     want[i], layer, kv, hd) < 0)
						fail_msg("kept token %zu (position %u): wrong K/V "
							 "in layer %u kv %u head %u",
							 i, want[i], layer, kv, hd);
				}
	}
	free(m);
}

/* want[] = [from, to) appended after *n entries. */
static void range(uint32_t *want, size_t *n, uint32_t from, uint32_t to)
{
	for (uint32_t p = from; p < to; p++)
		want[(*n)++] = p;
}

static void test_window(void **state)
{
	struct fixture *f = *state;
	kvp_session *s = make_session(f, N);
	struct kvp_policy pol;
	uint32_t want[N + 20], budget;
	uint64_t dropped;
	size_t n = 0;

	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 64);
	assert_int_equal(kvp_session_set_policy(s, &pol, &budget), 0);
	assert_int_equal(budget, 64);
	assert_int_equal(kvp_session_compacted(s), 0);
	assert_int_equal(kvp_session_compact(s, &dropped), 0);
	assert_int_equal(dropped, N - 64);
	assert_int_equal(kvp_session_compacted(s), 1);
	range(want, &n, N - 64, N);
	assert_kept(f, s, want, n);
	/* Within the budget now: nothing more goes. */
	assert_int_equal(kvp_session_compact(s, &dropped), 0);
	assert_int_equal(dropped, 0);
	assert_kept(f, s, want, n);
	/* It goes on: appended tokens take the next original positions, and
	 * commits that fill pages of a compacted session work (their pages
	 * stay out of the index). */
	assert_int_equal(kvp_append(s, f->tokens + N, 20), 0);
	for (uint32_t i = 0; i < 20; i++)
		for (uint32_t layer = 0; layer < harness_layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t hd = 0; hd < harness_layout.n_kv_heads; hd++)
					harness_kv_fill(kvp_session_kv(s, 64 + i, layer, kv, hd),
							harness_layout.head_dim, f->tokens[N + i],
							N + i, layer, kv, hd);
	assert_int_equal(kvp_commit(s, 20), 0);
	range(want, &n, N, N + 20);
	assert_kept(f, s, want, n);
	/* What an admin sees of it. */
	{
		struct kvp_session_detail *d;
		kvp_client *admin;

		assert_int_equal(kvp_connect(f->h->admin_sock, &admin), 0);
		assert_int_equal(kvp_admin_show_session(admin, kvp_session_id(s), 0, &d), 0);
		assert_int_equal(d->policy, KVP_POLICY_WINDOW);
		assert_int_equal(d->budget, 64);
		assert_true(d->compacted);
		assert_int_equal(d->dropped_tokens, N - 64);
		free(d);
		kvp_disconnect(admin);
	}
	assert_int_equal(kvp_session_close(s), 0);
}

static void test_sinks(void **state)
{
	struct fixture *f = *state;
	kvp_session *s = make_session(f, N);
	struct kvp_policy pol;
	uint32_t want[N];
	size_t n = 0;

	kvp_policy_init(&pol, KVP_POLICY_SINKS, 64);
	pol.sinks = 4;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	range(want, &n, 0, 4);
	range(want, &n, N - 60, N);
	assert_kept(f, s, want, n);
	assert_int_equal(kvp_session_close(s), 0);
}

/* H2O with masses the client measured: two reports, the second one after
 * a decay step; the recent window and the sinks are kept whatever their
 * score. */
static void test_importance_reported(void **state)
{
	struct fixture *f = *state;
	kvp_session *s = make_session(f, N);
	struct kvp_token_info m[N];
	struct kvp_policy pol;
	float mass[N] = {0};
	uint32_t want[N];
	size_t n = 0;

	kvp_policy_init(&pol, KVP_POLICY_IMPORTANCE, 40);
	pol.sinks = 2;
	pol.recent = 16;
	pol.decay = 0.5f;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	/* Heavy hitters: positions 10..29 (mass 1), and 50..59 (mass 3 in
	 * the first report, which decays by e^-0.5 in the second: 3·0.61 =
	 * 1.8 > 1). Positions 100..119 get 0.5 in the second report only. */
	for (uint32_t p = 10; p < 30; p++)
		mass[p] = 1.0f;
	for (uint32_t p = 50; p < 60; p++)
		mass[p] = 3.0f;
	assert_int_equal(kvp_session_report_importance(s, 0, mass, N), 0);
	memset(mass, 0, sizeof(mass));
	for (uint32_t p = 100; p < 120; p++)
		mass[p] = 0.5f;
	assert_int_equal(kvp_session_report_importance(s, 0, mass, N), 0);
	assert_int_equal(kvp_session_meta(s, 0, N, m), 0);
	assert_true(fabsf(m[10].score - expf(-0.5f)) < 1e-4f);
	assert_true(fabsf(m[50].score - 3.0f * expf(-0.5f)) < 1e-4f);
	assert_true(fabsf(m[100].score - 0.5f) < 1e-5f);
	assert_true(m[0].score == 0.0f);
	/* Budget 40: sinks 0,1, recent 184..199, then 22 by score: 50..59
	 * (1.82) and 12 of 10..29 (0.61 each; ties go to the most recent:
	 * 18..29). */
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	range(want, &n, 0, 2);
	range(want, &n, 18, 30);
	range(want, &n, 50, 60);
	range(want, &n, N - 16, N);
	assert_kept(f, s, want, n);
	/* A report past the tokens is refused. */
	assert_int_equal(kvp_session_report_importance(s, 30, mass, 11), -ERANGE);
	assert_int_equal(kvp_session_close(s), 0);
}

/* The daemon computes attention weights from a query: tokens whose K rows
 * align with the query win. */
static void test_importance_query(void **state)
{
	struct fixture *f = *state;
	const struct kvp_layout *l = &harness_layout;
	uint32_t n_q = l->n_kv_heads * 2; /* GQA: two query heads a KV head */
	float *q = calloc((size_t)n_q * l->head_dim, sizeof(float));
	struct kvp_token_info m[64];
	kvp_session *s;
	float best = -1.0f;
	uint32_t best_pos = 0;

	assert_non_null(q);
	s = make_session(f, 64);
	/* q = K row of position 37 in every head of layer 1: its weight is the
	 * largest the softmax gives (rows are distinct and bounded). */
	for (uint32_t h = 0; h < n_q; h++) {
		const uint16_t *k = kvp_session_kv(s, 37, 1, 0, h / 2);

		assert_non_null(k);
		for (uint32_t d = 0; d < l->head_dim; d++)
			q[h * l->head_dim + d] = harness_f16_to_float(k[d]) * 8.0f;
	}
	assert_int_equal(kvp_session_score_query(s, 1, q, n_q), 0);
	assert_int_equal(kvp_session_meta(s, 0, 64, m), 0);
	for (uint32_t i = 0; i < 64; i++) {
		assert_true(m[i].score >= 0.0f && m[i].score <= (float)n_q + 1e-3f);
		if (m[i].score > best) {
			best = m[i].score;
			best_pos = i;
		}
	}
	assert_int_equal(best_pos, 37);
	/* Wrong shapes are refused with the reason. */
	assert_int_equal(kvp_session_score_query(s, l->n_layers, q, n_q), -EINVAL);
	assert_int_equal(kvp_session_score_query(s, 0, q, 3), -EINVAL);
	assert_int_equal(kvp_session_close(s), 0);
	free(q);
}

/* Topic relevance: four turns of 32 tokens; the topic is turn 2's own mean
 * key, so turn 2 scores 1 and the hierarchy's temporary layer keeps it
 * over turns 1 and 3. */
static void test_topic(void **state)
{
	struct fixture *f = *state;
	const struct kvp_layout *l = &harness_layout;
	struct kvp_token_info m[128];
	struct kvp_policy pol;
	kvp_session *s;
	uint32_t want[128];
	float q[2 * 32] = {0};
	size_t n = 0;

	assert_int_equal(l->n_kv_heads * l->head_dim, 64);
	assert_int_equal(kvp_session_create(f->p, &s), 0);
	for (uint32_t t = 1; t <= 4; t++)
		assert_int_equal(kvp_append_tagged(s, f->tokens + (t - 1) * 32, 32,
						   t % 2 ? KVP_ROLE_USER : KVP_ROLE_ASSISTANT, t,
						   0),
				 0);
	assert_int_equal(harness_write_session(f->p, s, 0, f->tokens, 128), 0);
	assert_int_equal(kvp_commit(s, 128), 0);
	for (uint32_t pos = 32; pos < 64; pos++)
		for (uint32_t h = 0; h < l->n_kv_heads; h++) {
			const uint16_t *k = kvp_session_kv(s, pos, 0, 0, h);

			for (uint32_t d = 0; d < l->head_dim; d++)
				q[h * l->head_dim + d] += harness_f16_to_float(k[d]) / 32;
		}
	assert_int_equal(kvp_session_score_topic(s, 0, q, l->n_kv_heads), 0);
	assert_int_equal(kvp_session_meta(s, 0, 128, m), 0);
	for (uint32_t i = 0; i < 128; i++) {
		if (i >= 32 && i < 64)
			assert_true(fabsf(m[i].score - 1.0f) < 1e-3f);
		else
			assert_true(m[i].score < 0.9f);
		assert_true(m[i].score == m[i / 32 * 32].score); /* one score a span */
	}
	kvp_policy_init(&pol, KVP_POLICY_HIERARCHY, 64);
	pol.hot_turns = 1;
	pol.share_permanent = 0;
	pol.share_hot = 50;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	range(want, &n, 32, 64);
	range(want, &n, 96, 128);
	assert_kept(f, s, want, n);
	assert_int_equal(kvp_session_close(s), 0);
}

/* A conversation: a permanent system prompt (turn 0), then turns 1..8 of
 * 20 user + 30 assistant tokens. Hierarchy at budget 160: permanent 10 %
 * (16), hot 30 % (48: the last turns), temporary the rest by score. */
static void test_hierarchy(void **state)
{
	struct fixture *f = *state;
	struct kvp_policy pol;
	kvp_session *s;
	uint32_t want[512], total;
	float mass[512] = {0};
	size_t n = 0;

	assert_int_equal(kvp_session_create(f->p, &s), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens, 16, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT),
			 0);
	total = 16;
	for (uint32_t t = 1; t <= 8; t++) {
		assert_int_equal(kvp_append_tagged(s, f->tokens + total, 20, KVP_ROLE_USER, t, 0),
				 0);
		total += 20;
		assert_int_equal(
			kvp_append_tagged(s, f->tokens + total, 30, KVP_ROLE_ASSISTANT, t, 0), 0);
		total += 30;
	}
	assert_int_equal(total, 416);
	assert_int_equal(harness_write_session(f->p, s, 0, f->tokens, total), 0);
	assert_int_equal(kvp_commit(s, total), 0);
	kvp_policy_init(&pol, KVP_POLICY_HIERARCHY, 160);
	pol.hot_turns = 1;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	/* Turn 2's assistant span (positions 86..115) is what the current
	 * topic attends to. */
	for (uint32_t p = 86; p < 116; p++)
		mass[p] = 1.0f;
	assert_int_equal(kvp_session_report_importance(s, 0, mass, total), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	/* Permanent: 0..15 (16 of 16). Hot: turn 8 = 366..415 (50 tokens,
	 * more than the hot share of 48: the newest 48, 368..415). Temporary:
	 * 160 - 16 - 48 = 96 by score: 86..115 (30), then 66 by recency among
	 * the zero scores: 366, 367 (turn 8's overflow) and 302..365. */
	range(want, &n, 0, 16);
	range(want, &n, 86, 116);
	range(want, &n, 302, 416);
	assert_kept(f, s, want, n);
	assert_int_equal(kvp_session_close(s), 0);
}

/* Per-role limits: only the last 10 user tokens may stay, whatever the
 * window would keep. */
static void test_role_limit(void **state)
{
	struct fixture *f = *state;
	struct kvp_policy pol;
	kvp_session *s;
	uint32_t want[128];
	size_t n = 0;

	assert_int_equal(kvp_session_create(f->p, &s), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens, 40, KVP_ROLE_USER, 1, 0), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens + 40, 40, KVP_ROLE_ASSISTANT, 1, 0), 0);
	assert_int_equal(harness_write_session(f->p, s, 0, f->tokens, 80), 0);
	assert_int_equal(kvp_commit(s, 80), 0);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 64);
	pol.role_limit[KVP_ROLE_USER] = 10;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	range(want, &n, 30, 40);
	range(want, &n, 40, 80);
	assert_kept(f, s, want, n);
	assert_int_equal(kvp_session_close(s), 0);
}

/* The same limit with a budget that holds every token: the choice (made
 * on a worker, which takes no pages when the budget holds everything)
 * still drops the user tokens past the limit, and the pages for the copy
 * are taken afterwards. */
static void test_role_limit_under_budget(void **state)
{
	struct fixture *f = *state;
	struct kvp_policy pol;
	kvp_session *s;
	uint32_t want[128];
	uint64_t dropped;
	size_t n = 0;

	assert_int_equal(kvp_session_create(f->p, &s), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens, 40, KVP_ROLE_USER, 1, 0), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens + 40, 40, KVP_ROLE_ASSISTANT, 1, 0), 0);
	assert_int_equal(harness_write_session(f->p, s, 0, f->tokens, 80), 0);
	assert_int_equal(kvp_commit(s, 80), 0);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 128);
	pol.role_limit[KVP_ROLE_USER] = 10;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, &dropped), 0);
	assert_int_equal(dropped, 30);
	range(want, &n, 30, 40);
	range(want, &n, 40, 80);
	assert_kept(f, s, want, n);
	/* Nothing more to drop: nothing changes. */
	assert_int_equal(kvp_session_compact(s, &dropped), 0);
	assert_int_equal(dropped, 0);
	assert_int_equal(kvp_session_close(s), 0);
}

/* auto_compact: a commit past the budget compacts; the session goes on
 * with positions that continue where they were, and its pages never serve
 * a match. */
static void test_auto_compact(void **state)
{
	struct fixture *f = *state;
	struct kvp_token_info m[128];
	struct kvp_policy pol;
	kvp_session *s;
	kvp_lease *l;
	uint32_t want[128];
	size_t n = 0;

	assert_int_equal(kvp_session_create(f->p, &s), 0);
	kvp_policy_init(&pol, KVP_POLICY_SINKS, 48);
	pol.sinks = 4;
	pol.auto_compact = 1;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_append(s, f->tokens, 48), 0);
	assert_int_equal(harness_write_session(f->p, s, 0, f->tokens, 48), 0);
	assert_int_equal(kvp_commit(s, 48), 0);
	assert_int_equal(kvp_session_compacted(s), 0); /* at the budget, not past it */
	assert_int_equal(kvp_append(s, f->tokens + 48, 20), 0);
	/* Rows keyed by their original positions 48..67. */
	for (uint32_t i = 0; i < 20; i++)
		for (uint32_t layer = 0; layer < harness_layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t hd = 0; hd < harness_layout.n_kv_heads; hd++)
					harness_kv_fill(kvp_session_kv(s, 48 + i, layer, kv, hd),
							harness_layout.head_dim, f->tokens[48 + i],
							48 + i, layer, kv, hd);
	assert_int_equal(kvp_commit(s, 20), 0);
	assert_int_equal(kvp_session_compacted(s), 1);
	range(want, &n, 0, 4);
	range(want, &n, 24, 68);
	assert_kept(f, s, want, n);
	/* Appending goes on at original position 68. */
	assert_int_equal(kvp_append(s, f->tokens + 68, 1), 0);
	assert_int_equal(kvp_session_meta(s, 48, 1, m), 0);
	assert_int_equal(m[0].pos, 68);
	assert_int_equal(kvp_truncate(s, 48), 0);
	/* The first 48 tokens were committed before compaction and are in the
	 * index; the compacted session's pages (tokens 0..3, 24..67) are not:
	 * the index serves the original prefix only. */
	assert_int_equal(kvp_match_prefix(f->p, f->tokens, 48, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 48);
	assert_int_equal(harness_check_lease(l, f->p, f->tokens, 48), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

/* A compacted session forks with its positions, and a checkpoint keeps
 * them: the restore reads back the same kept tokens at the same
 * positions. Warm-up, which fills the prefix index, refuses it. */
static void test_fork_and_checkpoint(void **state)
{
	struct fixture *f = *state;
	struct kvp_token_info m[N];
	struct kvp_policy pol;
	kvp_session *s = make_session(f, N), *fk, *r;
	kvp_client *admin;
	struct kvp_warmup_info wi;
	uint32_t want[N];
	size_t n = 0;

	kvp_policy_init(&pol, KVP_POLICY_SINKS, 40);
	pol.sinks = 8;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_tag(s, 0, 8, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	range(want, &n, 0, 8);
	range(want, &n, N - 32, N);
	assert_kept(f, s, want, n);

	assert_int_equal(kvp_session_fork(s, 20, &fk), 0);
	assert_int_equal(kvp_session_compacted(fk), 1);
	assert_kept(f, fk, want, 20);
	assert_int_equal(kvp_session_close(fk), 0);

	assert_int_equal(kvp_session_checkpoint(s, "compacted", NULL), 0);
	assert_int_equal(kvp_session_restore(f->p, "compacted", &r), 0);
	assert_kept(f, r, want, n);
	assert_int_equal(kvp_session_meta(r, 0, n, m), 0);
	assert_int_equal(m[0].role, KVP_ROLE_SYSTEM);
	assert_int_equal(m[0].flags, KVP_TAG_PERMANENT);
	assert_int_equal(m[8].role, KVP_ROLE_NONE);
	assert_int_equal(kvp_session_compacted(r), 1);
	assert_int_equal(kvp_session_close(r), 0);

	assert_int_equal(kvp_connect(f->h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_warmup(admin, "compacted", 1, (uint32_t)getuid(), &wi), -EINVAL);
	kvp_disconnect(admin);
	assert_int_equal(kvp_session_close(s), 0);
}

static void test_refusals(void **state)
{
	struct fixture *f = *state;
	kvp_session *s = make_session(f, 40);
	struct kvp_policy pol;
	kvp_client *other;
	kvp_pool *op;
	kvp_session *os;

	/* No policy: nothing to apply. */
	assert_int_equal(kvp_session_compact(s, NULL), -EINVAL);
	assert_non_null(strstr(kvp_strerror(f->c, -EINVAL), "policy"));
	/* Inconsistent policies name what is wrong. */
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 0);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), -EINVAL);
	assert_non_null(strstr(kvp_strerror(f->c, -EINVAL), "budget"));
	kvp_policy_init(&pol, 99, 10);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), -EINVAL);
	kvp_policy_init(&pol, KVP_POLICY_HIERARCHY, 10);
	pol.share_permanent = 80;
	pol.share_hot = 30;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), -EINVAL);
	/* Uncommitted tokens: commit first. */
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 16);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_append(s, f->tokens + 40, 4), 0);
	assert_int_equal(kvp_session_compact(s, NULL), -EBUSY);
	assert_int_equal(kvp_truncate(s, 40), 0);
	/* Tags and metadata past the tokens. */
	assert_int_equal(kvp_session_tag(s, 30, 11, KVP_ROLE_USER, 1, 0), -ERANGE);
	assert_int_equal(kvp_session_tag(s, 0, 1, 7, 1, 0), -EINVAL);
	/* A policy is the session's own: a session of another pool, made by
	 * another connection after s got its window, has none. */
	assert_int_equal(kvp_connect(f->h->sock, &other), 0);
	assert_int_equal(kvp_pool_open(other, "other-model", &harness_layout, &op), 0);
	assert_int_equal(harness_commit_session(op, f->tokens, 20, &os), 0);
	assert_int_equal(kvp_session_compact(os, NULL), -EINVAL);
	kvp_disconnect(other);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	assert_int_equal(kvp_session_tokens(s), 16);
	assert_int_equal(kvp_session_close(s), 0);
}

/* Placement: a span tagged permanent (a system prompt) outlives a stream
 * of conversations that overflows the host tier many times; the same
 * prompt untagged is evicted by it. Host only, 64 pages a pool. */
static void test_permanent_stays(void **state)
{
	static const char *const args[] = {"--host-pool-size", "512K", "--disk-pool-size", "0",
					   NULL};
	struct fixture *f = *state;
	struct harness h = {0};
	struct kvp_pool_stats ps;
	uint32_t conv[96];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	(void)f;
	assert_int_equal(harness_start(&h, args), 0);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 64);
	/* Prompt A (2 pages) tagged permanent as it is appended; prompt B
	 * (2 pages) tagged after its commit; prompt C untagged. */
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens, 32, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT),
			 0);
	assert_int_equal(harness_write_session(p, s, 0, f->tokens, 32), 0);
	assert_int_equal(kvp_commit(s, 32), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_commit_session(p, f->tokens + 1000, 32, &s), 0);
	assert_int_equal(kvp_session_tag(s, 0, 32, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_commit_session(p, f->tokens + 2000, 32, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.permanent_pages, 4);
	/* 40 conversations of 6 pages: 240 pages through a 64-page pool. */
	for (uint32_t i = 0; i < 40; i++) {
		harness_tokens(conv, 96, 100 + i, 0);
		assert_int_equal(harness_commit_session(p, conv, 96, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_true(ps.evictions >= 150);
	assert_int_equal(ps.permanent_pages, 4);
	/* The permanent prompts match whole, with their bytes; C is gone. */
	assert_int_equal(kvp_match_prefix(p, f->tokens, 32, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_check_lease(l, p, f->tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, f->tokens + 1000, 32, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_check_lease(l, p, f->tokens + 1000, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, f->tokens + 2000, 32, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
}

/* The sessions the daemon placed at their close, as c's tenant sees. */
static uint64_t placed(kvp_client *c)
{
	struct kvp_stats *st;
	uint64_t n;

	assert_int_equal(kvp_stats(c, &st), 0);
	n = st->placed_sessions;
	kvp_stats_free(st);
	return n;
}

/* One pass of the placement test: conversation A, 8 turns of 4*k pages,
 * closed (with the hierarchy when hier), then conversations of 4 pages
 * until the first spill; returns how many of A's pages went to disk, in
 * *ret_first how many of its first turn's, and in *ret_spilled how many
 * pages did in all. */
static uint32_t spilled_of_a(struct fixture *f, int hier, uint32_t k, uint32_t *ret_first,
			     uint64_t *ret_spilled)
{
	char pool_size[32];
	const char *const args[] = {"--host-pool-size", pool_size, "--disk-pool-size", "16M", NULL};
	struct harness h = {0};
	struct kvp_pool_stats ps;
	struct kvp_policy pol;
	uint32_t conv[64], coming = 0;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	snprintf(pool_size, sizeof(pool_size), "%uK", 512 * k);
	assert_int_equal(harness_start(&h, args), 0);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 64 * k);
	assert_int_equal(kvp_session_create(p, &s), 0);
	for (uint32_t t = 1; t <= 8; t++)
		assert_int_equal(kvp_append_tagged(s, f->tokens + (t - 1) * 64 * k, 64 * k,
						   t % 2 ? KVP_ROLE_USER : KVP_ROLE_ASSISTANT, t,
						   0),
				 0);
	assert_int_equal(harness_write_session(p, s, 0, f->tokens, 512 * k), 0);
	assert_int_equal(kvp_commit(s, 512 * k), 0);
	if (hier) {
		/* Budget 128k: turn 8 hot, turn 7 temporary, turns 1..6 rest. */
		kvp_policy_init(&pol, KVP_POLICY_HIERARCHY, 128 * k);
		pol.hot_turns = 1;
		pol.share_permanent = 0;
		pol.share_hot = 50;
		assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	}
	assert_int_equal(kvp_session_close(s), 0);
	/* A long session is placed on a worker: the spill below must come
	 * after (a bounded wait; nothing timed is asserted). */
	for (int i = 0; hier && i < 1000 && placed(c) < 1; i++)
		usleep(5000);
	assert_int_equal(placed(c), hier ? 1 : 0);
	for (uint32_t i = 0; i < 64; i++) {
		harness_tokens(conv, 64, 300 + i, 0);
		assert_int_equal(harness_commit_session(p, conv, 64, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
		if (ps.spilled_pages)
			break;
	}
	assert_true(ps.spilled_pages > 0);
	/* The batch's writes complete one by one: wait until the count holds
	 * still (a bounded wait, nothing timed is asserted). */
	for (int i = 0, still = 0; i < 500 && still < 5; i++) {
		uint64_t before = ps.spilled_pages;

		usleep(20000);
		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
		still = ps.spilled_pages == before ? still + 1 : 0;
	}
	/* A prefetch of A counts each of its pages on disk (or on its way
	 * back): its first turn's first. */
	assert_int_equal(kvp_prefetch(p, f->tokens, 64 * k, ret_first), 0);
	assert_int_equal(kvp_prefetch(p, f->tokens, 512 * k, &coming), 0);
	/* Spilled counted after the prefetches: under load a write of the
	 * batch may complete after the count held still (CI saw 9 pages of
	 * A coming against 7 spilled counted before). */
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	*ret_spilled = ps.spilled_pages;
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	return coming;
}

/* Tier placement for an exact session: with the hierarchy, the pages of
 * turns outside the budget (1..6: 24 pages) are the first to go to disk,
 * oldest first, while the hot and temporary turns stay in host: the first
 * spill (a batch down to the low watermark, 7 pages) takes only A's
 * oldest pages — had it taken a later page of A, that page's unwritten
 * ancestors would have gone with it. Without the hierarchy A's pages
 * leave from the chain's end, and only down to the low mark (issue 13:
 * the newest page dragged all its ancestors, all 32, to disk). */
static void test_hierarchy_placement(void **state)
{
	uint32_t a, first;
	uint64_t spilled;

	a = spilled_of_a(*state, 1, 1, &first, &spilled);
	fprintf(stderr,
		"with the hierarchy: %u of A's pages spilled (%u of its first turn), %llu in all\n",
		a, first, (unsigned long long)spilled);
	assert_true(a > 0 && a < 24);
	assert_true(first > 0);
	assert_true(a <= spilled);
	a = spilled_of_a(*state, 0, 1, &first, &spilled);
	fprintf(stderr,
		"without the hierarchy: %u of A's pages spilled (%u of its first turn), %llu in "
		"all\n",
		a, first, (unsigned long long)spilled);
	assert_true(a > 0 && a < 24);
	assert_int_equal(first, 0);
	assert_true(a <= spilled);
}

/* The same for a conversation of 2,560 tokens (5 times as long), whose
 * layers a worker computes (issue 14 item 7: 1M tokens took 1.6 s on the
 * event loop): A's oldest pages, outside the budget, still leave first. */
static void test_hierarchy_placement_on_worker(void **state)
{
	uint32_t a, first;
	uint64_t spilled;

	a = spilled_of_a(*state, 1, 5, &first, &spilled);
	fprintf(stderr,
		"with the hierarchy: %u of A's pages spilled (%u of its first turn), %llu in all\n",
		a, first, (unsigned long long)spilled);
	assert_true(a > 0 && a < 24 * 5);
	assert_true(first > 0);
	assert_true(a <= spilled);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window),
		cmocka_unit_test(test_sinks),
		cmocka_unit_test(test_importance_reported),
		cmocka_unit_test(test_importance_query),
		cmocka_unit_test(test_hierarchy),
		cmocka_unit_test(test_topic),
		cmocka_unit_test(test_role_limit),
		cmocka_unit_test(test_role_limit_under_budget),
		cmocka_unit_test(test_auto_compact),
		cmocka_unit_test(test_fork_and_checkpoint),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_permanent_stays),
		cmocka_unit_test(test_hierarchy_placement),
		cmocka_unit_test(test_hierarchy_placement_on_worker),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
