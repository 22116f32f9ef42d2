/* daemon/match.h — MatchPrefix over a pool's sessions (protocol v1).
 *
 * Finds the longest prefix of a token list that some session of the pool
 * has committed, and pins the pages holding it under a read lease. A token
 * list longer than one request arrives in chunks that extend one lease; so
 * that the chunks together find the true longest match, the lease keeps
 * every session that matched all tokens so far (its candidates) and each
 * chunk continues with the candidates that match it furthest. Pages come
 * from any candidate: sessions that committed the same tokens hold the
 * same KV for them (committed tokens never change in v1: there is no
 * Truncate yet). Cost: O(sessions × matched tokens); the
 * content-addressed prefix index replaces this. Event-loop thread only.
 */
#ifndef KVPD_MATCH_H
#define KVPD_MATCH_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "lease.h"
#include "pool.h"

struct session;

/* Candidates a lease keeps at most; past that the first ones are kept. */
#define MATCH_MAX_CANDIDATES 256u

struct match_result {
	uint64_t first_page;   /* page index of the first slot reported */
	const uint32_t *slots; /* slots from first_page on, in the lease's table */
	uint32_t n_slots;
};

/* First chunk: matches tokens[0..n) against every session of p, or only
 * `only` when not NULL. On a hit creates a lease owned by owner (linked into
 * owner_list) and returns 1 with it in *ret_lease; returns 0 on a miss (no
 * lease), -ENOMEM. */
int match_start(struct cache *c, struct pool *p, struct session *only, const void *owner,
		struct list *owner_list, const uint32_t *tokens, size_t n, struct lease **ret_lease,
		struct match_result *ret);

/* A later chunk: extends the lease's match with tokens[0..n). Returns 0
 * (the lease says how far it got and whether it is complete) or -ENOMEM.
 * The page holding the previous end of the match may be reported again
 * (from another candidate); clients replace it. */
int match_extend(struct cache *c, struct lease *l, const uint32_t *tokens, size_t n,
		 struct match_result *ret);

#endif
