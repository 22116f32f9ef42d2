/* examples/stories/stories.c — the stories260K loader and forward pass (see
 * stories.h): the checkpoint read and checked whole, one token per step,
 * K/V through the page table.
 *
 * Matrix-vector products and norms use one fixed summation order (eight
 * partial sums in two 4-lane vectors, folded in a fixed order), so the
 * results do not depend on the compiler's vectorization. Written from the
 * file format in models/stories260K/README.md, not from llama2.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stories.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the checkpoint is little-endian and read in place");

#define HEADER_BYTES 28u
#define RMS_EPS	     1e-5f

struct layer {
	const float *att_norm; /* [dim] */
	const float *wq;       /* [dim][dim] */
	const float *wk, *wv;  /* [kv_dim][dim] */
	const float *wo;       /* [dim][dim] */
	const float *ffn_norm; /* [dim] */
	const float *w1, *w3;  /* [hidden][dim] */
	const float *w2;       /* [dim][hidden] */
};

struct stories {
	struct stories_config cfg;
	const float *emb;	 /* [vocab][dim] */
	const float *final_norm; /* [dim] */
	const float *rope_cos;	 /* [seq_len][head_dim / 2] */
	const float *rope_sin;	 /* [seq_len][head_dim / 2] */
	const float *wcls;	 /* [vocab][dim]: emb when shared */
	struct layer *layers;
	float *blob; /* the file's tensors, after the header */
	/* scratch */
	float *x, *h, *q, *k, *v, *att, *a, *b; /* [dim] .. [hidden] */
	float *w;				/* [n_heads][seq_len]: attention weights */
	float *scratch;
};

/* ---- arithmetic with a fixed order --------------------------------------- */

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
	float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + RMS_EPS);

	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * inv * gain[i];
}

/* Rotates pairs (2i, 2i + 1) of each head by the file's angle of pos. */
static void rope(const struct stories *m, float *v, uint32_t n_heads, uint32_t pos)
{
	uint32_t hd = m->cfg.head_dim, half = hd / 2;
	const float *cs = m->rope_cos + (size_t)pos * half, *sn = m->rope_sin + (size_t)pos * half;

	for (uint32_t h = 0; h < n_heads; h++)
		for (uint32_t i = 0; i < half; i++) {
			float *p = v + (size_t)h * hd + 2 * i;
			float x0 = p[0], x1 = p[1];

			p[0] = x0 * cs[i] - x1 * sn[i];
			p[1] = x0 * sn[i] + x1 * cs[i];
		}
}

/* ---- loading ----------------------------------------------------------------- */

static int read_all(const char *path, void **ret_buf, size_t *ret_len)
{
	struct stat st;
	size_t got = 0;
	char *buf;
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto fail;
	}
	/* the largest model the bounds of parse_header allow is far below */
	if (!S_ISREG(st.st_mode) || st.st_size < HEADER_BYTES || st.st_size > (1ll << 32)) {
		ret = -EBADMSG;
		goto fail;
	}
	buf = malloc((size_t)st.st_size);
	if (!buf) {
		ret = -ENOMEM;
		goto fail;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EBADMSG;
			free(buf);
			goto fail;
		}
		got += (size_t)n;
	}
	close(fd);
	*ret_buf = buf;
	*ret_len = got;
	return 0;
fail:
	close(fd);
	return ret;
}

static int parse_header(const void *buf, struct stories_config *c)
{
	int32_t h[7];

	memcpy(h, buf, sizeof(h));
	for (int i = 0; i < 7; i++)
		if (h[i] == 0 || (i != 5 && h[i] < 0))
			return -EBADMSG;
	c->dim = (uint32_t)h[0];
	c->hidden_dim = (uint32_t)h[1];
	c->n_layers = (uint32_t)h[2];
	c->n_heads = (uint32_t)h[3];
	c->n_kv_heads = (uint32_t)h[4];
	c->shared_classifier = h[5] > 0;
	c->vocab = h[5] > 0 ? (uint32_t)h[5] : (uint32_t) - (int64_t)h[5];
	c->seq_len = (uint32_t)h[6];
	if (c->dim > 8192 || c->hidden_dim > 32768 || c->n_layers > 64 || c->n_heads > 128 ||
	    c->vocab > (1u << 20) || c->seq_len > 65536 || c->dim % c->n_heads ||
	    c->n_heads % c->n_kv_heads)
		return -EBADMSG;
	c->head_dim = c->dim / c->n_heads;
	if (c->head_dim % 2 || c->head_dim > SHM_MAX_HEAD_DIM || c->n_kv_heads > SHM_MAX_KV_HEADS)
		return -EBADMSG;
	return 0;
}

int stories_load(const char *path, struct stories **ret_model)
{
	struct stories_config c;
	uint64_t d, kv, hid, L, n_floats;
	struct stories *m = NULL;
	void *buf = NULL;
	size_t len, scratch;
	const float *p;
	int ret;

	ret = read_all(path, &buf, &len);
	if (ret < 0)
		return ret;
	ret = parse_header(buf, &c);
	if (ret < 0)
		goto fail;
	d = c.dim;
	kv = (uint64_t)c.n_kv_heads * c.head_dim;
	hid = c.hidden_dim;
	L = c.n_layers;
	n_floats = (uint64_t)c.vocab * d + L * (d + d * d + 2 * kv * d + d * d + d + 3 * hid * d) +
		   d + 2 * (uint64_t)c.seq_len * (c.head_dim / 2) +
		   (c.shared_classifier ? 0 : (uint64_t)c.vocab * d);
	if (len != HEADER_BYTES + 4 * n_floats) {
		ret = -EBADMSG;
		goto fail;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		ret = -ENOMEM;
		goto fail;
	}
	m->cfg = c;
	/* the tensors, aligned: move them down over the header */
	memmove(buf, (char *)buf + HEADER_BYTES, len - HEADER_BYTES);
	m->blob = buf;
	buf = NULL;
	m->layers = calloc(c.n_layers, sizeof(*m->layers));
	scratch = 3 * d + 3 * (size_t)c.n_heads * c.head_dim + 2 * hid +
		  (size_t)c.n_heads * c.seq_len;
	m->scratch = calloc(scratch, sizeof(float));
	if (!m->layers || !m->scratch) {
		ret = -ENOMEM;
		goto fail;
	}
	p = m->blob;
	m->emb = p;
	p += c.vocab * d;
#define EACH_LAYER(field, n)                                                                       \
	do {                                                                                       \
		for (uint32_t l = 0; l < c.n_layers; l++)                                          \
			m->layers[l].field = p + l * (n);                                          \
		p += L * (n);                                                                      \
	} while (0)
	EACH_LAYER(att_norm, d);
	EACH_LAYER(wq, d * d);
	EACH_LAYER(wk, kv * d);
	EACH_LAYER(wv, kv * d);
	EACH_LAYER(wo, d * d);
	EACH_LAYER(ffn_norm, d);
	EACH_LAYER(w1, hid * d);
	EACH_LAYER(w2, d * hid);
	EACH_LAYER(w3, hid * d);
#undef EACH_LAYER
	m->final_norm = p;
	p += d;
	m->rope_cos = p;
	p += (size_t)c.seq_len * (c.head_dim / 2);
	m->rope_sin = p;
	p += (size_t)c.seq_len * (c.head_dim / 2);
	m->wcls = c.shared_classifier ? m->emb : p;
	{
		float *s = m->scratch;

		m->x = s, s += d;
		m->h = s, s += d;
		m->att = s, s += d;
		m->q = s, s += (size_t)c.n_heads * c.head_dim;
		m->k = s, s += (size_t)c.n_heads * c.head_dim;
		m->v = s, s += (size_t)c.n_heads * c.head_dim;
		m->a = s, s += hid;
		m->b = s, s += hid;
		m->w = s;
	}
	*ret_model = m;
	return 0;
fail:
	free(buf);
	stories_free(m);
	return ret;
}

void stories_free(struct stories *m)
{
	if (!m)
		return;
	free(m->blob);
	free(m->layers);
	free(m->scratch);
	free(m);
}

const struct stories_config *stories_config(const struct stories *m)
{
	return &m->cfg;
}

void stories_layout(const struct stories *m, uint32_t dtype, uint32_t quant_group,
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

/* ---- the forward pass ---------------------------------------------------------- */

/* Stores the f32 row of kv head h (K or V) at slot, in the pages' format. */
static int store_row(const struct stories_kv *kv, uint64_t slot, uint32_t layer, uint32_t which,
		     uint32_t head, const float *row)
{
	const struct shm_layout *l = &kv->layout;
	uint8_t *page = kv->pages[slot / l->block_tokens];
	uint32_t s = (uint32_t)(slot % l->block_tokens);
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, f = {l->dtype, l->quant_group};
	uint16_t *scales = NULL;

	if (shm_dtype_quantized(l->dtype))
		scales = (uint16_t *)(void *)(page + shm_scale_offset(l, layer, which, head, s));
	return kref_convert_rows(f, page + shm_kv_offset(l, layer, which, head, s), scales, f32,
				 row, NULL, 1, l->head_dim);
}

int stories_step(struct stories *m, const struct stories_kv *kv, uint64_t slot, uint32_t pos,
		 uint32_t token, float *logits, float *mass)
{
	const struct stories_config *c = &m->cfg;
	const struct shm_layout *l = &kv->layout;
	uint32_t d = c->dim, hd = c->head_dim, kvd = c->n_kv_heads * hd;
	int ret;

	if (token >= c->vocab || pos >= c->seq_len || l->n_layers != c->n_layers ||
	    l->n_kv_heads != c->n_kv_heads || l->head_dim != hd || shm_layout_check(l) < 0 ||
	    slot / l->block_tokens >= kv->n_pages || !kv->pages[slot / l->block_tokens] ||
	    (mass && slot >= c->seq_len))
		return -EINVAL;
	memcpy(m->x, m->emb + (size_t)token * d, d * sizeof(float));
	for (uint32_t li = 0; li < c->n_layers; li++) {
		const struct layer *ly = &m->layers[li];

		rmsnorm(m->h, m->x, ly->att_norm, d);
		matvec(m->q, ly->wq, m->h, d, d);
		matvec(m->k, ly->wk, m->h, kvd, d);
		matvec(m->v, ly->wv, m->h, kvd, d);
		rope(m, m->q, c->n_heads, pos);
		rope(m, m->k, c->n_kv_heads, pos);
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			ret = store_row(kv, slot, li, 0, h, m->k + (size_t)h * hd);
			if (ret == 0)
				ret = store_row(kv, slot, li, 1, h, m->v + (size_t)h * hd);
			if (ret < 0)
				return ret;
		}
		ret = kref_attn_decode(l, li, (const void *const *)kv->pages, slot + 1, m->q,
				       c->n_heads, 1.0f / sqrtf((float)hd), m->att,
				       mass ? m->w : NULL);
		if (ret < 0)
			return ret;
		if (mass)
			for (uint32_t h = 0; h < c->n_heads; h++)
				for (uint64_t t = 0; t <= slot; t++)
					mass[t] += m->w[h * (slot + 1) + t];
		matvec(m->h, ly->wo, m->att, d, d);
		for (uint32_t i = 0; i < d; i++)
			m->x[i] += m->h[i];

		rmsnorm(m->h, m->x, ly->ffn_norm, d);
		matvec(m->a, ly->w1, m->h, c->hidden_dim, d);
		matvec(m->b, ly->w3, m->h, c->hidden_dim, d);
		for (uint32_t i = 0; i < c->hidden_dim; i++)
			m->a[i] = m->a[i] / (1.0f + expf(-m->a[i])) * m->b[i];
		matvec(m->h, ly->w2, m->a, d, c->hidden_dim);
		for (uint32_t i = 0; i < d; i++)
			m->x[i] += m->h[i];
	}
	if (logits) {
		rmsnorm(m->h, m->x, m->final_norm, d);
		matvec(logits, m->wcls, m->h, c->vocab, d);
	}
	return 0;
}

uint32_t stories_argmax(const struct stories *m, const float *logits)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < m->cfg.vocab; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint32_t stories_sample(const struct stories *m, const float *logits, uint64_t *rng)
{
	double mx = logits[stories_argmax(m, logits)], sum = 0, u, acc = 0;

	for (uint32_t i = 0; i < m->cfg.vocab; i++)
		sum += exp((double)logits[i] - mx);
	/* 53 random bits: u in [0, sum) */
	u = (double)(splitmix64(rng) >> 11) * 0x1p-53 * sum;
	for (uint32_t i = 0; i < m->cfg.vocab; i++) {
		acc += exp((double)logits[i] - mx);
		if (u < acc)
			return i;
	}
	return stories_argmax(m, logits); /* rounding left u at the very top */
}

double stories_nll(const struct stories *m, const float *logits, uint32_t token)
{
	double mx = logits[stories_argmax(m, logits)], sum = 0;

	for (uint32_t i = 0; i < m->cfg.vocab; i++)
		sum += exp((double)logits[i] - mx);
	return log(sum) - ((double)logits[token] - mx);
}
