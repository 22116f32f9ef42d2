/* examples/write_conversation.c — kvp-write-conversation: one process of the
 * demo writes a conversation's KV into kvpalaced.
 *
 * Opens the pool of model "tinylm-demo" (4 layers, 2 KV heads, head_dim
 * 64, 16 tokens per page, f16), creates a session, and for each turn of
 * the conversation in demo_kv.h: reserves slots for the turn's tokens
 * (kvp_append), writes every token's K and V for every layer and head
 * straight into the shared pages (kvp_session_kv), and publishes the turn
 * (kvp_commit). It then disconnects without closing the session, so
 * another process — kvp-read-conversation — can match and read it.
 * Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_kv.h"
#include "kvpalace.h"

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvp-write-conversation [--socket PATH]\n"
		   "Writes the demo conversation's KV (model " DEMO_MODEL_ID ") into kvpalaced.\n"
		   "The socket defaults to $KVPALACE_SOCKET, else the default path.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *path = NULL;
	const char *what = "";
	struct kvp_layout layout;
	uint64_t bytes = 0;
	uint32_t *tokens;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	size_t n;
	size_t pos = 0;
	int opt;
	int ret;

	while ((opt = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			path = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}

	n = demo_n_tokens();
	tokens = malloc(n * sizeof(*tokens));
	if (!tokens) {
		fprintf(stderr, "kvp-write-conversation: out of memory\n");
		return 1;
	}
	demo_tokens(tokens);
	demo_layout(&layout);

	ret = kvp_connect(path, &c);
	if (ret < 0) {
		fprintf(stderr, "kvp-write-conversation: cannot connect to kvpalaced: %s\n",
			kvp_strerror(NULL, ret));
		free(tokens);
		return 1;
	}
	what = "opening the pool";
	ret = kvp_pool_open(c, DEMO_MODEL_ID, &layout, &p);
	if (ret < 0)
		goto fail;
	what = "creating a session";
	ret = kvp_session_create(p, &s);
	if (ret < 0)
		goto fail;
	printf("pool %" PRIu64 " (model %s, %uL %uH %uD %uT f16, %zu-byte pages), session %" PRIu64
	       "\n",
	       kvp_pool_id(p), DEMO_MODEL_ID, layout.n_layers, layout.n_kv_heads, layout.head_dim,
	       layout.block_tokens, kvp_pool_page_bytes(p), kvp_session_id(s));

	for (size_t t = 0; t < DEMO_N_TURNS; t++) {
		uint32_t len = demo_turns[t].n_tokens;

		/* Reserve the turn's slots, write its K/V in place, publish. */
		what = "appending";
		ret = kvp_append(s, tokens + pos, len);
		if (ret < 0)
			goto fail;
		for (size_t i = pos; i < pos + len; i++)
			for (uint32_t l = 0; l < layout.n_layers; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < layout.n_kv_heads; h++) {
						uint16_t *row = kvp_session_kv(s, i, l, kv, h);

						if (!row) {
							what = "writing K/V";
							ret = -EFAULT;
							goto fail;
						}
						demo_kv_row(row, i, l, kv, h);
						bytes += kvp_pool_row_bytes(p);
					}
		what = "committing";
		ret = kvp_commit(s, len);
		if (ret < 0)
			goto fail;
		pos += len;
		printf("turn %zu %-9s +%3u tokens, %5" PRIu64 " committed, %3" PRIu64 " pages\n",
		       t + 1, demo_turns[t].role, len, kvp_session_committed(s),
		       (kvp_session_committed(s) + layout.block_tokens - 1) / layout.block_tokens);
	}
	printf("wrote %zu turns, %zu tokens, %" PRIu64 " pages, %" PRIu64
	       " bytes of K/V into session %" PRIu64 "\n",
	       DEMO_N_TURNS, pos, (uint64_t)(pos + layout.block_tokens - 1) / layout.block_tokens,
	       bytes, kvp_session_id(s));
	/* The session stays in the daemon for the reader; only handles go. */
	kvp_disconnect(c);
	free(tokens);
	return 0;
fail:
	fprintf(stderr, "kvp-write-conversation: %s: %s\n", what, kvp_strerror(c, ret));
	kvp_disconnect(c);
	free(tokens);
	return 1;
}
