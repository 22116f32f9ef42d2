/* daemon/evict.c — host-tier watermarks (see evict.h).
 *
 * One victim order for every way of leaving the host tier: the prefix
 * index's host list (leaves first, least recently used first, permanent
 * pages last). Without a disk tier the victims are dropped here; with one
 * tier_spill takes the same victims, those with a disk copy at once and
 * the others once written, and stops at the same count. Event-loop thread
 * only.
 */
#include <errno.h>

#include "evict.h"
#include "tier.h"

uint32_t evict_mark_pages(double fraction, uint32_t n_pages)
{
	/* In millionths, exactly: fraction · n_pages in binary floating
	 * point falls just short of an integer for some marks (0.57 · 100 is
	 * 56.999...), which truncated would start eviction a page early. */
	uint64_t ppm = fraction > 0 ? (uint64_t)(fraction * 1e6 + 0.5) : 0;

	if (ppm > 1000000)
		ppm = 1000000;
	return (uint32_t)(ppm * n_pages / 1000000);
}

int evict_make_room(struct cache *c, struct pool *p, uint32_t need)
{
	struct pagealloc *pa = &p->pa;
	uint64_t high = evict_mark_pages(c->cfg->host_high_watermark, pa->n_pages);
	uint64_t low = evict_mark_pages(c->cfg->host_low_watermark, pa->n_pages);
	uint64_t used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	uint64_t want, freeable;

	if (need > pa->n_pages)
		return -ENOSPC;
	if (used_after <= high && pa->n_free >= need)
		return 0;
	/* A request that cannot get its pages changes nothing: eviction
	 * frees at most the host copies only the index holds (those with a
	 * write in flight only once it is done, so not when this request
	 * cannot wait). Decided before anything goes (issue 13: a failed
	 * Append evicted an unrelated chain). */
	freeable = p->ix.n_idle - (c->no_park || !p->spill ? p->ix.n_idle_busy : 0);
	if ((uint64_t)pa->n_free + freeable < need)
		return -ENOSPC;
	/* Down to the low mark, and at least enough for this request. */
	want = pa->n_pages - (low < pa->n_pages ? low : pa->n_pages);
	if (want < need)
		want = need;
	if (want > pa->n_pages)
		want = pa->n_pages;
	if (!p->spill) {
		prefix_index_evict(&p->ix, pa, (uint32_t)want, 1);
		return pa->n_free >= need ? 0 : -ENOSPC;
	}
	/* With a disk tier the same victims leave, those without a disk copy
	 * once written; a request that cannot wait for the writes drops
	 * leaves as without a disk tier. */
	if (tier_spill(c, p, (uint32_t)want) && pa->n_free < need && !c->no_park) {
		c->park_on = p;
		return -EAGAIN;
	}
	if (pa->n_free < need)
		prefix_index_evict(&p->ix, pa, need, 1);
	return pa->n_free >= need ? 0 : -ENOSPC;
}
