/* tests/gpu/test_gpu.c — every CUDA kernel against its C reference.
 *
 * Exits 77 (skip) when CUDA was not built or no GPU is usable (any CUDA
 * error at start, as kvpalace treats it). Otherwise, on random and edge-case
 * inputs: page conversion between every pair of dtypes is bit-identical to
 * kref_convert_pages (garbage pages too, up to NaN payloads), token ranges
 * touch nothing else; attention decode matches the reference within
 * 2e-5 max|v| (weights within 2e-5 of their value + 1e-7) for MHA, GQA,
 * MQA and groups wider than a block, contexts from one token to several
 * chunks, and stays within the reference's own bound of double precision;
 * compaction and the f32 row gather are bit-identical (out-of-range
 * positions skipped); Q·Kᵀ through cuBLAS and cosine similarity are within
 * the float dot-product bounds of kernels.h of exact values; bad arguments
 * are refused. Each launcher runs on a created stream. Single-threaded.
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
#include <math.h>
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

static void sync_ok(void)
{
	CU(cudaStreamSynchronize(stream));
	CU(cudaGetLastError());
}

/* A page table on the device mirroring a host one. */
struct dpages {
	uint32_t n;
	size_t page_bytes;
	void **pages;	/* host array of device pointers */
	void **d_table; /* device array of the same */
};

static void dpages_upload(struct dpages *d, const struct kt_pages *h)
{
	d->n = h->n_pages;
	d->page_bytes = h->page_bytes;
	d->pages = calloc(d->n, sizeof(void *));
	assert_non_null(d->pages);
	for (uint32_t i = 0; i < d->n; i++)
		d->pages[i] = upload(h->pages[i], h->page_bytes);
	d->d_table = upload(d->pages, d->n * sizeof(void *));
}

static void dpages_download(const struct dpages *d, struct kt_pages *h)
{
	for (uint32_t i = 0; i < d->n; i++)
		CU(cudaMemcpy(h->pages[i], d->pages[i], d->page_bytes, cudaMemcpyDeviceToHost));
}

static void dpages_free(struct dpages *d)
{
	for (uint32_t i = 0; i < d->n; i++)
		cudaFree(d->pages[i]);
	cudaFree(d->d_table);
	free(d->pages);
}

static void fill_random(struct kt_pages *p, uint64_t n_tokens, uint64_t seed, int edge)
{
	float row[SHM_MAX_HEAD_DIM];
	uint64_t rng = seed;

	for (uint64_t t = 0; t < n_tokens; t++)
		for (uint32_t layer = 0; layer < p->l.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < p->l.n_kv_heads; h++) {
					for (uint32_t i = 0; i < p->l.head_dim; i++) {
						row[i] = kt_normal(&rng);
						if (i % 16 == 3)
							row[i] *= 8.0f;
					}
					if (edge) {
						static const float special[] = {
							0.0f,	  -0.0f,  1e-9f,    -3e-7f,
							7e4f,	  -1e30f, INFINITY, -INFINITY,
							65504.0f, 448.0f};
						uint64_t r = kt_next(&rng);

						row[r % p->l.head_dim] = special[(r >> 20) % 10];
						if (t % 7 == 0) /* a whole row of zeros */
							memset(row, 0,
							       p->l.head_dim * sizeof(float));
					}
					kt_store_row(p, t, layer, kv, h, row);
				}
}

/* Bytes equal, or both elements NaN in dtype (NaN payloads differ between
 * CPU and GPU arithmetic). Compares the data and scales parts of pages. */
static void assert_pages_equal(const struct shm_layout *l, const struct kt_pages *a,
			       const struct kt_pages *b, int nan_ok, const char *what)
{
	uint64_t data = shm_page_data_bytes(l), total = data + shm_page_scale_bytes(l);

	for (uint32_t i = 0; i < a->n_pages; i++) {
		const uint8_t *x = a->pages[i], *y = b->pages[i];

		if (memcmp(x, y, total) == 0)
			continue;
		for (uint64_t o = 0; o < total; o++) {
			if (x[o] == y[o])
				continue;
			if (nan_ok && o < data &&
			    (l->dtype == SHM_DTYPE_F16 || l->dtype == SHM_DTYPE_BF16 ||
			     l->dtype == SHM_DTYPE_F32)) {
				struct kern_fmt f = {l->dtype, 0}, f32 = {SHM_DTYPE_F32, 0};
				uint32_t eb = shm_dtype_bits(l->dtype) / 8;
				uint64_t e0 = o / eb * eb;
				float fx, fy;

				kref_convert_rows(f32, &fx, NULL, f, x + e0, NULL, 1, 1);
				kref_convert_rows(f32, &fy, NULL, f, y + e0, NULL, 1, 1);
				if (isnan(fx) && isnan(fy))
					continue;
			}
			fail_msg("%s: page %u byte %llu: GPU 0x%02x, reference 0x%02x", what, i,
				 (unsigned long long)o, y[o], x[o]);
		}
	}
}

/* ---- conversion ------------------------------------------------------------- */

static const struct {
	uint32_t dtype, group;
} fmts[] = {
	{SHM_DTYPE_F16, 0},   {SHM_DTYPE_BF16, 0},	{SHM_DTYPE_F32, 0},
	{SHM_DTYPE_INT8, 32}, {SHM_DTYPE_FP8_E4M3, 16}, {SHM_DTYPE_INT4, 8},
};
#define N_FMTS (sizeof(fmts) / sizeof(fmts[0]))

static void convert_case(uint32_t sf, uint32_t df, uint32_t hd, uint32_t tok0, uint32_t n_tok,
			 int edge, int garbage)
{
	struct shm_layout sl = {2, 3, hd, 16, fmts[sf].dtype, fmts[sf].group};
	struct shm_layout dl = {2, 3, hd, 16, fmts[df].dtype, fmts[df].group};
	struct kt_pages src, want, got;
	struct dpages dsrc, ddst;
	char what[96];

	if (sl.quant_group && hd % sl.quant_group)
		sl.quant_group = 4;
	if (dl.quant_group && hd % dl.quant_group)
		dl.quant_group = 4;
	kt_pages_alloc(&src, &sl, 5);
	kt_pages_alloc(&want, &dl, 5);
	kt_pages_alloc(&got, &dl, 5);
	fill_random(&src, 5 * 16, 100 + sf * 7 + df, edge);
	if (garbage) {
		uint64_t rng = 9 + sf;

		for (uint32_t i = 0; i < src.n_pages; i++)
			for (size_t b = 0; b < src.page_bytes; b++)
				((uint8_t *)src.pages[i])[b] = (uint8_t)kt_next(&rng);
	}
	for (uint32_t i = 0; i < 5; i++) {
		memset(want.pages[i], 0x3c, want.page_bytes);
		memset(got.pages[i], 0x3c, got.page_bytes);
	}
	dpages_upload(&dsrc, &src);
	dpages_upload(&ddst, &got);
	assert_int_equal(kref_convert_pages(&dl, want.pages, &sl, (const void *const *)src.pages, 5,
					    tok0, n_tok),
			 0);
	assert_int_equal(kcuda_convert_pages(&dl, ddst.d_table, &sl,
					     (const void *const *)dsrc.d_table, 5, tok0, n_tok,
					     stream),
			 0);
	sync_ok();
	dpages_download(&ddst, &got);
	snprintf(what, sizeof(what), "convert %s/%u → %s/%u, head_dim %u, tokens %u+%u%s",
		 shm_dtype_name(sl.dtype), sl.quant_group, shm_dtype_name(dl.dtype), dl.quant_group,
		 hd, tok0, n_tok, garbage ? " (garbage)" : "");
	assert_pages_equal(&dl, &want, &got, garbage || edge, what);
	/* the padding after data and scales is never written */
	for (uint32_t i = 0; i < 5; i++)
		for (size_t b = shm_page_data_bytes(&dl) + shm_page_scale_bytes(&dl);
		     b < got.page_bytes; b++)
			assert_int_equal(((uint8_t *)got.pages[i])[b], 0x3c);
	dpages_free(&dsrc);
	dpages_free(&ddst);
	kt_pages_free(&src);
	kt_pages_free(&want);
	kt_pages_free(&got);
}

static void test_convert(void **state)
{
	for (uint32_t s = 0; s < N_FMTS; s++)
		for (uint32_t d = 0; d < N_FMTS; d++) {
			convert_case(s, d, 128, 0, 16, 0, 0);
			convert_case(s, d, 24, 3, 7, 1, 0);
			convert_case(s, d, 64, 0, 16, 0, 1);
		}
	/* head_dim 1024, the largest: one row per tile */
	convert_case(1, 3, 1024, 0, 16, 1, 0);
	convert_case(3, 5, 1024, 5, 2, 0, 0);
}

/* ---- attention ----------------------------------------------------------------- */

static void attn_case(uint32_t f, uint32_t n_kv, uint32_t n_q, uint32_t hd, uint64_t n,
		      int with_weights)
{
	struct shm_layout l = {2, n_kv, hd, 16, fmts[f].dtype, fmts[f].group};
	struct kt_pages p;
	struct dpages dp;
	size_t qn = (size_t)n_q * hd, ws_bytes;
	float *q = malloc(qn * sizeof(float)), *o_ref = malloc(qn * sizeof(float));
	float *o_gpu = malloc(qn * sizeof(float));
	float *w_ref = malloc(n_q * n * sizeof(float)), *w_gpu = malloc(n_q * n * sizeof(float));
	double *o_d = malloc(qn * sizeof(double)), *w_d = malloc(n_q * n * sizeof(double));
	float *d_q, *d_out, *d_w = NULL, row[SHM_MAX_HEAD_DIM], vmax = 0.0f;
	void *d_ws;
	uint64_t rng = 1000 + n;

	assert_non_null(q);
	assert_non_null(o_ref);
	assert_non_null(o_gpu);
	assert_non_null(w_ref);
	assert_non_null(w_gpu);
	assert_non_null(o_d);
	assert_non_null(w_d);
	if (l.quant_group && hd % l.quant_group)
		l.quant_group = 8;
	kt_pages_alloc(&p, &l, kt_pages_for(&l, n));
	fill_random(&p, n, 7 + f, 0);
	for (size_t i = 0; i < qn; i++)
		q[i] = kt_normal(&rng);
	for (uint64_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < n_kv; h++) {
			kt_load_row(&p, t, 1, 1, h, row);
			vmax = fmaxf(vmax, kt_max_abs(row, hd));
		}
	dpages_upload(&dp, &p);
	d_q = upload(q, qn * sizeof(float));
	d_out = dmalloc(qn * sizeof(float));
	if (with_weights)
		d_w = dmalloc(n_q * n * sizeof(float));
	ws_bytes = kcuda_attn_workspace_bytes(&l, n_q, n);
	d_ws = dmalloc(ws_bytes);
	assert_int_equal(kref_attn_decode(&l, 1, (const void *const *)p.pages, n, q, n_q,
					  1.0f / sqrtf((float)hd), o_ref, w_ref),
			 0);
	assert_int_equal(kcuda_attn_decode(&l, 1, (const void *const *)dp.d_table, n, d_q, n_q,
					   1.0f / sqrtf((float)hd), d_out, d_w, d_ws, ws_bytes,
					   stream),
			 0);
	sync_ok();
	CU(cudaMemcpy(o_gpu, d_out, qn * sizeof(float), cudaMemcpyDeviceToHost));
	if (with_weights)
		CU(cudaMemcpy(w_gpu, d_w, n_q * n * sizeof(float), cudaMemcpyDeviceToHost));
	kt_attn_double(&p, 1, n, q, n_q, 1.0f / sqrtf((float)hd), o_d, w_d);
	for (size_t i = 0; i < qn; i++) {
		double e_ref = fabs(o_gpu[i] - o_ref[i]) / vmax;
		double e_d = fabs(o_gpu[i] - o_d[i]) / vmax;

		if (!(e_ref <= 2e-5) || !(e_d <= 1e-5))
			fail_msg("attention %s n_kv %u n_q %u head_dim %u n %llu: output %zu: "
				 "GPU %.9g, reference %.9g, double %.9g",
				 shm_dtype_name(l.dtype), n_kv, n_q, hd, (unsigned long long)n, i,
				 o_gpu[i], o_ref[i], o_d[i]);
	}
	for (size_t i = 0; with_weights && i < n_q * n; i++)
		if (!(fabs(w_gpu[i] - w_ref[i]) <= 2e-5 * w_ref[i] + 1e-7))
			fail_msg("attention %s n %llu: weight %zu: GPU %.9g, reference %.9g",
				 shm_dtype_name(l.dtype), (unsigned long long)n, i, w_gpu[i],
				 w_ref[i]);
	/* too small a workspace is refused */
	assert_int_equal(kcuda_attn_decode(&l, 1, (const void *const *)dp.d_table, n, d_q, n_q,
					   1.0f, d_out, NULL, d_ws, ws_bytes - 1, stream),
			 -ENOSPC);
	cudaFree(d_q);
	cudaFree(d_out);
	cudaFree(d_w);
	cudaFree(d_ws);
	dpages_free(&dp);
	kt_pages_free(&p);
	free(q);
	free(o_ref);
	free(o_gpu);
	free(w_ref);
	free(w_gpu);
	free(o_d);
	free(w_d);
}

static void test_attention(void **state)
{
	for (uint32_t f = 0; f < N_FMTS; f++) {
		attn_case(f, 2, 8, 128, 1, 1);	 /* GQA, one token */
		attn_case(f, 1, 4, 64, 37, 1);	 /* MQA, partial page */
		attn_case(f, 2, 2, 24, 300, 0);	 /* MHA, odd head_dim, 2 chunks */
		attn_case(f, 1, 20, 64, 700, 1); /* a group wider than a block */
	}
	attn_case(1, 8, 32, 128, 5000, 1); /* Llama-like, many chunks */
	attn_case(1, 1, 2, 1024, 70, 0);   /* the largest head_dim */
}

/* ---- gathers -------------------------------------------------------------------- */

static void test_gather(void **state)
{
	for (uint32_t f = 0; f < N_FMTS; f++) {
		struct shm_layout l = {3, 2, 64, 16, fmts[f].dtype, fmts[f].group};
		uint32_t pos[60], *d_pos;
		uint64_t n = 0, n_src = 200;
		struct kt_pages src, want, got;
		struct dpages dsrc, ddst;
		float *dense_ref = malloc(150 * 64 * sizeof(float));
		float *dense_gpu = malloc(150 * 64 * sizeof(float)), *d_dense;

		assert_non_null(dense_ref);
		assert_non_null(dense_gpu);
		for (uint32_t t = 0; t < 4; t++)
			pos[n++] = t;
		for (uint32_t t = 150; t < 200; t++)
			pos[n++] = t;
		kt_pages_alloc(&src, &l, kt_pages_for(&l, n_src));
		kt_pages_alloc(&want, &l, 5);
		kt_pages_alloc(&got, &l, 5);
		fill_random(&src, n_src, 55 + f, 1);
		for (uint32_t i = 0; i < 5; i++) {
			memset(want.pages[i], 0xee, want.page_bytes);
			memset(got.pages[i], 0xee, got.page_bytes);
		}
		dpages_upload(&dsrc, &src);
		dpages_upload(&ddst, &got);
		d_pos = upload(pos, n * sizeof(uint32_t));
		assert_int_equal(kref_gather_tokens(&l, want.pages, 9,
						    (const void *const *)src.pages, n_src, pos, n),
				 0);
		assert_int_equal(kcuda_gather_tokens(&l, ddst.d_table, 9,
						     (const void *const *)dsrc.d_table, n_src,
						     d_pos, n, stream),
				 0);
		sync_ok();
		dpages_download(&ddst, &got);
		assert_pages_equal(&l, &want, &got, 0, "gather tokens");
		/* an out-of-range position skips its token, the others land */
		pos[1] = 999;
		CU(cudaMemcpy(d_pos, pos, n * sizeof(uint32_t), cudaMemcpyHostToDevice));
		for (uint32_t i = 0; i < 5; i++)
			CU(cudaMemset(ddst.pages[i], 0xee, ddst.page_bytes));
		assert_int_equal(kcuda_gather_tokens(&l, ddst.d_table, 9,
						     (const void *const *)dsrc.d_table, n_src,
						     d_pos, n, stream),
				 0);
		sync_ok();
		dpages_download(&ddst, &got);
		for (uint32_t layer = 0; layer < 3; layer++) {
			const uint8_t *r =
				(const uint8_t *)got.pages[0] + shm_kv_offset(&l, layer, 1, 1, 10);
			const uint8_t *r0 =
				(const uint8_t *)got.pages[0] + shm_kv_offset(&l, layer, 1, 1, 9);
			const uint8_t *w0 =
				(const uint8_t *)want.pages[0] + shm_kv_offset(&l, layer, 1, 1, 9);

			for (uint64_t b = 0; b < shm_row_bytes(&l); b++)
				assert_int_equal(r[b], 0xee);
			assert_memory_equal(r0, w0, shm_row_bytes(&l));
		}
		/* dense f32 rows */
		d_dense = dmalloc(150 * 64 * sizeof(float));
		assert_int_equal(kref_gather_rows_f32(&l, (const void *const *)src.pages, 2, 1, 1,
						      40, 150, dense_ref),
				 0);
		assert_int_equal(kcuda_gather_rows_f32(&l, (const void *const *)dsrc.d_table, 2, 1,
						       1, 40, 150, d_dense, stream),
				 0);
		sync_ok();
		CU(cudaMemcpy(dense_gpu, d_dense, 150 * 64 * sizeof(float),
			      cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < 150 * 64; i++)
			if (memcmp(&dense_ref[i], &dense_gpu[i], sizeof(float)) &&
			    !(isnan(dense_ref[i]) && isnan(dense_gpu[i])))
				fail_msg("%s rows f32: element %zu GPU %.9g reference %.9g",
					 shm_dtype_name(l.dtype), i, dense_gpu[i], dense_ref[i]);
		cudaFree(d_dense);
		cudaFree(d_pos);
		dpages_free(&dsrc);
		dpages_free(&ddst);
		kt_pages_free(&src);
		kt_pages_free(&want);
		kt_pages_free(&got);
		free(dense_ref);
		free(dense_gpu);
	}
}

/* ---- scores -------------------------------------------------------------------- */

static void test_scores(void **state)
{
	static const uint32_t shapes[][4] = {
		{1, 1, 1, 1},
		{3, 4, 37, 64},
		{8, 16, 1000, 128},
		{2, 5, 9, 13},
	};
	struct cublasContext *blas;
	uint64_t rng = 77;

	assert_int_equal(kcuda_blas_create(&blas), 0);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		uint32_t b = shapes[s][0], nq = shapes[s][1], nk = shapes[s][2], dim = shapes[s][3];
		size_t qn = (size_t)b * nq * dim, kn = (size_t)b * nk * dim,
		       sn = (size_t)b * nq * nk;
		float *q = malloc(qn * 4), *k = malloc(kn * 4), *sc = malloc(sn * 4);
		float alpha = 1.0f / sqrtf((float)dim), *d_q, *d_k, *d_s;

		assert_non_null(q);
		assert_non_null(k);
		assert_non_null(sc);
		for (size_t i = 0; i < qn; i++)
			q[i] = kt_normal(&rng) * 3;
		for (size_t i = 0; i < kn; i++)
			k[i] = kt_normal(&rng);
		d_q = upload(q, qn * 4);
		d_k = upload(k, kn * 4);
		d_s = dmalloc(sn * 4);
		assert_int_equal(kcuda_score_qk(blas, d_q, d_k, d_s, b, nq, nk, dim, alpha, stream),
				 0);
		sync_ok();
		CU(cudaMemcpy(sc, d_s, sn * 4, cudaMemcpyDeviceToHost));
		for (uint32_t bb = 0; bb < b; bb++)
			for (uint32_t i = 0; i < nq; i++)
				for (uint32_t j = 0; j < nk; j++) {
					const float *qi = q + ((size_t)bb * nq + i) * dim;
					const float *kj = k + ((size_t)bb * nk + j) * dim;
					double want = alpha * kt_dot_exact(qi, kj, dim);
					float got = sc[((size_t)bb * nq + i) * nk + j];

					if (!(fabs(got - want) <= kt_qk_bound(qi, kj, dim, alpha)))
						fail_msg(
							"Q·Kᵀ batch %u (%u, %u), dim %u: GPU %.9g, "
							"exact %.9g",
							bb, i, j, dim, got, want);
				}
		cudaFree(d_q);
		cudaFree(d_k);
		cudaFree(d_s);
		free(q);
		free(k);
		free(sc);
	}
	assert_int_equal(kcuda_score_qk(blas, NULL, NULL, NULL, 0, 1, 1, 1, 1.0f, stream), -EINVAL);
	kcuda_blas_destroy(blas);

	/* cosine */
	{
		const uint32_t na = 9, nb = 700, dim = 96;
		float *a = malloc(na * dim * 4), *bv = malloc(nb * dim * 4);
		float *sim = malloc(na * nb * 4), *d_a, *d_b, *d_sim;

		assert_non_null(a);
		assert_non_null(bv);
		assert_non_null(sim);
		for (uint32_t i = 0; i < na * dim; i++)
			a[i] = kt_normal(&rng);
		for (uint32_t i = 0; i < nb * dim; i++)
			bv[i] = kt_normal(&rng) * 0.01f;
		memset(bv + 5 * dim, 0, dim * 4); /* a zero vector: similarity 0 */
		d_a = upload(a, na * dim * 4);
		d_b = upload(bv, nb * dim * 4);
		d_sim = dmalloc(na * nb * 4);
		assert_int_equal(kcuda_score_cosine(d_a, na, d_b, nb, dim, d_sim, stream), 0);
		sync_ok();
		CU(cudaMemcpy(sim, d_sim, na * nb * 4, cudaMemcpyDeviceToHost));
		for (uint32_t i = 0; i < na; i++)
			for (uint32_t j = 0; j < nb; j++) {
				const float *ai = a + i * dim, *bj = bv + j * dim;
				double den =
					sqrt(kt_dot_exact(ai, ai, dim) * kt_dot_exact(bj, bj, dim));
				double want = den > 0 ? kt_dot_exact(ai, bj, dim) / den : 0.0;

				if (!(fabs(sim[i * nb + j] - want) <= kt_cosine_bound(dim)))
					fail_msg("cosine (%u, %u): GPU %.9g, exact %.9g", i, j,
						 sim[i * nb + j], want);
			}
		assert_true(sim[5] == 0.0f);
		cudaFree(d_a);
		cudaFree(d_b);
		cudaFree(d_sim);
		free(a);
		free(bv);
		free(sim);
	}
}

static void test_bad_arguments(void **state)
{
	struct shm_layout good = {2, 2, 64, 16, SHM_DTYPE_F16, 0};
	struct shm_layout bad = {2, 2, 64, 16, SHM_DTYPE_INT8, 48};
	struct shm_layout other = {2, 4, 64, 16, SHM_DTYPE_F16, 0};

	assert_int_equal(kcuda_convert_pages(&good, NULL, &bad, NULL, 1, 0, 16, stream), -EINVAL);
	assert_int_equal(kcuda_convert_pages(&good, NULL, &other, NULL, 1, 0, 16, stream), -EINVAL);
	assert_int_equal(kcuda_convert_pages(&good, NULL, &good, NULL, 1, 10, 7, stream), -EINVAL);
	assert_int_equal(kcuda_attn_decode(&good, 2, NULL, 1, NULL, 4, 1.0f, NULL, NULL, NULL,
					   1 << 20, stream),
			 -EINVAL);
	assert_int_equal(kcuda_attn_decode(&good, 0, NULL, 1, NULL, 3, 1.0f, NULL, NULL, NULL,
					   1 << 20, stream),
			 -EINVAL);
	assert_int_equal(kcuda_attn_decode(&good, 0, NULL, 0, NULL, 4, 1.0f, NULL, NULL, NULL,
					   1 << 20, stream),
			 -EINVAL);
	assert_int_equal(kcuda_gather_rows_f32(&good, NULL, 0, 2, 0, 0, 1, NULL, stream), -EINVAL);
	assert_int_equal(kcuda_score_cosine(NULL, 0, NULL, 1, 1, NULL, stream), -EINVAL);
	/* nothing to do is fine and launches nothing */
	assert_int_equal(kcuda_convert_pages(&good, NULL, &good, NULL, 0, 0, 16, stream), 0);
	assert_int_equal(kcuda_gather_tokens(&good, NULL, 0, NULL, 0, NULL, 0, stream), 0);
	sync_ok();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_convert),	      cmocka_unit_test(test_attention),
		cmocka_unit_test(test_gather),	      cmocka_unit_test(test_scores),
		cmocka_unit_test(test_bad_arguments),
	};
	int n = kcuda_device_count(), ret;
	struct cudaDeviceProp prop;

	if (n < 0) {
		printf("no usable GPU (the CUDA runtime reports an error): skipped\n");
		return 77;
	}
	if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		printf("GPU 0: %s, compute capability %d.%d, %zu MiB\n", prop.name, prop.major,
		       prop.minor, prop.totalGlobalMem >> 20);
	if (cudaStreamCreate(&stream) != cudaSuccess) {
		printf("cannot create a CUDA stream: skipped\n");
		return 77;
	}
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	cudaStreamDestroy(stream);
	return ret;
}

#endif
