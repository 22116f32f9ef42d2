/* tests/integration/test_purge.c — what an admin drops, purges or evicts
 * from the disk tier is gone, in every tier and after a restart (issue 13,
 * items 2, 9 and 18).
 *
 * A 1 MiB host pool of 4 KiB pages over a 16 MiB spill file, as in
 * test_disk.c:
 *  - evict --tier host demotes: the pages go to the disk tier (nothing
 *    dropped) and still match with the right bytes; --tier disk removes
 *    their disk copies, and a restart after SIGKILL finds none;
 *  - drop pool --force of a pool with spilled pages: a new pool of the same
 *    user, model and layout starts empty, in this run and after a restart
 *    (the spill file was removed, not left to be found "from an earlier
 *    run");
 *  - drop session: the pages only that session held are never matched
 *    again, not after a clean stop (which writes cached pages to disk)
 *    either; pages a reader's lease shares stay;
 *  - purge --salt: a tenant's leaked salt — its chains go from host and
 *    disk at once, a reader's lease keeps its bytes, the other salt's
 *    chains stay, and a session that held purged pages puts nothing it
 *    computes after them into the index; after SIGKILL and a restart
 *    nothing of the purged salt comes back; then purge --unused-since
 *    takes the pages found on disk and never used since the restart, and
 *    leaves a fresh one.
 */
#include <errno.h>
#include <inttypes.h>
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

#define MODEL	   "purge-model"
#define BT	   16u
#define CONV_PAGES 16u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   6

static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static const char *const disk_args[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M", NULL};

static char out[1 << 16];

static uint32_t *conv_tokens(void)
{
	uint32_t *all = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));

	assert_non_null(all);
	for (int i = 0; i < N_CONV; i++)
		harness_tokens(all + (size_t)i * CONV, CONV, 900 + (uint32_t)i, 0);
	return all;
}

static const uint32_t *conv(const uint32_t *all, int i)
{
	return all + (size_t)i * CONV;
}

/* Commits conversation i through p and closes its session. */
static void write_conv(kvp_pool *p, const uint32_t *all, int i)
{
	kvp_session *s;

	assert_int_equal(harness_pkv_commit_session(p, conv(all, i), CONV, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

/* The tokens a match of conversation i finds through p; every byte found
 * is checked. */
static uint64_t matched(kvp_pool *p, const uint32_t *all, int i)
{
	kvp_lease *l;
	uint64_t m;

	assert_int_equal(kvp_match_prefix(p, conv(all, i), CONV, &l), 0);
	m = kvp_lease_tokens(l);
	assert_int_equal(harness_pkv_check_lease(l, p, conv(all, i), m), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	return m;
}

static struct kvp_pool_stats stats_of(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps;
}

/* Runs kvpalacectl --socket sock with the NULL-terminated arguments;
 * output in out. Returns the exit status. */
static int ctlv(const char *sock, ...)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[24] = {(char *)bin, "--socket", (char *)sock};
	int n = 3;
	va_list ap;

	assert_non_null(bin);
	va_start(ap, sock);
	while (n < 23 && (argv[n] = va_arg(ap, char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	return harness_run_capture(argv, NULL, out, sizeof(out));
}

#define CTL_EXPECT(want, ...)                                                                      \
	do {                                                                                       \
		int st_ = ctlv(__VA_ARGS__, NULL);                                                 \
		if (st_ != (want))                                                                 \
			fail_msg("%s:%d: kvpalacectl exited %d, expected %d:\n%s", __FILE__,       \
				 __LINE__, st_, (want), out);                                      \
	} while (0)

static void expect_out(const char *what, const char *want)
{
	if (!strstr(out, want))
		fail_msg("%s: no '%s' in:\n%s", what, want, out);
}

/* Item 9: an admin's eviction from the host tier writes pages to the disk
 * tier first, as the README says pages leaving the host tier are; before,
 * it dropped them. --tier disk works on a daemon with a disk tier (it used
 * to answer "there is no disk tier") and what it evicts stays gone after a
 * crash. */
static void test_evict_demotes(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_evict_result *r;
	struct kvp_pool_stats ps;
	kvp_client *c, *admin;
	kvp_pool *p;
	char id[24];

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	snprintf(id, sizeof(id), "%" PRIu64, kvp_pool_id(p));
	for (int i = 0; i < 4; i++)
		write_conv(p, all, i);
	ps = stats_of(c, p);
	assert_int_equal(ps.host_indexed_pages, 4 * CONV_PAGES);
	assert_int_equal(ps.disk_pages, 0);

	assert_int_equal(
		kvp_admin_evict(admin, KVP_TIER_HOST, kvp_pool_id(p), KVP_EVICT_ALL, 0, &r), 0);
	assert_int_equal(r->pages, 4 * CONV_PAGES);
	assert_int_equal(r->demoted, 4 * CONV_PAGES);
	assert_int_equal(r->dropped, 0);
	free(r);
	ps = stats_of(c, p);
	assert_int_equal(ps.indexed_pages, 4 * CONV_PAGES);
	assert_int_equal(ps.host_indexed_pages, 0);
	assert_int_equal(ps.disk_pages, 4 * CONV_PAGES);
	assert_int_equal(ps.evictions, 0);
	/* Demoted, not lost: every page comes back from disk, right. */
	for (int i = 0; i < 4; i++)
		assert_int_equal(matched(p, all, i), CONV);
	ps = stats_of(c, p);
	assert_int_equal(ps.promoted_pages, 4 * CONV_PAGES);

	/* --discard drops what has no disk copy: conversation 4. */
	write_conv(p, all, 4);
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "host", "--bytes", "all", "--pool", id,
		   "--discard");
	expect_out("evict --discard", "evicted 80 pages (320 KiB) from the host tier: 64 "
				      "demoted to the disk tier, 16 dropped");
	assert_int_equal(matched(p, all, 4), 0);
	assert_int_equal(matched(p, all, 0), CONV);

	/* The disk tier: copies go for good, the host copies stay. */
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "disk", "--bytes", "all", "--pool", id);
	expect_out("evict --tier disk", "evicted 64 pages (256 KiB) from the disk tier");
	ps = stats_of(c, p);
	assert_int_equal(ps.disk_pages, 0);
	assert_int_equal(matched(p, all, 0), CONV);
	kvp_disconnect(admin);
	kvp_disconnect(c);

	/* A crash: the spill file's headers were invalidated and synced. */
	assert_int_equal(harness_restart(h, SIGKILL, disk_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = stats_of(c, p);
	assert_int_equal(ps.restored_pages, 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(matched(p, all, i), 0);
	kvp_disconnect(c);
	free(all);
}

/* Item 2: `drop pool ID --force` left the pool's spilled pages in its
 * spill file; the next pool of the same user, model and layout said "N
 * found from an earlier run" and matched the dropped chains, also after a
 * restart. */
static void test_drop_pool_forgets_disk(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_drop_pool_result dr;
	struct kvp_pool_stats ps;
	kvp_client *c, *admin;
	kvp_session *keep;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	for (int i = 0; i < 4; i++)
		write_conv(p, all, i);
	/* A clean stop writes them to the spill file; the next start finds
	 * them there. */
	kvp_disconnect(admin);
	kvp_disconnect(c);
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(stats_of(c, p).restored_pages, 4 * CONV_PAGES);
	assert_int_equal(stats_of(c, p).disk_pages, 4 * CONV_PAGES);
	/* In use: only --force drops it. */
	assert_int_equal(harness_pkv_commit_session(p, conv(all, 4), CONV, &keep), 0);
	assert_int_equal(kvp_admin_drop_pool(admin, kvp_pool_id(p), 0, &dr), -EBUSY);
	assert_int_equal(kvp_admin_drop_pool(admin, kvp_pool_id(p), KVP_DROP_FORCE, &dr), 0);
	assert_int_equal(dr.sessions_closed, 1);
	kvp_pool_close(p);

	/* A pool of the same identity, in this run: empty. */
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = stats_of(c, p);
	assert_int_equal(ps.restored_pages, 0);
	assert_int_equal(ps.indexed_pages, 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(matched(p, all, i), 0);
	kvp_disconnect(admin);
	kvp_disconnect(c);

	/* And after a restart (a clean stop, then a crash). */
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	ps = stats_of(c, p);
	assert_int_equal(ps.restored_pages, 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(matched(p, all, i), 0);
	kvp_disconnect(c);
	free(all);
}

/* Item 2, sessions: a dropped session's pages stayed cached and were
 * matched (and written to disk at a clean stop, found after the restart).
 * Pages a reader's lease shares are that reader's too: they stay. */
static void test_drop_session_forgets(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_drop_session_result dr;
	kvp_client *c, *admin, *reader;
	kvp_pool *p, *rp;
	kvp_session *s0, *s1;
	kvp_lease *l;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->sock, &reader), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(harness_pool_open(h, reader, MODEL, &page4k, &rp), 0);
	assert_int_equal(harness_pkv_commit_session(p, conv(all, 0), CONV, &s0), 0);
	assert_int_equal(harness_pkv_commit_session(p, conv(all, 1), CONV, &s1), 0);
	write_conv(p, all, 2); /* cached, nobody's session */
	/* The reader holds the first 2 pages of conversation 1. */
	assert_int_equal(kvp_match_prefix(rp, conv(all, 1), 2 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 2 * BT);

	assert_int_equal(kvp_admin_drop_session(admin, kvp_session_id(s0), 0, &dr), 0);
	assert_int_equal(kvp_admin_drop_session(admin, kvp_session_id(s1), 0, &dr), 0);
	assert_int_equal(matched(p, all, 0), 0);
	assert_int_equal(matched(p, all, 1), 2 * BT);
	assert_int_equal(matched(p, all, 2), CONV);
	assert_int_equal(harness_pkv_check_lease(l, rp, conv(all, 1), 2 * BT), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(reader);
	kvp_disconnect(admin);
	kvp_disconnect(c);

	/* A clean stop writes what is cached to disk: nothing dropped is. */
	assert_int_equal(harness_restart(h, SIGTERM, disk_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	assert_int_equal(matched(p, all, 0), 0);
	assert_int_equal(matched(p, all, 1), 2 * BT);
	assert_int_equal(matched(p, all, 2), CONV);
	kvp_disconnect(c);
	free(all);
}

/* Item 18: a tenant's salt leaked. purge --salt removes exactly its
 * chains, from host and disk at once and for good; a lease on one of them
 * keeps its bytes until released; the other salt's chains stay. After a
 * crash nothing of it comes back. purge --unused-since then takes the
 * pages found on disk and never used since the restart. */
static void test_purge_salt_and_age(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	struct kvp_evict_result *r;
	struct kvp_purge_result pr;
	struct kvp_purge_spec spec = {0};
	struct kvp_pool_stats ps;
	uint32_t ext[CONV + BT];
	kvp_client *ca, *cb, *admin;
	kvp_session *held;
	kvp_pool *pa, *pb;
	kvp_lease *l, *l2;

	assert_int_equal(kvp_connect(h->sock, &ca), 0);
	assert_int_equal(kvp_connect(h->sock, &cb), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, ca, MODEL, &page4k, &pa), 0);
	assert_int_equal(harness_pool_open(h, cb, MODEL, &page4k, &pb), 0);
	assert_int_equal(kvp_pool_id(pa), kvp_pool_id(pb));
	assert_int_equal(kvp_pool_set_salt(pa, "leaked-salt", 11), 0);
	assert_int_equal(kvp_pool_set_salt(pb, "other-salt", 10), 0);
	/* Conversations 0..3 under both salts, on disk; 4 under A in host. */
	for (int i = 0; i < 4; i++) {
		write_conv(pa, all, i);
		write_conv(pb, all, i);
	}
	assert_int_equal(kvp_admin_evict(admin, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &r), 0);
	free(r);
	write_conv(pa, all, 4);
	/* A reader of salt A holds conversation 0 (read back from disk); a
	 * writer of salt A has conversation 3 open, about to go on. */
	assert_int_equal(kvp_match_prefix(pa, conv(all, 0), CONV, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), CONV);
	memcpy(ext, conv(all, 3), CONV * sizeof(uint32_t));
	harness_tokens(ext + CONV, BT, 777, 0);
	assert_int_equal(harness_pkv_commit_session(pa, ext, CONV, &held), 0);

	CTL_EXPECT(0, h->admin_sock, "purge", "--salt", "leaked-salt");
	expect_out("purge --salt",
		   "purged 80 pages from 1 pool: 48 in the host tier, 64 on disk (invalidated "
		   "and synced), 0 GPU copies");
	expect_out("purge --salt",
		   "32 pages still held by sessions or leases, freed when they end; 1 session "
		   "will index nothing more");
	for (int i = 0; i < 5; i++)
		assert_int_equal(matched(pa, all, i), 0);
	/* The writer goes on from its purged pages: what it computes on them
	 * must not be matched either, not even once a clean client has
	 * recomputed conversation 3 under the same salt. */
	write_conv(pa, all, 3);
	assert_int_equal(kvp_append(held, ext + CONV, BT), 0);
	assert_int_equal(harness_pkv_write_session(pa, held, ext, CONV, CONV + BT), 0);
	assert_int_equal(kvp_commit(held, BT), 0);
	assert_int_equal(kvp_match_prefix(pa, ext, CONV + BT, &l2), 0);
	assert_int_equal(kvp_lease_tokens(l2), CONV);
	assert_int_equal(kvp_lease_release(l2), 0);
	assert_int_equal(kvp_session_close(held), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(matched(pb, all, i), CONV);
	assert_int_equal(harness_pkv_check_lease(l, pa, conv(all, 0), CONV), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* B's 4 conversations, and A's conversation 3 as recomputed. */
	ps = stats_of(cb, pb);
	assert_int_equal(ps.indexed_pages, 5 * CONV_PAGES);
	assert_int_equal(ps.purged_pages, 80);
	/* The library call: what of that salt came since (the recomputed
	 * conversation 3), and not the writer's page after it. */
	spec.flags = KVP_PURGE_SALT | KVP_PURGE_MODEL;
	spec.salt = "leaked-salt";
	spec.salt_len = 11;
	spec.model_id = MODEL;
	assert_int_equal(kvp_admin_purge(admin, &spec, &pr), 0);
	assert_int_equal(pr.pages, CONV_PAGES);
	assert_int_equal(pr.pools, 1);
	assert_int_equal(matched(pa, all, 3), 0);
	spec.flags = 0;
	assert_int_equal(kvp_admin_purge(admin, &spec, &pr), -EINVAL);
	kvp_disconnect(admin);
	kvp_disconnect(ca);
	kvp_disconnect(cb);

	/* A crash right after: the purge was durable when it answered. */
	assert_int_equal(harness_restart(h, SIGKILL, disk_args), 0);
	assert_int_equal(kvp_connect(h->sock, &ca), 0);
	assert_int_equal(kvp_connect(h->sock, &cb), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(harness_pool_open(h, ca, MODEL, &page4k, &pa), 0);
	assert_int_equal(harness_pool_open(h, cb, MODEL, &page4k, &pb), 0);
	assert_int_equal(kvp_pool_set_salt(pa, "leaked-salt", 11), 0);
	assert_int_equal(kvp_pool_set_salt(pb, "other-salt", 10), 0);
	ps = stats_of(cb, pb);
	assert_int_equal(ps.restored_pages, 4 * CONV_PAGES);
	for (int i = 0; i < 5; i++)
		assert_int_equal(matched(pa, all, i), 0);

	/* Age: a fresh conversation is used now; the restored ones were not
	 * used since the restart. */
	write_conv(pb, all, 5);
	CTL_EXPECT(0, h->admin_sock, "purge", "--unused-since", "1h", "--model", MODEL);
	expect_out("purge --unused-since", "purged 64 pages from 1 pool");
	for (int i = 0; i < 4; i++)
		assert_int_equal(matched(pb, all, i), 0);
	assert_int_equal(matched(pb, all, 5), CONV);
	kvp_disconnect(admin);
	kvp_disconnect(ca);
	kvp_disconnect(cb);
	free(all);
}

static int setup_disk(void **state)
{
	return harness_setup_args(state, disk_args);
}

/* Issue 18: pages under an extra key (a LoRA adapter's) are purged by
 * --salt with --extra-key, not by --salt alone; --extra-key needs a
 * salt to go with. */
static uint64_t matched_keyed(kvp_pool *p, const uint32_t *t, const char *extra)
{
	struct kvp_match_opts mo = {.size = sizeof(mo),
				    .salt = "s",
				    .salt_len = 1,
				    .extra_key = extra,
				    .extra_key_len = extra ? strlen(extra) : 0};
	kvp_lease *l;
	uint64_t m;

	assert_int_equal(kvp_match_prefix_opts(p, t, CONV, &mo, &l), 0);
	m = kvp_lease_tokens(l);
	assert_int_equal(kvp_lease_release(l), 0);
	return m;
}

static void commit_keyed(kvp_pool *p, const uint32_t *t, const char *extra)
{
	struct kvp_session_opts so = {.size = sizeof(so),
				      .salt = "s",
				      .salt_len = 1,
				      .extra_key = extra,
				      .extra_key_len = extra ? strlen(extra) : 0};
	kvp_session *s;

	assert_int_equal(kvp_session_create_opts(p, &so, &s), 0);
	assert_int_equal(kvp_append(s, t, CONV), 0);
	assert_int_equal(harness_pkv_write_session(p, s, t, 0, CONV), 0);
	assert_int_equal(kvp_commit(s, CONV), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

static void test_purge_extra_key(void **state)
{
	struct harness *h = *state;
	uint32_t *all = conv_tokens();
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, MODEL, &page4k, &p), 0);
	commit_keyed(p, conv(all, 0), "lora-7");
	commit_keyed(p, conv(all, 1), NULL);
	assert_int_equal(matched_keyed(p, conv(all, 0), "lora-7"), CONV);
	assert_int_equal(matched_keyed(p, conv(all, 1), NULL), CONV);

	CTL_EXPECT(2, h->admin_sock, "purge", "--extra-key", "lora-7");
	expect_out("purge --extra-key alone", "--salt");
	CTL_EXPECT(0, h->admin_sock, "purge", "--salt", "s");
	expect_out("purge --salt", "purged 16 pages");
	assert_int_equal(matched_keyed(p, conv(all, 1), NULL), 0);
	assert_int_equal(matched_keyed(p, conv(all, 0), "lora-7"), CONV);
	CTL_EXPECT(0, h->admin_sock, "purge", "--salt", "s", "--extra-key", "lora-7");
	expect_out("purge --salt --extra-key", "purged 16 pages");
	assert_int_equal(matched_keyed(p, conv(all, 0), "lora-7"), 0);
	kvp_disconnect(c);
	free(all);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_evict_demotes, setup_disk, harness_teardown),
		cmocka_unit_test_setup_teardown(test_drop_pool_forgets_disk, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_drop_session_forgets, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_purge_salt_and_age, setup_disk,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_purge_extra_key, setup_disk, harness_teardown),
	};

	return cmocka_run_group_tests_name("purge", tests, NULL, NULL);
}
