/* tests/gpu/test_gpu_adapt.c — the CUDA engine-layout adapters
 * (kcuda_adapt) against their C reference (kref_adapt).
 *
 * Exits 77 (skip) when CUDA was not built or no GPU is usable. Otherwise,
 * on random bytes for FlashAttention, FlashInfer NHD and HND and SGLang
 * layouts (strides written out here): the same pages and engine buffers,
 * one copy on the host and one on the device, both directions, must come
 * out byte for byte the same on both sides — every byte of every page
 * and of every engine tensor, so what must stay untouched stays so. Cases
 * cover full and partial last pages, head and layer ranges, f16, bf16 and
 * f32, rows that take the 16-byte, 4-byte and 1-byte paths (misaligned
 * engine bases), and a block id out of range (skipped on the device, its
 * run unchanged, where the reference refuses the call). Single-threaded.
 */
#include <stdio.h>

#ifndef KVP_HAVE_CUDA
int main(void)
{
	printf("CUDA parts not built (nvcc not found or -Dcuda=disabled): skipped\n");
	return 77;
}
#else

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ktest.h"

static cudaStream_t stream;

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess)                                                             \
			fail_msg("%s: %s", #call, cudaGetErrorString(e_));                         \
	} while (0)

enum { FA, NHD, HND, SGL };

struct acase {
	uint32_t kind, dtype, n_layers, n_heads, head_dim, block_tokens, num_blocks, n_pages;
	uint32_t last, misalign; /* bytes added to every engine base */
	int ranged;
	struct kern_adapt_range r; /* with ranged: engine has r's counts plus engine_*_first */
};

/* One engine, on the host and the device: per layer one buffer (FA and
 * FlashInfer: K and V in one tensor) or two (SGLang). */
struct aeng {
	uint32_t n_bufs, n_layers;
	size_t buf_bytes;
	uint8_t *h[64], *d[64];			 /* allocations */
	void *hk[32], *hv[32], *dk[32], *dv[32]; /* layer bases */
	void **d_k_table, **d_v_table;
	struct kern_engine he, de;
};

static void *dmalloc(size_t n)
{
	void *p = NULL;

	CU(cudaMalloc(&p, n ? n : 1));
	return p;
}

static void *upload(const void *h, size_t n)
{
	void *d = dmalloc(n);

	CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
	return d;
}

static void fill_bytes(void *p, size_t n, uint64_t *rng)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)kt_next(rng);
}

static void aeng_new(struct aeng *a, const struct acase *c, uint32_t el_layers, uint32_t el_heads,
		     uint32_t es, uint64_t *rng)
{
	uint64_t D = c->head_dim, bs = c->block_tokens, H = el_heads, NB = c->num_blocks;
	uint64_t blk = bs * H * D;

	memset(a, 0, sizeof(*a));
	a->n_layers = el_layers;
	a->n_bufs = c->kind == SGL ? 2 : 1;
	a->buf_bytes = NB * blk * (c->kind == SGL ? 1 : 2) * es + 16;
	for (uint32_t l = 0; l < el_layers; l++)
		for (uint32_t b = 0; b < a->n_bufs; b++) {
			uint32_t i = l * a->n_bufs + b;

			a->h[i] = malloc(a->buf_bytes);
			assert_non_null(a->h[i]);
			fill_bytes(a->h[i], a->buf_bytes, rng);
			a->d[i] = upload(a->h[i], a->buf_bytes);
			(b ? a->hv : a->hk)[l] = a->h[i] + c->misalign;
			(b ? a->dv : a->dk)[l] = a->d[i] + c->misalign;
		}
	a->d_k_table = upload(a->dk, el_layers * sizeof(void *));
	a->d_v_table = a->n_bufs == 2 ? upload(a->dv, el_layers * sizeof(void *)) : NULL;
	a->he.n_layers = el_layers;
	a->he.num_blocks = c->num_blocks;
	a->he.block_size = c->block_tokens;
	a->he.n_heads = el_heads;
	a->he.head_dim = c->head_dim;
	a->he.elem_bytes = es;
	switch (c->kind) {
	case FA: /* [2, NB, bs, H, D] */
		a->he.block_stride = blk;
		a->he.token_stride = H * D;
		a->he.head_stride = D;
		a->he.v_offset = NB * blk;
		break;
	case NHD: /* [NB, 2, bs, H, D] */
		a->he.block_stride = 2 * blk;
		a->he.token_stride = H * D;
		a->he.head_stride = D;
		a->he.v_offset = blk;
		break;
	case HND: /* [NB, 2, H, bs, D] */
		a->he.block_stride = 2 * blk;
		a->he.token_stride = D;
		a->he.head_stride = bs * D;
		a->he.v_offset = blk;
		break;
	default: /* pools [NB * bs, H, D] */
		a->he.block_stride = blk;
		a->he.token_stride = H * D;
		a->he.head_stride = D;
		break;
	}
	a->de = a->he;
	a->he.k_layers = a->hk;
	a->he.v_layers = a->n_bufs == 2 ? a->hv : NULL;
	a->de.k_layers = a->d_k_table;
	a->de.v_layers = a->n_bufs == 2 ? a->d_v_table : NULL;
}

static void aeng_compare(const struct aeng *a)
{
	uint8_t *tmp = malloc(a->buf_bytes);

	assert_non_null(tmp);
	for (uint32_t i = 0; i < a->n_layers * a->n_bufs; i++) {
		CU(cudaMemcpy(tmp, a->d[i], a->buf_bytes, cudaMemcpyDeviceToHost));
		for (size_t j = 0; j < a->buf_bytes; j++)
			if (tmp[j] != a->h[i][j])
				fail_msg("engine buffer %u byte %zu: device %#x, reference %#x", i,
					 j, tmp[j], a->h[i][j]);
	}
	free(tmp);
}

static void aeng_free(struct aeng *a)
{
	for (uint32_t i = 0; i < a->n_layers * a->n_bufs; i++) {
		free(a->h[i]);
		cudaFree(a->d[i]);
	}
	cudaFree(a->d_k_table);
	cudaFree(a->d_v_table);
}

static void pages_compare(const struct kt_pages *h, void *const *d_pages)
{
	uint8_t *tmp = malloc(h->page_bytes);

	assert_non_null(tmp);
	for (uint32_t i = 0; i < h->n_pages; i++) {
		CU(cudaMemcpy(tmp, d_pages[i], h->page_bytes, cudaMemcpyDeviceToHost));
		if (memcmp(tmp, h->pages[i], h->page_bytes))
			fail_msg("page %u differs between device and reference", i);
	}
	free(tmp);
}

static void run_case(const struct acase *c, uint64_t seed)
{
	const struct shm_layout l = {
		c->n_layers, c->ranged ? c->r.head_first + c->r.n_heads + 1 : c->n_heads,
		c->head_dim, c->block_tokens,
		c->dtype,    0};
	uint32_t es = shm_dtype_bits(c->dtype) / 8;
	uint32_t el_layers = c->ranged ? c->r.engine_layer_first + c->r.n_layers : c->n_layers;
	uint32_t el_heads = c->ranged ? c->r.engine_head_first + c->r.n_heads : l.n_kv_heads;
	const struct kern_adapt_range *r = c->ranged ? &c->r : NULL;
	uint64_t rng = seed;
	int32_t ids[64];
	void *d_pages[64], **d_table;
	int32_t *d_ids;
	struct kt_pages hp;
	struct aeng a;

	assert_true(c->n_pages <= 64 && c->n_pages <= c->num_blocks);
	/* distinct random block ids */
	for (uint32_t i = 0; i < c->n_pages; i++) {
		int dup;

		do {
			ids[i] = (int32_t)(kt_next(&rng) % c->num_blocks);
			dup = 0;
			for (uint32_t j = 0; j < i; j++)
				dup |= ids[j] == ids[i];
		} while (dup);
	}
	for (uint32_t dir = 0; dir < 2; dir++) {
		kt_pages_alloc(&hp, &l, c->n_pages);
		for (uint32_t i = 0; i < c->n_pages; i++) {
			fill_bytes(hp.pages[i], hp.page_bytes, &rng);
			d_pages[i] = upload(hp.pages[i], hp.page_bytes);
		}
		d_table = upload(d_pages, c->n_pages * sizeof(void *));
		d_ids = upload(ids, c->n_pages * sizeof(int32_t));
		aeng_new(&a, c, el_layers, el_heads, es, &rng);

		assert_int_equal(kref_adapt(&l, hp.pages, c->n_pages, c->last, &a.he, ids, r, dir),
				 0);
		assert_int_equal(kcuda_adapt(&l, (void *const *)d_table, c->n_pages, c->last, &a.de,
					     d_ids, r, dir, stream),
				 0);
		CU(cudaStreamSynchronize(stream));
		CU(cudaGetLastError());
		aeng_compare(&a);
		pages_compare(&hp, d_pages);

		for (uint32_t i = 0; i < c->n_pages; i++)
			cudaFree(d_pages[i]);
		cudaFree(d_table);
		cudaFree(d_ids);
		aeng_free(&a);
		kt_pages_free(&hp);
	}
}

static void test_layouts(void **state)
{
	const struct acase cases[] = {
		/* Llama-like f16, 16-byte vectors, full and partial last pages */
		{FA, SHM_DTYPE_F16, 4, 8, 128, 16, 40, 17, 16, 0, 0, {0}},
		{NHD, SHM_DTYPE_F16, 4, 8, 128, 16, 40, 17, 5, 0, 0, {0}},
		{HND, SHM_DTYPE_F16, 4, 8, 128, 16, 40, 17, 1, 0, 0, {0}},
		{SGL, SHM_DTYPE_F16, 4, 8, 128, 16, 40, 17, 16, 0, 0, {0}},
		/* bf16, 12-byte rows: 4-byte words */
		{FA, SHM_DTYPE_BF16, 2, 3, 6, 5, 9, 4, 3, 0, 0, {0}},
		{HND, SHM_DTYPE_BF16, 2, 3, 6, 5, 9, 4, 5, 0, 0, {0}},
		/* f32, a latent cache (one head of 576) */
		{NHD, SHM_DTYPE_F32, 3, 1, 576, 8, 12, 6, 7, 0, 0, {0}},
		{SGL, SHM_DTYPE_F32, 3, 2, 5, 4, 7, 7, 2, 0, 0, {0}},
		/* engine bases 2 bytes off: byte copies */
		{FA, SHM_DTYPE_F16, 2, 4, 64, 16, 10, 3, 9, 2, 0, {0}},
		{SGL, SHM_DTYPE_F16, 2, 4, 64, 16, 10, 3, 16, 2, 0, {0}},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&cases[i], 100 + i);
}

/* Tensor-parallel and pipeline ranks: heads [2, 4) of 5, layers [1, 3) of
 * 4, at engine heads [1, 3) and layers [0, 2). */
static void test_ranges(void **state)
{
	const struct kern_adapt_range r = {1, 2, 2, 2, 0, 1};

	(void)state;
	for (uint32_t kind = FA; kind <= SGL; kind++) {
		struct acase c = {kind, SHM_DTYPE_F16, 4, 0, 64, 16, 12, 5, 11, 0, 1, r};

		run_case(&c, 200 + kind);
		c.head_dim = 3; /* 6-byte rows: byte copies */
		run_case(&c, 300 + kind);
	}
}

/* An out-of-range block id is skipped on the device; the other pages are
 * copied. The reference refuses such a call, so compare against it with
 * the bad page left out. */
static void test_bad_id(void **state)
{
	const struct shm_layout l = {2, 2, 16, 4, SHM_DTYPE_F16, 0};
	const struct acase c = {FA, SHM_DTYPE_F16, 2, 2, 16, 4, 6, 3, 4, 0, 0, {0}};
	int32_t ids[3] = {1, 99, 4}, *d_ids;
	void *d_pages[3], **d_table;
	uint64_t rng = 7;
	struct kt_pages hp;
	struct aeng a;

	(void)state;
	kt_pages_alloc(&hp, &l, 3);
	for (uint32_t i = 0; i < 3; i++) {
		fill_bytes(hp.pages[i], hp.page_bytes, &rng);
		d_pages[i] = upload(hp.pages[i], hp.page_bytes);
	}
	d_table = upload(d_pages, sizeof(d_pages));
	d_ids = upload(ids, sizeof(ids));
	aeng_new(&a, &c, 2, 2, 2, &rng);
	assert_int_equal(kref_adapt(&l, hp.pages, 3, 4, &a.he, ids, NULL, KERN_ADAPT_TO_ENGINE),
			 -ERANGE);
	assert_int_equal(kcuda_adapt(&l, (void *const *)d_table, 3, 4, &a.de, d_ids, NULL,
				     KERN_ADAPT_TO_ENGINE, stream),
			 0);
	CU(cudaStreamSynchronize(stream));
	assert_int_equal(kref_adapt(&l, hp.pages, 1, 4, &a.he, ids, NULL, KERN_ADAPT_TO_ENGINE), 0);
	assert_int_equal(
		kref_adapt(&l, hp.pages + 2, 1, 4, &a.he, ids + 2, NULL, KERN_ADAPT_TO_ENGINE), 0);
	aeng_compare(&a);
	/* and the launcher refuses what the reference's checks refuse */
	assert_int_equal(kcuda_adapt(&l, (void *const *)d_table, 3, 0, &a.de, d_ids, NULL,
				     KERN_ADAPT_TO_ENGINE, stream),
			 -EINVAL);
	assert_int_equal(
		kcuda_adapt(&l, (void *const *)d_table, 3, 4, &a.de, d_ids, NULL, 2, stream),
		-EINVAL);
	assert_int_equal(kcuda_adapt(&l, NULL, 0, 4, &a.de, NULL, NULL, 0, stream), 0);
	for (uint32_t i = 0; i < 3; i++)
		cudaFree(d_pages[i]);
	cudaFree(d_table);
	cudaFree(d_ids);
	aeng_free(&a);
	kt_pages_free(&hp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layouts),
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_bad_id),
	};
	int ret;

	if (kcuda_device_count() < 0) {
		printf("no usable GPU (the CUDA runtime reports an error): skipped\n");
		return 77;
	}
	if (cudaStreamCreate(&stream) != cudaSuccess) {
		printf("cannot create a CUDA stream: skipped\n");
		return 77;
	}
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	cudaStreamDestroy(stream);
	return ret;
}

#endif
