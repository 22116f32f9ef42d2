/* client/rpc/rpc.h — requests and replies on a client's socket.
 *
 * Each request is one SOCK_SEQPACKET datagram (frame header + Request with a
 * fresh id); each reply names the id it answers and replies may come in any
 * order. rpc_call() is the synchronous case: send, then receive until our
 * id comes back. Pipelining callers use rpc_send()/rpc_recv() and match ids
 * themselves. Any transport failure, malformed reply or reply to an id we
 * are not waiting for breaks the client (conn_break). Not thread-safe.
 *
 * Layer: rpc (client/README.md): above base/, below handle/ and api/.
 */
#ifndef KVPC_RPC_H
#define KVPC_RPC_H

#include <stdint.h>

#include "conn.h"
#include "kvpalace.pb-c.h"

/* Gives req the next id, packs and sends it. Returns 0 and the id in
 * *ret_id; -EMSGSIZE when req does not fit the daemon's cap (nothing was
 * sent, the client stays usable); -EBUSY on a client subscribed to KV
 * events (nothing sent); a transport error breaks the client. */
int rpc_send(struct kvp_client *c, Kvpalace__V1__Request *req, uint64_t *ret_id);

/* Receives and unpacks one reply. Returns 0 and the reply in *ret_resp,
 * valid until the next rpc_recv/rpc_call on c; a received fd goes to
 * *ret_fd (the caller owns it), else -1. Errors break the client:
 * -ECONNRESET the daemon closed the socket, -EPROTO malformed or truncated
 * reply, -EPROTONOSUPPORT other frame version, or the socket's errno. */
int rpc_recv(struct kvp_client *c, Kvpalace__V1__Response **ret_resp, int *ret_fd);

/* Waits up to timeout_ms (poll's) for the socket to be readable. Returns
 * 1 when it is, 0 when it was not in time (or a signal came), or a
 * negative errno. */
int rpc_wait(struct kvp_client *c, int timeout_ms);

/* Sends req without waiting for its reply, which rpc_reap returns with
 * tag (not NULL). Replies to submitted requests that arrive while
 * another call waits for its own are kept for rpc_reap. Returns 0;
 * -EAGAIN CONN_ASYNC_MAX are in flight (nothing sent); rpc_send's
 * errors. */
int rpc_submit(struct kvp_client *c, Kvpalace__V1__Request *req, void *tag);

/* Waits up to timeout_ms (poll's: -1 for ever, 0 not at all) for a reply
 * to a submitted request, a kept one first. Returns 1 with its tag and
 * the reply (valid until the next rpc call on c), 0 when none came in
 * time (or none is in flight, or a signal came), or a negative errno
 * (the client broken, as rpc_recv's). */
int rpc_reap(struct kvp_client *c, int timeout_ms, void **ret_tag,
	     Kvpalace__V1__Response **ret_resp);

/* Forgets the submitted requests of tag: their replies are dropped. */
void rpc_forget(struct kvp_client *c, const void *tag);

/* Handles a reply whose id matches no request in flight: a reply with id 0
 * and an error status is the daemon's last word before it closes the
 * connection; anything else is a protocol error. Breaks the client and
 * returns the negative errno to report. */
int rpc_stray(struct kvp_client *c, const Kvpalace__V1__Response *resp);

/* Turns a reply's status into 0 or a negative errno, recording the daemon's
 * message. An OK reply must carry operation `op` (-EPROTO otherwise). An
 * unknown status, STATUS_PROTOCOL and STATUS_TOO_BIG break the client: the
 * daemon closes connections that sent it such messages. */
int rpc_status(struct kvp_client *c, const Kvpalace__V1__Response *resp, int op);

/* Sends req (operation op) and waits for its reply. Returns 0 and the reply
 * in *ret_resp (valid until the next rpc call on c), or a negative errno
 * from the transport or the reply's status. When ret_fd is NULL a received
 * fd is closed; otherwise the caller owns *ret_fd (-1 when none came, and
 * always -1 on error). */
int rpc_call(struct kvp_client *c, Kvpalace__V1__Request *req, int op,
	     Kvpalace__V1__Response **ret_resp, int *ret_fd);

#endif
