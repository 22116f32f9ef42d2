/* daemon/server/listen.c — listening sockets (see listen.h): bound by the daemon
 * itself, or passed by systemd through socket activation. Called at start,
 * from the main thread, before the event loop runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "listen.h"

int listen_mkdir_p(const char *path, mode_t mode)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int parent_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *slash = strrchr(path, '/');

	if (!slash || slash == path)
		return 0;
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	return listen_mkdir_p(dir, 0755);
}

/* True when a daemon accepts connections at addr. */
static int someone_listens(const struct sockaddr_un *addr)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int alive;

	if (fd < 0)
		return 0;
	alive = connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0;
	close(fd);
	return alive;
}

int listen_unix(const char *path, mode_t mode)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd, ret;

	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	memcpy(addr.sun_path, path, strlen(path) + 1);
	ret = parent_dir(path);
	if (ret < 0)
		return ret;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		int tries = 0;

		ret = -errno;
		if (ret != -EADDRINUSE)
			goto fail;
		/* A daemon killed a moment ago still accepts connections until
		 * the kernel has torn its io_uring down: give it two seconds. */
		while (someone_listens(&addr)) {
			if (++tries == 20)
				goto fail;
			usleep(100 * 1000);
		}
		unlink(path);
		if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
			ret = -errno;
			goto fail;
		}
	}
	if (chmod(path, mode) < 0 || listen(fd, 128) < 0) {
		ret = -errno;
		unlink(path);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return ret;
}

int listen_activated(struct listen_activated *ret)
{
	struct listen_activated got = {.client = -1, .admin = -1};
	char **names = NULL;
	int n, taken = 0, err = 0;

	n = sd_listen_fds_with_names(1, &names);
	if (n <= 0) {
		*ret = got;
		return n < 0 ? n : 0;
	}
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		const char *name = names && names[i] ? names[i] : "unknown";
		int *slot = NULL;

		if (strcmp(name, "client") == 0 || (n == 1 && strcmp(name, "unknown") == 0))
			slot = &got.client;
		else if (strcmp(name, "admin") == 0)
			slot = &got.admin;
		if (!slot) {
			close(fd);
			continue;
		}
		if (*slot >= 0 || sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0 ||
		    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			err = -EINVAL;
			close(fd);
			continue;
		}
		*slot = fd;
		taken++;
	}
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	if (err < 0) {
		if (got.client >= 0)
			close(got.client);
		if (got.admin >= 0)
			close(got.admin);
		got.client = got.admin = -1;
		*ret = got;
		return err;
	}
	*ret = got;
	return taken;
}
