/* daemon/base/policy.c — token policies and layers (see policy.h): which tokens
 * of a session stay when it outgrows its budget, and which layer each one
 * belongs to.
 *
 * Everything works on the caller's arrays: keep[] first holds a state per
 * token (dropped by a role limit, free, or kept in a layer), and is
 * compacted in place into the ascending indexes at the end; scratch[] holds
 * candidate indexes for the heaps that rank tokens (the top scores) and
 * sort them (by turn, to find the hot turns). No allocation, no state,
 * O(n log n) at worst; deterministic: equal keys are ordered by index, the
 * more recent token first.
 *
 * Choices the header leaves open, made here:
 *  - role limits are applied first: every other rule (sinks, windows,
 *    shares) counts only the tokens the limits allow, so a budget is
 *    never spent on a token a limit drops; POLICY_NONE ignores them
 *    (exact: every token is kept), and so does an unknown kind;
 *  - roles out of range count as ROLE_NONE; a weight that is not > 0 is
 *    read as 1; a NaN score (or score × weight) ranks below every number;
 *  - HIERARCHY shares are percentages of the budget passed in, rounded
 *    down; permanent tokens beyond their share, and hot tokens beyond
 *    theirs, compete for the temporary layer by score like the others;
 *  - the hot turns are the hot_turns distinct turn values whose last token
 *    (among eligible tokens without TOKEN_PERMANENT) is the most recent;
 *    turn 0 (untagged) is a value like any other, so an untagged session
 *    has one turn and its hot layer is the newest tokens.
 *  - summary spans (TOKEN_SUMMARY) are marked kept first, in session
 *    order, before the role limits, which skip them; the rules then run
 *    on the budget left, and a hierarchy's permanent share loses what the
 *    summaries took of it;
 *  - policy_validate checks sinks against the budget for SINKS, sinks +
 *    recent for IMPORTANCE (a window and a hierarchy use neither, so the
 *    defaults' recent 64 does not bind them), and also refuses grow_pct
 *    above 100 and a hierarchy with hot_turns 0 (the fields' ranges).
 *
 * Thread-safe: pure functions.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "policy.h"

/* keep[i] while choosing: a state in the low bits, flags above. */
enum {
	ST_DROP = 0, /* a role limit drops it */
	ST_FREE = 1, /* eligible, not chosen (yet) */
	ST_PERM = 2, /* kept: LAYER_PERMANENT */
	ST_HOT = 3,  /* kept: LAYER_HOT (every kept token of the other kinds) */
	ST_TEMP = 4, /* kept: LAYER_TEMPORARY */
	ST_MASK = 0xfu,
	FL_LAST = 0x10u,   /* HIERARCHY: the last token of its turn */
	FL_HOTTURN = 0x20u /* HIERARCHY: a token of a hot turn */
};

static inline uint32_t state(uint32_t v)
{
	return v & ST_MASK;
}

static inline bool kept(uint32_t v)
{
	uint32_t s = state(v);

	return s == ST_PERM || s == ST_HOT || s == ST_TEMP;
}

void policy_defaults(struct policy *pol, enum policy_kind kind)
{
	memset(pol, 0, sizeof(*pol));
	pol->kind = (uint8_t)kind;
	pol->share_permanent = 10;
	pol->share_hot = 30;
	pol->sinks = 4;
	pol->recent = 64;
	pol->hot_turns = 4;
	pol->decay = 0.01f;
	for (unsigned r = 0; r < POLICY_N_ROLES; r++)
		pol->role_weight[r] = 1.0f;
}

int policy_validate(const struct policy *pol, const char **why)
{
	const char *w = NULL;

	if (pol->kind > POLICY_HIERARCHY)
		w = "unknown policy kind";
	else if (pol->kind != POLICY_NONE && pol->budget == 0)
		w = "budget 0 for a policy that drops tokens";
	else if (pol->budget_max != 0 && pol->budget_max < pol->budget)
		w = "budget_max below budget";
	else if (pol->grow_pct > 100)
		w = "grow_pct above 100";
	else if (pol->kind == POLICY_SINKS && pol->sinks > pol->budget)
		w = "sinks above the budget";
	else if (pol->kind == POLICY_IMPORTANCE &&
		 (uint64_t)pol->sinks + pol->recent > (uint64_t)pol->budget)
		w = "sinks + recent above the budget";
	else if (pol->share_permanent > 100 || pol->share_hot > 100 ||
		 pol->share_permanent + pol->share_hot > 100)
		w = "shares above 100 %";
	else if (pol->kind == POLICY_HIERARCHY && pol->hot_turns == 0)
		w = "hot_turns 0 for a hierarchy";
	else if (!isfinite(pol->decay) || pol->decay < 0)
		w = "decay negative or not finite";
	for (unsigned r = 0; !w && r < POLICY_N_ROLES; r++)
		if (!isfinite(pol->role_weight[r]) || pol->role_weight[r] < 0)
			w = "role weight negative or not finite";
	if (!w)
		return 0;
	if (why)
		*why = w;
	return -EINVAL;
}

uint32_t policy_budget(const struct policy *pol, uint64_t n)
{
	uint64_t b = pol->budget;
	uint32_t pct = pol->grow_pct > 100 ? 100 : pol->grow_pct;

	if (n > b)
		b += (n - b) / 100 * pct + (n - b) % 100 * pct / 100;
	if (pol->budget_max && b > pol->budget_max)
		b = pol->budget_max;
	return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}

/* ---- ranking ------------------------------------------------------------ */

static inline unsigned role_index(uint8_t role)
{
	return role < POLICY_N_ROLES ? role : ROLE_NONE;
}

struct rank {
	const struct policy *pol;
	const struct token_meta *m;
};

/* Score × role weight; NaN ranks below everything. */
static float rank_key(const struct rank *rk, uint32_t i)
{
	float w = rk->pol->role_weight[role_index(rk->m[i].role)];
	float k;

	if (!(w > 0))
		w = 1.0f;
	k = rk->m[i].score * w;
	return isnan(k) ? -INFINITY : k;
}

/* A heap's order: nonzero when a comes out before b. */
typedef int (*before_fn)(const void *ctx, uint32_t a, uint32_t b);

/* The higher key first; on a tie the more recent token. */
static int higher_rank(const void *ctx, uint32_t a, uint32_t b)
{
	float ka = rank_key(ctx, a), kb = rank_key(ctx, b);

	return ka > kb || (ka == kb && a > b);
}

/* The larger (turn, index) first: heapsort then leaves them ascending. */
static int later_turn(const void *ctx, uint32_t a, uint32_t b)
{
	const struct token_meta *m = ctx;

	return m[a].turn > m[b].turn || (m[a].turn == m[b].turn && a > b);
}

static void sift_down(uint32_t *h, size_t n, size_t i, before_fn before, const void *ctx)
{
	for (;;) {
		size_t l = 2 * i + 1, top = i;
		uint32_t t;

		if (l < n && before(ctx, h[l], h[top]))
			top = l;
		if (l + 1 < n && before(ctx, h[l + 1], h[top]))
			top = l + 1;
		if (top == i)
			return;
		t = h[i];
		h[i] = h[top];
		h[top] = t;
		i = top;
	}
}

static void heap_build(uint32_t *h, size_t n, before_fn before, const void *ctx)
{
	for (size_t i = n / 2; i-- > 0;)
		sift_down(h, n, i, before, ctx);
}

/* Sorts h[0..n) so that h[i] comes out before h[j] is false for i < j. */
static void heap_sort(uint32_t *h, size_t n, before_fn before, const void *ctx)
{
	heap_build(h, n, before, ctx);
	for (size_t end = n; end > 1; end--) {
		uint32_t t = h[0];

		h[0] = h[end - 1];
		h[end - 1] = t;
		sift_down(h, end - 1, 0, before, ctx);
	}
}

/* Gives up to `want` free tokens of st[] state `to`, the highest ranked
 * first; returns how many. */
static size_t take_top(const struct policy *pol, const struct token_meta *m, size_t n, uint32_t *st,
		       uint32_t *scratch, size_t want, uint32_t to)
{
	struct rank rk = {pol, m};
	size_t c = 0, got = 0;

	if (!want)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (state(st[i]) == ST_FREE)
			scratch[c++] = (uint32_t)i;
	heap_build(scratch, c, higher_rank, &rk);
	while (got < want && c > 0) {
		uint32_t i = scratch[0];

		scratch[0] = scratch[--c];
		sift_down(scratch, c, 0, higher_rank, &rk);
		st[i] = to;
		got++;
	}
	return got;
}

/* The first `want` free tokens, in session order. */
static size_t take_first(uint32_t *st, size_t n, size_t want, uint32_t to)
{
	size_t got = 0;

	for (size_t i = 0; i < n && got < want; i++)
		if (state(st[i]) == ST_FREE) {
			st[i] = to;
			got++;
		}
	return got;
}

/* The last `want` free tokens. */
static size_t take_last(uint32_t *st, size_t n, size_t want, uint32_t to)
{
	size_t got = 0;

	for (size_t i = n; i-- > 0 && got < want;)
		if (state(st[i]) == ST_FREE) {
			st[i] = to;
			got++;
		}
	return got;
}

/* ---- the hierarchy ---------------------------------------------------------- */

static size_t pct_of(uint32_t budget, unsigned pct)
{
	return (size_t)((uint64_t)budget * (pct > 100 ? 100 : pct) / 100);
}

/* The hot layer: flags the tokens of the hot_turns turns whose last token
 * is the most recent (free, not TOKEN_PERMANENT), then keeps them newest
 * first, at most `want`. O(c log c) for c candidates. */
static size_t take_hot(const struct policy *pol, const struct token_meta *m, size_t n, uint32_t *st,
		       uint32_t *scratch, size_t want)
{
	size_t c = 0, got = 0, lo = 0, turns = 0;

	if (!want || !pol->hot_turns)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (state(st[i]) == ST_FREE && !(m[i].flags & TOKEN_PERMANENT))
			scratch[c++] = (uint32_t)i;
	if (!c)
		return 0;
	/* Groups of equal turns, each in session order: the last of each
	 * group is its turn's last token. */
	heap_sort(scratch, c, later_turn, m);
	for (size_t g = 0; g < c; g++)
		if (g + 1 == c || m[scratch[g + 1]].turn != m[scratch[g]].turn)
			st[scratch[g]] |= FL_LAST;
	/* lo: the last token of the hot_turns-th most recent turn. */
	for (size_t i = n; i-- > 0;)
		if ((st[i] & FL_LAST) && ++turns == pol->hot_turns) {
			lo = i;
			break;
		}
	for (size_t g0 = 0, g = 0; g < c; g++) {
		if (g + 1 < c && m[scratch[g + 1]].turn == m[scratch[g]].turn)
			continue;
		if (scratch[g] >= lo)
			for (size_t j = g0; j <= g; j++)
				st[scratch[j]] |= FL_HOTTURN;
		g0 = g + 1;
	}
	for (size_t i = n; i-- > 0 && got < want;)
		if (state(st[i]) == ST_FREE && (st[i] & FL_HOTTURN)) {
			st[i] = ST_HOT;
			got++;
		}
	return got;
}

/* b: the budget left after the n_sum summary tokens, which take from the
 * permanent share first. */
static size_t take_hierarchy(const struct policy *pol, const struct token_meta *m, size_t n,
			     uint32_t budget, size_t b, size_t n_sum, uint32_t *st,
			     uint32_t *scratch)
{
	size_t share_perm = pct_of(budget, pol->share_permanent);
	size_t share_hot = pct_of(budget, pol->share_hot);
	size_t got = 0;

	share_perm = share_perm > n_sum ? share_perm - n_sum : 0;
	if (share_perm > b)
		share_perm = b;
	for (size_t i = 0; i < n && got < share_perm; i++)
		if (state(st[i]) == ST_FREE && (m[i].flags & TOKEN_PERMANENT)) {
			st[i] = ST_PERM;
			got++;
		}
	if (share_hot > b - got)
		share_hot = b - got;
	got += take_hot(pol, m, n, st, scratch, share_hot);
	got += take_top(pol, m, n, st, scratch, b - got, ST_TEMP);
	return got;
}

/* ---- selection ---------------------------------------------------------------- */

/* Marks st[i] with the state of every token (the flags may remain);
 * returns how many are kept. */
static size_t choose(const struct policy *pol, const struct token_meta *m, size_t n,
		     uint32_t budget, uint32_t *st, uint32_t *scratch)
{
	uint32_t seen[POLICY_N_ROLES] = {0};
	size_t elig = 0, n_sum = 0, b, s, r;

	if (pol->kind == POLICY_NONE || pol->kind > POLICY_HIERARCHY) {
		for (size_t i = 0; i < n; i++)
			st[i] = ST_HOT;
		return n;
	}
	/* Summary spans before everything, oldest first, outside the role
	 * limits: the permanent layer under every kind. */
	for (size_t i = 0; i < n; i++) {
		st[i] = ST_FREE;
		if (m[i].flags & TOKEN_SUMMARY) {
			st[i] = n_sum < budget ? ST_PERM : ST_DROP;
			n_sum += n_sum < budget;
		}
	}
	budget -= (uint32_t)n_sum;
	/* Role limits: only the last role_limit[r] tokens of role r. */
	for (size_t i = n; i-- > 0;) {
		unsigned role = role_index(m[i].role);
		uint32_t lim = pol->role_limit[role];

		if (m[i].flags & TOKEN_SUMMARY)
			continue;
		if (lim && seen[role] >= lim) {
			st[i] = ST_DROP;
		} else {
			st[i] = ST_FREE;
			elig++;
		}
		if (seen[role] < UINT32_MAX)
			seen[role]++;
	}
	b = budget < elig ? budget : elig;
	if (b == elig && pol->kind != POLICY_HIERARCHY) {
		for (size_t i = 0; i < n; i++)
			if (st[i] == ST_FREE)
				st[i] = ST_HOT;
		return n_sum + elig;
	}
	switch (pol->kind) {
	case POLICY_WINDOW:
		return n_sum + take_last(st, n, b, ST_HOT);
	case POLICY_SINKS:
		s = take_first(st, n, pol->sinks < b ? pol->sinks : b, ST_HOT);
		return n_sum + s + take_last(st, n, b - s, ST_HOT);
	case POLICY_IMPORTANCE:
		s = take_first(st, n, pol->sinks < b ? pol->sinks : b, ST_HOT);
		r = take_last(st, n, pol->recent < b - s ? pol->recent : b - s, ST_HOT);
		return n_sum + s + r + take_top(pol, m, n, st, scratch, b - s - r, ST_HOT);
	default: /* POLICY_HIERARCHY: shares of the whole budget */
		return n_sum +
		       take_hierarchy(pol, m, n, budget + (uint32_t)n_sum, b, n_sum, st, scratch);
	}
}

size_t policy_select(const struct policy *pol, const struct token_meta *m, size_t n,
		     uint32_t budget, uint32_t *keep, uint32_t *scratch)
{
	size_t k = 0;

	choose(pol, m, n, budget, keep, scratch);
	/* In place: index k <= i is written after keep[i] is read. */
	for (size_t i = 0; i < n; i++)
		if (kept(keep[i]))
			keep[k++] = (uint32_t)i;
	return k;
}

void policy_layers(const struct policy *pol, const struct token_meta *m, size_t n, uint32_t budget,
		   uint8_t *layer, uint32_t *keep, uint32_t *scratch)
{
	choose(pol, m, n, budget, keep, scratch);
	for (size_t i = 0; i < n; i++) {
		switch (state(keep[i])) {
		case ST_PERM:
			layer[i] = LAYER_PERMANENT;
			break;
		case ST_HOT:
			layer[i] = LAYER_HOT;
			break;
		case ST_TEMP:
			layer[i] = LAYER_TEMPORARY;
			break;
		default:
			layer[i] = LAYER_REST;
			break;
		}
	}
}

void policy_add_mass(struct token_meta *m, size_t n, float decay, size_t first, const float *mass,
		     size_t n_mass)
{
	float f = decay > 0 && isfinite(decay) ? expf(-decay) : 1.0f;

	if (f != 1.0f)
		for (size_t i = 0; i < n; i++)
			m[i].score *= f;
	if (first >= n)
		return;
	if (n_mass > n - first)
		n_mass = n - first;
	for (size_t i = 0; i < n_mass; i++)
		if (isfinite(mass[i]) && mass[i] > 0)
			m[first + i].score += mass[i];
}
