/* daemon/evict.c — host-tier watermarks (see evict.h). */
#include <errno.h>

#include "evict.h"
#include "tier.h"

int evict_make_room(struct cache *c, struct pool *p, uint32_t need)
{
	struct pagealloc *pa = &p->pa;
	uint64_t high = (uint64_t)(c->cfg->host_high_watermark * pa->n_pages);
	uint64_t low = (uint64_t)(c->cfg->host_low_watermark * pa->n_pages);
	uint64_t used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	uint64_t want;

	if (need > pa->n_pages)
		return -ENOSPC;
	if (used_after <= high && pa->n_free >= need)
		return 0;
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
	/* With a disk tier, pages already on disk leave at once and the
	 * others are written out first; a request that cannot wait for the
	 * writes drops leaves as without a disk tier. */
	prefix_index_evict(&p->ix, pa, (uint32_t)want, 0);
	if (tier_spill(c, p, (uint32_t)want) && pa->n_free < need && !c->no_park) {
		c->park_on = p;
		return -EAGAIN;
	}
	if (pa->n_free < need)
		prefix_index_evict(&p->ix, pa, need, 1);
	return pa->n_free >= need ? 0 : -ENOSPC;
}
