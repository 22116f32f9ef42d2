/* kernels/ref/ref.h — helpers shared by the C reference kernels (private to
 * kernels/ref/): argument checks, one row to and from f32, page addressing
 * and the dot product every reference routine uses. Thread-safe, no state.
 */
#ifndef KVP_KERNELS_REF_H
#define KVP_KERNELS_REF_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "kernels_num.h"

/* 0 when rows of head_dim elements can be stored in format f, else
 * -EINVAL (see kref_convert_rows). */
int ref_fmt_check(struct kern_fmt f, uint32_t head_dim);

/* The format of a checked layout's rows. */
static inline struct kern_fmt ref_layout_fmt(const struct shm_layout *l)
{
	struct kern_fmt f = {l->dtype, l->quant_group};

	return f;
}

/* Widens one row (with its group scales when f is quantized) to f32. */
void ref_row_load(struct kern_fmt f, const void *row, const uint16_t *scales, uint32_t head_dim,
		  float *out /* [head_dim] */);

/* Rounds or quantizes one f32 row into format f, writing its scales. */
void ref_row_store(struct kern_fmt f, void *row, uint16_t *scales, uint32_t head_dim,
		   const float *in /* [head_dim] */);

/* The geometry of a checked layout (kernels_num.h). */
static inline struct kn_geom ref_geom(const struct shm_layout *l)
{
	struct kn_geom g;

	kn_geom_init(&g, l->n_layers, l->n_kv_heads, l->head_dim, l->block_tokens, l->dtype,
		     l->quant_group);
	return g;
}

/* Row and scales of (layer, kv, head, slot) inside one page; the scales
 * pointer is NULL for unquantized layouts. */
static inline const void *ref_row(const struct kn_geom *g, const void *page, uint32_t layer,
				  uint32_t kv, uint32_t head, uint32_t slot,
				  const uint16_t **ret_scales)
{
	const uint8_t *p = (const uint8_t *)page;
	uint64_t r = kn_row_index(g, layer, kv, head, slot);

	*ret_scales =
		g->n_groups ? (const uint16_t *)(const void *)(p + kn_scale_offset(g, r)) : NULL;
	return p + kn_row_offset(g, r);
}

static inline void *ref_row_mut(const struct kn_geom *g, void *page, uint32_t layer, uint32_t kv,
				uint32_t head, uint32_t slot, uint16_t **ret_scales)
{
	uint8_t *p = (uint8_t *)page;
	uint64_t r = kn_row_index(g, layer, kv, head, slot);

	*ret_scales = g->n_groups ? (uint16_t *)(void *)(p + kn_scale_offset(g, r)) : NULL;
	return p + kn_row_offset(g, r);
}

/* Σ a_i b_i in f32 with eight interleaved partial sums s[j] (element i
 * goes to s[i % 8]) folded as ((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7)): a fixed
 * order, so the result is reproducible. The main loop keeps s[0..3] and
 * s[4..7] in two 4-lane vectors (GCC/clang vector extensions: lane-wise
 * IEEE operations, the same bits as the scalar loop). */
typedef float ref_v4 __attribute__((vector_size(16)));

static inline float ref_dot(const float *a, const float *b, uint32_t n)
{
	ref_v4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0}, va, vb;
	float s[8];
	uint32_t i = 0, j;

	for (; i + 8 <= n; i += 8) {
		memcpy(&va, a + i, sizeof(va));
		memcpy(&vb, b + i, sizeof(vb));
		lo += va * vb;
		memcpy(&va, a + i + 4, sizeof(va));
		memcpy(&vb, b + i + 4, sizeof(vb));
		hi += va * vb;
	}
	memcpy(s, &lo, sizeof(lo));
	memcpy(s + 4, &hi, sizeof(hi));
	for (j = 0; i < n; i++, j++)
		s[j] += a[i] * b[i];
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

#endif
