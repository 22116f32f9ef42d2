/* daemon/pagealloc.h — the page-slot allocator of one arena.
 *
 * Slots are the fixed page positions of a pool's arena. A slot is free or
 * held; a held slot has a reference count (one per session page-table entry
 * and one per read lease that pins it) and a pin count (leases only, for
 * statistics and, later, eviction). Free slots sit on a LIFO stack so a
 * recently freed (cache-warm) slot is reused first. Event-loop thread only.
 */
#ifndef KVPD_PAGEALLOC_H
#define KVPD_PAGEALLOC_H

#include <stdint.h>

struct pagealloc {
	uint32_t n_pages;
	uint32_t n_free;
	uint32_t *free_stack; /* [n_pages], the first n_free entries are free slots */
	uint32_t *refs;	      /* [n_pages] holders of each slot, 0 = free */
	uint32_t *pins;	      /* [n_pages] read leases pinning each slot */
};

/* Sets up n_pages free slots. Returns 0 or -ENOMEM. */
int pagealloc_init(struct pagealloc *pa, uint32_t n_pages);
/* Frees the tables; accepts a zeroed or half-built allocator. */
void pagealloc_fini(struct pagealloc *pa);

/* Takes a free slot with one reference. Returns 0 and the slot in
 * *ret_slot, or -ENOSPC when none is free. */
int pagealloc_get(struct pagealloc *pa, uint32_t *ret_slot);
/* Adds a reference to a held slot. */
void pagealloc_ref(struct pagealloc *pa, uint32_t slot);
/* Drops a reference; the slot returns to the free stack at zero. Returns
 * the references left. */
uint32_t pagealloc_unref(struct pagealloc *pa, uint32_t slot);
/* Pin/unpin for read leases: a pin also holds a reference. */
void pagealloc_pin(struct pagealloc *pa, uint32_t slot);
void pagealloc_unpin(struct pagealloc *pa, uint32_t slot);

/* Slots pinned by at least one lease. O(n_pages). */
uint32_t pagealloc_n_pinned(const struct pagealloc *pa);
/* Checks free + held == n_pages, that the free stack holds exactly the
 * slots with zero references, each once, and pins <= refs. Returns 0 or
 * -EUCLEAN. O(n_pages). */
int pagealloc_check(const struct pagealloc *pa);

#endif
