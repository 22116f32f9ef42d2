/* bench/gpu_bench.c — kvp-bench-gpu: the GPU tier against what it
 * replaces, measured in the same run on the same GPU.
 *
 *  - gpu.migrate_h2d_bw: a GPU-tier match of a cold prefix (the daemon
 *    copies every page host→device on its stream, LeaseDevice answers when
 *    done; the daemon runs with gpu watermarks 0.01 so no copy stays cached),
 *    in GB/s, next to gpu.ref.pinned_h2d_bw, a plain cudaMemcpy of the
 *    same bytes from pinned memory.
 *  - gpu.vmm_d2h_bw: reading the leased device pages back to pinned host
 *    memory through this process's VMM mapping of the arena, next to
 *    gpu.ref.pinned_d2h_bw from a cudaMalloc buffer. (The daemon never
 *    copies device→host: device pages are copies of host pages, and
 *    leaving the GPU drops the copy.)
 *  - restore.*: bringing a 4096-token prefix of the Llama-3-8B layout (32
 *    layers, 8 KV heads, head dim 128, f16: 512 MiB) onto the GPU through
 *    the daemon, in ms, next to restore.ref.prefill_gemm_ms, the cuBLAS
 *    GEMMs of the prefill it saves (per layer: QKV, O, gate+up and down
 *    projections of 4096 tokens, f16 in, f32 accumulation; attention left
 *    out, so the reference is a lower bound of the prefill).
 *
 * Prints "sample NAME VALUE" lines (bench/bench_util.h). Needs a running
 * kvpalaced with a GPU tier (--socket), as tests/gpu/run.sh starts one.
 * Exits 77 where there is no usable GPU, in a build without CUDA, or when
 * the daemon has no GPU tier, so a run without a GPU skips cleanly.
 */
#define BENCH_PROG "kvp-bench-gpu"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvpalace.h"

#ifdef KVP_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define CU(x)                                                                                      \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess)                                                             \
			die("%s: %s", #x, cudaGetErrorString(e_));                                 \
	} while (0)

static const struct kvp_layout llama3_8b = {
	.n_layers = 32,
	.n_kv_heads = 8,
	.head_dim = 128,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

static int reps = 5;

/* Best of reps plain copies of n bytes, in seconds. */
static double best_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	double best = 1e30;

	for (int r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();
		double t;

		CU(cudaMemcpy(dst, src, n, kind));
		t = (now_ns() - t0) / 1e9;
		if (t < best)
			best = t;
	}
	return best;
}

/* Commits n_tokens tokens (ids from seed) whose pages hold a byte
 * pattern; the content is irrelevant to a copy. */
static void commit_prefix(kvp_pool *p, uint32_t *tokens, size_t n_tokens, uint32_t seed)
{
	size_t page_bytes = kvp_pool_page_bytes(p);
	kvp_session *s;

	for (size_t i = 0; i < n_tokens; i++)
		tokens[i] = seed * 1000003u + (uint32_t)i;
	if (kvp_session_create(p, &s) < 0 || kvp_append(s, tokens, n_tokens) < 0)
		die("cannot reserve %zu tokens", n_tokens);
	for (size_t pos = 0; pos < n_tokens; pos += llama3_8b.block_tokens) {
		void *page = kvp_session_kv(s, pos, 0, 0, 0);

		if (!page)
			die("no page for position %zu", pos);
		memset(page, (int)(pos / llama3_8b.block_tokens), page_bytes);
	}
	if (kvp_commit(s, n_tokens) < 0)
		die("cannot commit");
}

/* A cold GPU-tier match of tokens: seconds, and the lease (held). */
static double gpu_match(kvp_pool *p, const uint32_t *tokens, size_t n, kvp_lease **ret)
{
	uint64_t t0 = now_ns();
	int ret_code = kvp_match_prefix_tier(p, tokens, n, KVP_TIER_GPU, 0, ret);

	if (ret_code < 0)
		die("GPU match: %s", kvp_strerror(NULL, ret_code));
	if (kvp_lease_tier(*ret) != KVP_TIER_GPU || kvp_lease_tokens(*ret) != n)
		die("GPU match served %llu tokens from tier %u",
		    (unsigned long long)kvp_lease_tokens(*ret), kvp_lease_tier(*ret));
	return (now_ns() - t0) / 1e9;
}

/* The prefill GEMMs of one forward pass over n_tokens (Llama-3-8B), in
 * seconds: best of reps. */
static double prefill_gemms(int n_tokens)
{
	const int ff = 14336, layers = 32;
	const float one = 1.0f, zero = 0.0f;
	size_t wmax = (size_t)4096 * 2 * ff; /* gate+up is the largest weight */
	void *x, *w, *y;
	cudaEvent_t e0, e1;
	cublasHandle_t h;
	double best = 1e30;

	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
		die("cublasCreate failed");
	CU(cudaMalloc(&x, (size_t)n_tokens * ff * 2));
	CU(cudaMalloc(&w, wmax * 2));
	CU(cudaMalloc(&y, (size_t)n_tokens * 2 * ff * 2));
	CU(cudaMemset(x, 0, (size_t)n_tokens * ff * 2));
	CU(cudaMemset(w, 0, wmax * 2));
	CU(cudaEventCreate(&e0));
	CU(cudaEventCreate(&e1));
	for (int r = 0; r < reps; r++) {
		/* {out features, in features} of each projection. */
		static const int shapes[4][2] = {
			{4096 + 2 * 1024, 4096}, {4096, 4096}, {2 * 14336, 4096}, {4096, 14336}};
		float ms = 0;

		CU(cudaEventRecord(e0, 0));
		for (int l = 0; l < layers; l++)
			for (int g = 0; g < 4; g++)
				if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, shapes[g][0],
						 n_tokens, shapes[g][1], &one, w, CUDA_R_16F,
						 shapes[g][1], x, CUDA_R_16F, shapes[g][1], &zero,
						 y, CUDA_R_16F, shapes[g][0], CUBLAS_COMPUTE_32F,
						 CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
					die("cublasGemmEx failed");
		CU(cudaEventRecord(e1, 0));
		CU(cudaEventSynchronize(e1));
		CU(cudaEventElapsedTime(&ms, e0, e1));
		if (ms / 1e3 < best)
			best = ms / 1e3;
	}
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(x);
	cudaFree(w);
	cudaFree(y);
	cublasDestroy(h);
	return best;
}

static int bench(const char *sock, int tokens)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	uint32_t *toks = malloc((size_t)tokens * sizeof(uint32_t));
	size_t bytes;
	void *h_pinned, *d_buf, *h_back;
	double t, best;
	int ret, n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		printf("no usable GPU: skipped\n");
		return 77;
	}
	if (!toks)
		die("out of memory");
	ret = kvp_connect(sock, &c);
	if (ret < 0)
		die("cannot connect to %s: %s", sock ? sock : "(default)", kvp_strerror(NULL, ret));
	ret = kvp_pool_open(c, "kvp-bench-gpu-llama-3-8b", &llama3_8b, &p);
	if (ret < 0)
		die("OpenPool: %s", kvp_strerror(c, ret));
	if (!kvp_pool_has_gpu(p)) {
		printf("the daemon has no GPU tier for the pool: skipped\n");
		kvp_disconnect(c);
		return 77;
	}
	ret = kvp_pool_gpu_open(p);
	if (ret < 0)
		die("cannot map the device arena: %s", kvp_strerror(c, ret));
	commit_prefix(p, toks, (size_t)tokens, 1);
	bytes = (size_t)tokens / llama3_8b.block_tokens * kvp_pool_page_bytes(p);

	/* References: plain pinned copies of the same bytes. */
	CU(cudaMallocHost(&h_pinned, bytes));
	CU(cudaMallocHost(&h_back, bytes));
	CU(cudaMalloc(&d_buf, bytes));
	memset(h_pinned, 1, bytes);
	t = best_copy(d_buf, h_pinned, bytes, cudaMemcpyHostToDevice);
	sample("gpu.ref.pinned_h2d_bw", bytes / t / 1e9);
	t = best_copy(h_back, d_buf, bytes, cudaMemcpyDeviceToHost);
	sample("gpu.ref.pinned_d2h_bw", bytes / t / 1e9);

	/* The daemon's migration: cold every time (watermarks 0.01). */
	best = 1e30;
	for (int r = 0; r < reps; r++) {
		t = gpu_match(p, toks, (size_t)tokens, &l);
		if (t < best)
			best = t;
		if (r == reps - 1) {
			/* Read back through our own mapping, page by page as a
			 * consumer would (pages are not contiguous). */
			size_t pb = kvp_pool_page_bytes(p);
			double rb = 1e30;

			for (int k = 0; k < reps; k++) {
				uint64_t t0 = now_ns();

				for (int pg = 0; pg < tokens / 16; pg++)
					CU(cudaMemcpyAsync(
						(char *)h_back + (size_t)pg * pb,
						kvp_lease_device_kv(l, (uint64_t)pg * 16, 0, 0, 0),
						pb, cudaMemcpyDeviceToHost, 0));
				CU(cudaStreamSynchronize(0));
				if ((now_ns() - t0) / 1e9 < rb)
					rb = (now_ns() - t0) / 1e9;
			}
			sample("gpu.vmm_d2h_bw", bytes / rb / 1e9);
			for (int pg = 0; pg < tokens / 16; pg++)
				if (((unsigned char *)h_back)[(size_t)pg * pb] != (unsigned char)pg)
					die("page %d read back wrong", pg);
		}
		kvp_lease_release(l);
	}
	sample("gpu.migrate_h2d_bw", bytes / best / 1e9);
	sample("restore.gpu_ms", best * 1e3);
	sample("restore.ref.prefill_gemm_ms", prefill_gemms(tokens) * 1e3);
	cudaFree(d_buf);
	cudaFreeHost(h_pinned);
	cudaFreeHost(h_back);
	kvp_disconnect(c);
	free(toks);
	return 0;
}
#endif

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"tokens", required_argument, NULL, 't'},
		{"reps", required_argument, NULL, 'r'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *sock = NULL;
	int tokens = 4096, opt;

	while ((opt = getopt_long(argc, argv, "s:t:r:h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			sock = optarg;
			break;
		case 't':
			tokens = atoi(optarg);
			break;
		case 'r':
#ifdef KVP_HAVE_CUDA
			reps = atoi(optarg);
#endif
			break;
		case 'h':
			printf("Usage: kvp-bench-gpu [--socket PATH] [--tokens N (multiple of "
			       "16, default 4096)] [--reps N]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (tokens < 16 || tokens % 16 || tokens > 1 << 20) {
		fprintf(stderr, BENCH_PROG ": bad --tokens\n");
		return 2;
	}
#ifdef KVP_HAVE_CUDA
	if (reps < 1 || reps > 1000) {
		fprintf(stderr, BENCH_PROG ": bad --reps\n");
		return 2;
	}
	return bench(sock, tokens);
#else
	(void)sock;
	printf("built without CUDA: skipped\n");
	return 77;
#endif
}
