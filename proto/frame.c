/* proto/frame.c — framing, budgeted unpacking and datagram fd passing.
 *
 * See frame.h for the contracts. The header is written little-endian
 * explicitly so the format does not depend on the host.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = (v >> 24) & 0xff;
}

static uint32_t get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void frame_header_encode(void *buf, uint32_t payload_bytes)
{
	unsigned char *p = buf;

	put_le32(p, FRAME_MAGIC);
	p[4] = FRAME_VERSION & 0xff;
	p[5] = FRAME_VERSION >> 8;
	p[6] = 0;
	p[7] = 0;
	put_le32(p + 8, payload_bytes);
	put_le32(p + 12, 0);
}

int frame_header_check(const void *buf, size_t n, uint32_t max_bytes)
{
	const unsigned char *p = buf;
	uint32_t len;

	if (n < FRAME_HEADER_BYTES)
		return -EBADMSG;
	if (get_le32(p) != FRAME_MAGIC)
		return -EPROTO;
	if ((uint32_t)(p[4] | p[5] << 8) != FRAME_VERSION)
		return -EPROTONOSUPPORT;
	if (n > max_bytes)
		return -EMSGSIZE;
	len = get_le32(p + 8);
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
	if (get_le32(p) != FRAME_MAGIC)
		return -EPROTO;
	if ((uint32_t)(p[4] | p[5] << 8) != FRAME_VERSION)
		return -EPROTONOSUPPORT;
	len = get_le32(p + 8);
	if (len > left - FRAME_HEADER_BYTES)
		return -EBADMSG;
	*ret_payload = p + FRAME_HEADER_BYTES;
	*ret_len = len;
	*off += FRAME_HEADER_BYTES + len;
	return 1;
}

static void *arena_alloc(void *data, size_t size)
{
	struct frame_arena *a = data;
	size_t at = (a->used + 15) & ~(size_t)15;

	if (size > a->cap || at > a->cap - size)
		return NULL;
	a->used = at + size;
	return a->buf + at;
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
	a->allocator.alloc = arena_alloc;
	a->allocator.free = arena_free;
	a->allocator.allocator_data = a;
}

void frame_arena_reset(struct frame_arena *a)
{
	a->used = 0;
}

size_t frame_arena_bytes(uint32_t max_bytes)
{
	return (size_t)max_bytes * FRAME_ARENA_FACTOR + FRAME_ARENA_SLACK;
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
