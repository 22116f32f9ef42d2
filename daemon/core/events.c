/* daemon/core/events.c — the ring of KV events (see events.h).
 *
 * Layer: core, at its bottom beside cache.c: calls only base/ (idmap).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"

void kv_events_init(struct kv_events *ev)
{
	*ev = (struct kv_events){.next_seq = 1};
}

void kv_events_fini(struct kv_events *ev)
{
	free(ev->ring);
	ev->ring = NULL;
	ev->n_subscribers = 0;
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
	return next_of(&ev->next_by_uid, (uint64_t)uid + 1);
}

uint64_t kv_events_pool_next(const struct kv_events *ev, uint64_t pool_id)
{
	return next_of(&ev->next_by_pool, pool_id);
}

int kv_events_subscribe(struct kv_events *ev)
{
	if (!ev->ring) {
		ev->ring = malloc(KV_EVENTS_KEEP * sizeof(*ev->ring));
		if (!ev->ring)
			return -ENOMEM;
		ev->first_seq = ev->next_seq; /* none before it is kept */
	}
	ev->n_subscribers++;
	return 0;
}

void kv_events_unsubscribe(struct kv_events *ev)
{
	if (ev->n_subscribers && --ev->n_subscribers == 0) {
		free(ev->ring);
		ev->ring = NULL;
	}
}

struct kv_event *kv_events_add(struct kv_events *ev, enum kv_event_kind kind, uint64_t pool_id,
			       uid_t uid)
{
	struct kv_event *e;

	if (!ev->ring) {
		if (kind == KV_EVENT_CLEARED)
			idmap_del(&ev->next_by_pool, pool_id);
		return NULL;
	}
	e = &ev->ring[ev->next_seq % KV_EVENTS_KEEP];
	memset(e, 0, offsetof(struct kv_event, tokens));
	e->seq = ev->next_seq++;
	e->useq = take_next(&ev->next_by_uid, (uint64_t)uid + 1);
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

void kv_events_stored(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		      XXH128_hash_t hash, const XXH128_hash_t *parent, enum kv_event_tier tier,
		      const uint32_t *tokens)
{
	struct kv_event *e = kv_events_add(ev, KV_EVENT_STORED, pool_id, uid);

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
}

void kv_events_removed(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		       XXH128_hash_t hash, enum kv_event_tier tier)
{
	struct kv_event *e = kv_events_add(ev, KV_EVENT_REMOVED, pool_id, uid);

	if (!e)
		return;
	e->block_tokens = block_tokens;
	e->hash = hash;
	e->tier = (uint8_t)tier;
}

uint64_t kv_events_oldest(const struct kv_events *ev)
{
	if (!ev->ring)
		return ev->next_seq;
	if (ev->next_seq - ev->first_seq > KV_EVENTS_KEEP)
		return ev->next_seq - KV_EVENTS_KEEP;
	return ev->first_seq;
}

const struct kv_event *kv_events_at(const struct kv_events *ev, uint64_t seq)
{
	if (!ev->ring || seq >= ev->next_seq || seq < kv_events_oldest(ev))
		return NULL;
	return &ev->ring[seq % KV_EVENTS_KEEP];
}
