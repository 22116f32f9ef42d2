/* tests/integration/test_disk.c — the disk tier.
 *
 * A 1 MiB host pool of 4 KiB pages (256 pages) over a spill file of 16 MiB
 * (4096 pages):
 *  - a working set of 64 conversations of 16 pages (1024 pages, 4× the
 *    host tier) is written and closed, then matched back by two processes
 *    at once: every conversation matches whole, every byte verified, the
 *    pages went host → disk → host (Stats: spilled, promoted, nothing
 *    failed verification); on io_uring and on the pread/pwrite threads;
 *  - warm restart: after a clean stop (which writes out what was only in
 *    host: every page comes back) and after SIGKILL (what had spilled comes
 *    back), a new daemon finds the pages again (Stats: restored) and
 *    matches them with the right bytes; Prefetch starts the reads ahead;
 *  - corruption: bytes flipped in the data of spilled pages and in page
 *    headers make misses (and verify_failures), never wrong bytes;
 *  - a size-limited spill file (RLIMIT_FSIZE: EFBIG, as a full file
 *    system): the disk tier caps itself, every match still returns right
 *    bytes, the daemon keeps serving;
 *  - mixed precision (spill-dtype int8): cold pages go to disk quantized
 *    and come back within int8's error bound, pages of a permanent span
 *    come back bit-exact, before and after a restart.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	   "disk-model"
#define BT	   16u
#define CONV_PAGES 16u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   64
#define DISK_BYTES (16u << 20)
/* The spill file's layout (daemon/spill.h): a 4096-byte file header, 128
 * bytes of page header per extent, then 4096-aligned extents. */
#define PAGE_BYTES 4096u
#define N_EXTENTS  (DISK_BYTES / PAGE_BYTES)
#define HDR_OFF(e) (4096ull + (uint64_t)(e)*128)
#define DATA_OFF   ((4096ull + N_EXTENTS * 128ull + 4095) / 4096 * 4096)

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static const char *const disk_args[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M", NULL};
static const char *const thread_args[] = {
	"--host-pool-size", "1M", "--disk-pool-size", "16M", "--io-backend", "threads", NULL};

static uint32_t *conv_tokens(void)
{
	uint32_t *all = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));

	assert_non_null(all);
	for (int i = 0; i < N_CONV; i++)
		harness_tokens(all + (size_t)i * CONV, CONV, 500 + (uint32_t)i, 0);
	return all;
}

/* Writes conversations [from, to) and closes their sessions: only the
 * prefix index holds them afterwards. */
static void write_convs(kvp_pool *p, const uint32_t *all, int from, int to)
{
	for (int i = from; i < to; i++) {
		kvp_session *s;

		assert_int_equal(harness_pkv_commit_session(p, all + (size_t)i * CONV, CONV, &s),
				 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
}

struct reader {
	const char *sock;
	const uint32_t *all;
	int from, to;
	int min_whole; /* conversations that must match whole */
};

/* A child: matches conversations [from, to), checks every byte matched. */
static int read_convs(void *arg)
{
	const struct reader *r = arg;
	kvp_client *c;
	kvp_pool *p;
	int whole = 0;

	CHILD_CHECK(kvp_connect(r->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL, &page4k, &p) == 0);
	for (int i = r->from; i < r->to; i++) {
		const uint32_t *t = r->all + (size_t)i * CONV;
		kvp_lease *l;
		uint64_t m;

		CHILD_CHECK(kvp_match_prefix(p, t, CONV, &l) == 0);
		m = kvp_lease_tokens(l);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, t, m), 0);
		whole += m == CONV;
		CHILD_CHECK(kvp_lease_release(l) == 0);
	}
	CHILD_CHECK(whole >= r->min_whole);
	kvp_disconnect(c);
	return 0;
}

static struct kvp_pool_stats pool_stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps;
}

static void working_set_4x(struct harness *h)
{
	uint32_t *all = conv_tokens();
	struct reader r1 = {h->sock, all, 0, N_CONV / 2, N_CONV / 2};
	struct reader r2 = {h->sock, all, N_CONV / 2, N_CONV, N_CONV / 2};
	struct kvp_pool_stats ps;
	pid_t a, b;
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 256);
	write_convs(p, all, 0, N_CONV);
	ps = pool_stats(c, p);
	fprintf(stderr, "after writing: %llu pages spilled, %u on disk, %u in host, %u indexed\n",
		(unsigned long long)ps.spilled_pages, ps.disk_pages, ps.host_indexed_pages,
		ps.indexed_pages);
	assert_true(ps.has_disk);
	assert_int_equal(ps.disk_capacity, N_EXTENTS);
	assert_true(ps.spilled_pages >= N_CONV * CONV_PAGES - 256);
	assert_int_equal(ps.indexed_pages, N_CONV * CONV_PAGES);
	assert_int_equal(ps.evictions, 0);

	/* Two processes read everything back at once: pages come in from
	 * disk while others are served. */
	a = harness_fork(read_convs, &r1);
	b = harness_fork(read_convs, &r2);
	assert_int_equal(harness_wait(a, 120), 0);
	assert_int_equal(harness_wait(b, 120), 0);
	ps = pool_stats(c, p);
	assert_true(ps.promoted_pages >= N_CONV * CONV_PAGES - 256);
	assert_int_equal(ps.verify_failures, 0);
	assert_int_equal(ps.io_errors, 0);
	assert_int_equal(ps.leased_pages, 0);
	kvp_disconnect(c);
	free(all);
}

static void test_working_set_uring(void **state)
{
	working_set_4x(*state);
}

static void test_working_set_threads(void **state)
{
	working_set_4x(*state);
}

/* Conversations 0..31 written, then 32..63: the first half is on disk. */
static void fill_and_restart(struct harness *h, int sig, const uint32_t *all)
{
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	write_convs(p, all, 0, N_CONV);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, sig, disk_args), 0);
}

static void warm_restart(struct harness *h, int sig)
{
	uint32_t *all = conv_tokens();
	struct reader r = {h->sock, all, 0, N_CONV / 2, N_CONV / 2 - 1};
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	fill_and_restart(h, sig, all);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	if (sig == SIGTERM) {
		/* A clean stop writes what was only in host: all of it. */
		assert_int_equal(ps.restored_pages, N_CONV * CONV_PAGES);
		r.to = N_CONV;
		r.min_whole = N_CONV;
	}
	assert_true(ps.restored_pages >= N_CONV / 2 * CONV_PAGES);
	/* Nothing is in host after a restart: a prefetch of the oldest
	 * conversation starts reading all its pages, a second one none. */
	{
		uint32_t coming = 0;

		assert_int_equal(kvp_prefetch(p, all, CONV, &coming), 0);
		assert_int_equal(coming, CONV_PAGES);
		assert_int_equal(kvp_prefetch(p, all + CONV, 0, &coming), 0);
		assert_int_equal(coming, 0);
	}
	/* The oldest conversations were spilled first: they all come back
	 * (one may have been cut by the last pages in flight at a kill). */
	assert_int_equal(harness_run_child(read_convs, &r), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.verify_failures, 0);
	assert_true(ps.promoted_pages >= (N_CONV / 2 - 1) * CONV_PAGES);
	kvp_disconnect(c);
	free(all);
}

static void test_warm_restart_clean(void **state)
{
	warm_restart(*state, SIGTERM);
}

static void test_warm_restart_kill(void **state)
{
	warm_restart(*state, SIGKILL);
}

static int spill_fd(struct harness *h)
{
	char pattern[160];
	glob_t g;
	int fd;

	snprintf(pattern, sizeof(pattern), "%s/cache/spill-*.kvs", h->dir);
	assert_int_equal(glob(pattern, 0, NULL, &g), 0);
	assert_int_equal(g.gl_pathc, 1);
	fd = open(g.gl_pathv[0], O_RDWR);
	globfree(&g);
	assert_true(fd >= 0);
	return fd;
}

static void flip(int fd, uint64_t off)
{
	unsigned char b;

	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x5a;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
}

static void test_corruption(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct reader r = {h->sock, all, 0, N_CONV / 2, 0};
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	int fd;

	/* Stop cleanly, damage the file, start again. */
	fill_and_restart(h, SIGTERM, all);
	assert_int_equal(
		harness_restart(h, SIGTERM, (const char *const[]){"--disk-pool-size", "0", NULL}),
		0);
	fd = spill_fd(h);
	/* A byte in the data of every 3rd extent, and the checksum of the
	 * page header of extents 1, 4, 7, ... */
	for (uint32_t e = 0; e < 256; e += 3) {
		flip(fd, DATA_OFF + (uint64_t)e * PAGE_BYTES + 100 + e);
		flip(fd, HDR_OFF(e + 1) + 68);
	}
	close(fd);
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);

	assert_int_equal(harness_run_child(read_convs, &r), 0); /* right bytes or misses */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	assert_true(ps.verify_failures > 0);
	assert_true(ps.restored_pages < N_CONV * CONV_PAGES);
	kvp_disconnect(c);
	free(all);
}

static void test_file_size_limit(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct reader r = {h->sock, all, 0, N_CONV, 0};
	struct kvp_pool_stats ps;
	struct rlimit old, lim;
	kvp_client *c;
	kvp_pool *p;

	/* The daemon inherits a 1.5 MiB file size limit (and an ignored
	 * SIGXFSZ): writes past it fail with EFBIG like a full disk. */
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 1536 << 10;
	signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, SIG_DFL);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	write_convs(p, all, 0, N_CONV);
	ps = pool_stats(c, p);
	/* The data region starts at 516 KiB: about 250 extents fit. */
	assert_true(ps.disk_capacity < N_EXTENTS);
	assert_true(ps.spilled_pages > 0);
	assert_true(ps.evictions > 0); /* what fits nowhere is dropped */
	/* The newest conversations are whole: nothing was lost that fit.
	 * Read first: reading everything makes the older ones the more
	 * recently used, and eviction takes the least recently used. */
	r.from = N_CONV - 8;
	r.min_whole = 8;
	assert_int_equal(harness_run_child(read_convs, &r), 0);
	r.from = 0;
	r.min_whole = 0;
	assert_int_equal(harness_run_child(read_convs, &r), 0);
	kvp_disconnect(c);
	free(all);
}

/* ---- mixed precision --------------------------------------------------- */

/* 2 layers, 2 heads of 64, 16 tokens, f16: 16 KiB pages, 12 KiB as int8
 * with per-token groups of 32 channels (8 KiB of codes, 512 B of scales,
 * padded). */
static const struct kvp_layout page16k = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};
#define Q_CONV 16 /* conversations of CONV tokens: 256 pages, 4x the host pool */

/* Reads every conversation back: sys (tagged permanent) exact, the rest
 * within the bound and mostly inexact (they went through int8). */
static void read_quantized(kvp_pool *p, const uint32_t *all, int restarted)
{
	uint64_t inexact_total = 0;

	for (int i = 0; i < Q_CONV; i++) {
		const uint32_t *t = all + (size_t)i * CONV;
		uint64_t bad, inexact;
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, t, CONV, &l), 0);
		assert_int_equal(kvp_lease_tokens(l), CONV);
		bad = harness_pkv_check_int8(p, l, NULL, t, CONV, &inexact);
		if (bad)
			fail_msg("conversation %d%s: %llu rows beyond int8's bound", i,
				 restarted ? " (after the restart)" : "", (unsigned long long)bad);
		if (i == 0)
			assert_int_equal(inexact, 0); /* permanent: never quantized */
		inexact_total += inexact;
		assert_int_equal(kvp_lease_release(l), 0);
	}
	/* The spilled ones came back through int8. */
	assert_true(inexact_total > (uint64_t)(Q_CONV / 2) * CONV * 8);
}

static void test_quantized_spill(void **state)
{
	static const char *const args[] = {
		"--host-pool-size", "1M", "--disk-pool-size", "16M", "--spill-dtype", "int8", NULL};
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(harness_restart(h, SIGTERM, args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "quant-model", &page16k, &p), 0);
	assert_int_equal(kvp_pool_page_bytes(p), 16384);
	assert_int_equal(kvp_pool_n_pages(p), 64);
	/* Conversation 0 is a permanent span (a system prompt). */
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append_tagged(s, all, CONV, KVP_ROLE_SYSTEM, 0, KVP_TAG_PERMANENT), 0);
	assert_int_equal(harness_pkv_write_session(p, s, all, 0, CONV), 0);
	assert_int_equal(kvp_commit(s, CONV), 0);
	assert_int_equal(kvp_session_close(s), 0);
	write_convs(p, all, 1, Q_CONV);
	/* Touch nothing of conversation 0 while the others stream through:
	 * the permanent span is the last to go, the others spill as int8. */
	ps = pool_stats(c, p);
	assert_true(ps.spilled_pages > 0);
	assert_true(ps.quantized_pages > 0);
	assert_true(ps.quantized_pages <= ps.spilled_pages);
	assert_int_equal(ps.permanent_pages, CONV_PAGES);
	read_quantized(p, all, 0);
	ps = pool_stats(c, p);
	assert_true(ps.promoted_pages > 0);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);

	/* A clean stop writes the rest (conversation 0 as it is), a restart
	 * finds every page in its format. */
	assert_int_equal(harness_restart(h, SIGTERM, args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "quant-model", &page16k, &p), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.restored_pages, Q_CONV * CONV_PAGES);
	read_quantized(p, all, 1);
	ps = pool_stats(c, p);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
	free(all);
}

static int setup_disk(void **state)
{
	return harness_setup_args(state, disk_args);
}

static int setup_threads(void **state)
{
	return harness_setup_args(state, thread_args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_quantized_spill, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_working_set_uring, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_working_set_threads, setup_threads,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_warm_restart_clean, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_warm_restart_kill, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_corruption, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_file_size_limit, setup_disk, harness_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
