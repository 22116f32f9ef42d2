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
 *    and are lossy: no match returns them, every byte matched is the one
 *    written; pages of a permanent span come back bit-exact, before and
 *    after a restart; a fresh exact commit of lossy tokens replaces the
 *    lossy copy instead of reading it back (issue 13 item 13);
 *  - recency across a restart: the conversation used last before a clean
 *    stop keeps its pages when the restarted disk tier must drop some
 *    (issue 13 item 4);
 *  - a spill file cut short, while the daemon was down and under a running
 *    one: what is gone is a miss, never an I/O error that turns spilling
 *    off (issue 13 item 5);
 *  - junk in the cache directory (no header, no pages) is removed at start,
 *    the spill file of a pool not open yet is kept (issue 13 item 6).
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
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
/* The spill file's layout (daemon/store/spill.h): a 4096-byte file header, 128
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

/* N_CONV conversations of sequences seed, seed + 1, ... */
static uint32_t *conv_tokens_from(uint32_t seed)
{
	uint32_t *all = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));

	assert_non_null(all);
	for (int i = 0; i < N_CONV; i++)
		harness_tokens(all + (size_t)i * CONV, CONV, seed + (uint32_t)i, 0);
	return all;
}

static uint32_t *conv_tokens(void)
{
	return conv_tokens_from(500);
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
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
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
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
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
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
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

	/* Every page listed first, so the reads meet the damaged ones. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(harness_run_child(read_convs, &r), 0); /* right bytes or misses */
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
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
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

/* Matches every conversation: every row matched must be the one written
 * (a page that went to disk as int8 is lossy and never matched as exact),
 * and conversation 0, a permanent span never quantized, matches whole.
 * Returns the conversations matched whole. */
static int read_quantized(kvp_pool *p, const uint32_t *all, int restarted)
{
	int whole = 0;

	for (int i = 0; i < Q_CONV; i++) {
		const uint32_t *t = all + (size_t)i * CONV;
		uint64_t bad, m;
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, t, CONV, &l), 0);
		m = kvp_lease_tokens(l);
		bad = harness_pkv_check_lease(l, p, t, m);
		if (bad)
			fail_msg("conversation %d%s: %llu rows of %llu matched tokens are not the "
				 "ones written",
				 i, restarted ? " (after the restart)" : "",
				 (unsigned long long)bad, (unsigned long long)m);
		if (i == 0)
			assert_int_equal(m, CONV); /* permanent: never quantized */
		whole += m == CONV;
		assert_int_equal(kvp_lease_release(l), 0);
	}
	return whole;
}

static const char *const quant_args[] = {
	"--host-pool-size", "1M", "--disk-pool-size", "16M", "--spill-dtype", "int8", NULL};

static void test_quantized_spill(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(harness_restart(h, SIGTERM, quant_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, "quant-model", &page16k, &p), 0);
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
	/* The conversations that went to disk as int8 are not matched. */
	assert_true(read_quantized(p, all, 0) < Q_CONV);
	ps = pool_stats(c, p);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);

	/* A clean stop writes the rest (conversation 0 as it is), a restart
	 * finds every page in its format, and still matches no lossy one. */
	assert_int_equal(harness_restart(h, SIGTERM, quant_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, "quant-model", &page16k, &p), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.restored_pages, Q_CONV * CONV_PAGES);
	assert_true(read_quantized(p, all, 1) < Q_CONV);
	ps = pool_stats(c, p);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
	free(all);
}

/* Issue 13 item 13: with spill-dtype int8, pages promoted back from disk
 * stayed in the index as if exact: an exact checkpoint restored later
 * came back with 512 of 512 rows of other bytes, and a fresh exact commit
 * of the same tokens was deduplicated onto the lossy copy, so the writer
 * read back rows that differ from what it wrote. */
static void test_lossy_never_exact(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	const uint32_t *t0 = all, *t1 = all + CONV;
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	assert_int_equal(harness_restart(h, SIGTERM, quant_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, "quant-model", &page16k, &p), 0);
	/* Conversation 1 checkpointed while it is exact. */
	assert_int_equal(harness_pkv_commit_session(p, t1, CONV, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "conv1", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	write_convs(p, all, 0, Q_CONV); /* 4x the host tier: the oldest go to disk as int8 */
	ps = pool_stats(c, p);
	assert_true(ps.quantized_pages >= 2 * CONV_PAGES);

	/* A match never returns the lossy pages (nor reads them back). */
	for (int i = 0; i < 2; i++) {
		const uint32_t *t = i ? t1 : t0;

		assert_int_equal(kvp_match_prefix(p, t, CONV, &l), 0);
		assert_int_equal(harness_pkv_check_lease(l, p, t, kvp_lease_tokens(l)), 0);
		assert_true(kvp_lease_tokens(l) < CONV);
		assert_int_equal(kvp_lease_release(l), 0);
	}
	/* A fresh exact commit of the same tokens reads back what it wrote,
	 * and replaces the lossy copy: a match now returns it whole. */
	assert_int_equal(harness_pkv_commit_session(p, t0, CONV, &s), 0);
	assert_int_equal(harness_pkv_check_session(p, s, t0, 0, CONV), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_match_prefix(p, t0, CONV, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), CONV);
	assert_int_equal(harness_pkv_check_lease(l, p, t0, CONV), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* The exact checkpoint restores exact rows, not the lossy copies. */
	assert_int_equal(kvp_session_restore(p, "conv1", &s), 0);
	assert_int_equal(harness_pkv_check_session(p, s, t1, 0, CONV), 0);
	assert_int_equal(kvp_session_close(s), 0);
	ps = pool_stats(c, p);
	assert_true(ps.lossy_replaced_pages >= 2 * CONV_PAGES);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
	free(all);
}

/* ---- restarts that must not surprise ------------------------------------ */

static const char *const recency_args[] = {"--host-pool-size", "1M", "--disk-pool-size", "4M",
					   NULL};

/* Issue 13 item 4: after a restart the disk tier dropped pages in
 * file-slot order, not in the order they were last used: the chain used
 * last lost pages while older ones kept theirs. Conversations A (0-7)
 * are written first, then B (8-15) and F (16-31), so A goes to disk
 * first, in the lowest extents; then A is read back (used last) and the
 * daemon stops cleanly. After the restart new conversations overflow the
 * 1024-page disk tier: what is dropped must be B and F, never A. */
static void test_restart_keeps_recency(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens(), *more = conv_tokens_from(900);
	struct reader a = {h->sock, all, 0, 8, 8};
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	write_convs(p, all, 0, 32);
	ps = pool_stats(c, p);
	assert_true(ps.spilled_pages >= 16 * CONV_PAGES); /* A and B are on disk */
	assert_int_equal(harness_run_child(read_convs, &a), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, SIGTERM, recency_args), 0);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.restored_pages, 32 * CONV_PAGES);
	write_convs(p, more, 0, 56);
	ps = pool_stats(c, p);
	fprintf(stderr, "after the restart: %llu disk pages dropped\n",
		(unsigned long long)ps.disk_dropped);
	assert_true(ps.disk_dropped > 0);
	assert_true(ps.disk_dropped < 24 * CONV_PAGES); /* B and F could take them all */
	/* A, used last before the stop, is whole. */
	assert_int_equal(harness_run_child(read_convs, &a), 0);
	kvp_disconnect(c);
	free(all);
	free(more);
}

/* Issue 13 item 5: a spill file cut short while the daemon was down: the
 * daemon announced 40 pages where 16 remained, the matches hit 25 read
 * errors, and after "8 disk errors in a row ... no more spilling" the
 * tier stayed off until a restart. Then the same under a running daemon:
 * reads of pages that are simply gone drop those pages, not the tier. */
static void test_truncated_file(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens(), *more = conv_tokens_from(900),
		 *newest = conv_tokens_from(1300);
	struct reader r = {h->sock, all, 0, N_CONV, 0};
	struct kvp_pool_stats ps;
	uint64_t spilled, gone;
	kvp_client *c;
	kvp_pool *p;
	int fd;

	fill_and_restart(h, SIGTERM, all);
	assert_int_equal(
		harness_restart(h, SIGTERM, (const char *const[]){"--disk-pool-size", "0", NULL}),
		0);
	fd = spill_fd(h);
	assert_int_equal(ftruncate(fd, (off_t)(DATA_OFF + 16 * PAGE_BYTES)), 0);
	close(fd);
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	assert_true(ps.restored_pages <= 16); /* what the file still holds, no more */
	assert_true(ps.disk_gone_pages > 0);
	assert_int_equal(harness_run_child(read_convs, &r), 0); /* right bytes or misses */
	ps = pool_stats(c, p);
	assert_int_equal(ps.io_errors, 0);

	/* Cut again under the running daemon, after new pages spilled. */
	write_convs(p, more, 0, N_CONV);
	ps = pool_stats(c, p);
	assert_true(ps.spilled_pages > 0);
	gone = ps.disk_gone_pages + ps.verify_failures;
	fd = spill_fd(h);
	assert_int_equal(ftruncate(fd, (off_t)(DATA_OFF + 16 * PAGE_BYTES)), 0);
	close(fd);
	r.all = more;
	assert_int_equal(harness_run_child(read_convs, &r), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.io_errors, 0);
	/* Gone, or in a hole that spills after the cut made again: misses. */
	assert_true(ps.disk_gone_pages + ps.verify_failures > gone);
	/* The tier still spills, and what it spills comes back. */
	spilled = ps.spilled_pages;
	write_convs(p, newest, 0, N_CONV);
	ps = pool_stats(c, p);
	assert_true(ps.spilled_pages > spilled);
	r.all = newest;
	r.from = N_CONV - 24;
	r.min_whole = 24;
	assert_int_equal(harness_run_child(read_convs, &r), 0);
	kvp_disconnect(c);
	free(all);
	free(more);
	free(newest);
}

/* ---- a restart with many pages: listed while the daemon serves ----------- */

/* Issue 17 item 6: the spill file is scanned in steps of 1024 headers on a
 * worker while the daemon serves. KVPALACED_DEBUG_SCAN_STEP_MS (a debug
 * knob, kvpalaced(8)) pauses each step, so the scan of 4096 pages is
 * still running while this client is served; afterwards every page is
 * found with its bytes, and a stop in mid-scan loses nothing. */
#define SCAN_SETS 4
static const char *const scan_args[] = {"--host-pool-size", "1M", "--disk-pool-size", "64M", NULL};

static void restart_scan_slow(struct harness *h, const char *ms)
{
	if (ms)
		setenv("KVPALACED_DEBUG_SCAN_STEP_MS", ms, 1);
	assert_int_equal(harness_restart(h, SIGTERM, scan_args), 0);
	unsetenv("KVPALACED_DEBUG_SCAN_STEP_MS");
}

static void read_all_sets(struct harness *h, uint32_t **sets)
{
	for (int k = 0; k <= SCAN_SETS; k++) {
		struct reader r = {h->sock, sets[k], 0, N_CONV, N_CONV};

		assert_int_equal(harness_run_child(read_convs, &r), 0);
	}
}

static void test_scan_while_serving(void **state)
{
	struct harness *h = *state;
	uint32_t *sets[SCAN_SETS + 1];
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	restart_scan_slow(h, NULL);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	for (int k = 0; k < SCAN_SETS; k++) {
		sets[k] = conv_tokens_from(1000 + 100 * (uint32_t)k);
		write_convs(p, sets[k], 0, N_CONV);
	}
	kvp_disconnect(c);

	/* Slowed down: served while the scan runs, the pages come later. */
	restart_scan_slow(h, "500");
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(kvp_ping(c), 0);
	ps = pool_stats(c, p);
	print_message("during the scan: %llu of %u pages listed\n",
		      (unsigned long long)ps.restored_pages, SCAN_SETS * N_CONV * CONV_PAGES);
	assert_true(ps.restored_pages < SCAN_SETS * N_CONV * CONV_PAGES);
	assert_int_equal(ps.disk_scanning, 1); /* and Stats says so */
	/* Commits meanwhile spill past every header written before (the
	 * host pool holds 256 pages): the pages not found yet survive. */
	sets[SCAN_SETS] = conv_tokens_from(1000 + 100 * SCAN_SETS);
	write_convs(p, sets[SCAN_SETS], 0, N_CONV);
	/* A stop in mid-scan: nothing leaks, nothing is lost. */
	kvp_disconnect(c);
	restart_scan_slow(h, "500");
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	kvp_disconnect(c);
	restart_scan_slow(h, NULL);

	/* Every page found, with its bytes. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.restored_pages, (SCAN_SETS + 1) * N_CONV * CONV_PAGES);
	assert_int_equal(ps.disk_scanning, 0);
	read_all_sets(h, sets);
	kvp_disconnect(c);

	/* In mid-scan a drop is refused, and a purge of the pool waits for
	 * the scan's end: it forgets the pages not listed when it came too,
	 * so the next start finds none. */
	restart_scan_slow(h, "500");
	{
		struct kvp_purge_spec spec = {.flags = KVP_PURGE_POOL};
		struct kvp_purge_result pr;
		kvp_client *admin;

		assert_int_equal(kvp_connect(h->sock, &c), 0);
		assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
		assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
		spec.pool_id = kvp_pool_id(p);
		assert_int_equal(kvp_admin_drop_pool(admin, spec.pool_id, 0, NULL), -EBUSY);
		assert_int_equal(kvp_admin_purge(admin, &spec, &pr), 0);
		assert_int_equal(pr.pages, (SCAN_SETS + 1) * N_CONV * CONV_PAGES);
		kvp_disconnect(admin);
		kvp_disconnect(c);
	}
	restart_scan_slow(h, NULL);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(pool_stats(c, p).restored_pages, 0);
	kvp_disconnect(c);
	for (int k = 0; k <= SCAN_SETS; k++)
		free(sets[k]);
}

static size_t count_spill_files(struct harness *h)
{
	char pattern[160];
	glob_t g;
	size_t n;

	snprintf(pattern, sizeof(pattern), "%s/cache/spill-*.kvs", h->dir);
	if (glob(pattern, 0, NULL, &g) != 0)
		return 0;
	n = g.gl_pathc;
	globfree(&g);
	return n;
}

/* Issue 13 item 6: a file in the cache directory named like a spill file
 * but holding no valid header stayed forever, and so did the spill files
 * of pools with nothing to restart from. They go at start; the spill
 * file of a pool that is not open yet, the next OpenPool's warm restart,
 * and files named otherwise stay. */
static void test_junk_reclaimed(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_pool_stats ps;
	char path[256];
	kvp_client *c;
	kvp_pool *p, *empty;
	int fd;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	write_convs(p, all, 0, 4); /* in the host tier; the clean stop writes them */
	assert_int_equal(harness_pool_open(h, c, "empty-model", &page4k, &empty), 0);
	kvp_disconnect(c);
	snprintf(path, sizeof(path), "%s/cache/spill-%u-0123456789abcdef0123456789abcdef.kvs",
		 h->dir, (unsigned)getuid());
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	{
		static unsigned char junk[65536];

		memset(junk, 0xa5, sizeof(junk));
		assert_int_equal(write(fd, junk, sizeof(junk)), sizeof(junk));
	}
	close(fd);
	snprintf(path, sizeof(path), "%s/cache/notes.txt", h->dir);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(count_spill_files(h), 3);

	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);
	assert_int_equal(count_spill_files(h), 1); /* the junk and the empty pool's */
	assert_int_equal(access(path, F_OK), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = pool_stats(c, p);
	assert_int_equal(ps.restored_pages, 4 * CONV_PAGES);
	kvp_disconnect(c);
	free(all);
}

static int setup_disk(void **state)
{
	return harness_setup_args(state, disk_args);
}

static int setup_recency(void **state)
{
	return harness_setup_args(state, recency_args);
}

static int setup_threads(void **state)
{
	return harness_setup_args(state, thread_args);
}

/* Issue 14 item 5: one user's spill files filled the file system that
 * holds the state directory, and another user's checkpoints then failed.
 * The disk tier has a share per tenant (disk-tenant-size) and leaves
 * disk-reserve free. Two pools of one user, each spilling three times
 * what the share holds, together never hold more than the share; what
 * they still match is right. */
static int setup_share(void **state)
{
	static const char *const extra[] = {"--host-pool-size",
					    "1M",
					    "--disk-pool-size",
					    "16M",
					    "--disk-tenant-size",
					    "2M",
					    NULL};

	return harness_setup_args(state, extra);
}

static uint64_t newest_rows_wrong(kvp_pool *p, const uint32_t *all, int from, int to,
				  int *ret_whole)
{
	uint64_t bad = 0;

	*ret_whole = 0;
	for (int i = from; i < to; i++) {
		const uint32_t *t = all + (size_t)i * CONV;
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, t, CONV, &l), 0);
		bad += harness_pkv_check_lease(l, p, t, kvp_lease_tokens(l));
		*ret_whole += kvp_lease_tokens(l) == CONV;
		assert_int_equal(kvp_lease_release(l), 0);
	}
	return bad;
}

static void test_tenant_disk_share(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_pool_stats a, b;
	kvp_client *c;
	kvp_pool *pa, *pb;
	int whole;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &pa), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL "-b", &page4k, &pb), 0);
	write_convs(pa, all, 0, N_CONV);
	write_convs(pb, all, 0, N_CONV);
	a = pool_stats(c, pa);
	b = pool_stats(c, pb);
	print_message("tenant share 2 MiB (512 pages): pool a %u disk pages, pool b %u; refused "
		      "%llu + %llu\n",
		      a.disk_pages, b.disk_pages, (unsigned long long)a.disk_refused_pages,
		      (unsigned long long)b.disk_refused_pages);
	assert_true(a.disk_pages + b.disk_pages <= 512);
	assert_true(a.disk_pages > 0 && b.disk_pages > 0);
	assert_true(a.disk_refused_pages + b.disk_refused_pages + a.disk_dropped + b.disk_dropped >
		    0);
	assert_int_equal(newest_rows_wrong(pa, all, N_CONV - 8, N_CONV, &whole), 0);
	assert_int_equal(newest_rows_wrong(pb, all, N_CONV - 8, N_CONV, &whole), 0);
	assert_true(whole > 0);
	kvp_disconnect(c);
	free(all);
}

/* A file system at its reserve takes no spill at all; pages leave the
 * host tier by eviction instead, and a checkpoint (the state directory is
 * on the same file system here) is still written. */
static int setup_reserve(void **state)
{
	static const char *const extra[] = {"--host-pool-size",
					    "1M",
					    "--disk-pool-size",
					    "16M",
					    "--disk-reserve",
					    "1000T",
					    NULL};

	return harness_setup_args(state, extra);
}

static void test_disk_reserve(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int whole;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	write_convs(p, all, 0, N_CONV);
	ps = pool_stats(c, p);
	assert_int_equal(ps.spilled_pages, 0);
	assert_int_equal(ps.disk_pages, 0);
	assert_true(ps.disk_refused_pages > 0);
	assert_true(ps.evictions > 0);
	assert_int_equal(newest_rows_wrong(p, all, N_CONV - 4, N_CONV, &whole), 0);
	assert_int_equal(whole, 4);
	assert_int_equal(harness_pkv_commit_session(p, all, CONV, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "reserve-kept", NULL), 0);
	kvp_disconnect(c);
	free(all);
}

/* Issue 14 item 4, pinned memory: with io_uring and a disk tier each
 * pool's whole arena was registered as fixed buffers, pinning it (VmPin
 * 1 GiB per pool); issue 17 item 5: no arena is registered any more (the
 * kernel pins each request's pages), so nothing is pinned, and the pools
 * still spill and read back right. */
static int setup_pin(void **state)
{
	static const char *const extra[] = {"--host-tier-size",
					    "8M",
					    "--host-pool-size",
					    "2M",
					    "--disk-pool-size",
					    "16M",
					    NULL};

	return harness_setup_args(state, extra);
}

static long vm_pin_kib(pid_t pid)
{
	char path[64], line[128];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void test_pinned_share(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	kvp_client *c;
	kvp_pool *p[8];
	long pin;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	for (int i = 0; i < 8; i++) {
		char model[32];

		snprintf(model, sizeof(model), MODEL "-pin-%d", i);
		assert_int_equal(harness_pool_open(h, c, model, &page4k, &p[i]), 0);
	}
	pin = vm_pin_kib(h->pid);
	print_message("8 pools of 2 MiB, host tier 8 MiB: daemon VmPin %ld kB\n", pin);
	if (pin >= 0)
		assert_true(pin <= 512);
	/* A pool past the pinned share still spills and reads back right. */
	write_convs(p[7], all, 0, 40);
	{
		struct kvp_pool_stats ps = pool_stats(c, p[7]);
		int whole;

		assert_true(ps.spilled_pages > 0);
		assert_int_equal(newest_rows_wrong(p[7], all, 0, 40, &whole), 0);
	}
	kvp_disconnect(c);
	free(all);
}

/* Issue 17 item 5: opening a pool with a disk tier made its whole arena
 * resident (the fixed-buffer registration touched and pinned every page,
 * 0.7 s per GiB on the loop). Two pools of 256 MiB now add next to
 * nothing to the daemon's resident memory. */
static int setup_open(void **state)
{
	static const char *const extra[] = {"--host-tier-size",
					    "1G",
					    "--host-pool-size",
					    "256M",
					    "--disk-pool-size",
					    "16M",
					    NULL};

	return harness_setup_args(state, extra);
}

static long rss_kib(pid_t pid)
{
	char path[64], line[128];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Rss: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void test_open_makes_nothing_resident(void **state)
{
	struct harness *h = *state;
	kvp_client *c;
	kvp_pool *p[2];
	long before, after;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	before = rss_kib(h->pid);
	for (int i = 0; i < 2; i++) {
		char model[32];

		snprintf(model, sizeof(model), MODEL "-open-%d", i);
		assert_int_equal(harness_pool_open(h, c, model, &page4k, &p[i]), 0);
		assert_true(pool_stats(c, p[i]).has_disk);
	}
	after = rss_kib(h->pid);
	print_message("2 pools of 256 MiB with a disk tier: daemon Rss %ld -> %ld kB\n", before,
		      after);
	if (before >= 0 && after >= 0)
		assert_true(after - before < 32 * 1024);
	kvp_disconnect(c);
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
		cmocka_unit_test_setup_teardown(test_lossy_never_exact, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_restart_keeps_recency, setup_recency,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_truncated_file, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_junk_reclaimed, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_scan_while_serving, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_tenant_disk_share, setup_share,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_disk_reserve, setup_reserve, harness_teardown),
		cmocka_unit_test_setup_teardown(test_pinned_share, setup_pin, harness_teardown),
		cmocka_unit_test_setup_teardown(test_open_makes_nothing_resident, setup_open,
						harness_teardown),
	};
	harness_eviction = "lru"; /* the assertions spell out LRU's order */

	return cmocka_run_group_tests(tests, NULL, NULL);
}
