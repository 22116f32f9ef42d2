/* tests/integration/test_activate.c — socket activation, emulated by
 * systemd's own systemd-socket-activate.
 *
 * systemd-socket-activate --seqpacket listens on two paths, names them
 * (--fdname=client:admin) and execs kvpalaced in its own process at the
 * first connection. The test asserts that nothing runs kvpalaced before a
 * client connects, that the first client is served through the passed
 * socket (the daemon's own fallback paths are never created), that the
 * admin socket works too, and that after SIGTERM the daemon exits 0
 * leaving the passed sockets' files in place (they belong to the service
 * manager). A single unnamed socket counts as the client socket, with the
 * admin socket bound by the daemon itself. Skips (77) without
 * systemd-socket-activate.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

static char activator[256];

struct activation {
	char dir[96];
	char client[128], admin[128];	      /* passed by the activator */
	char own_client[128], own_admin[128]; /* the daemon's fallback paths */
	char state[128], cache[128];
	int two; /* pass both sockets, else only the client one, unnamed */
	pid_t pid;
};

static int which(const char *tool, char *buf, size_t size)
{
	char cmd[128];
	FILE *f;
	int ok;

	snprintf(cmd, sizeof(cmd), "command -v %s 2>/dev/null", tool);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	ok = fgets(buf, (int)size, f) != NULL;
	if (pclose(f) != 0 || !ok || buf[0] != '/')
		return -1;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

static int exec_activator(void *arg)
{
	struct activation *a = arg;
	const char *daemon = getenv("KVPALACED");
	const char *argv[32];
	int n = 0;

	argv[n++] = activator;
	argv[n++] = "--seqpacket";
	argv[n++] = "-l";
	argv[n++] = a->client;
	if (a->two) {
		argv[n++] = "-l";
		argv[n++] = a->admin;
		argv[n++] = "--fdname=client:admin";
	}
	argv[n++] = daemon;
	argv[n++] = "--socket";
	argv[n++] = a->own_client;
	argv[n++] = "--admin-socket";
	argv[n++] = a->own_admin;
	argv[n++] = "--state-dir";
	argv[n++] = a->state;
	argv[n++] = "--cache-dir";
	argv[n++] = a->cache;
	argv[n] = NULL;
	execv(activator, (char *const *)argv);
	fprintf(stderr, "exec %s: %s\n", activator, strerror(errno));
	return 127;
}

static int exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* The name of process pid ("kvpalaced" once exec'd), or "" when gone. */
static void comm_of(pid_t pid, char *buf, size_t size)
{
	char path[64];
	FILE *f;

	buf[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return;
	if (!fgets(buf, (int)size, f))
		buf[0] = 0;
	buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

static void start(struct activation *a, int two)
{
	const char *tmp = getenv("TMPDIR");
	char comm[32];
	int i;

	memset(a, 0, sizeof(*a));
	a->two = two;
	assert_non_null(getenv("KVPALACED"));
	snprintf(a->dir, sizeof(a->dir), "%s/kvpa-XXXXXX", tmp && strlen(tmp) < 60 ? tmp : "/tmp");
	assert_non_null(mkdtemp(a->dir));
	snprintf(a->client, sizeof(a->client), "%s/client.sock", a->dir);
	snprintf(a->admin, sizeof(a->admin), "%s/admin.sock", a->dir);
	snprintf(a->own_client, sizeof(a->own_client), "%s/own-client.sock", a->dir);
	snprintf(a->own_admin, sizeof(a->own_admin), "%s/own-admin.sock", a->dir);
	snprintf(a->state, sizeof(a->state), "%s/state", a->dir);
	snprintf(a->cache, sizeof(a->cache), "%s/cache", a->dir);
	a->pid = harness_fork(exec_activator, a);
	assert_true(a->pid > 0);
	for (i = 0; i < 1000 && !(exists(a->client) && (!two || exists(a->admin))); i++)
		sleep_ms(10);
	assert_true(exists(a->client));

	/* Listening, but nobody connected: no daemon yet. */
	sleep_ms(200);
	comm_of(a->pid, comm, sizeof(comm));
	assert_string_not_equal(comm, "kvpalaced");
	assert_false(exists(a->own_client));
}

static void stop(struct activation *a)
{
	char cmd[160];

	assert_int_equal(kill(a->pid, SIGTERM), 0);
	assert_int_equal(harness_wait(a->pid, 20), 0);
	/* The passed sockets belong to the service manager: not unlinked. */
	assert_true(exists(a->client));
	if (a->two)
		assert_true(exists(a->admin));
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a->dir);
	assert_int_equal(system(cmd), 0);
}

static void test_first_connection_starts_daemon(void **state)
{
	struct activation a;
	kvp_client *c;
	char comm[32];

	(void)state;
	start(&a, 1);
	/* kvp_connect's hello waits in the backlog until the daemon runs. */
	assert_int_equal(kvp_connect(a.client, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	comm_of(a.pid, comm, sizeof(comm));
	assert_string_equal(comm, "kvpalaced");
	kvp_disconnect(c);
	assert_int_equal(kvp_connect(a.admin, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
	/* The daemon used the passed sockets, bound none of its own. */
	assert_false(exists(a.own_client));
	assert_false(exists(a.own_admin));
	stop(&a);
}

static void test_single_unnamed_socket(void **state)
{
	struct activation a;
	kvp_client *c;
	int i;

	(void)state;
	start(&a, 0);
	assert_int_equal(kvp_connect(a.client, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
	/* The admin socket, not passed, is bound by the daemon. */
	for (i = 0; i < 500 && !exists(a.own_admin); i++)
		sleep_ms(10);
	assert_false(exists(a.own_client));
	assert_int_equal(kvp_connect(a.own_admin, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
	stop(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_connection_starts_daemon),
		cmocka_unit_test(test_single_unnamed_socket),
	};

	if (which("systemd-socket-activate", activator, sizeof(activator)) < 0) {
		fprintf(stderr, "systemd-socket-activate not found: skipping\n");
		return 77;
	}
	return cmocka_run_group_tests_name("activate", tests, NULL, NULL);
}
