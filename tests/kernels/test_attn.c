/* tests/kernels/test_attn.c — paged-attention decode of the C reference.
 *
 * Against a naive double-precision attention over the same dequantized
 * K/V, for every dtype, for MHA, GQA and MQA head layouts, for contexts of
 * one token, a partial page and thousands of tokens: outputs within
 * 1e-5 max|v|, attention weights within 2e-5 of their value (+1e-7) and
 * summing to 1. Also: the
 * GQA head mapping on crafted values, huge scores without overflow, and the
 * attention over int8 / fp8 / int4 pages within the tolerances of kernels.h
 * of the same attention over f16 pages (printed). Single-threaded.
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

#include "ktest.h"

#define OUT_TOL	   1e-5 /* of max|v| */
#define WEIGHT_TOL 2e-5 /* of the weight (+1e-7 absolute) */

/* Fills positions [0, n) of every layer and head with N(0,1) K and V, keys
 * with a few outlier channels as real keys have. */
static void fill_kv(struct kt_pages *p, uint64_t n, uint64_t seed)
{
	uint32_t hd = p->l.head_dim;
	float *row = malloc(hd * sizeof(float));
	uint64_t rng = seed;

	assert_non_null(row);
	for (uint64_t t = 0; t < n; t++)
		for (uint32_t layer = 0; layer < p->l.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < p->l.n_kv_heads; h++) {
					for (uint32_t i = 0; i < hd; i++) {
						row[i] = kt_normal(&rng);
						if (kv == 0 && i % 16 == 3)
							row[i] *= 8.0f;
					}
					kt_store_row(p, t, layer, kv, h, row);
				}
	free(row);
}

struct attn_err {
	double out, weight, weight_sum; /* max errors: out relative to max|v| */
};

static struct attn_err check_vs_double(const struct kt_pages *p, uint32_t layer, uint64_t n,
				       uint32_t n_q, uint64_t seed)
{
	uint32_t hd = p->l.head_dim;
	float *q = malloc((size_t)n_q * hd * sizeof(float));
	float *out = malloc((size_t)n_q * hd * sizeof(float));
	float *w = malloc((size_t)n_q * n * sizeof(float));
	double *outd = malloc((size_t)n_q * hd * sizeof(double));
	double *wd = malloc((size_t)n_q * n * sizeof(double));
	float *v = malloc(hd * sizeof(float));
	struct attn_err e = {0};
	float vmax = 0.0f;
	uint64_t rng = seed;

	assert_non_null(q);
	assert_non_null(out);
	assert_non_null(w);
	assert_non_null(outd);
	assert_non_null(wd);
	assert_non_null(v);
	for (uint32_t i = 0; i < n_q * hd; i++)
		q[i] = kt_normal(&rng);
	/* make some tokens stand out, as real attention is peaked */
	for (uint32_t h = 0; h < n_q && n > 3; h++) {
		float k[SHM_MAX_HEAD_DIM];

		kt_load_row(p, (h * 7919u) % n, layer, 0, h / (n_q / p->l.n_kv_heads), k);
		for (uint32_t i = 0; i < hd; i++)
			q[h * hd + i] += 0.3f * k[i];
	}
	for (uint64_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < p->l.n_kv_heads; h++) {
			kt_load_row(p, t, layer, 1, h, v);
			vmax = fmaxf(vmax, kt_max_abs(v, hd));
		}
	assert_int_equal(kref_attn_decode(&p->l, layer, (const void *const *)p->pages, n, q, n_q,
					  1.0f / sqrtf((float)hd), out, w),
			 0);
	kt_attn_double(p, layer, n, q, n_q, 1.0f / sqrtf((float)hd), outd, wd);
	for (uint32_t h = 0; h < n_q; h++) {
		double sum = 0.0;

		for (uint32_t i = 0; i < hd; i++)
			e.out = fmax(e.out, fabs(out[h * hd + i] - outd[h * hd + i]) / vmax);
		for (uint64_t t = 0; t < n; t++) {
			/* relative to the weight, plus a floor for tiny ones */
			e.weight = fmax(e.weight, fabs(w[h * n + t] - wd[h * n + t]) /
							  (wd[h * n + t] + 0.005));

			sum += w[h * n + t];
		}
		e.weight_sum = fmax(e.weight_sum, fabs(sum - 1.0));
	}
	free(q);
	free(out);
	free(w);
	free(outd);
	free(wd);
	free(v);
	return e;
}

static void test_vs_double(void **state)
{
	static const struct {
		uint32_t dtype, group;
	} fmts[] = {
		{SHM_DTYPE_F32, 0},   {SHM_DTYPE_F16, 0},	{SHM_DTYPE_BF16, 0},
		{SHM_DTYPE_INT8, 32}, {SHM_DTYPE_FP8_E4M3, 32}, {SHM_DTYPE_INT4, 16},
	};
	static const struct {
		uint32_t n_kv, n_q, hd;
		uint64_t n;
	} shapes[] = {
		{2, 8, 64, 1},	 /* GQA, one token */
		{1, 4, 128, 37}, /* MQA, partial last page */
		{2, 2, 24, 300}, /* MHA, head_dim not a multiple of 8 */
		{2, 6, 64, 1000},
	};
	double worst_out = 0, worst_w = 0;

	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++)
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			struct shm_layout l = {2,  shapes[s].n_kv, shapes[s].hd,
					       16, fmts[f].dtype,  fmts[f].group};
			struct kt_pages p;
			struct attn_err e;

			if (fmts[f].group && shapes[s].hd % fmts[f].group)
				l.quant_group = 8;
			kt_pages_alloc(&p, &l, kt_pages_for(&l, shapes[s].n));
			fill_kv(&p, shapes[s].n, 1 + f * 10 + s);
			e = check_vs_double(&p, 1, shapes[s].n, shapes[s].n_q, 100 + s);
			if (e.out > OUT_TOL || e.weight > WEIGHT_TOL || e.weight_sum > 1e-5)
				fail_msg("%s n_kv %u n_q %u n %llu: out error %.3g max|v|, "
					 "weight error %.3g, weight sum off by %.3g",
					 shm_dtype_name(l.dtype), l.n_kv_heads, shapes[s].n_q,
					 (unsigned long long)shapes[s].n, e.out, e.weight,
					 e.weight_sum);
			worst_out = fmax(worst_out, e.out);
			worst_w = fmax(worst_w, e.weight);
			kt_pages_free(&p);
		}
	printf("reference vs double: worst output error %.3g max|v| (bound %.0e), worst weight "
	       "error %.3g (bound %.0e)\n",
	       worst_out, OUT_TOL, worst_w, WEIGHT_TOL);
}

/* A long context: the error must not grow past the bound. */
static void test_long_context(void **state)
{
	struct shm_layout l = {1, 2, 128, 16, SHM_DTYPE_F16, 0};
	struct kt_pages p;
	struct attn_err e;

	kt_pages_alloc(&p, &l, kt_pages_for(&l, 4096));
	fill_kv(&p, 4096, 77);
	e = check_vs_double(&p, 0, 4096, 8, 78);
	printf("4096 tokens f16: output error %.3g max|v|, weight error %.3g\n", e.out, e.weight);
	assert_true(e.out <= OUT_TOL);
	assert_true(e.weight <= WEIGHT_TOL);
	kt_pages_free(&p);
}

/* GQA mapping: V of kv head h is all h + 1, so every query head of group
 * g must output exactly g + 1 whatever the weights. */
static void test_gqa_mapping(void **state)
{
	struct shm_layout l = {1, 4, 32, 8, SHM_DTYPE_F32, 0};
	struct kt_pages p;
	float row[32], q[16 * 32], out[16 * 32];
	uint64_t rng = 9;

	kt_pages_alloc(&p, &l, 3);
	for (uint64_t t = 0; t < 20; t++)
		for (uint32_t h = 0; h < 4; h++) {
			for (uint32_t i = 0; i < 32; i++)
				row[i] = kt_normal(&rng);
			kt_store_row(&p, t, 0, 0, h, row);
			for (uint32_t i = 0; i < 32; i++)
				row[i] = (float)(h + 1);
			kt_store_row(&p, t, 0, 1, h, row);
		}
	for (uint32_t i = 0; i < 16 * 32; i++)
		q[i] = kt_normal(&rng);
	assert_int_equal(
		kref_attn_decode(&l, 0, (const void *const *)p.pages, 20, q, 16, 0.2f, out, NULL),
		0);
	for (uint32_t h = 0; h < 16; h++)
		for (uint32_t i = 0; i < 32; i++)
			assert_true(fabsf(out[h * 32 + i] - (float)(h / 4 + 1)) <=
				    1e-6f * (h / 4 + 1));
	kt_pages_free(&p);
}

/* Scores of ±1e4 must not overflow: the output is the V of the best key. */
static void test_huge_scores(void **state)
{
	struct shm_layout l = {1, 1, 16, 4, SHM_DTYPE_F32, 0};
	struct kt_pages p;
	float row[16], q[16], out[16], w[10];

	kt_pages_alloc(&p, &l, 3);
	for (uint64_t t = 0; t < 10; t++) {
		for (uint32_t i = 0; i < 16; i++)
			row[i] = t == 6 ? 100.0f : -100.0f + (float)t;
		kt_store_row(&p, t, 0, 0, 0, row);
		for (uint32_t i = 0; i < 16; i++)
			row[i] = (float)t;
		kt_store_row(&p, t, 0, 1, 0, row);
	}
	for (uint32_t i = 0; i < 16; i++)
		q[i] = 10.0f;
	assert_int_equal(
		kref_attn_decode(&l, 0, (const void *const *)p.pages, 10, q, 1, 1.0f, out, w), 0);
	for (uint32_t i = 0; i < 16; i++)
		assert_true(out[i] == 6.0f);
	for (uint32_t t = 0; t < 10; t++)
		assert_true(w[t] == (t == 6 ? 1.0f : 0.0f));
	kt_pages_free(&p);
}

/* Attention over quantized pages against the same attention over f16
 * pages of the same values; the tolerances of kernels.h. */
static void test_quantized_vs_f16(void **state)
{
	static const struct {
		uint32_t dtype, group;
		double tol;
	} q[] = {
		{SHM_DTYPE_INT8, 32, 0.02},
		{SHM_DTYPE_FP8_E4M3, 32, 0.06},
		{SHM_DTYPE_INT4, 32, 0.25},
	};
	const uint32_t hd = 128, n_q = 8, n = 512;
	struct shm_layout fl = {1, 2, hd, 16, SHM_DTYPE_F16, 0};
	struct kt_pages ref;
	float *qv = malloc(n_q * hd * sizeof(float)), *o16 = malloc(n_q * hd * sizeof(float));
	float *oq = malloc(n_q * hd * sizeof(float)), row[128], vmax = 0.0f;
	uint64_t rng = 31;

	assert_non_null(qv);
	assert_non_null(o16);
	assert_non_null(oq);
	kt_pages_alloc(&ref, &fl, kt_pages_for(&fl, n));
	fill_kv(&ref, n, 32);
	for (uint64_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < 2; h++) {
			kt_load_row(&ref, t, 0, 1, h, row);
			vmax = fmaxf(vmax, kt_max_abs(row, hd));
		}
	for (uint32_t i = 0; i < n_q * hd; i++)
		qv[i] = kt_normal(&rng) * 0.5f;
	for (uint32_t h = 0; h < n_q; h++) {
		kt_load_row(&ref, (h * 61u) % n, 0, 0, h / 4, row);
		for (uint32_t i = 0; i < hd; i++)
			qv[h * hd + i] += 0.2f * row[i];
	}
	assert_int_equal(kref_attn_decode(&fl, 0, (const void *const *)ref.pages, n, qv, n_q,
					  1.0f / sqrtf((float)hd), o16, NULL),
			 0);
	for (size_t k = 0; k < 3; k++) {
		struct shm_layout ql = fl;
		struct kt_pages p;
		double err = 0;

		ql.dtype = q[k].dtype;
		ql.quant_group = q[k].group;
		kt_pages_alloc(&p, &ql, ref.n_pages);
		assert_int_equal(kref_convert_pages(&ql, p.pages, &fl,
						    (const void *const *)ref.pages, ref.n_pages, 0,
						    16),
				 0);
		assert_int_equal(kref_attn_decode(&ql, 0, (const void *const *)p.pages, n, qv, n_q,
						  1.0f / sqrtf((float)hd), oq, NULL),
				 0);
		for (uint32_t i = 0; i < n_q * hd; i++)
			err = fmax(err, fabs(oq[i] - o16[i]) / vmax);
		printf("attention over %-8s pages (group %u) vs f16: max error %.4f max|v| "
		       "(tolerance %.2f)\n",
		       shm_dtype_name(ql.dtype), q[k].group, err, q[k].tol);
		assert_true(err <= q[k].tol);
		assert_true(err > 0);
		kt_pages_free(&p);
	}
	kt_pages_free(&ref);
	free(qv);
	free(o16);
	free(oq);
}

static void test_bad_arguments(void **state)
{
	struct shm_layout l = {2, 2, 32, 16, SHM_DTYPE_F16, 0};
	struct shm_layout bad = {2, 2, 32, 16, SHM_DTYPE_F16, 8};
	struct kt_pages p;
	float q[4 * 32] = {0}, out[4 * 32];

	kt_pages_alloc(&p, &l, 1);
	assert_int_equal(
		kref_attn_decode(&bad, 0, (const void *const *)p.pages, 1, q, 4, 1, out, NULL),
		-EINVAL);
	assert_int_equal(
		kref_attn_decode(&l, 2, (const void *const *)p.pages, 1, q, 4, 1, out, NULL),
		-EINVAL);
	assert_int_equal(
		kref_attn_decode(&l, 0, (const void *const *)p.pages, 0, q, 4, 1, out, NULL),
		-EINVAL);
	assert_int_equal(
		kref_attn_decode(&l, 0, (const void *const *)p.pages, 1, q, 3, 1, out, NULL),
		-EINVAL);
	assert_int_equal(
		kref_attn_decode(&l, 0, (const void *const *)p.pages, 1, q, 0, 1, out, NULL),
		-EINVAL);
	kt_pages_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vs_double),	 cmocka_unit_test(test_long_context),
		cmocka_unit_test(test_gqa_mapping),	 cmocka_unit_test(test_huge_scores),
		cmocka_unit_test(test_quantized_vs_f16), cmocka_unit_test(test_bad_arguments),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
