/* kernels/cuda/adapt_body.h — the code of kcuda_adapt (adapt.cu), written
 * in the subset of C that nvcc and a C compiler both take, so that
 * tests/kernels/test_adapt_emu.c can run the kernel on the CPU (blocks and
 * threads one after another: it has no shared memory and no barrier) and
 * check its index arithmetic against kref_adapt where no GPU exists.
 *
 * Whoever includes it has included kernels.h and provides __global__,
 * __device__, __forceinline__, uint4 (16 bytes) and threadIdx, blockIdx,
 * blockDim, gridDim (.x only): CUDA does; the emulation defines them.
 *
 * One thread block per (page, layer, k|v (one plane: latent), head), grid-stride over them,
 * its threads over the n_tokens x row_bytes bytes of that run (contiguous
 * in the page; one row per token_stride in the engine), in 16-byte vectors
 * when both sides and the strides are 16-byte aligned, else 4-byte words,
 * else bytes (decided per run: uniform inside a block). Block ids, page
 * bases and layer bases are read on the device only: a bad one skips its
 * run.
 */
#ifndef KVP_KERNELS_CUDA_ADAPT_BODY_H
#define KVP_KERNELS_CUDA_ADAPT_BODY_H

#define ADAPT_THREADS 256u

struct adapt_args {
	void *const *pages;
	const int32_t *block_ids;
	void *const *k_layers;
	void *const *v_layers;
	uint64_t v_offset_bytes;
	uint64_t block_stride_bytes, token_stride_bytes, head_stride_bytes;
	uint64_t page_layer_stride, page_kv_stride, page_head_stride; /* bytes */
	uint64_t n_items; /* pages x layers x planes x heads */
	uint64_t n_pages;
	uint32_t planes; /* 2 (K, V), 1 (a latent layout: no V) */
	uint32_t row_bytes, block_tokens, last_page_tokens, num_blocks;
	struct kern_adapt_range r;
	uint32_t dir;
};

/* The n_tok rows of one run, w (16, 4 or 1) bytes per thread and step. */
static __device__ __forceinline__ void adapt_run(uint8_t *pr, uint8_t *er, uint32_t n_tok,
						 uint32_t w, const struct adapt_args *a)
{
	const uint32_t upr = a->row_bytes / w;
	const uint32_t n = n_tok * upr;

	for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
		uint32_t t = u / upr, c = u % upr;
		uint8_t *p = pr + (uint64_t)t * a->row_bytes + (uint64_t)c * w;
		uint8_t *e = er + t * a->token_stride_bytes + (uint64_t)c * w;
		uint8_t *dst = a->dir == KERN_ADAPT_TO_ENGINE ? e : p;
		const uint8_t *src = a->dir == KERN_ADAPT_TO_ENGINE ? p : e;

		if (w == 16)
			*(uint4 *)(void *)dst = *(const uint4 *)(const void *)src;
		else if (w == 4)
			*(uint32_t *)(void *)dst = *(const uint32_t *)(const void *)src;
		else
			*dst = *src;
	}
}

__global__ void adapt_kernel(struct adapt_args a)
{
	for (uint64_t it = blockIdx.x; it < a.n_items; it += gridDim.x) {
		uint32_t hi = (uint32_t)(it % a.r.n_heads);
		uint64_t rest = it / a.r.n_heads;
		uint32_t kv = (uint32_t)(rest % a.planes);
		uint32_t li = (uint32_t)(rest / a.planes % a.r.n_layers);
		uint64_t i = rest / a.planes / a.r.n_layers;
		uint32_t el = a.r.engine_layer_first + li;
		int32_t bid = a.block_ids[i];
		uint8_t *page = (uint8_t *)a.pages[i];
		uint8_t *eb = (uint8_t *)a.k_layers[el];
		uint32_t n_tok = i + 1 == a.n_pages ? a.last_page_tokens : a.block_tokens;
		uint8_t *pr, *er;
		uint64_t align;

		if (bid < 0 || (uint32_t)bid >= a.num_blocks || !page || !eb)
			continue;
		if (kv) {
			if (a.v_layers) {
				eb = (uint8_t *)a.v_layers[el];
				if (!eb)
					continue;
			} else {
				eb += a.v_offset_bytes;
			}
		}
		pr = page + (a.r.layer_first + li) * a.page_layer_stride + kv * a.page_kv_stride +
		     (a.r.head_first + hi) * a.page_head_stride;
		er = eb + (uint64_t)bid * a.block_stride_bytes +
		     (uint64_t)(a.r.engine_head_first + hi) * a.head_stride_bytes;
		align = (uint64_t)(uintptr_t)pr | (uint64_t)(uintptr_t)er | a.row_bytes |
			a.token_stride_bytes;
		adapt_run(pr, er, n_tok, !(align % 16) ? 16 : !(align % 4) ? 4 : 1, &a);
	}
}

/* The launch's arguments, on the host: 1 when there is work (a filled),
 * 0 when n_pages is 0, or kcuda_adapt's errors. */
static int adapt_args_init(struct adapt_args *a, const struct shm_layout *l, void *const *d_pages,
			   size_t n_pages, uint32_t last_page_tokens, const struct kern_engine *e,
			   const int32_t *d_block_ids, const struct kern_adapt_range *r,
			   uint32_t dir)
{
	uint64_t es;
	int ret;

	ret = kref_adapt_plan(l, n_pages, last_page_tokens, e, r, &a->r);
	if (ret < 0)
		return ret;
	if (dir != KERN_ADAPT_TO_ENGINE && dir != KERN_ADAPT_TO_PAGES)
		return -EINVAL;
	if (!n_pages)
		return 0;
	if (!d_pages || !d_block_ids || !e->k_layers)
		return -EINVAL;
	/* one block per run: the count must fit the grid-stride index */
	if (n_pages > UINT64_MAX / 2 / a->r.n_layers / a->r.n_heads)
		return -ERANGE;
	es = e->elem_bytes;
	a->pages = d_pages;
	a->block_ids = d_block_ids;
	a->k_layers = e->k_layers;
	a->v_layers = e->v_layers;
	/* the plan bounded every extent to 63 bits of bytes */
	a->v_offset_bytes = e->v_offset * es;
	a->block_stride_bytes = e->block_stride * es;
	a->token_stride_bytes = e->token_stride * es;
	a->head_stride_bytes = e->head_stride * es;
	a->row_bytes = (uint32_t)shm_row_bytes(l);
	a->page_head_stride = (uint64_t)l->block_tokens * a->row_bytes;
	a->page_kv_stride = l->n_kv_heads * a->page_head_stride;
	a->planes = shm_layout_planes(l);
	a->page_layer_stride = a->planes * a->page_kv_stride;
	a->n_pages = n_pages;
	a->n_items = (uint64_t)n_pages * a->r.n_layers * a->planes * a->r.n_heads;
	a->block_tokens = l->block_tokens;
	a->last_page_tokens = last_page_tokens;
	a->num_blocks = e->num_blocks;
	a->dir = dir;
	return 1;
}

#endif
