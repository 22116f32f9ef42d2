/* daemon/core/pool.h — pools: all pages of one (tenant, model id, layout).
 *
 * Each pool owns its host arena (a sealed memfd, shm/arena.h) and the
 * page-slot allocator over it, so mapping one pool's arena never exposes
 * another tenant's data. Pools are found by (uid, model id, layout) on
 * OpenPool and by id afterwards; a pool id presented by another uid is
 * "not found", never "forbidden", so ids reveal nothing across tenants.
 * Pools live until the daemon stops. Event-loop thread only.
 */
#ifndef KVPD_POOL_H
#define KVPD_POOL_H

#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "gpu.h"
#include "idseq.h"
#include "layout.h"
#include "list.h"
#include "pagealloc.h"
#include "prefix_index.h"
#include "prewarm.h"
#include "rtier.h"
#include "tier.h"

struct warm_job;

struct pool {
	uint64_t id;
	uid_t uid;
	char model_id[128];
	struct shm_layout layout;
	uint64_t page_bytes;
	uint64_t arena_bytes;
	int arena_fd;
	void *arena;	    /* the daemon's own mapping */
	int huge;	    /* arena uses hugepages */
	int release_failed; /* punching holes in the arena failed: not again */
	/* Warming free slots on a worker (pool_warm): the job in flight,
	 * the allocator's n_gets when last looked, whether writers took
	 * slots since the reserve was last full, and whether fallocate
	 * failed (not again). */
	struct warm_job *warm_job;
	uint64_t warm_gets;
	int warm_wanted;
	int warm_failed;
	struct pagealloc pa;
	struct prefix_index ix;
	struct kv_events *events; /* the cache's: what enters and leaves ix is announced there */
	XXH128_hash_t root;	  /* chain root without a salt */
	struct spill *spill;	  /* the disk tier's file, or NULL */
	struct tier_scan *scan;	  /* the warm restart's scan while it runs (tier.c) */
	int preallocating;	  /* the spill file's blocks are being allocated ahead (tier.c) */
	int spill_data;		  /* its aio handles */
	int spill_meta;
	uint32_t spill_dtype; /* quantized format cold pages are written in, or 0 */
	uint32_t io_inflight; /* disk reads and writes */
	uint32_t writes_inflight;
	uint32_t reads_inflight;
	uint32_t disk_errors_in_row;
	uint32_t n_jobs;    /* checkpoint jobs working on this pool */
	uint32_t n_forgets; /* admin purges making its forgotten extents durable (purge.c) */
	struct list jobs;   /* their links (daemon/service/ckptop.c) */
	/* Scorings and compactions on workers (compact.h), and their links. */
	uint32_t n_compact_jobs;
	struct list compact_jobs;
	struct tier_counters tier;
	struct rtier_pool rt; /* the remote tier's part (rtier.h) */
	struct gpu_pool dev;  /* the device arena (dev.on), daemon/core/gpu.h */
	struct list waiters;  /* struct tier_waiter.link: requests parked on I/O */
	uint32_t waking;      /* tier_wake_all running: waiters off the list, not all woken */
	struct pool_prewarm prewarm; /* reading disk pages ahead (prewarm.h) */
	struct list ios;	     /* struct tier_io.link: disk I/O in flight */
	struct list sessions;	     /* struct session.pool_link */
	struct idseq by_id;	     /* the same sessions in id order (ListSessions) */
	uint32_t n_sessions;
	/* Of them the persistent ones (session_own), and of those the ones
	 * no open connection owns. */
	uint32_t n_persistent;
	uint32_t n_unowned;
	/* Pages of its sessions holding only uncommitted positions, kept by
	 * session.c as reservations change (Stats reads it in O(1);
	 * cache_check compares it with session_pool_reserved_pages). */
	uint32_t reserved_pages;
	struct list link; /* cache.pool_list */
};

/* Finds the pool of (uid, model_id, layout) or creates it with a fresh
 * arena. model_id and layout must have been validated. Returns 0 and the
 * pool, -EDQUOT when the tenant has max_pools_per_tenant pools, -ENOSPC
 * when the host tier has no room for another arena or a page does not fit
 * in a pool arena, or -ENOMEM. */
int pool_open(struct cache *c, uid_t uid, const char *model_id, const struct shm_layout *layout,
	      struct pool **ret_pool);

/* The pool with this id if it belongs to uid (any uid when admin), else
 * NULL. */
struct pool *pool_get(struct cache *c, uint64_t id, uid_t uid, int admin);

/* Frees a pool and its arena; its sessions must be gone. */
void pool_free(struct cache *c, struct pool *p);

/* Gives the memory of p's cold free pages back to the system (a hole
 * punched in the arena): all but the most recently freed 1/32 of the
 * pool, at most POOL_RELEASE_MAX pages a call (the server's tick). A page
 * given back reads as zeros and costs memory again when next written.
 * Not for a hugetlb arena.
 * Returns the pages given back. */
#define POOL_RELEASE_MAX 16384u
uint32_t pool_release_free(struct pool *p);

/* Keeps free memory ready for p's writers: once p has handed out slots
 * and a quarter of its reserve is gone, allocates the memory of released
 * free slots again on workers (fallocate, POOL_WARM_BYTES a job, one job
 * at a time) until the same 1/32 of the pool that pool_release_free keeps
 * is free and allocated, so that the next writer does not pay the kernel
 * for allocating it one 4 KiB fault at a time. (The kernel still zeroes
 * such a page on its first fault, but not under a kvp_session_write of
 * the whole page.) Not while the pool has no more than twice that free
 * (the slots are for writers, not for eviction to fight over), nor for a
 * hugetlb arena (reserved huge pages are not the system's); a pool that
 * was never written gets nothing. Called after each Commit (not Append:
 * fallocate holds the arena's inode lock, which the writer's
 * kvp_session_write would wait for) and from the server's tick; a no-op
 * without workers. Small jobs, for the same lock. */
#define POOL_WARM_BYTES (8ull << 20)
void pool_warm(struct cache *c, struct pool *p);

#endif
