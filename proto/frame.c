/* proto/frame.c — framing, budgeted unpacking and datagram fd passing.
 *
 * See frame.h for the contracts. The header is written little-endian
 * explicitly so the format does not depend on the host.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "le.h"

void frame_header_encode(void *buf, uint32_t payload_bytes)
{
	unsigned char *p = buf;

	le_put32(p, FRAME_MAGIC);
	p[4] = FRAME_VERSION & 0xff;
	p[5] = FRAME_VERSION >> 8;
	p[6] = 0;
	p[7] = 0;
	le_put32(p + 8, payload_bytes);
	le_put32(p + 12, 0);
}

int frame_header_check(const void *buf, size_t n, uint32_t max_bytes)
{
	const unsigned char *p = buf;
	uint32_t len;

	if (n < FRAME_HEADER_BYTES)
		return -EBADMSG;
	if (le_get32(p) != FRAME_MAGIC)
		return -EPROTO;
	if ((uint32_t)(p[4] | p[5] << 8) != FRAME_VERSION)
		return -EPROTONOSUPPORT;
	if (n > max_bytes)
		return -EMSGSIZE;
	len = le_get32(p + 8);
	if ((size_t)len != n - FRAME_HEADER_BYTES)
		return -EBADMSG;
	return (int)len;
}

int frame_next(const void *buf, size_t n, size_t *off, uint32_t max_bytes,
	       const uint8_t **ret_payload, size_t *ret_len)
{
	const unsigned char *p = (const unsigned char *)buf + *off;
	size_t left = n - *off;
	uint32_t len;

	if (n > max_bytes)
		return -EMSGSIZE;
	if (*off == n)
		return n ? 0 : -EBADMSG;
	if (left < FRAME_HEADER_BYTES)
		return -EBADMSG;
	if (le_get32(p) != FRAME_MAGIC)
		return -EPROTO;
	if ((uint32_t)(p[4] | p[5] << 8) != FRAME_VERSION)
		return -EPROTONOSUPPORT;
	len = le_get32(p + 8);
	if (len > left - FRAME_HEADER_BYTES)
		return -EBADMSG;
	*ret_payload = p + FRAME_HEADER_BYTES;
	*ret_len = len;
	*off += FRAME_HEADER_BYTES + len;
	return 1;
}

/* A malloc'd region past the caller's buffer. */
struct frame_chunk {
	struct frame_chunk *next;
	size_t cap, used;
	unsigned char data[];
};

#define ARENA_ALIGN	  16u
#define ARENA_CHUNK_BYTES (256u * 1024u)

static void *chunk_alloc(struct frame_arena *a, size_t size)
{
	struct frame_chunk *ch = a->chunks;
	size_t at;

	if (ch) {
		at = (ch->used + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
		if (at <= ch->cap && size <= ch->cap - at) {
			ch->used = at + size;
			return ch->data + at;
		}
	}
	at = size > ARENA_CHUNK_BYTES ? size : ARENA_CHUNK_BYTES;
	/* malloc's alignment (16 on x86-64 and arm64) covers the data. */
	ch = malloc(sizeof(*ch) + at);
	if (!ch)
		return NULL;
	ch->cap = at;
	ch->used = size;
	ch->next = a->chunks;
	a->chunks = ch;
	return ch->data;
}

static void *arena_alloc(void *data, size_t size)
{
	struct frame_arena *a = data;
	size_t at = (a->used + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	size_t cost = size + ARENA_ALIGN - 1; /* what alignment may waste, counted */
	void *p;

	if (size > a->budget || a->spent > a->budget - size)
		return NULL;
	if (at <= a->cap && size <= a->cap - at) {
		a->spent += at - a->used + size;
		a->used = at + size;
		return a->buf + at;
	}
	if (cost > a->budget - a->spent)
		return NULL;
	p = chunk_alloc(a, size);
	if (p)
		a->spent += cost;
	return p;
}

static void arena_free(void *data, void *ptr)
{
	(void)data;
	(void)ptr;
}

void frame_arena_init(struct frame_arena *a, void *buf, size_t cap)
{
	a->buf = buf;
	a->cap = cap;
	a->used = 0;
	a->budget = cap;
	a->spent = 0;
	a->chunks = NULL;
	a->allocator.alloc = arena_alloc;
	a->allocator.free = arena_free;
	a->allocator.allocator_data = a;
}

void frame_arena_fini(struct frame_arena *a)
{
	struct frame_chunk *ch, *next;

	if (!a)
		return;
	for (ch = a->chunks; ch; ch = next) {
		next = ch->next;
		free(ch);
	}
	a->chunks = NULL;
}

void frame_arena_reset(struct frame_arena *a)
{
	frame_arena_fini(a);
	a->used = 0;
	a->spent = 0;
}

void frame_arena_set_budget(struct frame_arena *a, size_t bytes)
{
	a->budget = bytes > a->cap ? bytes : a->cap;
}

size_t frame_arena_bytes(uint32_t max_bytes)
{
	return (size_t)max_bytes * FRAME_ARENA_FACTOR + FRAME_ARENA_SLACK;
}

/* ---- the worst case of unpacking ----------------------------------------
 *
 * protobuf-c 1.4 (protobuf_c_message_unpack) allocates, for one message:
 * its struct; per field occurrence on the wire a 32-byte ScannedMember in
 * slabs that double in size (at most 64 bytes per occurrence in all, plus
 * one alignment per slab); per repeated field one array; per string or
 * bytes value its data (+1); per submessage the same again, recursively;
 * per unknown field a 24-byte record and a copy of its bytes. Each arena
 * allocation may waste ARENA_ALIGN - 1 bytes. Every occurrence takes at
 * least its tag and one byte of value on the wire, so the worst case is a
 * ratio: the largest cost per minimal wire occurrence over every field of
 * every reachable message type, plus the unknown field. */
#define SCAN_BYTES    (64u + ARENA_ALIGN) /* ScannedMember share, slab alignment */
#define UNKNOWN_BYTES 24u		  /* ProtobufCMessageUnknownField */
#define MAX_TYPES     256u		  /* the schema has 73 */
#define OVER_RATIO    4096u		  /* past MAX_TYPES: more than any struct costs */

static size_t tag_bytes(uint32_t id)
{
	uint64_t key = (uint64_t)id << 3;
	size_t n = 1;

	while (key >= 0x80) {
		key >>= 7;
		n++;
	}
	return n;
}

static size_t elem_bytes(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_BYTES:
	case PROTOBUF_C_TYPE_MESSAGE:
		return 8; /* pointers, ProtobufCBinaryData counted below */
	default:
		return 4;
	}
}

/* Cost of one occurrence of field f (min_wire bytes on the wire at least)
 * in arena bytes, and the largest cost per wire byte of the field's
 * packed elements. */
static size_t field_ratio(const ProtobufCFieldDescriptor *f)
{
	size_t wire = tag_bytes(f->id) + 1; /* tag, then a varint or a length */
	size_t cost = SCAN_BYTES;
	int repeated = f->label == PROTOBUF_C_LABEL_REPEATED;

	if (f->type == PROTOBUF_C_TYPE_FIXED32 || f->type == PROTOBUF_C_TYPE_SFIXED32 ||
	    f->type == PROTOBUF_C_TYPE_FLOAT)
		wire = tag_bytes(f->id) + 4;
	if (f->type == PROTOBUF_C_TYPE_FIXED64 || f->type == PROTOBUF_C_TYPE_SFIXED64 ||
	    f->type == PROTOBUF_C_TYPE_DOUBLE)
		wire = tag_bytes(f->id) + 8;
	if (repeated)
		/* The element, and the array's alignment. A packed
		 * occurrence is a length (one byte at least) with elements
		 * of one byte at least: elem_bytes per byte, below. */
		cost += (f->type == PROTOBUF_C_TYPE_BYTES ? 16 : elem_bytes(f->type)) + ARENA_ALIGN;
	if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES)
		/* Data of length L costs L (+1) and an alignment; the wire
		 * carries L bytes more, so the empty value is the worst. */
		cost += 1 + ARENA_ALIGN;
	if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
		const ProtobufCMessageDescriptor *d = f->descriptor;

		cost += d->sizeof_message + ARENA_ALIGN;
		if (d->n_fields > 16 * 8) /* the required-field bitmap leaves the stack */
			cost += (d->n_fields + 7) / 8 + ARENA_ALIGN;
	}
	return (cost + wire - 1) / wire;
}

static size_t ratio_of(const ProtobufCMessageDescriptor *top)
{
	const ProtobufCMessageDescriptor *seen[MAX_TYPES];
	size_t n_seen = 1, worst;

	/* An unknown varint field: a record, a copy of its byte, the array's
	 * alignment, over tag + value (two bytes at least). */
	worst = (SCAN_BYTES + UNKNOWN_BYTES + 1 + 2 * ARENA_ALIGN + 1) / 2;
	if (worst < 8) /* a packed 64-bit varint element: 8 bytes per byte */
		worst = 8;
	seen[0] = top;
	for (size_t i = 0; i < n_seen; i++) {
		const ProtobufCMessageDescriptor *d = seen[i];

		for (unsigned int k = 0; k < d->n_fields; k++) {
			const ProtobufCFieldDescriptor *f = &d->fields[k];
			size_t r = field_ratio(f);
			size_t j;

			if (r > worst)
				worst = r;
			if (f->type != PROTOBUF_C_TYPE_MESSAGE)
				continue;
			for (j = 0; j < n_seen && seen[j] != f->descriptor; j++)
				;
			if (j < n_seen)
				continue;
			if (n_seen == MAX_TYPES)
				return OVER_RATIO;
			seen[n_seen++] = f->descriptor;
		}
	}
	return worst;
}

size_t frame_response_bound(size_t wire_bytes)
{
	static size_t ratio; /* computed once; the same value from any thread */
	size_t r = __atomic_load_n(&ratio, __ATOMIC_RELAXED);

	if (!r) {
		r = ratio_of(&kvpalace__v1__response__descriptor);
		__atomic_store_n(&ratio, r, __ATOMIC_RELAXED);
	}
	return wire_bytes * r + kvpalace__v1__response__descriptor.sizeof_message +
	       FRAME_ARENA_SLACK;
}

Kvpalace__V1__Request *frame_unpack_request(struct frame_arena *a, const uint8_t *payload, size_t n)
{
	return kvpalace__v1__request__unpack(&a->allocator, n, payload);
}

Kvpalace__V1__Response *frame_unpack_response(struct frame_arena *a, const uint8_t *payload,
					      size_t n)
{
	return kvpalace__v1__response__unpack(&a->allocator, n, payload);
}

size_t frame_packed_bytes(const ProtobufCMessage *m)
{
	return protobuf_c_message_get_packed_size(m) + FRAME_HEADER_BYTES;
}

void frame_pack_sized(const ProtobufCMessage *m, size_t total, void *buf)
{
	frame_header_encode(buf, (uint32_t)(total - FRAME_HEADER_BYTES));
	protobuf_c_message_pack(m, (uint8_t *)buf + FRAME_HEADER_BYTES);
}

static size_t varint_bytes(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/* The operation message of r, or NULL (none set), and its field number. */
static const ProtobufCMessage *response_op(const Kvpalace__V1__Response *r, unsigned int *ret_field)
{
	const ProtobufCFieldDescriptor *f;

	if (r->op_case == KVPALACE__V1__RESPONSE__OP__NOT_SET)
		return NULL;
	/* A oneof's case is its member's field number. */
	f = protobuf_c_message_descriptor_get_field(&kvpalace__v1__response__descriptor,
						    (unsigned int)r->op_case);
	if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE)
		return NULL;
	*ret_field = f->id;
	return *(const ProtobufCMessage *const *)(const void *)((const char *)r + f->offset);
}

/* Fields 1 to 3 and the op fields' numbers fit one-byte and two-byte
 * tags; status is an enum, packed as an int32 (negative: 10 bytes). */
#define RESP_ID_TAG	(1u << 3)
#define RESP_STATUS_TAG (2u << 3)
#define RESP_ERROR_TAG	(3u << 3 | 2u)

size_t frame_response_packed_bytes(const Kvpalace__V1__Response *r, size_t *ret_op_bytes)
{
	const ProtobufCMessage *op;
	unsigned int field = 0;
	size_t n;

	*ret_op_bytes = SIZE_MAX;
	if (r->base.n_unknown_fields)
		return frame_packed_bytes(&r->base); /* never built by us: the slow way */
	n = 1 + varint_bytes(r->id) + 1 + varint_bytes((uint64_t)(int64_t)r->status);
	if (r->error) {
		size_t len = strlen(r->error);

		n += 1 + varint_bytes(len) + len;
	}
	op = response_op(r, &field);
	if (op) {
		*ret_op_bytes = protobuf_c_message_get_packed_size(op);
		n += varint_bytes((uint64_t)field << 3 | 2) + varint_bytes(*ret_op_bytes) +
		     *ret_op_bytes;
	} else {
		*ret_op_bytes = 0;
	}
	return n + FRAME_HEADER_BYTES;
}

void frame_response_pack_sized(const Kvpalace__V1__Response *r, size_t total, size_t op_bytes,
			       void *buf)
{
	uint8_t *p = (uint8_t *)buf + FRAME_HEADER_BYTES;
	const ProtobufCMessage *op;
	unsigned int field = 0;

	if (op_bytes == SIZE_MAX) {
		frame_pack_sized(&r->base, total, buf);
		return;
	}
	frame_header_encode(buf, (uint32_t)(total - FRAME_HEADER_BYTES));
	*p++ = RESP_ID_TAG;
	p += put_varint(p, r->id);
	*p++ = RESP_STATUS_TAG;
	p += put_varint(p, (uint64_t)(int64_t)r->status);
	if (r->error) {
		size_t len = strlen(r->error);

		*p++ = RESP_ERROR_TAG;
		p += put_varint(p, len);
		memcpy(p, r->error, len);
		p += len;
	}
	op = response_op(r, &field);
	if (op) {
		p += put_varint(p, (uint64_t)field << 3 | 2);
		p += put_varint(p, op_bytes);
		protobuf_c_message_pack(op, p);
	}
}

static int pack_checked(const ProtobufCMessage *m, void *buf, size_t cap, uint32_t max_bytes)
{
	size_t total = frame_packed_bytes(m);

	if (total > cap || total > max_bytes)
		return -EMSGSIZE;
	frame_pack_sized(m, total, buf);
	return (int)total;
}

int frame_pack_request(const Kvpalace__V1__Request *req, void *buf, size_t cap, uint32_t max_bytes)
{
	return pack_checked(&req->base, buf, cap, max_bytes);
}

int frame_pack_response(const Kvpalace__V1__Response *resp, void *buf, size_t cap,
			uint32_t max_bytes)
{
	return pack_checked(&resp->base, buf, cap, max_bytes);
}

/* ---- NUL bytes inside strings ------------------------------------------ */

#define NUL_MAX_DEPTH 32 /* protobuf-c's own recursion is unbounded; ours is not */

static int get_varint(const uint8_t *p, size_t n, size_t *at, uint64_t *ret)
{
	uint64_t v = 0;

	for (unsigned int shift = 0; shift < 64; shift += 7) {
		uint8_t b;

		if (*at >= n)
			return -EBADMSG;
		b = p[(*at)++];
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -EBADMSG;
}

static int nul_walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth)
{
	size_t at = 0;

	if (depth > NUL_MAX_DEPTH)
		return -EBADMSG;
	while (at < n) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, len;
		int ret;

		if (get_varint(p, n, &at, &key) < 0)
			return -EBADMSG;
		switch (key & 7) {
		case 0:
			if (get_varint(p, n, &at, &len) < 0)
				return -EBADMSG;
			continue;
		case 1:
			len = 8;
			break;
		case 5:
			len = 4;
			break;
		case 2:
			if (get_varint(p, n, &at, &len) < 0)
				return -EBADMSG;
			break;
		default:
			return -EBADMSG; /* groups: protobuf-c refuses them too */
		}
		if (len > n - at)
			return -EBADMSG;
		f = (key & 7) == 2 && key >> 3 <= UINT32_MAX
			    ? protobuf_c_message_descriptor_get_field(d, (unsigned int)(key >> 3))
			    : NULL;
		if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + at, 0, len))
			return 1;
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
			ret = nul_walk(f->descriptor, p + at, len, depth + 1);
			if (ret)
				return ret;
		}
		at += len;
	}
	return 0;
}

int frame_string_has_nul(const ProtobufCMessageDescriptor *d, const uint8_t *payload, size_t n)
{
	return nul_walk(d, payload, n, 0);
}

void frame_cmsg_put_fd(struct msghdr *msg, void *cbuf, int fd)
{
	struct cmsghdr *c;

	memset(cbuf, 0, FRAME_CMSG_BYTES);
	msg->msg_control = cbuf;
	msg->msg_controllen = CMSG_SPACE(sizeof(int));
	c = CMSG_FIRSTHDR(msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

int frame_cmsg_fd(struct msghdr *msg)
{
	int found = -1;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
		    c->cmsg_len < CMSG_LEN(0))
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (found < 0)
				found = fd;
			else
				close(fd);
		}
	}
	return found;
}

int frame_send(int sock, const void *buf, size_t len, int pass_fd)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	unsigned char cbuf[FRAME_CMSG_BYTES];
	ssize_t n;

	if (pass_fd >= 0)
		frame_cmsg_put_fd(&msg, cbuf, pass_fd);
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if ((size_t)n != len)
		return -EMSGSIZE;
	return 0;
}

int frame_recv(int sock, void *buf, size_t cap, int *ret_fd)
{
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	unsigned char cbuf[FRAME_CMSG_BYTES];
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = cbuf,
		.msg_controllen = sizeof(cbuf),
	};
	ssize_t n;
	int fd;

	*ret_fd = -1;
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	fd = frame_cmsg_fd(&msg);
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (fd >= 0)
			close(fd);
		return -EMSGSIZE;
	}
	*ret_fd = fd;
	return (int)n;
}
