/* bench/remote_prefix_bench.c — a long prefix fetched from the remote tier
 * by a cold machine, against its recompute estimate (issue 20).
 *
 *   kvp-bench-remote-prefix [--tokens N] [--reps N] [--tflops T] [--threads N]
 *
 * Starts a 6-node Redis Cluster (tests/redis/cluster.sh, from
 * $KVP_REDIS_CLUSTER) and two kvpalaced daemons ($KVPALACED) on it,
 * "machines" A and B, through the tests' harness. A commits a prefix of N
 * tokens (default 4096) in Llama-3-8B's KV shape — 32 layers, 8 KV heads,
 * head_dim 128, f16, 16-token pages: 128 KiB a token, 2 MiB a page, 512
 * MiB for 4096 tokens — and its pages go through to the cluster. Then, in
 * each repetition, a fresh daemon B (new directory, no disk tier: nothing
 * local) matches the prefix and the bench reads every byte of every
 * leased page in place (a 64-bit XOR, as a kernel would load it); timed
 * from the first kvp_match_prefix to the end of that read, matching again
 * should a match come back short (time to the first full match). The
 * bytes are then checked against what A wrote (untimed): a wrong fetch
 * does not pass.
 *
 * Beside it, two references: the recompute estimate, prefill FLOPs =
 * 2 x 8.0e9 parameters x N tokens at T TFLOP/s (default 400: an
 * H100/H200's effective bf16 dense throughput, an assumption, not a
 * measurement), with the ratio estimate/fetch (above 1: fetching is
 * faster than recomputing); and redis-benchmark GET of 2 MiB values on
 * the same cluster in the same run, as the time it takes to move the same
 * bytes, with the ratio reference/ours. Medians over the repetitions
 * (default 3). Prints "sample NAME VALUE" lines too.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_PROG "kvp-bench-remote-prefix"
#include "bench_util.h"
#include "harness.h"
#include "rcluster.h"
#include "redis_get_ref.h"

#define MODEL	"kvp-bench-remote-prefix"
#define PARAMS	8.0e9 /* Llama-3-8B */
#define MAX_REP 64

static const struct kvp_layout llama3_8b = {
	.n_layers = 32,
	.n_kv_heads = 8,
	.head_dim = 128,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

static unsigned int n_tokens = 4096, reps = 3, threads = 4;
static double tflops = 400;
static char tier[96], pool_size[32], inflight[32], threads_arg[16];

static void usage(FILE *f)
{
	fprintf(f, "usage: " BENCH_PROG " [--tokens N] [--reps N] [--tflops T] [--threads N]\n"
		   "Needs $KVPALACED, $KVP_REDIS_CLUSTER and redis-benchmark.\n");
}

static int start(struct harness *h)
{
	const char *const extra[] = {"--remote-tier",
				     tier,
				     "--remote-tenants",
				     "*=bench",
				     "--remote-timeout-ms",
				     "5000",
				     "--remote-threads",
				     threads_arg,
				     "--remote-max-inflight-mb",
				     inflight,
				     "--host-pool-size",
				     pool_size,
				     "--disk-pool-size",
				     "0",
				     NULL};

	return harness_start(h, extra);
}

static double median(double *v, unsigned int n)
{
	return harness_quantile(v, n, 0.5);
}

/* One cold fetch on a fresh B: seconds to the first full match and the
 * read of every byte; *ret_matches the matches it took, *ret_match_s the
 * seconds of the matches alone. */
static double cold_fetch(const uint32_t *tokens, unsigned int *ret_matches, double *ret_match_s)
{
	struct harness b;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;
	uint64_t t0, tm, t1, x = 0, bad;
	unsigned int matches = 0;

	if (start(&b) < 0)
		die("could not start daemon B");
	if (kvp_connect(b.sock, &c) < 0 || kvp_pool_open(c, MODEL, &llama3_8b, &p) < 0)
		die("B: connect or pool open failed");
	t0 = now_ns();
	for (;;) {
		if (kvp_match_prefix(p, tokens, n_tokens, &l) < 0)
			die("B: match failed");
		matches++;
		if (kvp_lease_tokens(l) == n_tokens)
			break;
		kvp_lease_release(l);
		if (now_ns() - t0 > 60ull * 1000000000ull)
			die("B: no full match within 60 s");
	}
	tm = now_ns();
	for (uint64_t pg = 0; pg < n_tokens / llama3_8b.block_tokens; pg++) {
		struct kvp_page_view v;
		const uint64_t *w;

		if (kvp_lease_page(l, pg, &v) < 0)
			die("B: no view of page %" PRIu64, pg);
		w = v.base;
		for (size_t i = 0; i < v.data_bytes / 8; i++)
			x ^= w[i];
	}
	t1 = now_ns();
	bad = harness_pkv_check_lease(l, p, tokens, n_tokens);
	if (bad)
		die("B: %" PRIu64 " rows differ from what A wrote (xor %" PRIx64 ")", bad, x);
	kvp_lease_release(l);
	kvp_disconnect(c);
	if (harness_stop(&b) < 0)
		die("daemon B did not stop cleanly");
	*ret_matches = matches;
	*ret_match_s = (double)(tm - t0) / 1e9;
	return (double)(t1 - t0) / 1e9;
}

int main(int argc, char **argv)
{
	const struct bench_opt opts[] = {
		{"tokens", BENCH_OPT_UINT, &n_tokens, 16, 1 << 20},
		{"reps", BENCH_OPT_UINT, &reps, 1, MAX_REP},
		{"tflops", BENCH_OPT_DOUBLE, &tflops, 1e-3, 1e6},
		{"threads", BENCH_OPT_UINT, &threads, 1, 32},
	};
	double ours[MAX_REP], refs[MAX_REP], bytes, flop, estimate, t_ours, t_ref, ref_rps;
	unsigned int pages, matches;
	double match_s;
	struct rcluster rc;
	struct harness a;
	uint32_t *tokens;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int ret;

	bench_parse_opts(argc, argv, opts, 4, usage);
	if (n_tokens % llama3_8b.block_tokens)
		die("--tokens must be a multiple of %u", llama3_8b.block_tokens);
	signal(SIGPIPE, SIG_IGN);
	pages = n_tokens / llama3_8b.block_tokens;
	bytes = (double)n_tokens * 128.0 * 1024.0;
	snprintf(pool_size, sizeof(pool_size), "%uM", pages * 2 + 64);
	snprintf(inflight, sizeof(inflight), "%u", pages * 2 + 64);
	snprintf(threads_arg, sizeof(threads_arg), "%u", threads);
	ret = rcluster_start(&rc);
	if (ret)
		die("no Redis Cluster (%d; $KVP_REDIS_CLUSTER, redis-server)", ret);
	rcluster_tier_arg(&rc, tier, sizeof(tier));
	if (start(&a) < 0)
		die("could not start daemon A ($KVPALACED)");
	tokens = malloc(n_tokens * sizeof(*tokens));
	if (!tokens)
		die("out of memory");
	harness_tokens(tokens, n_tokens, 7, 0);
	if (kvp_connect(a.sock, &c) < 0 || kvp_pool_open(c, MODEL, &llama3_8b, &p) < 0 ||
	    harness_pkv_commit_session(p, tokens, n_tokens, &s) < 0)
		die("A: could not commit the prefix");
	kvp_disconnect(c);
	for (int i = 0; rcluster_keys(&rc, NULL, 0) < (int)pages; i++) {
		if (i > 1200)
			die("the cluster holds %d of %u pages after 60 s",
			    rcluster_keys(&rc, NULL, 0), pages);
		usleep(50000);
	}
	printf("prefix of %u tokens in Llama-3-8B's KV shape (32 layers, 8 KV heads, head_dim "
	       "128, f16, 16-token pages): %.0f MiB in %u pages of 2 MiB on the cluster\n",
	       n_tokens, bytes / 1048576.0, pages);
	/* Rounds alternate ours and redis-benchmark's so both see the same
	 * machine. */
	for (unsigned int i = 0; i < reps; i++) {
		ours[i] = cold_fetch(tokens, &matches, &match_s);
		ref_rps = redis_get_ref_rps(rc.base, 2u << 20, threads, pages);
		if (ref_rps <= 0)
			die("redis-benchmark gave no GET figure");
		refs[i] = bytes / (ref_rps * (double)(2u << 20));
		printf("rep %u: cold B, first full match + read of every byte %.3f s (%u match%s "
		       "%.3f s, %.0f MiB/s); redis-benchmark GET 2 MiB -c %u: %.0f MiB/s, %.3f s "
		       "for the "
		       "same bytes\n",
		       i, ours[i], matches, matches == 1 ? "" : "es", match_s,
		       bytes / ours[i] / 1048576.0, threads, bytes / refs[i] / 1048576.0, refs[i]);
		fflush(stdout);
	}
	t_ours = median(ours, reps);
	t_ref = median(refs, reps);
	flop = 2.0 * PARAMS * n_tokens;
	estimate = flop / (tflops * 1e12);
	sample("remote.prefix_fetch_s", t_ours);
	sample("remote.prefix_recompute_estimate_s", estimate);
	sample("remote.prefix_redis_get_s", t_ref);
	printf("median of %u: fetch %.3f s (%.0f MiB/s); recompute estimate %.3f s (2 x 8.0e9 "
	       "params x %u tokens = %.2e FLOP at an assumed %.0f TFLOP/s effective bf16 dense, "
	       "H100/H200 class): ratio estimate/fetch %.2f; redis-benchmark GET of the same "
	       "bytes %.3f s: ratio reference/ours %.2f\n",
	       reps, t_ours, bytes / t_ours / 1048576.0, estimate, n_tokens, flop, tflops,
	       estimate / t_ours, t_ref, t_ref / t_ours);
	free(tokens);
	if (harness_stop(&a) < 0)
		die("daemon A did not stop cleanly");
	rcluster_stop(&rc);
	return 0;
}
