/* client/lease.h — a read lease handle: the page table of a matched prefix.
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
};

/* Frees the handle without telling the daemon. */
void lease_free(struct kvp_lease *l);

#endif
