/* daemon/core/whole.h — what acts on the whole cache at once: the
 * invariant check and the teardown.
 *
 * Both walk every pool, session and lease and what holds their pages
 * (disk I/O, device copies, compaction and checkpoint jobs), so whole.c
 * sits at the top of the core, above every file whose objects it checks
 * or frees. cache.h includes this header: the callers in every layer (the
 * server's stop, the debug checks after each operation, the tests and
 * fuzzers) find both where they always did. Event-loop thread only.
 */
#ifndef KVPD_WHOLE_H
#define KVPD_WHOLE_H

#include <errno.h>

#include "log.h"

struct cache;

/* Frees every lease, session and pool (leases first: they pin pages of
 * the pools), then the registry (cache_registry_fini). */
void cache_fini(struct cache *c);

/* Checks page accounting of every pool: free + held = capacity, each
 * slot's reference count equals the session page-table entries, lease pins
 * and index entries that name it, plus what disk I/O, device copies,
 * compaction jobs and — through cache.check_pool_refs — checkpoint jobs
 * hold, and the index is consistent; and each tenant's max-tenant-tokens
 * count equals what its sessions hold. Returns 0, -EUCLEAN, or -ENOMEM
 * when it could not allocate its tables (nothing checked).
 * O(pages + tokens). */
int cache_check(const struct cache *c);

/* Runs cache_check after every operation in a -Ddebug-checks=true build
 * and aborts when the accounting is wrong (not when memory for checking
 * it ran out); compiles to nothing otherwise. */
#ifdef KVP_DEBUG_CHECKS
#define cache_debug_check(c) kvp_assert(cache_check(c) != -EUCLEAN)
#else
#define cache_debug_check(c) ((void)(c))
#endif

#endif
