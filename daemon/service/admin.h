/* daemon/service/admin.h — the operations only the admin socket serves.
 *
 * kvpalacectl's steering commands: one session in detail (ShowSession),
 * dropping a session or a whole pool (DropSession, DropPool: what is
 * dropped is forgotten in every tier, durably, daemon/service/purge.h), evicting
 * cached pages from a tier (Evict: from the host tier down to the disk
 * tier through its spill path, or dropped; from the disk tier for good),
 * purging suspect pages (Purge, daemon/service/purge.h), and the configuration
 * (ConfigShow, ConfigReload). Replies that wait for disk work (header
 * invalidations, demotion writes) go out later through a ticket. Ids here name any tenant's pools and sessions: the
 * admin socket is the admin group's only (its file mode), and dispatch
 * refuses these operations on the client socket with -EPERM before they
 * get here. Everything that destroys state is logged with who asked.
 * Event-loop thread only.
 */
#ifndef KVPD_ADMIN_H
#define KVPD_ADMIN_H

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "reply.h"
#include "validate.h"

/* Page slots ShowSession lists when the request does not say, and the
 * most it may ask for. */
#define ADMIN_SHOW_SLOTS_DEFAULT 16u
#define ADMIN_SHOW_SLOTS_MAX	 VALIDATE_SHOW_SLOTS_MAX
/* Pages one Evict request takes at most: a long eviction is many short
 * requests, so the event loop never stalls on one. */
#define ADMIN_EVICT_MAX_PAGES 65536u

/* True for the operations of this file. */
int admin_is_admin_op(Kvpalace__V1__Request__OpCase op);

struct tier_park;
/* Executes admin operation req (validated, on an admin connection c) into
 * r as dispatch does. Returns 0, a negative errno with a reason in *why
 * (valid until reply_fini(r)), -EAGAIN with pk->park_on set when it waits
 * for a pool's disk I/O (nothing changed; never when pk->no_park) or
 * -EINPROGRESS (answered later through a ticket of c). */
int admin_run(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req,
	      struct reply *r, struct tier_park *pk, const char **why);

/* Peer c is going: an eviction it was running (struct evict_run) is
 * logged as it stands, and forgotten. */
void admin_peer_gone(struct peer *c);

#endif
