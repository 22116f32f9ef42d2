/* tests/integration/test_engineapi.c — the small calls an engine needs
 * before anything else (issue 18): versions, named model layouts, and a
 * client inherited across fork().
 *
 *  - kvp_version() is the project's version, and its three numbers are
 *    the string's; kvp_server_version() is what the daemon's Hello said
 *    ("kvpalaced <version>").
 *  - kvp_layout_named() gives published config.json numbers for a few
 *    models (by short name, any case, and by Hugging Face id), -ENOENT
 *    for an unknown one; every listed entry is a layout the daemon
 *    accepts (each opens a pool), names are unique.
 *  - After fork() the child's copy of the parent's client refuses with
 *    -ECHILD (and says why) instead of sharing the socket; the child's
 *    own client matches and reads the parent's prefix byte for byte; the
 *    child disconnecting its copy leaves the parent's connection, its
 *    session and its lease intact.
 *  - Block tables of sessions and leases give kvp_*_page's addresses and
 *    slots for a run of pages in one call; the arena's base, size and
 *    memfd (for cudaHostRegister, pread) agree with them.
 *  - Tensor-parallel ranks (kvp_pool_open_opts) each get a pool of their
 *    own: a rank never reads another's heads behind the same tokens.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define N_TOKENS    100 /* six pages of 16 and a partial one */
#define N_COMMITTED 90	/* before the fork: five whole pages */

static void test_versions(void **state)
{
	struct harness *h = *state;
	unsigned int major = 99, minor = 99, patch = 99;
	char want[64];
	kvp_client *c;

	assert_string_equal(kvp_version(&major, &minor, &patch), KVP_VERSION);
	snprintf(want, sizeof(want), "%u.%u.%u", major, minor, patch);
	assert_string_equal(want, KVP_VERSION);
	assert_non_null(kvp_version(NULL, NULL, NULL));
	assert_null(kvp_server_version(NULL));

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	snprintf(want, sizeof(want), "kvpalaced %s", KVP_VERSION);
	assert_string_equal(kvp_server_version(c), want);
	kvp_disconnect(c);
}

static void expect_layout(const char *name, uint32_t layers, uint32_t kv_heads, uint32_t dim)
{
	struct kvp_layout l;

	assert_int_equal(kvp_layout_named(name, KVP_DTYPE_BF16, 16, &l), 0);
	assert_int_equal(l.n_layers, layers);
	assert_int_equal(l.n_kv_heads, kv_heads);
	assert_int_equal(l.head_dim, dim);
	assert_int_equal(l.block_tokens, 16);
	assert_int_equal(l.dtype, KVP_DTYPE_BF16);
	assert_int_equal(l.quant_group, 0);
}

static void test_named_layouts(void **state)
{
	struct harness *h = *state;
	struct kvp_layout l;
	const char *name, *hf, *other;
	kvp_client *c;
	kvp_pool *p;
	size_t i, j;

	/* From the published config.json files. */
	expect_layout("llama-3-8b", 32, 8, 128);
	expect_layout("LLaMA-3-70B", 80, 8, 128);
	expect_layout("meta-llama/Meta-Llama-3-8B", 32, 8, 128);
	expect_layout("llama-3.1-405b", 126, 8, 128);
	expect_layout("llama-2-7b", 32, 32, 128);
	expect_layout("qwen2.5-7b", 28, 4, 128);
	expect_layout("gemma-2-9b", 42, 8, 256);
	expect_layout("phi-3-mini", 32, 32, 96);
	expect_layout("stories260k", 5, 4, 8);

	assert_int_equal(kvp_layout_named("llama-3-8b", KVP_DTYPE_INT8, 16, &l), 0);
	assert_int_equal(l.quant_group, 32);
	assert_int_equal(kvp_layout_named("stories260k", KVP_DTYPE_INT4, 16, &l), 0);
	assert_int_equal(l.quant_group, 8);
	assert_int_equal(kvp_layout_named("llama-3-9b", KVP_DTYPE_F16, 16, &l), -ENOENT);
	assert_int_equal(kvp_layout_named("", KVP_DTYPE_F16, 16, &l), -ENOENT);
	assert_int_equal(kvp_layout_named(NULL, KVP_DTYPE_F16, 16, &l), -EINVAL);
	assert_int_equal(kvp_layout_named("llama-3-8b", KVP_DTYPE_F16, 16, NULL), -EINVAL);

	/* Every entry is one the daemon takes, under its own name; one
	 * token a page keeps the arenas of the big ones small. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	for (i = 0; (name = kvp_layout_name(i, &hf)); i++) {
		assert_non_null(hf);
		for (j = 0; j < i; j++) {
			other = kvp_layout_name(j, NULL);
			assert_true(strcasecmp(name, other) != 0);
		}
		assert_int_equal(kvp_layout_named(hf, KVP_DTYPE_F16, 1, &l), 0);
		assert_int_equal(kvp_pool_open(c, name, &l, &p), 0);
		kvp_pool_close(p);
	}
	assert_true(i >= 15);
	assert_null(kvp_layout_name(i, &hf));
	kvp_disconnect(c);
}

struct forked {
	struct harness *h;
	kvp_client *c; /* the parent's, inherited */
	kvp_pool *p;
	uint32_t tokens[N_TOKENS];
	struct kvp_layout layout;
};

static int child(void *arg)
{
	struct forked *f = arg;
	kvp_lease *l = NULL;
	kvp_client *own;
	kvp_pool *p;
	uint64_t whole = harness_whole(N_COMMITTED, f->layout.block_tokens);

	/* The inherited client refuses, and says why. */
	CHILD_CHECK_EQ(kvp_ping(f->c), -ECHILD);
	if (!strstr(kvp_strerror(f->c, -ECHILD), "fork"))
		return 2;
	CHILD_CHECK_EQ(kvp_match_prefix(f->p, f->tokens, N_TOKENS, &l), -ECHILD);
	CHILD_CHECK_EQ(kvp_pool_open(f->c, "engineapi", &f->layout, &p), -ECHILD);
	/* Dropping the copy closes only the child's socket. */
	kvp_disconnect(f->c);

	CHILD_CHECK_EQ(kvp_connect(f->h->sock, &own), 0);
	CHILD_CHECK_EQ(kvp_pool_open(own, "engineapi", &f->layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, f->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), whole);
	CHILD_CHECK_EQ(harness_check_lease(l, p, f->tokens, whole), 0);
	kvp_disconnect(own);
	return 0;
}

static void test_fork(void **state)
{
	struct forked *f = calloc(1, sizeof(*f));
	uint64_t whole;
	kvp_session *s;
	kvp_lease *l;

	assert_non_null(f);
	f->h = *state;
	assert_int_equal(kvp_layout_named("stories260k", KVP_DTYPE_F16, 16, &f->layout), 0);
	whole = harness_whole(N_COMMITTED, f->layout.block_tokens);
	harness_tokens(f->tokens, N_TOKENS, 3, 0);
	assert_int_equal(kvp_connect(f->h->sock, &f->c), 0);
	assert_int_equal(kvp_pool_open(f->c, "engineapi", &f->layout, &f->p), 0);
	assert_int_equal(harness_commit_session(f->p, f->tokens, N_COMMITTED, &s), 0);
	assert_int_equal(kvp_match_prefix(f->p, f->tokens, N_TOKENS, &l), 0);

	assert_int_equal(harness_run_child(child, f), 0);

	/* The parent's connection, lease and session are as they were. */
	assert_int_equal(kvp_ping(f->c), 0);
	assert_int_equal(kvp_lease_tokens(l), whole);
	assert_int_equal(harness_check_lease(l, f->p, f->tokens, whole), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_append(s, f->tokens + N_COMMITTED, N_TOKENS - N_COMMITTED), 0);
	assert_int_equal(harness_write_session(f->p, s, N_COMMITTED, f->tokens + N_COMMITTED,
					       N_TOKENS - N_COMMITTED),
			 0);
	assert_int_equal(kvp_commit(s, N_TOKENS - N_COMMITTED), 0);
	assert_int_equal(kvp_session_committed(s), N_TOKENS);
	kvp_disconnect(f->c);
	free(f);
}

/* Block tables and the arena: every address is the one kvp_*_page
 * gives, every slot lands on it through the arena's base, and the memfd
 * at fd_offset holds the same bytes. */
static void test_block_tables(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[N_TOKENS], slots[8];
	void *bases[8];
	struct kvp_page_view v;
	struct kvp_layout layout;
	struct kvp_arena a;
	unsigned char *buf;
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	assert_int_equal(kvp_layout_named("stories260k", KVP_DTYPE_F16, 16, &layout), 0);
	harness_tokens(tokens, N_TOKENS, 4, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "engineapi-bt", &layout, &p), 0);
	assert_int_equal(kvp_pool_arena(p, &a), 0);
	assert_int_equal(a.page_bytes, kvp_pool_page_bytes(p));
	assert_int_equal(a.n_pages, kvp_pool_n_pages(p));
	assert_int_equal(a.bytes, (size_t)a.n_pages * a.page_bytes);
	assert_true(a.fd >= 0);
	buf = malloc(a.page_bytes);
	assert_non_null(buf);

	assert_int_equal(harness_commit_session(p, tokens, N_TOKENS, &s), 0);
	/* 100 tokens: six whole pages and a partial seventh. */
	assert_int_equal(kvp_session_block_table(s, 0, 7, bases, slots), 0);
	for (int i = 0; i < 7; i++) {
		assert_int_equal(kvp_session_page(s, i, &v), 0);
		assert_ptr_equal(bases[i], v.base);
		assert_int_equal(slots[i], v.slot);
		assert_ptr_equal((unsigned char *)a.base + (size_t)slots[i] * a.page_bytes,
				 bases[i]);
	}
	assert_int_equal(kvp_session_block_table(s, 7, 1, bases, NULL), -ERANGE);
	assert_int_equal(kvp_session_block_table(s, 5, 3, bases, NULL), -ERANGE);
	assert_int_equal(kvp_session_block_table(s, 7, 0, NULL, NULL), 0);
	assert_int_equal(kvp_session_block_table(s, 0, 1, NULL, NULL), -EINVAL);

	assert_int_equal(kvp_match_prefix(p, tokens, N_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_block_table(l, 2, 4, NULL, slots), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvp_lease_page(l, 2 + i, &v), 0);
		assert_int_equal(slots[i], v.slot);
		/* The file holds what the mapping shows. */
		assert_int_equal(pread(a.fd, buf, a.page_bytes,
				       (off_t)(a.fd_offset + (uint64_t)slots[i] * a.page_bytes)),
				 (ssize_t)a.page_bytes);
		assert_memory_equal(buf, v.base, v.data_bytes);
	}
	assert_int_equal(kvp_lease_block_table(l, 0, 7, bases, NULL), -ERANGE); /* whole only */
	assert_int_equal(kvp_lease_block_table(NULL, 0, 1, bases, NULL), -EINVAL);
	assert_int_equal(kvp_pool_arena(NULL, &a), -EINVAL);
	assert_int_equal(kvp_lease_release(l), 0);
	free(buf);
	kvp_disconnect(c);
}

/* Tensor-parallel ranks: rank 1's pages (in a child) never meet rank
 * 0's, though tokens and per-rank layout are the same; each rank's match
 * reads its own; one process of the user sees both pools. */
struct ranks {
	struct harness *h;
	struct kvp_layout layout;
	uint32_t tokens[N_TOKENS];
};

static int rank_one(void *arg)
{
	struct ranks *r = arg;
	struct kvp_pool_opts o = {.tp_rank = 1, .tp_size = 2};
	uint64_t got = 1;
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(r->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &p), 0);
	CHILD_CHECK_EQ(kvp_lookup(p, r->tokens, N_TOKENS, &got), 0);
	CHILD_CHECK_EQ(got, 0); /* rank 0 committed; nothing of it here */
	/* Rank 1's K/V: the prefix formula of other tokens, so a page of
	 * rank 0's would read wrong. */
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, r->tokens, N_TOKENS, &s), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, r->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 96);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, r->tokens, 96), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_tp_ranks(void **state)
{
	struct ranks *r = calloc(1, sizeof(*r));
	struct kvp_pool_opts o = {.tp_rank = 0, .tp_size = 2};
	struct kvp_stats *st;
	char long_id[130];
	uint64_t got;
	kvp_client *c;
	kvp_pool *p0, *p1, *plain;
	kvp_session *s;
	kvp_lease *l;
	int seen = 0;

	assert_non_null(r);
	r->h = *state;
	assert_int_equal(kvp_layout_named("stories260k", KVP_DTYPE_F16, 16, &r->layout), 0);
	r->layout.n_kv_heads /= 2; /* each rank holds half the heads */
	harness_tokens(r->tokens, N_TOKENS, 6, 0);
	assert_int_equal(kvp_connect(r->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &p0), 0);
	assert_int_equal(harness_commit_session(p0, r->tokens, N_TOKENS, &s), 0);
	assert_int_equal(harness_run_child(rank_one, r), 0);

	/* Rank 0 still reads its own bytes. */
	assert_int_equal(kvp_match_prefix(p0, r->tokens, N_TOKENS, &l), 0);
	assert_int_equal(harness_check_lease(l, p0, r->tokens, 96), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* One process sees both ranks' pools; the plain name is a third. */
	o.tp_rank = 1;
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &p1), 0);
	assert_true(kvp_pool_id(p1) != kvp_pool_id(p0));
	assert_int_equal(kvp_lookup(p1, r->tokens, N_TOKENS, &got), 0);
	assert_int_equal(got, 96);
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, NULL, &plain), 0);
	assert_int_equal(kvp_lookup(plain, r->tokens, N_TOKENS, &got), 0);
	assert_int_equal(got, 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	for (size_t i = 0; i < st->n_pools; i++)
		seen += !strcmp(st->pools[i].model_id, "engineapi-tp#tp0/2") +
			!strcmp(st->pools[i].model_id, "engineapi-tp#tp1/2");
	assert_int_equal(seen, 2);
	kvp_stats_free(st);

	/* Refused, with a reason. */
	o = (struct kvp_pool_opts){.tp_rank = 2, .tp_size = 2};
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &plain), -EINVAL);
	assert_non_null(strstr(kvp_strerror(c, -EINVAL), "tp_rank"));
	o = (struct kvp_pool_opts){.tp_rank = 1, .tp_size = 0};
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &plain), -EINVAL);
	o = (struct kvp_pool_opts){.tp_rank = 0, .tp_size = 4096};
	assert_int_equal(kvp_pool_open_opts(c, "engineapi-tp", &r->layout, &o, &plain), -EINVAL);
	memset(long_id, 'm', 122);
	long_id[122] = 0; /* 122 + "#tp0/2" = 128 bytes: one too many */
	o = (struct kvp_pool_opts){.tp_rank = 0, .tp_size = 2};
	assert_int_equal(kvp_pool_open_opts(c, long_id, &r->layout, &o, &plain), -EINVAL);
	long_id[121] = 0;
	assert_int_equal(kvp_pool_open_opts(c, long_id, &r->layout, &o, &plain), 0);
	assert_int_equal(kvp_pool_open_opts(c, "", &r->layout, &o, &plain), -EINVAL);
	kvp_disconnect(c);
	free(r);
}

/* A pool for every named model: more than the default 16 per tenant. */
static int setup_many_pools(void **state)
{
	static const char *const args[] = {"--max-pools-per-tenant", "64", NULL};

	return harness_setup_args(state, args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_versions, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_named_layouts, setup_many_pools,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_fork, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_block_tables, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_tp_ranks, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("engineapi", tests, NULL, NULL);
}
