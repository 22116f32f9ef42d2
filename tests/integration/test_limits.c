/* tests/integration/test_limits.c — limits on client-controlled resources.
 *
 * With small limits on the daemon's command line, each limit is reached
 * and refused with the errno kvpalace.h documents (-EDQUOT), the refusal
 * changes nothing, and freeing one unit makes room for exactly one more.
 * The limits are per user and per client: another client is unaffected.
 * SIGHUP applies limits changed in the configuration file.
 */
#include <errno.h>
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

#define MODEL "limits-model"

static int start(void **state)
{
	static const char *const extra[] = {
		"--max-pools-per-tenant",
		"2",
		"--max-sessions-per-pool",
		"3",
		"--max-leases-per-client",
		"4",
		"--max-session-tokens",
		"100",
		NULL,
	};

	return harness_setup_args(state, extra);
}

static void test_pools_per_user(void **state)
{
	struct harness *h = *state;
	kvp_client *c;
	kvp_pool *a, *b, *x, *again;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "limits-a", &harness_layout, &a), 0);
	assert_int_equal(kvp_pool_open(c, "limits-b", &harness_layout, &b), 0);
	assert_int_equal(kvp_pool_open(c, "limits-c", &harness_layout, &x), -EDQUOT);
	/* Opening an existing pool again is no new pool. */
	assert_int_equal(kvp_pool_open(c, "limits-a", &harness_layout, &again), 0);
	assert_int_equal(kvp_pool_id(again), kvp_pool_id(a));
	kvp_disconnect(c);
}

static void test_sessions_per_pool(void **state)
{
	struct harness *h = *state;
	kvp_client *c, *d;
	kvp_pool *p, *q;
	kvp_session *s[4];

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvp_session_create(p, &s[i]), 0);
	assert_int_equal(kvp_session_create(p, &s[3]), -EDQUOT);
	/* The limit is the pool's: another client of it is refused too. */
	assert_int_equal(kvp_connect(h->sock, &d), 0);
	assert_int_equal(kvp_pool_open(d, MODEL, &harness_layout, &q), 0);
	assert_int_equal(kvp_session_create(q, &s[3]), -EDQUOT);
	/* Closing one makes room for one. */
	assert_int_equal(kvp_session_close(s[1]), 0);
	assert_int_equal(kvp_session_create(q, &s[1]), 0);
	assert_int_equal(kvp_session_create(p, &s[3]), -EDQUOT);
	kvp_disconnect(d);
	kvp_disconnect(c);
}

static void test_leases_per_client(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[20];
	kvp_client *c, *d;
	kvp_pool *p, *q;
	kvp_session *s;
	kvp_lease *l[5], *m;

	harness_tokens(tokens, 20, 80, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 20, &s), 0);
	/* 20 tokens: one full page to match. */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvp_match_prefix(p, tokens, 20, &l[i]), 0);
		assert_int_equal(kvp_lease_tokens(l[i]), 16);
	}
	assert_int_equal(kvp_match_prefix(p, tokens, 20, &l[4]), -EDQUOT);
	/* Another client has its own allowance. */
	assert_int_equal(kvp_connect(h->sock, &d), 0);
	assert_int_equal(kvp_pool_open(d, MODEL, &harness_layout, &q), 0);
	assert_int_equal(kvp_match_prefix(q, tokens, 20, &m), 0);
	assert_int_equal(harness_check_lease(m, q, tokens, 16), 0);
	assert_int_equal(kvp_lease_release(m), 0);
	kvp_disconnect(d);
	/* Releasing one makes room for one; the others still read right. */
	assert_int_equal(kvp_lease_release(l[2]), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 20, &l[2]), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 20, &l[4]), -EDQUOT);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(harness_check_lease(l[i], p, tokens, 16), 0);
		assert_int_equal(kvp_lease_release(l[i]), 0);
	}
	kvp_disconnect(c);
}

static void test_session_tokens(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[101];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(tokens, 101, 81, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, 101), -EDQUOT);
	assert_int_equal(kvp_session_tokens(s), 0);
	assert_int_equal(kvp_append(s, tokens, 60), 0);
	assert_int_equal(kvp_append(s, tokens + 60, 41), -EDQUOT);
	assert_int_equal(kvp_session_tokens(s), 60);
	assert_int_equal(kvp_append(s, tokens + 60, 40), 0);
	assert_int_equal(kvp_session_tokens(s), 100);
	assert_int_equal(kvp_append(s, tokens + 100, 1), -EDQUOT);
	assert_int_equal(kvp_commit(s, 100), 0);
	kvp_disconnect(c);
}

/* SIGHUP re-reads the configuration file: a limit raised there applies to
 * the running daemon; a broken file keeps the old configuration. */
static char conf_path[128];

static void write_conf(const char *text)
{
	FILE *f = fopen(conf_path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int start_with_file(void **state)
{
	static const char *const extra[] = {"--config", conf_path, NULL};

	snprintf(conf_path, sizeof(conf_path), "/tmp/kvp-limits-%d.conf", (int)getpid());
	write_conf("max-sessions-per-pool = 1\n");
	return harness_setup_args(state, extra);
}

static int stop_with_file(void **state)
{
	unlink(conf_path);
	return harness_teardown(state);
}

/* Creates a session, retrying for up to 5 s while the daemon says -EDQUOT
 * (a reload is asynchronous). */
static int create_eventually(kvp_pool *p, kvp_session **s)
{
	int ret = -EDQUOT;

	for (int i = 0; i < 100 && ret == -EDQUOT; i++) {
		ret = kvp_session_create(p, s);
		if (ret == -EDQUOT)
			usleep(50 * 1000);
	}
	return ret;
}

static void test_sighup_reloads_limits(void **state)
{
	struct harness *h = *state;
	kvp_session *s[3];
	kvp_client *c;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s[0]), 0);
	assert_int_equal(kvp_session_create(p, &s[1]), -EDQUOT);
	/* A broken file: the old limit stays, the daemon keeps serving. */
	write_conf("max-sessions-per-pool = many\n");
	assert_int_equal(kill(h->pid, SIGHUP), 0);
	usleep(300 * 1000);
	assert_int_equal(kvp_session_create(p, &s[1]), -EDQUOT);
	assert_int_equal(kvp_ping(c), 0);
	/* A good one: the new limit applies without a restart. */
	write_conf("max-sessions-per-pool = 2\n");
	assert_int_equal(kill(h->pid, SIGHUP), 0);
	assert_int_equal(create_eventually(p, &s[1]), 0);
	assert_int_equal(kvp_session_create(p, &s[2]), -EDQUOT);
	kvp_disconnect(c);
}

/* Issue 14 item 3: one user's sessions together hold at most
 * max-tenant-tokens slots of daemon memory (a token's id and metadata, or
 * a page's slot and chain hash, about 20 bytes each; here 8,192). Forks
 * share their parent's tokens, so 40 forks of a 1,000-token session fit
 * where 8 copies would not. A fork that goes on with tokens of its own
 * gets its own copy of the last chunk of tokens, charged to the user:
 * before all 40 have, one is refused with -EDQUOT (the refusal changes
 * nothing), and closing a fork that had its own copy gives room back. */
static int start_tenant_tokens(void **state)
{
	static const char *const extra[] = {"--max-tenant-tokens", "8192", NULL};

	return harness_setup_args(state, extra);
}

#define TT_FORKS 40

static void test_tenant_tokens(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[1000], tail = 7;
	kvp_session *s, *f[TT_FORKS];
	int refused = -1;
	kvp_client *c;
	kvp_pool *p;

	harness_tokens(tokens, 1000, 82, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 1000, &s), 0);
	for (int i = 0; i < TT_FORKS; i++) {
		assert_int_equal(kvp_session_fork(s, 1000, &f[i]), 0);
		assert_int_equal(kvp_session_committed(f[i]), 1000);
	}
	for (int i = 0; i < TT_FORKS && refused < 0; i++) {
		int ret = kvp_append(f[i], &tail, 1);

		if (ret == -EDQUOT)
			refused = i;
		else
			assert_int_equal(ret, 0);
	}
	assert_true(refused > 0);
	assert_int_equal(kvp_session_tokens(f[refused]), 1000);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_session_close(f[0]), 0);
	assert_int_equal(kvp_append(f[refused], &tail, 1), 0);
	assert_int_equal(kvp_commit(f[refused], 1), 0);
	assert_int_equal(kvp_session_committed(f[refused]), 1001);
	kvp_disconnect(c);
}

#define T(f) cmocka_unit_test_setup_teardown(f, start, harness_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_pools_per_user),
		T(test_sessions_per_pool),
		T(test_leases_per_client),
		T(test_session_tokens),
		cmocka_unit_test_setup_teardown(test_sighup_reloads_limits, start_with_file,
						stop_with_file),
		cmocka_unit_test_setup_teardown(test_tenant_tokens, start_tenant_tokens,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("limits", tests, NULL, NULL);
}
