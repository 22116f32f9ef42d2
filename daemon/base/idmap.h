/* daemon/base/idmap.h — a hash map from 64-bit ids to pointers.
 *
 * Open addressing with linear probing and backward-shift deletion; ids are
 * never 0 (0 marks an empty slot). Lookups of client-supplied ids are O(1)
 * on average whatever the ids. Event-loop thread only.
 */
#ifndef KVPD_IDMAP_H
#define KVPD_IDMAP_H

#include <stddef.h>
#include <stdint.h>

struct idmap_entry {
	uint64_t id;
	void *ptr;
};

struct idmap {
	struct idmap_entry *slots; /* [cap], cap a power of two */
	size_t cap;
	size_t n;
};

/* A zeroed struct idmap is a valid empty map. */
void idmap_fini(struct idmap *m);
/* Returns the pointer stored for id, or NULL. */
void *idmap_get(const struct idmap *m, uint64_t id);
/* Starts loading the table slot where a lookup of id begins, so that a
 * caller with several lookups to make overlaps their cache misses. */
void idmap_prefetch(const struct idmap *m, uint64_t id);
/* Stores ptr under id (must be absent, non-zero). Returns 0 or -ENOMEM. */
int idmap_put(struct idmap *m, uint64_t id, void *ptr);
/* Makes room for n ids in all without growing again (a caller about to
 * add many at once: growing rehashes every id, one long pause).
 * Returns 0 or -ENOMEM (the map is as it was). */
int idmap_reserve(struct idmap *m, size_t n);
/* A zeroed table with room for n ids (its size in *ret_cap), every page
 * of it touched, for idmap_adopt: made on a worker thread, it spares the
 * map's own thread the page faults of a large table (thousands of them,
 * milliseconds, when many ids come at once). Touches no map: any thread.
 * Returns NULL when out of memory. */
struct idmap_entry *idmap_table_new(size_t n, size_t *ret_cap);
/* Moves every id of m into slots (from idmap_table_new), which m then
 * owns. Returns 0, or -ENOSPC when slots is not larger than m's table or
 * too small for its ids (nothing changed: the caller frees slots). */
int idmap_adopt(struct idmap *m, struct idmap_entry *slots, size_t cap);
/* Removes id; returns the pointer it held or NULL. */
void *idmap_del(struct idmap *m, uint64_t id);

#endif
