/* client/api/lease.h — matching a prefix into a new read lease on a
 * given tier, for the GPU tier's calls (api/gpu.c); struct kvp_lease is
 * handle/handle.h's.
 *
 * Layer: api (client/README.md). Not thread-safe.
 */
#ifndef KVPC_LEASE_H
#define KVPC_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"

/* Matches tokens[0..n) asking for tier (KVP_TIER_HOST or KVP_TIER_GPU,
 * or_host allowing the host instead) and returns a new lease handle on
 * p's list; l->tier says what the daemon gave. Errors as kvp_match_prefix,
 * and -EOPNOTSUPP the GPU was asked for without or_host and there is none. */
int lease_match_tier(struct kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		     int or_host, const struct kvp_match_opts *keys, struct kvp_lease **ret_lease);

/* kvp_match_prefix_tier under keys' salt, extra key and spans (NULL: the
 * pool handle's salt, none; keys' tier and flags are not read), checked
 * by the caller (keys_check). */
int lease_match_any(struct kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		    unsigned int flags, const struct kvp_match_opts *keys,
		    struct kvp_lease **ret_lease);

#endif
