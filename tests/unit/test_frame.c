/* tests/unit/test_frame.c — the message framing of proto/frame.h.
 *
 * Checks the 16-byte header on the wire (its bytes, and every way
 * frame_header_check refuses one), walking several frames of one datagram
 * with frame_next, pack/unpack round trips of requests and
 * responses, and the byte-budgeted unpacking arena: a legitimate message of
 * the largest size unpacks within frame_arena_bytes(), while hostile
 * messages (huge declared lengths, floods of tiny submessages or unknown
 * fields) fail cleanly instead of allocating. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "frame.h"

#define MAX_BYTES FRAME_DEFAULT_MAX_BYTES

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = (v >> 24) & 0xff;
}

/* Appends a protobuf varint at p; returns the bytes written. */
static size_t put_varint(unsigned char *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (unsigned char)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (unsigned char)v;
	return n;
}

static void test_header_wire_bytes(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES];
	const unsigned char want[FRAME_HEADER_BYTES] = {
		'K', 'V', 'P', '1', 1, 0, 0, 0, 0x34, 0x12, 0, 0, 0, 0, 0, 0,
	};

	memset(buf, 0xee, sizeof(buf));
	frame_header_encode(buf, 0x1234);
	/* Little-endian whatever the host: "KVP1", version 1, flags 0, length. */
	assert_memory_equal(buf, want, sizeof(want));
}

static void test_header_accepts_good(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES + 100];

	frame_header_encode(buf, 100);
	assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), 100);
	/* An empty payload is a valid frame (the envelope decides). */
	frame_header_encode(buf, 0);
	assert_int_equal(frame_header_check(buf, FRAME_HEADER_BYTES, MAX_BYTES), 0);
	/* Exactly at the cap is allowed. */
	frame_header_encode(buf, 100);
	assert_int_equal(frame_header_check(buf, sizeof(buf), sizeof(buf)), 100);
}

static void test_header_short(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES];

	frame_header_encode(buf, 0);
	for (size_t n = 0; n < FRAME_HEADER_BYTES; n++)
		assert_int_equal(frame_header_check(buf, n, MAX_BYTES), -EBADMSG);
}

static void test_header_bad_magic(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES + 8];

	for (int i = 0; i < 4; i++) {
		frame_header_encode(buf, 8);
		buf[i] ^= 0x20;
		assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), -EPROTO);
	}
	/* Big-endian magic is wrong too. */
	frame_header_encode(buf, 8);
	memcpy(buf, "1PVK", 4);
	assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), -EPROTO);
}

static void test_header_bad_version(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES + 8];
	const uint16_t versions[] = {0, 2, 0x100, 0xffff};

	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		frame_header_encode(buf, 8);
		buf[4] = versions[i] & 0xff;
		buf[5] = versions[i] >> 8;
		assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), -EPROTONOSUPPORT);
	}
}

static void test_header_length_mismatch(void **state)
{
	unsigned char buf[FRAME_HEADER_BYTES + 101];

	/* Says 100, datagram holds 99 (truncated) or 101 (trailing bytes). */
	frame_header_encode(buf, 100);
	assert_int_equal(frame_header_check(buf, FRAME_HEADER_BYTES + 99, MAX_BYTES), -EBADMSG);
	assert_int_equal(frame_header_check(buf, FRAME_HEADER_BYTES + 101, MAX_BYTES), -EBADMSG);
	/* Lengths that would wrap a 32-bit sum. */
	put_le32(buf + 8, UINT32_MAX);
	assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), -EBADMSG);
	put_le32(buf + 8, UINT32_MAX - FRAME_HEADER_BYTES + 1);
	assert_int_equal(frame_header_check(buf, sizeof(buf), MAX_BYTES), -EBADMSG);
}

static void test_header_oversize(void **state)
{
	size_t n = MAX_BYTES + 1;
	unsigned char *buf = calloc(1, n);

	assert_non_null(buf);
	frame_header_encode(buf, (uint32_t)(n - FRAME_HEADER_BYTES));
	assert_int_equal(frame_header_check(buf, n, MAX_BYTES), -EMSGSIZE);
	assert_int_equal(frame_header_check(buf, n, (uint32_t)n), (int)(n - FRAME_HEADER_BYTES));
	free(buf);
}

/* ---- several frames in one datagram ----------------------------------- */

/* Writes a frame with a payload of len bytes of `fill` at p; returns its
 * total length. */
static size_t put_frame(unsigned char *p, uint32_t len, unsigned char fill)
{
	frame_header_encode(p, len);
	memset(p + FRAME_HEADER_BYTES, fill, len);
	return FRAME_HEADER_BYTES + len;
}

static void test_next_walks_frames(void **state)
{
	unsigned char buf[256];
	const uint32_t lens[] = {5, 0, 17, 1};
	const uint8_t *payload;
	size_t n = 0, off = 0, len;

	for (int i = 0; i < 4; i++)
		n += put_frame(buf + n, lens[i], (unsigned char)('a' + i));
	for (int i = 0; i < 4; i++) {
		assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), 1);
		assert_int_equal(len, lens[i]);
		assert_ptr_equal(payload + len, buf + off);
		for (size_t k = 0; k < len; k++)
			assert_int_equal(payload[k], 'a' + i);
	}
	assert_int_equal(off, n);
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), 0);

	/* One frame: the same answer as frame_header_check. */
	n = put_frame(buf, 9, 'z');
	off = 0;
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), 1);
	assert_int_equal(len, frame_header_check(buf, n, MAX_BYTES));
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), 0);
}

static void test_next_refuses(void **state)
{
	unsigned char buf[256] = {0};
	const uint8_t *payload;
	size_t n, off, len;

	/* An empty datagram holds no frame. */
	off = 0;
	assert_int_equal(frame_next(buf, 0, &off, MAX_BYTES, &payload, &len), -EBADMSG);

	/* A good frame, then less than a header. */
	n = put_frame(buf, 4, 'a');
	memcpy(buf + n, "KVP1\1", 5);
	off = 0;
	assert_int_equal(frame_next(buf, n + 5, &off, MAX_BYTES, &payload, &len), 1);
	assert_int_equal(frame_next(buf, n + 5, &off, MAX_BYTES, &payload, &len), -EBADMSG);

	/* A second frame whose length runs past the datagram, by one byte or
	 * by 4 GiB. */
	n = put_frame(buf, 4, 'a');
	n += put_frame(buf + n, 10, 'b');
	frame_header_encode(buf + 4 + FRAME_HEADER_BYTES, 11);
	off = 0;
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), 1);
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), -EBADMSG);
	frame_header_encode(buf + 4 + FRAME_HEADER_BYTES, UINT32_MAX);
	off = 4 + FRAME_HEADER_BYTES;
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), -EBADMSG);

	/* Wrong magic or version in the second frame. */
	n = put_frame(buf, 4, 'a');
	n += put_frame(buf + n, 4, 'b');
	buf[4 + FRAME_HEADER_BYTES] = 'X';
	off = 4 + FRAME_HEADER_BYTES;
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), -EPROTO);
	n = put_frame(buf, 4, 'a');
	n += put_frame(buf + n, 4, 'b');
	buf[4 + FRAME_HEADER_BYTES + 4] = 9;
	off = 4 + FRAME_HEADER_BYTES;
	assert_int_equal(frame_next(buf, n, &off, MAX_BYTES, &payload, &len), -EPROTONOSUPPORT);

	/* A datagram over the cap, however well framed. */
	n = put_frame(buf, 100, 'a');
	n += put_frame(buf + n, 100, 'b');
	off = 0;
	assert_int_equal(frame_next(buf, n, &off, (uint32_t)n - 1, &payload, &len), -EMSGSIZE);
}

/* ---- pack / unpack ---------------------------------------------------- */

struct fixture {
	unsigned char wire[FRAME_MAX_MAX_BYTES];
	unsigned char *mem;
	size_t mem_bytes;
	struct frame_arena arena;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->mem_bytes = frame_arena_bytes(MAX_BYTES);
	f->mem = malloc(f->mem_bytes);
	if (!f->mem) {
		free(f);
		return -1;
	}
	frame_arena_init(&f->arena, f->mem, f->mem_bytes);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	free(f->mem);
	free(f);
	return 0;
}

/* Packs req, checks the header and unpacks it again in the fixture arena. */
static Kvpalace__V1__Request *roundtrip_request(struct fixture *f, const Kvpalace__V1__Request *req)
{
	int n = frame_pack_request(req, f->wire, sizeof(f->wire), MAX_BYTES);
	int len;

	assert_true(n > (int)FRAME_HEADER_BYTES);
	len = frame_header_check(f->wire, (size_t)n, MAX_BYTES);
	assert_int_equal(len, n - (int)FRAME_HEADER_BYTES);
	frame_arena_reset(&f->arena);
	return frame_unpack_request(&f->arena, f->wire + FRAME_HEADER_BYTES, (size_t)len);
}

static void test_roundtrip_append(void **state)
{
	struct fixture *f = *state;
	uint32_t tokens[] = {0, 1, 127, 128, 16383, 16384, 151643, UINT32_MAX};
	Kvpalace__V1__AppendRequest app = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__Request *out;

	app.session_id = UINT64_MAX - 1;
	app.n_tokens = sizeof(tokens) / sizeof(tokens[0]);
	app.tokens = tokens;
	req.id = 0x0123456789abcdefull;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &app;

	out = roundtrip_request(f, &req);
	assert_non_null(out);
	assert_true(f->arena.used > 0); /* decoded into the arena, not malloc */
	assert_int_equal(out->id, req.id);
	assert_int_equal(out->op_case, KVPALACE__V1__REQUEST__OP_APPEND);
	assert_int_equal(out->append->session_id, app.session_id);
	assert_int_equal(out->append->n_tokens, app.n_tokens);
	assert_memory_equal(out->append->tokens, tokens, sizeof(tokens));
}

static void test_roundtrip_open_pool(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__Layout lay = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__Request *out;

	lay.n_layers = 32;
	lay.n_kv_heads = 8;
	lay.head_dim = 128;
	lay.block_tokens = 16;
	lay.dtype = KVPALACE__V1__DTYPE__DTYPE_INT8;
	lay.has_quant_group = 1;
	lay.quant_group = 32;
	op.model_id = "llama-3-8b";
	op.layout = &lay;
	req.id = 7;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;

	out = roundtrip_request(f, &req);
	assert_non_null(out);
	assert_int_equal(out->op_case, KVPALACE__V1__REQUEST__OP_OPEN_POOL);
	assert_string_equal(out->open_pool->model_id, "llama-3-8b");
	assert_int_equal(out->open_pool->layout->n_layers, 32);
	assert_int_equal(out->open_pool->layout->n_kv_heads, 8);
	assert_int_equal(out->open_pool->layout->head_dim, 128);
	assert_int_equal(out->open_pool->layout->block_tokens, 16);
	assert_int_equal(out->open_pool->layout->dtype, KVPALACE__V1__DTYPE__DTYPE_INT8);
	assert_true(out->open_pool->layout->has_quant_group);
	assert_int_equal(out->open_pool->layout->quant_group, 32);
}

static void test_roundtrip_response(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__Layout lay = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__PoolStats ps[3];
	Kvpalace__V1__PoolStats *pp[3];
	Kvpalace__V1__StatsResponse st = KVPALACE__V1__STATS_RESPONSE__INIT;
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
	Kvpalace__V1__Response *out;
	const char *names[3] = {"model-a", "model-b", "model-c"};
	int n, len;

	lay.n_layers = 2;
	lay.n_kv_heads = 1;
	lay.head_dim = 64;
	lay.block_tokens = 16;
	lay.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	for (int i = 0; i < 3; i++) {
		kvpalace__v1__pool_stats__init(&ps[i]);
		ps[i].pool_id = 100 + (uint64_t)i;
		ps[i].uid = 1000;
		ps[i].model_id = (char *)names[i];
		ps[i].layout = &lay;
		ps[i].page_bytes = 8192;
		ps[i].n_pages = 64;
		ps[i].free_pages = 60 - (uint32_t)i;
		ps[i].reserved_pages = 1;
		ps[i].leased_pages = (uint32_t)i;
		ps[i].n_sessions = 2;
		pp[i] = &ps[i];
	}
	st.uptime_ms = 12345;
	st.requests = 99;
	st.n_pools = 3;
	st.pools = pp;
	st.gpu_status = "no GPU";
	resp.id = 42;
	resp.status = KVPALACE__V1__STATUS__STATUS_OK;
	resp.op_case = KVPALACE__V1__RESPONSE__OP_STATS;
	resp.stats = &st;

	n = frame_pack_response(&resp, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > (int)FRAME_HEADER_BYTES);
	len = frame_header_check(f->wire, (size_t)n, MAX_BYTES);
	assert_int_equal(len, n - (int)FRAME_HEADER_BYTES);
	out = frame_unpack_response(&f->arena, f->wire + FRAME_HEADER_BYTES, (size_t)len);
	assert_non_null(out);
	assert_int_equal(out->id, 42);
	assert_int_equal(out->op_case, KVPALACE__V1__RESPONSE__OP_STATS);
	assert_int_equal(out->stats->uptime_ms, 12345);
	assert_int_equal(out->stats->requests, 99);
	assert_string_equal(out->stats->gpu_status, "no GPU");
	assert_int_equal(out->stats->n_pools, 3);
	for (int i = 0; i < 3; i++) {
		const Kvpalace__V1__PoolStats *p = out->stats->pools[i];

		assert_int_equal(p->pool_id, 100 + i);
		assert_string_equal(p->model_id, names[i]);
		assert_int_equal(p->free_pages, 60 - i);
		assert_int_equal(p->leased_pages, i);
		assert_int_equal(p->layout->head_dim, 64);
	}
}

static void test_roundtrip_error_response(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
	Kvpalace__V1__Response *out;
	int n;

	resp.id = 5;
	resp.status = KVPALACE__V1__STATUS__STATUS_RANGE;
	resp.error = "commit of more tokens than reserved";
	n = frame_pack_response(&resp, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > (int)FRAME_HEADER_BYTES);
	out = frame_unpack_response(&f->arena, f->wire + FRAME_HEADER_BYTES,
				    (size_t)n - FRAME_HEADER_BYTES);
	assert_non_null(out);
	assert_int_equal(out->status, KVPALACE__V1__STATUS__STATUS_RANGE);
	assert_int_equal(out->op_case, KVPALACE__V1__RESPONSE__OP__NOT_SET);
	assert_string_equal(out->error, resp.error);
}

/* frame_response_pack_sized writes what protobuf-c writes, byte for byte:
 * errors with and without text, an empty text, ids of every varint
 * length, operations empty, with repeated and bytes fields, with nested
 * messages, and a case set with no message. */
static void expect_same_bytes(const Kvpalace__V1__Response *r)
{
	static unsigned char a[8192], b[8192];
	size_t n = frame_packed_bytes(&r->base), op, m;

	assert_true(n <= sizeof(a));
	frame_pack_sized(&r->base, n, a);
	m = frame_response_packed_bytes(r, &op);
	assert_int_equal(m, n);
	memset(b, 0xee, sizeof(b));
	frame_response_pack_sized(r, m, op, b);
	assert_memory_equal(a, b, n);
}

static void test_response_pack_same_bytes(void **state)
{
	static const uint64_t ids[] = {0, 1, 127, 128, 300, 1ull << 35, UINT64_MAX};
	static uint32_t slots[] = {0, 1, 300, 70000, 0xffffffffu};
	static uint8_t le[] = {1, 0, 0, 0, 0x2c, 1, 0, 0};
	Kvpalace__V1__Response r = KVPALACE__V1__RESPONSE__INIT;
	Kvpalace__V1__MatchPrefixResponse mp = KVPALACE__V1__MATCH_PREFIX_RESPONSE__INIT;
	Kvpalace__V1__ReleaseResponse rel = KVPALACE__V1__RELEASE_RESPONSE__INIT;
	Kvpalace__V1__HelloResponse h = KVPALACE__V1__HELLO_RESPONSE__INIT;
	Kvpalace__V1__StatsResponse st = KVPALACE__V1__STATS_RESPONSE__INIT;
	Kvpalace__V1__PoolStats ps = KVPALACE__V1__POOL_STATS__INIT, *pools[2] = {&ps, &ps};

	(void)state;
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		r = (Kvpalace__V1__Response)KVPALACE__V1__RESPONSE__INIT;
		r.id = ids[i];
		r.status = KVPALACE__V1__STATUS__STATUS_NOT_FOUND;
		r.error = "no such lease in this pool";
		expect_same_bytes(&r);
		r.error = "";
		expect_same_bytes(&r);
		r.error = NULL;
		expect_same_bytes(&r);

		r.status = KVPALACE__V1__STATUS__STATUS_OK;
		r.op_case = KVPALACE__V1__RESPONSE__OP_RELEASE;
		r.release = &rel;
		expect_same_bytes(&r);
		r.release = NULL; /* a case without its message: nothing packed */
		expect_same_bytes(&r);

		mp.lease_id = ids[i];
		mp.matched_tokens = 64;
		mp.first_page = 3;
		mp.page_slots = slots;
		mp.n_page_slots = sizeof(slots) / sizeof(slots[0]);
		mp.complete = 1;
		mp.has_tier = 1;
		mp.tier = KVPALACE__V1__TIER__TIER_HOST;
		r.op_case = KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX;
		r.match_prefix = &mp;
		expect_same_bytes(&r);
		mp.n_page_slots = 0;
		mp.has_page_slots_le = 1;
		mp.page_slots_le.data = le;
		mp.page_slots_le.len = sizeof(le);
		expect_same_bytes(&r);

		h.protocol_version = 1;
		h.max_message_bytes = 65536;
		h.max_tokens_per_request = 13052;
		r.op_case = KVPALACE__V1__RESPONSE__OP_HELLO;
		r.hello = &h;
		expect_same_bytes(&r);

		ps.pool_id = ids[i];
		ps.model_id = "m";
		st.pools = pools;
		st.n_pools = 2;
		r.op_case = KVPALACE__V1__RESPONSE__OP_STATS;
		r.stats = &st;
		expect_same_bytes(&r);
	}
}

static void test_pack_too_big(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__HelloRequest hello = KVPALACE__V1__HELLO_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	int n;

	hello.protocol_version = 1;
	hello.client_name = "test_frame";
	req.id = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	n = frame_pack_request(&req, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > (int)FRAME_HEADER_BYTES);
	/* Exactly enough room works; one byte less of buffer or cap does not. */
	assert_int_equal(frame_pack_request(&req, f->wire, (size_t)n, (uint32_t)n), n);
	assert_int_equal(frame_pack_request(&req, f->wire, (size_t)n - 1, MAX_BYTES), -EMSGSIZE);
	assert_int_equal(frame_pack_request(&req, f->wire, sizeof(f->wire), (uint32_t)n - 1),
			 -EMSGSIZE);
}

static void test_unpack_malformed(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__CommitRequest cm = KVPALACE__V1__COMMIT_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	unsigned char garbage[64];
	int n;

	cm.session_id = 300;
	cm.n_tokens = 70000;
	req.id = 1234567;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = &cm;
	n = frame_pack_request(&req, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > (int)FRAME_HEADER_BYTES);
	/* Payload: id (tag + 3-byte varint), then the commit submessage. Every
	 * proper prefix is refused — a missing required id, a cut varint, a cut
	 * submessage — except the one that ends right after the id, which is a
	 * well-formed request without an operation (validate's business). */
	for (int cut = 0; cut < n - (int)FRAME_HEADER_BYTES; cut++) {
		Kvpalace__V1__Request *out;

		frame_arena_reset(&f->arena);
		out = frame_unpack_request(&f->arena, f->wire + FRAME_HEADER_BYTES, (size_t)cut);
		if (cut == 4) {
			assert_non_null(out);
			assert_int_equal(out->id, 1234567);
			assert_int_equal(out->op_case, KVPALACE__V1__REQUEST__OP__NOT_SET);
		} else {
			assert_null(out);
		}
	}
	/* Bytes that are no protobuf at all: wire type 7 does not exist. */
	memset(garbage, 0xff, sizeof(garbage));
	frame_arena_reset(&f->arena);
	assert_null(frame_unpack_request(&f->arena, garbage, sizeof(garbage)));
	/* A commit submessage without its required n_tokens. */
	{
		const unsigned char bytes[] = {0x08, 0x01, 0x7a, 0x02, 0x08, 0x05};

		frame_arena_reset(&f->arena);
		assert_null(frame_unpack_request(&f->arena, bytes, sizeof(bytes)));
	}
}

/* ---- the budget ------------------------------------------------------- */

/* A packed repeated field whose declared length is far beyond the bytes
 * present (and beyond any budget) is refused without touching memory. */
static void test_budget_huge_declared_length(void **state)
{
	struct fixture *f = *state;
	unsigned char b[64];
	unsigned char sub[32];
	size_t n = 0, s = 0;

	/* AppendRequest { session_id = 1, tokens: packed, length 2^31 - 1 } */
	sub[s++] = 0x08;
	sub[s++] = 0x01;
	sub[s++] = 0x12;
	s += put_varint(sub + s, 0x7fffffff);
	for (int i = 0; i < 8; i++)
		sub[s++] = 0x01;
	/* Request { id = 1, append = sub } */
	b[n++] = 0x08;
	b[n++] = 0x01;
	b[n++] = 0x72;
	n += put_varint(b + n, s);
	memcpy(b + n, sub, s);
	n += s;
	frame_arena_reset(&f->arena);
	assert_null(frame_unpack_request(&f->arena, b, n));
	assert_true(f->arena.used <= f->arena.cap);

	/* The submessage itself claims 2^32 bytes. */
	n = 0;
	b[n++] = 0x08;
	b[n++] = 0x01;
	b[n++] = 0x72;
	n += put_varint(b + n, 0xffffffffull);
	memcpy(b + n, sub, 8);
	n += 8;
	frame_arena_reset(&f->arena);
	assert_null(frame_unpack_request(&f->arena, b, n));
	assert_true(f->arena.used <= f->arena.cap);
}

/* The same valid message unpacks with a generous arena and fails with a
 * small one: the arena, not malloc, is what unpacking draws from. */
static void test_budget_refuses_over_cap(void **state)
{
	struct fixture *f = *state;
	enum { N = 2000 };
	static uint32_t tokens[N];
	Kvpalace__V1__AppendRequest app = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	unsigned char small[1024];
	struct frame_arena a;
	int n;

	for (int i = 0; i < N; i++)
		tokens[i] = (uint32_t)i % 100; /* one wire byte, four in memory */
	app.session_id = 1;
	app.n_tokens = N;
	app.tokens = tokens;
	req.id = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &app;
	n = frame_pack_request(&req, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > 0);

	frame_arena_init(&a, small, sizeof(small));
	assert_null(frame_unpack_request(&a, f->wire + FRAME_HEADER_BYTES,
					 (size_t)n - FRAME_HEADER_BYTES));
	assert_true(a.used <= a.cap);

	frame_arena_reset(&f->arena);
	assert_non_null(frame_unpack_request(&f->arena, f->wire + FRAME_HEADER_BYTES,
					     (size_t)n - FRAME_HEADER_BYTES));
	assert_true(f->arena.used >= N * sizeof(uint32_t));
	assert_true(f->arena.used <= f->arena.cap);
}

/* The largest legitimate request (an Append of one-byte tokens filling the
 * cap) unpacks within frame_arena_bytes(cap) — the promise the daemon sizes
 * its per-connection arena by. */
static void test_budget_fits_largest_request(void **state)
{
	struct fixture *f = *state;
	const uint32_t caps[] = {FRAME_MIN_MAX_BYTES, FRAME_DEFAULT_MAX_BYTES, FRAME_MAX_MAX_BYTES};

	for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
		uint32_t cap = caps[c];
		size_t n_tokens = cap; /* more than fit; shrink below */
		uint32_t *tokens = calloc(n_tokens, sizeof(uint32_t));
		Kvpalace__V1__AppendRequest app = KVPALACE__V1__APPEND_REQUEST__INIT;
		Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
		size_t mem_bytes = frame_arena_bytes(cap);
		unsigned char *mem = malloc(mem_bytes);
		struct frame_arena a;
		int n;

		assert_non_null(tokens);
		assert_non_null(mem);
		app.session_id = UINT64_MAX;
		app.tokens = tokens;
		req.id = UINT64_MAX;
		req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
		req.append = &app;
		app.n_tokens = n_tokens;
		while ((n = frame_pack_request(&req, f->wire, sizeof(f->wire), cap)) < 0)
			app.n_tokens -= 16;
		assert_true(app.n_tokens > cap - 64);
		frame_arena_init(&a, mem, mem_bytes);
		assert_non_null(frame_unpack_request(&a, f->wire + FRAME_HEADER_BYTES,
						     (size_t)n - FRAME_HEADER_BYTES));
		free(mem);
		free(tokens);
	}
}

/* A request of the largest size made of thousands of tiny submessages
 * (the oneof field `stats` repeated; each costs 3 wire bytes and a struct
 * in memory) needs far more memory than its wire size. It is a valid
 * encoding — a big enough arena decodes it — but the budget refuses it. */
static void test_budget_many_tiny_submessages(void **state)
{
	struct fixture *f = *state;
	size_t n = 0;
	size_t big_bytes = 64u << 20;
	unsigned char *big = malloc(big_bytes);
	struct frame_arena a;

	assert_non_null(big);
	f->wire[n++] = 0x08; /* id = 1 */
	f->wire[n++] = 0x01;
	while (n + 3 <= MAX_BYTES - FRAME_HEADER_BYTES) {
		f->wire[n++] = 0x92; /* field 18 (stats), wire type 2 */
		f->wire[n++] = 0x01;
		f->wire[n++] = 0x00; /* empty StatsRequest */
	}
	frame_arena_reset(&f->arena);
	assert_null(frame_unpack_request(&f->arena, f->wire, n));
	assert_true(f->arena.used <= f->arena.cap);

	frame_arena_init(&a, big, big_bytes);
	assert_non_null(frame_unpack_request(&a, f->wire, n));
	assert_true(a.used > frame_arena_bytes(MAX_BYTES));
	free(big);
}

/* A request of the largest size padded with unknown fields: protobuf-c
 * keeps each with its own bookkeeping, far more than FRAME_ARENA_FACTOR
 * bytes per wire byte, so the budget must refuse it. */
static void test_budget_unknown_field_flood(void **state)
{
	struct fixture *f = *state;
	size_t n = 0;

	f->wire[n++] = 0x08; /* id = 1 */
	f->wire[n++] = 0x01;
	f->wire[n++] = 0x92; /* stats {} */
	f->wire[n++] = 0x01;
	f->wire[n++] = 0x00;
	while (n + 2 <= MAX_BYTES - FRAME_HEADER_BYTES) {
		f->wire[n++] = 0x10; /* field 2, varint: not in the schema */
		f->wire[n++] = 0x00;
	}
	frame_arena_reset(&f->arena);
	assert_null(frame_unpack_request(&f->arena, f->wire, n));
	assert_true(f->arena.used <= f->arena.cap);
}

/* After a refused message, a reset arena decodes the next one. */
static void test_arena_reset_reuses(void **state)
{
	struct fixture *f = *state;
	Kvpalace__V1__StatsRequest st = KVPALACE__V1__STATS_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__Request *out;
	size_t used;

	req.id = 3;
	req.op_case = KVPALACE__V1__REQUEST__OP_STATS;
	req.stats = &st;
	out = roundtrip_request(f, &req);
	assert_non_null(out);
	used = f->arena.used;
	assert_true(used > 0);
	out = roundtrip_request(f, &req);
	assert_non_null(out);
	assert_int_equal(f->arena.used, used);
	assert_int_equal(out->id, 3);
	assert_int_equal(out->op_case, KVPALACE__V1__REQUEST__OP_STATS);
}

/* Unpacks the n-byte Response in wire with a small buffer and the budget
 * frame_response_bound(n), as the client library does. Returns the
 * message (NULL when it did not decode); *ret_spent gets what it used. */
static Kvpalace__V1__Response *unpack_bounded(const unsigned char *wire, size_t n,
					      size_t *ret_spent)
{
	static unsigned char small[4096];
	static struct frame_arena a;
	Kvpalace__V1__Response *resp;

	frame_arena_fini(&a);
	frame_arena_init(&a, small, sizeof(small));
	frame_arena_set_budget(&a, frame_response_bound(n));
	resp = frame_unpack_response(&a, wire, n);
	assert_true(a.spent <= a.budget);
	*ret_spent = a.spent;
	return resp;
}

/* The statistics reply of as many pools as fit in the largest cap (the
 * daemon's reply to an operator with a thousand pools) decodes within the
 * response bound, though it needs over ten times its wire size: the
 * factor that budgets requests would refuse it. */
static void test_response_bound_fits_full_stats(void **state)
{
	struct fixture *f = *state;
	enum { MAX_POOLS = 8192 };
	static Kvpalace__V1__PoolStats ps[MAX_POOLS];
	static Kvpalace__V1__PoolStats *pp[MAX_POOLS];
	Kvpalace__V1__Layout lay = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__StatsResponse st = KVPALACE__V1__STATS_RESPONSE__INIT;
	Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
	Kvpalace__V1__Response *out;
	size_t lo = 1, hi = MAX_POOLS, spent;
	int n = -1;

	lay.n_layers = 32;
	lay.n_kv_heads = 8;
	lay.head_dim = 128;
	lay.block_tokens = 16;
	lay.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	for (size_t i = 0; i < MAX_POOLS; i++) {
		kvpalace__v1__pool_stats__init(&ps[i]);
		ps[i].pool_id = i + 1;
		ps[i].model_id = "m";
		ps[i].layout = &lay;
		ps[i].has_indexed_pages = ps[i].has_evictable_pages = 1;
		ps[i].has_evictions = ps[i].has_dedup_pages = ps[i].has_disk_pages = 1;
		ps[i].has_disk_capacity = ps[i].has_spilled_pages = 1;
		pp[i] = &ps[i];
	}
	st.pools = pp;
	resp.id = 1;
	resp.op_case = KVPALACE__V1__RESPONSE__OP_STATS;
	resp.stats = &st;
	/* The most pools that fit under the largest cap. */
	while (lo < hi) {
		size_t mid = (lo + hi + 1) / 2;

		st.n_pools = mid;
		if (frame_pack_response(&resp, f->wire, sizeof(f->wire), FRAME_MAX_MAX_BYTES) > 0)
			lo = mid;
		else
			hi = mid - 1;
	}
	st.n_pools = lo;
	assert_true(lo > 1000);
	n = frame_pack_response(&resp, f->wire, sizeof(f->wire), FRAME_MAX_MAX_BYTES);
	assert_true(n > 0);
	out = unpack_bounded(f->wire + FRAME_HEADER_BYTES, (size_t)n - FRAME_HEADER_BYTES, &spent);
	assert_non_null(out);
	assert_int_equal(out->stats->n_pools, lo);
	assert_int_equal(out->stats->pools[lo - 1]->pool_id, lo);
	assert_true(spent > frame_arena_bytes((uint32_t)n));
	printf("%zu pools: %d wire bytes, %zu unpacked (%.1f per wire byte), bound %zu\n", lo, n,
	       spent, (double)spent / n, frame_response_bound((size_t)n));
}

/* Floods a hostile daemon could send, each a valid encoding at the
 * largest cap: they decode within the bound, and the bound holds them. */
static void test_response_bound_floods(void **state)
{
	struct fixture *f = *state;
	size_t lim = FRAME_MAX_MAX_BYTES - FRAME_HEADER_BYTES, n, spent;
	unsigned char *w = f->wire;

	/* Unknown varint fields: a record and a copy each. */
	n = 0;
	w[n++] = 0x08; /* id = 1 */
	w[n++] = 0x01;
	w[n++] = 0x10; /* status = 0 */
	w[n++] = 0x00;
	while (n + 2 <= lim) {
		w[n++] = 0x48; /* field 9, varint: not in the schema */
		w[n++] = 0x00;
	}
	assert_non_null(unpack_bounded(w, n, &spent));

	/* Unknown empty length-delimited fields. */
	n = 4;
	while (n + 2 <= lim) {
		w[n++] = 0x4a; /* field 9, length 0 */
		w[n++] = 0x00;
	}
	assert_non_null(unpack_bounded(w, n, &spent));

	/* The error string repeated: each occurrence replaces the last. */
	n = 4;
	while (n + 2 <= lim) {
		w[n++] = 0x1a; /* field 3 (error), empty */
		w[n++] = 0x00;
	}
	assert_non_null(unpack_bounded(w, n, &spent));

	/* The id repeated: a scan slot per occurrence. */
	n = 4;
	while (n + 2 <= lim) {
		w[n++] = 0x08;
		w[n++] = 0x01;
	}
	assert_non_null(unpack_bounded(w, n, &spent));
}

/* frame_string_has_nul: a NUL in a string at any depth is found; NULs in
 * bytes fields (salts) and in numbers are not strings. */
static void test_string_has_nul(void **state)
{
	struct fixture *f = *state;
	static const uint8_t salt[4] = {0, 1, 0, 2};
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Layout lay = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	const ProtobufCMessageDescriptor *d = &kvpalace__v1__request__descriptor;
	unsigned char *x;
	int n;

	req.id = 256; /* a zero byte in the id's varint */
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;
	op.model_id = "modelXjunk";
	op.layout = &lay;
	n = frame_pack_request(&req, f->wire, sizeof(f->wire), MAX_BYTES);
	assert_true(n > 0);
	assert_int_equal(frame_string_has_nul(d, f->wire + FRAME_HEADER_BYTES,
					      (size_t)n - FRAME_HEADER_BYTES),
			 0);
	x = memchr(f->wire + FRAME_HEADER_BYTES, 'X', (size_t)n - FRAME_HEADER_BYTES);
	assert_non_null(x);
	*x = 0;
	assert_int_equal(frame_string_has_nul(d, f->wire + FRAME_HEADER_BYTES,
					      (size_t)n - FRAME_HEADER_BYTES),
			 1);
	/* Garbage is not a message. */
	assert_int_equal(frame_string_has_nul(d, (const uint8_t *)"\x0a\x7f", 2), -EBADMSG);

	/* A salt is bytes: its NULs are fine. */
	{
		Kvpalace__V1__CreateSessionRequest cs = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;

		kvpalace__v1__request__init(&req);
		req.id = 1;
		req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
		req.create_session = &cs;
		cs.pool_id = 1;
		cs.has_cache_salt = 1;
		cs.cache_salt.data = (uint8_t *)salt;
		cs.cache_salt.len = sizeof(salt);
		n = frame_pack_request(&req, f->wire, sizeof(f->wire), MAX_BYTES);
		assert_true(n > 0);
		assert_int_equal(frame_string_has_nul(d, f->wire + FRAME_HEADER_BYTES,
						      (size_t)n - FRAME_HEADER_BYTES),
				 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header_wire_bytes),
		cmocka_unit_test(test_header_accepts_good),
		cmocka_unit_test(test_header_short),
		cmocka_unit_test(test_header_bad_magic),
		cmocka_unit_test(test_header_bad_version),
		cmocka_unit_test(test_header_length_mismatch),
		cmocka_unit_test(test_header_oversize),
		cmocka_unit_test(test_next_walks_frames),
		cmocka_unit_test(test_next_refuses),
		cmocka_unit_test_setup_teardown(test_roundtrip_append, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roundtrip_open_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roundtrip_response, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roundtrip_error_response, setup, teardown),
		cmocka_unit_test(test_response_pack_same_bytes),
		cmocka_unit_test_setup_teardown(test_pack_too_big, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unpack_malformed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_huge_declared_length, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_refuses_over_cap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_fits_largest_request, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_many_tiny_submessages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_unknown_field_flood, setup, teardown),
		cmocka_unit_test_setup_teardown(test_arena_reset_reuses, setup, teardown),
		cmocka_unit_test_setup_teardown(test_response_bound_fits_full_stats, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_response_bound_floods, setup, teardown),
		cmocka_unit_test_setup_teardown(test_string_has_nul, setup, teardown),
	};

	return cmocka_run_group_tests_name("frame", tests, NULL, NULL);
}
