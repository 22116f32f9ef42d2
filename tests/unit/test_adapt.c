/* tests/unit/test_adapt.c — the engine-layout adapters of libkvpalace
 * (kvp_engine_cache_init, kvp_pages_to_engine, kvp_engine_to_pages; the C
 * reference kernels/ref/adapt.c behind them), without a daemon: pages are
 * heap buffers in kvpalace's page layout.
 *
 * For each named layout (FlashAttention, FlashInfer NHD and HND, SGLang)
 * the engine's index arithmetic is written out here, independently of the
 * library: every element of every copied page lands where that
 * arithmetic puts it, nothing else of the engine changes, one element
 * computed by hand lands at its hand-computed offset, and pages → engine
 * → pages gives the pages back. Then a partial last page, a head and
 * layer range (a tensor-parallel rank), and every error, each checked to
 * write nothing. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvpalace.h"

/* 3 layers, 4 KV heads, head_dim 8, 4 tokens per page, f16 (2 bytes) */
enum { NL = 3, NH = 4, HD = 8, BT = 4, NB = 6, NP = 3 };
static const struct kvp_layout layout = {NL, NH, HD, BT, KVP_DTYPE_F16, 0};
static const int32_t ids[NP] = {4, 0, 2};
#define UNTOUCHED 0xaaaau

static const uint32_t kinds[] = {KVP_ENGINE_FLASH_ATTN, KVP_ENGINE_FLASHINFER_NHD,
				 KVP_ENGINE_FLASHINFER_HND, KVP_ENGINE_SGLANG};

/* Element of kvpalace page: data[layer][kv][head][token][head_dim]. */
static size_t page_idx(uint32_t layer, uint32_t kv, uint32_t h, uint32_t t, uint32_t c)
{
	return ((((size_t)layer * 2 + kv) * NH + h) * BT + t) * HD + c;
}

/* The engines' layouts, per layer, for an engine of nh heads: the element
 * index in layer buffer `kv` (FlashAttention, FlashInfer: one buffer for K
 * and V, kv is part of the index; SGLang: a K pool and a V pool). */
static size_t engine_idx(uint32_t kind, uint32_t nh, uint32_t kv, uint32_t b, uint32_t t,
			 uint32_t h, uint32_t c)
{
	switch (kind) {
	case KVP_ENGINE_FLASH_ATTN: /* [2, num_blocks, bs, H, D] */
		return ((((size_t)kv * NB + b) * BT + t) * nh + h) * HD + c;
	case KVP_ENGINE_FLASHINFER_NHD: /* [num_blocks, 2, bs, H, D] */
		return ((((size_t)b * 2 + kv) * BT + t) * nh + h) * HD + c;
	case KVP_ENGINE_FLASHINFER_HND: /* [num_blocks, 2, H, bs, D] */
		return ((((size_t)b * 2 + kv) * nh + h) * BT + t) * HD + c;
	default: /* SGLang: pool [num_blocks * bs, H, D], block b = slots b*bs.. */
		return (((size_t)b * BT + t) * nh + h) * HD + c;
	}
}

/* An engine's buffers: per layer one (K and V) or two (SGLang) tensors. */
struct eng {
	uint32_t kind, n_layers, nh;
	size_t layer_elems; /* elements of one buffer */
	uint16_t *buf[NL][2];
	void *k[NL], *v[NL];
	struct kvp_engine_cache c;
};

static void eng_new(struct eng *e, uint32_t kind, uint32_t n_layers, uint32_t nh)
{
	int split = kind == KVP_ENGINE_SGLANG;

	memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->n_layers = n_layers;
	e->nh = nh;
	e->layer_elems = (size_t)NB * BT * nh * HD * (split ? 1 : 2);
	for (uint32_t l = 0; l < n_layers; l++)
		for (int kv = 0; kv < 1 + split; kv++) {
			e->buf[l][kv] = malloc(e->layer_elems * 2);
			assert_non_null(e->buf[l][kv]);
			for (size_t i = 0; i < e->layer_elems; i++)
				e->buf[l][kv][i] = UNTOUCHED;
			if (kv)
				e->v[l] = e->buf[l][kv];
			else
				e->k[l] = e->buf[l][kv];
		}
	assert_int_equal(kvp_engine_cache_init(&e->c, kind, n_layers, e->k, split ? e->v : NULL, NB,
					       BT, nh, HD, 2),
			 0);
}

static void eng_free(struct eng *e)
{
	for (uint32_t l = 0; l < NL; l++)
		for (int kv = 0; kv < 2; kv++)
			free(e->buf[l][kv]);
}

/* Element (layer, kv, block, token, head, c) of the engine. */
static uint16_t *eng_at(struct eng *e, uint32_t l, uint32_t kv, uint32_t b, uint32_t t, uint32_t h,
			uint32_t c)
{
	int split = e->kind == KVP_ENGINE_SGLANG;

	return &e->buf[l][split ? kv : 0][engine_idx(e->kind, e->nh, split ? 0 : kv, b, t, h, c)];
}

static const size_t page_elems = (size_t)NL * 2 * NH * BT * HD;

static uint16_t val(uint32_t p, size_t i)
{
	return (uint16_t)(1 + (p * 7919u + i * 31u) % 60000u);
}

static void pages_new(uint16_t *pg[NP], void *bases[NP])
{
	for (uint32_t p = 0; p < NP; p++) {
		pg[p] = malloc(page_elems * 2);
		assert_non_null(pg[p]);
		for (size_t i = 0; i < page_elems; i++)
			pg[p][i] = val(p, i);
		bases[p] = pg[p];
	}
}

static void pages_free(uint16_t *pg[NP])
{
	for (uint32_t p = 0; p < NP; p++)
		free(pg[p]);
}

/* 1 when block b is block_ids[p] for some copied page p (then *ret_p). */
static int block_page(uint32_t b, uint32_t *ret_p)
{
	for (uint32_t p = 0; p < NP; p++)
		if ((uint32_t)ids[p] == b) {
			*ret_p = p;
			return 1;
		}
	return 0;
}

/* Every engine element holds what the layout arithmetic says: the page's
 * value for copied (page, layer, kv, head, token) of the range, else
 * UNTOUCHED. */
static void check_engine(struct eng *e, uint32_t last_tokens, const struct kvp_adapt_range *r)
{
	for (uint32_t el = 0; el < e->n_layers; el++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t b = 0; b < NB; b++)
				for (uint32_t t = 0; t < BT; t++)
					for (uint32_t eh = 0; eh < e->nh; eh++)
						for (uint32_t c = 0; c < HD; c++) {
							uint32_t p, pl = el, ph = eh;
							uint16_t want = UNTOUCHED;
							int in = block_page(b, &p);

							if (r) {
								in = in &&
								     el >= r->engine_layer_first &&
								     el < r->engine_layer_first +
										     r->n_layers &&
								     eh >= r->engine_head_first &&
								     eh < r->engine_head_first +
										     r->n_heads;
								pl = el - r->engine_layer_first +
								     r->layer_first;
								ph = eh - r->engine_head_first +
								     r->head_first;
							}
							if (in && p == NP - 1 && t >= last_tokens)
								in = 0;
							if (in)
								want = val(p, page_idx(pl, kv, ph,
										       t, c));
							if (*eng_at(e, el, kv, b, t, eh, c) != want)
								fail_msg("kind %u layer %u kv %u "
									 "block %u token "
									 "%u head %u c %u: %#x, "
									 "want %#x",
									 e->kind, el, kv, b, t, eh,
									 c,
									 *eng_at(e, el, kv, b, t,
										 eh, c),
									 want);
						}
}

static void test_layouts(void **state)
{
	/* Page 0 (-> block 4), layer 1, V, head 2, token 3, element 5, by hand:
	 * page: (((1*2+1)*4+2)*4+3)*8+5 = 477; engine, layer 1's buffer:
	 * FA ((((1*6+4)*4+3)*4+2)*8+5 = 1397, NHD (((4*2+1)*4+3)*4+2)*8+5 =
	 * 1269, HND (((4*2+1)*4+2)*4+3)*8+5 = 1245, SGLang V pool
	 * ((4*4+3)*4+2)*8+5 = 629. */
	static const size_t hand[] = {1397, 1269, 1245, 629};

	(void)state;
	for (size_t k = 0; k < 4; k++) {
		uint16_t *pg[NP], *orig[NP];
		void *bases[NP];
		struct eng e;

		eng_new(&e, kinds[k], NL, NH);
		pages_new(pg, bases);
		pages_new(orig, (void *[NP]){0});
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &e.c, ids, NULL), 0);
		check_engine(&e, BT, NULL);
		assert_int_equal(e.buf[1][kinds[k] == KVP_ENGINE_SGLANG][hand[k]], pg[0][477]);

		/* back: a fresh set of pages gets the originals again */
		for (uint32_t p = 0; p < NP; p++)
			memset(pg[p], 0, page_elems * 2);
		assert_int_equal(kvp_engine_to_pages(&layout, bases, NP, BT, &e.c, ids, NULL), 0);
		for (uint32_t p = 0; p < NP; p++)
			assert_memory_equal(pg[p], orig[p], page_elems * 2);
		pages_free(orig);
		pages_free(pg);
		eng_free(&e);
	}
}

/* The last page holds 2 of its 4 tokens: its other rows stay untouched on
 * both sides. */
static void test_partial(void **state)
{
	(void)state;
	for (size_t k = 0; k < 4; k++) {
		uint16_t *pg[NP];
		void *bases[NP];
		struct eng e;

		eng_new(&e, kinds[k], NL, NH);
		pages_new(pg, bases);
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, 2, &e.c, ids, NULL), 0);
		check_engine(&e, 2, NULL);
		memset(pg[NP - 1], 0x55, page_elems * 2);
		assert_int_equal(kvp_engine_to_pages(&layout, bases, NP, 2, &e.c, ids, NULL), 0);
		for (uint32_t l = 0; l < NL; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < NH; h++)
					for (uint32_t t = 0; t < BT; t++)
						for (uint32_t c = 0; c < HD; c++) {
							size_t i = page_idx(l, kv, h, t, c);

							assert_int_equal(pg[NP - 1][i],
									 t < 2 ? val(NP - 1, i)
									       : 0x5555);
						}
		pages_free(pg);
		eng_free(&e);
	}
}

/* A tensor-parallel rank with heads 2..3 of the pages' 4, and a pipeline
 * stage with layers 1..2 of 3: its engine has 2 layers of 2 heads. */
static void test_range(void **state)
{
	const struct kvp_adapt_range r = {
		.layer_first = 1, .n_layers = 2, .head_first = 2, .n_heads = 2};
	const struct kvp_adapt_range r2 = {.layer_first = 0,
					   .n_layers = 1,
					   .head_first = 1,
					   .n_heads = 1,
					   .engine_layer_first = 1,
					   .engine_head_first = 1};

	(void)state;
	for (size_t k = 0; k < 4; k++) {
		uint16_t *pg[NP], *orig[NP];
		void *bases[NP];
		struct eng e;

		eng_new(&e, kinds[k], 2, 2);
		pages_new(pg, bases);
		pages_new(orig, (void *[NP]){0});
		/* without a range the head and layer counts must agree */
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &e.c, ids, NULL),
				 -EINVAL);
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, 3, &e.c, ids, &r), 0);
		check_engine(&e, 3, &r);
		/* back into zeroed pages: exactly the range's rows come back */
		for (uint32_t p = 0; p < NP; p++)
			memset(pg[p], 0, page_elems * 2);
		assert_int_equal(kvp_engine_to_pages(&layout, bases, NP, 3, &e.c, ids, &r), 0);
		for (uint32_t p = 0; p < NP; p++)
			for (uint32_t l = 0; l < NL; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < NH; h++)
						for (uint32_t t = 0; t < BT; t++)
							for (uint32_t c = 0; c < HD; c++) {
								size_t i = page_idx(l, kv, h, t, c);
								int in = l >= 1 && h >= 2 &&
									 (p < NP - 1 || t < 3);

								assert_int_equal(pg[p][i],
										 in ? orig[p][i]
										    : 0);
							}
		pages_free(pg);
		pages_new(pg, bases);
		eng_free(&e);
		/* offsets on the engine side too */
		eng_new(&e, kinds[k], 2, 2);
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &e.c, ids, &r2), 0);
		check_engine(&e, BT, &r2);
		pages_free(orig);
		pages_free(pg);
		eng_free(&e);
	}
}

/* A latent cache (one "head" of width 8, f32): a layout like any other. */
static void test_latent_f32(void **state)
{
	const struct kvp_layout l = {2, 1, 8, 4, KVP_DTYPE_F32, 0};
	float pg[2 * 2 * 4 * 8], back[2 * 2 * 4 * 8], kbuf[2][2 * 3 * 4 * 8];
	void *bases[1] = {pg}, *k[2] = {kbuf[0], kbuf[1]};
	const int32_t bid[1] = {1};
	struct kvp_engine_cache c;

	(void)state;
	for (size_t i = 0; i < sizeof(pg) / sizeof(pg[0]); i++)
		pg[i] = (float)i + 0.5f;
	memset(kbuf, 0, sizeof(kbuf));
	assert_int_equal(
		kvp_engine_cache_init(&c, KVP_ENGINE_FLASH_ATTN, 2, k, NULL, 3, 4, 1, 8, 4), 0);
	assert_int_equal(kvp_pages_to_engine(&l, bases, 1, 4, &c, bid, NULL), 0);
	/* layer 1, V, token 2, element 3: page ((1*2+1)*4+2)*8+3 = 115,
	 * engine [2, 3, 4, 1, 8]: ((1*3+1)*4+2)*8+3 = 147 */
	assert_true(kbuf[1][147] == pg[115]);
	bases[0] = back;
	assert_int_equal(kvp_engine_to_pages(&l, bases, 1, 4, &c, bid, NULL), 0);
	assert_memory_equal(back, pg, sizeof(pg));
}

/* The latent format (MLA): one plane per layer, data[layer][token][D]. An
 * engine's latent cache is one tensor per layer, [num_blocks, bs, D]
 * (strides given); no V is read or written: a V past the tensor would run
 * off its end (a guard block after it stays untouched). */
static void test_latent_format(void **state)
{
	const struct kvp_layout l = {.n_layers = 2,
				     .n_kv_heads = 1,
				     .head_dim = 8,
				     .block_tokens = 4,
				     .dtype = KVP_DTYPE_BF16,
				     .format = KVP_FORMAT_LATENT};
	const struct kvp_layout two = {.n_layers = 2,
				       .n_kv_heads = 2,
				       .head_dim = 8,
				       .block_tokens = 4,
				       .dtype = KVP_DTYPE_BF16,
				       .format = KVP_FORMAT_LATENT};
	uint16_t pg[2][2 * 4 * 8], back[2][2 * 4 * 8], eng[2][(3 + 1) * 4 * 8];
	void *bases[2] = {pg[0], pg[1]}, *k[2] = {eng[0], eng[1]};
	const int32_t bid[2] = {2, 0};
	struct kvp_engine_cache c = {.n_layers = 2,
				     .num_blocks = 3,
				     .block_size = 4,
				     .n_heads = 1,
				     .head_dim = 8,
				     .elem_bytes = 2,
				     .block_stride = 4 * 8,
				     .token_stride = 8,
				     .head_stride = 8,
				     .k_layers = k};

	(void)state;
	for (size_t p = 0; p < 2; p++)
		for (size_t i = 0; i < 2 * 4 * 8; i++)
			pg[p][i] = (uint16_t)(1000 * p + i + 1);
	memset(eng, 0xaa, sizeof(eng));
	assert_int_equal(kvp_pages_to_engine(&l, bases, 2, 4, &c, bid, NULL), 0);
	/* page 0, layer 1, token 2, element 3: page (1*4+2)*8+3 = 51; engine
	 * layer 1, block 2: (2*4+2)*8+3 = 83 */
	assert_int_equal(eng[1][83], pg[0][51]);
	for (uint32_t layer = 0; layer < 2; layer++)
		for (uint32_t t = 0; t < 4; t++)
			for (uint32_t d = 0; d < 8; d++) {
				assert_int_equal(eng[layer][(2 * 4 + t) * 8 + d],
						 pg[0][(layer * 4 + t) * 8 + d]);
				assert_int_equal(eng[layer][(0 * 4 + t) * 8 + d],
						 pg[1][(layer * 4 + t) * 8 + d]);
				assert_int_equal(eng[layer][(1 * 4 + t) * 8 + d], 0xaaaa);
				assert_int_equal(eng[layer][(3 * 4 + t) * 8 + d], 0xaaaa);
			}
	memset(back, 0, sizeof(back));
	bases[0] = back[0];
	bases[1] = back[1];
	assert_int_equal(kvp_engine_to_pages(&l, bases, 2, 4, &c, bid, NULL), 0);
	assert_memory_equal(back, pg, sizeof(pg));
	/* a latent layout has one head */
	assert_int_equal(kvp_pages_to_engine(&two, bases, 2, 4, &c, bid, NULL), -EINVAL);
}

/* An engine's own fp8 (raw e4m3): 1-byte elements copied unchanged; the
 * page's f32 scales after the data are neither copied nor written. */
static void test_raw_fp8(void **state)
{
	const struct kvp_layout l = {2, 2, 8, 4, KVP_DTYPE_E4M3_RAW, 0};
	enum { DATA = 2 * 2 * 2 * 4 * 8, SCALES = 2 * 2 * 4 };
	uint8_t pg[DATA + SCALES], back[DATA + SCALES], eng[2][3 * 2 * 4 * 2 * 8];
	void *bases[1] = {pg}, *k[2] = {eng[0], eng[1]};
	const int32_t bid[1] = {1};
	struct kvp_engine_cache c;

	(void)state;
	for (size_t i = 0; i < sizeof(pg); i++)
		pg[i] = (uint8_t)(i * 37 + 11);
	memset(eng, 0, sizeof(eng));
	assert_int_equal(
		kvp_engine_cache_init(&c, KVP_ENGINE_FLASHINFER_NHD, 2, k, NULL, 3, 4, 2, 8, 2), 0);
	assert_int_equal(kvp_pages_to_engine(&l, bases, 1, 4, &c, bid, NULL), -EINVAL);
	assert_int_equal(
		kvp_engine_cache_init(&c, KVP_ENGINE_FLASHINFER_NHD, 2, k, NULL, 3, 4, 2, 8, 1), 0);
	assert_int_equal(kvp_pages_to_engine(&l, bases, 1, 4, &c, bid, NULL), 0);
	/* layer 1, V, head 1, token 2, element 3: page (((1*2+1)*2+1)*4+2)*8+3
	 * = 243; engine [3, 2, 4, 2, 8], block 1: (((1*2+1)*4+2)*2+1)*8+3 = 235 */
	assert_int_equal(eng[1][235], pg[243]);
	memset(back, 0xee, sizeof(back));
	bases[0] = back;
	assert_int_equal(kvp_engine_to_pages(&l, bases, 1, 4, &c, bid, NULL), 0);
	assert_memory_equal(back, pg, DATA);
	for (size_t i = DATA; i < sizeof(back); i++)
		assert_int_equal(back[i], 0xee);
}

static void test_errors(void **state)
{
	const struct kvp_layout q8 = {NL, NH, HD, BT, KVP_DTYPE_INT8, 8};
	const struct kvp_layout f32 = {NL, NH, HD, BT, KVP_DTYPE_F32, 0};
	const struct kvp_layout bad = {NL, NH, HD, 0, KVP_DTYPE_F16, 0};
	uint16_t *pg[NP];
	void *bases[NP], *nulls[NP] = {0};
	struct kvp_engine_cache c, huge;
	struct kvp_adapt_range r = {.n_layers = NL, .n_heads = NH};
	int32_t badid[NP] = {4, 0, NB}, negid[NP] = {-1, 0, 2};
	struct eng e;

	(void)state;
	eng_new(&e, KVP_ENGINE_FLASH_ATTN, NL, NH);
	pages_new(pg, bases);
	/* init */
	assert_int_equal(kvp_engine_cache_init(NULL, 1, NL, e.k, NULL, NB, BT, NH, HD, 2), -EINVAL);
	assert_int_equal(kvp_engine_cache_init(&c, 1, NL, NULL, NULL, NB, BT, NH, HD, 2), -EINVAL);
	assert_int_equal(kvp_engine_cache_init(&c, 0, NL, e.k, NULL, NB, BT, NH, HD, 2), -EINVAL);
	assert_int_equal(kvp_engine_cache_init(&c, 9, NL, e.k, NULL, NB, BT, NH, HD, 2), -EINVAL);
	assert_int_equal(kvp_engine_cache_init(&c, 1, NL, e.k, NULL, 0, BT, NH, HD, 2), -EINVAL);
	assert_int_equal(kvp_engine_cache_init(&c, 1, NL, e.k, NULL, NB, BT, NH, HD, 3), -EINVAL);
	assert_int_equal(
		kvp_engine_cache_init(&c, KVP_ENGINE_SGLANG, NL, e.k, NULL, NB, BT, NH, HD, 2),
		-EINVAL);
	assert_int_equal(
		kvp_engine_cache_init(&huge, 1, NL, e.k, NULL, UINT32_MAX, 4096, 1024, 1024, 4),
		-ERANGE);

	/* copies: nothing may be written by a refused call */
	c = e.c;
	assert_int_equal(kvp_pages_to_engine(NULL, bases, NP, BT, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, NULL, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, NULL, NP, BT, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, NULL, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, nulls, NP, BT, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&bad, bases, NP, BT, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&q8, bases, NP, BT, &c, ids, NULL), -EOPNOTSUPP);
	assert_int_equal(kvp_pages_to_engine(&f32, bases, NP, BT, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, 0, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT + 1, &c, ids, NULL), -EINVAL);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, badid, NULL), -ERANGE);
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, negid, NULL), -ERANGE);
	r.n_heads = 0;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, &r), -EINVAL);
	r.n_heads = NH;
	r.head_first = 1;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, &r), -ERANGE);
	r.head_first = 0;
	r.engine_layer_first = 1;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, &r), -ERANGE);
	r.engine_layer_first = 0;
	r.layer_first = NL;
	r.n_layers = 1;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, &r), -ERANGE);
	c.reserved = 1;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, NULL), -EINVAL);
	/* strides under which two rows overlap: tokens one element apart */
	c = e.c;
	c.token_stride = 1;
	assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, NULL), -EINVAL);
	/* strides times ids past 63 bits, and a tensor wrapping the address space */
	c = e.c;
	c.block_stride = UINT64_MAX / 4;
	assert_int_equal(kvp_engine_to_pages(&layout, bases, NP, BT, &c, ids, NULL), -ERANGE);
	c = e.c;
	c.v_offset = UINT64_MAX / 2;
	assert_int_equal(kvp_engine_to_pages(&layout, bases, NP, BT, &c, ids, NULL), -ERANGE);
	c = e.c;
	{
		void *wrap[NL] = {e.k[0], (void *)(UINTPTR_MAX - 64), e.k[2]};

		c.k_layers = wrap;
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, NULL),
				 -ERANGE);
		wrap[1] = NULL;
		assert_int_equal(kvp_pages_to_engine(&layout, bases, NP, BT, &c, ids, NULL),
				 -EINVAL);
	}
	check_engine(&e, 0, &(struct kvp_adapt_range){.n_layers = 0}); /* all untouched */
	for (uint32_t p = 0; p < NP; p++)
		for (size_t i = 0; i < page_elems; i++)
			assert_int_equal(pg[p][i], val(p, i));
	/* nothing to copy */
	assert_int_equal(kvp_pages_to_engine(&layout, NULL, 0, 0, &e.c, NULL, NULL), 0);
	pages_free(pg);
	eng_free(&e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layouts), cmocka_unit_test(test_partial),
		cmocka_unit_test(test_range),	cmocka_unit_test(test_latent_f32),
		cmocka_unit_test(test_errors),	cmocka_unit_test(test_latent_format),
		cmocka_unit_test(test_raw_fp8),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
