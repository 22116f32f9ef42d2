/* daemon/stats.h — fills the Stats reply from the cache's counters and
 * pools: a client sees its own pools, an admin connection every pool.
 * Event-loop thread only.
 */
#ifndef KVPD_STATS_H
#define KVPD_STATS_H

#include <sys/types.h>

#include "cache.h"
#include "kvpalace.pb-c.h"

/* Fills out (initialized by the caller) and allocates what it points to
 * in one block returned in *ret_heap (free() it after packing). Keeps the
 * packed message under max_bytes by leaving out pools (pools_truncated).
 * Returns 0 or -ENOMEM. */
int stats_fill(const struct cache *c, uid_t uid, int admin, uint32_t max_bytes,
	       Kvpalace__V1__StatsResponse *out, void **ret_heap);

#endif
