/* bench/resp.h — a minimal, strict RESP client for the benchmarks' Redis
 * references (redis-server on a Unix socket; no hiredis needed).
 *
 * The benchmarks time kvpalace and Redis in the same process, in short
 * interleaved bursts, so the reference must cost what a real client costs
 * and no more: commands are built once (resp_cmd_set, resp_cmd_get) and
 * written as they are (or, for values of megabytes, header and value in
 * one writev without a copy), replies are read through a buffer (one
 * read(2) per reply or per pipelined batch, not one per byte). Pipelining is
 * redis-benchmark's -P: write N commands in one write, then read N replies.
 *
 * Parsing is strict: a reply that is not exactly the one expected (an
 * error, a nil, another length, a missing CR LF, a connection closed
 * midway) ends the program with a message; a wrong answer is never
 * counted. Header-only, single-threaded; include after bench_util.h (it
 * uses die()).
 */
#ifndef KVP_BENCH_RESP_H
#define KVP_BENCH_RESP_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define RESP_BUF_BYTES (1u << 20)
/* Longest reply line accepted ("+OK", "$123", an error message). */
#define RESP_LINE_MAX 512u

struct resp {
	int fd;
	uint8_t *buf; /* received bytes [off, len) not yet parsed */
	size_t off;
	size_t len;
};

/* A command, built once and sent as many times as needed. */
struct resp_cmd {
	uint8_t *bytes;
	size_t n;
};

static inline void resp_connect(struct resp *r, const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 30};

	memset(r, 0, sizeof(*r));
	if (strlen(path) >= sizeof(a.sun_path))
		die("redis socket path too long: %s", path);
	strcpy(a.sun_path, path);
	r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->fd < 0)
		die("redis: socket: %s", strerror(errno));
	if (connect(r->fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("redis: connect %s: %s", path, strerror(errno));
	/* A server that stops answering fails the run instead of hanging it. */
	if (setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		die("redis: SO_RCVTIMEO: %s", strerror(errno));
	r->buf = malloc(RESP_BUF_BYTES);
	if (!r->buf)
		die("out of memory");
}

static inline void resp_close(struct resp *r)
{
	if (r->fd >= 0)
		close(r->fd);
	free(r->buf);
	r->fd = -1;
	r->buf = NULL;
}

/* A bulk-string array command: argv[i] of len[i] bytes. */
static inline struct resp_cmd resp_cmd_build(int argc, const void *const *argv, const size_t *len)
{
	struct resp_cmd c;
	size_t n = 32, at;

	for (int i = 0; i < argc; i++)
		n += 32 + len[i];
	c.bytes = malloc(n);
	if (!c.bytes)
		die("out of memory");
	at = (size_t)snprintf((char *)c.bytes, n, "*%d\r\n", argc);
	for (int i = 0; i < argc; i++) {
		at += (size_t)snprintf((char *)c.bytes + at, n - at, "$%zu\r\n", len[i]);
		memcpy(c.bytes + at, argv[i], len[i]);
		at += len[i];
		memcpy(c.bytes + at, "\r\n", 2);
		at += 2;
	}
	c.n = at;
	return c;
}

static inline struct resp_cmd resp_cmd_set(const char *key, const void *val, size_t n)
{
	const void *argv[3] = {"SET", key, val};
	size_t len[3] = {3, strlen(key), n};

	return resp_cmd_build(3, argv, len);
}

static inline struct resp_cmd resp_cmd_get(const char *key)
{
	const void *argv[2] = {"GET", key};
	size_t len[2] = {3, strlen(key)};

	return resp_cmd_build(2, argv, len);
}

/* `times` copies of c back to back: one pipelined batch. */
static inline struct resp_cmd resp_cmd_repeat(const struct resp_cmd *c, unsigned times)
{
	struct resp_cmd b = {.bytes = malloc(c->n * times), .n = c->n * times};

	if (!b.bytes)
		die("out of memory");
	for (unsigned i = 0; i < times; i++)
		memcpy(b.bytes + (size_t)i * c->n, c->bytes, c->n);
	return b;
}

/* Writes every byte of iov[0..n) (changing iov). */
static inline void resp_writev(struct resp *r, struct iovec *iov, int n)
{
	while (n) {
		struct msghdr h = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t put = sendmsg(r->fd, &h, MSG_NOSIGNAL);

		if (put < 0 && errno == EINTR)
			continue;
		if (put <= 0)
			die("redis: write: %s", put < 0 ? strerror(errno) : "wrote nothing");
		while (n && (size_t)put >= iov->iov_len) {
			put -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + put;
			iov->iov_len -= (size_t)put;
		}
	}
}

static inline void resp_send(struct resp *r, const struct resp_cmd *c)
{
	struct iovec iov = {.iov_base = c->bytes, .iov_len = c->n};

	resp_writev(r, &iov, 1);
}

/* SET key to val[0..n) without copying val (values of megabytes): the
 * header, the value and the CR LF in one write. Reads no reply. */
static inline void resp_send_set(struct resp *r, const char *key, const void *val, size_t n)
{
	char head[RESP_LINE_MAX];
	struct iovec iov[3];
	int len = snprintf(head, sizeof(head), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
			   strlen(key), key, n);

	if (len < 0 || (size_t)len >= sizeof(head))
		die("redis: key too long: %s", key);
	iov[0] = (struct iovec){.iov_base = head, .iov_len = (size_t)len};
	iov[1] = (struct iovec){.iov_base = (void *)val, .iov_len = n};
	iov[2] = (struct iovec){.iov_base = (void *)"\r\n", .iov_len = 2};
	resp_writev(r, iov, 3);
}

/* GET key. Reads no reply. */
static inline void resp_send_get(struct resp *r, const char *key)
{
	char head[RESP_LINE_MAX];
	struct iovec iov;
	int len =
		snprintf(head, sizeof(head), "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);

	if (len < 0 || (size_t)len >= sizeof(head))
		die("redis: key too long: %s", key);
	iov = (struct iovec){.iov_base = head, .iov_len = (size_t)len};
	resp_writev(r, &iov, 1);
}

/* Reads exactly n bytes into dst, past the buffer. */
static inline void resp_read_full(struct resp *r, uint8_t *dst, size_t n)
{
	while (n) {
		ssize_t got = read(r->fd, dst, n);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			die("redis: read: %s",
			    got < 0 ? strerror(errno) : "the server closed the connection");
		dst += got;
		n -= (size_t)got;
	}
}

/* Makes at least `want` unparsed bytes available in r->buf[r->off..]. */
static inline void resp_fill(struct resp *r, size_t want)
{
	if (want > RESP_BUF_BYTES)
		die("redis: reply of %zu bytes is larger than the buffer", want);
	if (r->len - r->off >= want)
		return;
	if (r->off == r->len)
		r->off = r->len = 0;
	if (r->off + want > RESP_BUF_BYTES) {
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->len -= r->off;
		r->off = 0;
	}
	while (r->len - r->off < want) {
		ssize_t got = read(r->fd, r->buf + r->len, RESP_BUF_BYTES - r->len);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			die("redis: read: %s",
			    got < 0 ? strerror(errno) : "the server closed the connection");
		r->len += (size_t)got;
	}
}

/* One reply line, CR LF stripped, NUL-terminated in line (RESP_LINE_MAX
 * bytes). A line without CR right before its LF is a protocol error. */
static inline void resp_line(struct resp *r, char *line, const char *what)
{
	size_t i = 0;

	for (;;) {
		uint8_t ch;

		resp_fill(r, 1);
		ch = r->buf[r->off++];
		if (ch == '\n')
			break;
		if (i == RESP_LINE_MAX - 1)
			die("redis %s: reply line longer than %u bytes", what, RESP_LINE_MAX);
		line[i++] = (char)ch;
	}
	if (i == 0 || line[i - 1] != '\r')
		die("redis %s: reply line not ended by CR LF", what);
	line[i - 1] = 0;
}

/* Reads one reply that must be exactly "+OK". */
static inline void resp_expect_ok(struct resp *r, const char *what)
{
	char line[RESP_LINE_MAX];

	/* the common case without the loop: the whole reply is there */
	if (r->len - r->off >= 5 && !memcmp(r->buf + r->off, "+OK\r\n", 5)) {
		r->off += 5;
		return;
	}
	resp_line(r, line, what);
	if (strcmp(line, "+OK"))
		die("redis %s: %s (want +OK)", what, line);
}

/* Reads one reply that must be a bulk string of exactly n bytes, into dst.
 * A value larger than what is buffered is read straight into dst, so big
 * values (pages of megabytes) cost one copy, as with any client. */
static inline void resp_expect_bulk(struct resp *r, void *dst, size_t n, const char *what)
{
	char line[RESP_LINE_MAX], *end;
	unsigned long long got;
	size_t have;

	resp_line(r, line, what);
	if (line[0] != '$' || line[1] < '0' || line[1] > '9')
		die("redis %s: %s (want a bulk string of %zu bytes)", what, line, n);
	errno = 0;
	got = strtoull(line + 1, &end, 10);
	if (errno || *end || got != n)
		die("redis %s: %s (want a bulk string of %zu bytes)", what, line, n);
	have = r->len - r->off;
	if (have >= n) {
		memcpy(dst, r->buf + r->off, n);
		r->off += n;
	} else {
		memcpy(dst, r->buf + r->off, have);
		r->off = r->len = 0;
		resp_read_full(r, (uint8_t *)dst + have, n - have);
	}
	resp_fill(r, 2);
	if (r->buf[r->off] != '\r' || r->buf[r->off + 1] != '\n')
		die("redis %s: bulk string of %zu bytes not ended by CR LF", what, n);
	r->off += 2;
}

/* After a burst: nothing may be left unread (a reply too many is as wrong
 * as one too few). */
static inline void resp_expect_drained(const struct resp *r, const char *what)
{
	if (r->off != r->len)
		die("redis %s: %zu bytes of replies nobody asked for", what, r->len - r->off);
}

#endif
