/* bench/remote_bench.c — the remote tier's fetch throughput of large pages
 * against redis-benchmark GET of the same value size, on the same 6-node
 * Redis Cluster (started here, tests/redis/cluster.sh) in the same run.
 *
 *   kvp-bench-remote [--size BYTES] [--pages N] [--threads N] [--rounds N]
 *
 * Puts N pages of BYTES through remote_put, then fetches them all through
 * remote_get, one page a request with as many requests in flight as
 * threads (each fetch verified: header, identity, XXH3-128, then copied
 * into the page), then redis-benchmark --cluster -t set,get -d BYTES with
 * 4N requests over N random keys (-r: spread over the masters as ours
 * are) and as many clients as threads, ROUNDS times (default 7) in
 * turn. Prints each round, the medians in MiB/s and the median ratio. Needs $KVP_REDIS_CLUSTER (the script; bench/meson.build's
 * run target sets it) and redis-benchmark.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "list.h"
#include "loop.h"
#include "rcluster.h"
#include "redis_get_ref.h"
#include "remote.h"

static struct loop loop;
static int n_done, want;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct slot {
	struct remote_req req;
	struct remote_page page;
	unsigned int next_page;
};

static struct remote r;
static struct slot *slots;
static unsigned int n_pages, issued, hits;
static size_t size;
static int putting;

static void issue(struct slot *s);

static void on_done(struct remote_req *req)
{
	struct slot *s = container_of(req, struct slot, req);

	hits += s->page.result == REMOTE_HIT;
	n_done++;
	if (issued < (unsigned int)want)
		issue(s);
	else if (n_done == want)
		loop_stop(&loop);
}

static void issue(struct slot *s)
{
	unsigned int i = issued++ % n_pages;

	memset(s->page.chain, 0, 16);
	memcpy(s->page.chain, &i, sizeof(i));
	if (putting)
		memset(s->page.buf, (int)(i * 37 + 1), size);
	s->req.pages = &s->page;
	s->req.n_pages = 1;
	s->req.done = on_done;
	if ((putting ? remote_put(&r, &s->req) : remote_get(&r, &s->req)) < 0) {
		fprintf(stderr, "submit failed\n");
		exit(1);
	}
}

static double run(unsigned int n_inflight, unsigned int total, int put)
{
	double t0 = now_s();

	putting = put;
	issued = 0;
	hits = 0;
	n_done = 0;
	want = (int)total;
	for (unsigned int i = 0; i < n_inflight && i < total; i++)
		issue(&slots[i]);
	loop.stop = 0;
	loop_run(&loop);
	return now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"size", 1, NULL, 's'},	  {"pages", 1, NULL, 'p'}, {"threads", 1, NULL, 't'},
		{"rounds", 1, NULL, 'r'}, {NULL, 0, NULL, 0},
	};
	unsigned int threads = 4, rounds = 7;
	struct rcluster rc;
	static char s0[32];
	const char *seeds[] = {s0};
	struct remote_stats st;
	double t, ours, ref_rps;
	int o, ret;

	size = 2u << 20;
	n_pages = 64;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			size = strtoul(optarg, NULL, 0);
			break;
		case 'p':
			n_pages = (unsigned int)strtoul(optarg, NULL, 0);
			break;
		case 't':
			threads = (unsigned int)strtoul(optarg, NULL, 0);
			break;
		case 'r':
			rounds = (unsigned int)strtoul(optarg, NULL, 0);
			break;
		default:
			fprintf(stderr,
				"usage: %s [--size B] [--pages N] [--threads N] [--rounds N]\n",
				argv[0]);
			return 2;
		}
	}
	if (!size || !n_pages || !threads || threads > REMOTE_MAX_THREADS || !rounds)
		return 2;
	ret = rcluster_start(&rc);
	if (ret) {
		fprintf(stderr, "no Redis Cluster (%d)\n", ret);
		return ret == 77 ? 77 : 1;
	}
	snprintf(s0, sizeof(s0), "127.0.0.1:%d", rc.base);
	if (loop_init(&loop, 256, LOOP_WANT_AUTO) < 0)
		return 1;
	struct remote_config cfg = {
		.nodes = seeds,
		.n_nodes = 1,
		.timeout_ms = 5000,
		.threads = threads,
		.max_inflight_bytes = (uint64_t)(threads + 1) * (size + REMOTE_HEADER_BYTES),
		.max_page_bytes = size,
	};
	if (remote_init(&r, &loop, &cfg) < 0) {
		fprintf(stderr, "remote_init: %s\n", remote_why(&r));
		return 1;
	}
	slots = calloc(threads, sizeof(*slots));
	for (unsigned int i = 0; i < threads; i++) {
		slots[i].page.buf = malloc(size);
		slots[i].page.bytes = size;
		memset(&slots[i].req.id, 0x42, sizeof(slots[i].req.id));
	}
	t = run(threads, n_pages, 1);
	printf("put    %u x %zu B: %.1f MiB/s\n", n_pages, size,
	       (double)n_pages * (double)size / t / 1048576.0);
	/* Rounds alternate ours and redis-benchmark's so both see the same
	 * machine; each pair gives a ratio, and the median of those is the
	 * figure (the machines are shared and noisy). */
	double ratios[64], ours_all[64], refs[64];
	if (rounds > 64)
		rounds = 64;
	for (unsigned int i = 0; i < rounds; i++) {
		t = run(threads, n_pages, 0);
		ours = (double)n_pages * (double)size / t / 1048576.0;
		if (hits != n_pages) {
			fprintf(stderr, "misses in the fetch round\n");
			return 1;
		}
		ref_rps = redis_get_ref_rps(rc.base, size, threads, n_pages);
		double ref = ref_rps * (double)size / 1048576.0;
		ours_all[i] = ours;
		refs[i] = ref;
		ratios[i] = ref > 0 ? ours / ref : 0;
		printf("round %u: remote_get %.1f MiB/s (%u/%u hits), redis-benchmark GET %.1f "
		       "MiB/s "
		       "(%.1f req/s): ratio %.2f\n",
		       i, ours, hits, n_pages, ref, ref_rps, ratios[i]);
	}
	qsort(ratios, rounds, sizeof(double), cmp_double);
	qsort(ours_all, rounds, sizeof(double), cmp_double);
	qsort(refs, rounds, sizeof(double), cmp_double);
	remote_stats(&r, &st);
	printf("sample remote.get_mibs %.1f\n", ours_all[rounds / 2]);
	printf("sample remote.redis_benchmark_get_mibs %.1f\n", refs[rounds / 2]);
	printf("remote_get of %zu-byte pages, %u threads: median %.1f MiB/s; redis-benchmark GET "
	       "-c %u: "
	       "median %.1f MiB/s; median ratio %.2f (range %.2f-%.2f, %u rounds; goal 0.8); "
	       "corrupt %llu\n",
	       size, threads, ours_all[rounds / 2], threads, refs[rounds / 2], ratios[rounds / 2],
	       ratios[0], ratios[rounds - 1], rounds, (unsigned long long)st.corrupt);
	remote_fini(&r);
	loop_fini(&loop);
	rcluster_stop(&rc);
	return 0;
}
