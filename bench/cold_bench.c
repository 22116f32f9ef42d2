/* bench/cold_bench.c — fresh processes on the data path (issue 17, items 2-4).
 *
 * Against a running kvpalaced and a redis-server on a Unix socket (bench/run
 * starts both; this program starts neither), in the Llama-3-8B shape (32
 * layers, 8 KV heads, head_dim 128, f16, 16-token pages of 2 MiB):
 *
 *  - cold read: a prefix of 1k and 4k tokens is written and committed once;
 *    then, in each repetition, a fresh process (fork + exec of this program:
 *    it has never touched the arena) opens the pool, matches the prefix,
 *    reads every byte of every page in place (a 64-bit XOR over it, as a
 *    kernel reading K/V would load it) and releases the lease; timed from
 *    kvp_pool_open to kvp_lease_release (the checks of the bytes read are
 *    not timed). Beside it, interleaved in the same repetition: the same
 *    process copying the same bytes from warm private memory into a warm
 *    buffer (memcpy), and a Redis GET of
 *    the same bytes (one 2 MiB value per page, one connection, into a warm
 *    buffer). The fresh read runs twice, with prefaulting (the library's
 *    default) and without (KVPALACE_PREFAULT=0): what prefaulting buys.
 *    For 1k tokens a third fresh process copies the pages out into warm
 *    private memory with kvp_lease_read (pread of the arena's memfd),
 *    beside its own memcpy of the same bytes.
 *  - cold write: a fresh process opens the pool, appends 1k tokens, copies
 *    each page's bytes in (kvp_session_page) and commits; timed from
 *    kvp_pool_open to the end of kvp_commit; again without prefault, and
 *    a third time copying each page in with kvp_session_write (pwrite of
 *    the arena's memfd, appended with KVP_APPEND_NO_PREFAULT). Beside
 *    them: Redis SET of the same bytes (a value per page) and pwrite(2)
 *    of them into a new file of the scratch directory ($TMPDIR). Each
 *    writer's pages are checked afterwards, untimed, through a lease.
 *  - row by row: a warm process writes 64 MiB of reserved pages one
 *    head_dim row at a time through kvp_session_kv, one row at a time with
 *    addresses from kvp_session_page's strides, and one (layer, K|V) run of
 *    a page per memcpy; the reference is memcpy of the same bytes in
 *    page-sized blocks into private memory. Passes alternate, medians.
 *
 * Every byte read is checked against what was written (a wrong fast path
 * must not pass). Prints "sample NAME VALUE" lines (GB/s = bytes/ns, or
 * microseconds) for bench/run, and each repetition's ratios on stderr.
 * Speaks RESP itself (bench/resp.h). Single-threaded; children report
 * their figures through a pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_PROG "kvp-bench-cold"
#include "bench_util.h"
#include "kvpalace.h"
#include "resp.h"

#define COLD_MODEL "kvp-bench-cold"
#define MAX_RES	   16

static const struct kvp_layout llama_layout = {
	.n_layers = 32,
	.n_kv_heads = 8,
	.head_dim = 128,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

static size_t page_data_bytes(void)
{
	return (size_t)llama_layout.n_layers * 2 * llama_layout.n_kv_heads *
	       llama_layout.block_tokens * llama_layout.head_dim * 2;
}

struct opts {
	const char *socket;
	const char *redis;
	const char *dir;
	int reps;
	int reps_4k;
	unsigned row_mib;
	int row_passes;
};

static void check(kvp_client *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s (%d)", what, c ? kvp_strerror(c, r) : strerror(-r), r);
}

static kvp_client *lib_connect(const char *path)
{
	kvp_client *c;
	int r = kvp_connect(path, &c);

	if (r < 0)
		die("kvp_connect %s: %s", path, strerror(-r));
	return c;
}

/* The bytes of token tok's page data: a xorshift stream seeded by the
 * page's first token, so any process can rebuild and check them. */
static void fill_page(uint8_t *dst, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15u + 1;

	for (size_t i = 0; i < n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(dst + i, &x, 8);
	}
}

static void fill(uint8_t *dst, size_t page_data, uint32_t n_pages, uint32_t tok0)
{
	for (uint32_t i = 0; i < n_pages; i++)
		fill_page(dst + (size_t)i * page_data, page_data, tok0 + i * 16u);
}

static uint32_t *tokens(uint32_t tok0, uint32_t n)
{
	uint32_t *t = malloc(n * sizeof(*t));

	if (!t)
		die("out of memory");
	for (uint32_t i = 0; i < n; i++)
		t[i] = tok0 + i;
	return t;
}

static uint8_t *warm_alloc(size_t n)
{
	uint8_t *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);

	if (!p)
		die("out of memory (%zu bytes)", n);
	memset(p, 0x5a, n);
	return p;
}

static double median_d(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- Redis (bench/resp.h) ----------------------------------------------------- */

static void redis_set(struct resp *r, const char *key, const void *val, size_t n)
{
	resp_send_set(r, key, val, n);
	resp_expect_ok(r, "SET");
}

static void redis_get(struct resp *r, const char *key, void *dst, size_t n)
{
	resp_send_get(r, key);
	resp_expect_bulk(r, dst, n, "GET");
}

/* Reads every byte of p[0..n) (n a multiple of 32): what a reader of K/V
 * does, without a copy. Four accumulators so loads do not wait on each
 * other. */
static uint64_t xor_sum(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t a = 0, b = 0, c = 0, d = 0;

	for (size_t i = 0; i < n / 8; i += 4) {
		a ^= w[i];
		b ^= w[i + 1];
		c ^= w[i + 2];
		d ^= w[i + 3];
	}
	return a ^ b ^ c ^ d;
}

/* ---- children: fresh processes --------------------------------------------- */

/* Reports NAME VALUE to the parent. */
static void report(int fd, const char *name, double v)
{
	dprintf(fd, "%s %.6g\n", name, v);
}

/* A fresh reader: the prefix of n_tok tokens from tok0. */
static void child_read(const struct opts *o, uint32_t tok0, uint32_t n_tok, const char *tag,
		       int out)
{
	uint32_t *toks = tokens(tok0, n_tok);
	uint32_t n_pages = n_tok / llama_layout.block_tokens;
	struct kvp_page_view v;
	size_t page_data, total;
	uint8_t *dst, *src;
	uint64_t t0, t1, t2, t3, tw, sum = 0, wsum = 0, esum = 0;
	uint32_t ref_pages;
	uint8_t *want;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char name[64];

	c = lib_connect(o->socket);
	/* Private memory of the reference copy, warm (faulted in) before the
	 * clock starts, as an engine's buffers are. */
	page_data = (size_t)llama_layout.n_layers * 2 * llama_layout.n_kv_heads *
		    llama_layout.block_tokens * llama_layout.head_dim * 2;
	total = (size_t)n_pages * page_data;
	/* The reference copies the same bytes through buffers of at most
	 * 64 pages (128 MiB, far past any cache): a 4k prefix's 512 MiB
	 * twice over would only cost set-up time. */
	ref_pages = n_pages < 64 ? n_pages : 64;
	dst = warm_alloc((size_t)ref_pages * page_data);
	src = warm_alloc((size_t)ref_pages * page_data);
	want = warm_alloc(page_data);
	fill(src, page_data, ref_pages, tok0);

	t0 = now_ns();
	check(c, kvp_pool_open(c, COLD_MODEL, &llama_layout, &p), "kvp_pool_open (reader)");
	check(c, kvp_match_prefix(p, toks, n_tok, &l), "kvp_match_prefix (reader)");
	t1 = now_ns();
	if (kvp_lease_tokens(l) != n_tok)
		die("the fresh reader matched %" PRIu64 " of %u tokens", kvp_lease_tokens(l),
		    n_tok);
	for (uint32_t i = 0; i < n_pages; i++) {
		check(c, kvp_lease_page(l, i, &v), "kvp_lease_page");
		sum ^= xor_sum(v.base, v.data_bytes);
	}
	t2 = now_ns();
	/* Untimed: the same pages again, warm, for information, and every
	 * byte checked against what was written. */
	tw = now_ns();
	for (uint32_t i = 0; i < n_pages; i++) {
		check(c, kvp_lease_page(l, i, &v), "kvp_lease_page");
		wsum ^= xor_sum(v.base, v.data_bytes);
	}
	tw = now_ns() - tw;
	for (uint32_t i = 0; i < n_pages; i++) {
		check(c, kvp_lease_page(l, i, &v), "kvp_lease_page");
		fill_page(want, page_data, tok0 + i * 16u);
		if (memcmp(v.base, want, page_data))
			die("the fresh reader read other bytes than were written (page %u)", i);
		esum ^= xor_sum(want, page_data);
	}
	if (sum != wsum || sum != esum)
		die("the fresh reader's first pass saw other bytes");
	t3 = now_ns();
	check(c, kvp_lease_release(l), "kvp_lease_release");
	t3 = now_ns() - t3;

	snprintf(name, sizeof(name), "cold.read_%s_bw", tag);
	report(out, name, (double)total / (double)(t2 - t0 + t3));
	snprintf(name, sizeof(name), "cold.read_%s_warm_bw", tag);
	report(out, name, (double)total / (double)tw);
	snprintf(name, sizeof(name), "cold.read_%s_match_us", tag);
	report(out, name, (double)(t1 - t0) / 1e3);
	snprintf(name, sizeof(name), "cold.read_%s_copy_us", tag);
	report(out, name, (double)(t2 - t1) / 1e3);

	/* The reference, in the same process, right after: the same bytes
	 * from warm private memory into the same warm buffer. */
	t0 = now_ns();
	for (uint32_t i = 0; i < n_pages; i++)
		memcpy(dst + (size_t)(i % ref_pages) * page_data,
		       src + (size_t)(i % ref_pages) * page_data, page_data);
	t1 = now_ns();
	snprintf(name, sizeof(name), "cold.memcpy_%s_bw", tag);
	report(out, name, (double)total / (double)(t1 - t0));
	kvp_pool_close(p);
	kvp_disconnect(c);
}

/* A fresh reader copying the prefix out with kvp_lease_read into warm
 * private memory (what an engine staging K/V for the GPU does), timed from
 * kvp_pool_open to kvp_lease_release; the reference, in the same process
 * right after, is memcpy of the same bytes from warm private memory into
 * the same warm buffer. n_tok / block_tokens pages of at most 64. */
static void child_read_copy(const struct opts *o, uint32_t tok0, uint32_t n_tok, const char *tag,
			    int out)
{
	uint32_t *toks = tokens(tok0, n_tok);
	uint32_t n_pages = n_tok / llama_layout.block_tokens;
	size_t pd = page_data_bytes(), total = (size_t)n_pages * pd;
	uint8_t *dst = warm_alloc(total), *src = warm_alloc(total), *want = warm_alloc(pd);
	uint64_t t0, t1;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	char name[64];

	if (n_pages > 64)
		die("the copy-out reader takes 64 pages at most");
	fill(src, pd, n_pages, tok0);
	c = lib_connect(o->socket);
	t0 = now_ns();
	check(c, kvp_pool_open(c, COLD_MODEL, &llama_layout, &p), "kvp_pool_open (copy reader)");
	check(c, kvp_match_prefix(p, toks, n_tok, &l), "kvp_match_prefix (copy reader)");
	if (kvp_lease_tokens(l) != n_tok)
		die("the copy reader matched %" PRIu64 " of %u tokens", kvp_lease_tokens(l), n_tok);
	for (uint32_t i = 0; i < n_pages; i++)
		check(c, kvp_lease_read(l, i, 0, dst + (size_t)i * pd, pd), "kvp_lease_read");
	check(c, kvp_lease_release(l), "kvp_lease_release (copy reader)");
	t1 = now_ns();
	for (uint32_t i = 0; i < n_pages; i++) {
		fill_page(want, pd, tok0 + i * 16u);
		if (memcmp(dst + (size_t)i * pd, want, pd))
			die("the copy reader read other bytes than were written (page %u)", i);
	}
	snprintf(name, sizeof(name), "cold.read_%s_bw", tag);
	report(out, name, (double)total / (double)(t1 - t0));
	t0 = now_ns();
	memcpy(dst, src, total);
	t1 = now_ns();
	snprintf(name, sizeof(name), "cold.memcpy_%s_bw", tag);
	report(out, name, (double)total / (double)(t1 - t0));
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(toks);
	free(dst);
	free(src);
	free(want);
}

/* Untimed: a lease of the n_tok tokens must hold exactly src's pages. */
static void check_written(kvp_client *c, kvp_pool *p, const uint32_t *toks, uint32_t n_tok,
			  const uint8_t *src, size_t page_data)
{
	struct kvp_page_view v;
	kvp_lease *l;

	check(c, kvp_match_prefix(p, toks, n_tok, &l), "kvp_match_prefix (writer's check)");
	if (kvp_lease_tokens(l) != n_tok)
		die("the fresh writer's %u tokens match %" PRIu64, n_tok, kvp_lease_tokens(l));
	for (uint32_t i = 0; i < n_tok / llama_layout.block_tokens; i++) {
		check(c, kvp_lease_page(l, i, &v), "kvp_lease_page (writer's check)");
		if (memcmp(v.base, src + (size_t)i * page_data, page_data))
			die("page %u holds other bytes than the fresh writer wrote", i);
	}
	check(c, kvp_lease_release(l), "kvp_lease_release (writer's check)");
}

/* A fresh writer: n_tok tokens from tok0, committed; through the mapping
 * (kvp_session_page and memcpy), or with copy through the arena's file
 * (kvp_session_write, appended without prefault). */
static void child_write(const struct opts *o, uint32_t tok0, uint32_t n_tok, const char *tag,
			int copy, int out)
{
	uint32_t *toks = tokens(tok0, n_tok);
	uint32_t n_pages = n_tok / llama_layout.block_tokens;
	struct kvp_page_view v;
	size_t page_data, total;
	uint64_t t0, ta, tb, t1;
	uint8_t *src;
	kvp_client *c;
	kvp_session *s;
	kvp_pool *p;
	char name[64];

	c = lib_connect(o->socket);
	page_data = (size_t)llama_layout.n_layers * 2 * llama_layout.n_kv_heads *
		    llama_layout.block_tokens * llama_layout.head_dim * 2;
	total = (size_t)n_pages * page_data;
	src = warm_alloc(total);
	fill(src, page_data, n_pages, tok0);

	t0 = now_ns();
	check(c, kvp_pool_open(c, COLD_MODEL, &llama_layout, &p), "kvp_pool_open (writer)");
	check(c, kvp_session_create(p, &s), "kvp_session_create (writer)");
	check(c, kvp_append_tier(s, toks, n_tok, KVP_TIER_HOST, copy ? KVP_APPEND_NO_PREFAULT : 0),
	      "kvp_append (writer)");
	ta = now_ns();
	for (uint32_t i = 0; i < n_pages; i++) {
		if (copy) {
			check(c, kvp_session_write(s, i, 0, src + (size_t)i * page_data, page_data),
			      "kvp_session_write");
			continue;
		}
		check(c, kvp_session_page(s, i, &v), "kvp_session_page");
		memcpy(v.base, src + (size_t)i * page_data, v.data_bytes);
	}
	tb = now_ns();
	check(c, kvp_commit(s, n_tok), "kvp_commit (writer)");
	t1 = now_ns();
	snprintf(name, sizeof(name), "cold.write_%s_bw", tag);
	report(out, name, (double)total / (double)(t1 - t0));
	snprintf(name, sizeof(name), "cold.write_%s_append_us", tag);
	report(out, name, (double)(ta - t0) / 1e3);
	snprintf(name, sizeof(name), "cold.write_%s_copy_us", tag);
	report(out, name, (double)(tb - ta) / 1e3);
	snprintf(name, sizeof(name), "cold.write_%s_commit_us", tag);
	report(out, name, (double)(t1 - tb) / 1e3);
	check_written(c, p, toks, n_tok, src, page_data);
	check(c, kvp_session_close(s), "kvp_session_close (writer)");
	kvp_pool_close(p);
	kvp_disconnect(c);
}

/* Runs this program as a fresh process in child mode; returns its figures
 * as "NAME VALUE" pairs in res (n_res at most), the count. */
struct result {
	char name[64];
	double v;
};

static int run_child(const struct opts *o, const char *mode, uint32_t tok0, uint32_t n_tok,
		     const char *tag, int prefault, struct result *res)
{
	char a_tok0[16], a_n[16], line[160];
	int pfd[2], st, n = 0;
	FILE *f;
	pid_t pid;

	snprintf(a_tok0, sizeof(a_tok0), "%u", tok0);
	snprintf(a_n, sizeof(a_n), "%u", n_tok);
	if (pipe2(pfd, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (pfd[1] == 3)
			fcntl(3, F_SETFD, 0);
		else
			dup2(pfd[1], 3);
		if (!prefault)
			setenv("KVPALACE_PREFAULT", "0", 1);
		else
			unsetenv("KVPALACE_PREFAULT");
		execl("/proc/self/exe", "kvp-bench-cold", "--child", mode, "--socket", o->socket,
		      "--tok0", a_tok0, "--tokens", a_n, "--tag", tag, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	f = fdopen(pfd[0], "r");
	while (f && fgets(line, sizeof(line), f) && n < MAX_RES)
		if (sscanf(line, "%63s %lf", res[n].name, &res[n].v) == 2)
			n++;
	if (f)
		fclose(f);
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("the fresh %s process (%s) failed", mode, tag);
	for (int i = 0; i < n; i++)
		sample(res[i].name, res[i].v);
	return n;
}

static double find(const struct result *r, int n, const char *prefix)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(r[i].name, prefix))
			return r[i].v;
	die("no figure %s from the child", prefix);
}

/* ---- the parent ------------------------------------------------------------- */

/* Writes and commits the prefix of n_tok tokens from tok0 in session s's
 * pool (untimed set-up) and stores the same bytes in Redis under
 * PREFIX:page. */
static void put_prefix(kvp_client *c, kvp_pool *p, struct resp *rfd, const char *prefix,
		       uint32_t tok0, uint32_t n_tok)
{
	uint32_t *toks = tokens(tok0, n_tok), n_pages = n_tok / llama_layout.block_tokens;
	size_t pd = page_data_bytes();
	uint8_t *buf = warm_alloc(pd);
	struct kvp_page_view v;
	kvp_session *s;
	char key[256];

	check(c, kvp_session_create(p, &s), "kvp_session_create (prefix)");
	check(c, kvp_append(s, toks, n_tok), "kvp_append (prefix)");
	for (uint32_t i = 0; i < n_pages; i++) {
		fill_page(buf, pd, tok0 + i * 16u);
		check(c, kvp_session_page(s, i, &v), "kvp_session_page (prefix)");
		memcpy(v.base, buf, pd);
		snprintf(key, sizeof(key), "%s:%u", prefix, i);
		redis_set(rfd, key, buf, pd);
	}
	check(c, kvp_commit(s, n_tok), "kvp_commit (prefix)");
	check(c, kvp_session_close(s), "kvp_session_close (prefix)");
	free(toks);
	free(buf);
}

static double redis_get_all(struct resp *rfd, const char *prefix, uint32_t n_pages, uint8_t *dst)
{
	size_t pd = page_data_bytes();
	char key[256];
	uint64_t t0 = now_ns();

	for (uint32_t i = 0; i < n_pages; i++) {
		snprintf(key, sizeof(key), "%s:%u", prefix, i);
		redis_get(rfd, key, dst + (size_t)i * pd, pd);
	}
	return (double)((size_t)n_pages * pd) / (double)(now_ns() - t0);
}

static double redis_set_all(struct resp *rfd, const char *prefix, uint32_t n_pages,
			    const uint8_t *src)
{
	size_t pd = page_data_bytes();
	char key[256];
	uint64_t t0 = now_ns();

	for (uint32_t i = 0; i < n_pages; i++) {
		snprintf(key, sizeof(key), "%s:%u", prefix, i);
		redis_set(rfd, key, src + (size_t)i * pd, pd);
	}
	return (double)((size_t)n_pages * pd) / (double)(now_ns() - t0);
}

static double pwrite_all(const char *dir, uint32_t n_pages, const uint8_t *src)
{
	size_t pd = page_data_bytes();
	char path[4096];
	uint64_t t0, t1;
	int fd;

	snprintf(path, sizeof(path), "%s/kvp-bench-cold.%d", dir, (int)getpid());
	unlink(path);
	t0 = now_ns();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	for (uint32_t i = 0; i < n_pages; i++)
		if (pwrite(fd, src + (size_t)i * pd, pd, (off_t)i * (off_t)pd) != (ssize_t)pd)
			die("pwrite %s: %s", path, strerror(errno));
	t1 = now_ns();
	close(fd);
	unlink(path);
	return (double)((size_t)n_pages * pd) / (double)(t1 - t0);
}

static void bench_cold_read(const struct opts *o, kvp_client *c, kvp_pool *p, struct resp *rfd,
			    const char *tag, uint32_t tok0, uint32_t n_tok, int reps)
{
	uint32_t n_pages = n_tok / llama_layout.block_tokens;
	uint8_t *dst = warm_alloc((size_t)n_pages * page_data_bytes());
	double r_get[32], r_cpy[32], r_nopf[32], r_copy[32];
	int copy = n_pages <= 64, n_alt = copy ? 4 : 3;
	struct result res[MAX_RES];
	char key[160], name[64], nopf_tag[32], copy_tag[32];
	int n;
	kvp_lease *hold;
	uint32_t *toks = tokens(tok0, n_tok);

	snprintf(key, sizeof(key), "cold-%s", tag);
	put_prefix(c, p, rfd, key, tok0, n_tok);
	/* Pinned for the whole run, so the cold writes' pages never evict it. */
	check(c, kvp_match_prefix(p, toks, n_tok, &hold), "kvp_match_prefix (hold)");
	if (kvp_lease_tokens(hold) != n_tok)
		die("the prefix of %u tokens is not cached (%" PRIu64 " matched)", n_tok,
		    kvp_lease_tokens(hold));
	snprintf(nopf_tag, sizeof(nopf_tag), "%s_nopf", tag);
	snprintf(copy_tag, sizeof(copy_tag), "%s_copy", tag);
	for (int rep = 0; rep < reps; rep++) {
		double ours = 0, nopf = 0, get = 0, cpy = 0, out = 0, out_cpy = 1;

		/* A B C D, then D C B A: whichever goes first meets other
		 * caches. */
		for (int k = 0; k < n_alt; k++) {
			switch (rep % 2 ? n_alt - 1 - k : k) {
			case 0:
				n = run_child(o, "read", tok0, n_tok, tag, 1, res);
				snprintf(name, sizeof(name), "cold.read_%s_bw", tag);
				ours = find(res, n, name);
				snprintf(name, sizeof(name), "cold.memcpy_%s_bw", tag);
				cpy = find(res, n, name);
				break;
			case 1:
				get = redis_get_all(rfd, key, n_pages, dst);
				snprintf(name, sizeof(name), "redis.get_%s_bw", tag);
				sample(name, get);
				break;
			case 2:
				n = run_child(o, "read", tok0, n_tok, nopf_tag, 0, res);
				snprintf(name, sizeof(name), "cold.read_%s_bw", nopf_tag);
				nopf = find(res, n, name);
				break;
			default:
				n = run_child(o, "read-copy", tok0, n_tok, copy_tag, 1, res);
				snprintf(name, sizeof(name), "cold.read_%s_bw", copy_tag);
				out = find(res, n, name);
				snprintf(name, sizeof(name), "cold.memcpy_%s_bw", copy_tag);
				out_cpy = find(res, n, name);
			}
		}
		r_copy[rep] = out / out_cpy;
		/* The same figure against its second reference, for bench/run. */
		snprintf(name, sizeof(name), "cold.read_%s_bw_vs_memcpy", tag);
		sample(name, ours);
		r_get[rep] = ours / get;
		r_cpy[rep] = ours / cpy;
		r_nopf[rep] = ours / nopf;
		fprintf(stderr,
			"  read %s: fresh %.2f GB/s (without prefault %.2f), memcpy %.2f, Redis "
			"GET "
			"%.3f: %.2fx GET, %.2fx memcpy, %.2fx no-prefault\n",
			tag, ours, nopf, cpy, get, r_get[rep], r_cpy[rep], r_nopf[rep]);
	}
	fprintf(stderr, "  read %s: median %.2fx Redis GET, %.2fx memcpy, %.2fx no-prefault\n", tag,
		median_d(r_get, reps), median_d(r_cpy, reps), median_d(r_nopf, reps));
	if (copy)
		fprintf(stderr, "  read %s copied out (kvp_lease_read): median %.2fx memcpy\n", tag,
			median_d(r_copy, reps));
	check(c, kvp_lease_release(hold), "kvp_lease_release (hold)");
	free(dst);
	free(toks);
}

static void bench_cold_write(const struct opts *o, struct resp *rfd, uint32_t tok0, uint32_t n_tok,
			     int reps)
{
	uint32_t n_pages = n_tok / llama_layout.block_tokens;
	size_t pd = page_data_bytes();
	uint8_t *src = warm_alloc((size_t)n_pages * pd);
	struct result res[MAX_RES];
	double r_set[32], r_pw[32], r_copy[32];
	int n;

	fill(src, pd, n_pages, tok0);
	for (int rep = 0; rep < reps; rep++) {
		/* New tokens every time: pages nobody has, nothing deduplicated. */
		uint32_t t = tok0 + (uint32_t)rep * 3 * n_tok;
		double ours = 0, nopf = 0, set = 0, pw = 0, cp = 0;

		for (int k = 0; k < 5; k++) {
			switch (rep % 2 ? 4 - k : k) {
			case 0:
				n = run_child(o, "write", t, n_tok, "1k", 1, res);
				ours = find(res, n, "cold.write_1k_bw");
				break;
			case 1:
				set = redis_set_all(rfd, "cold-set", n_pages, src);
				sample("redis.set_1k_bw", set);
				break;
			case 2:
				pw = pwrite_all(o->dir, n_pages, src);
				sample("ref.pwrite_1k_bw", pw);
				break;
			case 3:
				n = run_child(o, "write", t + n_tok, n_tok, "1k_nopf", 0, res);
				nopf = find(res, n, "cold.write_1k_nopf_bw");
				break;
			default:
				n = run_child(o, "write-copy", t + 2 * n_tok, n_tok, "1k_copy", 1,
					      res);
				cp = find(res, n, "cold.write_1k_copy_bw");
			}
		}
		sample("cold.write_1k_bw_vs_pwrite", ours);
		sample("cold.write_1k_copy_bw_vs_pwrite", cp);
		r_set[rep] = ours / set;
		r_pw[rep] = ours / pw;
		r_copy[rep] = cp / set;
		fprintf(stderr,
			"  write 1k: fresh %.2f GB/s (without prefault %.2f, kvp_session_write "
			"%.2f), "
			"Redis SET %.3f, pwrite %.2f: %.2fx SET, %.2fx pwrite; kvp_session_write "
			"%.2fx SET\n",
			ours, nopf, cp, set, pw, r_set[rep], r_pw[rep], r_copy[rep]);
	}
	fprintf(stderr,
		"  write 1k: median %.2fx Redis SET, %.2fx pwrite; kvp_session_write %.2fx Redis "
		"SET\n",
		median_d(r_set, reps), median_d(r_pw, reps), median_d(r_copy, reps));
	free(src);
}

/* ---- row by row, warm ---------------------------------------------------------- */

static uint64_t rows_kv(kvp_session *s, uint32_t n_tok, const uint8_t *src, size_t row)
{
	const struct kvp_layout *l = &llama_layout;
	uint64_t t0 = now_ns();

	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++)
				for (uint32_t pos = 0; pos < n_tok; pos++) {
					void *dst = kvp_session_kv(s, pos, layer, kv, h);

					if (!dst)
						die("kvp_session_kv is NULL");
					memcpy(dst, src, row);
					src += row;
				}
	return now_ns() - t0;
}

/* The same rows, in the same order, at addresses from the page views. */
static uint64_t rows_view(const struct kvp_page_view *pv, uint32_t n_tok, const uint8_t *src)
{
	const struct kvp_layout *l = &llama_layout;
	uint32_t bt = l->block_tokens;
	uint64_t t0 = now_ns();
	size_t row = pv[0].row_bytes;

	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++)
				for (uint32_t pg = 0; pg < n_tok / bt; pg++) {
					const struct kvp_page_view *v = &pv[pg];
					uint8_t *d = (uint8_t *)v->base + layer * v->layer_stride +
						     kv * v->kv_stride + h * v->head_stride;

					for (uint32_t t = 0; t < bt; t++) {
						memcpy(d, src, row);
						d += v->token_stride;
						src += row;
					}
				}
	return now_ns() - t0;
}

/* One memcpy per (page, layer, K|V): the run of n_kv_heads heads. */
static uint64_t runs_view(const struct kvp_page_view *pv, uint32_t n_pages, const uint8_t *src)
{
	uint64_t t0 = now_ns();

	for (uint32_t pg = 0; pg < n_pages; pg++)
		for (uint32_t layer = 0; layer < llama_layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const struct kvp_page_view *v = &pv[pg];

				memcpy((uint8_t *)v->base + layer * v->layer_stride +
					       kv * v->kv_stride,
				       src, v->kv_stride);
				src += v->kv_stride;
			}
	return now_ns() - t0;
}

static uint64_t copy_blocks(uint8_t *dst, const uint8_t *src, size_t total, size_t block)
{
	uint64_t t0 = now_ns();

	for (size_t at = 0; at < total; at += block)
		memcpy(dst + at, src + at, total - at < block ? total - at : block);
	return now_ns() - t0;
}

static void bench_rows(const struct opts *o, kvp_client *c, kvp_pool *p, uint32_t tok0)
{
	size_t pd = page_data_bytes(), row = kvp_pool_row_bytes(p);
	uint32_t n_pages = (uint32_t)(((size_t)o->row_mib << 20) / pd);
	uint32_t n_tok = n_pages * llama_layout.block_tokens;
	size_t total = (size_t)n_pages * pd;
	uint32_t *toks = tokens(tok0, n_tok);
	uint8_t *src = warm_alloc(total), *dst = warm_alloc(total);
	struct kvp_page_view *pv = calloc(n_pages, sizeof(*pv));
	double kv[32], vr[32], vn[32], cp[32], r1[32], r2[32], r3[32];
	kvp_session *s;
	int np = o->row_passes;

	if (!pv)
		die("out of memory");
	fill(src, pd, n_pages, tok0);
	check(c, kvp_session_create(p, &s), "kvp_session_create (rows)");
	check(c, kvp_append(s, toks, n_tok), "kvp_append (rows)");
	for (uint32_t i = 0; i < n_pages; i++) {
		check(c, kvp_session_page(s, i, &pv[i]), "kvp_session_page (rows)");
		if (pv[i].n_tokens != llama_layout.block_tokens)
			die("page %u holds %u tokens", i, pv[i].n_tokens);
	}
	/* untimed passes: fault everything in on both sides */
	rows_kv(s, n_tok, src, row);
	copy_blocks(dst, src, total, pd);
	for (int i = 0; i < np; i++) {
		kv[i] = (double)total / (double)rows_kv(s, n_tok, src, row);
		cp[i] = (double)total / (double)copy_blocks(dst, src, total, pd);
		vr[i] = (double)total / (double)rows_view(pv, n_tok, src);
		vn[i] = (double)total / (double)runs_view(pv, n_pages, src);
		r1[i] = kv[i] / cp[i];
		r2[i] = vr[i] / cp[i];
		r3[i] = vn[i] / cp[i];
		sample("rows.kv_bw", kv[i]);
		sample("rows.view_row_bw", vr[i]);
		sample("rows.view_run_bw", vn[i]);
		sample("ref.rows_memcpy_bw", cp[i]);
	}
	/* What the runs wrote must be where kvp_session_kv points. */
	for (uint32_t layer = 0; layer < llama_layout.n_layers; layer++)
		for (uint32_t kvi = 0; kvi < 2; kvi++)
			for (uint32_t h = 0; h < llama_layout.n_kv_heads; h++)
				for (uint32_t pos = 0; pos < n_tok; pos += 7) {
					uint32_t pg = pos / llama_layout.block_tokens;
					const uint8_t *want = src + (size_t)pg * pd +
							      ((((size_t)layer * 2 + kvi) *
									llama_layout.n_kv_heads +
								h) * llama_layout.block_tokens +
							       pos % llama_layout.block_tokens) *
								      row;

					if (memcmp(kvp_session_kv(s, pos, layer, kvi, h), want,
						   row))
						die("a run written through the page view is not "
						    "where "
						    "kvp_session_kv points");
				}
	fprintf(stderr,
		"  rows (%u pages, %.0f MiB): kvp_session_kv %.2fx memcpy, view rows %.2fx, view "
		"runs %.2fx (memcpy %.2f GB/s)\n",
		n_pages, (double)total / 1048576.0, median_d(r1, np), median_d(r2, np),
		median_d(r3, np), median_d(cp, np));
	check(c, kvp_session_close(s), "kvp_session_close (rows)");
	free(pv);
	free(src);
	free(dst);
	free(toks);
}

/* ---- main ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: kvp-bench-cold --socket PATH --redis PATH [--dir DIR] [--reps N]\n"
	      "                      [--reps-4k N] [--row-mib M] [--row-passes N]\n"
	      "Fresh processes reading a cached 1k- and 4k-token Llama-3-8B prefix and\n"
	      "writing 1k tokens (through the mapping and with kvp_session_write),\n"
	      "beside Redis GET/SET, memcpy and pwrite; row-by-row\n"
	      "in-place writes beside memcpy. Prints 'sample NAME VALUE' (GB/s, us).\n",
	      f);
}

int main(int argc, char **argv)
{
	struct opts o = {.reps = 3, .reps_4k = 1, .row_mib = 64, .row_passes = 5};
	const char *child = NULL, *tag = "1k";
	unsigned tok0 = 0, n_tok = 0;
	const struct bench_opt opts[] = {
		{"socket", BENCH_OPT_STR, &o.socket, 0, 0},
		{"redis", BENCH_OPT_STR, &o.redis, 0, 0},
		{"dir", BENCH_OPT_STR, &o.dir, 0, 0},
		{"reps", BENCH_OPT_INT, &o.reps, 1, 32},
		{"reps-4k", BENCH_OPT_INT, &o.reps_4k, 0, 32},
		{"row-mib", BENCH_OPT_UINT, &o.row_mib, 2, 4096},
		{"row-passes", BENCH_OPT_INT, &o.row_passes, 1, 32},
		{"child", BENCH_OPT_STR, &child, 0, 0},
		{"tok0", BENCH_OPT_UINT, &tok0, 0, UINT32_MAX},
		{"tokens", BENCH_OPT_UINT, &n_tok, 1, 1u << 24},
		{"tag", BENCH_OPT_STR, &tag, 0, 0},
	};
	kvp_client *c;
	kvp_pool *p;
	struct resp rs;

	o.dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	bench_parse_opts(argc, argv, opts, (int)(sizeof(opts) / sizeof(opts[0])), usage);
	if (child) {
		if (!o.socket || !n_tok || n_tok % llama_layout.block_tokens)
			die("bad child arguments");
		if (!strcmp(child, "read"))
			child_read(&o, tok0, n_tok, tag, 3);
		else if (!strcmp(child, "read-copy"))
			child_read_copy(&o, tok0, n_tok, tag, 3);
		else if (!strcmp(child, "write"))
			child_write(&o, tok0, n_tok, tag, 0, 3);
		else if (!strcmp(child, "write-copy"))
			child_write(&o, tok0, n_tok, tag, 1, 3);
		else
			die("unknown child mode %s", child);
		return 0;
	}
	if (!o.socket || !o.redis) {
		usage(stderr);
		return 2;
	}
	c = lib_connect(o.socket);
	resp_connect(&rs, o.redis);
	check(c, kvp_pool_open(c, COLD_MODEL, &llama_layout, &p), "kvp_pool_open");
	fprintf(stderr, "cold: Llama-3-8B shape, pages of %zu bytes; %d repetitions (4k: %d)\n",
		kvp_pool_page_bytes(p), o.reps, o.reps_4k);
	bench_rows(&o, c, p, 300000000u);
	bench_cold_read(&o, c, p, &rs, "1k", 100000000u, 1024, o.reps);
	if (o.reps_4k)
		bench_cold_read(&o, c, p, &rs, "4k", 110000000u, 4096, o.reps_4k);
	bench_cold_write(&o, &rs, 200000000u, 1024, o.reps);
	kvp_pool_close(p);
	kvp_disconnect(c);
	resp_close(&rs);
	return 0;
}
