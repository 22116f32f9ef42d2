/* tests/integration/test_share.c — sharing between processes, isolation
 * between pools and tenants.
 *
 * Process A appends 1000 tokens of deterministic K/V and commits, then
 * exits. Process B, with its own connection, opens the same model and
 * layout, gets the same pool, matches the prefix — whole pages: 992 of the
 * 1000 tokens, the partial last page is A's alone — and reads back
 * identical bytes for every token, layer, K/V and head. A pool of another model id,
 * or another layout, matches nothing; a process of another user (uid
 * 65534, when the tests run as root) opening the same model and layout gets
 * a pool of its own that matches nothing, cannot reach A's pool by id nor
 * open the admin socket; the admin sees both users' pools.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "demo_kv.h"
#include "harness.h"

#define N_TOKENS 1000
#define MODEL	 "share-model-7b"
#define SEQ	 1
/* What a match can return: whole pages of 16. */
#define WHOLE(n) ((n) / 16 * 16)

/* The demo's model shape: 4 layers, 2 KV heads, head_dim 64, 16 tokens. */
static struct kvp_layout layout;

struct share {
	struct harness *h;
	uint32_t tokens[N_TOKENS + 64];
	int pipe_fd;	  /* A writes its pool id here */
	uint64_t pool_id; /* A's pool, known to the parent after A ran */
};

static int writer_a(void *arg)
{
	struct share *sh = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_row_bytes(p), 64 * 2);
	CHILD_CHECK_EQ(kvp_pool_page_bytes(p), 4 * 2 * 2 * 16 * 64 * 2);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, sh->tokens, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_session_tokens(s), N_TOKENS);
	CHILD_CHECK_EQ(kvp_session_committed(s), 0);
	/* Past the reservation there is nothing to write to. */
	CHILD_CHECK(kvp_session_kv(s, N_TOKENS, 0, 0, 0) == NULL);
	CHILD_CHECK(kvp_session_kv(s, 0, layout.n_layers, 0, 0) == NULL);
	CHILD_CHECK(kvp_session_kv(s, 0, 0, 2, 0) == NULL);
	CHILD_CHECK(kvp_session_kv(s, 0, 0, 0, layout.n_kv_heads) == NULL);
	CHILD_CHECK_EQ(harness_write_session(p, s, 0, sh->tokens, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_session_committed(s), N_TOKENS);
	{
		uint64_t id = kvp_pool_id(p);

		CHILD_CHECK(write(sh->pipe_fd, &id, sizeof(id)) == (ssize_t)sizeof(id));
	}
	/* Disconnecting leaves the committed session in the daemon. */
	kvp_disconnect(c);
	return 0;
}

/* Matches `tokens` and checks the lease covers `want` tokens with A's
 * bytes. */
static int match_and_check(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t want)
{
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_match_prefix(p, tokens, n, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), want);
	CHILD_CHECK_EQ(harness_check_lease(l, p, tokens, want), 0);
	CHILD_CHECK(kvp_lease_kv(l, want, 0, 0, 0) == NULL);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	return 0;
}

static int reader_b(void *arg)
{
	struct share *sh = arg;
	uint32_t *q = malloc(sizeof(sh->tokens));
	struct kvp_layout other_layout = layout;
	kvp_client *c;
	kvp_pool *p, *other_model, *other_shape;
	kvp_lease *l;

	CHILD_CHECK(q != NULL);
	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_id(p), sh->pool_id);

	/* Every full page, byte for byte: 62 pages of 16, not the 8 tokens
	 * of A's partial last page. */
	CHILD_CHECK_EQ(match_and_check(p, sh->tokens, N_TOKENS, WHOLE(N_TOKENS)), 0);
	CHILD_CHECK_EQ(WHOLE(N_TOKENS), 992);
	/* A longer prompt matches what is cached. */
	CHILD_CHECK_EQ(match_and_check(p, sh->tokens, N_TOKENS + 64, WHOLE(N_TOKENS)), 0);
	/* A prompt that diverges at 600 (mid-page) matches the pages before
	 * the one it differs in: 592. */
	memcpy(q, sh->tokens, sizeof(sh->tokens));
	q[600] ^= 1;
	CHILD_CHECK_EQ(match_and_check(p, q, N_TOKENS, 592), 0);
	/* Diverging at the first token of a page keeps every page before. */
	memcpy(q, sh->tokens, sizeof(sh->tokens));
	q[608] ^= 1;
	CHILD_CHECK_EQ(match_and_check(p, q, N_TOKENS, 608), 0);
	/* ...and at its last token loses that page. */
	memcpy(q, sh->tokens, sizeof(sh->tokens));
	q[607] ^= 1;
	CHILD_CHECK_EQ(match_and_check(p, q, N_TOKENS, 592), 0);
	/* A short prompt inside the cached prefix: its full pages. */
	CHILD_CHECK_EQ(match_and_check(p, sh->tokens, 17, 16), 0);
	CHILD_CHECK_EQ(match_and_check(p, sh->tokens, 16, 16), 0);
	/* Less than a page is always a miss. */
	CHILD_CHECK_EQ(match_and_check(p, sh->tokens, 15, 0), 0);
	/* A prompt that differs at its first token matches nothing. */
	harness_tokens(q, N_TOKENS, 99, 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, q, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK(kvp_lease_kv(l, 0, 0, 0, 0) == NULL);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);

	/* Another model id with the same layout: another pool, no match. */
	CHILD_CHECK_EQ(kvp_pool_open(c, "another-model", &layout, &other_model), 0);
	CHILD_CHECK(kvp_pool_id(other_model) != sh->pool_id);
	CHILD_CHECK_EQ(kvp_match_prefix(other_model, sh->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);

	/* The same model id with another layout: another pool, no match. */
	other_layout.block_tokens = 32;
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &other_layout, &other_shape), 0);
	CHILD_CHECK(kvp_pool_id(other_shape) != sh->pool_id);
	CHILD_CHECK(kvp_pool_id(other_shape) != kvp_pool_id(other_model));
	CHILD_CHECK_EQ(kvp_match_prefix(other_shape, sh->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);

	kvp_disconnect(c);
	free(q);
	return 0;
}

static int other_user(void *arg)
{
	struct share *sh = arg;
	struct kvp_stats *st;
	struct raw r;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;
	uint64_t sid;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	/* The admin socket is root's alone. */
	CHILD_CHECK_EQ(kvp_connect(sh->h->admin_sock, &c), -EACCES);
	CHILD_CHECK_EQ(kvp_connect(sh->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK(kvp_pool_id(p) != sh->pool_id);
	CHILD_CHECK_EQ(kvp_match_prefix(p, sh->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);

	/* Its statistics show its own pool only. */
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK(harness_find_pool(st, sh->pool_id) == NULL);
	CHILD_CHECK(harness_find_pool(st, kvp_pool_id(p)) != NULL);
	for (size_t i = 0; i < st->n_pools; i++)
		CHILD_CHECK_EQ(st->pools[i].uid, 65534);
	kvp_stats_free(st);
	kvp_disconnect(c);

	/* Naming A's pool by its id over the wire does not reach it. */
	CHILD_CHECK_EQ(raw_open(&r, sh->h->sock), 0);
	{
		uint64_t mine;

		CHILD_CHECK_EQ(raw_open_pool(&r, MODEL, &layout, &mine), 0);
		CHILD_CHECK(mine != sh->pool_id);
	}
	CHILD_CHECK_EQ(raw_create_session(&r, sh->pool_id, &sid), -ENOENT);
	{
		Kvpalace__V1__Request req;
		Kvpalace__V1__MatchPrefixRequest mp;
		Kvpalace__V1__Response *resp;

		raw_req_match(&req, &mp, sh->pool_id, sh->tokens, 64);
		CHILD_CHECK_EQ(raw_call(&r, &req, &resp, NULL), 1);
		CHILD_CHECK_EQ(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);
		CHILD_CHECK(resp->op_case != KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX ||
			    resp->match_prefix->matched_tokens == 0);
	}
	raw_close(&r);
	return 0;
}

static void run_writer(struct share *sh)
{
	int p[2];

	assert_int_equal(pipe(p), 0);
	sh->pipe_fd = p[1];
	assert_int_equal(harness_run_child(writer_a, sh), 0);
	close(p[1]);
	assert_int_equal(read(p[0], &sh->pool_id, sizeof(sh->pool_id)), sizeof(sh->pool_id));
	close(p[0]);
	assert_true(sh->pool_id != 0);
}

static void test_two_processes_share_bytes(void **state)
{
	struct share *sh = calloc(1, sizeof(*sh));

	assert_non_null(sh);
	sh->h = *state;
	harness_tokens(sh->tokens, N_TOKENS + 64, SEQ, 0);
	run_writer(sh);
	assert_int_equal(harness_run_child(reader_b, sh), 0);
	/* A second reader after the first one left sees the same. */
	assert_int_equal(harness_run_child(reader_b, sh), 0);
	free(sh);
}

static void test_other_user_sees_nothing(void **state)
{
	struct share *sh = calloc(1, sizeof(*sh));

	assert_non_null(sh);
	if (geteuid() != 0) {
		free(sh);
		skip(); /* needs root to become another user */
	}
	sh->h = *state;
	harness_tokens(sh->tokens, N_TOKENS + 64, SEQ, 0);
	run_writer(sh);
	assert_int_equal(harness_run_child(other_user, sh), 0);
	/* And A's data is still there for A's user. */
	assert_int_equal(harness_run_child(reader_b, sh), 0);
	/* The admin sees both users' pools. */
	{
		struct kvp_stats *st;
		kvp_client *c;
		int uids = 0;

		assert_int_equal(kvp_connect(sh->h->admin_sock, &c), 0);
		assert_int_equal(kvp_is_admin(c), 1);
		assert_int_equal(kvp_stats(c, &st), 0);
		assert_non_null(harness_find_pool(st, sh->pool_id));
		for (size_t i = 0; i < st->n_pools; i++)
			uids |= st->pools[i].uid == 0 ? 1 : st->pools[i].uid == 65534 ? 2 : 4;
		assert_int_equal(uids, 3);
		kvp_stats_free(st);
		kvp_disconnect(c);
	}
	free(sh);
}

int main(void)
{
	demo_layout(&layout);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_two_processes_share_bytes, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_other_user_sees_nothing, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("share", tests, NULL, NULL);
}
