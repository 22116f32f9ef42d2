/* tests/integration/test_ctl.c — kvpalacectl against the admin socket.
 *
 * Runs the real binary ($KVPALACECTL) as a user would: `ping`, `stats`
 * and `stats --json` against a daemon where a client has opened a pool
 * and committed tokens; checks the exit status and that the output names
 * the pool and its numbers. The socket also comes from
 * $KVPALACE_ADMIN_SOCKET, and a socket where no daemon listens is an
 * error (exit 1), a bad command a usage error (exit 2).
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

static int ctl(char *env_entry, const char *a1, const char *a2, const char *a3, const char *a4)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[6] = {(char *)bin, (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
	char *env[2] = {env_entry, NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, env, out, sizeof(out));
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ctl, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("ctl", tests, NULL, NULL);
}
