/* client/metrics/latency_stub.c — DROP AT MERGE. A stand-in for
 * kvp_latency_bound_ns() (kvpalace.h) until libkvpalace defines it (the
 * issue-16 library branch); with that branch merged, delete this file and
 * its line in client/meson.build. Same bounds as the header promises:
 * 10 µs, 25 µs, 50 µs, 100 µs, ... (1, 2.5, 5 per decade), 10 s for
 * i = 18, UINT64_MAX from i = KVP_LATENCY_BUCKETS - 1 on.
 */
#include <stdint.h>

#include "kvpalace.h"

uint64_t kvp_latency_bound_ns(unsigned int i)
{
	static const uint64_t mantissa_x2[3] = {2, 5, 10}; /* 1, 2.5, 5 times 2 */
	uint64_t decade = 1;

	if (i >= KVP_LATENCY_BUCKETS - 1)
		return UINT64_MAX;
	for (unsigned int d = 0; d < i / 3; d++)
		decade *= 10;
	return mantissa_x2[i % 3] * 5000 * decade;
}
