/* tests/integration/test_gpu_emulated.c — the GPU tier's machinery on a
 * machine without a GPU.
 *
 * kvpalaced started with KVPALACED_EMULATE_GPU=1 plays a GPU in host
 * memory (daemon/core/gpu.c): device arenas are memfds, copies are memcpy, and
 * everything else is the real tier — OpenDeviceArena with the arena passed
 * over SCM_RIGHTS, LeaseDevice answered through a ticket once the
 * completion came back through the eventfd, device slots owned by leases
 * and given back with connections, the content-addressed device cache and
 * its watermarks, the client library's GPU calls. Only the CUDA calls are
 * left for tests/gpu/test_gpu_tier.c, which runs the same scenarios on a
 * GPU:
 *
 *  - share: process A's GPU lease has the host bytes on the "device"; A
 *    writes a marker there; process B's lease of the same prefix shares
 *    the device slots (one copy) and reads A's marker through its own
 *    mapping.
 *  - round trip: host → device → host (read back) → disk (spilled) →
 *    device again (copied afresh: watermarks 0.01): every byte the same.
 *  - killed client: while a process holds device leases on the whole
 *    arena another's GPU lease finds no room (-ENOSPC, or the host with
 *    KVP_TIER_OR_HOST); once it is SIGKILLed the arena is free again.
 *  - limits of the protocol: LeaseDevice past the lease, of another
 *    client's lease, answers errors and keeps the connection.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "emu-gpu-model"
#define BT    16u
/* 4 layers × K/V × 8 heads × 16 tokens × 128 × f16 = 256 KiB a page; a
 * 2 MiB device arena holds 8. */
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
static uint32_t others[4][4 * BT];

/* Pages of the lease whose device copy differs from its host copy. */
static int device_pages_differ(const kvp_lease *l, uint64_t n_pages)
{
	int bad = 0;

	for (uint64_t pg = 0; pg < n_pages; pg++) {
		const void *d = kvp_lease_device_kv(l, pg * BT, 0, 0, 0);
		const void *h = kvp_lease_kv(l, pg * BT, 0, 0, 0);

		if (!d || !h || d == h || memcmp(d, h, PAGE_BYTES))
			bad++;
	}
	return bad;
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

struct share {
	struct harness *h;
	int to_b[2];
	int to_a[2];
};

static int proc_a(void *arg)
{
	struct share *sh = arg;
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char x = 1;

	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->gpu, 1);
	CHILD_CHECK(strstr(st->gpu_status, "emulated GPU") != NULL);
	kvp_stats_free(st);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_has_gpu(p), 1);
	CHILD_CHECK_EQ(kvp_pool_gpu_pages(p), DEV_PAGES);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, SHARE_PAGES * BT, KVP_TIER_GPU, 0, &l),
		       0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), SHARE_PAGES * BT);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_a, SHARE_PAGES * BT), 0);
	CHILD_CHECK_EQ(device_pages_differ(l, SHARE_PAGES), 0);
	CHILD_CHECK(kvp_lease_device_kv(l, SHARE_PAGES * BT, 0, 0, 0) == NULL);
	CHILD_CHECK(kvp_lease_device_kv(l, 0, layout.n_layers, 0, 0) == NULL);
	/* A writes on the device, through its own mapping. */
	memset(kvp_lease_device_kv(l, 0, 0, 0, 0), MARK, MARK_BYTES);
	CHILD_CHECK(write(sh->to_b[1], &x, 1) == 1);
	CHILD_CHECK(read(sh->to_a[0], &x, 1) == 1);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

static int proc_b(void *arg)
{
	struct share *sh = arg;
	const unsigned char *d;
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
	d = kvp_lease_device_kv(l, 0, 0, 0, 0);
	CHILD_CHECK(d != NULL);
	for (unsigned int i = 0; i < MARK_BYTES; i++)
		CHILD_CHECK_EQ(d[i], MARK);
	for (uint64_t pg = 1; pg < SHARE_PAGES; pg++)
		CHILD_CHECK(memcmp(kvp_lease_device_kv(l, pg * BT, 0, 0, 0),
				   kvp_lease_kv(l, pg * BT, 0, 0, 0), PAGE_BYTES) == 0);
	CHILD_CHECK(write(sh->to_a[1], &x, 1) == 1);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
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
	assert_int_equal(harness_wait(a, 60), 0);
	assert_int_equal(harness_wait(b, 60), 0);
	ps = stats_of_pool(sh.h);
	assert_true(ps.has_gpu);
	assert_int_equal(ps.device_pages, DEV_PAGES);
	assert_int_equal(ps.device_copied_pages, SHARE_PAGES); /* once, shared */
	assert_int_equal(ps.device_used_pages, SHARE_PAGES);   /* cached, unleased */
	assert_int_equal(ps.leased_pages, 0);

	/* The admin empties the GPU tier: the cached copies go, the pages
	 * stay matchable from the host. */
	{
		struct kvp_evict_result *res;
		kvp_client *admin;

		assert_int_equal(kvp_connect(sh.h->admin_sock, &admin), 0);
		assert_int_equal(kvp_admin_evict(admin, KVP_TIER_GPU, 0, KVP_EVICT_ALL, 0, &res),
				 0);
		assert_int_equal(res->pages, SHARE_PAGES);
		assert_int_equal(res->bytes, (uint64_t)SHARE_PAGES * PAGE_BYTES);
		assert_int_equal(res->more, 0);
		free(res);
		kvp_disconnect(admin);
	}
	ps = stats_of_pool(sh.h);
	assert_int_equal(ps.device_used_pages, 0);
	assert_int_equal(ps.indexed_pages, SHARE_PAGES);
}

static int proc_trip(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_a, DEV_PAGES * BT, KVP_TIER_GPU, 0, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), DEV_PAGES * BT);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_a, DEV_PAGES * BT), 0);
	CHILD_CHECK_EQ(device_pages_differ(l, DEV_PAGES), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_round_trip(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;

	commit_prefix(h, prefix_a, DEV_PAGES * BT);
	assert_int_equal(harness_run_child(proc_trip, h), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_copied_pages, DEV_PAGES);
	for (int i = 0; i < 4; i++)
		commit_prefix(h, others[i], 4 * BT);
	ps = stats_of_pool(h);
	fprintf(stderr, "after the spill: %u pages in host, %u on disk, %llu spilled\n",
		ps.host_indexed_pages, ps.disk_pages, (unsigned long long)ps.spilled_pages);
	assert_true(ps.has_disk);
	assert_true(ps.spilled_pages >= 1);
	assert_int_equal(harness_run_child(proc_trip, h), 0);
	ps = stats_of_pool(h);
	assert_true(ps.promoted_pages >= 1);
	assert_int_equal(ps.verify_failures, 0);
	assert_int_equal(ps.device_copied_pages, 2 * DEV_PAGES);
	assert_true(ps.device_dropped_pages >= DEV_PAGES);
}

struct holder {
	struct harness *h;
	int ready[2];
	int expect;
};

static int proc_hold(void *arg)
{
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
	return 0;
}

static int proc_want(void *arg)
{
	struct holder *x = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_b, DEV_PAGES * BT, KVP_TIER_GPU, 0, &l),
		       x->expect);
	if (x->expect == 0) {
		CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_GPU);
		CHILD_CHECK_EQ(device_pages_differ(l, DEV_PAGES), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	} else {
		CHILD_CHECK(strstr(kvp_strerror(c, x->expect), "device arena is full") != NULL);
		CHILD_CHECK_EQ(kvp_match_prefix_tier(p, prefix_b, DEV_PAGES * BT, KVP_TIER_GPU,
						     KVP_TIER_OR_HOST, &l),
			       0);
		CHILD_CHECK_EQ(kvp_lease_tier(l), KVP_TIER_HOST);
		CHILD_CHECK(kvp_lease_device_kv(l, 0, 0, 0, 0) == NULL);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_b, DEV_PAGES * BT), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	}
	kvp_disconnect(c);
	return 0;
}

static void test_killed_client(void **state)
{
	struct holder x = {.h = *state};
	struct kvp_pool_stats ps;
	pid_t holder;
	char b;

	commit_prefix(x.h, prefix_a, DEV_PAGES * BT);
	commit_prefix(x.h, prefix_b, DEV_PAGES * BT);
	assert_int_equal(pipe(x.ready), 0);
	holder = harness_fork(proc_hold, &x);
	assert_int_equal(read(x.ready[0], &b, 1), 1);
	x.expect = -ENOSPC;
	assert_int_equal(harness_run_child(proc_want, &x), 0);
	ps = stats_of_pool(x.h);
	assert_int_equal(ps.device_used_pages, DEV_PAGES);
	assert_int_equal(ps.leased_pages, DEV_PAGES);
	kill(holder, SIGKILL);
	assert_int_equal(harness_wait(holder, 30), 128 + SIGKILL);
	/* Its leases, device slots included, came back with its connection. */
	x.expect = 0;
	assert_int_equal(harness_run_child(proc_want, &x), 0);
	ps = stats_of_pool(x.h);
	assert_int_equal(ps.leased_pages, 0);
	assert_int_equal(ps.device_dropped_pages, DEV_PAGES);
	assert_int_equal(ps.device_copied_pages, 2 * DEV_PAGES);
}

/* Writes the prefix-keyed rows of positions [from, to) of s on the device
 * (dev) or on the host; 0, or -1 when a pointer is missing. */
static int write_rows(kvp_session *s, const uint32_t *t, uint64_t from, uint64_t to, int dev)
{
	uint64_t ph = HARNESS_PREFIX_SEED;

	for (uint64_t pos = 0; pos < to; pos++) {
		ph = harness_prefix_step(ph, t[pos]);
		if (pos < from)
			continue;
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < layout.n_kv_heads; head++) {
					void *row =
						dev ? kvp_session_device_kv(s, pos, layer, kv, head)
						    : kvp_session_kv(s, pos, layer, kv, head);

					if (!row)
						return -1;
					harness_pkv_fill(row, layout.head_dim, ph, pos, layer, kv,
							 head);
				}
	}
	return 0;
}

#define APPEND_TOKENS 56 /* 3.5 pages */

/* K/V written on the GPU (and some on the host, in a page that has a
 * device slot) reaches the host pages at commit, every row where it
 * belongs. */
static int proc_gpu_writer(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	const uint32_t *t = prefix_b;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	/* Persistent: it outlives this process, for the checks after it. */
	CHILD_CHECK_EQ(kvp_session_create_persistent(p, &s), 0);
	/* 0..40 on the GPU, 40..48 on the host (page 2 has a device slot
	 * all the same), 48..56 on the GPU again. */
	CHILD_CHECK_EQ(kvp_append_tier(s, t, 40, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK(kvp_session_device_kv(s, 39, 0, 0, 0) != NULL);
	CHILD_CHECK(kvp_session_device_kv(s, 39, 0, 0, 0) != kvp_session_kv(s, 39, 0, 0, 0));
	CHILD_CHECK(kvp_session_device_kv(s, 40, 0, 0, 0) == NULL);
	CHILD_CHECK_EQ(write_rows(s, t, 0, 40, 1), 0);
	CHILD_CHECK_EQ(kvp_append(s, t + 40, 8), 0);
	CHILD_CHECK_EQ(write_rows(s, t, 40, 48, 0), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, t + 48, 8, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK_EQ(write_rows(s, t, 48, 56, 1), 0);
	/* Nothing is on the host yet for the GPU rows. */
	CHILD_CHECK(harness_pkv_check_session(p, s, t, 0, 40) > 0);
	/* Two commits, each copying back its own part. */
	CHILD_CHECK_EQ(kvp_commit(s, 20), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, t, 0, 20), 0);
	CHILD_CHECK(harness_pkv_check_session(p, s, t, 20, 40) > 0);
	CHILD_CHECK_EQ(kvp_commit(s, APPEND_TOKENS - 20), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, t, 0, APPEND_TOKENS), 0);
	kvp_disconnect(c); /* the session stays, committed: it is persistent */
	return 0;
}

static int proc_host_reader(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, prefix_b, APPEND_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 48);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, prefix_b, 48), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

/* A compacted session renumbers its pages: the device slots of the old
 * ones go back, and a GPU append gets fresh ones, copied back at its
 * commit. */
static int proc_gpu_compact(void *arg)
{
	struct harness *h = arg;
	struct kvp_policy pol;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *f;
	const uint32_t *t = prefix_b;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &f), 0);
	CHILD_CHECK_EQ(kvp_append_tier(f, t, APPEND_TOKENS, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK(kvp_session_device_kv(f, APPEND_TOKENS - 1, 0, 0, 0) != NULL);
	CHILD_CHECK_EQ(write_rows(f, t, 0, APPEND_TOKENS, 1), 0);
	CHILD_CHECK_EQ(kvp_commit(f, APPEND_TOKENS), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, f, t, 0, APPEND_TOKENS), 0);
	kvp_policy_init(&pol, KVP_POLICY_WINDOW, 24);
	CHILD_CHECK_EQ(kvp_session_set_policy(f, &pol, NULL), 0);
	CHILD_CHECK_EQ(kvp_session_compact(f, NULL), 0);
	CHILD_CHECK_EQ(kvp_session_tokens(f), 24);
	CHILD_CHECK(kvp_session_device_kv(f, 20, 0, 0, 0) == NULL);
	CHILD_CHECK_EQ(kvp_append_tier(f, t, 8, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK(kvp_session_device_kv(f, 24, 0, 0, 0) != NULL);
	CHILD_CHECK(kvp_session_device_kv(f, 23, 0, 0, 0) != NULL); /* same page */
	CHILD_CHECK_EQ(kvp_commit(f, 8), 0);
	CHILD_CHECK_EQ(kvp_session_committed(f), 32);
	CHILD_CHECK_EQ(kvp_session_close(f), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_gpu_compact(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;

	assert_int_equal(harness_run_child(proc_gpu_compact, h), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_copy_errors, 0);
	/* The compacted session is closed: none of its device slots stay. */
	assert_int_equal(ps.device_used_pages, 0);
}

static void test_gpu_append(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	struct kvp_session_info *si;
	kvp_client *c;
	size_t n;

	assert_int_equal(harness_run_child(proc_gpu_writer, h), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 4); /* the session's 4 pages */
	/* Page parts copied back: pages 0 and 1 (to token 20) at the first
	 * commit; page 1 (from 20), page 2 (its GPU rows 32..40) and page 3
	 * at the second. */
	assert_int_equal(ps.device_copied_back_pages, 5);
	assert_int_equal(ps.device_copy_errors, 0);
	assert_int_equal(harness_run_child(proc_host_reader, h), 0);

	/* kvpalacectl shows the device arena, as text and as JSON. */
	{
		static char out[8192];
		char *argv[] = {
			getenv("KVPALACECTL"), "--socket", h->admin_sock, "pools", NULL, NULL};

		assert_non_null(argv[0]);
		assert_int_equal(harness_run_capture(argv, NULL, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "device arena: 8 pages, 4 in use; 0 copied to the "
					    "GPU, 5 back, 0 dropped, 0 copy errors"));
		argv[3] = "--json";
		argv[4] = "pools";
		assert_int_equal(harness_run_capture(argv, NULL, out, sizeof(out)), 0);
		assert_non_null(
			strstr(out, "\"gpu\":{\"device_pages\":8,\"device_used_pages\":4,"));
	}

	/* Closing the session gives its device slots back. */
	assert_int_equal(kvp_connect(h->admin_sock, &c), 0);
	assert_int_equal(kvp_list_sessions(c, 0, &si, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(kvp_admin_drop_session(c, si[0].session_id, 0, NULL), 0);
	free(si);
	kvp_disconnect(c);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 0);
}

/* A GPU append that finds no device slot fails whole, or goes to the
 * host with the fallback; an uncommitted GPU append dies with its
 * writer, device slots included. */
static int proc_full_arena(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, prefix_a, 6 * BT, KVP_TIER_GPU, 0), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, prefix_a + 6 * BT, 3 * BT, KVP_TIER_GPU, 0), -ENOSPC);
	CHILD_CHECK_EQ(kvp_session_tokens(s), 6 * BT);
	CHILD_CHECK_EQ(
		kvp_append_tier(s, prefix_a + 6 * BT, 2 * BT, KVP_TIER_GPU, KVP_TIER_OR_HOST), 0);
	CHILD_CHECK(kvp_session_device_kv(s, 7 * BT, 0, 0, 0) != NULL);
	CHILD_CHECK_EQ(
		kvp_append_tier(s, prefix_a + 6 * BT, 2 * BT, KVP_TIER_GPU, KVP_TIER_OR_HOST), 0);
	CHILD_CHECK(kvp_session_device_kv(s, 9 * BT, 0, 0, 0) == NULL);
	kvp_disconnect(c); /* uncommitted: rolled back */
	return 0;
}

static void test_gpu_append_limits(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;

	assert_int_equal(harness_run_child(proc_full_arena, h), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 0);
	assert_int_equal(ps.reserved_pages, 0);
}

/* LeaseDevice on the wire: its errors cost no connection. */
static void test_raw_lease_device(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LeaseDeviceRequest ld = KVPALACE__V1__LEASE_DEVICE_REQUEST__INIT;
	Kvpalace__V1__OpenDeviceArenaRequest oda = KVPALACE__V1__OPEN_DEVICE_ARENA_REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Response *resp;
	struct raw *r = calloc(1, sizeof(*r)), *other = calloc(1, sizeof(*other));
	uint64_t pool_id, lease_id;
	int fd = -1;

	assert_non_null(r);
	assert_non_null(other);
	commit_prefix(h, prefix_a, 4 * BT);
	assert_int_equal(raw_open(r, h->sock), 0);
	assert_int_equal(raw_open_pool(r, MODEL, &layout, &pool_id), 0);

	req.id = 500;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA;
	req.open_device_arena = &oda;
	oda.pool_id = pool_id;
	assert_int_equal(raw_call(r, &req, &resp, &fd), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->open_device_arena->handle_type,
			 KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_HOST_EMULATED);
	assert_int_equal(resp->open_device_arena->n_pages, DEV_PAGES);
	assert_int_equal(resp->open_device_arena->page_bytes, PAGE_BYTES);
	assert_true(fd >= 0);
	close(fd);

	raw_req_match(&req, &mp, pool_id, prefix_a, 4 * BT);
	mp.has_tier = 1;
	mp.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->match_prefix->tier, KVPALACE__V1__TIER__TIER_GPU);
	lease_id = resp->match_prefix->lease_id;

	req.id = 501;
	req.op_case = KVPALACE__V1__REQUEST__OP_LEASE_DEVICE;
	req.lease_device = &ld;
	ld.lease_id = lease_id;
	ld.has_first_page = 1;
	ld.first_page = 5; /* past the lease's 4 pages */
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_RANGE);
	ld.first_page = 2;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->lease_device->first_page, 2);
	assert_int_equal(resp->lease_device->n_device_slots, 2);
	assert_int_equal(resp->lease_device->copied_pages, 4);
	/* Again: nothing to copy, answered at once. */
	ld.first_page = 0;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->lease_device->n_device_slots, 4);
	assert_int_equal(resp->lease_device->copied_pages, 0);
	for (size_t i = 0; i < 4; i++)
		assert_true(resp->lease_device->device_slots[i] < DEV_PAGES);

	/* Another client cannot name the lease. */
	assert_int_equal(raw_open(other, h->sock), 0);
	assert_int_equal(raw_hello(other), 0);
	assert_int_equal(raw_call(other, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(raw_hello(other), 0);
	assert_int_equal(raw_hello(r), 0);
	raw_close(other);
	raw_close(r);
	free(other);
	free(r);
}

/* Clients that go away with a LeaseDevice or a GPU Commit in flight: the
 * daemon finishes the copies, answers nobody, and gets everything back. */
static void test_raw_abandon(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LeaseDeviceRequest ld = KVPALACE__V1__LEASE_DEVICE_REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__Response *resp;
	struct raw *r = calloc(1, sizeof(*r)), *w = calloc(1, sizeof(*w));
	struct harness_pool_info info;
	struct kvp_pool_stats ps;
	uint64_t pool_id, session_id;

	assert_non_null(r);
	assert_non_null(w);
	commit_prefix(h, prefix_a, 4 * BT);

	/* A reader asks for device copies and leaves at once. */
	assert_int_equal(raw_open(r, h->sock), 0);
	assert_int_equal(raw_open_pool(r, MODEL, &layout, &pool_id), 0);
	raw_req_match(&req, &mp, pool_id, prefix_a, 4 * BT);
	mp.has_tier = 1;
	mp.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	req.id = 700;
	req.op_case = KVPALACE__V1__REQUEST__OP_LEASE_DEVICE;
	req.lease_device = &ld;
	ld.lease_id = resp->match_prefix->lease_id;
	assert_int_equal(raw_send(r, &req), 0);
	raw_close(r);

	/* A writer appends on the GPU, commits and leaves before the answer. */
	assert_int_equal(raw_open(w, h->sock), 0);
	assert_int_equal(raw_open_pool(w, MODEL, &layout, &pool_id), 0);
	assert_int_equal(raw_create_session(w, pool_id, &session_id), 0);
	raw_req_append(&req, &ap, session_id, prefix_b, 3 * BT);
	ap.has_tier = 1;
	ap.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(raw_call(w, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->append->n_device_slots, 3);
	raw_req_commit(&req, &cm, session_id, 2 * BT);
	assert_int_equal(raw_send(w, &req), 0);
	raw_close(w);

	/* Both gone: nothing leased, nothing reserved; what is left on the
	 * device is the reader's cached copies and nothing of the writer's
	 * uncommitted pages. */
	assert_int_equal(raw_open(r, h->sock), 0);
	assert_int_equal(raw_hello(r), 0);
	assert_int_equal(raw_wait_connections(r, 1), 0);
	assert_int_equal(raw_pool_info(r, pool_id, &info), 0);
	assert_int_equal(info.leased_pages, 0);
	assert_int_equal(info.reserved_pages, 0);
	raw_close(r);
	ps = stats_of_pool(h);
	assert_true(harness_daemon_alive(h));
	assert_int_equal(ps.leased_pages, 0);
	/* 4 cached copies of the reader's prefix, and the 2 pages the
	 * writer's commit (if it ran before the close) keeps in its session. */
	assert_true(ps.device_used_pages == 4 || ps.device_used_pages == 4 + 2);
	free(r);
	free(w);
}

/* Device arenas are capped all together: a pool past gpu-tier-size runs
 * from the host tier, and GPU requests on it take the fallback. */
static void test_tier_size(void **state)
{
	struct harness *h = *state;
	static const struct kvp_layout other = {.n_layers = 4,
						.n_kv_heads = 8,
						.head_dim = 128,
						.block_tokens = 32,
						.dtype = KVP_DTYPE_F16};
	kvp_client *c;
	kvp_pool *p1, *p2;
	kvp_lease *l;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p1), 0);
	assert_int_equal(kvp_pool_has_gpu(p1), 1);
	assert_int_equal(kvp_pool_open(c, MODEL, &other, &p2), 0);
	assert_int_equal(kvp_pool_has_gpu(p2), 0);
	assert_int_equal(kvp_match_prefix_tier(p2, prefix_a, 64, KVP_TIER_GPU, 0, &l), -EOPNOTSUPP);
	assert_int_equal(
		kvp_match_prefix_tier(p2, prefix_a, 64, KVP_TIER_GPU, KVP_TIER_OR_HOST, &l), 0);
	assert_int_equal(kvp_lease_tier(l), KVP_TIER_HOST);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
}

static int setup_tier_cap(void **state)
{
	static const char *const extra[] = {
		"--host-pool-size", "8M", "--gpu-pool-size", "2M", "--gpu-tier-size", "3M", NULL};

	return harness_setup_args(state, extra);
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

/* Issue 13, item 18: a purge forgets the device cache's copies too. A
 * cached copy is found by the chain hash: left behind, it would be given
 * to the next lease of a recomputed page with the same tokens, the
 * purged bytes instead of the new ones. */
static void test_purge_device_copies(void **state)
{
	struct harness *h = *state;
	struct kvp_purge_spec spec = {.flags = KVP_PURGE_MODEL, .model_id = MODEL};
	struct kvp_purge_result res;
	struct kvp_pool_stats ps;
	kvp_client *c, *admin;
	kvp_pool *p;
	kvp_lease *l;

	commit_prefix(h, prefix_b, 4 * BT);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_match_prefix_tier(p, prefix_b, 4 * BT, KVP_TIER_GPU, 0, &l), 0);
	assert_int_equal(kvp_lease_tier(l), KVP_TIER_GPU);
	assert_int_equal(kvp_lease_release(l), 0);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 4); /* cached, unleased */

	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_purge(admin, &spec, &res), 0);
	assert_int_equal(res.pages, 4);
	assert_int_equal(res.device_pages, 4);
	assert_int_equal(res.pools, 1);
	ps = stats_of_pool(h);
	assert_int_equal(ps.device_used_pages, 0);
	assert_int_equal(ps.indexed_pages, 0);
	assert_int_equal(ps.purged_pages, 4);
	assert_int_equal(kvp_match_prefix(p, prefix_b, 4 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(admin);
	kvp_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_share, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_round_trip, setup_no_cache, harness_teardown),
		cmocka_unit_test_setup_teardown(test_killed_client, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_raw_lease_device, setup_small,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_gpu_append, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_gpu_compact, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_gpu_append_limits, setup_small,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_raw_abandon, setup_small, harness_teardown),
		cmocka_unit_test_setup_teardown(test_tier_size, setup_tier_cap, harness_teardown),
		cmocka_unit_test_setup_teardown(test_purge_device_copies, setup_small,
						harness_teardown),
	};
	/* The daemons this test starts play a GPU in host memory. */
	setenv("KVPALACED_EMULATE_GPU", "1", 1);
	harness_tokens(prefix_a, DEV_PAGES * BT, 31, 0);
	harness_tokens(prefix_b, DEV_PAGES * BT, 32, 0);
	for (int i = 0; i < 4; i++)
		harness_tokens(others[i], 4 * BT, 40 + (uint32_t)i, 0);
	return cmocka_run_group_tests_name("gpu_emulated", tests, NULL, NULL);
}
