/* tests/unit/test_layout.c — the page layout ABI of shm/layout.h.
 *
 * Page sizes are checked against figures worked out by hand for common
 * models and for every dtype (quantized ones with their f16 scales), the
 * 4096-byte padding, and every (layer, kv, head, token) offset of small
 * layouts against the formula of DESIGN.md; rows must tile the data part
 * exactly and scales must follow it. shm_layout_check must refuse every
 * kind of bad layout. The latent format (one plane per layer) and the raw
 * fp8 types (f32 scales per layer and plane) are checked the same way.
 * Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "layout.h"

static struct shm_layout mk(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
			    uint32_t dtype, uint32_t group)
{
	struct shm_layout l = {
		.n_layers = layers,
		.n_kv_heads = heads,
		.head_dim = dim,
		.block_tokens = tokens,
		.dtype = dtype,
		.quant_group = group,
	};
	return l;
}

static void test_dtype_bits_and_names(void **state)
{
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_F16), 16);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_BF16), 16);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_F32), 32);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_INT8), 8);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_FP8_E4M3), 8);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_INT4), 4);
	assert_int_equal(shm_dtype_bits(0), 0);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_E4M3_RAW), 8);
	assert_int_equal(shm_dtype_bits(SHM_DTYPE_E5M2_RAW), 8);
	assert_int_equal(shm_dtype_bits(9), 0);
	assert_int_equal(shm_dtype_bits(UINT32_MAX), 0);

	assert_false(shm_dtype_quantized(SHM_DTYPE_F16));
	assert_false(shm_dtype_quantized(SHM_DTYPE_BF16));
	assert_false(shm_dtype_quantized(SHM_DTYPE_F32));
	assert_true(shm_dtype_quantized(SHM_DTYPE_INT8));
	assert_true(shm_dtype_quantized(SHM_DTYPE_FP8_E4M3));
	assert_true(shm_dtype_quantized(SHM_DTYPE_INT4));
	assert_false(shm_dtype_quantized(SHM_DTYPE_E4M3_RAW));
	assert_true(shm_dtype_raw(SHM_DTYPE_E4M3_RAW));
	assert_true(shm_dtype_raw(SHM_DTYPE_E5M2_RAW));
	assert_false(shm_dtype_raw(SHM_DTYPE_FP8_E4M3));
	assert_string_equal(shm_dtype_name(SHM_DTYPE_E5M2_RAW), "e5m2-raw");
	assert_string_equal(shm_format_name(SHM_FORMAT_LATENT), "latent");
	assert_string_equal(shm_format_name(2), "?");

	assert_string_equal(shm_dtype_name(SHM_DTYPE_F16), "f16");
	assert_string_equal(shm_dtype_name(SHM_DTYPE_INT4), "int4");
	assert_string_equal(shm_dtype_name(0), "?");
	assert_string_equal(shm_dtype_name(99), "?");
	assert_string_equal(shm_dtype_name(UINT32_MAX), "?");
}

static void test_page_bytes_by_hand(void **state)
{
	static const struct {
		struct shm_layout l;
		uint64_t data, scales, page;
	} cases[] = {
		/* Llama-3-8B f16: 32 * 2 * 8 * 16 * 128 * 2 = 2 MiB exactly. */
		{{32, 8, 128, 16, SHM_DTYPE_F16, 0}, 2097152, 0, 2097152},
		/* The same in bf16 and f32. */
		{{32, 8, 128, 16, SHM_DTYPE_BF16, 0}, 2097152, 0, 2097152},
		{{32, 8, 128, 16, SHM_DTYPE_F32, 0}, 4194304, 0, 4194304},
		/* Tiny: one 8-wide f16 row of K and V = 32 bytes, padded to 4096. */
		{{1, 1, 8, 1, SHM_DTYPE_F16, 0}, 32, 0, 4096},
		/* Just over a 4096 multiple: 2 * 683 tokens * 3 f32 = 16392 bytes
		 * of data, padded to 20480. */
		{{1, 1, 3, 683, SHM_DTYPE_F32, 0}, 16392, 0, 20480},
		/* int8, group 32: data 2*2*2*16*64 = 8192, scales
		 * 2*2*2*16*(64/32)*2 = 512, 8704 → 12288. */
		{{2, 2, 64, 16, SHM_DTYPE_INT8, 32}, 8192, 512, 12288},
		/* fp8 with one scale per row: 2*2*2*16*1*2 = 256. */
		{{2, 2, 64, 16, SHM_DTYPE_FP8_E4M3, 64}, 8192, 256, 12288},
		/* int4, group 32: data 8192 / 2 = 4096, scales 512 → 8192. */
		{{2, 2, 64, 16, SHM_DTYPE_INT4, 32}, 4096, 512, 8192},
		/* int4, group 2 (a scale per pair): data 1*2*1*1*4/2 = 4 bytes,
		 * scales 1*2*1*1*2*2 = 8 bytes → 4096. */
		{{1, 1, 4, 1, SHM_DTYPE_INT4, 2}, 4, 8, 4096},
		/* Exactly 4096 stays 4096: 1*2*1*16*64*2. */
		{{1, 1, 64, 16, SHM_DTYPE_F16, 0}, 4096, 0, 4096},
		/* Qwen-like GQA int8, group 128: 28*2*4*32*128 = 917504 data,
		 * 28*2*4*32*1*2 = 14336 scales, 931840 → 933888. */
		{{28, 4, 128, 32, SHM_DTYPE_INT8, 128}, 917504, 14336, 933888},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct shm_layout *l = &cases[i].l;

		assert_int_equal(shm_layout_check(l), 0);
		assert_int_equal(shm_page_data_bytes(l), cases[i].data);
		assert_int_equal(shm_page_scale_bytes(l), cases[i].scales);
		assert_int_equal(shm_page_bytes(l), cases[i].page);
		assert_int_equal(shm_page_bytes(l) % SHM_PAGE_ALIGN, 0);
		assert_true(shm_page_bytes(l) >= cases[i].data + cases[i].scales);
		assert_true(shm_page_bytes(l) < cases[i].data + cases[i].scales + SHM_PAGE_ALIGN);
	}
}

/* Hand formula from DESIGN.md: data[layer][kv][head][token][head_dim]. */
static uint64_t want_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
			    uint32_t token)
{
	uint64_t row_bits = (uint64_t)l->head_dim * shm_dtype_bits(l->dtype);
	uint64_t row =
		(((uint64_t)layer * 2 + kv) * l->n_kv_heads + head) * l->block_tokens + token;

	return row * row_bits / 8;
}

static void check_offsets(const struct shm_layout *l)
{
	uint64_t row = shm_row_bytes(l);
	uint64_t data = shm_page_data_bytes(l);
	uint64_t n_rows = (uint64_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
	unsigned char *seen = calloc(n_rows, 1);
	uint64_t last_end = 0;

	assert_non_null(seen);
	assert_int_equal(row * 8, (uint64_t)l->head_dim * shm_dtype_bits(l->dtype));
	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++)
				for (uint32_t t = 0; t < l->block_tokens; t++) {
					uint64_t off = shm_kv_offset(l, layer, kv, h, t);

					assert_int_equal(off, want_offset(l, layer, kv, h, t));
					/* Rows tile [0, data) without overlap. */
					assert_int_equal(off % row, 0);
					assert_true(off + row <= data);
					assert_false(seen[off / row]);
					seen[off / row] = 1;
					if (off + row > last_end)
						last_end = off + row;
				}
	assert_int_equal(last_end, data);
	free(seen);

	if (shm_dtype_quantized(l->dtype)) {
		uint64_t per_row = (uint64_t)(l->head_dim / l->quant_group) * 2;

		/* Scales start right after the data and follow the same order. */
		assert_int_equal(shm_scale_offset(l, 0, 0, 0, 0), data);
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < l->n_kv_heads; h++)
					for (uint32_t t = 0; t < l->block_tokens; t++) {
						uint64_t r = want_offset(l, layer, kv, h, t) / row;

						assert_int_equal(
							shm_scale_offset(l, layer, kv, h, t),
							data + r * per_row);
					}
		assert_int_equal(shm_scale_offset(l, l->n_layers - 1, 1, l->n_kv_heads - 1,
						  l->block_tokens - 1) +
					 per_row,
				 data + shm_page_scale_bytes(l));
	}
}

static void test_offsets_match_formula(void **state)
{
	const struct shm_layout ls[] = {
		mk(3, 2, 8, 5, SHM_DTYPE_F16, 0),      mk(2, 3, 4, 7, SHM_DTYPE_F32, 0),
		mk(4, 1, 16, 16, SHM_DTYPE_BF16, 0),   mk(2, 2, 64, 16, SHM_DTYPE_INT8, 32),
		mk(3, 2, 8, 3, SHM_DTYPE_FP8_E4M3, 8), mk(2, 4, 6, 4, SHM_DTYPE_INT4, 2),
		mk(1, 1, 2, 1, SHM_DTYPE_INT4, 2),     mk(5, 1, 1, 9, SHM_DTYPE_F16, 0),
	};

	for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) {
		assert_int_equal(shm_layout_check(&ls[i]), 0);
		check_offsets(&ls[i]);
	}
}

static void test_offsets_large_layout(void **state)
{
	/* A big page: offsets must not wrap 32 bits. 64 layers * 2 * 16 heads
	 * * 128 tokens * 256 * 4 bytes = 256 MiB, the limit. */
	struct shm_layout l = mk(64, 16, 256, 128, SHM_DTYPE_F32, 0);
	uint64_t row = shm_row_bytes(&l);

	assert_int_equal(shm_layout_check(&l), 0);
	assert_int_equal(shm_page_bytes(&l), SHM_MAX_PAGE_BYTES);
	assert_int_equal(shm_kv_offset(&l, 63, 1, 15, 127), SHM_MAX_PAGE_BYTES - row);
	assert_int_equal(shm_kv_offset(&l, 32, 0, 0, 0), SHM_MAX_PAGE_BYTES / 2);
}

static void test_check_rejects(void **state)
{
	const struct shm_layout good = mk(2, 2, 64, 16, SHM_DTYPE_F16, 0);
	const struct shm_layout bad[] = {
		/* zero dimensions */
		mk(0, 2, 64, 16, SHM_DTYPE_F16, 0),
		mk(2, 0, 64, 16, SHM_DTYPE_F16, 0),
		mk(2, 2, 0, 16, SHM_DTYPE_F16, 0),
		mk(2, 2, 64, 0, SHM_DTYPE_F16, 0),
		/* over the limits */
		mk(SHM_MAX_LAYERS + 1, 1, 8, 1, SHM_DTYPE_F16, 0),
		mk(1, SHM_MAX_KV_HEADS + 1, 8, 1, SHM_DTYPE_F16, 0),
		mk(1, 1, SHM_MAX_HEAD_DIM + 1, 1, SHM_DTYPE_F16, 0),
		mk(1, 1, 8, SHM_MAX_BLOCK_TOKENS + 1, SHM_DTYPE_F16, 0),
		mk(UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX, SHM_DTYPE_F32, 0),
		/* unknown dtypes */
		mk(2, 2, 64, 16, 0, 0),
		mk(2, 2, 64, 16, 9, 0),
		mk(2, 2, 64, 16, UINT32_MAX, 0),
		/* raw fp8 is scaled by the engine: no quant_group */
		mk(2, 2, 64, 16, SHM_DTYPE_E4M3_RAW, 32),
		mk(2, 2, 64, 16, SHM_DTYPE_E5M2_RAW, 64),
		/* quant_group: missing, not dividing, on an unquantized type */
		mk(2, 2, 64, 16, SHM_DTYPE_INT8, 0),
		mk(2, 2, 64, 16, SHM_DTYPE_INT8, 48),
		mk(2, 2, 64, 16, SHM_DTYPE_FP8_E4M3, 128),
		mk(2, 2, 64, 16, SHM_DTYPE_INT4, 0),
		mk(2, 2, 64, 16, SHM_DTYPE_F16, 32),
		mk(2, 2, 64, 16, SHM_DTYPE_F32, 1),
		/* int4 needs an even head_dim */
		mk(2, 2, 3, 16, SHM_DTYPE_INT4, 3),
		mk(2, 2, 1, 16, SHM_DTYPE_INT4, 1),
		/* every dimension within its limit, but a page over 256 MiB */
		mk(SHM_MAX_LAYERS, SHM_MAX_KV_HEADS, SHM_MAX_HEAD_DIM, SHM_MAX_BLOCK_TOKENS,
		   SHM_DTYPE_F32, 0),
		mk(64, 16, 256, 129, SHM_DTYPE_F32, 0),
	};

	assert_int_equal(shm_layout_check(&good), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (shm_layout_check(&bad[i]) != -EINVAL)
			fail_msg("bad layout %zu accepted: %u/%u/%u/%u dtype %u group %u", i,
				 bad[i].n_layers, bad[i].n_kv_heads, bad[i].head_dim,
				 bad[i].block_tokens, bad[i].dtype, bad[i].quant_group);
	}
}

static struct shm_layout mkf(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
			     uint32_t dtype, uint32_t group, uint32_t format)
{
	struct shm_layout l = mk(layers, heads, dim, tokens, dtype, group);

	l.format = format;
	return l;
}

/* The latent format: one plane per layer, half the K/V page; raw fp8: one
 * byte an element and an f32 per (layer, plane) after the data. */
static void test_formats(void **state)
{
	/* DeepSeek-V3: 61 layers of 576 bf16 latents, 64 tokens a page */
	struct shm_layout ds = mkf(61, 1, 576, 64, SHM_DTYPE_BF16, 0, SHM_FORMAT_LATENT);
	struct shm_layout ds_kv = mk(61, 1, 576, 64, SHM_DTYPE_BF16, 0);
	struct shm_layout lat = mkf(3, 1, 24, 5, SHM_DTYPE_F16, 0, SHM_FORMAT_LATENT);
	struct shm_layout lat8 = mkf(3, 1, 24, 5, SHM_DTYPE_INT8, 8, SHM_FORMAT_LATENT);
	struct shm_layout raw = mk(3, 2, 24, 5, SHM_DTYPE_E4M3_RAW, 0);
	struct shm_layout rawl = mkf(3, 1, 24, 5, SHM_DTYPE_E5M2_RAW, 0, SHM_FORMAT_LATENT);
	struct shm_layout q;
	const struct shm_layout bad[] = {
		mkf(2, 2, 64, 16, SHM_DTYPE_BF16, 0, SHM_FORMAT_LATENT),
		mkf(2, 1, 64, 16, SHM_DTYPE_BF16, 0, 2),
		mkf(2, 1, 64, 16, SHM_DTYPE_BF16, 0, UINT32_MAX),
	};

	assert_int_equal(shm_layout_check(&ds), 0);
	assert_int_equal(shm_layout_planes(&ds), 1);
	assert_int_equal(shm_layout_planes(&ds_kv), 2);
	assert_int_equal(shm_page_data_bytes(&ds), 61ull * 64 * 576 * 2);
	assert_int_equal(shm_page_bytes(&ds) * 2, shm_page_bytes(&ds_kv));
	/* rows tile data[layer][token][head_dim] */
	for (uint32_t layer = 0; layer < 3; layer++)
		for (uint32_t t = 0; t < 5; t++) {
			assert_int_equal(shm_kv_offset(&lat, layer, 0, 0, t),
					 ((uint64_t)layer * 5 + t) * 48);
			assert_int_equal(shm_scale_offset(&lat8, layer, 0, 0, t),
					 3 * 5 * 24 + ((uint64_t)layer * 5 + t) * 3 * 2);
		}
	assert_int_equal(shm_page_data_bytes(&lat), 3 * 5 * 48);
	assert_int_equal(shm_page_scale_bytes(&lat8), 3 * 5 * 3 * 2);
	/* raw: 1 byte, f32 scales[layer][k|v] */
	assert_int_equal(shm_row_bytes(&raw), 24);
	assert_int_equal(shm_page_data_bytes(&raw), 3 * 2 * 2 * 5 * 24);
	assert_int_equal(shm_page_scale_bytes(&raw), 3 * 2 * 4);
	assert_int_equal(shm_raw_scale_offset(&raw, 0, 0), shm_page_data_bytes(&raw));
	assert_int_equal(shm_raw_scale_offset(&raw, 2, 1), shm_page_data_bytes(&raw) + 5 * 4);
	assert_int_equal(shm_page_scale_bytes(&rawl), 3 * 4);
	assert_int_equal(shm_raw_scale_offset(&rawl, 2, 0), shm_page_data_bytes(&rawl) + 2 * 4);
	assert_int_equal(shm_layout_check(&raw), 0);
	assert_int_equal(shm_layout_check(&rawl), 0);
	/* never converted: raw bytes are the engine's, latents stay as they are */
	assert_int_equal(shm_layout_quantized(&raw, SHM_DTYPE_INT8, &q), -EINVAL);
	assert_int_equal(shm_layout_quantized(&ds, SHM_DTYPE_INT8, &q), -EINVAL);
	assert_int_equal(shm_layout_quantized(&ds_kv, SHM_DTYPE_INT8, &q), 0);
	assert_false(shm_layout_numeric(&raw));
	assert_false(shm_layout_numeric(&ds));
	assert_true(shm_layout_numeric(&ds_kv));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(shm_layout_check(&bad[i]), -EINVAL);
		assert_non_null(shm_layout_why(&bad[i]));
	}
	assert_string_equal(shm_layout_why(&bad[0]),
			    "a latent layout has n_kv_heads 1 (head_dim is the latent width)");
	assert_null(shm_layout_why(&ds));
}

static void test_check_accepts_limits(void **state)
{
	const struct shm_layout ok[] = {
		mk(1, 1, 1, 1, SHM_DTYPE_F16, 0),
		mk(SHM_MAX_LAYERS, 1, 1, 1, SHM_DTYPE_F16, 0),
		mk(1, SHM_MAX_KV_HEADS, 1, 1, SHM_DTYPE_F16, 0),
		mk(1, 1, SHM_MAX_HEAD_DIM, 1, SHM_DTYPE_F16, 0),
		mk(1, 1, 1, SHM_MAX_BLOCK_TOKENS, SHM_DTYPE_F16, 0),
		mk(1, 1, 7, 1, SHM_DTYPE_INT8, 7),
		mk(1, 1, 7, 1, SHM_DTYPE_INT8, 1),
		mk(1, 1, 2, 1, SHM_DTYPE_INT4, 1),
		mk(80, 8, 128, 16, SHM_DTYPE_FP8_E4M3, 128),
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (shm_layout_check(&ok[i]) != 0)
			fail_msg("good layout %zu refused", i);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtype_bits_and_names),
		cmocka_unit_test(test_page_bytes_by_hand),
		cmocka_unit_test(test_offsets_match_formula),
		cmocka_unit_test(test_offsets_large_layout),
		cmocka_unit_test(test_check_rejects),
		cmocka_unit_test(test_check_accepts_limits),
		cmocka_unit_test(test_formats),
	};

	return cmocka_run_group_tests_name("layout", tests, NULL, NULL);
}
