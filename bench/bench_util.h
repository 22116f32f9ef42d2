/* bench/bench_util.h — what every benchmark program shares: the clock,
 * the "sample NAME VALUE" lines bench/run reads, dying with a message,
 * sorting samples, and parsing "--name VALUE" options from a table (a
 * value that does not parse or is out of range is a usage error, never a
 * silent 0). Header-only, single-threaded programs. Each program defines
 * BENCH_PROG (its name, for messages) before including it.
 */
#ifndef KVP_BENCH_UTIL_H
#define KVP_BENCH_UTIL_H

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- options ---------------------------------------------------------------- */

enum bench_opt_type {
	BENCH_OPT_STR,	  /* const char * */
	BENCH_OPT_UINT,	  /* unsigned */
	BENCH_OPT_INT,	  /* int */
	BENCH_OPT_DOUBLE, /* double */
};

/* One "--name VALUE" option: where its value goes and, for a number, the
 * range it must lie in. */
struct bench_opt {
	const char *name;
	enum bench_opt_type type;
	void *dst;
	double min;
	double max;
};

#define BENCH_OPTS_MAX 32

/* Stores arg as o's value; returns 0, or -EINVAL when it is not a number
 * of o's type within its range. */
static inline int bench_opt_set(const struct bench_opt *o, const char *arg)
{
	char *end;
	double v;

	if (o->type == BENCH_OPT_STR) {
		*(const char **)o->dst = arg;
		return 0;
	}
	errno = 0;
	v = o->type == BENCH_OPT_DOUBLE ? strtod(arg, &end) : (double)strtoll(arg, &end, 10);
	if (errno || end == arg || *end || !(v >= o->min && v <= o->max))
		return -EINVAL;
	if (o->type == BENCH_OPT_UINT)
		*(unsigned *)o->dst = (unsigned)v;
	else if (o->type == BENCH_OPT_INT)
		*(int *)o->dst = (int)v;
	else
		*(double *)o->dst = v;
	return 0;
}

/* Parses argv against opts[0..n): every option takes a value (--name V or
 * --name=V). --help prints usage to stdout and exits 0; an unknown option,
 * a bad value or a stray argument prints a line and the usage to stderr
 * and exits 2. Checks that depend on several options stay with the
 * caller. */
static inline void bench_parse_opts(int argc, char **argv, const struct bench_opt *opts, int n,
				    void (*usage)(FILE *))
{
	struct option lo[BENCH_OPTS_MAX + 2];
	int ch;

	if (n > BENCH_OPTS_MAX)
		die("too many options");
	for (int i = 0; i < n; i++)
		lo[i] = (struct option){opts[i].name, required_argument, NULL, 256 + i};
	lo[n] = (struct option){"help", no_argument, NULL, 'h'};
	lo[n + 1] = (struct option){0};
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (ch == 'h') {
			usage(stdout);
			exit(0);
		}
		if (ch < 256 || ch >= 256 + n) {
			usage(stderr);
			exit(2);
		}
		if (bench_opt_set(&opts[ch - 256], optarg) < 0) {
			fprintf(stderr, BENCH_PROG ": --%s %s: not a value it takes\n",
				opts[ch - 256].name, optarg);
			usage(stderr);
			exit(2);
		}
	}
	if (optind != argc) {
		fprintf(stderr, BENCH_PROG ": unexpected argument %s\n", argv[optind]);
		usage(stderr);
		exit(2);
	}
}

#endif
