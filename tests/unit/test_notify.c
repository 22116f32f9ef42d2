/* tests/unit/test_notify.c — the daemon's sd_notify messages, received on
 * a datagram socket standing in for the service manager: a STATUS=
 * summary, and nothing after STOPPING=1 that would tell the manager the
 * daemon is ready or replace its "stopping" (the drain after a stop still
 * turns the loop's timer and serves admin reloads), while
 * EXTEND_TIMEOUT_USEC= still goes out.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "notify.h"

static char dir[64], path[100];
static int fd = -1;

static int setup(void **state)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};

	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kvpnotify-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/notify", dir);
	memcpy(a.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	setenv("NOTIFY_SOCKET", path, 1);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	close(fd);
	unlink(path);
	rmdir(dir);
	return 0;
}

/* The next message, or "" when none came (sd_notify sends before it
 * returns, so one sent is already queued). */
static const char *next(void)
{
	static char buf[512];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

	buf[n > 0 ? n : 0] = 0;
	return buf;
}

static void test_nothing_ready_after_stopping(void **state)
{
	static struct cache c; /* no pools, no sessions: a summary of zeros */
	struct notify n;

	(void)state;
	notify_init(&n);
	notify_ready(&n, &c);
	assert_non_null(strstr(next(), "READY=1\nSTATUS=0 pools"));
	notify_status(&n, &c, 1);
	assert_non_null(strstr(next(), "STATUS=0 pools"));

	notify_stopping(&n);
	assert_string_equal(next(), "STOPPING=1\nSTATUS=stopping");
	notify_status(&n, &c, 1);
	notify_reloading(&n);
	notify_ready(&n, &c);
	assert_string_equal(next(), "");
	notify_watchdog(&n); /* the stop is still watched */
	assert_string_equal(next(), "WATCHDOG=1");
	notify_extend_timeout(&n, 15000000);
	assert_string_equal(next(), "EXTEND_TIMEOUT_USEC=15000000");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nothing_ready_after_stopping),
	};

	return cmocka_run_group_tests_name("notify", tests, setup, teardown);
}
