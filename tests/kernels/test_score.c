/* tests/kernels/test_score.c — Q·Kᵀ scoring and cosine similarity of the C
 * reference against exact values computed in double, within the
 * worst-case bounds of float dot products that kernels.h states:
 *   Q·Kᵀ:   |s - exact| <= (dim + 2) 2^-24 |alpha| Σ|q_i k_i|
 *   cosine: |c - exact| <= (2 dim + 8) 2^-24
 * The bound is shown to catch reduced precision: a dot product with TF32
 * inputs (10-bit mantissas) breaks it. Single-threaded.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ktest.h"

static void test_qk(void **state)
{
	static const uint32_t shapes[][4] = {
		/* batch, n_q, n_k, dim */
		{1, 1, 1, 1},
		{3, 4, 37, 64},
		{2, 8, 100, 128},
		{1, 5, 9, 13},
	};
	uint64_t rng = 11;

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		uint32_t b = shapes[s][0], nq = shapes[s][1], nk = shapes[s][2], dim = shapes[s][3];
		float *q = malloc((size_t)b * nq * dim * sizeof(float));
		float *k = malloc((size_t)b * nk * dim * sizeof(float));
		float *sc = malloc((size_t)b * nq * nk * sizeof(float));
		float alpha = 1.0f / sqrtf((float)dim);

		assert_non_null(q);
		assert_non_null(k);
		assert_non_null(sc);
		for (size_t i = 0; i < (size_t)b * nq * dim; i++)
			q[i] = kt_normal(&rng) * 3;
		for (size_t i = 0; i < (size_t)b * nk * dim; i++)
			k[i] = kt_normal(&rng);
		assert_int_equal(kref_score_qk(q, k, sc, b, nq, nk, dim, alpha), 0);
		for (uint32_t bb = 0; bb < b; bb++)
			for (uint32_t i = 0; i < nq; i++)
				for (uint32_t j = 0; j < nk; j++) {
					const float *qi = q + ((size_t)bb * nq + i) * dim;
					const float *kj = k + ((size_t)bb * nk + j) * dim;
					double want = (double)alpha * kt_dot_exact(qi, kj, dim);
					double got = sc[((size_t)bb * nq + i) * nk + j];

					assert_true(fabs(got - want) <=
						    kt_qk_bound(qi, kj, dim, alpha));
				}
		free(q);
		free(k);
		free(sc);
	}
	assert_int_equal(kref_score_qk(NULL, NULL, NULL, 0, 1, 1, 1, 1), -EINVAL);
	assert_int_equal(kref_score_qk(NULL, NULL, NULL, 1, 1, 1, 0, 1), -EINVAL);
}

/* Round to TF32 (10-bit mantissa), as tensor cores read f32 inputs. */
static float tf32(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
	memcpy(&x, &u, sizeof(u));
	return x;
}

static void test_bound_rejects_tf32(void **state)
{
	uint64_t rng = 12;
	float q[128], k[128];
	int caught = 0;

	for (int trial = 0; trial < 20; trial++) {
		double tf = 0.0;

		for (int i = 0; i < 128; i++) {
			q[i] = kt_normal(&rng);
			k[i] = kt_normal(&rng);
			tf += (double)tf32(q[i]) * tf32(k[i]);
		}
		caught += fabs(tf - kt_dot_exact(q, k, 128)) > kt_qk_bound(q, k, 128, 1.0f);
	}
	assert_true(caught >= 15);
}

static void test_cosine(void **state)
{
	const uint32_t na = 7, nb = 300, dim = 96;
	float *a = malloc(na * dim * sizeof(float)), *b = malloc(nb * dim * sizeof(float));
	float *sim = malloc(na * nb * sizeof(float));
	uint64_t rng = 13;

	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(sim);
	for (uint32_t i = 0; i < na * dim; i++)
		a[i] = kt_normal(&rng);
	for (uint32_t i = 0; i < nb * dim; i++)
		b[i] = kt_normal(&rng) * 0.01f;
	/* specials: b_0 = a_0 (1), b_1 = -3 a_1 (-1), b_2 = 0, a_6 = 0 */
	memcpy(b, a, dim * sizeof(float));
	for (uint32_t i = 0; i < dim; i++)
		b[dim + i] = -3 * a[dim + i];
	memset(b + 2 * dim, 0, dim * sizeof(float));
	memset(a + 6 * dim, 0, dim * sizeof(float));
	assert_int_equal(kref_score_cosine(a, na, b, nb, dim, sim), 0);
	for (uint32_t i = 0; i < na; i++)
		for (uint32_t j = 0; j < nb; j++) {
			const float *ai = a + i * dim, *bj = b + j * dim;
			double den = sqrt(kt_dot_exact(ai, ai, dim) * kt_dot_exact(bj, bj, dim));
			double want = den > 0 ? kt_dot_exact(ai, bj, dim) / den : 0.0;

			assert_true(fabs(sim[i * nb + j] - want) <= kt_cosine_bound(dim));
		}
	assert_true(fabsf(sim[0] - 1.0f) <= 1e-5f);
	assert_true(fabsf(sim[nb + 1] + 1.0f) <= 1e-5f);
	assert_true(sim[2] == 0.0f);
	assert_true(sim[6 * nb + 10] == 0.0f);
	assert_int_equal(kref_score_cosine(a, 0, b, nb, dim, sim), -EINVAL);
	free(a);
	free(b);
	free(sim);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qk),
		cmocka_unit_test(test_bound_rejects_tf32),
		cmocka_unit_test(test_cosine),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
