/* tests/kernels/test_gather.c — gathers of the C reference: compaction of
 * kept tokens into fresh pages (every byte of each kept row and its scales
 * lands at its new position, nothing else of the destination changes,
 * attention over the compacted pages equals attention over the kept
 * tokens) and the dense f32 rows of one head. Bad positions are refused
 * before anything is written. Single-threaded.
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

static void fill(struct kt_pages *p, uint64_t n, uint64_t seed)
{
	float row[SHM_MAX_HEAD_DIM];
	uint64_t rng = seed;

	for (uint64_t t = 0; t < n; t++)
		for (uint32_t layer = 0; layer < p->l.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < p->l.n_kv_heads; h++) {
					for (uint32_t i = 0; i < p->l.head_dim; i++)
						row[i] = kt_normal(&rng);
					kt_store_row(p, t, layer, kv, h, row);
				}
}

static const uint8_t *row_at(const struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv,
			     uint32_t h)
{
	return (const uint8_t *)p->pages[pos / p->l.block_tokens] +
	       shm_kv_offset(&p->l, layer, kv, h, (uint32_t)(pos % p->l.block_tokens));
}

static const uint8_t *scales_at(const struct kt_pages *p, uint64_t pos, uint32_t layer, uint32_t kv,
				uint32_t h)
{
	return (const uint8_t *)p->pages[pos / p->l.block_tokens] +
	       shm_scale_offset(&p->l, layer, kv, h, (uint32_t)(pos % p->l.block_tokens));
}

/* StreamingLLM-style: 4 sinks and a window of the last 40 of 150 tokens,
 * written after 5 tokens already in the destination. */
static void test_compact(void **state)
{
	static const struct shm_layout layouts[] = {
		{3, 2, 64, 16, SHM_DTYPE_F16, 0},
		{3, 2, 64, 16, SHM_DTYPE_INT8, 32},
		{3, 2, 64, 16, SHM_DTYPE_INT4, 16},
		{2, 1, 8, 3, SHM_DTYPE_FP8_E4M3, 4},
	};
	const uint64_t n_src = 150, dst0 = 5;
	uint32_t pos[44];
	uint64_t n = 0;

	for (uint32_t t = 0; t < 4; t++)
		pos[n++] = t;
	for (uint32_t t = 110; t < 150; t++)
		pos[n++] = t;
	for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
		const struct shm_layout *l = &layouts[li];
		struct kt_pages src, dst;
		uint64_t row_bytes = shm_row_bytes(l);
		uint64_t sc_bytes =
			shm_dtype_quantized(l->dtype) ? l->head_dim / l->quant_group * 2 : 0;

		kt_pages_alloc(&src, l, kt_pages_for(l, n_src));
		kt_pages_alloc(&dst, l, kt_pages_for(l, dst0 + n) + 1);
		fill(&src, n_src, 40 + li);
		for (uint32_t i = 0; i < dst.n_pages; i++)
			memset(dst.pages[i], 0x5a, dst.page_bytes);
		assert_int_equal(kref_gather_tokens(l, dst.pages, dst0,
						    (const void *const *)src.pages, n_src, pos, n),
				 0);
		for (uint64_t d = 0; d < (uint64_t)dst.n_pages * l->block_tokens; d++)
			for (uint32_t layer = 0; layer < l->n_layers; layer++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < l->n_kv_heads; h++) {
						const uint8_t *got = row_at(&dst, d, layer, kv, h);

						if (d < dst0 || d >= dst0 + n) {
							for (uint64_t b = 0; b < row_bytes; b++)
								assert_int_equal(got[b], 0x5a);
							continue;
						}
						assert_memory_equal(
							got,
							row_at(&src, pos[d - dst0], layer, kv, h),
							row_bytes);
						if (sc_bytes)
							assert_memory_equal(
								scales_at(&dst, d, layer, kv, h),
								scales_at(&src, pos[d - dst0],
									  layer, kv, h),
								sc_bytes);
					}

		/* attention over the compacted tokens = over a table of the kept
		 * tokens gathered to position 0 */
		if (l->head_dim == 64) {
			struct kt_pages kept;
			float q[4 * 64], o1[4 * 64], o2[4 * 64];
			uint64_t rng = 3;

			kt_pages_alloc(&kept, l, kt_pages_for(l, n));
			assert_int_equal(kref_gather_tokens(l, kept.pages, 0,
							    (const void *const *)src.pages, n_src,
							    pos, n),
					 0);
			for (uint32_t i = 0; i < 4 * 64; i++)
				q[i] = kt_normal(&rng);
			assert_int_equal(kref_attn_decode(l, 2, (const void *const *)kept.pages, n,
							  q, 4, 0.125f, o1, NULL),
					 0);
			/* the same keys, assembled row by row from the source */
			for (uint64_t i = 0; i < n; i++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < 2; h++) {
						float row[64];

						kt_load_row(&src, pos[i], 2, kv, h, row);
						kt_store_row(&kept, i, 2, kv, h, row);
					}
			assert_int_equal(kref_attn_decode(l, 2, (const void *const *)kept.pages, n,
							  q, 4, 0.125f, o2, NULL),
					 0);
			if (!shm_dtype_quantized(l->dtype))
				assert_memory_equal(o1, o2, sizeof(o1));
			kt_pages_free(&kept);
		}
		kt_pages_free(&src);
		kt_pages_free(&dst);
	}
}

static void test_bad_positions(void **state)
{
	struct shm_layout l = {1, 1, 16, 4, SHM_DTYPE_F16, 0};
	struct kt_pages src, dst;
	uint32_t pos[3] = {0, 1, 8};

	kt_pages_alloc(&src, &l, 2);
	kt_pages_alloc(&dst, &l, 1);
	memset(dst.pages[0], 0x77, dst.page_bytes);
	assert_int_equal(
		kref_gather_tokens(&l, dst.pages, 0, (const void *const *)src.pages, 8, pos, 3),
		-EINVAL);
	for (size_t b = 0; b < dst.page_bytes; b++)
		assert_int_equal(((uint8_t *)dst.pages[0])[b], 0x77);
	assert_int_equal(kref_gather_tokens(&l, dst.pages, UINT64_MAX,
					    (const void *const *)src.pages, 8, pos, 2),
			 -EINVAL);
	kt_pages_free(&src);
	kt_pages_free(&dst);
}

static void test_rows_f32(void **state)
{
	struct shm_layout l = {2, 3, 32, 8, SHM_DTYPE_INT8, 8};
	struct kt_pages p;
	float *dense = malloc(50 * 32 * sizeof(float)), row[32];

	assert_non_null(dense);
	kt_pages_alloc(&p, &l, kt_pages_for(&l, 60));
	fill(&p, 60, 8);
	assert_int_equal(
		kref_gather_rows_f32(&l, (const void *const *)p.pages, 1, 1, 2, 10, 50, dense), 0);
	for (uint64_t i = 0; i < 50; i++) {
		kt_load_row(&p, 10 + i, 1, 1, 2, row);
		assert_memory_equal(dense + i * 32, row, sizeof(row));
	}
	assert_int_equal(
		kref_gather_rows_f32(&l, (const void *const *)p.pages, 2, 0, 0, 0, 1, dense),
		-EINVAL);
	assert_int_equal(
		kref_gather_rows_f32(&l, (const void *const *)p.pages, 0, 2, 0, 0, 1, dense),
		-EINVAL);
	assert_int_equal(
		kref_gather_rows_f32(&l, (const void *const *)p.pages, 0, 0, 3, 0, 1, dense),
		-EINVAL);
	kt_pages_free(&p);
	free(dense);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compact),
		cmocka_unit_test(test_bad_positions),
		cmocka_unit_test(test_rows_f32),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
