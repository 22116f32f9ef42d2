/* daemon/server/conn.h — one client connection.
 *
 * A connection waits for datagrams through io_uring; when one arrives it
 * also takes those already queued behind it without blocking (a pipelining
 * client sends many), checks each frame, unpacks it with the server's
 * byte-budgeted arena, validates and dispatches it, and queues the reply.
 * Queued replies go out with sendmmsg while the socket has room, and
 * through the ring when it is full. A connection's requests in flight —
 * replies queued here that its socket had no room for, plus frames held
 * behind a parked request — are bounded by max-requests-in-flight: at the
 * bound the connection stops receiving until they drain, so a client that
 * floods or stops reading only stalls itself and holds at most
 * max-requests-in-flight + FRAME_MAX_BATCH - 1 of them, each at most
 * max_message_bytes, while every other connection is served. A malformed,
 * truncated or oversized message gets an error reply and the connection is
 * closed after it is sent. A request that must wait for pages from disk is
 * parked (a copy of its frame is kept and it runs again when the pool's
 * I/O completes); the connection's later frames wait behind it, so each
 * client sees its requests answered in order while others are served.
 * Closing releases the client's leases, rolls back its uncommitted
 * reservations and closes the sessions it owns (made or adopted on it)
 * that are not persistent, at once, and gives its persistent ones to
 * nobody (daemon/core/session.h); what it left behind is logged in one line.
 * The memory goes when the last in-flight operation completes.
 *
 * Admission: a connection on the client socket is refused past
 * max-connections (all users) or max-connections-per-user (its uid, from
 * SO_PEERCRED); one on the admin socket past CONN_MAX_ADMIN, whatever the
 * client connections, so a flood of clients never locks the administrator
 * out. A refused connection gets one error reply (id 0, STATUS_LIMIT,
 * which the library returns as -EDQUOT) and is closed at once; the
 * refusals are logged, at most CONN_REFUSALS_LOGGED_PER_S lines a second.
 * Event-loop thread only.
 */
#ifndef KVPD_CONN_H
#define KVPD_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "frame.h"
#include "idmap.h"
#include "list.h"
#include "loop.h"
#include "peer.h"
#include "session.h"
#include "tier.h"

/* Connections on the admin socket at once (not counted as clients). */
#define CONN_MAX_ADMIN 16u
/* Refused connections logged per second; the rest are counted. */
#define CONN_REFUSALS_LOGGED_PER_S 5u
/* Messages taken per wakeup, and replies per sendmmsg. */
#define CONN_RECV_BATCH 32u
#define CONN_SEND_BATCH 32u
#define CONN_SEND_IOVS	128u

struct server;
struct conn_out;
struct conn_held;
struct reply;

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

/* Open connections by socket and by user, for admission, and the rate of
 * refusal log lines. A zeroed struct is a valid empty census. */
struct conn_census {
	struct idmap per_uid; /* uid + 1 → struct conn_uid_count (client socket) */
	uint32_t n_client;
	uint32_t n_admin;
	uint64_t log_second; /* the second refusals were last logged in */
	uint32_t logged;     /* lines logged in it */
	uint64_t unlogged;   /* refusals not logged since the last line */
};

/* Frees the census (every connection must be closed). */
void conn_census_fini(struct conn_census *cs);
/* Logs how many refusals went unlogged, once their second is over; the
 * server's timer calls it every second. */
void conn_census_tick(struct conn_census *cs);

struct conn {
	struct server *srv;
	uint64_t id;
	int fd;
	/* Who it is and what it holds, as the service layer sees it
	 * (peer.admin: accepted on the admin socket). */
	struct peer peer;

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
	struct ticket *ticket; /* the request answered later, or NULL */
	uint64_t cur_batch;    /* the datagram of the request being handled */

	int draining; /* send what is queued, then close */
	int closed;   /* resources released; waiting for in-flight ops */

	struct list link; /* server.conns */
	/* A KV event subscriber (peer.ev_sub): on server.subscribers. */
	struct list ev_link;
	int ev_listed;
};

/* Takes over an accepted socket: reads the peer's credentials, admits it
 * (see above) and starts receiving. Returns 0, -EDQUOT when it was refused
 * (answered, closed and logged here), or another negative errno (the fd
 * is closed then). */
int conn_start(struct server *srv, int fd, int admin);

/* Closes the connection now: releases leases and reservations, closes the
 * sessions it owns that are not persistent, logs what it left behind, and
 * frees it once no operation is in flight. bad counts it as a misbehaving
 * client. */
void conn_close(struct conn *c, int bad);

/* Once a second (the server's tick): wakes the requests parked on a pool
 * that have waited PEER_MAX_PARK_NS, so they answer (a miss, or a drop of
 * cached pages for room) even when the pool's I/O never completes. */
void conn_park_tick(struct server *srv);

/* Pushes the KV events subscribers have not had yet, as far as each one's
 * queue has room (a slow reader waits for its own sends and loses the
 * oldest events; nobody else waits). After requests and on the tick, for
 * events that background work made. */
void conn_push_events(struct server *srv);

#endif
