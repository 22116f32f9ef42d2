/* daemon/core/cache.h — the registry at the root of the daemon's metadata.
 *
 * One struct cache holds every pool, session and lease, indexed by id, the
 * tenants, the daemon-wide counters and the limits from the configuration.
 * Pools, sessions and leases live in pool.c, session.c and lease.c; this
 * file owns their id maps, id allocation, tenants and descriptor room, and
 * is the bottom of the core: it calls none of them. The whole-cache
 * invariant check and the teardown, which walk and free them all, are
 * whole.h's (included below, so every file that reaches them through
 * cache.h still does). Event-loop thread only.
 */
#ifndef KVPD_CACHE_H
#define KVPD_CACHE_H

#include <errno.h>
#include <stdint.h>
#include <sys/types.h>

#include "clock.h"
#include "config.h"
#include "events.h"
#include "idmap.h"
#include "latency.h"
#include "list.h"

/* How long one request type took to answer (service/dispatch.c measures
 * it): buckets[i] counts those of at most latency_bound_ns(i) and more
 * than the bound before (common/latency.h). */
struct cache_latency {
	uint64_t count;
	uint64_t sum_ns;
	uint64_t buckets[LATENCY_BUCKETS];
};

/* Request types a histogram is kept for, indexed by the service layer's
 * own numbering (the Request's fields, stats_op_index): room for those
 * kvpalace.proto has and some to come; a test fails when it has more. */
#define CACHE_LATENCY_OPS 64u

struct cache_counters {
	uint64_t requests;
	uint64_t errors;
	uint64_t match_hits;
	uint64_t match_misses;
	uint64_t matched_tokens;
	uint64_t appended_tokens;
	uint64_t committed_tokens;
	uint64_t disconnects_bad;
	uint64_t connections; /* open now */
	uint64_t checkpoints_written;
	uint64_t checkpoints_restored; /* restores and warm-ups */
	uint64_t checkpoints_refused;  /* corrupt, truncated, newer or foreign files */
	uint64_t checkpoint_failures;  /* writes that failed */
	uint64_t warmed_up_pages;
	uint64_t checkpoints_removed;
	uint64_t restore_waits; /* restores that waited for room (host tier draining) */
	uint64_t purges;	/* Purge requests served */
	uint64_t purged_pages;	/* index pages purges and admin drops forgot */
	/* Sessions closed because their connection closed, and persistent
	 * ones closed after session-idle-timeout unused. */
	uint64_t sessions_closed_with_conn;
	uint64_t sessions_expired;
	/* Closing hierarchy sessions placed by their layers (place_session, place.c),
	 * and long ones left unplaced (one placement per tenant at a time). */
	uint64_t placed_sessions;
	uint64_t unplaced_sessions;
	/* MatchPrefix: the tokens asked about, the whole pages they fill
	 * (of the pool's block_tokens) and the pages matched (matched_tokens
	 * counts the tokens matched). */
	uint64_t queried_tokens;
	uint64_t queried_pages;
	uint64_t matched_pages;
	/* Per request type, from its arrival to its reply (op < CACHE_LATENCY_OPS). */
	struct cache_latency latency[CACHE_LATENCY_OPS];
};

/* One tenant's share of the counters: the client socket's Stats shows a
 * user only its own (another user's match and token counts would show
 * their prompt lengths and hit pattern live). */
struct cache_tenant {
	uid_t uid;
	uint64_t tag;	  /* the top bits of its ids (cache_new_id) */
	uint64_t next_id; /* ids of this tag handed out */
	/* Slots of about 20 bytes its sessions hold allocated (token ids and
	 * metadata, chunks shared by forks counted once: tokvec.h; page
	 * table entries): what max-tenant-tokens bounds (session.c). */
	uint64_t meta_tokens;
	uint32_t place_jobs;   /* hierarchy placements on a worker (place.c) */
	uint64_t leased_bytes; /* host pages its read leases pin (lease.c) */
	struct cache_counters ctr;
};

struct aio;
struct gpu;
struct worker;
struct pool;

struct cache {
	const struct config *cfg;
	struct aio *aio;	 /* disk I/O, or NULL when there is none */
	const struct loop *loop; /* the event loop (its kind, for Stats), or NULL */
	struct gpu *gpu;	 /* the device tier (gpu_available), or NULL */
	struct worker *worker;	 /* threads for blocking work (checkpoints) */
	struct remote *remote;	 /* the remote tier (rtier.h), or NULL when there is none */
	struct evpub *evpub;	 /* KV events to the cluster (evpub.h), or NULL */
	int ckpt_dir_fd;	 /* <state-dir>/checkpoints, or -1 */
	/* The policy new sessions share while the configuration's stays the
	 * same (struct session_policy, session.c), or NULL before the first. */
	struct session_policy *default_pol;
	struct idmap pools;	  /* id → struct pool */
	struct idmap sessions;	  /* id → struct session */
	struct idmap leases;	  /* id → struct lease */
	struct list pool_list;	  /* every pool, oldest first */
	struct idmap tenants;	  /* uid + 1 → struct cache_tenant */
	struct cache_tenant sink; /* tenants we had no memory for */
	uint64_t next_tag;	  /* of the next tenant (cache_new_id) */
	uint64_t host_bytes;	  /* arena bytes of all pools */
	/* Descriptors connections and pools may hold together (RLIMIT_NOFILE
	 * less what the admin socket and the daemon itself keep), 0 for no
	 * limit: a client may never take the admin's. */
	uint64_t fd_room;
	/* Free bytes of the cache directory's file system (statvfs, every
	 * second, less what spills took since), UINT64_MAX when unknown. */
	uint64_t disk_avail_bytes;
	/* The daemon is stopping: nothing starts that the stop would wait
	 * for and nobody asked for (prewarm.h). */
	int stopping;
	struct cache_counters ctr;
	struct kv_events events; /* for subscribers (proto's SubscribeEvents) */
	uint64_t start_ns;
	/* Persistent sessions no open connection owns (struct
	 * session.owner_link): what the idle sweep (session_expire_idle)
	 * looks at. */
	struct list unowned;
	/* Adds to refs[slot] the page references p's checkpoint jobs hold
	 * (pool.jobs, daemon/service/ckptop.c: ckptop_init sets it to
	 * ckptop_check), for cache_check (whole.h); NULL while no layer
	 * above the core holds pages. Returns 0 or -EUCLEAN. */
	int (*check_pool_refs)(const struct pool *p, uint32_t *refs);
};

void cache_init(struct cache *c, const struct config *cfg);
/* Frees the id maps and the tenants. Every pool, session and lease must be
 * gone: cache_fini (whole.h) frees them, then calls this. */
void cache_registry_fini(struct cache *c);
/* A new id for a pool, session or lease of uid's tenant: unique across
 * kinds and tenants, never 0, never reused, increasing within a tenant.
 * Each tenant counts its own (a tag per tenant in the top bits), so an id
 * says nothing about what other tenants made since the last one. */
uint64_t cache_new_id(struct cache *c, uid_t uid);

/* Descriptors one pool may hold: its arena, its spill file twice, its
 * device arena. */
#define CACHE_POOL_FDS 4u
/* Whether fd_room has room for n more descriptors besides every open
 * connection and pool. */
int cache_fd_room(const struct cache *c, uint64_t n);
/* Whether one more client connection fits: in fd_room, and in its first
 * three quarters, which leaves room for pools when connections are at
 * their limit. */
int cache_fd_room_conn(const struct cache *c, uint64_t n_client);

/* The counters of uid's tenant, made on first use; when memory for them
 * runs out, a sink shared by such tenants (the daemon-wide counters still
 * count). Event-loop thread only. */
struct cache_counters *cache_tenant_ctr(struct cache *c, uid_t uid);
/* uid's tenant, made on first use (the sink when memory ran out). */
struct cache_tenant *cache_tenant(struct cache *c, uid_t uid);
/* The counters of uid's tenant, or NULL when it has none yet. */
const struct cache_counters *cache_tenant_find(const struct cache *c, uid_t uid);
/* Adds n to a counter daemon-wide and for uid's tenant. */
#define cache_count(c, uid, field, n)                                                              \
	do {                                                                                       \
		(c)->ctr.field += (n);                                                             \
		cache_tenant_ctr((c), (uid))->field += (n);                                        \
	} while (0)

/* Counts one request of type op (< CACHE_LATENCY_OPS, else nothing) that
 * took ns to answer, daemon-wide and for uid's tenant. Allocates nothing
 * but uid's tenant on first use, as cache_count does. */
void cache_latency_add(struct cache *c, uid_t uid, unsigned int op, uint64_t ns);

/* The whole-cache check and teardown (cache_check, cache_fini): whole.c,
 * at the top of the core. */
#include "whole.h"

#endif
