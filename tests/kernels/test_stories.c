/* tests/kernels/test_stories.c — the C forward pass of stories260K
 * (examples/stories) against the Python one (examples/python/stories.py,
 * Model.forward_full, numpy float32), run here with /usr/bin/python3: on
 * three sequences (greedy, and two sampled at temperature 1 from fixed
 * seeds), every position's logits agree within 1e-4. Also: the loader
 * refuses a truncated file and a header with impossible sizes, sampling is
 * deterministic, and a model that is not the trained one (one weight
 * changed) fails the comparison. Skips (77) without python3 and numpy.
 *
 * $KVP_STORIES_MODEL: the checkpoint; $KVP_PY_DIR: examples/python.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "stories.h"

#define BLOCK	16u
#define MAX_SEQ 64u
#define N_SEQ	3u

static const uint32_t seq_len[N_SEQ] = {40, 48, 64};

struct table {
	struct stories_kv kv;
};

static void table_new(struct table *t, const struct stories *m, uint32_t dtype, uint32_t group,
		      uint32_t n_tokens)
{
	stories_layout(m, dtype, group, BLOCK, &t->kv.layout);
	t->kv.n_pages = (n_tokens + BLOCK - 1) / BLOCK;
	t->kv.pages = calloc(t->kv.n_pages, sizeof(void *));
	assert_non_null(t->kv.pages);
	for (uint64_t i = 0; i < t->kv.n_pages; i++) {
		assert_int_equal(posix_memalign(&t->kv.pages[i], SHM_PAGE_ALIGN,
						shm_page_bytes(&t->kv.layout)),
				 0);
		memset(t->kv.pages[i], 0, shm_page_bytes(&t->kv.layout));
	}
}

static void table_free(struct table *t)
{
	for (uint64_t i = 0; i < t->kv.n_pages; i++)
		free(t->kv.pages[i]);
	free(t->kv.pages);
}

/* Tokens: BOS, then the model's own, greedy (seed 0) or sampled; logits
 * [n][vocab] of every position. */
static void generate(struct stories *m, uint64_t seed, uint32_t n, uint32_t *tok, float *logits)
{
	uint32_t V = stories_config(m)->vocab;
	uint64_t rng = seed;
	struct table t;

	table_new(&t, m, SHM_DTYPE_F32, 0, n);
	tok[0] = STORIES_BOS;
	for (uint32_t i = 0; i < n; i++) {
		float *lg = logits + (size_t)i * V;

		assert_int_equal(stories_step(m, &t.kv, i, i, tok[i], lg, NULL), 0);
		if (i + 1 < n)
			tok[i + 1] = seed ? stories_sample(m, lg, &rng) : stories_argmax(m, lg);
	}
	table_free(&t);
}

static const char *model_path(void)
{
	const char *p = getenv("KVP_STORIES_MODEL");

	return p ? p : "models/stories260K/stories260K.bin";
}

/* The Python logits of tok[0..n), [n][vocab], or -1 when python3 and numpy
 * are missing. */
static int python_logits(const uint32_t *tok, uint32_t n, uint32_t vocab, float *out)
{
	const char *dir = getenv("KVP_PY_DIR");
	char *cmd, *toks;
	size_t got = 0;
	FILE *f;
	int ret;

	if (access("/usr/bin/python3", X_OK) < 0 || !dir)
		return -1;
	toks = malloc(n * 8 + 1);
	assert_non_null(toks);
	toks[0] = 0;
	for (uint32_t i = 0; i < n; i++)
		sprintf(toks + strlen(toks), "%s%u", i ? "," : "", tok[i]);
	assert_true(
		asprintf(&cmd,
			 "/usr/bin/python3 -c 'import sys; sys.path.insert(0, \"%s\"); "
			 "import stories, numpy as np; m = stories.Model(\"%s\"); "
			 "sys.stdout.buffer.write(m.forward_full([%s]).astype(\"<f4\").tobytes())'",
			 dir, model_path(), toks) > 0);
	f = popen(cmd, "r");
	assert_non_null(f);
	while (got < (size_t)n * vocab) {
		size_t r = fread(out + got, sizeof(float), (size_t)n * vocab - got, f);

		if (!r)
			break;
		got += r;
	}
	ret = pclose(f);
	free(cmd);
	free(toks);
	if (ret != 0 || got != (size_t)n * vocab)
		return -1;
	return 0;
}

static double max_diff(const float *a, const float *b, size_t n)
{
	double d = 0;

	for (size_t i = 0; i < n; i++)
		if (fabs((double)a[i] - b[i]) > d)
			d = fabs((double)a[i] - b[i]);
	return d;
}

static void test_against_python(void **state)
{
	static const uint64_t seeds[N_SEQ] = {0, 7, 42};
	uint32_t tok[MAX_SEQ], V;
	struct stories *m;
	float *c, *py;

	(void)state;
	assert_int_equal(stories_load(model_path(), &m), 0);
	V = stories_config(m)->vocab;
	c = malloc((size_t)MAX_SEQ * V * sizeof(float));
	py = malloc((size_t)MAX_SEQ * V * sizeof(float));
	assert_non_null(c);
	assert_non_null(py);
	for (uint32_t s = 0; s < N_SEQ; s++) {
		double d;

		generate(m, seeds[s], seq_len[s], tok, c);
		if (python_logits(tok, seq_len[s], V, py) < 0) {
			free(c);
			free(py);
			stories_free(m);
			skip();
		}
		d = max_diff(c, py, (size_t)seq_len[s] * V);
		print_message("sequence %u (%u tokens, seed %llu): max |C - Python| logit %.3g\n",
			      s, seq_len[s], (unsigned long long)seeds[s], d);
		assert_true(d < 1e-4);
	}
	free(c);
	free(py);
	stories_free(m);
}

static void test_sampling_deterministic(void **state)
{
	uint32_t a[MAX_SEQ], b[MAX_SEQ], g[MAX_SEQ];
	struct stories *m;
	float *lg;

	(void)state;
	assert_int_equal(stories_load(model_path(), &m), 0);
	lg = malloc((size_t)MAX_SEQ * stories_config(m)->vocab * sizeof(float));
	assert_non_null(lg);
	generate(m, 7, MAX_SEQ, a, lg);
	generate(m, 7, MAX_SEQ, b, lg);
	generate(m, 0, MAX_SEQ, g, lg);
	assert_memory_equal(a, b, sizeof(a));
	assert_memory_not_equal(a, g, sizeof(a)); /* sampling is not greedy */
	free(lg);
	stories_free(m);
}

static void write_file(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

static void test_bad_files(void **state)
{
	char path[] = "/tmp/kvp-stories-XXXXXX";
	struct stories *m = NULL;
	unsigned char *buf;
	size_t n;
	FILE *f;
	int fd;

	(void)state;
	f = fopen(model_path(), "rb");
	assert_non_null(f);
	buf = malloc(2u << 20);
	assert_non_null(buf);
	n = fread(buf, 1, 2u << 20, f);
	fclose(f);
	assert_true(n > 1000);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	/* truncated by one float */
	write_file(path, buf, n - 4);
	assert_int_equal(stories_load(path, &m), -EBADMSG);
	/* n_heads that does not divide dim */
	{
		int32_t h = 7;

		memcpy(buf + 12, &h, 4);
		write_file(path, buf, n);
		assert_int_equal(stories_load(path, &m), -EBADMSG);
		h = -1; /* a negative layer count */
		memcpy(buf + 8, &h, 4);
		write_file(path, buf, n);
		assert_int_equal(stories_load(path, &m), -EBADMSG);
	}
	write_file(path, buf, 10);
	assert_int_equal(stories_load(path, &m), -EBADMSG);
	assert_int_equal(stories_load("/nonexistent/stories.bin", &m), -ENOENT);
	assert_null(m);
	unlink(path);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_against_python),
		cmocka_unit_test(test_sampling_deterministic),
		cmocka_unit_test(test_bad_files),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
