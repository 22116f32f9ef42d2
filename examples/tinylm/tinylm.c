/* examples/tinylm/tinylm.c — the tiny transformer (see tinylm.h): weights
 * from a seed, one token per step, K/V through the page table.
 *
 * Weights are uniform in ±1/sqrt(fan_in) from splitmix64 (integers to
 * floats exactly, so every process and machine gets the same bits); the
 * norms' gains are 1 ± 0.1. Matrix-vector products and norms use one fixed
 * summation order. RoPE angles are computed in double and rounded once.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tinylm.h"

struct layer {
	float *attn_norm; /* [d_model] */
	float *wq;	  /* [n_heads * head_dim][d_model] */
	float *wk, *wv;	  /* [n_kv_heads * head_dim][d_model] */
	float *wo;	  /* [d_model][n_heads * head_dim] */
	float *ffn_norm;  /* [d_model] */
	float *w1, *w3;	  /* [d_ff][d_model] */
	float *w2;	  /* [d_model][d_ff] */
};

struct tinylm {
	struct tinylm_config cfg;
	float *emb;	   /* [TINYLM_VOCAB][d_model], also the output head */
	float *final_norm; /* [d_model] */
	struct layer *layers;
	float *inv_freq; /* [head_dim / 2] */
	/* scratch */
	float *x, *h, *q, *k, *v, *att, *a, *b;
	void *mem; /* one allocation holds every array above */
};

void tinylm_default_config(struct tinylm_config *cfg, uint64_t seed)
{
	cfg->n_layers = 4;
	cfg->d_model = 128;
	cfg->n_heads = 4;
	cfg->n_kv_heads = 2;
	cfg->head_dim = 32;
	cfg->d_ff = 256;
	cfg->rope_base = 10000.0f;
	cfg->seed = seed;
}

static uint64_t next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-a, a): a 24-bit integer scaled exactly, then one rounding. */
static void fill_uniform(float *w, size_t n, float a, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++)
		w[i] = a * ((float)(int32_t)(next(rng) >> 40) * 0x1p-23f - 1.0f);
}

static void fill_gain(float *w, size_t n, uint64_t *rng)
{
	fill_uniform(w, n, 0.1f, rng);
	for (size_t i = 0; i < n; i++)
		w[i] += 1.0f;
}

/* Σ a_i b_i with eight partial sums (element i into s[i % 8]) in two
 * 4-lane vectors (GCC/clang vector extensions, lane-wise IEEE operations),
 * folded in a fixed order: reproducible bits. */
typedef float v4 __attribute__((vector_size(16)));

static float dot(const float *a, const float *b, uint32_t n)
{
	v4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0}, va, vb;
	float s[8];
	uint32_t i = 0, j;

	for (; i + 8 <= n; i += 8) {
		memcpy(&va, a + i, sizeof(va));
		memcpy(&vb, b + i, sizeof(vb));
		lo += va * vb;
		memcpy(&va, a + i + 4, sizeof(va));
		memcpy(&vb, b + i + 4, sizeof(vb));
		hi += va * vb;
	}
	memcpy(s, &lo, sizeof(lo));
	memcpy(s + 4, &hi, sizeof(hi));
	for (j = 0; i < n; i++, j++)
		s[j] += a[i] * b[i];
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* out[r] = W[r] · x for r < rows (W row-major [rows][cols]). */
static void matvec(float *out, const float *w, const float *x, uint32_t rows, uint32_t cols)
{
	for (uint32_t r = 0; r < rows; r++)
		out[r] = dot(w + (size_t)r * cols, x, cols);
}

static void rmsnorm(float *out, const float *x, const float *gain, uint32_t n)
{
	float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + 1e-6f);

	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * inv * gain[i];
}

/* Rotates pairs (2i, 2i + 1) of each head by pos * inv_freq[i]. */
static void rope(const struct tinylm *m, float *v, uint32_t n_heads, uint64_t pos)
{
	uint32_t hd = m->cfg.head_dim;

	for (uint32_t i = 0; i < hd / 2; i++) {
		double ang = (double)pos * m->inv_freq[i];
		float c = (float)cos(ang), s = (float)sin(ang);

		for (uint32_t h = 0; h < n_heads; h++) {
			float *p = v + (size_t)h * hd + 2 * i;
			float x0 = p[0], x1 = p[1];

			p[0] = x0 * c - x1 * s;
			p[1] = x0 * s + x1 * c;
		}
	}
}

int tinylm_new(const struct tinylm_config *cfg, struct tinylm **ret_model)
{
	const struct tinylm_config *c = cfg;
	size_t d, qd, kd, per_layer, total;
	struct tinylm *m;
	uint64_t rng;
	float *p;

	if (!c->n_layers || c->n_layers > 64 || !c->d_model || c->d_model > 4096 || !c->n_heads ||
	    !c->n_kv_heads || c->n_heads % c->n_kv_heads || !c->head_dim || c->head_dim % 2 ||
	    c->head_dim > SHM_MAX_HEAD_DIM || c->n_heads > 64 || !c->d_ff || c->d_ff > 16384 ||
	    !(c->rope_base > 1.0f))
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->cfg = *c;
	d = c->d_model;
	qd = (size_t)c->n_heads * c->head_dim;
	kd = (size_t)c->n_kv_heads * c->head_dim;
	per_layer = 2 * d + qd * d + 2 * kd * d + d * qd + 3 * (size_t)c->d_ff * d;
	total = TINYLM_VOCAB * d + d + c->n_layers * per_layer + c->head_dim / 2 +
		/* scratch */ 2 * d + qd + 2 * kd + qd + 2 * (size_t)c->d_ff;
	m->mem = calloc(total, sizeof(float));
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	if (!m->mem || !m->layers) {
		tinylm_free(m);
		return -ENOMEM;
	}
	p = m->mem;
	rng = c->seed;
#define TAKE(dst, n)                                                                               \
	do {                                                                                       \
		(dst) = p;                                                                         \
		p += (n);                                                                          \
	} while (0)
	TAKE(m->emb, TINYLM_VOCAB * d);
	fill_uniform(m->emb, TINYLM_VOCAB * d, 1.0f, &rng);
	TAKE(m->final_norm, d);
	fill_gain(m->final_norm, d, &rng);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		struct layer *ly = &m->layers[l];

		TAKE(ly->attn_norm, d);
		fill_gain(ly->attn_norm, d, &rng);
		TAKE(ly->wq, qd * d);
		fill_uniform(ly->wq, qd * d, 1.0f / sqrtf((float)d), &rng);
		TAKE(ly->wk, kd * d);
		fill_uniform(ly->wk, kd * d, 1.0f / sqrtf((float)d), &rng);
		TAKE(ly->wv, kd * d);
		fill_uniform(ly->wv, kd * d, 1.0f / sqrtf((float)d), &rng);
		TAKE(ly->wo, d * qd);
		fill_uniform(ly->wo, d * qd, 1.0f / sqrtf((float)qd), &rng);
		TAKE(ly->ffn_norm, d);
		fill_gain(ly->ffn_norm, d, &rng);
		TAKE(ly->w1, c->d_ff * d);
		fill_uniform(ly->w1, c->d_ff * d, 1.0f / sqrtf((float)d), &rng);
		TAKE(ly->w3, c->d_ff * d);
		fill_uniform(ly->w3, c->d_ff * d, 1.0f / sqrtf((float)d), &rng);
		TAKE(ly->w2, d * c->d_ff);
		fill_uniform(ly->w2, d * c->d_ff, 1.0f / sqrtf((float)c->d_ff), &rng);
	}
	TAKE(m->inv_freq, c->head_dim / 2);
	for (uint32_t i = 0; i < c->head_dim / 2; i++)
		m->inv_freq[i] = (float)pow(c->rope_base, -2.0 * i / c->head_dim);
	TAKE(m->x, d);
	TAKE(m->h, d);
	TAKE(m->q, qd);
	TAKE(m->k, kd);
	TAKE(m->v, kd);
	TAKE(m->att, qd);
	TAKE(m->a, c->d_ff);
	TAKE(m->b, c->d_ff);
#undef TAKE
	*ret_model = m;
	return 0;
}

void tinylm_free(struct tinylm *m)
{
	if (!m)
		return;
	free(m->mem);
	free(m->layers);
	free(m);
}

void tinylm_layout(const struct tinylm *m, uint32_t dtype, uint32_t quant_group,
		   uint32_t block_tokens, struct shm_layout *ret_layout)
{
	ret_layout->n_layers = m->cfg.n_layers;
	ret_layout->n_kv_heads = m->cfg.n_kv_heads;
	ret_layout->head_dim = m->cfg.head_dim;
	ret_layout->block_tokens = block_tokens;
	ret_layout->dtype = dtype;
	ret_layout->quant_group = quant_group;
	ret_layout->format = SHM_FORMAT_KV;
}

/* Stores the f32 rows of kv head h (K or V) at pos, in the pages' format. */
static int store_row(const struct tinylm_kv *kv, uint64_t pos, uint32_t layer, uint32_t which,
		     uint32_t head, const float *row)
{
	const struct shm_layout *l = &kv->layout;
	uint8_t *page = kv->pages[pos / l->block_tokens];
	uint32_t slot = (uint32_t)(pos % l->block_tokens);
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, f = {l->dtype, l->quant_group};
	uint16_t *scales = NULL;

	if (shm_dtype_quantized(l->dtype))
		scales = (uint16_t *)(void *)(page + shm_scale_offset(l, layer, which, head, slot));
	return kref_convert_rows(f, page + shm_kv_offset(l, layer, which, head, slot), scales, f32,
				 row, NULL, 1, l->head_dim);
}

int tinylm_step(struct tinylm *m, const struct tinylm_kv *kv, uint64_t pos, uint32_t token,
		float *logits)
{
	const struct tinylm_config *c = &m->cfg;
	const struct shm_layout *l = &kv->layout;
	uint32_t d = c->d_model, hd = c->head_dim;
	uint32_t qd = c->n_heads * hd;
	int ret;

	if (token >= TINYLM_VOCAB || l->n_layers != c->n_layers || l->n_kv_heads != c->n_kv_heads ||
	    l->head_dim != hd || shm_layout_check(l) < 0 || pos / l->block_tokens >= kv->n_pages)
		return -EINVAL;
	memcpy(m->x, m->emb + (size_t)token * d, d * sizeof(float));
	for (uint32_t li = 0; li < c->n_layers; li++) {
		const struct layer *ly = &m->layers[li];

		rmsnorm(m->h, m->x, ly->attn_norm, d);
		matvec(m->q, ly->wq, m->h, qd, d);
		matvec(m->k, ly->wk, m->h, c->n_kv_heads * hd, d);
		matvec(m->v, ly->wv, m->h, c->n_kv_heads * hd, d);
		rope(m, m->q, c->n_heads, pos);
		rope(m, m->k, c->n_kv_heads, pos);
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			ret = store_row(kv, pos, li, 0, h, m->k + (size_t)h * hd);
			if (ret == 0)
				ret = store_row(kv, pos, li, 1, h, m->v + (size_t)h * hd);
			if (ret < 0)
				return ret;
		}
		ret = kref_attn_decode(l, li, (const void *const *)kv->pages, pos + 1, m->q,
				       c->n_heads, 1.0f / sqrtf((float)hd), m->att, NULL);
		if (ret < 0)
			return ret;
		matvec(m->h, ly->wo, m->att, d, qd);
		for (uint32_t i = 0; i < d; i++)
			m->x[i] += m->h[i];

		rmsnorm(m->h, m->x, ly->ffn_norm, d);
		matvec(m->a, ly->w1, m->h, c->d_ff, d);
		matvec(m->b, ly->w3, m->h, c->d_ff, d);
		for (uint32_t i = 0; i < c->d_ff; i++)
			m->a[i] = m->a[i] / (1.0f + expf(-m->a[i])) * m->b[i];
		matvec(m->h, ly->w2, m->a, d, c->d_ff);
		for (uint32_t i = 0; i < d; i++)
			m->x[i] += m->h[i];
	}
	if (logits) {
		rmsnorm(m->h, m->x, m->final_norm, d);
		matvec(logits, m->emb, m->h, TINYLM_VOCAB, d);
	}
	return 0;
}

uint32_t tinylm_argmax(const float *logits)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < TINYLM_VOCAB; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

uint64_t tinylm_logits_hash(const float *logits)
{
	const uint8_t *b = (const uint8_t *)logits;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < TINYLM_VOCAB * sizeof(float); i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}
