/* tests/gpu/test_gpu_tier.c — the GPU tier shared across processes (issue
 * 7), on a machine with a GPU. Exits 77 (skip) where no GPU is usable, or
 * in a build without CUDA.
 *
 * Each test starts its own kvpalaced (tests/integration/harness.h) with a
 * small device arena and drives it from child processes: CUDA does not
 * survive fork, so the parent never touches it and every process that
 * maps a device arena is a fresh child.
 *
 *  - share: the daemon copies a committed prefix host→device; process A
 *    reads every device page back through its own mapping and finds the
 *    host bytes, then writes a marker on the device (cudaMemset); process
 *    B's lease of the same prefix gets the same device slots (no second
 *    copy) and reads A's marker through its own mapping.
 *  - round trip: host→GPU (LeaseDevice) → host (read back) → disk (the
 *    host tier spills the prefix) → GPU again (promoted from disk, copied
 *    afresh: the watermarks drop every cached copy): every byte the same.
 *  - killed client: a process holding device leases on the whole arena is
 *    SIGKILLed; until then another process's GPU lease finds no room
 *    (-ENOSPC, or the host with KVP_TIER_OR_HOST), afterwards it gets the
 *    whole arena.
 *  - GPU append: rows written on the device (cudaMemcpy into the
 *    session's device slots), mixed with host rows in one page, are on
 *    the host pages after Commit (the daemon's cudaMemcpy2DAsync back).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MODEL "gpu-tier-model"
#define BT    16u
/* 4 layers × K/V × 8 heads × 16 tokens × 128 × f16 = 256 KiB a page: a
 * 2 MiB device arena (the VMM granularity) holds 8 pages. */
static const struct kvp_layout layout = {
	.n_layers = 4,
	.n_kv_heads = 8,
	.head_dim = 128,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};
#define PAGE_BYTES  (256u << 10)
#define DEV_PAGES   8u
#define MARK	    0x5a
#define MARK_BYTES  4096u
#define SHARE_PAGES 6u

static uint32_t prefix_a[DEV_PAGES * BT];
static uint32_t prefix_b[DEV_PAGES * BT];
/* Four other conversations of 4 pages: as many pages as the round trip's
 * host pool, committed one by one so the daemon spills as they come. */
static uint32_t others[4][4 * BT];

#ifdef KVP_HAVE_CUDA
/* Pages of the lease whose device copy differs from the host copy. */
static int device_pages_differ(const kvp_lease *l, uint64_t n_pages)
{
	unsigned char *buf = malloc(PAGE_BYTES);
	int bad = 0;

	if (!buf)
		return -1;
	for (uint64_t pg = 0; pg < n_pages; pg++) {
		const void *d = kvp_lease_device_kv(l, pg * BT, 0, 0, 0);
		const void *h = kvp_lease_kv(l, pg * BT, 0, 0, 0);

		if (!d || !h ||
		    cudaMemcpy(buf, d, PAGE_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess ||
		    memcmp(buf, h, PAGE_BYTES))
			bad++;
	}
	free(buf);
	return bad;
}
#endif

struct share {
	struct harness *h;
	int to_b[2]; /* A → B: the marker is written */
	int to_a[2]; /* B → A: B has read it */
};

static int proc_a(void *arg)
{
#ifdef KVP_HAVE_CUDA
	struct share *sh = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char x = 1;

	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_has_gpu(p), 1);
	CHILD_CHECK_EQ(kvp_pool_gpu_pages(p), DEV_PAGES);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, SHARE_PAGES * BT, KVP_TIER_GPU, 0, &l),
		       0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), SHARE_PAGES * BT);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_a, SHARE_PAGES * BT), 0);
	CHILD_CHECK_EQ(device_pages_differ(l, SHARE_PAGES), 0);
	/* A writes on the device, in its own mapping. */
	CHILD_CHECK(cudaMemset(kvp_lease_device_kv(l, 0, 0, 0, 0), MARK, MARK_BYTES) ==
		    cudaSuccess);
	CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
	CHILD_CHECK(write(sh->to_b[1], &x, 1) == 1);
	CHILD_CHECK(read(sh->to_a[0], &x, 1) == 1);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
#else
	(void)arg;
#endif
	return 0;
}

static int proc_b(void *arg)
{
#ifdef KVP_HAVE_CUDA
	struct share *sh = arg;
	unsigned char buf[MARK_BYTES];
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char x;

	CHILD_CHECK(read(sh->to_b[0], &x, 1) == 1);
	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, SHARE_PAGES * BT, KVP_TIER_GPU, 0, &l),
		       0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	/* The same device slot as A's lease: A's marker, read through B's own
	 * mapping of the arena. */
	CHILD_CHECK(cudaMemcpy(buf, kvp_lease_device_kv(l, 0, 0, 0, 0), MARK_BYTES,
			       cudaMemcpyDeviceToHost) == cudaSuccess);
	for (unsigned int i = 0; i < MARK_BYTES; i++)
		CHILD_CHECK_EQ(buf[i], MARK);
	/* The other pages are still the host's. */
	for (uint64_t pg = 1; pg < SHARE_PAGES; pg++) {
		unsigned char *d = malloc(PAGE_BYTES);

		CHILD_CHECK(d != NULL);
		CHILD_CHECK(cudaMemcpy(d, kvp_lease_device_kv(l, pg * BT, 0, 0, 0), PAGE_BYTES,
				       cudaMemcpyDeviceToHost) == cudaSuccess);
		CHILD_CHECK(memcmp(d, kvp_lease_kv(l, pg * BT, 0, 0, 0), PAGE_BYTES) == 0);
		free(d);
	}
	CHILD_CHECK(write(sh->to_a[1], &x, 1) == 1);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
#else
	(void)arg;
#endif
	return 0;
}

static void commit_prefix(struct harness *h, const uint32_t *tokens, size_t n)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	/* A full host pool makes room by spilling to disk, and an Append
	 * that comes before the writes finish finds none yet: try again. */
	for (int tries = 0;; tries++) {
		int ret = harness_pkv_commit_session(p, tokens, n, &s);

		if (ret == -ENOSPC && tries < 100) {
			usleep(20 * 1000);
			continue;
		}
		assert_int_equal(ret, 0);
		break;
	}
	/* Only the prefix index holds the pages now: they may be spilled. */
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

static struct kvp_pool_stats stats_of_pool(struct harness *h)
{
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	kvp_disconnect(c);
	return ps;
}

static void test_share(void **state)
{
	struct share sh = {.h = *state};
	struct kvp_pool_stats ps;
	pid_t a, b;

	commit_prefix(sh.h, prefix_a, SHARE_PAGES * BT);
	assert_int_equal(pipe(sh.to_a), 0);
	assert_int_equal(pipe(sh.to_b), 0);
	a = harness_fork(proc_a, &sh);
	b = harness_fork(proc_b, &sh);
	assert_int_equal(harness_wait(a, 120), 0);
	assert_int_equal(harness_wait(b, 120), 0);
	ps = stats_of_pool(sh.h);
	assert_true(ps.has_gpu);
	assert_int_equal(ps.device_pages, DEV_PAGES);
	/* Copied once, shared by both leases. */
	assert_int_equal(ps.device_copied_pages, SHARE_PAGES);
	assert_int_equal(ps.leased_pages, 0);
}

struct trip {
	struct harness *h;
};

static int proc_trip(void *arg)
{
#ifdef KVP_HAVE_CUDA
	struct trip *t = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, DEV_PAGES * BT, KVP_TIER_GPU, 0, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), DEV_PAGES * BT);
	/* The host copy is the prefix's own bytes, and the device copy is
	 * the host copy, read back to the host. */
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_a, DEV_PAGES * BT), 0);
	CHILD_CHECK_EQ(device_pages_differ(l, DEV_PAGES), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
#else
	(void)arg;
#endif
	return 0;
}

static void test_round_trip(void **state)
{
	struct trip t = {.h = *state};
	struct kvp_pool_stats ps;

	commit_prefix(t.h, prefix_a, DEV_PAGES * BT);
	assert_int_equal(harness_run_child(proc_trip, &t), 0);
	ps = stats_of_pool(t.h);
	assert_int_equal(ps.device_copied_pages, DEV_PAGES);
	/* As many pages again as the host pool holds push the first prefix,
	 * the least recently used, to disk. */
	for (int i = 0; i < 4; i++)
		commit_prefix(t.h, others[i], 4 * BT);
	ps = stats_of_pool(t.h);
	fprintf(stderr, "after the spill: %u of the pool's pages in host, %u on disk\n",
		ps.host_indexed_pages, ps.disk_pages);
	assert_true(ps.has_disk);
	assert_true(ps.spilled_pages >= DEV_PAGES);
	assert_int_equal(harness_run_child(proc_trip, &t), 0);
	ps = stats_of_pool(t.h);
	assert_true(ps.promoted_pages >= 1);
	assert_int_equal(ps.verify_failures, 0);
	/* The watermarks (0.01) dropped the cached copies: copied afresh. */
	assert_int_equal(ps.device_copied_pages, 2 * DEV_PAGES);
	assert_true(ps.device_dropped_pages >= DEV_PAGES);
}

struct holder {
	struct harness *h;
	int ready[2];
};

static int proc_hold(void *arg)
{
#ifdef KVP_HAVE_CUDA
	struct holder *x = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char b = 1;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, DEV_PAGES * BT, KVP_TIER_GPU, 0, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	CHILD_CHECK(write(x->ready[1], &b, 1) == 1);
	for (;;)
		pause(); /* until SIGKILL */
#else
	(void)arg;
#endif
	return 0;
}

/* A GPU lease of prefix_b's first DEV_PAGES pages: expect is what
 * kvp_match_prefix_tier returns without the fallback. */
static int proc_want(void *arg)
{
#ifdef KVP_HAVE_CUDA
	struct harness *h = ((struct holder *)arg)->h;
	int expect = ((struct holder *)arg)->ready[0];
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_b, DEV_PAGES * BT, KVP_TIER_GPU, 0, &l),
		       expect);
	if (expect == 0) {
		CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
		CHILD_CHECK_EQ(device_pages_differ(l, DEV_PAGES), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	} else {
		CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_b, DEV_PAGES * BT, KVP_TIER_GPU,
						     KVP_TIER_OR_HOST, &l),
			       0);
		CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_HOST);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_b, DEV_PAGES * BT), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	}
	kvp_disconnect(c);
#else
	(void)arg;
#endif
	return 0;
}

static void test_killed_client(void **state)
{
	struct holder x = {.h = *state};
	struct holder want = {.h = *state};
	struct kvp_pool_stats ps;
	pid_t holder;
	char b;

	commit_prefix(x.h, prefix_a, DEV_PAGES * BT);
	commit_prefix(x.h, prefix_b, DEV_PAGES * BT);
	assert_int_equal(pipe(x.ready), 0);
	holder = harness_fork(proc_hold, &x);
	assert_int_equal(read(x.ready[0], &b, 1), 1);
	/* The whole arena is leased: no room for another GPU lease. */
	want.ready[0] = -ENOSPC;
	assert_int_equal(harness_run_child(proc_want, &want), 0);
	ps = stats_of_pool(x.h);
	assert_int_equal(ps.device_used_pages, DEV_PAGES);
	kill(holder, SIGKILL);
	assert_int_equal(harness_wait(holder, 30), 128 + SIGKILL);
	/* Its device leases came back with its connection. */
	want.ready[0] = 0;
	assert_int_equal(harness_run_child(proc_want, &want), 0);
	ps = stats_of_pool(x.h);
	assert_int_equal(ps.leased_pages, 0);
	assert_true(ps.device_dropped_pages >= DEV_PAGES);
}

#define APPEND_TOKENS 56 /* 3.5 pages */

/* Rows of positions [from, to) written on the device (dev: through
 * cudaMemcpy to kvp_session_device_kv) or on the host. */
static int write_rows(kvp_session *s, const uint32_t *t, uint64_t from, uint64_t to, int dev)
{
#ifdef KVP_HAVE_CUDA
	uint16_t row[128];
	uint64_t ph = HARNESS_PREFIX_SEED;

	for (uint64_t pos = 0; pos < to; pos++) {
		ph = harness_prefix_step(ph, t[pos]);
		if (pos < from)
			continue;
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < layout.n_kv_heads; head++) {
					void *dst =
						dev ? kvp_session_device_kv(s, pos, layer, kv, head)
						    : kvp_session_kv(s, pos, layer, kv, head);

					if (!dst)
						return -1;
					harness_pkv_fill(row, layout.head_dim, ph, pos, layer, kv,
							 head);
					if (!dev)
						memcpy(dst, row, sizeof(row));
					else if (cudaMemcpy(dst, row, sizeof(row),
							    cudaMemcpyHostToDevice) != cudaSuccess)
						return -1;
				}
	}
#else
	(void)s;
	(void)t;
	(void)from;
	(void)to;
	(void)dev;
#endif
	return 0;
}

/* K/V written on the GPU (and a few rows on the host, in a page that has
 * a device slot) reaches the host pages at Commit, every row in place. */
static int proc_gpu_writer(void *arg)
{
	struct harness *h = arg;
	const uint32_t *t = prefix_b;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	/* Persistent: it outlives this process, for the check after it. */
	CHILD_CHECK_EQ(kvp_session_create_persistent(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, t, 40, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK(kvp_session_device_kv(s, 39, 0, 0, 0) != NULL);
	CHILD_CHECK_EQ(write_rows(s, t, 0, 40, 1), 0);
	CHILD_CHECK_EQ(kvp_append(s, t + 40, 8), 0);
	CHILD_CHECK_EQ(write_rows(s, t, 40, 48, 0), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, t + 48, 8, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK_EQ(write_rows(s, t, 48, 56, 1), 0);
	CHILD_CHECK_EQ(kvp_commit(s, 20), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, t, 0, 20), 0);
	CHILD_CHECK_EQ(kvp_commit(s, APPEND_TOKENS - 20), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, t, 0, APPEND_TOKENS), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_gpu_append(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;

	assert_int_equal(harness_run_child(proc_gpu_writer, h), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 4);
}

static int setup_small(void **state)
{
	static const char *const extra[] = {
		"--host-pool-size", "8M", "--gpu-pool-size", "2M", "--disk-pool-size", "64M", NULL};

	return harness_setup_args(state, extra);
}

static int setup_no_cache(void **state)
{
	static const char *const extra[] = {"--host-pool-size",
					    "4M",
					    "--gpu-pool-size",
					    "2M",
					    "--disk-pool-size",
					    "64M",
					    "--gpu-high-watermark",
					    "0.01",
					    "--gpu-low-watermark",
					    "0.01",
					    NULL};

	return harness_setup_args(state, extra);
}

/* In a child, so this process never initializes CUDA: 0 when a GPU is
 * usable. */
static int probe(void *arg)
{
	(void)arg;
#ifdef KVP_HAVE_CUDA
	int n = 0;

	return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1;
#else
	return 1;
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_share, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_round_trip, setup_no_cache, harness_teardown),
		cmocka_unit_test_setup_teardown(test_killed_client, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_gpu_append, setup_small, harness_teardown),
	};

	if (harness_run_child(probe, NULL) != 0) {
		printf("no usable GPU (or a build without CUDA): skipped\n");
		return 77;
	}
	harness_tokens(prefix_a, DEV_PAGES * BT, 31, 0);
	harness_tokens(prefix_b, DEV_PAGES * BT, 32, 0);
	for (int i = 0; i < 4; i++)
		harness_tokens(others[i], 4 * BT, 40 + (uint32_t)i, 0);
	return cmocka_run_group_tests_name("gpu_tier", tests, NULL, NULL);
}
