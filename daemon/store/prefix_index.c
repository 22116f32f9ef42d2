/* daemon/store/prefix_index.c — content-addressed full pages (see prefix_index.h). */
/* Streaming XXH3 state on the stack instead of malloc per hash. */
#define XXH_STATIC_LINKING_ONLY
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "prefix_index.h"

_Static_assert(PINDEX_LFU_BUCKETS <= 16, "lfu_count and lfu_bucket are 4 bits");
/* The layout prefix_index.h describes (LP64): the walk's fields in the
 * first 64 bytes, the whole in a 128-byte malloc chunk. */
_Static_assert(sizeof(void *) != 8 || (offsetof(struct pindex_entry, lru_link) == 64 &&
				       sizeof(struct pindex_entry) <= 120),
	       "struct pindex_entry grew past its layout");

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token ids are hashed as little-endian uint32: add a byte swap for this host"
#endif

static uint64_t key_of(XXH128_hash_t h)
{
	return h.low64 | 1; /* idmap ids are never 0 */
}

uint64_t prefix_index_now_ns(void)
{
	struct timespec ts;

	/* The coarse clock costs a memory read, not a counter read: it is
	 * taken on every holder change of an indexed page, and an age purge
	 * counts in seconds. */
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int prefix_index_init(struct prefix_index *ix, uint32_t n_pages)
{
	memset(ix, 0, sizeof(*ix));
	list_init(&ix->host_lru);
	list_init(&ix->keep_lru);
	list_init(&ix->disk_lru);
	ix->n_pages = n_pages;
	ix->by_slot = calloc(n_pages ? n_pages : 1, sizeof(*ix->by_slot));
	return ix->by_slot ? 0 : -ENOMEM;
}

int prefix_index_set_lfu(struct prefix_index *ix, uint32_t n_ghosts, uint64_t aging_uses)
{
	int ret;

	if (ix->n_entries || !aging_uses)
		return -EINVAL;
	ret = ghost_init(&ix->ghost, n_ghosts);
	if (ret < 0)
		return ret;
	for (uint32_t b = 0; b < PINDEX_LFU_BUCKETS; b++)
		list_init(&ix->host_lfu[b]);
	ix->lfu = 1;
	ix->lfu_aging_uses = aging_uses;
	return 0;
}

int prefix_index_set_window(struct prefix_index *ix, uint32_t permille)
{
	if (ix->n_entries || ix->lfu || permille > 1000)
		return -EINVAL;
	for (uint32_t b = 0; b < PINDEX_LFU_BUCKETS; b++)
		list_init(&ix->host_lfu[b]);
	ix->win = 1;
	ix->win_limit = (uint32_t)((uint64_t)permille * ix->n_pages / 1000);
	return 0;
}

/* A host copy of e joins (d = 1) or leaves (d = -1) the host tier. */
static void win_host(struct prefix_index *ix, const struct pindex_entry *e, int d)
{
	if (ix->win && e->lfu_bucket == PINDEX_WIN_PROBATION)
		ix->n_prob += (uint32_t)d;
}

/* e was let go of: a use; the second takes it off probation for good. */
static void win_use(struct prefix_index *ix, struct pindex_entry *e)
{
	if (e->lfu_count < 2)
		e->lfu_count++;
	if (e->lfu_count < 2 || e->lfu_bucket == PINDEX_WIN_MAIN)
		return;
	win_host(ix, e, -1);
	if (e->list == PINDEX_LIST_HOST) { /* to be listed again, under main */
		list_del(&e->lru_link);
		e->list = PINDEX_LIST_NONE;
		ix->n_evictable--;
	}
	e->lfu_bucket = PINDEX_WIN_MAIN;
}

/* e's use count now (halved once per aging step since it was set). */
static uint32_t lfu_count(const struct prefix_index *ix, uint32_t count, uint32_t epoch)
{
	uint32_t d = ix->lfu_epoch - epoch;

	return d >= 8 ? 0 : count >> d;
}

static void lfu_use(struct prefix_index *ix, struct pindex_entry *e)
{
	uint32_t c = lfu_count(ix, e->lfu_count, e->lfu_epoch) + 1;

	e->lfu_count = (uint8_t)(c >= PINDEX_LFU_BUCKETS ? PINDEX_LFU_BUCKETS - 1 : c);
	e->lfu_epoch = ix->lfu_epoch;
	ix->lfu_uses++;
}

/* An aging step when one is due: every count halves, the host lists are
 * re-sorted (each bucket's entries, oldest first, to the warm end of the
 * bucket they now belong to). */
static void lfu_age(struct prefix_index *ix)
{
	if (ix->lfu_uses < ix->lfu_aging_uses)
		return;
	ix->lfu_uses = 0;
	ix->lfu_epoch++;
	for (uint32_t b = 1; b < PINDEX_LFU_BUCKETS; b++) {
		struct list *head = &ix->host_lfu[b];

		while (!list_empty(head)) {
			struct pindex_entry *x =
				list_entry(head->next, struct pindex_entry, lru_link);

			list_del(&x->lru_link);
			x->lfu_bucket = (uint8_t)lfu_count(ix, x->lfu_count, x->lfu_epoch);
			list_add_tail(&ix->host_lfu[x->lfu_bucket], &x->lru_link);
		}
	}
}

/* The host list e joins now (its count's bucket under LFU). */
static struct list *host_head(struct prefix_index *ix, struct pindex_entry *e)
{
	if (e->permanent)
		return &ix->keep_lru;
	if (ix->win)
		return &ix->host_lfu[e->lfu_bucket];
	if (!ix->lfu)
		return &ix->host_lru;
	e->lfu_bucket = (uint8_t)lfu_count(ix, e->lfu_count, e->lfu_epoch);
	return &ix->host_lfu[e->lfu_bucket];
}

int prefix_index_adopt_table(struct prefix_index *ix, struct idmap_entry *slots, size_t cap)
{
	return idmap_adopt(&ix->by_hash, slots, cap);
}

void prefix_index_fini(struct prefix_index *ix, struct pagealloc *pa)
{
	/* Every entry is in by_hash; host copies also hold a slot reference. */
	for (size_t i = 0; ix->by_hash.slots && i < ix->by_hash.cap; i++) {
		struct pindex_entry *e = ix->by_hash.slots[i].ptr;

		if (!ix->by_hash.slots[i].id)
			continue;
		if (e->slot != PINDEX_NONE)
			pagealloc_unref(pa, e->slot);
		free(e);
	}
	ghost_fini(&ix->ghost);
	free(ix->by_slot);
	idmap_fini(&ix->by_hash);
	memset(ix, 0, sizeof(*ix));
}

XXH128_hash_t prefix_index_root(const char *model_id, const struct shm_layout *layout,
				const void *salt, size_t salt_len)
{
	static const char tag[] = "kvpalace prefix index";
	uint32_t fields[8] = {
		PREFIX_INDEX_FORMAT,  layout->n_layers, layout->n_kv_heads,  layout->head_dim,
		layout->block_tokens, layout->dtype,	layout->quant_group, (uint32_t)salt_len,
	};
	XXH3_state_t st;

	/* Lengths and fixed-size fields keep the fields apart: no two
	 * identities give the same byte string. */
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, tag, sizeof(tag));
	XXH3_128bits_update(&st, fields, sizeof(fields));
	/* The page format joined the identity later: the KV format hashes
	 * as before (spilled pages and checkpoints of KV pools stay
	 * addressable), any other adds a tagged field, so a latent pool and
	 * a KV pool of equal numbers never share a chain. */
	if (layout->format) {
		static const char ftag[] = "format";
		uint32_t f = layout->format;

		XXH3_128bits_update(&st, ftag, sizeof(ftag));
		XXH3_128bits_update(&st, &f, sizeof(f));
	}
	XXH3_128bits_update(&st, model_id, strlen(model_id) + 1);
	if (salt_len)
		XXH3_128bits_update(&st, salt, salt_len);
	return XXH3_128bits_digest(&st);
}

XXH128_hash_t prefix_index_hash_page(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n)
{
	/* One-shot XXH3 over parent ‖ tokens is the same value as streaming
	 * them and measured 2-3x faster per token than a streaming state. */
	unsigned char buf[sizeof(XXH128_canonical_t) + SHM_MAX_BLOCK_TOKENS * sizeof(uint32_t)];

	kvp_assert(n <= SHM_MAX_BLOCK_TOKENS);
	XXH128_canonicalFromHash((XXH128_canonical_t *)buf, parent);
	memcpy(buf + sizeof(XXH128_canonical_t), tokens, (size_t)n * sizeof(uint32_t));
	return XXH3_128bits(buf, sizeof(XXH128_canonical_t) + (size_t)n * sizeof(uint32_t));
}

XXH128_hash_t prefix_index_root_keyed(const char *model_id, const struct shm_layout *layout,
				      const void *salt, size_t salt_len, const void *extra,
				      size_t extra_len)
{
	static const char tag[] = "kvpalace extra key";
	XXH128_hash_t root = prefix_index_root(model_id, layout, salt, salt_len);
	unsigned char buf[sizeof(tag) + sizeof(XXH128_canonical_t) + 4 + PREFIX_INDEX_MAX_KEY];
	size_t at = 0;

	if (!extra_len)
		return root;
	kvp_assert(extra_len <= PREFIX_INDEX_MAX_KEY);
	memcpy(buf, tag, sizeof(tag));
	at += sizeof(tag);
	XXH128_canonicalFromHash((XXH128_canonical_t *)(buf + at), root);
	at += sizeof(XXH128_canonical_t);
	buf[at++] = (unsigned char)extra_len; /* a 4-byte little-endian length */
	buf[at++] = 0;
	buf[at++] = 0;
	buf[at++] = 0;
	memcpy(buf + at, extra, extra_len);
	return XXH3_128bits(buf, at + extra_len);
}

XXH128_hash_t prefix_index_key_digest(const void *key, size_t len)
{
	static const char tag[] = "kvpalace span key";
	unsigned char buf[sizeof(tag) + PREFIX_INDEX_MAX_KEY];

	kvp_assert(len <= PREFIX_INDEX_MAX_KEY);
	memcpy(buf, tag, sizeof(tag));
	memcpy(buf + sizeof(tag), key, len);
	return XXH3_128bits(buf, sizeof(tag) + len);
}

uint32_t prefix_index_span_seek(const struct pindex_span *spans, uint32_t n, uint64_t pos)
{
	uint32_t lo = 0, hi = n;

	/* Sorted and disjoint: their ends are sorted too. */
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (spans[mid].first_token + spans[mid].n_tokens <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

XXH128_hash_t prefix_index_hash_keyed(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n,
				      uint64_t pos, const struct pindex_span *spans,
				      uint32_t n_spans)
{
	uint32_t i;
	XXH3_state_t st;

	/* Before the first span or after the last (text around the images):
	 * no search. */
	if (!n_spans || pos + n <= spans[0].first_token ||
	    spans[n_spans - 1].first_token + spans[n_spans - 1].n_tokens <= pos)
		return prefix_index_hash_page(parent, tokens, n);
	i = prefix_index_span_seek(spans, n_spans, pos);

	if (i == n_spans || spans[i].first_token >= pos + n)
		return prefix_index_hash_page(parent, tokens, n);
	/* XXH3 over parent ‖ tokens ‖ (offset, key)...: longer than any plain
	 * page's input, so never a plain page's hash. Small pages with few
	 * spans in one shot (measured twice as fast as streaming), the rest
	 * streamed: the same value. */
	kvp_assert(n <= SHM_MAX_BLOCK_TOKENS);
	{
		unsigned char buf[sizeof(XXH128_canonical_t) + 64 * sizeof(uint32_t) + 8 * 24];
		size_t at = sizeof(XXH128_canonical_t) + (size_t)n * sizeof(uint32_t);
		uint32_t k = i;

		while (k < n_spans && spans[k].first_token < pos + n && k - i < 8)
			k++;
		if (n <= 64 && (k == n_spans || spans[k].first_token >= pos + n)) {
			XXH128_canonicalFromHash((XXH128_canonical_t *)buf, parent);
			memcpy(buf + sizeof(XXH128_canonical_t), tokens,
			       (size_t)n * sizeof(uint32_t));
			for (; i < k; i++, at += 24) {
				uint64_t off = spans[i].first_token - pos;

				for (int b = 0; b < 8; b++)
					buf[at + b] = (unsigned char)(off >> (8 * b));
				XXH128_canonicalFromHash((XXH128_canonical_t *)(buf + at + 8),
							 spans[i].key);
			}
			return XXH3_128bits(buf, at);
		}
	}
	XXH3_128bits_reset(&st);
	{
		XXH128_canonical_t pc;

		XXH128_canonicalFromHash(&pc, parent);
		XXH3_128bits_update(&st, &pc, sizeof(pc));
	}
	XXH3_128bits_update(&st, tokens, (size_t)n * sizeof(uint32_t));
	for (; i < n_spans && spans[i].first_token < pos + n; i++) {
		unsigned char rec[8 + sizeof(XXH128_canonical_t)];
		uint64_t off = spans[i].first_token - pos; /* two's complement int64 */

		for (int b = 0; b < 8; b++)
			rec[b] = (unsigned char)(off >> (8 * b));
		XXH128_canonicalFromHash((XXH128_canonical_t *)(rec + 8), spans[i].key);
		XXH3_128bits_update(&st, rec, sizeof(rec));
	}
	return XXH3_128bits_digest(&st);
}

void prefix_index_spans_free(struct pindex_spans *s)
{
	free(s->v);
	*s = (struct pindex_spans){0};
}

int prefix_index_spans_add(struct pindex_spans *s, const struct pindex_span *add, uint32_t n,
			   uint32_t max)
{
	if (!n)
		return 0;
	if (n > max || s->n > max - n)
		return -EDQUOT;
	if (s->n + n > s->cap) {
		uint32_t cap = s->cap ? s->cap : 4;
		struct pindex_span *v;

		while (cap < s->n + n)
			cap *= 2;
		v = realloc(s->v, (size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	memcpy(s->v + s->n, add, (size_t)n * sizeof(*add));
	s->n += n;
	return 0;
}

void prefix_index_spans_cut(struct pindex_spans *s, uint64_t n_tokens)
{
	while (s->n && s->v[s->n - 1].first_token >= n_tokens)
		s->n--;
	if (s->n && s->v[s->n - 1].first_token + s->v[s->n - 1].n_tokens > n_tokens)
		s->v[s->n - 1].n_tokens = n_tokens - s->v[s->n - 1].first_token;
}

int prefix_index_spans_copy(struct pindex_spans *dst, const struct pindex_span *src, uint32_t n_src,
			    uint64_t n_tokens)
{
	int ret = prefix_index_spans_add(dst, src, n_src, UINT32_MAX);

	if (ret == 0)
		prefix_index_spans_cut(dst, n_tokens);
	return ret;
}

struct pindex_entry *prefix_index_find(const struct prefix_index *ix, XXH128_hash_t hash)
{
	struct pindex_entry *e = idmap_get(&ix->by_hash, key_of(hash));

	return e && XXH128_isEqual(e->hash, hash) ? e : NULL;
}

void prefix_index_prefetch(const struct prefix_index *ix, XXH128_hash_t hash)
{
	idmap_prefetch(&ix->by_hash, key_of(hash));
}

struct pindex_entry *prefix_index_find_host(const struct prefix_index *ix, XXH128_hash_t hash)
{
	struct pindex_entry *e = prefix_index_find(ix, hash);

	return e && e->slot != PINDEX_NONE ? e : NULL;
}

/* Only the index holds e's host copy, and a write to disk in flight. */
static int is_idle(const struct pagealloc *pa, const struct pindex_entry *e)
{
	return e->slot != PINDEX_NONE && pa->pins[e->slot] == 0 &&
	       pa->refs[e->slot] == 1u + (e->io == PINDEX_IO_WRITE);
}

/* e's host copy stays in the host tier: it counts as its parent's. */
static int stays(const struct pindex_entry *e)
{
	return e->slot != PINDEX_NONE && !e->leaving;
}

/* The list e belongs on now. */
static enum pindex_list belongs(const struct prefix_index *ix, const struct pagealloc *pa,
				const struct pindex_entry *e)
{
	if (e->io != PINDEX_IO_NONE)
		return PINDEX_LIST_NONE;
	if (e->slot == PINDEX_NONE)
		return e->n_children == 0 ? PINDEX_LIST_DISK : PINDEX_LIST_NONE;
	if (pa->refs[e->slot] != 1 || pa->pins[e->slot] != 0)
		return PINDEX_LIST_NONE;
	/* Leaves first, with or without a disk tier: a child whose host
	 * copy stays keeps its parent's (without a disk tier every child
	 * has one, so these are the leaves of the index). A page a policy
	 * demoted (the hierarchy's rest layer) may go to disk before its
	 * children: that placement is the policy's point. */
	return e->n_host_children == 0 || (e->demoted && ix->disk) ? PINDEX_LIST_HOST
								   : PINDEX_LIST_NONE;
}

/* A prewarmed e was used (1) or left the host tier first (0). */
static void prewarm_settle(struct prefix_index *ix, struct pindex_entry *e, int used)
{
	if (!e->prewarmed)
		return;
	e->prewarmed = 0;
	if (used)
		ix->prewarm_used++;
	else
		ix->prewarm_unused++;
}

void prefix_index_set_prewarmed(struct prefix_index *ix, struct pindex_entry *e)
{
	e->prewarmed = 1;
	ix->prewarm_pages++;
}

void prefix_index_unset_prewarmed(struct prefix_index *ix, struct pindex_entry *e, int counted)
{
	if (!e->prewarmed)
		return;
	if (counted) {
		prewarm_settle(ix, e, 0);
		return;
	}
	e->prewarmed = 0;
	ix->prewarm_pages--;
}

struct pindex_entry *prefix_index_disk_prev(const struct prefix_index *ix,
					    const struct pindex_entry *e)
{
	const struct list *it = e ? e->lru_link.prev : ix->disk_lru.prev;

	return it == &ix->disk_lru ? NULL : list_entry(it, struct pindex_entry, lru_link);
}

/* Moves e to the list it belongs on; at_lru places it at the cold end. */
static void place(struct prefix_index *ix, const struct pagealloc *pa, struct pindex_entry *e,
		  int at_lru)
{
	enum pindex_list want = belongs(ix, pa, e);
	int idle = is_idle(pa, e), busy = idle && e->io != PINDEX_IO_NONE, used = 0;
	struct list *head;

	if (idle != e->idle) {
		ix->n_idle += idle ? 1u : -1u;
		e->idle = (uint8_t)idle;
		if (!idle && e->slot != PINDEX_NONE)
			prewarm_settle(ix, e, 1); /* a session or lease holds it */
		if (idle && e->prewarmed) {
			/* Read in ahead of requests: not a use. */
		} else if (idle && ix->lfu) {
			lfu_use(ix, e); /* let go of: a use */
			used = 1;
		}
		if (idle && ix->win)
			win_use(ix, e);
		else if (idle && !ix->lfu && e->lfu_count < 2)
			e->lfu_count++; /* LRU: only prefix_index_reused asks */
	}
	if (busy != e->idle_busy) {
		ix->n_idle_busy += busy ? 1u : -1u;
		e->idle_busy = (uint8_t)busy;
	}
	if (want == e->list)
		goto out;
	at_lru = at_lru || e->prewarmed; /* no use yet: first to leave */
	if (e->list == PINDEX_LIST_HOST)
		ix->n_evictable--;
	else if (e->list == PINDEX_LIST_DISK)
		ix->n_droppable--;
	list_del(&e->lru_link);
	e->list = (uint8_t)want;
	if (want == PINDEX_LIST_NONE)
		goto out;
	if (want == PINDEX_LIST_HOST) {
		head = host_head(ix, e);
		ix->n_evictable++;
	} else {
		head = &ix->disk_lru;
		ix->n_droppable++;
	}
	if (at_lru) {
		e->lru_link.next = head->next;
		e->lru_link.prev = head;
		head->next->prev = &e->lru_link;
		head->next = &e->lru_link;
	} else {
		list_add_tail(head, &e->lru_link);
		/* Joining the host list's warm end is a use (a commit, a lease
		 * released, a promotion); leaving the host tier is not. */
		if (want == PINDEX_LIST_HOST)
			e->used = ++ix->clock;
	}
out:
	if (used)
		lfu_age(ix);
}

/* Tells e's parent that e's host copy started or stopped staying (stayed:
 * what stays(e) was before). A parent that lost its last staying child
 * is as cold as that child: the next to leave. */
static void host_changed(struct prefix_index *ix, const struct pagealloc *pa,
			 struct pindex_entry *e, int stayed)
{
	int now = stays(e);

	if (!e->parent || now == stayed)
		return;
	if (now)
		e->parent->n_host_children++;
	else
		e->parent->n_host_children--;
	place(ix, pa, e->parent, !now);
}

void prefix_index_reconsider_cold(struct prefix_index *ix, const struct pagealloc *pa,
				  struct pindex_entry *e)
{
	place(ix, pa, e, 1);
}

void prefix_index_set_leaving(struct prefix_index *ix, const struct pagealloc *pa,
			      struct pindex_entry *e, int leaving)
{
	int stayed = stays(e);

	kvp_assert(!leaving || e->io == PINDEX_IO_WRITE);
	if (e->leaving == !!leaving)
		return;
	e->leaving = (uint8_t) !!leaving;
	ix->n_leaving += leaving ? 1u : -1u;
	host_changed(ix, pa, e, stayed);
	place(ix, pa, e, 0);
}

void prefix_index_reconsider(struct prefix_index *ix, const struct pagealloc *pa,
			     struct pindex_entry *e)
{
	place(ix, pa, e, 0);
}

/* The head of the list e is on, or NULL. */
static struct list *list_of(struct prefix_index *ix, const struct pindex_entry *e)
{
	if (e->list == PINDEX_LIST_HOST)
		return e->permanent	    ? &ix->keep_lru
		       : ix->lfu || ix->win ? &ix->host_lfu[e->lfu_bucket]
					    : &ix->host_lru;
	return e->list == PINDEX_LIST_DISK ? &ix->disk_lru : NULL;
}

void prefix_index_touch(struct prefix_index *ix, const struct pagealloc *pa, struct pindex_entry *e)
{
	struct list *head;

	prewarm_settle(ix, e, 1);
	if (e->demoted) {
		/* Used again: back in the ordinary order. */
		e->demoted = 0;
		place(ix, pa, e, 0);
	}
	head = list_of(ix, e);
	e->used_ns = prefix_index_now_ns();
	/* Stamped on no list too: a parent whose host children keep it off
	 * the host list joins it at the cold end once the last one leaves,
	 * and a walk that touched it must still keep it
	 * (prefix_index_keep_walk). */
	e->used = ++ix->clock;
	if (!head)
		return;
	list_del(&e->lru_link);
	list_add_tail(head, &e->lru_link);
}

void prefix_index_demote(struct prefix_index *ix, const struct pagealloc *pa,
			 struct pindex_entry *e)
{
	struct list *head;

	e->demoted = 1;
	place(ix, pa, e, 1); /* a parent may join the host list now */
	head = list_of(ix, e);
	if (!head)
		return;
	list_del(&e->lru_link);
	e->lru_link.next = head->next;
	e->lru_link.prev = head;
	head->next->prev = &e->lru_link;
	head->next = &e->lru_link;
}

void prefix_index_mark_permanent(struct prefix_index *ix, const struct pagealloc *pa,
				 struct pindex_entry *e)
{
	if (e->permanent)
		return;
	e->permanent = 1;
	ix->n_permanent++;
	if (e->list == PINDEX_LIST_HOST) {
		/* Off the ordinary list, onto the warm end of the kept one. */
		list_del(&e->lru_link);
		e->list = PINDEX_LIST_NONE;
		ix->n_evictable--;
		place(ix, pa, e, 0);
	}
}

/* The host lists in victim order: the ordinary one (or LFU's buckets,
 * lowest count first), then the permanent one. Returns how many. */
static uint32_t host_heads(const struct prefix_index *ix, const struct list **heads)
{
	uint32_t n = 0;

	if (ix->lfu) {
		for (uint32_t b = 0; b < PINDEX_LFU_BUCKETS; b++)
			heads[n++] = &ix->host_lfu[b];
	} else if (ix->win) {
		/* Probation first while it holds more than its share. */
		int p = ix->n_prob > ix->win_limit;

		heads[n++] = &ix->host_lfu[p ? PINDEX_WIN_PROBATION : PINDEX_WIN_MAIN];
		heads[n++] = &ix->host_lfu[p ? PINDEX_WIN_MAIN : PINDEX_WIN_PROBATION];
	} else
		heads[n++] = &ix->host_lru;
	heads[n++] = &ix->keep_lru;
	return n;
}

void prefix_index_keep_walk(struct prefix_index *ix, int keep)
{
	ix->keep_from = keep ? ix->clock + 1 : 0;
}

/* it, a host list's link, is an entry the walk under way keeps. */
static int kept(const struct prefix_index *ix, const struct list *it)
{
	return ix->keep_from &&
	       list_entry(it, struct pindex_entry, lru_link)->used >= ix->keep_from;
}

struct pindex_entry *prefix_index_host_next(const struct prefix_index *ix,
					    const struct pindex_entry *e)
{
	const struct list *heads[PINDEX_LFU_BUCKETS + 1], *it;
	uint32_t n = host_heads(ix, heads), k = 0;

	if (e) {
		if (e->permanent)
			k = n - 1;
		else if (ix->lfu)
			k = e->lfu_bucket;
		else if (ix->win)
			k = heads[0] == &ix->host_lfu[e->lfu_bucket] ? 0 : 1;
		it = e->lru_link.next;
	} else {
		it = heads[0]->next;
	}
	/* Kept entries are few: a walk's pages are listed only at its leaf
	 * (a parent with host children is on no list). */
	while (it == heads[k] || kept(ix, it)) {
		if (it != heads[k]) {
			it = it->next;
			continue;
		}
		if (++k == n)
			return NULL;
		it = heads[k]->next;
	}
	return list_entry(it, struct pindex_entry, lru_link);
}

static struct pindex_entry *new_entry(struct prefix_index *ix, XXH128_hash_t hash,
				      struct pindex_entry *parent)
{
	struct pindex_entry *e;

	if (idmap_get(&ix->by_hash, key_of(hash)))
		return NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->hash = hash;
	e->slot = PINDEX_NONE;
	e->extent = PINDEX_NONE;
	e->parent = parent;
	if (parent)
		e->root = parent->root;
	e->used_ns = prefix_index_now_ns();
	list_init(&e->lru_link);
	e->lfu_epoch = ix->lfu_epoch;
	if (ix->lfu) {
		uint8_t count;
		uint32_t epoch;

		/* Back while its ghost lives: the count it had. */
		if (ghost_take(&ix->ghost, key_of(hash), &count, &epoch))
			e->lfu_count = (uint8_t)lfu_count(ix, count, epoch);
	}
	if (idmap_put(&ix->by_hash, key_of(hash), e) < 0) {
		free(e);
		return NULL;
	}
	ix->n_entries++;
	if (parent)
		parent->n_children++;
	return e;
}

int prefix_index_insert(struct prefix_index *ix, struct pagealloc *pa, XXH128_hash_t hash,
			struct pindex_entry *parent, uint32_t slot)
{
	struct pindex_entry *e;

	kvp_assert(slot < ix->n_pages && !ix->by_slot[slot]);
	if (idmap_get(&ix->by_hash, key_of(hash)))
		return -EEXIST;
	e = new_entry(ix, hash, parent);
	if (!e)
		return -ENOMEM;
	if (parent)
		place(ix, pa, parent, 0);
	prefix_index_attach_host(ix, pa, e, slot);
	return 0;
}

int prefix_index_insert_disk(struct prefix_index *ix, XXH128_hash_t hash,
			     struct pindex_entry *parent, uint32_t extent, uint64_t sum,
			     uint8_t dtype)
{
	struct pindex_entry *e;

	if (idmap_get(&ix->by_hash, key_of(hash)))
		return -EEXIST;
	e = new_entry(ix, hash, parent);
	if (!e)
		return -ENOMEM;
	e->used_ns = 0; /* not used since this start */
	e->extent = extent;
	e->disk_sum = sum;
	e->disk_dtype = dtype;
	ix->n_disk++;
	if (parent && parent->list == PINDEX_LIST_DISK) {
		/* No longer a leaf. */
		list_del(&parent->lru_link);
		parent->list = PINDEX_LIST_NONE;
		ix->n_droppable--;
	}
	list_add_tail(&ix->disk_lru, &e->lru_link);
	e->list = PINDEX_LIST_DISK;
	ix->n_droppable++;
	return 0;
}

void prefix_index_update_at(struct prefix_index *ix, const struct pagealloc *pa, uint32_t slot,
			    uint64_t now_ns)
{
	struct pindex_entry *e = ix->by_slot[slot];

	if (e) {
		/* A session, lease or job took or let go of the page: a use. */
		e->used_ns = now_ns;
		place(ix, pa, e, 0);
	}
}

void prefix_index_update(struct prefix_index *ix, const struct pagealloc *pa, uint32_t slot)
{
	if (ix->by_slot[slot])
		prefix_index_update_at(ix, pa, slot, prefix_index_now_ns());
}

void prefix_index_attach_host(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
			      uint32_t slot)
{
	kvp_assert(e->slot == PINDEX_NONE && slot < ix->n_pages && !ix->by_slot[slot]);
	pagealloc_ref(pa, slot);
	e->slot = slot;
	ix->by_slot[slot] = e;
	ix->n_host++;
	win_host(ix, e, 1);
	host_changed(ix, pa, e, 0);
	e->used_ns = prefix_index_now_ns(); /* committed, or read back for a match */
	place(ix, pa, e, 0);
}

/* Tells ix->leaving that e's host copy leaves (prefix_index.h). */
static void host_leaving(struct prefix_index *ix, struct pindex_entry *e)
{
	if (!ix->leaving || e->slot == PINDEX_NONE)
		return;
	ix->leaving(ix->leaving_arg, e);
	if (ix->evicting)
		ix->left_in_batch = 1;
	else
		ix->leaving(ix->leaving_arg, NULL);
}

void prefix_index_leaving_batch(struct prefix_index *ix, int open)
{
	if (open) {
		ix->evicting++;
		return;
	}
	kvp_assert(ix->evicting);
	if (--ix->evicting || !ix->left_in_batch)
		return;
	ix->left_in_batch = 0;
	if (ix->leaving)
		ix->leaving(ix->leaving_arg, NULL);
}

void prefix_index_detach_host(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e)
{
	uint32_t slot = e->slot;
	int stayed = stays(e);

	kvp_assert(slot != PINDEX_NONE);
	prewarm_settle(ix, e, 0);
	host_leaving(ix, e);
	ix->by_slot[slot] = NULL;
	e->slot = PINDEX_NONE;
	ix->n_host--;
	win_host(ix, e, -1);
	pagealloc_unref(pa, slot);
	place(ix, pa, e, 0);
	host_changed(ix, pa, e, stayed);
}

/* Takes e (no children, no I/O) out of the index and frees it; its host
 * reference goes, its extent is returned. */
static void unlink_entry(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
			 uint32_t *ret_extent)
{
	struct pindex_entry *parent = e->parent;

	kvp_assert(e->n_children == 0 && e->io == PINDEX_IO_NONE && !e->leaving);
	if (ix->gone)
		ix->gone(ix->gone_arg, e);
	prewarm_settle(ix, e, 0);
	if (parent && stays(e))
		parent->n_host_children--;
	ix->n_idle -= e->idle;
	if (e->list == PINDEX_LIST_HOST)
		ix->n_evictable--;
	else if (e->list == PINDEX_LIST_DISK)
		ix->n_droppable--;
	list_del(&e->lru_link);
	if (e->slot != PINDEX_NONE) {
		ix->by_slot[e->slot] = NULL;
		ix->n_host--;
		win_host(ix, e, -1);
		pagealloc_unref(pa, e->slot);
	}
	if (e->extent != PINDEX_NONE)
		ix->n_disk--;
	*ret_extent = e->extent;
	idmap_del(&ix->by_hash, key_of(e->hash));
	ix->n_entries--;
	ix->n_permanent -= e->permanent;
	free(e);
	if (parent) {
		/* As cold as the child it just lost: next in line. */
		parent->n_children--;
		place(ix, pa, parent, 1);
	}
}

void prefix_index_drop(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
		       uint32_t *ret_extent)
{
	if (ix->lfu)
		ghost_put(&ix->ghost, key_of(e->hash), e->lfu_count, e->lfu_epoch);
	host_leaving(ix, e);
	unlink_entry(ix, pa, e, ret_extent);
	ix->evictions++;
}

void prefix_index_detach_disk(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
			      uint32_t *ret_extent)
{
	kvp_assert(e->extent != PINDEX_NONE && e->io == PINDEX_IO_NONE);
	if (e->slot == PINDEX_NONE && e->n_children == 0) {
		prefix_index_drop(ix, pa, e, ret_extent);
		return;
	}
	*ret_extent = e->extent;
	e->extent = PINDEX_NONE;
	ix->n_disk--;
	place(ix, pa, e, 0);
}

enum { MARK_NONE, MARK_KEEP, MARK_DOOMED };

/* Marks e and the unmarked entries above it: doomed when pick accepts it
 * or an ancestor. Two walks up, each stopping at the first marked entry,
 * so every entry is walked over a bounded number of times: O(n) for the
 * whole index. */
static void mark_chain(struct pindex_entry *e, int (*pick)(void *, const struct pindex_entry *),
		       void *arg)
{
	struct pindex_entry *x, *top_pick = NULL;
	int above;

	for (x = e; x && x->mark == MARK_NONE; x = x->parent)
		if (pick(arg, x))
			top_pick = x;
	/* x: the first marked ancestor, or NULL past the first page. */
	above = x && x->mark == MARK_DOOMED;
	for (struct pindex_entry *y = e; y != x; y = y->parent) {
		/* Below the topmost pick: doomed; above it, as the marked
		 * ancestor is. */
		y->mark = top_pick || above ? MARK_DOOMED : MARK_KEEP;
		if (y == top_pick)
			top_pick = NULL;
	}
}

int prefix_index_forget(struct prefix_index *ix, struct pagealloc *pa,
			int (*pick)(void *arg, const struct pindex_entry *e),
			void (*gone)(void *arg, const struct pindex_entry *e), void *arg,
			int dry_run)
{
	struct pindex_entry **doomed = NULL;
	uint32_t n = 0, k = 0, extent;
	int busy = 0;

	for (size_t i = 0; i < ix->by_hash.cap; i++)
		if (ix->by_hash.slots[i].id)
			mark_chain(ix->by_hash.slots[i].ptr, pick, arg);
	for (size_t i = 0; i < ix->by_hash.cap; i++) {
		struct pindex_entry *e = ix->by_hash.slots[i].ptr;

		if (ix->by_hash.slots[i].id && e->mark == MARK_DOOMED) {
			n++;
			busy |= e->io != PINDEX_IO_NONE;
		}
	}
	if (n && !busy && !dry_run) {
		doomed = malloc(n * sizeof(*doomed));
		if (!doomed)
			busy = -ENOMEM;
	}
	if (n && !busy && !dry_run) {
		/* The doomed leaves, collected first: removing entries
		 * reshapes the map. Every other doomed entry goes when the
		 * walk up from its last child reaches it (all its children
		 * are doomed too), so each is freed exactly once. */
		for (size_t i = 0; i < ix->by_hash.cap; i++) {
			struct pindex_entry *e = ix->by_hash.slots[i].ptr;

			if (ix->by_hash.slots[i].id && e->mark == MARK_DOOMED && e->n_children == 0)
				doomed[k++] = e;
		}
		for (uint32_t i = 0; i < k; i++) {
			struct pindex_entry *e = doomed[i];

			while (e && e->mark == MARK_DOOMED && e->n_children == 0) {
				struct pindex_entry *up = e->parent;

				gone(arg, e);
				unlink_entry(ix, pa, e, &extent);
				ix->forgotten++;
				e = up;
			}
		}
		free(doomed);
	}
	/* The marks are scratch: cleared on whatever is left. */
	for (size_t i = 0; i < ix->by_hash.cap; i++)
		if (ix->by_hash.slots[i].id)
			((struct pindex_entry *)ix->by_hash.slots[i].ptr)->mark = MARK_NONE;
	if (busy)
		return busy < 0 ? busy : -EBUSY;
	return (int)n;
}

uint32_t prefix_index_evict(struct prefix_index *ix, struct pagealloc *pa, uint32_t want_free,
			    int may_drop)
{
	uint32_t n = 0, extent;

	prefix_index_leaving_batch(ix, 1);
	while (pa->n_free < want_free) {
		struct pindex_entry *e = NULL;

		/* From the cold end each time: a drop may move a parent there.
		 * Without a disk tier every listed entry qualifies. */
		for (struct pindex_entry *c = prefix_index_host_next(ix, NULL); c;
		     c = prefix_index_host_next(ix, c))
			if (c->extent != PINDEX_NONE || (may_drop && c->n_children == 0)) {
				e = c;
				break;
			}
		if (!e)
			break;
		if (e->extent != PINDEX_NONE)
			prefix_index_detach_host(ix, pa, e);
		else
			prefix_index_drop(ix, pa, e, &extent);
		n++;
	}
	prefix_index_leaving_batch(ix, 0);
	return n;
}

int prefix_index_check(const struct prefix_index *ix, const struct pagealloc *pa, uint32_t *refs)
{
	struct idmap children = {0};	  /* parent key → children counted */
	struct idmap host_children = {0}; /* parent key → staying host children */
	uint32_t n = 0, n_host = 0, n_disk = 0, n_perm = 0, n_list[3] = {0}, on_list[3] = {0};
	uint32_t n_leaving = 0, n_idle = 0, n_busy = 0, n_prob = 0;
	const struct list *heads[3] = {NULL, &ix->host_lru, &ix->disk_lru};
	int ret = -EUCLEAN;

	for (size_t i = 0; i < ix->by_hash.cap; i++) {
		const struct pindex_entry *e = ix->by_hash.slots[i].ptr;

		if (!ix->by_hash.slots[i].id)
			continue;
		if (prefix_index_find(ix, e->hash) != e || e->list != belongs(ix, pa, e))
			goto out;
		if (e->slot != PINDEX_NONE) {
			if (e->slot >= ix->n_pages || ix->by_slot[e->slot] != e)
				goto out;
			refs[e->slot]++;
			n_host++;
		}
		n_disk += e->extent != PINDEX_NONE;
		n_perm += e->permanent;
		if (ix->win && (e->lfu_bucket > PINDEX_WIN_MAIN ||
				(e->lfu_count >= 2) != (e->lfu_bucket == PINDEX_WIN_MAIN)))
			goto out;
		n_prob +=
			ix->win && e->slot != PINDEX_NONE && e->lfu_bucket == PINDEX_WIN_PROBATION;
		n_list[e->list]++;
		if (e->leaving && (e->io != PINDEX_IO_WRITE || e->slot == PINDEX_NONE))
			goto out;
		if (e->idle != is_idle(pa, e) ||
		    e->idle_busy != (e->idle && e->io != PINDEX_IO_NONE))
			goto out;
		n_leaving += e->leaving;
		n_idle += e->idle;
		n_busy += e->idle_busy;
		if (e->parent) {
			uint64_t k = key_of(e->parent->hash);
			uintptr_t c = (uintptr_t)idmap_get(&children, k);

			if (prefix_index_find(ix, e->parent->hash) != e->parent)
				goto out;
			if (c)
				idmap_del(&children, k);
			if (idmap_put(&children, k, (void *)(c + 1)) < 0) {
				ret = -ENOMEM;
				goto out;
			}
			if (stays(e)) {
				c = (uintptr_t)idmap_get(&host_children, k);
				if (c)
					idmap_del(&host_children, k);
				if (idmap_put(&host_children, k, (void *)(c + 1)) < 0) {
					ret = -ENOMEM;
					goto out;
				}
			}
		}
		n++;
	}
	for (size_t i = 0; i < ix->by_hash.cap; i++) {
		const struct pindex_entry *e = ix->by_hash.slots[i].ptr;

		if (ix->by_hash.slots[i].id &&
		    (e->n_children != (uintptr_t)idmap_get(&children, key_of(e->hash)) ||
		     e->n_host_children != (uintptr_t)idmap_get(&host_children, key_of(e->hash))))
			goto out;
	}
	for (uint32_t s = 0; s < ix->n_pages; s++)
		if (ix->by_slot[s] && ix->by_slot[s]->slot != s)
			goto out;
	for (int l = PINDEX_LIST_HOST; l <= PINDEX_LIST_DISK; l++)
		for (const struct list *it = heads[l]->next; it != heads[l]; it = it->next) {
			const struct pindex_entry *e =
				list_entry(it, struct pindex_entry, lru_link);

			if (e->list != l || (l == PINDEX_LIST_HOST && e->permanent))
				goto out;
			on_list[l]++;
		}
	for (uint32_t b = 0; (ix->lfu || ix->win) && b < PINDEX_LFU_BUCKETS; b++)
		for (const struct list *it = ix->host_lfu[b].next; it != &ix->host_lfu[b];
		     it = it->next) {
			const struct pindex_entry *e =
				list_entry(it, struct pindex_entry, lru_link);

			if (e->list != PINDEX_LIST_HOST || e->permanent || e->lfu_bucket != b)
				goto out;
			on_list[PINDEX_LIST_HOST]++;
		}
	for (const struct list *it = ix->keep_lru.next; it != &ix->keep_lru; it = it->next) {
		const struct pindex_entry *e = list_entry(it, struct pindex_entry, lru_link);

		if (e->list != PINDEX_LIST_HOST || !e->permanent)
			goto out;
		on_list[PINDEX_LIST_HOST]++;
	}
	if (n != ix->n_entries || n != ix->by_hash.n || n_host != ix->n_host ||
	    n_perm != ix->n_permanent || n_disk != ix->n_disk ||
	    n_list[PINDEX_LIST_HOST] != ix->n_evictable ||
	    on_list[PINDEX_LIST_HOST] != ix->n_evictable ||
	    n_list[PINDEX_LIST_DISK] != ix->n_droppable ||
	    on_list[PINDEX_LIST_DISK] != ix->n_droppable || n_leaving != ix->n_leaving ||
	    n_idle != ix->n_idle || n_busy != ix->n_idle_busy || n_prob != ix->n_prob)
		goto out;
	ret = 0;
out:
	idmap_fini(&children);
	idmap_fini(&host_children);
	return ret;
}
