/* bench/trace_sim.h — offline cache simulations over a conversation trace
 * (trace_sim.c documents what each simulates): the reference that
 * kvp-bench-trace holds the real daemon's hit rate against, at the same
 * capacity in pages and with the same page rules.
 *
 * Pages are identified as the daemon's prefix index identifies them: by a
 * hash chain over full pages, h_i = XXH3_128(h_{i-1} ‖ tokens of page i),
 * so the same prefix is the same pages in every conversation that has it.
 * Only full pages are cacheable; a partial last page is recomputed.
 * Single-threaded, no I/O.
 */
#ifndef KVP_BENCH_TRACE_SIM_H
#define KVP_BENCH_TRACE_SIM_H

#include <stdint.h>

#include "trace_gen.h"

#define TRACE_SIM_NEVER UINT32_MAX

/* The page identities of a trace. */
struct trace_pages {
	uint32_t block_tokens;
	uint32_t n_pages; /* distinct pages (prefix-chain hashes) */
	uint32_t n_convs;
	uint32_t **conv;    /* [n_convs][conv tokens / block_tokens] page ids */
	uint32_t *depth;    /* [n_pages] index of the page in its chain */
	uint32_t *parent;   /* [n_pages] the page before it, or TRACE_SIM_NEVER */
	uint64_t page_refs; /* prompt pages (full ones) over all requests */
};

/* Builds the page identities of t with pages of block_tokens tokens.
 * Returns 0, -EINVAL, -ENOMEM; *ret written only on success. */
int trace_pages_build(const struct trace *t, uint32_t block_tokens, struct trace_pages *ret);
void trace_pages_free(struct trace_pages *pg);

enum trace_policy {
	TRACE_SIM_INFINITE, /* no eviction: only first references miss */
	TRACE_SIM_LRU,	    /* plain LRU over pages */
	TRACE_SIM_LEAF_LRU, /* kvpalaced's host-tier policy, sequentially */
	TRACE_SIM_BELADY,   /* Belady's MIN: evict the furthest next use */
	TRACE_SIM_LEAF_LFU, /* leaves-first LFU with aging and ghosts (--eviction lfu) */
	TRACE_SIM_LEAF_WIN, /* leaves-first probation window + LRU main (--eviction window) */
	TRACE_SIM_N,
};

/* TRACE_SIM_LEAF_LFU's parameters (trace_sim.c documents them). */
struct trace_lfu {
	uint32_t max_count;	 /* counts saturate here, 1..TRACE_LFU_MAX_COUNT */
	uint32_t aging_uses;	 /* counts halve every aging_uses page uses */
	uint32_t ghost_per_page; /* evicted pages remembered: ghost_per_page × capacity */
	/* TRACE_SIM_LEAF_WIN: the probation window's share of the capacity
	 * (per mille) and its ghosts per page of capacity. */
	uint32_t window_permille;
	uint32_t win_ghost_per_page;
};

#define TRACE_LFU_MAX_COUNT 15u

void trace_lfu_default(struct trace_lfu *l);

struct trace_sim_result {
	uint64_t prompt_tokens; /* every request's prompt */
	uint64_t hit_tokens;	/* served from the cache */
	uint64_t evictions;	/* pages dropped for room */
	uint64_t bypassed;	/* pages never admitted (Belady only) */
	uint32_t peak_pages;	/* most pages held at once */
};

/* Replays t's requests in trace order through one policy with room for
 * capacity_pages pages (ignored by TRACE_SIM_INFINITE). high and low are
 * the watermarks TRACE_SIM_LEAF_LRU evicts at and down to (fractions of
 * the capacity, as kvpalaced's --host-high-watermark and
 * --host-low-watermark); the others use the whole capacity. ret_hits (may
 * be NULL) gets each request's tokens served from the cache. Returns 0,
 * -EINVAL, -ENOMEM; *ret written only on success. */
int trace_sim_run(const struct trace *t, const struct trace_pages *pg, enum trace_policy pol,
		  uint32_t capacity_pages, double high, double low, uint32_t *ret_hits,
		  struct trace_sim_result *ret);

/* trace_sim_run with TRACE_SIM_LEAF_LFU's parameters (NULL: defaults). */
int trace_sim_run_lfu(const struct trace *t, const struct trace_pages *pg, enum trace_policy pol,
		      uint32_t capacity_pages, double high, double low, const struct trace_lfu *lfu,
		      uint32_t *ret_hits, struct trace_sim_result *ret);

const char *trace_sim_name(enum trace_policy pol);

#endif
