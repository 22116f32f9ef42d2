/* tests/integration/test_examples.c — the README's demo, end to end.
 *
 * kvp-read-conversation against an empty daemon must fail (nothing is
 * cached); after kvp-write-conversation it must succeed; and this process,
 * with the library and examples/demo_kv.h, reads the conversation back —
 * every full page: 1008 of its 1020 tokens — and checks every element
 * against the demo's formula, so the examples write what the header says
 * and the reader's success means something.
 */
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "demo_kv.h"
#include "harness.h"

static char out[1 << 16];

static int run(const char *env_name, struct harness *h)
{
	const char *bin = getenv(env_name);
	char *argv[] = {(char *)bin, "--socket", h->sock, NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, NULL, out, sizeof(out));
}

static void test_demo(void **state)
{
	struct harness *h = *state;
	size_t n = demo_n_tokens();
	uint32_t *tokens = calloc(n, sizeof(uint32_t));
	struct kvp_layout layout;
	uint16_t row[DEMO_HEAD_DIM];
	uint64_t bad = 0;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	int ret;

	assert_non_null(tokens);
	ret = run("KVP_READ_CONVERSATION", h);
	if (ret != 1)
		fail_msg("reader on an empty daemon exited %d: %s", ret, out);
	ret = run("KVP_WRITE_CONVERSATION", h);
	if (ret != 0)
		fail_msg("writer exited %d: %s", ret, out);
	ret = run("KVP_READ_CONVERSATION", h);
	if (ret != 0)
		fail_msg("reader exited %d: %s", ret, out);
	if (!strstr(out, "matched 1008 of 1020 tokens"))
		fail_msg("the reader says: %s", out);

	demo_tokens(tokens);
	demo_layout(&layout);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, DEMO_MODEL_ID, &layout, &p), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, n, &l), 0);
	assert_int_equal(n, 1020);
	assert_int_equal(kvp_lease_tokens(l), n / DEMO_BLOCK_TOKENS * DEMO_BLOCK_TOKENS);
	for (uint64_t pos = 0; pos < kvp_lease_tokens(l); pos++)
		for (uint32_t layer = 0; layer < DEMO_N_LAYERS; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < DEMO_N_KV_HEADS; head++) {
					const void *got = kvp_lease_kv(l, pos, layer, kv, head);

					demo_kv_row(row, pos, layer, kv, head);
					bad += !got || memcmp(got, row, sizeof(row)) != 0;
				}
	assert_int_equal(bad, 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	free(tokens);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_demo, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("examples", tests, NULL, NULL);
}
