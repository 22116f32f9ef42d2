/* bench/disk_bench.c — the disk tier and checkpoints: spill write
 * bandwidth, promote read bandwidth, checkpoint write and restore, and
 * the match latency of a prefix that lives on disk.
 *
 * Against a running kvpalaced (bench/run starts it with a small host pool
 * and a disk tier in its scratch directory; this program starts nothing),
 * through the real library, one client, unpipelined. One invocation runs
 * one mode:
 *
 *  --mode write  writes a 4k-token prefix, then sessions of --session-pages
 *                pages each (created, every page written, committed,
 *                closed: their full pages then belong to the prefix index
 *                only) until --working-mib MiB are written, several times
 *                the host pool, so the daemon spills index pages to disk
 *                to make room. Once the first page has reached disk (the
 *                pool is in steady state) it counts the pages spilled and
 *                the bytes committed until the last commit: spill write
 *                bandwidth and commit throughput, MiB/s.
 *  --mode read   against the same daemon restarted on the same cache
 *                directory (bench/run does that), so the host tier is
 *                empty and every spilled page is on disk only, which is
 *                what a warm restart finds: times one match of the 4k
 *                prefix from disk (every page promoted: read, verified
 *                with XXH3, pinned), then the same match again, now
 *                resident in host (median); then matches every session
 *                written by --mode write, oldest first, and releases each
 *                lease (nothing read, nothing verified here): pages
 *                promoted per second, MiB/s. Pages written in the
 *                write pass's last host pool never reached disk and are
 *                lost with the restart: those sessions are misses.
 *  --mode ckpt   in a pool of its own: commits a session of --ckpt-mib
 *                MiB, times kvp_session_checkpoint (written and fsynced by
 *                the daemon), closes the session, drops the file from the
 *                page cache (POSIX_FADV_DONTNEED on
 *                <state-dir>/checkpoints/<uid>/<name>, so the restore
 *                reads the disk, as fio's read reference does) and times
 *                kvp_session_restore; MiB/s of the checkpoint file. Then
 *                removes the checkpoint (untimed), so each run writes a
 *                new file, as its dd reference does.
 *  --mode spill  the daemon's own spill rate, apart from how fast a client
 *                fills pages: in a pool of its own (model id per --seed),
 *                commits sessions of --session-pages pages until the host
 *                pool is 80 % full (under the high watermark, so nothing
 *                spills yet; none of the pages has a disk copy), then times
 *                kvp_admin_evict of the host tier through --admin-socket
 *                until the pool's index holds nothing in host: every page
 *                written to the spill file and its host copy freed. Two
 *                rounds: the first into a new spill file
 *                (disk.spill_evict_new_bw), the second on new sessions
 *                into the extents the first used, after it was dropped
 *                from disk with kvp_admin_evict of the disk tier
 *                (disk.spill_evict_reuse_bw); MiB/s of pages written.
 *  --mode open   opens a new pool (model id per --seed) while a forked
 *                client pings the daemon in a loop: the open's time, the
 *                growth of the daemon's resident memory (--daemon-pid, from
 *                /proc/PID/smaps_rollup) and the worst ping during it.
 *  --mode restart-fill  writes --pages pages of 4 KiB (the smallest a
 *                pool takes) in sessions of 256 pages into a pool of its
 *                own (model id per --seed); the daemon spills what its host
 *                pool cannot hold, and its clean stop writes the rest.
 *  --mode restart  against the daemon restarted after restart-fill (same
 *                --pages, --seed), while a forked client pings: the pool
 *                open's time, the time to the first hit (the oldest
 *                session matches whole; its bytes are checked), the time
 *                until every page is listed (the pool's restored pages
 *                reach --pages), the cost per page, the worst ping.
 *
 * Write and read regenerate the same token ids from --seed, so the read
 * pass matches exactly what the write pass committed. The layout makes
 * pages of --page-kib KiB (f16, 16 tokens per page, 4 KV heads of 128,
 * --page-kib / 32 layers); bench/run gives fio the same block size.
 * A page is written whole through kvp_session_kv() of its first token
 * (the header documents the page layout: data[layer][k|v][head][token][dim]
 * is page_bytes in a row).
 *
 * Only the operations under test are timed. Prints "sample NAME VALUE"
 * lines (MiB/s, microseconds) that bench/run turns into medians and ratios
 * against fio measured in the same run; progress and errors go to stderr;
 * any failure exits 1. Single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_PROG "kvp-bench-disk"
#include "bench_util.h"
#include "kvpalace.h"

#define MODEL	    "kvp-bench-disk"
#define CKPT_MODEL  "kvp-bench-disk-ckpt"
#define CKPT_NAME   "kvp-bench-disk"
#define BLOCK	    16u
#define LAYER_BYTES (BLOCK * 2u * 4u * 128u * 2u) /* tokens × K,V × heads × dim × f16 */
#define MIB	    (1024.0 * 1024.0)

static struct {
	const char *sock;
	const char *mode;
	const char *state_dir;
	const char *admin_sock;
	unsigned page_kib;
	unsigned working_mib;
	unsigned session_pages;
	unsigned prefix_tokens;
	unsigned ckpt_mib;
	unsigned daemon_pid;
	unsigned pages;
	uint64_t seed;
	double seconds;
} opt = {
	.page_kib = 128,
	.working_mib = 256,
	.session_pages = 32,
	.prefix_tokens = 4096,
	.ckpt_mib = 64,
	.seed = 1,
	.pages = 25600,
	.seconds = 1,
};

static struct kvp_layout layout = {
	.n_kv_heads = 4,
	.head_dim = 128,
	.block_tokens = BLOCK,
	.dtype = KVP_DTYPE_F16,
};

static void check(kvp_client *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s (%d)", what, kvp_strerror(c, r), r);
}

static double median_ns(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

/* Token ids like a real vocabulary's; a different stream per seed. */
static void fill_tokens(uint32_t *t, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		t[i] = 1000u + (uint32_t)(x % 150000u);
	}
}

/* The seeds of the prefix, of session i of the working set and of the
 * checkpointed session: distinct streams, the same in write and read. */
static uint64_t prefix_seed(void)
{
	return opt.seed * 1000003u;
}
static uint64_t session_seed(uint64_t i)
{
	return opt.seed * 1000003u + 1 + i;
}

/* The pool's counters, from one Stats round trip. */
static struct kvp_pool_stats pool_stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps = {0};
	struct kvp_stats *st;
	int found = 0;

	check(c, kvp_stats(c, &st), "kvp_stats");
	for (size_t i = 0; i < st->n_pools; i++)
		if (st->pools[i].pool_id == kvp_pool_id(p)) {
			ps = st->pools[i];
			found = 1;
		}
	kvp_stats_free(st);
	if (!found)
		die("kvp_stats does not list pool %" PRIu64, kvp_pool_id(p));
	return ps;
}

static const char *io_backend(kvp_client *c)
{
	static char buf[sizeof(((struct kvp_stats *)0)->disk_io)];
	struct kvp_stats *st;

	check(c, kvp_stats(c, &st), "kvp_stats");
	snprintf(buf, sizeof(buf), "%s", st->disk_io[0] ? st->disk_io : "none");
	kvp_stats_free(st);
	return buf;
}

/* Appends tokens[0..n) to a new session, writes every page whole (a
 * pattern that differs per page: the bytes do not matter, the writing
 * does), commits; returns the session, open. */
static kvp_session *commit_session(kvp_client *c, kvp_pool *p, const uint32_t *tokens, size_t n)
{
	size_t page_bytes = kvp_pool_page_bytes(p);
	kvp_session *s;

	check(c, kvp_session_create(p, &s), "kvp_session_create");
	check(c, kvp_append(s, tokens, n), "kvp_append");
	for (size_t pos = 0; pos < n; pos += BLOCK) {
		unsigned char *page = kvp_session_kv(s, pos, 0, 0, 0);

		if (!page)
			die("kvp_session_kv(%zu) gave NULL", pos);
		memset(page, (int)(pos / BLOCK) | 1, page_bytes);
		memcpy(page, tokens + pos, sizeof(*tokens));
	}
	check(c, kvp_commit(s, n), "kvp_commit");
	return s;
}

static void open_pool(kvp_client **c, kvp_pool **p, const char *model)
{
	int r = kvp_connect(opt.sock, c);

	if (r < 0)
		die("kvp_connect %s: %s", opt.sock, strerror(-r));
	check(*c, kvp_pool_open(*c, model, &layout, p), "kvp_pool_open");
	if (kvp_pool_page_bytes(*p) != (size_t)opt.page_kib * 1024u)
		die("pages of %zu bytes, not the %u KiB asked for", kvp_pool_page_bytes(*p),
		    opt.page_kib);
}

/* Sessions of the working set: the prefix's pages count in it. */
static uint64_t n_sessions(void)
{
	uint64_t pages = (uint64_t)opt.working_mib * 1024u / opt.page_kib;
	uint64_t prefix_pages = opt.prefix_tokens / BLOCK;

	return pages > prefix_pages ? (pages - prefix_pages) / opt.session_pages : 0;
}

/* ---- write: spill bandwidth and steady-state commit throughput -------------- */

static void mode_write(void)
{
	size_t n_tok = (size_t)opt.session_pages * BLOCK, page_bytes;
	uint32_t *tokens = malloc(((size_t)opt.prefix_tokens + n_tok) * sizeof(uint32_t));
	struct kvp_pool_stats ps0, ps1;
	uint64_t n = n_sessions(), i, steady_from = 0, t0 = 0, t1;
	kvp_client *c;
	kvp_pool *p;

	if (!tokens)
		die("out of memory");
	open_pool(&c, &p, MODEL);
	page_bytes = kvp_pool_page_bytes(p);
	ps0 = pool_stats(c, p);
	if (!ps0.has_disk)
		die("the pool has no disk tier (kvpalaced --disk-pool-size, --cache-dir)");
	if ((uint64_t)opt.working_mib * MIB < 2.0 * ps0.n_pages * page_bytes)
		die("a working set of %u MiB is less than twice the host pool (%.0f MiB)",
		    opt.working_mib, ps0.n_pages * (double)page_bytes / MIB);
	fprintf(stderr,
		"disk write: host pool %.0f MiB, pages of %zu KiB, %" PRIu64
		" sessions of %u pages after a %u-token prefix; I/O backend %s\n",
		ps0.n_pages * (double)page_bytes / MIB, page_bytes / 1024, n, opt.session_pages,
		opt.prefix_tokens, io_backend(c));

	/* The prefix first: the oldest pages, spilled first. */
	fill_tokens(tokens, opt.prefix_tokens, prefix_seed());
	check(c, kvp_session_close(commit_session(c, p, tokens, opt.prefix_tokens)),
	      "kvp_session_close");
	for (i = 0; i < n; i++) {
		fill_tokens(tokens, n_tok, session_seed(i));
		check(c, kvp_session_close(commit_session(c, p, tokens, n_tok)),
		      "kvp_session_close");
		/* Steady state from the first page on disk: asked after each
		 * session until then (a round trip against 4 MiB written). */
		if (!t0) {
			ps0 = pool_stats(c, p);
			if (ps0.spilled_pages) {
				t0 = now_ns();
				steady_from = i + 1;
			}
		}
	}
	t1 = now_ns();
	ps1 = pool_stats(c, p);
	if (!t0 || n - steady_from < 2)
		die("nothing spilled, or too late to measure (%" PRIu64 " of %" PRIu64
		    " sessions written in steady state): grow --working-mib",
		    n - steady_from, n);
	{
		double s = (double)(t1 - t0) / 1e9;
		double spilled = (double)(ps1.spilled_pages - ps0.spilled_pages) * page_bytes / MIB;
		double committed = (double)(n - steady_from) * n_tok / BLOCK * page_bytes / MIB;

		sample("disk.spill_write_bw", spilled / s);
		sample("disk.commit_steady_bw", committed / s);
		fprintf(stderr,
			"  steady state (%" PRIu64
			" sessions, %.3f s): %.0f MiB spilled (%.0f MiB/s), "
			"%.0f MiB committed (%.0f MiB/s)\n",
			n - steady_from, s, spilled, spilled / s, committed, committed / s);
		fprintf(stderr,
			"  pool: %" PRIu64
			" pages spilled, %u on disk, %u indexed in host, %" PRIu64
			" I/O errors, %" PRIu64 " dropped from disk\n",
			ps1.spilled_pages, ps1.disk_pages, ps1.host_indexed_pages, ps1.io_errors,
			ps1.disk_dropped);
	}
	if (ps1.io_errors)
		die("%" PRIu64 " disk I/O errors", ps1.io_errors);
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(tokens);
}

/* ---- read: the prefix from disk and from host, promote bandwidth ----------------- */

static uint64_t match_once(kvp_client *c, kvp_pool *p, const uint32_t *tokens, size_t n,
			   uint64_t *ret_tokens)
{
	uint64_t t0 = now_ns(), t;
	kvp_lease *l;

	check(c, kvp_match_prefix(p, tokens, n, &l), "kvp_match_prefix");
	t = now_ns() - t0;
	*ret_tokens = kvp_lease_tokens(l);
	check(c, kvp_lease_release(l), "kvp_lease_release");
	return t;
}

static void mode_read(void)
{
	size_t n_tok = (size_t)opt.session_pages * BLOCK, page_bytes, cap = 1u << 14, k = 0;
	uint32_t *tokens = malloc(((size_t)opt.prefix_tokens + n_tok) * sizeof(uint32_t));
	uint64_t *v = malloc(cap * sizeof(*v)), n = n_sessions(), got, hits = 0, t0, t1, stop;
	struct kvp_pool_stats ps0, ps1;
	double disk_us, host_us;
	kvp_client *c;
	kvp_pool *p;

	if (!tokens || !v)
		die("out of memory");
	open_pool(&c, &p, MODEL);
	page_bytes = kvp_pool_page_bytes(p);
	/* The warm restart lists the spill file's pages while the daemon
	 * serves (pages not listed yet are misses): this mode times reads
	 * from disk, so it starts once every page is listed. */
	t0 = now_ns();
	while ((ps0 = pool_stats(c, p)).disk_scanning) {
		if (now_ns() - t0 > 60ull * 1000000000u)
			die("the daemon still scans the spill file after 60 s (%" PRIu64
			    " pages listed)",
			    ps0.restored_pages);
		usleep(1000);
	}
	fprintf(stderr,
		"disk read: after a restart, %u pages on disk (%" PRIu64
		" found in the spill file), %u indexed in host; I/O backend %s\n",
		ps0.disk_pages, ps0.restored_pages, ps0.host_indexed_pages, io_backend(c));
	if (!ps0.has_disk || ps0.disk_pages < opt.prefix_tokens / BLOCK)
		die("the restarted daemon lists %u pages on disk: was --mode write run on this "
		    "cache directory with the same --seed, --page-kib and sizes?",
		    ps0.disk_pages);

	/* The prefix, on disk only: one sample per daemon start. */
	fill_tokens(tokens, opt.prefix_tokens, prefix_seed());
	disk_us = (double)match_once(c, p, tokens, opt.prefix_tokens, &got) / 1000.0;
	if (got != opt.prefix_tokens)
		die("the %u-token prefix matched %" PRIu64 " tokens from disk", opt.prefix_tokens,
		    got);
	/* Now resident in host. */
	stop = now_ns() + (uint64_t)(opt.seconds * 1e9);
	while (k < 5 || (now_ns() < stop && k < cap)) {
		v[k++] = match_once(c, p, tokens, opt.prefix_tokens, &got);
		if (got != opt.prefix_tokens)
			die("the %u-token prefix matched %" PRIu64 " tokens in host",
			    opt.prefix_tokens, got);
	}
	host_us = median_ns(v, k) / 1000.0;
	sample("disk.match_4k_disk_us", disk_us);
	sample("disk.match_4k_host_us", host_us);
	fprintf(stderr,
		"  %u-token prefix (%.0f MiB): match from disk %.0f us, in host %.1f us "
		"(median of %zu)\n",
		opt.prefix_tokens, opt.prefix_tokens / BLOCK * (double)page_bytes / MIB, disk_us,
		host_us, k);

	/* Every session of the working set, oldest first. */
	ps0 = pool_stats(c, p);
	t0 = now_ns();
	for (uint64_t i = 0; i < n; i++) {
		fill_tokens(tokens, n_tok, session_seed(i));
		match_once(c, p, tokens, n_tok, &got);
		hits += got == n_tok;
	}
	t1 = now_ns();
	ps1 = pool_stats(c, p);
	{
		double s = (double)(t1 - t0) / 1e9;
		double promoted =
			(double)(ps1.promoted_pages - ps0.promoted_pages) * page_bytes / MIB;

		if (ps1.promoted_pages == ps0.promoted_pages)
			die("no page was promoted: nothing of the working set was on disk");
		sample("disk.promote_read_bw", promoted / s);
		fprintf(stderr,
			"  %" PRIu64 " sessions matched (%" PRIu64 " whole, the rest lost with "
			"the restart), %.3f s: %.0f MiB promoted (%.0f MiB/s); %" PRIu64
			" pages spilled meanwhile\n",
			n, hits, s, promoted, promoted / s, ps1.spilled_pages - ps0.spilled_pages);
	}
	if (ps1.verify_failures || ps1.io_errors)
		die("%" PRIu64 " pages failed verification, %" PRIu64 " I/O errors",
		    ps1.verify_failures, ps1.io_errors);
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(tokens);
	free(v);
}

/* ---- ckpt: checkpoint write and restore ---------------------------------------------- */

/* Drops the checkpoint file from the page cache; returns 0 or -errno. */
static int drop_cached(void)
{
	char path[4096];
	int fd, r;

	snprintf(path, sizeof(path), "%s/checkpoints/%u/%s", opt.state_dir, (unsigned)getuid(),
		 CKPT_NAME);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	return -r;
}

static void mode_ckpt(void)
{
	size_t page_bytes = (size_t)opt.page_kib * 1024u;
	size_t n_tok = (size_t)opt.ckpt_mib * 1024u * 1024u / page_bytes * BLOCK;
	uint32_t *tokens = malloc(n_tok * sizeof(uint32_t));
	uint64_t bytes, t0, tw, tr;
	kvp_session *s, *r;
	kvp_client *c;
	kvp_pool *p;
	int ret;

	if (!tokens)
		die("out of memory");
	if (!opt.state_dir)
		die("--mode ckpt needs --state-dir (the daemon's)");
	open_pool(&c, &p, CKPT_MODEL);
	if ((double)kvp_pool_n_pages(p) * page_bytes < 2.5 * opt.ckpt_mib * MIB)
		die("a host pool of %.0f MiB: too small to restore %u MiB beside the original "
		    "without spilling",
		    kvp_pool_n_pages(p) * (double)page_bytes / MIB, opt.ckpt_mib);
	/* New tokens each run, so nothing is found in the index already. */
	fill_tokens(tokens, n_tok, now_ns());
	s = commit_session(c, p, tokens, n_tok);

	t0 = now_ns();
	check(c, kvp_session_checkpoint(s, CKPT_NAME, &bytes), "kvp_session_checkpoint");
	tw = now_ns() - t0;
	check(c, kvp_session_close(s), "kvp_session_close");
	ret = drop_cached();
	if (ret < 0)
		fprintf(stderr, "  warning: cannot drop the checkpoint from the page cache: %s\n",
			strerror(-ret));

	t0 = now_ns();
	check(c, kvp_session_restore(p, CKPT_NAME, &r), "kvp_session_restore");
	tr = now_ns() - t0;
	if (kvp_session_committed(r) != n_tok)
		die("restored %" PRIu64 " of %zu tokens", kvp_session_committed(r), n_tok);
	check(c, kvp_session_close(r), "kvp_session_close (restored)");

	sample("disk.checkpoint_write_bw", bytes / MIB / ((double)tw / 1e9));
	sample("disk.restore_read_bw", bytes / MIB / ((double)tr / 1e9));
	fprintf(stderr,
		"ckpt: %zu tokens, file of %.1f MiB: checkpoint %.1f ms (%.0f MiB/s), restore "
		"%.1f ms (%.0f MiB/s)%s\n",
		n_tok, bytes / MIB, (double)tw / 1e6, bytes / MIB / ((double)tw / 1e9),
		(double)tr / 1e6, bytes / MIB / ((double)tr / 1e9),
		ret < 0 ? " (file maybe in the page cache)" : ", from disk");
	/* Untimed: so the next run writes a new file, as dd does, and does
	 * not pay in its directory fsync for freeing this one's blocks. */
	check(c, kvp_checkpoint_remove(c, CKPT_NAME, 0, 0, NULL), "kvp_checkpoint_remove");
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(tokens);
}

/* ---- spill: the daemon's write rate, fed from a full host tier ----------------- */

/* Moves every page of pool p that only the index holds out of the host tier
 * (down to disk: each is written first) through admin connection a;
 * returns the bytes that left. */
static uint64_t evict_all(kvp_client *a, kvp_pool *p, uint32_t tier)
{
	uint64_t bytes = 0;

	for (;;) {
		struct kvp_evict_result *r;

		check(a, kvp_admin_evict(a, tier, kvp_pool_id(p), KVP_EVICT_ALL, 0, &r),
		      "kvp_admin_evict");
		bytes += r->bytes;
		if (!r->more || !r->pages) {
			free(r);
			return bytes;
		}
		free(r);
	}
}

static void mode_spill(void)
{
	size_t n_tok = (size_t)opt.session_pages * BLOCK;
	uint32_t *tokens = malloc(n_tok * sizeof(uint32_t));
	char model[64];
	static const char *const name[2] = {"disk.spill_evict_new_bw", "disk.spill_evict_reuse_bw"};
	kvp_client *c, *a;
	kvp_pool *p;
	int r;

	if (!tokens)
		die("out of memory");
	if (!opt.admin_sock)
		die("--mode spill needs --admin-socket (the daemon's)");
	r = kvp_connect(opt.admin_sock, &a);
	if (r < 0)
		die("kvp_connect %s: %s", opt.admin_sock, strerror(-r));
	snprintf(model, sizeof(model), "%s-spill-%" PRIu64, MODEL, opt.seed);
	open_pool(&c, &p, model);
	for (int round = 0; round < 2; round++) {
		struct kvp_pool_stats ps0 = pool_stats(c, p), ps1;
		uint64_t n = (uint64_t)(0.8 * ps0.n_pages) / opt.session_pages, t0, bytes;
		double s;

		if (!ps0.has_disk)
			die("the pool has no disk tier (kvpalaced --disk-pool-size, --cache-dir)");
		if (!n)
			die("a host pool of %u pages holds no session of %u pages", ps0.n_pages,
			    opt.session_pages);
		for (uint64_t i = 0; i < n; i++) {
			fill_tokens(tokens, n_tok,
				    session_seed(i + round * n + opt.seed * 1000000u));
			check(c, kvp_session_close(commit_session(c, p, tokens, n_tok)),
			      "kvp_session_close");
		}
		ps1 = pool_stats(c, p);
		if (ps1.spilled_pages != ps0.spilled_pages || ps1.disk_pages)
			die("%u pages reached disk while the host pool filled: a smaller "
			    "--session-pages or a larger host pool",
			    ps1.disk_pages);
		ps0 = ps1;
		t0 = now_ns();
		bytes = evict_all(a, p, KVP_TIER_HOST);
		s = (double)(now_ns() - t0) / 1e9;
		ps1 = pool_stats(c, p);
		if (ps1.io_errors)
			die("%" PRIu64 " disk I/O errors", ps1.io_errors);
		if (ps1.host_indexed_pages ||
		    ps1.spilled_pages - ps0.spilled_pages < n * opt.session_pages)
			die("after the eviction %u pages are still in host and %" PRIu64
			    " of %" PRIu64 " were written",
			    ps1.host_indexed_pages, ps1.spilled_pages - ps0.spilled_pages,
			    n * opt.session_pages);
		fprintf(stderr, "disk spill, round %d: %.1f MiB written in %.1f ms: %.0f MiB/s\n",
			round + 1, bytes / MIB, s * 1e3, bytes / MIB / s);
		sample(name[round], bytes / MIB / s);
		evict_all(a, p, KVP_TIER_DISK);
	}
	kvp_pool_close(p);
	kvp_disconnect(c);
	kvp_disconnect(a);
	free(tokens);
}

/* ---- open: opening a pool beside a pinging client ------------------------------ */

/* The daemon's resident memory, KiB (Rss of /proc/PID/smaps_rollup: its
 * own pages and the shared arena pages it maps), or -1 where unreadable. */
static long daemon_rss_kib(unsigned pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%u/smaps_rollup", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Rss: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* In a child: pings the daemon over a connection of its own until the
 * parent closes stop_fd's other end; writes the worst and the median
 * round trip (ns) to out_fd. */
static void pinger(int stop_fd, int out_fd)
{
	static uint64_t v[1u << 20];
	size_t n = 0;
	uint64_t worst = 0, res[2];
	kvp_client *c;

	if (kvp_connect(opt.sock, &c) < 0)
		_exit(1);
	if (write(out_fd, "r", 1) != 1) /* connected: the parent may start */
		_exit(1);
	for (;;) {
		uint64_t t0 = now_ns(), t;
		char b;

		check(c, kvp_ping(c), "kvp_ping");
		t = now_ns() - t0;
		worst = t > worst ? t : worst;
		if (n < sizeof(v) / sizeof(*v))
			v[n++] = t;
		if (read(stop_fd, &b, 1) == 0)
			break; /* non-blocking: EAGAIN until the parent closes it */
	}
	res[0] = worst;
	res[1] = (uint64_t)median_ns(v, n);
	if (write(out_fd, res, sizeof(res)) != (ssize_t)sizeof(res))
		_exit(1);
	kvp_disconnect(c);
	_exit(0);
}

/* A pinging client beside the parent's work (pinger): started connected,
 * then stopped with its worst and median round trip (ns). */
struct pinging {
	pid_t pid;
	int stop_w, out_r;
};

static struct pinging pinger_start(void)
{
	struct pinging g;
	int stop[2], out[2];
	char b;

	if (pipe(stop) < 0 || pipe(out) < 0 || fcntl(stop[0], F_SETFL, O_NONBLOCK) < 0)
		die("pipe: %s", strerror(errno));
	g.pid = fork();
	if (g.pid < 0)
		die("fork: %s", strerror(errno));
	if (g.pid == 0) {
		close(stop[1]);
		close(out[0]);
		pinger(stop[0], out[1]);
	}
	close(stop[0]);
	close(out[1]);
	if (read(out[0], &b, 1) != 1)
		die("the pinging client did not connect");
	g.stop_w = stop[1];
	g.out_r = out[0];
	return g;
}

static void pinger_stop(struct pinging *g, uint64_t res[2])
{
	close(g->stop_w);
	if (read(g->out_r, res, 2 * sizeof(*res)) != (ssize_t)(2 * sizeof(*res)))
		die("the pinging client failed");
	close(g->out_r);
	waitpid(g->pid, NULL, 0);
}

/* Opens a new pool (a model id of its own per --seed) in a daemon whose
 * host pool is the arena size under test, while a forked client pings:
 * the open's time, the daemon's resident growth, the pinger's worst round
 * trip during it against its median. Samples disk.open_ms, disk.open_rss_mib,
 * disk.open_ping_worst_us, disk.open_ping_median_us. */
static void mode_open(void)
{
	struct pinging g;
	uint64_t res[2], t0, t;
	long rss0, rss1;
	char model[64];
	kvp_client *c;
	kvp_pool *p;

	if (!opt.daemon_pid)
		die("--mode open wants --daemon-pid");
	g = pinger_start();
	if (kvp_connect(opt.sock, &c) < 0)
		die("kvp_connect %s", opt.sock);
	usleep(50000); /* the pinger's median before the open */
	snprintf(model, sizeof(model), "kvp-bench-open-%" PRIu64, opt.seed);
	rss0 = daemon_rss_kib(opt.daemon_pid);
	t0 = now_ns();
	check(c, kvp_pool_open(c, model, &layout, &p), "kvp_pool_open");
	t = now_ns() - t0;
	rss1 = daemon_rss_kib(opt.daemon_pid);
	usleep(50000);
	pinger_stop(&g, res);
	if (!pool_stats(c, p).has_disk)
		die("the pool has no disk tier (kvpalaced --disk-pool-size, --cache-dir)");
	sample("disk.open_ms", (double)t / 1e6);
	if (rss0 >= 0 && rss1 >= 0)
		sample("disk.open_rss_mib", (double)(rss1 - rss0) / 1024.0);
	sample("disk.open_ping_worst_us", (double)res[0] / 1e3);
	sample("disk.open_ping_median_us", (double)res[1] / 1e3);
	fprintf(stderr,
		"disk open: %.3f ms, daemon resident %+.1f MiB, ping worst %.0f us (median %.0f "
		"us)\n",
		(double)t / 1e6, (double)(rss1 - rss0) / 1024.0, (double)res[0] / 1e3,
		(double)res[1] / 1e3);
	kvp_pool_close(p);
	kvp_disconnect(c);
}

/* ---- restart: the warm-restart scan of many small spilled pages ------------- */

/* Pages of 4 KiB, the smallest a pool takes (one layer, one head of 64,
 * 16 tokens, f16), so many pages cost little disk; sessions of 256 pages. */
#define RS_PAGES_PER_SESSION 256u
static struct kvp_layout rs_layout = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BLOCK,
	.dtype = KVP_DTYPE_F16,
};

static void rs_open(kvp_client **c, kvp_pool **p)
{
	char model[64];
	int r = kvp_connect(opt.sock, c);

	if (r < 0)
		die("kvp_connect %s: %s", opt.sock, strerror(-r));
	snprintf(model, sizeof(model), "kvp-bench-restart-%" PRIu64, opt.seed);
	check(*c, kvp_pool_open(*c, model, &rs_layout, p), "kvp_pool_open");
}

/* Session i's tokens; its page k starts with (i, k) so a read can tell. */
static void rs_tokens(uint32_t *t, uint64_t i)
{
	fill_tokens(t, (size_t)RS_PAGES_PER_SESSION * BLOCK, session_seed(i) * 7919u);
}

/* Writes --pages pages (whole sessions) into the pool of --seed; the
 * daemon spills what its host pool cannot hold and writes the rest at
 * its clean stop (bench/run stops it). */
static void mode_restart_fill(void)
{
	size_t n_tok = (size_t)RS_PAGES_PER_SESSION * BLOCK;
	uint32_t *tokens = malloc(n_tok * sizeof(uint32_t));
	uint64_t n = opt.pages / RS_PAGES_PER_SESSION, t0 = now_ns();
	kvp_client *c;
	kvp_pool *p;

	if (!tokens)
		die("out of memory");
	rs_open(&c, &p);
	if (!pool_stats(c, p).has_disk)
		die("the pool has no disk tier (kvpalaced --disk-pool-size, --cache-dir)");
	for (uint64_t i = 0; i < n; i++) {
		kvp_session *s;

		rs_tokens(tokens, i);
		check(c, kvp_session_create(p, &s), "kvp_session_create");
		check(c, kvp_append(s, tokens, n_tok), "kvp_append");
		for (size_t k = 0; k < RS_PAGES_PER_SESSION; k++) {
			uint32_t *page = kvp_session_kv(s, k * BLOCK, 0, 0, 0);

			if (!page)
				die("kvp_session_kv gave NULL");
			memset(page, 0x5a, kvp_pool_page_bytes(p));
			page[0] = (uint32_t)i;
			page[1] = (uint32_t)k;
		}
		check(c, kvp_commit(s, n_tok), "kvp_commit");
		check(c, kvp_session_close(s), "kvp_session_close");
	}
	fprintf(stderr, "restart fill: %" PRIu64 " pages in %.2f s\n", n * RS_PAGES_PER_SESSION,
		(double)(now_ns() - t0) / 1e9);
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(tokens);
}

/* 1 when session i matches whole and its pages hold what the fill wrote. */
static int rs_hit(kvp_client *c, kvp_pool *p, const uint32_t *tokens, uint64_t i)
{
	size_t n_tok = (size_t)RS_PAGES_PER_SESSION * BLOCK;
	kvp_lease *l;
	int hit;

	check(c, kvp_match_prefix(p, tokens, n_tok, &l), "kvp_match_prefix");
	hit = kvp_lease_tokens(l) == n_tok;
	for (size_t k = 0; hit && k < RS_PAGES_PER_SESSION; k++) {
		const uint32_t *page = kvp_lease_kv(l, k * BLOCK, 0, 0, 0);

		if (!page || page[0] != (uint32_t)i || page[1] != (uint32_t)k)
			die("session %" PRIu64 " page %zu: wrong bytes after the restart", i, k);
	}
	check(c, kvp_lease_release(l), "kvp_lease_release");
	return hit;
}

/* Against the daemon restarted after --mode restart-fill with the same
 * --pages and --seed, while a forked client pings: the pool open's time,
 * the time until the first session matches (pages are matchable as the
 * scan finds them), until every page is listed (the pool's restored
 * pages reach --pages), the worst ping meanwhile, and the cost per page
 * of the whole scan. Samples disk.restart_*_PAGES. */
static void mode_restart(void)
{
	size_t n_tok = (size_t)RS_PAGES_PER_SESSION * BLOCK;
	uint32_t *first = malloc(n_tok * sizeof(uint32_t)),
		 *last = malloc(n_tok * sizeof(uint32_t));
	uint64_t n = opt.pages / RS_PAGES_PER_SESSION, want = n * RS_PAGES_PER_SESSION;
	uint64_t res[2], t0, t_open, t_hit = 0, t_all = 0, restored = 0;
	struct pinging g;
	char name[64];
	kvp_client *c;
	kvp_pool *p;

	if (!first || !last || n == 0)
		die("out of memory, or --pages below one session");
	rs_tokens(first, 0);
	rs_tokens(last, n - 1);
	g = pinger_start();
	usleep(50000); /* the pinger's median before the open */
	t0 = now_ns();
	rs_open(&c, &p);
	t_open = now_ns() - t0;
	/* The oldest session first: a scan in extent order finds it first. */
	while (!t_hit || !t_all) {
		if (!t_hit && rs_hit(c, p, first, 0))
			t_hit = now_ns() - t0;
		if (!t_all) {
			restored = pool_stats(c, p).restored_pages;
			if (restored >= want)
				t_all = now_ns() - t0;
		}
		/* A client that retries, not one that floods the loop the
		 * scan shares: 1 ms between looks (the resolution of both). */
		usleep(1000);
		if (now_ns() - t0 > 60ull * 1000000000u)
			die("after 60 s: %s, %" PRIu64 " of %" PRIu64 " pages listed",
			    t_hit ? "first session found" : "first session not found", restored,
			    want);
	}
	pinger_stop(&g, res);
	if (!rs_hit(c, p, last, n - 1))
		die("the newest session is not found after the scan");
	snprintf(name, sizeof(name), "%" PRIu64, want);
#define RS_SAMPLE(what, v)                                                                         \
	do {                                                                                       \
		char k_[96];                                                                       \
		snprintf(k_, sizeof(k_), "disk.restart_%s_%s", what, name);                        \
		sample(k_, v);                                                                     \
	} while (0)
	RS_SAMPLE("open_ms", (double)t_open / 1e6);
	RS_SAMPLE("first_hit_ms", (double)t_hit / 1e6);
	RS_SAMPLE("all_ms", (double)t_all / 1e6);
	RS_SAMPLE("page_ns", (double)t_all / (double)want);
	RS_SAMPLE("ping_worst_us", (double)res[0] / 1e3);
	RS_SAMPLE("ping_median_us", (double)res[1] / 1e3);
#undef RS_SAMPLE
	fprintf(stderr,
		"disk restart, %" PRIu64 " pages: open %.3f ms, first hit %.3f ms, all listed "
		"%.3f ms (%.0f ns per page), ping worst %.0f us (median %.0f us)\n",
		want, (double)t_open / 1e6, (double)t_hit / 1e6, (double)t_all / 1e6,
		(double)t_all / (double)want, (double)res[0] / 1e3, (double)res[1] / 1e3);
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(first);
	free(last);
}

/* ---- main -------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: kvp-bench-disk --socket PATH --mode "
	      "write|read|spill|ckpt|open|restart-fill|restart\n"
	      "         [--seed N] [--pages N]\n"
	      "         [--page-kib K] [--working-mib M] [--session-pages N]\n"
	      "         [--prefix-tokens N] [--seconds S] [--ckpt-mib M --state-dir DIR]\n"
	      "         [--daemon-pid PID] [--admin-socket PATH]\n"
	      "Measures the disk tier (spill and promote bandwidth, the match latency of a\n"
	      "prefix on disk) and checkpoints (write and restore bandwidth) against a\n"
	      "running kvpalaced; prints 'sample NAME VALUE' lines. Run --mode read\n"
	      "against the daemon restarted after --mode write, with the same options.\n",
	      f);
}

static unsigned parse_uint(const char *s, const char *what, unsigned lo, unsigned hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		die("--%s wants %u..%u", what, lo, hi);
	return (unsigned)v;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"mode", required_argument, NULL, 'm'},
		{"seed", required_argument, NULL, 'S'},
		{"page-kib", required_argument, NULL, 'k'},
		{"working-mib", required_argument, NULL, 'w'},
		{"session-pages", required_argument, NULL, 'n'},
		{"prefix-tokens", required_argument, NULL, 'x'},
		{"ckpt-mib", required_argument, NULL, 'c'},
		{"state-dir", required_argument, NULL, 'd'},
		{"seconds", required_argument, NULL, 't'},
		{"daemon-pid", required_argument, NULL, 'p'},
		{"pages", required_argument, NULL, 'P'},
		{"admin-socket", required_argument, NULL, 'a'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (ch) {
		case 's':
			opt.sock = optarg;
			break;
		case 'm':
			opt.mode = optarg;
			break;
		case 'S':
			opt.seed = parse_uint(optarg, "seed", 1, 1000000);
			break;
		case 'k':
			opt.page_kib = parse_uint(optarg, "page-kib", 32, 4096);
			break;
		case 'w':
			opt.working_mib = parse_uint(optarg, "working-mib", 1, 1u << 20);
			break;
		case 'n':
			opt.session_pages = parse_uint(optarg, "session-pages", 1, 4096);
			break;
		case 'x':
			opt.prefix_tokens = parse_uint(optarg, "prefix-tokens", BLOCK, 1u << 20);
			break;
		case 'c':
			opt.ckpt_mib = parse_uint(optarg, "ckpt-mib", 1, 1u << 16);
			break;
		case 'd':
			opt.state_dir = optarg;
			break;
		case 'a':
			opt.admin_sock = optarg;
			break;
		case 'p':
			opt.daemon_pid = parse_uint(optarg, "daemon-pid", 1, 1u << 30);
			break;
		case 'P':
			opt.pages = parse_uint(optarg, "pages", RS_PAGES_PER_SESSION, 1u << 24);
			break;
		case 't':
			opt.seconds = strtod(optarg, NULL);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!opt.sock || !opt.mode || optind != argc || !(opt.seconds > 0 && opt.seconds < 3600) ||
	    opt.page_kib % (LAYER_BYTES / 1024) || opt.prefix_tokens % BLOCK) {
		usage(stderr);
		return 2;
	}
	layout.n_layers = opt.page_kib * 1024u / LAYER_BYTES;
	if (!strcmp(opt.mode, "write"))
		mode_write();
	else if (!strcmp(opt.mode, "read"))
		mode_read();
	else if (!strcmp(opt.mode, "spill"))
		mode_spill();
	else if (!strcmp(opt.mode, "ckpt"))
		mode_ckpt();
	else if (!strcmp(opt.mode, "open"))
		mode_open();
	else if (!strcmp(opt.mode, "restart-fill"))
		mode_restart_fill();
	else if (!strcmp(opt.mode, "restart"))
		mode_restart();
	else {
		usage(stderr);
		return 2;
	}
	return 0;
}
