/* bench/trace_gen.c — generates, writes and reads the conversation traces
 * kvp-bench-trace replays (trace_gen.h).
 *
 * The model (every figure is a field of struct trace_params; the defaults
 * are trace_params_default's and what bench/run uses, with the seed it
 * names):
 *  - n_system (4) shared system prompts, each of a length drawn uniformly
 *    in [256, 1024] tokens; a new conversation picks prompt k (0-based)
 *    with probability ∝ 1 / (k + 1)^s, Zipf with s = 1.0 (for 4 prompts:
 *    48 %, 24 %, 16 %, 12 %). Lengths are not page multiples, so the page
 *    holding a prompt's end is private to each conversation, as in life.
 *  - n_users users. Each user's first request comes at a time uniform in
 *    [0, later_mean_s); after each request the user comes back "soon"
 *    with probability p_soon (0.75), after an exponential gap of mean
 *    soon_mean_s (30 s: reads the reply, types the next message), else
 *    "later", exponential of mean later_mean_s (1,200 s: comes back after
 *    many other users' requests). Requests are ordered by time; with U
 *    users a short gap sees about U/11 other requests in between and a
 *    long one about 3.7·U (the mean gap is 322 s).
 *  - On each return the user starts a new conversation with probability
 *    p_new_after_soon (0.05) after a short gap and p_new_after_later (0.5)
 *    after a long one; always after max_turns (24) turns, or when the next
 *    request (history + message + reply) would exceed max_context_tokens
 *    (8,192). Each new conversation draws its system prompt afresh.
 *  - A turn's user message and assistant reply have lognormal lengths of
 *    mean 64 (sigma 1.0) and 192 (sigma 0.8) tokens (sigma of the
 *    underlying normal; mu = ln(mean) - sigma²/2), rounded, clamped to
 *    [4, 1024] and [8, 2048].
 *  - Request = prompt (system prompt + every earlier turn + the new user
 *    message) then the reply. Stops after n_requests requests.
 *
 * The production-like shape (shape = TRACE_SHAPE_PROD, trace_params_shape),
 * counted in requests, not seconds, as production traces measured it:
 *  - every request starts with one short shared block of
 *    system_block_tokens (32: two 16-token pages), so a match that finds
 *    a page or two says nothing;
 *  - a new conversation opens, with probability p_doc (0.3), on one of
 *    n_system - 1 (32) shared documents (Zipf s = zipf_s, 1.0, over
 *    them) of lognormal length, mean doc_mean_tokens (384) and sigma
 *    doc_sigma (1.0), clamped to [16, 4096]: popular prefixes reused
 *    across users at every depth; then a first user message of lognormal
 *    length, mean first_mean_tokens (320, sigma 1.0, clamped [4, 2048]):
 *    the long unique first prompt of chat services;
 *  - after each turn the conversation goes on with probability
 *    p_continue (0.25), at most max_turns (24) turns, while it fits
 *    max_context_tokens (8,192): most conversations have one turn and
 *    every one a last, so about three quarters of the blocks are never
 *    used again (kvp-bench-trace prints the share);
 *  - its next turn comes after a lognormal number of other requests,
 *    median gap_median_reqs (400), sigma gap_sigma (1.0): longer than an
 *    LRU cache of a few thousand pages remembers. A request slot serves
 *    the turn whose time has come (earliest first), else opens a new
 *    conversation; later turns' user messages and replies are as in the
 *    chat shape (user_*: mean 48, reply_*: mean 24 tokens here). Each
 *    conversation is its own user (user = conversation mod n_users).
 * The long-documents shape (TRACE_SHAPE_DOCS) is the same with p_doc
 * 0.8 over 16 documents of mean 2,048 tokens (sigma 0.5), first messages of mean 48, max_context_tokens 16,384.
 * In both, "system prompt" K > 0 is the shared block followed by
 * document K (token i: trace_token(seed, 0, i) inside the block,
 * trace_token(seed, K, i) after it); system prompt 0 is the block alone.
 *
 * All randomness comes from one splitmix64 stream seeded with the seed, in
 * a fixed order, so a seed names a trace; token ids come from trace_token
 * (position-addressed, not from the stream), so a conversation's history
 * has the same ids in every later request.
 *
 * File format (text, one record a line, '#' lines are comments):
 *	kvpalace-trace 1
 *	param KEY VALUE          the generator's parameters, seed included
 *	system K LENGTH          system prompt K (0-based) of LENGTH tokens
 *	req T USER CONV SYSTEM TURN GAP PROMPT REPLY
 * one req line per request in arrival order: virtual time T (s), the
 * user, the conversation (numbered from 0 in order of first request), its
 * system prompt, the turn (0 first), the gap before it (0 first request,
 * 1 soon, 2 later), the prompt's and the reply's lengths in tokens. Token
 * ids are not stored: trace_read regenerates them with trace_token from
 * the seed param, the system prompt's number and the conversation's.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "trace_gen.h"

void trace_params_default(struct trace_params *p)
{
	*p = (struct trace_params){
		.seed = 1,
		.n_users = 200,
		.n_requests = 20000,
		.n_system = 4,
		.system_min_tokens = 256,
		.system_max_tokens = 1024,
		.zipf_s = 1.0,
		.user_mean_tokens = 64,
		.user_sigma = 1.0,
		.reply_mean_tokens = 192,
		.reply_sigma = 0.8,
		.p_soon = 0.75,
		.soon_mean_s = 30,
		.later_mean_s = 1200,
		.p_new_after_soon = 0.05,
		.p_new_after_later = 0.5,
		.max_turns = 24,
		.max_context_tokens = 8192,
	};
}

int trace_params_shape(struct trace_params *p, uint32_t shape)
{
	trace_params_default(p);
	if (shape == TRACE_SHAPE_CHAT)
		return 0;
	if (shape >= TRACE_N_SHAPES)
		return -EINVAL;
	p->shape = shape;
	p->n_users = 100000;
	p->system_block_tokens = 32;
	p->n_system = 33;
	p->zipf_s = 1.0;
	p->p_doc = 0.3;
	p->doc_mean_tokens = 384;
	p->doc_sigma = 1.0;
	p->first_mean_tokens = 320;
	p->first_sigma = 1.0;
	p->user_mean_tokens = 48;
	p->reply_mean_tokens = 24;
	p->p_continue = 0.25;
	p->gap_median_reqs = 400;
	p->gap_sigma = 1.0;
	if (shape == TRACE_SHAPE_DOCS) {
		p->n_system = 17;
		p->p_doc = 0.8;
		p->doc_mean_tokens = 2048;
		p->doc_sigma = 0.5;
		p->first_mean_tokens = 48;
		p->max_context_tokens = 16384;
	}
	return 0;
}

static const char *const shape_names[TRACE_N_SHAPES] = {"chat", "prod", "docs"};

int trace_shape_parse(const char *name)
{
	for (int i = 0; i < TRACE_N_SHAPES; i++)
		if (!strcmp(name, shape_names[i]))
			return i;
	return -EINVAL;
}

const char *trace_shape_name(uint32_t shape)
{
	return shape < TRACE_N_SHAPES ? shape_names[shape] : "?";
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint32_t trace_token(uint64_t seed, uint64_t stream, uint64_t i)
{
	uint64_t s = seed ^ (stream * 0xd1b54a32d192ed03ull) ^ (i * 0xabc98388fb8fac03ull);

	return 1000u + (uint32_t)(splitmix64(&s) % 150000u);
}

static uint64_t conv_stream(uint32_t conv)
{
	return 0x100000000ull + conv;
}

/* Uniform in [0, 1). */
static double uniform(uint64_t *s)
{
	return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

static double exponential(uint64_t *s, double mean)
{
	return -mean * log(1.0 - uniform(s));
}

static double normal(uint64_t *s)
{
	double u1 = 1.0 - uniform(s), u2 = uniform(s);

	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static uint32_t lognormal(uint64_t *s, double mean, double sigma, uint32_t lo, uint32_t hi)
{
	double mu = log(mean) - sigma * sigma / 2.0;
	double x = round(exp(mu + sigma * normal(s)));

	return x < lo ? lo : x > hi ? hi : (uint32_t)x;
}

static uint32_t zipf(uint64_t *s, uint32_t n, double zs)
{
	double w[TRACE_MAX_SYSTEM], sum = 0, u;

	for (uint32_t k = 0; k < n; k++)
		sum += w[k] = 1.0 / pow(k + 1.0, zs);
	u = uniform(s) * sum;
	for (uint32_t k = 0; k < n; k++) {
		if (u < w[k])
			return k;
		u -= w[k];
	}
	return n - 1;
}

/* Grows a growable array of `size`-byte items to hold `need`. */
static int grow(void **v, uint32_t *cap, uint32_t need, size_t size)
{
	uint32_t n = *cap ? *cap : 16;
	void *nv;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	nv = realloc(*v, (size_t)n * size);
	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = n;
	return 0;
}

static int make_systems(struct trace *t, const uint32_t *lengths)
{
	t->n_system = t->prm.n_system;
	for (uint32_t k = 0; k < t->n_system; k++) {
		t->system_tokens[k] = lengths[k];
		t->system[k] = malloc((size_t)lengths[k] * sizeof(uint32_t));
		if (!t->system[k])
			return -ENOMEM;
		for (uint32_t i = 0; i < lengths[k]; i++)
			t->system[k][i] = trace_token(
				t->prm.seed, t->prm.shape && i < t->prm.system_block_tokens ? 0 : k,
				i);
	}
	return 0;
}

/* Opens conversation t->n_convs for user with system prompt sys. */
static int conv_open(struct trace *t, uint32_t *conv_cap, uint32_t *tok_caps_cap,
		     uint32_t **tok_caps, uint32_t user, uint32_t sys)
{
	struct trace_conv *c;
	uint32_t n = t->system_tokens[sys];
	int ret;

	ret = grow((void **)&t->convs, conv_cap, t->n_convs + 1, sizeof(*t->convs));
	if (ret < 0)
		return ret;
	ret = grow((void **)tok_caps, tok_caps_cap, t->n_convs + 1, sizeof(**tok_caps));
	if (ret < 0)
		return ret;
	c = &t->convs[t->n_convs];
	*c = (struct trace_conv){.user = user, .system = sys, .n_tokens = n};
	(*tok_caps)[t->n_convs] = 0;
	ret = grow((void **)&c->tokens, &(*tok_caps)[t->n_convs], n, sizeof(uint32_t));
	if (ret < 0)
		return ret;
	t->n_convs++;
	memcpy(c->tokens, t->system[sys], (size_t)n * sizeof(uint32_t));
	return 0;
}

/* Appends n_user + n_reply tokens of its own to conversation ci. */
static int conv_extend(struct trace *t, uint32_t *tok_caps, uint32_t ci, uint32_t n_new)
{
	struct trace_conv *c = &t->convs[ci];
	uint32_t base = t->system_tokens[c->system];
	int ret;

	ret = grow((void **)&c->tokens, &tok_caps[ci], c->n_tokens + n_new, sizeof(uint32_t));
	if (ret < 0)
		return ret;
	for (uint32_t i = 0; i < n_new; i++)
		c->tokens[c->n_tokens + i] =
			trace_token(t->prm.seed, conv_stream(ci), c->n_tokens + i - base);
	c->n_tokens += n_new;
	return 0;
}

static int shape_params_check(const struct trace_params *p)
{
	if (!p->n_users || !p->n_requests || p->n_system < 1 || p->n_system > TRACE_MAX_SYSTEM ||
	    !p->system_block_tokens || p->system_block_tokens > 4096 || !(p->zipf_s >= 0) ||
	    !(p->p_doc >= 0 && p->p_doc <= 1) || !(p->doc_mean_tokens >= 1) ||
	    !(p->doc_sigma >= 0) || !(p->first_mean_tokens >= 1) || !(p->first_sigma >= 0) ||
	    !(p->user_mean_tokens >= 1) || !(p->reply_mean_tokens >= 1) || !(p->user_sigma >= 0) ||
	    !(p->reply_sigma >= 0) || !(p->p_continue >= 0 && p->p_continue <= 1) ||
	    !(p->gap_median_reqs >= 1) || !(p->gap_sigma >= 0) || !p->max_turns ||
	    p->max_context_tokens < 8192u || p->max_context_tokens > (1u << 24))
		return -EINVAL;
	return 0;
}

static int params_check(const struct trace_params *p)
{
	if (p->shape)
		return p->shape < TRACE_N_SHAPES ? shape_params_check(p) : -EINVAL;
	if (!p->n_users || !p->n_requests || !p->n_system || p->n_system > TRACE_MAX_SYSTEM ||
	    !p->system_min_tokens || p->system_min_tokens > p->system_max_tokens ||
	    !(p->user_mean_tokens >= 1) || !(p->reply_mean_tokens >= 1) || !(p->user_sigma >= 0) ||
	    !(p->reply_sigma >= 0) || !(p->p_soon >= 0 && p->p_soon <= 1) ||
	    !(p->soon_mean_s > 0) || !(p->later_mean_s > 0) || !(p->zipf_s >= 0) ||
	    !(p->p_new_after_soon >= 0 && p->p_new_after_soon <= 1) ||
	    !(p->p_new_after_later >= 0 && p->p_new_after_later <= 1) || !p->max_turns ||
	    p->max_context_tokens < p->system_max_tokens + 1024u + 2048u ||
	    p->max_context_tokens > (1u << 24))
		return -EINVAL;
	return 0;
}

/* A min-heap of conversations waiting for their next turn, by the
 * request index it is due at. */
struct turn_heap {
	uint32_t n, cap;
	uint64_t *v; /* due << 32 | conversation */
};

static int turn_push(struct turn_heap *h, uint64_t x)
{
	uint32_t i;

	if (grow((void **)&h->v, &h->cap, h->n + 1, sizeof(*h->v)) < 0)
		return -ENOMEM;
	for (i = h->n++; i && h->v[(i - 1) / 2] > x; i = (i - 1) / 2)
		h->v[i] = h->v[(i - 1) / 2];
	h->v[i] = x;
	return 0;
}

static uint64_t turn_pop(struct turn_heap *h)
{
	uint64_t top = h->v[0], x = h->v[--h->n];
	uint32_t i = 0;

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && h->v[c + 1] < h->v[c])
			c++;
		if (h->v[c] >= x)
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = x;
	return top;
}

/* TRACE_SHAPE_PROD and TRACE_SHAPE_DOCS (the comment at the top). */
static int generate_turns(const struct trace_params *prm, struct trace *ret)
{
	struct trace t = {.prm = *prm};
	uint32_t lengths[TRACE_MAX_SYSTEM], conv_cap = 0, caps_cap = 0, *tok_caps = NULL;
	uint32_t turns_cap = 0, *turns = NULL, blk = prm->system_block_tokens;
	uint32_t doc_hi = prm->max_context_tokens / 2 - blk;
	struct turn_heap h = {0};
	uint64_t s = prm->seed;
	int err = -ENOMEM;

	lengths[0] = blk;
	for (uint32_t k = 1; k < prm->n_system; k++)
		lengths[k] = blk + lognormal(&s, prm->doc_mean_tokens, prm->doc_sigma, 16, doc_hi);
	if (make_systems(&t, lengths) < 0)
		goto fail;
	t.reqs = calloc(prm->n_requests, sizeof(*t.reqs));
	if (!t.reqs)
		goto fail;
	for (uint32_t r = 0; r < prm->n_requests; r++) {
		uint32_t c, n_user,
			n_reply = lognormal(&s, prm->reply_mean_tokens, prm->reply_sigma, 4, 1024);
		int fresh = !h.n || (uint32_t)(h.v[0] >> 32) > r;

		if (fresh) {
			uint32_t sys = 0;

			if (prm->n_system > 1 && uniform(&s) < prm->p_doc)
				sys = 1 + zipf(&s, prm->n_system - 1, prm->zipf_s);
			if (conv_open(&t, &conv_cap, &caps_cap, &tok_caps, t.n_convs % prm->n_users,
				      sys) < 0 ||
			    grow((void **)&turns, &turns_cap, t.n_convs, sizeof(*turns)) < 0)
				goto fail;
			c = t.n_convs - 1;
			turns[c] = 0;
			n_user = lognormal(&s, prm->first_mean_tokens, prm->first_sigma, 4, 2048);
		} else {
			c = (uint32_t)turn_pop(&h);
			n_user = lognormal(&s, prm->user_mean_tokens, prm->user_sigma, 4, 1024);
		}
		t.reqs[r] = (struct trace_req){
			.t_s = r * 0.1,
			.user = t.convs[c].user,
			.conv = c,
			.turn = turns[c]++,
			.gap = fresh ? TRACE_GAP_FIRST : TRACE_GAP_LATER,
			.prompt_tokens = t.convs[c].n_tokens + n_user,
			.reply_tokens = n_reply,
		};
		if (conv_extend(&t, tok_caps, c, n_user + n_reply) < 0)
			goto fail;
		t.n_reqs++;
		/* The next turn, if any: due after a lognormal gap, if it
		 * can still fit (the largest message and reply). */
		if (turns[c] < prm->max_turns && uniform(&s) < prm->p_continue &&
		    t.convs[c].n_tokens + 1024u + 1024u <= prm->max_context_tokens) {
			double mu = log(prm->gap_median_reqs);
			double g = round(exp(mu + prm->gap_sigma * normal(&s)));
			uint64_t due = (uint64_t)r + 1 + (g < 1 ? 1 : g > 1e9 ? 1e9 : (uint64_t)g);

			if (due < UINT32_MAX && turn_push(&h, due << 32 | c) < 0)
				goto fail;
		}
	}
	*ret = t;
	err = 0;
	goto out;
fail:
	trace_free(&t);
out:
	free(tok_caps);
	free(turns);
	free(h.v);
	return err;
}

int trace_generate(const struct trace_params *prm, struct trace *ret)
{
	struct trace t = {.prm = *prm};
	uint32_t lengths[TRACE_MAX_SYSTEM], conv_cap = 0, caps_cap = 0, *tok_caps = NULL;
	uint32_t *cur = NULL, *turns = NULL;
	double *next_t = NULL;
	uint8_t *next_gap = NULL;
	uint64_t s = prm->seed;
	int err;

	err = params_check(prm);
	if (err < 0)
		return err;
	if (prm->shape)
		return generate_turns(prm, ret);
	err = -ENOMEM;
	for (uint32_t k = 0; k < prm->n_system; k++)
		lengths[k] = prm->system_min_tokens +
			     (uint32_t)(splitmix64(&s) %
					(prm->system_max_tokens - prm->system_min_tokens + 1));
	if (make_systems(&t, lengths) < 0)
		goto fail;
	t.reqs = calloc(prm->n_requests, sizeof(*t.reqs));
	cur = malloc(prm->n_users * sizeof(*cur));
	turns = calloc(prm->n_users, sizeof(*turns));
	next_t = malloc(prm->n_users * sizeof(*next_t));
	next_gap = calloc(prm->n_users, sizeof(*next_gap));
	if (!t.reqs || !cur || !turns || !next_t || !next_gap)
		goto fail;
	for (uint32_t u = 0; u < prm->n_users; u++) {
		cur[u] = UINT32_MAX;
		next_t[u] = uniform(&s) * prm->later_mean_s;
	}

	for (uint32_t r = 0; r < prm->n_requests; r++) {
		struct trace_req *q = &t.reqs[r];
		uint32_t u = 0, n_user, n_reply, c;
		int fresh;

		for (uint32_t i = 1; i < prm->n_users; i++)
			if (next_t[i] < next_t[u])
				u = i;
		n_user = lognormal(&s, prm->user_mean_tokens, prm->user_sigma, 4, 1024);
		n_reply = lognormal(&s, prm->reply_mean_tokens, prm->reply_sigma, 8, 2048);
		fresh = cur[u] == UINT32_MAX || turns[u] >= prm->max_turns;
		if (!fresh && next_gap[u] == TRACE_GAP_SOON)
			fresh = uniform(&s) < prm->p_new_after_soon;
		else if (!fresh)
			fresh = uniform(&s) < prm->p_new_after_later;
		if (!fresh && t.convs[cur[u]].n_tokens + n_user + n_reply > prm->max_context_tokens)
			fresh = 1;
		if (fresh) {
			if (conv_open(&t, &conv_cap, &caps_cap, &tok_caps, u,
				      zipf(&s, prm->n_system, prm->zipf_s)) < 0)
				goto fail;
			cur[u] = t.n_convs - 1;
			turns[u] = 0;
		}
		c = cur[u];
		*q = (struct trace_req){
			.t_s = next_t[u],
			.user = u,
			.conv = c,
			.turn = turns[u]++,
			.gap = next_gap[u],
			.prompt_tokens = t.convs[c].n_tokens + n_user,
			.reply_tokens = n_reply,
		};
		if (conv_extend(&t, tok_caps, c, n_user + n_reply) < 0)
			goto fail;
		t.n_reqs++;
		if (uniform(&s) < prm->p_soon) {
			next_gap[u] = TRACE_GAP_SOON;
			next_t[u] += exponential(&s, prm->soon_mean_s);
		} else {
			next_gap[u] = TRACE_GAP_LATER;
			next_t[u] += exponential(&s, prm->later_mean_s);
		}
	}
	*ret = t;
	err = 0;
	goto out;
fail:
	trace_free(&t);
out:
	free(tok_caps);
	free(cur);
	free(turns);
	free(next_t);
	free(next_gap);
	return err;
}

void trace_free(struct trace *t)
{
	for (uint32_t k = 0; k < t->n_system; k++)
		free(t->system[k]);
	for (uint32_t c = 0; c < t->n_convs; c++)
		free(t->convs[c].tokens);
	free(t->convs);
	free(t->reqs);
	memset(t, 0, sizeof(*t));
}

/* ---- the text format ----------------------------------------------------------- */

#define P_U(name)                                                                                  \
	{                                                                                          \
#name, offsetof(struct trace_params, name), 0                                      \
	}
#define P_D(name)                                                                                  \
	{                                                                                          \
#name, offsetof(struct trace_params, name), 1                                      \
	}

static const struct {
	const char *key;
	size_t off;
	int is_double;
} param_keys[] = {
	P_U(n_users),
	P_U(n_requests),
	P_U(n_system),
	P_U(system_min_tokens),
	P_U(system_max_tokens),
	P_D(zipf_s),
	P_D(user_mean_tokens),
	P_D(user_sigma),
	P_D(reply_mean_tokens),
	P_D(reply_sigma),
	P_D(p_soon),
	P_D(soon_mean_s),
	P_D(later_mean_s),
	P_D(p_new_after_soon),
	P_D(p_new_after_later),
	P_U(max_turns),
	P_U(max_context_tokens),
	P_U(shape),
	P_U(system_block_tokens),
	P_D(p_doc),
	P_D(doc_mean_tokens),
	P_D(doc_sigma),
	P_D(first_mean_tokens),
	P_D(first_sigma),
	P_D(p_continue),
	P_D(gap_median_reqs),
	P_D(gap_sigma),
};

int trace_write(const struct trace *t, FILE *f)
{
	fprintf(f,
		"kvpalace-trace 1\n"
		"# Conversation trace of kvp-bench-trace (bench/trace_gen.c documents the\n"
		"# model). Lines: 'param KEY VALUE'; 'system K LENGTH'; one\n"
		"# 'req T USER CONV SYSTEM TURN GAP PROMPT REPLY' per request in arrival order:\n"
		"# virtual time (s), user, conversation, its system prompt, turn (0 first),\n"
		"# gap before it (0 first request, 1 soon, 2 later), prompt and reply tokens.\n"
		"# A prompt is the system prompt, every earlier turn and the new user message.\n"
		"# Token ids are not stored: token i of system prompt K is trace_token(seed, K, "
		"i),\n"
		"# token i after the system prompt of conversation C trace_token(seed, 2^32 + C, "
		"i).\n");
	fprintf(f, "param seed %llu\n", (unsigned long long)t->prm.seed);
	for (size_t i = 0; i < sizeof(param_keys) / sizeof(param_keys[0]); i++) {
		const char *v = (const char *)&t->prm + param_keys[i].off;

		if (param_keys[i].is_double)
			fprintf(f, "param %s %.17g\n", param_keys[i].key, *(const double *)v);
		else
			fprintf(f, "param %s %u\n", param_keys[i].key, *(const uint32_t *)v);
	}
	for (uint32_t k = 0; k < t->n_system; k++)
		fprintf(f, "system %u %u\n", k, t->system_tokens[k]);
	for (uint32_t r = 0; r < t->n_reqs; r++) {
		const struct trace_req *q = &t->reqs[r];

		fprintf(f, "req %.3f %u %u %u %u %u %u %u\n", q->t_s, q->user, q->conv,
			t->convs[q->conv].system, q->turn, q->gap, q->prompt_tokens,
			q->reply_tokens);
	}
	return fflush(f) || ferror(f) ? -EIO : 0;
}

static int read_param(struct trace_params *p, const char *key, const char *val)
{
	char *end;

	if (!strcmp(key, "seed")) {
		p->seed = strtoull(val, &end, 10);
		return *end ? -EBADMSG : 0;
	}
	for (size_t i = 0; i < sizeof(param_keys) / sizeof(param_keys[0]); i++) {
		char *v = (char *)p + param_keys[i].off;

		if (strcmp(key, param_keys[i].key))
			continue;
		if (param_keys[i].is_double) {
			*(double *)v = strtod(val, &end);
		} else {
			unsigned long x = strtoul(val, &end, 10);

			if (x > UINT32_MAX)
				return -EBADMSG;
			*(uint32_t *)v = (uint32_t)x;
		}
		return *end ? -EBADMSG : 0;
	}
	return 0; /* unknown keys: from a newer writer, informative only */
}

int trace_read(FILE *f, struct trace *ret)
{
	struct trace t = {0};
	uint32_t lengths[TRACE_MAX_SYSTEM] = {0}, conv_cap = 0, caps_cap = 0, *tok_caps = NULL;
	uint32_t req_cap = 0, n_sys_seen = 0, n_req_param;
	char line[512];
	int err = -EBADMSG, in_reqs = 0;

	if (!fgets(line, sizeof(line), f) || strcmp(line, "kvpalace-trace 1\n"))
		return -EBADMSG;
	while (fgets(line, sizeof(line), f)) {
		char key[64], val[64];
		unsigned k, len, user, conv, sys, turn, gap, prompt, reply;
		double ts;

		if (line[0] == '#' || line[0] == '\n')
			continue;
		if (!in_reqs && sscanf(line, "param %63s %63s", key, val) == 2) {
			if (read_param(&t.prm, key, val) < 0)
				goto fail;
		} else if (!in_reqs && sscanf(line, "system %u %u", &k, &len) == 2) {
			if (k != n_sys_seen || k >= TRACE_MAX_SYSTEM || !len || len > (1u << 24))
				goto fail;
			lengths[n_sys_seen++] = len;
		} else if (sscanf(line, "req %lf %u %u %u %u %u %u %u", &ts, &user, &conv, &sys,
				  &turn, &gap, &prompt, &reply) == 8) {
			struct trace_conv *c;

			if (!in_reqs) {
				in_reqs = 1;
				t.prm.n_system = n_sys_seen;
				if (!n_sys_seen || make_systems(&t, lengths) < 0)
					goto fail;
			}
			if (conv > t.n_convs || sys >= t.n_system || gap > TRACE_GAP_LATER ||
			    !reply || reply > (1u << 24) || prompt > (1u << 24))
				goto fail;
			if (conv == t.n_convs) {
				if (turn != 0)
					goto fail;
				err = conv_open(&t, &conv_cap, &caps_cap, &tok_caps, user, sys);
				if (err < 0)
					goto fail;
				err = -EBADMSG;
			}
			c = &t.convs[conv];
			if (c->user != user || c->system != sys || prompt <= c->n_tokens)
				goto fail;
			if (grow((void **)&t.reqs, &req_cap, t.n_reqs + 1, sizeof(*t.reqs)) < 0 ||
			    conv_extend(&t, tok_caps, conv, prompt - c->n_tokens + reply) < 0) {
				err = -ENOMEM;
				goto fail;
			}
			t.reqs[t.n_reqs++] = (struct trace_req){
				.t_s = ts,
				.user = user,
				.conv = conv,
				.turn = turn,
				.gap = gap,
				.prompt_tokens = prompt,
				.reply_tokens = reply,
			};
		} else {
			goto fail;
		}
	}
	if (ferror(f) || !t.n_reqs)
		goto fail;
	n_req_param = t.prm.n_requests;
	if (n_req_param && n_req_param != t.n_reqs)
		goto fail;
	t.prm.n_requests = t.n_reqs;
	free(tok_caps);
	*ret = t;
	return 0;
fail:
	free(tok_caps);
	trace_free(&t);
	return err;
}
