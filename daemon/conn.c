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
	uint64_t batch; /* the datagram it answers; replies to one may share one */
	int fd;		/* passed with the message (owned, closed after sending), or -1 */
	size_t len;
	unsigned char buf[];
};

struct conn_held {
	struct conn_held *next;
	uint64_t batch;
	unsigned int tries; /* times it was parked */
	size_t len;
	uint8_t payload[];
};

static void free_held(struct conn *c)
{
	while (c->held_head) {
		struct conn_held *h = c->held_head;

		c->held_head = h->next;
		free(h);
	}
	c->held_tail = NULL;
	c->n_held = 0;
}

static void conn_maybe_free(struct conn *c)
{
	if (!c->closed || c->receiving || c->sending)
		return;
	free_held(c);
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
	tier_unwait(&c->waiter);
	if (c->ticket)
		c->ticket->conn = NULL;
	c->ticket = NULL;
	c->parked = 0;
	free_held(c);
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

static void reset_rmsg(struct conn *c)
{
	c->riov.iov_base = c->rbuf;
	c->riov.iov_len = c->srv->cfg->max_message_bytes + 1;
	memset(&c->rmsg, 0, sizeof(c->rmsg));
	c->rmsg.msg_iov = &c->riov;
	c->rmsg.msg_iovlen = 1;
	c->rmsg.msg_control = c->rcbuf;
	c->rmsg.msg_controllen = sizeof(c->rcbuf);
}

static void submit_recv(struct conn *c)
{
	struct io_uring_sqe *sqe = loop_sqe(&c->srv->loop);

	reset_rmsg(c);
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
static void queue_reply(struct conn *c, const Kvpalace__V1__Response *resp, int pass_fd,
			uint64_t batch)
{
	Kvpalace__V1__Response err = KVPALACE__V1__RESPONSE__INIT;
	size_t n = frame_packed_bytes(&resp->base);
	struct conn_out *o;

	if (n > c->srv->cfg->max_message_bytes) {
		/* Only a reply the dispatcher failed to bound gets here. */
		log_err("connection %llu: reply %llu over the message cap",
			(unsigned long long)c->id, (unsigned long long)resp->id);
		err.id = resp->id;
		err.status = KVPALACE__V1__STATUS__STATUS_INTERNAL;
		err.error = "reply too large";
		resp = &err;
		n = frame_packed_bytes(&resp->base);
		if (pass_fd >= 0)
			close(pass_fd);
		pass_fd = -1;
	}
	o = malloc(sizeof(*o) + n);
	if (!o) {
		/* Without its reply the client would wait forever: end the
		 * connection once what is queued is out. */
		log_err("connection %llu: out of memory for a reply", (unsigned long long)c->id);
		if (pass_fd >= 0)
			close(pass_fd);
		c->draining = 1;
		return;
	}
	frame_pack_sized(&resp->base, n, o->buf);
	o->len = n;
	o->batch = batch;
	o->fd = pass_fd;
	o->next = NULL;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->n_out++;
}

static void pop_reply(struct conn *c)
{
	struct conn_out *o = c->out_head;

	c->out_head = o->next;
	if (!c->out_head)
		c->out_tail = NULL;
	c->n_out--;
	if (o->fd >= 0)
		close(o->fd);
	free(o);
}

/* Sends queued replies with as few system calls as possible: sendmmsg
 * without blocking while the socket has room, then one ring send that
 * waits for room. Replies to the frames of one multi-frame datagram are
 * gathered into one datagram (iovecs, no copy). Returns 0, or -1 when the
 * connection was closed. */
static int flush_replies(struct conn *c)
{
	uint32_t max_bytes = c->srv->cfg->max_message_bytes;
	struct mmsghdr mm[CONN_SEND_BATCH];
	struct iovec iov[CONN_SEND_IOVS];
	unsigned int per_msg[CONN_SEND_BATCH];
	unsigned char cbuf[CONN_SEND_BATCH][FRAME_CMSG_BYTES];

	while (c->out_head && !c->sending) {
		struct conn_out *o = c->out_head;
		unsigned int k = 0, n_iov = 0;
		int n;

		memset(mm, 0, sizeof(mm));
		while (o && k < CONN_SEND_BATCH && n_iov < CONN_SEND_IOVS) {
			struct msghdr *h = &mm[k].msg_hdr;
			size_t bytes = 0;
			uint64_t batch = o->batch;

			h->msg_iov = &iov[n_iov];
			per_msg[k] = 0;
			if (o->fd >= 0)
				frame_cmsg_put_fd(h, cbuf[k], o->fd);
			do {
				iov[n_iov].iov_base = o->buf;
				iov[n_iov].iov_len = o->len;
				n_iov++;
				per_msg[k]++;
				bytes += o->len;
				o = o->next;
			} while (o && batch && o->batch == batch && o->fd < 0 &&
				 h->msg_control == NULL && bytes + o->len <= max_bytes &&
				 n_iov < CONN_SEND_IOVS);
			h->msg_iovlen = per_msg[k];
			k++;
		}
		n = sendmmsg(c->fd, mm, k, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			submit_send(c);
			break;
		}
		if (n < 0) {
			if (errno != EPIPE && errno != ECONNRESET)
				log_info("connection %llu: send: %s", (unsigned long long)c->id,
					 strerror(errno));
			conn_close(c, 0);
			return -1;
		}
		for (int i = 0; i < n; i++)
			for (unsigned int j = 0; j < per_msg[i]; j++)
				pop_reply(c);
	}
	if (!c->out_head && c->draining) {
		conn_close(c, 0);
		return -1;
	}
	return 0;
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
	queue_reply(c, &resp, -1, 0);
}

/* Unpacks, dispatches and answers one frame's payload, tried times
 * parked before. Returns 1 when it was parked again (no reply yet). */
static int run_frame(struct conn *c, const uint8_t *payload, size_t len, uint64_t batch,
		     unsigned int tries)
{
	struct server *srv = c->srv;
	Kvpalace__V1__Request *req;
	struct reply r;

	frame_arena_reset(&srv->arena);
	req = frame_unpack_request(&srv->arena, payload, len);
	if (!req) {
		fail_conn(c, 0, -EPROTO, "undecodable request");
		return 0;
	}
	srv->cache.no_park = tries >= CONN_MAX_PARK_TRIES;
	c->cur_batch = batch;
	switch (dispatch(&srv->cache, c, req, &r)) {
	case 1:
		tier_wait(r.park, &c->waiter);
		c->parked = 1;
		reply_fini(&r);
		cache_debug_check(&srv->cache);
		return 1;
	case 2:
		/* Answered later (conn_deliver); what follows waits. */
		srv->cache.ctr.requests++;
		c->parked = 1;
		reply_fini(&r);
		cache_debug_check(&srv->cache);
		return 2;
	}
	srv->cache.ctr.requests++;
	if (r.resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		srv->cache.ctr.errors++;
	queue_reply(c, &r.resp, r.pass_fd, batch);
	reply_fini(&r);
	cache_debug_check(&srv->cache);
	return 0;
}

/* Keeps a copy of a frame to run later: at the tail behind a parked
 * request, or at the head when it is the parked one. */
static void hold(struct conn *c, const uint8_t *payload, size_t len, uint64_t batch,
		 unsigned int tries, int at_head)
{
	struct conn_held *h = malloc(sizeof(*h) + len);

	if (!h) {
		fail_conn(c, 0, -ENOMEM, "out of memory for a waiting request");
		return;
	}
	memcpy(h->payload, payload, len);
	h->len = len;
	h->batch = batch;
	h->tries = tries;
	h->next = NULL;
	if (at_head) {
		h->next = c->held_head;
		c->held_head = h;
		if (!c->held_tail)
			c->held_tail = h;
	} else {
		if (c->held_tail)
			c->held_tail->next = h;
		else
			c->held_head = h;
		c->held_tail = h;
	}
	c->n_held++;
}

static void handle_frame(struct conn *c, const uint8_t *payload, size_t len, uint64_t batch)
{
	if (c->held_head) {
		hold(c, payload, len, batch, 0, 0); /* in order, behind the parked one */
		return;
	}
	if (run_frame(c, payload, len, batch, 0) == 1)
		hold(c, payload, len, batch, 1, 1);
}

/* Runs held frames in order until one parks again or none is left. */
static void run_held(struct conn *c)
{
	while (c->held_head && !c->parked && !c->draining && !c->closed) {
		struct conn_held *h = c->held_head;
		int ret = run_frame(c, h->payload, h->len, h->batch, h->tries);

		if (ret == 1) {
			h->tries++;
			break;
		}
		c->held_head = h->next;
		if (!c->held_head)
			c->held_tail = NULL;
		c->n_held--;
		free(h);
	}
}

static int may_receive(const struct conn *c)
{
	return !c->draining && c->n_out < CONN_MAX_QUEUED && c->n_held < CONN_MAX_HELD;
}

/* Runs what waited behind a parked request and resumes receiving. */
static void unpark(struct conn *c)
{
	c->parked = 0;
	run_held(c);
	if (c->closed || flush_replies(c) < 0)
		return;
	if (!c->receiving && may_receive(c))
		submit_recv(c);
}

/* The pool this connection waited on made progress. */
static void on_wake(struct tier_waiter *w)
{
	unpark((struct conn *)((char *)w - offsetof(struct conn, waiter)));
}

void conn_ticket_start(struct conn *c, struct conn_ticket *t, uint64_t id)
{
	t->conn = c;
	t->id = id;
	t->batch = c->cur_batch;
	c->ticket = t;
}

void conn_deliver(struct conn_ticket *t, struct reply *r)
{
	struct conn *c = t->conn;

	if (!c) {
		if (r->pass_fd >= 0)
			close(r->pass_fd);
		return;
	}
	t->conn = NULL;
	c->ticket = NULL;
	r->resp.id = t->id;
	if (r->resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		c->srv->cache.ctr.errors++;
	queue_reply(c, &r->resp, r->pass_fd, t->batch);
	r->pass_fd = -1;
	unpark(c);
}

/* Handles one received datagram of n bytes in buf, received with msg: one
 * frame, or up to FRAME_MAX_BATCH frames back to back. */
static void handle_message(struct conn *c, const unsigned char *buf, size_t n, struct msghdr *msg)
{
	uint32_t max_bytes = c->srv->cfg->max_message_bytes;
	unsigned int frames = 0;
	const uint8_t *payload;
	size_t off = 0, len;
	uint64_t batch;
	int fd, ret;

	fd = frame_cmsg_fd(msg);
	if (fd >= 0) {
		close(fd);
		fail_conn(c, 0, -EPROTO, "clients must not send file descriptors");
		return;
	}
	if (msg->msg_flags & (MSG_TRUNC | MSG_CTRUNC) || n > max_bytes) {
		fail_conn(c, 0, -EMSGSIZE, "message larger than max_message_bytes");
		return;
	}
	/* Replies to a single frame are never gathered with others. */
	batch = ++c->rx_datagrams;
	while ((ret = frame_next(buf, n, &off, max_bytes, &payload, &len)) > 0) {
		if (++frames > FRAME_MAX_BATCH) {
			fail_conn(c, 0, -EPROTO, "more frames in one message than allowed");
			return;
		}
		handle_frame(c, payload, len, off == n && frames == 1 ? 0 : batch);
		if (c->draining)
			return;
	}
	if (ret < 0)
		fail_conn(c, 0, ret == -EPROTONOSUPPORT ? ret : -EPROTO,
			  ret == -EPROTONOSUPPORT ? "unsupported frame version"
						  : "malformed frame header");
}

int conn_rx_init(struct conn_rx *rx, uint32_t max_message_bytes)
{
	rx->slot_bytes = (size_t)max_message_bytes + 1;
	rx->buf = malloc(rx->slot_bytes * CONN_RECV_BATCH);
	return rx->buf ? 0 : -ENOMEM;
}

void conn_rx_fini(struct conn_rx *rx)
{
	free(rx->buf);
	rx->buf = NULL;
}

/* Receives and handles the datagrams already queued on the socket, as many
 * as the reply queue has room for. Returns 0, or -1 when the peer closed
 * or the socket failed. */
static int drain_socket(struct conn *c)
{
	struct conn_rx *rx = &c->srv->rx;

	while (may_receive(c)) {
		/* Each datagram may add FRAME_MAX_BATCH replies: take only as
		 * many as surely fit, and one at a time near the limit, so at
		 * most CONN_MAX_QUEUED + FRAME_MAX_BATCH - 1 are ever queued. */
		unsigned int want = (CONN_MAX_QUEUED - c->n_out) / FRAME_MAX_BATCH;
		int k;

		if (want == 0)
			want = 1;
		if (want > CONN_RECV_BATCH)
			want = CONN_RECV_BATCH;
		memset(rx->mm, 0, sizeof(rx->mm[0]) * want);
		for (unsigned int i = 0; i < want; i++) {
			rx->iov[i].iov_base = rx->buf + i * rx->slot_bytes;
			rx->iov[i].iov_len = rx->slot_bytes;
			rx->mm[i].msg_hdr.msg_iov = &rx->iov[i];
			rx->mm[i].msg_hdr.msg_iovlen = 1;
			rx->mm[i].msg_hdr.msg_control = rx->cbuf[i];
			rx->mm[i].msg_hdr.msg_controllen = FRAME_CMSG_BYTES;
		}
		k = recvmmsg(c->fd, rx->mm, want, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, NULL);
		if (k < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
		for (int i = 0; i < k; i++) {
			if (rx->mm[i].msg_len == 0)
				return -1; /* end of stream */
			if (c->draining) {
				/* Dropped: the connection ends; only fds need closing. */
				int fd = frame_cmsg_fd(&rx->mm[i].msg_hdr);

				if (fd >= 0)
					close(fd);
				continue;
			}
			handle_message(c, rx->buf + i * rx->slot_bytes, rx->mm[i].msg_len,
				       &rx->mm[i].msg_hdr);
		}
		if ((unsigned int)k < want)
			break;
	}
	return 0;
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
	handle_message(c, c->rbuf, (size_t)res, &c->rmsg);
	/* The ring said one message is there; a pipelining client has usually
	 * sent more. Take them in one recvmmsg without blocking, so one wakeup
	 * serves a batch. */
	if (!c->draining && drain_socket(c) < 0) {
		/* The peer is gone: flush what the socket still takes. */
		if (flush_replies(c) == 0)
			conn_close(c, 0);
		return;
	}
	if (flush_replies(c) < 0)
		return;
	if (may_receive(c))
		submit_recv(c);
}

static void on_send(struct loop_op *op, int res, unsigned int flags)
{
	struct conn *c = (struct conn *)((char *)op - offsetof(struct conn, send_op));

	(void)flags;
	c->sending = 0;
	pop_reply(c);
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
	if (flush_replies(c) < 0)
		return;
	/* Receiving paused while too many replies were queued. */
	if (!c->receiving && may_receive(c))
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
	c->waiter.wake = on_wake;
	list_init(&c->waiter.link);
	list_init(&c->leases);
	list_init(&c->writing);
	list_add_tail(&srv->conns, &c->link);
	srv->cache.ctr.connections++;
	log_debug("connection %llu from pid %d uid %u%s", (unsigned long long)c->id, (int)c->pid,
		  (unsigned)c->uid, admin ? " (admin)" : "");
	submit_recv(c);
	return 0;
}
