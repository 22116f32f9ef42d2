/* daemon/core/events.h — KV events: what entered and left the prefix
 * indexes, kept for subscribers (routers; proto's SubscribeEvents).
 *
 * A ring of the last KV_EVENTS_KEEP events, numbered from 1, which exists
 * only while someone subscribes: with no subscriber nothing is recorded
 * and nothing allocated. Readers keep their own position (a sequence
 * number) and read at their pace; one that falls behind by more than
 * the ring holds has lost the oldest, which kv_events_oldest() shows.
 *
 * Besides its number across the daemon (seq), each event has one among
 * its tenant's events (useq) and one among its pool's (pseq): a tenant's
 * subscriber is shown those, so neither the numbers it sees nor the count
 * of what it lost tell anything of other tenants' traffic. Loop thread
 * only.
 */
#ifndef KVPD_EVENTS_H
#define KVPD_EVENTS_H

#include <stdint.h>
#include <sys/types.h>

#include <xxhash.h>

#include "idmap.h"

#define KV_EVENTS_KEEP	    16384u
#define KV_EVENT_MAX_TOKENS 64u /* tokens kept with a stored page of at most this many */

enum kv_event_kind { KV_EVENT_STORED = 1, KV_EVENT_REMOVED = 2, KV_EVENT_CLEARED = 3 };

struct kv_event {
	uint64_t seq;
	uint64_t useq; /* among the tenant's events, from 1; 0: not numbered (no memory) */
	uint64_t pseq; /* among the pool's events, the same way */
	uint64_t pool_id;
	uid_t uid;	    /* the pool's tenant: who may see it */
	uint8_t kind;	    /* enum kv_event_kind */
	uint8_t tier;	    /* proto's Tier: TIER_HOST 2, TIER_DISK 3 */
	uint8_t has_parent; /* STORED: parent is the page before */
	uint16_t n_tokens;  /* tokens[] given (0: unknown, or a page too long) */
	uint32_t block_tokens;
	XXH128_hash_t hash, parent;
	uint32_t tokens[KV_EVENT_MAX_TOKENS];
};

struct kv_events {
	struct kv_event *ring; /* [KV_EVENTS_KEEP] while n_subscribers, else NULL */
	uint64_t next_seq;     /* the number the next event gets; from 1 */
	uint64_t first_seq;    /* the first event the ring was made for */
	uint32_t n_subscribers;
	/* The next useq of each tenant (uid + 1) and pseq of each pool that
	 * had an event, stored as the map's values; a pool's goes with its
	 * ALL_CLEARED. */
	struct idmap next_by_uid;
	struct idmap next_by_pool;
};

void kv_events_init(struct kv_events *ev);
void kv_events_fini(struct kv_events *ev);

/* A subscriber comes (the ring is made for the first: -ENOMEM) or goes
 * (the ring goes with the last; the numbering goes on). */
int kv_events_subscribe(struct kv_events *ev);
void kv_events_unsubscribe(struct kv_events *ev);

/* The next event to fill in (seq set, the rest zeroed), or NULL when
 * nobody subscribes. */
struct kv_event *kv_events_add(struct kv_events *ev, enum kv_event_kind kind, uint64_t pool_id,
			       uid_t uid);

/* A page entered a pool's index (parent NULL: a first page; tokens NULL:
 * not known) or left it, in tier (enum kv_event_tier); nothing when
 * nobody subscribes. */
enum kv_event_tier { KV_EVENT_HOST = 2, KV_EVENT_DISK = 3 }; /* proto's Tier values */
void kv_events_stored(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		      XXH128_hash_t hash, const XXH128_hash_t *parent, enum kv_event_tier tier,
		      const uint32_t *tokens);
void kv_events_removed(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		       XXH128_hash_t hash, enum kv_event_tier tier);

/* The useq the next event of uid will have, and the pseq of pool_id's. */
uint64_t kv_events_uid_next(const struct kv_events *ev, uid_t uid);
uint64_t kv_events_pool_next(const struct kv_events *ev, uint64_t pool_id);

/* The oldest event still kept (next_seq when none is), and event seq, or
 * NULL when it is not kept (lost, or not yet made). */
uint64_t kv_events_oldest(const struct kv_events *ev);
const struct kv_event *kv_events_at(const struct kv_events *ev, uint64_t seq);

#endif
