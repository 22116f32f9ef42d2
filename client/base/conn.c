/* client/base/conn.c — a client's socket and its error state: opening
 * and closing the connection, default socket paths and error text.
 *
 * Layer: base, the bottom of libkvpalace (client/README.md). It calls no
 * other folder of client/; rpc/ and everything above build on it.
 *
 * conn_open() opens a SOCK_SEQPACKET socket (O_CLOEXEC) and connects; the
 * Hello handshake that follows is api/client.c's. Closing the socket
 * (conn_close, conn_break) makes the daemon free every lease and
 * reservation of the connection. Library code: never logs, never touches
 * the global errno contract of its callers. Not thread-safe: one thread at
 * a time per client.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"

void conn_clear_error(struct kvp_client *c)
{
	c->err_code = 0;
	c->err_msg[0] = '\0';
}

static void conn_verror(struct kvp_client *c, int err, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));

static void conn_verror(struct kvp_client *c, int err, const char *fmt, va_list ap)
{
	c->err_code = err;
	vsnprintf(c->err_msg, sizeof(c->err_msg), fmt, ap);
}

int conn_error(struct kvp_client *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	conn_verror(c, err, fmt, ap);
	va_end(ap);
	return err;
}

int conn_break(struct kvp_client *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	conn_verror(c, err, fmt, ap);
	va_end(ap);
	conn_close(c);
	return err;
}

int conn_usable(struct kvp_client *c)
{
	/* After fork() parent and child share the socket: the child's
	 * requests would be answered to whichever process reads first, and
	 * each would take the other's replies. The child's copy refuses
	 * instead, without closing or breaking anything (the parent's
	 * connection is intact). getpid() is a system call on glibc 2.25
	 * and later: ~0.1 µs against a round trip of ~10 µs. */
	if (c->pid != getpid())
		return conn_error(c, -ECHILD,
				  "this kvpalace client was connected by process %d; after fork() "
				  "a child must kvp_connect() on its own",
				  (int)c->pid);
	if (!c->dead)
		return 0;
	return conn_error(c, -ENOTCONN, "the connection to kvpalaced was lost earlier");
}

/* The packaged service's sockets (systemd/kvpalaced*.socket). */
#define SYSTEM_SOCKET_DIR "/run/kvpalace"

/* $XDG_RUNTIME_DIR/kvpalace/<name> for a user other than root, where a
 * per-user daemon binds by default (daemon/base/config.c), when a socket
 * is there; else the system service's. A user with a session (and so
 * XDG_RUNTIME_DIR) but no daemon of their own reaches the packaged one. */
static int default_path(char *buf, size_t n, const char *name)
{
	const char *xdg = secure_getenv("XDG_RUNTIME_DIR");

	if (geteuid() != 0 && xdg && xdg[0] == '/') {
		struct stat st;
		int len = snprintf(buf, n, "%s/kvpalace/%s", xdg, name);

		if (len >= 0 && (size_t)len < n && stat(buf, &st) == 0 && S_ISSOCK(st.st_mode))
			return len;
	}
	return snprintf(buf, n, SYSTEM_SOCKET_DIR "/%s", name);
}

KVP_PUBLIC int kvp_default_socket_path(char *buf, size_t n)
{
	return default_path(buf, n, "kvpalace.sock");
}

KVP_PUBLIC int kvp_default_admin_socket_path(char *buf, size_t n)
{
	return default_path(buf, n, "admin.sock");
}

/* connect() on a Unix socket interrupted by a signal goes on in the
 * background; wait for it and fetch its result. */
static int connect_unix(int fd, const struct sockaddr_un *sa)
{
	struct pollfd pfd = {.fd = fd, .events = POLLOUT};
	socklen_t len = sizeof(int);
	int soerr = 0;

	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
		return 0;
	if (errno != EINTR && errno != EINPROGRESS)
		return -errno;
	while (poll(&pfd, 1, -1) < 0)
		if (errno != EINTR)
			return -errno;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
		return -errno;
	return -soerr;
}

static struct kvp_client *conn_new(void)
{
	struct kvp_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->fd = -1;
	c->pid = getpid();
	c->next_id = 1;
	/* Until the Hello reply says otherwise, send no more than any daemon
	 * accepts. Receive buffers take the largest frame a daemon may send. */
	c->max_message_bytes = FRAME_MIN_MAX_BYTES;
	c->abuf_bytes = frame_arena_bytes(FRAME_MAX_MAX_BYTES);
	c->sbuf = malloc(FRAME_MAX_MAX_BYTES);
	c->rbuf = malloc(FRAME_MAX_MAX_BYTES);
	c->abuf = malloc(c->abuf_bytes);
	list_init(&c->pools);
	frame_arena_init(&c->arena, c->abuf, c->abuf_bytes);
	if (!c->sbuf || !c->rbuf || !c->abuf) {
		free(c->sbuf);
		free(c->rbuf);
		free(c->abuf);
		free(c);
		return NULL;
	}
	return c;
}

void conn_free(struct kvp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	for (size_t i = 0; i < c->n_async; i++)
		free(c->async[i].frame);
	free(c->sbuf);
	free(c->rbuf);
	frame_arena_fini(&c->arena);
	free(c->abuf);
	free(c);
}

int conn_open(const char *path, struct kvp_client **ret_client)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char def[sizeof(sa.sun_path)];
	struct kvp_client *c;
	int ret;

	if (!path || !*path)
		path = secure_getenv("KVPALACE_SOCKET");
	if (!path || !*path) {
		ret = kvp_default_socket_path(def, sizeof(def));
		if (ret < 0)
			return -EINVAL;
		if ((size_t)ret >= sizeof(def))
			return -ENAMETOOLONG;
		path = def;
	}
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);

	c = conn_new();
	if (!c)
		return -ENOMEM;
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		ret = -errno;
		goto fail;
	}
	ret = connect_unix(c->fd, &sa);
	if (ret == -ECONNREFUSED && path == def && strncmp(def, SYSTEM_SOCKET_DIR "/", 14)) {
		/* A per-user daemon's socket left behind by its end: the system
		 * service's may still answer. A connect that failed leaves the
		 * socket unconnected, so it can try again. */
		snprintf(sa.sun_path, sizeof(sa.sun_path), SYSTEM_SOCKET_DIR "/kvpalace.sock");
		ret = connect_unix(c->fd, &sa);
		if (ret == -ENOENT)
			ret = -ECONNREFUSED; /* say what happened at the first */
	}
	if (ret < 0)
		goto fail;
	*ret_client = c;
	return 0;
fail:
	conn_free(c);
	return ret;
}

void conn_close(struct kvp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->dead = 1;
}

KVP_PUBLIC const char *kvp_strerror(const kvp_client *c, int err)
{
	const char *s;

	if (err > 0)
		err = -err;
	if (c && c->err_code && c->err_code == err && c->err_msg[0])
		return c->err_msg;
	if (!err)
		return "success";
	s = strerrordesc_np(-err);
	return s ? s : "unknown error";
}
