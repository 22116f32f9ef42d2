/* bench/py_ref.c — kvp-bench-pyref: the C side of bench/py_bench.py, the
 * Python package's overhead. It times the same calls the Python side does,
 * through libkvpalace directly, in blocks the Python side asks for on
 * stdin, so both run interleaved in the same seconds:
 *
 *	kvp-bench-pyref SOCKET MODEL N_TOKENS
 *	stdin:  "lookup COUNT" | "match COUNT" | "quit", one a line
 *	stdout: the block's mean nanoseconds per call, one a line
 *
 * lookup is kvp_lookup of tokens 0..N_TOKENS-1; match is kvp_match_prefix
 * of them then kvp_lease_release. The pool has the layout py_bench.py
 * uses (2 layers, 2 KV heads, head_dim 32, 16 tokens a page, f16), and the
 * prefix is committed by the Python side before the first block.
 * Single-threaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpalace.h"

static unsigned long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	const struct kvp_layout layout = {2, 2, 32, 16, KVP_DTYPE_F16, 0};
	kvp_client *c;
	kvp_pool *p;
	uint32_t *tokens;
	size_t n;
	char line[64], op[16];
	int ret;

	if (argc != 4) {
		fprintf(stderr, "usage: %s SOCKET MODEL N_TOKENS\n", argv[0]);
		return 2;
	}
	n = strtoul(argv[3], NULL, 10);
	tokens = calloc(n ? n : 1, sizeof(*tokens));
	if (!tokens)
		return 1;
	for (size_t i = 0; i < n; i++)
		tokens[i] = (uint32_t)i;
	ret = kvp_connect(argv[1], &c);
	if (ret == 0)
		ret = kvp_pool_open(c, argv[2], &layout, &p);
	if (ret < 0) {
		fprintf(stderr, "kvp-bench-pyref: %s\n", strerror(-ret));
		return 1;
	}
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long count = 0;
		unsigned long long t0, t1;

		if (sscanf(line, "%15s %lu", op, &count) < 1 || strcmp(op, "quit") == 0)
			break;
		t0 = now_ns();
		for (unsigned long i = 0; i < count && ret >= 0; i++) {
			if (strcmp(op, "lookup") == 0) {
				uint64_t got;

				ret = kvp_lookup(p, tokens, n, &got);
			} else {
				kvp_lease *l;

				ret = kvp_match_prefix(p, tokens, n, &l);
				if (ret == 0)
					ret = kvp_lease_release(l);
			}
		}
		t1 = now_ns();
		if (ret < 0) {
			fprintf(stderr, "kvp-bench-pyref: %s: %s\n", op, kvp_strerror(c, ret));
			return 1;
		}
		printf("%.1f\n", count ? (double)(t1 - t0) / (double)count : 0.0);
		fflush(stdout);
	}
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(tokens);
	return 0;
}
