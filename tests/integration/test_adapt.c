/* tests/integration/test_adapt.c — the engine-layout adapters through a
 * real kvpalaced, across processes (issue 18 item 2).
 *
 * Process A appends a prompt of five and a half pages, fills a
 * FlashAttention-layout engine cache ([2, num_blocks, block_size, H, D]
 * per layer) with random K/V in scattered blocks, copies them into its
 * session's pages with one kvp_engine_to_pages (the half page as a
 * partial last page), and commits. A's engine buffer lives in memory
 * shared with the test, which is how its bytes reach the readers.
 * Process B, fresh, matches the prompt (the five full pages), copies the
 * lease's pages into an engine cache of its own in the same layout but
 * other blocks with one kvp_pages_to_engine, and compares every block's
 * bytes with A's; process C does the same into an SGLang layout (K and V
 * token pools) and compares element by element, through each layout's
 * index arithmetic, with A's FlashAttention cache; process D reads only
 * heads [1, 2) of layers [2, 4) (a tensor-parallel rank of a pipeline
 * stage) into a FlashInfer HND cache of 2 layers and 1 head.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	 "adapt-model"
#define N_TOKENS 88 /* 5 pages of 16 and a half */
#define N_PAGES	 6
#define N_FULL	 5
#define NB	 12 /* engine blocks */
#define SEQ	 11

enum { NL = 4, NH = 2, HD = 64, BT = 16 };
static const struct kvp_layout layout = {NL, NH, HD, BT, KVP_DTYPE_F16, 0};

/* FlashAttention's per layer [2, NB, BT, NH, HD], in elements */
#define FA_LAYER ((size_t)2 * NB * BT * NH * HD)
static size_t fa_idx(uint32_t kv, uint32_t b, uint32_t t, uint32_t h, uint32_t c)
{
	return ((((size_t)kv * NB + b) * BT + t) * NH + h) * HD + c;
}

struct shared {
	struct harness *h;
	uint32_t tokens[N_TOKENS];
	uint16_t a_cache[NL][FA_LAYER]; /* A's engine, read by B, C, D */
};

static const int32_t a_ids[N_PAGES] = {7, 2, 9, 0, 11, 4};
static const int32_t b_ids[N_FULL] = {1, 3, 5, 6, 8};

static int open_pool(struct shared *x, kvp_client **c, kvp_pool **p)
{
	int ret = kvp_connect(x->h->sock, c);

	if (ret < 0)
		return ret;
	return harness_pool_open(x->h, *c, MODEL, &layout, p);
}

static int writer(void *arg)
{
	struct shared *x = arg;
	void *bases[N_PAGES], *k[NL];
	struct kvp_engine_cache ec;
	struct kvp_page_view v;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(open_pool(x, &c, &p), 0);
	for (uint32_t l = 0; l < NL; l++) {
		for (size_t i = 0; i < FA_LAYER; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			x->a_cache[l][i] = (uint16_t)(rng >> 48);
		}
		k[l] = x->a_cache[l];
	}
	CHILD_CHECK_EQ(
		kvp_engine_cache_init(&ec, KVP_ENGINE_FLASH_ATTN, NL, k, NULL, NB, BT, NH, HD, 2),
		0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, x->tokens, N_TOKENS), 0);
	for (uint32_t i = 0; i < N_PAGES; i++) {
		CHILD_CHECK_EQ(kvp_session_page(s, i, &v), 0);
		bases[i] = v.base;
	}
	CHILD_CHECK_EQ(v.n_tokens, N_TOKENS - N_FULL * BT);
	CHILD_CHECK_EQ(kvp_engine_to_pages(kvp_pool_layout(p), bases, N_PAGES, v.n_tokens, &ec,
					   a_ids, NULL),
		       0);
	/* the rows went where kvp_session_kv says: one spot check per page */
	for (uint32_t i = 0; i < N_PAGES; i++) {
		uint64_t pos = i * BT + (i == N_PAGES - 1 ? 7 : 13);

		CHILD_CHECK(!memcmp(kvp_session_kv(s, pos, 3, 1, 1),
				    &x->a_cache[3][fa_idx(1, (uint32_t)a_ids[i], pos % BT, 1, 0)],
				    HD * 2));
	}
	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS), 0);
	kvp_disconnect(c);
	return 0;
}

/* The lease's page bases, after a match of the whole prompt. */
static int match(struct shared *x, kvp_client **c, kvp_pool **p, kvp_lease **l, void *bases[N_FULL])
{
	struct kvp_page_view v;

	CHILD_CHECK_EQ(open_pool(x, c, p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(*p, x->tokens, N_TOKENS, l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(*l), N_FULL * BT);
	for (uint32_t i = 0; i < N_FULL; i++) {
		CHILD_CHECK_EQ(kvp_lease_page(*l, i, &v), 0);
		bases[i] = v.base;
	}
	return 0;
}

/* FlashAttention into other blocks: each K and V block is blk contiguous
 * elements, the same bytes as A's block. */
static int reader_fa(void *arg)
{
	struct shared *x = arg;
	const size_t blk = (size_t)BT * NH * HD;
	uint16_t *cache[NL];
	void *bases[N_FULL], *k[NL];
	struct kvp_engine_cache ec;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(match(x, &c, &p, &l, bases), 0);
	for (uint32_t i = 0; i < NL; i++) {
		cache[i] = calloc(FA_LAYER, 2);
		CHILD_CHECK(cache[i]);
		k[i] = cache[i];
	}
	CHILD_CHECK_EQ(
		kvp_engine_cache_init(&ec, KVP_ENGINE_FLASH_ATTN, NL, k, NULL, NB, BT, NH, HD, 2),
		0);
	CHILD_CHECK_EQ(kvp_pages_to_engine(kvp_pool_layout(p), bases, N_FULL, BT, &ec, b_ids, NULL),
		       0);
	for (uint32_t ly = 0; ly < NL; ly++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t i = 0; i < N_FULL; i++)
				CHILD_CHECK(!memcmp(
					&cache[ly][fa_idx(kv, (uint32_t)b_ids[i], 0, 0, 0)],
					&x->a_cache[ly][fa_idx(kv, (uint32_t)a_ids[i], 0, 0, 0)],
					blk * 2));
	for (uint32_t i = 0; i < NL; i++)
		free(cache[i]);
	kvp_lease_release(l);
	kvp_disconnect(c);
	return 0;
}

/* SGLang pools [NB * BT, NH, HD], page i into block i + 2 (slots
 * (i + 2) * BT ..), compared element by element with A's FlashAttention
 * cache. */
static int reader_sglang(void *arg)
{
	struct shared *x = arg;
	const size_t pool = (size_t)NB * BT * NH * HD;
	uint16_t *kp[NL], *vp[NL];
	void *bases[N_FULL], *k[NL], *v[NL];
	int32_t ids[N_FULL];
	struct kvp_engine_cache ec;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(match(x, &c, &p, &l, bases), 0);
	for (uint32_t i = 0; i < NL; i++) {
		k[i] = kp[i] = calloc(pool, 2);
		v[i] = vp[i] = calloc(pool, 2);
		CHILD_CHECK(kp[i] && vp[i]);
	}
	for (uint32_t i = 0; i < N_FULL; i++)
		ids[i] = (int32_t)i + 2;
	CHILD_CHECK_EQ(kvp_engine_cache_init(&ec, KVP_ENGINE_SGLANG, NL, k, v, NB, BT, NH, HD, 2),
		       0);
	CHILD_CHECK_EQ(kvp_pages_to_engine(kvp_pool_layout(p), bases, N_FULL, BT, &ec, ids, NULL),
		       0);
	for (uint32_t ly = 0; ly < NL; ly++)
		for (uint32_t i = 0; i < N_FULL; i++)
			for (uint32_t t = 0; t < BT; t++)
				for (uint32_t h = 0; h < NH; h++)
					for (uint32_t e = 0; e < HD; e++) {
						size_t s =
							((size_t)(ids[i] * BT + t) * NH + h) * HD +
							e;

						CHILD_CHECK_EQ(
							kp[ly][s],
							x->a_cache[ly][fa_idx(0, (uint32_t)a_ids[i],
									      t, h, e)]);
						CHILD_CHECK_EQ(
							vp[ly][s],
							x->a_cache[ly][fa_idx(1, (uint32_t)a_ids[i],
									      t, h, e)]);
					}
	for (uint32_t i = 0; i < NL; i++) {
		free(kp[i]);
		free(vp[i]);
	}
	kvp_lease_release(l);
	kvp_disconnect(c);
	return 0;
}

/* Heads [1, 2) of layers [2, 4) into a FlashInfer HND cache of 2 layers
 * of 1 head, [NB, 2, 1, BT, HD] per layer, blocks as A's. */
static int reader_rank(void *arg)
{
	struct shared *x = arg;
	const struct kvp_adapt_range r = {
		.layer_first = 2, .n_layers = 2, .head_first = 1, .n_heads = 1};
	const size_t layer_elems = (size_t)NB * 2 * BT * HD;
	uint16_t *cache[2];
	void *bases[N_FULL], *k[2];
	struct kvp_engine_cache ec;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(match(x, &c, &p, &l, bases), 0);
	for (uint32_t i = 0; i < 2; i++) {
		k[i] = cache[i] = calloc(layer_elems, 2);
		CHILD_CHECK(cache[i]);
	}
	CHILD_CHECK_EQ(
		kvp_engine_cache_init(&ec, KVP_ENGINE_FLASHINFER_HND, 2, k, NULL, NB, BT, 1, HD, 2),
		0);
	CHILD_CHECK_EQ(kvp_pages_to_engine(kvp_pool_layout(p), bases, N_FULL, BT, &ec, a_ids, NULL),
		       -EINVAL);
	CHILD_CHECK_EQ(kvp_pages_to_engine(kvp_pool_layout(p), bases, N_FULL, BT, &ec, a_ids, &r),
		       0);
	for (uint32_t ly = 0; ly < 2; ly++)
		for (uint32_t i = 0; i < N_FULL; i++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t t = 0; t < BT; t++)
					for (uint32_t e = 0; e < HD; e++) {
						size_t s = (((size_t)a_ids[i] * 2 + kv) * BT + t) *
								   HD +
							   e;

						CHILD_CHECK_EQ(
							cache[ly][s],
							x->a_cache[2 + ly][fa_idx(
								kv, (uint32_t)a_ids[i], t, 1, e)]);
					}
	for (uint32_t i = 0; i < 2; i++)
		free(cache[i]);
	kvp_lease_release(l);
	kvp_disconnect(c);
	return 0;
}

static void test_cross_process(void **state)
{
	struct shared *x =
		mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(x != MAP_FAILED);
	x->h = *state;
	harness_tokens(x->tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, x), 0);
	assert_int_equal(harness_run_child(reader_fa, x), 0);
	assert_int_equal(harness_run_child(reader_sglang, x), 0);
	assert_int_equal(harness_run_child(reader_rank, x), 0);
	munmap(x, sizeof(*x));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_cross_process, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("adapt", tests, NULL, NULL);
}
