/* daemon/core/events.h — KV events: what entered and left the prefix
 * indexes, kept for subscribers (routers; proto's SubscribeEvents).
 *
 * Events are kept in rings, each of the last KV_EVENTS_KEEP events at
 * most, which exist only while someone reads them: with no subscriber
 * nothing is recorded and nothing allocated.
 *
 *   - One ring per tenant (uid) that has a subscriber on the client
 *     socket, holding that tenant's events only and numbered by useq.
 *     A tenant's subscriber reads its own tenant's ring, so it loses
 *     events only to its own tenant's traffic: another tenant, however
 *     busy or hostile, cannot overrun it. At most KV_EVENTS_MAX_TENANTS
 *     tenants have a ring at once; a subscriber of one more is refused
 *     (-EDQUOT) until a ring goes, while tenants that have one keep it.
 *   - One ring of every event (the "all" ring, numbered by seq) while an
 *     admin subscriber or the cluster publisher (evpub.c) reads: those
 *     see every tenant's events, and so lose the oldest under any
 *     tenant's flood; they are told how many of the daemon's events they
 *     lost (the gap in seq).
 *
 * An event of a tenant with a ring, while the all ring exists too, is
 * kept in both. A ring starts small (KV_RING_FIRST events) and doubles
 * as events come, up to KV_EVENTS_KEEP (where it stays when memory runs
 * out: it then keeps fewer), so an idle subscriber's ring costs 86 KB
 * (336 bytes an event) and a full one 5.5 MB; in all at most
 * (KV_EVENTS_MAX_TENANTS + 1) * KV_EVENTS_KEEP events, 182 MB, the worst
 * case of 32 tenants and an admin subscribing while every tenant floods.
 *
 * Readers keep their own position (a number of their ring) and read at
 * their pace; one that falls behind by more than its ring holds has lost
 * the oldest, which kv_ring_oldest() shows.
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

#define KV_EVENTS_KEEP	      16384u /* events a ring keeps, at most */
#define KV_EVENTS_MAX_TENANTS 32u    /* tenants with a ring of their own at once */
#define KV_RING_FIRST	      256u   /* events a new ring has room for; doubles up to KEEP */
#define KV_EVENT_MAX_TOKENS   64u    /* tokens kept with a stored page of at most this many */

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

/* The last events of one tenant (numbered by useq) or of all (by seq). */
struct kv_ring {
	struct kv_event *ev; /* [cap], by number % cap */
	uint32_t cap;	     /* a power of two, KV_RING_FIRST..KV_EVENTS_KEEP */
	uint32_t n_readers;
	uint64_t oldest; /* the number of the oldest event kept */
	uint64_t next;	 /* the number its next event has */
	uid_t uid;	 /* a tenant's ring: whose */
	int all;	 /* the ring of every event */
};

struct kv_events {
	struct kv_ring *all; /* while an admin subscriber or the publisher reads */
	struct idmap rings;  /* uid + 1 -> struct kv_ring *: the tenants' rings */
	uint32_t n_rings;    /* in rings, at most KV_EVENTS_MAX_TENANTS */
	uint64_t next_seq;   /* the number the next event gets; from 1 */
	/* The next useq of each tenant (uid + 1) and pseq of each pool that
	 * had an event, stored as the map's values; a pool's goes with its
	 * ALL_CLEARED. A tenant with a ring always has its entry. */
	struct idmap next_by_uid;
	struct idmap next_by_pool;
	struct kv_event stage; /* the event being filled in */
};

void kv_events_init(struct kv_events *ev);
void kv_events_fini(struct kv_events *ev);

/* A subscriber comes: all (an admin's, the publisher's) reads every
 * event, else uid's only. Returns 0 and in *ret the ring it reads (made
 * for the first of its readers), -EDQUOT (KV_EVENTS_MAX_TENANTS other
 * tenants have a ring) or -ENOMEM. */
int kv_events_subscribe(struct kv_events *ev, int all, uid_t uid, struct kv_ring **ret);
/* A subscriber of r goes (the ring goes with its last; the numbering
 * goes on). */
void kv_events_unsubscribe(struct kv_events *ev, struct kv_ring *r);

/* A page entered a pool's index (parent NULL: a first page; tokens NULL:
 * not known) or left it, in tier (enum kv_event_tier), or the pool ended
 * (its numbering goes with it); nothing kept when nobody reads the
 * events of uid. */
enum kv_event_tier { KV_EVENT_HOST = 2, KV_EVENT_DISK = 3 }; /* proto's Tier values */
void kv_events_stored(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		      XXH128_hash_t hash, const XXH128_hash_t *parent, enum kv_event_tier tier,
		      const uint32_t *tokens);
void kv_events_removed(struct kv_events *ev, uint64_t pool_id, uid_t uid, uint32_t block_tokens,
		       XXH128_hash_t hash, enum kv_event_tier tier);
void kv_events_cleared(struct kv_events *ev, uint64_t pool_id, uid_t uid);

/* The useq the next event of uid will have, and the pseq of pool_id's. */
uint64_t kv_events_uid_next(const struct kv_events *ev, uid_t uid);
uint64_t kv_events_pool_next(const struct kv_events *ev, uint64_t pool_id);

/* The number of r's oldest event still kept (r->next when none is), and
 * its event n, or NULL when it is not kept (lost, or not yet made). The
 * event stays valid until the next event is recorded. */
uint64_t kv_ring_oldest(const struct kv_ring *r);
const struct kv_event *kv_ring_at(const struct kv_ring *r, uint64_t n);

#endif
