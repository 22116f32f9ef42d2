/* kernels/cuda/score.cu — CUDA scoring (kcuda_score_qk through cuBLAS,
 * kcuda_score_cosine; contract in kernels.h).
 *
 * Q·Kᵀ for row-major Q [n_q][dim] and K [n_k][dim] is, in cuBLAS's
 * column-major terms, C = op(A)·B with A = K read as a dim × n_k matrix
 * (transposed), B = Q read as dim × n_q, and C the n_k × n_q column-major
 * matrix that is S [n_q][n_k] row-major; batches are strided. Cosine
 * similarity is one warp per pair computing a·b, |a|² and |b|² in one pass.
 * Enqueued on the caller's stream, no synchronization.
 */
#include <limits.h>
#include <math.h>

#include <cublas_v2.h>

#include "common.cuh"

extern "C" int kcuda_score_qk(struct cublasContext *blas, const float *d_q, const float *d_k,
			      float *d_scores, uint32_t batch, uint32_t n_q, uint32_t n_k,
			      uint32_t dim, float alpha, struct CUstream_st *stream)
{
	const float beta = 0.0f;
	cublasStatus_t st;

	if (!blas || !batch || !n_q || !n_k || !dim || batch > INT_MAX || n_q > INT_MAX ||
	    n_k > INT_MAX || dim > INT_MAX)
		return -EINVAL;
	if (cublasSetStream(blas, (cudaStream_t)stream) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	st = cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_k, (int)n_q, (int)dim,
				       &alpha, d_k, (int)dim, (long long)n_k * dim, d_q, (int)dim,
				       (long long)n_q * dim, &beta, d_scores, (int)n_k,
				       (long long)n_q * n_k, (int)batch);
	return st == CUBLAS_STATUS_SUCCESS ? 0 : -EIO;
}

#define COSINE_WARPS 4u

__global__ void cosine_kernel(const float *a, uint32_t n_a, const float *b, uint32_t n_b,
			      uint32_t dim, float *sim)
{
	const uint32_t lane = threadIdx.x % 32;

	for (uint32_t i = blockIdx.x; i < n_a; i += gridDim.x)
		for (uint64_t j = (uint64_t)blockIdx.y * COSINE_WARPS + threadIdx.x / 32; j < n_b;
		     j += (uint64_t)gridDim.y * COSINE_WARPS) {
			const float *ai = a + (uint64_t)i * dim, *bj = b + j * dim;
			float d = 0.0f, na = 0.0f, nb = 0.0f, den;

			for (uint32_t c = lane; c < dim; c += 32) {
				d += ai[c] * bj[c];
				na += ai[c] * ai[c];
				nb += bj[c] * bj[c];
			}
			d = kc_warp_sum(d);
			na = kc_warp_sum(na);
			nb = kc_warp_sum(nb);
			den = sqrtf(na) * sqrtf(nb);
			if (lane == 0)
				sim[(uint64_t)i * n_b + j] = den > 0.0f ? d / den : 0.0f;
		}
}

extern "C" int kcuda_score_cosine(const float *d_a, uint32_t n_a, const float *d_b, uint32_t n_b,
				  uint32_t dim, float *d_sim, struct CUstream_st *stream)
{
	uint32_t gy = (n_b + COSINE_WARPS - 1) / COSINE_WARPS;
	dim3 grid(n_a < 65535u ? n_a : 65535u, gy < 65535u ? gy : 65535u);

	if (!n_a || !n_b || !dim)
		return -EINVAL;
	cosine_kernel<<<grid, COSINE_WARPS * 32, 0, (cudaStream_t)stream>>>(d_a, n_a, d_b, n_b, dim,
									    d_sim);
	return kc_launched();
}
