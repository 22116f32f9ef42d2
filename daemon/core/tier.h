/* daemon/core/tier.h — the host tier's watermarks and the disk tier: when
 * prefix-index pages leave the host tier, and how they move host ⇄ disk.
 *
 * Watermarks (once daemon/core/evict.h). Before a pool hands out pages,
 * tier_make_room evicts from the pool's prefix index (leaves first, least
 * recently used first, of the pages nothing but the index holds) when the
 * request would take the pool above its high watermark — a pool may fill
 * up to the mark, never past it with cached pages — down to its low
 * watermark, so bursts of appends find free pages without an eviction
 * each. With a disk tier the same pages leave in the same order, down to
 * the same mark: those without a disk copy are written to the pool's
 * spill file first and only leave the host tier once written. Pages held
 * by a session or pinned by a lease are never evicted, and a request that
 * could not get its pages evicts nothing.
 *
 * The disk tier. When a pool has a spill file (daemon/store/spill.h),
 * pages that only the prefix index holds leave the host tier by being
 * written to an extent (tier_spill, called by tier_make_room above the
 * high watermark) and come back when a match needs them (tier_promote).
 * All I/O is asynchronous (daemon/io/aio.h): a request that needs a page
 * in flight is parked on the pool (tier_wait) and retried when the pool's
 * I/O completes. A page read back is verified against the XXH3-64 taken
 * when it was written; a mismatch, short read or I/O error makes the
 * entry a miss (and counts), never hands out the bytes. A page keeps its
 * disk copy after promotion, so leaving the host tier again costs no
 * write.
 *
 * At pool creation tier_pool_open finds the pool's spill file from an
 * earlier run (clean stop or crash) and starts listing every page whose
 * header verifies and whose data the file still holds as a disk-only
 * index entry: a warm restart. The scan runs in steps on a worker while
 * the daemon serves (tier.c, "warm restart"); pages are matchable as it
 * finds them, and at its end the disk LRU is put least recently used
 * first by the last-use stamps of the headers (daemon/store/spill.h). tier_pool_close writes the stamps of
 * pages used since they were written, so after a clean stop the disk
 * tier drops pages in the order they were last used; after a crash, in
 * the order of their last write. A read that comes back short (the file
 * was cut under the daemon) drops that page like a failed verification
 * and counts as gone, not as a disk error: only real I/O errors can turn
 * spilling off.
 *
 * Pages written in spill-dtype are lossy: they are kept on disk but never
 * promoted, so no match, prefetch or dedup gets them as exact
 * (prefix_index_lossy); a commit of the same tokens replaces one
 * (tier_replace_lossy). Event-loop thread only.
 */
#ifndef KVPD_TIER_H
#define KVPD_TIER_H

#include <stdint.h>

#include "cache.h"
#include "list.h"
#include "prefix_index.h"

struct pool;

struct tier_counters {
	uint64_t spilled;	  /* pages written to disk */
	uint64_t promoted;	  /* pages read back and verified */
	uint64_t verify_failures; /* read back with the wrong checksum */
	uint64_t io_errors;	  /* reads or writes that failed */
	uint64_t dropped;	  /* disk-only pages dropped for room */
	uint64_t restored;	  /* pages found in the spill file at start */
	uint64_t quantized;	  /* pages written in spill-dtype rather than as they are */
	uint64_t gone;		  /* disk copies whose data the file no longer held */
	uint64_t lossy_replaced;  /* lossy disk copies replaced by an exact commit */
	uint64_t refused;	  /* writes refused: the tenant's or the tier's disk share
				   * was used up, or the reserve reached (tier_disk_room) */
	uint64_t written_bytes;	  /* bytes written to the spill files: pages and headers */
	uint64_t served_bytes;	  /* bytes read back from them and verified (promotions) */
	uint64_t unadmitted;	  /* host victims dropped, not written (--disk-admission) */
};

/* A request parked until its pool's I/O makes progress. */
struct tier_waiter {
	struct list link;
	void (*wake)(struct tier_waiter *w);
};

/* Whether one request (or job) may wait for a pool's I/O, and on which
 * pool it waits: made per request by its caller (daemon/service/
 * dispatch.c, a checkpoint or compaction job for its own waits) and
 * handed to every function that may park. Such a function returns -EAGAIN
 * with park_on set (nothing changed: run the request again once that
 * pool's I/O made progress), never when no_park. */
struct tier_park {
	int no_park;	      /* may not wait: take a miss or an error instead */
	struct pool *park_on; /* set with -EAGAIN: the pool to wait on */
};

/* Opens (or creates) p's spill file when the configuration has a disk
 * tier and lists the pages it holds. A disk tier that cannot be opened is
 * logged and left off for this pool; the pool still works. */
void tier_pool_open(struct cache *c, struct pool *p);
/* At daemon start, before any pool opens: removes the cache directory's
 * spill files that hold nothing a pool could restart from (spill_reclaim)
 * when the configuration has a disk tier. */
void tier_reclaim(struct cache *c);
/* Closes p's spill file, writing the last-use stamps of disk copies used
 * since their header was written (blocking: at a stop or a pool's end).
 * I/O must be over (tier_pool_busy). */
void tier_pool_close(struct cache *c, struct pool *p);
/* True while p has disk I/O or remote operations in flight, its
 * warm-restart scan runs, or its waiters are being woken. */
int tier_pool_busy(const struct pool *p);
/* True while p's warm-restart scan runs: pages of the spill file not
 * listed yet may still come (a purge waits for the end: tier_wait). */
int tier_pool_scanning(const struct pool *p);
/* Makes p's scan end at its next step (the daemon stops); what it did not
 * read stays in the file for the next start. */
void tier_pool_stop_scan(struct pool *p);

/* Converts a page stored quantized in layout stored (shm_layout_quantized
 * of l), which fills the start of page, back to layout l in place, with
 * the reference kernels; the padding becomes zeros. Pure and thread-safe
 * (checkpoint restores call it on worker threads). Returns 0, -ENOMEM or
 * -EINVAL. */
int tier_page_unquantize(const struct shm_layout *l, void *page, const struct shm_layout *stored);

/* The pages of n_pages a watermark fraction stands for: floor(fraction ·
 * n_pages) for the fraction in millionths, so 0.57 of 100 pages is 57. */
uint32_t tier_mark_pages(double fraction, uint32_t n_pages);

/* Whether uid's read leases may pin more host pages: they pin less than
 * host-tier-size over one more than the tenants holding host pages (so
 * alone it pins at most half, and whatever the tenants present pin, a
 * newcomer finds its share unpinned: reclaiming from others can only take
 * pages nothing pins). O(pools). */
int tier_lease_room(const struct cache *c, uid_t uid);

/* Makes sure p has need free pages, evicting as the watermarks say. With a
 * disk tier, index pages are written to disk before they leave
 * (tier_spill). Returns 0, -EAGAIN when room comes once disk writes in
 * flight finish (with pk->park_on set: the pool to park the request on
 * and retry; never when pk->no_park, which also leaves alone the pages
 * whose writes are in flight), or -ENOSPC when everything left is held
 * or pinned (then nothing was evicted). */
int tier_make_room(struct cache *c, struct pool *p, uint32_t need, struct tier_park *pk);

/* Frees host slots in eviction's order (prefix_index.h: leaves first,
 * least recently used first) until the free pages plus those leaving
 * reach want_free: a page with a disk copy leaves at once, one without is
 * written to disk and leaves once written, unless a lease took it
 * meanwhile. Returns the pages of p leaving (writes in flight for them). */
uint32_t tier_spill(struct cache *c, struct pool *p, uint32_t want_free);

/* Starts writing every page only the index holds that has no disk copy
 * yet, each after its unwritten ancestors (at a clean stop, so a restart
 * finds them, whole prefixes even if the stop is cut short). Returns the
 * writes started. */
uint32_t tier_flush(struct cache *c, struct pool *p);

/* Brings e's page into a host slot. Returns 0 when it is there already,
 * 1 when a read is in flight (wait for it), -EAGAIN with pk->park_on set
 * when a slot will only be free once writes in flight finish (wait too;
 * never when pk->no_park: tier_make_room), -ENOSPC when no slot
 * can be had, -ENOENT when e has no exact copy to read (none, or only a
 * lossy one: a miss). */
int tier_promote(struct cache *c, struct pool *p, struct pindex_entry *e, struct tier_park *pk);

/* e is lossy and a commit brings its exact page: its disk copy goes (the
 * extent is freed) before the caller attaches the exact page as its host
 * copy. */
void tier_replace_lossy(struct pool *p, struct pindex_entry *e);

/* Adds the references disk I/O in flight holds to refs[slot] and checks
 * the in-flight counts and extents. Returns 0 or -EUCLEAN. */
int tier_check(const struct pool *p, uint32_t *refs);

/* Parks w on p until the pool's writes or reads in flight are all done
 * (a batch, not each page); w->wake runs then, once. */
void tier_wait(struct pool *p, struct tier_waiter *w);
/* Unparks w (safe when not parked). */
void tier_unwait(struct tier_waiter *w);
/* Wakes every waiter of p (on completions and when p goes away). */
void tier_wake_all(struct pool *p);

#endif
