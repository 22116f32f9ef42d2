/* kernels/cuda/convert.cu — CUDA conversion, quantization and
 * dequantization of pages (kcuda_convert_pages; contract in kernels.h).
 *
 * A block handles a tile of rows (about 2048 elements, at most 256 rows):
 * it first finds each row's source and destination addresses (one thread
 * per row), widens the rows to f32 in shared memory with coalesced loads,
 * computes each group's amax and f16 scale (one thread per group; the tile
 * is padded by one float per 32 so those strided reads do not conflict on
 * banks), then writes the codes with coalesced stores. Every scalar step
 * comes from kernels_num.h, the same code as the reference, and max is
 * order-independent, so the output is bit-identical to kref_convert_pages.
 * Grid-stride over tiles; enqueued on the caller's stream, no
 * synchronization.
 */
#include "common.cuh"

#define CONVERT_TILE_ELEMS 2048u
#define CONVERT_MAX_ROWS   256u
#define CONVERT_THREADS	   256u

static __device__ __forceinline__ uint32_t pad(uint32_t e)
{
	return e + (e >> 5);
}

struct convert_args {
	struct kn_geom dg, sg;
	void *const *dst_pages;
	const void *const *src_pages;
	uint32_t tok0, n_tok;
	uint64_t n_rows; /* n_pages * (layer, kv, head) blocks * n_tok */
	uint32_t rows_per_tile;
};

struct row_ptrs {
	const uint8_t *src;
	const uint16_t *src_scales;
	uint8_t *dst;
	uint16_t *dst_scales;
};

__global__ void convert_kernel(struct convert_args a)
{
	extern __shared__ unsigned long long smem_raw[];
	struct row_ptrs *rp = (struct row_ptrs *)(void *)smem_raw;
	float *sm = (float *)(void *)(rp + a.rows_per_tile);
	const uint32_t D = a.dg.head_dim;
	float *scale = sm + pad(a.rows_per_tile * D) + 1; /* [rows][n_groups] */
	const uint64_t n_tiles = (a.n_rows + a.rows_per_tile - 1) / a.rows_per_tile;
	const uint64_t per_page = (uint64_t)a.dg.n_layers * 2 * a.dg.n_kv_heads * a.n_tok;

	for (uint64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
		uint64_t r0 = tile * a.rows_per_tile;
		uint32_t rows = (uint32_t)(a.n_rows - r0 < a.rows_per_tile ? a.n_rows - r0
									   : a.rows_per_tile);

		for (uint32_t lr = threadIdx.x; lr < rows; lr += blockDim.x) {
			uint64_t r = r0 + lr, rem = r % per_page;
			uint64_t ri = rem / a.n_tok * a.dg.block_tokens + a.tok0 + rem % a.n_tok;
			const uint8_t *s = (const uint8_t *)a.src_pages[r / per_page];
			uint8_t *d = (uint8_t *)a.dst_pages[r / per_page];

			rp[lr].src = s + kn_row_offset(&a.sg, ri);
			rp[lr].src_scales =
				(const uint16_t *)(const void *)(s + kn_scale_offset(&a.sg, ri));
			rp[lr].dst = d + kn_row_offset(&a.dg, ri);
			rp[lr].dst_scales = (uint16_t *)(void *)(d + kn_scale_offset(&a.dg, ri));
		}
		__syncthreads();
		for (uint32_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
			const struct row_ptrs *p = &rp[e / D];

			sm[pad(e)] = kn_load(a.sg.dtype, a.sg.group, p->src, p->src_scales, e % D);
		}
		__syncthreads();
		if (a.dg.n_groups) {
			float qmax = kn_qmax(a.dg.dtype);

			for (uint32_t gi = threadIdx.x; gi < rows * a.dg.n_groups;
			     gi += blockDim.x) {
				uint32_t lr = gi / a.dg.n_groups, g = gi % a.dg.n_groups;
				uint32_t e0 = lr * D + g * a.dg.group;
				float amax = 0.0f;
				uint16_t hs;

				for (uint32_t j = 0; j < a.dg.group; j++)
					amax = kn_amax(amax, sm[pad(e0 + j)]);
				hs = kn_scale_f16(amax, qmax);
				scale[gi] = kn_f16_to_f32(hs);
				rp[lr].dst_scales[g] = hs;
			}
			__syncthreads();
		}
		if (a.dg.dtype == SHM_DTYPE_INT4) {
			for (uint32_t bi = threadIdx.x; bi < rows * D / 2; bi += blockDim.x) {
				uint32_t lr = bi / (D / 2), c = bi % (D / 2) * 2;
				uint32_t e = lr * D + c;
				float s0 = scale[lr * a.dg.n_groups + c / a.dg.group];
				float s1 = scale[lr * a.dg.n_groups + (c + 1) / a.dg.group];
				unsigned q0 = (unsigned)kn_quant_int(sm[pad(e)], s0, 7.0f) & 0xfu;
				unsigned q1 =
					(unsigned)kn_quant_int(sm[pad(e + 1)], s1, 7.0f) & 0xfu;

				rp[lr].dst[c / 2] = (uint8_t)(q0 | q1 << 4);
			}
		} else {
			for (uint32_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
				uint32_t lr = e / D, c = e % D;
				float x = sm[pad(e)];
				uint8_t *row = rp[lr].dst;

				switch (a.dg.dtype) {
				case SHM_DTYPE_F16:
					((uint16_t *)(void *)row)[c] = kn_f32_to_f16(x);
					break;
				case SHM_DTYPE_BF16:
					((uint16_t *)(void *)row)[c] = kn_f32_to_bf16(x);
					break;
				case SHM_DTYPE_F32:
					((float *)(void *)row)[c] = x;
					break;
				case SHM_DTYPE_INT8:
					row[c] = (uint8_t)(int8_t)kn_quant_int(
						x, scale[lr * a.dg.n_groups + c / a.dg.group],
						127.0f);
					break;
				default: /* fp8-e4m3 */
					row[c] = kn_quant_e4m3(
						x, scale[lr * a.dg.n_groups + c / a.dg.group]);
					break;
				}
			}
		}
		__syncthreads(); /* the tile is reused by the next iteration */
	}
}

extern "C" int kcuda_convert_pages(const struct shm_layout *dl, void *const *d_dst_pages,
				   const struct shm_layout *sl, const void *const *d_src_pages,
				   uint32_t n_pages, uint32_t tok0, uint32_t n_tok,
				   struct CUstream_st *stream)
{
	struct convert_args a;
	uint32_t rows;
	size_t smem;

	if (shm_layout_check(dl) < 0 || shm_layout_check(sl) < 0 || !shm_layout_numeric(dl) ||
	    !shm_layout_numeric(sl) || dl->n_layers != sl->n_layers ||
	    dl->n_kv_heads != sl->n_kv_heads || dl->head_dim != sl->head_dim ||
	    dl->block_tokens != sl->block_tokens || tok0 > dl->block_tokens ||
	    n_tok > dl->block_tokens - tok0)
		return -EINVAL;
	if (!n_pages || !n_tok)
		return 0;
	a.dg = kc_geom(dl);
	a.sg = kc_geom(sl);
	a.dst_pages = d_dst_pages;
	a.src_pages = d_src_pages;
	a.tok0 = tok0;
	a.n_tok = n_tok;
	a.n_rows = (uint64_t)n_pages * dl->n_layers * 2 * dl->n_kv_heads * n_tok;
	rows = dl->head_dim >= CONVERT_TILE_ELEMS ? 1 : CONVERT_TILE_ELEMS / dl->head_dim;
	a.rows_per_tile = rows > CONVERT_MAX_ROWS ? CONVERT_MAX_ROWS : rows;
	rows = a.rows_per_tile;
	smem = rows * sizeof(struct row_ptrs) +
	       (rows * dl->head_dim + rows * dl->head_dim / 32 + 1 + (size_t)rows * a.dg.n_groups) *
		       sizeof(float);
	convert_kernel<<<kc_blocks(a.n_rows, rows), CONVERT_THREADS, smem, (cudaStream_t)stream>>>(
		a);
	return kc_launched();
}
