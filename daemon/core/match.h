/* daemon/core/match.h — MatchPrefix: walk a prompt's hash chain in the pool's
 * prefix index.
 *
 * The prompt is cut into pages of block_tokens; each full page's chain
 * hash is looked up in the index and the walk stops at the first miss, so
 * a match is always whole pages and costs one hash and one lookup per page.
 * The matched pages are pinned under a read lease. A token list longer
 * than one request arrives in chunks that extend the same lease: the lease
 * keeps the chain hash reached and the tokens of a page cut by a chunk
 * boundary. Pages of the chain that are on disk only are a miss to the
 * walk: match_prefetch starts bringing them in first, and the request
 * waits for them (daemon/core/tier.h). A page being written to disk is still
 * in the host tier and is matched. Event-loop thread only.
 */
#ifndef KVPD_MATCH_H
#define KVPD_MATCH_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "cache.h"
#include "lease.h"
#include "pool.h"

struct match_result {
	uint64_t first_page;   /* page index of the first slot reported */
	const uint32_t *slots; /* slots from first_page on, in the lease's table */
	uint32_t n_slots;
};

struct tier_park;
/* Starts promoting the disk-only pages a walk of tokens[0..n) from chain
 * (after the n_carry tokens of carry, the first of which, or tokens[0],
 * is at absolute position pos, under the key spans spans[0..n_spans))
 * would match, and marks the pages
 * already in the host tier as recently used so the promotions do not push
 * them out. Returns the pages still on their way (0: walk now): reads in
 * flight, and pages whose slot comes once disk writes finish (then
 * pk->park_on is set; never when pk->no_park: tier_promote). */
uint32_t match_prefetch(struct cache *c, struct pool *p, XXH128_hash_t chain, const uint32_t *carry,
			uint32_t n_carry, const uint32_t *tokens, size_t n, uint64_t pos,
			const struct pindex_span *spans, uint32_t n_spans, struct tier_park *pk);

/* First chunk: walks tokens[0..n) from root under the key spans
 * spans[0..n_spans) (absolute positions; the lease keeps a copy, which
 * later chunks add to: lease.spans). Creates a lease owned by
 * owner (linked into owner_list) unless the walk missed at once, with room
 * for reserve_pages pages (the whole prompt's, when the caller knows it:
 * its tables then grow once; 0: as the match grows); returns 1 with it in
 * *ret_lease, 0 on a miss (no lease), or -ENOMEM. */
int match_start(struct cache *c, struct pool *p, XXH128_hash_t root, const void *owner,
		struct list *owner_list, const uint32_t *tokens, size_t n,
		const struct pindex_span *spans, uint32_t n_spans, uint64_t reserve_pages,
		struct lease **ret_lease, struct match_result *ret);

/* A later chunk: continues the lease's walk with tokens[0..n). Returns 0
 * (the lease says how far it got and whether it is complete) or -ENOMEM. */
int match_extend(struct cache *c, struct lease *l, const uint32_t *tokens, size_t n,
		 struct match_result *ret);

/* What a lookup found: see match_lookup. */
struct match_lookup_result {
	uint64_t matched_tokens; /* whole pages of tokens the index holds, in order */
	uint64_t host_tokens;	 /* of them, the leading ones with a host copy */
	int complete;		 /* stopped at a missing (or lossy) page */
	XXH128_hash_t chain;	 /* the chain after the last matched page */
};

/* Walks the whole pages of tokens[0..n) (tokens[0] at absolute position
 * pos, under the key spans spans[0..n_spans)) from chain through p's prefix
 * index and changes nothing: no pin, no recency, no promotion, no
 * counter (a scheduler asks this many times per request). Pages whose
 * only copy is lossy (a quantized spill) end the walk, as they end a
 * match; pages only on disk, or on their way in, count as matched but
 * not as host. A partial last page is not looked at. */
void match_lookup(const struct pool *p, XXH128_hash_t chain, const uint32_t *tokens, size_t n,
		  uint64_t pos, const struct pindex_span *spans, uint32_t n_spans,
		  struct match_lookup_result *ret);

#endif
