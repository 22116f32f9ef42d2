/* daemon/evict.h — tier placement for the host tier: watermarks.
 *
 * Before a pool hands out pages, evict_make_room evicts from the pool's
 * prefix index (least recently used leaves that nothing but the index
 * holds) when the pool would be above its high watermark, down to its low
 * watermark, so bursts of appends find free pages without an eviction
 * each; with a disk tier those pages are written to the pool's spill file
 * first and only leave the host tier once written. Pages held by a session or pinned by a lease are never evicted.
 * Event-loop thread only.
 */
#ifndef KVPD_EVICT_H
#define KVPD_EVICT_H

#include <stdint.h>

#include "cache.h"
#include "pool.h"

/* Makes sure p has need free pages, evicting as the watermarks say. With a
 * disk tier, index pages are written to disk before they leave (tier.h).
 * Returns 0, -EAGAIN when room comes once disk writes in flight finish
 * (c->park_on says on which pool to park the request and retry; never
 * when c->no_park), or
 * -ENOSPC when everything left is held or pinned. */
int evict_make_room(struct cache *c, struct pool *p, uint32_t need);

#endif
