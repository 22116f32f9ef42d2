/* daemon/conn.h — one client connection.
 *
 * A connection waits for datagrams through io_uring; when one arrives it
 * also takes those already queued behind it without blocking (a pipelining
 * client sends many), checks each frame, unpacks it with the server's
 * byte-budgeted arena, validates and dispatches it, and queues the reply.
 * Queued replies go out with sendmmsg while the socket has room, and
 * through the ring when it is full. When a client leaves CONN_MAX_QUEUED
 * replies unread, the connection stops receiving until they drain, so a
 * stalled reader only stalls itself and holds at most CONN_MAX_QUEUED +
 * FRAME_MAX_BATCH - 1 replies of at most max_message_bytes each. A malformed,
 * truncated or oversized message gets an error reply and the connection is
 * closed after it is sent. A request that must wait for pages from disk is
 * parked (a copy of its frame is kept and it runs again when the pool's
 * I/O completes); the connection's later frames wait behind it, so each
 * client sees its requests answered in order while others are served. Closing releases the client's leases and rolls
 * back its uncommitted reservations at once; the memory goes when the last
 * in-flight operation completes. Event-loop thread only.
 */
#ifndef KVPD_CONN_H
#define KVPD_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "frame.h"
#include "list.h"
#include "loop.h"
#include "tier.h"

#define CONN_MAX_QUEUED 256u
/* Frames held behind a request that waits for disk I/O, and how often a
 * request waits before it takes a miss instead. */
#define CONN_MAX_HELD	    256u
#define CONN_MAX_PARK_TRIES 64u
/* Messages taken per wakeup, and replies per sendmmsg. */
#define CONN_RECV_BATCH 32u
#define CONN_SEND_BATCH 32u
#define CONN_SEND_IOVS	128u

struct server;
struct conn_out;
struct conn_held;
struct reply;

/* A request answered later, when work off the event loop (a worker job)
 * is done. The connection forgets it if it closes first (conn becomes
 * NULL): the work still finishes, its answer goes nowhere. */
struct conn_ticket {
	struct conn *conn;
	uint64_t id;	/* the request's id */
	uint64_t batch; /* the datagram it came in */
};

/* Receive buffers for recvmmsg, shared by every connection: messages are
 * handled one at a time on the loop thread, straight after they arrive. */
struct conn_rx {
	struct mmsghdr mm[CONN_RECV_BATCH];
	struct iovec iov[CONN_RECV_BATCH];
	unsigned char cbuf[CONN_RECV_BATCH][FRAME_CMSG_BYTES];
	unsigned char *buf; /* CONN_RECV_BATCH slots of slot_bytes */
	size_t slot_bytes;
};

/* Allocates the shared buffers for messages of max_message_bytes (one more
 * byte per slot shows an oversized message). Returns 0 or -ENOMEM. */
int conn_rx_init(struct conn_rx *rx, uint32_t max_message_bytes);
void conn_rx_fini(struct conn_rx *rx);

struct conn {
	struct server *srv;
	uint64_t id;
	int fd;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	int admin; /* accepted on the admin socket */

	struct loop_op recv_op;
	struct msghdr rmsg;
	struct iovec riov;
	unsigned char rcbuf[FRAME_CMSG_BYTES];
	unsigned char *rbuf;   /* max_message_bytes + 1: one more shows oversize */
	int receiving;	       /* a receive is in flight */
	uint64_t rx_datagrams; /* datagrams received, numbering reply batches */

	struct loop_op send_op;
	struct msghdr smsg;
	struct iovec siov;
	unsigned char scbuf[FRAME_CMSG_BYTES];
	struct conn_out *out_head, *out_tail;
	unsigned int n_out;
	int sending; /* a send is in flight */

	/* A request waiting for disk I/O, and the frames that arrived after
	 * it: they run in order once it is answered. */
	struct conn_held *held_head, *held_tail;
	unsigned int n_held;
	int parked; /* a request waits: for disk I/O or a ticket */
	struct tier_waiter waiter;
	struct conn_ticket *ticket; /* the request answered later, or NULL */
	uint64_t cur_batch;	    /* the datagram of the request being handled */

	int draining; /* send what is queued, then close */
	int closed;   /* resources released; waiting for in-flight ops */

	struct list leases; /* struct lease.owner_link */
	uint32_t n_leases;
	struct list writing; /* struct session.writer_link */
	struct list link;    /* server.conns */
};

/* Takes over an accepted socket: reads the peer's credentials and starts
 * receiving. Returns 0 or a negative errno (the fd is closed then). */
int conn_start(struct server *srv, int fd, int admin);

/* Starts a ticket for the request being handled (its id is id), to be
 * answered later with conn_deliver; dispatch then returns 2. */
void conn_ticket_start(struct conn *c, struct conn_ticket *t, uint64_t id);
/* Sends the reply of a ticket's request (when its connection is still
 * open) and lets the connection's next requests run. Takes r's fd. */
void conn_deliver(struct conn_ticket *t, struct reply *r);

/* Closes the connection now: releases leases and reservations and frees it
 * once no operation is in flight. bad counts it as a misbehaving client. */
void conn_close(struct conn *c, int bad);

#endif
