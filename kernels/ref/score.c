/* kernels/ref/score.c — the C reference of scoring (see kernels.h): batched
 * Q·Kᵀ (the CPU side of the cuBLAS GEMM) and the cosine similarity of span
 * embeddings for topic selection. Plain loops over ref_dot; no allocation
 * (norms of b are computed per chunk on the stack), thread-safe.
 */
#include <errno.h>
#include <math.h>

#include "ref.h"

int kref_score_qk(const float *q, const float *k, float *scores, uint32_t batch, uint32_t n_q,
		  uint32_t n_k, uint32_t dim, float alpha)
{
	if (!batch || !n_q || !n_k || !dim)
		return -EINVAL;
	for (uint32_t b = 0; b < batch; b++) {
		const float *qb = q + (uint64_t)b * n_q * dim;
		const float *kb = k + (uint64_t)b * n_k * dim;
		float *sb = scores + (uint64_t)b * n_q * n_k;

		for (uint32_t i = 0; i < n_q; i++)
			for (uint32_t j = 0; j < n_k; j++)
				sb[(uint64_t)i * n_k + j] =
					alpha * ref_dot(qb + (uint64_t)i * dim,
							kb + (uint64_t)j * dim, dim);
	}
	return 0;
}

#define COSINE_CHUNK 256u

int kref_score_cosine(const float *a, uint32_t n_a, const float *b, uint32_t n_b, uint32_t dim,
		      float *sim)
{
	float nb[COSINE_CHUNK];

	if (!n_a || !n_b || !dim)
		return -EINVAL;
	for (uint32_t j0 = 0; j0 < n_b; j0 += COSINE_CHUNK) {
		uint32_t nj = n_b - j0 < COSINE_CHUNK ? n_b - j0 : COSINE_CHUNK;

		for (uint32_t j = 0; j < nj; j++) {
			const float *bj = b + (uint64_t)(j0 + j) * dim;

			nb[j] = sqrtf(ref_dot(bj, bj, dim));
		}
		for (uint32_t i = 0; i < n_a; i++) {
			const float *ai = a + (uint64_t)i * dim;
			float na = sqrtf(ref_dot(ai, ai, dim));

			for (uint32_t j = 0; j < nj; j++) {
				float den = na * nb[j];

				sim[(uint64_t)i * n_b + j0 + j] =
					den > 0.0f
						? ref_dot(ai, b + (uint64_t)(j0 + j) * dim, dim) /
							  den
						: 0.0f;
			}
		}
	}
	return 0;
}
