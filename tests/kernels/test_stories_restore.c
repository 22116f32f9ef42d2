/* tests/kernels/test_stories_restore.c — restore equals recompute for the
 * trained stories260K model, bit for bit, through a real kvpalaced: this
 * process prefills a prompt the model wrote (BOS, then 99 tokens sampled
 * at temperature 1) straight into a session's pages and commits it; a
 * child process, on its own connection, matches the prompt's prefix at
 * every kind of cut (nothing, less than a page, a page boundary, all but
 * the last prompt token), maps the leased pages as they are, computes the
 * rest of the prompt and generates greedily; its logits must equal those
 * of a full recompute on private pages, for f16 and int8 pools. Negative
 * control: one flipped byte in a copy of a cached page changes the logits.
 *
 * $KVPALACED: the daemon; $KVP_STORIES_MODEL: the checkpoint.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "stories.h"

#define BT	  16u
#define N_PROMPT  100u
#define N_GEN	  4u
#define MAX_PAGES ((N_PROMPT + N_GEN + BT - 1) / BT)

static struct stories *model;
static uint32_t prompt[N_PROMPT];

static const char *model_path(void)
{
	const char *p = getenv("KVP_STORIES_MODEL");

	return p ? p : "models/stories260K/stories260K.bin";
}

static void *page_new(const struct shm_layout *l)
{
	void *p = NULL;

	if (posix_memalign(&p, SHM_PAGE_ALIGN, shm_page_bytes(l)))
		return NULL;
	memset(p, 0, shm_page_bytes(l));
	return p;
}

/* Steps positions [from, N_PROMPT) over kv (slots [0, from) hold the
 * restored prefix), then generates greedily; logits [N_GEN][vocab]: the
 * last prompt position's and the generated tokens'. Pages at index >=
 * from / BT that are NULL are made private (freed by the caller via
 * owned). Returns 0 or a negative errno. */
static int run(struct stories_kv *kv, void **owned, uint64_t from, float *logits)
{
	uint32_t V = stories_config(model)->vocab, tok;
	int ret;

	for (uint64_t i = 0; i < kv->n_pages; i++)
		if (!kv->pages[i]) {
			kv->pages[i] = owned[i] = page_new(&kv->layout);
			if (!kv->pages[i])
				return -ENOMEM;
		}
	for (uint64_t pos = from; pos < N_PROMPT; pos++) {
		ret = stories_step(model, kv, pos, (uint32_t)pos, prompt[pos],
				   pos == N_PROMPT - 1 ? logits : NULL, NULL);
		if (ret < 0)
			return ret;
	}
	for (uint32_t j = 1; j < N_GEN; j++) {
		tok = stories_argmax(model, logits + (size_t)(j - 1) * V);
		ret = stories_step(model, kv, N_PROMPT + j - 1, N_PROMPT + j - 1, tok,
				   logits + (size_t)j * V, NULL);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* The full recompute: private pages only. */
static void recompute(const struct shm_layout *l, float *logits)
{
	void *pages[MAX_PAGES] = {0}, *owned[MAX_PAGES] = {0};
	struct stories_kv kv = {*l, pages, MAX_PAGES};

	assert_int_equal(run(&kv, owned, 0, logits), 0);
	for (uint32_t i = 0; i < MAX_PAGES; i++)
		free(owned[i]);
}

static void make_prompt(void)
{
	uint32_t V = stories_config(model)->vocab;
	struct shm_layout l;
	void *pages[MAX_PAGES] = {0}, *owned[MAX_PAGES] = {0};
	struct stories_kv kv;
	float *lg = malloc(V * sizeof(float));
	uint64_t rng = 2024;

	assert_non_null(lg);
	stories_layout(model, SHM_DTYPE_F32, 0, BT, &l);
	kv = (struct stories_kv){l, pages, MAX_PAGES};
	for (uint32_t i = 0; i < MAX_PAGES; i++)
		pages[i] = owned[i] = page_new(&l);
	prompt[0] = STORIES_BOS;
	for (uint32_t i = 0; i + 1 < N_PROMPT; i++) {
		assert_int_equal(stories_step(model, &kv, i, i, prompt[i], lg, NULL), 0);
		prompt[i + 1] = stories_sample(model, lg, &rng);
	}
	for (uint32_t i = 0; i < MAX_PAGES; i++)
		free(owned[i]);
	free(lg);
}

/* The child: matches prompt[0..cut) on its own connection, maps the
 * leased pages, computes the rest; logits into out. flip: corrupt one
 * byte of a copy of the first leased page. */
static int reader(struct harness *h, const struct shm_layout *l, const char *name, uint64_t cut,
		  int flip, float *out, uint64_t *ret_hit)
{
	struct kvp_layout kl = {l->n_layers,	 l->n_kv_heads, l->head_dim,
				l->block_tokens, l->dtype,	l->quant_group};
	void *pages[MAX_PAGES] = {0}, *owned[MAX_PAGES] = {0};
	struct stories_kv kv = {*l, pages, MAX_PAGES};
	kvp_lease *lease = NULL;
	kvp_client *c;
	kvp_pool *p;
	uint64_t m;

	CHILD_CHECK(kvp_connect(h->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, name, &kl, &p) == 0);
	CHILD_CHECK(kvp_match_prefix(p, prompt, cut, &lease) == 0);
	m = kvp_lease_tokens(lease);
	CHILD_CHECK(m % BT == 0 && m <= cut);
	for (uint64_t i = 0; i < m / BT; i++) {
		pages[i] = (void *)kvp_lease_kv(lease, i * BT, 0, 0, 0);
		CHILD_CHECK(pages[i] != NULL);
	}
	if (flip && m) {
		pages[0] = owned[0] = page_new(l);
		CHILD_CHECK(pages[0] != NULL);
		memcpy(pages[0], kvp_lease_kv(lease, 0, 0, 0, 0), shm_page_bytes(l));
		((uint8_t *)pages[0])[shm_kv_offset(l, 1, 0, 0, 3)] ^= 0x40;
	}
	CHILD_CHECK(run(&kv, owned, m, out) == 0);
	*ret_hit = m;
	CHILD_CHECK(kvp_lease_release(lease) == 0);
	kvp_pool_close(p);
	kvp_disconnect(c);
	for (uint32_t i = 0; i < MAX_PAGES; i++)
		free(owned[i]);
	return 0;
}

/* Runs reader in a child process; its logits come back through shared
 * memory. Returns the tokens it restored. */
static uint64_t restore(struct harness *h, const struct shm_layout *l, const char *name,
			uint64_t cut, int flip, float *logits)
{
	size_t bytes = (size_t)N_GEN * stories_config(model)->vocab * sizeof(float) + 64;
	uint8_t *shared =
		mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t hit;
	int status;
	pid_t pid;

	assert_true(shared != MAP_FAILED);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(reader(h, l, name, cut, flip, (float *)(void *)(shared + 64),
			     (uint64_t *)(void *)shared));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	memcpy(&hit, shared, sizeof(hit));
	memcpy(logits, shared + 64, bytes - 64);
	munmap(shared, bytes);
	return hit;
}

/* This process prefills the prompt straight into a session's pages. */
static void prefill(kvp_client *c, const struct shm_layout *l, const char *name)
{
	struct kvp_layout kl = {l->n_layers,	 l->n_kv_heads, l->head_dim,
				l->block_tokens, l->dtype,	l->quant_group};
	void *pages[MAX_PAGES] = {0}, *owned[MAX_PAGES] = {0};
	struct stories_kv kv = {*l, pages, (N_PROMPT + BT - 1) / BT};
	kvp_session *s;
	kvp_pool *p;

	assert_int_equal(kvp_pool_open(c, name, &kl, &p), 0);
	assert_int_equal(kvp_session_create_persistent(p, &s), 0);
	assert_int_equal(kvp_append(s, prompt, N_PROMPT), 0);
	for (uint32_t i = 0; i < kv.n_pages; i++) {
		pages[i] = kvp_session_kv(s, (uint64_t)i * BT, 0, 0, 0);
		assert_non_null(pages[i]);
	}
	for (uint32_t pos = 0; pos < N_PROMPT; pos++)
		assert_int_equal(stories_step(model, &kv, pos, pos, prompt[pos], NULL, NULL), 0);
	assert_int_equal(kvp_commit(s, N_PROMPT), 0);
	(void)owned;
	kvp_session_close(s);
	kvp_pool_close(p);
}

static void check_dtype(void **state, uint32_t dtype, const char *name)
{
	static const uint64_t cuts[] = {1, 10, 48, N_PROMPT - 1};
	struct harness *h = *state;
	size_t n = (size_t)N_GEN * stories_config(model)->vocab;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	struct shm_layout l;
	kvp_client *c;

	assert_non_null(want);
	assert_non_null(got);
	stories_layout(model, dtype, shm_dtype_quantized(dtype) ? 8 : 0, BT, &l);
	recompute(&l, want);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	prefill(c, &l, name);
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		uint64_t hit = restore(h, &l, name, cuts[i], 0, got);

		assert_int_equal(hit, cuts[i] / BT * BT);
		assert_memory_equal(got, want, n * sizeof(float));
	}
	/* the comparison has teeth */
	assert_int_equal(restore(h, &l, name, N_PROMPT - 1, 1, got), (N_PROMPT - 1) / BT * BT);
	assert_memory_not_equal(got, want, n * sizeof(float));
	kvp_disconnect(c);
	free(want);
	free(got);
}

static void test_f16(void **state)
{
	check_dtype(state, SHM_DTYPE_F16, "stories260K-f16");
}

static void test_int8(void **state)
{
	check_dtype(state, SHM_DTYPE_INT8, "stories260K-int8");
}

static int group_setup(void **state)
{
	(void)state;
	if (stories_load(model_path(), &model) < 0)
		return -1;
	make_prompt();
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	stories_free(model);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_f16, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_int8, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
