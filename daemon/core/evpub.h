/* daemon/core/evpub.h — KV events to the cluster: the pages that enter and
 * leave this machine's prefix indexes, appended to a Redis Stream that
 * every machine of the deployment writes and routers read (issue 20).
 *
 * With remote-events = KEY (and a remote tier), the daemon follows its
 * own event ring (core/events.h) like a subscriber of the admin socket
 * and appends, for each event of a pool that takes part in the remote
 * tier (rtier.h: a tenant name, so the scope means the same on every
 * machine), one stream entry
 *
 *     machine <host name>  kind stored|removed|cleared  scope <hex>
 *     pool <hex>  hash <hex>  [parent <hex>]  tier host|disk
 *
 * (hashes as 32 hex digits of the canonical XXH128, as the remote tier's
 * keys spell them), the stream trimmed to about EVPUB_MAXLEN entries
 * (XADD MAXLEN ~). Pools of uids without a tenant name stay unannounced.
 * One batch is in flight at a time; events that came meanwhile wait in
 * the ring, and should the ring overrun them an entry of kind lost says
 * how many this machine dropped (a router should then forget what it
 * knew of this machine). Best effort: a batch the cluster refused is
 * counted and not retried. Event-loop thread only.
 */
#ifndef KVPD_EVPUB_H
#define KVPD_EVPUB_H

#include <stdint.h>

#include "cache.h"

#define EVPUB_MAXLEN 100000u /* entries the stream keeps, about */
#define EVPUB_BATCH  255u    /* events in one batch (and a lost entry): REMOTE_MAX_PAGES */
/* Bytes of one formatted XADD, at most: the longest (a 127-byte key, a
 * 64-byte host name, a 20-digit pool id, two hashes) takes about 520. */
#define EVPUB_ENTRY_MAX 1024u

struct evpub_stats {
	uint64_t published; /* entries the cluster took */
	uint64_t failed;    /* entries of batches it refused or that failed */
	uint64_t lost;	    /* events the ring dropped before they went out */
};

struct evpub;

/* Starts publishing to the stream cfg->remote_events through c->remote
 * (a subscription to c->events, kept until evpub_stop). Returns 0
 * (nothing to do when either is absent), or -ENOMEM. */
int evpub_start(struct cache *c);
/* Sends what came since the last batch, unless one is in flight. Cheap
 * when nothing came. */
void evpub_pump(struct cache *c);
/* True while a batch is in flight (the daemon's stop waits for it). */
int evpub_busy(const struct cache *c);
/* Ends the subscription; the batch in flight must be done. */
void evpub_stop(struct cache *c);
void evpub_stats(const struct cache *c, struct evpub_stats *ret);

#endif
