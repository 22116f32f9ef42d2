/* tests/integration/test_pageview.c — page views (kvp_session_page,
 * kvp_lease_page) and prefaulting (issue 17).
 *
 *  - For every page of a session of three and a half pages, and every
 *    (layer, kv, head, token) of it, the address the view's base and
 *    strides give is the one kvp_session_kv gives; the strides are those
 *    the header documents, the scales of an int8 pool where the layout
 *    says; pages past the session are -ERANGE.
 *  - Process A writes half its pages through views (one memcpy per
 *    layer's K or V of a page: whole runs) and the other half row by row
 *    through kvp_session_kv, then commits; process B, fresh, matches the
 *    prefix and checks every row through kvp_lease_page's view and
 *    through kvp_lease_kv (the same address, the bytes A meant), and
 *    process C does the same with prefaulting off (KVPALACE_PREFAULT=0):
 *    prefaulting changes nothing that is read.
 *  - A fresh process adopts A's session (persistent, its last page half
 *    full), appends to it (prefaulting that last page with the new ones)
 *    and finds the last page's earlier rows intact.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	 "pageview-model"
#define N_TOKENS 200 /* 12 pages and a half of 16 */
#define SEQ	 7

static const struct kvp_layout layout = {
	.n_layers = 3,
	.n_kv_heads = 2,
	.head_dim = 32,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

struct pv {
	struct harness *h;
	uint32_t tokens[N_TOKENS + 64];
	int prefault;	     /* for the reader: 1 default, 0 KVPALACE_PREFAULT=0 */
	uint64_t session_id; /* A's, written by A (the struct is shared) */
};

/* The address (layer, kv, head, token) has in a view, by the header's
 * formula. */
static const unsigned char *at(const struct kvp_page_view *v, uint32_t layer, uint32_t kv,
			       uint32_t head, uint32_t token)
{
	return (const unsigned char *)v->base + layer * v->layer_stride + kv * v->kv_stride +
	       head * v->head_stride + token * v->token_stride;
}

static int strides_documented(const struct kvp_page_view *v, const struct kvp_layout *l, size_t row)
{
	return v->row_bytes == row && v->token_stride == row &&
	       v->head_stride == l->block_tokens * row &&
	       v->kv_stride == l->n_kv_heads * v->head_stride &&
	       v->layer_stride == 2 * v->kv_stride &&
	       v->data_bytes == l->n_layers * v->layer_stride;
}

static void check_session_views(kvp_pool *p, const struct kvp_layout *l, size_t n)
{
	uint32_t *tokens = calloc(n, sizeof(*tokens));
	uint64_t pages = (n + l->block_tokens - 1) / l->block_tokens;
	struct kvp_page_view v;
	kvp_session *s;

	assert_non_null(tokens);
	harness_tokens(tokens, n, SEQ + 1, 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_session_page(s, 0, &v), -ERANGE); /* nothing reserved */
	assert_int_equal(kvp_append(s, tokens, n), 0);
	for (uint64_t pg = 0; pg < pages; pg++) {
		uint32_t held = n - pg * l->block_tokens < l->block_tokens
					? (uint32_t)(n - pg * l->block_tokens)
					: l->block_tokens;

		assert_int_equal(kvp_session_page(s, pg, &v), 0);
		assert_int_equal(v.first_pos, pg * l->block_tokens);
		assert_int_equal(v.n_tokens, held);
		assert_true(v.slot < kvp_pool_n_pages(p));
		assert_int_equal(v.page_bytes, kvp_pool_page_bytes(p));
		assert_true(strides_documented(&v, l, kvp_pool_row_bytes(p)));
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++)
					for (uint32_t t = 0; t < held; t++)
						assert_ptr_equal(at(&v, layer, kv, h, t),
								 kvp_session_kv(s, v.first_pos + t,
										layer, kv, h));
		if (l->quant_group) {
			size_t srow = l->head_dim / l->quant_group * 2;

			/* scales[layer][k|v][head][token][head_dim/group]
			 * right after the data */
			assert_ptr_equal(v.scales, (unsigned char *)v.base + v.data_bytes);
			assert_int_equal(v.scale_row_bytes, srow);
			assert_int_equal(v.scale_token_stride, srow);
			assert_int_equal(v.scale_head_stride, srow * l->block_tokens);
			assert_int_equal(v.scale_kv_stride, v.scale_head_stride * l->n_kv_heads);
			assert_int_equal(v.scale_layer_stride, 2 * v.scale_kv_stride);
			assert_true(v.data_bytes + l->n_layers * v.scale_layer_stride <=
				    v.page_bytes);
		} else {
			assert_null(v.scales);
			assert_int_equal(v.scale_layer_stride, 0);
		}
	}
	assert_int_equal(kvp_session_page(s, pages, &v), -ERANGE);
	assert_int_equal(kvp_session_page(s, 0, NULL), -EINVAL);
	assert_int_equal(kvp_session_page(NULL, 0, &v), -EINVAL);
	assert_int_equal(kvp_session_close(s), 0);
	free(tokens);
}

static void test_views_match_session_kv(void **state)
{
	struct harness *h = *state;
	struct kvp_layout q = layout;
	kvp_client *c;
	kvp_pool *p, *pq;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &layout, &p), 0);
	check_session_views(p, &layout, 56); /* 3 pages and a half */
	check_session_views(p, &layout, 64); /* whole pages */
	q.dtype = KVP_DTYPE_INT8;
	q.quant_group = 16;
	assert_int_equal(kvp_pool_open(c, MODEL, &q, &pq), 0);
	check_session_views(pq, &q, 40);
	kvp_disconnect(c);
}

/* Writes position pos's rows of page view v (all layers, K and V,
 * heads) into the arena: even pages as whole runs, one memcpy per
 * (layer, kv), from a buffer laid out as the page; odd pages row by row
 * through kvp_session_kv. */
static int write_page(kvp_session *s, const struct kvp_page_view *v, const uint32_t *tokens,
		      uint64_t pg)
{
	uint32_t hd = layout.head_dim, bt = layout.block_tokens;
	size_t row = v->row_bytes;

	if (pg % 2 == 0) {
		unsigned char *run = malloc(v->kv_stride);

		if (!run)
			return -1;
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				for (uint32_t h = 0; h < layout.n_kv_heads; h++)
					for (uint32_t t = 0; t < v->n_tokens; t++)
						harness_kv_fill((uint16_t *)(run +
									     h * v->head_stride +
									     t * v->token_stride),
								hd, tokens[v->first_pos + t],
								v->first_pos + t, layer, kv, h);
				/* The tail of a partial page's heads is no
				 * token's: leave it as it is. */
				if (v->n_tokens == bt)
					memcpy((unsigned char *)v->base + layer * v->layer_stride +
						       kv * v->kv_stride,
					       run, v->kv_stride);
				else
					for (uint32_t h = 0; h < layout.n_kv_heads; h++)
						memcpy((unsigned char *)v->base +
							       layer * v->layer_stride +
							       kv * v->kv_stride +
							       h * v->head_stride,
						       run + h * v->head_stride, v->n_tokens * row);
			}
		free(run);
		return 0;
	}
	for (uint32_t layer = 0; layer < layout.n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < layout.n_kv_heads; h++)
				for (uint32_t t = 0; t < v->n_tokens; t++) {
					uint64_t pos = v->first_pos + t;
					uint16_t *r = kvp_session_kv(s, pos, layer, kv, h);

					if (!r)
						return -1;
					harness_kv_fill(r, hd, tokens[pos], pos, layer, kv, h);
				}
	return 0;
}

static int writer(void *arg)
{
	struct pv *x = arg;
	struct kvp_page_view v;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	uint64_t pages = (N_TOKENS + 15) / 16;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, x->tokens, N_TOKENS), 0);
	for (uint64_t pg = 0; pg < pages; pg++) {
		CHILD_CHECK_EQ(kvp_session_page(s, pg, &v), 0);
		CHILD_CHECK_EQ(write_page(s, &v, x->tokens, pg), 0);
	}
	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS), 0);
	/* Persistent: the partial last page stays for the fork test. */
	CHILD_CHECK_EQ(kvp_session_set_persistent(s, 1), 0);
	x->session_id = kvp_session_id(s);
	kvp_disconnect(c);
	return 0;
}

/* A fresh process: every row of the match, through the lease's view and
 * through kvp_lease_kv. */
static int reader(void *arg)
{
	struct pv *x = arg;
	struct kvp_page_view v;
	uint32_t hd = layout.head_dim;
	uint64_t whole = N_TOKENS / 16 * 16;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	if (x->prefault)
		unsetenv("KVPALACE_PREFAULT");
	else
		setenv("KVPALACE_PREFAULT", "0", 1);
	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, x->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), whole);
	for (uint64_t pg = 0; pg < whole / 16; pg++) {
		CHILD_CHECK_EQ(kvp_lease_page(l, pg, &v), 0);
		CHILD_CHECK_EQ(v.n_tokens, 16);
		CHILD_CHECK_EQ(v.first_pos, pg * 16);
		CHILD_CHECK(strides_documented(&v, &layout, kvp_pool_row_bytes(p)));
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < layout.n_kv_heads; h++)
					for (uint32_t t = 0; t < 16; t++) {
						uint64_t pos = pg * 16 + t;
						const uint16_t *r =
							(const uint16_t *)at(&v, layer, kv, h, t);

						CHILD_CHECK(r ==
							    kvp_lease_kv(l, pos, layer, kv, h));
						CHILD_CHECK_EQ(harness_kv_check(r, hd,
										x->tokens[pos], pos,
										layer, kv, h),
							       0);
					}
	}
	CHILD_CHECK_EQ(kvp_lease_page(l, whole / 16, &v), -ERANGE);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

/* A fresh process goes on with A's session: its half-full last page is
 * prefaulted with the new pages by the append and must keep its rows. */
static int continuer(void *arg)
{
	struct pv *x = arg;
	uint32_t extra[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(x->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_adopt(p, x->session_id, &s), 0);
	CHILD_CHECK_EQ(kvp_session_tokens(s), N_TOKENS);
	harness_tokens(extra, 40, SEQ, N_TOKENS);
	CHILD_CHECK_EQ(kvp_append(s, extra, 40), 0);
	for (uint64_t pos = N_TOKENS / 16 * 16; pos < N_TOKENS; pos++)
		for (uint32_t layer = 0; layer < layout.n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < layout.n_kv_heads; h++)
					CHILD_CHECK_EQ(harness_kv_check(
							       kvp_session_kv(s, pos, layer, kv, h),
							       layout.head_dim, x->tokens[pos], pos,
							       layer, kv, h),
						       0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_cross_process(void **state)
{
	struct pv *x =
		mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(x != MAP_FAILED);
	x->h = *state;
	harness_tokens(x->tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, x), 0);
	x->prefault = 1;
	assert_int_equal(harness_run_child(reader, x), 0);
	x->prefault = 0;
	assert_int_equal(harness_run_child(reader, x), 0);
	assert_int_equal(harness_run_child(continuer, x), 0);
	munmap(x, sizeof(*x));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_views_match_session_kv, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_cross_process, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("pageview", tests, NULL, NULL);
}
