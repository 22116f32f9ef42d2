/* bench/bench_util.h — what every benchmark program shares: the clock,
 * the "sample NAME VALUE" lines bench/run reads, dying with a message, and
 * sorting samples. Header-only, single-threaded programs. Each program
 * defines BENCH_PROG (its name, for messages) before including it.
 */
#ifndef KVP_BENCH_UTIL_H
#define KVP_BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef BENCH_PROG
#define BENCH_PROG "kvp-bench"
#endif

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One figure for bench/run, which takes the median over repetitions. */
static inline void sample(const char *name, double value)
{
	printf("sample %s %.6g\n", name, value);
	fflush(stdout);
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2), unused));
static void die(const char *fmt, ...)
{
	va_list ap;

	fputs(BENCH_PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static inline int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

#endif
