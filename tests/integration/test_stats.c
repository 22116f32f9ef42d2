/* tests/integration/test_stats.c — statistics at the pool counts fleets run.
 *
 * Scenario (an operator's scrape, as LMCache and Mooncake expose per-pool
 * counters): one user opens many pools — one per model, per layout, per
 * LoRA base — and asks for statistics on the client socket and on the
 * admin socket, with and without a disk tier. A statistics reply costs
 * ten times its wire size and more once unpacked (each PoolStats is a
 * struct of some 300 bytes and a scan slab for its 30 fields, for some 50
 * bytes on the wire), so a library that budgeted replies by wire size
 * refused the reply of four pools as undecodable and dropped the caller's
 * connection, leases and reservations with it; kvpalacectl then reported
 * it as a refusal by the daemon (exit 1).
 *
 * Each case opens N pools (1, 16, and as many as one reply can list: the
 * smallest message cap with more pools than fit, so the daemon truncates),
 * keeps a session with an uncommitted reservation open on the same
 * connection, asks for Stats on both sockets, checks every pool it opened
 * is listed (or the reply says it was truncated), and that the connection
 * and its reservation survived. kvpalacectl status, stats, pools and
 * metrics must exit 0 on the same daemon.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define BT 16u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: one 4 KiB page. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static char out[1 << 18];

static int ctl(const char *sock, const char *cmd)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[] = {(char *)bin, "--socket", (char *)sock, (char *)cmd, NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, NULL, out, sizeof(out));
}

/* Stats through c: every pool of ids[0..n) is listed, unless the reply
 * says some were left out, in which case those it lists are ours. */
static void check_stats(kvp_client *c, const uint64_t *ids, size_t n, int disk, const char *sock)
{
	struct kvp_stats *st = NULL;
	size_t found = 0;
	int ret = kvp_stats(c, &st);

	if (ret < 0)
		fail_msg("kvp_stats on %s with %zu pools: %s", sock, n, kvp_strerror(c, ret));
	assert_non_null(st);
	for (size_t i = 0; i < n; i++)
		if (harness_find_pool(st, ids[i]))
			found++;
	if (st->pools_truncated) {
		assert_true(st->n_pools > 0);
		assert_true(st->n_pools < n);
		assert_int_equal(found, st->n_pools);
	} else {
		assert_int_equal(found, n);
	}
	for (size_t i = 0; i < st->n_pools; i++)
		assert_int_equal(st->pools[i].disk_capacity > 0, disk);
	kvp_stats_free(st);
}

static void run_case(size_t n_pools, int disk, int small_cap)
{
	char max_pools[16];
	const char *args[] = {"--host-pool-size",
			      "64K",
			      "--disk-pool-size",
			      disk ? "1M" : "0",
			      "--max-pools-per-tenant",
			      max_pools,
			      "--max-message-bytes",
			      small_cap ? "4096" : "65536",
			      NULL};
	uint64_t *ids = calloc(n_pools, sizeof(*ids));
	kvp_pool **pools = calloc(n_pools, sizeof(*pools));
	uint32_t tokens[BT / 2];
	struct harness h;
	kvp_client *c, *admin;
	kvp_session *s;

	assert_non_null(ids);
	assert_non_null(pools);
	snprintf(max_pools, sizeof(max_pools), "%zu", n_pools);
	assert_int_equal(harness_start(&h, args), 0);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_connect(h.admin_sock, &admin), 0);
	for (size_t i = 0; i < n_pools; i++) {
		char model[64];

		snprintf(model, sizeof(model), "stats-model-%zu", i);
		assert_int_equal(kvp_pool_open(c, model, &page4k, &pools[i]), 0);
		ids[i] = kvp_pool_id(pools[i]);
	}
	/* A reservation that a dropped connection would take along. */
	harness_tokens(tokens, BT / 2, 1, 0);
	assert_int_equal(kvp_session_create(pools[0], &s), 0);
	assert_int_equal(kvp_append(s, tokens, BT / 2), 0);

	check_stats(c, ids, n_pools, disk, "the client socket");
	check_stats(admin, ids, n_pools, disk, "the admin socket");

	/* The connection, its session and its reservation are still there. */
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(harness_write_session(pools[0], s, 0, tokens, BT / 2), 0);
	assert_int_equal(kvp_commit(s, BT / 2), 0);
	assert_int_equal(kvp_session_committed(s), BT / 2);

	for (const char **cmd = (const char *[]){"status", "stats", "pools", "metrics", NULL}; *cmd;
	     cmd++) {
		int st = ctl(h.admin_sock, *cmd);

		if (st != 0)
			fail_msg("kvpalacectl %s with %zu pools exited %d:\n%s", *cmd, n_pools, st,
				 out);
	}

	assert_int_equal(kvp_session_close(s), 0);
	for (size_t i = 0; i < n_pools; i++)
		kvp_pool_close(pools[i]);
	kvp_disconnect(admin);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	free(pools);
	free(ids);
}

static void test_one_pool(void **state)
{
	(void)state;
	run_case(1, 0, 0);
	run_case(1, 1, 0);
}

static void test_sixteen_pools(void **state)
{
	(void)state;
	run_case(16, 0, 0);
	run_case(16, 1, 0);
}

/* More pools than the smallest message cap can list: the daemon leaves
 * some out and says so, and what it sends decodes. */
static void test_most_pools(void **state)
{
	(void)state;
	run_case(120, 0, 1);
	run_case(120, 1, 1);
}

/* The largest reply the default cap allows: 1,100 pools do not fit in 64
 * KiB, so the reply is as full of PoolStats as a reply can be. */
static void test_full_reply(void **state)
{
	(void)state;
	run_case(1100, 0, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_pool),
		cmocka_unit_test(test_sixteen_pools),
		cmocka_unit_test(test_most_pools),
		cmocka_unit_test(test_full_reply),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
