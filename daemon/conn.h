/* daemon/conn.h — one client connection.
 *
 * A connection receives one datagram at a time through io_uring, checks
 * the frame, unpacks it with the server's byte-budgeted arena, validates
 * and dispatches it, and queues the reply; replies are sent one at a time
 * in order of completion. When a client queues more replies than
 * CONN_MAX_QUEUED without reading them, the connection stops receiving
 * until they drain, so a stalled reader only stalls itself. A malformed,
 * truncated or oversized message gets an error reply and the connection is
 * closed after it is sent. Closing releases the client's leases and rolls
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

#define CONN_MAX_QUEUED 64u

struct server;
struct conn_out;

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
	unsigned char *rbuf; /* max_message_bytes + 1: one more shows oversize */
	int receiving;	     /* a receive is in flight */

	struct loop_op send_op;
	struct msghdr smsg;
	struct iovec siov;
	unsigned char scbuf[FRAME_CMSG_BYTES];
	struct conn_out *out_head, *out_tail;
	unsigned int n_out;
	int sending; /* a send is in flight */

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

/* Closes the connection now: releases leases and reservations and frees it
 * once no operation is in flight. bad counts it as a misbehaving client. */
void conn_close(struct conn *c, int bad);

#endif
