/* tests/kernels/test_adapt_emu.c — the CUDA engine-layout adapter's code
 * (kernels/cuda/adapt_body.h, what kcuda_adapt launches) run on the CPU
 * against the C reference kref_adapt, so its index arithmetic is checked
 * on every build, GPU or not (tests/gpu/test_gpu_adapt.c checks the real
 * launch where a GPU exists).
 *
 * The kernel has no shared memory and no barrier, so running its blocks
 * and their threads one after another is what the GPU computes. A grid
 * of 37 blocks of 256 threads, fewer blocks than runs: the grid-stride
 * and thread-stride loops both turn. 400 random cases over the four
 * engine layouts (FlashAttention, FlashInfer NHD and HND, SGLang), f16,
 * bf16 and f32, both directions, partial last pages, layer and head
 * ranges, engine bases off by 0..14 bytes (16-, 4- and 1-byte paths):
 * every byte of every page and engine buffer must come out as the
 * reference leaves it, and the calls must return the same. Then a block
 * id out of range: the device code skips its run. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ktest.h"

/* What CUDA provides the device code. */
#define __global__ static
#define __device__
#define __forceinline__ inline
typedef struct {
	uint32_t x, y, z, w;
} uint4;
static struct {
	unsigned x;
} threadIdx, blockIdx, blockDim, gridDim;

#include "cuda/adapt_body.h"

static void emu_launch(struct adapt_args a)
{
	gridDim.x = 37;
	blockDim.x = ADAPT_THREADS;
	for (unsigned b = 0; b < gridDim.x; b++)
		for (unsigned t = 0; t < blockDim.x; t++) {
			blockIdx.x = b;
			threadIdx.x = t;
			adapt_kernel(a);
		}
}

/* kcuda_adapt with the launch emulated. */
static int emu_adapt(const struct shm_layout *l, void *const *pages, size_t n_pages, uint32_t last,
		     const struct kern_engine *e, const int32_t *ids,
		     const struct kern_adapt_range *r, uint32_t dir)
{
	struct adapt_args a;
	int ret = adapt_args_init(&a, l, pages, n_pages, last, e, ids, r, dir);

	if (ret <= 0)
		return ret;
	emu_launch(a);
	return 0;
}

static uint8_t rb(uint64_t *rng)
{
	return (uint8_t)(kt_next(rng) >> 56);
}

/* An engine of layout kind over buffers buf[kv][layer] (kv 1 only for
 * SGLang's V pools), as engines lay them out. */
static void engine_fill(struct kern_engine *e, uint32_t kind, uint32_t n_layers, uint32_t nb,
			uint32_t bs, uint32_t nh, uint32_t d, uint32_t es)
{
	uint64_t blk = (uint64_t)bs * nh * d;

	memset(e, 0, sizeof(*e));
	e->n_layers = n_layers;
	e->num_blocks = nb;
	e->block_size = bs;
	e->n_heads = nh;
	e->head_dim = d;
	e->elem_bytes = es;
	switch (kind) {
	case 0: /* FlashAttention [2, NB, bs, H, D] */
		e->block_stride = blk;
		e->token_stride = (uint64_t)nh * d;
		e->head_stride = d;
		e->v_offset = nb * blk;
		break;
	case 1: /* FlashInfer NHD [NB, 2, bs, H, D] */
		e->block_stride = 2 * blk;
		e->token_stride = (uint64_t)nh * d;
		e->head_stride = d;
		e->v_offset = blk;
		break;
	case 2: /* FlashInfer HND [NB, 2, H, bs, D] */
		e->block_stride = 2 * blk;
		e->token_stride = d;
		e->head_stride = (uint64_t)bs * d;
		e->v_offset = blk;
		break;
	default: /* SGLang pools [NB * bs, H, D] */
		e->block_stride = blk;
		e->token_stride = (uint64_t)nh * d;
		e->head_stride = d;
		break;
	}
}

/* Engine layers: up to 4, and a range may put them one layer further
 * into the engine's cache (engine_layer_first): 5. */
#define SIDE_LAYERS 5

struct side {
	uint8_t *buf[2][SIDE_LAYERS];
	void *k[SIDE_LAYERS], *v[SIDE_LAYERS];
	void *pages[8];
};

static void side_alloc(struct side *s, uint32_t n_layers, size_t lb, uint32_t mis, uint32_t np,
		       size_t pb)
{
	memset(s, 0, sizeof(*s));
	for (uint32_t i = 0; i < n_layers; i++)
		for (int kv = 0; kv < 2; kv++) {
			s->buf[kv][i] = malloc(lb);
			assert_non_null(s->buf[kv][i]);
			(kv ? s->v : s->k)[i] = s->buf[kv][i] + mis;
		}
	for (uint32_t i = 0; i < np; i++) {
		s->pages[i] = aligned_alloc(4096, (pb + 4095) / 4096 * 4096);
		assert_non_null(s->pages[i]);
	}
}

static void side_free(struct side *s)
{
	for (int kv = 0; kv < 2; kv++)
		for (int i = 0; i < SIDE_LAYERS; i++)
			free(s->buf[kv][i]);
	for (int i = 0; i < 8; i++)
		free(s->pages[i]);
}

static void test_random_cases(void **state)
{
	uint64_t rng = 0x5eed;
	int n_paths[3] = {0, 0, 0};

	(void)state;
	for (int it = 0; it < 400; it++) {
		/* every 7th case an engine's raw fp8 (1-byte elements), every 5th
		 * a latent layout (one plane, one head) */
		uint32_t kind = it % 4, es = it % 7 == 3 ? 1 : it / 4 % 3 == 2 ? 4 : 2;
		uint32_t dtype = es == 1   ? SHM_DTYPE_E4M3_RAW
				 : es == 4 ? SHM_DTYPE_F32
				 : it % 2  ? SHM_DTYPE_BF16
					   : SHM_DTYPE_F16;
		uint32_t fmt = it % 5 == 1 ? SHM_FORMAT_LATENT : SHM_FORMAT_KV;
		uint32_t nl = 1 + rb(&rng) % 4, nh = fmt ? 1 : 1 + rb(&rng) % 4,
			 d = 1 + rb(&rng) % 40;
		uint32_t bs = 1 + rb(&rng) % 9, nb = 2 + rb(&rng) % 7;
		uint32_t np = 1 + rb(&rng) % (nb - 1), last = 1 + rb(&rng) % bs;
		uint32_t mis = rb(&rng) % 2 ? 0 : (rb(&rng) % 8) * 2, dir = rb(&rng) % 2;
		struct shm_layout l = {nl, nh, d, bs, dtype, 0, fmt};
		struct kern_adapt_range r, *rp = NULL;
		uint32_t enl = nl, enh = nh;
		struct kern_engine ea, eb;
		struct side a, b;
		int32_t ids[8];
		size_t lb, pb;
		int ra, re;

		if (rb(&rng) % 2) {
			r.layer_first = rb(&rng) % nl;
			r.n_layers = 1 + rb(&rng) % (nl - r.layer_first);
			r.head_first = rb(&rng) % nh;
			r.n_heads = 1 + rb(&rng) % (nh - r.head_first);
			r.engine_layer_first = rb(&rng) % 2;
			r.engine_head_first = rb(&rng) % 3;
			enl = r.engine_layer_first + r.n_layers;
			enh = r.engine_head_first + r.n_heads;
			rp = &r;
		}
		lb = (size_t)nb * bs * enh * d * 2 * es + 16;
		pb = shm_page_bytes(&l);
		side_alloc(&a, enl, lb, mis, np, pb);
		side_alloc(&b, enl, lb, mis, np, pb);
		for (uint32_t i = 0; i < enl; i++)
			for (int kv = 0; kv < 2; kv++)
				for (size_t j = 0; j < lb; j++)
					a.buf[kv][i][j] = b.buf[kv][i][j] = rb(&rng);
		for (uint32_t i = 0; i < np; i++) {
			int dup;

			for (size_t j = 0; j < pb; j++)
				((uint8_t *)a.pages[i])[j] = ((uint8_t *)b.pages[i])[j] = rb(&rng);
			do {
				ids[i] = (int32_t)(rb(&rng) % nb);
				dup = 0;
				for (uint32_t j = 0; j < i; j++)
					dup |= ids[j] == ids[i];
			} while (dup);
		}
		engine_fill(&ea, kind, enl, nb, bs, enh, d, es);
		eb = ea;
		ea.k_layers = a.k;
		eb.k_layers = b.k;
		ea.v_layers = kind == 3 ? a.v : NULL;
		eb.v_layers = kind == 3 ? b.v : NULL;
		ra = kref_adapt(&l, a.pages, np, last, &ea, ids, rp, dir);
		re = emu_adapt(&l, b.pages, np, last, &eb, ids, rp, dir);
		assert_int_equal(ra, 0);
		assert_int_equal(re, 0);
		for (uint32_t i = 0; i < enl; i++)
			for (int kv = 0; kv < 2; kv++)
				if (memcmp(a.buf[kv][i], b.buf[kv][i], lb))
					fail_msg("case %d (kind %u, %u-byte elements, head_dim %u, "
						 "offset %u, range %d, dir %u): engine layer %u "
						 "buffer %d differs",
						 it, kind, es, d, mis, rp != NULL, dir, i, kv);
		for (uint32_t i = 0; i < np; i++)
			if (memcmp(a.pages[i], b.pages[i], pb))
				fail_msg("case %d (kind %u, dir %u): page %u differs", it, kind,
					 dir, i);
		{
			uint64_t al = (uint64_t)d * es | mis;

			n_paths[al % 16 == 0 ? 0 : al % 4 == 0 ? 1 : 2]++;
		}
		side_free(&a);
		side_free(&b);
	}
	/* each copy width was taken */
	assert_true(n_paths[0] > 10 && n_paths[1] > 10 && n_paths[2] > 10);
}

/* A block id out of range skips its run on the device; the others are
 * copied (the reference refuses the whole call). */
static void test_bad_id_skipped(void **state)
{
	const struct shm_layout l = {2, 2, 16, 4, SHM_DTYPE_F16, 0};
	int32_t ids[3] = {1, 99, 4};
	struct kern_engine ea, eb;
	struct side a, b;
	uint64_t rng = 3;
	size_t lb = (size_t)6 * 4 * 2 * 16 * 2 * 2, pb = shm_page_bytes(&l);

	(void)state;
	side_alloc(&a, 2, lb, 0, 3, pb);
	side_alloc(&b, 2, lb, 0, 3, pb);
	for (uint32_t i = 0; i < 2; i++)
		for (size_t j = 0; j < lb; j++)
			a.buf[0][i][j] = b.buf[0][i][j] = rb(&rng);
	for (uint32_t i = 0; i < 3; i++)
		for (size_t j = 0; j < pb; j++)
			((uint8_t *)a.pages[i])[j] = ((uint8_t *)b.pages[i])[j] = rb(&rng);
	engine_fill(&ea, 0, 2, 6, 4, 2, 16, 2);
	eb = ea;
	ea.k_layers = a.k;
	eb.k_layers = b.k;
	assert_int_equal(kref_adapt(&l, a.pages, 3, 4, &ea, ids, NULL, KERN_ADAPT_TO_ENGINE),
			 -ERANGE);
	assert_int_equal(emu_adapt(&l, b.pages, 3, 4, &eb, ids, NULL, KERN_ADAPT_TO_ENGINE), 0);
	assert_int_equal(kref_adapt(&l, a.pages, 1, 4, &ea, ids, NULL, KERN_ADAPT_TO_ENGINE), 0);
	assert_int_equal(
		kref_adapt(&l, a.pages + 2, 1, 4, &ea, ids + 2, NULL, KERN_ADAPT_TO_ENGINE), 0);
	for (uint32_t i = 0; i < 2; i++)
		assert_memory_equal(a.buf[0][i], b.buf[0][i], lb);
	/* the launcher's own refusals */
	assert_int_equal(emu_adapt(&l, NULL, 3, 4, &eb, ids, NULL, 0), -EINVAL);
	assert_int_equal(emu_adapt(&l, b.pages, 3, 4, &eb, ids, NULL, 2), -EINVAL);
	assert_int_equal(emu_adapt(&l, b.pages, 3, 0, &eb, ids, NULL, 0), -EINVAL);
	assert_int_equal(emu_adapt(&l, NULL, 0, 4, &eb, NULL, NULL, 0), 0);
	side_free(&a);
	side_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_cases),
		cmocka_unit_test(test_bad_id_skipped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
