/* tests/integration/test_async.c — submitting without waiting:
 * kvp_lookup_submit, kvp_prefetch_submit, kvp_complete and the client's
 * pollable socket (issue 18).
 *
 *  - Lookups submitted together complete with the answers kvp_lookup
 *    gives, each under its user_data, once the socket polls readable;
 *    nothing is readable and nothing completes when nothing is in flight.
 *  - Blocking calls made while lookups are in flight (a match, a ping,
 *    an append) get their own replies; the submitted ones' replies are
 *    kept and complete afterwards.
 *  - A batch longer than one request (4 KiB messages) completes after
 *    all its pieces; a batch of prompts shorter than a page completes
 *    without a request.
 *  - KVP_ASYNC_MAX in flight, then -EAGAIN until one completes.
 *  - Closing a pool drops its operations: the client goes on, nothing of
 *    them completes later.
 *  - A prefetch completes with the pages coming (none here).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "async-model"
#define BT    16
#define N_SEQ 8
#define LEN   200

static const struct kvp_layout layout = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

struct fixture {
	kvp_client *c;
	kvp_pool *p;
	uint32_t tokens[N_SEQ][LEN];
	struct kvp_lookup_query q[N_SEQ];
	uint64_t want[N_SEQ];
};

/* Sequences 0..N_SEQ-1 committed to lengths 16 * i + 20: lookups find
 * 16 * i + 16 tokens of each. */
static struct fixture *fixture(struct harness *h)
{
	struct fixture *f = calloc(1, sizeof(*f));
	kvp_session *s;

	assert_non_null(f);
	assert_int_equal(kvp_connect(h->sock, &f->c), 0);
	assert_int_equal(kvp_pool_open(f->c, MODEL, &layout, &f->p), 0);
	for (int i = 0; i < N_SEQ; i++) {
		harness_tokens(f->tokens[i], LEN, 10 + i, 0);
		assert_int_equal(harness_commit_session(f->p, f->tokens[i], 16 * i + 20, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
		f->q[i] = (struct kvp_lookup_query){.tokens = f->tokens[i], .n_tokens = LEN};
		assert_int_equal(kvp_lookup(f->p, f->tokens[i], LEN, &f->want[i]), 0);
		assert_int_equal(f->want[i], 16 * i + 16);
	}
	return f;
}

static int readable(kvp_client *c, int timeout_ms)
{
	struct pollfd pfd = {.fd = kvp_client_fd(c), .events = POLLIN};

	assert_true(pfd.fd >= 0);
	return poll(&pfd, 1, timeout_ms);
}

static void test_submit_poll_complete(void **state)
{
	struct fixture *f = fixture(*state);
	struct kvp_lookup_result r[N_SEQ];
	struct kvp_completion done[N_SEQ + 1];
	int seen[N_SEQ] = {0}, n = 0;

	assert_int_equal(kvp_complete(f->c, done, N_SEQ, 0), 0); /* nothing in flight */
	assert_int_equal(readable(f->c, 0), 0);
	for (int i = 0; i < N_SEQ; i++)
		assert_int_equal(kvp_lookup_submit(f->p, &f->q[i], 1, &r[i], 100 + i), 0);
	assert_int_equal(kvp_in_flight(f->c), N_SEQ);
	while (n < N_SEQ) {
		int got;

		assert_int_equal(readable(f->c, 10000), 1);
		got = kvp_complete(f->c, done + n, N_SEQ + 1 - n, 0);
		assert_true(got >= 0);
		n += got;
	}
	assert_int_equal(n, N_SEQ);
	for (int k = 0; k < n; k++) {
		int i = (int)done[k].user_data - 100;

		assert_true(i >= 0 && i < N_SEQ);
		assert_int_equal(done[k].op, KVP_ASYNC_LOOKUP);
		assert_int_equal(done[k].result, 0);
		assert_int_equal(seen[i]++, 0);
		assert_int_equal(r[i].matched_tokens, f->want[i]);
		assert_int_equal(r[i].host_tokens, f->want[i]);
	}
	assert_int_equal(kvp_in_flight(f->c), 0);
	assert_int_equal(kvp_complete(f->c, done, N_SEQ, 50), 0);

	/* Prompts all shorter than a page: complete without a request. */
	f->q[0].n_tokens = 5;
	assert_int_equal(kvp_lookup_submit(f->p, f->q, 1, r, 7), 0);
	assert_int_equal(kvp_complete(f->c, done, 4, -1), 1);
	assert_int_equal(done[0].user_data, 7);
	assert_int_equal(r[0].matched_tokens, 0);

	/* A prefetch's result is the pages coming: none without a disk. */
	assert_int_equal(kvp_prefetch_submit(f->p, f->tokens[3], LEN, 9), 0);
	assert_int_equal(kvp_complete(f->c, done, 4, 10000), 1);
	assert_int_equal(done[0].op, KVP_ASYNC_PREFETCH);
	assert_int_equal(done[0].result, 0);
	kvp_disconnect(f->c);
	free(f);
}

static void test_blocking_calls_between(void **state)
{
	struct fixture *f = fixture(*state);
	struct kvp_lookup_result r[N_SEQ];
	struct kvp_completion done[N_SEQ];
	kvp_session *s;
	kvp_lease *l;
	int n = 0;

	for (int i = 0; i < N_SEQ; i++)
		assert_int_equal(kvp_lookup_submit(f->p, &f->q[i], 1, &r[i], i), 0);
	/* The daemon answers in order: each blocking call below reads the
	 * lookups' replies first and keeps them. */
	assert_int_equal(kvp_ping(f->c), 0);
	assert_int_equal(kvp_match_prefix(f->p, f->tokens[5], LEN, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), f->want[5]);
	assert_int_equal(kvp_session_create(f->p, &s), 0);
	assert_int_equal(kvp_append(s, f->tokens[0], LEN), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_in_flight(f->c), N_SEQ);
	while (n < N_SEQ) {
		int got = kvp_complete(f->c, done + n, N_SEQ - n, 10000);

		assert_true(got > 0);
		n += got;
	}
	for (int k = 0; k < N_SEQ; k++) {
		assert_int_equal(done[k].result, 0);
		assert_int_equal(r[done[k].user_data].matched_tokens, f->want[done[k].user_data]);
	}
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(f->c);
	free(f);
}

static void test_limit_and_close(void **state)
{
	struct fixture *f = fixture(*state);
	struct kvp_lookup_result r[KVP_ASYNC_MAX + 1];
	struct kvp_completion done[4];
	kvp_pool *other;

	for (unsigned int i = 0; i < KVP_ASYNC_MAX; i++)
		assert_int_equal(kvp_lookup_submit(f->p, &f->q[i % N_SEQ], 1, &r[i], i), 0);
	assert_int_equal(kvp_lookup_submit(f->p, &f->q[0], 1, &r[KVP_ASYNC_MAX], 99), -EAGAIN);
	assert_int_equal(kvp_complete(f->c, done, 1, 10000), 1);
	assert_int_equal(kvp_lookup_submit(f->p, &f->q[0], 1, &r[KVP_ASYNC_MAX], 99), 0);

	/* A second handle of the same pool, closed with lookups in flight:
	 * they are dropped, the first handle's complete. */
	assert_int_equal(kvp_pool_open(f->c, MODEL, &layout, &other), 0);
	assert_int_equal(kvp_complete(f->c, done, 4, 10000), 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvp_lookup_submit(other, &f->q[i], 1, &r[i], 1000 + i), 0);
	kvp_pool_close(other);
	assert_int_equal(kvp_ping(f->c), 0);
	for (size_t left = kvp_in_flight(f->c); left;) {
		int got = kvp_complete(f->c, done, 4, 10000);

		assert_true(got > 0);
		for (int k = 0; k < got; k++)
			assert_true(done[k].user_data < 1000);
		left -= (size_t)got;
	}
	assert_int_equal(kvp_in_flight(f->c), 0);
	assert_int_equal(kvp_complete(f->c, done, 4, 100), 0);
	assert_int_equal(kvp_ping(f->c), 0);

	/* What is refused at once. */
	assert_int_equal(kvp_lookup_submit(NULL, f->q, 1, r, 0), -EINVAL);
	assert_int_equal(kvp_lookup_submit(f->p, f->q, 1, NULL, 0), -EINVAL);
	assert_int_equal(kvp_prefetch_submit(f->p, NULL, 3, 0), -EINVAL);
	assert_int_equal(kvp_complete(NULL, done, 1, 0), -EINVAL);
	assert_int_equal(kvp_client_fd(NULL), -EINVAL);
	kvp_disconnect(f->c);
	free(f);
}

static int setup_small_messages(void **state)
{
	static const char *const args[] = {"--max-message-bytes", "4096", NULL};

	return harness_setup_args(state, args);
}

#define LONG_N 3000

static void test_long_batch(void **state)
{
	struct harness *h = *state;
	uint32_t *t = calloc(LONG_N, sizeof(*t));
	struct kvp_lookup_query q[3];
	struct kvp_lookup_result r[3], sync[3];
	struct kvp_completion done;
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;

	assert_non_null(t);
	harness_tokens(t, LONG_N, 20, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(harness_commit_session(p, t, LONG_N - 100, &s), 0);
	q[0] = (struct kvp_lookup_query){.tokens = t, .n_tokens = LONG_N};
	q[1] = (struct kvp_lookup_query){.tokens = t, .n_tokens = 1000};
	q[2] = (struct kvp_lookup_query){.tokens = t + 1, .n_tokens = LONG_N - 1};
	assert_int_equal(kvp_lookup_batch(p, q, 3, sync), 0);
	assert_int_equal(sync[0].matched_tokens, harness_whole(LONG_N - 100, BT));
	assert_int_equal(kvp_lookup_submit(p, q, 3, r, 5), 0);
	assert_int_equal(kvp_complete(c, &done, 1, 10000), 1);
	assert_int_equal(done.result, 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(r[i].matched_tokens, sync[i].matched_tokens);
	kvp_disconnect(c);
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_submit_poll_complete, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_blocking_calls_between, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_limit_and_close, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_long_batch, setup_small_messages,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("async", tests, NULL, NULL);
}
