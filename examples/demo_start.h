/* examples/demo_start.h — the start shared by the two demo programs: parse
 * [--socket PATH] [--help], build the conversation's tokens, connect to
 * kvpalaced and open the demo pool. Header-only so each example stays one
 * program file plus this. Single-threaded.
 */
#ifndef KVP_DEMO_START_H
#define KVP_DEMO_START_H

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "demo_kv.h"
#include "kvpalace.h"

struct demo {
	const char *prog;
	kvp_client *c;
	kvp_pool *p;
	struct kvp_layout layout;
	uint32_t *tokens;
	size_t n;
};

/* Frees what demo_start set up; safe on a half-built demo. */
static inline void demo_end(struct demo *d)
{
	kvp_disconnect(d->c);
	free(d->tokens);
}

/* Returns -1 when the program should go on with d ready, else the exit
 * status to return at once (0 after --help, 1 on failure, 2 on a usage
 * error), having printed why. help is the --help text. */
static inline int demo_start(struct demo *d, int argc, char **argv, const char *prog,
			     const char *help)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *path = NULL;
	int opt, ret;

	*d = (struct demo){.prog = prog};
	while ((opt = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			path = optarg;
			break;
		case 'h':
			fputs(help, stdout);
			return 0;
		default:
			fputs(help, stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fputs(help, stderr);
		return 2;
	}
	d->n = demo_n_tokens();
	d->tokens = malloc(d->n * sizeof(*d->tokens));
	if (!d->tokens) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 1;
	}
	demo_tokens(d->tokens);
	demo_layout(&d->layout);
	ret = kvp_connect(path, &d->c);
	if (ret < 0) {
		fprintf(stderr, "%s: cannot connect to kvpalaced: %s\n", prog,
			kvp_strerror(NULL, ret));
		demo_end(d);
		return 1;
	}
	ret = kvp_pool_open(d->c, DEMO_MODEL_ID, &d->layout, &d->p);
	if (ret < 0) {
		fprintf(stderr, "%s: opening the pool: %s\n", prog, kvp_strerror(d->c, ret));
		demo_end(d);
		return 1;
	}
	return -1;
}

#endif
