/* daemon/core/rtier.c — the remote tier: pages written to the cluster (at
 * commit, first reuse or eviction: remote-write) and fetches past the local
 * tiers (see rtier.h).
 *
 * Layer: core, above tier.c (it makes room and wakes the parked through
 * it) and below match.c and session.c, which call it. Calls the remote
 * layer (daemon/remote/remote.h) downwards; its answers come back through
 * remote_req.done, on the loop thread, never from inside the call that
 * started them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "log.h"
#include "pool.h"
#include "remote.h"
#include "rtier.h"
#include "tier.h"

struct rtier_put {
	struct remote_req req;
	struct pool *p;
	uint32_t n;
	/* Each page is either held in its slot until the write is done
	 * (commit, reuse) or copied out of it (eviction: slot PINDEX_NONE,
	 * copy the buffer, freed when done). */
	uint32_t slots[RTIER_BATCH_PAGES];
	void *copy[RTIER_BATCH_PAGES];
	uint32_t n_slots;  /* pages held in their slots */
	uint32_t n_copies; /* copies whose room is reserved (remote_reserve) */
	struct remote_page pages[RTIER_BATCH_PAGES];
	struct list link; /* rtier_pool.puts */
};

struct rtier_fetch {
	struct remote_req req;
	struct pool *p;
	int has_parent;		   /* hashes[0] is not a first page */
	XXH128_hash_t parent_hash; /* the page before hashes[0], or the root */
	XXH128_hash_t hashes[RTIER_BATCH_PAGES];
	uint32_t slots[RTIER_BATCH_PAGES]; /* free slots the pages are read into */
	struct remote_page pages[RTIER_BATCH_PAGES];
	uint32_t n;
	struct list link; /* rtier_pool.fetches */
};

static void *page_addr(const struct pool *p, uint32_t slot)
{
	return (char *)p->arena + (uint64_t)slot * p->page_bytes;
}

static int same_hash(XXH128_hash_t a, XXH128_hash_t b)
{
	return a.low64 == b.low64 && a.high64 == b.high64;
}

static void hash_bytes(XXH128_hash_t h, uint8_t out[16])
{
	XXH128_canonicalFromHash((XXH128_canonical_t *)out, h);
}

static void evicted(void *arg, struct pindex_entry *e);

void rtier_pool_open(struct cache *c, struct pool *p)
{
	char tenant[CONFIG_REMOTE_TENANT_MAX + 1];

	memset(&p->rt, 0, sizeof(p->rt));
	list_init(&p->rt.fetches);
	list_init(&p->rt.puts);
	if (!c->remote)
		return;
	if (!config_remote_tenant(c->cfg, p->uid, tenant, sizeof(tenant)))
		return; /* no name for this uid on other machines: local only */
	remote_scope_digest(tenant, p->rt.id.scope);
	/* The chain of every page starts from the pool's root, which names
	 * the model id and the layout (prefix_index_root, format included):
	 * what makes two pools' pages interchangeable. */
	hash_bytes(p->root, p->rt.id.pool);
	p->rt.on = 1;
	p->rt.c = c;
	if (c->cfg->remote_write == CONFIG_REMOTE_WRITE_EVICTION) {
		p->ix.leaving = evicted;
		p->ix.leaving_arg = p;
	}
}

/* ---- write-through ------------------------------------------------------- */

static void put_done(struct remote_req *q)
{
	struct rtier_put *w = q->user;
	struct pool *p = w->p;

	for (uint32_t i = 0; i < w->n; i++) {
		if (w->pages[i].result == REMOTE_HIT)
			p->rt.ctr.puts_done++;
		else
			p->rt.ctr.puts_failed++;
		free(w->copy[i]);
		if (w->slots[i] == PINDEX_NONE)
			continue;
		pagealloc_unref(&p->pa, w->slots[i]);
		prefix_index_update(&p->ix, &p->pa, w->slots[i]);
	}
	list_del(&w->link);
	p->rt.held -= w->n_slots;
	p->rt.inflight--;
	free(w);
	tier_wake_all(p); /* a pool drop waits for the remote to be idle */
}

/* The batch *open of p, started when there is none; NULL without
 * memory. */
static struct rtier_put *open_batch(struct pool *p, struct rtier_put **open)
{
	struct rtier_put *w = *open;

	if (w)
		return w;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->p = p;
	list_add_tail(&p->rt.puts, &w->link);
	p->rt.inflight++;
	*open = w;
	return w;
}

/* Hands the batch *open to the remote (nothing when there is none). */
static void submit_batch(struct cache *c, struct pool *p, struct rtier_put **open)
{
	struct rtier_put *w = *open;

	if (!w)
		return;
	*open = NULL;
	w->req.id = p->rt.id;
	w->req.pages = w->pages;
	w->req.n_pages = w->n;
	w->req.done = put_done;
	w->req.user = w;
	/* The copies' room passes from the reservation to the request. */
	if (w->n_copies)
		remote_unreserve(c->remote, (uint64_t)w->n_copies * p->page_bytes, w->n_copies);
	if (remote_put(c->remote, &w->req) < 0) {
		/* Refused at once (a page larger than the tier takes): no
		 * done comes. */
		for (uint32_t i = 0; i < w->n; i++)
			w->pages[i].result = REMOTE_MISS;
		put_done(&w->req);
	}
}

/* Adds e's page, held in its slot, to the batch of the operation running. */
static void put_page(struct cache *c, struct pool *p, struct pindex_entry *e)
{
	struct rtier_put *w = open_batch(p, &p->rt.open);

	if (!w) {
		p->rt.ctr.puts_failed++;
		return;
	}
	/* The page is read where it lies, on the remote's thread: the
	 * reference keeps the slot (a committed page is not written again;
	 * a client scribbling on its own tenant's page meanwhile spoils only
	 * that tenant's copy, whose checksum covers what was read). */
	w->slots[w->n] = e->slot;
	hash_bytes(e->hash, w->pages[w->n].chain);
	w->pages[w->n].buf = page_addr(p, e->slot);
	w->pages[w->n].bytes = p->page_bytes;
	w->n++;
	w->n_slots++;
	e->remote = 1;
	pagealloc_ref(&p->pa, e->slot);
	prefix_index_update(&p->ix, &p->pa, e->slot);
	p->rt.held++;
	p->rt.ctr.puts++;
	if (w->n == RTIER_BATCH_PAGES)
		rtier_commit_end(c, p);
}

void rtier_committed(struct cache *c, struct pool *p, struct pindex_entry *e)
{
	if (p->rt.on && e && e->slot != PINDEX_NONE && !e->remote &&
	    c->cfg->remote_write == CONFIG_REMOTE_WRITE_COMMIT)
		put_page(c, p, e);
}

void rtier_matched(struct cache *c, struct pool *p, struct pindex_entry *e)
{
	/* remote-write reuse: a page goes once a match used it, the first
	 * sign it is asked for again (most pages are never). */
	if (p->rt.on && e->slot != PINDEX_NONE && !e->remote &&
	    c->cfg->remote_write == CONFIG_REMOTE_WRITE_REUSE)
		put_page(c, p, e);
}

void rtier_commit_end(struct cache *c, struct pool *p)
{
	submit_batch(c, p, &p->rt.open);
}

/* remote-write eviction: the prefix index's leaving hook (prefix_index.h).
 * e's host copy leaves now, its slot free for reuse the moment this
 * returns; NULL: the eviction that called is over, its batch goes.
 *
 * Copy, not pin. Holding the slot until the put is done would keep the
 * victim in the host tier: eviction would have to take the next victim
 * instead (a hotter page), tier_make_room's count of what it freed and
 * the requests parked on it would wait on the network, and a slow
 * cluster would slow every Append. A copy leaves eviction exactly as it
 * is, at the cost of one memcpy of the page on the loop, and its memory
 * comes out of the remote's in-flight budget (remote_reserve): over it,
 * the page is simply not written (counted), never waited for. */
static void evicted(void *arg, struct pindex_entry *e)
{
	struct pool *p = arg;
	struct cache *c = p->rt.c;
	struct rtier_put *w;
	void *copy;

	if (!e) {
		submit_batch(c, p, &p->rt.evicting);
		return;
	}
	/* Host copies are exact (prefix_index_lossy): a lossy entry has
	 * none, so it never comes here. */
	if (e->remote || e->slot == PINDEX_NONE)
		return;
	p->rt.ctr.puts++;
	if (remote_reserve(c->remote, p->page_bytes, 1) < 0) {
		p->rt.ctr.puts_failed++;
		return;
	}
	copy = malloc(p->page_bytes);
	w = copy ? open_batch(p, &p->rt.evicting) : NULL;
	/* The arena is the clients' memory: read it under the guard. */
	if (!w || guard_memcpy(copy, page_addr(p, e->slot), p->page_bytes) < 0) {
		free(copy);
		remote_unreserve(c->remote, p->page_bytes, 1);
		p->rt.ctr.puts_failed++;
		return;
	}
	w->slots[w->n] = PINDEX_NONE;
	w->copy[w->n] = copy;
	hash_bytes(e->hash, w->pages[w->n].chain);
	w->pages[w->n].buf = copy;
	w->pages[w->n].bytes = p->page_bytes;
	w->n++;
	w->n_copies++;
	e->remote = 1;
	if (w->n == RTIER_BATCH_PAGES)
		submit_batch(c, p, &p->rt.evicting);
}

/* ---- fetches ------------------------------------------------------------- */

static int neg_has(struct pool *p, XXH128_hash_t h, uint64_t now)
{
	for (uint32_t i = 0; i < RTIER_NEG_ENTRIES; i++)
		if (p->rt.neg[i].until_ns > now && same_hash(p->rt.neg[i].hash, h))
			return 1;
	return 0;
}

static void neg_add(struct pool *p, XXH128_hash_t h)
{
	struct rtier_neg *n = &p->rt.neg[p->rt.neg_next++ % RTIER_NEG_ENTRIES];

	n->hash = h;
	n->until_ns = prefix_index_now_ns() + RTIER_NEG_NS;
}

/* Lists page i of f, read into its slot, under parent; the slot's
 * reference passes to the index. Returns its entry, or NULL when it could
 * not be listed (a key collision, no memory). */
static struct pindex_entry *list_page(struct rtier_fetch *f, struct pindex_entry *parent,
				      uint32_t i)
{
	struct pool *p = f->p;
	struct pindex_entry *e;

	if (prefix_index_insert(&p->ix, &p->pa, f->hashes[i], parent, f->slots[i]) < 0)
		return NULL;
	e = prefix_index_find(&p->ix, f->hashes[i]);
	e->remote = 1; /* the cluster has it */
	if (!parent)
		e->root = f->parent_hash; /* for a purge by salt */
	kv_events_stored(p->events, p->id, p->uid, p->layout.block_tokens, f->hashes[i],
			 parent ? &f->parent_hash : NULL, KV_EVENT_HOST, NULL);
	return e;
}

static void fetch_done(struct remote_req *q)
{
	struct rtier_fetch *f = q->user;
	struct pool *p = f->p;
	struct pindex_entry *parent = NULL;
	uint32_t i = 0, listed = 0;

	/* The page before may have left the index meanwhile: then nothing
	 * fetched can be reached, and nothing is listed. */
	if (f->has_parent && !(parent = prefix_index_find(&p->ix, f->parent_hash)))
		i = f->n;
	for (; i < f->n; i++) {
		struct pindex_entry *e = prefix_index_find(&p->ix, f->hashes[i]);

		if (!e && f->pages[i].result == REMOTE_HIT) {
			p->rt.ctr.fetch_bytes += p->page_bytes;
			e = list_page(f, parent, i);
			listed += e != NULL;
		}
		if (!e) {
			/* Not had, or not listed: a request run again walks
			 * on past it rather than asking again. */
			neg_add(p, f->hashes[i]);
			break;
		}
		parent = e;
		f->parent_hash = f->hashes[i];
	}
	p->rt.ctr.fetched += listed;
	p->rt.ctr.fetch_misses += f->n - listed;
	/* Our references: a listed page keeps the index's, the others'
	 * slots go back to the free stack. */
	for (uint32_t k = 0; k < f->n; k++) {
		pagealloc_unref(&p->pa, f->slots[k]);
		prefix_index_update(&p->ix, &p->pa, f->slots[k]);
	}
	p->rt.held -= f->n;
	list_del(&f->link);
	p->rt.inflight--;
	free(f);
	tier_wake_all(p);
}

int rtier_fetch(struct cache *c, struct pool *p, const struct pindex_entry *parent,
		XXH128_hash_t parent_hash, const XXH128_hash_t *hashes, uint32_t n)
{
	struct tier_park pk = {.no_park = 1};
	struct rtier_fetch *f;

	if (!p->rt.on || !n || neg_has(p, hashes[0], prefix_index_now_ns()))
		return 0;
	/* Someone asked for it already: wait for the same answer. */
	for (struct list *it = p->rt.fetches.next; it != &p->rt.fetches; it = it->next) {
		const struct rtier_fetch *o = list_entry(it, struct rtier_fetch, link);

		for (uint32_t i = 0; i < o->n; i++)
			if (same_hash(o->hashes[i], hashes[0]))
				return 1;
	}
	if (n > RTIER_BATCH_PAGES)
		n = RTIER_BATCH_PAGES;
	/* The pages are read straight into free slots (no copy on the
	 * loop), taken as an Append takes them: past the high watermark the
	 * tier makes room first. Fewer when fewer are free. */
	if (tier_make_room(c, p, n, &pk) < 0 && p->pa.n_free < n)
		n = p->pa.n_free;
	if (!n)
		return 0;
	f = calloc(1, sizeof(*f));
	if (!f)
		return 0;
	f->p = p;
	f->has_parent = parent != NULL;
	f->parent_hash = parent_hash;
	f->n = n;
	for (uint32_t i = 0; i < n; i++) {
		kvp_assert(pagealloc_get(&p->pa, &f->slots[i]) == 0);
		f->hashes[i] = hashes[i];
		hash_bytes(hashes[i], f->pages[i].chain);
		f->pages[i].buf = page_addr(p, f->slots[i]);
		f->pages[i].bytes = p->page_bytes;
	}
	f->req.id = p->rt.id;
	f->req.pages = f->pages;
	f->req.n_pages = n;
	f->req.done = fetch_done;
	f->req.user = f;
	list_add_tail(&p->rt.fetches, &f->link);
	p->rt.held += n;
	p->rt.inflight++;
	p->rt.ctr.fetches++;
	if (remote_get(c->remote, &f->req) < 0) {
		for (uint32_t i = 0; i < n; i++)
			pagealloc_unref(&p->pa, f->slots[i]);
		list_del(&f->link);
		p->rt.held -= n;
		p->rt.inflight--;
		free(f);
		return 0;
	}
	return 1;
}

int rtier_check(const struct pool *p, uint32_t *refs)
{
	uint32_t n = 0;

	for (const struct list *it = p->rt.puts.next; it != &p->rt.puts; it = it->next) {
		const struct rtier_put *w = list_entry(it, struct rtier_put, link);

		for (uint32_t i = 0; i < w->n; i++) {
			if (w->slots[i] == PINDEX_NONE)
				continue; /* a copy */
			if (w->slots[i] >= p->pa.n_pages)
				return -EUCLEAN;
			refs[w->slots[i]]++;
			n++;
		}
	}
	for (const struct list *it = p->rt.fetches.next; it != &p->rt.fetches; it = it->next) {
		const struct rtier_fetch *f = list_entry(it, struct rtier_fetch, link);

		for (uint32_t i = 0; i < f->n; i++) {
			if (f->slots[i] >= p->pa.n_pages)
				return -EUCLEAN;
			refs[f->slots[i]]++;
			n++;
		}
	}
	return n == p->rt.held ? 0 : -EUCLEAN;
}
