/* tests/integration/test_formats.c — page formats other than f16/bf16 K/V
 * per head, against a real daemon (issue 18):
 *  - a latent layout (MLA: one plane per layer) has pages half the bytes
 *    of the same width stored as K and V; kv 1 has no address; what one
 *    process writes another process (new connection) matches and reads
 *    byte for byte, through kvp_lease_kv and the page view's strides;
 *  - a latent pool and a K/V pool with equal other numbers never share a
 *    page (the same tokens match nothing across them);
 *  - a raw fp8 pool (an engine's e4m3 bytes and its per-layer f32 scales)
 *    keeps data and scales through commit, a match in another process,
 *    the disk tier under --spill-dtype int8 (the pages come back exact and
 *    matched, none was quantized) and a checkpoint restored after a
 *    restart; a quantized checkpoint of such a pool is refused;
 *  - latent pages too spill exact under --spill-dtype int8, and both come
 *    back from the spill file after a warm restart (its header records
 *    the format) and from a checkpoint;
 *  - invalid layouts are refused with a reason, by the library and by the
 *    daemon (a raw OpenPool): latent with n_kv_heads 2, raw fp8 with a
 *    quant_group.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define BT 16u

/* 2 layers of a 576-wide bf16 latent (DeepSeek's 512 + 64): 36 KiB pages. */
static const struct kvp_layout latent = {
	.n_layers = 2,
	.n_kv_heads = 1,
	.head_dim = 576,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_BF16,
	.format = KVP_FORMAT_LATENT,
};
static const struct kvp_layout latent_as_kv = {
	.n_layers = 2,
	.n_kv_heads = 1,
	.head_dim = 576,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_BF16,
};
/* 2 layers, 2 heads of 128 e4m3 bytes: 16 KiB of data, 16 bytes of scales. */
static const struct kvp_layout rawfp8 = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 128,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_E4M3_RAW,
};

static const char *const args[] = {"--host-pool-size", "4M", NULL};
static const char *const spill_args[] = {
	"--host-pool-size", "1M", "--disk-pool-size", "16M", "--spill-dtype", "int8", NULL};

/* The byte every (pos, layer, plane, head, c) holds: from the tokens'
 * sequence seed too, so two conversations differ. */
static uint8_t pat(uint32_t seq, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
		   uint32_t c)
{
	uint64_t x = seq * 0x9e3779b97f4a7c15ull ^ (pos << 20) ^ ((uint64_t)layer << 14) ^
		     ((uint64_t)kv << 12) ^ ((uint64_t)head << 10) ^ c;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 32);
}

/* The f32 scale of (page, layer, plane) for conversation seq. */
static float scale_of(uint32_t seq, uint64_t page, uint32_t layer, uint32_t kv)
{
	return 0.5f + (float)((seq * 7 + page * 5 + layer * 3 + kv) % 64) / 16.0f;
}

static uint32_t planes(const struct kvp_layout *l)
{
	return l->format == KVP_FORMAT_LATENT ? 1 : 2;
}

/* Writes n tokens of conversation seq through kvp_session_kv, and each
 * page's scales (raw fp8) through the page view, then commits them. */
static int write_conv(kvp_pool *p, uint32_t seq, const uint32_t *tokens, size_t n,
		      kvp_session **ret)
{
	const struct kvp_layout *l = kvp_pool_layout(p);
	size_t row = kvp_pool_row_bytes(p);
	kvp_session *s;

	if (kvp_session_create(p, &s) < 0 || kvp_append(s, tokens, n) < 0)
		return -1;
	for (uint64_t pos = 0; pos < n; pos++)
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < planes(l); kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++) {
					uint8_t *r = kvp_session_kv(s, pos, layer, kv, h);

					if (!r)
						return -1;
					for (size_t c = 0; c < row; c++)
						r[c] = pat(seq, pos, layer, kv, h, (uint32_t)c);
				}
	if (l->dtype == KVP_DTYPE_E4M3_RAW)
		for (uint64_t pg = 0; pg < (n + BT - 1) / BT; pg++) {
			struct kvp_page_view v;

			if (kvp_session_page(s, pg, &v) < 0 || !v.scales)
				return -1;
			for (uint32_t layer = 0; layer < l->n_layers; layer++)
				for (uint32_t kv = 0; kv < planes(l); kv++) {
					float f = scale_of(seq, pg, layer, kv);

					memcpy((char *)v.scales + layer * v.scale_layer_stride +
						       kv * v.scale_kv_stride,
					       &f, 4);
				}
		}
	if (kvp_commit(s, n) < 0)
		return -1;
	*ret = s;
	return 0;
}

/* Bytes (and scales) of the first m tokens of a lease that differ from
 * what write_conv wrote; read through kvp_lease_kv and the page view. */
static uint64_t check_lease(const kvp_lease *ls, const kvp_pool *p, uint32_t seq, uint64_t m)
{
	const struct kvp_layout *l = kvp_pool_layout(p);
	size_t row = kvp_pool_row_bytes(p);
	uint64_t bad = 0;

	for (uint64_t pos = 0; pos < m; pos++)
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < planes(l); kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++) {
					const uint8_t *r = kvp_lease_kv(ls, pos, layer, kv, h);

					if (!r)
						return UINT64_MAX;
					for (size_t c = 0; c < row; c++)
						bad += r[c] !=
						       pat(seq, pos, layer, kv, h, (uint32_t)c);
				}
	for (uint64_t pg = 0; pg < m / BT; pg++) {
		struct kvp_page_view v;

		if (kvp_lease_page(ls, pg, &v) < 0)
			return UINT64_MAX;
		/* the strides address what kvp_lease_kv does */
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < planes(l); kv++) {
				const uint8_t *a = (const uint8_t *)v.base +
						   layer * v.layer_stride + kv * v.kv_stride +
						   3 * v.token_stride;

				bad += a != kvp_lease_kv(ls, pg * BT + 3, layer, kv, 0);
				if (l->dtype == KVP_DTYPE_E4M3_RAW) {
					float f;

					memcpy(&f,
					       (const char *)v.scales +
						       layer * v.scale_layer_stride +
						       kv * v.scale_kv_stride,
					       4);
					bad += f != scale_of(seq, pg, layer, kv);
				}
			}
	}
	return bad;
}

struct reader {
	const char *sock;
	const struct kvp_layout *layout;
	const char *model;
	uint32_t seq;
	size_t n;
	uint64_t want; /* tokens the match must hold */
};

/* A child on its own connection: matches conversation seq, checks it. */
static int read_conv(void *arg)
{
	const struct reader *r = arg;
	uint32_t *t = calloc(r->n, sizeof(*t));
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK(t);
	harness_tokens(t, r->n, r->seq, 0);
	CHILD_CHECK(kvp_connect(r->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, r->model, r->layout, &p) == 0);
	CHILD_CHECK(kvp_match_prefix(p, t, r->n, &l) == 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), r->want);
	CHILD_CHECK_EQ(check_lease(l, p, r->seq, kvp_lease_tokens(l)), 0);
	CHILD_CHECK(kvp_lease_release(l) == 0);
	kvp_disconnect(c);
	free(t);
	return 0;
}

static void test_latent(void **state)
{
	struct harness *h = *state;
	uint32_t t[3 * BT];
	struct reader r = {h->sock, &latent, "deepseek-v2-lite", 11, 3 * BT, 3 * BT};
	struct kvp_page_view v;
	kvp_pool *p, *q;
	kvp_session *s;
	kvp_lease *l;
	kvp_client *c;

	harness_tokens(t, 3 * BT, 11, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, "deepseek-v2-lite", &latent, &p), 0);
	assert_int_equal(harness_pool_open(h, c, "deepseek-v2-lite", &latent_as_kv, &q), 0);
	assert_int_not_equal(kvp_pool_id(p), kvp_pool_id(q));
	/* one plane: half the bytes (2 * 16 * 576 * 2 = 36 KiB, no padding) */
	assert_int_equal(kvp_pool_page_bytes(p), 2u * BT * 576 * 2);
	assert_int_equal(kvp_pool_page_bytes(p) * 2, kvp_pool_page_bytes(q));
	assert_int_equal(kvp_pool_row_bytes(p), 576 * 2);

	assert_int_equal(write_conv(p, 11, t, 3 * BT, &s), 0);
	assert_null(kvp_session_kv(s, 0, 0, 1, 0)); /* no V in a latent page */
	assert_non_null(kvp_session_kv(s, 0, 1, 0, 0));
	assert_int_equal(kvp_session_page(s, 0, &v), 0);
	assert_int_equal(v.kv_stride, v.layer_stride);
	assert_int_equal(v.layer_stride, BT * 576 * 2);
	assert_int_equal(v.data_bytes, 2 * v.layer_stride);
	assert_ptr_equal((char *)v.base + v.layer_stride + 5 * v.token_stride,
			 kvp_session_kv(s, 5, 1, 0, 0));
	assert_null(v.scales);
	assert_int_equal(kvp_session_close(s), 0);

	/* Another process, another connection: every byte. */
	assert_int_equal(harness_run_child(read_conv, &r), 0);
	/* The K/V pool of equal numbers shares nothing with it. */
	assert_int_equal(kvp_match_prefix(q, t, 3 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* ... nor the other way round. */
	assert_int_equal(write_conv(q, 12, t, 3 * BT, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_match_prefix(p, t, 3 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 3 * BT);
	assert_int_equal(check_lease(l, p, 11, 3 * BT), 0); /* still the latent bytes */
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
}

static void test_named_latent(void **state)
{
	struct kvp_layout l;

	(void)state;
	assert_int_equal(kvp_layout_named("deepseek-v3", KVP_DTYPE_BF16, 64, &l), 0);
	assert_int_equal(l.n_layers, 61);
	assert_int_equal(l.n_kv_heads, 1);
	assert_int_equal(l.head_dim, 576);
	assert_int_equal(l.format, KVP_FORMAT_LATENT);
	assert_int_equal(kvp_layout_named("deepseek-ai/DeepSeek-V2-Lite", KVP_DTYPE_BF16, 64, &l),
			 0);
	assert_int_equal(l.n_layers, 27);
	assert_int_equal(l.format, KVP_FORMAT_LATENT);
	assert_int_equal(kvp_layout_named("llama-3-8b", KVP_DTYPE_BF16, 64, &l), 0);
	assert_int_equal(l.format, KVP_FORMAT_KV);
}

static void test_raw_fp8(void **state)
{
	struct harness *h = *state;
	uint32_t t[2 * BT + 5];
	struct reader r = {h->sock, &rawfp8, "fp8-model", 21, 2 * BT + 5, 2 * BT};
	struct kvp_layout e5 = rawfp8;
	kvp_pool *p, *q;
	kvp_session *s;
	kvp_lease *l;
	kvp_client *c;

	harness_tokens(t, 2 * BT + 5, 21, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, "fp8-model", &rawfp8, &p), 0);
	/* 16 KiB of bytes and 2 x 2 f32 scales, padded */
	assert_int_equal(kvp_pool_page_bytes(p), 20480);
	assert_int_equal(kvp_pool_row_bytes(p), 128);
	assert_int_equal(write_conv(p, 21, t, 2 * BT + 5, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_run_child(read_conv, &r), 0);
	/* e5m2 bytes are another pool */
	e5.dtype = KVP_DTYPE_E5M2_RAW;
	assert_int_equal(harness_pool_open(h, c, "fp8-model", &e5, &q), 0);
	assert_int_not_equal(kvp_pool_id(p), kvp_pool_id(q));
	assert_int_equal(kvp_match_prefix(q, t, 2 * BT, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
}

#define N_CONV	 64
#define CONV_TOK (4 * BT)

/* Matches every conversation of pool p whole, every byte (and scale)
 * checked. */
static void match_all(kvp_pool *p, const uint32_t *t, int n_conv)
{
	for (int i = 0; i < n_conv; i++) {
		kvp_lease *l;

		assert_int_equal(kvp_match_prefix(p, t + (size_t)i * CONV_TOK, CONV_TOK, &l), 0);
		assert_int_equal(kvp_lease_tokens(l), CONV_TOK);
		assert_int_equal(check_lease(l, p, 100 + (uint32_t)i, CONV_TOK), 0);
		assert_int_equal(kvp_lease_release(l), 0);
	}
}

/* n_conv conversations of 4 pages through a 1 MiB host tier: most go to
 * disk under --spill-dtype int8, and all come back exact and matched (no
 * page of these formats is quantized); a warm restart finds them in the
 * spill file again (its header records the format); a checkpoint of the
 * first restores bytes and scales in a daemon without a disk tier. */
static void spill_checkpoint(struct harness *h, const struct kvp_layout *lay, const char *model,
			     int n_conv)
{
	uint32_t *t = calloc((size_t)n_conv * CONV_TOK, sizeof(*t));
	struct kvp_pool_stats ps;
	uint32_t host_pages;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	kvp_client *c;
	uint64_t bytes;

	assert_non_null(t);
	assert_int_equal(harness_restart(h, SIGTERM, spill_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, model, lay, &p), 0);
	host_pages = kvp_pool_n_pages(p);
	for (int i = 0; i < n_conv; i++) {
		harness_tokens(t + (size_t)i * CONV_TOK, CONV_TOK, 100 + (uint32_t)i, 0);
		assert_int_equal(
			write_conv(p, 100 + (uint32_t)i, t + (size_t)i * CONV_TOK, CONV_TOK, &s),
			0);
		if (i == 0) {
			assert_int_equal(kvp_session_checkpoint(s, "fmt-ckpt", &bytes), 0);
			assert_true(bytes > 4 * kvp_pool_page_bytes(p));
			/* these bytes are never converted: no quantized checkpoint */
			assert_true(kvp_session_checkpoint_as(s, "fmt-q", KVP_DTYPE_INT8, NULL) <
				    0);
		}
		assert_int_equal(kvp_session_close(s), 0);
	}
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	fprintf(stderr, "%s: %u host pages, %llu spilled, %llu quantized\n", model, host_pages,
		(unsigned long long)ps.spilled_pages, (unsigned long long)ps.quantized_pages);
	assert_true(ps.has_disk);
	assert_true(ps.spilled_pages >= (uint64_t)n_conv * 4 - host_pages);
	assert_int_equal(ps.quantized_pages, 0);
	match_all(p, t, n_conv);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_true(ps.promoted_pages > 0);
	assert_int_equal(ps.verify_failures, 0);
	kvp_disconnect(c);

	/* Warm restart: the spill file is this pool's again. */
	assert_int_equal(harness_restart(h, SIGTERM, spill_args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, model, lay, &p), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.restored_pages, (uint64_t)n_conv * 4);
	match_all(p, t, n_conv);
	kvp_disconnect(c);

	/* A daemon without the disk tier: the checkpoint restores the bytes
	 * and the scales. */
	assert_int_equal(harness_restart(h, SIGTERM, args), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(harness_pool_open(h, c, model, lay, &p), 0);
	assert_int_equal(kvp_session_restore(p, "fmt-ckpt", &s), 0);
	assert_int_equal(kvp_session_tokens(s), CONV_TOK);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_match_prefix(p, t, CONV_TOK, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), CONV_TOK);
	assert_int_equal(check_lease(l, p, 100, CONV_TOK), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	free(t);
}

static void test_raw_fp8_spill_checkpoint(void **state)
{
	spill_checkpoint(*state, &rawfp8, "fp8-spill", N_CONV);
}

static void test_latent_spill_checkpoint(void **state)
{
	spill_checkpoint(*state, &latent, "latent-spill", N_CONV / 2);
}

/* The daemon's answer to an OpenPool of layout lay, sent raw (the library
 * refuses it first); its error text into why. */
static int daemon_open_pool(struct harness *h, const struct kvp_layout *lay, char *why, size_t n)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout wl;
	Kvpalace__V1__Response *resp;
	struct raw r;
	int fd = -1, status;

	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	raw_req_open_pool(&req, &op, &wl, "bad-model", lay);
	assert_int_equal(raw_call(&r, &req, &resp, &fd), 1);
	if (fd >= 0)
		close(fd);
	status = resp->status;
	snprintf(why, n, "%s", resp->error ? resp->error : "");
	raw_close(&r);
	return status;
}

static void test_invalid(void **state)
{
	struct harness *h = *state;
	struct kvp_layout two_heads = latent, grouped = rawfp8, fmt = latent_as_kv;
	kvp_client *c;
	kvp_pool *p;
	char why[256];

	two_heads.n_kv_heads = 2;
	grouped.quant_group = 32;
	fmt.format = 7;
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "bad-model", &two_heads, &p), -EINVAL);
	assert_non_null(strstr(kvp_strerror(c, -EINVAL), "latent layout has n_kv_heads 1"));
	assert_int_equal(kvp_pool_open(c, "bad-model", &grouped, &p), -EINVAL);
	assert_non_null(strstr(kvp_strerror(c, -EINVAL), "raw fp8"));
	assert_int_equal(kvp_pool_open(c, "bad-model", &fmt, &p), -EINVAL);
	assert_non_null(strstr(kvp_strerror(c, -EINVAL), "format"));
	kvp_disconnect(c);

	/* The daemon refuses them too, saying why. */
	assert_int_equal(daemon_open_pool(h, &two_heads, why, sizeof(why)),
			 KVPALACE__V1__STATUS__STATUS_INVALID);
	assert_non_null(strstr(why, "latent layout has n_kv_heads 1"));
	assert_int_equal(daemon_open_pool(h, &grouped, why, sizeof(why)),
			 KVPALACE__V1__STATUS__STATUS_INVALID);
	assert_non_null(strstr(why, "raw fp8"));
	assert_true(harness_daemon_alive(h));
}

static int setup(void **state)
{
	return harness_setup_args(state, args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_latent, setup, harness_teardown),
		cmocka_unit_test(test_named_latent),
		cmocka_unit_test_setup_teardown(test_raw_fp8, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_raw_fp8_spill_checkpoint, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_latent_spill_checkpoint, setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_invalid, setup, harness_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
