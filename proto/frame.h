/* proto/frame.h — message framing, fd passing and budgeted unpacking.
 *
 * Every message on the control socket is one SOCK_SEQPACKET datagram: a
 * 16-byte header (magic "KVP1", protocol version, flags, payload length)
 * then one protobuf-c encoded Request or Response. Shared by the daemon,
 * the client library and the tests; no logging, no global state,
 * thread-safe as long as callers do not share buffers.
 */
#ifndef KVP_PROTO_FRAME_H
#define KVP_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "kvpalace.pb-c.h"

#define FRAME_MAGIC	   0x3150564bu /* "KVP1" read as a little-endian u32 */
#define FRAME_VERSION	   1u
#define FRAME_HEADER_BYTES 16u
/* Default and bounds of the whole-message cap (header included). The
 * SOCK_SEQPACKET send limit at the default SO_SNDBUF is about 208 KiB. */
#define FRAME_DEFAULT_MAX_BYTES (64u * 1024u)
#define FRAME_MIN_MAX_BYTES	(4u * 1024u)
#define FRAME_MAX_MAX_BYTES	(192u * 1024u)

/* Bytes of unpacking memory allowed per wire byte, plus a fixed slack: a
 * packed uint32 takes at least one wire byte and four in memory, every
 * submessage costs its struct. Hostile lengths hit this budget, never
 * malloc. */
#define FRAME_ARENA_FACTOR 8u
#define FRAME_ARENA_SLACK  4096u

struct frame_header {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint32_t length; /* payload bytes after the header */
	uint32_t reserved;
};
_Static_assert(sizeof(struct frame_header) == FRAME_HEADER_BYTES, "frame header is 16 bytes");

/* Writes a header for a payload of payload_bytes at buf (16 bytes). */
void frame_header_encode(void *buf, uint32_t payload_bytes);

/* Frames one datagram may carry back to back (pipelining in one system
 * call, as Redis does with -P on a stream). A datagram of one frame is the
 * usual case; the daemon answers the frames of one datagram with replies
 * that it may gather into one datagram, and never gathers replies to
 * separate datagrams, so a client that never batches never meets one. */
#define FRAME_MAX_BATCH 64u

/* Checks the header at the start of a received datagram of n bytes, whose
 * cap is max_bytes, as a datagram of exactly one frame. Returns the payload length, or -EBADMSG (shorter than a
 * header, or length disagrees with n), -EPROTO (bad magic),
 * -EPROTONOSUPPORT (other version), -EMSGSIZE (over max_bytes). */
int frame_header_check(const void *buf, size_t n, uint32_t max_bytes);

/* Walks the frames of a datagram of n bytes: call with *off = 0; each call
 * checks the frame at *off, stores where its payload starts and its length,
 * advances *off and returns 1; returns 0 once every byte is consumed. Errors
 * as frame_header_check, with -EBADMSG for a frame running past the end or
 * an empty datagram. The frame count is the caller's to limit. */
int frame_next(const void *buf, size_t n, size_t *off, uint32_t max_bytes,
	       const uint8_t **ret_payload, size_t *ret_len);

/* A bump allocator for protobuf-c unpacking: freeing is a no-op, the whole
 * arena is reset at once (frame_arena_reset). Allocations come from the
 * caller's buffer; once it is used up, from malloc'd chunks, up to a
 * budget of bytes handed out in all. An allocation past the budget fails,
 * so unpacking fails cleanly. frame_arena_init sets the budget to the
 * buffer (the arena never mallocs); frame_arena_set_budget raises it. */
struct frame_chunk;
struct frame_arena {
	unsigned char *buf;	    /* the caller's buffer */
	size_t cap;		    /* its size */
	size_t used;		    /* bytes of it handed out */
	size_t budget;		    /* bytes the arena may hand out until reset */
	size_t spent;		    /* bytes handed out since reset, alignment included */
	struct frame_chunk *chunks; /* malloc'd past buf, newest first */
	ProtobufCAllocator allocator;
};
void frame_arena_init(struct frame_arena *a, void *buf, size_t cap);
/* Frees the chunks and makes every byte available again; the budget stays. */
void frame_arena_reset(struct frame_arena *a);
/* Allows bytes in all (at least the buffer) until the next change. */
void frame_arena_set_budget(struct frame_arena *a, size_t bytes);
/* Frees the chunks; the buffer stays the caller's. Accepts NULL. */
void frame_arena_fini(struct frame_arena *a);
/* Bytes of arena the daemon gives one request of at most max_bytes: a
 * request our library builds fits (a packed uint32 takes at least one wire
 * byte and four in memory); a flood of tiny submessages does not. */
size_t frame_arena_bytes(uint32_t max_bytes);
/* Bytes of arena that unpack ANY valid Response of wire_bytes: the worst
 * case of protobuf-c 1.4's allocations (its per-field scan slabs, arrays,
 * strings, submessage structs, unknown fields) per wire byte, taken over
 * every message type a Response can hold. Replies come from the daemon,
 * whose statistics may hold thousands of small PoolStats; a client sets
 * this budget so every reply up to the cap decodes, while a hostile daemon
 * still cannot make it allocate more than this. */
size_t frame_response_bound(size_t wire_bytes);

/* Unpacks the payload of a checked frame. Returns NULL when the bytes are
 * not a valid message or the arena budget is exhausted. The message lives in
 * the arena until its next reset. */
Kvpalace__V1__Request *frame_unpack_request(struct frame_arena *a, const uint8_t *payload,
					    size_t n);
Kvpalace__V1__Response *frame_unpack_response(struct frame_arena *a, const uint8_t *payload,
					      size_t n);

/* Walks the wire bytes of a message of type d (payload of n bytes, already
 * unpacked successfully) and returns 1 when a string field, at any depth,
 * holds a NUL byte, else 0 (-EBADMSG for bytes that are no message).
 * protobuf-c hands strings over NUL-terminated, so "ok\0/../x" would read
 * as "ok": such a request is refused before anyone sees the name. */
int frame_string_has_nul(const ProtobufCMessageDescriptor *d, const uint8_t *payload, size_t n);

/* Encodes header + message into buf of cap bytes. Returns the total length,
 * or -EMSGSIZE when it does not fit (or exceeds max_bytes). */
int frame_pack_request(const Kvpalace__V1__Request *req, void *buf, size_t cap, uint32_t max_bytes);
int frame_pack_response(const Kvpalace__V1__Response *resp, void *buf, size_t cap,
			uint32_t max_bytes);

/* Bytes of header + message once packed, and packing with that size known
 * (saves a second size walk on hot paths): buf must hold total bytes. */
size_t frame_packed_bytes(const ProtobufCMessage *m);
void frame_pack_sized(const ProtobufCMessage *m, size_t total, void *buf);

/* The same for a Response, byte for byte what protobuf-c would write:
 * the envelope (id, status, error) by hand and the one operation's
 * message once sized and once packed, instead of protobuf-c's walk over
 * every field of the oneof, twice, and the operation sized twice (the
 * daemon packs one reply per request). *ret_op_bytes carries the
 * operation's size from one call to the other. */
size_t frame_response_packed_bytes(const Kvpalace__V1__Response *r, size_t *ret_op_bytes);
void frame_response_pack_sized(const Kvpalace__V1__Response *r, size_t total, size_t op_bytes,
			       void *buf);

/* Blocking datagram I/O for the client library and tests (the daemon does
 * its own I/O through io_uring but parses ancillary data with
 * frame_cmsg_fd). frame_send sends len bytes and, when pass_fd >= 0, that fd
 * as SCM_RIGHTS; returns 0 or a negative errno (-EPIPE when the peer is
 * gone). frame_recv receives one datagram into buf; returns its length,
 * 0 at end of stream, -EMSGSIZE when it was truncated (MSG_TRUNC or
 * MSG_CTRUNC), or a negative errno. A received fd is stored in *ret_fd
 * (O_CLOEXEC), else *ret_fd = -1; extra fds are closed. */
int frame_send(int sock, const void *buf, size_t len, int pass_fd);
int frame_recv(int sock, void *buf, size_t cap, int *ret_fd);

/* Ancillary buffer big enough for one fd. */
#define FRAME_CMSG_BYTES 64u
struct msghdr;
/* Returns the first SCM_RIGHTS fd of a received message and closes any
 * others, or -1 when it carries none. */
int frame_cmsg_fd(struct msghdr *msg);
/* Fills msg's control area (cbuf of FRAME_CMSG_BYTES) to pass fd. */
void frame_cmsg_put_fd(struct msghdr *msg, void *cbuf, int fd);

#endif
