/* kernels/ref/gather.c — the C reference of gathers over page tables (see
 * kernels.h): compaction of kept tokens into fresh pages (bytes unchanged,
 * scales included) and the rows of one head as a dense f32 matrix.
 * Positions are checked before anything is written. No allocation,
 * thread-safe.
 */
#include <errno.h>
#include <string.h>

#include "ref.h"

int kref_gather_tokens(const struct shm_layout *l, void *const *dst_pages, uint64_t dst_pos0,
		       const void *const *src_pages, uint64_t n_src_tokens, const uint32_t *src_pos,
		       uint64_t n)
{
	uint64_t row_bytes, scale_bytes;
	struct kn_geom g;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || dst_pos0 > UINT64_MAX - n)
		return -EINVAL;
	g = ref_geom(l);
	for (uint64_t i = 0; i < n; i++)
		if (src_pos[i] >= n_src_tokens)
			return -EINVAL;
	row_bytes = shm_row_bytes(l);
	scale_bytes = shm_dtype_quantized(l->dtype) ? l->head_dim / l->quant_group * 2 : 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t s = src_pos[i], d = dst_pos0 + i;
		const void *sp = src_pages[s / l->block_tokens];
		void *dp = dst_pages[d / l->block_tokens];
		uint32_t ss = (uint32_t)(s % l->block_tokens), ds = (uint32_t)(d % l->block_tokens);

		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++) {
					const uint16_t *sscale;
					uint16_t *dscale;
					const void *srow =
						ref_row(&g, sp, layer, kv, h, ss, &sscale);
					void *drow = ref_row_mut(&g, dp, layer, kv, h, ds, &dscale);

					memcpy(drow, srow, row_bytes);
					if (scale_bytes)
						memcpy(dscale, sscale, scale_bytes);
				}
	}
	return 0;
}

int kref_gather_rows_f32(const struct shm_layout *l, const void *const *pages, uint32_t layer,
			 uint32_t kv, uint32_t kv_head, uint64_t pos0, uint64_t n, float *dst)
{
	struct kern_fmt f;
	struct kn_geom g;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || layer >= l->n_layers || kv > 1 ||
	    kv_head >= l->n_kv_heads || pos0 > UINT64_MAX - n)
		return -EINVAL;
	f = ref_layout_fmt(l);
	g = ref_geom(l);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t t = pos0 + i;
		const uint16_t *sc;
		const void *row = ref_row(&g, pages[t / l->block_tokens], layer, kv, kv_head,
					  (uint32_t)(t % l->block_tokens), &sc);

		ref_row_load(f, row, sc, l->head_dim, dst + i * l->head_dim);
	}
	return 0;
}
