/* bench/kernel_bench.c — throughput of the numeric kernels (kernels.h).
 *
 * CPU: every C reference kernel over pages of a Llama-like layout (8
 * layers, 8 KV heads, head_dim 128, 16 tokens per page: 512 KiB f16 pages),
 * next to a plain memcpy of the same bytes measured in the same run:
 *   kernel.ref.memcpy_bw          memcpy of the f16 pages (GB/s copied)
 *   kernel.quant_{int8,fp8,int4}  f16 pages → quantized (GB/s of f16 pages)
 *   kernel.dequant_{...}          quantized → f16 pages (GB/s of f16 pages)
 *   kernel.attn_f16, attn_int8    decode attention of 32 query heads over
 *                                 every layer of the context (GB/s of the
 *                                 page bytes read: K, V and scales)
 *   kernel.gather                 compaction of every other token (GB/s of
 *                                 rows copied)
 *   kernel.qk_scores              Q·Kᵀ of 32 queries against f32 keys (GB/s
 *                                 of keys read)
 *   kernel.cosine                 64 topics against 4096 span embeddings
 *                                 (GB/s of embeddings read)
 *   kernel.adapt_{fa,hnd}_to_engine  engine-layout adapters (kref_adapt, the
 *   kernel.adapt_{fa,hnd}_to_pages   library's kvp_pages_to_engine and
 *                                 kvp_engine_to_pages): --adapt-blocks
 *                                 Llama-3-8B pages (32 layers, 8 KV heads,
 *                                 head_dim 128, f16, 16 tokens: 2 MiB) to
 *                                 and from a vLLM FlashAttention cache
 *                                 (256-byte rows) or a FlashInfer HND one
 *                                 (4 KiB runs), blocks in shuffled order,
 *                                 next to
 *   kernel.ref.adapt_memcpy_bw    memcpy of the same bytes, measured with
 *                                 them (GB/s of page bytes copied)
 * GPU (built with CUDA, and a GPU present; --no-gpu skips): the same
 * quantize, dequantize, attention, gather and Q·Kᵀ kernels on device pages
 * (--gpu-mib of them), next to a device-to-device cudaMemcpyAsync of the
 * same bytes (gpu.ref.d2d_bw), timed with CUDA events on one stream; and
 * the adapters (kcuda_adapt, gpu.adapt_{fa,hnd}_to_{engine,pages}) on
 * --adapt-blocks device pages, next to a D2D copy of the same bytes
 * (gpu.ref.adapt_d2d_bw).
 *
 * Each figure is the best of repeated timed calls over at least --seconds
 * (after a warm-up call), so it measures the kernel, not the first touch
 * of memory. One invocation is one repetition: "sample NAME VALUE" lines on
 * stdout for bench/run, progress on stderr, exit 1 if anything fails.
 * Single-threaded (the reference kernels are).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static double seconds = 0.5;

static const struct shm_layout f16_layout = {8, 8, 128, 16, SHM_DTYPE_F16, 0};
/* Llama-3-8B: the adapters' pages */
static const struct shm_layout llama3_layout = {32, 8, 128, 16, SHM_DTYPE_F16, 0};
static uint32_t adapt_blocks = 256;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "kvp-bench-kernel: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static void *xalloc(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, SHM_PAGE_ALIGN, n))
		die("allocation", ENOMEM);
	memset(p, 0, n);
	return p;
}

struct pages {
	struct shm_layout l;
	uint32_t n;
	size_t page_bytes;
	void **p;
};

static void pages_alloc(struct pages *pg, const struct shm_layout *l, uint32_t n)
{
	pg->l = *l;
	pg->n = n;
	pg->page_bytes = shm_page_bytes(l);
	pg->p = calloc(n, sizeof(void *));
	if (!pg->p)
		die("allocation", ENOMEM);
	/* one block, so memcpy of all of it is the fair reference */
	pg->p[0] = xalloc(pg->page_bytes * n);
	for (uint32_t i = 1; i < n; i++)
		pg->p[i] = (uint8_t *)pg->p[0] + pg->page_bytes * i;
}

static void pages_free(struct pages *pg)
{
	free(pg->p[0]);
	free(pg->p);
}

/* Deterministic f16 values of magnitude ~1 with outlier channels. */
static void fill_f16(struct pages *pg)
{
	uint64_t x = 88172645463325252ull;
	size_t n = pg->page_bytes * pg->n / 2;
	uint16_t *h = pg->p[0];

	for (size_t i = 0; i < n; i++) {
		float v;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v = (float)((double)(x >> 11) * 0x1p-52 - 1.0) * (i % 128 == 3 ? 8.0f : 1.0f);
		/* f32 → f16 by hand, normal range only, truncating: data only */
		{
			uint32_t u;

			memcpy(&u, &v, 4);
			h[i] = (uint16_t)(((u >> 16) & 0x8000u) |
					  ((u & 0x7fffffffu) < 0x38800000u
						   ? 0
						   : (((u & 0x7fffffffu) - (112u << 23)) >> 13)));
		}
	}
}

static void sample(const char *name, double value)
{
	printf("sample %s %.6g\n", name, value);
	fflush(stdout);
}

/* Best time of fn over at least `seconds` (one warm-up call first). */
static double best_time(void (*fn)(void *), void *arg)
{
	double best = INFINITY, start, t0, dt;

	fn(arg);
	start = now_s();
	do {
		t0 = now_s();
		fn(arg);
		dt = now_s() - t0;
		if (dt < best)
			best = dt;
	} while (now_s() - start < seconds);
	return best;
}

/* ---- CPU -------------------------------------------------------------------- */

struct conv_arg {
	struct pages *dst, *src;
};

static void run_memcpy(void *a)
{
	struct conv_arg *c = a;

	memcpy(c->dst->p[0], c->src->p[0], c->src->page_bytes * c->src->n);
}

static void run_convert(void *a)
{
	struct conv_arg *c = a;
	int ret = kref_convert_pages(&c->dst->l, c->dst->p, &c->src->l,
				     (const void *const *)c->src->p, c->src->n, 0,
				     c->src->l.block_tokens);

	if (ret < 0)
		die("kref_convert_pages", ret);
}

struct attn_arg {
	struct pages *pg;
	uint64_t n_tokens;
	float *q, *out;
};

static void run_attn(void *a)
{
	struct attn_arg *c = a;

	for (uint32_t layer = 0; layer < c->pg->l.n_layers; layer++) {
		int ret = kref_attn_decode(&c->pg->l, layer, (const void *const *)c->pg->p,
					   c->n_tokens, c->q, 32, 0.088f, c->out, NULL);

		if (ret < 0)
			die("kref_attn_decode", ret);
	}
}

struct gather_arg {
	struct pages *dst, *src;
	uint32_t *pos;
	uint64_t n;
};

static void run_gather(void *a)
{
	struct gather_arg *c = a;
	int ret = kref_gather_tokens(&c->src->l, c->dst->p, 0, (const void *const *)c->src->p,
				     (uint64_t)c->src->n * c->src->l.block_tokens, c->pos, c->n);

	if (ret < 0)
		die("kref_gather_tokens", ret);
}

struct score_arg {
	float *q, *k, *out;
	uint32_t n_q, n_k, dim, batch;
};

static void run_qk(void *a)
{
	struct score_arg *c = a;
	int ret = kref_score_qk(c->q, c->k, c->out, c->batch, c->n_q, c->n_k, c->dim, 0.088f);

	if (ret < 0)
		die("kref_score_qk", ret);
}

static void run_cosine(void *a)
{
	struct score_arg *c = a;
	int ret = kref_score_cosine(c->q, c->n_q, c->k, c->n_k, c->dim, c->out);

	if (ret < 0)
		die("kref_score_cosine", ret);
}

static const struct {
	const char *name;
	uint32_t dtype, group;
} qtypes[] = {
	{"int8", SHM_DTYPE_INT8, 32},
	{"fp8", SHM_DTYPE_FP8_E4M3, 32},
	{"int4", SHM_DTYPE_INT4, 32},
};

static void bench_cpu(uint32_t mib)
{
	uint32_t n_pages = (uint32_t)(((uint64_t)mib << 20) / shm_page_bytes(&f16_layout));
	uint64_t f16_bytes, n_tokens;
	struct pages src, copy;
	char name[64];
	double t;

	if (n_pages < 2)
		n_pages = 2;
	pages_alloc(&src, &f16_layout, n_pages);
	pages_alloc(&copy, &f16_layout, n_pages);
	fill_f16(&src);
	f16_bytes = src.page_bytes * n_pages;
	n_tokens = (uint64_t)n_pages * f16_layout.block_tokens;
	fprintf(stderr, "kvp-bench-kernel: CPU, %u pages of %zu KiB (%llu tokens)\n", n_pages,
		src.page_bytes >> 10, (unsigned long long)n_tokens);

	{
		struct conv_arg c = {&copy, &src};

		t = best_time(run_memcpy, &c);
		sample("kernel.ref.memcpy_bw", f16_bytes / t / 1e9);
	}
	for (size_t i = 0; i < sizeof(qtypes) / sizeof(qtypes[0]); i++) {
		struct shm_layout ql = f16_layout;
		struct pages q;
		struct conv_arg to_q, from_q;

		ql.dtype = qtypes[i].dtype;
		ql.quant_group = qtypes[i].group;
		pages_alloc(&q, &ql, n_pages);
		to_q = (struct conv_arg){&q, &src};
		from_q = (struct conv_arg){&copy, &q};
		t = best_time(run_convert, &to_q);
		snprintf(name, sizeof(name), "kernel.quant_%s", qtypes[i].name);
		sample(name, f16_bytes / t / 1e9);
		t = best_time(run_convert, &from_q);
		snprintf(name, sizeof(name), "kernel.dequant_%s", qtypes[i].name);
		sample(name, f16_bytes / t / 1e9);
		if (qtypes[i].dtype == SHM_DTYPE_INT8) {
			float *qv = calloc(32 * 128, sizeof(float)), *out = malloc(32 * 128 * 4);
			struct attn_arg a = {&q, n_tokens, qv, out};

			if (!qv || !out)
				die("allocation", ENOMEM);
			for (int j = 0; j < 32 * 128; j++)
				qv[j] = (float)((j * 7919) % 13) / 13.0f - 0.5f;
			t = best_time(run_attn, &a);
			sample("kernel.attn_int8",
			       (shm_page_data_bytes(&ql) + shm_page_scale_bytes(&ql)) * n_pages /
				       t / 1e9);
			free(qv);
			free(out);
		}
		pages_free(&q);
	}
	{
		float *qv = calloc(32 * 128, sizeof(float)), *out = malloc(32 * 128 * 4);
		struct attn_arg a = {&src, n_tokens, qv, out};

		if (!qv || !out)
			die("allocation", ENOMEM);
		for (int j = 0; j < 32 * 128; j++)
			qv[j] = (float)((j * 7919) % 13) / 13.0f - 0.5f;
		t = best_time(run_attn, &a);
		sample("kernel.attn_f16", f16_bytes / t / 1e9);
		free(qv);
		free(out);
	}
	{
		struct gather_arg g = {&copy, &src, malloc(n_tokens / 2 * sizeof(uint32_t)),
				       n_tokens / 2};

		if (!g.pos)
			die("allocation", ENOMEM);
		for (uint64_t i = 0; i < g.n; i++)
			g.pos[i] = (uint32_t)(2 * i);
		t = best_time(run_gather, &g);
		sample("kernel.gather", f16_bytes / 2 / t / 1e9);
		free(g.pos);
	}
	{
		/* 8 heads × 32 queries against the keys of one layer, f32 */
		struct score_arg s = {.n_q = 32, .n_k = (uint32_t)n_tokens, .dim = 128, .batch = 8};
		size_t kn = (size_t)s.batch * s.n_k * s.dim;

		s.q = calloc((size_t)s.batch * s.n_q * s.dim, sizeof(float));
		s.k = calloc(kn, sizeof(float));
		s.out = malloc((size_t)s.batch * s.n_q * s.n_k * sizeof(float));
		if (!s.q || !s.k || !s.out)
			die("allocation", ENOMEM);
		for (size_t i = 0; i < kn; i++)
			s.k[i] = (float)(i % 17) - 8.0f;
		t = best_time(run_qk, &s);
		sample("kernel.qk_scores", kn * sizeof(float) / t / 1e9);
		free(s.q);
		free(s.k);
		free(s.out);
	}
	{
		struct score_arg s = {.n_q = 64, .n_k = 4096, .dim = 128, .batch = 1};
		size_t kn = (size_t)s.n_k * s.dim;

		s.q = malloc((size_t)s.n_q * s.dim * sizeof(float));
		s.k = malloc(kn * sizeof(float));
		s.out = malloc((size_t)s.n_q * s.n_k * sizeof(float));
		if (!s.q || !s.k || !s.out)
			die("allocation", ENOMEM);
		for (size_t i = 0; i < (size_t)s.n_q * s.dim; i++)
			s.q[i] = (float)(i % 11) - 5.0f;
		for (size_t i = 0; i < kn; i++)
			s.k[i] = (float)(i % 17) - 8.0f;
		t = best_time(run_cosine, &s);
		sample("kernel.cosine", kn * sizeof(float) / t / 1e9);
		free(s.q);
		free(s.k);
		free(s.out);
	}
	pages_free(&src);
	pages_free(&copy);
}

/* ---- engine-layout adapters (CPU) ----------------------------------------- */

/* An engine cache of layout kind (0 FlashAttention [2, NB, bs, H, D], 1
 * FlashInfer HND [NB, 2, H, bs, D]) over one buffer per layer. */
static void engine_fill(struct kern_engine *e, int kind, void **k, uint32_t nb)
{
	const struct shm_layout *l = &llama3_layout;
	uint64_t D = l->head_dim, bs = l->block_tokens, H = l->n_kv_heads, blk = bs * H * D;

	memset(e, 0, sizeof(*e));
	e->k_layers = k;
	e->n_layers = l->n_layers;
	e->num_blocks = nb;
	e->block_size = l->block_tokens;
	e->n_heads = l->n_kv_heads;
	e->head_dim = l->head_dim;
	e->elem_bytes = 2;
	if (kind == 0) {
		e->block_stride = blk;
		e->token_stride = H * D;
		e->head_stride = D;
		e->v_offset = nb * blk;
	} else {
		e->block_stride = 2 * blk;
		e->token_stride = D;
		e->head_stride = bs * D;
		e->v_offset = blk;
	}
}

/* block ids 0..n-1, shuffled (an engine's free list is in no order) */
static void shuffled_ids(int32_t *ids, uint32_t n)
{
	uint64_t x = 0x243f6a8885a308d3ull;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j;
		int32_t t;

		x = x * 6364136223846793005ull + 1442695040888963407ull;
		j = (uint32_t)((x >> 33) % (i + 1));
		t = ids[i];
		ids[i] = ids[j];
		ids[j] = t;
	}
}

struct adapt_arg {
	struct pages *pg;
	struct kern_engine *e;
	const int32_t *ids;
	uint32_t dir;
	void *flat; /* memcpy reference: the engine's bytes as one block */
};

static void run_adapt(void *a)
{
	struct adapt_arg *c = a;
	int ret = kref_adapt(&c->pg->l, c->pg->p, c->pg->n, c->pg->l.block_tokens, c->e, c->ids,
			     NULL, c->dir);

	if (ret < 0)
		die("kref_adapt", ret);
}

static void run_adapt_memcpy(void *a)
{
	struct adapt_arg *c = a;

	memcpy(c->flat, c->pg->p[0], c->pg->page_bytes * c->pg->n);
}

static void bench_adapt_cpu(void)
{
	const struct shm_layout *l = &llama3_layout;
	uint32_t nb = adapt_blocks;
	size_t layer_bytes = (size_t)2 * nb * l->block_tokens * l->n_kv_heads * l->head_dim * 2;
	int32_t *ids = calloc(nb, sizeof(*ids));
	void *k[32];
	uint8_t *eng;
	struct kern_engine e;
	struct pages pg;
	double t, bytes;

	if (!ids)
		die("allocation", ENOMEM);
	pages_alloc(&pg, l, nb);
	fill_f16(&pg);
	eng = xalloc(layer_bytes * l->n_layers);
	for (uint32_t i = 0; i < l->n_layers; i++)
		k[i] = eng + layer_bytes * i;
	shuffled_ids(ids, nb);
	bytes = (double)pg.page_bytes * nb;
	fprintf(stderr, "kvp-bench-kernel: adapters, %u Llama-3-8B pages of %zu KiB\n", nb,
		pg.page_bytes >> 10);
	{
		struct adapt_arg c = {&pg, &e, ids, 0, eng};

		t = best_time(run_adapt_memcpy, &c);
		sample("kernel.ref.adapt_memcpy_bw", bytes / t / 1e9);
	}
	for (int kind = 0; kind < 2; kind++)
		for (uint32_t dir = 0; dir < 2; dir++) {
			struct adapt_arg c = {&pg, &e, ids, dir, NULL};
			char name[64];

			engine_fill(&e, kind, k, nb);
			t = best_time(run_adapt, &c);
			snprintf(name, sizeof(name), "kernel.adapt_%s_to_%s", kind ? "hnd" : "fa",
				 dir ? "pages" : "engine");
			sample(name, bytes / t / 1e9);
		}
	free(eng);
	pages_free(&pg);
	free(ids);
}

/* ---- GPU -------------------------------------------------------------------- */

#ifdef KVP_HAVE_CUDA

static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "kvp-bench-kernel: %s: %s\n", #call,                       \
				cudaGetErrorString(e_));                                           \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

struct dpages {
	struct shm_layout l;
	uint32_t n;
	size_t page_bytes;
	uint8_t *base;
	void **d_table;
};

static void dpages_alloc(struct dpages *d, const struct shm_layout *l, uint32_t n)
{
	void **table = calloc(n, sizeof(void *));

	if (!table)
		die("allocation", ENOMEM);
	d->l = *l;
	d->n = n;
	d->page_bytes = shm_page_bytes(l);
	CU(cudaMalloc((void **)&d->base, d->page_bytes * n));
	CU(cudaMemset(d->base, 0, d->page_bytes * n));
	for (uint32_t i = 0; i < n; i++)
		table[i] = d->base + d->page_bytes * i;
	CU(cudaMalloc((void **)&d->d_table, n * sizeof(void *)));
	CU(cudaMemcpy(d->d_table, table, n * sizeof(void *), cudaMemcpyHostToDevice));
	free(table);
}

static void dpages_free(struct dpages *d)
{
	cudaFree(d->base);
	cudaFree(d->d_table);
}

/* Best time (s) of fn on the stream, timed with events. */
static double gpu_best(int (*fn)(void *), void *arg)
{
	double best = INFINITY, start;
	float ms;
	int ret = fn(arg);

	if (ret < 0)
		die("GPU kernel", ret);
	CU(cudaStreamSynchronize(stream));
	start = now_s();
	do {
		CU(cudaEventRecord(ev0, stream));
		ret = fn(arg);
		if (ret < 0)
			die("GPU kernel", ret);
		CU(cudaEventRecord(ev1, stream));
		CU(cudaEventSynchronize(ev1));
		CU(cudaEventElapsedTime(&ms, ev0, ev1));
		if (ms / 1e3 < best)
			best = ms / 1e3;
	} while (now_s() - start < seconds);
	return best;
}

struct gconv {
	struct dpages *dst, *src;
};

static int gpu_memcpy(void *a)
{
	struct gconv *c = a;

	return cudaMemcpyAsync(c->dst->base, c->src->base, c->src->page_bytes * c->src->n,
			       cudaMemcpyDeviceToDevice, stream) == cudaSuccess
		       ? 0
		       : -EIO;
}

static int gpu_convert(void *a)
{
	struct gconv *c = a;

	return kcuda_convert_pages(&c->dst->l, c->dst->d_table, &c->src->l,
				   (const void *const *)c->src->d_table, c->src->n, 0,
				   c->src->l.block_tokens, stream);
}

struct gattn {
	struct dpages *pg;
	uint64_t n_tokens;
	float *q, *out;
	void *ws;
	size_t ws_bytes;
};

static int gpu_attn(void *a)
{
	struct gattn *c = a;
	int ret = 0;

	for (uint32_t layer = 0; ret == 0 && layer < c->pg->l.n_layers; layer++)
		ret = kcuda_attn_decode(&c->pg->l, layer, (const void *const *)c->pg->d_table,
					c->n_tokens, c->q, 32, 0.088f, c->out, NULL, c->ws,
					c->ws_bytes, stream);
	return ret;
}

struct ggather {
	struct dpages *dst, *src;
	uint32_t *d_pos;
	uint64_t n;
};

static int gpu_gather(void *a)
{
	struct ggather *c = a;

	return kcuda_gather_tokens(
		&c->src->l, c->dst->d_table, 0, (const void *const *)c->src->d_table,
		(uint64_t)c->src->n * c->src->l.block_tokens, c->d_pos, c->n, stream);
}

struct gqk {
	struct cublasContext *blas;
	float *q, *k, *out;
	uint32_t n_q, n_k, dim, batch;
};

static int gpu_qk(void *a)
{
	struct gqk *c = a;

	return kcuda_score_qk(c->blas, c->q, c->k, c->out, c->batch, c->n_q, c->n_k, c->dim, 0.088f,
			      stream);
}

struct gadapt {
	struct dpages *pg;
	struct kern_engine *e;
	const int32_t *d_ids;
	uint32_t dir;
	void *flat;
};

static int gpu_adapt(void *a)
{
	struct gadapt *c = a;

	return kcuda_adapt(&c->pg->l, c->pg->d_table, c->pg->n, c->pg->l.block_tokens, c->e,
			   c->d_ids, NULL, c->dir, stream);
}

static int gpu_adapt_memcpy(void *a)
{
	struct gadapt *c = a;

	return cudaMemcpyAsync(c->flat, c->pg->base, c->pg->page_bytes * c->pg->n,
			       cudaMemcpyDeviceToDevice, stream) == cudaSuccess
		       ? 0
		       : -EIO;
}

/* kcuda_adapt on device pages and a device engine cache. Called from
 * bench_gpu, with its stream and events. */
static void bench_adapt_gpu(void)
{
	const struct shm_layout *l = &llama3_layout;
	uint32_t nb = adapt_blocks;
	size_t layer_bytes = (size_t)2 * nb * l->block_tokens * l->n_kv_heads * l->head_dim * 2;
	int32_t *ids = calloc(nb, sizeof(*ids)), *d_ids;
	void *k[32], **d_k;
	uint8_t *eng;
	struct kern_engine e;
	struct dpages pg;
	double t, bytes;

	if (!ids)
		die("allocation", ENOMEM);
	dpages_alloc(&pg, l, nb);
	CU(cudaMalloc((void **)&eng, layer_bytes * l->n_layers));
	CU(cudaMemset(eng, 0, layer_bytes * l->n_layers));
	for (uint32_t i = 0; i < l->n_layers; i++)
		k[i] = eng + layer_bytes * i;
	CU(cudaMalloc((void **)&d_k, sizeof(k)));
	CU(cudaMemcpy(d_k, k, sizeof(k), cudaMemcpyHostToDevice));
	shuffled_ids(ids, nb);
	CU(cudaMalloc((void **)&d_ids, nb * sizeof(*ids)));
	CU(cudaMemcpy(d_ids, ids, nb * sizeof(*ids), cudaMemcpyHostToDevice));
	bytes = (double)pg.page_bytes * nb;
	{
		struct gadapt c = {&pg, &e, d_ids, 0, eng};

		t = gpu_best(gpu_adapt_memcpy, &c);
		sample("gpu.ref.adapt_d2d_bw", bytes / t / 1e9);
	}
	for (int kind = 0; kind < 2; kind++)
		for (uint32_t dir = 0; dir < 2; dir++) {
			struct gadapt c = {&pg, &e, d_ids, dir, NULL};
			char name[64];

			engine_fill(&e, kind, (void **)d_k, nb);
			t = gpu_best(gpu_adapt, &c);
			snprintf(name, sizeof(name), "gpu.adapt_%s_to_%s", kind ? "hnd" : "fa",
				 dir ? "pages" : "engine");
			sample(name, bytes / t / 1e9);
		}
	cudaFree(d_ids);
	cudaFree(d_k);
	cudaFree(eng);
	dpages_free(&pg);
	free(ids);
}

static void bench_gpu(uint32_t mib)
{
	uint32_t n_pages = (uint32_t)(((uint64_t)mib << 20) / shm_page_bytes(&f16_layout));
	uint64_t f16_bytes, n_tokens;
	struct dpages src, copy;
	struct cudaDeviceProp prop;
	char name[64];
	double t;

	if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		fprintf(stderr, "kvp-bench-kernel: GPU %s, %u pages of %zu KiB\n", prop.name,
			n_pages, shm_page_bytes(&f16_layout) >> 10);
	CU(cudaStreamCreate(&stream));
	CU(cudaEventCreate(&ev0));
	CU(cudaEventCreate(&ev1));
	dpages_alloc(&src, &f16_layout, n_pages);
	dpages_alloc(&copy, &f16_layout, n_pages);
	{
		/* f16 values from the CPU generator, copied up */
		struct pages h;

		pages_alloc(&h, &f16_layout, n_pages);
		fill_f16(&h);
		CU(cudaMemcpy(src.base, h.p[0], h.page_bytes * n_pages, cudaMemcpyHostToDevice));
		pages_free(&h);
	}
	f16_bytes = src.page_bytes * n_pages;
	n_tokens = (uint64_t)n_pages * f16_layout.block_tokens;
	{
		struct gconv c = {&copy, &src};

		t = gpu_best(gpu_memcpy, &c);
		sample("gpu.ref.d2d_bw", f16_bytes / t / 1e9);
	}
	for (size_t i = 0; i < sizeof(qtypes) / sizeof(qtypes[0]); i++) {
		struct shm_layout ql = f16_layout;
		struct dpages q;
		struct gconv to_q, from_q;

		ql.dtype = qtypes[i].dtype;
		ql.quant_group = qtypes[i].group;
		dpages_alloc(&q, &ql, n_pages);
		to_q = (struct gconv){&q, &src};
		from_q = (struct gconv){&copy, &q};
		t = gpu_best(gpu_convert, &to_q);
		snprintf(name, sizeof(name), "gpu.quant_%s", qtypes[i].name);
		sample(name, f16_bytes / t / 1e9);
		t = gpu_best(gpu_convert, &from_q);
		snprintf(name, sizeof(name), "gpu.dequant_%s", qtypes[i].name);
		sample(name, f16_bytes / t / 1e9);
		if (qtypes[i].dtype == SHM_DTYPE_INT8) {
			struct gattn a = {.pg = &q, .n_tokens = n_tokens};

			a.ws_bytes = kcuda_attn_workspace_bytes(&ql, 32, n_tokens);
			CU(cudaMalloc((void **)&a.q, 32 * 128 * sizeof(float)));
			CU(cudaMemset(a.q, 0, 32 * 128 * sizeof(float)));
			CU(cudaMalloc((void **)&a.out, 32 * 128 * sizeof(float)));
			CU(cudaMalloc(&a.ws, a.ws_bytes));
			t = gpu_best(gpu_attn, &a);
			sample("gpu.attn_int8",
			       (shm_page_data_bytes(&ql) + shm_page_scale_bytes(&ql)) * n_pages /
				       t / 1e9);
			cudaFree(a.q);
			cudaFree(a.out);
			cudaFree(a.ws);
		}
		dpages_free(&q);
	}
	{
		struct gattn a = {.pg = &src, .n_tokens = n_tokens};

		a.ws_bytes = kcuda_attn_workspace_bytes(&f16_layout, 32, n_tokens);
		CU(cudaMalloc((void **)&a.q, 32 * 128 * sizeof(float)));
		CU(cudaMemset(a.q, 0, 32 * 128 * sizeof(float)));
		CU(cudaMalloc((void **)&a.out, 32 * 128 * sizeof(float)));
		CU(cudaMalloc(&a.ws, a.ws_bytes));
		t = gpu_best(gpu_attn, &a);
		sample("gpu.attn_f16", f16_bytes / t / 1e9);
		cudaFree(a.q);
		cudaFree(a.out);
		cudaFree(a.ws);
	}
	{
		struct ggather g = {&copy, &src, NULL, n_tokens / 2};
		uint32_t *pos = malloc(g.n * sizeof(uint32_t));

		if (!pos)
			die("allocation", ENOMEM);
		for (uint64_t i = 0; i < g.n; i++)
			pos[i] = (uint32_t)(2 * i);
		CU(cudaMalloc((void **)&g.d_pos, g.n * sizeof(uint32_t)));
		CU(cudaMemcpy(g.d_pos, pos, g.n * sizeof(uint32_t), cudaMemcpyHostToDevice));
		t = gpu_best(gpu_gather, &g);
		sample("gpu.gather", f16_bytes / 2 / t / 1e9);
		cudaFree(g.d_pos);
		free(pos);
	}
	{
		struct gqk s = {.n_q = 32, .n_k = (uint32_t)n_tokens, .dim = 128, .batch = 8};
		size_t kn = (size_t)s.batch * s.n_k * s.dim;
		int ret = kcuda_blas_create(&s.blas);

		if (ret < 0)
			die("cuBLAS", ret);
		CU(cudaMalloc((void **)&s.q, (size_t)s.batch * s.n_q * s.dim * sizeof(float)));
		CU(cudaMemset(s.q, 0, (size_t)s.batch * s.n_q * s.dim * sizeof(float)));
		CU(cudaMalloc((void **)&s.k, kn * sizeof(float)));
		CU(cudaMemset(s.k, 0, kn * sizeof(float)));
		CU(cudaMalloc((void **)&s.out, (size_t)s.batch * s.n_q * s.n_k * sizeof(float)));
		t = gpu_best(gpu_qk, &s);
		sample("gpu.qk_scores", kn * sizeof(float) / t / 1e9);
		cudaFree(s.q);
		cudaFree(s.k);
		cudaFree(s.out);
		kcuda_blas_destroy(s.blas);
	}
	dpages_free(&src);
	dpages_free(&copy);
	if (adapt_blocks)
		bench_adapt_gpu();
	cudaEventDestroy(ev0);
	cudaEventDestroy(ev1);
	cudaStreamDestroy(stream);
}

#endif /* KVP_HAVE_CUDA */

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"seconds", required_argument, NULL, 's'},
		{"mib", required_argument, NULL, 'm'},
		{"gpu-mib", required_argument, NULL, 'G'},
		{"no-gpu", no_argument, NULL, 'n'},
		{"gpu-only", no_argument, NULL, 'g'},
		{"adapt-blocks", required_argument, NULL, 'a'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	unsigned long mib = 64, gpu_mib = 1024;
	int opt, gpu = 1, cpu = 1;

	while ((opt = getopt_long(argc, argv, "s:m:h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			seconds = strtod(optarg, NULL);
			break;
		case 'm':
			mib = strtoul(optarg, NULL, 10);
			break;
		case 'G':
			gpu_mib = strtoul(optarg, NULL, 10);
			break;
		case 'a':
			adapt_blocks = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'n':
			gpu = 0;
			break;
		case 'g':
			cpu = 0;
			break;
		case 'h':
			printf("Usage: kvp-bench-kernel [--seconds S] [--mib N] [--gpu-mib N] "
			       "[--adapt-blocks N] [--no-gpu | --gpu-only]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (!(seconds > 0 && seconds < 600) || mib < 1 || mib > 65536 || gpu_mib < 1 ||
	    gpu_mib > 1u << 20 || adapt_blocks > 65536) {
		fprintf(stderr, "kvp-bench-kernel: bad argument\n");
		return 2;
	}
	if (cpu)
		bench_cpu((uint32_t)mib);
	if (cpu && adapt_blocks)
		bench_adapt_cpu();
#ifdef KVP_HAVE_CUDA
	if (gpu && kcuda_device_count() > 0)
		bench_gpu((uint32_t)gpu_mib);
	else if (gpu)
		fprintf(stderr, "kvp-bench-kernel: no usable GPU: GPU figures skipped\n");
#else
	if (gpu)
		fprintf(stderr, "kvp-bench-kernel: built without CUDA: GPU figures skipped\n");
#endif
	return 0;
}
