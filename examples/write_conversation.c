/* examples/write_conversation.c — kvp-write-conversation: one process of the
 * demo writes a conversation's KV into kvpalaced.
 *
 * Opens the pool of model "tinylm-demo" (4 layers, 2 KV heads, head_dim
 * 64, 16 tokens per page, f16), creates a session, and for each turn of
 * the conversation in demo_kv.h: reserves slots for the turn's tokens
 * (kvp_append), writes every token's K and V for every layer and head
 * straight into the shared pages (kvp_session_kv), and publishes the turn
 * (kvp_commit). It then disconnects without closing the session: the
 * daemon closes it with the connection, but its full pages stay in the
 * pool's prefix index, where another process — kvp-read-conversation —
 * matches and reads them.
 * Single-threaded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "demo_start.h"

static const char help[] =
	"Usage: kvp-write-conversation [--socket PATH]\n"
	"Writes the demo conversation's KV (model " DEMO_MODEL_ID ") into kvpalaced.\n"
	"The socket defaults to $KVPALACE_SOCKET, else the default path.\n";

int main(int argc, char **argv)
{
	const char *what = "";
	uint64_t bytes = 0;
	size_t pos = 0;
	struct demo d;
	kvp_session *s;
	int ret;

	ret = demo_start(&d, argc, argv, "kvp-write-conversation", help);
	if (ret >= 0)
		return ret;
	what = "creating a session";
	ret = kvp_session_create(d.p, &s);
	if (ret < 0)
		goto fail;
	printf("pool %" PRIu64 " (model %s, %uL %uH %uD %uT f16, %zu-byte pages), session %" PRIu64
	       "\n",
	       kvp_pool_id(d.p), DEMO_MODEL_ID, d.layout.n_layers, d.layout.n_kv_heads,
	       d.layout.head_dim, d.layout.block_tokens, kvp_pool_page_bytes(d.p),
	       kvp_session_id(s));

	for (size_t t = 0; t < DEMO_N_TURNS; t++) {
		uint32_t len = demo_turns[t].n_tokens;

		/* Reserve the turn's slots, write its K/V in place, publish. */
		what = "appending";
		ret = kvp_append(s, d.tokens + pos, len);
		if (ret < 0)
			goto fail;
		for (size_t i = pos; i < pos + len; i++)
			for (uint32_t l = 0; l < d.layout.n_layers; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < d.layout.n_kv_heads; h++) {
						uint16_t *row = kvp_session_kv(s, i, l, kv, h);

						if (!row) {
							what = "writing K/V";
							ret = -EFAULT;
							goto fail;
						}
						demo_kv_row(row, i, l, kv, h);
						bytes += kvp_pool_row_bytes(d.p);
					}
		what = "committing";
		ret = kvp_commit(s, len);
		if (ret < 0)
			goto fail;
		pos += len;
		printf("turn %zu %-9s +%3u tokens, %5" PRIu64 " committed, %3" PRIu64 " pages\n",
		       t + 1, demo_turns[t].role, len, kvp_session_committed(s),
		       (kvp_session_committed(s) + d.layout.block_tokens - 1) /
			       d.layout.block_tokens);
	}
	printf("wrote %zu turns, %zu tokens, %" PRIu64 " pages, %" PRIu64
	       " bytes of K/V into session %" PRIu64 "\n",
	       DEMO_N_TURNS, pos,
	       (uint64_t)(pos + d.layout.block_tokens - 1) / d.layout.block_tokens, bytes,
	       kvp_session_id(s));
	/* The session goes with the connection; its full pages stay indexed
	 * for the reader. */
	demo_end(&d);
	return 0;
fail:
	fprintf(stderr, "%s: %s: %s\n", d.prog, what, kvp_strerror(d.c, ret));
	demo_end(&d);
	return 1;
}
