/* daemon/remote/remote.h — the remote tier's front for the core: batches of
 * pages fetched from and stored to a Redis Cluster, off the event loop.
 *
 * A request (struct remote_req) is a batch of pages of one pool. It runs
 * as a job on a pool of threads of its own (a struct worker, io/worker.c),
 * each thread with its own cluster client (cluster.h explains why the
 * blocking hiredis API on threads, not its async API on the loop), and
 * completes through req->done on the loop thread, never from inside
 * remote_get/remote_put.
 *
 * Keys. A page is stored under
 *     "kvp:" hex(scope) ":" hex(pool) ":" hex(chain)
 * (32 lowercase hex digits each): scope is the tenant's remote scope (a
 * digest of the configured tenant name, remote_scope_digest: never a bare
 * uid, which means nothing on another machine), pool the fingerprint of
 * the pool's identity (model, layout, format: what makes two pools' pages
 * interchangeable), chain the page's position in its hash chain. The same
 * tokens under another scope or another pool are another key: a tenant's
 * pages are never found under another's scope.
 *
 * Values. Content-keyed, so immutable: a header then the page's bytes.
 *     0  u32 magic REMOTE_MAGIC ("KVPR")   4  u16 version   6  u16 header bytes
 *     8  scope[16]  24 pool[16]  40 chain[16]  56 u64 payload bytes
 *     64 XXH3-128 of the payload (high 8 bytes, then low 8)  = 80 bytes
 * all little-endian. A fetched value is served only when every field
 * matches what the caller asked for and the checksum holds; anything else
 * is a miss and counts as corrupt. Puts carry an expiry (PX) when one is
 * configured: the cluster is a cache, not a store.
 *
 * Memory. The bytes of queued and running requests are bounded by
 * max_inflight_bytes: beyond it a put is dropped (counted) and a get
 * answered at once as all misses (still through done, on a later turn).
 *
 * Threading: every function here, and done, on the loop thread; the
 * pages' buffers are read (put) or written (get) by a worker thread
 * between the call and done, so they must stay untouched until then.
 */
#ifndef KVPD_REMOTE_H
#define KVPD_REMOTE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "loop.h"
#include "worker.h"

#define REMOTE_MAGIC	    0x5250564bu /* "KVPR" little-endian */
#define REMOTE_VERSION	    1u
#define REMOTE_HEADER_BYTES 80u
#define REMOTE_KEY_BYTES    (4 + 3 * 32 + 2 + 1)
#define REMOTE_MAX_THREADS  32u
#define REMOTE_MAX_PAGES    256u /* pages of one request */

struct remote_config {
	const char *const *nodes; /* "host:port" seeds */
	unsigned int n_nodes;
	const char *user;     /* NULL: AUTH with the password alone */
	const char *password; /* NULL: no AUTH */
	uint32_t timeout_ms;  /* connect, read, write: 1.. */
	uint32_t backoff_ms;  /* 0: the default, 1000 */
	unsigned int threads; /* 1..REMOTE_MAX_THREADS */
	uint64_t max_inflight_bytes;
	uint64_t max_page_bytes; /* the largest page payload */
	uint64_t expiry_ms;	 /* PX of puts; 0: none */
};

/* What a pool's pages are identified by. */
struct remote_identity {
	uint8_t scope[16]; /* remote_scope_digest of the tenant name */
	uint8_t pool[16];  /* fingerprint of model, layout, format */
};

enum remote_page_result {
	REMOTE_HIT,  /* get: buf holds the page; put: stored */
	REMOTE_MISS, /* get: not found, failed or did not verify; put: not stored */
};

struct remote_page {
	uint8_t chain[16]; /* the page's chain hash */
	void *buf;	   /* get: filled on a hit, undefined after a miss; put: read */
	size_t bytes;	   /* the page's payload bytes */
	enum remote_page_result result;
	/* Why a miss: CLUSTER_MISS, a CLUSTER_ERR_*, or
	 * CLUSTER_RESULT_COUNT for a value that did not verify. */
	int why;
};

struct remote;

struct remote_req {
	struct remote_identity id;
	struct remote_page *pages;	      /* [n_pages] */
	unsigned int n_pages;		      /* 1..REMOTE_MAX_PAGES */
	void (*done)(struct remote_req *req); /* loop thread */
	void *user;

	/* Private to remote.c. */
	struct worker_job job;
	struct remote *r;
	int is_put;
	uint64_t bytes;
	struct remote_req *next;
	uint64_t n_bytes_in, n_bytes_out;
	unsigned int n_result[CLUSTER_RESULT_COUNT];
	unsigned int n_corrupt;
	unsigned int n_moved, n_asked;
	unsigned int nodes_up, nodes_down;
};

struct remote_stats {
	uint64_t gets, hits, misses; /* pages */
	uint64_t corrupt;	     /* fetched values that did not verify */
	uint64_t timeouts;
	uint64_t moved, asked;		       /* redirections followed (MOVED, ASK) */
	uint64_t errors[CLUSTER_RESULT_COUNT]; /* by kind, CLUSTER_ERR_* */
	uint64_t puts, stored, dropped_puts, dropped_gets;
	uint64_t bytes_in, bytes_out; /* values, headers included */
	uint64_t inflight_bytes;
	unsigned int nodes_up, nodes_down; /* as the latest finished request saw them */
};

struct remote {
	/* Private to remote.c. */
	struct loop *loop;
	struct worker w;
	struct remote_config cfg;
	char **nodes;
	char *user, *password;
	unsigned int n_clients;
	struct cluster *clients[REMOTE_MAX_THREADS];
	atomic_int busy[REMOTE_MAX_THREADS];
	struct remote_req *deferred, **deferred_tail;
	struct loop_op defer_op;
	int defer_armed;
	int started;
	uint64_t reserved_bytes; /* remote_reserve: taken, not yet submitted */
	struct remote_stats st;
	char why[256];
};

/* Starts the tier: copies cfg, asks the cluster for its slot map once
 * (blocking, up to the timeout per node: this runs at start, before the
 * loop serves anyone) and starts cfg->threads threads. Returns 0 — also
 * when no node answered (a cache starts without its cluster; requests are
 * misses until it comes) — or -EINVAL (a node not host:port, a zero
 * timeout, threads out of range), -EACCES (a node refused the
 * credentials), -ENOMEM, or worker_init's error; then remote_why(r) says
 * why, and remote_fini is safe. */
int remote_init(struct remote *r, struct loop *l, const struct remote_config *cfg);

/* Why the last remote_init failed, or why the cluster could not be
 * reached at start ("" when it was). Valid until remote_fini. */
const char *remote_why(const struct remote *r);

/* Fetches req's pages: each page's result (and buf on a hit) is set when
 * req->done runs. req and the pages stay the caller's, untouched until
 * then. -EINVAL (and no done) for n_pages or a page size out of range;
 * otherwise 0 and done exactly once. */
int remote_get(struct remote *r, struct remote_req *req);
/* Stores req's pages (result HIT when stored). Same contract. */
int remote_put(struct remote *r, struct remote_req *req);

/* Takes room for a put of pages of payload bytes in all (headers are
 * added here) from the in-flight budget before the caller copies them:
 * a caller that copies pages out of memory about to be reused (the core's
 * write on eviction) holds at most max_inflight_bytes of copies, queued,
 * running and being assembled together. Returns 0, or -ENOBUFS (over the
 * budget, or the tier did not start: nothing taken). Give the room back
 * with remote_unreserve, just before remote_put of those pages, or when
 * they are not put after all. */
int remote_reserve(struct remote *r, uint64_t bytes, unsigned int n_pages);
void remote_unreserve(struct remote *r, uint64_t bytes, unsigned int n_pages);

/* True while requests are queued or running (their done not yet run). */
static inline int remote_busy(const struct remote *r)
{
	return r->w.n_pending != 0 || r->deferred != NULL;
}

/* A batch of commands on one key, each whole in RESP (the KV events'
 * XADDs to their stream, core/evpub.c): run like a page request (one
 * job, one of the threads' clients, MOVED and ASK followed), done on the
 * loop thread with n_ok the commands answered with anything but an
 * error. Nothing of the in-flight budget is taken (the caller keeps at
 * most one batch going). */
struct remote_cmd {
	const char *key;
	size_t key_len;
	const char *const *cmds; /* [n] */
	const size_t *lens;	 /* [n] */
	unsigned int n;		 /* 1..REMOTE_MAX_PAGES */
	unsigned int n_ok;
	void (*done)(struct remote_cmd *q);
	void *user;

	/* Private to remote.c. */
	struct worker_job job;
	struct remote *r;
};

/* Queues q. Returns 0 (done exactly once, later) or -EINVAL (and no
 * done) for n out of range or a tier that did not start. */
int remote_command(struct remote *r, struct remote_cmd *q);

/* The counters; loop thread. */
void remote_stats(const struct remote *r, struct remote_stats *ret);

/* Every request submitted still completes (its done runs here), then the
 * threads stop and the connections close. Call it after loop_run
 * returned; safe after a failed init and twice. As with worker_fini, the
 * loop may keep an operation pointing into r (the worker's eventfd read,
 * the timer of answers given at once) until loop_fini: r's memory must
 * stay valid until then. */
void remote_fini(struct remote *r);

/* The scope digest of a tenant name: XXH3-128 of "kvp-scope\0" + name. */
void remote_scope_digest(const char *name, uint8_t ret[16]);

/* The key of page chain of pool id, NUL-terminated, REMOTE_KEY_BYTES
 * with the NUL; returns its length without it. */
size_t remote_key(const struct remote_identity *id, const uint8_t chain[16],
		  char out[REMOTE_KEY_BYTES]);

#endif
