/* common/latency.h — the bucket bounds of request latency histograms,
 * shared by the daemon (which fills them) and libkvpalace (whose
 * kvp_latency_bound_ns() tells callers what they are).
 *
 * Defined once here so the two cannot disagree: the daemon sends bucket
 * counts without their bounds, and a bound that moved on one side only
 * would put every request in the wrong bucket. Bounds follow 1, 2.5, 5
 * per decade from 10 µs to 10 s (Prometheus's default buckets, scaled
 * down to a local daemon's µs round trips); the last bucket has none.
 * Header-only, no state: any thread.
 */
#ifndef KVP_COMMON_LATENCY_H
#define KVP_COMMON_LATENCY_H

#include <stdint.h>

/* Buckets per histogram; kvpalace.h's KVP_LATENCY_BUCKETS must equal it
 * (client/api/stats.c asserts so at build time). */
#define LATENCY_BUCKETS 20u

/* The upper bound (inclusive) of bucket i in nanoseconds, i <
 * LATENCY_BUCKETS - 1; UINT64_MAX for the last bucket and beyond. */
static inline uint64_t latency_bound_ns(unsigned int i)
{
	static const uint64_t bound_ns[LATENCY_BUCKETS - 1] = {
		10000ull,	25000ull,      50000ull,      /* 10, 25, 50 µs */
		100000ull,	250000ull,     500000ull,     /* 100, 250, 500 µs */
		1000000ull,	2500000ull,    5000000ull,    /* 1, 2.5, 5 ms */
		10000000ull,	25000000ull,   50000000ull,   /* 10, 25, 50 ms */
		100000000ull,	250000000ull,  500000000ull,  /* 100, 250, 500 ms */
		1000000000ull,	2500000000ull, 5000000000ull, /* 1, 2.5, 5 s */
		10000000000ull,				      /* 10 s */
	};

	return i < LATENCY_BUCKETS - 1 ? bound_ns[i] : UINT64_MAX;
}

/* The bucket a latency of ns falls in: the first whose bound is >= ns.
 * At most LATENCY_BUCKETS - 1 comparisons, no division: cheap enough for
 * every request. */
static inline unsigned int latency_bucket(uint64_t ns)
{
	unsigned int i = 0;

	while (i < LATENCY_BUCKETS - 1 && ns > latency_bound_ns(i))
		i++;
	return i;
}

#endif
