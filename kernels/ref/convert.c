/* kernels/ref/convert.c — the C reference of conversion, quantization and
 * dequantization of K/V rows and pages (see kernels.h for the contract and
 * the error bounds, kernels_num.h for the scalar steps shared with CUDA).
 *
 * Every conversion goes through f32: a row is widened (dequantized with
 * its group scales), then rounded or quantized into the destination format
 * with fresh scales. Rows are at most SHM_MAX_HEAD_DIM elements, so one row
 * of f32 lives on the stack. No allocation, no state, thread-safe.
 */
#include <errno.h>
#include <string.h>

#include "kernels_num.h"
#include "ref.h"

int ref_fmt_check(struct kern_fmt f, uint32_t head_dim)
{
	if (!head_dim || head_dim > SHM_MAX_HEAD_DIM || !shm_dtype_bits(f.dtype))
		return -EINVAL;
	if (shm_dtype_quantized(f.dtype)) {
		if (!f.group || head_dim % f.group)
			return -EINVAL;
	} else if (f.group) {
		return -EINVAL;
	}
	if (f.dtype == SHM_DTYPE_INT4 && head_dim % 2)
		return -EINVAL;
	return 0;
}

void ref_row_load(struct kern_fmt f, const void *row, const uint16_t *scales, uint32_t head_dim,
		  float *out)
{
	const uint16_t *h = (const uint16_t *)row;
	const uint8_t *b = (const uint8_t *)row;
	uint32_t i, g, end;
	float s;

	switch (f.dtype) {
	case SHM_DTYPE_F16:
		for (i = 0; i < head_dim; i++)
			out[i] = kn_f16_to_f32(h[i]);
		return;
	case SHM_DTYPE_BF16:
		for (i = 0; i < head_dim; i++)
			out[i] = kn_bf16_to_f32(h[i]);
		return;
	case SHM_DTYPE_F32:
		memcpy(out, row, (size_t)head_dim * sizeof(float));
		return;
	default:
		break;
	}
	if (f.dtype == SHM_DTYPE_INT4) /* the codes as floats, two per byte */
		for (i = 0; i < head_dim / 2; i++) {
			out[2 * i] = (float)((int)(b[i] & 0xfu) - (int)((b[i] & 0x8u) << 1));
			out[2 * i + 1] = (float)((int)(b[i] >> 4) - (int)((b[i] & 0x80u) >> 3));
		}
	for (g = 0, i = 0; i < head_dim; g++) {
		s = kn_f16_to_f32(scales[g]);
		end = i + f.group;
		switch (f.dtype) {
		case SHM_DTYPE_INT8:
			for (; i < end; i++)
				out[i] = (float)(int8_t)b[i] * s;
			break;
		case SHM_DTYPE_FP8_E4M3:
			for (; i < end; i++)
				out[i] = kn_e4m3_to_f32(b[i]) * s;
			break;
		default: /* SHM_DTYPE_INT4: codes unpacked below, times s here */
			for (; i < end; i++)
				out[i] *= s;
			break;
		}
	}
}

void ref_row_store(struct kern_fmt f, void *row, uint16_t *scales, uint32_t head_dim,
		   const float *in)
{
	uint16_t *h = (uint16_t *)row;
	uint8_t *b = (uint8_t *)row;
	int8_t codes[SHM_MAX_HEAD_DIM];
	float qmax, s;
	uint32_t i, g, end;
	uint16_t hs;

	switch (f.dtype) {
	case SHM_DTYPE_F16:
		for (i = 0; i < head_dim; i++)
			h[i] = kn_f32_to_f16(in[i]);
		return;
	case SHM_DTYPE_BF16:
		for (i = 0; i < head_dim; i++)
			h[i] = kn_f32_to_bf16(in[i]);
		return;
	case SHM_DTYPE_F32:
		memcpy(row, in, (size_t)head_dim * sizeof(float));
		return;
	default:
		break;
	}
	qmax = kn_qmax(f.dtype);
	for (g = 0, i = 0; i < head_dim; g++) {
		uint32_t amax_bits = 0;

		end = i + f.group;
		for (uint32_t j = i; j < end; j++) {
			uint32_t a = kn_abs_bits(in[j]);

			amax_bits = a > amax_bits ? a : amax_bits;
		}
		hs = kn_scale_f16(kn_bits_f32(amax_bits), qmax);
		scales[g] = hs;
		s = kn_f16_to_f32(hs);
		switch (f.dtype) {
		case SHM_DTYPE_INT8:
			for (; i < end; i++)
				b[i] = (uint8_t)(int8_t)kn_quant_int(in[i], s, qmax);
			break;
		case SHM_DTYPE_FP8_E4M3:
			for (; i < end; i++)
				b[i] = kn_quant_e4m3(in[i], s);
			break;
		default: /* SHM_DTYPE_INT4: codes first, packed below */
			for (; i < end; i++)
				codes[i] = (int8_t)kn_quant_int(in[i], s, qmax);
			break;
		}
	}
	if (f.dtype == SHM_DTYPE_INT4) /* two per byte, the even index low */
		for (i = 0; i < head_dim / 2; i++)
			b[i] = (uint8_t)(((unsigned)codes[2 * i] & 0xfu) |
					 ((unsigned)codes[2 * i + 1] & 0xfu) << 4);
}

int kref_convert_rows(struct kern_fmt dst_fmt, void *dst, uint16_t *dst_scales,
		      struct kern_fmt src_fmt, const void *src, const uint16_t *src_scales,
		      uint64_t n_rows, uint32_t head_dim)
{
	float row[SHM_MAX_HEAD_DIM];
	uint64_t dst_row_bytes, src_row_bytes;
	uint32_t dst_groups = 0, src_groups = 0;

	if (ref_fmt_check(dst_fmt, head_dim) < 0 || ref_fmt_check(src_fmt, head_dim) < 0)
		return -EINVAL;
	if (dst_fmt.group) {
		if (!dst_scales)
			return -EINVAL;
		dst_groups = head_dim / dst_fmt.group;
	}
	if (src_fmt.group) {
		if (!src_scales)
			return -EINVAL;
		src_groups = head_dim / src_fmt.group;
	}
	dst_row_bytes = (uint64_t)head_dim * shm_dtype_bits(dst_fmt.dtype) / 8;
	src_row_bytes = (uint64_t)head_dim * shm_dtype_bits(src_fmt.dtype) / 8;
	for (uint64_t r = 0; r < n_rows; r++) {
		ref_row_load(src_fmt, (const uint8_t *)src + r * src_row_bytes,
			     src_groups ? src_scales + r * src_groups : NULL, head_dim, row);
		ref_row_store(dst_fmt, (uint8_t *)dst + r * dst_row_bytes,
			      dst_groups ? dst_scales + r * dst_groups : NULL, head_dim, row);
	}
	return 0;
}

int kref_convert_pages(const struct shm_layout *dl, void *const *dst_pages,
		       const struct shm_layout *sl, const void *const *src_pages, uint32_t n_pages,
		       uint32_t tok0, uint32_t n_tok)
{
	struct kn_geom dg, sg;
	uint64_t n_blocks;
	int ret;

	if (shm_layout_check(dl) < 0 || shm_layout_check(sl) < 0 || !shm_layout_numeric(dl) ||
	    !shm_layout_numeric(sl) || dl->n_layers != sl->n_layers ||
	    dl->n_kv_heads != sl->n_kv_heads || dl->head_dim != sl->head_dim ||
	    dl->block_tokens != sl->block_tokens || tok0 > dl->block_tokens ||
	    n_tok > dl->block_tokens - tok0)
		return -EINVAL;
	/* rows of one (layer, kv, head) are contiguous over tokens, in data
	 * and in scales alike: convert n_tok of them per block */
	n_blocks = (uint64_t)dl->n_layers * 2 * dl->n_kv_heads;
	dg = ref_geom(dl);
	sg = ref_geom(sl);
	for (uint32_t i = 0; i < n_pages; i++) {
		for (uint64_t blk = 0; blk < n_blocks; blk++) {
			uint32_t layer = (uint32_t)(blk / (2ull * dl->n_kv_heads));
			uint32_t kv = (uint32_t)(blk / dl->n_kv_heads % 2);
			uint32_t head = (uint32_t)(blk % dl->n_kv_heads);
			const uint16_t *ss;
			uint16_t *ds;
			const void *s = ref_row(&sg, src_pages[i], layer, kv, head, tok0, &ss);
			void *d = ref_row_mut(&dg, dst_pages[i], layer, kv, head, tok0, &ds);

			ret = kref_convert_rows(ref_layout_fmt(dl), d, ds, ref_layout_fmt(sl), s,
						ss, n_tok, dl->head_dim);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}
