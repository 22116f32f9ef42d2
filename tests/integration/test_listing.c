/* tests/integration/test_listing.c — Stats' page counters and paged
 * ListSessions, as a user checks them.
 *
 *  - counters: Stats keeps a pool's reserved and leased pages as counters
 *    (not walks). After a mixed workload of several processes (sessions
 *    created, committed, forked, truncated, closed; read leases held;
 *    uncommitted tokens left reserved) and after one of them is killed in
 *    the middle of a write, both equal what a walk finds: reserved pages
 *    the sum over the listed sessions of pages holding only uncommitted
 *    tokens, leased pages the distinct pages the live leases pin. When
 *    everyone has gone, both are 0.
 *  - paging: 10,000 sessions paged through with a small limit while
 *    sessions are created and closed between pages (a mass close among
 *    them): ids strictly increase across pages, every session that existed
 *    throughout is listed exactly once, nothing never created is listed.
 *  - hostile limits: 0 is refused as invalid (the connection stays), a
 *    huge one is capped at KVP_LIST_SESSIONS_MAX with `more` set, and the
 *    library refuses 0 itself.
 * Tenants (a user lists only its own sessions) are test_isolation's.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	 "listing-model"
#define BT	 16 /* harness_layout's block_tokens */
#define WORKERS	 4
#define LEASED_T 48 /* tokens each worker holds two leases on: 3 pages */
#define ST(x)	 KVPALACE__V1__STATUS__STATUS_##x

/* ---- counters after a mixed workload ------------------------------------ */

struct work {
	struct harness *h;
	int idx;
	int ready[2]; /* worker → parent: set up */
	int go[2];    /* parent → workers: exit now */
};

/* Creates, commits, forks, truncates and closes sessions; then holds two
 * read leases on a prefix of its own and leaves uncommitted tokens in
 * two sessions (one with a committed part), says so, and waits. */
static int worker(void *arg)
{
	struct work *w = arg;
	uint32_t tok[200], own[LEASED_T];
	kvp_session *s, *f, *keep, *writing, *writing2;
	kvp_lease *l1, *l2;
	kvp_client *c;
	kvp_pool *p;
	char byte;

	/* Half the tokens shared by every worker (dedup), then its own. */
	harness_tokens(tok, 100, 70, 0);
	harness_tokens(tok + 100, 100, 80 + (uint32_t)w->idx, 100);
	harness_tokens(own, LEASED_T, 90 + (uint32_t)w->idx, 0);
	CHILD_CHECK_EQ(kvp_connect(w->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	for (int j = 0; j < 12; j++) {
		size_t n = 40 + (size_t)j * 13;

		CHILD_CHECK_EQ(harness_pkv_commit_session(p, tok, n, &s), 0);
		CHILD_CHECK_EQ(kvp_session_fork(s, n / 2, &f), 0);
		CHILD_CHECK_EQ(kvp_truncate(f, n / 3), 0);
		/* The fork grows again: some reserved, then committed. */
		CHILD_CHECK_EQ(kvp_append(f, tok + n / 3, 20), 0);
		CHILD_CHECK_EQ(harness_pkv_write_session(p, f, tok, n / 3, n / 3 + 20), 0);
		CHILD_CHECK_EQ(kvp_commit(f, 20), 0);
		CHILD_CHECK_EQ(kvp_truncate(s, n - 7), 0);
		if (j % 3 == 0)
			CHILD_CHECK_EQ(kvp_session_close(s), 0);
		if (j % 2 == 0)
			CHILD_CHECK_EQ(kvp_session_close(f), 0);
	}
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, own, LEASED_T, &keep), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, own, LEASED_T, &l1), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, own, LEASED_T, &l2), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l1), LEASED_T);
	CHILD_CHECK_EQ(kvp_lease_tokens(l2), LEASED_T);
	/* Mid-write: 50 tokens (4 pages) reserved, none committed; and 30
	 * committed then 40 more reserved (a page and a half). */
	CHILD_CHECK_EQ(kvp_session_create(p, &writing), 0);
	CHILD_CHECK_EQ(kvp_append(writing, tok, 50), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &writing2), 0);
	CHILD_CHECK_EQ(kvp_append(writing2, tok, 30), 0);
	CHILD_CHECK_EQ(kvp_commit(writing2, 30), 0);
	CHILD_CHECK_EQ(kvp_append(writing2, tok + 30, 40), 0);
	CHILD_CHECK_EQ(write(w->ready[1], "r", 1), 1);
	CHILD_CHECK_EQ(read(w->go[0], &byte, 1), 1);
	kvp_disconnect(c);
	return 0;
}

/* The pool's reserved pages as a walk over the listed sessions finds
 * them: pages beyond those holding committed tokens. */
static uint32_t walk_reserved(kvp_client *adm, uint64_t pool_id, size_t *ret_sessions)
{
	struct kvp_session_info *si;
	uint32_t sum = 0;
	size_t n;

	assert_int_equal(kvp_list_sessions(adm, pool_id, &si, &n), 0);
	for (size_t i = 0; i < n; i++)
		sum += si[i].n_pages - (uint32_t)((si[i].committed_tokens + BT - 1) / BT);
	free(si);
	*ret_sessions = n;
	return sum;
}

/* Stats' counters against the walk, with `leased` pages pinned and
 * `reserved` expected (checked against the walk too). */
static void check_counters(struct harness *h, kvp_client *adm, uint64_t pool_id, uint32_t reserved,
			   uint32_t leased)
{
	struct harness_pool_info info;
	size_t n_sessions;
	uint32_t walked = walk_reserved(adm, pool_id, &n_sessions);

	assert_int_equal(harness_pool_info(h, pool_id, &info), 0);
	assert_int_equal(info.reserved_pages, walked);
	assert_int_equal(info.reserved_pages, reserved);
	assert_int_equal(info.leased_pages, leased);
	assert_int_equal(info.n_sessions, n_sessions);
}

static void test_counters_after_mixed_workload(void **state)
{
	struct harness *h = *state;
	struct work w[WORKERS];
	int ready[2], go[2];
	pid_t pid[WORKERS];
	kvp_client *adm, *c;
	kvp_pool *p;
	struct harness_pool_info info;
	uint64_t pool_id, conns;
	struct raw r;
	char byte;

	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_hello(&r), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	pool_id = kvp_pool_id(p);
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	for (int i = 0; i < WORKERS; i++) {
		w[i] = (struct work){.h = h, .idx = i};
		memcpy(w[i].ready, ready, sizeof(ready));
		memcpy(w[i].go, go, sizeof(go));
		pid[i] = harness_fork(worker, &w[i]);
		assert_true(pid[i] > 0);
	}
	/* Only the workers hold the write end now: one that fails before it
	 * is ready ends the wait instead of hanging it. */
	close(ready[1]);
	for (int i = 0; i < WORKERS; i++)
		assert_int_equal(read(ready[0], &byte, 1), 1);
	/* Each worker: 4 + 3 pages reserved, 3 pages leased twice. */
	check_counters(h, adm, pool_id, WORKERS * 7, WORKERS * 3);
	assert_int_equal(raw_pool_info(&r, pool_id, &info), 0);
	conns = info.connections;

	/* One is killed in the middle of its writes: its reservations are
	 * rolled back, its leases released, its sessions closed. */
	assert_int_equal(kill(pid[0], SIGKILL), 0);
	assert_int_equal(harness_wait(pid[0], 30), 128 + SIGKILL);
	assert_int_equal(raw_wait_connections(&r, conns - 1), 0);
	check_counters(h, adm, pool_id, (WORKERS - 1) * 7, (WORKERS - 1) * 3);

	for (int i = 1; i < WORKERS; i++)
		assert_int_equal(write(go[1], "g", 1), 1);
	for (int i = 1; i < WORKERS; i++)
		assert_int_equal(harness_wait(pid[i], 60), 0);
	assert_int_equal(raw_wait_connections(&r, conns - WORKERS), 0);
	check_counters(h, adm, pool_id, 0, 0);
	raw_close(&r);
	kvp_disconnect(adm);
	kvp_disconnect(c);
	close(ready[0]);
	close(go[0]);
	close(go[1]);
}

/* ---- paging while sessions come and go ---------------------------------- */

#define N_SESSIONS 10000
#define PAGE	   257

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static int has_id(const uint64_t *sorted, size_t n, uint64_t id)
{
	return bsearch(&id, sorted, n, sizeof(id), cmp_u64) != NULL;
}

static void test_paging_while_changing(void **state)
{
	struct harness *h = *state;
	size_t cap = N_SESSIONS + 4096, n_s = 0, n_created = 0, n_closed = 0, n_listed = 0;
	kvp_session **s = calloc(cap, sizeof(*s));
	uint64_t *initial = calloc(N_SESSIONS, sizeof(uint64_t));
	uint64_t *created = calloc(cap, sizeof(uint64_t));
	uint64_t *closed = calloc(cap, sizeof(uint64_t));
	uint64_t *listed = calloc(2 * cap, sizeof(uint64_t));
	uint64_t after = 0;
	unsigned int seed = 17;
	kvp_client *c, *lc;
	kvp_pool *p;
	int more = 1, pages = 0;

	assert_non_null(s);
	assert_non_null(initial);
	assert_non_null(created);
	assert_non_null(closed);
	assert_non_null(listed);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_connect(h->sock, &lc), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	for (size_t i = 0; i < N_SESSIONS; i++) {
		assert_int_equal(kvp_session_create(p, &s[n_s]), 0);
		initial[i] = kvp_session_id(s[n_s++]);
	}
	while (more) {
		struct kvp_session_info *si;
		size_t n;

		assert_int_equal(kvp_list_sessions_page(lc, 0, after, PAGE, &si, &n, &more), 0);
		assert_true(n <= PAGE);
		assert_true(n > 0 || !more);
		for (size_t i = 0; i < n; i++) {
			assert_true(si[i].session_id > after);
			after = si[i].session_id;
			listed[n_listed++] = after;
		}
		free(si);
		pages++;
		/* Between pages: close a few anywhere, create a few; once, close
		 * more than half of everything (the daemon squeezes its holes
		 * out in the middle of the listing). */
		for (int k = 0; k < (pages == 10 ? 6000 : 4) && n_s > 1; k++) {
			size_t at = (size_t)rand_r(&seed) % n_s;

			closed[n_closed++] = kvp_session_id(s[at]);
			assert_int_equal(kvp_session_close(s[at]), 0);
			s[at] = s[--n_s];
		}
		for (int k = 0; k < 3 && n_s < cap; k++) {
			assert_int_equal(kvp_session_create(p, &s[n_s]), 0);
			created[n_created++] = kvp_session_id(s[n_s++]);
		}
		assert_true(pages < 1000);
	}
	assert_true(pages >= N_SESSIONS / PAGE / 2);
	/* Strictly increasing, so no duplicates. */
	for (size_t i = 1; i < n_listed; i++)
		assert_true(listed[i] > listed[i - 1]);
	qsort(closed, n_closed, sizeof(*closed), cmp_u64);
	qsort(created, n_created, sizeof(*created), cmp_u64);
	/* Every session that lived throughout: listed (exactly once, as the
	 * order shows). */
	for (size_t i = 0; i < N_SESSIONS; i++)
		if (!has_id(closed, n_closed, initial[i]) && !has_id(listed, n_listed, initial[i]))
			fail_msg("session %llu existed throughout and was not listed",
				 (unsigned long long)initial[i]);
	/* Nothing that was never made. */
	qsort(initial, N_SESSIONS, sizeof(*initial), cmp_u64);
	for (size_t i = 0; i < n_listed; i++)
		if (!has_id(initial, N_SESSIONS, listed[i]) &&
		    !has_id(created, n_created, listed[i]))
			fail_msg("session %llu listed but never created",
				 (unsigned long long)listed[i]);
	kvp_disconnect(lc);
	kvp_disconnect(c);
	free(s);
	free(initial);
	free(created);
	free(closed);
	free(listed);
}

/* ---- hostile limits ------------------------------------------------------ */

static void test_hostile_limits(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__ListSessionsRequest ls;
	Kvpalace__V1__Response *resp;
	struct kvp_session_info *si = NULL;
	uint64_t pool_id, sid, first = 0;
	kvp_client *c;
	struct raw r;
	size_t n;
	int more;

	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	for (uint32_t i = 0; i < KVP_LIST_SESSIONS_MAX + 100; i++) {
		assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);
		if (!first)
			first = sid;
	}
	/* 0: refused, clearly, and the connection serves on. */
	raw_req_list_sessions(&req, &ls, pool_id);
	ls.has_limit = 1;
	ls.limit = 0;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(INVALID));
	assert_non_null(resp->error);
	assert_non_null(strstr(resp->error, "limit"));
	/* Huge: capped, with more to come. */
	raw_req_list_sessions(&req, &ls, pool_id);
	ls.has_limit = 1;
	ls.limit = UINT32_MAX;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_true(resp->list_sessions->n_sessions > 0);
	assert_true(resp->list_sessions->n_sessions <= KVP_LIST_SESSIONS_MAX);
	assert_true(resp->list_sessions->more);
	assert_int_equal(resp->list_sessions->sessions[0]->session_id, first);
	/* 1: one, and more. No limit: the cap too. */
	raw_req_list_sessions(&req, &ls, pool_id);
	ls.has_limit = 1;
	ls.limit = 1;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->list_sessions->n_sessions, 1);
	assert_true(resp->list_sessions->more);
	raw_req_list_sessions(&req, &ls, pool_id);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_true(resp->list_sessions->n_sessions <= KVP_LIST_SESSIONS_MAX);
	assert_true(resp->list_sessions->more);
	/* The last page: exactly what is left, no more. */
	raw_req_list_sessions(&req, &ls, pool_id);
	ls.has_limit = 1;
	ls.limit = 1000;
	ls.has_after_id = 1;
	ls.after_id = sid - 1;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->list_sessions->n_sessions, 1);
	assert_int_equal(resp->list_sessions->sessions[0]->session_id, sid);
	assert_false(resp->list_sessions->more);

	/* The library refuses 0 before asking. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_list_sessions_page(c, 0, 0, 0, &si, &n, &more), -EINVAL);
	assert_int_equal(kvp_list_sessions_page(c, 0, 0, UINT32_MAX, &si, &n, &more), 0);
	assert_true(n <= KVP_LIST_SESSIONS_MAX);
	assert_true(more);
	free(si);
	kvp_disconnect(c);
	raw_close(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_counters_after_mixed_workload, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_paging_while_changing, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_hostile_limits, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("listing", tests, NULL, NULL);
}
