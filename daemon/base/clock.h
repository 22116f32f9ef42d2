/* daemon/base/clock.h — the daemon's one clock.
 *
 * CLOCK_MONOTONIC in nanoseconds: every timeout, idle sweep, last-use
 * stamp and latency the daemon keeps is measured with it, so none jumps
 * when the wall clock is set. Thread-safe.
 */
#ifndef KVPD_CLOCK_H
#define KVPD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
