/* daemon/core/events.c — the rings of KV events (see events.h).
 *
 * Layer: core, at its bottom beside cache.c: calls only base/ (idmap).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "log.h"

static uint64_t uid_key(uid_t uid)
{
	return (uint64_t)uid + 1; /* ids are never 0; uid 0 is root */
}

static void ring_free(struct kv_ring *r)
{
	if (r)
		free(r->ev);
	free(r);
}

static struct kv_ring *ring_new(uint64_t first, uid_t uid, int all)
{
	struct kv_ring *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->ev = malloc(KV_RING_FIRST * sizeof(*r->ev));
	if (!r->ev) {
		free(r);
		return NULL;
	}
	r->cap = KV_RING_FIRST;
	r->oldest = r->next = first;
	r->uid = uid;
	r->all = all;
	return r;
}

void kv_events_init(struct kv_events *ev)
{
	*ev = (struct kv_events){.next_seq = 1};
}

void kv_events_fini(struct kv_events *ev)
{
	for (size_t i = 0; ev->rings.slots && i < ev->rings.cap; i++)
		if (ev->rings.slots[i].id)
			ring_free(ev->rings.slots[i].ptr);
	idmap_fini(&ev->rings);
	ev->n_rings = 0;
	ring_free(ev->all);
	ev->all = NULL;
	idmap_fini(&ev->next_by_uid);
	idmap_fini(&ev->next_by_pool);
}

static uint64_t next_of(const struct idmap *m, uint64_t key)
{
	uintptr_t v = (uintptr_t)idmap_get(m, key);

	return v ? (uint64_t)v : 1;
}

/* Hands out key's next number in m; 0 when m has no memory for it. Put
 * back after its removal, a key never needs the map to grow (it held it
 * just before): only a key's first number can fail, which leaves no
 * trace, so the numbers of a key only ever grow. */
static uint64_t take_next(struct idmap *m, uint64_t key)
{
	uint64_t n = (uint64_t)(uintptr_t)idmap_del(m, key);

	if (!n)
		n = 1;
	return idmap_put(m, key, (void *)(uintptr_t)(n + 1)) == 0 ? n : 0;
}

uint64_t kv_events_uid_next(const struct kv_events *ev, uid_t uid)
{
	return next_of(&ev->next_by_uid, uid_key(uid));
}

uint64_t kv_events_pool_next(const struct kv_events *ev, uint64_t pool_id)
{
	return next_of(&ev->next_by_pool, pool_id);
}

int kv_events_subscribe(struct kv_events *ev, int all, uid_t uid, struct kv_ring **ret)
{
	struct kv_ring *r;

	if (all) {
		if (!ev->all) {
			ev->all = ring_new(ev->next_seq, 0, 1); /* none before it is kept */
			if (!ev->all)
				return -ENOMEM;
		}
		r = ev->all;
	} else if (!(r = idmap_get(&ev->rings, uid_key(uid)))) {
		if (ev->n_rings >= KV_EVENTS_MAX_TENANTS)
			return -EDQUOT;
		/* The tenant's numbering gets its entry now, so that each of
		 * its events gets a useq (take_next cannot fail for it) and
		 * the ring, numbered by useq, has no hole. */
		if (!idmap_get(&ev->next_by_uid, uid_key(uid)) &&
		    idmap_put(&ev->next_by_uid, uid_key(uid), (void *)(uintptr_t)1) < 0)
			return -ENOMEM;
		r = ring_new(kv_events_uid_next(ev, uid), uid, 0);
		if (!r)
			return -ENOMEM;
		if (idmap_put(&ev->rings, uid_key(uid), r) < 0) {
			ring_free(r);
			return -ENOMEM;
		}
		ev->n_rings++;
	}
	r->n_readers++;
	*ret = r;
	return 0;
}

void kv_events_unsubscribe(struct kv_events *ev, struct kv_ring *r)
{
	if (!r || --r->n_readers)
		return;
	if (r->all)
		ev->all = NULL;
	else if (idmap_del(&ev->rings, uid_key(r->uid)))
		ev->n_rings--;
	ring_free(r);
}

uint64_t kv_ring_oldest(const struct kv_ring *r)
{
	return r->oldest;
}

const struct kv_event *kv_ring_at(const struct kv_ring *r, uint64_t n)
{
	if (n >= r->next || n < kv_ring_oldest(r))
		return NULL;
	return &r->ev[n & (r->cap - 1)];
}

/* Doubles r's room, the events it keeps moved to their new places; where
 * memory runs out r stays as it is (and keeps fewer). */
static void ring_grow(struct kv_ring *r)
{
	uint32_t cap = 2 * r->cap;
	struct kv_event *ev = malloc((size_t)cap * sizeof(*ev));

	if (!ev)
		return;
	for (uint64_t n = r->oldest; n < r->next; n++)
		memcpy(&ev[n & (cap - 1)], &r->ev[n & (r->cap - 1)], sizeof(*ev));
	free(r->ev);
	r->ev = ev;
	r->cap = cap;
}

/* Appends e to r as its number n (r->next: the numbers have no hole). */
static void ring_put(struct kv_ring *r, const struct kv_event *e, uint64_t n)
{
	kvp_assert(n == r->next);
	if (r->next - r->oldest >= r->cap && r->cap < KV_EVENTS_KEEP)
		ring_grow(r);
	if (r->next - r->oldest >= r->cap)
		r->oldest++; /* its slot is taken over */
	memcpy(&r->ev[n & (r->cap - 1)], e,
	       offsetof(struct kv_event, tokens) + e->n_tokens * sizeof(uint32_t));
	r->next = n + 1;
}

/* The event to fill in (numbered, the rest zeroed), in ev->stage, or NULL
 * when nobody reads uid's events; add() then keeps it in the rings that
 * are to have it. */
static struct kv_event *begin(struct kv_events *ev, enum kv_event_kind kind, uint64_t pool_id,
			      uid_t uid)
{
	struct kv_event *e = &ev->stage;

	if (!ev->all && !idmap_get(&ev->rings, uid_key(uid))) {
		if (kind == KV_EVENT_CLEARED)
			idmap_del(&ev->next_by_pool, pool_id);
		return NULL;
	}
	memset(e, 0, offsetof(struct kv_event, tokens));
	e->seq = ev->next_seq++;
	e->useq = take_next(&ev->next_by_uid, uid_key(uid));
	if (kind == KV_EVENT_CLEARED) {
		/* The pool's last event: its numbering goes with it. */
		e->pseq = next_of(&ev->next_by_pool, pool_id);
		idmap_del(&ev->next_by_pool, pool_id);
	} else {
		e->pseq = take_next(&ev->next_by_pool, pool_id);
	}
	e->kind = (uint8_t)kind;
	e->pool_id = pool_id;
	e->uid = uid;
	return e;
}

static void add(struct kv_events *ev, const struct kv_event *e)
{
	struct kv_ring *r = idmap_get(&ev->rings, uid_key(e->uid));

	if (ev->all)
		ring_put(ev->all, e, e->seq);
	if (r && e->useq) /* a tenant with a ring always gets a useq */
		ring_put(r, e, e->useq);
}

void kv_events_stored(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		      XXH128_hash_t hash, const XXH128_hash_t *parent, enum kv_event_tier tier,
		      const uint32_t *tokens)
{
	struct kv_event *e = begin(ev, KV_EVENT_STORED, pool_id, uid);

	if (!e)
		return;
	e->block_tokens = block_tokens;
	e->hash = hash;
	e->has_parent = parent != NULL;
	if (parent)
		e->parent = *parent;
	e->tier = (uint8_t)tier;
	if (tokens && block_tokens <= KV_EVENT_MAX_TOKENS) {
		memcpy(e->tokens, tokens, block_tokens * sizeof(uint32_t));
		e->n_tokens = (uint16_t)block_tokens;
	}
	add(ev, e);
}

void kv_events_removed(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		       XXH128_hash_t hash, enum kv_event_tier tier)
{
	struct kv_event *e = begin(ev, KV_EVENT_REMOVED, pool_id, uid);

	if (!e)
		return;
	e->block_tokens = block_tokens;
	e->hash = hash;
	e->tier = (uint8_t)tier;
	add(ev, e);
}

void kv_events_cleared(struct kv_events *ev, uint64_t pool_id, uid_t uid)
{
	struct kv_event *e = begin(ev, KV_EVENT_CLEARED, pool_id, uid);

	if (e)
		add(ev, e);
}
