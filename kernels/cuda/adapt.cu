/* kernels/cuda/adapt.cu — the engine-layout adapters on the GPU
 * (kcuda_adapt; contract in kernels.h, reference in ref/adapt.c).
 *
 * One launch for the whole list of pages. The kernel and the host setup
 * of its arguments are in adapt_body.h, in C that a C compiler takes too
 * (tests/kernels/test_adapt_emu.c runs it on the CPU against the
 * reference); this file only launches it. Enqueued on the caller's
 * stream, no synchronization.
 */
#include "common.cuh"

#include "adapt_body.h"

extern "C" int kcuda_adapt(const struct shm_layout *l, void *const *d_pages, size_t n_pages,
			   uint32_t last_page_tokens, const struct kern_engine *e,
			   const int32_t *d_block_ids, const struct kern_adapt_range *r,
			   uint32_t dir, struct CUstream_st *stream)
{
	struct adapt_args a;
	int ret =
		adapt_args_init(&a, l, d_pages, n_pages, last_page_tokens, e, d_block_ids, r, dir);

	if (ret <= 0)
		return ret;
	adapt_kernel<<<kc_blocks(a.n_items, 1), ADAPT_THREADS, 0, (cudaStream_t)stream>>>(a);
	return kc_launched();
}
