/* tests/kernels/test_quant.c — quantization and dequantization of the C
 * reference against the bounds that kernels.h states.
 *
 * For every quantized dtype (int8, fp8-e4m3, int4), group size and
 * float format on either side, each element is checked on its own: the
 * stored scale is amax / QMAX rounded up to f16, the code times the scale is within the
 * dtype's bound of the input (s/2 for integer codes, 2^-4 |x| + 2^-10 s for
 * fp8), and the value read back is exactly that product rounded to the
 * output format. Data: normal values with outlier channels at several
 * magnitudes. RMS errors over N(0,1) are printed and held to the figures of
 * kernels.h. Also: edge cases (zeros, NaN, inf, huge and tiny values),
 * garbage pages dequantize without undefined behaviour, page conversion of
 * a token range touches nothing else, requantization is idempotent, and
 * every bad argument is refused. Single-threaded.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kernels_num.h"
#include "ktest.h"

#define D      128u
#define N_ROWS 256u

static const uint32_t qtypes[] = {SHM_DTYPE_INT8, SHM_DTYPE_FP8_E4M3, SHM_DTYPE_INT4};
static const uint32_t ftypes[] = {SHM_DTYPE_F32, SHM_DTYPE_F16, SHM_DTYPE_BF16};

static size_t row_bytes(uint32_t dtype)
{
	return (size_t)D * shm_dtype_bits(dtype) / 8;
}

/* Code i of a quantized row, decoded (before the scale). */
static float code_value(uint32_t dtype, const uint8_t *row, uint32_t i)
{
	switch (dtype) {
	case SHM_DTYPE_INT8:
		return (float)(int8_t)row[i];
	case SHM_DTYPE_FP8_E4M3:
		return kn_e4m3_to_f32(row[i]);
	default:
		return (float)kn_int4_get(row, i);
	}
}

/* x rounded to a float format, as f32. */
static float round_to(uint32_t dtype, float x)
{
	switch (dtype) {
	case SHM_DTYPE_F16:
		return kn_f16_to_f32(kn_f32_to_f16(x));
	case SHM_DTYPE_BF16:
		return kn_bf16_to_f32(kn_f32_to_bf16(x));
	default:
		return x;
	}
}

struct err_stats {
	double sum_err2, sum_x2, max_rel_amax;
};

/* Quantizes N_ROWS rows of src (format sf) into qt/group, dequantizes into
 * format of, and checks every element and scale. */
static void check_roundtrip(uint32_t qt, uint32_t group, uint32_t sf, uint32_t of,
			    const float *data, struct err_stats *st)
{
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, sfmt = {sf, 0}, ofmt = {of, 0};
	struct kern_fmt qfmt = {qt, group};
	uint32_t n_groups = D / group;
	uint8_t *src = malloc(N_ROWS * row_bytes(sf)), *q = malloc(N_ROWS * row_bytes(qt));
	uint8_t *out = malloc(N_ROWS * row_bytes(of));
	uint16_t *scales = malloc(N_ROWS * n_groups * sizeof(uint16_t));
	float *x = malloc(N_ROWS * D * sizeof(float)), *xo = malloc(N_ROWS * D * sizeof(float));
	float qmax = kn_qmax(qt);

	assert_non_null(src);
	assert_non_null(q);
	assert_non_null(out);
	assert_non_null(scales);
	assert_non_null(x);
	assert_non_null(xo);
	/* the input as the source format holds it */
	assert_int_equal(kref_convert_rows(sfmt, src, NULL, f32, data, NULL, N_ROWS, D), 0);
	assert_int_equal(kref_convert_rows(f32, x, NULL, sfmt, src, NULL, N_ROWS, D), 0);
	assert_int_equal(kref_convert_rows(qfmt, q, scales, sfmt, src, NULL, N_ROWS, D), 0);
	assert_int_equal(kref_convert_rows(ofmt, out, NULL, qfmt, q, scales, N_ROWS, D), 0);
	assert_int_equal(kref_convert_rows(f32, xo, NULL, ofmt, out, NULL, N_ROWS, D), 0);

	for (uint32_t r = 0; r < N_ROWS; r++) {
		const uint8_t *qrow = q + r * row_bytes(qt);

		for (uint32_t g = 0; g < n_groups; g++) {
			float amax = 0.0f, s = kn_f16_to_f32(scales[r * n_groups + g]);
			double ideal;

			for (uint32_t i = g * group; i < (g + 1) * group; i++)
				amax = fmaxf(amax, fabsf(x[r * D + i]));
			ideal = (double)amax / qmax;
			if (ideal >= 65504.0)
				assert_true(s == 65504.0f);
			else if (amax > 0 && ideal < 0x1p-24)
				assert_true(s == 0x1p-24f);
			else if (s < ideal * (1 - 0x1p-23) || s > ideal * (1 + 0x1p-10) + 0x1p-24)
				fail_msg("%s group %u: scale %g for amax %g", shm_dtype_name(qt), g,
					 s, amax);
			for (uint32_t i = g * group; i < (g + 1) * group; i++) {
				float xi = x[r * D + i];
				float qs = code_value(qt, qrow, i) * s; /* exact */
				double err = fabs((double)xi - qs), bound;

				if (qt == SHM_DTYPE_FP8_E4M3)
					bound = 0x1p-4 * fabs(xi) + 0x1p-10 * s;
				else
					bound = s / 2;
				bound *= 1 + 0x1p-20;
				if (err > bound)
					fail_msg("%s g%u %s: x %.9g → %.9g (code %g, scale %g), "
						 "error %.3g > bound %.3g",
						 shm_dtype_name(qt), group, shm_dtype_name(sf), xi,
						 qs, code_value(qt, qrow, i), s, err, bound);
				/* reading back is exactly that product, rounded */
				if (xo[r * D + i] != round_to(of, qs))
					fail_msg("%s → %s: read %.9g, want %.9g",
						 shm_dtype_name(qt), shm_dtype_name(of),
						 xo[r * D + i], round_to(of, qs));
				if (st) {
					double e = (double)xi - xo[r * D + i];

					st->sum_err2 += e * e;
					st->sum_x2 += (double)xi * xi;
					if (amax > 0 && fabs(e) / amax > st->max_rel_amax)
						st->max_rel_amax = fabs(e) / amax;
				}
			}
		}
	}
	free(src);
	free(q);
	free(out);
	free(scales);
	free(x);
	free(xo);
}

static void fill(float *data, uint64_t seed, float magnitude, int outliers)
{
	uint64_t rng = seed;

	for (uint32_t i = 0; i < N_ROWS * D; i++) {
		data[i] = kt_normal(&rng) * magnitude;
		if (outliers && i % D % 37 == 5)
			data[i] *= 20.0f;
	}
}

static void test_roundtrip_bounds(void **state)
{
	static const uint32_t groups[] = {8, 32, 128};
	static const float mags[] = {1e-3f, 1.0f, 300.0f};
	float *data = malloc(N_ROWS * D * sizeof(float));

	assert_non_null(data);
	for (size_t m = 0; m < 3; m++)
		for (int outl = 0; outl < 2; outl++) {
			fill(data, 10 + m * 2 + (uint64_t)outl, mags[m], outl);
			for (size_t q = 0; q < 3; q++)
				for (size_t g = 0; g < 3; g++)
					for (size_t sf = 0; sf < 3; sf++)
						for (size_t of = 0; of < 3; of++)
							check_roundtrip(qtypes[q], groups[g],
									ftypes[sf], ftypes[of],
									data, NULL);
		}
	free(data);
}

/* The figures kernels.h states, over N(0,1) data in f32. */
static void test_rms_error(void **state)
{
	static const double limit[3][2] = {
		/* group 32, group 128 */
		{0.0060, 0.0075}, /* int8 */
		{0.028, 0.028},	  /* fp8-e4m3 */
		{0.115, 0.145},	  /* int4 */
	};
	static const uint32_t groups[] = {32, 128};
	float *data = malloc(N_ROWS * D * sizeof(float));

	assert_non_null(data);
	fill(data, 99, 1.0f, 0);
	for (size_t q = 0; q < 3; q++)
		for (size_t g = 0; g < 2; g++) {
			struct err_stats st = {0};
			double rms;

			check_roundtrip(qtypes[q], groups[g], SHM_DTYPE_F32, SHM_DTYPE_F32, data,
					&st);
			rms = sqrt(st.sum_err2 / st.sum_x2);
			printf("%-8s group %3u: RMS error %.3f %% of RMS, max %.3f %% of group "
			       "amax\n",
			       shm_dtype_name(qtypes[q]), groups[g], 100 * rms,
			       100 * st.max_rel_amax);
			assert_true(rms < limit[q][g]);
			assert_true(rms > limit[q][g] / 4); /* the measure measures */
		}
	free(data);
}

static void test_edge_values(void **state)
{
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0};
	float in[D], out[D];
	uint8_t q[D];
	uint16_t sc[D / 8];

	for (size_t t = 0; t < 3; t++) {
		struct kern_fmt qf = {qtypes[t], 8};
		float qmax = kn_qmax(qtypes[t]);

		/* zeros: scale 0, output +0 */
		memset(in, 0, sizeof(in));
		assert_int_equal(kref_convert_rows(qf, q, sc, f32, in, NULL, 1, D), 0);
		assert_int_equal(kref_convert_rows(f32, out, NULL, qf, q, sc, 1, D), 0);
		for (uint32_t i = 0; i < D; i++)
			assert_true(out[i] == 0.0f && !signbit(out[i]));
		assert_int_equal(sc[0], 0);

		/* NaN reads back as 0 and does not spoil its group */
		for (uint32_t i = 0; i < D; i++)
			in[i] = (float)(i % 8) - 3.0f;
		in[3] = NAN;
		assert_int_equal(kref_convert_rows(qf, q, sc, f32, in, NULL, 1, D), 0);
		assert_int_equal(kref_convert_rows(f32, out, NULL, qf, q, sc, 1, D), 0);
		assert_true(out[3] == 0.0f);
		assert_true(kn_f16_to_f32(sc[0]) >= 4.0f / qmax);
		assert_true(kn_f16_to_f32(sc[0]) <= 4.0f / qmax * (1 + 0x1p-10f));
		assert_true(fabsf(out[7] - 4.0f) <= 4.0f / 14);

		/* inf and huge values saturate to 65504 * QMAX */
		in[9] = INFINITY;
		in[17] = -1e30f;
		assert_int_equal(kref_convert_rows(qf, q, sc, f32, in, NULL, 1, D), 0);
		assert_int_equal(kref_convert_rows(f32, out, NULL, qf, q, sc, 1, D), 0);
		assert_int_equal(sc[1], KN_F16_MAX_BITS);
		assert_int_equal(sc[2], KN_F16_MAX_BITS);
		assert_true(out[9] == 65504.0f * qmax);
		assert_true(out[17] == -65504.0f * qmax);

		/* tiny values: the smallest scale, small absolute error */
		for (uint32_t i = 0; i < D; i++)
			in[i] = 1e-9f * (float)(i % 5);
		assert_int_equal(kref_convert_rows(qf, q, sc, f32, in, NULL, 1, D), 0);
		assert_int_equal(kref_convert_rows(f32, out, NULL, qf, q, sc, 1, D), 0);
		for (uint32_t i = 0; i < D; i++)
			assert_true(fabsf(out[i] - in[i]) <= 0x1p-25f);
	}
}

/* Client bytes are untrusted: any bits must dequantize without undefined
 * behaviour (UBSan watches in the sanitizer build), NaN scales included. */
static void test_garbage_pages(void **state)
{
	uint64_t rng = 7;
	uint8_t q[D];
	uint16_t sc[D / 4];
	float out[D];
	uint16_t h[D];

	for (int it = 0; it < 2000; it++) {
		for (uint32_t i = 0; i < D; i++)
			q[i] = (uint8_t)kt_next(&rng);
		for (uint32_t i = 0; i < D / 4; i++)
			sc[i] = (uint16_t)kt_next(&rng);
		for (size_t t = 0; t < 3; t++) {
			struct kern_fmt qf = {qtypes[t], 4}, f32 = {SHM_DTYPE_F32, 0};
			struct kern_fmt f16 = {SHM_DTYPE_F16, 0}, q8 = {SHM_DTYPE_INT8, 4};
			uint8_t q2[D];
			uint16_t sc2[D / 4];

			assert_int_equal(kref_convert_rows(f32, out, NULL, qf, q, sc, 1, D), 0);
			assert_int_equal(kref_convert_rows(f16, h, NULL, qf, q, sc, 1, D), 0);
			assert_int_equal(kref_convert_rows(q8, q2, sc2, qf, q, sc, 1, D), 0);
		}
	}
}

/* A token range of pages: converted rows equal the row-wise conversion,
 * everything else of the destination pages is untouched. */
static void test_pages_token_range(void **state)
{
	struct shm_layout fl = {2, 2, 64, 16, SHM_DTYPE_F32, 0};
	struct shm_layout ql = {2, 2, 64, 16, SHM_DTYPE_INT4, 16};
	struct kt_pages src, dst;
	uint64_t rng = 5;
	float row[64];

	kt_pages_alloc(&src, &fl, 2);
	kt_pages_alloc(&dst, &ql, 2);
	for (uint64_t pos = 0; pos < 32; pos++)
		for (uint32_t layer = 0; layer < 2; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < 2; h++) {
					for (uint32_t i = 0; i < 64; i++)
						row[i] = kt_normal(&rng);
					kt_store_row(&src, pos, layer, kv, h, row);
				}
	for (uint32_t i = 0; i < 2; i++)
		memset(dst.pages[i], 0xab, dst.page_bytes);
	assert_int_equal(
		kref_convert_pages(&ql, dst.pages, &fl, (const void *const *)src.pages, 2, 3, 5),
		0);
	for (uint32_t p = 0; p < 2; p++) {
		const uint8_t *page = dst.pages[p];
		uint64_t scale_end = shm_page_data_bytes(&ql) + shm_page_scale_bytes(&ql);

		for (uint32_t layer = 0; layer < 2; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < 2; h++)
					for (uint32_t t = 0; t < 16; t++) {
						const uint8_t *r =
							page + shm_kv_offset(&ql, layer, kv, h, t);
						const uint8_t *s =
							page +
							shm_scale_offset(&ql, layer, kv, h, t);
						uint8_t want[32];
						uint16_t want_sc[4];
						struct kern_fmt qf = {SHM_DTYPE_INT4, 16};
						struct kern_fmt f32 = {SHM_DTYPE_F32, 0};

						if (t < 3 || t >= 8) {
							for (uint32_t b = 0; b < 32; b++)
								assert_int_equal(r[b], 0xab);
							for (uint32_t b = 0; b < 8; b++)
								assert_int_equal(s[b], 0xab);
							continue;
						}
						kt_load_row(&src, (uint64_t)p * 16 + t, layer, kv,
							    h, row);
						assert_int_equal(
							kref_convert_rows(qf, want, want_sc, f32,
									  row, NULL, 1, 64),
							0);
						assert_memory_equal(r, want, 32);
						assert_memory_equal(s, want_sc, 8);
					}
		for (uint64_t b = scale_end; b < dst.page_bytes; b++)
			assert_int_equal(page[b], 0xab);
	}
	kt_pages_free(&src);
	kt_pages_free(&dst);
}

/* quantized → f32 → quantized gives the same bytes (each group's largest
 * code is ±QMAX, so the scale comes back exactly); also quantized →
 * quantized directly. */
static void test_requantize_idempotent(void **state)
{
	float *data = malloc(N_ROWS * D * sizeof(float)), *mid = malloc(N_ROWS * D * 4);
	uint8_t *q1 = malloc(N_ROWS * D), *q2 = malloc(N_ROWS * D);
	uint16_t *s1 = malloc(N_ROWS * D / 16 * 2), *s2 = malloc(N_ROWS * D / 16 * 2);
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0};

	assert_non_null(data);
	assert_non_null(mid);
	assert_non_null(q1);
	assert_non_null(q2);
	assert_non_null(s1);
	assert_non_null(s2);
	fill(data, 3, 2.0f, 1);
	for (size_t t = 0; t < 3; t++) {
		struct kern_fmt qf = {qtypes[t], 16};
		size_t bytes = N_ROWS * row_bytes(qtypes[t]);

		assert_int_equal(kref_convert_rows(qf, q1, s1, f32, data, NULL, N_ROWS, D), 0);
		assert_int_equal(kref_convert_rows(f32, mid, NULL, qf, q1, s1, N_ROWS, D), 0);
		assert_int_equal(kref_convert_rows(qf, q2, s2, f32, mid, NULL, N_ROWS, D), 0);
		assert_memory_equal(q1, q2, bytes);
		assert_memory_equal(s1, s2, N_ROWS * D / 16 * 2);
		memset(q2, 0, bytes);
		assert_int_equal(kref_convert_rows(qf, q2, s2, qf, q1, s1, N_ROWS, D), 0);
		assert_memory_equal(q1, q2, bytes);
	}
	free(data);
	free(mid);
	free(q1);
	free(q2);
	free(s1);
	free(s2);
}

static void test_bad_arguments(void **state)
{
	struct kern_fmt f32 = {SHM_DTYPE_F32, 0}, i8 = {SHM_DTYPE_INT8, 32};
	struct kern_fmt bad_group = {SHM_DTYPE_INT8, 48}, zero_group = {SHM_DTYPE_INT8, 0};
	struct kern_fmt f16_group = {SHM_DTYPE_F16, 8}, unknown = {9, 0};
	struct kern_fmt i4 = {SHM_DTYPE_INT4, 3};
	float x[128] = {0};
	uint8_t q[128];
	uint16_t sc[8];
	struct shm_layout a = {2, 2, 64, 16, SHM_DTYPE_F16, 0};
	struct shm_layout b = {2, 2, 64, 16, SHM_DTYPE_INT8, 32};
	struct shm_layout c = {2, 4, 64, 16, SHM_DTYPE_INT8, 32};
	void *pages[1] = {NULL};

	assert_int_equal(kref_convert_rows(i8, q, NULL, f32, x, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(f32, x, NULL, i8, q, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(bad_group, q, sc, f32, x, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(zero_group, q, sc, f32, x, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(f16_group, q, sc, f32, x, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(unknown, q, sc, f32, x, NULL, 1, 128), -EINVAL);
	assert_int_equal(kref_convert_rows(i4, q, sc, f32, x, NULL, 1, 3), -EINVAL);
	assert_int_equal(kref_convert_rows(f32, x, NULL, f32, x, NULL, 1, 0), -EINVAL);
	assert_int_equal(kref_convert_rows(f32, x, NULL, f32, x, NULL, 1, 2048), -EINVAL);
	assert_int_equal(kref_convert_pages(&b, pages, &c, (const void *const *)pages, 1, 0, 1),
			 -EINVAL);
	assert_int_equal(kref_convert_pages(&b, pages, &a, (const void *const *)pages, 1, 10, 7),
			 -EINVAL);
	a.quant_group = 4; /* a bad layout */
	assert_int_equal(kref_convert_pages(&b, pages, &a, (const void *const *)pages, 1, 0, 1),
			 -EINVAL);
	/* nothing to do is fine */
	assert_int_equal(kref_convert_rows(i8, q, sc, f32, x, NULL, 0, 128), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_bounds),
		cmocka_unit_test(test_rms_error),
		cmocka_unit_test(test_edge_values),
		cmocka_unit_test(test_garbage_pages),
		cmocka_unit_test(test_pages_token_range),
		cmocka_unit_test(test_requantize_idempotent),
		cmocka_unit_test(test_bad_arguments),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
