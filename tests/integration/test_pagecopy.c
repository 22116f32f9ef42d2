/* tests/integration/test_pagecopy.c — copying whole pages in and out
 * through the arena's file (kvp_session_write, kvp_lease_read,
 * KVP_APPEND_NO_PREFAULT) and free memory kept ready for writers
 * (pool_warm, daemon/core/pool.h); issue 17, item 3.
 *
 *  - Process A appends without prefault and writes every page with
 *    kvp_session_write from buffers laid out as the page: even pages in
 *    one call, odd pages one (layer, K|V) run per call at its offset, the
 *    partial last page only its tokens' rows; kvp_session_kv sees the
 *    rows before the commit; the writes mapped nothing in A (its shared
 *    memory resident did not grow by the pages written); ranges past
 *    the session or the page are -ERANGE, committed pages -EROFS.
 *  - Process B, fresh, reads every page with kvp_lease_read, whole and
 *    at offsets, and checks every row; ranges past the lease are -ERANGE.
 *  - After a writer took pages of a fresh pool, the daemon allocates the
 *    memory of the next free pages (the arena memfd's allocated blocks),
 *    no more than the documented 1/32 of the pool beyond what is held,
 *    and the next writer's pages are among them: writing them allocates
 *    nothing new (the warm-up's lower bound moves by at most the pages
 *    of the next job).
 *  - On a hugetlb arena (only where huge pages are reserved: skipped
 *    elsewhere) kvp_session_write still writes, though hugetlbfs has no
 *    write(2).
 */
#include <dirent.h>
#include <errno.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	 "pagecopy-model"
#define N_TOKENS 200 /* 12 pages and a half of 16 */
#define SEQ	 11

static const struct kvp_layout layout = {
	.n_layers = 3,
	.n_kv_heads = 2,
	.head_dim = 32,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

struct pc {
	struct harness *h;
	uint32_t tokens[N_TOKENS];
};

/* Page pg of the sequence as the page's bytes: every token's rows where
 * the view's strides put them (rows past a partial page's tokens zero). */
static unsigned char *page_image(const struct kvp_page_view *v, const uint32_t *tokens)
{
	unsigned char *b = calloc(1, v->page_bytes);

	if (!b)
		return NULL;
	for (uint32_t layer = 0; layer < layout.n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < layout.n_kv_heads; h++)
				for (uint32_t t = 0; t < v->n_tokens; t++)
					harness_kv_fill((uint16_t *)(b + layer * v->layer_stride +
								     kv * v->kv_stride +
								     h * v->head_stride +
								     t * v->token_stride),
							layout.head_dim, tokens[v->first_pos + t],
							v->first_pos + t, layer, kv, h);
	return b;
}

static int writer(void *arg)
{
	struct pc *x = arg;
	uint64_t pages = (N_TOKENS + 15) / 16, last = pages - 1;
	struct kvp_page_view v;
	unsigned char *img;
	long rss0, rss1;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append_tier(s, x->tokens, 10, KVP_TIER_HOST, 4u), -EINVAL);
	rss0 = harness_proc_kb(getpid(), "RssShmem");
	CHILD_CHECK_EQ(
		kvp_append_tier(s, x->tokens, N_TOKENS, KVP_TIER_HOST, KVP_APPEND_NO_PREFAULT), 0);
	for (uint64_t pg = 0; pg < pages; pg++) {
		CHILD_CHECK_EQ(kvp_session_page(s, pg, &v), 0);
		img = page_image(&v, x->tokens);
		CHILD_CHECK(img != NULL);
		if (pg == last) {
			/* Only the rows of its tokens: one call per head. */
			for (uint32_t layer = 0; layer < layout.n_layers; layer++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t h = 0; h < layout.n_kv_heads; h++) {
						size_t off = layer * v.layer_stride +
							     kv * v.kv_stride + h * v.head_stride;

						CHILD_CHECK_EQ(
							kvp_session_write(s, pg, off, img + off,
									  v.n_tokens * v.row_bytes),
							0);
					}
		} else if (pg % 2 == 0) {
			CHILD_CHECK_EQ(kvp_session_write(s, pg, 0, img, v.data_bytes), 0);
		} else {
			for (uint32_t layer = 0; layer < layout.n_layers; layer++)
				for (uint32_t kv = 0; kv < 2; kv++) {
					size_t off = layer * v.layer_stride + kv * v.kv_stride;

					CHILD_CHECK_EQ(kvp_session_write(s, pg, off, img + off,
									 v.kv_stride),
						       0);
				}
		}
		free(img);
	}
	/* Not through this process's mapping: its page tables hold none of
	 * the pages (an append with prefault would have mapped all). */
	rss1 = harness_proc_kb(getpid(), "RssShmem");
	CHILD_CHECK(rss0 >= 0 && rss1 >= 0);
	CHILD_CHECK((uint64_t)(rss1 - rss0) * 1024 < pages * kvp_pool_page_bytes(p) / 2);
	/* ...yet the rows are where kvp_session_kv points. */
	for (uint64_t pos = 0; pos < N_TOKENS; pos++)
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < layout.n_kv_heads; h++)
					CHILD_CHECK_EQ(harness_kv_check(
							       kvp_session_kv(s, pos, layer, kv, h),
							       layout.head_dim, x->tokens[pos], pos,
							       layer, kv, h),
						       0);

	/* Bounds. */
	CHILD_CHECK_EQ(kvp_session_page(s, 0, &v), 0);
	CHILD_CHECK_EQ(kvp_session_write(s, pages, 0, x->tokens, 4), -ERANGE);
	CHILD_CHECK_EQ(kvp_session_write(s, 0, v.page_bytes - 1, x->tokens, 2), -ERANGE);
	CHILD_CHECK_EQ(kvp_session_write(s, 0, UINT64_MAX, x->tokens, 1), -ERANGE);
	CHILD_CHECK_EQ(kvp_session_write(s, 0, 8, x->tokens, SIZE_MAX), -ERANGE);
	CHILD_CHECK_EQ(kvp_session_write(s, 0, v.page_bytes, NULL, 0), 0);
	CHILD_CHECK_EQ(kvp_session_write(s, 0, 0, NULL, 4), -EINVAL);
	CHILD_CHECK_EQ(kvp_session_write(NULL, 0, 0, x->tokens, 4), -EINVAL);

	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS), 0);
	/* Committed K/V is other processes' to read: not through here. */
	CHILD_CHECK_EQ(kvp_session_write(s, 0, 0, x->tokens, 4), -EROFS);
	CHILD_CHECK_EQ(kvp_session_write(s, last, 0, x->tokens, 4), -EROFS);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	kvp_disconnect(c);
	return 0;
}

static int reader(void *arg)
{
	struct pc *x = arg;
	uint64_t whole = N_TOKENS / 16;
	struct kvp_page_view v;
	unsigned char *buf, *want;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, x->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), whole * 16);
	buf = malloc(kvp_pool_page_bytes(p));
	CHILD_CHECK(buf != NULL);
	for (uint64_t pg = 0; pg < whole; pg++) {
		CHILD_CHECK_EQ(kvp_lease_page(l, pg, &v), 0);
		want = page_image(&v, x->tokens);
		CHILD_CHECK(want != NULL);
		memset(buf, 0xa5, v.data_bytes);
		CHILD_CHECK_EQ(kvp_lease_read(l, pg, 0, buf, v.data_bytes), 0);
		CHILD_CHECK_EQ(memcmp(buf, want, v.data_bytes), 0);
		/* A layer's V alone, at its offset. */
		memset(buf, 0xa5, v.kv_stride);
		CHILD_CHECK_EQ(
			kvp_lease_read(l, pg, v.layer_stride + v.kv_stride, buf, v.kv_stride), 0);
		CHILD_CHECK_EQ(memcmp(buf, want + v.layer_stride + v.kv_stride, v.kv_stride), 0);
		free(want);
	}
	CHILD_CHECK_EQ(kvp_lease_read(l, whole, 0, buf, 4), -ERANGE);
	CHILD_CHECK_EQ(kvp_lease_read(l, 0, v.page_bytes - 3, buf, 4), -ERANGE);
	CHILD_CHECK_EQ(kvp_lease_read(l, 0, 0, NULL, 4), -EINVAL);
	CHILD_CHECK_EQ(kvp_lease_read(NULL, 0, 0, buf, 4), -EINVAL);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	free(buf);
	kvp_disconnect(c);
	return 0;
}

static void test_copy_in_and_out(void **state)
{
	struct pc *x =
		mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(x != MAP_FAILED);
	x->h = *state;
	harness_tokens(x->tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, x), 0);
	assert_int_equal(harness_run_child(reader, x), 0);
	munmap(x, sizeof(*x));
}

/* ---- free memory ready for writers --------------------------------------- */

/* 64 KiB pages in a 64 MiB pool: 1024 pages, a reserve of 32. */
static const struct kvp_layout big = {
	.n_layers = 4,
	.n_kv_heads = 4,
	.head_dim = 64,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

static int warm_setup(void **state)
{
	static const char *const extra[] = {"--host-pool-size", "64M", "--disk-pool-size", "0",
					    NULL};

	return harness_setup_args(state, extra);
}

/* The /proc/self/fd path of the memfd the library keeps for the pool's
 * arena (for kvp_session_write): the descriptor named after the pool. */
static void arena_fd_path(uint64_t pool_id, char *path, size_t cap)
{
	char want[64], link[256];
	struct dirent *e;
	int found = 0;
	DIR *d = opendir("/proc/self/fd");

	assert_non_null(d);
	snprintf(want, sizeof(want), "/memfd:kvpalace-pool-%llu ", (unsigned long long)pool_id);
	while (!found && (e = readdir(d))) {
		ssize_t n;

		snprintf(path, cap, "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		found = !strncmp(link, want, strlen(want));
	}
	closedir(d);
	assert_true(found);
}

/* Bytes of memory the pool's arena holds (allocated shmem pages, touched
 * or not). */
static uint64_t arena_allocated(uint64_t pool_id)
{
	char path[300];
	struct stat st;

	arena_fd_path(pool_id, path, sizeof(path));
	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/* Whether the pool's arena is on hugetlbfs. */
static int arena_is_hugetlb(uint64_t pool_id)
{
	char path[300];
	struct statfs fs;

	arena_fd_path(pool_id, path, sizeof(path));
	assert_int_equal(statfs(path, &fs), 0);
	return fs.f_type == HUGETLBFS_MAGIC;
}

static void test_free_memory_ready(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[64 * 16];
	uint64_t pb, held, got = 0;
	uint32_t keep;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *a, *b;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &big, &p), 0);
	pb = kvp_pool_page_bytes(p);
	keep = kvp_pool_n_pages(p) / 32;
	assert_true(keep >= 16);
	if (arena_is_hugetlb(kvp_pool_id(p))) {
		/* Reserved huge pages are not warmed (pool.h): nothing to see. */
		kvp_disconnect(c);
		skip();
	}
	harness_tokens(tokens, 64 * 16, SEQ, 1000);
	/* A pool nobody wrote holds nothing. */
	assert_true(arena_allocated(kvp_pool_id(p)) < pb);

	/* A writer takes 64 pages of the fresh pool and writes them... */
	assert_int_equal(kvp_session_create(p, &a), 0);
	assert_int_equal(kvp_append(a, tokens, 64 * 16), 0);
	assert_int_equal(harness_write_session(p, a, 0, tokens, 64 * 16), 0);
	assert_int_equal(kvp_commit(a, 64 * 16), 0);

	/* ...and the daemon gets the reserve ready on a worker: wait for
	 * it (20 s at most), then it is the reserve and no more. */
	held = 64 * pb;
	for (int tries = 0; tries < 400; tries++) {
		got = arena_allocated(kvp_pool_id(p));
		if (got >= held + keep * pb)
			break;
		usleep(50000);
	}
	assert_true(got >= held + keep * pb);
	usleep(200000);
	assert_true(arena_allocated(kvp_pool_id(p)) <= held + keep * pb);

	/* The next writer's pages are among them: taking them allocates
	 * nothing new (the append maps nothing either). */
	assert_int_equal(kvp_session_create(p, &b), 0);
	assert_int_equal(
		kvp_append_tier(b, tokens, keep / 2 * 16, KVP_TIER_HOST, KVP_APPEND_NO_PREFAULT),
		0);
	for (uint64_t pg = 0; pg < keep / 2; pg++) {
		struct kvp_page_view v;
		unsigned char *img;

		assert_int_equal(kvp_session_page(b, pg, &v), 0);
		img = page_image(&v, tokens);
		assert_non_null(img);
		assert_int_equal(kvp_session_write(b, pg, 0, img, v.data_bytes), 0);
		free(img);
	}
	got = arena_allocated(kvp_pool_id(p));
	assert_true(got <= held + keep * pb + keep / 2 * pb);
	assert_true(got >= held + keep * pb);
	assert_int_equal(kvp_session_close(b), 0);
	assert_int_equal(kvp_session_close(a), 0);
	kvp_disconnect(c);
}

/* Once the connection is lost the daemon may lend the slots to someone
 * else: neither copy touches them then. */
static void test_copy_after_lost_connection(void **state)
{
	struct harness *h = *state;
	unsigned char buf[64] = {0};
	uint32_t tokens[32];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	harness_tokens(tokens, 32, SEQ, 500);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, 16), 0);
	assert_int_equal(harness_write_session(p, s, 0, tokens, 16), 0);
	assert_int_equal(kvp_commit(s, 16), 0);
	assert_int_equal(kvp_append(s, tokens + 16, 16), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 16, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 16);
	assert_int_equal(kvp_session_write(s, 1, 0, buf, sizeof(buf)), 0);
	assert_int_equal(kvp_lease_read(l, 0, 0, buf, sizeof(buf)), 0);
	assert_int_equal(harness_stop(h), 0);
	assert_true(kvp_ping(c) < 0);
	assert_int_equal(kvp_session_write(s, 1, 0, buf, sizeof(buf)), -ENOTCONN);
	assert_int_equal(kvp_lease_read(l, 0, 0, buf, sizeof(buf)), -ENOTCONN);
	kvp_disconnect(c);
}

/* ---- a hugetlb arena ------------------------------------------------------ */

static int huge_setup(void **state)
{
	static const char *const extra[] = {"--host-pool-size", "10M", "--disk-pool-size", "0",
					    NULL};

	return harness_setup_args(state, extra);
}

/* A pool whose arena got hugetlb pages (the daemon takes them when enough
 * are reserved): hugetlbfs has no write(2), so a pwrite to its memfd is
 * -EINVAL; kvp_session_write must still put the bytes in the page. Runs
 * only where 5 huge pages of 2 MiB are free (the 10 MiB arena). */
static void test_write_hugetlb(void **state)
{
	struct harness *h = *state;
	struct kvp_page_view v;
	unsigned char *img;
	uint32_t tokens[32];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	if (!arena_is_hugetlb(kvp_pool_id(p))) {
		kvp_disconnect(c);
		skip(); /* no hugetlb pages reserved here */
	}
	harness_tokens(tokens, 32, SEQ, 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append_tier(s, tokens, 32, KVP_TIER_HOST, KVP_APPEND_NO_PREFAULT), 0);
	for (uint64_t pg = 0; pg < 2; pg++) {
		assert_int_equal(kvp_session_page(s, pg, &v), 0);
		img = page_image(&v, tokens);
		assert_non_null(img);
		assert_int_equal(kvp_session_write(s, pg, 0, img, v.data_bytes), 0);
		assert_memory_equal(v.base, img, v.data_bytes);
		free(img);
	}
	assert_int_equal(kvp_commit(s, 32), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_copy_in_and_out, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_free_memory_ready, warm_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_copy_after_lost_connection, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_write_hugetlb, huge_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("pagecopy", tests, NULL, NULL);
}
