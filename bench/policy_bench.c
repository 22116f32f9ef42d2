/* bench/policy_bench.c — what each token policy (daemon/base/policy.h) costs in
 * attention error, against keeping a random subset of the same size.
 *
 * tinylm (default config, --seed) reads a synthetic conversation of
 * --tokens byte tokens into f16 pages: a system prompt, then user and
 * assistant turns of about 64 tokens. Then, for each of --queries further
 * tokens (the query steps), every policy chooses which of the cached
 * positions [0, s) to keep at a budget of 10, 20, 30, 40 and 50 % of s;
 * the kept positions, and the new token s itself (a decode step always
 * attends to the token it just wrote), are compacted into fresh pages
 * with kref_gather_tokens and each layer's query of step s attends over
 * them with kref_attn_decode. The figure is the relative error of that
 * attention output against the output over the full cache,
 * ||out_kept - out_full|| / ||out_full|| per layer and query head,
 * averaged over layers, heads and query steps. tinylm applies RoPE before
 * it writes K, so gathered keys keep their original rotation and the
 * compacted attention is exactly the attention over the kept subset.
 *
 * The policies:
 *   window      the last B tokens;
 *   sinks       4 attention sinks + the last B - 4;
 *   importance  4 sinks, the last B/2, the rest by H2O score: the
 *               attention mass each token received in every step so far
 *               (summed over layers and heads, policy_add_mass with the
 *               default decay 0.01 per step);
 *   hierarchy   the policy's defaults (10 % permanent, 30 % hot over the
 *               last 4 turns, temporary by the same score) with the
 *               system prompt tagged permanent and each turn its own;
 *   random      B positions drawn uniformly (the mean of 4 draws): chance.
 *
 * The queries and attention weights tinylm computes are not part of its
 * interface, so the bench is linked with -Wl,--wrap=kref_attn_decode: every
 * attention call tinylm makes goes through __wrap_kref_attn_decode below,
 * which calls the real kernel, keeps the layer's query and output, and
 * adds the weights to the step's mass. The model itself is unchanged.
 *
 * Output: a table (policy × budget, errors in %) and "sample
 * policy.err_<kind>_<pct> VALUE" lines (percent) for bench/run on stdout;
 * progress on stderr; exit 1 if anything fails, including the self-check
 * that keeping every token gives exactly the full output. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "policy.h"
#include "tinylm.h"

#define BLOCK_TOKENS 16u
#define N_PCT	     5u
#define N_KINDS	     6u /* window, sinks, importance, hierarchy, random, oracle */
#define K_RANDOM     4u
#define K_ORACLE     5u
#define RANDOM_DRAWS 4u
#define TURN_TOKENS  64u

static const unsigned pcts[N_PCT] = {10, 20, 30, 40, 50};
static const char *const kind_names[N_KINDS] = {"window",    "sinks",  "importance",
						"hierarchy", "random", "oracle"};

static void die(const char *what, int err)
{
	fprintf(stderr, "kvp-bench-policy: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		die("allocation", ENOMEM);
	return p;
}

/* Zeroed, aligned as the pool aligns pages. */
static void *xpage(size_t bytes)
{
	void *p = NULL;

	if (posix_memalign(&p, SHM_PAGE_ALIGN, bytes))
		die("allocation", ENOMEM);
	memset(p, 0, bytes);
	return p;
}

/* ---- what tinylm's attention calls leave behind -------------------------- */

static struct {
	int on;
	uint32_t n_layers, n_heads, head_dim;
	float *q;    /* [n_layers][n_heads][head_dim]: the step's queries */
	float *out;  /* [n_layers][n_heads][head_dim]: over the full cache */
	float *w;    /* [n_heads][max_tokens] */
	float *mass; /* [max_tokens]: Σ over layers and heads of the weights */
	uint64_t max_tokens;
	double eff_sum; /* Σ 1 / Σ_t w_t² over calls and heads: tokens attended */
	uint64_t eff_n;
	float sharpen; /* --sharpen: factor on the logits of the measured attention */
	float scale;   /* the measured attention's: tinylm's scale × sharpen */
} cap;

int __real_kref_attn_decode(const struct shm_layout *l, uint32_t layer, const void *const *pages,
			    uint64_t n_tokens, const float *q, uint32_t n_q_heads, float scale,
			    float *out, float *weights);
int __wrap_kref_attn_decode(const struct shm_layout *l, uint32_t layer, const void *const *pages,
			    uint64_t n_tokens, const float *q, uint32_t n_q_heads, float scale,
			    float *out, float *weights);

int __wrap_kref_attn_decode(const struct shm_layout *l, uint32_t layer, const void *const *pages,
			    uint64_t n_tokens, const float *q, uint32_t n_q_heads, float scale,
			    float *out, float *weights)
{
	size_t row = (size_t)cap.n_heads * cap.head_dim;
	int ret;

	/* The model's own call, unchanged. */
	ret = __real_kref_attn_decode(l, layer, pages, n_tokens, q, n_q_heads, scale, out, weights);
	if (ret < 0 || !cap.on || weights || layer >= cap.n_layers || n_q_heads != cap.n_heads ||
	    n_tokens > cap.max_tokens)
		return ret;
	/* The measured attention: the same call, with the logits sharpened
	 * when asked (the same bits as the model's when not). */
	cap.scale = scale * cap.sharpen;
	ret = __real_kref_attn_decode(l, layer, pages, n_tokens, q, n_q_heads, cap.scale,
				      cap.out + layer * row, cap.w);
	if (ret < 0)
		return ret;
	memcpy(cap.q + layer * row, q, row * sizeof(float));
	for (uint32_t h = 0; h < n_q_heads; h++) {
		double w2 = 0;

		for (uint64_t t = 0; t < n_tokens; t++) {
			cap.mass[t] += cap.w[h * n_tokens + t];
			w2 += (double)cap.w[h * n_tokens + t] * cap.w[h * n_tokens + t];
		}
		cap.eff_sum += 1.0 / w2;
		cap.eff_n++;
	}
	return 0;
}

/* ---- the conversation ------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static const char system_prompt[] = "System: You are a concise assistant for a storage team. "
				    "Answer in plain words.\n";

static const char *const words[] = {
	"the",	 "cache",  "page",  "token", "layer",  "attention", "prefix", "session",
	"disk",	 "memory", "fast",  "slow",  "keep",   "drop",	    "model",  "query",
	"key",	 "value",  "batch", "turn",  "user",   "answer",    "why",    "how",
	"store", "load",   "spill", "hot",   "budget", "score",	    "and",    "of",
};

static void tag(uint32_t *tok, struct token_meta *m, size_t i, uint8_t byte, uint8_t role,
		uint32_t turn)
{
	tok[i] = byte;
	m[i].role = role;
	m[i].turn = turn;
}

/* Fills tok[0..n) with the conversation and tags m[0..n): the system
 * prompt (permanent, turn 0), then turns 1, 2, ... of about TURN_TOKENS
 * tokens, user and assistant in turn. */
static void conversation(uint32_t *tok, struct token_meta *m, size_t n, uint64_t seed)
{
	size_t i = 0, sys = strlen(system_prompt);
	uint32_t turn = 0;
	uint64_t s = seed ^ 0x5eed;

	memset(m, 0, n * sizeof(*m));
	for (; i < n && i < sys; i++) {
		tok[i] = (uint8_t)system_prompt[i];
		m[i].role = ROLE_SYSTEM;
		m[i].flags = TOKEN_PERMANENT;
	}
	while (i < n) {
		const char *head = ++turn % 2 ? "User: " : "Assistant: ";
		size_t end = i + TURN_TOKENS - 8 + rng_next(&s) % 17; /* 56..72 tokens */
		uint8_t role = turn % 2 ? ROLE_USER : ROLE_ASSISTANT;

		for (size_t j = 0; head[j] && i < n; j++, i++)
			tag(tok, m, i, (uint8_t)head[j], role, turn);
		/* Words, a space after each, the turn's last token a newline. */
		while (i < n && i < end) {
			const char *w = words[rng_next(&s) % (sizeof(words) / sizeof(words[0]))];

			for (size_t j = 0; w[j] && i < n && i + 1 < end; j++, i++)
				tag(tok, m, i, (uint8_t)w[j], role, turn);
			if (i < n && i < end) {
				tag(tok, m, i, i + 1 == end ? '\n' : ' ', role, turn);
				i++;
			}
		}
	}
	for (size_t k = 0; k < n; k++)
		m[k].pos = (uint32_t)k;
}

/* ---- measurement ------------------------------------------------------------- */

struct bench {
	struct tinylm *model;
	struct tinylm_config cfg;
	struct shm_layout l;
	void **pages, **cpages; /* full and compacted page tables */
	size_t n_pages;
	struct token_meta *m; /* the session's tags and H2O scores */
	struct token_meta *o; /* the oracle's: this step's mass */
	uint32_t *keep, *scratch;
	uint8_t *mark;
	float *out; /* [n_heads][head_dim] */
	uint64_t rng;
	int verify;	      /* check subset_error's attention against naive_attn */
	float *krows, *vrows; /* [max_tokens][head_dim]: naive_attn's rows */
	double *wbuf;	      /* [max_tokens] */
};

static void **alloc_pages(size_t n, size_t page_bytes)
{
	void **p = xcalloc(n, sizeof(void *));

	for (size_t i = 0; i < n; i++)
		p[i] = xpage(page_bytes);
	return p;
}

/* Attention of query q over positions pos[0..n) of (layer, kv head) in
 * double, from the full page table: the check of the compacted path. */
static void naive_attn(struct bench *b, uint32_t layer, uint32_t kv_head, const float *q,
		       const uint32_t *pos, size_t n, double *ret_out /* [head_dim] */)
{
	uint32_t hd = b->cfg.head_dim;
	double mx = -INFINITY, den = 0;
	int ret;

	for (size_t i = 0; i < n; i++) {
		double dot = 0;

		ret = kref_gather_rows_f32(&b->l, (const void *const *)b->pages, layer, 0, kv_head,
					   pos[i], 1, b->krows);
		if (ret == 0)
			ret = kref_gather_rows_f32(&b->l, (const void *const *)b->pages, layer, 1,
						   kv_head, pos[i], 1, b->vrows + (size_t)i * hd);
		if (ret < 0)
			die("kref_gather_rows_f32", ret);
		for (uint32_t d = 0; d < hd; d++)
			dot += (double)q[d] * b->krows[d];
		b->wbuf[i] = dot * cap.scale;
		if (b->wbuf[i] > mx)
			mx = b->wbuf[i];
	}
	for (uint32_t d = 0; d < hd; d++)
		ret_out[d] = 0;
	for (size_t i = 0; i < n; i++) {
		double w = exp(b->wbuf[i] - mx);

		den += w;
		for (uint32_t d = 0; d < hd; d++)
			ret_out[d] += w * b->vrows[(size_t)i * hd + d];
	}
	for (uint32_t d = 0; d < hd; d++)
		ret_out[d] /= den;
}

/* The mean over layers and heads of the relative error of attention over
 * positions keep[0..k) and s, against the captured full output. */
static double subset_error(struct bench *b, uint64_t s, const uint32_t *keep, size_t k)
{
	uint32_t hd = b->cfg.head_dim, nh = b->cfg.n_heads;
	size_t row = (size_t)nh * hd;
	double sum = 0;
	int ret;

	memcpy(b->scratch, keep, k * sizeof(*keep));
	b->scratch[k] = (uint32_t)s;
	ret = kref_gather_tokens(&b->l, b->cpages, 0, (const void *const *)b->pages, s + 1,
				 b->scratch, k + 1);
	if (ret < 0)
		die("kref_gather_tokens", ret);
	for (uint32_t li = 0; li < b->cfg.n_layers; li++) {
		ret = __real_kref_attn_decode(&b->l, li, (const void *const *)b->cpages, k + 1,
					      cap.q + li * row, nh, cap.scale, b->out, NULL);
		if (ret < 0)
			die("kref_attn_decode", ret);
		for (uint32_t h = 0; h < nh; h++) {
			const float *f = cap.out + li * row + (size_t)h * hd, *o = b->out + h * hd;
			double d2 = 0, f2 = 0, ref[SHM_MAX_HEAD_DIM];

			if (b->verify) {
				naive_attn(b, li, h / (nh / b->cfg.n_kv_heads),
					   cap.q + li * row + (size_t)h * hd, b->scratch, k + 1,
					   ref);
				for (uint32_t i = 0; i < hd; i++)
					if (fabs(ref[i] - o[i]) > 1e-4 * (1 + fabs(ref[i]))) {
						fprintf(stderr,
							"kvp-bench-policy: attention over %zu kept "
							"tokens is %g, naive %g (layer %u head "
							"%u)\n",
							k, o[i], ref[i], li, h);
						exit(1);
					}
			}

			for (uint32_t i = 0; i < hd; i++) {
				d2 += ((double)o[i] - f[i]) * ((double)o[i] - f[i]);
				f2 += (double)f[i] * f[i];
			}
			sum += f2 > 0 ? sqrt(d2 / f2) : sqrt(d2);
		}
	}
	return sum / ((double)b->cfg.n_layers * nh);
}

/* k distinct positions of [0, s), uniformly, ascending. */
static size_t random_subset(struct bench *b, uint64_t s, size_t k)
{
	size_t got = 0;

	memset(b->mark, 0, s);
	while (got < k) {
		uint64_t i = rng_next(&b->rng) % s;

		if (!b->mark[i]) {
			b->mark[i] = 1;
			got++;
		}
	}
	got = 0;
	for (uint64_t i = 0; i < s; i++)
		if (b->mark[i])
			b->keep[got++] = (uint32_t)i;
	return got;
}

static void policy_for(struct policy *pol, unsigned kind, uint32_t budget, float decay)
{
	static const uint8_t kinds[] = {POLICY_WINDOW, POLICY_SINKS, POLICY_IMPORTANCE,
					POLICY_HIERARCHY};
	const char *why = NULL;

	policy_defaults(pol, kinds[kind]);
	pol->budget = budget;
	pol->decay = decay;
	pol->sinks = 4;
	pol->recent = budget / 2;
	if (pol->recent + pol->sinks > budget)
		pol->recent = budget > pol->sinks ? budget - pol->sinks : 0;
	if (policy_validate(pol, &why) < 0) {
		fprintf(stderr, "kvp-bench-policy: %s at budget %u: %s\n", kind_names[kind], budget,
			why);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tokens", required_argument, NULL, 't'},
		{"queries", required_argument, NULL, 'q'},
		{"seed", required_argument, NULL, 's'},
		{"decay", required_argument, NULL, 'd'},
		{"sharpen", required_argument, NULL, 'x'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}, /* one per line */
	};
	double err[N_KINDS][N_PCT] = {{0}};
	uint64_t n_ctx = 512, n_queries = 16, seed = 1, total;
	struct bench b = {0};
	uint32_t *tok;
	float *logits;
	struct policy oracle;
	float decay;
	int c, ret;

	policy_defaults(&oracle, POLICY_IMPORTANCE);
	decay = oracle.decay;
	cap.sharpen = 1.0f;
	while ((c = getopt_long(argc, argv, "t:q:s:d:x:h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			n_ctx = strtoull(optarg, NULL, 10);
			break;
		case 'q':
			n_queries = strtoull(optarg, NULL, 10);
			break;
		case 's':
			seed = strtoull(optarg, NULL, 10);
			break;
		case 'd':
			decay = strtof(optarg, NULL);
			break;
		case 'x':
			cap.sharpen = strtof(optarg, NULL);
			break;
		default:
			fprintf(stderr,
				"usage: kvp-bench-policy [--tokens N (512)] "
				"[--queries N (16)] [--seed S (1)] [--decay L (%g)] "
				"[--sharpen F (1)]\n",
				oracle.decay);
			return c == 'h' ? 0 : 2;
		}
	}
	if (n_ctx < 64 || n_ctx > 65536 || n_queries < 1 || n_queries > 4096 ||
	    !(decay >= 0 && decay < 100) || !(cap.sharpen >= 1 && cap.sharpen <= 64)) {
		fprintf(stderr, "kvp-bench-policy: --tokens 64..65536, --queries 1..4096, --decay "
				"0..100, --sharpen 1..64\n");
		return 2;
	}
	total = n_ctx + n_queries;

	tinylm_default_config(&b.cfg, seed);
	ret = tinylm_new(&b.cfg, &b.model);
	if (ret < 0)
		die("tinylm_new", ret);
	tinylm_layout(b.model, SHM_DTYPE_F16, 0, BLOCK_TOKENS, &b.l);
	b.n_pages = (total + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
	b.pages = alloc_pages(b.n_pages, shm_page_bytes(&b.l));
	b.cpages = alloc_pages(b.n_pages, shm_page_bytes(&b.l));
	b.m = xcalloc(total, sizeof(*b.m));
	b.o = xcalloc(total, sizeof(*b.o));
	b.keep = xcalloc(total + 1, sizeof(*b.keep));
	b.scratch = xcalloc(total + 1, sizeof(*b.scratch));
	b.mark = xcalloc(total, 1);
	b.out = xcalloc((size_t)b.cfg.n_heads * b.cfg.head_dim, sizeof(float));
	b.krows = xcalloc(b.cfg.head_dim, sizeof(float));
	b.vrows = xcalloc(total * b.cfg.head_dim, sizeof(float));
	b.wbuf = xcalloc(total, sizeof(double));
	b.rng = seed * 0x9e3779b97f4a7c15ull + 7;
	tok = xcalloc(total, sizeof(*tok));
	logits = xcalloc(TINYLM_VOCAB, sizeof(float));
	cap.n_layers = b.cfg.n_layers;
	cap.n_heads = b.cfg.n_heads;
	cap.head_dim = b.cfg.head_dim;
	cap.max_tokens = total;
	cap.q = xcalloc((size_t)b.cfg.n_layers * b.cfg.n_heads * b.cfg.head_dim, sizeof(float));
	cap.out = xcalloc((size_t)b.cfg.n_layers * b.cfg.n_heads * b.cfg.head_dim, sizeof(float));
	cap.w = xcalloc((size_t)b.cfg.n_heads * total, sizeof(float));
	cap.mass = xcalloc(total, sizeof(float));
	conversation(tok, b.m, total, seed);

	struct tinylm_kv kv = {b.l, b.pages, b.n_pages};

	fprintf(stderr, "kvp-bench-policy: %llu tokens, %llu query steps, seed %llu\n",
		(unsigned long long)n_ctx, (unsigned long long)n_queries, (unsigned long long)seed);
	cap.on = 1;
	for (uint64_t s = 0; s < total; s++) {
		memset(cap.mass, 0, (s + 1) * sizeof(float));
		if (s == n_ctx) {
			cap.eff_sum = 0;
			cap.eff_n = 0;
		}
		ret = tinylm_step(b.model, &kv, s, tok[s], logits);
		if (ret < 0)
			die("tinylm_step", ret);
		/* The first query step checks every subset's attention. */
		b.verify = s == n_ctx;
		if (s >= n_ctx) {
			/* The self-check: every token kept is the full output. */
			for (uint64_t i = 0; i < s; i++)
				b.keep[i] = (uint32_t)i;
			if (subset_error(&b, s, b.keep, s) != 0.0) {
				fprintf(stderr, "kvp-bench-policy: keeping every token changed the "
						"attention output\n");
				return 1;
			}
			for (unsigned pi = 0; pi < N_PCT; pi++) {
				uint32_t budget = (uint32_t)((s * pcts[pi] + 50) / 100);

				for (unsigned k = 0; k < K_RANDOM; k++) {
					struct policy pol;
					size_t n_keep;

					policy_for(&pol, k, budget, decay);
					n_keep = policy_select(&pol, b.m, s, budget, b.keep,
							       b.scratch);
					if (n_keep != budget) {
						fprintf(stderr,
							"kvp-bench-policy: %s kept %zu of %u\n",
							kind_names[k], n_keep, budget);
						return 1;
					}
					err[k][pi] += subset_error(&b, s, b.keep, n_keep);
				}
				for (unsigned d = 0; d < RANDOM_DRAWS; d++)
					err[K_RANDOM][pi] +=
						subset_error(&b, s, b.keep,
							     random_subset(&b, s, budget)) /
						RANDOM_DRAWS;
				/* The oracle: this very query's top mass. */
				for (uint64_t i = 0; i < s; i++)
					b.o[i].score = cap.mass[i];
				policy_defaults(&oracle, POLICY_IMPORTANCE);
				oracle.sinks = oracle.recent = 0;
				err[K_ORACLE][pi] += subset_error(
					&b, s, b.keep,
					policy_select(&oracle, b.o, s, budget, b.keep, b.scratch));
			}
		}
		/* This step's attention mass, for the steps after it. */
		policy_add_mass(b.m, s + 1, decay, 0, cap.mass, s + 1);
	}
	cap.on = 0;

	printf("attention output error (%%, ||out_kept - out_full|| / ||out_full||, mean of %u "
	       "layers x %u heads x %llu steps), tinylm seed %llu, %llu-token context, decay %g;\n"
	       "a query head attends to %.0f tokens of %llu on average (1 / sum of squared "
	       "weights)\n",
	       b.cfg.n_layers, b.cfg.n_heads, (unsigned long long)n_queries,
	       (unsigned long long)seed, (unsigned long long)n_ctx, decay,
	       cap.eff_sum / (double)(cap.eff_n ? cap.eff_n : 1), (unsigned long long)n_ctx);
	printf("%-12s", "budget");
	for (unsigned pi = 0; pi < N_PCT; pi++)
		printf(" %7u%%", pcts[pi]);
	printf("\n");
	for (unsigned k = 0; k < N_KINDS; k++) {
		printf("%-12s", kind_names[k]);
		for (unsigned pi = 0; pi < N_PCT; pi++)
			printf(" %8.3f", 100.0 * err[k][pi] / (double)n_queries);
		printf("\n");
	}
	for (unsigned k = 0; k < N_KINDS; k++)
		for (unsigned pi = 0; pi < N_PCT; pi++)
			printf("sample policy.err_%s_%u %.6g\n", kind_names[k], pcts[pi],
			       100.0 * err[k][pi] / (double)n_queries);
	fflush(stdout);

	for (size_t i = 0; i < b.n_pages; i++) {
		free(b.pages[i]);
		free(b.cpages[i]);
	}
	free(b.pages);
	free(b.cpages);
	free(b.m);
	free(b.o);
	free(b.keep);
	free(b.scratch);
	free(b.mark);
	free(b.out);
	free(b.krows);
	free(b.vrows);
	free(b.wbuf);
	free(tok);
	free(logits);
	free(cap.q);
	free(cap.out);
	free(cap.w);
	free(cap.mass);
	tinylm_free(b.model);
	return 0;
}
