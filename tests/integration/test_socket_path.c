/* tests/integration/test_socket_path.c — where libkvpalace looks for the
 * daemon when the caller names no socket: a user with XDG_RUNTIME_DIR
 * (every login session has one) reaches the packaged service under
 * /run/kvpalace/ unless a daemon of their own listens under
 * $XDG_RUNTIME_DIR/kvpalace/; a socket a per-user daemon left behind
 * (refusing connections) does not hide the service either.
 *
 * Runs as an ordinary user: as root it forks a child that becomes nobody
 * (root always uses /run/kvpalace/). The service's socket itself is not
 * created: /run/kvpalace/ may hold a real one on this machine.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static int check(int cond, const char *what)
{
	if (!cond)
		fprintf(stderr, "FAILED: %s\n", what);
	return cond ? 0 : 1;
}

/* A socket file at path that nobody listens on any more. */
static int leave_stale_socket(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

	if (strlen(path) >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, path, strlen(path) + 1);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	close(fd);
	return 0;
}

static int paths(void *arg)
{
	const struct harness *h = arg;
	char xdg[64], dir[96], path[160], want[160];
	kvp_client *c;
	int bad = 0;

	if (geteuid() == 0 && harness_become_nobody() < 0)
		return 2;
	snprintf(xdg, sizeof(xdg), "/tmp/kvpxdg-XXXXXX");
	if (!mkdtemp(xdg))
		return 2;
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	unsetenv("KVPALACE_SOCKET");

	/* No daemon of the user's own: the service's path. */
	kvp_default_socket_path(path, sizeof(path));
	bad += check(!strcmp(path, "/run/kvpalace/kvpalace.sock"), "no user socket: service's");
	kvp_default_admin_socket_path(path, sizeof(path));
	bad += check(!strcmp(path, "/run/kvpalace/admin.sock"), "no user socket: service's admin");

	/* A per-user daemon listening under $XDG_RUNTIME_DIR/kvpalace/: its
	 * socket (here a link to the harness daemon's, which is what a
	 * connect reaches). */
	snprintf(dir, sizeof(dir), "%s/kvpalace", xdg);
	mkdir(dir, 0700);
	snprintf(want, sizeof(want), "%s/kvpalace.sock", dir);
	if (symlink(h->sock, want) < 0)
		return 2;
	kvp_default_socket_path(path, sizeof(path));
	bad += check(!strcmp(path, want), "user socket: used");
	bad += check(kvp_connect(NULL, &c) == 0, "user socket: connects");
	if (!bad) {
		bad += check(kvp_ping(c) == 0, "user socket: ping");
		kvp_disconnect(c);
	}
	/* Only the client socket is there: the admin default stays the
	 * service's. */
	kvp_default_admin_socket_path(path, sizeof(path));
	bad += check(!strcmp(path, "/run/kvpalace/admin.sock"), "no user admin socket");

	/* What a per-user daemon that ended leaves: a socket refusing
	 * connections. kvp_connect then tries the service; without one
	 * there it reports the refusal. */
	unlink(want);
	if (leave_stale_socket(want) < 0)
		return 2;
	kvp_default_socket_path(path, sizeof(path));
	bad += check(!strcmp(path, want), "stale user socket: still the default");
	{
		struct stat st;
		int ret = kvp_connect(NULL, &c);

		if (stat("/run/kvpalace/kvpalace.sock", &st) < 0)
			bad += check(ret == -ECONNREFUSED,
				     "stale user socket, no service: refused");
		else if (ret == 0)
			kvp_disconnect(c); /* a real service answered */
	}
	unlink(want);
	rmdir(dir);
	rmdir(xdg);
	return bad ? 1 : 0;
}

static void test_default_socket_paths(void **state)
{
	assert_int_equal(harness_run_child(paths, *state), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_default_socket_paths, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("socket_path", tests, NULL, NULL);
}
