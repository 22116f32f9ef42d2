/* daemon/core/match.c — prefix matching through the index (see match.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "match.h"
#include "rtier.h"
#include "tier.h"

/* Pages a walk hashes ahead of its lookups: their index lookups, each a
 * cache miss or two in a big index, then overlap. A miss wastes the
 * hashing of at most this many pages. */
#define WALK_AHEAD 16u

/* Walks the pages of carry ‖ tokens from the lease's chain hash, pinning
 * each page found; keeps an incomplete last page's tokens as the new carry.
 * Sets l->complete at the first miss. In batches of WALK_AHEAD pages:
 * hash them (each hash needs the one before, not its lookup) and prefetch
 * their index slots, then look each up and pin it in order. */
static int walk(struct cache *c, struct lease *l, const uint32_t *tokens, size_t n,
		struct match_result *ret)
{
	struct pool *p = l->pool;
	uint32_t bt = p->layout.block_tokens;
	uint32_t first = l->n_pages, n_carry = l->n_carry;
	uint64_t n_tokens = l->n_tokens, now = prefix_index_now_ns();
	XXH128_hash_t chain = l->chain;
	uint32_t *page = NULL;
	size_t at = 0;
	int err = 0;

	*ret = (struct match_result){.first_page = first};
	if (l->complete)
		return 0;
	while (!l->complete && l->n_carry + (n - at) >= bt) {
		XXH128_hash_t hs[WALK_AHEAD], h = l->chain;
		const uint32_t *toks[WALK_AHEAD];
		struct pindex_entry *es[WALK_AHEAD];
		uint32_t k = 0;

		while (k < WALK_AHEAD && l->n_carry + (n - at) >= bt) {
			toks[k] = tokens + at;
			if (l->n_carry) {
				/* A page cut by the previous chunk's end: only
				 * ever the walk's first. */
				if (!(page = malloc((size_t)bt * sizeof(uint32_t)))) {
					err = -ENOMEM;
					break;
				}
				memcpy(page, l->carry, l->n_carry * sizeof(uint32_t));
				memcpy(page + l->n_carry, tokens + at,
				       (bt - l->n_carry) * sizeof(uint32_t));
				at += bt - l->n_carry;
				l->n_carry = 0;
				toks[k] = page;
			} else {
				at += bt;
			}
			h = hs[k] = prefix_index_hash_keyed(h, toks[k], bt,
							    l->n_tokens + (uint64_t)k * bt,
							    l->spans.v, l->spans.n);
			prefix_index_prefetch(&p->ix, h);
			k++;
		}
		if (err < 0)
			break;
		/* A page whose write to disk is in flight is still in its
		 * host slot, which the write's reference keeps: served like
		 * any other (issue 13: pages on their way to disk were
		 * misses). The lease's pin keeps the slot after the write:
		 * the page then stays in the host tier (tier.c, on_written).
		 * Pages being read in have no host slot yet (e->slot). */
		for (uint32_t i = 0; i < k; i++) {
			es[i] = prefix_index_find_host(&p->ix, hs[i]);
			if (!es[i])
				break;
			__builtin_prefetch(es[i]);
		}
		for (uint32_t i = 0; i < k; i++) {
			if (!es[i]) {
				l->complete = 1;
				break;
			}
			err = lease_add_page(l, es[i]->slot, hs[i], toks[i], now);
			if (err < 0)
				break;
			rtier_matched(c, p, es[i]);
			l->chain = hs[i];
			l->n_tokens += bt;
		}
		if (err < 0)
			break;
	}
	free(page);
	if (err == 0 && !l->complete && at < n) {
		/* Fewer than bt tokens left: keep them for the next chunk. */
		if (!l->carry && !(l->carry = malloc((size_t)bt * sizeof(uint32_t))))
			err = -ENOMEM;
		else
			memcpy(l->carry + l->n_carry, tokens + at, (n - at) * sizeof(uint32_t));
		if (err == 0)
			l->n_carry += (uint32_t)(n - at);
	}
	if (err < 0) {
		/* A chunk that failed leaves the lease as it was (the carried
		 * tokens were only read), so the same chunk sent again
		 * matches what it would have: never tokens out of step. */
		lease_drop_pages(l, first);
		l->n_carry = n_carry;
		l->n_tokens = n_tokens;
		l->chain = chain;
		l->complete = 0;
		return err;
	}
	/* No page yet: pages may be NULL, and NULL + 0 is undefined. */
	ret->slots = l->n_pages > first ? l->pages + first : NULL;
	ret->n_slots = l->n_pages - first;
	return 0;
}

/* Pages the walk may still bring into p's host tier: up to the low mark
 * beside what others pin (sessions, leases; not reads). */
static int64_t prefetch_room(const struct cache *c, const struct pool *p)
{
	int64_t pinned = (int64_t)p->pa.n_pages - p->pa.n_free - p->ix.n_idle - p->reads_inflight;

	return (int64_t)tier_mark_pages(c->cfg->host_low_watermark, p->pa.n_pages) -
	       (pinned > 0 ? pinned : 0);
}

/* The next page of carry ‖ tokens[*at..n) into page (when carried) and its
 * tokens; advances *at and clears *n_carry. */
static const uint32_t *next_page(uint32_t bt, const uint32_t *carry, uint32_t *n_carry,
				 const uint32_t *tokens, size_t *at, uint32_t *page)
{
	const uint32_t *toks = tokens + *at;

	if (*n_carry) {
		memcpy(page, carry, *n_carry * sizeof(uint32_t));
		memcpy(page + *n_carry, tokens + *at, (bt - *n_carry) * sizeof(uint32_t));
		*at += bt - *n_carry;
		*n_carry = 0;
		return page;
	}
	*at += bt;
	return toks;
}

static uint32_t disk_prefetch(struct cache *c, struct pool *p, XXH128_hash_t chain,
			      const uint32_t *carry, uint32_t n_carry, const uint32_t *tokens,
			      size_t n, uint64_t pos, const struct pindex_span *spans,
			      uint32_t n_spans, struct tier_park *pk)
{
	uint32_t bt = p->layout.block_tokens, waiting = 0;
	uint32_t page[SHM_MAX_BLOCK_TOKENS];
	int64_t room, need = 0;
	size_t at = 0;

	/* Only a pool with index entries outside the host tier needs the
	 * extra walk: the common all-in-host match hashes its tokens once. */
	if (!p->spill || p->ix.n_entries == p->ix.n_host)
		return 0;
	/* No more of the chain is brought in than the pool holds at its low
	 * mark beside what others pin (sessions, leases; not reads, ours
	 * included): past that, each read evicted a page this walk had read
	 * before, the request parked again and read it back, a livelock until
	 * PEER_MAX_PARK_NS (fuzz_conn: 6.7 GB read in 10 s for a 150-page
	 * match beside a 100-page lease in a 256-page pool). The match then
	 * serves the prefix that fits. */
	room = prefetch_room(c, p);
	while (n_carry + (n - at) >= bt) {
		const uint32_t *toks = next_page(bt, carry, &n_carry, tokens, &at, page);
		struct pindex_entry *e;
		int ret;

		chain = prefix_index_hash_keyed(chain, toks, bt, pos, spans, n_spans);
		pos += bt;
		e = prefix_index_find(&p->ix, chain);
		if (!e)
			break;
		/* Pages others pin are in host and counted in pinned. */
		if (e->slot == PINDEX_NONE || e->io == PINDEX_IO_READ || e->idle) {
			if (need >= room)
				break;
			need++;
		}
		prefix_index_touch(&p->ix, &p->pa, e);
		ret = tier_promote(c, p, e, pk);
		if (ret == 1 || ret == -EAGAIN)
			waiting++;
		else if (ret < 0)
			break; /* no copy, or no room: the walk stops here */
	}
	return waiting;
}

/* Past the last page any local tier holds, asks the cluster for the next
 * pages of the chain (rtier.h): as many as the pool has room for, at most
 * a batch. Returns 1 when the request is to wait for them. */
static uint32_t remote_prefetch(struct cache *c, struct pool *p, XXH128_hash_t chain,
				const uint32_t *carry, uint32_t n_carry, const uint32_t *tokens,
				size_t n, uint64_t pos, const struct pindex_span *spans,
				uint32_t n_spans)
{
	uint32_t bt = p->layout.block_tokens, k = 0, want = RTIER_BATCH_PAGES;
	uint32_t page[SHM_MAX_BLOCK_TOKENS];
	XXH128_hash_t hs[RTIER_BATCH_PAGES], before = chain;
	struct pindex_entry *parent = NULL;
	int64_t room = prefetch_room(c, p);
	size_t at = 0;

	if (room <= 0)
		return 0;
	if ((int64_t)want > room)
		want = (uint32_t)room;
	/* A walk that does not start at the root continues from a page the
	 * lease holds, which is indexed (else nothing after it could be). */
	if (pos && !(parent = prefix_index_find(&p->ix, chain)))
		return 0;
	while (k < want && n_carry + (n - at) >= bt) {
		const uint32_t *toks = next_page(bt, carry, &n_carry, tokens, &at, page);
		struct pindex_entry *e;

		chain = prefix_index_hash_keyed(chain, toks, bt, pos, spans, n_spans);
		pos += bt;
		if (k) {
			hs[k++] = chain;
			continue;
		}
		e = prefix_index_find(&p->ix, chain);
		if (e) {
			/* Held locally (host, disk or on its way): walk on, and
			 * keep it (the fetch's room must not be made of it). */
			prefix_index_touch(&p->ix, &p->pa, e);
			parent = e;
			before = chain;
			continue;
		}
		hs[k++] = chain;
	}
	return k ? (uint32_t)rtier_fetch(c, p, parent, before, hs, k) : 0;
}

uint32_t match_prefetch(struct cache *c, struct pool *p, XXH128_hash_t chain, const uint32_t *carry,
			uint32_t n_carry, const uint32_t *tokens, size_t n, uint64_t pos,
			const struct pindex_span *spans, uint32_t n_spans, struct tier_park *pk)
{
	uint32_t waiting;

	prewarm_release(p); /* a request again: reading ahead may resume */
	/* Room for what the walks bring in is never made of what they use
	 * (prefix_index_keep_walk): a chain longer than the pool has room
	 * for stops short instead of evicting its own pages, reading them
	 * again and parking until its limit. */
	prefix_index_keep_walk(&p->ix, 1);
	waiting = disk_prefetch(c, p, chain, carry, n_carry, tokens, n, pos, spans, n_spans, pk);
	if (!waiting && p->rt.on)
		waiting = remote_prefetch(c, p, chain, carry, n_carry, tokens, n, pos, spans,
					  n_spans);
	prefix_index_keep_walk(&p->ix, 0);
	return waiting;
}

int match_start(struct cache *c, struct pool *p, XXH128_hash_t root, const void *owner,
		struct list *owner_list, const uint32_t *tokens, size_t n,
		const struct pindex_span *spans, uint32_t n_spans, uint64_t reserve_pages,
		struct lease **ret_lease, struct match_result *ret)
{
	struct lease *l;
	int err;

	err = lease_create(c, p, owner, owner_list, &l);
	if (err < 0)
		return err;
	l->root = l->chain = root;
	err = lease_reserve(l, reserve_pages);
	if (err == 0)
		err = prefix_index_spans_add(&l->spans, spans, n_spans, UINT32_MAX);
	if (err == 0)
		err = walk(c, l, tokens, n, ret);
	rtier_commit_end(c, p);
	if (err < 0 || (l->complete && l->n_tokens == 0)) {
		lease_release(c, l);
		return err < 0 ? err : 0;
	}
	*ret_lease = l;
	return 1;
}

int match_extend(struct cache *c, struct lease *l, const uint32_t *tokens, size_t n,
		 struct match_result *ret)
{
	int err = walk(c, l, tokens, n, ret);

	rtier_commit_end(c, l->pool);
	return err;
}

void match_lookup(const struct pool *p, XXH128_hash_t chain, const uint32_t *tokens, size_t n,
		  uint64_t pos, const struct pindex_span *spans, uint32_t n_spans,
		  struct match_lookup_result *ret)
{
	uint32_t bt = p->layout.block_tokens;
	int in_host = 1;

	*ret = (struct match_lookup_result){.chain = chain};
	for (size_t at = 0; at + bt <= n; at += bt) {
		XXH128_hash_t h = prefix_index_hash_keyed(ret->chain, tokens + at, bt, pos + at,
							  spans, n_spans);
		const struct pindex_entry *e = prefix_index_find(&p->ix, h);

		if (!e || prefix_index_lossy(e)) {
			ret->complete = 1;
			return;
		}
		/* A page being read in has no host slot yet. */
		in_host = in_host && e->slot != PINDEX_NONE;
		ret->host_tokens += in_host ? bt : 0;
		ret->matched_tokens += bt;
		ret->chain = h;
	}
}
