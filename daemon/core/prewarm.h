/* daemon/core/prewarm.h — reading disk pages back ahead of requests
 * (host-prewarm-watermark; issue 21).
 *
 * A conversation's next turn asks for the prefix its last turn left; after
 * a restart, or once pages were freed, those prefixes are on disk while
 * the host tier has room, and the first request of each parks on disk
 * reads. While a pool with a disk tier holds fewer host pages than the
 * prewarm mark (a fraction of its pages, at most the low watermark), the
 * pages on disk used last are read back: the disk list's most recently
 * used leaves, each with the ancestors it needs, those nearest the root
 * first (a child is no match without its parent), at most PREWARM_QD reads
 * in flight. Nothing is evicted for them: they only take free slots below
 * the mark, and where host shares could make a pool give way
 * (host-tier-size oversubscribed, or host-tenant-size set) nothing is read
 * ahead. A page read ahead is no use until a request uses it: it joins the
 * host list at the cold end, first to leave, and the index counts whether
 * a request used it before it left (prefix_index_set_prewarmed; PoolStats
 * prewarm_*), which is what says the reads paid.
 *
 * Driven by the daemon's timer (every pool, each tick) and by the pool's
 * reads finishing (a tier waiter, parked only while reads are in flight,
 * so a pool is never freed with it parked). Event-loop thread only.
 */
#ifndef KVPD_PREWARM_H
#define KVPD_PREWARM_H

#include "tier.h"

struct cache;
struct pool;

/* Reads in flight per pool (its own and requests') past which prewarm
 * starts none. */
#define PREWARM_QD 16u
/* Disk leaves looked at per step whose chain cannot come back (a lost or
 * lossy page on the way) or is all coming already. */
#define PREWARM_SKIPS 64u

/* Prewarm's state in a pool (struct pool.prewarm). */
struct pool_prewarm {
	struct tier_waiter w; /* parked on the pool's reads */
	struct cache *c;
	int held; /* prewarm_hold: nothing read ahead until a request matches */
};

/* Sets up p's state (at pool creation). */
void prewarm_init(struct pool_prewarm *pw, struct cache *c);
/* One step for p: starts reads while p is under its mark. */
void prewarm_pool(struct cache *c, struct pool *p);
/* An administrator evicted p's host pages (kvpalacectl evict): they are
 * not read back by themselves until a request matches in p again
 * (prewarm_release, from core/match.c), or the eviction would be undone
 * within a second. */
void prewarm_hold(struct pool *p);
void prewarm_release(struct pool *p);

#endif
