/* kernels/cuda/adapt.cu — the engine-layout adapters on the GPU
 * (kcuda_adapt; contract in kernels.h, reference in ref/adapt.c).
 *
 * One launch for the whole list of pages: one thread block per (page,
 * layer, k|v, head), grid-stride over them, its threads over the
 * n_tokens x row_bytes bytes of that run (contiguous in the page; one
 * row per token_stride in the engine), in 16-byte vectors when both
 * sides and the strides are 16-byte aligned, else 4-byte words, else
 * bytes (decided per run: uniform inside a block). Block ids, page bases
 * and layer bases live in device memory and are not read on the host: a
 * bad one skips its run. Enqueued on the caller's stream, no
 * synchronization.
 */
#include "common.cuh"

#define ADAPT_THREADS 256u

struct adapt_args {
	void *const *pages;
	const int32_t *block_ids;
	void *const *k_layers;
	void *const *v_layers;
	uint64_t v_offset_bytes;
	uint64_t block_stride_bytes, token_stride_bytes, head_stride_bytes;
	uint64_t page_layer_stride, page_kv_stride, page_head_stride; /* bytes */
	uint64_t n_items; /* pages x layers x 2 x heads */
	uint64_t n_pages;
	uint32_t row_bytes, block_tokens, last_page_tokens, num_blocks;
	struct kern_adapt_range r;
	uint32_t dir;
};

template <typename T>
static __device__ __forceinline__ void adapt_run(uint8_t *pr, uint8_t *er, uint32_t n_tok,
						 const struct adapt_args &a)
{
	const uint32_t upr = a.row_bytes / sizeof(T);
	const uint32_t n = n_tok * upr;

	for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
		uint32_t t = u / upr, c = u % upr;
		T *p = (T *)(void *)(pr + (uint64_t)t * a.row_bytes) + c;
		T *e = (T *)(void *)(er + t * a.token_stride_bytes) + c;

		if (a.dir == KERN_ADAPT_TO_ENGINE)
			*e = *p;
		else
			*p = *e;
	}
}

__global__ void adapt_kernel(struct adapt_args a)
{
	for (uint64_t it = blockIdx.x; it < a.n_items; it += gridDim.x) {
		uint32_t hi = (uint32_t)(it % a.r.n_heads);
		uint64_t rest = it / a.r.n_heads;
		uint32_t kv = (uint32_t)(rest % 2);
		uint32_t li = (uint32_t)(rest / 2 % a.r.n_layers);
		uint64_t i = rest / 2 / a.r.n_layers;
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
		if (!(align % 16))
			adapt_run<uint4>(pr, er, n_tok, a);
		else if (!(align % 4))
			adapt_run<uint32_t>(pr, er, n_tok, a);
		else
			adapt_run<uint8_t>(pr, er, n_tok, a);
	}
}

extern "C" int kcuda_adapt(const struct shm_layout *l, void *const *d_pages, size_t n_pages,
			   uint32_t last_page_tokens, const struct kern_engine *e,
			   const int32_t *d_block_ids, const struct kern_adapt_range *r,
			   uint32_t dir, struct CUstream_st *stream)
{
	struct adapt_args a;
	uint64_t es;
	int ret;

	ret = kref_adapt_plan(l, n_pages, last_page_tokens, e, r, &a.r);
	if (ret < 0)
		return ret;
	if (dir != KERN_ADAPT_TO_ENGINE && dir != KERN_ADAPT_TO_PAGES)
		return -EINVAL;
	if (!n_pages)
		return 0;
	if (!d_pages || !d_block_ids || !e->k_layers)
		return -EINVAL;
	/* one block per run: the count must fit the grid-stride index */
	if (n_pages > UINT64_MAX / 2 / a.r.n_layers / a.r.n_heads)
		return -ERANGE;
	es = e->elem_bytes;
	a.pages = d_pages;
	a.block_ids = d_block_ids;
	a.k_layers = e->k_layers;
	a.v_layers = e->v_layers;
	/* the plan bounded every extent to 63 bits of bytes */
	a.v_offset_bytes = e->v_offset * es;
	a.block_stride_bytes = e->block_stride * es;
	a.token_stride_bytes = e->token_stride * es;
	a.head_stride_bytes = e->head_stride * es;
	a.row_bytes = (uint32_t)shm_row_bytes(l);
	a.page_head_stride = (uint64_t)l->block_tokens * a.row_bytes;
	a.page_kv_stride = l->n_kv_heads * a.page_head_stride;
	a.page_layer_stride = 2 * a.page_kv_stride;
	a.n_pages = n_pages;
	a.n_items = (uint64_t)n_pages * a.r.n_layers * 2 * a.r.n_heads;
	a.block_tokens = l->block_tokens;
	a.last_page_tokens = last_page_tokens;
	a.num_blocks = e->num_blocks;
	a.dir = dir;
	adapt_kernel<<<kc_blocks(a.n_items, 1), ADAPT_THREADS, 0, (cudaStream_t)stream>>>(a);
	return kc_launched();
}
