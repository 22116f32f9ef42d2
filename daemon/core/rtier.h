/* daemon/core/rtier.h — the remote tier (T3): full pages of exact sessions
 * to and from a Redis Cluster shared by the machines of a deployment,
 * through daemon/remote/remote.h.
 *
 * What goes there. A pool takes part when the daemon has a remote tier
 * and the pool's owner has a remote tenant name (config remote-tenants:
 * a uid means nothing on another machine, so the bare uid is never the
 * scope). Every page a commit lists in the prefix index (remote-write
 * commit), or every page when a match first uses it (reuse: admission
 * after a second use, which spares the network the pages never asked for
 * again), is written to the cluster, pinned in its host slot until the write
 * is done, under a key made of the tenant's scope, the pool's identity
 * (model id, layout: remote_pool_identity) and the page's chain hash,
 * which names its tokens and everything before them. Writes are best
 * effort: one that finds the remote's in-flight budget full is dropped
 * and counted; nothing waits for them.
 *
 * remote-write eviction writes a page instead when it leaves the host
 * tier (evicted, dropped, or demoted to disk: the prefix index's leaving
 * hook), so the network carries only the pages the machine could not
 * keep. Its bytes are copied out of the slot there and then, into a
 * buffer taken from the remote's in-flight budget (remote_reserve): over
 * the budget the write is dropped and counted, and eviction goes on
 * exactly as without a remote tier. A page written or fetched once
 * (pindex_entry.remote) is not written again when it leaves again (after
 * a promotion from disk); one dropped from the index and committed anew
 * is a new entry and is written again (the same key and bytes).
 *
 * What comes back. When a match's walk reaches a page that no local tier
 * holds, the next pages of the chain are asked of the cluster in one
 * batch (rtier_fetch) and the request parks on its pool like a disk read
 * (tier.h). Each value is verified by the remote layer (identity, length,
 * checksum); the pages that came back, in chain order up to the first
 * that did not, are copied into free host slots and listed in the index
 * as children of the page before them, and the parked requests run again
 * and match them like any other page. Any doubt is a miss: a missing key,
 * a wrong identity or checksum, a timeout, a node down, no free slot, a
 * parent that left the index meanwhile. A page asked for and not found is
 * not asked for again for a while (a small negative cache per pool), so
 * a retried request walks on instead of waiting again.
 *
 * Event-loop thread only; completions come back through the remote
 * layer's done callbacks (on the loop thread).
 */
#ifndef KVPD_RTIER_H
#define KVPD_RTIER_H

#include <stdint.h>
#include <xxhash.h>

#include "cache.h"
#include "list.h"
#include "prefix_index.h"
#include "remote.h"

struct pool;

/* Pages one fetch asks for at most. */
#define RTIER_BATCH_PAGES 16u
/* Chain hashes a pool remembers the cluster did not have, and for how
 * long. */
#define RTIER_NEG_ENTRIES 64u
#define RTIER_NEG_NS	  (2ull * 1000000000ull)

struct rtier_counters {
	uint64_t puts;	       /* pages handed to the cluster */
	uint64_t puts_done;    /* of them, acknowledged */
	uint64_t puts_failed;  /* refused or failed (errors, timeouts, budget) */
	uint64_t fetches;      /* batches asked for */
	uint64_t fetched;      /* pages that came back verified and were listed */
	uint64_t fetch_misses; /* pages asked for and not had (any reason) */
	uint64_t fetch_bytes;  /* of the pages fetched and listed */
};

struct rtier_neg {
	XXH128_hash_t hash;
	uint64_t until_ns;
};

/* The remote tier's state of one pool (struct pool.rt). */
struct rtier_pool {
	int on;			    /* the pool takes part */
	struct remote_identity id;  /* the tenant's scope, the pool's identity */
	uint32_t inflight;	    /* puts and fetches not yet completed */
	uint32_t held;		    /* slot references they hold (rtier_check) */
	struct list fetches;	    /* struct rtier_fetch.link */
	struct list puts;	    /* struct rtier_put.link */
	struct rtier_put *open;	    /* the batch of the commit running (rtier_commit_end) */
	struct rtier_put *evicting; /* remote-write eviction: the batch of the eviction running */
	struct cache *c;	    /* for the index's leaving hook (remote-write eviction) */
	struct rtier_neg neg[RTIER_NEG_ENTRIES];
	uint32_t neg_next;
	struct rtier_counters ctr;
};

/* Decides whether p takes part (c has a remote tier, p's owner a tenant
 * name) and sets p->rt up. At pool creation. */
void rtier_pool_open(struct cache *c, struct pool *p);

/* e (a host page) was just listed by a commit (rtier_committed), or a
 * match just used it (rtier_matched): with remote-write commit, resp.
 * reuse, it is written to the cluster when p takes part and it was not
 * written (or fetched) before (pindex_entry.remote), in one batch with
 * the other pages of the same commit or match, which rtier_commit_end
 * (at its end) hands to the remote. */
void rtier_committed(struct cache *c, struct pool *p, struct pindex_entry *e);
void rtier_matched(struct cache *c, struct pool *p, struct pindex_entry *e);
void rtier_commit_end(struct cache *c, struct pool *p);

/* A walk found no local copy of hashes[0], the page after parent (NULL:
 * hashes[0] is a first page, whose chain starts at parent_hash, the
 * root); hashes[0..n) are the chain's next pages. Starts fetching them
 * unless the cluster was just found not to have hashes[0]. Returns 1 when
 * a fetch covering hashes[0] is in flight (the request waits on p: it is
 * woken through tier_wake_all), 0 when there is nothing to wait for. */
int rtier_fetch(struct cache *c, struct pool *p, const struct pindex_entry *parent,
		XXH128_hash_t parent_hash, const XXH128_hash_t *hashes, uint32_t n);

/* True while p has remote operations in flight (a pool goes only after). */
static inline int rtier_pool_busy(const struct rtier_pool *rt)
{
	return rt->inflight != 0;
}

/* Adds the references puts in flight hold to refs[slot] and checks the
 * counts. Returns 0 or -EUCLEAN. */
int rtier_check(const struct pool *p, uint32_t *refs);

#endif
