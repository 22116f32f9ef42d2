/* client/rpc/rpc.c — sending requests and receiving replies (see rpc.h).
 *
 * One outgoing and one incoming frame buffer per client; a reply is
 * unpacked into the client's arena with a budget that fits any valid reply
 * of its size (frame_response_bound), so a hostile length in a reply cannot
 * make us allocate past it. Every failure of
 * the transport or of the reply's shape breaks the client: after a lost or
 * garbled exchange we can no longer tell which requests took effect.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: rpc (client/README.md), above base/ (the socket and the error
 * text it records) and below the handles and the calls that use it.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc.h"
#include "status.h"

/* Readies the arena for a reply of len payload bytes: whatever the daemon
 * may validly send decodes (a statistics reply of thousands of pools costs
 * ten times its wire size and more), nothing else can make us allocate
 * past that bound. */
static void unpack_budget(struct kvp_client *c, size_t len)
{
	frame_arena_reset(&c->arena);
	frame_arena_set_budget(&c->arena, frame_response_bound(len));
}

/* Receives one datagram. A daemon that closes a connection while our
 * request sits unread in it (a refusal racing our Hello) makes the kernel
 * report ECONNRESET on the next receive, before the datagrams it had
 * already sent (the refusal, which says why): the report is consumed, so
 * one more receive returns them, or 0 at the end. */
static int recv_frame(struct kvp_client *c, int *ret_fd)
{
	int n = frame_recv(c->fd, c->rbuf, FRAME_MAX_MAX_BYTES, ret_fd);

	if (n == -ECONNRESET)
		n = frame_recv(c->fd, c->rbuf, FRAME_MAX_MAX_BYTES, ret_fd);
	return n;
}

/* Sending failed with -EPIPE: the daemon closed the connection. One that
 * refuses a connection (a limit on connections) says why first, in a reply
 * with id 0, and may close before our first request goes out: when that
 * reply is there, its status is the error (-EDQUOT), else -EPIPE. The
 * peer is gone, so the receive does not wait. */
static int send_refused(struct kvp_client *c)
{
	Kvpalace__V1__Response *resp = NULL;
	int fd = -1, n, len;

	n = recv_frame(c, &fd);
	if (fd >= 0)
		close(fd);
	len = n > 0 ? frame_header_check(c->rbuf, (size_t)n, FRAME_MAX_MAX_BYTES) : -1;
	if (len >= 0) {
		unpack_budget(c, (size_t)len);
		resp = frame_unpack_response(&c->arena, c->rbuf + FRAME_HEADER_BYTES, (size_t)len);
	}
	if (resp && resp->id == 0 && resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return rpc_stray(c, resp);
	return conn_break(c, -EPIPE, "sending to kvpalaced failed: %s", kvp_strerror(NULL, -EPIPE));
}

int rpc_send(struct kvp_client *c, Kvpalace__V1__Request *req, uint64_t *ret_id)
{
	uint64_t id;
	int len;
	int ret;

	if (c->dead)
		return conn_usable(c);
	if (c->events)
		/* Its replies would come among the daemon's pushes. */
		return conn_error(c, -EBUSY,
				  "this client is subscribed to KV events: use another connection");
	id = c->next_id;
	req->id = id;
	len = frame_pack_request(req, c->sbuf, FRAME_MAX_MAX_BYTES, c->max_message_bytes);
	if (len < 0)
		return conn_error(c, len,
				  "request of operation %d exceeds the daemon's %u-byte cap",
				  (int)req->op_case, c->max_message_bytes);
	ret = frame_send(c->fd, c->sbuf, (size_t)len, -1);
	if (ret == -EPIPE)
		return send_refused(c);
	if (ret < 0)
		return conn_break(c, ret, "sending to kvpalaced failed: %s",
				  kvp_strerror(NULL, ret));
	c->next_id++;
	*ret_id = id;
	return 0;
}

/* Receives and unpacks one reply, whatever it answers; *ret_n gets the
 * frame's bytes in c->rbuf. */
static int recv_one(struct kvp_client *c, Kvpalace__V1__Response **ret_resp, int *ret_fd,
		    size_t *ret_n)
{
	Kvpalace__V1__Response *resp;
	int fd;
	int n;
	int len;

	if (c->dead)
		return conn_usable(c);
	n = recv_frame(c, &fd);
	if (n == 0)
		return conn_break(c, -ECONNRESET, "kvpalaced closed the connection");
	if (n == -EMSGSIZE)
		return conn_break(c, -EPROTO, "kvpalaced sent a truncated message");
	if (n < 0)
		return conn_break(c, n, "receiving from kvpalaced failed: %s",
				  kvp_strerror(NULL, n));
	len = frame_header_check(c->rbuf, (size_t)n, FRAME_MAX_MAX_BYTES);
	if (len < 0) {
		if (fd >= 0)
			close(fd);
		if (len == -EPROTONOSUPPORT)
			return conn_break(c, len, "kvpalaced framed a reply with another version");
		return conn_break(c, -EPROTO, "kvpalaced sent a bad frame header (%d)", len);
	}
	unpack_budget(c, (size_t)len);
	resp = frame_unpack_response(&c->arena, c->rbuf + FRAME_HEADER_BYTES, (size_t)len);
	if (!resp) {
		if (fd >= 0)
			close(fd);
		return conn_break(c, -EPROTO, "kvpalaced sent a reply that does not decode");
	}
	*ret_resp = resp;
	*ret_fd = fd;
	*ret_n = (size_t)n;
	return 0;
}

/* The index of the submitted request id in c->async, or -1. */
static int async_find(const struct kvp_client *c, uint64_t id)
{
	for (size_t i = 0; i < c->n_async; i++)
		if (c->async[i].id == id)
			return (int)i;
	return -1;
}

static void async_remove(struct kvp_client *c, size_t i)
{
	free(c->async[i].frame);
	memmove(&c->async[i], &c->async[i + 1], (c->n_async - i - 1) * sizeof(c->async[0]));
	c->n_async--;
}

int rpc_recv(struct kvp_client *c, Kvpalace__V1__Response **ret_resp, int *ret_fd)
{
	for (;;) {
		Kvpalace__V1__Response *resp;
		size_t n;
		int i, fd, ret = recv_one(c, &resp, &fd, &n);

		if (ret < 0)
			return ret;
		i = resp->id ? async_find(c, resp->id) : -1;
		if (i < 0 || c->async[i].frame) {
			/* Ours, a stray, or a second reply to a submitted id
			 * (which the caller reports as a stray). */
			*ret_resp = resp;
			*ret_fd = fd;
			return 0;
		}
		/* A submitted request's reply, while a call waits for its
		 * own: kept for rpc_reap (no submitted operation takes an
		 * fd), or dropped when its submitter went away. */
		if (fd >= 0)
			close(fd);
		if (!c->async[i].tag) {
			async_remove(c, (size_t)i);
			continue;
		}
		c->async[i].frame = malloc(n);
		if (!c->async[i].frame)
			return conn_break(c, -ENOMEM, "out of memory keeping a reply");
		memcpy(c->async[i].frame, c->rbuf, n);
		c->async[i].len = n;
	}
}

int rpc_submit(struct kvp_client *c, Kvpalace__V1__Request *req, void *tag)
{
	uint64_t id;
	int ret;

	if (c->n_async == CONN_ASYNC_MAX)
		return conn_error(c, -EAGAIN,
				  "%u requests submitted and not completed: kvp_complete first",
				  CONN_ASYNC_MAX);
	ret = rpc_send(c, req, &id);
	if (ret < 0)
		return ret;
	c->async[c->n_async++] = (struct conn_async){.id = id, .tag = tag};
	return 0;
}

void rpc_forget(struct kvp_client *c, const void *tag)
{
	for (size_t i = 0; i < c->n_async;) {
		if (c->async[i].tag != tag) {
			i++;
			continue;
		}
		c->async[i].tag = NULL;
		if (c->async[i].frame) /* came already: nobody will reap it */
			async_remove(c, i);
		else
			i++;
	}
}

/* Unpacks the kept reply of c->async[i] from c->rbuf. */
static int unpack_kept(struct kvp_client *c, size_t i, Kvpalace__V1__Response **ret_resp)
{
	size_t n = c->async[i].len;
	int len;

	memcpy(c->rbuf, c->async[i].frame, n);
	len = frame_header_check(c->rbuf, n, FRAME_MAX_MAX_BYTES);
	if (len < 0)
		return conn_break(c, -EPROTO, "a kept reply lost its header");
	unpack_budget(c, (size_t)len);
	*ret_resp = frame_unpack_response(&c->arena, c->rbuf + FRAME_HEADER_BYTES, (size_t)len);
	if (!*ret_resp)
		return conn_break(c, -EPROTO, "a kept reply does not decode");
	return 0;
}

int rpc_wait(struct kvp_client *c, int timeout_ms)
{
	struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
	int ret = poll(&pfd, 1, timeout_ms);

	if (ret < 0 && errno == EINTR)
		return 0;
	if (ret < 0)
		return conn_error(c, -errno, "poll: %s", kvp_strerror(NULL, -errno));
	return ret > 0;
}

int rpc_reap(struct kvp_client *c, int timeout_ms, void **ret_tag,
	     Kvpalace__V1__Response **ret_resp)
{
	for (;;) {
		Kvpalace__V1__Response *resp;
		size_t n;
		int i, fd, ret;

		if (c->dead)
			return conn_usable(c);
		for (size_t k = 0; k < c->n_async; k++) {
			if (!c->async[k].frame)
				continue;
			*ret_tag = c->async[k].tag;
			ret = unpack_kept(c, k, ret_resp);
			async_remove(c, k);
			return ret < 0 ? ret : 1;
		}
		if (!c->n_async)
			return 0;
		ret = rpc_wait(c, timeout_ms);
		if (ret <= 0)
			return ret;
		ret = recv_one(c, &resp, &fd, &n);
		if (ret < 0)
			return ret;
		if (fd >= 0)
			close(fd);
		i = resp->id ? async_find(c, resp->id) : -1;
		if (i < 0)
			return rpc_stray(c, resp);
		*ret_tag = c->async[i].tag;
		async_remove(c, (size_t)i);
		if (!*ret_tag)
			continue; /* forgotten: dropped */
		*ret_resp = resp;
		return 1;
	}
}

int rpc_stray(struct kvp_client *c, const Kvpalace__V1__Response *resp)
{
	int err;

	if (resp->id == 0 && resp->status != KVPALACE__V1__STATUS__STATUS_OK) {
		err = status_to_errno(resp->status);
		return conn_break(c, err, "kvpalaced: %s",
				  resp->error && resp->error[0] ? resp->error : "request refused");
	}
	return conn_break(c, -EPROTO, "kvpalaced answered request %llu, which is not in flight",
			  (unsigned long long)resp->id);
}

int rpc_status(struct kvp_client *c, const Kvpalace__V1__Response *resp, int op)
{
	const char *why = resp->error && resp->error[0] ? resp->error : NULL;
	int err;

	if (resp->status == KVPALACE__V1__STATUS__STATUS_OK) {
		if ((int)resp->op_case != op)
			return conn_break(c, -EPROTO,
					  "kvpalaced answered operation %d with operation %d", op,
					  (int)resp->op_case);
		return 0;
	}
	err = status_to_errno(resp->status);
	if (err == -EPROTO || resp->status == KVPALACE__V1__STATUS__STATUS_TOO_BIG)
		/* The daemon drops connections whose messages it refuses as
		 * malformed or oversized; an unknown status is malformed. */
		return conn_break(c, err, "kvpalaced: %s", why ? why : "protocol error");
	if (why)
		return conn_error(c, err, "kvpalaced: %s", why);
	return conn_error(c, err, "kvpalaced refused the request (status %d)", (int)resp->status);
}

int rpc_call(struct kvp_client *c, Kvpalace__V1__Request *req, int op,
	     Kvpalace__V1__Response **ret_resp, int *ret_fd)
{
	Kvpalace__V1__Response *resp;
	uint64_t id;
	int fd;
	int ret;

	ret = rpc_send(c, req, &id);
	if (ret < 0)
		return ret;
	ret = rpc_recv(c, &resp, &fd);
	if (ret < 0)
		return ret;
	if (resp->id != id) {
		if (fd >= 0)
			close(fd);
		return rpc_stray(c, resp);
	}
	ret = rpc_status(c, resp, op);
	if (ret < 0 || !ret_fd) {
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	if (ret < 0)
		return ret;
	*ret_resp = resp;
	if (ret_fd)
		*ret_fd = fd;
	return 0;
}
