/* tests/integration/test_prewarm.c — reading disk pages back ahead of
 * requests (host-prewarm-watermark, daemon/core/prewarm.h; issue 21):
 *  - after a clean restart every page is on disk and the host tier is
 *    empty; with the mark set, the pages used last come back up to the
 *    mark and no further, whole conversations from their first page, and
 *    the newest conversation matches without a disk read; without it
 *    nothing is read;
 *  - a page read ahead is no use until a request uses it: new pages push
 *    the unused ones out first, before older pages committed before them,
 *    and the counters say which were used before they left and which were
 *    not (the mark set by a reload);
 *  - hostile: pages damaged on disk while the daemon was down are read
 *    ahead and never served (right bytes or a shorter match); a purge or
 *    a pool drop right after a restart, and a stop, while reads ahead are
 *    in flight leave the daemon serving and stopping cleanly; a reload
 *    putting the mark above host-low-watermark is refused.
 * Pools of 4 KiB pages: 256 pages, the mark at half of them.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	   "prewarm-model"
#define BT	   16u
#define CONV_PAGES 10u
#define N_CONV	   20u
#define MARK_PAGES 128u /* 0.5 of 256 */

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static const char *const plain[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M", NULL};
static const char *const prewarm[] = {"--host-pool-size",
				      "1M",
				      "--disk-pool-size",
				      "16M",
				      "--host-prewarm-watermark",
				      "0.5",
				      NULL};

static struct kvp_pool_stats stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps;
}

/* The tokens of conversation i (CONV_PAGES pages). */
static void conv_tokens(uint32_t *t, uint32_t i)
{
	harness_tokens(t, (size_t)CONV_PAGES * BT, 500 + i, 0);
}

/* Tokens matched now for conversation i, every byte checked. */
static uint64_t matched(kvp_pool *p, uint32_t i)
{
	uint32_t t[CONV_PAGES * BT];
	kvp_lease *l;
	uint64_t m;

	conv_tokens(t, i);
	assert_int_equal(kvp_match_prefix(p, t, CONV_PAGES * BT, &l), 0);
	m = kvp_lease_tokens(l);
	assert_int_equal(harness_pkv_check_lease(l, p, t, m), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	return m;
}

/* Conversations from..to-1, written and closed in that order: only the
 * index holds them, the last the most recently used. */
static void write_convs(kvp_pool *p, uint32_t from, uint32_t to)
{
	uint32_t t[CONV_PAGES * BT];

	for (uint32_t i = from; i < to; i++) {
		kvp_session *s;

		conv_tokens(t, i);
		assert_int_equal(harness_pkv_commit_session(p, t, CONV_PAGES * BT, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
}

/* Restarts the daemon cleanly (every page goes to disk) with args and
 * opens the pool again once its scan listed the disk pages. */
static void restart(struct harness *h, const char *const *args, kvp_client **c, kvp_pool **p)
{
	kvp_disconnect(*c);
	assert_int_equal(harness_restart(h, SIGTERM, args), 0);
	assert_int_equal(kvp_connect(h->sock, c), 0);
	assert_int_equal(harness_pool_open(h, *c, MODEL, &page4k, p), 0);
}

/* Waits (up to 10 s) until prewarm read want pages and all are in. */
static struct kvp_pool_stats wait_prewarmed(kvp_client *c, kvp_pool *p, uint64_t want)
{
	struct kvp_pool_stats ps = stats(c, p);

	for (int i = 0; i < 1000 && (ps.prewarm_pages < want || ps.host_indexed_pages < want);
	     i++) {
		usleep(10000);
		ps = stats(c, p);
	}
	return ps;
}

/* Connects, opens the pool and writes the N_CONV conversations (200
 * pages: all in the host tier). */
static void start_convs(struct harness *h, kvp_client **c, kvp_pool **p)
{
	assert_int_equal(kvp_connect(h->sock, c), 0);
	assert_int_equal(harness_pool_open(h, *c, MODEL, &page4k, p), 0);
	assert_int_equal(kvp_pool_n_pages(*p), 256);
	write_convs(*p, 0, N_CONV);
}

static void test_restart_reads_back_what_was_used_last(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	uint64_t promoted;
	kvp_client *c;
	kvp_pool *p;

	start_convs(h, &c, &p);

	/* Without the mark nothing comes back by itself (two timer ticks). */
	restart(h, plain, &c, &p);
	usleep(2500000);
	ps = stats(c, p);
	assert_int_equal(ps.disk_pages, N_CONV * CONV_PAGES);
	assert_int_equal(ps.host_indexed_pages, 0);
	assert_int_equal(ps.prewarm_pages, 0);

	/* With it, the mark's worth: the 12 newest conversations whole and
	 * the first 8 pages of the one before, nothing past the mark. */
	restart(h, prewarm, &c, &p);
	ps = wait_prewarmed(c, p, MARK_PAGES);
	assert_int_equal(ps.prewarm_pages, MARK_PAGES);
	assert_int_equal(ps.host_indexed_pages, MARK_PAGES);
	assert_int_equal(ps.promoted_pages, MARK_PAGES);
	assert_int_equal(ps.prewarm_used_pages, 0);
	usleep(1500000); /* a tick later: still no further */
	ps = stats(c, p);
	assert_int_equal(ps.prewarm_pages, MARK_PAGES);
	assert_int_equal(ps.host_indexed_pages, MARK_PAGES);

	/* The newest conversations match without a disk read. */
	promoted = ps.promoted_pages;
	for (uint32_t i = N_CONV - 12; i < N_CONV; i++)
		assert_int_equal(matched(p, i), CONV_PAGES * BT);
	ps = stats(c, p);
	assert_int_equal(ps.promoted_pages, promoted);
	assert_int_equal(ps.prewarm_used_pages, 12 * CONV_PAGES);
	/* The one cut at the mark: its first 8 pages are in, the rest come
	 * from disk as for any match; the oldest wholly from disk. */
	assert_int_equal(matched(p, N_CONV - 13), CONV_PAGES * BT);
	assert_int_equal(matched(p, 0), CONV_PAGES * BT);
	ps = stats(c, p);
	assert_int_equal(ps.promoted_pages, promoted + 2 + CONV_PAGES);
	assert_int_equal(ps.prewarm_used_pages, 12 * CONV_PAGES + 8);
	assert_int_equal(ps.prewarm_unused_pages, 0);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);
}

/* A configuration file the test rewrites (SIGHUP reloads it). */
static char conf_path[128];
static const char *conf_args[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M", "--config",
				  conf_path,	      NULL};

static void write_conf(const char *text)
{
	FILE *f = fopen(conf_path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_unused_pages_read_ahead_leave_first(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	uint64_t promoted;
	kvp_client *c;
	kvp_pool *p;

	start_convs(h, &c, &p);
	restart(h, conf_args, &c, &p);
	/* 50 pages committed after the restart, before anything is read
	 * ahead; then the mark (a reload): 78 pages come back. */
	write_convs(p, 100, 105);
	write_conf("host-prewarm-watermark = 0.5\n");
	assert_int_equal(kill(h->pid, SIGHUP), 0);
	ps = wait_prewarmed(c, p, MARK_PAGES - 50);
	for (int i = 0; i < 1000 && ps.host_indexed_pages < MARK_PAGES; i++) {
		usleep(10000);
		ps = stats(c, p);
	}
	assert_int_equal(ps.prewarm_pages, MARK_PAGES - 50);
	assert_int_equal(ps.host_indexed_pages, MARK_PAGES);

	/* One conversation read ahead is used; then 150 new pages take the
	 * pool past its high mark (243 pages) and eviction down to the low
	 * mark (230) takes pages read ahead and still unused, though the 50
	 * committed before them are older. */
	assert_int_equal(matched(p, N_CONV - 1), CONV_PAGES * BT);
	write_convs(p, 105, 120);
	ps = stats(c, p);
	assert_true(ps.prewarm_unused_pages > 0);
	assert_int_equal(ps.prewarm_used_pages, CONV_PAGES);
	assert_true(ps.prewarm_used_pages + ps.prewarm_unused_pages <= ps.prewarm_pages);
	assert_int_equal(ps.prewarm_pages, MARK_PAGES - 50); /* above the mark: no more */
	promoted = ps.promoted_pages;
	for (uint32_t i = 100; i < 120; i++)
		assert_int_equal(matched(p, i), CONV_PAGES * BT);
	assert_int_equal(matched(p, N_CONV - 1), CONV_PAGES * BT);
	assert_int_equal(stats(c, p).promoted_pages, promoted);
	kvp_disconnect(c);
}

/* ---- hostile cases --------------------------------------------------- */

static char out[8192];

#define ctl(...) harness_ctl(out, sizeof(out), __VA_ARGS__, NULL)

/* The spill file's layout (daemon/store/spill.h, as test_disk.c): a
 * 4096-byte file header, 128 bytes of page header per extent, then
 * 4096-aligned extents. */
#define N_EXTENTS ((16u << 20) / 4096u)
#define DATA_OFF  ((4096ull + N_EXTENTS * 128ull + 4095) / 4096 * 4096)

static void flip_spill(struct harness *h)
{
	int fd = harness_spill_open(h);

	assert_true(fd >= 0);
	for (uint32_t e = 0; e < N_CONV * CONV_PAGES; e += 3) {
		unsigned char b;
		off_t off = (off_t)(DATA_OFF + (uint64_t)e * 4096 + 100 + e);

		assert_int_equal(pread(fd, &b, 1, off), 1);
		b ^= 0x5a;
		assert_int_equal(pwrite(fd, &b, 1, off), 1);
	}
	close(fd);
}

/* Damaged disk pages read ahead: never served, the daemon goes on. */
static void test_corrupt_spill_read_ahead(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	start_convs(h, &c, &p);
	kvp_disconnect(c);
	/* Down with the file closed (no pool opens it), then damaged. */
	assert_int_equal(harness_restart(h, SIGTERM, plain), 0);
	flip_spill(h);
	assert_int_equal(harness_restart(h, SIGTERM, prewarm), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	usleep(1500000);
	for (uint32_t i = 0; i < N_CONV; i++)
		(void)matched(p, i); /* right bytes or a shorter match */
	ps = stats(c, p);
	assert_true(ps.verify_failures > 0);
	assert_true(harness_daemon_alive(h));
	kvp_disconnect(c);
}

/* A pool dropped, or purged, right after a restart, while its reads ahead
 * are in flight; a stop while they are. */
static void test_drop_purge_stop_during_read_ahead(void **state)
{
	struct harness *h = *state;
	char id[32];
	kvp_client *c;
	kvp_pool *p;

	start_convs(h, &c, &p);
	restart(h, prewarm, &c, &p);
	snprintf(id, sizeof(id), "%llu", (unsigned long long)kvp_pool_id(p));
	assert_int_equal(ctl(h->admin_sock, "purge", "--pool", id), 0);
	assert_true(harness_daemon_alive(h));
	kvp_disconnect(c);

	/* purge forgot them all: write again, restart, drop. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	write_convs(p, 0, N_CONV);
	restart(h, prewarm, &c, &p);
	snprintf(id, sizeof(id), "%llu", (unsigned long long)kvp_pool_id(p));
	kvp_disconnect(c);
	(void)ctl(h->admin_sock, "drop", "pool", id);
	assert_true(harness_daemon_alive(h));

	/* Open again (its pages from disk), read ahead, stop at once. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, SIGTERM, prewarm), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, SIGTERM, plain), 0);
}

/* An administrator's evict of the host tier stays done: nothing is read
 * back by itself until a request matches in the pool again (it was all
 * back within a second). */
static void test_admin_evict_holds_prewarm(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;

	start_convs(h, &c, &p);
	restart(h, prewarm, &c, &p);
	ps = wait_prewarmed(c, p, MARK_PAGES);
	assert_int_equal(ps.host_indexed_pages, MARK_PAGES);
	assert_int_equal(ctl(h->admin_sock, "evict", "--tier", "host", "--bytes", "all"), 0);
	usleep(2500000); /* two timer ticks */
	ps = stats(c, p);
	assert_int_equal(ps.host_indexed_pages, 0);
	assert_int_equal(ps.prewarm_pages, MARK_PAGES);
	/* A match: it reads its own pages back, and reading ahead resumes. */
	assert_int_equal(matched(p, 0), CONV_PAGES * BT);
	ps = stats(c, p);
	for (int i = 0; i < 1000 && ps.host_indexed_pages < MARK_PAGES; i++) {
		usleep(10000);
		ps = stats(c, p);
	}
	assert_int_equal(ps.host_indexed_pages, MARK_PAGES);
	assert_int_equal(ps.prewarm_pages, 2 * MARK_PAGES - CONV_PAGES);
	kvp_disconnect(c);
}

/* A reload setting the mark above host-low-watermark is refused. */
static void test_reload_mark_above_low_refused(void **state)
{
	struct harness *h = *state;

	write_conf("host-low-watermark = 0.5\nhost-prewarm-watermark = 0.6\n");
	assert_int_not_equal(ctl(h->admin_sock, "config", "reload"), 0);
	assert_true(harness_daemon_alive(h));
	assert_int_equal(ctl(h->admin_sock, "config", "show"), 0);
	if (!strstr(out, "host-prewarm-watermark") || strstr(out, "0.60"))
		fail_msg("reload took the mark:\n%s", out);
}

static int setup(void **state)
{
	return harness_setup_args(state, plain);
}

static int setup_conf(void **state)
{
	snprintf(conf_path, sizeof(conf_path), "/tmp/kvp-prewarm-%d.conf", (int)getpid());
	write_conf("host-prewarm-watermark = 0\n");
	return harness_setup_args(state, conf_args);
}

static int teardown_conf(void **state)
{
	unlink(conf_path);
	return harness_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_restart_reads_back_what_was_used_last, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_unused_pages_read_ahead_leave_first,
						setup_conf, teardown_conf),
		cmocka_unit_test_setup_teardown(test_corrupt_spill_read_ahead, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_drop_purge_stop_during_read_ahead, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_admin_evict_holds_prewarm, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_reload_mark_above_low_refused, setup_conf,
						teardown_conf),
	};

	return cmocka_run_group_tests_name("prewarm", tests, NULL, NULL);
}
