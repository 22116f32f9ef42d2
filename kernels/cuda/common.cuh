/* kernels/cuda/common.cuh — what the CUDA kernels of kvpalace share
 * (private to kernels/cuda/): error mapping, the page geometry taken from
 * shm/layout.h on the host, warp reductions. No state.
 */
#ifndef KVP_KERNELS_CUDA_COMMON_CUH
#define KVP_KERNELS_CUDA_COMMON_CUH

#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

/* shm/layout.h is C11; nvcc compiles .cu files as C++, which spells the
 * assertion static_assert. */
#define _Static_assert static_assert
#include "kernels.h"
#include "kernels_num.h"

/* Any CUDA error is -EIO, except those that mean "no usable GPU". */
static inline int kc_err(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	    e == cudaErrorInitializationError || e == cudaErrorCompatNotSupportedOnDevice)
		return -ENODEV;
	return -EIO;
}

/* The status of the launch just made (consumes the sticky-free error). */
static inline int kc_launched(void)
{
	return kc_err(cudaGetLastError());
}

/* The geometry of a checked layout, as the kernels address pages. */
static inline struct kn_geom kc_geom(const struct shm_layout *l)
{
	struct kn_geom g;

	kn_geom_init(&g, l->n_layers, l->n_kv_heads, l->head_dim, l->block_tokens, l->dtype,
		     l->quant_group);
	return g;
}

/* Element c of the row of (layer, kv, head) at sequence position t. */
static __device__ __forceinline__ float kc_load_pos(const struct kn_geom &g,
						    const void *const *pages, uint32_t layer,
						    uint32_t kv, uint32_t head, uint64_t t,
						    uint32_t c)
{
	const uint8_t *page = (const uint8_t *)pages[t / g.block_tokens];
	uint64_t r = kn_row_index(&g, layer, kv, head, (uint32_t)(t % g.block_tokens));

	return kn_load(g.dtype, g.group, page + kn_row_offset(&g, r),
		       (const uint16_t *)(const void *)(page + kn_scale_offset(&g, r)), c);
}

static __device__ __forceinline__ float kc_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float kc_warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Blocks for a grid-stride loop over n items, per items_per_block. */
static inline unsigned kc_blocks(uint64_t n, uint64_t items_per_block)
{
	uint64_t b = (n + items_per_block - 1) / items_per_block;

	return (unsigned)(b > 65535u * 16u ? 65535u * 16u : b ? b : 1);
}

#endif
