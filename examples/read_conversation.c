/* examples/read_conversation.c — kvp-read-conversation: another process of
 * the demo finds the conversation's KV in kvpalaced and checks every byte.
 *
 * Opens the same pool as kvp-write-conversation, matches the demo
 * conversation's tokens (kvp_match_prefix pins the matched pages under a
 * read lease), and compares every K and V row of every matched token, layer
 * and head with the formula in demo_kv.h. The daemon's prefix index holds
 * whole pages only, so the match covers every full page of the
 * conversation and stops before its last, partial page (1020 tokens of 16
 * a page: 63 pages, 1008 tokens). Prints what it matched and verified and
 * OK, PARTIAL or MISMATCH. Exit status: 0 when every full page matched and
 * every byte agreed; 1 on a miss, a shorter match, a mismatch or an error;
 * 2 on a usage error. Single-threaded.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "demo_start.h"

static const char help[] =
	"Usage: kvp-read-conversation [--socket PATH]\n"
	"Matches the demo conversation (model " DEMO_MODEL_ID ") in kvpalaced and\n"
	"verifies every byte of its KV. The socket defaults to $KVPALACE_SOCKET,\n"
	"else the default path.\n";

int main(int argc, char **argv)
{
	uint16_t want[DEMO_HEAD_DIM];
	const char *what = "";
	const char *verdict = "OK";
	uint64_t bytes = 0;
	uint64_t bad_rows = 0;
	uint64_t matched;
	uint64_t full; /* tokens in the conversation's full pages */
	uint64_t tail;
	struct demo d;
	kvp_lease *l;
	int ret;

	ret = demo_start(&d, argc, argv, "kvp-read-conversation", help);
	if (ret >= 0)
		return ret;
	/* Pins the longest cached prefix of the conversation under a lease. */
	what = "matching the conversation";
	ret = kvp_match_prefix(d.p, d.tokens, d.n, &l);
	if (ret < 0)
		goto fail;
	matched = kvp_lease_tokens(l);
	full = d.n / d.layout.block_tokens * d.layout.block_tokens;
	tail = d.n - full;
	if (!matched) {
		printf("miss: pool %" PRIu64 " holds no prefix of the %zu-token conversation "
		       "(run kvp-write-conversation first)\n",
		       kvp_pool_id(d.p), d.n);
		demo_end(&d);
		return 1;
	}

	for (uint64_t pos = 0; pos < matched; pos++) {
		for (uint32_t li = 0; li < d.layout.n_layers; li++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				for (uint32_t h = 0; h < d.layout.n_kv_heads; h++) {
					const void *row = kvp_lease_kv(l, pos, li, kv, h);

					demo_kv_row(want, pos, li, kv, h);
					if (!row || memcmp(row, want, sizeof(want)) != 0) {
						if (!bad_rows)
							fprintf(stderr,
								"first mismatch: token %" PRIu64
								" layer %u %s head %u\n",
								pos, li, kv ? "V" : "K", h);
						bad_rows++;
						continue;
					}
					bytes += sizeof(want);
				}
			}
		}
	}
	if (bad_rows)
		verdict = "MISMATCH";
	else if (matched != full)
		verdict = "PARTIAL";
	printf("matched %" PRIu64 " of %zu tokens in pool %" PRIu64 " (%" PRIu64 " full pages",
	       matched, d.n, kvp_pool_id(d.p), matched / d.layout.block_tokens);
	if (matched == full && tail)
		printf("; the last %" PRIu64 " tokens sit in a partial page, which is never shared",
		       tail);
	printf("), %" PRIu64 " bytes verified: %s\n", bytes, verdict);
	if (bad_rows)
		printf("%" PRIu64 " rows differ from what kvp-write-conversation writes\n",
		       bad_rows);
	what = "releasing the lease";
	ret = kvp_lease_release(l);
	if (ret < 0)
		goto fail;
	demo_end(&d);
	return bad_rows || matched != full ? 1 : 0;
fail:
	fprintf(stderr, "%s: %s: %s\n", d.prog, what, kvp_strerror(d.c, ret));
	demo_end(&d);
	return 1;
}
