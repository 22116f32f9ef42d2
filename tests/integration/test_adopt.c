/* tests/integration/test_adopt.c — kvp_lease_adopt: a match made in one
 * process (an engine's scheduler) handed to another (the worker that
 * loads the pages), issue 18.
 *
 *  - A worker process adopts the scheduler's lease by id and reads the
 *    same bytes; the scheduler releases its own lease and an admin evicts
 *    everything: the worker's pages stay, right; once the worker releases
 *    too, the eviction takes them.
 *  - A lease of more pages than one reply carries (4 KiB messages) comes
 *    over whole: every slot the source's.
 *  - The adopted lease forks into a session that goes on; adopting counts
 *    no second hit. Under key spans (an image) its fork hashes as the
 *    source lease's fork does (the two share their pages) and keeps the
 *    span: restored from a checkpoint, its pages match only under it.
 *  - Refused: id 0, an unknown id, a released one, one whose client
 *    disconnected, one of another pool of the same user, one of another
 *    user (not found, never shared across users); the leases limit.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "adopt-model"
#define BT    16

static const struct kvp_layout layout = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static uint64_t evict_all(struct harness *h, kvp_pool *p)
{
	struct kvp_evict_result *res;
	kvp_client *admin;
	uint64_t got;

	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_evict_flags(admin, KVP_TIER_HOST, kvp_pool_id(p), KVP_EVICT_ALL,
					       0, KVP_EVICT_DISCARD, &res),
			 0);
	got = res->pages;
	free(res);
	kvp_disconnect(admin);
	return got;
}

struct handoff {
	struct harness *h;
	uint32_t tokens[100];
	uint64_t lease_id;
	int adopted[2];	 /* worker -> scheduler: adopted */
	int released[2]; /* scheduler -> worker: released and evicted */
};

static int worker(void *arg)
{
	struct handoff *w = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;
	char b = 'a';

	CHILD_CHECK_EQ(kvp_connect(w->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_lease_adopt(p, w->lease_id, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 96);
	CHILD_CHECK_EQ(kvp_lease_id(l) != w->lease_id, 1);
	CHILD_CHECK_EQ(harness_check_lease(l, p, w->tokens, 96), 0);
	CHILD_CHECK_EQ(write(w->adopted[1], &b, 1), 1);
	CHILD_CHECK_EQ(read(w->released[0], &b, 1), 1);
	/* The scheduler let go and everything evictable went: still ours. */
	CHILD_CHECK_EQ(harness_check_lease(l, p, w->tokens, 96), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_handoff(void **state)
{
	struct handoff *w = calloc(1, sizeof(*w));
	struct kvp_stats *st;
	uint64_t hits, got;
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	pid_t pid;
	char b;

	assert_non_null(w);
	w->h = *state;
	harness_tokens(w->tokens, 100, 1, 0);
	assert_int_equal(pipe(w->adopted), 0);
	assert_int_equal(pipe(w->released), 0);
	assert_int_equal(kvp_connect(w->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(harness_commit_session(p, w->tokens, 100, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_match_prefix(p, w->tokens, 100, &l), 0);
	w->lease_id = kvp_lease_id(l);
	assert_true(w->lease_id != 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	hits = st->match_hits;
	kvp_stats_free(st);

	pid = harness_fork(worker, w);
	assert_true(pid > 0);
	assert_int_equal(read(w->adopted[0], &b, 1), 1);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(evict_all(w->h, p), 0); /* the worker pins all six */
	assert_int_equal(write(w->released[1], &b, 1), 1);
	assert_int_equal(harness_wait(pid, 30), 0);

	/* Now nothing holds them. */
	assert_int_equal(evict_all(w->h, p), 6);
	assert_int_equal(kvp_lookup(p, w->tokens, 100, &got), 0);
	assert_int_equal(got, 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(st->match_hits, hits); /* the adoption was no hit */
	kvp_stats_free(st);
	kvp_disconnect(c);
	free(w);
}

static int setup_small_messages(void **state)
{
	static const char *const args[] = {"--max-message-bytes", "4096", "--max-leases-per-client",
					   "3", NULL};

	return harness_setup_args(state, args);
}

#define LONG_N (2000 * BT)

static void test_long_and_limits(void **state)
{
	struct harness *h = *state;
	uint32_t *t = calloc(LONG_N, sizeof(*t));
	struct kvp_page_view a, b;
	kvp_client *c, *c2;
	kvp_pool *p, *p2, *other;
	kvp_lease *src, *got, *more[3];
	kvp_session *s;

	assert_non_null(t);
	harness_tokens(t, LONG_N, 2, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->sock, &c2), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_pool_open(c2, MODEL, &layout, &p2), 0);
	assert_int_equal(kvp_pool_open(c2, "adopt-other", &layout, &other), 0);
	assert_int_equal(harness_commit_session(p, t, LONG_N, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_match_prefix(p, t, LONG_N, &src), 0);
	assert_int_equal(kvp_lease_tokens(src), LONG_N);

	/* 2000 slots: more than one 4 KiB reply holds. */
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(src), &got), 0);
	assert_int_equal(kvp_lease_tokens(got), LONG_N);
	for (uint64_t i = 0; i < LONG_N / BT; i++) {
		assert_int_equal(kvp_lease_page(src, i, &a), 0);
		assert_int_equal(kvp_lease_page(got, i, &b), 0);
		assert_int_equal(a.slot, b.slot);
	}
	assert_int_equal(harness_check_lease(got, p2, t, LONG_N), 0);

	/* Forked into a session that goes on past the prefix. */
	assert_int_equal(kvp_lease_fork(got, LONG_N, &s), 0);
	assert_int_equal(kvp_session_committed(s), LONG_N);
	assert_int_equal(kvp_append(s, t, 8), 0);
	assert_int_equal(kvp_session_tokens(s), LONG_N + 8);
	assert_int_equal(kvp_session_close(s), 0);

	/* Refusals, each said. */
	assert_int_equal(kvp_lease_adopt(p2, 0, &got), -EINVAL);
	assert_int_equal(kvp_lease_adopt(NULL, 1, &got), -EINVAL);
	assert_int_equal(kvp_lease_adopt(p2, 1, NULL), -EINVAL);
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(src) + 999, &got), -ENOENT);
	assert_int_equal(kvp_lease_adopt(other, kvp_lease_id(src), &got), -ENOENT);
	assert_non_null(strstr(kvp_strerror(c2, -ENOENT), "lease"));
	/* The limit of 3 leases a client: got and two more. */
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(src), &more[0]), 0);
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(src), &more[1]), 0);
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(src), &more[2]), -EDQUOT);
	assert_int_equal(kvp_lease_release(more[0]), 0);
	assert_int_equal(kvp_lease_release(more[1]), 0);

	/* Released, or its client gone: not found. */
	uint64_t id = kvp_lease_id(src);

	assert_int_equal(kvp_lease_release(src), 0);
	assert_int_equal(kvp_lease_adopt(p2, id, &more[0]), -ENOENT);
	assert_int_equal(kvp_match_prefix(p, t, 64, &src), 0);
	id = kvp_lease_id(src);
	kvp_disconnect(c);
	assert_int_equal(kvp_lease_adopt(p2, id, &more[0]), -ENOENT);
	/* What was adopted before is untouched. */
	assert_int_equal(harness_check_lease(got, p2, t, LONG_N), 0);
	assert_int_equal(kvp_lease_release(got), 0);
	kvp_disconnect(c2);
	free(t);
}

/* A keyed prompt (an image's span over tokens 40..79): a session forked
 * from the adopted lease hashes its later pages as one forked from the
 * source lease does, so the two commits share their pages. */
static void test_keyed(void **state)
{
	struct harness *h = *state;
	uint32_t t[96];
	struct kvp_key_span img = {
		.first_token = 40, .n_tokens = 40, .key = "image-a", .key_len = 7};
	struct kvp_append_opts ao = {.size = sizeof(ao), .spans = &img, .n_spans = 1};
	struct kvp_match_opts mo = {.size = sizeof(mo), .spans = &img, .n_spans = 1};
	uint32_t slots_f[6], slots_g[6];
	struct kvp_lookup_query q = {.tokens = t, .n_tokens = 96};
	struct kvp_lookup_result res;
	kvp_session *s, *f, *g, *r;
	uint64_t got;
	kvp_client *c, *c2;
	kvp_pool *p, *p2;
	kvp_lease *l, *l2;

	harness_tokens(t, 96, 4, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->sock, &c2), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_pool_open(c2, MODEL, &layout, &p2), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append_opts(s, t, 64, &ao), 0);
	assert_int_equal(harness_write_session(p, s, 0, t, 64), 0);
	assert_int_equal(kvp_commit(s, 64), 0);
	assert_int_equal(kvp_match_prefix_opts(p, t, 64, &mo, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 64);
	assert_int_equal(kvp_lease_adopt(p2, kvp_lease_id(l), &l2), 0);

	/* Both continue past the prefix with the same tokens. */
	assert_int_equal(kvp_lease_fork(l, 64, &g), 0);
	assert_int_equal(kvp_lease_fork(l2, 64, &f), 0);
	assert_int_equal(kvp_append(g, t + 64, 32), 0);
	assert_int_equal(harness_write_session(p, g, 64, t + 64, 32), 0);
	assert_int_equal(kvp_commit(g, 32), 0);
	assert_int_equal(kvp_append(f, t + 64, 32), 0);
	assert_int_equal(harness_write_session(p2, f, 64, t + 64, 32), 0);
	assert_int_equal(kvp_commit(f, 32), 0);
	assert_int_equal(kvp_session_block_table(g, 0, 6, NULL, slots_g), 0);
	assert_int_equal(kvp_session_block_table(f, 0, 6, NULL, slots_f), 0);
	assert_memory_equal(slots_f, slots_g, sizeof(slots_f)); /* one set of pages */

	/* The forked session kept the image's span: its checkpoint, restored
	 * into an index that forgot everything, matches under the image and
	 * not under plain tokens (which would be another image's KV). */
	assert_int_equal(kvp_session_checkpoint(f, "adopt-keyed", NULL), 0);
	{
		struct kvp_purge_spec ps = {.flags = KVP_PURGE_POOL, .pool_id = kvp_pool_id(p)};
		struct kvp_purge_result pr;
		kvp_client *admin;

		assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
		assert_int_equal(kvp_admin_purge(admin, &ps, &pr), 0);
		kvp_disconnect(admin);
	}
	assert_int_equal(kvp_lookup(p, t, 96, &got), 0);
	assert_int_equal(got, 0);
	assert_int_equal(kvp_session_restore(p, "adopt-keyed", &r), 0);
	assert_int_equal(kvp_lookup(p, t, 96, &got), 0);
	assert_int_equal(got, 32); /* pages 0-1 lie before the image */
	q.spans = &img;
	q.n_spans = 1;
	assert_int_equal(kvp_lookup_batch(p, &q, 1, &res), 0);
	/* The fork at 64 cut the span there, as kvp_truncate would: pages
	 * 4-5 were hashed past it, so a query under the whole image stops
	 * at 64. */
	assert_int_equal(res.matched_tokens, 64);
	kvp_disconnect(c2);
	kvp_disconnect(c);
}

struct foreign {
	struct harness *h;
	uint64_t lease_id;
};

static int adopt_as_nobody(void *arg)
{
	struct foreign *f = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(prctl(PR_SET_PDEATHSIG, SIGKILL), 0);
	CHILD_CHECK_EQ(kvp_connect(f->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_lease_adopt(p, f->lease_id, &l), -ENOENT);
	CHILD_CHECK_EQ(l == NULL, 1);
	kvp_disconnect(c);
	return 0;
}

static void test_other_user(void **state)
{
	struct foreign f = {.h = *state};
	uint32_t t[64];
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	harness_tokens(t, 64, 3, 0);
	assert_int_equal(kvp_connect(f.h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(harness_commit_session(p, t, 64, &s), 0);
	assert_int_equal(kvp_match_prefix(p, t, 64, &l), 0);
	f.lease_id = kvp_lease_id(l);
	assert_int_equal(harness_run_child(adopt_as_nobody, &f), 0);
	assert_int_equal(harness_check_lease(l, p, t, 64), 0);
	kvp_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_handoff, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_long_and_limits, setup_small_messages,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_other_user, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_keyed, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("adopt", tests, NULL, NULL);
}
