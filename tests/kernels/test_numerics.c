/* tests/kernels/test_numerics.c — the scalar numerics of kernels_num.h,
 * which the C reference and the CUDA kernels share.
 *
 * Conversions are checked against independent oracles: every f16, bf16 and
 * fp8-e4m3 value must survive decode → encode; random and boundary f32
 * values (every midpoint between neighbours, ties included) must encode to
 * the nearest representable value, ties to even, as found by brute force
 * over the neighbours in double, and as GCC's own _Float16 conversion where
 * the compiler has one. Also: the quantization step's scale and code
 * saturation, int4 nibbles, and the page addressing the CUDA kernels use
 * (kn_row_offset/kn_scale_offset) against shm/layout.h for every dtype.
 * Single-threaded.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kernels_num.h"
#include "ktest.h"

/* ---- f16 ---------------------------------------------------------------- */

static int f16_is_nan(uint16_t h)
{
	return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

/* The f16 nearest to x by brute force over the neighbours of a candidate,
 * ties to even; overflow to inf as IEEE: |x| >= 65520. */
static uint16_t f16_oracle(float x)
{
	double d = x, best_err = INFINITY;
	uint16_t best = 0, sign = signbit(x) ? 0x8000u : 0;
	double a = fabs(d);

	if (isnan(x))
		return 0x7e00u;
	if (a >= 65520.0)
		return sign | 0x7c00u;
	/* scan the f16 magnitudes around the value */
	for (uint32_t h = 0; h <= 0x7bffu; h++) {
		double v = kn_f16_to_f32((uint16_t)h), err = fabs(v - a);

		if (v > a * 2 + 1)
			break;
		if (err < best_err || (err == best_err && !(h & 1))) {
			best_err = err;
			best = (uint16_t)h;
		}
	}
	return sign | best;
}

static void test_f16_decode_encode_all(void **state)
{
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = kn_f16_to_f32((uint16_t)h);
		uint16_t back = kn_f32_to_f16(f);

		if (f16_is_nan((uint16_t)h)) {
			assert_true(isnan(f));
			assert_true(f16_is_nan(back));
			assert_int_equal(back & 0x8000u, h & 0x8000u);
		} else {
			assert_int_equal(back, h);
		}
	}
	/* known values */
	assert_true(kn_f16_to_f32(0x3c00) == 1.0f);
	assert_true(kn_f16_to_f32(0xc000) == -2.0f);
	assert_true(kn_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(kn_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(kn_f16_to_f32(0x0400) == 0x1p-14f);
	assert_true(isinf(kn_f16_to_f32(0x7c00)));
}

static void test_f16_rounding(void **state)
{
	uint64_t rng = 1;

	/* every midpoint between neighbouring f16 values (ties to even) and
	 * the floats just around it */
	for (uint32_t h = 0; h < 0x7bffu; h++) {
		float lo = kn_f16_to_f32((uint16_t)h), hi = kn_f16_to_f32((uint16_t)(h + 1));
		float mid = (float)(((double)lo + hi) / 2);
		uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;

		assert_int_equal(kn_f32_to_f16(mid), even);
		assert_int_equal(kn_f32_to_f16(-mid), even | 0x8000u);
		assert_int_equal(kn_f32_to_f16(nextafterf(mid, 0)), h);
		assert_int_equal(kn_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
	}
	/* overflow: 65519.99 → max, 65520 → inf; inf, NaN */
	assert_int_equal(kn_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
	assert_int_equal(kn_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(kn_f32_to_f16(-1e30f), 0xfc00);
	assert_int_equal(kn_f32_to_f16(INFINITY), 0x7c00);
	assert_true(f16_is_nan(kn_f32_to_f16(NAN)));
	/* underflow: 2^-25 is a tie → 0; just above → smallest subnormal */
	assert_int_equal(kn_f32_to_f16(0x1p-25f), 0);
	assert_int_equal(kn_f32_to_f16(nextafterf(0x1p-25f, 1)), 1);
	assert_int_equal(kn_f32_to_f16(-0x1p-30f), 0x8000);
	assert_int_equal(kn_f32_to_f16(0x1p-149f), 0);
	/* random bit patterns against the brute-force oracle (a sample: the
	 * oracle scans) and against the compiler's conversion (many) */
	for (int i = 0; i < 3000; i++) {
		uint32_t bits = (uint32_t)kt_next(&rng);
		float x;

		/* bias towards the f16 range */
		bits = (bits & 0x807fffffu) | ((100u + bits % 45u) << 23);
		memcpy(&x, &bits, sizeof(x));
		assert_int_equal(kn_f32_to_f16(x), f16_oracle(x));
	}
#ifdef __FLT16_MAX__
	for (int i = 0; i < 2000000; i++) {
		uint32_t bits = (uint32_t)kt_next(&rng);
		volatile float x;
		_Float16 h;
		uint16_t hb;

		memcpy((void *)&x, &bits, sizeof(bits));
		if (isnan(x))
			continue;
		h = (_Float16)x;
		memcpy(&hb, &h, sizeof(hb));
		if (kn_f32_to_f16(x) != hb)
			fail_msg("f32 bits 0x%08x: ours 0x%04x, compiler 0x%04x", bits,
				 kn_f32_to_f16(x), hb);
	}
#endif
}

/* ---- bf16 --------------------------------------------------------------- */

static void test_bf16(void **state)
{
	uint64_t rng = 2;

	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = kn_bf16_to_f32((uint16_t)h);
		uint16_t back = kn_f32_to_bf16(f);

		if (isnan(f))
			assert_true(isnan(kn_bf16_to_f32(back)));
		else
			assert_int_equal(back, h);
	}
	/* random floats: the result is one of the two neighbours, the nearer
	 * one, ties to even */
	for (int i = 0; i < 1000000; i++) {
		uint32_t bits = (uint32_t)kt_next(&rng), lo = bits >> 16, hi = lo + 1;
		float x, a, b;
		double da, db;
		uint16_t want;

		memcpy(&x, &bits, sizeof(x));
		if (isnan(x) || (lo & 0x7f80u) == 0x7f80u || (hi & 0x7f80u) == 0x7f80u)
			continue;
		a = kn_bf16_to_f32((uint16_t)lo);
		b = kn_bf16_to_f32((uint16_t)hi);
		da = fabs((double)x - a);
		db = fabs((double)x - b);
		want = (uint16_t)(da < db ? lo : db < da ? hi : (lo & 1) ? hi : lo);
		assert_int_equal(kn_f32_to_bf16(x), want);
	}
	assert_int_equal(kn_f32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(kn_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(kn_f32_to_bf16(3.4e38f), 0x7f80); /* rounds up to inf */
	assert_true(isnan(kn_bf16_to_f32(kn_f32_to_bf16(NAN))));
}

/* ---- fp8 e4m3 ----------------------------------------------------------- */

static void test_e4m3(void **state)
{
	uint64_t rng = 3;
	float table[127]; /* positive finite codes 0..0x7e */

	for (uint32_t v = 0; v < 256; v++) {
		float f = kn_e4m3_to_f32((uint8_t)v);

		if ((v & 0x7f) == 0x7f) {
			assert_true(isnan(f));
			assert_int_equal(kn_f32_to_e4m3(f), v);
			continue;
		}
		assert_int_equal(kn_f32_to_e4m3(f), v == 0x80 ? 0x80 : v);
		if (v < 127)
			table[v] = f;
	}
	assert_true(table[0x7e] == 448.0f);
	assert_true(table[0x08] == 0x1p-6f);
	assert_true(table[0x01] == 0x1p-9f);
	assert_true(table[0x38] == 1.0f);
	for (int v = 1; v < 127; v++) {
		float mid = (table[v - 1] + table[v]) / 2; /* exact in f32 */
		int even = (v & 1) ? v - 1 : v;

		assert_true(table[v] > table[v - 1]);
		assert_int_equal(kn_f32_to_e4m3(mid), even);
		assert_int_equal(kn_f32_to_e4m3(-mid), even | 0x80);
		assert_int_equal(kn_f32_to_e4m3(nextafterf(mid, 0)), v - 1);
		assert_int_equal(kn_f32_to_e4m3(nextafterf(mid, INFINITY)), v);
	}
	/* saturation: everything from 448 up (inf included) is 448 */
	assert_int_equal(kn_f32_to_e4m3(nextafterf(448.0f, INFINITY)), 0x7e);
	assert_int_equal(kn_f32_to_e4m3(464.0f), 0x7e);
	assert_int_equal(kn_f32_to_e4m3(1e30f), 0x7e);
	assert_int_equal(kn_f32_to_e4m3(INFINITY), 0x7e);
	assert_int_equal(kn_f32_to_e4m3(-INFINITY), 0xfe);
	assert_int_equal(kn_f32_to_e4m3(0x1p-10f), 0);
	assert_int_equal(kn_f32_to_e4m3(nextafterf(0x1p-10f, 1)), 1);
	/* random values, log-uniform over the whole range: brute force */
	for (int i = 0; i < 300000; i++) {
		float x = ldexpf(1.0f + kt_uniform(&rng) / 2, (int)(kt_next(&rng) % 24) - 14);
		double best_err = INFINITY;
		int best = 0;

		if (x > 448.0f)
			x = 448.0f;
		for (int v = 0; v < 127; v++) {
			double err = fabs((double)table[v] - x);

			if (err < best_err || (err == best_err && !(v & 1))) {
				best_err = err;
				best = v;
			}
		}
		assert_int_equal(kn_f32_to_e4m3(x), best);
	}
}

/* ---- quantization steps ------------------------------------------------- */

static void test_quant_steps(void **state)
{
	/* scales */
	assert_int_equal(kn_scale_f16(0.0f, 127.0f), 0);
	assert_int_equal(kn_scale_f16(127.0f, 127.0f), 0x3c00);
	assert_int_equal(kn_scale_f16(1e-12f, 127.0f), KN_F16_MIN_BITS);
	assert_int_equal(kn_scale_f16(1e30f, 7.0f), KN_F16_MAX_BITS);
	assert_int_equal(kn_scale_f16(INFINITY, 448.0f), KN_F16_MAX_BITS);
	/* amax ignores NaN, takes |x| */
	assert_true(kn_amax(kn_amax(0.0f, NAN), -3.0f) == 3.0f);
	assert_true(kn_amax(kn_amax(0.0f, -3.0f), NAN) == 3.0f);
	/* codes: round to nearest even, saturate, NaN and zero scale → 0 */
	assert_int_equal(kn_quant_int(2.5f, 1.0f, 127.0f), 2);
	assert_int_equal(kn_quant_int(3.5f, 1.0f, 127.0f), 4);
	assert_int_equal(kn_quant_int(-1000.0f, 1.0f, 127.0f), -127);
	assert_int_equal(kn_quant_int(INFINITY, 1.0f, 7.0f), 7);
	assert_int_equal(kn_quant_int(NAN, 1.0f, 7.0f), 0);
	assert_int_equal(kn_quant_int(5.0f, 0.0f, 7.0f), 0);
	assert_int_equal(kn_quant_e4m3(NAN, 1.0f), 0);
	assert_int_equal(kn_quant_e4m3(-1e9f, 1.0f), 0xfe);
	assert_int_equal(kn_quant_e4m3(5.0f, 0.0f), 0);
}

static void test_int4_nibbles(void **state)
{
	uint8_t row[8];

	for (int v = -8; v < 8; v++)
		for (uint32_t i = 0; i < 16; i++) {
			memset(row, 0xa5, sizeof(row));
			row[i / 2] = (uint8_t)((row[i / 2] & ((i & 1) ? 0x0f : 0xf0)) |
					       (((unsigned)v & 0xfu) << ((i & 1) * 4)));
			assert_int_equal(kn_int4_get(row, i), v);
		}
}

/* ---- page geometry of the CUDA kernels ----------------------------------- */

static void test_geometry(void **state)
{
	static const uint32_t dtypes[] = {SHM_DTYPE_F16,  SHM_DTYPE_BF16,     SHM_DTYPE_F32,
					  SHM_DTYPE_INT8, SHM_DTYPE_FP8_E4M3, SHM_DTYPE_INT4};

	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
		int quant = shm_dtype_quantized(dtypes[d]);
		struct shm_layout l = {3, 2, 24, 5, dtypes[d], quant ? 8 : 0};
		struct kn_geom g;

		kn_geom_init(&g, l.n_layers, l.n_kv_heads, l.head_dim, l.block_tokens, l.dtype,
			     l.quant_group);
		assert_int_equal(g.data_bytes, shm_page_data_bytes(&l));
		assert_int_equal(g.row_bytes, shm_row_bytes(&l));
		assert_int_equal(shm_layout_check(&l), 0);
		for (uint32_t layer = 0; layer < l.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < l.n_kv_heads; h++)
					for (uint32_t t = 0; t < l.block_tokens; t++) {
						uint64_t r = kn_row_index(&g, layer, kv, h, t);

						assert_int_equal(
							kn_row_offset(&g, r),
							shm_kv_offset(&l, layer, kv, h, t));
						if (quant) {
							assert_int_equal(kn_scale_offset(&g, r),
									 shm_scale_offset(&l, layer,
											  kv, h,
											  t));
							/* f16 scales are 2-byte aligned */
							assert_int_equal(kn_scale_offset(&g, r) % 2,
									 0);
						}
					}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f16_decode_encode_all),
		cmocka_unit_test(test_f16_rounding),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_e4m3),
		cmocka_unit_test(test_quant_steps),
		cmocka_unit_test(test_int4_nibbles),
		cmocka_unit_test(test_geometry),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
