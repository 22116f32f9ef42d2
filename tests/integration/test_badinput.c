/* tests/integration/test_badinput.c — hostile and careless input over a raw
 * socket.
 *
 * Malformed frames (truncated, oversized, garbage, wrong magic, wrong
 * version, undecodable payload, short, carrying a file descriptor) must get
 * an error reply with the right status and lose their connection.
 * Well-formed requests with bad contents (unknown session, pool and lease
 * ids, bad layouts and model ids, commits beyond the reservation, too many
 * tokens, another client's reservation, non-admin operations on the admin
 * socket) get an error reply with the documented status and keep their
 * connection; a lease belongs to its connection alone. Through the library
 * the same mistakes return the errno that kvpalace.h lists, as do sockets
 * where no daemon listens. After all of it the daemon still serves a
 * well-behaved client, and its counters show the misbehaviour.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "le.h"

#define MAX_MESSAGE 8192
#define MODEL	    "bad-input-model"

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

static int start(void **state)
{
	static const char *const extra[] = {"--max-message-bytes", "8192", NULL};

	return harness_setup_args(state, extra);
}

/* Expects an error reply with `status` (or, where the daemon could not
 * reply, nothing) and then the end of the connection. */
static void expect_error_then_close(struct raw *r, int status)
{
	Kvpalace__V1__Response *resp;
	int n = raw_recv(r, &resp, NULL);

	assert_true(n >= 0); /* a reply or the end, not a timeout */
	if (n == 1) {
		assert_int_equal(resp->status, status);
		assert_non_null(resp->error);
		assert_true(strlen(resp->error) > 0);
		n = raw_recv(r, &resp, NULL);
	}
	assert_int_equal(n, 0); /* closed */
}

/* Expects one reply to req with `status`; the connection stays usable. */
static void expect_status(struct raw *r, Kvpalace__V1__Request *req, int status)
{
	Kvpalace__V1__Response *resp;

	assert_int_equal(raw_call(r, req, &resp, NULL), 1);
	if ((int)resp->status != status)
		fail_msg("request %llu: status %d (%s), expected %d", (unsigned long long)req->id,
			 resp->status, resp->error ? resp->error : "", status);
	if (status != ST(OK)) {
		assert_non_null(resp->error);
		assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP__NOT_SET);
	}
}

static void expect_alive(struct raw *r)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;

	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	expect_status(r, &req, ST(OK));
}

/* A valid Hello frame in buf; returns its length. */
static size_t hello_frame(unsigned char *buf, size_t cap)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	int n;

	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	n = frame_pack_request(&req, buf, cap, (uint32_t)cap);
	assert_true(n > (int)FRAME_HEADER_BYTES);
	return (size_t)n;
}

/* ---- malformed frames: error reply, then the connection is closed ------ */

/* Sends buf[0..n) (with fd as SCM_RIGHTS when >= 0) as one datagram on a
 * new connection and expects an error reply with `status`, then the end
 * of the connection. */
static void send_bad(struct harness *h, const void *buf, size_t n, int fd, int status)
{
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_send_bytes(&r, buf, n, fd), 0);
	expect_error_then_close(&r, status);
	raw_close(&r);
}

static void test_truncated_frame(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES + 100];
	size_t n;

	memset(buf, 0, sizeof(buf));
	frame_header_encode(buf, 100); /* says 100 bytes, carries 50 */
	send_bad(*state, buf, FRAME_HEADER_BYTES + 50, -1, ST(PROTOCOL));

	/* A valid request cut short: the header is right, the payload is not. */
	n = hello_frame(buf, sizeof(buf));
	frame_header_encode(buf, (uint32_t)(n - FRAME_HEADER_BYTES - 3));
	send_bad(*state, buf, n - 3, -1, ST(PROTOCOL));
}

static void test_oversized_datagram(void **state)
{
	size_t sizes[] = {MAX_MESSAGE + 1, 3 * MAX_MESSAGE, 150000};

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned char *buf = calloc(1, sizes[i]);

		assert_non_null(buf);
		frame_header_encode(buf, (uint32_t)(sizes[i] - FRAME_HEADER_BYTES));
		send_bad(*state, buf, sizes[i], -1, ST(TOO_BIG));
		free(buf);
	}
}

static void test_garbage_bytes(void **state)
{
	unsigned char buf[256];
	uint64_t x = 0x123456789abcdefull;

	for (size_t i = 0; i < sizeof(buf); i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
	send_bad(*state, buf, sizeof(buf), -1, ST(PROTOCOL));

	/* Shorter than a header. */
	send_bad(*state, "KVP1", 4, -1, ST(PROTOCOL));

	/* A good header over a payload that is no protobuf. */
	memset(buf, 0xff, sizeof(buf));
	frame_header_encode(buf, sizeof(buf) - FRAME_HEADER_BYTES);
	send_bad(*state, buf, sizeof(buf), -1, ST(PROTOCOL));

	/* A good header over a request missing its required id. */
	frame_header_encode(buf, 3);
	buf[FRAME_HEADER_BYTES] = 0x92; /* stats {}, but no id */
	buf[FRAME_HEADER_BYTES + 1] = 0x01;
	buf[FRAME_HEADER_BYTES + 2] = 0x00;
	send_bad(*state, buf, FRAME_HEADER_BYTES + 3, -1, ST(PROTOCOL));
}

static void test_wrong_magic_and_version(void **state)
{
	unsigned char buf[256];
	size_t n;

	n = hello_frame(buf, sizeof(buf));
	memcpy(buf, "KVP2", 4);
	send_bad(*state, buf, n, -1, ST(PROTOCOL));

	n = hello_frame(buf, sizeof(buf));
	buf[4] = 2; /* frame version 2 */
	send_bad(*state, buf, n, -1, ST(VERSION));
}

static void test_fd_passing_refused(void **state)
{
	unsigned char buf[256];
	size_t n = hello_frame(buf, sizeof(buf));

	send_bad(*state, buf, n, STDIN_FILENO, ST(PROTOCOL));
}

static void test_empty_datagram(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Response *resp;
	struct raw r;
	int n;

	/* Zero bytes look like the end of the stream to the daemon; whatever
	 * it does, it must not answer with success. */
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_send_bytes(&r, "", 0, -1), 0);
	n = raw_recv(&r, &resp, NULL);
	assert_true(n >= 0);
	if (n == 1)
		assert_int_not_equal(resp->status, ST(OK));
	raw_close(&r);
}

/* ---- bad contents: error reply, connection kept ------------------------- */

static void test_hello_wrong_version(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_hello(&req, &hello, 2);
	expect_status(&r, &req, ST(VERSION));
	raw_req_hello(&req, &hello, 0);
	expect_status(&r, &req, ST(VERSION));
	raw_close(&r);
}

static void test_no_operation(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	req.id = 777;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(PROTOCOL));
	raw_close(&r);
}

static void test_unknown_ids(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__CloseSessionRequest cl;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rel;
	uint32_t tokens[4] = {1, 2, 3, 4};
	uint64_t pool_id, sid;
	const uint64_t bogus[] = {0, 1, 987654321, UINT64_MAX};
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);

	for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
		uint64_t id = bogus[i];

		if (id == pool_id || id == sid)
			continue;
		raw_req_append(&req, &app, id, tokens, 4);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_commit(&req, &cm, id, 1);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_close_session(&req, &cl, id);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_create_session(&req, &cs, id);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_match(&req, &mp, id, tokens, 4);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_release(&req, &rel, id);
		expect_status(&r, &req, ST(NOT_FOUND));
		/* A continuation of a lease that does not exist. */
		if (id != 0) {
			raw_req_match(&req, &mp, pool_id, tokens, 4);
			mp.has_lease_id = 1;
			mp.lease_id = id;
			expect_status(&r, &req, ST(NOT_FOUND));
		}
		/* session_id is obsolete since the prefix index: ignored,
		 * whatever it names. */
		raw_req_match(&req, &mp, pool_id, tokens, 4);
		mp.has_session_id = 1;
		mp.session_id = id;
		expect_status(&r, &req, ST(OK));
		/* A session id used as a pool id and the other way round. */
		raw_req_create_session(&req, &cs, sid);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_append(&req, &app, pool_id, tokens, 4);
		expect_status(&r, &req, ST(NOT_FOUND));
	}
	expect_alive(&r);
	raw_close(&r);
}

static void test_bad_layouts_and_model_ids(void **state)
{
	struct harness *h = *state;
	struct kvp_layout bad[12];
	const char *bad_ids[] = {"", "has\nnewline", "esc\x1b", "caf\xc3\xa9", NULL};
	char long_id[200];
	Kvpalace__V1__Request req;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	struct raw r;
	int n = 0;

	for (int i = 0; i < 12; i++)
		bad[i] = harness_layout;
	bad[n++].n_layers = 0;
	bad[n++].n_kv_heads = 0;
	bad[n++].head_dim = 0;
	bad[n++].block_tokens = 0;
	bad[n++].dtype = 0;
	bad[n++].dtype = 99;
	bad[n].dtype = KVP_DTYPE_INT8; /* no quant_group */
	n++;
	bad[n++].quant_group = 8; /* quant_group on f16 */
	bad[n].dtype = KVP_DTYPE_INT4;
	bad[n].head_dim = 33;
	bad[n++].quant_group = 11;
	bad[n++].n_layers = 100000;
	bad[n++].block_tokens = 1u << 31;
	bad[n].n_layers = 1024; /* every field in range, the page far too big */
	bad[n].n_kv_heads = 128;
	bad[n].head_dim = 256;
	bad[n].block_tokens = 256;
	bad[n++].dtype = KVP_DTYPE_F32;

	assert_int_equal(raw_open(&r, h->sock), 0);
	for (int i = 0; i < n; i++) {
		raw_req_open_pool(&req, &op, &lay, MODEL, &bad[i]);
		expect_status(&r, &req, ST(INVALID));
	}
	for (int i = 0; bad_ids[i]; i++) {
		raw_req_open_pool(&req, &op, &lay, bad_ids[i], &harness_layout);
		expect_status(&r, &req, ST(INVALID));
	}
	memset(long_id, 'x', sizeof(long_id) - 1);
	long_id[sizeof(long_id) - 1] = '\0';
	raw_req_open_pool(&req, &op, &lay, long_id, &harness_layout);
	expect_status(&r, &req, ST(INVALID));
	expect_alive(&r);
	raw_close(&r);

	/* The library refuses them with -EINVAL too (before or after asking). */
	{
		kvp_client *c;
		kvp_pool *p;

		assert_int_equal(kvp_connect(h->sock, &c), 0);
		for (int i = 0; i < n; i++)
			assert_int_equal(kvp_pool_open(c, MODEL, &bad[i], &p), -EINVAL);
		for (int i = 0; bad_ids[i]; i++)
			assert_int_equal(kvp_pool_open(c, bad_ids[i], &harness_layout, &p),
					 -EINVAL);
		assert_int_equal(kvp_pool_open(c, long_id, &harness_layout, &p), -EINVAL);
		assert_int_equal(kvp_ping(c), 0);
		/* 127 bytes, and printable ASCII characters, are fine. */
		long_id[127] = '\0';
		assert_int_equal(kvp_pool_open(c, long_id, &harness_layout, &p), 0);
		assert_int_equal(
			kvp_pool_open(c, "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./", &harness_layout, &p),
			0);
		kvp_disconnect(c);
	}
}

/* Packs req, turns the first 'X' of its wire bytes into a NUL, sends it
 * and returns the reply's status. */
static int send_with_nul(struct raw *r, Kvpalace__V1__Request *req)
{
	unsigned char buf[4096];
	Kvpalace__V1__Response *resp;
	unsigned char *x;
	int n = frame_pack_request(req, buf, sizeof(buf), sizeof(buf));

	assert_true(n > 0);
	x = memchr(buf + FRAME_HEADER_BYTES, 'X', (size_t)n - FRAME_HEADER_BYTES);
	assert_non_null(x);
	*x = '\0';
	assert_int_equal(raw_send_bytes(r, buf, (size_t)n, -1), 0);
	assert_int_equal(raw_recv(r, &resp, NULL), 1);
	assert_int_equal(resp->id, req->id);
	return (int)resp->status;
}

/* A NUL inside a name: protobuf-c hands strings over NUL-terminated, so a
 * checkpoint named "ok\0/../../x" was written as "ok" and a model id
 * "model\0junk" was accepted as "model". Both are refused as INVALID, and
 * the connection goes on. Scenario: issue 14's hostile local user. */
static void test_nul_inside_names(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__CheckpointRequest ck = KVPALACE__V1__CHECKPOINT_REQUEST__INIT;
	Kvpalace__V1__ListCheckpointsRequest lc = KVPALACE__V1__LIST_CHECKPOINTS_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	Kvpalace__V1__Layout lay;
	uint64_t pool_id, sid;
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_open_pool(&req, &op, &lay, "modelXjunk", &harness_layout);
	assert_int_equal(send_with_nul(&r, &req), ST(INVALID));
	expect_alive(&r);

	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);
	kvpalace__v1__request__init(&req);
	req.id = 9001;
	req.op_case = KVPALACE__V1__REQUEST__OP_CHECKPOINT;
	req.checkpoint = &ck;
	ck.session_id = sid;
	ck.name = "okX/../../x";
	assert_int_equal(send_with_nul(&r, &req), ST(INVALID));
	expect_alive(&r);
	/* Nothing was written under the name before the NUL. */
	kvpalace__v1__request__init(&req);
	req.id = 9002;
	req.op_case = KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS;
	req.list_checkpoints = &lc;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->list_checkpoints->n_checkpoints, 0);
	raw_close(&r);
}

/* kvpalace.h: "model_id is 1..127 bytes of printable ASCII" — the space
 * (0x20) is printable ASCII. */
static void test_model_id_with_space(void **state)
{
	struct harness *h = *state;
	kvp_client *c;
	kvp_pool *p;
	char why[256];
	int ret;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	ret = kvp_pool_open(c, "Llama 3 8B", &harness_layout, &p);
	snprintf(why, sizeof(why), "%s", kvp_strerror(c, ret));
	kvp_disconnect(c);
	if (ret != 0)
		fail_msg("model id \"Llama 3 8B\" refused: %d (%s)", ret, why);
}

static void test_commit_beyond_reservation(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__Response *resp;
	uint32_t tokens[10];
	uint64_t pool_id, sid;
	struct raw r;

	harness_tokens(tokens, 10, 5, 0);
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);

	/* Nothing reserved yet. */
	raw_req_commit(&req, &cm, sid, 1);
	expect_status(&r, &req, ST(RANGE));
	raw_req_append(&req, &app, sid, tokens, 10);
	expect_status(&r, &req, ST(OK));
	raw_req_commit(&req, &cm, sid, 11);
	expect_status(&r, &req, ST(RANGE));
	raw_req_commit(&req, &cm, sid, UINT64_MAX);
	expect_status(&r, &req, ST(RANGE));
	/* The refused commits changed nothing: 4 + 6 still commit. */
	raw_req_commit(&req, &cm, sid, 4);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->commit->committed_tokens, 4);
	raw_req_commit(&req, &cm, sid, 7);
	expect_status(&r, &req, ST(RANGE));
	raw_req_commit(&req, &cm, sid, 6);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->commit->committed_tokens, 10);
	raw_req_commit(&req, &cm, sid, 1);
	expect_status(&r, &req, ST(RANGE));
	/* Zero-token requests do nothing and say so. */
	raw_req_commit(&req, &cm, sid, 0);
	expect_status(&r, &req, ST(INVALID));
	raw_req_append(&req, &app, sid, tokens, 0);
	expect_status(&r, &req, ST(INVALID));
	expect_alive(&r);
	raw_close(&r);

	/* Through the library: -ERANGE as kvpalace.h documents. */
	{
		kvp_client *c;
		kvp_pool *p;
		kvp_session *s;

		assert_int_equal(kvp_connect(h->sock, &c), 0);
		assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
		assert_int_equal(kvp_session_create(p, &s), 0);
		assert_int_equal(kvp_commit(s, 1), -ERANGE);
		assert_int_equal(kvp_append(s, tokens, 10), 0);
		assert_int_equal(kvp_commit(s, 11), -ERANGE);
		assert_int_equal(kvp_session_committed(s), 0);
		assert_int_equal(kvp_commit(s, 10), 0);
		assert_int_equal(kvp_session_committed(s), 10);
		assert_int_equal(kvp_commit(s, 1), -ERANGE);
		assert_int_equal(kvp_session_close(s), 0);
		kvp_disconnect(c);
	}
}

static void test_too_many_tokens(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Response *resp;
	uint64_t pool_id, sid;
	uint32_t max_tokens, *tokens;
	struct raw r;

	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->hello->max_message_bytes, MAX_MESSAGE);
	max_tokens = resp->hello->max_tokens_per_request;
	assert_true(max_tokens > 0 && max_tokens < MAX_MESSAGE);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);

	/* One-byte tokens, so the message itself stays under the cap. */
	tokens = calloc(max_tokens + 1, sizeof(uint32_t));
	assert_non_null(tokens);
	raw_req_append(&req, &app, sid, tokens, max_tokens + 1);
	expect_status(&r, &req, ST(TOO_BIG));
	raw_req_match(&req, &mp, pool_id, tokens, max_tokens + 1);
	expect_status(&r, &req, ST(TOO_BIG));
	raw_req_append(&req, &app, sid, tokens, max_tokens);
	expect_status(&r, &req, ST(OK));
	free(tokens);
	expect_alive(&r);
	raw_close(&r);
}

/* MatchPrefix with its tokens as tokens_le bytes, as libkvpalace sends
 * them: lengths that are no whole number of tokens, both forms at once,
 * more tokens than a request may carry and none at all are refused or
 * answered as a miss, on a connection that stays usable; the slots of a
 * hit come back as page_slots_le, the same slots the varint form gives. */
static void test_tokens_le(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rel;
	Kvpalace__V1__Response *resp;
	uint32_t tokens[40], slots[2], max_tokens;
	unsigned char *le;
	uint64_t pool_id;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	struct raw r;

	harness_tokens(tokens, 40, 11, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);

	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	max_tokens = resp->hello->max_tokens_per_request;
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(pool_id, kvp_pool_id(p));
	le = calloc(max_tokens + 1, 4);
	assert_non_null(le);
	for (size_t i = 0; i < 40; i++)
		le_put32(le + 4 * i, tokens[i]);

	/* The varint form: 2 pages. */
	raw_req_match(&req, &mp, pool_id, tokens, 40);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->match_prefix->matched_tokens, 32);
	assert_int_equal(resp->match_prefix->n_page_slots, 2);
	assert_false(resp->match_prefix->has_page_slots_le);
	memcpy(slots, resp->match_prefix->page_slots, sizeof(slots));
	kvpalace__v1__release_request__init(&rel);
	rel.lease_id = resp->match_prefix->lease_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = &rel;
	expect_status(&r, &req, ST(OK));

	/* The same match as bytes: the same slots, little-endian. */
	raw_req_match(&req, &mp, pool_id, NULL, 0);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = le;
	mp.tokens_le.len = 40 * 4;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->match_prefix->matched_tokens, 32);
	assert_int_equal(resp->match_prefix->n_page_slots, 0);
	assert_true(resp->match_prefix->has_page_slots_le);
	assert_int_equal(resp->match_prefix->page_slots_le.len, 8);
	assert_int_equal(le_get32(resp->match_prefix->page_slots_le.data), slots[0]);
	assert_int_equal(le_get32(resp->match_prefix->page_slots_le.data + 4), slots[1]);
	rel.lease_id = resp->match_prefix->lease_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = &rel;
	expect_status(&r, &req, ST(OK));

	/* A token cut short, at every length that is not a multiple of 4. */
	for (size_t cut = 1; cut < 4; cut++) {
		raw_req_match(&req, &mp, pool_id, NULL, 0);
		mp.has_tokens_le = 1;
		mp.tokens_le.data = le;
		mp.tokens_le.len = 40 * 4 - cut;
		expect_status(&r, &req, ST(INVALID));
	}
	raw_req_match(&req, &mp, pool_id, NULL, 0);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = le;
	mp.tokens_le.len = 3;
	expect_status(&r, &req, ST(INVALID));
	/* Both forms in one request. */
	raw_req_match(&req, &mp, pool_id, tokens, 16);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = le;
	mp.tokens_le.len = 16 * 4;
	expect_status(&r, &req, ST(INVALID));
	/* More tokens than one request may carry (the message still fits). */
	raw_req_match(&req, &mp, pool_id, NULL, 0);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = le;
	mp.tokens_le.len = ((size_t)max_tokens + 1) * 4;
	expect_status(&r, &req, ST(TOO_BIG));
	/* prompt_tokens below what the bytes carry. */
	raw_req_match(&req, &mp, pool_id, NULL, 0);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = le;
	mp.tokens_le.len = 40 * 4;
	mp.has_prompt_tokens = 1;
	mp.prompt_tokens = 39;
	expect_status(&r, &req, ST(INVALID));
	/* No bytes at all: as an empty varint list, a first chunk that
	 * matched nothing yet (a lease later chunks may extend), whose
	 * release works. */
	raw_req_match(&req, &mp, pool_id, NULL, 0);
	mp.has_tokens_le = 1;
	mp.tokens_le.data = NULL;
	mp.tokens_le.len = 0;
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->match_prefix->matched_tokens, 0);
	assert_int_equal(resp->match_prefix->page_slots_le.len, 0);
	assert_false(resp->match_prefix->complete);
	rel.lease_id = resp->match_prefix->lease_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = &rel;
	expect_status(&r, &req, ST(OK));
	expect_alive(&r);
	raw_close(&r);

	/* A bytes field whose length runs past the message: the frame does
	 * not decode, the connection goes, the daemon stays. By hand:
	 * Request { id = 1, match_prefix (16) = { pool_id, tokens_le (9) of
	 * 1 GiB, carrying one byte } }. */
	{
		unsigned char buf[64], m[32];
		size_t n = 0, mn = 0;

		m[mn++] = 1 << 3; /* pool_id, a varint */
		for (uint64_t v = pool_id; mn < 12; v >>= 7) {
			m[mn++] = (unsigned char)((v & 0x7f) | (v >> 7 ? 0x80 : 0));
			if (!(v >> 7))
				break;
		}
		m[mn++] = 9 << 3 | 2;
		m[mn++] = 0x80;
		m[mn++] = 0x80;
		m[mn++] = 0x80;
		m[mn++] = 0x80;
		m[mn++] = 0x04; /* 1 << 30 */
		m[mn++] = 0xab;
		buf[FRAME_HEADER_BYTES + n++] = 1 << 3; /* id = 1 */
		buf[FRAME_HEADER_BYTES + n++] = 1;
		buf[FRAME_HEADER_BYTES + n++] = 0x82; /* field 16, length-delimited */
		buf[FRAME_HEADER_BYTES + n++] = 0x01;
		buf[FRAME_HEADER_BYTES + n++] = (unsigned char)mn;
		memcpy(buf + FRAME_HEADER_BYTES + n, m, mn);
		n += mn;
		frame_header_encode(buf, (uint32_t)n);
		send_bad(h, buf, FRAME_HEADER_BYTES + n, -1, ST(PROTOCOL));
	}
	assert_true(harness_daemon_alive(h));
	free(le);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_pool_close(p);
	kvp_disconnect(c);
}

static void test_other_clients_reservation(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__CloseSessionRequest cl;
	uint32_t tokens[8];
	uint64_t pool_id, pool_id2, sid;
	struct raw a, b;

	harness_tokens(tokens, 8, 6, 0);
	assert_int_equal(raw_open(&a, h->sock), 0);
	assert_int_equal(raw_open(&b, h->sock), 0);
	assert_int_equal(raw_open_pool(&a, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_open_pool(&b, MODEL, &harness_layout, &pool_id2), 0);
	assert_int_equal(pool_id, pool_id2);
	assert_int_equal(raw_create_session(&a, pool_id, &sid), 0);
	raw_req_append(&req, &app, sid, tokens, 8);
	expect_status(&a, &req, ST(OK));
	/* B may neither append to, commit nor close A's reservation. */
	raw_req_append(&req, &app, sid, tokens, 8);
	expect_status(&b, &req, ST(BUSY));
	raw_req_commit(&req, &cm, sid, 8);
	expect_status(&b, &req, ST(BUSY));
	raw_req_close_session(&req, &cl, sid);
	expect_status(&b, &req, ST(BUSY));
	/* A commits; now the session is free for B to continue. */
	raw_req_commit(&req, &cm, sid, 8);
	expect_status(&a, &req, ST(OK));
	raw_req_append(&req, &app, sid, tokens, 8);
	expect_status(&b, &req, ST(OK));
	raw_close(&a);
	raw_close(&b);
}

/* Appends n tokens to sid through r and commits `commit` of them. */
static void raw_fill(struct raw *r, uint64_t sid, uint32_t *tokens, size_t n, uint64_t commit)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;

	raw_req_append(&req, &app, sid, tokens, n);
	expect_status(r, &req, ST(OK));
	if (commit) {
		raw_req_commit(&req, &cm, sid, commit);
		expect_status(r, &req, ST(OK));
	}
}

/* Fork, Truncate, SessionPages and ListSessions with ids that name
 * nothing, counts past what exists, and salts too long: error replies, and
 * the connection stays. */
static void test_index_ops_bad_arguments(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__ForkRequest fk;
	Kvpalace__V1__TruncateRequest tr;
	Kvpalace__V1__SessionPagesRequest sp;
	Kvpalace__V1__ListSessionsRequest ls;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Response *resp;
	const uint64_t bogus[] = {0, 1, 987654321, UINT64_MAX};
	uint8_t salt[65];
	uint32_t tokens[40];
	uint64_t pool_id, sid;
	struct raw r;

	memset(salt, 's', sizeof(salt));
	harness_tokens(tokens, 40, 9, 0);
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);
	raw_fill(&r, sid, tokens, 40, 30);

	for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
		uint64_t id = bogus[i];

		if (id == pool_id || id == sid)
			continue;
		raw_req_fork(&req, &fk, id, 0);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_truncate(&req, &tr, id, 0);
		expect_status(&r, &req, ST(NOT_FOUND));
		raw_req_session_pages(&req, &sp, id, 0);
		expect_status(&r, &req, ST(NOT_FOUND));
		/* A pool that is not ours lists nothing (and says nothing);
		 * pool 0 means all of ours. */
		raw_req_list_sessions(&req, &ls, id);
		assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
		assert_int_equal(resp->status, ST(OK));
		assert_int_equal(resp->list_sessions->n_sessions, id == 0);
	}
	/* A pool id is no session id. */
	raw_req_fork(&req, &fk, pool_id, 0);
	expect_status(&r, &req, ST(NOT_FOUND));
	raw_req_truncate(&req, &tr, pool_id, 0);
	expect_status(&r, &req, ST(NOT_FOUND));

	/* Counts past what exists: 40 tokens reserved, 30 committed. */
	raw_req_fork(&req, &fk, sid, 31);
	expect_status(&r, &req, ST(RANGE));
	raw_req_fork(&req, &fk, sid, UINT64_MAX);
	expect_status(&r, &req, ST(RANGE));
	raw_req_truncate(&req, &tr, sid, 41);
	expect_status(&r, &req, ST(RANGE));
	raw_req_truncate(&req, &tr, sid, UINT64_MAX);
	expect_status(&r, &req, ST(RANGE));
	raw_req_session_pages(&req, &sp, sid, 4);
	expect_status(&r, &req, ST(RANGE));
	raw_req_session_pages(&req, &sp, sid, UINT64_MAX);
	expect_status(&r, &req, ST(RANGE));
	/* ...and right at the end: three pages, none after the last. */
	raw_req_session_pages(&req, &sp, sid, 0);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->session_pages->n_page_slots, 3);
	assert_int_equal(resp->session_pages->n_tokens, 40);
	assert_int_equal(resp->session_pages->committed_tokens, 30);
	raw_req_session_pages(&req, &sp, sid, 3);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->session_pages->n_page_slots, 0);
	raw_req_fork(&req, &fk, sid, 30);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->fork->n_tokens, 30);

	/* Salts of 65 bytes; 64 is the most. */
	raw_req_create_session(&req, &cs, pool_id);
	cs.has_cache_salt = 1;
	cs.cache_salt.data = salt;
	cs.cache_salt.len = 65;
	expect_status(&r, &req, ST(INVALID));
	cs.cache_salt.len = 64;
	expect_status(&r, &req, ST(OK));
	raw_req_match(&req, &mp, pool_id, tokens, 16);
	mp.has_cache_salt = 1;
	mp.cache_salt.data = salt;
	mp.cache_salt.len = 65;
	expect_status(&r, &req, ST(INVALID));
	mp.cache_salt.len = 64;
	expect_status(&r, &req, ST(OK));
	expect_alive(&r);
	raw_close(&r);
}

/* A session belongs to the connection that made it: another connection of
 * the same user may fork its committed part, but neither truncate, close
 * nor adopt it, before or after a commit (a truncate or close under the
 * owner's feet would free pages the owner still reads through its page
 * table, for someone else's session to take), nor append to or commit it
 * while the owner holds uncommitted tokens. The owner truncates as before. */
static void test_session_of_another_connection(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__TruncateRequest tr;
	Kvpalace__V1__ForkRequest fk;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CloseSessionRequest cl;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__Response *resp;
	uint32_t tokens[40];
	uint64_t pool_id, sid;
	struct raw a, b;

	harness_tokens(tokens, 40, 10, 0);
	assert_int_equal(raw_open(&a, h->sock), 0);
	assert_int_equal(raw_open(&b, h->sock), 0);
	assert_int_equal(raw_open_pool(&a, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_open_pool(&b, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&a, pool_id, &sid), 0);
	raw_fill(&a, sid, tokens, 40, 20);
	for (int committed = 0; committed < 2; committed++) {
		raw_req_truncate(&req, &tr, sid, 10);
		expect_status(&b, &req, ST(BUSY));
		raw_req_truncate(&req, &tr, sid, 0);
		expect_status(&b, &req, ST(BUSY));
		if (!committed) {
			raw_req_append(&req, &app, sid, tokens + 20, 4);
			expect_status(&b, &req, ST(BUSY));
			raw_req_commit(&req, &cm, sid, 20);
			expect_status(&b, &req, ST(BUSY));
		}
		raw_req_close_session(&req, &cl, sid);
		expect_status(&b, &req, ST(BUSY));
		raw_req_create_session(&req, &cs, pool_id);
		cs.has_session_id = 1;
		cs.session_id = sid;
		expect_status(&b, &req, ST(BUSY));
		raw_req_fork(&req, &fk, sid, 20);
		expect_status(&b, &req, ST(OK));
		if (!committed) {
			raw_req_commit(&req, &cm, sid, 20);
			expect_status(&a, &req, ST(OK));
		}
	}
	/* Nothing of it changed: the owner goes on where it was. */
	raw_req_append(&req, &app, sid, tokens, 20);
	assert_int_equal(raw_call(&a, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->append->first_token, 40);
	raw_req_commit(&req, &cm, sid, 20);
	expect_status(&a, &req, ST(OK));
	raw_req_truncate(&req, &tr, sid, 10);
	assert_int_equal(raw_call(&a, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->truncate->n_tokens, 10);
	assert_int_equal(resp->truncate->committed_tokens, 10);
	/* Its first page was full and indexed: the truncated session got a
	 * copy of it, in another slot. */
	assert_int_equal(resp->truncate->n_page_slots, 1);
	assert_int_equal(resp->truncate->first_page, 0);
	/* Once the owner is gone the session went with it (not persistent). */
	raw_close(&a);
	assert_int_equal(raw_wait_connections(&b, 1), 0);
	raw_req_truncate(&req, &tr, sid, 0);
	expect_status(&b, &req, ST(NOT_FOUND));
	raw_close(&b);
}

/* A lease belongs to the connection that made it: another client of the
 * same user can neither release nor extend it, and it keeps reading. */
static void test_foreign_lease(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rel;
	Kvpalace__V1__Response *resp;
	uint32_t tokens[32];
	uint64_t pool_id, sid, lease_id;
	struct raw a, b;

	harness_tokens(tokens, 32, 8, 0);
	assert_int_equal(raw_open(&a, h->sock), 0);
	assert_int_equal(raw_open(&b, h->sock), 0);
	assert_int_equal(raw_open_pool(&a, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_open_pool(&b, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&a, pool_id, &sid), 0);
	raw_req_append(&req, &app, sid, tokens, 32);
	expect_status(&a, &req, ST(OK));
	raw_req_commit(&req, &cm, sid, 32);
	expect_status(&a, &req, ST(OK));
	raw_req_match(&req, &mp, pool_id, tokens, 16);
	assert_int_equal(raw_call(&a, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->match_prefix->matched_tokens, 16);
	lease_id = resp->match_prefix->lease_id;
	assert_true(lease_id != 0);

	raw_req_release(&req, &rel, lease_id);
	expect_status(&b, &req, ST(NOT_FOUND));
	raw_req_match(&req, &mp, pool_id, tokens + 16, 16);
	mp.has_lease_id = 1;
	mp.lease_id = lease_id;
	expect_status(&b, &req, ST(NOT_FOUND));
	/* Its owner still has it: extends it, then releases it once. */
	raw_req_match(&req, &mp, pool_id, tokens + 16, 16);
	mp.has_lease_id = 1;
	mp.lease_id = lease_id;
	assert_int_equal(raw_call(&a, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_int_equal(resp->match_prefix->matched_tokens, 32);
	raw_req_release(&req, &rel, lease_id);
	expect_status(&a, &req, ST(OK));
	raw_req_release(&req, &rel, lease_id);
	expect_status(&a, &req, ST(NOT_FOUND));
	raw_close(&a);
	raw_close(&b);
}

static void test_connect_errors(void **state)
{
	struct harness *h = *state;
	char path[300];
	kvp_client *c = NULL;

	snprintf(path, sizeof(path), "%s/no-such.sock", h->dir);
	assert_int_equal(kvp_connect(path, &c), -ENOENT);
	assert_null(c);
	memset(path, 'a', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	assert_int_equal(kvp_connect(path, &c), -ENAMETOOLONG);
	/* A socket file nobody listens on any more. */
	{
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

		assert_true(fd >= 0);
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/dead.sock", h->dir);
		assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		close(fd);
		assert_int_equal(kvp_connect(sa.sun_path, &c), -ECONNREFUSED);
	}
	/* NULL means $KVPALACE_SOCKET. */
	assert_int_equal(setenv("KVPALACE_SOCKET", h->sock, 1), 0);
	assert_int_equal(kvp_connect(NULL, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_is_admin(c), 0);
	kvp_disconnect(c);
	unsetenv("KVPALACE_SOCKET");
}

static void test_admin_socket_refuses_client_ops(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	Kvpalace__V1__Response *resp;
	struct raw r;

	assert_int_equal(raw_open(&r, h->admin_sock), 0);
	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	assert_true(resp->hello->admin);
	raw_req_open_pool(&req, &op, &lay, MODEL, &harness_layout);
	expect_status(&r, &req, ST(PERMISSION));
	expect_alive(&r);
	raw_close(&r);
}

/* Everything at once, then a well-behaved client is served in full. */
static void test_survives_then_serves(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st;
	uint32_t tokens[100];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	test_truncated_frame(state);
	test_oversized_datagram(state);
	test_garbage_bytes(state);
	test_wrong_magic_and_version(state);
	test_fd_passing_refused(state);
	test_empty_datagram(state);
	test_unknown_ids(state);
	test_bad_layouts_and_model_ids(state);
	test_commit_beyond_reservation(state);
	test_too_many_tokens(state);
	assert_true(harness_daemon_alive(h));

	harness_tokens(tokens, 100, 7, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_pool_open(c, "good-model", &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 100, &s), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 100, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 96);
	assert_int_equal(harness_check_lease(l, p, tokens, 96), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	/* 2 truncated + 3 oversized + 4 garbage + 2 magic/version + 1 fd. */
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_true(st->disconnects_bad >= 12);
	assert_true(st->errors >= 12);
	kvp_stats_free(st);
	kvp_disconnect(c);
}

#define T(f) cmocka_unit_test_setup_teardown(f, start, harness_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_truncated_frame),
		T(test_oversized_datagram),
		T(test_garbage_bytes),
		T(test_wrong_magic_and_version),
		T(test_fd_passing_refused),
		T(test_empty_datagram),
		T(test_hello_wrong_version),
		T(test_no_operation),
		T(test_unknown_ids),
		T(test_bad_layouts_and_model_ids),
		T(test_model_id_with_space),
		T(test_nul_inside_names),
		T(test_commit_beyond_reservation),
		T(test_too_many_tokens),
		T(test_tokens_le),
		T(test_other_clients_reservation),
		T(test_foreign_lease),
		T(test_index_ops_bad_arguments),
		T(test_session_of_another_connection),
		T(test_connect_errors),
		T(test_admin_socket_refuses_client_ops),
		T(test_survives_then_serves),
	};

	return cmocka_run_group_tests_name("badinput", tests, NULL, NULL);
}
