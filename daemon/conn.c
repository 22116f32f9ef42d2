/* daemon/conn.c — receive, check, dispatch and reply (see conn.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conn.h"
#include "dispatch.h"
#include "lease.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "status.h"

struct conn_out {
	struct conn_out *next;
	int fd; /* passed with the message (owned, closed after sending), or -1 */
	size_t len;
	unsigned char buf[];
};

static void conn_maybe_free(struct conn *c)
{
	if (!c->closed || c->receiving || c->sending)
		return;
	while (c->out_head) {
		struct conn_out *o = c->out_head;

		c->out_head = o->next;
		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	close(c->fd);
	free(c->rbuf);
	free(c);
}

static void release_client_state(struct conn *c)
{
	struct cache *cache = &c->srv->cache;
	struct list *it, *tmp;

	list_for_each_safe (it, tmp, &c->leases)
		lease_release(cache, list_entry(it, struct lease, owner_link));
	c->n_leases = 0;
	list_for_each_safe (it, tmp, &c->writing)
		session_rollback(cache, list_entry(it, struct session, writer_link));
	cache_debug_check(cache);
}

void conn_close(struct conn *c, int bad)
{
	if (c->closed)
		return;
	c->closed = 1;
	if (bad)
		c->srv->cache.ctr.disconnects_bad++;
	c->srv->cache.ctr.connections--;
	release_client_state(c);
	list_del(&c->link);
	log_debug("connection %llu (pid %d uid %u) closed%s", (unsigned long long)c->id,
		  (int)c->pid, (unsigned)c->uid, bad ? " for misbehaviour" : "");
	/* Wakes a pending receive or send so their completions let us free. */
	if (c->receiving || c->sending)
		shutdown(c->fd, SHUT_RDWR);
	conn_maybe_free(c);
}

static void submit_recv(struct conn *c)
{
	struct io_uring_sqe *sqe = loop_sqe(&c->srv->loop);

	c->riov.iov_base = c->rbuf;
	c->riov.iov_len = c->srv->cfg->max_message_bytes + 1;
	memset(&c->rmsg, 0, sizeof(c->rmsg));
	c->rmsg.msg_iov = &c->riov;
	c->rmsg.msg_iovlen = 1;
	c->rmsg.msg_control = c->rcbuf;
	c->rmsg.msg_controllen = sizeof(c->rcbuf);
	io_uring_prep_recvmsg(sqe, c->fd, &c->rmsg, MSG_CMSG_CLOEXEC);
	loop_sqe_set_op(sqe, &c->recv_op);
	c->receiving = 1;
}

static void submit_send(struct conn *c)
{
	struct conn_out *o = c->out_head;
	struct io_uring_sqe *sqe;

	memset(&c->smsg, 0, sizeof(c->smsg));
	c->siov.iov_base = o->buf;
	c->siov.iov_len = o->len;
	c->smsg.msg_iov = &c->siov;
	c->smsg.msg_iovlen = 1;
	if (o->fd >= 0)
		frame_cmsg_put_fd(&c->smsg, c->scbuf, o->fd);
	sqe = loop_sqe(&c->srv->loop);
	io_uring_prep_sendmsg(sqe, c->fd, &c->smsg, MSG_NOSIGNAL);
	loop_sqe_set_op(sqe, &c->send_op);
	c->sending = 1;
}

/* Queues a packed reply; takes ownership of pass_fd. */
static void queue_reply(struct conn *c, const Kvpalace__V1__Response *resp, int pass_fd)
{
	size_t len = protobuf_c_message_get_packed_size(&resp->base) + FRAME_HEADER_BYTES;
	struct conn_out *o = malloc(sizeof(*o) + len);
	int n;

	if (!o) {
		log_err("connection %llu: out of memory for a reply", (unsigned long long)c->id);
		if (pass_fd >= 0)
			close(pass_fd);
		conn_close(c, 0);
		return;
	}
	n = frame_pack_response(resp, o->buf, len, c->srv->cfg->max_message_bytes);
	if (n < 0) {
		/* Only a reply the dispatcher failed to bound gets here. */
		Kvpalace__V1__Response err = KVPALACE__V1__RESPONSE__INIT;

		log_err("connection %llu: reply %llu over the message cap",
			(unsigned long long)c->id, (unsigned long long)resp->id);
		err.id = resp->id;
		err.status = KVPALACE__V1__STATUS__STATUS_INTERNAL;
		err.error = "reply too large";
		n = frame_pack_response(&err, o->buf, len, c->srv->cfg->max_message_bytes);
		kvp_assert(n > 0);
		if (pass_fd >= 0)
			close(pass_fd);
		pass_fd = -1;
	}
	o->len = (size_t)n;
	o->fd = pass_fd;
	o->next = NULL;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->n_out++;
	if (!c->sending)
		submit_send(c);
}

/* Replies with an error and closes the connection once the reply is out. */
static void fail_conn(struct conn *c, uint64_t id, int err, const char *why)
{
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;

	log_info("connection %llu (pid %d uid %u): %s; disconnecting", (unsigned long long)c->id,
		 (int)c->pid, (unsigned)c->uid, why);
	c->srv->cache.ctr.errors++;
	c->srv->cache.ctr.disconnects_bad++;
	resp.id = id;
	resp.status = status_from_errno(err);
	resp.error = (char *)why;
	c->draining = 1;
	queue_reply(c, &resp, -1);
}

static void handle_message(struct conn *c, size_t n)
{
	struct server *srv = c->srv;
	Kvpalace__V1__Request *req;
	struct reply r;
	int len, fd;

	fd = frame_cmsg_fd(&c->rmsg);
	if (fd >= 0) {
		close(fd);
		fail_conn(c, 0, -EPROTO, "clients must not send file descriptors");
		return;
	}
	if (c->rmsg.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || n > srv->cfg->max_message_bytes) {
		fail_conn(c, 0, -EMSGSIZE, "message larger than max_message_bytes");
		return;
	}
	len = frame_header_check(c->rbuf, n, srv->cfg->max_message_bytes);
	if (len < 0) {
		fail_conn(c, 0, len == -EPROTONOSUPPORT ? len : -EPROTO,
			  len == -EPROTONOSUPPORT ? "unsupported frame version"
						  : "malformed frame header");
		return;
	}
	frame_arena_reset(&srv->arena);
	req = frame_unpack_request(&srv->arena, c->rbuf + FRAME_HEADER_BYTES, (size_t)len);
	if (!req) {
		fail_conn(c, 0, -EPROTO, "undecodable request");
		return;
	}
	srv->cache.ctr.requests++;
	dispatch(&srv->cache, c, req, &r);
	if (r.resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		srv->cache.ctr.errors++;
	queue_reply(c, &r.resp, r.pass_fd);
	reply_fini(&r);
	cache_debug_check(&srv->cache);
}

static void on_recv(struct loop_op *op, int res, unsigned int flags)
{
	struct conn *c = (struct conn *)((char *)op - offsetof(struct conn, recv_op));

	(void)flags;
	c->receiving = 0;
	if (c->closed) {
		conn_maybe_free(c);
		return;
	}
	if (res <= 0) {
		if (res < 0 && res != -ECONNRESET)
			log_debug("connection %llu: receive: %s", (unsigned long long)c->id,
				  strerror(-res));
		conn_close(c, 0);
		return;
	}
	handle_message(c, (size_t)res);
	if (!c->closed && !c->draining && c->n_out < CONN_MAX_QUEUED)
		submit_recv(c);
}

static void on_send(struct loop_op *op, int res, unsigned int flags)
{
	struct conn *c = (struct conn *)((char *)op - offsetof(struct conn, send_op));
	struct conn_out *o = c->out_head;

	(void)flags;
	c->sending = 0;
	c->out_head = o->next;
	if (!c->out_head)
		c->out_tail = NULL;
	c->n_out--;
	if (o->fd >= 0)
		close(o->fd);
	free(o);
	if (c->closed) {
		conn_maybe_free(c);
		return;
	}
	if (res < 0) {
		if (res != -EPIPE && res != -ECONNRESET)
			log_info("connection %llu: send: %s", (unsigned long long)c->id,
				 strerror(-res));
		conn_close(c, 0);
		return;
	}
	if (c->out_head) {
		submit_send(c);
		return;
	}
	if (c->draining) {
		conn_close(c, 0);
		return;
	}
	/* Receiving paused while too many replies were queued. */
	if (!c->receiving && c->n_out < CONN_MAX_QUEUED)
		submit_recv(c);
}

int conn_start(struct server *srv, int fd, int admin)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct conn *c;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	c = calloc(1, sizeof(*c));
	if (c)
		c->rbuf = malloc(srv->cfg->max_message_bytes + 1);
	if (!c || !c->rbuf) {
		free(c);
		close(fd);
		return -ENOMEM;
	}
	c->srv = srv;
	c->id = ++srv->next_conn_id;
	c->fd = fd;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	c->admin = admin;
	c->recv_op.cb = on_recv;
	c->send_op.cb = on_send;
	list_init(&c->leases);
	list_init(&c->writing);
	list_add_tail(&srv->conns, &c->link);
	srv->cache.ctr.connections++;
	log_debug("connection %llu from pid %d uid %u%s", (unsigned long long)c->id, (int)c->pid,
		  (unsigned)c->uid, admin ? " (admin)" : "");
	submit_recv(c);
	return 0;
}
