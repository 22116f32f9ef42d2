/* tests/unit/test_trace_sim.c — the trace shapes and offline eviction
 * simulations kvp-bench-trace reports (bench/trace_gen.h,
 * bench/trace_sim.h).
 *
 * What the figures rely on: the production-like shape has the properties
 * it claims (one shared block on every request, most pages never used
 * again, next turns hundreds of requests later); a Mooncake trace's equal
 * hash ids are equal pages and a malformed line names its number;
 * leaf-LFU keeps a page used often through a scan of one-use pages that
 * leaf-LRU loses, and a ghost brings an evicted page's count back.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "trace_gen.h"
#include "trace_sim.h"

#define B 16u

static void prod_shape(void **state)
{
	struct trace_params p;
	struct trace t;
	struct trace_pages pg;
	uint32_t *first, *last, n_gaps = 0, never = 0, n_new;
	uint8_t *again;
	uint64_t gap_sum = 0;

	(void)state;
	assert_int_equal(trace_params_shape(&p, TRACE_SHAPE_PROD), 0);
	p.n_requests = 6000;
	assert_int_equal(trace_generate(&p, &t), 0);
	assert_int_equal(trace_pages_build(&t, B, &pg), 0);
	first = malloc(pg.n_pages * sizeof(*first));
	again = calloc(pg.n_pages, 1);
	last = malloc(t.n_convs * sizeof(*last));
	assert_non_null(first);
	assert_non_null(again);
	assert_non_null(last);
	memset(first, 0xff, pg.n_pages * sizeof(*first));
	for (uint32_t r = 0; r < t.n_reqs; r++) {
		const struct trace_req *q = &t.reqs[r];
		const uint32_t *ids = pg.conv[q->conv];

		/* The shared block: the same first two pages everywhere. */
		assert_true(q->prompt_tokens >= 2 * B);
		assert_int_equal(ids[0], pg.conv[t.reqs[0].conv][0]);
		assert_int_equal(ids[1], pg.conv[t.reqs[0].conv][1]);
		for (uint32_t i = 0; i < q->prompt_tokens / B; i++)
			if (first[ids[i]] < r)
				again[ids[i]] = 1;
		for (uint32_t i = 0; i < (q->prompt_tokens + q->reply_tokens) / B; i++)
			if (first[ids[i]] == UINT32_MAX)
				first[ids[i]] = r;
		if (q->turn) {
			gap_sum += r - last[q->conv];
			n_gaps++;
		}
		last[q->conv] = r;
	}
	for (uint32_t i = 0; i < pg.n_pages; i++)
		never += !again[i];
	n_new = pg.n_pages;
	/* About three quarters never used again; turns hundreds apart. */
	assert_true(never > n_new * 6 / 10 && never < n_new * 9 / 10);
	assert_true(n_gaps > 500);
	assert_true(gap_sum / n_gaps > 200);
	free(first);
	free(again);
	free(last);
	trace_pages_free(&pg);
	trace_free(&t);
}

static FILE *text_file(const char *s)
{
	FILE *f = tmpfile();

	assert_non_null(f);
	fputs(s, f);
	rewind(f);
	return f;
}

static void mooncake(void **state)
{
	FILE *f = text_file("{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 20, "
			    "\"hash_ids\": [0, 1, 2]}\n"
			    "\n"
			    "{\"timestamp\": 9, \"input_length\": 2048, \"output_length\": 300, "
			    "\"hash_ids\": [0, 1, 3, 4]}\n");
	struct trace t;
	struct trace_pages pg;
	uint32_t line = 0;

	(void)state;
	assert_int_equal(trace_read_mooncake(f, B, &t, &line), 0);
	fclose(f);
	assert_int_equal(t.n_reqs, 2);
	assert_int_equal(t.reqs[0].prompt_tokens, (1500 * B + 511) / 512);
	assert_int_equal(t.reqs[1].prompt_tokens, 4 * B);
	assert_int_equal(trace_pages_build(&t, B, &pg), 0);
	/* Hash ids 0, 1 are the same pages in both requests, 3 is not 2. */
	assert_int_equal(pg.conv[0][0], pg.conv[1][0]);
	assert_int_equal(pg.conv[0][1], pg.conv[1][1]);
	assert_int_not_equal(pg.conv[1][2], pg.conv[0][2]);
	trace_pages_free(&pg);
	trace_free(&t);

	f = text_file("{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
		      "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": \"x\"}\n");
	assert_int_equal(trace_read_mooncake(f, B, &t, &line), -EBADMSG);
	assert_int_equal(line, 2);
	fclose(f);
}

/* A trace by hand: conversation c is one page of its own (B tokens) and
 * one reply token; the requests name conversations in order. */
static void hand_trace(struct trace *t, uint32_t n_convs, const uint32_t *order, uint32_t n)
{
	memset(t, 0, sizeof(*t));
	trace_params_shape(&t->prm, TRACE_SHAPE_PROD);
	t->convs = calloc(n_convs, sizeof(*t->convs));
	t->reqs = calloc(n, sizeof(*t->reqs));
	assert_non_null(t->convs);
	assert_non_null(t->reqs);
	t->n_convs = n_convs;
	for (uint32_t c = 0; c < n_convs; c++) {
		t->convs[c].user = c;
		t->convs[c].n_tokens = B + 1;
		t->convs[c].tokens = malloc((B + 1) * sizeof(uint32_t));
		assert_non_null(t->convs[c].tokens);
		for (uint32_t i = 0; i <= B; i++)
			t->convs[c].tokens[i] = trace_token(7, c, i);
	}
	for (uint32_t r = 0; r < n; r++)
		t->reqs[r] = (struct trace_req){
			.user = order[r], .conv = order[r], .prompt_tokens = B, .reply_tokens = 1};
	t->n_reqs = n;
}

/* The last request's hit tokens under pol at capacity cap. */
static uint32_t last_hit(const struct trace *t, enum trace_policy pol, uint32_t cap,
			 const struct trace_lfu *lfu)
{
	struct trace_pages pg;
	struct trace_sim_result res;
	uint32_t *hits = malloc(t->n_reqs * sizeof(*hits)), h;

	assert_non_null(hits);
	assert_int_equal(trace_pages_build(t, B, &pg), 0);
	assert_int_equal(trace_sim_run_lfu(t, &pg, pol, cap, 1.0, 1.0, lfu, hits, &res), 0);
	assert_true(res.peak_pages <= cap);
	h = hits[t->n_reqs - 1];
	free(hits);
	trace_pages_free(&pg);
	return h;
}

static void lfu_survives_scan(void **state)
{
	/* Conversation 0 asked 6 times, then 30 one-use pages, then 0 again,
	 * with room for 8 pages (each request needs 2: its page and the
	 * partial one). */
	uint32_t order[6 + 30 + 1], n = 0;
	struct trace t;

	(void)state;
	for (int i = 0; i < 6; i++)
		order[n++] = 0;
	for (uint32_t c = 1; c <= 30; c++)
		order[n++] = c;
	order[n++] = 0;
	hand_trace(&t, 31, order, n);
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_LRU, 8, NULL), 0);
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_LFU, 8, NULL), B);
	assert_int_equal(last_hit(&t, TRACE_SIM_BELADY, 8, NULL), B);
	trace_free(&t);
}

static void window_survives_scan(void **state)
{
	/* Conversation 0 asked twice (its page used by a second request:
	 * main), then 30 one-use pages (probation), then 0 again, with room
	 * for 8 pages: probation holds more than 70 % of them as the scan
	 * goes, so it loses its own pages first and page 0 stays. With a
	 * window of the whole capacity (1000 per mille) probation never holds
	 * more than its share, main's leaf goes first, and page 0 is lost as
	 * under leaf-LRU. */
	uint32_t order[2 + 30 + 1], n = 0;
	struct trace_lfu all;
	struct trace t;

	(void)state;
	order[n++] = 0;
	order[n++] = 0;
	for (uint32_t c = 1; c <= 30; c++)
		order[n++] = c;
	order[n++] = 0;
	hand_trace(&t, 31, order, n);
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_LRU, 8, NULL), 0);
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_WIN, 8, NULL), B);
	trace_lfu_default(&all);
	all.window_permille = 1000;
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_WIN, 8, &all), 0);
	trace_free(&t);
}

static void ghost_remembers(void **state)
{
	/* Room for 6 pages (a request needs 2: its page and the partial
	 * one). Pages 1..4 asked 3 times each: counts 3, more than page 0's
	 * 2, so page 0 leaves for page 5; page 0 written again starts at 2 +
	 * 1 with its ghost, 1 without; then a scan of one-use pages (count 1)
	 * and page 0: with the ghost it outranks them and stays, without it
	 * is the oldest of the lowest count and leaves first. */
	uint32_t order[64], n = 0;
	struct trace_lfu with, without;
	struct trace t;

	(void)state;
	order[n++] = 0;
	order[n++] = 0;
	for (int k = 0; k < 3; k++)
		for (uint32_t c = 1; c <= 4; c++)
			order[n++] = c;
	order[n++] = 5; /* room: 0 is the lowest count, it goes */
	order[n++] = 0; /* back: a miss, written again */
	for (uint32_t c = 6; c <= 12; c++)
		order[n++] = c;
	order[n++] = 0;
	hand_trace(&t, 13, order, n);
	trace_lfu_default(&with);
	without = with;
	without.ghost_per_page = 0;
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_LFU, 6, &with), B);
	assert_int_equal(last_hit(&t, TRACE_SIM_LEAF_LFU, 6, &without), 0);
	trace_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(prod_shape),		cmocka_unit_test(mooncake),
		cmocka_unit_test(lfu_survives_scan),	cmocka_unit_test(ghost_remembers),
		cmocka_unit_test(window_survives_scan),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
