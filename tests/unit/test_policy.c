/* tests/unit/test_policy.c — token policies and layers of daemon/base/policy.h.
 *
 * Every kind on small sessions whose answer is worked out by hand in the
 * comments (window, sinks, importance with ties and weights, hierarchy
 * with its shares, hot turns and spill-over), role limits, the dynamic
 * budget, the refusals of policy_validate, the decay arithmetic of
 * policy_add_mass, the layers, and a larger random session checked
 * against the definition of importance. Single-threaded.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "policy.h"

#define MAX_N 1024u

/* |a - b| <= eps, false for NaN (cmocka's assert_float_equal takes an
 * infinity or a NaN for equal to anything). */
#define assert_near(a, b, eps) assert_true(fabsf((float)(a) - (float)(b)) <= (float)(eps))

static struct token_meta m[MAX_N];
static uint32_t keep[MAX_N], scratch[MAX_N];
static uint8_t layer[MAX_N];

/* n plain tokens: positions 0..n-1, turn 0, score 0, no role, no flags. */
static void reset(size_t n)
{
	memset(m, 0, sizeof(m));
	for (size_t i = 0; i < n; i++)
		m[i].pos = (uint32_t)i;
}

static struct policy make(enum policy_kind kind, uint32_t budget)
{
	struct policy pol;

	policy_defaults(&pol, kind);
	pol.budget = budget;
	return pol;
}

/* Selects and checks the result is exactly want[0..n_want). */
static void expect_keep(const struct policy *pol, size_t n, uint32_t budget, const uint32_t *want,
			size_t n_want)
{
	size_t k;

	memset(keep, 0xff, sizeof(keep));
	k = policy_select(pol, m, n, budget, keep, scratch);
	assert_int_equal(k, n_want);
	for (size_t i = 0; i < k; i++)
		assert_int_equal(keep[i], want[i]);
}

#define EXPECT(pol, n, budget, ...)                                                                \
	do {                                                                                       \
		static const uint32_t want_[] = {__VA_ARGS__};                                     \
		expect_keep((pol), (n), (budget), want_, sizeof(want_) / sizeof(want_[0]));        \
	} while (0)

static void test_defaults(void **state)
{
	struct policy pol;

	memset(&pol, 0x5a, sizeof(pol));
	policy_defaults(&pol, POLICY_HIERARCHY);
	assert_int_equal(pol.kind, POLICY_HIERARCHY);
	assert_int_equal(pol.budget, 0);
	assert_int_equal(pol.budget_max, 0);
	assert_int_equal(pol.grow_pct, 0);
	assert_int_equal(pol.sinks, 4);
	assert_int_equal(pol.recent, 64);
	assert_int_equal(pol.hot_turns, 4);
	assert_int_equal(pol.share_permanent, 10);
	assert_int_equal(pol.share_hot, 30);
	assert_near(pol.decay, 0.01f, 0);
	for (unsigned r = 0; r < POLICY_N_ROLES; r++) {
		assert_int_equal(pol.role_limit[r], 0);
		assert_near(pol.role_weight[r], 1.0f, 0);
	}
}

static void test_none_keeps_everything(void **state)
{
	struct policy pol = make(POLICY_NONE, 3);

	reset(6);
	pol.role_limit[ROLE_NONE] = 1; /* exact: no limit applies */
	EXPECT(&pol, 6, 3, 0, 1, 2, 3, 4, 5);
}

static void test_window(void **state)
{
	struct policy pol = make(POLICY_WINDOW, 4);

	reset(10);
	EXPECT(&pol, 10, 4, 6, 7, 8, 9);
	EXPECT(&pol, 10, 1, 9);
	/* A budget above n keeps everything. */
	EXPECT(&pol, 10, 50, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
	EXPECT(&pol, 3, 3, 0, 1, 2);
	/* Scores do not matter to a window. */
	m[0].score = 100.0f;
	EXPECT(&pol, 10, 3, 7, 8, 9);
	assert_int_equal(policy_select(&pol, m, 10, 0, keep, scratch), 0);
	assert_int_equal(policy_select(&pol, m, 0, 4, keep, scratch), 0);
}

static void test_sinks(void **state)
{
	struct policy pol = make(POLICY_SINKS, 5);

	reset(10);
	pol.sinks = 2;
	/* First 2, last 5 - 2. */
	EXPECT(&pol, 10, 5, 0, 1, 7, 8, 9);
	/* The dynamic budget passed in wins over pol.budget. */
	EXPECT(&pol, 10, 8, 0, 1, 4, 5, 6, 7, 8, 9);
	/* Sinks and window meet: everything. */
	EXPECT(&pol, 7, 7, 0, 1, 2, 3, 4, 5, 6);
	EXPECT(&pol, 7, 6, 0, 1, 3, 4, 5, 6);
	/* A budget below the sinks keeps the first tokens only. */
	pol.sinks = 4;
	EXPECT(&pol, 10, 3, 0, 1, 2);
}

static void test_importance_scores(void **state)
{
	struct policy pol = make(POLICY_IMPORTANCE, 5);

	pol.sinks = 1;
	pol.recent = 2;
	reset(12);
	/* Protected: 0 (sink), 10 and 11 (recent); 2 slots for 1..9.
	 * 5 has the top score; 3 and 8 tie at 2.0: the more recent wins. */
	m[0].score = 0.0f;
	m[3].score = 2.0f;
	m[5].score = 3.0f;
	m[8].score = 2.0f;
	m[11].score = 0.0f;
	EXPECT(&pol, 12, 5, 0, 5, 8, 10, 11);
	/* One more slot: 3 too. */
	EXPECT(&pol, 12, 6, 0, 3, 5, 8, 10, 11);
	/* A high score does not beat a protected token's place: the
	 * protected ones are kept whatever their score. */
	m[6].score = 100.0f;
	EXPECT(&pol, 12, 4, 0, 6, 10, 11);
	/* All scores equal: the most recent of the rest. */
	reset(12);
	EXPECT(&pol, 12, 5, 0, 8, 9, 10, 11);
	/* NaN ranks below 0; negative below 0 too. */
	m[9].score = NAN;
	m[8].score = -1.0f;
	EXPECT(&pol, 12, 4, 0, 7, 10, 11);
	/* At the root of the heap too: NaN before -1 in session order. */
	pol.sinks = 0;
	pol.recent = 0;
	reset(2);
	m[0].score = NAN;
	m[1].score = -1.0f;
	EXPECT(&pol, 2, 1, 1);
	m[1].score = NAN;
	EXPECT(&pol, 2, 1, 1); /* NaN ties NaN: the more recent */
}

static void test_importance_weights(void **state)
{
	struct policy pol = make(POLICY_IMPORTANCE, 4);

	pol.sinks = 1;
	pol.recent = 1;
	reset(10);
	for (size_t i = 0; i < 10; i++)
		m[i].role = i % 2 ? ROLE_ASSISTANT : ROLE_USER;
	m[4].score = 3.0f; /* user */
	m[5].score = 1.0f; /* assistant */
	m[7].score = 0.5f; /* assistant */
	/* Weights 1: 4 then 5. */
	EXPECT(&pol, 10, 4, 0, 4, 5, 9);
	/* Assistant × 4: 5 (4.0) and 4 (3.0) still, 7 is 2.0. */
	pol.role_weight[ROLE_ASSISTANT] = 4.0f;
	EXPECT(&pol, 10, 3, 0, 5, 9);
	/* Assistant × 3: 5 ties 4 at 3.0, the more recent (5) wins. */
	pol.role_weight[ROLE_ASSISTANT] = 3.0f;
	EXPECT(&pol, 10, 3, 0, 5, 9);
	/* User × 0 is read as 1 (not 0, which would tie 4 with the zeros). */
	pol.role_weight[ROLE_USER] = 0.0f;
	pol.role_weight[ROLE_ASSISTANT] = 8.0f; /* 5: 8, 7: 4, 4: 3 */
	EXPECT(&pol, 10, 5, 0, 4, 5, 7, 9);
	EXPECT(&pol, 10, 4, 0, 5, 7, 9);
}

static void test_importance_overlap(void **state)
{
	struct policy pol = make(POLICY_IMPORTANCE, 5);

	reset(6);
	/* sinks 2 + recent 8 cover the session: sinks, then the recent
	 * window takes what is left of the budget. */
	pol.sinks = 2;
	pol.recent = 8;
	EXPECT(&pol, 6, 5, 0, 1, 3, 4, 5);
	/* sinks 4, recent 4, budget 5: the recent window gets one. */
	pol.sinks = 4;
	pol.recent = 4;
	m[4].score = 50.0f;
	EXPECT(&pol, 6, 5, 0, 1, 2, 3, 5);
	/* Budget above n: everything. */
	EXPECT(&pol, 6, 100, 0, 1, 2, 3, 4, 5);
}

static void test_role_limits(void **state)
{
	struct policy pol = make(POLICY_WINDOW, 100);

	reset(10);
	for (size_t i = 0; i < 10; i++)
		m[i].role = i % 2 ? ROLE_ASSISTANT : ROLE_USER;
	pol.role_limit[ROLE_USER] = 2;
	/* Under the budget, the limit still drops users 0, 2, 4. */
	EXPECT(&pol, 10, 100, 1, 3, 5, 6, 7, 8, 9);
	/* The window counts only what the limit allows. */
	EXPECT(&pol, 10, 5, 5, 6, 7, 8, 9);
	pol.role_limit[ROLE_USER] = 1;
	EXPECT(&pol, 10, 5, 3, 5, 7, 8, 9);
	/* Importance: a high-scoring user token beyond the limit stays out. */
	pol.kind = POLICY_IMPORTANCE;
	pol.sinks = 1;
	pol.recent = 1;
	m[2].score = 9.0f;
	m[3].score = 1.0f;
	EXPECT(&pol, 10, 3, 1, 3, 9);
	/* Sinks count eligible tokens: the first allowed one is 1. */
	pol.kind = POLICY_SINKS;
	pol.sinks = 2;
	EXPECT(&pol, 10, 3, 1, 3, 9);
	/* A role out of range counts as ROLE_NONE. */
	reset(4);
	for (size_t i = 0; i < 4; i++)
		m[i].role = 7;
	memset(pol.role_limit, 0, sizeof(pol.role_limit));
	pol.role_limit[ROLE_NONE] = 1;
	pol.kind = POLICY_WINDOW;
	EXPECT(&pol, 4, 10, 3);
}

/* 20 tokens: 0..3 the system prompt (permanent, turn 0), then turns 1..4
 * of four tokens each (4..7, 8..11, 12..15, 16..19). */
static void hierarchy_session(void)
{
	reset(20);
	for (size_t i = 0; i < 20; i++) {
		m[i].turn = i < 4 ? 0 : (uint32_t)(i / 4);
		m[i].role = i < 4 ? ROLE_SYSTEM : (i / 4) % 2 ? ROLE_USER : ROLE_ASSISTANT;
		m[i].flags = i < 4 ? TOKEN_PERMANENT : 0;
	}
}

static void expect_layers(const struct policy *pol, size_t n, uint32_t budget, const char *want)
{
	memset(layer, 0xee, sizeof(layer));
	policy_layers(pol, m, n, budget, layer, keep, scratch);
	for (size_t i = 0; i < n; i++) {
		static const char code[] = "PHTR";

		if (layer[i] > LAYER_REST || code[layer[i]] != want[i])
			fail_msg("token %zu: layer %u, want %c (%s)", i, layer[i], want[i], want);
	}
}

static void test_hierarchy(void **state)
{
	struct policy pol = make(POLICY_HIERARCHY, 10);

	hierarchy_session();
	pol.share_permanent = 20; /* 2 of 10 */
	pol.share_hot = 40;	  /* 4 of 10 */
	pol.hot_turns = 2;	  /* turns 3 and 4: 12..19 */
	m[2].score = 5.0f;	  /* permanent beyond its share */
	m[5].score = 4.0f;
	m[13].score = 3.0f; /* hot turn beyond the hot share */
	m[9].score = 2.0f;
	/* Permanent 0, 1 (earliest); hot 16..19 (newest of turns 3-4);
	 * temporary: the 4 best of the rest, 2, 5, 13, 9. */
	EXPECT(&pol, 20, 10, 0, 1, 2, 5, 9, 13, 16, 17, 18, 19);
	expect_layers(&pol, 20, 10, "PPTRRTRRRTRRRTRRHHHH");
	/* A permanent token inside a hot turn is not hot: 18 beyond the
	 * permanent share leaves the hot layer to 19, 17, 16, 15. */
	m[18].flags = TOKEN_PERMANENT;
	m[13].score = 0.0f;
	m[18].score = 0.0f;
	m[11].score = 1.0f;
	EXPECT(&pol, 20, 10, 0, 1, 2, 5, 9, 11, 15, 16, 17, 19);
	expect_layers(&pol, 20, 10, "PPTRRTRRRTRTRRRHHHRH");
}

static void test_hierarchy_spill(void **state)
{
	struct policy pol = make(POLICY_HIERARCHY, 10);

	hierarchy_session();
	for (size_t i = 0; i < 4; i++)
		m[i].flags = 0; /* no permanent tokens at all */
	pol.share_permanent = 20;
	pol.share_hot = 60; /* 6, but the one hot turn has 4 tokens */
	pol.hot_turns = 1;
	m[1].score = 1.0f;
	m[6].score = 0.5f;
	/* Hot 16..19; the 2 + 2 unused go to temporary (6 in all): 1, 6,
	 * then the most recent of the zero scores, 15, 14, 13, 12. */
	EXPECT(&pol, 20, 10, 1, 6, 12, 13, 14, 15, 16, 17, 18, 19);
	expect_layers(&pol, 20, 10, "RTRRRRTRRRRRTTTTHHHH");
	/* Under the budget everything is kept, in its layer. */
	hierarchy_session();
	pol.hot_turns = 2;
	pol.share_permanent = 10; /* of the budget 40: 4 */
	pol.share_hot = 10;	  /* 4 */
	expect_keep(&pol, 20, 40, (const uint32_t[]){0,	 1,  2,	 3,  4,	 5,  6,	 7,  8,	 9,
						     10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
		    20);
	expect_layers(&pol, 20, 40, "PPPPTTTTTTTTTTTTHHHH");
	/* Shares above 100 % (refused by policy_validate) still keep no
	 * more than the budget: permanent 0..3, then what is left, 2, hot. */
	pol.share_permanent = 100;
	pol.share_hot = 100;
	EXPECT(&pol, 20, 6, 0, 1, 2, 3, 18, 19);
}

static void test_hierarchy_turns(void **state)
{
	struct policy pol = make(POLICY_HIERARCHY, 7);
	static const uint32_t turns[8] = {1, 1, 2, 2, 1, 3, 3, 0};

	/* Turns revisited: the last tokens of turns 0, 3, 1, 2 are 7, 6, 4,
	 * 3. The 3 hot turns are 0, 3 and 1, all of their tokens: 0, 1, 4,
	 * 5, 6, 7 (not only the last three runs). */
	reset(8);
	for (size_t i = 0; i < 8; i++)
		m[i].turn = turns[i];
	pol.share_permanent = 0;
	pol.share_hot = 100;
	pol.hot_turns = 3;
	EXPECT(&pol, 8, 7, 0, 1, 3, 4, 5, 6, 7);
	expect_layers(&pol, 8, 7, "HHRTHHHH");
	/* Two hot turns: 0 and 3; the rest by recency. */
	pol.hot_turns = 2;
	expect_layers(&pol, 8, 5, "RRRTTHHH");
	/* An untagged session is one turn: the newest tokens, up to the
	 * hot share (2 of 4), then temporary by score, then recency. */
	reset(8);
	pol.share_hot = 50;
	expect_layers(&pol, 8, 4, "RRRRTTHH");
	m[0].score = 1.0f;
	expect_layers(&pol, 8, 4, "TRRRRTHH");
	pol.share_hot = 100;
	expect_layers(&pol, 8, 4, "RRRRHHHH");
}

/* Summary spans (TOKEN_SUMMARY): kept first under every kind, oldest
 * first, counting against the budget, outside the role limits; the rules
 * share what is left; in a hierarchy they are the permanent layer. */
static void test_summary(void **state)
{
	struct policy pol;

	/* 20 tokens, 14..16 a summary. */
	reset(20);
	for (size_t i = 14; i < 17; i++)
		m[i].flags = TOKEN_SUMMARY | TOKEN_PERMANENT;
	/* Window 8: the summary, then the last 5 others. */
	pol = make(POLICY_WINDOW, 8);
	EXPECT(&pol, 20, 8, 12, 13, 14, 15, 16, 17, 18, 19);
	/* Budget 2, below the summary (the daemon refuses it): its first 2. */
	EXPECT(&pol, 20, 2, 14, 15);
	/* Sinks are the first tokens that are no summary. */
	pol = make(POLICY_SINKS, 8);
	pol.sinks = 2;
	EXPECT(&pol, 20, 8, 0, 1, 14, 15, 16, 17, 18, 19);
	/* Importance 9: the summary (score 0), sink 0, recent 19 18, then by
	 * score 5 (5), 6 (4), then 17 (0, the most recent of the ties). */
	pol = make(POLICY_IMPORTANCE, 9);
	pol.sinks = 1;
	pol.recent = 2;
	m[5].score = 5;
	m[6].score = 4;
	EXPECT(&pol, 20, 9, 0, 5, 6, 14, 15, 16, 17, 18, 19);
	/* A role limit of 2 on ROLE_NONE (every token's role) does not
	 * count or drop the summary. */
	pol = make(POLICY_WINDOW, 8);
	pol.role_limit[ROLE_NONE] = 2;
	EXPECT(&pol, 20, 8, 14, 15, 16, 18, 19);
	/* Hierarchy 10, permanent share 50 % (5): the summary takes 3 of it,
	 * permanent 0, 1 the other 2 (2 spills over); no hot share; the
	 * temporary 5 by score: 5, 6, then 19, 18, 17. */
	for (size_t i = 0; i < 3; i++)
		m[i].flags = TOKEN_PERMANENT;
	pol = make(POLICY_HIERARCHY, 10);
	pol.share_permanent = 50;
	pol.share_hot = 0;
	EXPECT(&pol, 20, 10, 0, 1, 5, 6, 14, 15, 16, 17, 18, 19);
	policy_layers(&pol, m, 20, 10, layer, keep, scratch);
	assert_int_equal(layer[14], LAYER_PERMANENT);
	assert_int_equal(layer[16], LAYER_PERMANENT);
	assert_int_equal(layer[0], LAYER_PERMANENT);
	assert_int_equal(layer[2], LAYER_REST);
	assert_int_equal(layer[5], LAYER_TEMPORARY);
	/* Under other kinds the summary is the permanent layer too. */
	pol = make(POLICY_WINDOW, 8);
	policy_layers(&pol, m, 20, 8, layer, keep, scratch);
	assert_int_equal(layer[15], LAYER_PERMANENT);
	assert_int_equal(layer[19], LAYER_HOT);
	assert_int_equal(layer[11], LAYER_REST);
	/* Exact: everything. */
	pol = make(POLICY_NONE, 0);
	assert_int_equal(policy_select(&pol, m, 20, 0, keep, scratch), 20);
}

static void test_layers_other_kinds(void **state)
{
	struct policy pol = make(POLICY_WINDOW, 3);

	reset(6);
	expect_layers(&pol, 6, 3, "RRRHHH");
	pol.kind = POLICY_SINKS;
	pol.sinks = 1;
	expect_layers(&pol, 6, 3, "HRRRHH");
	pol.kind = POLICY_NONE;
	expect_layers(&pol, 6, 3, "HHHHHH");
}

static void test_budget(void **state)
{
	struct policy pol = make(POLICY_WINDOW, 100);

	pol.grow_pct = 50;
	assert_int_equal(policy_budget(&pol, 0), 100);
	assert_int_equal(policy_budget(&pol, 100), 100);
	assert_int_equal(policy_budget(&pol, 101), 100); /* 0.5 rounds down */
	assert_int_equal(policy_budget(&pol, 102), 101);
	assert_int_equal(policy_budget(&pol, 300), 200);
	pol.budget_max = 150;
	assert_int_equal(policy_budget(&pol, 300), 150);
	assert_int_equal(policy_budget(&pol, 180), 140);
	pol.grow_pct = 0;
	assert_int_equal(policy_budget(&pol, 300), 100);
	pol.grow_pct = 100;
	pol.budget_max = 0;
	assert_int_equal(policy_budget(&pol, 12345), 12345);
	/* No overflow for huge sessions: capped at UINT32_MAX. */
	assert_int_equal(policy_budget(&pol, UINT64_MAX), UINT32_MAX);
	/* (n - budget) × pct would wrap to 0 in 64 bits here. */
	pol.grow_pct = 4;
	assert_int_equal(policy_budget(&pol, 100 + (1ull << 62)), UINT32_MAX);
	pol.grow_pct = 37;
	assert_int_equal(policy_budget(&pol, 100 + 1000000), 100 + 370000);
}

/* Expects a refusal whose reason contains word. */
static void refused(const struct policy *pol, const char *word)
{
	const char *why = NULL;

	assert_int_equal(policy_validate(pol, &why), -EINVAL);
	assert_non_null(why);
	if (!strstr(why, word))
		fail_msg("reason \"%s\" does not mention \"%s\"", why, word);
}

static void test_validate(void **state)
{
	const char *why = "untouched";
	struct policy pol;

	for (unsigned k = POLICY_WINDOW; k <= POLICY_HIERARCHY; k++) {
		pol = make(k, 128);
		assert_int_equal(policy_validate(&pol, &why), 0);
		assert_string_equal(why, "untouched");
		pol.budget = 0;
		refused(&pol, "budget");
	}
	pol = make(POLICY_NONE, 0);
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.kind = 5;
	refused(&pol, "kind");

	pol = make(POLICY_IMPORTANCE, 68); /* sinks 4 + recent 64 */
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.budget = 67;
	refused(&pol, "sinks + recent");
	pol.recent = UINT32_MAX; /* no wrap-around */
	pol.budget = 100;
	refused(&pol, "sinks + recent");
	pol = make(POLICY_SINKS, 4);
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.budget = 3;
	refused(&pol, "sinks");
	/* A window does not use sinks or recent. */
	pol = make(POLICY_WINDOW, 8);
	assert_int_equal(policy_validate(&pol, NULL), 0);

	pol = make(POLICY_WINDOW, 100);
	pol.budget_max = 99;
	refused(&pol, "budget_max");
	pol.budget_max = 100;
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.grow_pct = 101;
	refused(&pol, "grow_pct");

	pol = make(POLICY_HIERARCHY, 100);
	pol.share_permanent = 60;
	pol.share_hot = 40;
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.share_hot = 41;
	refused(&pol, "shares");
	pol.share_permanent = 200;
	pol.share_hot = 0;
	refused(&pol, "shares");
	pol = make(POLICY_HIERARCHY, 100);
	pol.hot_turns = 0;
	refused(&pol, "hot_turns");

	pol = make(POLICY_IMPORTANCE, 100);
	pol.decay = 0.0f;
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.decay = -0.1f;
	refused(&pol, "decay");
	pol.decay = NAN;
	refused(&pol, "decay");
	pol.decay = INFINITY;
	refused(&pol, "decay");
	pol = make(POLICY_IMPORTANCE, 100);
	pol.role_weight[ROLE_USER] = 0.0f;
	assert_int_equal(policy_validate(&pol, NULL), 0);
	pol.role_weight[ROLE_ASSISTANT] = -1.0f;
	refused(&pol, "weight");
	pol.role_weight[ROLE_ASSISTANT] = NAN;
	refused(&pol, "weight");
}

static void test_add_mass(void **state)
{
	const float l = 0.5f, f = expf(-0.5f);
	const float mass[3] = {1.0f, -1.0f, NAN};
	const float inf_mass[1] = {INFINITY};

	reset(4);
	m[0].score = 1.0f;
	m[1].score = 2.0f;
	m[3].score = 4.0f;
	policy_add_mass(m, 4, l, 0, mass, 3);
	assert_near(m[0].score, 1.0f * f + 1.0f, 1e-6);
	assert_near(m[1].score, 2.0f * f, 1e-6); /* -1 counts as 0 */
	assert_near(m[2].score, 0.0f, 0);	 /* NaN counts as 0 */
	assert_near(m[3].score, 4.0f * f, 1e-6);
	/* A second report with no mass: one step older, exp(-2λ) in all. */
	policy_add_mass(m, 4, l, 0, NULL, 0);
	assert_near(m[3].score, 4.0f * expf(-1.0f), 1e-6);
	/* An offset report; an infinite mass counts as 0. */
	policy_add_mass(m, 4, 0.0f, 2, inf_mass, 1);
	assert_near(m[2].score, 0.0f, 0);
	policy_add_mass(m, 4, 0.0f, 2, mass, 2);
	assert_near(m[2].score, 1.0f, 0);
	assert_near(m[3].score, 4.0f * expf(-1.0f), 1e-6); /* λ 0: no decay */
	/* Masses past the end of the session are not read. */
	policy_add_mass(m, 4, 0.0f, 3, (const float[]){2.0f, 1e30f, 1e30f}, 3);
	assert_near(m[3].score, 4.0f * expf(-1.0f) + 2.0f, 1e-6);
	assert_near(m[2].score, 1.0f, 0);
	assert_near(m[4].score, 0.0f, 0); /* m[] holds MAX_N: would show a write */
	/* Many reports: a constant mass converges to 1 / (1 - exp(-λ)). */
	reset(1);
	for (int i = 0; i < 2000; i++)
		policy_add_mass(m, 1, 0.01f, 0, mass, 1);
	assert_near(m[0].score, 1.0f / (1.0f - expf(-0.01f)), 0.05);
}

/* 1000 tokens, random scores: importance keeps exactly the sinks, the
 * recent window and the best of the rest, ascending. */
static void test_importance_random(void **state)
{
	struct policy pol = make(POLICY_IMPORTANCE, 200);
	const size_t n = 1000;
	uint64_t s = 42;
	static uint32_t first[200];
	uint8_t in[1000] = {0};
	float worst_kept = INFINITY, best_dropped = -INFINITY;
	size_t k;

	pol.sinks = 4;
	pol.recent = 32;
	reset(n);
	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		m[i].score = (float)(s >> 40) / (float)(1u << 24);
	}
	k = policy_select(&pol, m, n, 200, keep, scratch);
	assert_int_equal(k, 200);
	for (size_t i = 0; i < k; i++) {
		if (i)
			assert_true(keep[i] > keep[i - 1]);
		in[keep[i]] = 1;
	}
	for (size_t i = 0; i < n; i++) {
		if (i < 4 || i >= n - 32) {
			assert_int_equal(in[i], 1);
			continue;
		}
		if (in[i] && m[i].score < worst_kept)
			worst_kept = m[i].score;
		if (!in[i] && m[i].score > best_dropped)
			best_dropped = m[i].score;
	}
	assert_true(worst_kept >= best_dropped);
	/* The same input gives the same answer, whatever the arrays held. */
	memcpy(first, keep, k * sizeof(keep[0]));
	memset(keep, 0x77, sizeof(keep));
	memset(scratch, 0x33, sizeof(scratch));
	assert_int_equal(policy_select(&pol, m, n, 200, keep, scratch), 200);
	assert_memory_equal(keep, first, 200 * sizeof(keep[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_none_keeps_everything),
		cmocka_unit_test(test_window),
		cmocka_unit_test(test_sinks),
		cmocka_unit_test(test_importance_scores),
		cmocka_unit_test(test_importance_weights),
		cmocka_unit_test(test_importance_overlap),
		cmocka_unit_test(test_role_limits),
		cmocka_unit_test(test_hierarchy),
		cmocka_unit_test(test_hierarchy_spill),
		cmocka_unit_test(test_hierarchy_turns),
		cmocka_unit_test(test_summary),
		cmocka_unit_test(test_layers_other_kinds),
		cmocka_unit_test(test_budget),
		cmocka_unit_test(test_validate),
		cmocka_unit_test(test_add_mass),
		cmocka_unit_test(test_importance_random),
	};

	return cmocka_run_group_tests_name("policy", tests, NULL, NULL);
}
