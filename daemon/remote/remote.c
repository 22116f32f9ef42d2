/* daemon/remote/remote.c — the remote tier's front (remote.h): requests as
 * jobs on a worker pool of its own, one cluster client per thread, value
 * headers written and verified on the threads, counters on the loop.
 * Threading: remote_* on the loop thread; job_run on a worker thread,
 * touching only its request and the cluster client it took. */
#include "remote.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "le.h"
#include "list.h"
#include "log.h"

#define DEFAULT_BACKOFF_MS 1000u

void remote_scope_digest(const char *name, uint8_t ret[16])
{
	static const char tag[] = "kvp-scope"; /* with its NUL */
	XXH3_state_t st;
	XXH128_canonical_t can;

	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, tag, sizeof(tag));
	XXH3_128bits_update(&st, name, strlen(name));
	XXH128_canonicalFromHash(&can, XXH3_128bits_digest(&st));
	memcpy(ret, can.digest, 16);
}

static char *hex(char *p, const uint8_t b[16])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		*p++ = digits[b[i] >> 4];
		*p++ = digits[b[i] & 15];
	}
	return p;
}

size_t remote_key(const struct remote_identity *id, const uint8_t chain[16],
		  char out[REMOTE_KEY_BYTES])
{
	char *p = out;

	memcpy(p, "kvp:", 4);
	p = hex(p + 4, id->scope);
	*p++ = ':';
	p = hex(p, id->pool);
	*p++ = ':';
	p = hex(p, chain);
	*p = 0;
	return (size_t)(p - out);
}

static void put_checksum(unsigned char *p, const void *buf, size_t len)
{
	XXH128_hash_t h = XXH3_128bits(buf, len);

	le_put64(p, h.high64);
	le_put64(p + 8, h.low64);
}

static void write_header(unsigned char *h, const struct remote_identity *id,
			 const struct remote_page *pg)
{
	le_put32(h, REMOTE_MAGIC);
	le_put16(h + 4, REMOTE_VERSION);
	le_put16(h + 6, REMOTE_HEADER_BYTES);
	memcpy(h + 8, id->scope, 16);
	memcpy(h + 24, id->pool, 16);
	memcpy(h + 40, pg->chain, 16);
	le_put64(h + 56, pg->bytes);
	put_checksum(h + 64, pg->buf, pg->bytes);
}

/* A fetched value of len bytes for page pg, its header h and its
 * payload p (in pg->buf already, or to be copied there): 0 when every
 * header field is what was asked and the checksum holds. */
static int verify(const unsigned char *h, const unsigned char *p, size_t len,
		  const struct remote_identity *id, struct remote_page *pg)
{
	unsigned char sum[16];

	if (len != REMOTE_HEADER_BYTES + pg->bytes || le_get32(h) != REMOTE_MAGIC ||
	    le_get16(h + 4) != REMOTE_VERSION || le_get16(h + 6) != REMOTE_HEADER_BYTES ||
	    memcmp(h + 8, id->scope, 16) || memcmp(h + 24, id->pool, 16) ||
	    memcmp(h + 40, pg->chain, 16) || le_get64(h + 56) != pg->bytes)
		return -EBADMSG;
	put_checksum(sum, p, pg->bytes);
	if (memcmp(sum, h + 64, 16))
		return -EBADMSG;
	if (p != pg->buf)
		memcpy(pg->buf, p, pg->bytes);
	return 0;
}

/* A free client: at most n_clients jobs run at once, so one is free. */
static unsigned int take_client(struct remote *r)
{
	for (;;)
		for (unsigned int i = 0; i < r->n_clients; i++)
			if (!atomic_exchange(&r->busy[i], 1))
				return i;
}

static void job_run(struct worker_job *j)
{
	struct remote_req *req = container_of(j, struct remote_req, job);
	struct remote *r = req->r;
	struct cluster_op ops[REMOTE_MAX_PAGES];
	char keys[REMOTE_MAX_PAGES][REMOTE_KEY_BYTES];
	unsigned char hdrs[REMOTE_MAX_PAGES][REMOTE_HEADER_BYTES];
	unsigned int ci = take_client(r);
	struct cluster *c = r->clients[ci];

	memset(ops, 0, sizeof(ops[0]) * req->n_pages);
	for (unsigned int i = 0; i < req->n_pages; i++) {
		struct remote_page *pg = &req->pages[i];

		ops[i].key = keys[i];
		ops[i].key_len = remote_key(&req->id, pg->chain, keys[i]);
		if (!req->is_put) {
			/* A value of the expected length lands in place. */
			ops[i].dst_hdr = hdrs[i];
			ops[i].dst_hdr_len = REMOTE_HEADER_BYTES;
			ops[i].dst = pg->buf;
			ops[i].dst_len = pg->bytes;
		} else {
			write_header(hdrs[i], &req->id, pg);
			ops[i].val = hdrs[i];
			ops[i].val_len = REMOTE_HEADER_BYTES;
			ops[i].val2 = pg->buf;
			ops[i].val2_len = pg->bytes;
		}
	}
	if (req->is_put)
		cluster_set_batch(c, ops, req->n_pages, r->cfg.expiry_ms);
	else
		cluster_get_batch(c, ops, req->n_pages);
	for (unsigned int i = 0; i < req->n_pages; i++) {
		struct remote_page *pg = &req->pages[i];

		pg->result = REMOTE_MISS;
		pg->why = (int)ops[i].result;
		req->n_result[ops[i].result]++;
		req->n_moved += ops[i].n_moved;
		req->n_asked += ops[i].n_asked;
		if (ops[i].result == CLUSTER_HIT) {
			if (req->is_put) {
				pg->result = REMOTE_HIT;
				req->n_bytes_out += REMOTE_HEADER_BYTES + pg->bytes;
			} else {
				req->n_bytes_in += ops[i].val_len;
				const unsigned char *v = ops[i].val;
				int ok = ops[i].sunk ? verify(hdrs[i], pg->buf, ops[i].val_len,
							      &req->id, pg)
					 : ops[i].val_len >= REMOTE_HEADER_BYTES
						 ? verify(v, v + REMOTE_HEADER_BYTES,
							  ops[i].val_len, &req->id, pg)
						 : -EBADMSG;

				if (ok == 0) {
					pg->result = REMOTE_HIT;
				} else {
					pg->why = CLUSTER_RESULT_COUNT;
					req->n_corrupt++;
				}
			}
		}
		cluster_op_release(&ops[i]);
	}
	cluster_node_states(c, &req->nodes_up, &req->nodes_down);
	atomic_store(&r->busy[ci], 0);
}

/* Loop thread: counts req's outcome, hands it back. */
static void finish(struct remote *r, struct remote_req *req)
{
	struct remote_stats *st = &r->st;

	st->inflight_bytes -= req->bytes;
	if (req->is_put) {
		st->puts += req->n_pages;
		st->stored += req->n_result[CLUSTER_HIT];
	} else {
		st->gets += req->n_pages;
		for (unsigned int i = 0; i < req->n_pages; i++)
			if (req->pages[i].result == REMOTE_HIT)
				st->hits++;
			else
				st->misses++;
	}
	for (int k = CLUSTER_ERR_TIMEOUT; k < CLUSTER_RESULT_COUNT; k++)
		st->errors[k] += req->n_result[k];
	st->timeouts += req->n_result[CLUSTER_ERR_TIMEOUT];
	st->corrupt += req->n_corrupt;
	st->moved += req->n_moved;
	st->asked += req->n_asked;
	st->bytes_in += req->n_bytes_in;
	st->bytes_out += req->n_bytes_out;
	if (req->nodes_up || req->nodes_down) {
		st->nodes_up = req->nodes_up;
		st->nodes_down = req->nodes_down;
	}
	req->done(req);
}

static void job_done(struct worker_job *j)
{
	struct remote_req *req = container_of(j, struct remote_req, job);

	finish(req->r, req);
}

/* The answers given at once, delivered on a later turn of the loop. */
static void on_deferred(struct loop_op *op, int res, unsigned int flags)
{
	struct remote *r = container_of(op, struct remote, defer_op);
	struct remote_req *list = r->deferred;

	(void)res;
	(void)flags;
	r->defer_armed = 0;
	r->deferred = NULL;
	r->deferred_tail = &r->deferred;
	while (list) {
		struct remote_req *req = list;

		list = req->next;
		finish(r, req);
	}
}

static int submit(struct remote *r, struct remote_req *req, int is_put)
{
	uint64_t bytes = 0;

	if (!req->n_pages || req->n_pages > REMOTE_MAX_PAGES || !req->pages || !req->done)
		return -EINVAL;
	for (unsigned int i = 0; i < req->n_pages; i++) {
		if (req->pages[i].bytes > r->cfg.max_page_bytes || !req->pages[i].buf)
			return -EINVAL;
		bytes += req->pages[i].bytes + REMOTE_HEADER_BYTES;
	}
	req->r = r;
	req->is_put = is_put;
	req->bytes = 0;
	req->next = NULL;
	req->n_bytes_in = req->n_bytes_out = 0;
	memset(req->n_result, 0, sizeof(req->n_result));
	req->n_corrupt = req->nodes_up = req->nodes_down = 0;
	req->n_moved = req->n_asked = 0;
	for (unsigned int i = 0; i < req->n_pages; i++) {
		req->pages[i].result = REMOTE_MISS;
		req->pages[i].why = CLUSTER_ERR_DOWN;
	}
	if (!r->started ||
	    r->st.inflight_bytes + r->reserved_bytes + bytes > r->cfg.max_inflight_bytes) {
		if (is_put)
			r->st.dropped_puts += req->n_pages;
		else
			r->st.dropped_gets += req->n_pages;
		*r->deferred_tail = req;
		r->deferred_tail = &req->next;
		if (!r->defer_armed) {
			r->defer_armed = 1;
			loop_timeout(r->loop, &r->defer_op, 0);
		}
		return 0;
	}
	req->bytes = bytes;
	r->st.inflight_bytes += bytes;
	req->job.run = job_run;
	req->job.done = job_done;
	worker_submit(&r->w, &req->job);
	return 0;
}

int remote_reserve(struct remote *r, uint64_t bytes, unsigned int n_pages)
{
	bytes += (uint64_t)n_pages * REMOTE_HEADER_BYTES;
	if (!r->started ||
	    r->st.inflight_bytes + r->reserved_bytes + bytes > r->cfg.max_inflight_bytes)
		return -ENOBUFS;
	r->reserved_bytes += bytes;
	return 0;
}

void remote_unreserve(struct remote *r, uint64_t bytes, unsigned int n_pages)
{
	bytes += (uint64_t)n_pages * REMOTE_HEADER_BYTES;
	kvp_assert(bytes <= r->reserved_bytes);
	r->reserved_bytes -= bytes;
}

static void cmd_run(struct worker_job *j)
{
	struct remote_cmd *q = container_of(j, struct remote_cmd, job);
	struct remote *r = q->r;
	struct cluster_op ops[REMOTE_MAX_PAGES];
	unsigned int ci = take_client(r);

	memset(ops, 0, sizeof(ops[0]) * q->n);
	for (unsigned int i = 0; i < q->n; i++) {
		ops[i].key = q->key;
		ops[i].key_len = q->key_len;
		ops[i].val = q->cmds[i];
		ops[i].val_len = q->lens[i];
	}
	cluster_command_batch(r->clients[ci], ops, q->n);
	q->n_ok = 0;
	for (unsigned int i = 0; i < q->n; i++) {
		q->n_ok += ops[i].result == CLUSTER_HIT;
		cluster_op_release(&ops[i]);
	}
	atomic_store(&r->busy[ci], 0);
}

static void cmd_done(struct worker_job *j)
{
	struct remote_cmd *q = container_of(j, struct remote_cmd, job);

	q->done(q);
}

int remote_command(struct remote *r, struct remote_cmd *q)
{
	if (!r->started || !q->n || q->n > REMOTE_MAX_PAGES || !q->done || !q->key)
		return -EINVAL;
	q->r = r;
	q->n_ok = 0;
	q->job.run = cmd_run;
	q->job.done = cmd_done;
	worker_submit(&r->w, &q->job);
	return 0;
}

int remote_get(struct remote *r, struct remote_req *req)
{
	return submit(r, req, 0);
}

int remote_put(struct remote *r, struct remote_req *req)
{
	return submit(r, req, 1);
}

void remote_stats(const struct remote *r, struct remote_stats *ret)
{
	*ret = r->st;
}

const char *remote_why(const struct remote *r)
{
	return r->why;
}

int remote_init(struct remote *r, struct loop *l, const struct remote_config *cfg)
{
	struct cluster_config cc;
	int ret;

	memset(r, 0, sizeof(*r));
	r->deferred_tail = &r->deferred;
	r->defer_op.cb = on_deferred;
	r->loop = l;
	if (!cfg->n_nodes || cfg->n_nodes > CLUSTER_MAX_SEEDS || !cfg->timeout_ms ||
	    !cfg->threads || cfg->threads > REMOTE_MAX_THREADS || !cfg->max_page_bytes ||
	    cfg->max_page_bytes > SIZE_MAX / 2) {
		snprintf(r->why, sizeof(r->why), "remote tier: invalid configuration");
		return -EINVAL;
	}
	r->cfg = *cfg;
	if (!r->cfg.backoff_ms)
		r->cfg.backoff_ms = DEFAULT_BACKOFF_MS;
	r->nodes = calloc(cfg->n_nodes, sizeof(*r->nodes));
	if (!r->nodes)
		goto nomem;
	for (unsigned int i = 0; i < cfg->n_nodes; i++)
		if (!(r->nodes[i] = strdup(cfg->nodes[i])))
			goto nomem;
	if ((cfg->user && !(r->user = strdup(cfg->user))) ||
	    (cfg->password && !(r->password = strdup(cfg->password))))
		goto nomem;
	r->cfg.nodes = (const char *const *)r->nodes;
	r->cfg.user = r->user;
	r->cfg.password = r->password;
	cc = (struct cluster_config){
		.seeds = r->cfg.nodes,
		.n_seeds = cfg->n_nodes,
		.user = r->user,
		.password = r->password,
		.timeout_ms = cfg->timeout_ms,
		.backoff_ms = r->cfg.backoff_ms,
		.max_value_bytes = cfg->max_page_bytes + REMOTE_HEADER_BYTES,
	};
	for (unsigned int i = 0; i < cfg->threads; i++) {
		ret = cluster_new(&cc, &r->clients[i]);
		if (ret < 0) {
			snprintf(r->why, sizeof(r->why), "remote tier: %s",
				 ret == -EINVAL ? "a node is not host:port" : "out of memory");
			goto fail;
		}
		r->n_clients++;
	}
	/* One map fetch now, for the credentials' sake: a refusal stops the
	 * start; no answer does not. Each thread fetches its own later. */
	ret = cluster_refresh(r->clients[0], r->why, sizeof(r->why));
	if (ret == -EACCES)
		goto fail;
	if (ret == 0)
		r->why[0] = 0;
	ret = worker_init(&r->w, l, cfg->threads);
	if (ret < 0) {
		snprintf(r->why, sizeof(r->why), "remote tier: threads: %s", strerror(-ret));
		goto fail;
	}
	r->started = 1;
	return 0;
nomem:
	snprintf(r->why, sizeof(r->why), "remote tier: out of memory");
	ret = -ENOMEM;
fail:
	remote_fini(r);
	return ret;
}

void remote_fini(struct remote *r)
{
	if (r->started) {
		worker_fini(&r->w);
		r->started = 0;
	}
	/* Answers given at once that the loop has not delivered. */
	if (r->deferred)
		on_deferred(&r->defer_op, 0, 0);
	for (unsigned int i = 0; i < r->n_clients; i++)
		cluster_free(r->clients[i]);
	r->n_clients = 0;
	if (r->nodes)
		for (unsigned int i = 0; i < r->cfg.n_nodes; i++)
			free(r->nodes[i]);
	free(r->nodes);
	r->nodes = NULL;
	if (r->password) {
		explicit_bzero(r->password, strlen(r->password));
		free(r->password);
	}
	free(r->user);
	r->password = r->user = NULL;
}
