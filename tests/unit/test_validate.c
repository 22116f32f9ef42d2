/* tests/unit/test_validate.c — request validation of daemon/service/validate.h.
 *
 * Every decoded request passes validate_request before dispatch. These
 * tests build requests the way a hostile or careless client could (no
 * operation, zero or too many tokens, bad model ids, bad layouts) and check
 * that each is refused with the documented errno and a reason, and that
 * the good ones pass. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "validate.h"

#define MAX_TOKENS 1000u

#define MAX_PROMPT 200000u

static const struct validate_limits lim = {.max_tokens_per_request = MAX_TOKENS,
					   .max_prompt_tokens = MAX_PROMPT};

/* Runs validate_request; a refusal must come with a reason. */
static int check(const Kvpalace__V1__Request *req)
{
	const char *why = NULL;
	int ret = validate_request(req, &lim, &why);

	if (ret < 0) {
		assert_non_null(why);
		assert_true(strlen(why) > 0);
	}
	return ret;
}

static Kvpalace__V1__Layout good_layout(void)
{
	Kvpalace__V1__Layout l = KVPALACE__V1__LAYOUT__INIT;

	l.n_layers = 32;
	l.n_kv_heads = 8;
	l.head_dim = 128;
	l.block_tokens = 16;
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	return l;
}

static void test_no_operation(void **state)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	req.id = 1;
	assert_int_equal(check(&req), -EPROTO);
	/* An op number from a future protocol is not dispatched either. */
	req.op_case = (Kvpalace__V1__Request__OpCase)99;
	assert_int_equal(check(&req), -EPROTO);
}

static void test_simple_ops_pass(void **state)
{
	Kvpalace__V1__HelloRequest hello = KVPALACE__V1__HELLO_REQUEST__INIT;
	Kvpalace__V1__StatsRequest stats = KVPALACE__V1__STATS_REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;
	Kvpalace__V1__CloseSessionRequest cl = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;
	Kvpalace__V1__ReleaseRequest rel = KVPALACE__V1__RELEASE_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	hello.protocol_version = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	assert_int_equal(check(&req), 0);
	req.op_case = KVPALACE__V1__REQUEST__OP_STATS;
	req.stats = &stats;
	assert_int_equal(check(&req), 0);
	cs.pool_id = 5;
	req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	req.create_session = &cs;
	assert_int_equal(check(&req), 0);
	cl.session_id = 6;
	req.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
	req.close_session = &cl;
	assert_int_equal(check(&req), 0);
	rel.lease_id = 7;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = &rel;
	assert_int_equal(check(&req), 0);
}

static void test_append_counts(void **state)
{
	static uint32_t tokens[MAX_TOKENS + 1];
	Kvpalace__V1__AppendRequest app = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &app;
	app.session_id = 1;
	app.tokens = tokens;

	app.n_tokens = 0; /* a no-op */
	assert_int_equal(check(&req), -EINVAL);
	app.n_tokens = 1;
	assert_int_equal(check(&req), 0);
	app.n_tokens = MAX_TOKENS;
	assert_int_equal(check(&req), 0);
	app.n_tokens = MAX_TOKENS + 1;
	assert_int_equal(check(&req), -EMSGSIZE);
}

/* A summary span is permanent: summary with permanent false, and an
 * empty summary span, are malformed. */
static void test_summary_spans(void **state)
{
	static uint32_t tokens[4];
	Kvpalace__V1__AppendRequest app = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__TagSpanRequest ts = KVPALACE__V1__TAG_SPAN_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &app;
	app.session_id = 1;
	app.tokens = tokens;
	app.n_tokens = 4;
	app.has_summary = app.summary = 1;
	assert_int_equal(check(&req), 0);
	app.has_permanent = 1;
	app.permanent = 0;
	assert_int_equal(check(&req), -EINVAL);
	app.permanent = 1;
	assert_int_equal(check(&req), 0);

	req.op_case = KVPALACE__V1__REQUEST__OP_TAG_SPAN;
	req.tag_span = &ts;
	ts.session_id = 1;
	ts.n = 4;
	ts.has_summary = ts.summary = 1;
	assert_int_equal(check(&req), 0);
	ts.has_permanent = 1;
	assert_int_equal(check(&req), -EINVAL);
	ts.permanent = 1;
	assert_int_equal(check(&req), 0);
	ts.n = 0;
	assert_int_equal(check(&req), -EINVAL);
	ts.summary = 0; /* an empty span that is no summary: as before */
	assert_int_equal(check(&req), 0);
}

static void test_commit_counts(void **state)
{
	Kvpalace__V1__CommitRequest cm = KVPALACE__V1__COMMIT_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = &cm;
	cm.session_id = 1;
	cm.n_tokens = 0; /* a no-op */
	assert_int_equal(check(&req), -EINVAL);
	cm.n_tokens = 1;
	assert_int_equal(check(&req), 0);
}

static void test_match_prefix(void **state)
{
	static uint32_t tokens[MAX_TOKENS + 1];
	Kvpalace__V1__MatchPrefixRequest mp = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	req.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	req.match_prefix = &mp;
	mp.pool_id = 1;
	mp.tokens = tokens;
	mp.n_tokens = MAX_TOKENS;
	assert_int_equal(check(&req), 0);
	mp.n_tokens = MAX_TOKENS + 1;
	assert_int_equal(check(&req), -EMSGSIZE);
	mp.n_tokens = 10;
	mp.has_lease_id = 1;
	mp.lease_id = 0; /* a continuation of a lease that cannot exist */
	assert_int_equal(check(&req), -EINVAL);
	mp.lease_id = 12;
	assert_int_equal(check(&req), 0);
	/* The prompt's length: with the first chunk only, never shorter. */
	mp.has_prompt_tokens = 1;
	mp.prompt_tokens = 100000;
	assert_int_equal(check(&req), -EINVAL);
	mp.has_lease_id = 0;
	assert_int_equal(check(&req), 0);
	mp.prompt_tokens = 10;
	assert_int_equal(check(&req), 0);
	mp.prompt_tokens = 9;
	assert_int_equal(check(&req), -EINVAL);
	/* No longer than a session may be: a claim of more would let a
	 * tenant move the daemon's hit ratio at will. */
	mp.prompt_tokens = MAX_PROMPT;
	assert_int_equal(check(&req), 0);
	mp.prompt_tokens = MAX_PROMPT + 1;
	assert_int_equal(check(&req), -EINVAL);
	mp.prompt_tokens = UINT64_MAX;
	assert_int_equal(check(&req), -EINVAL);
}

static int open_pool(const char *model_id, Kvpalace__V1__Layout *l)
{
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	op.model_id = (char *)model_id;
	op.layout = l;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;
	return check(&req);
}

static void test_open_pool_model_ids(void **state)
{
	Kvpalace__V1__Layout l = good_layout();
	char id[VALIDATE_MODEL_ID_MAX + 2];

	assert_int_equal(open_pool("llama-3-8b", &l), 0);
	assert_int_equal(open_pool("Qwen/Qwen2.5-7B-Instruct@rev:1~x", &l), 0);
	assert_int_equal(open_pool("m", &l), 0);
	memset(id, 'a', sizeof(id));
	id[VALIDATE_MODEL_ID_MAX] = '\0';
	assert_int_equal(open_pool(id, &l), 0);
	id[VALIDATE_MODEL_ID_MAX] = 'a';
	id[VALIDATE_MODEL_ID_MAX + 1] = '\0';
	assert_int_equal(open_pool(id, &l), -EINVAL);

	assert_int_equal(open_pool("", &l), -EINVAL);
	assert_int_equal(open_pool("a\nb", &l), -EINVAL);
	assert_int_equal(open_pool("tab\there", &l), -EINVAL);
	assert_int_equal(open_pool("esc\x1b[2J", &l), -EINVAL);
	assert_int_equal(open_pool("del\x7f", &l), -EINVAL);
	assert_int_equal(open_pool("caf\xc3\xa9", &l), -EINVAL);
	assert_int_equal(open_pool("\xff", &l), -EINVAL);

	assert_int_equal(validate_model_id(NULL), -EINVAL);
	assert_int_equal(validate_model_id("ok"), 0);
}

/* validate.h and kvpalace.h: "printable ASCII", which includes the space
 * (0x20); the client library accepts it too. */
static void test_model_id_with_space(void **state)
{
	Kvpalace__V1__Layout l = good_layout();

	assert_int_equal(validate_model_id("Llama 3 8B Instruct"), 0);
	assert_int_equal(open_pool("Llama 3 8B Instruct", &l), 0);
}

static void test_open_pool_layouts(void **state)
{
	Kvpalace__V1__Layout l;

	l = good_layout();
	assert_int_equal(open_pool("m", &l), 0);
	l = good_layout();
	l.n_layers = 0;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.n_kv_heads = 0;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.head_dim = 0;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.block_tokens = 0;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.n_layers = SHM_MAX_LAYERS + 1;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.block_tokens = UINT32_MAX;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_INVALID;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.dtype = (Kvpalace__V1__DType)42; /* protobuf-c keeps unknown enum values */
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.dtype = (Kvpalace__V1__DType)-1;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	/* quantized without a group, with a group on f16 */
	l = good_layout();
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_INT8;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l.has_quant_group = 1;
	l.quant_group = 32;
	assert_int_equal(open_pool("m", &l), 0);
	l.quant_group = 48;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	l = good_layout();
	l.has_quant_group = 1;
	l.quant_group = 32;
	assert_int_equal(open_pool("m", &l), -EINVAL);
	/* A page over the size limit. */
	l = good_layout();
	l.n_layers = 1024;
	l.n_kv_heads = 64;
	l.head_dim = 256;
	l.block_tokens = 64;
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F32;
	assert_int_equal(open_pool("m", &l), -EINVAL);
}

static void test_validate_layout_converts(void **state)
{
	Kvpalace__V1__Layout in = good_layout();
	struct shm_layout out;

	in.dtype = KVPALACE__V1__DTYPE__DTYPE_INT4;
	in.has_quant_group = 1;
	in.quant_group = 64;
	assert_int_equal(validate_layout(&in, &out), 0);
	assert_int_equal(out.n_layers, 32);
	assert_int_equal(out.n_kv_heads, 8);
	assert_int_equal(out.head_dim, 128);
	assert_int_equal(out.block_tokens, 16);
	assert_int_equal(out.dtype, SHM_DTYPE_INT4);
	assert_int_equal(out.quant_group, 64);

	/* An absent quant_group reads as 0 even if the field holds junk. */
	in = good_layout();
	in.has_quant_group = 0;
	in.quant_group = 77;
	assert_int_equal(validate_layout(&in, &out), 0);
	assert_int_equal(out.quant_group, 0);
	assert_int_equal(out.dtype, SHM_DTYPE_F16);
	assert_int_equal(out.format, SHM_FORMAT_KV);

	/* An absent format is K/V whatever the field holds; a latent layout
	 * needs one head, and the reason says so. */
	in.format = 1;
	assert_int_equal(validate_layout(&in, &out), 0);
	assert_int_equal(out.format, SHM_FORMAT_KV);
	in.has_format = 1;
	assert_int_equal(validate_layout(&in, &out), -EINVAL);
	assert_non_null(strstr(validate_layout_why(&in), "latent"));
	in.n_kv_heads = 1;
	in.head_dim = 576;
	assert_int_equal(validate_layout(&in, &out), 0);
	assert_int_equal(out.format, SHM_FORMAT_LATENT);
	assert_null(validate_layout_why(&in));
	in = good_layout();
	in.dtype = KVPALACE__V1__DTYPE__DTYPE_E5M2_RAW;
	assert_int_equal(validate_layout(&in, &out), 0);
	assert_int_equal(out.dtype, SHM_DTYPE_E5M2_RAW);
	in.has_quant_group = 1;
	in.quant_group = 32;
	assert_int_equal(validate_layout(&in, &out), -EINVAL);
	assert_non_null(strstr(validate_layout_why(&in), "raw fp8"));
	in = good_layout();

	/* On failure the output is left alone. */
	memset(&out, 0xab, sizeof(out));
	in.head_dim = 0;
	assert_int_equal(validate_layout(&in, &out), -EINVAL);
	assert_int_equal(out.n_layers, 0xabababab);
}

/* Admin operations: the tier is a known one, counts and ids are not zero,
 * a session view asks for at most 4096 slots. */
static void test_admin_ops(void **state)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__EvictRequest ev = KVPALACE__V1__EVICT_REQUEST__INIT;
	Kvpalace__V1__ShowSessionRequest show = KVPALACE__V1__SHOW_SESSION_REQUEST__INIT;
	Kvpalace__V1__DropSessionRequest ds = KVPALACE__V1__DROP_SESSION_REQUEST__INIT;
	Kvpalace__V1__DropPoolRequest dp = KVPALACE__V1__DROP_POOL_REQUEST__INIT;
	Kvpalace__V1__ConfigShowRequest cs = KVPALACE__V1__CONFIG_SHOW_REQUEST__INIT;
	Kvpalace__V1__ConfigReloadRequest cr = KVPALACE__V1__CONFIG_RELOAD_REQUEST__INIT;

	req.id = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	ev.tier = KVPALACE__V1__TIER__TIER_HOST;
	assert_int_equal(check(&req), 0);
	/* gpu and disk pass validation: the daemon says whether it has them. */
	ev.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(check(&req), 0);
	ev.tier = KVPALACE__V1__TIER__TIER_DISK;
	assert_int_equal(check(&req), 0);
	ev.tier = KVPALACE__V1__TIER__TIER_INVALID;
	assert_int_equal(check(&req), -EINVAL);
	ev.tier = (Kvpalace__V1__Tier)4;
	assert_int_equal(check(&req), -EINVAL);
	ev.tier = (Kvpalace__V1__Tier)-1;
	assert_int_equal(check(&req), -EINVAL);
	ev.tier = KVPALACE__V1__TIER__TIER_HOST;
	ev.has_max_bytes = 1;
	assert_int_equal(check(&req), -EINVAL); /* zero bytes */
	ev.max_bytes = 1;
	assert_int_equal(check(&req), 0);
	ev.has_max_pages = 1;
	assert_int_equal(check(&req), -EINVAL); /* zero pages */
	ev.max_pages = UINT32_MAX;
	assert_int_equal(check(&req), 0);
	ev.has_pool_id = 1;
	assert_int_equal(check(&req), -EINVAL); /* pool 0 */
	ev.pool_id = 7;
	assert_int_equal(check(&req), 0);

	req.op_case = KVPALACE__V1__REQUEST__OP_SHOW_SESSION;
	req.show_session = &show;
	assert_int_equal(check(&req), 0);
	show.has_max_page_slots = 1;
	show.max_page_slots = VALIDATE_SHOW_SLOTS_MAX;
	assert_int_equal(check(&req), 0);
	show.max_page_slots = VALIDATE_SHOW_SLOTS_MAX + 1;
	assert_int_equal(check(&req), -EINVAL);
	show.max_page_slots = UINT32_MAX;
	assert_int_equal(check(&req), -EINVAL);

	/* Unknown ids are the handler's "not found", not a validation error. */
	req.op_case = KVPALACE__V1__REQUEST__OP_DROP_SESSION;
	req.drop_session = &ds;
	assert_int_equal(check(&req), 0);
	req.op_case = KVPALACE__V1__REQUEST__OP_DROP_POOL;
	req.drop_pool = &dp;
	assert_int_equal(check(&req), 0);
	req.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_SHOW;
	req.config_show = &cs;
	assert_int_equal(check(&req), 0);
	req.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD;
	req.config_reload = &cr;
	assert_int_equal(check(&req), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_operation),
		cmocka_unit_test(test_simple_ops_pass),
		cmocka_unit_test(test_append_counts),
		cmocka_unit_test(test_summary_spans),
		cmocka_unit_test(test_commit_counts),
		cmocka_unit_test(test_match_prefix),
		cmocka_unit_test(test_open_pool_model_ids),
		cmocka_unit_test(test_model_id_with_space),
		cmocka_unit_test(test_open_pool_layouts),
		cmocka_unit_test(test_validate_layout_converts),
		cmocka_unit_test(test_admin_ops),
	};

	return cmocka_run_group_tests_name("validate", tests, NULL, NULL);
}
