/* daemon/core/lease.h — read leases: a client's pins on matched pages.
 *
 * MatchPrefix pins the pages of the matched prefix under a lease; they
 * stay allocated and unchanged until Release or until the owning
 * connection closes, whatever happens to the session they came from. A
 * lease remembers what it matched so a token list split over several
 * requests extends one lease. Only the owner may use or release a lease;
 * another connection presenting its id gets "not found". Event-loop thread
 * only.
 */
#ifndef KVPD_LEASE_H
#define KVPD_LEASE_H

#include <stdint.h>
#include <xxhash.h>

#include "cache.h"
#include "list.h"
#include "pool.h"
#include "prefix_index.h"

/* Room for the tables of a match of a few pages inside the lease: 6
 * pages of 16 tokens, the rpc benchmark's 4-page prompt among them. */
#define LEASE_INLINE_BYTES 512u

struct lease {
	uint64_t id;
	struct pool *pool;
	const void *owner;
	struct cache_tenant *tenant; /* its user's: leased_bytes counts its pins */
	XXH128_hash_t root;	     /* chain root: pool identity + salt */
	XXH128_hash_t chain;	     /* hash of the last matched page (the root at first) */
	uint32_t *carry;	     /* tokens of a page cut by a chunk boundary */
	uint32_t n_carry;
	/* Key spans of the prompt so far (absolute positions), folded into
	 * the hashes of the pages they overlap (prefix_index_hash_keyed). */
	struct pindex_spans spans;
	uint64_t n_tokens; /* matched so far */
	/* Stats' queried tokens: counted so far for this match, the larger
	 * of the prompt length its first chunk declared (capped at
	 * max-session-tokens) and the tokens its chunks brought. */
	uint64_t queried_tokens;
	uint64_t declared_tokens; /* prompt_tokens of the first chunk, or 0 */
	uint64_t received_tokens; /* tokens of its chunks so far */
	int complete;
	int counted;
	/* counted as a hit or a miss */ /* the match stopped; later chunks add nothing */
	/* An admin purged some of its pages (daemon/service/purge.c): the match
	 * stopped, and a session forked from it indexes nothing. */
	int purged;
	/* The three tables lie in one block: inline_tables while they fit
	 * (a short prompt's match allocates nothing more than the lease),
	 * else tables, malloc'd. */
	uint32_t *tokens;      /* [cap_pages * block_tokens] tokens of the matched pages */
	XXH128_hash_t *hashes; /* [cap_pages] chain hash of each matched page */
	uint32_t *pages;       /* [cap_pages] pinned slots, n_pages used */
	uint32_t n_pages;
	uint32_t cap_pages;
	void *tables; /* the malloc'd block, or NULL */
	/* Device copies (LeaseDevice, daemon/core/gpu.c): dev_slots[i] is the
	 * device slot of pages[i] for i < n_dev; held until release. */
	uint32_t *dev_slots;
	uint32_t n_dev;
	uint32_t cap_dev;
	uint32_t dev_copied;	/* copies started for it, not yet answered */
	uint32_t dev_jobs;	/* its LeaseDevice jobs in flight (gpu.c) */
	int dev_error;		/* a copy it waited for failed: answered once */
	struct list owner_link; /* the owner's list of leases */
	_Alignas(16) unsigned char inline_tables[LEASE_INLINE_BYTES];
};

/* Creates an empty lease on p for owner, linked into owner_list. Returns
 * 0, or -ENOMEM. The caller enforces the per-client lease limit. */
int lease_create(struct cache *c, struct pool *p, const void *owner, struct list *owner_list,
		 struct lease **ret_lease);

/* Makes room for n_pages matched pages in all, so that a match whose
 * length is known ahead grows its tables once, not by doubling. Returns 0
 * or -ENOMEM (the lease unchanged but for room already gained). */
int lease_reserve(struct lease *l, uint64_t n_pages);

/* Pins slot, the next page of the match, whose chain hash is hash and
 * whose block_tokens tokens are tokens, and appends it to the lease, as a
 * use at now_ns (prefix_index_now_ns, taken once per walk).
 * Returns 0 or -ENOMEM (nothing pinned then). */
int lease_add_page(struct lease *l, uint32_t slot, XXH128_hash_t hash, const uint32_t *tokens,
		   uint64_t now_ns);

/* Unpins the pages after the first keep, newest first, and forgets them
 * (a chunk of a match that failed half-way), with their device slots. */
void lease_drop_pages(struct lease *l, uint32_t keep);

/* Unpins every page, gives back its device slots and frees the lease.
 * NULL is accepted. */
void lease_release(struct cache *c, struct lease *l);

/* The lease with this id if owner holds it, else NULL. */
struct lease *lease_get(struct cache *c, uint64_t id, const void *owner);

#endif
