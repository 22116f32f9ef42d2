/* tests/redis/test_rtier.c — the remote tier end to end: two real kvpalaced
 * daemons on sockets and state directories of their own stand for two
 * machines, sharing a real 6-node Redis Cluster (rcluster.c).
 *
 * A process on "machine" A writes a conversation; a process on B matches
 * the same tokens and reads the same bytes, fetched from the cluster. A
 * tenant on B looking for A's pages under another tenant name finds
 * nothing. A value changed in the cluster (one byte of the page) is a
 * miss on B and no wrong K/V. The whole cluster down: both daemons keep
 * serving from their local tiers, B's match is a miss within the timeout,
 * and once the cluster is back B finds A's new pages by itself. A password
 * file anyone may read, or wrong credentials, stop a daemon's start. With
 * remote-write reuse a page goes at its second use; with eviction when it
 * leaves A's host tier, once (promoted back from disk and evicted again,
 * it is not written twice).
 * Skips (77) without redis-server.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "rcluster.h"
#include "remote.h"

#define MODEL "rtier-model"
#define BT    16

static const struct kvp_layout small = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static struct rcluster rc;
static struct harness a, b;
/* The stream of KV events: as long as remote-events allows (127 bytes),
 * so that the longest entries are formatted. */
#define STREAM                                                                                     \
	"kvp:events:"                                                                              \
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"          \
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
static char tier_arg[96];
static uint32_t next_seq = 100;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A daemon of the deployment: root is tenant team-a, nobody team-n. */
static int start(struct harness *h, const char *tenants)
{
	const char *const extra[] = {"--remote-tier",
				     tier_arg,
				     "--remote-tenants",
				     tenants,
				     "--remote-timeout-ms",
				     "300",
				     "--host-pool-size",
				     "16M",
				     "--remote-events",
				     STREAM,
				     NULL};

	return harness_start(h, extra);
}

/* Restarts h as a daemon where root is tenant team-a, with a host pool
 * of pool_size and the options that follow (NULL-terminated). */
static void restart_team_a(struct harness *h, const char *pool_size, ...)
{
	const char *argv[32] = {"--remote-tier",       tier_arg, "--remote-tenants", "0=team-a",
				"--remote-timeout-ms", "300",	 "--host-pool-size", pool_size};
	int n = 8;
	const char *arg;
	va_list ap;

	va_start(ap, pool_size);
	while ((arg = va_arg(ap, const char *)) && n < 31)
		argv[n++] = arg;
	va_end(ap);
	argv[n] = NULL;
	assert_int_equal(harness_restart(h, SIGTERM, argv), 0);
}

/* Page keys (kvp:SCOPE:POOL:CHAIN) on the masters. */
static long remote_keys(void)
{
	int m[3], n = rcluster_masters(&rc, m);
	long keys = 0;

	for (int i = 0; i < n; i++) {
		redisContext *c = rcluster_connect(m[i]);
		redisReply *r = c ? redisCommand(c, "KEYS kvp:*:*:*") : NULL;

		if (r && r->type == REDIS_REPLY_ARRAY)
			keys += (long)r->elements;
		if (r)
			freeReplyObject(r);
		if (c)
			redisFree(c);
	}
	return keys;
}

static void flush_cluster(void)
{
	int m[3], n = rcluster_masters(&rc, m);

	for (int i = 0; i < n; i++) {
		redisContext *c = rcluster_connect(m[i]);
		redisReply *r = c ? redisCommand(c, "FLUSHALL") : NULL;

		if (r)
			freeReplyObject(r);
		if (c)
			redisFree(c);
	}
}

/* Waits until the cluster holds n keys (A's write-through is
 * asynchronous). */
static int wait_keys(long n, double secs)
{
	double end = now_s() + secs;

	while (now_s() < end) {
		if (remote_keys() >= n)
			return 0;
		usleep(20000);
	}
	return -1;
}

/* Commits tokens[0..n) on h as the calling user. */
static void commit_on(struct harness *h, const uint32_t *tokens, size_t n)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, n, &s), 0);
	kvp_disconnect(c); /* the committed pages stay in the index */
}

/* Matches tokens[0..n) on h: the tokens matched (UINT64_MAX when a call
 * failed), and in *ret_bad the rows that differ from what the writer
 * wrote. Usable in a child. */
static uint64_t match_on(struct harness *h, const uint32_t *tokens, size_t n, uint64_t *ret_bad)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	uint64_t got;

	if (kvp_connect(h->sock, &c) < 0)
		return UINT64_MAX;
	if (kvp_pool_open(c, MODEL, &small, &p) < 0 || kvp_match_prefix(p, tokens, n, &l) < 0) {
		kvp_disconnect(c);
		return UINT64_MAX;
	}
	got = kvp_lease_tokens(l);
	*ret_bad = got ? harness_pkv_check_lease(l, p, tokens, got) : 0;
	kvp_lease_release(l);
	kvp_disconnect(c);
	return got;
}

static void test_across_machines(void **state)
{
	uint32_t tokens[5 * BT + 7];
	uint64_t bad = 1, got;

	(void)state;
	flush_cluster();
	harness_tokens(tokens, 5 * BT + 7, next_seq++, 0);
	commit_on(&a, tokens, 5 * BT + 7);
	/* Five full pages, the partial one stays home. */
	assert_int_equal(wait_keys(5, 10), 0);
	assert_int_equal(remote_keys(), 5);
	got = match_on(&b, tokens, 5 * BT + 7, &bad);
	assert_int_equal(got, 5 * BT);
	assert_int_equal(bad, 0);
	/* What each daemon says it did: A wrote the five pages, B fetched
	 * them; the cluster client's own counters on the admin socket only. */
	{
		struct kvp_stats *st;
		kvp_client *c;

		assert_int_equal(kvp_connect(a.sock, &c), 0);
		assert_int_equal(kvp_stats(c, &st), 0);
		assert_true(st->remote_on);
		assert_int_equal(st->remote.pages_written, 5);
		assert_int_equal(st->remote.pages_fetched, 0);
		assert_false(st->remote_client);
		assert_int_equal(st->remote.puts, 0);
		kvp_stats_free(st);
		kvp_disconnect(c);
		assert_int_equal(kvp_connect(b.admin_sock, &c), 0);
		assert_int_equal(kvp_stats(c, &st), 0);
		assert_true(st->remote_on && st->remote_client);
		assert_int_equal(st->remote.pages_fetched, 5);
		assert_true(st->remote.hits >= 5);
		assert_int_equal(st->remote.nodes_up, 3);
		assert_int_equal(st->remote.corrupt, 0);
		kvp_stats_free(st);
		kvp_disconnect(c);
	}
	/* B holds them now: with the cluster emptied they still match. */
	flush_cluster();
	got = match_on(&b, tokens, 5 * BT + 7, &bad);
	assert_int_equal(got, 5 * BT);
	assert_int_equal(bad, 0);
	/* A longer prompt on B whose later pages A never wrote: the cached
	 * ones, then a miss (a page the cluster lacks is not waited for
	 * twice). */
	{
		uint32_t longer[8 * BT];

		memcpy(longer, tokens, 5 * BT * sizeof(uint32_t));
		harness_tokens(longer + 5 * BT, 3 * BT, next_seq++, 5 * BT);
		got = match_on(&b, longer, 8 * BT, &bad);
		assert_int_equal(got, 5 * BT);
		assert_int_equal(bad, 0);
	}
}

struct look {
	const uint32_t *tokens;
	size_t n;
};

/* As nobody (tenant team-n on B): nothing of team-a's. */
static int look_as_nobody(void *arg)
{
	struct look *lk = arg;
	uint64_t bad = 0;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(match_on(&b, lk->tokens, lk->n, &bad), 0);
	return 0;
}

static void test_other_tenant(void **state)
{
	uint32_t tokens[4 * BT];
	struct look lk = {tokens, 4 * BT};

	(void)state;
	flush_cluster();
	harness_tokens(tokens, 4 * BT, next_seq++, 0);
	commit_on(&a, tokens, 4 * BT);
	assert_int_equal(wait_keys(4, 10), 0);
	assert_int_equal(harness_run_child(look_as_nobody, &lk), 0);
}

/* Flips one byte of every value's page payload (its last byte). */
static void corrupt_all(void)
{
	int m[3], n = rcluster_masters(&rc, m);

	for (int i = 0; i < n; i++) {
		redisContext *c = rcluster_connect(m[i]);
		redisReply *keys = c ? redisCommand(c, "KEYS kvp:*:*:*") : NULL;

		assert_non_null(keys);
		for (size_t k = 0; k < keys->elements; k++) {
			redisReply *v = redisCommand(c, "GET %s", keys->element[k]->str);
			redisReply *s;

			assert_non_null(v);
			assert_int_equal(v->type, REDIS_REPLY_STRING);
			v->str[v->len - 1] ^= 0x40;
			s = redisCommand(c, "SET %s %b", keys->element[k]->str, v->str,
					 (size_t)v->len);
			assert_non_null(s);
			freeReplyObject(s);
			freeReplyObject(v);
		}
		freeReplyObject(keys);
		redisFree(c);
	}
}

static void test_corrupt_value(void **state)
{
	uint32_t tokens[3 * BT];
	uint64_t bad = 0;

	(void)state;
	flush_cluster();
	harness_tokens(tokens, 3 * BT, next_seq++, 0);
	commit_on(&a, tokens, 3 * BT);
	assert_int_equal(wait_keys(3, 10), 0);
	corrupt_all();
	assert_int_equal(match_on(&b, tokens, 3 * BT, &bad), 0);
	assert_true(harness_daemon_alive(&b));
	{
		struct kvp_stats *st;
		kvp_client *c;

		assert_int_equal(kvp_connect(b.admin_sock, &c), 0);
		assert_int_equal(kvp_stats(c, &st), 0);
		assert_true(st->remote.corrupt >= 1); /* the first page: the walk stops there */
		kvp_stats_free(st);
		kvp_disconnect(c);
	}
}

static void test_cluster_down(void **state)
{
	uint32_t tokens[3 * BT], later[3 * BT];
	uint64_t bad = 0, got = 0;
	double t0, end;

	(void)state;
	assert_int_equal(rcluster_script(&rc, "stop", 0), 0);
	harness_tokens(tokens, 3 * BT, next_seq++, 0);
	/* A still caches and serves what it holds. */
	commit_on(&a, tokens, 3 * BT);
	assert_int_equal(match_on(&a, tokens, 3 * BT, &bad), 3 * BT);
	assert_int_equal(bad, 0);
	/* B: a miss, within a few timeouts, not a hang. */
	t0 = now_s();
	assert_int_equal(match_on(&b, tokens, 3 * BT, &bad), 0);
	assert_true(now_s() - t0 < 5.0);
	assert_true(harness_daemon_alive(&a) && harness_daemon_alive(&b));
	/* Back: pages written from now on reach B again, by themselves. */
	assert_int_equal(rcluster_script(&rc, "restart", 0), 0);
	flush_cluster();
	harness_tokens(later, 3 * BT, next_seq++, 0);
	end = now_s() + 20;
	for (int k = 0; got != 3 * BT && now_s() < end; k++) {
		later[0] = 1000000u + (uint32_t)k; /* a new conversation each try */
		commit_on(&a, later, 3 * BT);
		if (wait_keys(1, 2) < 0)
			continue;
		usleep(300000); /* all three puts */
		got = match_on(&b, later, 3 * BT, &bad);
		assert_int_equal(bad, 0);
	}
	assert_int_equal(got, 3 * BT);
}

/* A password file others may read stops the start; so do credentials the
 * cluster refuses. */
static void test_credentials(void **state)
{
	struct harness h;
	char path[] = "/tmp/kvp-rtier-pw-XXXXXX";
	int fd = mkstemp(path);
	const char *const extra[] = {"--remote-tier", tier_arg, "--remote-password-file", path,
				     NULL};

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "not-the-password\n", 17), 17);
	close(fd);
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(harness_start(&h, extra), -1);
	assert_int_equal(chmod(path, 0600), 0);
	/* The cluster has no password: AUTH is refused. */
	assert_int_equal(harness_start(&h, extra), -1);
	unlink(path);
}

/* The entries of the stream, as hiredis gives them. */
static redisReply *stream_entries(redisContext **ret_c)
{
	int port = rcluster_owner(&rc, STREAM);
	redisContext *c = port > 0 ? rcluster_connect(port) : NULL;

	*ret_c = c;
	return c ? redisCommand(c, "XRANGE %s - +", STREAM) : NULL;
}

/* A field's value in an entry's [field, value, ...] array, or NULL. */
static const char *field(const redisReply *fields, const char *name)
{
	for (size_t i = 0; i + 1 < fields->elements; i += 2)
		if (!strcmp(fields->element[i]->str, name))
			return fields->element[i + 1]->str;
	return NULL;
}

/* KV events to the cluster: A's commit of three pages is three stored
 * entries in the stream, chained, under team-a's scope and A's machine
 * name, and nothing names a uid. */
static void test_events_stream(void **state)
{
	uint32_t tokens[3 * BT];
	char host[65] = "", scope[33];
	uint8_t d[16];
	const char *prev = NULL;
	redisContext *c = NULL;
	redisReply *r = NULL;
	double end;

	(void)state;
	assert_int_equal(strlen(STREAM), 127);
	flush_cluster();
	gethostname(host, sizeof(host) - 1);
	remote_scope_digest("team-a", d);
	for (int i = 0; i < 16; i++)
		snprintf(scope + 2 * i, 3, "%02x", d[i]);
	harness_tokens(tokens, 3 * BT, next_seq++, 0);
	commit_on(&a, tokens, 3 * BT);
	end = now_s() + 10;
	while (now_s() < end) {
		r = stream_entries(&c);
		if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3)
			break;
		if (r)
			freeReplyObject(r);
		if (c)
			redisFree(c);
		r = NULL;
		c = NULL;
		usleep(50000);
	}
	assert_non_null(r);
	assert_int_equal(r->elements, 3);
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *f = r->element[i]->element[1];

		assert_string_equal(field(f, "machine"), host);
		assert_string_equal(field(f, "kind"), "stored");
		assert_string_equal(field(f, "scope"), scope);
		assert_string_equal(field(f, "tier"), "host");
		assert_int_equal(strlen(field(f, "hash")), 32);
		assert_null(field(f, "uid"));
		if (prev)
			assert_string_equal(field(f, "parent"), prev);
		else
			assert_null(field(f, "parent"));
		prev = field(f, "hash");
	}
	freeReplyObject(r);
	redisFree(c);
}

/* remote-write reuse: nothing goes to the cluster at commit, a page goes
 * once a match used it, and then B finds it. */
static void test_write_on_reuse(void **state)
{
	uint32_t tokens[4 * BT];
	uint64_t bad = 1;

	(void)state;
	restart_team_a(&a, "16M", "--remote-write", "reuse", NULL);
	flush_cluster();
	harness_tokens(tokens, 4 * BT, next_seq++, 0);
	commit_on(&a, tokens, 4 * BT);
	usleep(500000);
	assert_int_equal(remote_keys(), 0);
	/* Two of the four pages used again, then all four. */
	assert_int_equal(match_on(&a, tokens, 2 * BT, &bad), 2 * BT);
	assert_int_equal(wait_keys(2, 10), 0);
	usleep(200000);
	assert_int_equal(remote_keys(), 2);
	assert_int_equal(match_on(&a, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(wait_keys(4, 10), 0);
	assert_int_equal(match_on(&b, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(bad, 0);
}

/* A's counters of its own pools (the remote tier's pages written). */
static struct kvp_stats *stats_of(const struct harness *h)
{
	struct kvp_stats *st;
	kvp_client *c;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	kvp_disconnect(c);
	return st;
}

/* Waits until every page h handed to the cluster is there (keys, the
 * cluster emptied before: one key per page written once); returns the
 * pages written. */
static uint64_t wait_written(const struct harness *h, double secs)
{
	double end = now_s() + secs;
	struct kvp_stats *st;
	uint64_t w;

	for (;;) {
		st = stats_of(h);
		w = st->remote.pages_written;
		assert_int_equal(st->remote.write_failures, 0);
		kvp_stats_free(st);
		if (remote_keys() >= (long)w || now_s() > end)
			break;
		usleep(20000);
	}
	/* A moment more: nothing else is on its way. */
	usleep(300000);
	st = stats_of(h);
	w = st->remote.pages_written;
	kvp_stats_free(st);
	return w;
}

/* A's host pool of 256 pages (1M of 4 KiB pages) filled past its
 * high watermark (243) with n conversations of 10 pages. */
#define FILL_PAGES 10
static void fill(struct harness *h, int n)
{
	uint32_t tokens[FILL_PAGES * BT];

	for (int i = 0; i < n; i++) {
		harness_tokens(tokens, FILL_PAGES * BT, next_seq++, 0);
		commit_on(h, tokens, FILL_PAGES * BT);
	}
}

/* A restarted with remote-write eviction and LRU's victim order: the
 * tests below say which pages leave first (under window a conversation
 * matched again is in main and outlasts the fill). */
static void restart_evicting(const char *disk_size)
{
	restart_team_a(&a, "1M", "--eviction", "lru", "--disk-pool-size", disk_size,
		       "--remote-write", "eviction", NULL);
}

/* remote-write eviction without a disk tier: A's committed pages stay
 * off the network until A's host tier drops them; then B finds them
 * (the same bytes) and A wrote exactly the pages it evicted. */
static void test_write_on_eviction(void **state)
{
	uint32_t tokens[4 * BT];
	struct harness_pool_info pi;
	struct kvp_stats *st;
	uint64_t bad = 1, written;
	kvp_client *c;
	kvp_pool *p;

	(void)state;
	restart_evicting("0");
	flush_cluster();
	harness_tokens(tokens, 4 * BT, next_seq++, 0);
	commit_on(&a, tokens, 4 * BT);
	/* Used again, even: still nothing goes while A keeps it. */
	assert_int_equal(match_on(&a, tokens, 4 * BT, &bad), 4 * BT);
	usleep(500000);
	assert_int_equal(remote_keys(), 0);
	st = stats_of(&a);
	assert_int_equal(st->remote.pages_written, 0);
	kvp_stats_free(st);
	/* 4 + 250 pages into 256: the oldest, our conversation first, go. */
	fill(&a, 25);
	written = wait_written(&a, 10);
	assert_true(written >= 4);
	assert_int_equal(remote_keys(), (long)written);
	assert_int_equal(kvp_connect(a.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 256);
	assert_int_equal(harness_pool_info(&a, kvp_pool_id(p), &pi), 0);
	kvp_disconnect(c);
	/* Every page written is one A dropped, and every one A dropped went. */
	assert_int_equal(pi.evictions, written);
	assert_true(written < 254);
	print_message("A: 254 pages committed, %llu evicted, %llu written\n",
		      (unsigned long long)pi.evictions, (unsigned long long)written);
	bad = 1;
	assert_int_equal(match_on(&b, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(bad, 0);
}

/* With a disk tier a page goes when it is demoted to disk; promoted back
 * (a match on A) and demoted again it is not written a second time. */
static void test_evicted_twice(void **state)
{
	uint32_t tokens[4 * BT];
	struct kvp_stats *st;
	uint64_t bad = 1, written, again, promoted;

	(void)state;
	restart_evicting("16M");
	flush_cluster();
	harness_tokens(tokens, 4 * BT, next_seq++, 0);
	commit_on(&a, tokens, 4 * BT);
	fill(&a, 25);
	written = wait_written(&a, 10);
	assert_true(written >= 4);
	assert_int_equal(remote_keys(), (long)written);
	assert_int_equal(match_on(&b, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(bad, 0);
	/* Back from A's disk, then out again under 250 more pages. */
	st = stats_of(&a);
	assert_true(st->spilled_pages >= 4);
	promoted = st->promoted_pages;
	kvp_stats_free(st);
	bad = 1;
	assert_int_equal(match_on(&a, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(bad, 0);
	st = stats_of(&a);
	assert_int_equal(st->promoted_pages, promoted + 4);
	promoted = st->promoted_pages;
	kvp_stats_free(st);
	fill(&a, 25);
	again = wait_written(&a, 10);
	assert_true(again > written); /* the new pages that left */
	/* One key per page written: none of them went twice. */
	assert_int_equal(remote_keys(), (long)again);
	print_message("A: %llu pages written after the first fill, %llu after the second\n",
		      (unsigned long long)written, (unsigned long long)again);
	/* And ours had left the host tier again: another promotion. */
	bad = 1;
	assert_int_equal(match_on(&a, tokens, 4 * BT, &bad), 4 * BT);
	assert_int_equal(bad, 0);
	st = stats_of(&a);
	assert_int_equal(st->promoted_pages, promoted + 4);
	kvp_stats_free(st);
	/* (The room that promotion took sent a few more pages.) */
	again = wait_written(&a, 10);
	assert_int_equal(remote_keys(), (long)again);
}

/* Over the in-flight budget a page leaving the host tier is not written
 * (counted), and eviction goes on: pages of 512 KiB, a budget of 1 MiB
 * (one page and its header), a host pool of 16 pages filled with 40;
 * past 12 pages used eviction frees 8 at once, so every run but the
 * first finds the budget taken by its own first page at least. */
static void test_eviction_over_budget(void **state)
{
	static const struct kvp_layout big = {
		.n_layers = 8,
		.n_kv_heads = 8,
		.head_dim = 128,
		.block_tokens = BT,
		.dtype = KVP_DTYPE_F16,
	};
	uint32_t tokens[BT];
	struct harness_pool_info pi;
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	double end;

	(void)state;
	restart_team_a(&a, "8M", "--disk-pool-size", "0", "--remote-write", "eviction",
		       "--remote-max-inflight-mb", "1", "--host-high-watermark", "0.75",
		       "--host-low-watermark", "0.5", NULL);
	flush_cluster();
	assert_int_equal(kvp_connect(a.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &big, &p), 0);
	assert_int_equal(kvp_pool_n_pages(p), 16);
	for (int i = 0; i < 40; i++) {
		harness_tokens(tokens, BT, next_seq++, 0);
		/* Every commit gets its page: eviction never waits. */
		assert_int_equal(harness_pkv_commit_session(p, tokens, BT, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	assert_int_equal(harness_pool_info(&a, kvp_pool_id(p), &pi), 0);
	kvp_disconnect(c);
	assert_true(pi.evictions >= 24);
	/* Every page that left was handed over or dropped over the budget,
	 * and what was handed over is in the cluster. */
	end = now_s() + 10;
	for (;;) {
		st = stats_of(&a);
		if (remote_keys() >= (long)(st->remote.pages_written - st->remote.write_failures) ||
		    now_s() > end)
			break;
		kvp_stats_free(st);
		usleep(20000);
	}
	print_message("A: %llu evicted, %llu handed over, %llu of them not stored\n",
		      (unsigned long long)pi.evictions,
		      (unsigned long long)st->remote.pages_written,
		      (unsigned long long)st->remote.write_failures);
	assert_int_equal(st->remote.pages_written, pi.evictions);
	assert_true(st->remote.write_failures >= 1);
	assert_true(st->remote.write_failures < st->remote.pages_written);
	assert_int_equal(remote_keys(),
			 (long)(st->remote.pages_written - st->remote.write_failures));
	kvp_stats_free(st);
}

/* A chain longer than B's pool has room for: B fetches what fits and
 * stops there (the pages it fetched are no room for the rest). It used to
 * evict its own first pages to fetch the next, park, fetch them again,
 * until its park limit. */
static void test_chain_longer_than_pool(void **state)
{
	enum { PAGES = 300 }; /* B's pool: 256 pages, the low mark at 230 */
	uint32_t *tokens = calloc(PAGES * BT, sizeof(uint32_t));
	struct kvp_stats *st;
	uint64_t bad = 1, got;

	(void)state;
	assert_non_null(tokens);
	restart_team_a(&a, "16M", NULL); /* writes at commit */
	restart_team_a(&b, "1M", NULL);
	flush_cluster();
	harness_tokens(tokens, PAGES * BT, next_seq++, 0);
	commit_on(&a, tokens, PAGES * BT);
	assert_int_equal(wait_keys(PAGES, 20), 0);
	got = match_on(&b, tokens, PAGES * BT, &bad);
	assert_int_equal(bad, 0);
	assert_true(got >= 200 * BT && got < PAGES * BT);
	st = stats_of(&b);
	print_message("B: %llu of %d pages matched, %llu fetched in %llu batches\n",
		      (unsigned long long)(got / BT), PAGES,
		      (unsigned long long)st->remote.pages_fetched,
		      (unsigned long long)st->remote.fetches);
	/* Each page came once: none was fetched, evicted and fetched again. */
	assert_true(st->remote.pages_fetched <= PAGES);
	kvp_stats_free(st);
	/* Asked again, B serves what it kept. */
	bad = 1;
	assert_int_equal(match_on(&b, tokens, PAGES * BT, &bad), got);
	assert_int_equal(bad, 0);
	free(tokens);
}

static int setup(void **state)
{
	int ret;

	(void)state;
	ret = rcluster_start(&rc);
	if (ret == 77)
		exit(77);
	if (ret)
		return -1;
	snprintf(tier_arg, sizeof(tier_arg), "redis://127.0.0.1:%d,127.0.0.1:%d", rc.base,
		 rc.base + 1);
	if (start(&a, "0=team-a,65534=team-n") < 0 || start(&b, "0=team-a,65534=team-n") < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	int ret = 0;

	(void)state;
	ret |= harness_stop(&a);
	ret |= harness_stop(&b);
	rcluster_stop(&rc);
	return ret ? -1 : 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_across_machines),
		cmocka_unit_test(test_other_tenant),
		cmocka_unit_test(test_corrupt_value),
		cmocka_unit_test(test_credentials),
		cmocka_unit_test(test_events_stream),
		cmocka_unit_test(test_cluster_down),
		cmocka_unit_test(test_write_on_reuse),
		cmocka_unit_test(test_write_on_eviction),
		cmocka_unit_test(test_evicted_twice),
		cmocka_unit_test(test_eviction_over_budget),
		cmocka_unit_test(test_chain_longer_than_pool),
	};

	signal(SIGPIPE, SIG_IGN);
	alarm(240);
	return cmocka_run_group_tests(tests, setup, teardown);
}
