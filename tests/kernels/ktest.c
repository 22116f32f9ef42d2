/* tests/kernels/ktest.c — shared helpers of the kernel tests (see
 * ktest.h). Single-threaded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ktest.h"

uint64_t kt_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float kt_uniform(uint64_t *state)
{
	return (float)((double)(kt_next(state) >> 11) * 0x1p-52 - 1.0);
}

float kt_normal(uint64_t *state)
{
	double u1 = ((double)(kt_next(state) >> 11) + 1.0) * 0x1p-53;
	double u2 = (double)(kt_next(state) >> 11) * 0x1p-53;

	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static void *xalloc(size_t align, size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, align, n ? n : 1)) {
		fprintf(stderr, "ktest: out of memory (%zu bytes)\n", n);
		abort();
	}
	memset(p, 0, n);
	return p;
}

void kt_pages_alloc(struct kt_pages *p, const struct shm_layout *l, uint32_t n_pages)
{
	if (shm_layout_check(l) < 0) {
		fprintf(stderr, "ktest: bad layout\n");
		abort();
	}
	p->l = *l;
	p->n_pages = n_pages;
	p->page_bytes = shm_page_bytes(l);
	p->pages = xalloc(sizeof(void *), (size_t)n_pages * sizeof(void *));
	for (uint32_t i = 0; i < n_pages; i++)
		p->pages[i] = xalloc(SHM_PAGE_ALIGN, p->page_bytes);
}

void kt_pages_free(struct kt_pages *p)
{
	for (uint32_t i = 0; p->pages && i < p->n_pages; i++)
		free(p->pages[i]);
	free(p->pages);
	p->pages = NULL;
	p->n_pages = 0;
}

uint32_t kt_pages_for(const struct shm_layout *l, uint64_t n_tokens)
{
	return (uint32_t)((n_tokens + l->block_tokens - 1) / l->block_tokens);
}

static void row_ptrs(const struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv,
		     uint32_t head, uint8_t **row, uint16_t **scales)
{
	uint8_t *page = p->pages[pos / p->l.block_tokens];
	uint32_t slot = (uint32_t)(pos % p->l.block_tokens);

	*row = page + shm_kv_offset(&p->l, layer, kv, head, slot);
	*scales = shm_dtype_quantized(p->l.dtype)
			  ? (uint16_t *)(void *)(page +
						 shm_scale_offset(&p->l, layer, kv, head, slot))
			  : NULL;
}

void kt_store_row(struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
		  const float *row)
{
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, f = {p->l.dtype, p->l.quant_group};
	uint16_t *scales;
	uint8_t *dst;

	row_ptrs(p, pos, layer, kv, head, &dst, &scales);
	if (kref_convert_rows(f, dst, scales, f32, row, NULL, 1, p->l.head_dim) < 0)
		abort();
}

void kt_load_row(const struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
		 float *row)
{
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, f = {p->l.dtype, p->l.quant_group};
	uint16_t *scales;
	uint8_t *src;

	row_ptrs(p, pos, layer, kv, head, &src, &scales);
	if (kref_convert_rows(f32, row, NULL, f, src, scales, 1, p->l.head_dim) < 0)
		abort();
}

void kt_attn_double(const struct kt_pages *p, uint32_t layer, uint64_t n_tokens, const float *q,
		    uint32_t n_q_heads, float scale, double *out, double *weights)
{
	uint32_t hd = p->l.head_dim, group = n_q_heads / p->l.n_kv_heads;
	float *row = xalloc(64, hd * sizeof(float));

	for (uint32_t h = 0; h < n_q_heads; h++) {
		double *w = weights + (uint64_t)h * n_tokens, m = -INFINITY, sum = 0.0;

		for (uint64_t t = 0; t < n_tokens; t++) {
			double s = 0.0;

			kt_load_row(p, t, layer, 0, h / group, row);
			for (uint32_t i = 0; i < hd; i++)
				s += (double)q[(uint64_t)h * hd + i] * row[i];
			w[t] = s * scale;
			if (w[t] > m)
				m = w[t];
		}
		for (uint64_t t = 0; t < n_tokens; t++) {
			w[t] = exp(w[t] - m);
			sum += w[t];
		}
		for (uint32_t i = 0; i < hd; i++)
			out[(uint64_t)h * hd + i] = 0.0;
		for (uint64_t t = 0; t < n_tokens; t++) {
			w[t] /= sum;
			kt_load_row(p, t, layer, 1, h / group, row);
			for (uint32_t i = 0; i < hd; i++)
				out[(uint64_t)h * hd + i] += w[t] * row[i];
		}
	}
	free(row);
}

double kt_dot_exact(const float *a, const float *b, uint32_t dim)
{
	double s = 0.0;

	for (uint32_t d = 0; d < dim; d++)
		s += (double)a[d] * b[d];
	return s;
}

double kt_qk_bound(const float *q, const float *k, uint32_t dim, float alpha)
{
	double abs_sum = 0.0;

	for (uint32_t d = 0; d < dim; d++)
		abs_sum += fabs((double)q[d] * k[d]);
	return (dim + 2) * 0x1p-24 * fabs(alpha) * abs_sum +
	       0x1p-24 * fabs(alpha * kt_dot_exact(q, k, dim));
}

double kt_cosine_bound(uint32_t dim)
{
	return (2.0 * dim + 8) * 0x1p-24;
}

float kt_max_abs(const float *a, size_t n)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++)
		m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
	return m;
}
