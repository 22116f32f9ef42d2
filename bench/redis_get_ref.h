/* bench/redis_get_ref.h — the Redis reference of the remote tier's
 * benchmarks: redis-benchmark's GET rate for values of a size, against a
 * running cluster (remote_bench.c, remote_prefix_bench.c). Header-only.
 */
#ifndef KVP_BENCH_REDIS_GET_REF_H
#define KVP_BENCH_REDIS_GET_REF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* redis-benchmark --cluster -t set,get -d bytes with 4n requests over n
 * random keys (-r: spread over the masters) from clients clients, against
 * the cluster node on port: its GET requests per second, 0 when it did
 * not run or printed no figure. */
static inline double redis_get_ref_rps(int port, size_t bytes, unsigned int clients, unsigned int n)
{
	char cmd[512], line[256];
	double rps = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd),
		 "redis-benchmark -h 127.0.0.1 -p %d --cluster -t set,get -d %zu -n %u -r %u -c %u "
		 "-q 2>/dev/null | tr '\\r' '\\n' | grep '^GET: [0-9]'",
		 port, bytes, 4 * n, n, clients);
	p = popen(cmd, "r");
	if (!p)
		return 0;
	while (fgets(line, sizeof(line), p)) {
		/* "GET: 123.45 requests per second, p50=..." (\r-separated progress) */
		for (char *g = strstr(line, "GET: "); g; g = strstr(g + 1, "GET: "))
			if (g[5] >= '0' && g[5] <= '9' && strstr(g, "requests per second"))
				rps = strtod(g + 5, NULL);
	}
	pclose(p);
	return rps;
}

#endif
