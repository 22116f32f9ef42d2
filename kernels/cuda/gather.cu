/* kernels/cuda/gather.cu — CUDA gathers over page tables
 * (kcuda_gather_tokens, kcuda_gather_rows_f32; contract in kernels.h).
 *
 * Compaction copies bytes: one warp per (kept token, layer, kv, head) row,
 * 32-bit words when rows allow it, then the row's f16 scales; a source
 * position out of range skips its token. The f32 gather widens one row per
 * warp through kernels_num.h (bit-identical to the reference). Grid-stride
 * loops; enqueued on the caller's stream, no synchronization.
 */
#include "common.cuh"

#define GATHER_THREADS 128u

struct gather_args {
	struct kn_geom g;
	void *const *dst_pages;
	uint64_t dst_pos0;
	const void *const *src_pages;
	uint64_t n_src_tokens;
	const uint32_t *src_pos;
	uint64_t n_rows; /* n * blocks per token */
};

__global__ void gather_tokens_kernel(struct gather_args a)
{
	const uint32_t lane = threadIdx.x % 32;
	const uint64_t per_tok = (uint64_t)a.g.n_layers * 2 * a.g.n_kv_heads;
	const uint64_t n_warps = (uint64_t)gridDim.x * blockDim.x / 32;

	for (uint64_t w = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < a.n_rows;
	     w += n_warps) {
		uint64_t i = w / per_tok, blk = w % per_tok;
		uint64_t s = a.src_pos[i], d = a.dst_pos0 + i;
		uint64_t sri, dri;
		const uint8_t *sp;
		uint8_t *dp;

		if (s >= a.n_src_tokens)
			continue;
		sri = blk * a.g.block_tokens + s % a.g.block_tokens;
		dri = blk * a.g.block_tokens + d % a.g.block_tokens;
		sp = (const uint8_t *)a.src_pages[s / a.g.block_tokens];
		dp = (uint8_t *)a.dst_pages[d / a.g.block_tokens];
		if (a.g.row_bytes % 4 == 0) {
			const uint32_t *sw =
				(const uint32_t *)(const void *)(sp + kn_row_offset(&a.g, sri));
			uint32_t *dw = (uint32_t *)(void *)(dp + kn_row_offset(&a.g, dri));

			for (uint32_t j = lane; j < a.g.row_bytes / 4; j += 32)
				dw[j] = sw[j];
		} else {
			const uint8_t *sb = sp + kn_row_offset(&a.g, sri);
			uint8_t *db = dp + kn_row_offset(&a.g, dri);

			for (uint32_t j = lane; j < a.g.row_bytes; j += 32)
				db[j] = sb[j];
		}
		if (a.g.n_groups) {
			const uint16_t *ss =
				(const uint16_t *)(const void *)(sp + kn_scale_offset(&a.g, sri));
			uint16_t *ds = (uint16_t *)(void *)(dp + kn_scale_offset(&a.g, dri));

			for (uint32_t j = lane; j < a.g.n_groups; j += 32)
				ds[j] = ss[j];
		}
	}
}

extern "C" int kcuda_gather_tokens(const struct shm_layout *l, void *const *d_dst_pages,
				   uint64_t dst_pos0, const void *const *d_src_pages,
				   uint64_t n_src_tokens, const uint32_t *d_src_pos, uint64_t n,
				   struct CUstream_st *stream)
{
	struct gather_args a;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || dst_pos0 > UINT64_MAX - n)
		return -EINVAL;
	if (!n)
		return 0;
	a.g = kc_geom(l);
	a.dst_pages = d_dst_pages;
	a.dst_pos0 = dst_pos0;
	a.src_pages = d_src_pages;
	a.n_src_tokens = n_src_tokens;
	a.src_pos = d_src_pos;
	a.n_rows = n * l->n_layers * 2 * l->n_kv_heads;
	gather_tokens_kernel<<<kc_blocks(a.n_rows, GATHER_THREADS / 32), GATHER_THREADS, 0,
			       (cudaStream_t)stream>>>(a);
	return kc_launched();
}

struct rows_args {
	struct kn_geom g;
	const void *const *pages;
	uint32_t layer, kv, head;
	uint64_t pos0, n;
	float *dst;
};

__global__ void gather_rows_kernel(struct rows_args a)
{
	const uint32_t lane = threadIdx.x % 32;
	const uint64_t n_warps = (uint64_t)gridDim.x * blockDim.x / 32;

	for (uint64_t i = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < a.n;
	     i += n_warps)
		for (uint32_t c = lane; c < a.g.head_dim; c += 32)
			a.dst[i * a.g.head_dim + c] =
				kc_load_pos(a.g, a.pages, a.layer, a.kv, a.head, a.pos0 + i, c);
}

extern "C" int kcuda_gather_rows_f32(const struct shm_layout *l, const void *const *d_pages,
				     uint32_t layer, uint32_t kv, uint32_t kv_head, uint64_t pos0,
				     uint64_t n, float *d_dst, struct CUstream_st *stream)
{
	struct rows_args a;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || layer >= l->n_layers || kv > 1 ||
	    kv_head >= l->n_kv_heads || pos0 > UINT64_MAX - n)
		return -EINVAL;
	if (!n)
		return 0;
	a.g = kc_geom(l);
	a.pages = d_pages;
	a.layer = layer;
	a.kv = kv;
	a.head = kv_head;
	a.pos0 = pos0;
	a.n = n;
	a.dst = d_dst;
	gather_rows_kernel<<<kc_blocks(n, GATHER_THREADS / 32), GATHER_THREADS, 0,
			     (cudaStream_t)stream>>>(a);
	return kc_launched();
}
