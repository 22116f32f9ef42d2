/* daemon/base/policy.h — which tokens a session keeps when it outgrows its
 * budget, and which layer each token belongs to.
 *
 * Pure functions over a session's per-token metadata: no daemon state, no
 * allocation beyond what the caller passes, so the daemon (session
 * compaction, tier placement), the unit tests and the benchmarks that
 * measure attention error (bench/) run the same code.
 *
 * Token policies (a session's pol.kind):
 *  - POLICY_WINDOW: the last `budget` tokens (a sliding window);
 *  - POLICY_SINKS: the first `sinks` tokens and the last budget - sinks
 *    (StreamingLLM's attention sinks + window);
 *  - POLICY_IMPORTANCE: the first `sinks`, the last `recent`, and of the
 *    rest those with the highest score × role weight (H2O-style heavy
 *    hitters; scores are accumulated attention mass with recency decay,
 *    policy_add_mass);
 *  - POLICY_HIERARCHY: three layers over spans the client tagged
 *    (role, turn, permanent): permanent tokens first (system prompt, user
 *    profile, summary) up to share_permanent % of the budget, then the
 *    tokens of the last hot_turns turns up to share_hot %, newest first,
 *    then temporary: the remaining budget to the other tokens by score ×
 *    role weight. A layer's unused share goes to the temporary layer.
 * Summary spans (TOKEN_SUMMARY: K/V of a summary the client computed, issue
 * 22) come before every rule of every dropping kind: all of them are kept,
 * oldest first, each counting one token of the budget, and the rules share
 * what is left (SINKS' and IMPORTANCE's sinks are the first tokens that
 * are not summaries); in a hierarchy they are the permanent layer's first
 * tokens and count in its share. Role limits do not apply to them. The
 * daemon keeps them at most the budget (compact.h); should they be more,
 * the first `budget` of them are kept and nothing else.
 * Per-role limits apply under every policy: role_limit[r] > 0 lets only the
 * last role_limit[r] tokens of role r be kept at all (say, a short window
 * over user turns while assistant turns are ranked by importance).
 *
 * A session's budget may grow with its length (policy_budget): budget +
 * grow_pct % of the tokens beyond it, at most budget_max.
 */
#ifndef KVPD_POLICY_H
#define KVPD_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* Values are part of the protocol (proto/kvpalace.proto, enum Policy). */
enum policy_kind {
	POLICY_NONE = 0, /* exact: every token is kept */
	POLICY_WINDOW = 1,
	POLICY_SINKS = 2,
	POLICY_IMPORTANCE = 3,
	POLICY_HIERARCHY = 4,
};

/* Values are part of the protocol (enum Role). */
enum token_role {
	ROLE_NONE = 0,
	ROLE_SYSTEM = 1,
	ROLE_USER = 2,
	ROLE_ASSISTANT = 3,
};
#define POLICY_N_ROLES 4u

#define TOKEN_PERMANENT 0x1u /* token_meta.flags: system prompt, profile, summary */
#define TOKEN_SUMMARY	0x2u /* a summary span's token (with TOKEN_PERMANENT): always kept */

/* Layers of policy_layers. */
enum token_layer {
	LAYER_PERMANENT = 0,
	LAYER_HOT = 1,
	LAYER_TEMPORARY = 2,
	LAYER_REST = 3, /* outside the budget: dropped by compaction */
};

/* What a session knows about each of its tokens, in session order. */
struct token_meta {
	uint32_t pos;  /* original position in the sequence (kept through compaction) */
	uint32_t turn; /* conversation turn the client tagged, 0 when untagged */
	float score;   /* accumulated attention mass, decayed */
	uint8_t role;  /* enum token_role */
	uint8_t flags; /* TOKEN_PERMANENT */
	uint16_t pad;
};

struct policy {
	uint8_t kind;		 /* enum policy_kind */
	uint8_t auto_compact;	 /* compact when a commit takes the session past its budget */
	uint8_t share_permanent; /* HIERARCHY: percent of the budget, 0..100 */
	uint8_t share_hot;	 /* HIERARCHY: percent; permanent + hot <= 100 */
	uint32_t budget;	 /* tokens kept at most (>= 1 unless kind is NONE) */
	uint32_t budget_max;	 /* dynamic budget cap, >= budget; 0 = budget */
	uint32_t grow_pct;	 /* percent of tokens beyond budget added to it, 0..100 */
	uint32_t sinks;		 /* SINKS, IMPORTANCE: first tokens always kept */
	uint32_t recent;	 /* IMPORTANCE: last tokens always kept */
	uint32_t hot_turns;	 /* HIERARCHY: turns in the hot layer, >= 1 */
	float decay;		 /* λ of score·exp(-λ·age), age in reports; >= 0 */
	uint32_t role_limit[POLICY_N_ROLES]; /* 0: no limit */
	float role_weight[POLICY_N_ROLES];   /* score multiplier; 0 is read as 1 */
};

/* Defaults for a kind: budget 0 (to be set), sinks 4, recent 64,
 * hot_turns 4, shares 10 % / 30 %, decay 0.01, no role limits, weights 1. */
void policy_defaults(struct policy *pol, enum policy_kind kind);

/* 0 when pol is consistent, else -EINVAL with *why saying what is wrong:
 * a kind out of range, budget 0 for a dropping kind, budget_max below
 * budget, grow_pct above 100, sinks above the budget (SINKS), sinks +
 * recent above the budget (IMPORTANCE: the default recent of 64 needs a
 * budget of 68 or more), shares above 100 %, hot_turns 0 (HIERARCHY), a
 * negative or non-finite decay or role weight. */
int policy_validate(const struct policy *pol, const char **why);

/* The budget for a session of n tokens: budget + grow_pct % of (n -
 * budget) when n exceeds it, capped at budget_max (when set). */
uint32_t policy_budget(const struct policy *pol, uint64_t n);

/* Chooses the tokens to keep of m[0..n) under pol with budget tokens at
 * most: writes their indexes, ascending, to keep[] and returns how many
 * (n itself when n <= budget and no role limit drops any, or for
 * POLICY_NONE). scratch must hold n uint32_t. Deterministic: ties in score
 * go to the more recent token. */
size_t policy_select(const struct policy *pol, const struct token_meta *m, size_t n,
		     uint32_t budget, uint32_t *keep /* [n] */, uint32_t *scratch /* [n] */);

/* The layer of every token (enum token_layer) under pol's hierarchy with
 * the given budget: for exact sessions the layers decide tier placement
 * instead of dropping anything. Kinds other than HIERARCHY: LAYER_HOT for
 * what policy_select keeps, LAYER_REST for the others. scratch as above. */
void policy_layers(const struct policy *pol, const struct token_meta *m, size_t n, uint32_t budget,
		   uint8_t *layer /* [n] */, uint32_t *keep /* [n] */, uint32_t *scratch /* [n] */);

/* One importance report: every score decays by exp(-decay) (one step
 * older), then mass[i] is added to m[first + i] for i < n_mass. Masses
 * that are negative or not finite count as 0. first + n_mass <= n. */
void policy_add_mass(struct token_meta *m, size_t n, float decay, size_t first, const float *mass,
		     size_t n_mass);

#endif
