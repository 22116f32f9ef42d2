/* tests/unit/test_ctl_format.c — what kvpalacectl's commands share for
 * their output (client/ctl): JSON strings from bytes that are not UTF-8
 * (jdoc.c: each bad byte one U+FFFD, the document still valid JSON, as a
 * JSON parser reads it back), the latency buckets' bounds and quantiles
 * and their words (latency.c), table cells and --no-headers (table.c),
 * short sizes (common.c).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

/* Before cmocka.h, whose fail() macro would take common.h's fail(). */
#include "common.h"
#include "jdoc.h"
#include "latency.h"
#include "table.h"

#include <cmocka.h>

/* s as the JSON text jdoc writes; the caller frees it. */
static char *text_json(const char *s)
{
	json_t *v = jdoc_text(s);
	char *out = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);

	json_decref(v);
	assert_non_null(out);
	return out;
}

static void expect_text(const char *in, const char *want)
{
	char *got = text_json(in);
	json_error_t err;
	json_t *back = json_loads(got, JSON_DECODE_ANY, &err);

	assert_string_equal(got, want);
	/* A JSON parser reads it back (jansson checks UTF-8 on decoding). */
	if (!back)
		fail_msg("'%s' does not parse: %s", got, err.text);
	json_decref(back);
	free(got);
}

static void test_utf8(void **state)
{
	(void)state;
	expect_text("plain", "\"plain\"");
	expect_text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
		    "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
	expect_text("q\"b\\s\n\x01", "\"q\\\"b\\\\s\\n\\u0001\"");
	/* One U+FFFD for each byte that starts no valid sequence. */
	expect_text("model\xff", "\"model\xef\xbf\xbd\"");
	expect_text("\xc0\xaf", "\"\xef\xbf\xbd\xef\xbf\xbd\"");		 /* overlong '/' */
	expect_text("\xed\xa0\x80", "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""); /* surrogate */
	expect_text("\xf4\x90\x80\x80x", "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx\"");
	expect_text("end\xe2\x82", "\"end\xef\xbf\xbd\xef\xbf\xbd\""); /* cut short */
	expect_text("\x80", "\"\xef\xbf\xbd\"");
}

/* A document with a bad model id: what `pools --json` would print. */
static void test_document(void **state)
{
	json_t *doc = jdoc_object(), *arr = jdoc_array(), *pool = jdoc_object();
	struct kvp_layout l = {.n_layers = 2,
			       .n_kv_heads = 2,
			       .head_dim = 32,
			       .block_tokens = 16,
			       .dtype = KVP_DTYPE_F16};
	char *s;
	FILE *f;
	char buf[512];
	size_t n;

	(void)state;
	jdoc_u64(pool, "pool_id", 1);
	jdoc_str(pool, "model_id", "m\xfe\xff");
	jdoc_set(pool, "layout", jdoc_layout(&l));
	jdoc_u64(pool, "big", UINT64_MAX); /* above jansson's int64: a real */
	jdoc_str_or_null(pool, "none", NULL);
	jdoc_push(arr, pool);
	jdoc_set(doc, "pools", arr);
	f = tmpfile();
	assert_non_null(f);
	assert_int_equal(jdoc_print(f, doc), 0);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	s = strchr(buf, '\n');
	assert_non_null(s);
	assert_string_equal(s, "\n");
	*s = '\0';
	assert_string_equal(
		buf, ("{\"pools\":[{\"pool_id\":1,\"model_id\":\"m\xef\xbf\xbd\xef\xbf\xbd\","
		      "\"layout\":{\"n_layers\":2,\"n_kv_heads\":2,\"head_dim\":32,"
		      "\"block_tokens\":16,\"dtype\":\"f16\",\"quant_group\":0,\"format\":\"kv\"},"
		      "\"big\":1.84467440737096e19,\"none\":null}]}"));
	doc = json_loads(buf, 0, NULL);
	assert_non_null(doc);
	json_decref(doc);
}

static void test_latency(void **state)
{
	struct kvp_latency l = {.count = 100};
	char buf[32];

	(void)state;
	assert_int_equal(kvp_latency_bound_ns(0), 10000);
	assert_int_equal(kvp_latency_bound_ns(1), 25000);
	assert_int_equal(kvp_latency_bound_ns(2), 50000);
	assert_int_equal(kvp_latency_bound_ns(3), 100000);
	assert_int_equal(kvp_latency_bound_ns(6), 1000000);
	assert_int_equal(kvp_latency_bound_ns(18), 10000000000ull);
	assert_true(kvp_latency_bound_ns(19) == UINT64_MAX);
	assert_true(kvp_latency_bound_ns(40) == UINT64_MAX);

	assert_int_equal(latency_quantile_ns(&l, 0.5), 0); /* no buckets: nothing */
	l.buckets[0] = 50;
	l.buckets[3] = 49;
	l.buckets[10] = 1;
	assert_int_equal(latency_quantile_ns(&l, 0.5), 10000);
	assert_int_equal(latency_quantile_ns(&l, 0.51), 100000);
	assert_int_equal(latency_quantile_ns(&l, 0.99), 100000);
	assert_int_equal(latency_quantile_ns(&l, 1.0), kvp_latency_bound_ns(10));
	l.buckets[KVP_LATENCY_BUCKETS - 1] = 900;
	assert_true(latency_quantile_ns(&l, 0.99) == UINT64_MAX);

	duration_text(10000, buf, sizeof(buf));
	assert_string_equal(buf, "10us");
	duration_text(2500000, buf, sizeof(buf));
	assert_string_equal(buf, "2.5ms");
	duration_text(1000000000, buf, sizeof(buf));
	assert_string_equal(buf, "1s");
	duration_text(500, buf, sizeof(buf));
	assert_string_equal(buf, "500ns");
	duration_text(UINT64_MAX, buf, sizeof(buf));
	assert_string_equal(buf, ">10s");
}

static void test_table(void **state)
{
	struct table t = {0};
	char buf[512];
	size_t n;
	FILE *f;

	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		table_col(&t, "POOL", '<');
		table_col(&t, "PAGES", '>');
		table_col(&t, "MODEL", '<');
		table_row(&t);
		table_cell(&t, "%d", 7);
		table_cell(&t, "%d", 123456);
		table_cell(&t, "%s", "m");
		table_row(&t);
		table_cell(&t, "%d", 12345);
		table_cell(&t, "%d", 1);
		table_cell(&t, "%s", ""); /* empty: "-", so columns stay columns */
		f = tmpfile();
		assert_non_null(f);
		assert_int_equal(table_print(&t, f, 2, pass), 0);
		rewind(f);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = '\0';
		fclose(f);
		if (pass == 0)
			assert_string_equal(buf, "  POOL   PAGES MODEL\n"
						 "  7     123456 m\n"
						 "  12345      1 -\n");
		else
			assert_string_equal(buf, "  7     123456 m\n"
						 "  12345      1 -\n");
		t = (struct table){0};
	}
}

static void test_size_short(void **state)
{
	char buf[16];

	(void)state;
	size_short(512, buf, sizeof(buf));
	assert_string_equal(buf, "512");
	size_short(1536, buf, sizeof(buf));
	assert_string_equal(buf, "1.5K");
	size_short(40960, buf, sizeof(buf));
	assert_string_equal(buf, "40K");
	size_short(8ull << 30, buf, sizeof(buf));
	assert_string_equal(buf, "8.0G");
	size_short(1023 * 1024, buf, sizeof(buf));
	assert_string_equal(buf, "1.0M");
	size_short(UINT64_MAX, buf, sizeof(buf));
	assert_string_equal(buf, "16E");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_utf8),	   cmocka_unit_test(test_document),
		cmocka_unit_test(test_latency),	   cmocka_unit_test(test_table),
		cmocka_unit_test(test_size_short),
	};

	return cmocka_run_group_tests_name("ctl_format", tests, NULL, NULL);
}
