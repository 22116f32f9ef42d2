/* tests/integration/test_ctl.c — kvpalacectl against the admin socket.
 *
 * Runs the real binary ($KVPALACECTL) as a user would: `ping`, `stats`
 * and `stats --json` against a daemon where a client has opened a pool
 * and committed tokens; checks the exit status and that the output names
 * the pool and its numbers. `pools` and `sessions` (with --pool, and
 * --json) list what is cached: indexed and deduplicated pages, each
 * session's tokens, pages, shared pages and whether it is being written.
 * The socket also comes from $KVPALACE_ADMIN_SOCKET, and a socket where no
 * daemon listens is an error (exit 1), a bad command a usage error (exit 2).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "ctl-test-model"

static char out[1 << 16];

static int ctl6(char *env_entry, const char *a1, const char *a2, const char *a3, const char *a4,
		const char *a5, const char *a6)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[8] = {(char *)bin, (char *)a1, (char *)a2, (char *)a3,
			 (char *)a4,  (char *)a5, (char *)a6, NULL};
	char *env[2] = {env_entry, NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, env, out, sizeof(out));
}

static int ctl(char *env_entry, const char *a1, const char *a2, const char *a3, const char *a4)
{
	return ctl6(env_entry, a1, a2, a3, a4, NULL, NULL);
}

/* Fails unless out contains the text of fmt. */
static void expect_out(const char *what, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void expect_out(const char *what, const char *fmt, ...)
{
	char want[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(want, sizeof(want), fmt, ap);
	va_end(ap);
	if (!strstr(out, want))
		fail_msg("%s: no '%s' in:\n%s", what, want, out);
}

static void test_ctl(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char want[128], env_entry[160];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int ret;

	harness_tokens(tokens, 40, 60, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, 40), 0);
	assert_int_equal(kvp_commit(s, 40), 0);

	ret = ctl(NULL, "--socket", h->admin_sock, "ping", NULL);
	if (ret != 0)
		fail_msg("ping exited %d: %s", ret, out);

	ret = ctl(NULL, "--socket", h->admin_sock, "stats", NULL);
	if (ret != 0)
		fail_msg("stats exited %d: %s", ret, out);
	assert_non_null(strstr(out, MODEL));

	ret = ctl(NULL, "--socket", h->admin_sock, "stats", "--json");
	if (ret != 0)
		fail_msg("stats --json exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	assert_non_null(strstr(out, "\"" MODEL "\""));
	snprintf(want, sizeof(want), "\"pool_id\":%" PRIu64, kvp_pool_id(p));
	if (!strstr(out, want))
		fail_msg("no %s in %s", want, out);
	/* 40 tokens of 16 per page: 3 pages used. */
	if (!strstr(out, "\"used_pages\":3"))
		fail_msg("no used_pages 3 in %s", out);
	if (!strstr(out, "\"committed_tokens\":40"))
		fail_msg("no committed_tokens 40 in %s", out);

	/* The socket from the environment. */
	snprintf(env_entry, sizeof(env_entry), "KVPALACE_ADMIN_SOCKET=%s", h->admin_sock);
	ret = ctl(env_entry, "stats", NULL, NULL, NULL);
	if (ret != 0)
		fail_msg("stats with $KVPALACE_ADMIN_SOCKET exited %d: %s", ret, out);
	assert_non_null(strstr(out, MODEL));

	/* No daemon there: exit 1. A bad command: exit 2. */
	snprintf(env_entry, sizeof(env_entry), "%s/nobody-listens.sock", h->dir);
	assert_int_equal(ctl(NULL, "--socket", env_entry, "ping", NULL), 1);
	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, "frobnicate", NULL), 2);
	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, NULL, NULL), 2);

	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

static void test_ctl_pools_sessions(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char pool_id[32], pool_id_num[32];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s1, *s2, *s3;
	int ret;

	harness_tokens(tokens, 40, 61, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, MODEL "-other", &harness_layout, &q), 0);
	/* s1: 40 committed (2 full pages indexed); s2: the same 40, 20 of
	 * them committed (its first page deduplicated), still writing. */
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s1), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, tokens, 40), 0);
	assert_int_equal(harness_pkv_write_session(p, s2, tokens, 0, 40), 0);
	assert_int_equal(kvp_commit(s2, 20), 0);
	assert_int_equal(kvp_session_create(q, &s3), 0);
	snprintf(pool_id, sizeof(pool_id), "%" PRIu64, kvp_pool_id(p));
	snprintf(pool_id_num, sizeof(pool_id_num), "%" PRIu64, kvp_pool_id(p));

	ret = ctl(NULL, "--socket", h->admin_sock, "pools", NULL);
	if (ret != 0)
		fail_msg("pools exited %d: %s", ret, out);
	expect_out("pools", "%s", MODEL);
	expect_out("pools", "%s", "INDEXED");
	ret = ctl(NULL, "--socket", h->admin_sock, "--json", "pools");
	if (ret != 0)
		fail_msg("pools --json exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	expect_out("pools --json", "\"pool_id\":%s", pool_id);
	expect_out("pools --json", "\"indexed_pages\":%d", 2);
	expect_out("pools --json", "\"dedup_pages\":%d", 1);
	expect_out("pools --json", "\"n_sessions\":%d", 2);
	expect_out("pools --json", "\"used_pages\":%d", 5);

	ret = ctl(NULL, "--socket", h->admin_sock, "sessions", NULL);
	if (ret != 0)
		fail_msg("sessions exited %d: %s", ret, out);
	expect_out("sessions", "%" PRIu64 " ", kvp_session_id(s1));
	expect_out("sessions", "%" PRIu64 " ", kvp_session_id(s3));
	expect_out("sessions", "%s", "yes");
	ret = ctl6(NULL, "--socket", h->admin_sock, "--json", "sessions", "--pool", pool_id);
	if (ret != 0)
		fail_msg("sessions --json --pool exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	expect_out("sessions --json", "\"session_id\":%" PRIu64, kvp_session_id(s1));
	expect_out("sessions --json", "\"session_id\":%" PRIu64, kvp_session_id(s2));
	expect_out("sessions --json", "\"committed_tokens\":%d", 20);
	expect_out("sessions --json", "\"shared_pages\":%d", 2);
	expect_out("sessions --json", "\"writing\":%s", "true");
	snprintf(pool_id, sizeof(pool_id), "\"session_id\":%" PRIu64, kvp_session_id(s3));
	if (strstr(out, pool_id))
		fail_msg("sessions --pool lists a session of another pool: %s", out);

	/* status and metrics read the same counters. */
	ret = ctl(NULL, "--socket", h->admin_sock, "status", NULL);
	if (ret != 0)
		fail_msg("status exited %d: %s", ret, out);
	expect_out("status", "%s", "host tier: 2 pools, 5 of ");
	expect_out("status", "%s", "gpu tier: no");
	ret = ctl(NULL, "--socket", h->admin_sock, "--json", "status");
	if (ret != 0)
		fail_msg("status --json exited %d: %s", ret, out);
	expect_out("status --json", "\"pools\":%d,", 2);
	expect_out("status --json", "\"host_used_pages\":%d,", 5);
	ret = ctl(NULL, "--socket", h->admin_sock, "metrics", NULL);
	if (ret != 0)
		fail_msg("metrics exited %d: %s", ret, out);
	expect_out("metrics", "%s", "# TYPE kvpalace_requests_total counter\n");
	expect_out("metrics", "%s", "\nkvpalace_dedup_pages_total 1\n");
	expect_out("metrics",
		   "kvpalace_pool_indexed_pages{pool=\"%s\",uid=\"%u\",model=\"%s\"} 2\n",
		   pool_id_num, (unsigned)getuid(), MODEL);
	expect_out("metrics", "kvpalace_pool_sessions{pool=\"%s\",uid=\"%u\",model=\"%s\"} 2\n",
		   pool_id_num, (unsigned)getuid(), MODEL);

	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, "sessions", "--pool"), 2);
	assert_int_equal(ctl6(NULL, "--socket", h->admin_sock, "sessions", "--pool", "0", NULL), 2);
	assert_int_equal(ctl6(NULL, "--socket", h->admin_sock, "stats", "--pool", "1", NULL), 2);
	kvp_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ctl, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_ctl_pools_sessions, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("ctl", tests, NULL, NULL);
}
