/* client/api/lease.h — a read lease handle: the page table of a matched prefix.
 *
 * slots[i] is the arena slot of page i of the match; the daemon keeps those
 * pages pinned until the lease is released or the connection closes. A
 * miss is a lease of id 0 and no tokens, which the daemon does not know.
 * Not thread-safe.
 */
#ifndef KVPC_LEASE_H
#define KVPC_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "pool.h"

struct kvp_lease {
	struct kvp_pool *pool;
	struct list link; /* in pool->leases */
	uint64_t id;	  /* 0: a miss, nothing to release */
	uint64_t n_tokens;
	uint32_t *slots; /* [cap] page table; pool_pages_for(n_tokens) entries used */
	size_t cap;
	uint32_t want_tier;  /* asked for (enum kvp_tier) */
	int or_host;	     /* the host tier will do when the GPU cannot */
	uint32_t tier;	     /* the tier the daemon serves it from */
	uint32_t *dev_slots; /* [dev_cap] device slot of page i, i < n_dev */
	size_t dev_cap;
	uint64_t n_dev;
};

/* Frees the handle without telling the daemon. */
void lease_free(struct kvp_lease *l);

/* Matches tokens[0..n) asking for tier (KVP_TIER_HOST or KVP_TIER_GPU,
 * or_host allowing the host instead) and returns a new lease handle on
 * p's list; l->tier says what the daemon gave. Errors as kvp_match_prefix,
 * and -EOPNOTSUPP the GPU was asked for without or_host and there is none. */
int lease_match_tier(struct kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		     int or_host, struct kvp_lease **ret_lease);

/* Asks the daemon for device copies of every page of l (LeaseDevice) and
 * records their device slots. Returns 0 or a negative errno. */
int lease_device(struct kvp_lease *l);

#endif
