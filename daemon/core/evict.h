/* daemon/core/evict.h — tier placement for the host tier: watermarks.
 *
 * Before a pool hands out pages, evict_make_room evicts from the pool's
 * prefix index (leaves first, least recently used first, of the pages
 * nothing but the index holds) when the request would take the pool above
 * its high watermark — a pool may fill up to the mark, never past it with
 * cached pages — down to its low watermark, so bursts of appends find free
 * pages without an eviction each. With a disk tier the same pages leave in
 * the same order, down to the same mark: those without a disk copy are
 * written to the pool's spill file first and only leave the host tier once
 * written. Pages held by a session or pinned by a lease are never evicted,
 * and a request that could not get its pages evicts nothing.
 * Event-loop thread only.
 */
#ifndef KVPD_EVICT_H
#define KVPD_EVICT_H

#include <stdint.h>

#include "cache.h"
#include "pool.h"

/* The pages of n_pages a watermark fraction stands for: floor(fraction ·
 * n_pages) for the fraction in millionths, so 0.57 of 100 pages is 57. */
uint32_t evict_mark_pages(double fraction, uint32_t n_pages);

/* Makes sure p has need free pages, evicting as the watermarks say. With a
 * disk tier, index pages are written to disk before they leave (tier.h).
 * Returns 0, -EAGAIN when room comes once disk writes in flight finish
 * (c->park_on says on which pool to park the request and retry; never
 * when c->no_park), or
 * -ENOSPC when everything left is held or pinned (then nothing was
 * evicted). */
int evict_make_room(struct cache *c, struct pool *p, uint32_t need);

#endif
