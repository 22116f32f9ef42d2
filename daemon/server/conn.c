/* daemon/server/conn.c — receive, check, dispatch and reply (see conn.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "dispatch.h"
#include "evpub.h"
#include "evsub.h"
#include "lease.h"
#include "list.h"
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
	uint64_t parked_ns; /* when it was first parked (clock_now_ns), 0: never */
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

/* Releases what a closing connection held and logs it, once: a client
 * that died (or just went) leaves sessions, leases and reservations, and
 * an administrator wondering where pages went should find who left what. */
static void release_client_state(struct conn *c, int bad)
{
	struct cache *cache = &c->srv->cache;
	struct session_left left = {0};
	uint64_t leased = c->peer.n_leased_pages, rolled_back = 0;
	uint32_t leases = c->peer.n_leases;
	struct list *it, *tmp;

	dispatch_peer_gone(&c->peer);
	list_for_each_safe (it, tmp, &c->peer.leases)
		lease_release(cache, list_entry(it, struct lease, owner_link));
	c->peer.n_leases = 0;
	c->peer.n_leased_pages = 0;
	list_for_each_safe (it, tmp, &c->peer.writing.sessions) {
		struct session *s = list_entry(it, struct session, writer_link);

		rolled_back += s->n_tokens - s->n_committed;
		session_rollback(cache, s);
	}
	kvp_assert(c->peer.writing.reserved_pages == 0);
	/* Its sessions die with it unless persistent; their committed full
	 * pages stay in the prefix index. */
	session_owner_release(cache, &c->peer.sessions, &left);
	cache_debug_check(cache);
	if (!left.closed && !left.persistent && !leases && !rolled_back) {
		log_ctx_debug(LOG_CONN(c->id, c->peer.uid, c->peer.pid),
			      "connection %llu (pid %d uid %u) closed%s", (unsigned long long)c->id,
			      (int)c->peer.pid, (unsigned)c->peer.uid,
			      bad ? " for misbehaviour" : "");
		return;
	}
	log_ctx_info(
		LOG_CONN(c->id, c->peer.uid, c->peer.pid),
		"connection %llu (pid %d uid %u) closed%s: %u session%s closed with it (%llu "
		"tokens, %llu pages, %llu freed), %u persistent kept; %u lease%s released (%llu "
		"pages); %llu uncommitted tokens rolled back",
		(unsigned long long)c->id, (int)c->peer.pid, (unsigned)c->peer.uid,
		bad ? " for misbehaviour" : "", left.closed, log_s(left.closed),
		(unsigned long long)left.tokens, (unsigned long long)left.pages,
		(unsigned long long)left.freed, left.persistent, leases, log_s(leases),
		(unsigned long long)leased, (unsigned long long)rolled_back);
}

#ifdef KVP_DEBUG_CHECKS
/* Every connection's counts agree with what it holds: the reserved pages
 * of the sessions it writes, its leases and their pages. O(connections +
 * those). */
static void check_accounts(const struct server *srv)
{
	for (const struct list *it = srv->conns.next; it != &srv->conns; it = it->next) {
		const struct conn *c = list_entry(it, struct conn, link);
		const struct list *w = &c->peer.writing.sessions, *l = &c->peer.leases;
		const struct list *o = &c->peer.sessions.sessions;
		uint32_t reserved = 0, leases = 0, owned = 0;
		uint64_t leased = 0;

		for (const struct list *s = w->next; s != w; s = s->next)
			reserved +=
				session_reserved_pages(list_entry(s, struct session, writer_link));
		for (const struct list *s = l->next; s != l; s = s->next) {
			leases++;
			leased += list_entry(s, struct lease, owner_link)->n_pages;
		}
		for (const struct list *s = o->next; s != o; s = s->next) {
			kvp_assert(list_entry(s, struct session, owner_link)->owner ==
				   &c->peer.sessions);
			owned++;
		}
		kvp_assert(owned == c->peer.sessions.n_sessions);
		kvp_assert(reserved == c->peer.writing.reserved_pages);
		kvp_assert(leases == c->peer.n_leases);
		kvp_assert(leased == c->peer.n_leased_pages);
	}
}
#define conn_debug_check(srv) check_accounts(srv)
#else
#define conn_debug_check(srv) ((void)(srv))
#endif

/* ---- admission ----------------------------------------------------------- */

struct conn_uid_count {
	uint32_t n;
};

static struct conn_uid_count *uid_count(struct conn_census *cs, uid_t uid)
{
	return idmap_get(&cs->per_uid, (uint64_t)uid + 1);
}

void conn_census_fini(struct conn_census *cs)
{
	for (size_t i = 0; i < cs->per_uid.cap; i++)
		if (cs->per_uid.slots[i].id)
			free(cs->per_uid.slots[i].ptr);
	idmap_fini(&cs->per_uid);
	memset(cs, 0, sizeof(*cs));
}

/* Counts c in (or, when add is 0, out of) the census. Returns 0 or
 * -ENOMEM (counting in only). */
static int census_count(struct conn_census *cs, const struct conn *c, int add)
{
	struct conn_uid_count *u;

	if (c->peer.admin) {
		if (add)
			cs->n_admin++;
		else
			cs->n_admin--;
		return 0;
	}
	u = uid_count(cs, c->peer.uid);
	if (add) {
		if (!u) {
			u = calloc(1, sizeof(*u));
			if (!u || idmap_put(&cs->per_uid, (uint64_t)c->peer.uid + 1, u) < 0) {
				free(u);
				return -ENOMEM;
			}
		}
		u->n++;
		cs->n_client++;
		return 0;
	}
	kvp_assert(u && u->n > 0 && cs->n_client > 0);
	cs->n_client--;
	if (--u->n == 0)
		free(idmap_del(&cs->per_uid, (uint64_t)c->peer.uid + 1));
	return 0;
}

/* Logs a refused connection, at most CONN_REFUSALS_LOGGED_PER_S lines a
 * second: a flood of connections must not flood the journal too. */
__attribute__((format(printf, 2, 3))) static void log_refusal(struct conn_census *cs,
							      const char *fmt, ...)
{
	struct timespec ts;
	char line[256];
	va_list ap;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	if ((uint64_t)ts.tv_sec != cs->log_second) {
		cs->log_second = (uint64_t)ts.tv_sec;
		cs->logged = 0;
	}
	if (cs->logged >= CONN_REFUSALS_LOGGED_PER_S) {
		cs->unlogged++;
		return;
	}
	cs->logged++;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (cs->unlogged)
		log_warn("%s (and %llu refused connections not logged before it)", line,
			 (unsigned long long)cs->unlogged);
	else
		log_warn("%s", line);
	cs->unlogged = 0;
}

void conn_census_tick(struct conn_census *cs)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (!cs->unlogged || (uint64_t)ts.tv_sec == cs->log_second)
		return;
	log_warn("%llu more connections refused (not logged one by one)",
		 (unsigned long long)cs->unlogged);
	cs->unlogged = 0;
}

/* Answers a connection we refuse with one error reply, id 0 (the library
 * returns its status from whatever call it is in, kvp_connect's Hello
 * included), and closes it. What the peer sent already is read and dropped
 * first (fds closed): closing a socket with unread data would reset the
 * peer's, which then could not read why it was refused. */
static void refuse(int fd, int status, const char *why)
{
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
	unsigned char buf[512], cbuf[FRAME_CMSG_BYTES];
	size_t n, op_bytes;

	resp.status = status;
	resp.error = (char *)why;
	n = frame_response_packed_bytes(&resp, &op_bytes);
	if (n <= sizeof(buf)) {
		frame_response_pack_sized(&resp, n, op_bytes, buf);
		(void)send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	for (int i = 0; i < 16; i++) {
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
		struct msghdr msg = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = cbuf,
			.msg_controllen = sizeof(cbuf),
		};
		ssize_t got = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		int passed;

		if (got < 0)
			break;
		passed = frame_cmsg_fd(&msg);
		if (passed >= 0)
			close(passed);
		if (got == 0)
			break; /* the end of the stream (or an empty datagram) */
	}
	close(fd);
}

/* Whether a connection of cred on the client socket (or the admin socket
 * when admin) may be served now. Returns 0, or -EDQUOT after refusing it. */
static int admit(struct server *srv, int fd, const struct ucred *cred, int admin)
{
	const struct config *cfg = srv->cfg;
	struct conn_census *cs = &srv->census;
	const struct conn_uid_count *u;
	char why[160];

	if (admin) {
		if (cs->n_admin < CONN_MAX_ADMIN)
			return 0;
		snprintf(why, sizeof(why), "too many admin connections (%u)", CONN_MAX_ADMIN);
	} else if (cs->n_client >= cfg->max_connections) {
		snprintf(why, sizeof(why), "too many connections (max-connections %u)",
			 cfg->max_connections);
	} else if (!cache_fd_room_conn(&srv->cache, cs->n_client)) {
		snprintf(why, sizeof(why),
			 "too many connections for the daemon's file descriptors (RLIMIT_NOFILE)");
	} else if ((u = uid_count(cs, cred->uid)) && u->n >= cfg->max_connections_per_user) {
		snprintf(why, sizeof(why),
			 "too many connections of uid %u (max-connections-per-user %u)",
			 (unsigned)cred->uid, cfg->max_connections_per_user);
	} else {
		return 0;
	}
	log_refusal(cs, "refusing a connection from pid %d uid %u: %s", (int)cred->pid,
		    (unsigned)cred->uid, why);
	refuse(fd, KVPALACE__V1__STATUS__STATUS_LIMIT, why);
	return -EDQUOT;
}

void conn_close(struct conn *c, int bad)
{
	if (c->closed)
		return;
	c->closed = 1;
	tier_unwait(&c->waiter);
	if (c->ticket)
		c->ticket->peer = NULL;
	c->ticket = NULL;
	c->parked = 0;
	free_held(c);
	if (bad)
		cache_count(&c->srv->cache, c->peer.uid, disconnects_bad, 1);
	cache_count(&c->srv->cache, c->peer.uid, connections, -1);
	census_count(&c->srv->census, c, 0);
	if (c->ev_listed)
		list_del(&c->ev_link);
	c->ev_listed = 0;
	release_client_state(c, bad);
	list_del(&c->link);
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
	reset_rmsg(c);
	loop_recvmsg(&c->srv->loop, &c->recv_op, c->fd, &c->rmsg, MSG_CMSG_CLOEXEC);
	c->receiving = 1;
}

static void submit_send(struct conn *c)
{
	struct conn_out *o = c->out_head;

	memset(&c->smsg, 0, sizeof(c->smsg));
	c->siov.iov_base = o->buf;
	c->siov.iov_len = o->len;
	c->smsg.msg_iov = &c->siov;
	c->smsg.msg_iovlen = 1;
	if (o->fd >= 0)
		frame_cmsg_put_fd(&c->smsg, c->scbuf, o->fd);
	loop_sendmsg(&c->srv->loop, &c->send_op, c->fd, &c->smsg, MSG_NOSIGNAL);
	c->sending = 1;
}

/* Sends a reply of n packed bytes straight away, without queueing it (and
 * so without allocating): only when nothing is queued or being sent before
 * it, so replies stay in order, and only when the socket takes it whole
 * now. Takes pass_fd on success. Returns 0, or -1 when it was not sent. */
static int send_unqueued(struct conn *c, const Kvpalace__V1__Response *resp, size_t n,
			 size_t op_bytes, int pass_fd)
{
	static unsigned char buf[FRAME_MAX_MAX_BYTES]; /* loop thread only */
	unsigned char cbuf[FRAME_CMSG_BYTES];
	struct iovec iov = {.iov_base = buf, .iov_len = n};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

	if (c->out_head || c->sending || c->closed || n > sizeof(buf))
		return -1;
	frame_response_pack_sized(resp, n, op_bytes, buf);
	if (pass_fd >= 0)
		frame_cmsg_put_fd(&msg, cbuf, pass_fd);
	if (sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)n)
		return -1;
	if (pass_fd >= 0)
		close(pass_fd);
	return 0;
}

/* Queues a packed reply; takes ownership of pass_fd. */
static void queue_reply(struct conn *c, const Kvpalace__V1__Response *resp, int pass_fd,
			uint64_t batch)
{
	Kvpalace__V1__Response err = KVPALACE__V1__RESPONSE__INIT;
	size_t op_bytes, n = frame_response_packed_bytes(resp, &op_bytes);
	struct conn_out *o;

	if (n > c->srv->cfg->max_message_bytes) {
		/* Only a reply the dispatcher failed to bound gets here. */
		log_ctx_err(LOG_CONN(c->id, c->peer.uid, c->peer.pid),
			    "connection %llu: reply %llu over the message cap",
			    (unsigned long long)c->id, (unsigned long long)resp->id);
		err.id = resp->id;
		err.status = KVPALACE__V1__STATUS__STATUS_INTERNAL;
		err.error = "reply too large";
		resp = &err;
		n = frame_response_packed_bytes(resp, &op_bytes);
		if (pass_fd >= 0)
			close(pass_fd);
		pass_fd = -1;
	}
	o = malloc(sizeof(*o) + n);
	if (!o) {
		/* The request took effect: a lost reply would leave the client
		 * without the id of what it made (a session, a lease). Send it
		 * at once when it can go out in order, else end the connection
		 * once what is queued is out (the client would wait forever). */
		if (send_unqueued(c, resp, n, op_bytes, pass_fd) == 0)
			return;
		log_ctx_err(LOG_CONN(c->id, c->peer.uid, c->peer.pid),
			    "connection %llu: out of memory for a reply",
			    (unsigned long long)c->id);
		if (pass_fd >= 0)
			close(pass_fd);
		c->draining = 1;
		return;
	}
	frame_response_pack_sized(resp, n, op_bytes, o->buf);
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

/* KV event pushes queued at most per subscriber: more wait in the ring. */
#define CONN_EVENT_QUEUE 4u

/* Sends c's pending event pushes, a few queued at a time, until none is
 * left or its socket is full (then on_send comes back for the rest).
 * Returns 0, or -1 when c was closed. */
static int push_events(struct conn *c)
{
	struct cache *cache = &c->srv->cache;
	struct reply r;
	int ret = 1;

	while (ret > 0 && !c->sending && !c->closed && !c->draining) {
		while (c->n_out < CONN_EVENT_QUEUE && evsub_pending(cache, &c->peer)) {
			ret = evsub_next(cache, &c->peer, &r, c->srv->cfg->max_message_bytes);
			if (ret > 0)
				queue_reply(c, &r.resp, -1, 0);
			reply_fini(&r);
			if (ret <= 0)
				break;
		}
		if (flush_replies(c) < 0)
			return -1;
		if (!evsub_pending(cache, &c->peer))
			break;
	}
	return 0;
}

void conn_push_events(struct server *srv)
{
	struct list *it, *tmp;

	evpub_pump(&srv->cache); /* the cluster's stream, if any */
	if (srv->events_pushed == srv->cache.events.next_seq)
		return; /* the subscribers held back wait for their sends */
	srv->events_pushed = srv->cache.events.next_seq;
	list_for_each_safe (it, tmp, &srv->subscribers)
		push_events(list_entry(it, struct conn, ev_link));
}

/* Replies with an error and closes the connection once the reply is out. */
static void fail_conn(struct conn *c, uint64_t id, int err, const char *why)
{
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;

	log_ctx_info(LOG_CONN(c->id, c->peer.uid, c->peer.pid),
		     "connection %llu (pid %d uid %u): %s; disconnecting",
		     (unsigned long long)c->id, (int)c->peer.pid, (unsigned)c->peer.uid, why);
	cache_count(&c->srv->cache, c->peer.uid, errors, 1);
	cache_count(&c->srv->cache, c->peer.uid, disconnects_bad, 1);
	resp.id = id;
	resp.status = status_from_errno(err);
	resp.error = (char *)why;
	c->draining = 1;
	queue_reply(c, &resp, -1, 0);
}

/* Unpacks, dispatches and answers one frame's payload, first parked at
 * parked_ns (0: never). Returns 0 when answered, -EAGAIN when it was
 * parked again or -EINPROGRESS when a worker answers it (no reply yet). */
static int run_frame(struct conn *c, const uint8_t *payload, size_t len, uint64_t batch,
		     uint64_t parked_ns)
{
	struct server *srv = c->srv;
	Kvpalace__V1__Request *req;
	struct reply r;
	int no_park;

	frame_arena_reset(&srv->arena);
	req = frame_unpack_request(&srv->arena, payload, len);
	if (!req) {
		fail_conn(c, 0, -EPROTO, "undecodable request");
		return 0;
	}
	if (frame_string_has_nul(&kvpalace__v1__request__descriptor, payload, len)) {
		/* A name would be cut at its NUL ("ok\0/../x" is "ok"). */
		Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;

		resp.id = req->id;
		resp.status = KVPALACE__V1__STATUS__STATUS_INVALID;
		resp.error = "a string field holds a NUL byte";
		cache_count(&srv->cache, c->peer.uid, requests, 1);
		cache_count(&srv->cache, c->peer.uid, errors, 1);
		queue_reply(c, &resp, -1, batch);
		return 0;
	}
	/* Bounded by time, not by wake-ups: a pool busy with other clients'
	 * I/O wakes its waiters often, while a request's own reads are still
	 * coming (issue 13: a match gave up after 64 wake-ups). */
	no_park = parked_ns && clock_now_ns() - parked_ns >= PEER_MAX_PARK_NS;
	c->cur_batch = batch;
	switch (dispatch(&srv->cache, &c->peer, req, no_park, &r)) {
	case -EAGAIN:
		tier_wait(r.park, &c->waiter);
		c->parked = 1;
		reply_fini(&r);
		cache_debug_check(&srv->cache);
		conn_debug_check(srv);
		return -EAGAIN;
	case -EINPROGRESS:
		/* Answered later (deliver); what follows waits. */
		cache_count(&srv->cache, c->peer.uid, requests, 1);
		c->parked = 1;
		reply_fini(&r);
		cache_debug_check(&srv->cache);
		conn_debug_check(srv);
		return -EINPROGRESS;
	}
	cache_count(&srv->cache, c->peer.uid, requests, 1);
	if (r.resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		cache_count(&srv->cache, c->peer.uid, errors, 1);
	queue_reply(c, &r.resp, r.pass_fd, batch);
	reply_fini(&r);
	if (c->peer.ev_sub && !c->ev_listed) {
		/* Subscribed just now: its pushes follow this reply. */
		list_add_tail(&srv->subscribers, &c->ev_link);
		c->ev_listed = 1;
	}
	cache_debug_check(&srv->cache);
	conn_debug_check(srv);
	return 0;
}

/* Keeps a copy of a frame to run later: at the tail behind a parked
 * request, or at the head when it is the parked one. */
static void hold(struct conn *c, const uint8_t *payload, size_t len, uint64_t batch,
		 uint64_t parked_ns, int at_head)
{
	struct conn_held *h = malloc(sizeof(*h) + len);

	if (!h) {
		fail_conn(c, 0, -ENOMEM, "out of memory for a waiting request");
		return;
	}
	memcpy(h->payload, payload, len);
	h->len = len;
	h->batch = batch;
	h->parked_ns = parked_ns;
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
	/* Behind a parked request, in order: one parked on the disk tier is
	 * itself held, one answered by a worker (a ticket) is not, so both
	 * tests are needed — without the second, a pipelined worker request
	 * started a second job whose ticket replaced the first's, and the
	 * first job then delivered to a freed connection. */
	if (c->held_head || c->parked) {
		hold(c, payload, len, batch, 0, 0);
		return;
	}
	if (run_frame(c, payload, len, batch, 0) == -EAGAIN)
		hold(c, payload, len, batch, clock_now_ns(), 1);
}

/* Runs held frames in order until one parks again or none is left. */
static void run_held(struct conn *c)
{
	c->peer.turn_ns = 0; /* a turn starts: nothing answered in it yet */
	while (c->held_head && !c->parked && !c->draining && !c->closed) {
		struct conn_held *h = c->held_head;
		/* Held behind a parked one, it never parked itself yet: its
		 * wait starts when it does. */
		int ret = run_frame(c, h->payload, h->len, h->batch, h->parked_ns);

		if (ret == -EAGAIN) {
			if (!h->parked_ns)
				h->parked_ns = clock_now_ns();
			break;
		}
		c->held_head = h->next;
		if (!c->held_head)
			c->held_tail = NULL;
		c->n_held--;
		free(h);
	}
}

/* Requests of this connection in flight in the daemon: replies waiting
 * for room in its socket, and frames waiting behind a parked request. */
static unsigned int in_flight(const struct conn *c)
{
	return c->n_out + c->n_held;
}

static int may_receive(const struct conn *c)
{
	return !c->draining && in_flight(c) < c->srv->cfg->max_requests_in_flight;
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
	unpark(container_of(w, struct conn, waiter));
}

void conn_park_tick(struct server *srv)
{
	uint64_t now = clock_now_ns();

	/* A pool whose I/O never completes wakes nobody: its requests past
	 * PEER_MAX_PARK_NS run again here and take their miss. */
	for (struct list *it = srv->cache.pool_list.next; it != &srv->cache.pool_list;
	     it = it->next) {
		struct pool *p = list_entry(it, struct pool, link);
		int expired = 0;

		for (struct list *w = p->waiters.next; w != &p->waiters && !expired; w = w->next) {
			struct tier_waiter *tw = list_entry(w, struct tier_waiter, link);
			struct conn *c;

			if (tw->wake != on_wake)
				continue;
			c = container_of(tw, struct conn, waiter);
			expired = c->held_head && c->held_head->parked_ns &&
				  now - c->held_head->parked_ns >= PEER_MAX_PARK_NS;
		}
		if (expired)
			tier_wake_all(p);
	}
}

static struct conn *conn_of(struct peer *p)
{
	return container_of(p, struct conn, peer);
}

static void ticket_start_op(struct peer *p, struct ticket *t, uint64_t id)
{
	struct conn *c = conn_of(p);

	/* One request at a time is answered later (handle_frame holds the
	 * rest): a second ticket would be forgotten by conn_close. */
	kvp_assert(!c->ticket);
	t->peer = p;
	t->id = id;
	t->batch = c->cur_batch;
	c->ticket = t;
}

static void deliver_op(struct ticket *t, struct reply *r)
{
	struct conn *c = conn_of(t->peer);

	t->peer = NULL;
	c->ticket = NULL;
	r->resp.id = t->id;
	if (r->resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		cache_count(&c->srv->cache, c->peer.uid, errors, 1);
	queue_reply(c, &r->resp, r->pass_fd, t->batch);
	r->pass_fd = -1;
	unpark(c);
}

static int reload_config_op(struct peer *p, const char *who, struct confview_reload *ret, char *err,
			    size_t errlen)
{
	struct server *srv = conn_of(p)->srv;

	return srv->reload(srv, who, ret, err, errlen);
}

/* What the service layer may ask of a connection (service/peer.h). */
static const struct peer_ops conn_peer_ops = {
	.ticket_start = ticket_start_op,
	.deliver = deliver_op,
	.reload_config = reload_config_op,
};

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
		/* Each datagram may add FRAME_MAX_BATCH replies or held
		 * frames: take only as many as surely fit, and one at a time
		 * near the limit, so at most max-requests-in-flight +
		 * FRAME_MAX_BATCH - 1 are ever in flight. */
		unsigned int want =
			(c->srv->cfg->max_requests_in_flight - in_flight(c)) / FRAME_MAX_BATCH;
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
		int end = 0;

		k = recvmmsg(c->fd, rx->mm, want, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, NULL);
		if (k < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
		for (int i = 0; i < k; i++) {
			/* An empty datagram reads as the end of the stream; it
			 * and whatever came with it are dropped, but the fds
			 * they carried are ours now and must be closed. */
			if (rx->mm[i].msg_len == 0)
				end = 1;
			if (end || c->draining) {
				int fd = frame_cmsg_fd(&rx->mm[i].msg_hdr);

				if (fd >= 0)
					close(fd);
				continue;
			}
			handle_message(c, rx->buf + i * rx->slot_bytes, rx->mm[i].msg_len,
				       &rx->mm[i].msg_hdr);
		}
		if (end)
			return -1;
		if ((unsigned int)k < want)
			break;
	}
	return 0;
}

static void on_recv(struct loop_op *op, int res, unsigned int flags)
{
	struct conn *c = container_of(op, struct conn, recv_op);

	(void)flags;
	c->receiving = 0;
	if (res > 0)
		loop_kernel_wrote(c->rbuf, (size_t)res);
	loop_kernel_wrote(c->rcbuf, sizeof(c->rcbuf));
	if (res >= 0 && (c->closed || res == 0)) {
		/* Not handled (closed, or an empty datagram, which reads as
		 * the end of the stream): only a passed fd needs closing. */
		int fd = frame_cmsg_fd(&c->rmsg);

		if (fd >= 0)
			close(fd);
	}
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
	c->peer.turn_ns = 0; /* a turn starts: nothing answered in it yet */
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
	/* Last: it may close and free connections, this one too. */
	conn_push_events(c->srv);
}

static void on_send(struct loop_op *op, int res, unsigned int flags)
{
	struct conn *c = container_of(op, struct conn, send_op);

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
	if (c->ev_listed && push_events(c) < 0)
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
	if (admit(srv, fd, &cred, admin) < 0)
		return -EDQUOT;
	c = calloc(1, sizeof(*c));
	if (c)
		c->rbuf = malloc(srv->cfg->max_message_bytes + 1);
	if (c)
		peer_init(&c->peer, &conn_peer_ops, cred.uid, cred.gid, cred.pid, admin);
	if (!c || !c->rbuf || census_count(&srv->census, c, 1) < 0) {
		if (c)
			free(c->rbuf);
		free(c);
		close(fd);
		return -ENOMEM;
	}
	c->srv = srv;
	c->id = ++srv->next_conn_id;
	c->fd = fd;
	c->recv_op.cb = on_recv;
	c->send_op.cb = on_send;
	c->waiter.wake = on_wake;
	list_init(&c->waiter.link);
	list_add_tail(&srv->conns, &c->link);
	cache_count(&srv->cache, c->peer.uid, connections, 1);
	log_ctx_debug(LOG_CONN(c->id, c->peer.uid, c->peer.pid),
		      "connection %llu from pid %d uid %u%s", (unsigned long long)c->id,
		      (int)c->peer.pid, (unsigned)c->peer.uid, admin ? " (admin)" : "");
	submit_recv(c);
	return 0;
}
