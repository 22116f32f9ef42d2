/* kernels/cuda/attn.cu — CUDA paged-attention decode (kcuda_attn_decode;
 * contract in kernels.h), split over chunks of tokens as flash-decoding
 * does, so a single sequence fills the GPU.
 *
 * Pass 1, one block per (chunk of ATTN_CHUNK tokens, kv head, group of up
 * to ATTN_HEADS query heads of that kv head): the queries go to shared
 * memory; each warp takes tokens in turn, reads the K row (dequantizing
 * through kernels_num.h) and reduces q·k for every query head of the block
 * with shuffles; the block then takes each head's max m and sum l of
 * exp(s - m) over the chunk and accumulates Σ exp(s - m) v over the chunk's
 * V rows, threads across head_dim (coalesced). m, l and the accumulator go
 * to the workspace; raw scores go to the weights when asked for.
 * Pass 2, one block per query head: the global max M and sum L from the
 * chunks' (m, l), the output Σ acc e^(m - M) / L, and the weights
 * exp(s - M) / L.
 * Both passes are enqueued on the caller's stream; no synchronization.
 */
#include <math.h>

#include "common.cuh"

#define ATTN_CHUNK   256u /* tokens per block in pass 1 */
#define ATTN_HEADS   8u	  /* query heads per block in pass 1 */
#define ATTN_THREADS 128u

struct attn_args {
	struct kn_geom g;
	uint32_t layer, n_q_heads, group, n_splits;
	uint64_t n_tokens;
	const void *const *pages;
	const float *q;
	float scale;
	float *weights;		     /* raw scores in pass 1, NULL when not asked for */
	float *ws_m, *ws_l, *ws_acc; /* [n_q_heads][n_splits], ..., [..][head_dim] */
	float *out;
};

__global__ void attn_chunk_kernel(struct attn_args a)
{
	extern __shared__ float sm[];
	const uint32_t D = a.g.head_dim;
	const uint32_t split = blockIdx.x, kh = blockIdx.y;
	const uint32_t h0 = kh * a.group + blockIdx.z * ATTN_HEADS;
	const uint32_t nh = min(ATTN_HEADS, (kh + 1) * a.group - h0);
	const uint64_t t0 = (uint64_t)split * ATTN_CHUNK;
	const uint32_t len = (uint32_t)min((uint64_t)ATTN_CHUNK, a.n_tokens - t0);
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint32_t n_warps = blockDim.x / 32;
	float *qs = sm;				  /* [nh][D] */
	float *ps = sm + ATTN_HEADS * D;	  /* [nh][ATTN_CHUNK]: scores, then exp(s - m) */
	float *ms = ps + ATTN_HEADS * ATTN_CHUNK; /* [nh] */

	for (uint32_t i = threadIdx.x; i < nh * D; i += blockDim.x)
		qs[i] = a.q[(uint64_t)h0 * D + i];
	__syncthreads();

	for (uint32_t tl = warp; tl < len; tl += n_warps) {
		float part[ATTN_HEADS];

		for (uint32_t j = 0; j < ATTN_HEADS; j++)
			part[j] = 0.0f;
		for (uint32_t c = lane; c < D; c += 32) {
			float k = kc_load_pos(a.g, a.pages, a.layer, 0, kh, t0 + tl, c);

			for (uint32_t j = 0; j < ATTN_HEADS; j++)
				if (j < nh)
					part[j] += qs[j * D + c] * k;
		}
		for (uint32_t j = 0; j < ATTN_HEADS; j++) {
			float s = kc_warp_sum(part[j]) * a.scale;

			if (lane == 0 && j < nh) {
				ps[j * ATTN_CHUNK + tl] = s;
				if (a.weights)
					a.weights[(uint64_t)(h0 + j) * a.n_tokens + t0 + tl] = s;
			}
		}
	}
	__syncthreads();

	/* per head: max and sum over the chunk, one warp per head */
	for (uint32_t j = warp; j < nh; j += n_warps) {
		float m = -INFINITY, l = 0.0f;

		for (uint32_t t = lane; t < len; t += 32)
			m = fmaxf(m, ps[j * ATTN_CHUNK + t]);
		m = kc_warp_max(m);
		for (uint32_t t = lane; t < len; t += 32) {
			float p = expf(ps[j * ATTN_CHUNK + t] - m);

			ps[j * ATTN_CHUNK + t] = p;
			l += p;
		}
		l = kc_warp_sum(l);
		if (lane == 0) {
			ms[j] = m;
			a.ws_m[(uint64_t)(h0 + j) * a.n_splits + split] = m;
			a.ws_l[(uint64_t)(h0 + j) * a.n_splits + split] = l;
		}
	}
	__syncthreads();

	for (uint32_t c = threadIdx.x; c < D; c += blockDim.x) {
		float acc[ATTN_HEADS];

		for (uint32_t j = 0; j < ATTN_HEADS; j++)
			acc[j] = 0.0f;
		for (uint32_t tl = 0; tl < len; tl++) {
			float v = kc_load_pos(a.g, a.pages, a.layer, 1, kh, t0 + tl, c);

			for (uint32_t j = 0; j < ATTN_HEADS; j++)
				if (j < nh)
					acc[j] += ps[j * ATTN_CHUNK + tl] * v;
		}
		for (uint32_t j = 0; j < nh; j++)
			a.ws_acc[((uint64_t)(h0 + j) * a.n_splits + split) * D + c] = acc[j];
	}
}

__global__ void attn_combine_kernel(struct attn_args a)
{
	__shared__ float red[ATTN_THREADS / 32];
	__shared__ float bcast[2];
	const uint32_t h = blockIdx.x, D = a.g.head_dim;
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const float *m_s = a.ws_m + (uint64_t)h * a.n_splits;
	const float *l_s = a.ws_l + (uint64_t)h * a.n_splits;
	float m = -INFINITY, l = 0.0f, inv;

	for (uint32_t s = threadIdx.x; s < a.n_splits; s += blockDim.x)
		m = fmaxf(m, m_s[s]);
	m = kc_warp_max(m);
	if (lane == 0)
		red[warp] = m;
	__syncthreads();
	if (threadIdx.x == 0) {
		float x = red[0];

		for (uint32_t w = 1; w < blockDim.x / 32; w++)
			x = fmaxf(x, red[w]);
		bcast[0] = x;
	}
	__syncthreads();
	m = bcast[0];
	for (uint32_t s = threadIdx.x; s < a.n_splits; s += blockDim.x)
		l += l_s[s] * expf(m_s[s] - m);
	l = kc_warp_sum(l);
	if (lane == 0)
		red[warp] = l;
	__syncthreads();
	if (threadIdx.x == 0) {
		float x = 0.0f;

		for (uint32_t w = 0; w < blockDim.x / 32; w++)
			x += red[w];
		bcast[1] = x;
	}
	__syncthreads();
	l = bcast[1];
	inv = 1.0f / l;
	for (uint32_t c = threadIdx.x; c < D; c += blockDim.x) {
		float acc = 0.0f;

		for (uint32_t s = 0; s < a.n_splits; s++)
			acc += a.ws_acc[((uint64_t)h * a.n_splits + s) * D + c] * expf(m_s[s] - m);
		a.out[(uint64_t)h * D + c] = acc * inv;
	}
	if (a.weights)
		for (uint64_t t = threadIdx.x; t < a.n_tokens; t += blockDim.x) {
			float *w = a.weights + (uint64_t)h * a.n_tokens + t;

			*w = expf(*w - m) * inv;
		}
}

static uint64_t n_splits_of(uint64_t n_tokens)
{
	return (n_tokens + ATTN_CHUNK - 1) / ATTN_CHUNK;
}

extern "C" size_t kcuda_attn_workspace_bytes(const struct shm_layout *l, uint32_t n_q_heads,
					     uint64_t n_tokens)
{
	return (size_t)n_q_heads * n_splits_of(n_tokens) * (2 + (size_t)l->head_dim) *
	       sizeof(float);
}

extern "C" int kcuda_attn_decode(const struct shm_layout *l, uint32_t layer,
				 const void *const *d_pages, uint64_t n_tokens, const float *d_q,
				 uint32_t n_q_heads, float scale, float *d_out, float *d_weights,
				 void *d_workspace, size_t workspace_bytes,
				 struct CUstream_st *stream)
{
	struct attn_args a;
	uint64_t splits;
	size_t smem;
	int ret;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || layer >= l->n_layers ||
	    !n_tokens || !n_q_heads || n_q_heads % l->n_kv_heads)
		return -EINVAL;
	splits = n_splits_of(n_tokens);
	if (splits > 0x7fffffffu)
		return -EINVAL;
	if (workspace_bytes < kcuda_attn_workspace_bytes(l, n_q_heads, n_tokens))
		return -ENOSPC;
	a.g = kc_geom(l);
	a.layer = layer;
	a.n_q_heads = n_q_heads;
	a.group = n_q_heads / l->n_kv_heads;
	a.n_splits = (uint32_t)splits;
	a.n_tokens = n_tokens;
	a.pages = d_pages;
	a.q = d_q;
	a.scale = scale;
	a.weights = d_weights;
	a.ws_m = (float *)d_workspace;
	a.ws_l = a.ws_m + (size_t)n_q_heads * splits;
	a.ws_acc = a.ws_l + (size_t)n_q_heads * splits;
	a.out = d_out;
	smem = (ATTN_HEADS * (size_t)l->head_dim + ATTN_HEADS * ATTN_CHUNK + ATTN_HEADS) *
	       sizeof(float);
	{
		dim3 grid((unsigned)splits, l->n_kv_heads, (a.group + ATTN_HEADS - 1) / ATTN_HEADS);

		attn_chunk_kernel<<<grid, ATTN_THREADS, smem, (cudaStream_t)stream>>>(a);
	}
	ret = kc_launched();
	if (ret < 0)
		return ret;
	attn_combine_kernel<<<n_q_heads, ATTN_THREADS, 0, (cudaStream_t)stream>>>(a);
	return kc_launched();
}
