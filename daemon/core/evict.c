/* daemon/core/evict.c — host-tier watermarks (see evict.h).
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

/* Host bytes held (pages not free) by every pool, by uid's pools, and the
 * tenants holding any. O(pools). */
struct held {
	uint64_t all, mine;
	uint32_t n_tenants;
};

#define HELD_MAX_UIDS 64

static uint64_t pool_held(const struct pool *q)
{
	return (uint64_t)(q->pa.n_pages - q->pa.n_free) * q->page_bytes;
}

static void count_held(const struct cache *c, uid_t uid, struct held *h)
{
	uid_t seen[HELD_MAX_UIDS];
	uint32_t n_seen = 0, extra = 0;

	*h = (struct held){0};
	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *q = list_entry(it, struct pool, link);
		uint64_t b = pool_held(q);
		uint32_t i;

		if (!b)
			continue;
		h->all += b;
		if (q->uid == uid)
			h->mine += b;
		for (i = 0; i < n_seen && seen[i] != q->uid; i++)
			;
		if (i == n_seen) {
			if (n_seen < HELD_MAX_UIDS)
				seen[n_seen++] = q->uid;
			else
				extra++; /* counted per pool past 64 tenants: shares only shrink */
		}
	}
	h->n_tenants = n_seen + extra;
}

static uint64_t tenant_held(const struct cache *c, uid_t uid)
{
	uint64_t b = 0;

	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *q = list_entry(it, struct pool, link);

		if (q->uid == uid)
			b += pool_held(q);
	}
	return b;
}

/* Frees up to want bytes of cached pages (only the index holds them) in
 * the pools of tenants holding more than fair, never uid's. They are
 * dropped, not spilled: the tenant over its share gives way at once to
 * one under it. Returns the bytes freed. */
static uint64_t reclaim_others(struct cache *c, uid_t uid, uint64_t want, uint64_t fair)
{
	uint64_t got = 0;

	for (struct list *it = c->pool_list.next; it != &c->pool_list && got < want;
	     it = it->next) {
		struct pool *q = list_entry(it, struct pool, link);
		uint64_t over, k, before;

		if (q->uid == uid || !q->ix.n_idle)
			continue;
		over = tenant_held(c, q->uid);
		if (over <= fair)
			continue;
		over -= fair;
		k = (want - got < over ? want - got : over) / q->page_bytes + 1;
		if (k > q->ix.n_idle - q->ix.n_idle_busy)
			k = q->ix.n_idle - q->ix.n_idle_busy;
		before = q->pa.n_free;
		prefix_index_evict(&q->ix, &q->pa, q->pa.n_free + (uint32_t)k, 1);
		got += (uint64_t)(q->pa.n_free - before) * q->page_bytes;
	}
	return got;
}

/* Pages p must give up besides those it takes, so that the host tier's
 * held pages stay within host-tier-size and uid's within
 * host-tenant-size: a tenant under its fair share (the tier over the
 * tenants holding pages) first takes room from tenants over theirs; one
 * at or over its share makes room in its own pool. */
static uint32_t share_extra(struct cache *c, struct pool *p, uint32_t need)
{
	const struct config *cfg = c->cfg;
	uint64_t pb = p->page_bytes, add = (uint64_t)need * pb, over = 0, cap;
	struct held h;

	/* Off the Append path while no share can be passed: every arena
	 * together fits the tier and no tenant cap is set. */
	if (c->host_bytes <= cfg->host_tier_bytes && !cfg->host_tenant_bytes)
		return 0;
	count_held(c, p->uid, &h);
	if (h.all + add > cfg->host_tier_bytes) {
		uint64_t fair = cfg->host_tier_bytes / (h.n_tenants + (h.mine == 0));

		over = h.all + add - cfg->host_tier_bytes;
		if (h.mine + add <= fair) {
			uint64_t got = reclaim_others(c, p->uid, over, fair);

			over = got < over ? over - got : 0;
		}
	}
	cap = cfg->host_tenant_bytes;
	if (cap && h.mine + add > cap && h.mine + add - cap > over)
		over = h.mine + add - cap;
	return (uint32_t)((over + pb - 1) / pb);
}

int evict_make_room(struct cache *c, struct pool *p, uint32_t need)
{
	struct pagealloc *pa = &p->pa;
	uint64_t high = evict_mark_pages(c->cfg->host_high_watermark, pa->n_pages);
	uint64_t low = evict_mark_pages(c->cfg->host_low_watermark, pa->n_pages);
	uint64_t used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	uint64_t want, freeable;
	uint32_t extra;

	if (need > pa->n_pages)
		return -ENOSPC;
	/* The shares first: pages past them come out of this pool. */
	extra = share_extra(c, p, need);
	if (extra) {
		uint32_t k =
			need > pa->n_free && need - pa->n_free > extra ? need - pa->n_free : extra;
		uint32_t target = pa->n_free + k;

		freeable = p->ix.n_idle - (c->no_park || !p->spill ? p->ix.n_idle_busy : 0);
		if (freeable < k)
			return -ENOSPC;
		if (p->spill && tier_spill(c, p, target) && pa->n_free < target && !c->no_park) {
			c->park_on = p;
			return -EAGAIN;
		}
		if (pa->n_free < target)
			prefix_index_evict(&p->ix, pa, target, 1);
		if (pa->n_free < target)
			return -ENOSPC;
		used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	}
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
