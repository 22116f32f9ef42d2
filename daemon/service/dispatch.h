/* daemon/service/dispatch.h — executes one validated request for a peer.
 *
 * Builds the reply in a struct reply whose storage outlives the call until
 * reply_fini, so repeated fields can point straight into daemon tables
 * (page slots are not copied). Errors become a Status and a reason string
 * in the reply; nothing here closes the connection. Event-loop thread only.
 */
#ifndef KVPD_DISPATCH_H
#define KVPD_DISPATCH_H

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "reply.h"

/* Returns 0 with the reply in r (an error becomes its Status); -EAGAIN
 * when the request must wait for the disk I/O or device copies of pool
 * r->park: nothing changed, no reply; run it again (with no_park set
 * when it has waited long enough, PEER_MAX_PARK_NS: it then takes a
 * miss or an error instead of waiting, and never returns -EAGAIN); or
 * -EINPROGRESS when a worker does it and the reply comes later through
 * the peer's ticket (peer.h). The request's wait (struct tier_park,
 * tier.h) is made here and handed to every handler that may park.
 * Each request's latency is counted here, under its type and c's tenant
 * (cache_latency_add), from its first dispatch to its reply: through its
 * parks (c->parked_ns) and, for one answered later, its ticket (counted
 * in ticket_deliver). */
int dispatch(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req, int no_park,
	     struct reply *r);

/* Peer c is going (its connection closed): what its requests left
 * unfinished in the log is written now (admin_peer_gone). */
void dispatch_peer_gone(struct peer *c);

#endif
