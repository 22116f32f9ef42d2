/* tests/integration/test_notify.c — kvpalaced's sd_notify protocol, seen
 * from a fake service manager.
 *
 * The test binds its own AF_UNIX datagram socket, points $NOTIFY_SOCKET at
 * it and sets $WATCHDOG_USEC (400 ms, so keep-alives come every 200 ms)
 * for the daemon the harness starts, then asserts, in this order:
 * READY=1 with a STATUS= summary, WATCHDOG=1, a refreshed STATUS= line
 * (about 5 s later), RELOADING=1 and READY=1
 * after SIGHUP, a client served after the reload, and STOPPING=1 after
 * SIGTERM, with the daemon exiting 0. A stop that writes the host tier
 * to disk asks for more time and says nothing else after STOPPING=1.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

struct fake_manager {
	char dir[80];
	char path[100];
	int fd;
	char last[4096]; /* the message that matched last */
};

static int fake_open(struct fake_manager *m)
{
	const char *tmp = getenv("TMPDIR");
	struct sockaddr_un addr = {.sun_family = AF_UNIX};

	snprintf(m->dir, sizeof(m->dir), "%s/kvpn-XXXXXX", tmp && strlen(tmp) < 60 ? tmp : "/tmp");
	if (!mkdtemp(m->dir))
		return -1;
	snprintf(m->path, sizeof(m->path), "%s/notify", m->dir);
	memcpy(addr.sun_path, m->path, strlen(m->path) + 1);
	m->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (m->fd < 0 || bind(m->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		return -1;
	return 0;
}

static void fake_close(struct fake_manager *m)
{
	if (m->fd >= 0)
		close(m->fd);
	unlink(m->path);
	rmdir(m->dir);
}

static int has_line(const char *msg, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = msg; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == 0 || line[n - 1] == '='))
			return 1;
	return 0;
}

/* Reads messages until one has a line equal to line (or starting with it
 * when it ends in '='), within timeout_ms. Messages before it are
 * skipped, so successive calls assert an order. Returns 0 or -1. */
static int fake_expect(struct fake_manager *m, const char *line, int timeout_ms)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pfd = {.fd = m->fd, .events = POLLIN};
		long left;
		ssize_t n;

		clock_gettime(CLOCK_MONOTONIC, &t);
		left = timeout_ms -
		       ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
		if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) {
			fprintf(stderr, "no %s within %d ms\n", line, timeout_ms);
			return -1;
		}
		n = recv(m->fd, m->last, sizeof(m->last) - 1, 0);
		if (n < 0)
			return -1;
		m->last[n] = 0;
		if (has_line(m->last, line))
			return 0;
	}
}

static void test_notify_sequence(void **state)
{
	struct fake_manager m = {.fd = -1};
	struct harness h;
	kvp_client *c;
	int ret;

	(void)state;
	assert_int_equal(fake_open(&m), 0);
	setenv("NOTIFY_SOCKET", m.path, 1);
	setenv("WATCHDOG_USEC", "400000", 1);
	unsetenv("WATCHDOG_PID");
	ret = harness_start(&h, NULL);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	assert_int_equal(ret, 0);

	assert_int_equal(fake_expect(&m, "READY=1", 10000), 0);
	assert_true(has_line(m.last, "STATUS="));
	assert_non_null(strstr(m.last, "pools"));
	assert_non_null(strstr(m.last, "sessions"));
	assert_non_null(strstr(m.last, "connections"));
	assert_non_null(strstr(m.last, "token hit ratio"));
	assert_int_equal(fake_expect(&m, "WATCHDOG=1", 5000), 0);
	assert_int_equal(fake_expect(&m, "WATCHDOG=1", 5000), 0);
	/* The summary is refreshed every NOTIFY_STATUS_INTERVAL_NS (5 s). */
	assert_int_equal(fake_expect(&m, "STATUS=", 10000), 0);
	assert_false(has_line(m.last, "READY=1"));
	assert_non_null(strstr(m.last, "token hit ratio"));

	assert_int_equal(kill(h.pid, SIGHUP), 0);
	assert_int_equal(fake_expect(&m, "RELOADING=1", 10000), 0);
	assert_int_equal(fake_expect(&m, "READY=1", 10000), 0);
	assert_true(has_line(m.last, "STATUS="));
	assert_int_equal(fake_expect(&m, "WATCHDOG=1", 5000), 0);

	/* Still serving after the reload. */
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);

	/* harness_stop sends SIGTERM and fails unless the daemon exits 0. */
	assert_int_equal(harness_stop(&h), 0);
	assert_int_equal(fake_expect(&m, "STOPPING=1", 5000), 0);
	fake_close(&m);
}

/* A clean stop writes the host tier's pages to the disk tier, which on
 * a large tier takes longer than TimeoutStopSec=: the daemon asks for
 * more time (EXTEND_TIMEOUT_USEC=) after STOPPING=1, and sends no STATUS=
 * or READY=1 after it. */
static void test_stop_flush_extends_timeout(void **state)
{
	static const char *const args[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M",
					   NULL};
	static const struct kvp_layout layout = {.n_layers = 1,
						 .n_kv_heads = 1,
						 .head_dim = 64,
						 .block_tokens = 16,
						 .dtype = KVP_DTYPE_F16};
	struct fake_manager m = {.fd = -1};
	uint32_t tokens[16 * 32];
	struct harness h;
	kvp_client *c;
	kvp_pool *p;
	int ret;

	(void)state;
	assert_int_equal(fake_open(&m), 0);
	setenv("NOTIFY_SOCKET", m.path, 1);
	ret = harness_start(&h, args);
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(ret, 0);
	assert_int_equal(fake_expect(&m, "READY=1", 10000), 0);

	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "notify-flush", &layout, &p), 0);
	for (uint32_t i = 0; i < 4; i++) {
		kvp_session *s;

		harness_tokens(tokens, sizeof(tokens) / sizeof(tokens[0]), 900 + i, 0);
		assert_int_equal(harness_commit_session(p, tokens, 16 * 32, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	kvp_disconnect(c);

	assert_int_equal(harness_stop(&h), 0);
	assert_int_equal(fake_expect(&m, "STOPPING=1", 5000), 0);
	assert_int_equal(fake_expect(&m, "EXTEND_TIMEOUT_USEC=", 5000), 0);
	assert_true(strtoull(strchr(m.last, '=') + 1, NULL, 10) >= 1000000);
	/* The daemon has exited: every message it sent is queued. */
	for (;;) {
		ssize_t n = recv(m.fd, m.last, sizeof(m.last) - 1, MSG_DONTWAIT);

		if (n < 0)
			break;
		m.last[n] = 0;
		assert_false(has_line(m.last, "STATUS="));
		assert_false(has_line(m.last, "READY=1"));
	}
	fake_close(&m);
}

/* Without $NOTIFY_SOCKET (not under systemd) nothing changes. */
static void test_no_manager(void **state)
{
	struct harness h;
	kvp_client *c;

	(void)state;
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(harness_start(&h, NULL), 0);
	assert_int_equal(kill(h.pid, SIGHUP), 0);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_notify_sequence),
		cmocka_unit_test(test_stop_flush_extends_timeout),
		cmocka_unit_test(test_no_manager),
	};

	return cmocka_run_group_tests_name("notify", tests, NULL, NULL);
}
