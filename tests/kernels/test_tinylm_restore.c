/* tests/kernels/test_tinylm_restore.c — tinylm's logits after restoring
 * cached positions equal those of a full recompute, bit for bit, without a
 * daemon: pages written by one run are mapped (kvtable_restore) by another
 * at every kind of cut — nothing cached, a partial page, a page boundary,
 * all but the last prompt token — for unquantized and quantized pages.
 * Negative controls show the comparison has teeth: another seed, or one
 * flipped byte in a cached page, changes the logits. The source pages are
 * never written by the restoring run. Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvtable.h"
#include "tinylm.h"

#define N_PROMPT 100u
#define N_GEN	 4u

static void prompt(uint32_t *p, uint32_t n)
{
	static const char text[] = "The quick brown fox jumps over the lazy dog; ";

	for (uint32_t i = 0; i < n; i++)
		p[i] = (uint8_t)text[i % (sizeof(text) - 1)];
}

/* Steps [from, N_PROMPT) then generates greedily; logits [N_GEN][256]. */
static void run(struct tinylm *m, struct kvtable *t, uint64_t from, float *logits)
{
	uint32_t p[N_PROMPT], tok;

	prompt(p, N_PROMPT);
	for (uint64_t pos = from; pos < N_PROMPT; pos++) {
		assert_int_equal(kvtable_ensure(t, pos), 0);
		assert_int_equal(
			tinylm_step(m, &t->kv, pos, p[pos], pos == N_PROMPT - 1 ? logits : NULL),
			0);
	}
	for (uint32_t j = 1; j < N_GEN; j++) {
		tok = tinylm_argmax(logits + (j - 1) * TINYLM_VOCAB);
		assert_int_equal(kvtable_ensure(t, N_PROMPT + j - 1), 0);
		assert_int_equal(
			tinylm_step(m, &t->kv, N_PROMPT + j - 1, tok, logits + j * TINYLM_VOCAB),
			0);
	}
}

static uint64_t checksum(const struct kvtable *t)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (uint64_t i = 0; i < t->kv.n_pages; i++)
		for (size_t b = 0; b < t->page_bytes; b++)
			h = (h ^ ((const uint8_t *)t->kv.pages[i])[b]) * 0x100000001b3ull;
	return h;
}

static void test_restore_bit_identical(void **state)
{
	static const struct {
		uint32_t dtype, group;
	} fmts[] = {
		{SHM_DTYPE_F16, 0},
		{SHM_DTYPE_BF16, 0},
		{SHM_DTYPE_INT8, 32},
		{SHM_DTYPE_INT4, 16},
	};
	static const uint64_t cuts[] = {0, 37, 48, N_PROMPT - 1};
	struct tinylm_config cfg;
	struct tinylm *m;
	float ref[N_GEN * TINYLM_VOCAB], got[N_GEN * TINYLM_VOCAB];

	tinylm_default_config(&cfg, 7);
	assert_int_equal(tinylm_new(&cfg, &m), 0);
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		struct shm_layout l;
		struct kvtable cache;

		tinylm_layout(m, fmts[f].dtype, fmts[f].group, 16, &l);
		assert_int_equal(shm_layout_check(&l), 0);
		/* the writer: a full run whose pages become the "cache" */
		kvtable_init(&cache, &l);
		run(m, &cache, 0, ref);
		for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
			struct kvtable t;
			uint64_t before = checksum(&cache);
			int copied;

			kvtable_init(&t, &l);
			copied = kvtable_restore(&t, (const void *const *)cache.kv.pages, cuts[c]);
			assert_int_equal(copied, (int)(cuts[c] % 16));
			run(m, &t, cuts[c], got);
			if (memcmp(ref, got, sizeof(ref)) != 0)
				fail_msg("%s, %llu cached tokens: logits differ from the full run",
					 shm_dtype_name(l.dtype), (unsigned long long)cuts[c]);
			kvtable_free(&t);
			assert_true(checksum(&cache) == before);
		}
		kvtable_free(&cache);
	}
	tinylm_free(m);
}

static void test_controls(void **state)
{
	struct tinylm_config cfg;
	struct tinylm *m, *m2;
	struct shm_layout l;
	struct kvtable cache, t;
	float ref[N_GEN * TINYLM_VOCAB], got[N_GEN * TINYLM_VOCAB];
	uint8_t *row;

	tinylm_default_config(&cfg, 7);
	assert_int_equal(tinylm_new(&cfg, &m), 0);
	tinylm_default_config(&cfg, 8);
	assert_int_equal(tinylm_new(&cfg, &m2), 0);
	tinylm_layout(m, SHM_DTYPE_F16, 0, 16, &l);
	kvtable_init(&cache, &l);
	run(m, &cache, 0, ref);

	/* another seed, another model */
	kvtable_init(&t, &l);
	run(m2, &t, 0, got);
	assert_memory_not_equal(ref, got, sizeof(ref));
	kvtable_free(&t);

	/* one flipped bit in a cached K row of layer 2 shows in the logits */
	row = (uint8_t *)cache.kv.pages[0] + shm_kv_offset(&l, 2, 0, 1, 10);
	row[5] ^= 0x10;
	kvtable_init(&t, &l);
	assert_int_equal(kvtable_restore(&t, (const void *const *)cache.kv.pages, 64), 0);
	run(m, &t, 64, got);
	assert_memory_not_equal(ref, got, sizeof(ref));
	kvtable_free(&t);

	kvtable_free(&cache);
	tinylm_free(m);
	tinylm_free(m2);
}

static void test_bad_arguments(void **state)
{
	struct tinylm_config cfg;
	struct tinylm *m;
	struct shm_layout l;
	struct kvtable t;
	float logits[TINYLM_VOCAB];

	tinylm_default_config(&cfg, 1);
	cfg.n_heads = 3; /* not a multiple of the KV heads */
	assert_int_equal(tinylm_new(&cfg, &m), -EINVAL);
	tinylm_default_config(&cfg, 1);
	assert_int_equal(tinylm_new(&cfg, &m), 0);
	tinylm_layout(m, SHM_DTYPE_F16, 0, 16, &l);
	kvtable_init(&t, &l);
	assert_int_equal(kvtable_ensure(&t, 0), 0);
	assert_int_equal(tinylm_step(m, &t.kv, 0, 256, logits), -EINVAL);
	assert_int_equal(tinylm_step(m, &t.kv, 16, 1, logits), -EINVAL); /* no page */
	l.head_dim = 64;
	t.kv.layout = l; /* not this model's layout */
	assert_int_equal(tinylm_step(m, &t.kv, 0, 1, logits), -EINVAL);
	kvtable_free(&t);
	tinylm_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restore_bit_identical),
		cmocka_unit_test(test_controls),
		cmocka_unit_test(test_bad_arguments),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
