/* tests/kernels/ktest.h — what the kernel tests (CPU reference and GPU)
 * share: a seeded random generator, page tables of heap pages filled with
 * known f32 values in any layout, and a naive double-precision attention
 * that is the yardstick of the reference.
 *
 * Single-threaded; everything is freed by the matching _free. Allocation
 * failures abort (tests only).
 */
#ifndef KVP_KTEST_H
#define KVP_KTEST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* splitmix64: a deterministic stream per seed. */
uint64_t kt_next(uint64_t *state);
/* Uniform in [-1, 1). */
float kt_uniform(uint64_t *state);
/* Standard normal (Box-Muller in double, rounded to f32). */
float kt_normal(uint64_t *state);

/* n_pages zeroed, 4096-aligned pages of layout l. */
struct kt_pages {
	struct shm_layout l;
	uint32_t n_pages;
	size_t page_bytes;
	void **pages;
};
void kt_pages_alloc(struct kt_pages *p, const struct shm_layout *l, uint32_t n_pages);
void kt_pages_free(struct kt_pages *p);
/* Pages enough for n_tokens positions. */
uint32_t kt_pages_for(const struct shm_layout *l, uint64_t n_tokens);

/* Stores row (head_dim f32 values) as position pos, layer, kv, head of the
 * page table (rounded or quantized into the layout's format). */
void kt_store_row(struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
		  const float *row);
/* Reads it back widened to f32 (dequantized). */
void kt_load_row(const struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
		 float *row);

/* Naive attention in double over the (dequantized) rows of positions
 * [0, n_tokens) of one layer: scores, max, exp, sum, weighted sum of V. */
void kt_attn_double(const struct kt_pages *p, uint32_t layer, uint64_t n_tokens, const float *q,
		    uint32_t n_q_heads, float scale, double *out /* [n_q][head_dim] */,
		    double *weights /* [n_q][n_tokens] */);

/* Σ a_i b_i in double (exact enough to judge f32 results). */
double kt_dot_exact(const float *a, const float *b, uint32_t dim);
/* The worst-case error bound kernels.h states for one Q·Kᵀ score:
 * (dim + 2) 2^-24 |alpha| Σ|q_i k_i|, plus the rounding of the result. */
double kt_qk_bound(const float *q, const float *k, uint32_t dim, float alpha);
/* The bound for a cosine similarity: (2 dim + 8) 2^-24. */
double kt_cosine_bound(uint32_t dim);

/* max |a_i| over n floats. */
float kt_max_abs(const float *a, size_t n);

#endif
