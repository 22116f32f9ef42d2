/* daemon/remote/cluster.c — one thread's Redis Cluster client over the
 * blocking hiredis API with timeouts (cluster.h says why). Threading: one
 * thread at a time per struct cluster. */
#include "cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "slots.h"

struct node {
	char host[SLOTS_HOST_MAX];
	int port;
	redisContext *ctx;	/* NULL: not connected */
	uint64_t down_until_ns; /* 0: up */
	int in_map;		/* serves a slot of the map */
	/* One round of a batch. */
	int n_ops;
	int sent;
	int reused; /* the connection was made before this round */
};

struct cluster {
	struct cluster_config cfg;
	char *user, *password;
	unsigned int n_seeds;
	struct slots_addr seeds[CLUSTER_MAX_SEEDS];
	uint16_t owner[SLOTS_N]; /* index into nodes, or SLOTS_NONE */
	unsigned int n_nodes;
	struct node nodes[SLOTS_MAX_NODES];
	int have_map;
	int need_refresh;
	uint64_t refresh_after_ns;
	enum cluster_result map_err; /* why there is no map */
	struct slots_table scratch;  /* refresh's parse (64 KiB: not on the stack) */
};

static const char *const result_names[CLUSTER_RESULT_COUNT] = {
	[CLUSTER_HIT] = "hit",
	[CLUSTER_MISS] = "miss",
	[CLUSTER_ERR_TIMEOUT] = "timeout",
	[CLUSTER_ERR_CONN] = "connection",
	[CLUSTER_ERR_DOWN] = "node-down",
	[CLUSTER_ERR_TRYAGAIN] = "tryagain",
	[CLUSTER_ERR_CLUSTERDOWN] = "clusterdown",
	[CLUSTER_ERR_TOOBIG] = "too-big",
	[CLUSTER_ERR_REPLY] = "bad-reply",
	[CLUSTER_ERR_REDIRECT] = "redirect",
	[CLUSTER_ERR_AUTH] = "auth",
};

const char *cluster_result_name(enum cluster_result r)
{
	return (unsigned int)r < CLUSTER_RESULT_COUNT ? result_names[r] : "?";
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "host:port" (the last ':' splits, so "::1:6379" works) into a. */
static int parse_hostport(const char *s, size_t len, struct slots_addr *a)
{
	const char *colon = NULL;
	char *end;
	long port;
	char num[8];

	for (size_t i = 0; i < len; i++)
		if (s[i] == ':')
			colon = s + i;
	if (!colon || colon == s || (size_t)(colon - s) >= SLOTS_HOST_MAX)
		return -EINVAL;
	size_t nlen = len - (size_t)(colon - s) - 1;
	if (nlen == 0 || nlen >= sizeof(num))
		return -EINVAL;
	memcpy(num, colon + 1, nlen);
	num[nlen] = 0;
	errno = 0;
	port = strtol(num, &end, 10);
	if (errno || *end || port < 1 || port > 65535)
		return -EINVAL;
	memcpy(a->host, s, (size_t)(colon - s));
	a->host[colon - s] = 0;
	a->port = (int)port;
	return 0;
}

int cluster_new(const struct cluster_config *cfg, struct cluster **ret)
{
	struct cluster *c;

	if (!cfg->n_seeds || cfg->n_seeds > CLUSTER_MAX_SEEDS || !cfg->timeout_ms)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = *cfg;
	c->cfg.seeds = NULL;
	for (unsigned int i = 0; i < cfg->n_seeds; i++)
		if (parse_hostport(cfg->seeds[i], strlen(cfg->seeds[i]), &c->seeds[i]) < 0) {
			free(c);
			return -EINVAL;
		}
	c->n_seeds = cfg->n_seeds;
	if ((cfg->user && !(c->user = strdup(cfg->user))) ||
	    (cfg->password && !(c->password = strdup(cfg->password)))) {
		cluster_free(c);
		return -ENOMEM;
	}
	memset(c->owner, 0xff, sizeof(c->owner));
	c->map_err = CLUSTER_ERR_CONN;
	*ret = c;
	return 0;
}

static void node_close(struct node *n)
{
	if (n->ctx)
		redisFree(n->ctx);
	n->ctx = NULL;
}

void cluster_free(struct cluster *c)
{
	if (!c)
		return;
	for (unsigned int i = 0; i < c->n_nodes; i++)
		node_close(&c->nodes[i]);
	if (c->password) {
		explicit_bzero(c->password, strlen(c->password));
		free(c->password);
	}
	free(c->user);
	free(c);
}

/* The node host:port, added (reusing the slot of a node outside the map
 * when the list is full). -1 when none can be had. */
static int node_index(struct cluster *c, const char *host, int port)
{
	unsigned int i;

	if (!*host || strlen(host) >= SLOTS_HOST_MAX || port < 1 || port > 65535)
		return -1;
	for (i = 0; i < c->n_nodes; i++)
		if (c->nodes[i].port == port && !strcmp(c->nodes[i].host, host))
			return (int)i;
	if (c->n_nodes < SLOTS_MAX_NODES) {
		i = c->n_nodes++;
	} else {
		for (i = 0; i < c->n_nodes && c->nodes[i].in_map; i++)
			;
		if (i == c->n_nodes)
			return -1;
		node_close(&c->nodes[i]);
	}
	memset(&c->nodes[i], 0, sizeof(c->nodes[i]));
	snprintf(c->nodes[i].host, sizeof(c->nodes[i].host), "%s", host);
	c->nodes[i].port = port;
	return (int)i;
}

static void mark_down(struct cluster *c, struct node *n)
{
	node_close(n);
	n->down_until_ns = now_ns() + (uint64_t)c->cfg.backoff_ms * 1000000u;
	c->need_refresh = 1;
}

/* What a failed call on ctx (or a failed connect) means. */
static enum cluster_result io_result(const redisContext *ctx, int saved_errno)
{
	if (ctx && ctx->err == REDIS_ERR_IO &&
	    (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT ||
	     saved_errno == EINPROGRESS))
		return CLUSTER_ERR_TIMEOUT;
	if (ctx && ctx->err == REDIS_ERR_PROTOCOL)
		return CLUSTER_ERR_REPLY;
	return CLUSTER_ERR_CONN;
}

/* A connection to n, with the timeouts set and AUTH done: CLUSTER_HIT, or
 * the error (the node then marked down). */
static enum cluster_result node_connect(struct cluster *c, struct node *n, char *why, size_t whylen)
{
	struct timeval tv = {
		.tv_sec = c->cfg.timeout_ms / 1000,
		.tv_usec = (c->cfg.timeout_ms % 1000) * 1000,
	};
	enum cluster_result res;
	redisReply *r;
	int e;

	if (n->ctx)
		return CLUSTER_HIT;
	if (n->down_until_ns && now_ns() < n->down_until_ns)
		return CLUSTER_ERR_DOWN;
	errno = 0;
	n->ctx = redisConnectWithTimeout(n->host, n->port, tv);
	e = errno;
	if (!n->ctx || n->ctx->err) {
		res = n->ctx ? io_result(n->ctx, e) : CLUSTER_ERR_CONN;
		if (why)
			snprintf(why, whylen, "%s:%d: %s", n->host, n->port,
				 n->ctx ? n->ctx->errstr : "out of memory");
		goto fail;
	}
	if (redisSetTimeout(n->ctx, tv) != REDIS_OK) {
		res = CLUSTER_ERR_CONN;
		goto fail;
	}
	if (c->password) {
		if (c->user)
			r = redisCommand(n->ctx, "AUTH %s %s", c->user, c->password);
		else
			r = redisCommand(n->ctx, "AUTH %s", c->password);
		if (!r) {
			res = io_result(n->ctx, errno);
			if (why)
				snprintf(why, whylen, "%s:%d: AUTH: %s", n->host, n->port,
					 n->ctx->errstr);
			goto fail;
		}
		if (r->type != REDIS_REPLY_STATUS) {
			if (why)
				snprintf(why, whylen, "%s:%d: AUTH refused: %.*s", n->host, n->port,
					 r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
					 r->type == REDIS_REPLY_ERROR ? r->str : "");
			freeReplyObject(r);
			res = CLUSTER_ERR_AUTH;
			goto fail;
		}
		freeReplyObject(r);
	}
	n->down_until_ns = 0;
	return CLUSTER_HIT;
fail:
	mark_down(c, n);
	return res;
}

/* Asks n for CLUSTER SLOTS and installs the map: 0 or -errno. */
static int refresh_from(struct cluster *c, int ni, char *why, size_t whylen)
{
	struct node *n = &c->nodes[ni];
	struct slots_table *t = &c->scratch;
	enum cluster_result res;
	uint16_t remap[SLOTS_MAX_NODES];
	redisReply *r;
	int ret;

	res = node_connect(c, n, why, whylen);
	if (res != CLUSTER_HIT) {
		c->map_err = res;
		return res == CLUSTER_ERR_AUTH ? -EACCES : -EHOSTUNREACH;
	}
	r = redisCommand(n->ctx, "CLUSTER SLOTS");
	if (!r) {
		if (why)
			snprintf(why, whylen, "%s:%d: CLUSTER SLOTS: %s", n->host, n->port,
				 n->ctx->errstr);
		c->map_err = io_result(n->ctx, errno);
		mark_down(c, n);
		return -EHOSTUNREACH;
	}
	if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOAUTH", 6)) {
		if (why)
			snprintf(why, whylen, "%s:%d: %.*s", n->host, n->port, (int)r->len, r->str);
		freeReplyObject(r);
		c->map_err = CLUSTER_ERR_AUTH;
		return -EACCES;
	}
	ret = slots_parse(r, n->host, t);
	freeReplyObject(r);
	if (ret < 0) {
		if (why)
			snprintf(why, whylen, "%s:%d: malformed CLUSTER SLOTS reply", n->host,
				 n->port);
		c->map_err = CLUSTER_ERR_REPLY;
		return -EBADMSG;
	}
	for (unsigned int i = 0; i < c->n_nodes; i++)
		c->nodes[i].in_map = 0;
	for (unsigned int i = 0; i < t->n_addr; i++) {
		int k = node_index(c, t->addr[i].host, t->addr[i].port);

		remap[i] = k < 0 ? SLOTS_NONE : (uint16_t)k;
		if (k >= 0)
			c->nodes[k].in_map = 1;
	}
	for (unsigned int s = 0; s < SLOTS_N; s++)
		c->owner[s] = t->owner[s] == SLOTS_NONE ? SLOTS_NONE : remap[t->owner[s]];
	c->have_map = 1;
	c->need_refresh = 0;
	return 0;
}

int cluster_refresh(struct cluster *c, char *why, size_t whylen)
{
	int ret = -EHOSTUNREACH, auth = 0, bad = 0;

	c->refresh_after_ns = now_ns() + (uint64_t)c->cfg.backoff_ms * 1000000u;
	/* Nodes of the current map first, then the seeds. */
	for (unsigned int i = 0; i < c->n_nodes; i++) {
		if (!c->nodes[i].in_map)
			continue;
		ret = refresh_from(c, (int)i, why, whylen);
		if (ret == 0)
			return 0;
		auth |= ret == -EACCES;
		bad |= ret == -EBADMSG;
	}
	for (unsigned int i = 0; i < c->n_seeds; i++) {
		int k = node_index(c, c->seeds[i].host, c->seeds[i].port);

		if (k < 0)
			continue;
		ret = refresh_from(c, k, why, whylen);
		if (ret == 0)
			return 0;
		auth |= ret == -EACCES;
		bad |= ret == -EBADMSG;
	}
	if (auth)
		c->map_err = CLUSTER_ERR_AUTH;
	return auth ? -EACCES : bad ? -EBADMSG : -EHOSTUNREACH;
}

static int append(redisContext *ctx, const void *p, size_t len)
{
	return redisAppendFormattedCommand(ctx, p, len) == REDIS_OK ? 0 : -ENOMEM;
}

/* Queues op's command (ASKING first after an ASK) on ctx. */
static int append_op(redisContext *ctx, const struct cluster_op *op, uint64_t expiry_ms)
{
	char hdr[96];
	int n;

	if (op->ask_node >= 0 && append(ctx, "*1\r\n$6\r\nASKING\r\n", 16) < 0)
		return -ENOMEM;
	if (op->is_set == 2) /* cluster_command_batch: the command as given */
		return append(ctx, op->val, op->val_len);
	if (!op->is_set) {
		const char *argv[2] = {"GET", op->key};
		size_t lens[2] = {3, op->key_len};

		return redisAppendCommandArgv(ctx, 2, argv, lens) == REDIS_OK ? 0 : -ENOMEM;
	}
	/* SET key value [PX ms], the value from its two pieces with no copy
	 * but hiredis's own output buffer. */
	n = snprintf(hdr, sizeof(hdr), "*%d\r\n$3\r\nSET\r\n$%zu\r\n", expiry_ms ? 5 : 3,
		     op->key_len);
	if (append(ctx, hdr, (size_t)n) < 0 || append(ctx, op->key, op->key_len) < 0)
		return -ENOMEM;
	n = snprintf(hdr, sizeof(hdr), "\r\n$%zu\r\n", op->val_len + op->val2_len);
	if (append(ctx, hdr, (size_t)n) < 0 ||
	    (op->val_len && append(ctx, op->val, op->val_len) < 0) ||
	    (op->val2_len && append(ctx, op->val2, op->val2_len) < 0))
		return -ENOMEM;
	if (expiry_ms) {
		char ms[24];
		int m = snprintf(ms, sizeof(ms), "%llu", (unsigned long long)expiry_ms);

		n = snprintf(hdr, sizeof(hdr), "\r\n$2\r\nPX\r\n$%d\r\n%s\r\n", m, ms);
	} else {
		n = snprintf(hdr, sizeof(hdr), "\r\n");
	}
	return append(ctx, hdr, (size_t)n);
}

/* "MOVED 3999 127.0.0.1:6381" or "ASK ...": the slot and the node. */
static int parse_redirect(struct cluster *c, const char *s, size_t len, const struct node *from,
			  unsigned int *ret_slot, int *ret_node)
{
	const char *sp = memchr(s, ' ', len), *sp2;
	struct slots_addr a;
	char num[8];
	char *end;
	long slot;
	int k;

	if (!sp)
		return -EBADMSG;
	sp++;
	sp2 = memchr(sp, ' ', len - (size_t)(sp - s));
	if (!sp2 || sp2 == sp || (size_t)(sp2 - sp) >= sizeof(num))
		return -EBADMSG;
	memcpy(num, sp, (size_t)(sp2 - sp));
	num[sp2 - sp] = 0;
	slot = strtol(num, &end, 10);
	if (*end || slot < 0 || slot >= (long)SLOTS_N)
		return -EBADMSG;
	sp2++;
	size_t rest = len - (size_t)(sp2 - s);
	if (rest && sp2[0] == ':') {
		/* No host: the node that answered. */
		char buf[SLOTS_HOST_MAX + 8];

		if (rest >= 8)
			return -EBADMSG;
		int m = snprintf(buf, sizeof(buf), "%s%.*s", from->host, (int)rest, sp2);
		if (parse_hostport(buf, (size_t)m, &a) < 0)
			return -EBADMSG;
	} else if (parse_hostport(sp2, rest, &a) < 0) {
		return -EBADMSG;
	}
	k = node_index(c, a.host, a.port);
	if (k < 0)
		return -E2BIG;
	*ret_slot = (unsigned int)slot;
	*ret_node = k;
	return 0;
}

static int starts(const char *str, size_t len, const char *word)
{
	size_t n = strlen(word);

	return len >= n && !memcmp(str, word, n) && (len == n || str[n] == ' ');
}

/* An error reply (text str of len bytes) to op from node ni: a
 * redirection leaves op pending for the next round. */
static void take_error(struct cluster *c, struct cluster_op *op, int ni, const char *str,
		       size_t len)
{
	unsigned int slot;
	int k;

	op->pending = 0;
	if (starts(str, len, "MOVED") &&
	    parse_redirect(c, str, len, &c->nodes[ni], &slot, &k) == 0) {
		c->owner[slot] = (uint16_t)k;
		c->nodes[k].in_map = 1;
		c->need_refresh = 1;
		op->ask_node = -1;
		op->pending = 1;
		op->n_moved++;
	} else if (starts(str, len, "ASK") && !op->asked &&
		   parse_redirect(c, str, len, &c->nodes[ni], &slot, &k) == 0) {
		op->ask_node = k;
		op->asked = 1;
		op->pending = 1;
		op->n_asked++;
	} else if (starts(str, len, "MOVED") || starts(str, len, "ASK")) {
		op->result = CLUSTER_ERR_REDIRECT;
	} else if (starts(str, len, "TRYAGAIN")) {
		op->result = CLUSTER_ERR_TRYAGAIN;
	} else if (starts(str, len, "CLUSTERDOWN")) {
		op->result = CLUSTER_ERR_CLUSTERDOWN;
	} else if (starts(str, len, "NOAUTH") || starts(str, len, "NOPERM")) {
		op->result = CLUSTER_ERR_AUTH;
	} else {
		op->result = CLUSTER_ERR_REPLY;
	}
}

/* A SET's reply r from node ni (r consumed). */
static void take_reply(struct cluster *c, struct cluster_op *op, int ni, redisReply *r)
{
	op->pending = 0;
	if (r->type == REDIS_REPLY_ERROR)
		take_error(c, op, ni, r->str, r->len);
	else if (op->is_set == 2) /* any answer but an error */
		op->result = CLUSTER_HIT;
	else
		op->result =
			r->type == REDIS_REPLY_STATUS && r->len == 2 && !memcmp(r->str, "OK", 2)
				? CLUSTER_HIT
				: CLUSTER_ERR_REPLY;
	freeReplyObject(r);
}

/* Every op of this round still on node ni gets res. */
static void fail_node_ops(struct cluster_op *ops, size_t n, int ni, enum cluster_result res)
{
	for (size_t i = 0; i < n; i++)
		if (ops[i].pending && ops[i].node == ni) {
			ops[i].pending = 0;
			ops[i].result = res;
		}
}

/* Node ni's connection broke under ops, or could not be made (connecting),
 * with res. Two cases send its pending ops once more, in the next round,
 * instead of failing them: a connection made before this round that broke
 * (it may have died while idle: the node restarted, or it died and a
 * replica took over its slots) is made again at once; and a connection
 * error when the map may be refreshed now (the backoff has passed) asks
 * for a refresh first, which sends the ops to their slots' new owner, if
 * any (a node still down then fails them at once). An op sent again
 * already fails; so does any other result. */
static void conn_lost(struct cluster *c, struct cluster_op *ops, size_t n, int ni,
		      enum cluster_result res, int connecting)
{
	struct node *nd = &c->nodes[ni];
	int stale = res == CLUSTER_ERR_CONN && !connecting && nd->reused;
	int remap = res == CLUSTER_ERR_CONN && now_ns() >= c->refresh_after_ns;

	if (stale)
		node_close(nd);
	else
		mark_down(c, nd);
	if (!stale && !remap) {
		fail_node_ops(ops, n, ni, res);
		return;
	}
	nd->reused = 0;
	c->need_refresh = 1;
	for (size_t i = 0; i < n; i++) {
		if (!ops[i].pending || ops[i].node != ni)
			continue;
		if (ops[i].retried) {
			ops[i].pending = 0;
			ops[i].result = res;
		} else {
			ops[i].retried = 1;
		}
	}
}

/* ---- GET replies, read from the socket without hiredis's reader ---------
 *
 * hiredis 0.14 reads a bulk reply 16 KiB at a time into its reader's
 * buffer, copies it into a reply object and only then says how long it
 * was: a 2 MiB page crossed memory three times before the caller saw it,
 * and a hostile node could make it allocate any length. GET replies are
 * read here instead: the length line first (a value above
 * max_value_bytes is skipped, never stored), then a value of the length
 * the caller expects straight into its buffers (the kernel's one copy),
 * any other length into a buffer of its own. The commands still go out
 * through hiredis; its reader holds nothing between batches (every reply
 * of a batch is read, and a node sends nothing unasked), so the two
 * never share bytes. */
struct rd {
	int fd;
	size_t pos, len;
	/* SO_RCVTIMEO bounds each recv, not the replies: a node that sends
	 * a byte just before each timeout would hold the thread for ever.
	 * The replies of one round must all be in by this time. */
	uint64_t deadline_ns;
	char buf[16384];
};

/* The slowest a node may send a round's replies: 10 MB/s, beyond the
 * timeout itself (4 of them: connect, write, the first byte, slack). */
#define RD_MIN_BYTES_PER_S (10ull * 1000 * 1000)

static int rd_late(const struct rd *r)
{
	return now_ns() > r->deadline_ns;
}

/* -errno of a failed or short read: EAGAIN is SO_RCVTIMEO expiring. */
static int rd_fill(struct rd *r)
{
	ssize_t n;

	if (r->pos == r->len)
		r->pos = r->len = 0;
	if (rd_late(r))
		return -ETIMEDOUT;
	do
		n = recv(r->fd, r->buf + r->len, sizeof(r->buf) - r->len, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ECONNRESET;
	r->len += (size_t)n;
	return 0;
}

/* A line without its CRLF into line (cap bytes with the NUL). */
static int rd_line(struct rd *r, char *line, size_t cap)
{
	size_t n = 0;

	for (;;) {
		while (r->pos < r->len) {
			char ch = r->buf[r->pos++];

			if (ch == '\n') {
				if (!n || line[n - 1] != '\r')
					return -EBADMSG;
				line[n - 1] = 0;
				return (int)(n - 1);
			}
			if (n + 1 >= cap)
				return -EBADMSG;
			line[n++] = ch;
		}
		int ret = rd_fill(r);
		if (ret < 0)
			return ret;
	}
}

/* n bytes into dst (NULL: dropped), large ones straight from the socket. */
static int rd_bytes(struct rd *r, void *dst, size_t n)
{
	unsigned char *d = dst;

	while (n) {
		if (r->pos < r->len) {
			size_t k = r->len - r->pos < n ? r->len - r->pos : n;

			if (d) {
				memcpy(d, r->buf + r->pos, k);
				d += k;
			}
			r->pos += k;
			n -= k;
		} else if (d && n >= sizeof(r->buf)) {
			ssize_t got;

			if (rd_late(r))
				return -ETIMEDOUT;
			got = recv(r->fd, d, n, MSG_WAITALL);

			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0)
				return -errno;
			if (got == 0)
				return -ECONNRESET;
			d += got;
			n -= (size_t)got;
		} else {
			int ret = rd_fill(r);

			if (ret < 0)
				return ret;
		}
	}
	return 0;
}

static enum cluster_result rd_result(int err)
{
	return err == -EAGAIN || err == -EWOULDBLOCK || err == -ETIMEDOUT ? CLUSTER_ERR_TIMEOUT
	       : err == -EBADMSG					  ? CLUSTER_ERR_REPLY
									  : CLUSTER_ERR_CONN;
}

/* One GET reply to op from node ni. 0, or -errno when the connection
 * cannot be trusted any more (read error, timeout, a reply not of a GET). */
static int rd_get(struct cluster *c, struct rd *r, struct cluster_op *op, int ni)
{
	char line[512], crlf[2];
	long long len;
	char *end;
	int n, ret;

	n = rd_line(r, line, sizeof(line));
	if (n < 0)
		return n;
	op->pending = 0;
	if (line[0] == '-') {
		take_error(c, op, ni, line + 1, (size_t)n - 1);
		return 0;
	}
	if (line[0] != '$' || n < 2)
		return -EBADMSG;
	errno = 0;
	len = strtoll(line + 1, &end, 10);
	if (errno || *end || len < -1)
		return -EBADMSG;
	if (len == -1) {
		op->result = CLUSTER_MISS;
		return 0;
	}
	if ((unsigned long long)len > c->cfg.max_value_bytes) {
		op->result = CLUSTER_ERR_TOOBIG;
		return rd_bytes(r, NULL, (size_t)len + 2);
	}
	if (op->dst && (size_t)len == op->dst_hdr_len + op->dst_len) {
		ret = rd_bytes(r, op->dst_hdr, op->dst_hdr_len);
		if (ret == 0)
			ret = rd_bytes(r, op->dst, op->dst_len);
		op->sunk = 1;
	} else {
		op->own = malloc((size_t)len + 1);
		if (!op->own)
			return -ENOMEM;
		ret = rd_bytes(r, op->own, (size_t)len);
		op->val = op->own;
	}
	if (ret == 0)
		ret = rd_bytes(r, crlf, 2);
	if (ret < 0)
		return ret;
	if (crlf[0] != '\r' || crlf[1] != '\n')
		return -EBADMSG;
	op->val_len = (size_t)len;
	op->result = CLUSTER_HIT;
	return 0;
}

/* Every GET reply of this round from node k. */
static void rd_node(struct cluster *c, struct cluster_op *ops, size_t n, int k)
{
	struct node *nd = &c->nodes[k];
	struct rd *r = malloc(sizeof(*r));
	char line[64];
	int ret = 0;

	if (!r) {
		mark_down(c, nd);
		fail_node_ops(ops, n, k, CLUSTER_ERR_CONN);
		return;
	}
	r->fd = nd->ctx->fd;
	r->pos = r->len = 0;
	{
		uint64_t bytes = 0;

		for (size_t i = 0; i < n; i++)
			if (ops[i].pending && ops[i].node == k)
				bytes += ops[i].dst_hdr_len + ops[i].dst_len;
		r->deadline_ns = now_ns() + 4ull * c->cfg.timeout_ms * 1000000ull +
				 bytes * 1000000000ull / RD_MIN_BYTES_PER_S;
	}
	for (size_t i = 0; i < n && ret == 0; i++) {
		struct cluster_op *op = &ops[i];

		if (!op->pending || op->node != k)
			continue;
		if (op->ask_node == k) {
			ret = rd_line(r, line, sizeof(line));
			if (ret >= 0 && strcmp(line, "+OK"))
				ret = -EBADMSG;
			if (ret < 0)
				break;
			op->ask_node = -1;
		}
		ret = rd_get(c, r, op, k);
		if (ret < 0) {
			/* What op holds so far is not a value. */
			op->pending = 1;
			free(op->own);
			op->own = NULL;
			op->val = NULL;
			op->sunk = 0;
		}
	}
	/* Bytes past the last reply: out of step with the node. */
	if (ret == 0 && r->pos != r->len)
		ret = -EBADMSG;
	if (ret < 0)
		conn_lost(c, ops, n, k, rd_result(ret), 0);
	free(r);
}

static void one_round(struct cluster *c, struct cluster_op *ops, size_t n, uint64_t expiry_ms)
{
	int is_set = n && ops[0].is_set;

	for (unsigned int k = 0; k < c->n_nodes; k++)
		c->nodes[k].n_ops = c->nodes[k].sent = 0;
	for (size_t i = 0; i < n; i++) {
		struct cluster_op *op = &ops[i];

		if (!op->pending)
			continue;
		op->node = op->ask_node >= 0 ? op->ask_node : c->owner[op->slot];
		if (op->node == SLOTS_NONE) {
			op->pending = 0;
			op->result = c->have_map ? CLUSTER_ERR_CLUSTERDOWN : c->map_err;
			continue;
		}
		c->nodes[op->node].n_ops++;
	}
	/* Every node's pipeline written before any is read: the nodes work
	 * at once. */
	for (unsigned int k = 0; k < c->n_nodes; k++) {
		struct node *nd = &c->nodes[k];
		enum cluster_result res;
		int done = 0;

		if (!nd->n_ops)
			continue;
		nd->reused = nd->ctx != NULL;
		res = node_connect(c, nd, NULL, 0);
		if (res == CLUSTER_ERR_CONN) {
			conn_lost(c, ops, n, (int)k, res, 1);
			continue;
		}
		if (res != CLUSTER_HIT) {
			fail_node_ops(ops, n, (int)k, res);
			continue;
		}
		for (size_t i = 0; i < n; i++)
			if (ops[i].pending && ops[i].node == (int)k &&
			    append_op(nd->ctx, &ops[i], expiry_ms) < 0) {
				mark_down(c, nd);
				fail_node_ops(ops, n, (int)k, CLUSTER_ERR_CONN);
				break;
			}
		while (nd->ctx && !done)
			if (redisBufferWrite(nd->ctx, &done) != REDIS_OK)
				conn_lost(c, ops, n, (int)k, io_result(nd->ctx, errno), 0);
		nd->sent = nd->ctx != NULL;
	}
	for (unsigned int k = 0; k < c->n_nodes; k++) {
		struct node *nd = &c->nodes[k];

		if (!nd->sent)
			continue;
		if (!is_set) {
			rd_node(c, ops, n, (int)k);
			continue;
		}
		for (size_t i = 0; i < n && nd->ctx; i++) {
			struct cluster_op *op = &ops[i];
			void *r = NULL;
			int asking = op->ask_node == (int)k;

			if (!op->pending || op->node != (int)k)
				continue;
			if (asking) {
				if (redisGetReply(nd->ctx, &r) != REDIS_OK)
					goto io_fail;
				freeReplyObject(r);
				r = NULL;
				op->ask_node = -1;
			}
			if (redisGetReply(nd->ctx, &r) != REDIS_OK)
				goto io_fail;
			take_reply(c, op, (int)k, r);
			continue;
		io_fail:
			conn_lost(c, ops, n, (int)k, io_result(nd->ctx, errno), 0);
		}
	}
}

static void run_batch(struct cluster *c, struct cluster_op *ops, size_t n, uint64_t expiry_ms)
{
	unsigned int round;
	int left;

	for (size_t i = 0; i < n; i++) {
		ops[i].reply = NULL;
		ops[i].own = NULL;
		ops[i].sunk = 0;
		ops[i].slot = slots_key_slot(ops[i].key, ops[i].key_len);
		ops[i].ask_node = -1;
		ops[i].asked = 0;
		ops[i].retried = 0;
		ops[i].n_moved = ops[i].n_asked = 0;
		ops[i].pending = 1;
		ops[i].result = CLUSTER_ERR_REDIRECT;
	}
	for (round = 0;; round++) {
		if ((!c->have_map || c->need_refresh) && now_ns() >= c->refresh_after_ns)
			cluster_refresh(c, NULL, 0);
		one_round(c, ops, n, expiry_ms);
		left = 0;
		for (size_t i = 0; i < n; i++)
			left += ops[i].pending;
		if (!left || round >= CLUSTER_MAX_REDIRECTS)
			break;
	}
	for (size_t i = 0; i < n; i++)
		if (ops[i].pending) {
			ops[i].pending = 0;
			ops[i].result = CLUSTER_ERR_REDIRECT;
		}
}

void cluster_get_batch(struct cluster *c, struct cluster_op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ops[i].is_set = 0;
		ops[i].val = NULL;
		ops[i].val_len = 0;
	}
	run_batch(c, ops, n, 0);
}

void cluster_set_batch(struct cluster *c, struct cluster_op *ops, size_t n, uint64_t expiry_ms)
{
	for (size_t i = 0; i < n; i++)
		ops[i].is_set = 1;
	run_batch(c, ops, n, expiry_ms);
}

void cluster_command_batch(struct cluster *c, struct cluster_op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		ops[i].is_set = 2;
	run_batch(c, ops, n, 0);
}

void cluster_op_release(struct cluster_op *op)
{
	if (op->reply)
		freeReplyObject(op->reply);
	op->reply = NULL;
	free(op->own);
	op->own = NULL;
	op->sunk = 0;
	if (!op->is_set) {
		op->val = NULL;
		op->val_len = 0;
	}
}

void cluster_node_states(const struct cluster *c, unsigned int *ret_up, unsigned int *ret_down)
{
	uint64_t now = now_ns();
	unsigned int up = 0, down = 0;

	for (unsigned int i = 0; i < c->n_nodes; i++) {
		if (!c->nodes[i].in_map)
			continue;
		if (c->nodes[i].down_until_ns && now < c->nodes[i].down_until_ns)
			down++;
		else
			up++;
	}
	*ret_up = up;
	*ret_down = down;
}
