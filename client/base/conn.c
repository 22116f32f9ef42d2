/* client/base/conn.c — connecting to kvpalaced, the Hello handshake, default
 * socket paths and error text.
 *
 * kvp_connect() opens a SOCK_SEQPACKET socket (O_CLOEXEC), connects, and
 * performs the Hello handshake, which tells the client the daemon's message
 * cap and how many tokens one request may carry; the library then splits
 * long token lists by that number. kvp_disconnect() closes the socket
 * first (the daemon then frees every lease and reservation of the
 * connection) and frees every handle opened through the client. Library
 * code: never logs, never touches the global errno contract of its callers.
 * Not thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "pool.h"
#include "rpc.h"

/* Bytes of a request besides its packed tokens: frame header, request id,
 * operation tag and length, pool/session/lease ids, the tokens' tag and
 * length. Generous on purpose. */
#define CONN_REQUEST_OVERHEAD_BYTES 128u
/* A packed uint32 (token id or page slot) takes at most five bytes on the
 * wire. */
#define CONN_TOKEN_WIRE_BYTES 5u

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
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->dead = 1;
	return err;
}

int conn_usable(struct kvp_client *c)
{
	if (!c->dead)
		return 0;
	return conn_error(c, -ENOTCONN, "the connection to kvpalaced was lost earlier");
}

static int default_path(char *buf, size_t n, const char *name)
{
	const char *xdg = secure_getenv("XDG_RUNTIME_DIR");

	/* Same rule as the daemon's embedded default (daemon/config.c). */
	if (geteuid() != 0 && xdg && xdg[0] == '/')
		return snprintf(buf, n, "%s/kvpalace/%s", xdg, name);
	return snprintf(buf, n, "/run/kvpalace/%s", name);
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

/* Sends a Hello and checks the reply; on the first one also learns the
 * daemon's limits. */
static int conn_hello(struct kvp_client *c, int first)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__HelloRequest hello = KVPALACE__V1__HELLO_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__HelloResponse *h;
	uint32_t fit;
	int ret;

	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = program_invocation_short_name;
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_HELLO, &resp, NULL);
	if (ret == -EOPNOTSUPP && first) {
		char why[CONN_ERR_MSG_BYTES];

		memcpy(why, c->err_msg, sizeof(why));
		return conn_break(c, -EPROTONOSUPPORT, "kvpalaced refused protocol version %u: %s",
				  KVP_PROTOCOL_VERSION, why);
	}
	if (ret < 0)
		return ret;
	h = resp->hello;
	if (h->protocol_version != KVP_PROTOCOL_VERSION)
		return conn_break(c, -EPROTONOSUPPORT,
				  "kvpalaced speaks protocol version %u, this library %u",
				  h->protocol_version, KVP_PROTOCOL_VERSION);
	if (!first)
		return 0;
	if (h->max_message_bytes < FRAME_MIN_MAX_BYTES ||
	    h->max_message_bytes > FRAME_MAX_MAX_BYTES || !h->max_tokens_per_request)
		return conn_break(c, -EPROTO,
				  "kvpalaced announced unusable limits (%u bytes, %u tokens)",
				  h->max_message_bytes, h->max_tokens_per_request);
	c->max_message_bytes = h->max_message_bytes;
	fit = (h->max_message_bytes - CONN_REQUEST_OVERHEAD_BYTES) / CONN_TOKEN_WIRE_BYTES;
	c->chunk_tokens = h->max_tokens_per_request < fit ? h->max_tokens_per_request : fit;
	/* A reply's fixed fields are no bigger than a request's, so a reply
	 * has room for as many page slots as a request for tokens; a daemon
	 * that bounds a commit's pages would bound them by its per-request
	 * count too. */
	c->reply_pages = c->chunk_tokens;
	c->admin = !!h->admin;
	c->uid = h->uid;
	c->gpu = h->has_gpu && h->gpu;
	return 0;
}

static struct kvp_client *conn_new(void)
{
	struct kvp_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->fd = -1;
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

static void conn_free(struct kvp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->sbuf);
	free(c->rbuf);
	frame_arena_fini(&c->arena);
	free(c->abuf);
	free(c);
}

KVP_PUBLIC int kvp_connect(const char *path, kvp_client **ret_client)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char def[sizeof(sa.sun_path)];
	struct kvp_client *c;
	int ret;

	if (!ret_client)
		return -EINVAL;
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
	if (ret < 0)
		goto fail;
	ret = conn_hello(c, 1);
	if (ret < 0)
		goto fail;
	*ret_client = c;
	return 0;
fail:
	conn_free(c);
	return ret;
}

KVP_PUBLIC void kvp_disconnect(kvp_client *c)
{
	if (!c)
		return;
	/* Closing the socket first makes the daemon drop our leases and
	 * reservations; the handles then need no round trips. */
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->dead = 1;
	while (!list_empty(&c->pools))
		pool_free(list_entry(c->pools.next, struct kvp_pool, link));
	conn_free(c);
}

KVP_PUBLIC int kvp_ping(kvp_client *c)
{
	int ret;

	if (!c)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	return conn_hello(c, 0);
}

KVP_PUBLIC int kvp_is_admin(const kvp_client *c)
{
	return c ? c->admin : 0;
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
