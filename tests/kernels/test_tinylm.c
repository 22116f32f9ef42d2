/* tests/kernels/test_tinylm.c — tinylm through a real kvpalaced: one
 * process (kvp-tinylm write) prefills a prompt into kvpalace pages and
 * commits it, another (kvp-tinylm read --verify) matches the prefix,
 * restores it from the leased pages and continues decoding. The logits of
 * both, saved with --logits-out, must equal bit for bit those this test
 * computes itself with the tinylm library and private pages (a full
 * recompute), and the reader must report a cache hit and its own
 * successful verification. Also a second writer of the same prompt (whose
 * pages the daemon may deduplicate at commit), a follow-up turn (a longer
 * prompt that extends the cached one), a quantized pool, and a miss
 * (another seed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "kvtable.h"
#include "tinylm.h"

#define N_GEN 5u

static char out[1 << 16];

/* The tests' prompts: the first n bytes of this text, repeated (passed to
 * kvp-tinylm with --prompt; bytes are tokens). */
static const char text[] =
	"kvpalace keeps the attention keys and values of one process for the next one; "
	"tinylm checks that what comes back is exactly what went in. ";

static void make_prompt(char *buf, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = text[i % (sizeof(text) - 1)];
	buf[n] = '\0';
}

/* The full recompute: logits [N_GEN][256] of the prompt, greedy decoding. */
static void reference(uint64_t seed, uint32_t dtype, uint32_t group, const char *prompt,
		      float *logits)
{
	struct tinylm_config cfg;
	struct tinylm *m;
	struct shm_layout l;
	struct kvtable t;
	size_t n = strlen(prompt);

	tinylm_default_config(&cfg, seed);
	assert_int_equal(tinylm_new(&cfg, &m), 0);
	tinylm_layout(m, dtype, group, 16, &l);
	kvtable_init(&t, &l);
	for (uint64_t pos = 0; pos < n; pos++) {
		assert_int_equal(kvtable_ensure(&t, pos), 0);
		assert_int_equal(tinylm_step(m, &t.kv, pos, (uint8_t)prompt[pos],
					     pos == n - 1 ? logits : NULL),
				 0);
	}
	for (uint32_t j = 1; j < N_GEN; j++) {
		assert_int_equal(kvtable_ensure(&t, n + j - 1), 0);
		assert_int_equal(tinylm_step(m, &t.kv, n + j - 1,
					     tinylm_argmax(logits + (j - 1) * TINYLM_VOCAB),
					     logits + j * TINYLM_VOCAB),
				 0);
	}
	kvtable_free(&t);
	tinylm_free(m);
}

/* Runs kvp-tinylm MODE against the harness's daemon; returns its status,
 * its output in out, its logits in logits. */
static int tinylm(struct harness *h, const char *mode, const char *prompt, const char *dtype,
		  const char *seed, float *logits)
{
	const char *bin = getenv("KVP_TINYLM");
	char file[160], gen[16];
	char *argv[20];
	int argc = 0, ret;
	FILE *f;

	assert_non_null(bin);
	snprintf(file, sizeof(file), "%s/logits-%d.bin", h->dir, (int)getpid());
	snprintf(gen, sizeof(gen), "%u", N_GEN);
	argv[argc++] = (char *)bin;
	argv[argc++] = "--socket";
	argv[argc++] = h->sock;
	argv[argc++] = "--prompt";
	argv[argc++] = (char *)prompt;
	argv[argc++] = "--generate";
	argv[argc++] = gen;
	argv[argc++] = "--dtype";
	argv[argc++] = (char *)dtype;
	argv[argc++] = "--seed";
	argv[argc++] = (char *)seed;
	argv[argc++] = "--logits-out";
	argv[argc++] = file;
	if (strcmp(mode, "read") == 0)
		argv[argc++] = "--verify";
	argv[argc++] = (char *)mode;
	argv[argc] = NULL;
	ret = harness_run_capture(argv, NULL, out, sizeof(out));
	if (ret == 0) {
		f = fopen(file, "rb");
		assert_non_null(f);
		assert_int_equal(fread(logits, sizeof(float), N_GEN * TINYLM_VOCAB, f),
				 N_GEN * TINYLM_VOCAB);
		fclose(f);
		unlink(file);
	}
	return ret;
}

/* The number after "cache hit of " in out, or -1. */
static long cache_hit(void)
{
	const char *p = strstr(out, "cache hit of ");

	return p ? strtol(p + strlen("cache hit of "), NULL, 10) : -1;
}

static void check(struct harness *h, const char *mode, const char *prompt, const char *dtype,
		  uint32_t dt, uint32_t group, const char *seed)
{
	float got[N_GEN * TINYLM_VOCAB], want[N_GEN * TINYLM_VOCAB];
	int ret = tinylm(h, mode, prompt, dtype, seed, got);

	if (ret != 0)
		fail_msg("kvp-tinylm %s exited %d:\n%s", mode, ret, out);
	reference(strtoull(seed, NULL, 10), dt, group, prompt, want);
	if (memcmp(got, want, sizeof(got)) != 0)
		fail_msg("kvp-tinylm %s: logits differ from the full recompute:\n%s", mode, out);
	if (strcmp(mode, "read") == 0 && !strstr(out, "bit-identical to a full recompute: yes"))
		fail_msg("the reader's own check failed:\n%s", out);
}

static void test_write_then_read(void **state)
{
	struct harness *h = *state;
	char p200[201], p260[261];

	make_prompt(p200, 200);
	make_prompt(p260, 260);
	check(h, "write", p200, "f16", SHM_DTYPE_F16, 0, "3");
	/* a second writer of the same prompt: its commits may swap its full
	 * pages for the first writer's identical ones (dedup) mid-decode */
	check(h, "write", p200, "f16", SHM_DTYPE_F16, 0, "3");
	/* the same prompt: everything but the last token's page comes back */
	check(h, "read", p200, "f16", SHM_DTYPE_F16, 0, "3");
	if (cache_hit() < 192)
		fail_msg("expected a cache hit of at least 192 tokens:\n%s", out);
	/* a follow-up turn: a longer prompt that starts with the cached one */
	check(h, "read", p260, "f16", SHM_DTYPE_F16, 0, "3");
	if (cache_hit() < 192)
		fail_msg("expected a cache hit of at least 192 tokens:\n%s", out);
	/* another seed is another model id, another pool: a miss */
	check(h, "read", p200, "f16", SHM_DTYPE_F16, 0, "4");
	if (cache_hit() != 0)
		fail_msg("expected a miss:\n%s", out);
}

static void test_quantized_pool(void **state)
{
	struct harness *h = *state;
	char p150[151];

	make_prompt(p150, 150);
	check(h, "write", p150, "int8", SHM_DTYPE_INT8, 32, "5");
	check(h, "read", p150, "int8", SHM_DTYPE_INT8, 32, "5");
	if (cache_hit() < 144)
		fail_msg("expected a cache hit of at least 144 tokens:\n%s", out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_write_then_read, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_quantized_pool, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
