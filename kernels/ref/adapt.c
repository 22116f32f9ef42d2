/* kernels/ref/adapt.c — the C reference of the engine-layout adapters (see
 * kernels.h): copies between kvpalace pages, data[layer][k|v][head][token]
 * [head_dim], and an engine's paged cache, per layer a K and a V tensor
 * addressed by element strides over (block, token, head). The checks every
 * side shares (kref_adapt_plan: the geometry, no pointer read) live here
 * too, so the CUDA launcher refuses exactly what the reference refuses.
 * Bytewise copies: the dtype only sets the element size (1 byte for the
 * engine-owned fp8 types, whose per-layer scales stay in the page: the
 * engine keeps its own); quantized pages (group scales after the data) are
 * refused. A latent layout has one plane per layer: the engine's K tensors
 * take it, v_layers and v_offset are not used. Everything is checked before
 * anything is written. No allocation, thread-safe.
 */
#include <errno.h>
#include <string.h>

#include "ref.h"

/* Elements spanned by one engine tensor (the last element's offset + 1),
 * or -EINVAL when two rows of it overlap, -ERANGE when it overflows 63
 * bits of bytes. Sorted by stride, each dimension with more than one index
 * must step over everything the smaller ones span: then no two (block,
 * token, head) rows share an element. */
static int engine_extent(const struct kern_engine *e, uint64_t *ret)
{
	uint64_t st[3] = {e->block_stride, e->token_stride, e->head_stride};
	uint64_t n[3] = {e->num_blocks, e->block_size, e->n_heads};
	uint64_t ext = e->head_dim, bytes;

	for (int i = 0; i < 3; i++)
		for (int j = i + 1; j < 3; j++)
			if (st[j] < st[i]) {
				uint64_t t = st[i];

				st[i] = st[j];
				st[j] = t;
				t = n[i];
				n[i] = n[j];
				n[j] = t;
			}
	for (int i = 0; i < 3; i++) {
		uint64_t span;

		if (n[i] < 2)
			continue;
		if (st[i] < ext)
			return -EINVAL;
		if (__builtin_mul_overflow(st[i], n[i] - 1, &span) ||
		    __builtin_add_overflow(span, ext, &ext))
			return -ERANGE;
	}
	if (!e->v_layers && __builtin_add_overflow(ext, e->v_offset, &ext))
		return -ERANGE;
	if (__builtin_mul_overflow(ext, (uint64_t)e->elem_bytes, &bytes) || bytes > INT64_MAX)
		return -ERANGE;
	*ret = ext;
	return 0;
}

int kref_adapt_plan(const struct shm_layout *l, size_t n_pages, uint32_t last_page_tokens,
		    const struct kern_engine *e, const struct kern_adapt_range *r,
		    struct kern_adapt_range *ret_range)
{
	struct kern_adapt_range a;
	uint64_t ext;
	int ret;

	if (!l || !e || !ret_range || shm_layout_check(l) < 0)
		return -EINVAL;
	if (shm_dtype_quantized(l->dtype))
		return -EOPNOTSUPP;
	if (!e->n_layers || !e->num_blocks || !e->block_size || !e->n_heads || !e->head_dim ||
	    e->elem_bytes != shm_dtype_bits(l->dtype) / 8 || e->head_dim != l->head_dim ||
	    e->block_size != l->block_tokens)
		return -EINVAL;
	if (n_pages && (!last_page_tokens || last_page_tokens > l->block_tokens))
		return -EINVAL;
	ret = engine_extent(e, &ext);
	if (ret < 0)
		return ret;
	if (r) {
		a = *r;
		if (!a.n_layers || !a.n_heads)
			return -EINVAL;
		if (a.layer_first >= l->n_layers || a.n_layers > l->n_layers - a.layer_first ||
		    a.head_first >= l->n_kv_heads || a.n_heads > l->n_kv_heads - a.head_first ||
		    a.engine_layer_first >= e->n_layers ||
		    a.n_layers > e->n_layers - a.engine_layer_first ||
		    a.engine_head_first >= e->n_heads ||
		    a.n_heads > e->n_heads - a.engine_head_first)
			return -ERANGE;
	} else {
		if (e->n_layers != l->n_layers || e->n_heads != l->n_kv_heads)
			return -EINVAL;
		memset(&a, 0, sizeof(a));
		a.n_layers = l->n_layers;
		a.n_heads = l->n_kv_heads;
	}
	*ret_range = a;
	return 0;
}

int kref_adapt(const struct shm_layout *l, void *const *pages, size_t n_pages,
	       uint32_t last_page_tokens, const struct kern_engine *e, const int32_t *block_ids,
	       const struct kern_adapt_range *r, uint32_t dir)
{
	struct kern_adapt_range a;
	uint64_t ext, ext_bytes, row_bytes, es;
	uint32_t planes;
	int ret;

	ret = kref_adapt_plan(l, n_pages, last_page_tokens, e, r, &a);
	if (ret < 0)
		return ret;
	if (dir != KERN_ADAPT_TO_ENGINE && dir != KERN_ADAPT_TO_PAGES)
		return -EINVAL;
	if (!n_pages)
		return 0;
	if (!pages || !block_ids || !e->k_layers)
		return -EINVAL;
	for (size_t i = 0; i < n_pages; i++) {
		if (!pages[i])
			return -EINVAL;
		if (block_ids[i] < 0 || (uint32_t)block_ids[i] >= e->num_blocks)
			return -ERANGE;
	}
	planes = shm_layout_planes(l);
	engine_extent(e, &ext); /* checked by the plan */
	es = e->elem_bytes;
	ext_bytes = ext * es;
	for (uint32_t i = 0; i < a.n_layers; i++) {
		uint32_t el = a.engine_layer_first + i;
		uintptr_t k = (uintptr_t)e->k_layers[el];

		if (!k || (planes == 2 && e->v_layers && !e->v_layers[el]))
			return -EINVAL;
		if (k > UINTPTR_MAX - ext_bytes ||
		    (planes == 2 && e->v_layers &&
		     (uintptr_t)e->v_layers[el] > UINTPTR_MAX - ext_bytes))
			return -ERANGE;
	}

	row_bytes = shm_row_bytes(l);
	for (size_t i = 0; i < n_pages; i++) {
		uint32_t n_tok = i + 1 == n_pages ? last_page_tokens : l->block_tokens;
		uint64_t boff = (uint64_t)block_ids[i] * e->block_stride;

		for (uint32_t li = 0; li < a.n_layers; li++) {
			uint32_t el = a.engine_layer_first + li;

			for (uint32_t kv = 0; kv < planes; kv++) {
				uint8_t *eb = kv ? (e->v_layers ? (uint8_t *)e->v_layers[el]
								: (uint8_t *)e->k_layers[el] +
									  e->v_offset * es)
						 : (uint8_t *)e->k_layers[el];

				for (uint32_t hi = 0; hi < a.n_heads; hi++) {
					uint8_t *pr = (uint8_t *)pages[i] +
						      shm_kv_offset(l, a.layer_first + li, kv,
								    a.head_first + hi, 0);
					uint8_t *er =
						eb + (boff + (uint64_t)(a.engine_head_first + hi) *
								     e->head_stride) *
							     es;

					/* HND keeps a head's tokens contiguous, as pages do */
					if (e->token_stride == e->head_dim) {
						if (dir == KERN_ADAPT_TO_ENGINE)
							memcpy(er, pr, n_tok * row_bytes);
						else
							memcpy(pr, er, n_tok * row_bytes);
						continue;
					}
					for (uint32_t t = 0; t < n_tok; t++) {
						uint8_t *et = er + t * e->token_stride * es;

						if (dir == KERN_ADAPT_TO_ENGINE)
							memcpy(et, pr + t * row_bytes, row_bytes);
						else
							memcpy(pr + t * row_bytes, et, row_bytes);
					}
				}
			}
		}
	}
	return 0;
}
