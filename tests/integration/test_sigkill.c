/* tests/integration/test_sigkill.c — a client killed with SIGKILL gives
 * everything back.
 *
 * The child holds uncommitted reservations (appends it never commits) and
 * read leases on pages another process committed; the parent sees them in
 * Stats, kills the child with SIGKILL and, once the daemon has noticed the
 * connection close, sees the pool's free page count back where it was
 * before the child started, with no reserved and no leased pages — and the
 * committed data the child was reading intact. Also: a lease outliving its
 * session (its pages then stay in the prefix index, not free), a client
 * killed between a partial commit and the rest (its sessions die with it,
 * their full pages stay indexed), a pool handle closed with
 * leases open, and the daemon stopping under a client (which then gets
 * errors, not hangs or stale pointers). Matches are whole pages: the
 * committed 100 tokens match 96.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	    "sigkill-model"
#define N_COMMITTED 100 /* the parent's committed session: 7 pages, 6 of them full */
#define N_MATCHED   96
#define N_RESERVED  300 /* the child's reservation: 19 pages */
#define N_RESERVED2 40	/* and a second one: 3 pages */

struct kill_ctx {
	struct harness *h;
	uint32_t committed[N_COMMITTED];
	int ready_fd;
};

static int victim(void *arg)
{
	struct kill_ctx *k = arg;
	uint32_t tokens[N_RESERVED];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s1, *s2;
	kvp_lease *l1, *l2;
	char ok = 'R';

	harness_tokens(tokens, N_RESERVED, 21, 0);
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	/* Two read leases on the parent's full pages (one of them on the
	 * first page only). */
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->committed, N_COMMITTED, &l1), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l1), N_MATCHED);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->committed, 20, &l2), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l2), 16);
	/* Two sessions with reservations it never commits; it even starts
	 * writing into them. */
	CHILD_CHECK_EQ(kvp_session_create(p, &s1), 0);
	CHILD_CHECK_EQ(kvp_append(s1, tokens, N_RESERVED), 0);
	CHILD_CHECK_EQ(harness_write_session(p, s1, 0, tokens, 10), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s2), 0);
	CHILD_CHECK_EQ(kvp_append(s2, tokens, N_RESERVED2), 0);
	CHILD_CHECK(write(k->ready_fd, &ok, 1) == 1);
	for (;;)
		pause();
}

/* A 1 MiB arena: 128 pages of the harness layout. */
static int start(void **state)
{
	static const char *const extra[] = {"--disk-pool-size", "0", "--host-pool-size", "1M",
					    NULL};

	return harness_setup_args(state, extra);
}

/* Waits (bounded) until the daemon has closed the killed connection: the
 * number of open connections falls back to `want`. */
static void wait_connections(kvp_client *c, uint64_t want)
{
	const struct timespec ts = {.tv_nsec = 10 * 1000 * 1000};

	for (int i = 0; i < 2000; i++) {
		struct kvp_stats *st;
		uint64_t n;

		assert_int_equal(kvp_stats(c, &st), 0);
		n = st->connections;
		kvp_stats_free(st);
		if (n == want)
			return;
		nanosleep(&ts, NULL);
	}
	fail_msg("the daemon never noticed the killed client");
}

static void run_victim(struct kill_ctx *k, pid_t *ret_pid)
{
	int p[2];
	char b;

	assert_int_equal(pipe(p), 0);
	k->ready_fd = p[1];
	*ret_pid = harness_fork(victim, k);
	assert_true(*ret_pid > 0);
	close(p[1]);
	/* The child reports readiness, or fails and closes the pipe. */
	assert_int_equal(read(p[0], &b, 1), 1);
	close(p[0]);
}

static void test_sigkill_returns_pages(void **state)
{
	struct kill_ctx *k = calloc(1, sizeof(*k));
	struct kvp_pool_stats ps;
	uint64_t conns;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	uint64_t conns_before;
	uint32_t free_before, n_pages;
	pid_t pid;

	assert_non_null(k);
	k->h = *state;
	harness_tokens(k->committed, N_COMMITTED, 20, 0);

	/* The parent commits a session the child will read. */
	assert_int_equal(kvp_connect(k->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	n_pages = kvp_pool_n_pages(p);
	assert_int_equal(harness_commit_session(p, k->committed, N_COMMITTED, &s), 0);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, &conns_before), 0);
	free_before = ps.free_pages;
	assert_int_equal(n_pages, 128);
	assert_int_equal(free_before, n_pages - 7);
	assert_int_equal(ps.reserved_pages, 0);
	assert_int_equal(ps.leased_pages, 0);

	run_victim(k, &pid);

	/* While it lives, its reservations and leases show. */
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, &conns), 0);
	assert_int_equal(ps.free_pages, free_before - 19 - 3);
	assert_int_equal(ps.reserved_pages, 19 + 3);
	assert_int_equal(ps.leased_pages, 6);
	assert_int_equal(conns, conns_before + 1);

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(harness_wait(pid, 30), 128 + SIGKILL);
	wait_connections(c, conns_before);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, &conns), 0);
	assert_int_equal(ps.free_pages, free_before);
	assert_int_equal(ps.reserved_pages, 0);
	assert_int_equal(ps.leased_pages, 0);
	assert_int_equal(ps.n_pages, n_pages);

	/* The committed data it was reading is intact and still served. */
	assert_int_equal(kvp_match_prefix(p, k->committed, N_COMMITTED, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), N_MATCHED);
	assert_int_equal(harness_check_lease(l, p, k->committed, N_MATCHED), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	/* And the pages came back usable: the whole pool can be reserved. */
	{
		size_t n = (size_t)free_before * harness_layout.block_tokens;
		uint32_t *more = calloc(n, sizeof(uint32_t));
		kvp_session *s2;

		assert_non_null(more);
		harness_tokens(more, n, 22, 0);
		assert_int_equal(kvp_session_create(p, &s2), 0);
		assert_int_equal(kvp_append(s2, more, n), 0);
		assert_int_equal(kvp_append(s2, more, 1), -ENOSPC);
		assert_int_equal(kvp_session_close(s2), 0);
		free(more);
	}
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
	free(k);
}

/* The writer closes its session while the killed child still leases its
 * pages: they stay pinned until the child dies; then the partial page the
 * session alone held is free already and the six full pages are the prefix
 * index's (matchable, evictable), nothing else. */
static void test_sigkill_lease_outlives_session(void **state)
{
	struct kill_ctx *k = calloc(1, sizeof(*k));
	struct harness_pool_info pi;
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	uint64_t conns_before;
	uint32_t n_pages;
	pid_t pid;

	assert_non_null(k);
	k->h = *state;
	harness_tokens(k->committed, N_COMMITTED, 23, 0);
	assert_int_equal(kvp_connect(k->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	n_pages = kvp_pool_n_pages(p);
	assert_int_equal(harness_commit_session(p, k->committed, N_COMMITTED, &s), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, &conns_before), 0);

	run_victim(k, &pid);
	assert_int_equal(kvp_session_close(s), 0);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.leased_pages, 6);
	assert_int_equal(ps.free_pages, n_pages - 6 - 19 - 3);

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(harness_wait(pid, 30), 128 + SIGKILL);
	wait_connections(c, conns_before);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.free_pages, n_pages - 6);
	assert_int_equal(ps.reserved_pages, 0);
	assert_int_equal(ps.leased_pages, 0);
	/* The child's two sessions died with it. */
	assert_int_equal(ps.n_sessions, 0);
	assert_int_equal(harness_pool_info(k->h, kvp_pool_id(p), &pi), 0);
	assert_int_equal(pi.indexed_pages, 6);
	assert_int_equal(pi.evictable_pages, 1);
	{
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, k->committed, N_COMMITTED, &l), 0);
		assert_int_equal(kvp_lease_tokens(l), N_MATCHED);
		assert_int_equal(harness_check_lease(l, p, k->committed, N_MATCHED), 0);
		assert_int_equal(kvp_lease_release(l), 0);
	}
	kvp_disconnect(c);
	free(k);
}

struct partial_ctx {
	struct harness *h;
	uint32_t tokens[40];
	int ready_fd;
};

/* Commits 20 of 40 reserved tokens, then waits to be killed. */
static int partial_victim(void *arg)
{
	struct partial_ctx *k = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	char ok = 'R';

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, k->tokens, 40), 0);
	CHILD_CHECK_EQ(harness_write_session(p, s, 0, k->tokens, 40), 0);
	CHILD_CHECK_EQ(kvp_commit(s, 20), 0);
	CHILD_CHECK(write(k->ready_fd, &ok, 1) == 1);
	for (;;)
		pause();
}

/* A client killed between a partial commit and the rest: its session dies
 * with it, the committed full page stays in the prefix index, every other
 * page comes back, and another process reads exactly the committed full
 * page. */
static void test_sigkill_after_partial_commit(void **state)
{
	struct partial_ctx k = {.h = *state};
	struct kvp_pool_stats ps;
	uint64_t conns_before;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	int pfd[2];
	pid_t pid;
	char b;

	harness_tokens(k.tokens, 40, 24, 0);
	assert_int_equal(kvp_connect(k.h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, &conns_before), 0);

	assert_int_equal(pipe(pfd), 0);
	k.ready_fd = pfd[1];
	pid = harness_fork(partial_victim, &k);
	assert_true(pid > 0);
	close(pfd[1]);
	assert_int_equal(read(pfd[0], &b, 1), 1);
	close(pfd[0]);

	/* Uncommitted tokens are not visible to others, nor is the
	 * committed part of a page that is not full. */
	assert_int_equal(kvp_match_prefix(p, k.tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 16);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.free_pages, kvp_pool_n_pages(p) - 3);
	assert_int_equal(ps.reserved_pages, 1);

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(harness_wait(pid, 30), 128 + SIGKILL);
	wait_connections(c, conns_before);

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.free_pages, kvp_pool_n_pages(p) - 1);
	assert_int_equal(ps.reserved_pages, 0);
	assert_int_equal(ps.leased_pages, 0);
	assert_int_equal(ps.n_sessions, 0);
	assert_int_equal(kvp_match_prefix(p, k.tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 16);
	assert_int_equal(harness_check_lease(l, p, k.tokens, 16), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
}

/* The daemon stops while a client holds a lease and a reservation: the
 * daemon exits cleanly, and the client gets errors, not hangs, and no
 * more pointers into pages that are no longer lent to it. */
static void test_daemon_stops_under_client(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *s2;
	kvp_lease *l;
	int ret;

	harness_tokens(tokens, 40, 25, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, 40), 0);
	assert_int_equal(harness_write_session(p, s, 0, tokens, 40), 0);
	assert_int_equal(kvp_commit(s, 20), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 20, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 16);
	assert_non_null(kvp_lease_kv(l, 0, 0, 0, 0));

	assert_int_equal(harness_stop(h), 0);

	ret = kvp_ping(c);
	if (ret != -ECONNRESET && ret != -EPIPE && ret != -ENOTCONN)
		fail_msg("ping after the daemon stopped: %d", ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	assert_int_equal(kvp_commit(s, 20), -ENOTCONN);
	assert_int_equal(kvp_append(s, tokens, 1), -ENOTCONN);
	assert_int_equal(kvp_session_create(p, &s2), -ENOTCONN);
	assert_null(kvp_lease_kv(l, 0, 0, 0, 0));
	assert_null(kvp_session_kv(s, 30, 0, 0, 0));
	kvp_disconnect(c);
}

/* Closing a pool handle gives back the leases opened through it (their
 * pointers die with the mapping); the client stays connected. */
static void test_pool_close_releases_leases(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s;
	kvp_lease *l1, *l2;

	harness_tokens(tokens, 40, 26, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &q), 0);
	assert_int_equal(kvp_match_prefix(q, tokens, 40, &l1), 0);
	assert_int_equal(kvp_lease_tokens(l1), 32);
	assert_int_equal(kvp_match_prefix(q, tokens, 20, &l2), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.leased_pages, 2);

	kvp_pool_close(q);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.leased_pages, 0);
	assert_int_equal(ps.free_pages, kvp_pool_n_pages(p) - 3);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sigkill_returns_pages, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_sigkill_after_partial_commit, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_daemon_stops_under_client, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_pool_close_releases_leases, start,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_sigkill_lease_outlives_session, start,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("sigkill", tests, NULL, NULL);
}
