/* daemon/store/pagealloc.h — the page-slot allocator of one arena.
 *
 * Slots are the fixed page positions of a pool's arena. A slot is free or
 * held; a held slot has a reference count (one per session page-table entry
 * and one per read lease that pins it) and a pin count (leases only, for
 * statistics and, later, eviction). Free slots sit on a LIFO stack so a
 * recently freed (cache-warm) slot is reused first; the bottom n_released
 * of it are slots whose memory went back to the system (never touched, or
 * given back: pagealloc_release), so the coldest free slots are the ones
 * that cost nothing. Event-loop thread only.
 */
#ifndef KVPD_PAGEALLOC_H
#define KVPD_PAGEALLOC_H

#include <stdint.h>

struct pagealloc {
	uint32_t n_pages;
	uint32_t n_free;
	uint32_t n_released;  /* free_stack[0..n_released): memory given back */
	uint64_t n_gets;      /* slots handed out by pagealloc_get, ever */
	uint32_t *free_stack; /* [n_pages], the first n_free entries are free slots */
	uint32_t *refs;	      /* [n_pages] holders of each slot, 0 = free */
	uint32_t *pins;	      /* [n_pages] read leases pinning each slot */
	/* Slots with pins > 0, kept as pins cross 0 and 1 so that Stats costs
	 * nothing per slot (pagealloc_check compares it with a walk). */
	uint32_t n_pinned;
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

/* The free slots whose memory may go back to the system now: all but the
 * keep most recently freed, at most max of them, sorted, into slots;
 * returns how many. The caller gives their memory back, then says so
 * with pagealloc_released(n) — nothing may take a slot in between. */
uint32_t pagealloc_release(const struct pagealloc *pa, uint32_t keep, uint32_t max,
			   uint32_t *slots);
void pagealloc_released(struct pagealloc *pa, uint32_t n);

/* Making free memory resident again ahead of writers (pool_warm): the
 * released slots pagealloc_get hands out first after the resident free
 * ones, at most max of them, into slots (stack order, not sorted), and in
 * *ret_pos where they lie; returns how many. Nothing changes: the caller
 * faults their memory in (on a worker; the loop goes on allocating
 * meanwhile, which is harmless, as making memory resident never changes
 * its bytes) and then reports it with pagealloc_warmed. */
uint32_t pagealloc_cold_top(const struct pagealloc *pa, uint32_t max, uint32_t *slots,
			    uint32_t *ret_pos);
/* Counts the n slots pagealloc_cold_top gave at pos as resident again,
 * when they are all still free and released where they were (else the
 * stack moved: the caller's work is left uncounted, a figure off, never a
 * slot misplaced). Returns n or 0. */
uint32_t pagealloc_warmed(struct pagealloc *pa, uint32_t pos, uint32_t n, const uint32_t *slots);
/* Held and free slots whose memory is in use: held plus free not given
 * back. */
static inline uint32_t pagealloc_resident(const struct pagealloc *pa)
{
	return pa->n_pages - pa->n_released;
}

/* Slots pinned by at least one lease. O(1). */
static inline uint32_t pagealloc_n_pinned(const struct pagealloc *pa)
{
	return pa->n_pinned;
}
/* The same, counted slot by slot: what n_pinned must equal. O(n_pages). */
uint32_t pagealloc_count_pinned(const struct pagealloc *pa);
/* Checks free + held == n_pages, that the free stack holds exactly the
 * slots with zero references, each once, pins <= refs, and n_pinned
 * against a count. Returns 0 or -EUCLEAN. O(n_pages). */
int pagealloc_check(const struct pagealloc *pa);

#endif
