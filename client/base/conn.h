/* client/base/conn.h — one connection to kvpalaced and its error state.
 *
 * struct kvp_client holds the socket, what the Hello handshake told us
 * (message cap, tokens per request, admin), the send/receive buffers and
 * the unpacking arena shared by every call, the list of open pools, and the
 * text of the last error. A transport or protocol failure marks the client
 * dead: the socket is closed at once (so the daemon frees our leases and
 * reservations) and every later call that needs the daemon fails with
 * -ENOTCONN. Not thread-safe: one thread at a time per client.
 *
 * Layer: base (client/README.md): the bottom of the library.
 */
#ifndef KVPC_CONN_H
#define KVPC_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "kvpalace.h"
#include "list.h"

#define CONN_ERR_MSG_BYTES 256

/* Requests submitted without waiting (rpc_submit) in flight at most: their
 * replies (a Lookup's: under 4 KiB) fit the socket buffers whether or not
 * the client reads, so a blocking send never waits on a daemon that waits
 * on us. */
#define CONN_ASYNC_MAX 16u

/* A submitted request in flight: its id and the caller's tag (NULL once
 * forgotten: its reply is dropped); frame, when not NULL, is its reply,
 * received while another call waited for its own (len bytes, malloc'd). */
struct conn_async {
	uint64_t id;
	void *tag;
	unsigned char *frame;
	size_t len;
};

struct kvp_client {
	int fd;	  /* -1 once dead or closed */
	int dead; /* a transport/protocol error happened: -ENOTCONN from now on */
	int admin;
	int gpu;
	int match_continues;  /* Hello: a match's later chunks need not wait for its lease id */
	int events;	      /* subscribed to KV events (api/events.c): for nothing else now */
	uint64_t events_next; /* the least number the next event may have */
	uint32_t uid;
	pid_t pid; /* the process that connected: a forked child may not use the socket */
	char server_version[64];    /* Hello's server_version, NUL-terminated */
	uint32_t max_message_bytes; /* the daemon's cap, header included */
	uint32_t chunk_tokens;	    /* tokens per Append/MatchPrefix request */
	uint32_t reply_pages;	    /* pages one Commit may fill: its reply lists their slots */
	uint64_t next_id;	    /* request ids start at 1; 0 never names a request */
	unsigned char *sbuf;	    /* [FRAME_MAX_MAX_BYTES] outgoing frame */
	unsigned char *rbuf;	    /* [FRAME_MAX_MAX_BYTES] incoming frame */
	unsigned char *abuf;	    /* unpacking arena for one incoming frame */
	size_t abuf_bytes;
	struct frame_arena arena;
	struct list pools;			 /* struct kvp_pool.link */
	struct conn_async async[CONN_ASYNC_MAX]; /* [n_async] in submission order */
	size_t n_async;
	int err_code; /* negative errno that err_msg explains, 0 for none */
	char err_msg[CONN_ERR_MSG_BYTES];
};

/* Resolves path (NULL or "": $KVPALACE_SOCKET, else the default socket
 * path), allocates a client and connects its socket. Returns 0 and the
 * client in *ret_client, or a negative errno (-ENAMETOOLONG, -ENOMEM, or
 * the socket's). No Hello has been exchanged yet. */
int conn_open(const char *path, struct kvp_client **ret_client);

/* Closes the socket, if open, and marks the client dead, keeping its
 * error text. */
void conn_close(struct kvp_client *c);

/* Frees the client and closes its socket; frees no handle (the caller has
 * freed its pools). */
void conn_free(struct kvp_client *c);

/* Forgets the last error message; every public call that can fail starts
 * with it so kvp_strerror() describes the latest call only. */
void conn_clear_error(struct kvp_client *c);

/* Records msg (printf format) as the text of err and returns err. */
int conn_error(struct kvp_client *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Marks the client dead: closes the socket, records msg as the text of err
 * and returns err. The mappings of its pools stay until their handles are
 * freed. */
int conn_break(struct kvp_client *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Returns 0 when the client can talk to the daemon, else -ENOTCONN (with a
 * message). */
int conn_usable(struct kvp_client *c);

#endif
