/* daemon/prefix_index.h — a pool's content-addressed index of full pages.
 *
 * Full committed pages of exact sessions are addressed by a hash chain,
 * h_i = XXH3_128(h_{i-1} ‖ tokens of page i), whose root h_{-1} is derived
 * from the pool's identity (model id, layout, format version) and the
 * client's optional cache salt. The hash is deterministic — no per-process
 * seed — so the same tokens give the same hashes in every process and after
 * every restart. Each pool has its own index and pools are per tenant.
 *
 * The index holds one reference on every page it lists. A page that
 * nothing but the index holds (no session, no lease) and that has no child
 * in the index is evictable; evictable pages sit on an LRU list, and
 * eviction takes its least recently used end, so leaves go first and a
 * parent only once its children are gone. Callers tell the index whenever
 * a page's holders change (prefix_index_update). Event-loop thread only.
 */
#ifndef KVPD_PREFIX_INDEX_H
#define KVPD_PREFIX_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "idmap.h"
#include "layout.h"
#include "list.h"
#include "pagealloc.h"

/* Bumped whenever what is hashed changes: it is part of every root. */
#define PREFIX_INDEX_FORMAT   1u
#define PREFIX_INDEX_MAX_SALT 64u

struct pindex_entry {
	XXH128_hash_t hash;
	uint32_t slot;
	uint32_t n_children;	     /* entries whose parent this is */
	struct pindex_entry *parent; /* NULL for a first page */
	struct list evict_link;	     /* prefix_index.evictable when evictable */
	int evictable;
};

struct prefix_index {
	struct idmap by_hash;	       /* low 64 bits of the hash (| 1) → entry */
	struct pindex_entry **by_slot; /* [n_pages] entry listing each slot, or NULL */
	uint32_t n_pages;
	struct list evictable; /* LRU first */
	uint32_t n_entries;
	uint32_t n_evictable;
	uint64_t evictions;
	uint64_t dedup_pages;
};

/* Returns 0 or -ENOMEM. */
int prefix_index_init(struct prefix_index *ix, uint32_t n_pages);
/* Drops every entry's reference through pa and frees the index. */
void prefix_index_fini(struct prefix_index *ix, struct pagealloc *pa);

/* The chain root of a pool identity and salt (salt_len ≤ 64). */
XXH128_hash_t prefix_index_root(const char *model_id, const struct shm_layout *layout,
				const void *salt, size_t salt_len);
/* h_i from h_{i-1} and the n tokens of page i. */
XXH128_hash_t prefix_index_hash_page(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n);

/* The entry of hash, or NULL. */
struct pindex_entry *prefix_index_find(const struct prefix_index *ix, XXH128_hash_t hash);
/* The entry listing slot, or NULL. */
static inline struct pindex_entry *prefix_index_of_slot(const struct prefix_index *ix,
							uint32_t slot)
{
	return ix->by_slot[slot];
}

/* Lists slot (a held page) under hash, child of parent (may be NULL),
 * taking a reference on it. Returns 0, -EEXIST when hash or its 64-bit key
 * is taken (the page simply stays unindexed), or -ENOMEM. */
int prefix_index_insert(struct prefix_index *ix, struct pagealloc *pa, XXH128_hash_t hash,
			struct pindex_entry *parent, uint32_t slot);

/* Re-evaluates whether slot, if indexed, is evictable after its holders
 * changed. A page that becomes evictable goes to the most recently used
 * end. */
void prefix_index_update(struct prefix_index *ix, const struct pagealloc *pa, uint32_t slot);

/* Evicts least recently used evictable pages until pa has want_free free
 * pages or nothing is evictable. Returns the pages evicted. */
uint32_t prefix_index_evict(struct prefix_index *ix, struct pagealloc *pa, uint32_t want_free);

/* Checks entries against pa: by_slot and by_hash agree, child counts are
 * right, the evictable list holds exactly the evictable entries. Adds each
 * entry's reference to refs[slot]. Returns 0 or -EUCLEAN. */
int prefix_index_check(const struct prefix_index *ix, const struct pagealloc *pa, uint32_t *refs);

#endif
