/* daemon/store/ghost.h — the bounded memory of evicted pages that the LFU
 * victim order (prefix_index.h, --eviction lfu) keeps: a page's use count
 * outlives its eviction for a while, so a page that was useful before and
 * lost its place to a burst of one-use pages comes back above them.
 *
 * A fixed table made at start (ghost_init): n entries, forgotten in the
 * order they were remembered (FIFO), keyed by 64 bits of the page's chain
 * hash; memory is 24 bytes an entry and never grows. A key collision (two
 * pages with the same 64 bits) only lends one page the other's count: an
 * eviction hint, never a wrong page. Event-loop thread only; no I/O.
 */
#ifndef KVPD_GHOST_H
#define KVPD_GHOST_H

#include <stdint.h>

struct ghost_slot {
	uint64_t key; /* 0: empty (keys are made odd) */
	uint32_t epoch;
	uint8_t count;
	uint32_t ring; /* its place in the FIFO */
};

struct ghost {
	uint32_t n;    /* capacity, 0: no ghosts */
	uint32_t mask; /* table size - 1 (a power of two, >= 2n) */
	struct ghost_slot *tab;
	uint64_t *ring;	   /* [n] keys in the order remembered */
	uint32_t ring_pos; /* the next to overwrite */
	uint32_t used;	   /* entries held */
};

/* Room for n ghosts (0: none). Returns 0 or -ENOMEM. */
int ghost_init(struct ghost *g, uint32_t n);
/* Frees the table; g may be zeroed or half-built. */
void ghost_fini(struct ghost *g);
/* Remembers key with count at epoch, forgetting the oldest ghost when full. */
void ghost_put(struct ghost *g, uint64_t key, uint8_t count, uint32_t epoch);
/* Takes key's ghost out: 1 with *ret_count and *ret_epoch, 0 if none. */
int ghost_take(struct ghost *g, uint64_t key, uint8_t *ret_count, uint32_t *ret_epoch);

#endif
