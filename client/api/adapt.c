/* client/api/adapt.c — engine layouts: kvp_engine_cache_init fills the
 * element strides of the engines' named paged layouts (FlashAttention,
 * FlashInfer NHD and HND, SGLang), and kvp_pages_to_engine /
 * kvp_engine_to_pages copy a list of pages between kvpalace pages and an
 * engine's blocks (contract in kvpalace.h).
 *
 * The copies are kernels/ref/adapt.c's kref_adapt, linked into the
 * library: one routine that is the reference the CUDA kernel
 * (kernels/cuda/adapt.cu) is tested against and the engines' CPU path,
 * so the two never drift. This file only translates the public structs
 * into the kernels' (struct kvp_layout is struct shm_layout field for
 * field). Nothing goes to the daemon; no state, thread-safe.
 *
 * Layer: api (client/README.md): calls no other file of client/; links
 * kernels/ref (below every client layer, like shm/).
 */
#include <errno.h>
#include <string.h>

#include "kernels.h"
#include "kvpalace.h"

KVP_PUBLIC int kvp_engine_cache_init(struct kvp_engine_cache *ret, uint32_t kind, uint32_t n_layers,
				     void *const *k_layers, void *const *v_layers,
				     uint32_t num_blocks, uint32_t block_size, uint32_t n_heads,
				     uint32_t head_dim, uint32_t elem_bytes)
{
	struct kvp_engine_cache c;
	uint64_t row = (uint64_t)n_heads * head_dim, blk, bytes;

	if (!ret || !k_layers || !n_layers || !num_blocks || !block_size || !n_heads || !head_dim ||
	    (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4))
		return -EINVAL;
	/* both tensors of a layer, in bytes, within 63 bits */
	if (__builtin_mul_overflow(row, (uint64_t)block_size, &blk) ||
	    __builtin_mul_overflow(blk, (uint64_t)num_blocks * 2, &bytes) ||
	    __builtin_mul_overflow(bytes, (uint64_t)elem_bytes, &bytes) || bytes > INT64_MAX)
		return -ERANGE;
	memset(&c, 0, sizeof(c));
	c.kind = kind;
	c.n_layers = n_layers;
	c.num_blocks = num_blocks;
	c.block_size = block_size;
	c.n_heads = n_heads;
	c.head_dim = head_dim;
	c.elem_bytes = elem_bytes;
	c.k_layers = k_layers;
	c.v_layers = v_layers;
	switch (kind) {
	case KVP_ENGINE_FLASH_ATTN: /* [2, num_blocks, bs, H, D] */
		c.block_stride = blk;
		c.token_stride = row;
		c.head_stride = head_dim;
		c.v_offset = v_layers ? 0 : blk * num_blocks;
		break;
	case KVP_ENGINE_FLASHINFER_NHD: /* [num_blocks, 2, bs, H, D] */
		c.block_stride = 2 * blk;
		c.token_stride = row;
		c.head_stride = head_dim;
		c.v_offset = v_layers ? 0 : blk;
		break;
	case KVP_ENGINE_FLASHINFER_HND: /* [num_blocks, 2, H, bs, D] */
		c.block_stride = 2 * blk;
		c.token_stride = head_dim;
		c.head_stride = (uint64_t)block_size * head_dim;
		c.v_offset = v_layers ? 0 : blk;
		break;
	case KVP_ENGINE_SGLANG: /* K and V pools [num_blocks * bs, H, D] */
		if (!v_layers)
			return -EINVAL;
		c.block_stride = blk;
		c.token_stride = row;
		c.head_stride = head_dim;
		break;
	default:
		return -EINVAL;
	}
	*ret = c;
	return 0;
}

static int adapt(const struct kvp_layout *layout, void *const *page_bases, size_t n_pages,
		 uint32_t last_page_tokens, const struct kvp_engine_cache *cache,
		 const int32_t *block_ids, const struct kvp_adapt_range *range, uint32_t dir)
{
	struct kern_adapt_range r;
	struct shm_layout l;
	struct kern_engine e;

	if (!layout || !cache || cache->reserved)
		return -EINVAL;
	l.n_layers = layout->n_layers;
	l.n_kv_heads = layout->n_kv_heads;
	l.head_dim = layout->head_dim;
	l.block_tokens = layout->block_tokens;
	l.dtype = layout->dtype;
	l.quant_group = layout->quant_group;
	l.format = layout->format;
	e.k_layers = cache->k_layers;
	e.v_layers = cache->v_layers;
	e.v_offset = cache->v_offset;
	e.block_stride = cache->block_stride;
	e.token_stride = cache->token_stride;
	e.head_stride = cache->head_stride;
	e.n_layers = cache->n_layers;
	e.num_blocks = cache->num_blocks;
	e.block_size = cache->block_size;
	e.n_heads = cache->n_heads;
	e.head_dim = cache->head_dim;
	e.elem_bytes = cache->elem_bytes;
	if (range) {
		r.layer_first = range->layer_first;
		r.n_layers = range->n_layers;
		r.head_first = range->head_first;
		r.n_heads = range->n_heads;
		r.engine_layer_first = range->engine_layer_first;
		r.engine_head_first = range->engine_head_first;
	}
	return kref_adapt(&l, page_bases, n_pages, last_page_tokens, &e, block_ids,
			  range ? &r : NULL, dir);
}

KVP_PUBLIC int kvp_pages_to_engine(const struct kvp_layout *layout, void *const *page_bases,
				   size_t n_pages, uint32_t last_page_tokens,
				   const struct kvp_engine_cache *cache, const int32_t *block_ids,
				   const struct kvp_adapt_range *range)
{
	return adapt(layout, page_bases, n_pages, last_page_tokens, cache, block_ids, range,
		     KERN_ADAPT_TO_ENGINE);
}

KVP_PUBLIC int kvp_engine_to_pages(const struct kvp_layout *layout, void *const *page_bases,
				   size_t n_pages, uint32_t last_page_tokens,
				   const struct kvp_engine_cache *cache, const int32_t *block_ids,
				   const struct kvp_adapt_range *range)
{
	return adapt(layout, page_bases, n_pages, last_page_tokens, cache, block_ids, range,
		     KERN_ADAPT_TO_PAGES);
}
