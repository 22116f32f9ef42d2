/* tests/unit/test_listen.c — taking sockets from systemd
 * (listen_activated) and the STATUS= summary line (notify_format_status).
 *
 * The socket-activation protocol is emulated in-process: the test places
 * sockets at fd 3, 4, … and sets $LISTEN_PID to itself, $LISTEN_FDS and
 * $LISTEN_FDNAMES, as systemd does before exec.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <systemd/sd-daemon.h>

#include "listen.h"
#include "notify.h"

/* A listening socket of type type (unbound: autobind to an abstract
 * address) placed at fd target. */
static void place(int type, int listening, int target)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, type, 0);

	assert_true(fd >= 0);
	if (listening) {
		assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof(sa_family_t)), 0);
		assert_int_equal(listen(fd, 4), 0);
	}
	if (fd != target) {
		assert_int_equal(dup2(fd, target), target);
		close(fd);
	}
}

static void set_env(int n, const char *names)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%d", (int)getpid());
	setenv("LISTEN_PID", buf, 1);
	snprintf(buf, sizeof(buf), "%d", n);
	setenv("LISTEN_FDS", buf, 1);
	if (names)
		setenv("LISTEN_FDNAMES", names, 1);
	else
		unsetenv("LISTEN_FDNAMES");
}

static int is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void test_not_activated(void **state)
{
	struct listen_activated a;

	(void)state;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	assert_int_equal(listen_activated(&a), 0);
	assert_int_equal(a.client, -1);
	assert_int_equal(a.admin, -1);
}

static void test_named_pair(void **state)
{
	struct listen_activated a;

	(void)state;
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START);
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START + 1);
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START + 2);
	set_env(3, "admin:client:metrics");
	assert_int_equal(listen_activated(&a), 2);
	assert_int_equal(a.admin, SD_LISTEN_FDS_START);
	assert_int_equal(a.client, SD_LISTEN_FDS_START + 1);
	/* Close-on-exec, and the unknown name's fd closed. */
	assert_int_equal(fcntl(a.client, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	assert_int_equal(fcntl(a.admin, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	assert_false(is_open(SD_LISTEN_FDS_START + 2));
	/* The variables are gone: children do not inherit them. */
	assert_null(getenv("LISTEN_FDS"));
	assert_null(getenv("LISTEN_FDNAMES"));
	close(a.client);
	close(a.admin);
}

static void test_single_unnamed_is_client(void **state)
{
	struct listen_activated a;

	(void)state;
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START);
	set_env(1, NULL);
	assert_int_equal(listen_activated(&a), 1);
	assert_int_equal(a.client, SD_LISTEN_FDS_START);
	assert_int_equal(a.admin, -1);
	close(a.client);
}

static void test_wrong_type_refused(void **state)
{
	struct listen_activated a;

	(void)state;
	place(SOCK_STREAM, 1, SD_LISTEN_FDS_START);
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START + 1);
	set_env(2, "client:admin");
	assert_int_equal(listen_activated(&a), -EINVAL);
	assert_int_equal(a.client, -1);
	assert_int_equal(a.admin, -1);
	assert_false(is_open(SD_LISTEN_FDS_START));
	assert_false(is_open(SD_LISTEN_FDS_START + 1));
}

static void test_not_listening_refused(void **state)
{
	struct listen_activated a;

	(void)state;
	place(SOCK_SEQPACKET, 0, SD_LISTEN_FDS_START);
	set_env(1, "client");
	assert_int_equal(listen_activated(&a), -EINVAL);
	assert_false(is_open(SD_LISTEN_FDS_START));
}

static void test_repeated_name_refused(void **state)
{
	struct listen_activated a;

	(void)state;
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START);
	place(SOCK_SEQPACKET, 1, SD_LISTEN_FDS_START + 1);
	set_env(2, "client:client");
	assert_int_equal(listen_activated(&a), -EINVAL);
	assert_false(is_open(SD_LISTEN_FDS_START));
	assert_false(is_open(SD_LISTEN_FDS_START + 1));
}

static void test_status_line(void **state)
{
	struct cache c;
	char buf[256];

	(void)state;
	memset(&c, 0, sizeof(c));
	notify_format_status(&c, buf, sizeof(buf));
	assert_string_equal(buf,
			    "0 pools, 0 sessions, 0 connections, 0 MiB host, token hit ratio n/a");
	c.pools.n = 2;
	c.sessions.n = 7;
	c.ctr.connections = 3;
	c.host_bytes = 64ull << 20;
	/* Of the tokens asked, not of the queries that found a page. */
	c.ctr.match_hits = 3;
	c.ctr.match_misses = 1;
	c.ctr.queried_tokens = 400;
	c.ctr.matched_tokens = 100;
	notify_format_status(&c, buf, sizeof(buf));
	assert_string_equal(buf, "2 pools, 7 sessions, 3 connections, 64 MiB host, "
				 "token hit ratio 25.0% (100/400)");
	/* Truncated, still terminated. */
	notify_format_status(&c, buf, 8);
	assert_string_equal(buf, "2 pools");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_not_activated),
		cmocka_unit_test(test_named_pair),
		cmocka_unit_test(test_single_unnamed_is_client),
		cmocka_unit_test(test_wrong_type_refused),
		cmocka_unit_test(test_not_listening_refused),
		cmocka_unit_test(test_repeated_name_refused),
		cmocka_unit_test(test_status_line),
	};

	return cmocka_run_group_tests_name("listen", tests, NULL, NULL);
}
