/* tests/integration/test_keys.c — extra keys and key spans (issue 18) with a
 * real kvpalaced: what engines key blocks by besides their tokens.
 *
 *  - Two images behind the same placeholder tokens never share pages: a
 *    match (and a lookup) under image B finds only the pages before the
 *    span; the same image at the same place shares (dedup), the same
 *    image one token later does not.
 *  - A LoRA extra key isolates: pages made under it are found only with
 *    it, not without, not under another, not under the salt alone.
 *  - Spans crossing append, request and page boundaries: the daemon runs
 *    with 4 KiB messages, so appends, matches and lookups of 2,000 tokens
 *    go in pieces and spans cross them.
 *  - Fork, truncate and checkpoint/restore keep the keys: a restored
 *    session (after a restart: nothing left in the pool) is matched only
 *    with the right spans.
 *  - Invalid spans are refused with clear errors: by the library, and by
 *    the daemon for raw requests (the connection stays usable).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "keys-model"
#define BT    16u      /* harness_layout */
#define IMG   0xfffffu /* the placeholder token of every image */

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

static const char *const args[] = {"--host-pool-size", "32M", "--max-message-bytes", "4096", NULL};

static int setup(void **state)
{
	return harness_setup_args(state, args);
}

/* Default message size: room for the daemon's 256 spans a request (a
 * daemon of 4 KiB messages cannot unpack that many: undecodable). */
static int setup_big(void **state)
{
	static const char *const big[] = {"--host-pool-size", "32M", NULL};

	return harness_setup_args(state, big);
}

/* A prompt of n tokens of sequence seq with an image's placeholders at
 * [at, at + len). */
static void prompt(uint32_t *t, size_t n, uint32_t seq, uint64_t at, uint64_t len)
{
	harness_tokens(t, n, seq, 0);
	for (uint64_t i = at; i < at + len && i < n; i++)
		t[i] = IMG;
}

static struct kvp_key_span span(uint64_t first, uint64_t n, const char *key)
{
	return (struct kvp_key_span){first, n, key, strlen(key)};
}

static uint64_t match_n(kvp_pool *p, const uint32_t *t, size_t n, const void *extra,
			const struct kvp_key_span *spans, size_t n_spans)
{
	struct kvp_match_opts o = {.size = sizeof(o),
				   .extra_key = extra,
				   .extra_key_len = extra ? strlen(extra) : 0,
				   .spans = spans,
				   .n_spans = n_spans};
	kvp_lease *l;
	uint64_t got;

	assert_int_equal(kvp_match_prefix_opts(p, t, n, &o, &l), 0);
	got = kvp_lease_tokens(l);
	assert_int_equal(kvp_lease_release(l), 0);
	return got;
}

static uint64_t lookup_n(kvp_pool *p, const uint32_t *t, size_t n, const void *extra,
			 const struct kvp_key_span *spans, size_t n_spans)
{
	struct kvp_lookup_query q = {.tokens = t,
				     .n_tokens = n,
				     .extra_key = extra,
				     .extra_key_len = extra ? strlen(extra) : 0,
				     .spans = spans,
				     .n_spans = n_spans};
	struct kvp_lookup_result r;

	assert_int_equal(kvp_lookup_batch(p, &q, 1, &r), 0);
	return r.matched_tokens;
}

/* Both a match and a lookup find want tokens. */
static void expect(kvp_pool *p, const uint32_t *t, size_t n, const void *extra,
		   const struct kvp_key_span *spans, size_t n_spans, uint64_t want)
{
	uint64_t m = match_n(p, t, n, extra, spans, n_spans);
	uint64_t k = lookup_n(p, t, n, extra, spans, n_spans);

	if (m != want || k != want)
		fail_msg("matched %llu, looked up %llu of %zu tokens, expected %llu",
			 (unsigned long long)m, (unsigned long long)k, n, (unsigned long long)want);
}

/* A session (under extra key extra) of tokens t[0..n), appended in the
 * pieces cut at cuts[0..n_cuts) (ascending), each append with the spans
 * that start before its end not sent yet, then committed. */
static kvp_session *commit_keyed(kvp_pool *p, const char *extra, const uint32_t *t, size_t n,
				 const struct kvp_key_span *spans, size_t n_spans,
				 const size_t *cuts, size_t n_cuts)
{
	struct kvp_session_opts so = {
		.size = sizeof(so), .extra_key = extra, .extra_key_len = extra ? strlen(extra) : 0};
	kvp_session *s;
	size_t at = 0, next = 0;

	assert_int_equal(kvp_session_create_opts(p, &so, &s), 0);
	for (size_t c = 0; c <= n_cuts; c++) {
		size_t end = c < n_cuts ? cuts[c] : n, first = next;
		struct kvp_append_opts ao = {.size = sizeof(ao)};

		while (next < n_spans && spans[next].first_token < end)
			next++;
		ao.spans = spans + first;
		ao.n_spans = next - first;
		assert_int_equal(kvp_append_opts(s, t + at, end - at, &ao), 0);
		at = end;
	}
	assert_int_equal(kvp_commit(s, n), 0);
	return s;
}

static void connect_pool(struct harness *h, kvp_client **c, kvp_pool **p)
{
	assert_int_equal(kvp_connect(h->sock, c), 0);
	assert_int_equal(kvp_pool_open(*c, MODEL, &harness_layout, p), 0);
}

/* ---- images ------------------------------------------------------------- */

static void test_images(void **state)
{
	struct harness *h = *state;
	uint32_t t[128];
	struct kvp_key_span a = span(40, 48, "image-A"), b = span(40, 48, "image-B");
	struct kvp_key_span a_moved = span(41, 47, "image-A");
	struct harness_pool_info before, after;
	kvp_session *s, *s2;
	kvp_client *c;
	kvp_pool *p;

	prompt(t, 128, 1, 40, 48);
	connect_pool(h, &c, &p);
	s = commit_keyed(p, NULL, t, 128, &a, 1, NULL, 0);
	/* The same tokens under image A: all 8 pages; under image B, or
	 * under no image, only pages 0 and 1 (page 2 holds tokens 32..47,
	 * the span starts at 40). */
	expect(p, t, 128, NULL, &a, 1, 128);
	expect(p, t, 128, NULL, &b, 1, 32);
	expect(p, t, 128, NULL, NULL, 0, 32);
	/* The same image one token later is another image position. */
	expect(p, t, 128, NULL, &a_moved, 1, 32);
	/* A span that starts past the prompt changes nothing. */
	expect(p, t, 32, NULL, &a, 1, 32);

	/* Image B behind the same tokens: its own pages from page 2 on. */
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &before), 0);
	s2 = commit_keyed(p, NULL, t, 128, &b, 1, NULL, 0);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &after), 0);
	assert_int_equal(after.dedup_pages - before.dedup_pages, 2);
	assert_int_equal(after.indexed_pages - before.indexed_pages, 6);
	expect(p, t, 128, NULL, &b, 1, 128);
	expect(p, t, 128, NULL, &a, 1, 128);
	assert_int_equal(kvp_session_close(s2), 0);

	/* The same image at the same place shares every page. */
	before = after;
	s2 = commit_keyed(p, NULL, t, 128, &a, 1, NULL, 0);
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &after), 0);
	assert_int_equal(after.dedup_pages - before.dedup_pages, 8);
	assert_int_equal(kvp_session_close(s2), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* ---- LoRA ---------------------------------------------------------------- */

static void test_lora(void **state)
{
	struct harness *h = *state;
	uint32_t t[100];
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p, *salted;

	harness_tokens(t, 100, 2, 0);
	connect_pool(h, &c, &p);
	s = commit_keyed(p, "lora-1", t, 100, NULL, 0, NULL, 0);
	expect(p, t, 100, "lora-1", NULL, 0, 96);
	expect(p, t, 100, NULL, NULL, 0, 0);
	expect(p, t, 100, "lora-2", NULL, 0, 0);
	expect(p, t, 100, "lora-", NULL, 0, 0);
	/* The extra key is not a salt: a salt of the same bytes is another
	 * chain. */
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &salted), 0);
	assert_int_equal(kvp_pool_set_salt(salted, "lora-1", 6), 0);
	expect(salted, t, 100, NULL, NULL, 0, 0);
	expect(salted, t, 100, "lora-1", NULL, 0, 0);
	/* A fork keeps the extra key: its commits are found under it. */
	{
		kvp_session *f;
		uint32_t more[132];

		memcpy(more, t, sizeof(t));
		harness_tokens(more + 100, 32, 3, 100);
		assert_int_equal(kvp_session_fork(s, 100, &f), 0);
		assert_int_equal(kvp_append(f, more + 100, 32), 0);
		assert_int_equal(kvp_commit(f, 32), 0);
		expect(p, more, 132, "lora-1", NULL, 0, 128);
		expect(p, more, 132, NULL, NULL, 0, 0);
		assert_int_equal(kvp_session_close(f), 0);
	}
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* ---- boundaries: appends, requests, pages --------------------------------- */

#define LONG 2000u

static void test_boundaries(void **state)
{
	struct harness *h = *state;
	static uint32_t t[LONG];
	/* Three images: one across the append cut at 500, one across the
	 * 4 KiB requests' boundaries (about 760 tokens each), one over many
	 * pages; a fourth of one token inside a page. */
	struct kvp_key_span sp[] = {
		span(490, 30, "img-1"),
		span(700, 150, "img-2"),
		span(1203, 1, "img-3"),
		span(1300, 400, "img-4"),
	};
	struct kvp_key_span other[4];
	const size_t cuts[] = {500, 505, 1301};
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;

	harness_tokens(t, LONG, 4, 0);
	for (size_t i = 0; i < 4; i++)
		for (uint64_t k = sp[i].first_token; k < sp[i].first_token + sp[i].n_tokens; k++)
			t[k] = IMG;
	connect_pool(h, &c, &p);
	s = commit_keyed(p, NULL, t, LONG, sp, 4, cuts, 3);
	expect(p, t, LONG, NULL, sp, 4, LONG);
	/* Each image swapped in turn: the match stops at its first page. */
	for (size_t i = 0; i < 4; i++) {
		memcpy(other, sp, sizeof(sp));
		other[i].key = "another";
		other[i].key_len = 7;
		expect(p, t, LONG, NULL, other, 4, other[i].first_token / BT * BT);
	}
	/* Only the spans before a point given: the match goes that far. */
	expect(p, t, LONG, NULL, sp, 2, 1200);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* ---- fork, truncate, checkpoint ------------------------------------------ */

static void test_fork_truncate(void **state)
{
	struct harness *h = *state;
	uint32_t t[128], u[128], w[128];
	struct kvp_key_span a = span(40, 48, "image-A"), cut = span(40, 20, "image-A");
	struct kvp_key_span b = span(40, 48, "image-B");
	kvp_session *s, *f;
	kvp_client *c;
	kvp_pool *p;

	prompt(t, 128, 5, 40, 48);
	/* u: t's first 60 tokens (inside the image), then text. */
	memcpy(u, t, 60 * sizeof(uint32_t));
	harness_tokens(u + 60, 68, 6, 60);
	memcpy(w, t, 60 * sizeof(uint32_t));
	harness_tokens(w + 60, 68, 10, 60);
	connect_pool(h, &c, &p);
	s = commit_keyed(p, NULL, t, 128, &a, 1, NULL, 0);

	/* A fork inside the image keeps the image up to the cut: its own
	 * tokens after it hash without it. */
	assert_int_equal(kvp_session_fork(s, 60, &f), 0);
	assert_int_equal(kvp_append(f, u + 60, 68), 0);
	assert_int_equal(kvp_commit(f, 68), 0);
	expect(p, u, 128, NULL, &cut, 1, 128);
	expect(p, u, 128, NULL, &b, 1, 32);
	assert_int_equal(kvp_session_close(f), 0);

	/* Truncate inside the image, then other text: the same. */
	expect(p, w, 128, NULL, &cut, 1, 48);
	assert_int_equal(kvp_truncate(s, 60), 0);
	assert_int_equal(kvp_append(s, w + 60, 68), 0);
	assert_int_equal(kvp_commit(s, 68), 0);
	expect(p, w, 128, NULL, &cut, 1, 128);
	expect(p, w, 128, NULL, &b, 1, 32);
	expect(p, t, 128, NULL, &a, 1, 128); /* the pages before stay indexed */
	/* A span sent again over a page already hashed is refused. */
	{
		struct kvp_append_opts ao = {.size = sizeof(ao), .spans = &a, .n_spans = 1};

		assert_int_equal(kvp_append_opts(s, u, 1, &ao), -EINVAL);
		assert_non_null(strstr(kvp_strerror(c, -EINVAL), "key span"));
	}
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

static void test_checkpoint(void **state)
{
	struct harness *h = *state;
	uint32_t t[200];
	struct kvp_key_span sp[] = {span(40, 48, "image-A"), span(150, 60, "image-C")};
	struct kvp_key_span b[] = {span(40, 48, "image-B"), span(150, 60, "image-C")};
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;

	harness_tokens(t, 200, 7, 0);
	for (size_t k = 40; k < 88; k++)
		t[k] = IMG;
	for (size_t k = 150; k < 200; k++)
		t[k] = IMG;
	connect_pool(h, &c, &p);
	/* The last image runs past the committed tokens: checkpointed cut. */
	s = commit_keyed(p, "lora-9", t, 200, sp, 2, NULL, 0);
	assert_int_equal(kvp_session_checkpoint(s, "keyed", NULL), 0);
	kvp_disconnect(c);

	/* After a restart, a purge of the pages of that extra key empties
	 * the pool: only the restore can bring them back, hashed from the
	 * checkpoint's spans and extra key. */
	assert_int_equal(harness_restart(h, SIGTERM, args), 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_wait_scans(h), 0);
	expect(p, t, 200, "lora-9", sp, 2, 192);
	{
		struct kvp_purge_spec ps = {
			.flags = KVP_PURGE_SALT, .extra_key = "lora-9", .extra_key_len = 6};
		struct kvp_purge_result pr;
		kvp_client *admin;

		assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
		assert_int_equal(kvp_admin_purge(admin, &ps, &pr), 0);
		assert_true(pr.pages >= 12);
		kvp_disconnect(admin);
	}
	expect(p, t, 200, "lora-9", sp, 2, 0);
	assert_int_equal(kvp_session_restore(p, "keyed", &s), 0);
	assert_int_equal(kvp_session_committed(s), 200);
	expect(p, t, 200, "lora-9", sp, 2, 192);
	expect(p, t, 200, "lora-9", b, 2, 32);
	expect(p, t, 200, "lora-9", sp, 1, 144);
	expect(p, t, 200, NULL, sp, 2, 0);
	/* The restored session goes on under its keys: its next pages are
	 * found under the image span it holds (cut at 200, so a new span
	 * continues the content from there). */
	{
		uint32_t more[40];
		struct kvp_key_span cont = span(200, 40, "image-D");
		struct kvp_append_opts ao = {.size = sizeof(ao), .spans = &cont, .n_spans = 1};
		uint32_t all[240];
		struct kvp_key_span all_sp[] = {sp[0], span(150, 50, "image-C"), cont};

		for (size_t k = 0; k < 40; k++)
			more[k] = IMG;
		assert_int_equal(kvp_append_opts(s, more, 40, &ao), 0);
		assert_int_equal(kvp_commit(s, 40), 0);
		memcpy(all, t, sizeof(t));
		memcpy(all + 200, more, sizeof(more));
		expect(p, all, 240, "lora-9", all_sp, 3, 240);
		all_sp[2].key = "image-E";
		expect(p, all, 240, "lora-9", all_sp, 3, 192);
	}
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_library_refuses(void **state)
{
	struct harness *h = *state;
	uint32_t t[64];
	char key65[65];
	struct kvp_key_span bad[][2] = {
		{span(10, 5, "a"), span(12, 5, "b")}, /* overlapping */
		{span(20, 5, "a"), span(10, 5, "b")}, /* unsorted */
		{span(10, 0, "a"), span(20, 1, "b")}, /* empty */
		{span(10, 5, ""), span(20, 1, "b")},  /* no key */
		{span(10, 5, key65), span(20, 1, "b")},
	};
	struct kvp_session_opts so = {.size = sizeof(so), .extra_key = key65, .extra_key_len = 65};
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	memset(key65, 'k', 64);
	key65[64] = 'k';
	bad[4][0].key_len = 65;
	harness_tokens(t, 64, 8, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(kvp_session_create_opts(p, &so, &s), -EINVAL);
	assert_int_equal(kvp_session_create_opts(p, NULL, &s), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvp_append_opts ao = {.size = sizeof(ao), .spans = bad[i], .n_spans = 2};
		struct kvp_match_opts mo = {.size = sizeof(mo), .spans = bad[i], .n_spans = 2};
		struct kvp_lookup_query q = {
			.tokens = t, .n_tokens = 64, .spans = bad[i], .n_spans = 2};
		struct kvp_lookup_result r;

		assert_int_equal(kvp_append_opts(s, t, 64, &ao), -EINVAL);
		assert_non_null(strstr(kvp_strerror(c, -EINVAL), "key"));
		assert_int_equal(kvp_match_prefix_opts(p, t, 64, &mo, &l), -EINVAL);
		assert_int_equal(kvp_prefetch_opts(p, t, 64, &mo, NULL), -EINVAL);
		assert_int_equal(kvp_lookup_batch(p, &q, 1, &r), -EINVAL);
	}
	assert_int_equal(kvp_session_tokens(s), 0);
	/* NULL options: the plain calls. */
	assert_int_equal(kvp_append_opts(s, t, 64, NULL), 0);
	assert_int_equal(kvp_commit(s, 64), 0);
	assert_int_equal(kvp_match_prefix_opts(p, t, 64, NULL, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 64);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* Expects one reply to req with status and an error naming what. */
static void expect_status(struct raw *r, Kvpalace__V1__Request *req, int status, const char *what)
{
	Kvpalace__V1__Response *resp;

	assert_int_equal(raw_send(r, req), 0);
	assert_int_equal(raw_recv(r, &resp, NULL), 1);
	if (resp->id != req->id)
		fail_msg("reply %llu to request %llu: status %d (%s)", (unsigned long long)resp->id,
			 (unsigned long long)req->id, resp->status, resp->error ? resp->error : "");
	if ((int)resp->status != status)
		fail_msg("status %d (%s), expected %d", resp->status,
			 resp->error ? resp->error : "", status);
	if (what) {
		assert_non_null(resp->error);
		if (!strstr(resp->error, what))
			fail_msg("error \"%s\" does not say \"%s\"", resp->error, what);
	}
}

static void test_daemon_refuses(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__KeySpan ks[300], *kp[300];
	static uint8_t long_key[65];
	uint32_t t[64];
	uint64_t pool_id, sid;
	struct raw r;

	harness_tokens(t, 64, 9, 0);
	for (size_t i = 0; i < 300; i++) {
		kvpalace__v1__key_span__init(&ks[i]);
		ks[i].first_token = i;
		ks[i].n_tokens = 1;
		ks[i].key.data = (uint8_t *)"key";
		ks[i].key.len = 3;
		kp[i] = &ks[i];
	}
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_hello(&r), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);

	/* Overlapping, then unsorted. */
	raw_req_append(&req, &ap, sid, t, 64);
	ap.key_spans = kp;
	ap.n_key_spans = 2;
	ks[0].n_tokens = 2;
	expect_status(&r, &req, ST(INVALID), "overlap");
	ks[0].n_tokens = 1;
	ks[0].first_token = 5;
	expect_status(&r, &req, ST(INVALID), "sorted");
	ks[0].first_token = 0;
	/* An empty span, a key too long or empty, a span past 2^48. */
	ks[1].n_tokens = 0;
	expect_status(&r, &req, ST(INVALID), "1 token");
	ks[1].n_tokens = 1;
	ks[1].key.data = long_key; /* 65 bytes that exist */
	ks[1].key.len = 65;
	expect_status(&r, &req, ST(INVALID), "1..64 bytes");
	ks[1].key.data = (uint8_t *)"key";
	ks[1].key.len = 0;
	expect_status(&r, &req, ST(INVALID), "1..64 bytes");
	ks[1].key.len = 3;
	ks[1].first_token = 1ull << 50;
	expect_status(&r, &req, ST(INVALID), "2^48");
	ks[1].first_token = 1;
	/* More than 256 in one request. */
	ap.n_key_spans = 257;
	raw_req_append(&req, &ap, sid, t, 64);
	ap.key_spans = kp;
	ap.n_key_spans = 257;
	expect_status(&r, &req, ST(TOO_BIG), "256");
	/* A span starting past the appended tokens. */
	ks[100].first_token = 64;
	ap.key_spans = kp + 100;
	ap.n_key_spans = 1;
	expect_status(&r, &req, ST(INVALID), "past the tokens");
	ks[100].first_token = 100;
	/* Nothing was reserved by the refusals. */
	ap.key_spans = kp + 10;
	ap.n_key_spans = 1;
	expect_status(&r, &req, ST(OK), NULL);
	raw_req_commit(&req, &cm, sid, 64);
	expect_status(&r, &req, ST(OK), NULL);
	/* Spans that overlap the session's, or start on a hashed page. */
	raw_req_append(&req, &ap, sid, t, 16);
	ap.key_spans = kp + 10;
	ap.n_key_spans = 1;
	expect_status(&r, &req, ST(INVALID), "precedes");
	ap.key_spans = kp + 20;
	expect_status(&r, &req, ST(INVALID), "already hashed");

	/* A match's extra key on a later chunk; a raw span-keyed match. */
	raw_req_match(&req, &mp, pool_id, t, 64);
	mp.has_lease_id = 1;
	mp.lease_id = 12345;
	mp.has_extra_key = 1;
	mp.extra_key.data = (uint8_t *)"x";
	mp.extra_key.len = 1;
	expect_status(&r, &req, ST(INVALID), "first chunk");
	raw_req_match(&req, &mp, pool_id, t, 64);
	mp.has_extra_key = 1;
	mp.extra_key.data = long_key;
	mp.extra_key.len = 65;
	expect_status(&r, &req, ST(INVALID), "extra key");
	raw_req_match(&req, &mp, pool_id, t, 64);
	ap.key_spans = NULL;
	mp.key_spans = kp + 10;
	mp.n_key_spans = 1;
	expect_status(&r, &req, ST(OK), NULL);
	raw_close(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_images, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_lora, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_boundaries, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_fork_truncate, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_library_refuses, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_daemon_refuses, setup_big, harness_teardown),
	};

	return cmocka_run_group_tests_name("keys", tests, NULL, NULL);
}
