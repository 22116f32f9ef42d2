/* tests/integration/test_summary.c — summary spans (issue 22) on a real
 * daemon: K/V of a summary the client computed, attached to a document's
 * session (appended with KVP_TAG_SUMMARY, or an existing span tagged so),
 * survives every token policy's compaction at every budget, counts
 * against the budget, outlives role limits, keeps its tag through a
 * checkpoint, and is refused where it could not be kept.
 *
 * As in test_policy.c, K/V rows are keyed by (token id, original position)
 * (harness_kv_fill), so a kept row copied from the wrong place reads wrong;
 * the expected kept positions are computed here from the rules in
 * daemon/base/policy.h and client/kvpalace.h.
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

#define MODEL "summary-model"
#define N     200u /* the document */
#define S     12u  /* its summary, appended after it */

struct fixture {
	struct harness *h;
	kvp_client *c;
	kvp_pool *p;
	uint32_t tokens[1024];
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f || harness_setup((void **)&f->h) < 0)
		return -1;
	if (kvp_connect(f->h->sock, &f->c) < 0 ||
	    kvp_pool_open(f->c, MODEL, &harness_layout, &f->p) < 0)
		return -1;
	harness_tokens(f->tokens, 1024, 11, 0);
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

/* A document of N tokens, then a summary span of S tokens appended with
 * KVP_TAG_SUMMARY (K/V written for positions N..N+S-1), all committed. */
static kvp_session *document_with_summary(struct fixture *f)
{
	kvp_session *s;

	assert_int_equal(harness_commit_session(f->p, f->tokens, N, &s), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens + N, S, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY),
			 0);
	assert_int_equal(harness_write_session(f->p, s, N, f->tokens + N, S), 0);
	assert_int_equal(kvp_commit(s, S), 0);
	return s;
}

/* Checks every kept token's rows against its reported position and
 * returns the metadata (the caller frees it); *ret_n: the kept tokens. */
static struct kvp_token_info *kept_meta(struct fixture *f, kvp_session *s, size_t *ret_n)
{
	const struct kvp_layout *l = &harness_layout;
	size_t n = kvp_session_tokens(s);
	struct kvp_token_info *m = calloc(n ? n : 1, sizeof(*m));

	assert_non_null(m);
	assert_int_equal(kvp_session_committed(s), n);
	assert_int_equal(kvp_session_meta(s, 0, n, m), 0);
	for (size_t i = 0; i < n; i++)
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t hd = 0; hd < l->n_kv_heads; hd++) {
					const uint16_t *row = kvp_session_kv(s, i, layer, kv, hd);

					assert_non_null(row);
					if (harness_kv_check(row, l->head_dim, f->tokens[m[i].pos],
							     m[i].pos, layer, kv, hd) < 0)
						fail_msg("kept token %zu (position %u): wrong K/V",
							 i, m[i].pos);
				}
	*ret_n = n;
	return m;
}

/* Every policy, budgets from the summary alone up to all tokens: the S
 * summary tokens are all kept, with their tags, and the rest of what is
 * kept is budget - S document tokens. Importance scores favour the
 * document (the summary has score 0) and a role limit of 8 covers
 * ROLE_NONE, the summary's role: neither drops a summary token. */
static void test_every_policy_keeps_summaries(void **state)
{
	static const uint32_t kinds[] = {KVP_POLICY_WINDOW, KVP_POLICY_SINKS, KVP_POLICY_IMPORTANCE,
					 KVP_POLICY_HIERARCHY};
	static const uint32_t budgets[] = {S, S + 1, 40, 100, N + S};
	struct fixture *f = *state;
	float mass[N + S];

	for (uint32_t i = 0; i < N + S; i++)
		mass[i] = i < N ? 1.0f + (float)(i % 7) : 0.0f;
	for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++)
		for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]); bi++)
			for (int limit = 0; limit < 2; limit++) {
				kvp_session *s = document_with_summary(f);
				struct kvp_token_info *m;
				struct kvp_policy pol;
				uint32_t b = budgets[bi], n_sum = 0, n_doc = 0;
				uint64_t dropped = 7;
				size_t n;

				kvp_policy_init(&pol, kinds[ki], b);
				pol.sinks = b >= 4 ? 4 : 0;
				pol.recent = b >= 8 + S ? 4 : 0;
				if (limit)
					pol.role_limit[KVP_ROLE_NONE] = 8;
				assert_int_equal(kvp_session_report_importance(s, 0, mass, N + S),
						 0);
				assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
				assert_int_equal(kvp_session_compact(s, &dropped), 0);
				m = kept_meta(f, s, &n);
				for (size_t i = 0; i < n; i++) {
					if (m[i].pos >= N) {
						n_sum++;
						assert_int_equal(m[i].flags,
								 KVP_TAG_SUMMARY |
									 KVP_TAG_PERMANENT);
					} else {
						n_doc++;
						assert_int_equal(m[i].flags, 0);
					}
				}
				if (n_sum != S)
					fail_msg("policy %u budget %u limit %d: %u of %u summary "
						 "tokens kept",
						 kinds[ki], b, limit, n_sum, S);
				/* The summaries count against the budget. */
				assert_int_equal(n_doc, limit ? (b - S < 8 ? b - S : 8) : b - S);
				assert_int_equal(dropped, N + S - n);
				free(m);
				assert_int_equal(kvp_session_close(s), 0);
			}
}

/* Which document tokens stay beside the summary, by hand: a window keeps
 * the last budget - S, sinks the first 4 and the last budget - S - 4. A
 * hierarchy's permanent share (50 % of 40 = 20) goes to the summary first
 * (12), then to the other permanent tokens (8 of the 10 tagged 0..9). */
static void test_what_stays_beside_it(void **state)
{
	struct fixture *f = *state;
	struct kvp_policy pol;

	for (int kind = 0; kind < 3; kind++) {
		kvp_session *s = document_with_summary(f);
		struct kvp_token_info *m;
		uint32_t want[40];
		size_t n, w = 0;

		if (kind == 0) {
			kvp_policy_init(&pol, KVP_POLICY_WINDOW, 40);
			for (uint32_t p = N - 28; p < N; p++)
				want[w++] = p;
		} else if (kind == 1) {
			kvp_policy_init(&pol, KVP_POLICY_SINKS, 40);
			pol.sinks = 4;
			for (uint32_t p = 0; p < 4; p++)
				want[w++] = p;
			for (uint32_t p = N - 24; p < N; p++)
				want[w++] = p;
		} else {
			kvp_policy_init(&pol, KVP_POLICY_HIERARCHY, 40);
			pol.share_permanent = 50;
			pol.share_hot = 0;
			assert_int_equal(
				kvp_session_tag(s, 0, 10, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT),
				0);
			/* permanent 0..7; temporary by score (all 0): the
			 * most recent, N - 20 .. N - 1. */
			for (uint32_t p = 0; p < 8; p++)
				want[w++] = p;
			for (uint32_t p = N - 20; p < N; p++)
				want[w++] = p;
		}
		for (uint32_t p = N; p < N + S; p++)
			want[w++] = p;
		assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
		assert_int_equal(kvp_session_compact(s, NULL), 0);
		m = kept_meta(f, s, &n);
		assert_int_equal(n, w);
		for (size_t i = 0; i < n; i++)
			if (m[i].pos != want[i])
				fail_msg("policy case %d: kept token %zu at position %u, expected "
					 "%u",
					 kind, i, m[i].pos, want[i]);
		free(m);
		assert_int_equal(kvp_session_close(s), 0);
	}
}

/* A span already in the session tagged a summary (in the middle of the
 * document) survives a window that would drop it; retagging it without
 * the flag makes it an ordinary span again; the tag survives a
 * checkpoint and an auto-compacting commit keeps it too. */
static void test_tagged_span_and_checkpoint(void **state)
{
	struct fixture *f = *state;
	struct kvp_token_info m[40];
	struct kvp_policy pol;
	kvp_session *s, *r;
	uint32_t want[40];
	size_t w = 0;

	assert_int_equal(harness_commit_session(f->p, f->tokens, N, &s), 0);
	assert_int_equal(kvp_session_tag(s, 50, 10, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), 0);
	assert_int_equal(kvp_session_tag(s, 60, 5, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), 0);
	assert_int_equal(kvp_session_tag(s, 60, 5, KVP_ROLE_NONE, 0, 0), 0); /* not any more */
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 30);
	pol.auto_compact = 1;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	for (uint32_t p = 50; p < 60; p++)
		want[w++] = p;
	for (uint32_t p = N - 20; p < N; p++)
		want[w++] = p;
	assert_int_equal(kvp_session_tokens(s), w);
	assert_int_equal(kvp_session_meta(s, 0, w, m), 0);
	for (size_t i = 0; i < w; i++) {
		assert_int_equal(m[i].pos, want[i]);
		assert_int_equal(m[i].flags,
				 m[i].pos < 60 ? KVP_TAG_SUMMARY | KVP_TAG_PERMANENT : 0);
	}

	assert_int_equal(kvp_session_checkpoint(s, "with-summary", NULL), 0);
	assert_int_equal(kvp_session_restore(f->p, "with-summary", &r), 0);
	assert_int_equal(kvp_session_meta(r, 0, w, m), 0);
	assert_int_equal(m[0].pos, 50);
	assert_int_equal(m[0].flags, KVP_TAG_SUMMARY | KVP_TAG_PERMANENT);
	assert_int_equal(m[10].flags, 0);
	assert_int_equal(kvp_session_close(r), 0);

	/* More document through auto-compacting commits: the summary stays. */
	for (int round = 0; round < 3; round++) {
		uint64_t at = kvp_session_tokens(s);

		assert_int_equal(kvp_append(s, f->tokens + N + 16 * round, 16), 0);
		assert_int_equal(harness_write_session(f->p, s, at, f->tokens + N + 16 * round, 16),
				 0);
		assert_int_equal(kvp_commit(s, 16), 0);
	}
	assert_int_equal(kvp_session_tokens(s), 30);
	assert_int_equal(kvp_session_meta(s, 0, 30, m), 0);
	for (uint32_t i = 0; i < 10; i++) {
		assert_int_equal(m[i].pos, 50 + i);
		assert_int_equal(m[i].flags, KVP_TAG_SUMMARY | KVP_TAG_PERMANENT);
	}
	assert_int_equal(m[10].pos, N + 48 - 20);
	assert_int_equal(kvp_session_close(s), 0);
}

/* What could not be kept is refused, clearly, and the session goes on. */
static void test_refusals(void **state)
{
	struct fixture *f = *state;
	struct kvp_policy pol;
	kvp_session *s;

	assert_int_equal(harness_commit_session(f->p, f->tokens, 40, &s), 0);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 16);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	/* More summary tokens than the budget: by tag, by append. */
	assert_int_equal(kvp_session_tag(s, 0, 17, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), -EINVAL);
	assert_non_null(strstr(kvp_strerror(f->c, -EINVAL), "summary"));
	assert_int_equal(kvp_session_tag(s, 0, 10, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), 0);
	assert_int_equal(kvp_append_tagged(s, f->tokens + 40, 7, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY),
			 -EINVAL);
	assert_int_equal(kvp_session_tokens(s), 40);
	/* Retagging the same span counts it once. */
	assert_int_equal(kvp_session_tag(s, 0, 16, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), 0);
	/* A budget below the summaries. */
	kvp_policy_init(&pol, KVP_POLICY_SINKS, 15);
	pol.sinks = 2;
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), -EINVAL);
	assert_non_null(strstr(kvp_strerror(f->c, -EINVAL), "summary"));
	/* An empty summary span, an unknown flag, a span past the tokens. */
	assert_int_equal(kvp_session_tag(s, 20, 0, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), -EINVAL);
	assert_int_equal(kvp_session_tag(s, 20, 4, KVP_ROLE_NONE, 0, 0x4u), -EINVAL);
	assert_int_equal(kvp_session_tag(s, 38, 4, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), -ERANGE);
	/* Still served: the window keeps exactly the 16 summary tokens. */
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	assert_int_equal(kvp_session_tokens(s), 16);
	{
		struct kvp_token_info m[16];

		assert_int_equal(kvp_session_meta(s, 0, 16, m), 0);
		for (uint32_t i = 0; i < 16; i++)
			assert_int_equal(m[i].pos, i);
	}
	assert_int_equal(kvp_session_close(s), 0);
	/* An exact session takes any summary; its policy must fit them. */
	assert_int_equal(harness_commit_session(f->p, f->tokens, 40, &s), 0);
	assert_int_equal(kvp_session_tag(s, 0, 30, KVP_ROLE_NONE, 0, KVP_TAG_SUMMARY), 0);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 29);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), -EINVAL);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 30);
	assert_int_equal(kvp_session_set_policy(s, &pol, NULL), 0);
	assert_int_equal(kvp_session_compact(s, NULL), 0);
	assert_int_equal(kvp_session_tokens(s), 30);
	assert_int_equal(kvp_session_close(s), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_policy_keeps_summaries),
		cmocka_unit_test(test_what_stays_beside_it),
		cmocka_unit_test(test_tagged_span_and_checkpoint),
		cmocka_unit_test(test_refusals),
	};

	return cmocka_run_group_tests_name("summary", tests, setup, teardown);
}
