/* daemon/service/evsub.h — KV event subscriptions (proto's
 * SubscribeEvents): who gets which of the cache's events (core/events.h),
 * and the KvEvents pushes that carry them.
 *
 * A subscriber on the client socket gets the events of its own tenant's
 * pools only, read from its tenant's ring, one on the admin socket every
 * pool's, from the ring of all events (core/events.h). The server asks
 * for a subscriber's next push whenever it has room to send one
 * (evsub_pending), so a subscriber that reads slowly holds back only its
 * own events, and loses the oldest once its ring has moved past them:
 * a tenant's, only through its own tenant's traffic.
 */
#ifndef KVPD_EVSUB_H
#define KVPD_EVSUB_H

#include <stdint.h>

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "reply.h"

/* SubscribeEvents for p. Returns 0 (r filled), -ENOENT (no such pool
 * visible to p), -EEXIST (already subscribed), -EDQUOT (too many other
 * tenants subscribe) or -ENOMEM; *why says. */
int evsub_subscribe(struct cache *cache, struct peer *p,
		    const Kvpalace__V1__SubscribeEventsRequest *in, struct reply *r,
		    const char **why);

/* Whether p has events to get (or lost some). */
static inline int evsub_pending(const struct cache *cache, const struct peer *p)
{
	(void)cache;
	return p->ev_sub && p->ev_next < p->ev_ring->next;
}

/* Fills r with p's next KvEvents push (Response id 0), packed at most
 * max_message_bytes, and moves p past what it holds. Returns 1 when r
 * holds a push, 0 when p had nothing it may see, -ENOMEM. */
int evsub_next(struct cache *cache, struct peer *p, struct reply *r, uint32_t max_message_bytes);

/* p goes: its subscription with it. */
void evsub_gone(struct cache *cache, struct peer *p);

#endif
