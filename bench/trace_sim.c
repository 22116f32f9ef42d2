/* bench/trace_sim.c — offline cache simulations over a conversation trace
 * (trace_sim.h), a code path separate from the daemon's: the same trace,
 * the same page identities (a prefix hash chain over full pages, like the
 * daemon's index, with a root of its own), the same capacity in pages.
 *
 * Each simulation replays the requests in trace order, one at a time. For
 * request r with a prompt of P tokens and a reply of R tokens, in pages of
 * B tokens:
 *  - hits: the prompt's full pages 0, 1, ... (P / B of them) in order,
 *    stopping at the first page not cached: a page is usable only with
 *    every page before it, as in the daemon's longest-prefix match. Hit
 *    tokens = pages hit × B; the prompt's partial last page and every page
 *    after the first miss are recomputed;
 *  - writes: then the request's full pages 0 .. (P + R) / B (its prompt
 *    and reply, what the replayer commits) are referenced in order, each
 *    cached or admitted as the policy says; the partial last page is
 *    never cached.
 * The policies:
 *  - INFINITE: nothing is evicted; the only misses are pages no earlier
 *    request wrote (the ceiling every policy shares);
 *  - LRU: textbook LRU over pages: every written page becomes most
 *    recently used, in page order (so a request's first page is the
 *    oldest of its own); the victim is the least recently used page
 *    anywhere, an interior page of a chain included (its descendants stay
 *    cached but cannot be matched until it is written again);
 *  - LEAF_LRU: kvpalaced's host-tier policy without a disk tier
 *    (daemon/core/tier.c, daemon/store/prefix_index.c), run sequentially: a page a
 *    request holds (matched or being written) cannot leave; only leaves
 *    (cached pages with no cached child) are candidates, least recently
 *    released first; a leaf's parent that becomes a leaf is next in line.
 *    Room is made as tier_make_room does: when the pages in use (cached
 *    plus the request's new ones, its partial last page included) would
 *    pass high × capacity, leaves go until low × capacity are in use (at
 *    least enough for the request). Differs from the daemon only in
 *    running one request at a time: the replayer's workers interleave
 *    and hold their pages concurrently;
 *  - LEAF_LFU: LEAF_LRU's rules (pins, leaves first, watermarks) with
 *    another victim order among the leaves: each page has a use count
 *    (saturating at max_count, 15), raised by one whenever a request
 *    that matched or wrote it lets it go (once a request, in page order,
 *    as the daemon's pages become idle); every aging_uses
 *    (32,768) page uses, every count halves (the leaves are
 *    re-sorted, lowest bucket first, oldest first inside each); the
 *    victim is the leaf of lowest count, least recently released among
 *    equals. A page dropped leaves a ghost: its count is remembered in a
 *    FIFO of ghost_per_page (8) × capacity entries (bounded memory; the
 *    oldest ghost is forgotten), and a page written again while its ghost
 *    lives starts from that count (halved once per aging step since), so
 *    a page that was useful before, evicted by a burst, comes back above
 *    the one-use pages. A parent left childless goes to the cold end of
 *    its count's bucket. The daemon's --eviction lfu is this order.
 *    Parameters chosen on the prod shape, seed 1, at 1,000, 3,000 and
 *    10,000 pages (an aging step measured in uses, not scaled with the
 *    capacity, did best at all three); bench/run reports other seeds
 *    and shapes;
 *  - LEAF_WIN: LEAF_LRU's rules (pins, leaves first, watermarks) with two
 *    classes of pages: a new page is on probation; when a request lets
 *    go of a page for the second time (the writer is the first), it joins
 *    main for good. The victim is probation's least recently released
 *    leaf while probation pages (cached, leaves or not) number more than
 *    window_permille (700) / 1000 of the capacity, else main's (or
 *    probation's when main has no leaf); a parent left childless goes to
 *    the cold end of its class. win_ghost_per_page × capacity ghosts
 *    (default 0: none) let a page evicted and written again start in
 *    main. Chosen on seeds 1-2 of the three shapes at 1,000, 3,000 and
 *    10,000 pages: windows of 100-300 ‰ gained more on prod at 1,000
 *    pages (0.69 of Belady) but lost up to a third on chat; ghosts cost
 *    hits everywhere. The daemon's --eviction window is this order, and
 *    a single replaying client gets exactly its hits
 *    (tests/integration/trace_replay.sh);
 *  - BELADY: Belady's MIN, the offline optimum: each cached page's key is
 *    the index of the next request whose prompt contains it (never:
 *    infinite), ties broken by depth (deeper first); when a page must be
 *    admitted to a full cache, the page with the largest key goes, or the
 *    new page is not admitted when its own key is at least that large
 *    (bypass). A page's next use is never later than its child's (every
 *    prompt holding the child holds the parent), so with the depth
 *    tie-break the cached set stays closed under parents and stopping at
 *    the first miss loses nothing: this is the optimum of page hits at
 *    that capacity (MIN with free admission of written pages), the prefix
 *    rule included. A request needs none of its pages resident to be
 *    served (the daemon holds a request's pages while it runs, workers ×
 *    request pages at most), and the future is known: an upper bound, not
 *    a policy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "trace_sim.h"

#define NONE UINT32_MAX

/* ---- page identities ------------------------------------------------------------ */

struct page_map {
	uint32_t cap; /* power of two */
	uint32_t n;
	XXH128_hash_t *keys;
	uint32_t *ids; /* NONE: empty */
};

static int map_init(struct page_map *m, uint32_t cap)
{
	m->cap = cap;
	m->n = 0;
	m->keys = malloc((size_t)cap * sizeof(*m->keys));
	m->ids = malloc((size_t)cap * sizeof(*m->ids));
	if (!m->keys || !m->ids)
		return -ENOMEM;
	memset(m->ids, 0xff, (size_t)cap * sizeof(*m->ids));
	return 0;
}

static void map_free(struct page_map *m)
{
	free(m->keys);
	free(m->ids);
}

/* The id of hash h, or NONE with *ret_slot where it would go. */
static uint32_t map_find(const struct page_map *m, XXH128_hash_t h, uint32_t *ret_slot)
{
	uint32_t i = (uint32_t)h.low64 & (m->cap - 1);

	while (m->ids[i] != NONE) {
		if (XXH128_isEqual(m->keys[i], h))
			return m->ids[i];
		i = (i + 1) & (m->cap - 1);
	}
	*ret_slot = i;
	return NONE;
}

static int map_grow(struct page_map *m)
{
	struct page_map n;
	uint32_t slot;
	int ret;

	if (m->cap > UINT32_MAX / 2)
		return -ENOMEM;
	ret = map_init(&n, m->cap * 2);
	if (ret < 0) {
		map_free(&n);
		return ret;
	}
	for (uint32_t i = 0; i < m->cap; i++) {
		if (m->ids[i] == NONE)
			continue;
		map_find(&n, m->keys[i], &slot);
		n.keys[slot] = m->keys[i];
		n.ids[slot] = m->ids[i];
	}
	n.n = m->n;
	map_free(m);
	*m = n;
	return 0;
}

/* XXH3_128(parent ‖ tokens), parent in canonical (big-endian) form, as
 * the daemon hashes its chain. */
static XXH128_hash_t hash_page(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n,
			       unsigned char *buf)
{
	XXH128_canonicalFromHash((XXH128_canonical_t *)buf, parent);
	memcpy(buf + sizeof(XXH128_canonical_t), tokens, (size_t)n * sizeof(uint32_t));
	return XXH3_128bits(buf, sizeof(XXH128_canonical_t) + (size_t)n * sizeof(uint32_t));
}

void trace_pages_free(struct trace_pages *pg)
{
	if (pg->conv) {
		for (uint32_t c = 0; c < pg->n_convs; c++)
			free(pg->conv[c]);
		free(pg->conv);
	}
	free(pg->depth);
	free(pg->parent);
	memset(pg, 0, sizeof(*pg));
}

int trace_pages_build(const struct trace *t, uint32_t block_tokens, struct trace_pages *ret)
{
	static const char root_tag[] = "kvp-bench-trace page chain, format 1";
	struct trace_pages pg = {.block_tokens = block_tokens};
	XXH128_hash_t root = XXH3_128bits(root_tag, sizeof(root_tag));
	struct page_map m = {0};
	uint32_t cap_pages = 0;
	unsigned char *buf;
	int ret_err = -ENOMEM;

	if (!block_tokens || block_tokens > 4096)
		return -EINVAL;
	buf = malloc(sizeof(XXH128_canonical_t) + (size_t)block_tokens * sizeof(uint32_t));
	if (!buf)
		return -ENOMEM;
	pg.conv = calloc((size_t)t->n_convs + 1, sizeof(*pg.conv));
	if (!pg.conv || map_init(&m, 1u << 16) < 0)
		goto fail;
	pg.n_convs = t->n_convs;
	for (uint32_t c = 0; c < t->n_convs; c++) {
		const struct trace_conv *cv = &t->convs[c];
		uint32_t n = cv->n_tokens / block_tokens;
		XXH128_hash_t h = root;

		pg.conv[c] = malloc(((size_t)n + 1) * sizeof(uint32_t));
		if (!pg.conv[c])
			goto fail;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t slot, id;

			h = hash_page(h, cv->tokens + (size_t)i * block_tokens, block_tokens, buf);
			id = map_find(&m, h, &slot);
			if (id == NONE) {
				if (pg.n_pages == cap_pages) {
					uint32_t nc = cap_pages ? cap_pages * 2 : 1u << 16;
					uint32_t *d = realloc(pg.depth, (size_t)nc * sizeof(*d));
					uint32_t *p;

					if (!d)
						goto fail;
					pg.depth = d;
					p = realloc(pg.parent, (size_t)nc * sizeof(*p));
					if (!p)
						goto fail;
					pg.parent = p;
					cap_pages = nc;
				}
				id = pg.n_pages++;
				pg.depth[id] = i;
				pg.parent[id] = i ? pg.conv[c][i - 1] : NONE;
				m.keys[slot] = h;
				m.ids[slot] = id;
				if (++m.n > m.cap / 2 && map_grow(&m) < 0)
					goto fail;
			}
			pg.conv[c][i] = id;
		}
	}
	for (uint32_t r = 0; r < t->n_reqs; r++)
		pg.page_refs += t->reqs[r].prompt_tokens / block_tokens;
	map_free(&m);
	free(buf);
	*ret = pg;
	return 0;
fail:
	map_free(&m);
	free(buf);
	trace_pages_free(&pg);
	return ret_err;
}

const char *trace_sim_name(enum trace_policy pol)
{
	switch (pol) {
	case TRACE_SIM_INFINITE:
		return "infinite";
	case TRACE_SIM_LRU:
		return "LRU";
	case TRACE_SIM_LEAF_LRU:
		return "leaf-LRU";
	case TRACE_SIM_BELADY:
		return "Belady";
	case TRACE_SIM_LEAF_LFU:
		return "leaf-LFU";
	case TRACE_SIM_LEAF_WIN:
		return "leaf-window";
	case TRACE_SIM_N:
		break;
	}
	return "?";
}

/* ---- a doubly linked list over page ids -------------------------------------------- */

/* Entries 0 .. n-1 are pages; entry n is the head (next: coldest). */
struct plist {
	uint32_t n;
	uint32_t *prev, *next;
	uint8_t *on;
};

static int plist_init(struct plist *l, uint32_t n)
{
	l->n = n;
	l->prev = malloc(((size_t)n + 1) * sizeof(uint32_t));
	l->next = malloc(((size_t)n + 1) * sizeof(uint32_t));
	l->on = calloc((size_t)n + 1, 1);
	if (!l->prev || !l->next || !l->on)
		return -ENOMEM;
	l->prev[n] = l->next[n] = n;
	return 0;
}

static void plist_free(struct plist *l)
{
	free(l->prev);
	free(l->next);
	free(l->on);
}

static void plist_del(struct plist *l, uint32_t x)
{
	if (!l->on[x])
		return;
	l->next[l->prev[x]] = l->next[x];
	l->prev[l->next[x]] = l->prev[x];
	l->on[x] = 0;
}

/* Inserts x after entry `at` (at = n: at the cold end). */
static void plist_add_after(struct plist *l, uint32_t at, uint32_t x)
{
	plist_del(l, x);
	l->prev[x] = at;
	l->next[x] = l->next[at];
	l->prev[l->next[at]] = x;
	l->next[at] = x;
	l->on[x] = 1;
}

static void plist_add_hot(struct plist *l, uint32_t x)
{
	plist_add_after(l, l->prev[l->n], x);
}

static uint32_t plist_coldest(const struct plist *l)
{
	return l->next[l->n] == l->n ? NONE : l->next[l->n];
}

/* ---- the policies ------------------------------------------------------------------ */

struct sim {
	const struct trace *t;
	const struct trace_pages *pg;
	uint32_t cap;
	uint8_t *cached; /* [n_pages] */
	uint32_t n_cached;
	struct trace_sim_result res;
};

/* Pages of request r's prompt hit, stopping at the first miss. */
static uint32_t sim_hits(const struct sim *s, const struct trace_req *q)
{
	const uint32_t *ids = s->pg->conv[q->conv];
	uint32_t n = q->prompt_tokens / s->pg->block_tokens, h = 0;

	while (h < n && s->cached[ids[h]])
		h++;
	return h;
}

static void sim_peak(struct sim *s, uint32_t used)
{
	if (used > s->res.peak_pages)
		s->res.peak_pages = used;
}

static int run_infinite(struct sim *s, uint32_t *hits)
{
	for (uint32_t r = 0; r < s->t->n_reqs; r++) {
		const struct trace_req *q = &s->t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t n = (q->prompt_tokens + q->reply_tokens) / s->pg->block_tokens;

		hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < n; i++) {
			s->n_cached += !s->cached[ids[i]];
			s->cached[ids[i]] = 1;
		}
		sim_peak(s, s->n_cached);
	}
	return 0;
}

static int run_lru(struct sim *s, uint32_t *hits)
{
	struct plist l;
	int ret = plist_init(&l, s->pg->n_pages);

	if (ret < 0)
		goto out;
	for (uint32_t r = 0; r < s->t->n_reqs; r++) {
		const struct trace_req *q = &s->t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t n = (q->prompt_tokens + q->reply_tokens) / s->pg->block_tokens;

		hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t id = ids[i];

			if (!s->cached[id]) {
				if (s->n_cached == s->cap) {
					uint32_t v = plist_coldest(&l);

					plist_del(&l, v);
					s->cached[v] = 0;
					s->n_cached--;
					s->res.evictions++;
				}
				s->cached[id] = 1;
				s->n_cached++;
			}
			plist_add_hot(&l, id);
		}
		sim_peak(s, s->n_cached);
	}
out:
	plist_free(&l);
	return ret;
}

struct leaf_state {
	struct plist l;	    /* unpinned leaves, coldest first */
	uint32_t *children; /* [n_pages] cached children of a page */
	uint8_t *pinned;    /* [n_pages] held by the request running */
};

/* Drops the coldest leaves until at most `keep` pages are cached or none
 * is left to drop; a parent left without children is next in line. */
static void leaf_evict(struct sim *s, struct leaf_state *ls, uint64_t keep)
{
	while (s->n_cached > keep) {
		uint32_t v = plist_coldest(&ls->l), p;

		if (v == NONE)
			break;
		plist_del(&ls->l, v);
		s->cached[v] = 0;
		s->n_cached--;
		s->res.evictions++;
		p = s->pg->parent[v];
		if (p != NONE && --ls->children[p] == 0 && !ls->pinned[p])
			plist_add_after(&ls->l, ls->l.n, p); /* at the cold end */
	}
}

/* kvpalaced without a disk tier, one request at a time. */
static int run_leaf_lru(struct sim *s, uint32_t *hits, double high, double low)
{
	uint32_t n_pages = s->pg->n_pages, B = s->pg->block_tokens;
	uint64_t high_p = (uint64_t)(high * s->cap), low_p = (uint64_t)(low * s->cap);
	struct leaf_state ls = {
		.children = calloc(n_pages, sizeof(uint32_t)),
		.pinned = calloc(n_pages, 1),
	};
	int ret = plist_init(&ls.l, n_pages);

	if (ret < 0 || !ls.children || !ls.pinned) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t r = 0; r < s->t->n_reqs; r++) {
		const struct trace_req *q = &s->t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t total = q->prompt_tokens + q->reply_tokens;
		uint32_t full = total / B, all = (total + B - 1) / B, h, need;

		h = hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < h; i++) { /* the match pins them */
			ls.pinned[ids[i]] = 1;
			plist_del(&ls.l, ids[i]);
		}
		/* Append: room for the new pages, partial last one included,
		 * as tier_make_room: past the high mark, down to the low one
		 * (or at least room for the request). */
		need = all - h;
		if ((uint64_t)s->n_cached + need > high_p ||
		    (uint64_t)s->n_cached + need > s->cap) {
			uint64_t want = s->cap - (low_p < s->cap ? low_p : s->cap);

			if (want < need)
				want = need;
			leaf_evict(s, &ls, want < s->cap ? s->cap - want : 0);
		}
		sim_peak(s, s->n_cached + need);
		/* Commit: full new pages enter the index (or are deduplicated
		 * against a copy already there); close: all are released,
		 * leaves to the hot end, in page order. */
		for (uint32_t i = h; i < full; i++) {
			uint32_t id = ids[i], p = s->pg->parent[id];

			ls.pinned[id] = 1;
			if (s->cached[id]) {
				plist_del(&ls.l, id);
				continue;
			}
			s->cached[id] = 1;
			s->n_cached++;
			if (p != NONE) {
				ls.children[p]++;
				plist_del(&ls.l, p);
			}
		}
		for (uint32_t i = 0; i < full; i++) {
			uint32_t id = ids[i];

			ls.pinned[id] = 0;
			if (!ls.children[id])
				plist_add_hot(&ls.l, id);
		}
		/* A request larger than the room there was: the daemon would
		 * have refused it (-ENOSPC); never keep more than the
		 * capacity past it. */
		leaf_evict(s, &ls, s->cap);
	}
out:
	plist_free(&ls.l);
	free(ls.children);
	free(ls.pinned);
	return ret;
}

void trace_lfu_default(struct trace_lfu *l)
{
	*l = (struct trace_lfu){
		.max_count = TRACE_LFU_MAX_COUNT,
		.aging_uses = 32768,
		.ghost_per_page = 8,
		.window_permille = 700,
		.win_ghost_per_page = 0,
	};
}

#define NB (TRACE_LFU_MAX_COUNT + 1)

struct lfu_state {
	uint32_t n; /* pages; entries n .. n + NB - 1 are the buckets' heads */
	uint32_t *prev, *next;
	uint8_t *on;
	uint8_t *cnt;	     /* [n_pages] count as of epoch ep */
	uint32_t *ep;	     /* [n_pages] */
	uint32_t epoch;	     /* aging steps so far */
	uint64_t uses;	     /* page uses since the last step */
	uint64_t aging_uses; /* a step every this many */
	uint32_t *children;
	uint8_t *pinned;
	uint32_t *ghost_ring; /* [n_ghost] page ids, FIFO */
	uint32_t *ghost_at;   /* [n_pages] slot of a page's ghost, NONE */
	uint32_t n_ghost, ghost_pos;
	const struct trace_lfu *prm;
};

static uint32_t lfu_eff(const struct lfu_state *ls, uint32_t x)
{
	uint32_t d = ls->epoch - ls->ep[x];

	return d >= 8 ? 0 : (uint32_t)ls->cnt[x] >> d;
}

static void lfu_del(struct lfu_state *ls, uint32_t x)
{
	if (!ls->on[x])
		return;
	ls->next[ls->prev[x]] = ls->next[x];
	ls->prev[ls->next[x]] = ls->prev[x];
	ls->on[x] = 0;
}

static void lfu_link(struct lfu_state *ls, uint32_t at, uint32_t x)
{
	ls->prev[x] = at;
	ls->next[x] = ls->next[at];
	ls->prev[ls->next[at]] = x;
	ls->next[at] = x;
	ls->on[x] = 1;
}

/* Lists x in its count's bucket: at the warm end, or the cold one. */
static void lfu_add(struct lfu_state *ls, uint32_t x, int cold)
{
	uint32_t h = ls->n + lfu_eff(ls, x);

	lfu_del(ls, x);
	lfu_link(ls, cold ? h : ls->prev[h], x);
}

static void lfu_use(struct lfu_state *ls, uint32_t x, uint32_t w)
{
	uint32_t c = lfu_eff(ls, x) + w;

	ls->cnt[x] = (uint8_t)(c > ls->prm->max_count ? ls->prm->max_count : c);
	ls->ep[x] = ls->epoch;
	ls->uses++;
}

/* An aging step when due: every count halves, the leaves re-sorted. */
static void lfu_age(struct lfu_state *ls)
{
	if (ls->uses < ls->aging_uses)
		return;
	ls->uses = 0;
	ls->epoch++;
	for (uint32_t b = 1; b < NB; b++) {
		uint32_t h = ls->n + b;

		while (ls->next[h] != h) {
			uint32_t x = ls->next[h];

			lfu_del(ls, x);
			lfu_add(ls, x, 0); /* its bucket is now b >> 1 */
		}
	}
}

static uint32_t lfu_coldest(const struct lfu_state *ls)
{
	for (uint32_t b = 0; b < NB; b++)
		if (ls->next[ls->n + b] != ls->n + b)
			return ls->next[ls->n + b];
	return NONE;
}

static void lfu_ghost(struct lfu_state *ls, uint32_t v)
{
	uint32_t old;

	if (!ls->n_ghost)
		return;
	old = ls->ghost_ring[ls->ghost_pos];
	if (old != NONE && ls->ghost_at[old] == ls->ghost_pos)
		ls->ghost_at[old] = NONE;
	ls->ghost_ring[ls->ghost_pos] = v;
	ls->ghost_at[v] = ls->ghost_pos;
	ls->ghost_pos = (ls->ghost_pos + 1) % ls->n_ghost;
}

static void lfu_evict(struct sim *s, struct lfu_state *ls, uint64_t keep)
{
	while (s->n_cached > keep) {
		uint32_t v = lfu_coldest(ls), p;

		if (v == NONE)
			break;
		lfu_del(ls, v);
		s->cached[v] = 0;
		s->n_cached--;
		s->res.evictions++;
		lfu_ghost(ls, v);
		p = s->pg->parent[v];
		if (p != NONE && --ls->children[p] == 0 && !ls->pinned[p])
			lfu_add(ls, p, 1);
	}
}

static int run_leaf_lfu(struct sim *s, uint32_t *hits, double high, double low,
			const struct trace_lfu *prm)
{
	uint32_t n_pages = s->pg->n_pages, B = s->pg->block_tokens;
	uint64_t high_p = (uint64_t)(high * s->cap), low_p = (uint64_t)(low * s->cap);
	size_t nl = (size_t)n_pages + NB;
	struct lfu_state ls = {
		.n = n_pages,
		.prev = malloc(nl * sizeof(uint32_t)),
		.next = malloc(nl * sizeof(uint32_t)),
		.on = calloc(nl, 1),
		.cnt = calloc(n_pages + 1, 1),
		.ep = calloc(n_pages + 1, sizeof(uint32_t)),
		.children = calloc(n_pages + 1, sizeof(uint32_t)),
		.pinned = calloc(n_pages + 1, 1),
		.ghost_at = malloc(((size_t)n_pages + 1) * sizeof(uint32_t)),
		.n_ghost = (uint32_t)((uint64_t)prm->ghost_per_page * s->cap > (1u << 30)
					      ? (1u << 30)
					      : (uint64_t)prm->ghost_per_page * s->cap),
		.aging_uses = prm->aging_uses,
		.prm = prm,
	};
	int ret = -ENOMEM;

	ls.ghost_ring = malloc(((size_t)ls.n_ghost + 1) * sizeof(uint32_t));
	if (!ls.prev || !ls.next || !ls.on || !ls.cnt || !ls.ep || !ls.children || !ls.pinned ||
	    !ls.ghost_at || !ls.ghost_ring)
		goto out;
	for (uint32_t b = 0; b < NB; b++)
		ls.prev[n_pages + b] = ls.next[n_pages + b] = n_pages + b;
	memset(ls.ghost_at, 0xff, ((size_t)n_pages + 1) * sizeof(uint32_t));
	memset(ls.ghost_ring, 0xff, ((size_t)ls.n_ghost + 1) * sizeof(uint32_t));
	for (uint32_t r = 0; r < s->t->n_reqs; r++) {
		const struct trace_req *q = &s->t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t total = q->prompt_tokens + q->reply_tokens;
		uint32_t full = total / B, all = (total + B - 1) / B, h, need;

		h = hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < h; i++) {
			ls.pinned[ids[i]] = 1;
			lfu_del(&ls, ids[i]);
		}
		need = all - h;
		if ((uint64_t)s->n_cached + need > high_p ||
		    (uint64_t)s->n_cached + need > s->cap) {
			uint64_t want = s->cap - (low_p < s->cap ? low_p : s->cap);

			if (want < need)
				want = need;
			lfu_evict(s, &ls, want < s->cap ? s->cap - want : 0);
		}
		sim_peak(s, s->n_cached + need);
		for (uint32_t i = h; i < full; i++) {
			uint32_t id = ids[i], p = s->pg->parent[id];

			ls.pinned[id] = 1;
			if (s->cached[id]) {
				lfu_del(&ls, id);
				continue;
			}
			/* A new page: its ghost's count, or none; the use is
			 * counted when it is released, as every page's. */
			if (ls.ghost_at[id] == NONE) {
				ls.cnt[id] = 0;
			} else {
				ls.cnt[id] = (uint8_t)lfu_eff(&ls, id);
				ls.ghost_at[id] = NONE;
			}
			ls.ep[id] = ls.epoch;
			s->cached[id] = 1;
			s->n_cached++;
			if (p != NONE) {
				ls.children[p]++;
				lfu_del(&ls, p);
			}
		}
		for (uint32_t i = 0; i < full; i++) {
			uint32_t id = ids[i];

			ls.pinned[id] = 0;
			lfu_use(&ls, id, 1);
			if (!ls.children[id])
				lfu_add(&ls, id, 0);
			lfu_age(&ls);
		}
		lfu_evict(s, &ls, s->cap);
	}
	ret = 0;
out:
	free(ls.prev);
	free(ls.next);
	free(ls.on);
	free(ls.cnt);
	free(ls.ep);
	free(ls.children);
	free(ls.pinned);
	free(ls.ghost_at);
	free(ls.ghost_ring);
	return ret;
}

/* ---- leaf-window: a probation window in front of an LRU main segment ---------- */

struct win_state {
	struct plist l[2];  /* unpinned leaves of each class (0 probation, 1 main), coldest first */
	uint32_t *children; /* [n_pages] cached children of a page */
	uint8_t *pinned;    /* [n_pages] held by the request running */
	uint8_t *main;	    /* [n_pages] class: in the main segment */
	uint8_t *uses;	    /* [n_pages] releases while cached, saturating at 2 */
	uint32_t n_prob;    /* cached pages of the probation class */
	uint64_t window;    /* pages the probation class may hold before it goes first */
	uint32_t *ghost_ring; /* [n_ghost] page ids, FIFO */
	uint32_t *ghost_at;   /* [n_pages] slot of a page's ghost, NONE */
	uint32_t n_ghost, ghost_pos;
};

/* The leaf to evict: probation's coldest while the probation class holds
 * more than its window (or main has no leaf), else main's coldest. */
static uint32_t win_victim(const struct win_state *w)
{
	uint32_t p = plist_coldest(&w->l[0]), m = plist_coldest(&w->l[1]);

	if (p != NONE && (w->n_prob > w->window || m == NONE))
		return p;
	return m;
}

static void win_list(struct win_state *w, uint32_t x, int cold)
{
	struct plist *l = &w->l[w->main[x]];

	plist_del(&w->l[!w->main[x]], x);
	if (cold)
		plist_add_after(l, l->n, x);
	else
		plist_add_hot(l, x);
}

static void win_unlist(struct win_state *w, uint32_t x)
{
	plist_del(&w->l[0], x);
	plist_del(&w->l[1], x);
}

static void win_evict(struct sim *s, struct win_state *w, uint64_t keep)
{
	while (s->n_cached > keep) {
		uint32_t v = win_victim(w), p;

		if (v == NONE)
			break;
		win_unlist(w, v);
		s->cached[v] = 0;
		s->n_cached--;
		s->res.evictions++;
		w->n_prob -= !w->main[v];
		if (w->n_ghost) { /* remembered: written again, it joins main */
			uint32_t old = w->ghost_ring[w->ghost_pos];

			if (old != NONE && w->ghost_at[old] == w->ghost_pos)
				w->ghost_at[old] = NONE;
			w->ghost_ring[w->ghost_pos] = v;
			w->ghost_at[v] = w->ghost_pos;
			w->ghost_pos = (w->ghost_pos + 1) % w->n_ghost;
		}
		p = s->pg->parent[v];
		if (p != NONE && --w->children[p] == 0 && !w->pinned[p])
			win_list(w, p, 1);
	}
}

static int run_leaf_win(struct sim *s, uint32_t *hits, double high, double low,
			const struct trace_lfu *prm)
{
	uint32_t n_pages = s->pg->n_pages, B = s->pg->block_tokens;
	uint64_t high_p = (uint64_t)(high * s->cap), low_p = (uint64_t)(low * s->cap);
	uint64_t ng = (uint64_t)prm->win_ghost_per_page * s->cap;
	struct win_state w = {
		.children = calloc((size_t)n_pages + 1, sizeof(uint32_t)),
		.pinned = calloc((size_t)n_pages + 1, 1),
		.main = calloc((size_t)n_pages + 1, 1),
		.uses = calloc((size_t)n_pages + 1, 1),
		.window = (uint64_t)prm->window_permille * s->cap / 1000,
		.ghost_at = malloc(((size_t)n_pages + 1) * sizeof(uint32_t)),
		.n_ghost = (uint32_t)(ng > (1u << 30) ? (1u << 30) : ng),
	};
	int ret = -ENOMEM;

	w.ghost_ring = malloc(((size_t)w.n_ghost + 1) * sizeof(uint32_t));
	if (plist_init(&w.l[0], n_pages) < 0 || plist_init(&w.l[1], n_pages) < 0 || !w.children ||
	    !w.pinned || !w.main || !w.uses || !w.ghost_at || !w.ghost_ring)
		goto out;
	memset(w.ghost_at, 0xff, ((size_t)n_pages + 1) * sizeof(uint32_t));
	memset(w.ghost_ring, 0xff, ((size_t)w.n_ghost + 1) * sizeof(uint32_t));
	for (uint32_t r = 0; r < s->t->n_reqs; r++) {
		const struct trace_req *q = &s->t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t total = q->prompt_tokens + q->reply_tokens;
		uint32_t full = total / B, all = (total + B - 1) / B, h, need;

		h = hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < h; i++) {
			w.pinned[ids[i]] = 1;
			win_unlist(&w, ids[i]);
		}
		need = all - h;
		if ((uint64_t)s->n_cached + need > high_p ||
		    (uint64_t)s->n_cached + need > s->cap) {
			uint64_t want = s->cap - (low_p < s->cap ? low_p : s->cap);

			if (want < need)
				want = need;
			win_evict(s, &w, want < s->cap ? s->cap - want : 0);
		}
		sim_peak(s, s->n_cached + need);
		for (uint32_t i = h; i < full; i++) {
			uint32_t id = ids[i], p = s->pg->parent[id];

			w.pinned[id] = 1;
			if (s->cached[id]) {
				win_unlist(&w, id);
				continue;
			}
			/* A new page: main if its ghost lives, else probation. */
			w.main[id] = w.ghost_at[id] != NONE;
			w.ghost_at[id] = NONE;
			w.uses[id] = 0;
			w.n_prob += !w.main[id];
			s->cached[id] = 1;
			s->n_cached++;
			if (p != NONE) {
				w.children[p]++;
				win_unlist(&w, p);
			}
		}
		/* Close: each page let go of is a use; a probation page used
		 * a second time (by a request other than the one that wrote
		 * it) joins main. */
		for (uint32_t i = 0; i < full; i++) {
			uint32_t id = ids[i];

			w.pinned[id] = 0;
			if (w.uses[id] < 2)
				w.uses[id]++;
			if (!w.main[id] && w.uses[id] >= 2) {
				w.main[id] = 1;
				w.n_prob--;
			}
			if (!w.children[id])
				win_list(&w, id, 0);
		}
		win_evict(s, &w, s->cap);
	}
	ret = 0;
out:
	plist_free(&w.l[0]);
	plist_free(&w.l[1]);
	free(w.children);
	free(w.pinned);
	free(w.main);
	free(w.uses);
	free(w.ghost_at);
	free(w.ghost_ring);
	return ret;
}

/* An indexed max-heap of cached pages by (next use, depth). */
struct bheap {
	uint32_t n;
	uint32_t *heap; /* [capacity] page ids */
	uint32_t *pos;	/* [n_pages] where a page is in heap, NONE if absent */
	uint32_t *next; /* [n_pages] a cached page's next use */
	const uint32_t *depth;
};

static int bh_greater(const struct bheap *b, uint32_t x, uint32_t y)
{
	if (b->next[x] != b->next[y])
		return b->next[x] > b->next[y];
	return b->depth[x] > b->depth[y];
}

static void bh_set(struct bheap *b, uint32_t i, uint32_t x)
{
	b->heap[i] = x;
	b->pos[x] = i;
}

static void bh_up(struct bheap *b, uint32_t i)
{
	uint32_t x = b->heap[i];

	while (i && bh_greater(b, x, b->heap[(i - 1) / 2])) {
		bh_set(b, i, b->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	bh_set(b, i, x);
}

static void bh_down(struct bheap *b, uint32_t i)
{
	uint32_t x = b->heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= b->n)
			break;
		if (c + 1 < b->n && bh_greater(b, b->heap[c + 1], b->heap[c]))
			c++;
		if (!bh_greater(b, b->heap[c], x))
			break;
		bh_set(b, i, b->heap[c]);
		i = c;
	}
	bh_set(b, i, x);
}

static void bh_pop(struct bheap *b)
{
	uint32_t x = b->heap[0];

	b->pos[x] = NONE;
	if (--b->n) {
		bh_set(b, 0, b->heap[b->n]);
		bh_down(b, 0);
	}
}

static int run_belady(struct sim *s, uint32_t *hits)
{
	const struct trace *t = s->t;
	uint32_t n_pages = s->pg->n_pages, B = s->pg->block_tokens;
	uint64_t n_refs = 0, *off = malloc(((size_t)t->n_reqs + 1) * sizeof(uint64_t));
	uint32_t *last = malloc((size_t)n_pages * sizeof(uint32_t)), *nxt = NULL;
	struct bheap b = {.depth = s->pg->depth};
	int ret = -ENOMEM;

	b.heap = malloc(((size_t)s->cap + 1) * sizeof(uint32_t));
	b.pos = malloc((size_t)n_pages * sizeof(uint32_t));
	b.next = malloc((size_t)n_pages * sizeof(uint32_t));
	if (!off || !last || !b.heap || !b.pos || !b.next)
		goto out;
	for (uint32_t r = 0; r < t->n_reqs; r++) {
		off[r] = n_refs;
		n_refs += (t->reqs[r].prompt_tokens + t->reqs[r].reply_tokens) / B;
	}
	off[t->n_reqs] = n_refs;
	nxt = malloc((size_t)n_refs * sizeof(uint32_t));
	if (!nxt)
		goto out;
	/* Next use of each page written by request r: the first later
	 * request whose prompt holds it. */
	memset(last, 0xff, (size_t)n_pages * sizeof(uint32_t));
	for (uint32_t r = t->n_reqs; r-- > 0;) {
		const struct trace_req *q = &t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t n = (uint32_t)(off[r + 1] - off[r]), np = q->prompt_tokens / B;

		for (uint32_t i = 0; i < n; i++)
			nxt[off[r] + i] = last[ids[i]];
		for (uint32_t i = 0; i < np; i++)
			last[ids[i]] = r;
	}
	memset(b.pos, 0xff, (size_t)n_pages * sizeof(uint32_t));
	for (uint32_t r = 0; r < t->n_reqs; r++) {
		const struct trace_req *q = &t->reqs[r];
		const uint32_t *ids = s->pg->conv[q->conv];
		uint32_t n = (uint32_t)(off[r + 1] - off[r]);

		hits[r] = sim_hits(s, q);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t id = ids[i], key = nxt[off[r] + i];

			if (b.pos[id] != NONE) {
				uint32_t old = b.next[id];

				b.next[id] = key;
				if (key > old)
					bh_up(&b, b.pos[id]);
				else
					bh_down(&b, b.pos[id]);
				continue;
			}
			b.next[id] = key;
			if (b.n == s->cap) {
				uint32_t v = b.heap[0];

				if (!bh_greater(&b, v, id)) {
					s->res.bypassed++;
					continue;
				}
				bh_pop(&b);
				s->cached[v] = 0;
				s->n_cached--;
				s->res.evictions++;
			}
			b.heap[b.n] = id;
			bh_up(&b, b.n++);
			s->cached[id] = 1;
			s->n_cached++;
		}
		sim_peak(s, s->n_cached);
	}
	ret = 0;
out:
	free(off);
	free(last);
	free(nxt);
	free(b.heap);
	free(b.pos);
	free(b.next);
	return ret;
}

int trace_sim_run(const struct trace *t, const struct trace_pages *pg, enum trace_policy pol,
		  uint32_t capacity_pages, double high, double low, uint32_t *ret_hits,
		  struct trace_sim_result *ret)
{
	return trace_sim_run_lfu(t, pg, pol, capacity_pages, high, low, NULL, ret_hits, ret);
}

int trace_sim_run_lfu(const struct trace *t, const struct trace_pages *pg, enum trace_policy pol,
		      uint32_t capacity_pages, double high, double low, const struct trace_lfu *lfu,
		      uint32_t *ret_hits, struct trace_sim_result *ret)
{
	struct trace_lfu dflt;
	struct sim s = {.t = t, .pg = pg, .cap = capacity_pages};
	uint32_t *hits = malloc(((size_t)t->n_reqs + 1) * sizeof(uint32_t));
	int err = -ENOMEM;

	if (pol != TRACE_SIM_INFINITE &&
	    (!capacity_pages || !(low > 0 && low <= high && high <= 1))) {
		free(hits);
		return -EINVAL;
	}
	s.cached = calloc((size_t)pg->n_pages + 1, 1);
	if (!hits || !s.cached)
		goto out;
	switch (pol) {
	case TRACE_SIM_INFINITE:
		err = run_infinite(&s, hits);
		break;
	case TRACE_SIM_LRU:
		err = run_lru(&s, hits);
		break;
	case TRACE_SIM_LEAF_LRU:
		err = run_leaf_lru(&s, hits, high, low);
		break;
	case TRACE_SIM_BELADY:
		err = run_belady(&s, hits);
		break;
	case TRACE_SIM_LEAF_LFU:
		if (!lfu) {
			trace_lfu_default(&dflt);
			lfu = &dflt;
		}
		err = lfu->max_count >= 1 && lfu->max_count <= TRACE_LFU_MAX_COUNT &&
				      lfu->aging_uses
			      ? run_leaf_lfu(&s, hits, high, low, lfu)
			      : -EINVAL;
		break;
	case TRACE_SIM_LEAF_WIN:
		if (!lfu) {
			trace_lfu_default(&dflt);
			lfu = &dflt;
		}
		err = lfu->window_permille <= 1000 ? run_leaf_win(&s, hits, high, low, lfu)
						   : -EINVAL;
		break;
	default:
		err = -EINVAL;
	}
	if (err < 0)
		goto out;
	for (uint32_t r = 0; r < t->n_reqs; r++) {
		hits[r] *= pg->block_tokens;
		s.res.prompt_tokens += t->reqs[r].prompt_tokens;
		s.res.hit_tokens += hits[r];
		if (ret_hits)
			ret_hits[r] = hits[r];
	}
	*ret = s.res;
out:
	free(hits);
	free(s.cached);
	return err;
}
