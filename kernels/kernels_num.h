/* kernels/kernels_num.h — scalar numerics shared, source for source, by the
 * C reference (kernels/ref/) and the CUDA kernels (kernels/cuda/).
 *
 * Conversions between f32 and the storage types (f16, bf16, fp8-e4m3) are
 * written here once, round to nearest even, so the CPU and the GPU produce
 * the same bits; the per-group quantization step (scale from the group's
 * largest magnitude, code from value / scale) is here too, for the same
 * reason. The float operations are IEEE-exact on both sides: divisions
 * (nvcc divides correctly unless -use_fast_math), multiplications by
 * powers of two, and the rounding additions of kn_rne_small, which the
 * device spells with __fadd_rn/__fsub_rn so nothing can be contracted into
 * an FMA. Quantized pages are bit-identical whichever side wrote them. The
 * code selects with masks instead of branching, so GCC vectorizes the row
 * loops of the reference (-O3, baseline SSE2; no -ffast-math).
 *
 * Quantization (see kernels.h for the bounds): symmetric, one f16 scale per
 * group of quant_group consecutive elements of one token's row (the page
 * layout's scales[layer][k|v][kv_head][token][head_dim/group]), no zero
 * point: scale = amax / QMAX rounded up to f16, with QMAX 127 (int8), 7
 * (int4, codes -7..7, two's complement nibbles) and 448 (fp8-e4m3, the
 * largest finite value). NaN inputs quantize to code 0 and do not count
 * towards amax; infinities saturate. Nothing here has undefined behaviour
 * on any input bits, which matters because page contents are written by
 * clients.
 *
 * Header only, no state, thread-safe.
 */
#ifndef KVP_KERNELS_NUM_H
#define KVP_KERNELS_NUM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KN_FN static __host__ __device__ __forceinline__
#else
#define KN_FN static inline
#endif

/* Largest finite f16 (65504) as bits, and the f16 scale used for groups
 * whose amax is too small for any normal f16 scale: 2^-24. */
#define KN_F16_MAX_BITS 0x7bffu
#define KN_F16_MIN_BITS 0x0001u

KN_FN uint32_t kn_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(f);
#else
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
#endif
}

KN_FN float kn_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
#endif
}

/* Rounds mant >> shift to nearest, ties to even (1 <= shift <= 31; mant
 * small enough that adding 2^shift cannot wrap, or a value the caller
 * discards): adding half - 1, plus 1 when the kept part is odd, carries
 * exactly when the dropped part is above half, or half with an odd kept
 * part. No branches, so row loops vectorize. */
KN_FN uint32_t kn_shift_rne(uint32_t mant, uint32_t shift)
{
	return (mant + ((1u << (shift - 1)) - 1) + ((mant >> shift) & 1)) >> shift;
}

/* y rounded to the nearest integer, ties to even, for |y| < 2^22: adding
 * and subtracting 1.5 * 2^23 leaves no fraction bits (IEEE round to
 * nearest even; nothing here may be reassociated, and the device spells
 * the additions out). Branch-free, so row loops vectorize. */
KN_FN float kn_rne_small(float y)
{
#ifdef __CUDA_ARCH__
	return __fsub_rn(__fadd_rn(y, 12582912.0f), 12582912.0f);
#else
	return (y + 12582912.0f) - 12582912.0f;
#endif
}

/* ---- f16 ---------------------------------------------------------------- */

/* Selects between up to four candidates with all-ones/all-zero masks. */
KN_FN uint32_t kn_mask(int cond)
{
	return 0u - (uint32_t)(cond != 0);
}

/* f32 → IEEE binary16, round to nearest even; overflow gives ±inf, NaN stays
 * a (quiet) NaN. Every path is computed and the right one selected with
 * masks (no branches: row loops vectorize). */
KN_FN uint16_t kn_f32_to_f16(float f)
{
	uint32_t x = kn_f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t a = x & 0x7fffffffu;
	/* |x| clamped to 2^-14 (integer compare: NaN takes another path) */
	float small = kn_bits_f32(a < 0x38800000u ? a : 0x38800000u);
	/* >= 2^-14: rebias the exponent, round 13 mantissa bits away */
	uint32_t normal = kn_shift_rne(a - (112u << 23), 13);
	/* < 2^-14: the subnormal count |x| / 2^-24 (exact scaling), rounded */
	uint32_t sub = (uint32_t)(int32_t)kn_rne_small(small * 0x1p24f);
	uint32_t special = 0x7c00u | (kn_mask(a > 0x7f800000u) & (0x200u | ((a >> 13) & 0x3ffu)));
	uint32_t m_special = kn_mask(a >= 0x7f800000u);
	uint32_t m_over = kn_mask(a >= 0x477ff000u) & ~m_special; /* >= 65520: inf */
	uint32_t m_normal = kn_mask(a >= 0x38800000u) & ~(m_over | m_special);
	uint32_t m_sub = ~(m_normal | m_over | m_special);

	return (uint16_t)(sign | (special & m_special) | (0x7c00u & m_over) | (normal & m_normal) |
			  (sub & m_sub));
}

/* f16 → f32, exact. Written with masks rather than branches so that loops
 * over rows vectorize. */
KN_FN float kn_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t em = h & 0x7fffu;
	uint32_t normal = (em << 13) + (112u << 23);			/* rebias the exponent */
	uint32_t special = normal + (112u << 23);			/* exponent 31: inf, NaN */
	uint32_t sub = kn_f32_bits((float)em * 5.9604644775390625e-8f); /* m * 2^-24 */
	uint32_t is_sub = 0u - (uint32_t)(em < 0x0400u);		/* masks, not branches */
	uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);

	return kn_bits_f32(sign | (normal & ~(is_sub | is_special)) | (sub & is_sub) |
			   (special & is_special));
}

/* ---- bf16 --------------------------------------------------------------- */

KN_FN uint16_t kn_f32_to_bf16(float f)
{
	uint32_t x = kn_f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

KN_FN float kn_bf16_to_f32(uint16_t h)
{
	return kn_bits_f32((uint32_t)h << 16);
}

/* ---- fp8 e4m3 (OCP "fn": no infinities, S.1111.111 is NaN, max 448) ---- */

/* f32 → e4m3, round to nearest even, saturating to ±448 (infinities too);
 * NaN → 0x7f with the sign. Branch-free like kn_f32_to_f16. */
KN_FN uint8_t kn_f32_to_e4m3(float f)
{
	uint32_t x = kn_f32_bits(f);
	uint32_t sign = (x >> 24) & 0x80u;
	uint32_t a = x & 0x7fffffffu;
	float small = kn_bits_f32(a < 0x3c800000u ? a : 0x3c800000u); /* min(|x|, 2^-6) */
	/* [2^-6, 448): rebias, round 20 mantissa bits away (never past 0x7e) */
	uint32_t normal = kn_shift_rne(a - (120u << 23), 20);
	/* < 2^-6: the subnormal count |x| / 2^-9 (0..8; 8 is the smallest normal) */
	uint32_t sub = (uint32_t)(int32_t)kn_rne_small(small * 512.0f);
	uint32_t m_nan = kn_mask(a > 0x7f800000u);
	uint32_t m_sat = kn_mask(a >= 0x43e00000u) & ~m_nan; /* >= 448 */
	uint32_t m_normal = kn_mask(a >= 0x3c800000u) & ~(m_sat | m_nan);
	uint32_t m_sub = ~(m_normal | m_sat | m_nan);

	return (uint8_t)(sign | (0x7fu & m_nan) | (0x7eu & m_sat) | (normal & m_normal) |
			 (sub & m_sub));
}

KN_FN float kn_e4m3_to_f32(uint8_t v)
{
	uint32_t sign = (uint32_t)(v & 0x80u) << 24;
	uint32_t em = v & 0x7fu;
	uint32_t normal = (em << 20) + (120u << 23);	      /* rebias */
	uint32_t sub = kn_f32_bits((float)em * 0.001953125f); /* m * 2^-9 */
	uint32_t is_sub = 0u - (uint32_t)(em < 8u);
	uint32_t is_nan = 0u - (uint32_t)(em == 0x7fu);

	return kn_bits_f32(sign | (normal & ~(is_sub | is_nan)) | (sub & is_sub) |
			   (0x7fc00000u & is_nan));
}

/* ---- int4 nibbles ------------------------------------------------------- */

/* Element i of a packed int4 row: the low nibble holds the even index. */
KN_FN int kn_int4_get(const uint8_t *row, uint32_t i)
{
	uint32_t b = row[i >> 1];
	uint32_t n = (i & 1) ? b >> 4 : b & 0xfu;

	return (int)n - (int)((n & 8u) << 1); /* sign-extend 4 bits */
}

/* ---- per-group quantization --------------------------------------------- */

/* The largest code magnitude of a quantized dtype (shm_dtype values 4..6). */
KN_FN float kn_qmax(uint32_t dtype)
{
	return dtype == 4 ? 127.0f : dtype == 6 ? 7.0f : 448.0f;
}

/* The bits of |x|, or 0 for NaN: for everything else the unsigned order of
 * these bits is the order of the magnitudes, so an integer max over them
 * is amax (it vectorizes where a float max with NaN rules does not). */
KN_FN uint32_t kn_abs_bits(float x)
{
	uint32_t a = kn_f32_bits(x) & 0x7fffffffu;

	return a & kn_mask(a <= 0x7f800000u);
}

/* Folds |x| into a running amax; NaN never wins (the comparison is false). */
KN_FN float kn_amax(float amax, float x)
{
	float a = kn_bits_f32(kn_f32_bits(x) & 0x7fffffffu);

	return a > amax ? a : amax;
}

/* The f16 scale of a group whose largest magnitude is amax (>= 0, may be
 * inf): amax / qmax rounded *up* to f16, so no code ever saturates and the
 * error bound s/2 holds even where the scale is subnormal; at most 65504,
 * and at least 2^-24 when amax > 0, so a non-zero group never gets a zero
 * scale. 0 for amax 0. */
KN_FN uint16_t kn_scale_f16(float amax, float qmax)
{
	float s = amax / qmax;
	uint16_t h;

	if (!(s < 65504.0f))
		return KN_F16_MAX_BITS;
	h = kn_f32_to_f16(s);
	if (kn_f16_to_f32(h) < s) /* positive and below 65504: the next f16 up */
		h++;
	return (h == 0 && amax > 0.0f) ? (uint16_t)KN_F16_MIN_BITS : h;
}

/* x / s rounded to the integer code of int8 (qmax 127) or int4 (qmax 7),
 * ties to even, saturating; NaN and a zero scale give 0. s is a decoded
 * f16 scale. Branch-free. */
KN_FN int kn_quant_int(float x, float s, float qmax)
{
	float y = x / s;

	y = ((y == y) & (s > 0.0f)) ? y : 0.0f;
	y = y > qmax ? qmax : y;
	y = y < -qmax ? -qmax : y;
	return (int)kn_rne_small(y);
}

/* x / s as e4m3 (saturating to ±448); NaN and a zero scale give 0. */
KN_FN uint8_t kn_quant_e4m3(float x, float s)
{
	float y = x / s;

	/* masks rather than a select: the loop stays free of branches */
	return kn_f32_to_e4m3(kn_bits_f32(kn_f32_bits(y) & kn_mask((y == y) & (s > 0.0f))));
}

/* ---- element access and page geometry ----------------------------------- */

/* Element i of a row of format (dtype, group) widened to f32, with its
 * group's scale: the same operations as the reference's row loops. */
KN_FN float kn_load(uint32_t dtype, uint32_t group, const uint8_t *row, const uint16_t *scales,
		    uint32_t i)
{
	switch (dtype) {
	case 1:
		return kn_f16_to_f32(((const uint16_t *)(const void *)row)[i]);
	case 2:
		return kn_bf16_to_f32(((const uint16_t *)(const void *)row)[i]);
	case 3:
		return ((const float *)(const void *)row)[i];
	case 4:
		return (float)(int8_t)row[i] * kn_f16_to_f32(scales[i / group]);
	case 5:
		return kn_e4m3_to_f32(row[i]) * kn_f16_to_f32(scales[i / group]);
	default:
		return (float)kn_int4_get(row, i) * kn_f16_to_f32(scales[i / group]);
	}
}

/* A checked layout's page geometry, in the form the kernels address pages
 * with (tests check kn_row_offset and kn_scale_offset against
 * shm_kv_offset and shm_scale_offset of shm/layout.h for every dtype). */
struct kn_geom {
	uint32_t n_layers, n_kv_heads, head_dim, block_tokens, dtype, group;
	uint32_t n_groups;   /* head_dim / group, 0 when unquantized */
	uint32_t row_bytes;  /* bytes of one token's head_dim elements */
	uint64_t data_bytes; /* where the scales start */
};

/* Fills g from the fields of a layout that shm_layout_check and
 * shm_layout_numeric accepted (n_layers, n_kv_heads, head_dim,
 * block_tokens, dtype, quant_group): the KV format, no raw fp8. */
KN_FN void kn_geom_init(struct kn_geom *g, uint32_t n_layers, uint32_t n_kv_heads,
			uint32_t head_dim, uint32_t block_tokens, uint32_t dtype,
			uint32_t quant_group)
{
	uint32_t bits = dtype == 3 ? 32 : dtype <= 2 ? 16 : dtype == 6 ? 4 : 8;

	g->n_layers = n_layers;
	g->n_kv_heads = n_kv_heads;
	g->head_dim = head_dim;
	g->block_tokens = block_tokens;
	g->dtype = dtype;
	g->group = quant_group;
	g->n_groups = dtype >= 4 && dtype <= 6 && quant_group ? head_dim / quant_group : 0;
	g->row_bytes = head_dim * bits / 8;
	g->data_bytes = (uint64_t)n_layers * 2 * n_kv_heads * block_tokens * g->row_bytes;
}

KN_FN uint64_t kn_row_index(const struct kn_geom *g, uint32_t layer, uint32_t kv, uint32_t head,
			    uint32_t slot)
{
	return (((uint64_t)layer * 2 + kv) * g->n_kv_heads + head) * g->block_tokens + slot;
}

KN_FN uint64_t kn_row_offset(const struct kn_geom *g, uint64_t row_index)
{
	return row_index * g->row_bytes;
}

KN_FN uint64_t kn_scale_offset(const struct kn_geom *g, uint64_t row_index)
{
	return g->data_bytes + row_index * g->n_groups * 2;
}

#endif
