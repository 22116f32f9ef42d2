/* daemon/core/prewarm.c — reading disk pages back ahead of requests
 * (prewarm.h). */
#include "prewarm.h"

#include "cache.h"
#include "pool.h"
#include "prefix_index.h"

static void woken(struct tier_waiter *w)
{
	struct pool *p = container_of(w, struct pool, prewarm.w);

	prewarm_pool(p->prewarm.c, p);
}

void prewarm_hold(struct pool *p)
{
	p->prewarm.held = 1;
}

void prewarm_release(struct pool *p)
{
	p->prewarm.held = 0;
}

void prewarm_init(struct pool_prewarm *pw, struct cache *c)
{
	list_init(&pw->w.link);
	pw->w.wake = woken;
	pw->c = c;
}

/* Whether p reads ahead now. */
static int prewarm_on(const struct cache *c, const struct pool *p)
{
	const struct config *cfg = c->cfg;

	/* Shares could make a page read ahead push another out (tier.c's
	 * share_extra): then nothing is. */
	return cfg->host_prewarm_watermark > 0 && p->spill && !p->scan && !c->stopping &&
	       !p->prewarm.held && c->host_bytes <= cfg->host_tier_bytes &&
	       !cfg->host_tenant_bytes && p->disk_errors_in_row == 0;
}

/* e needs a read: neither a host copy nor a read in flight. */
static int missing(const struct pindex_entry *e)
{
	return e->slot == PINDEX_NONE && e->io != PINDEX_IO_READ;
}

/* Up to max pages of leaf's chain to read, nearest the root first, into
 * want: those with neither a host copy nor a read in flight. Returns how
 * many; 0 when a page on the way cannot be read (lost, or only a lossy
 * copy: past it the chain matches nothing) or all are there or coming. */
static uint32_t chain_missing(struct pindex_entry *leaf, struct pindex_entry **want, uint32_t max)
{
	uint32_t m = 0, n = 0, skip;

	for (struct pindex_entry *e = leaf; e; e = e->parent) {
		if (!missing(e))
			continue;
		if (e->io != PINDEX_IO_NONE || e->extent == PINDEX_NONE || e->disk_dtype != 0)
			return 0;
		m++;
	}
	/* The leaf's side waits for a later step. */
	skip = m > max ? m - max : 0;
	for (struct pindex_entry *e = leaf; e; e = e->parent) {
		if (!missing(e))
			continue;
		if (skip) {
			skip--;
			continue;
		}
		want[n++] = e;
	}
	for (uint32_t i = 0; i + 1 < n - i; i++) {
		struct pindex_entry *t = want[i];

		want[i] = want[n - 1 - i];
		want[n - 1 - i] = t;
	}
	return n;
}

/* Starts reading e ahead of requests. Returns 1, or 0 when it could not
 * start (no slot, an error): the step ends. */
static int start(struct cache *c, struct pool *p, struct pindex_entry *e)
{
	struct tier_park pk = {.no_park = 1};

	prefix_index_set_prewarmed(&p->ix, e);
	if (tier_promote(c, p, e, &pk) == 1)
		return 1;
	prefix_index_unset_prewarmed(&p->ix, e, 0);
	return 0;
}

void prewarm_pool(struct cache *c, struct pool *p)
{
	uint32_t mark, used, skips = 0;
	struct pindex_entry *leaf = NULL;

	if (!prewarm_on(c, p))
		return;
	mark = tier_mark_pages(c->cfg->host_prewarm_watermark, p->pa.n_pages);
	for (;;) {
		struct pindex_entry *want[PREWARM_QD];
		uint32_t room, n, k;

		/* Reads in flight hold their slots: counted in used. */
		used = p->pa.n_pages - p->pa.n_free;
		if (used >= mark || p->reads_inflight >= PREWARM_QD || skips >= PREWARM_SKIPS)
			break;
		room = mark - used;
		if (room > PREWARM_QD - p->reads_inflight)
			room = PREWARM_QD - p->reads_inflight;
		leaf = prefix_index_disk_prev(&p->ix, leaf);
		if (!leaf)
			break;
		n = chain_missing(leaf, want, room);
		if (!n) {
			skips++;
			continue;
		}
		for (k = 0; k < n && start(c, p, want[k]); k++)
			;
		if (k < n)
			break;
		leaf = NULL; /* the leaf's own read may have started: from the end again */
	}
	/* Woken when the pool's reads are done; parked only while some are
	 * in flight, so the pool is busy (tier_pool_busy) and stays. */
	if (p->reads_inflight && list_empty(&p->prewarm.w.link))
		tier_wait(p, &p->prewarm.w);
}
