/* kernels/ref/attn.c — the C reference of paged-attention decode (see
 * kernels.h): one new token's queries against the K/V of positions
 * [0, n_tokens) of one layer, read through a page table.
 *
 * For each KV head the loop walks the tokens in blocks that stay inside one
 * page (rows of consecutive slots are contiguous there, scales too, so a
 * block widens to f32 in one pass), scores the block for every query head
 * of the GQA group, and folds it into an online softmax: running max m,
 * running sum l, accumulator rescaled by exp(m_old - m_new) once per block.
 * Each K/V row is read once per group and no heap memory is needed (about
 * 40 KiB of stack). The raw scores go to weights, when asked for, and are
 * normalized at the end with the final m and l. Accumulation in f32 in a
 * fixed order, so results are reproducible (tinylm relies on that for
 * bit-identical logits). Thread-safe.
 */
#include <errno.h>
#include <math.h>

#include "ref.h"

#define BLOCK_ELEMS  2048u /* f32 elements of K (and of V) per block */
#define BLOCK_TOKENS 64u
#define GROUP_HEADS  32u /* query heads handled together */

int kref_attn_decode(const struct shm_layout *l, uint32_t layer, const void *const *pages,
		     uint64_t n_tokens, const float *q, uint32_t n_q_heads, float scale, float *out,
		     float *weights)
{
	float kbuf[BLOCK_ELEMS], vbuf[BLOCK_ELEMS];
	float s[GROUP_HEADS][BLOCK_TOKENS], m[GROUP_HEADS], sum[GROUP_HEADS];
	struct kern_fmt f;
	struct kn_geom g;
	uint32_t hd, group, max_block;

	if (shm_layout_check(l) < 0 || !shm_layout_numeric(l) || layer >= l->n_layers ||
	    !n_tokens || !n_q_heads || n_q_heads % l->n_kv_heads)
		return -EINVAL;
	f = ref_layout_fmt(l);
	g = ref_geom(l);
	hd = l->head_dim;
	group = n_q_heads / l->n_kv_heads;
	max_block = BLOCK_ELEMS / hd < BLOCK_TOKENS ? BLOCK_ELEMS / hd : BLOCK_TOKENS;
	if (!max_block)
		max_block = 1; /* head_dim 1024 > BLOCK_ELEMS / 2: one row at a time */
	for (uint32_t h0 = 0; h0 < n_q_heads; h0 += (group < GROUP_HEADS ? group : GROUP_HEADS)) {
		uint32_t kh = h0 / group;
		uint32_t nh =
			(kh + 1) * group - h0 < GROUP_HEADS ? (kh + 1) * group - h0 : GROUP_HEADS;

		for (uint32_t j = 0; j < nh; j++) {
			m[j] = -INFINITY;
			sum[j] = 0.0f;
			for (uint32_t i = 0; i < hd; i++)
				out[(uint64_t)(h0 + j) * hd + i] = 0.0f;
		}
		for (uint64_t t0 = 0; t0 < n_tokens;) {
			const void *page = pages[t0 / l->block_tokens];
			uint32_t slot = (uint32_t)(t0 % l->block_tokens);
			uint64_t left = n_tokens - t0;
			uint32_t n = l->block_tokens - slot < max_block ? l->block_tokens - slot
									: max_block;
			const uint16_t *ks, *vs;
			const void *k, *v;

			if (n > left)
				n = (uint32_t)left;
			if (hd > BLOCK_ELEMS)
				n = 1;
			k = ref_row(&g, page, layer, 0, kh, slot, &ks);
			v = ref_row(&g, page, layer, 1, kh, slot, &vs);
			/* n consecutive rows and their scales are contiguous */
			ref_row_load(f, k, ks, n * hd, kbuf);
			ref_row_load(f, v, vs, n * hd, vbuf);
			for (uint32_t j = 0; j < nh; j++) {
				uint32_t h = h0 + j;
				const float *qh = q + (uint64_t)h * hd;
				float *acc = out + (uint64_t)h * hd;
				float mb = m[j], c;

				for (uint32_t i = 0; i < n; i++) {
					s[j][i] = ref_dot(qh, kbuf + (size_t)i * hd, hd) * scale;
					if (weights)
						weights[(uint64_t)h * n_tokens + t0 + i] = s[j][i];
					mb = s[j][i] > mb ? s[j][i] : mb;
				}
				if (mb > m[j]) {
					c = expf(m[j] - mb); /* 0 the first time */
					sum[j] *= c;
					for (uint32_t i = 0; i < hd; i++)
						acc[i] *= c;
					m[j] = mb;
				}
				for (uint32_t i = 0; i < n; i++) {
					float p = expf(s[j][i] - m[j]);
					const float *vi = vbuf + (size_t)i * hd;

					sum[j] += p;
					for (uint32_t e = 0; e < hd; e++)
						acc[e] += p * vi[e];
				}
			}
			t0 += n;
		}
		for (uint32_t j = 0; j < nh; j++) {
			uint32_t h = h0 + j;
			float inv = 1.0f / sum[j];

			for (uint32_t i = 0; i < hd; i++)
				out[(uint64_t)h * hd + i] *= inv;
			if (weights)
				for (uint64_t t = 0; t < n_tokens; t++) {
					float *w = weights + (uint64_t)h * n_tokens + t;

					*w = expf(*w - m[j]) * inv;
				}
		}
	}
	return 0;
}
