/* tests/integration/test_pipeline.c — pipelined requests over a raw socket.
 *
 * Many requests of mixed kinds (some that succeed, some that fail) are sent
 * back to back before any reply is read; each must be answered exactly
 * once, with its own id and the status its kind calls for, in whatever
 * order. The side effects must have happened exactly once too: every
 * pipelined one-token append is there to commit afterwards. Several frames
 * in one datagram are served like separate ones (their replies may share a
 * datagram; a lone request's reply never does); too many frames, or a bad
 * frame among good ones, end the connection after the good ones before it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	"pipeline-model"
#define N_REQ	600
#define ID_BASE 100000u
/* More requests than any daemon would queue replies for. */
#define CONN_QUEUE_HINT 64

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

enum kind { K_HELLO, K_STATS, K_APPEND, K_BAD_SESSION, K_BAD_LEASE, K_MATCH, N_KINDS };

/* Sends request i of the mix; returns raw_send's result. */
static int send_one(struct raw *r, int i, uint64_t pool_id, uint64_t sid, uint32_t *tokens,
		    int *n_append)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__StatsRequest stats;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CloseSessionRequest cl;
	Kvpalace__V1__ReleaseRequest rel;
	Kvpalace__V1__MatchPrefixRequest mp;
	int ret;

	switch (i % N_KINDS) {
	case K_HELLO:
		raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
		break;
	case K_STATS:
		raw_req_stats(&req, &stats);
		break;
	case K_APPEND:
		raw_req_append(&req, &app, sid, &tokens[*n_append], 1);
		break;
	case K_BAD_SESSION:
		raw_req_close_session(&req, &cl, 999999999);
		break;
	case K_BAD_LEASE:
		raw_req_release(&req, &rel, 888888888);
		break;
	default:
		raw_req_match(&req, &mp, pool_id, tokens, 4);
		break;
	}
	req.id = ID_BASE + (uint64_t)i;
	ret = raw_send(r, &req);
	if (ret == 0 && i % N_KINDS == K_APPEND)
		(*n_append)++;
	return ret;
}

static void check_reply(const Kvpalace__V1__Response *resp, uint8_t *seen, int n_append)
{
	uint64_t i;
	int want;

	assert_true(resp->id >= ID_BASE && resp->id < ID_BASE + N_REQ);
	i = resp->id - ID_BASE;
	if (seen[i])
		fail_msg("request %llu answered twice", (unsigned long long)resp->id);
	seen[i] = 1;
	want = i % N_KINDS == K_BAD_SESSION || i % N_KINDS == K_BAD_LEASE ? ST(NOT_FOUND) : ST(OK);
	if ((int)resp->status != want)
		fail_msg("request %llu (kind %d): status %d (%s)", (unsigned long long)resp->id,
			 (int)(i % N_KINDS), resp->status, resp->error ? resp->error : "");
	if (i % N_KINDS == K_APPEND) {
		assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP_APPEND);
		assert_true(resp->append->first_token < (uint64_t)n_append);
	}
	if (i % N_KINDS == K_MATCH) {
		/* Nothing is committed yet: a miss. */
		assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX);
		assert_int_equal(resp->match_prefix->matched_tokens, 0);
	}
}

static void test_pipelined_ids(void **state)
{
	struct harness *h = *state;
	struct raw r;
	uint64_t pool_id, sid;
	uint32_t tokens[N_REQ];
	uint8_t seen[N_REQ] = {0};
	int n_append = 0, sent = 0, received = 0;

	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);
	harness_tokens(tokens, N_REQ, 50, 0);

	/* Send as fast as the socket takes them; read only when it will not
	 * take more (the daemon stops reading while many replies wait). */
	assert_int_equal(fcntl(r.sock, F_SETFL, fcntl(r.sock, F_GETFL) | O_NONBLOCK), 0);
	while (received < N_REQ) {
		struct pollfd pfd = {.fd = r.sock, .events = POLLIN};
		Kvpalace__V1__Response *resp;
		int ret;

		while (sent < N_REQ) {
			ret = send_one(&r, sent, pool_id, sid, tokens, &n_append);
			if (ret == -EAGAIN)
				break;
			assert_int_equal(ret, 0);
			sent++;
		}
		if (sent < N_REQ)
			pfd.events |= POLLOUT;
		assert_int_equal(poll(&pfd, 1, 20000), 1);
		if (!(pfd.revents & POLLIN))
			continue;
		ret = raw_recv(&r, &resp, NULL);
		if (ret == -EAGAIN)
			continue;
		assert_int_equal(ret, 1);
		check_reply(resp, seen, n_append);
		received++;
	}
	assert_int_equal(fcntl(r.sock, F_SETFL, fcntl(r.sock, F_GETFL) & ~O_NONBLOCK), 0);
	for (int i = 0; i < N_REQ; i++)
		assert_true(seen[i]);

	/* No stray replies: the next one answers the next request. */
	{
		Kvpalace__V1__Request req;
		Kvpalace__V1__CommitRequest cm;
		Kvpalace__V1__Response *resp;

		raw_req_commit(&req, &cm, sid, (uint64_t)n_append);
		req.id = 4242;
		assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
		assert_int_equal(resp->id, 4242);
		assert_int_equal(resp->status, ST(OK));
		/* Every pipelined append happened once. */
		assert_int_equal(resp->commit->committed_tokens, n_append);
		raw_req_commit(&req, &cm, sid, 1);
		assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
		assert_int_equal(resp->status, ST(RANGE));
	}
	raw_close(&r);
}

/* Requests a worker thread answers (ListCheckpoints here; Checkpoint,
 * Restore and Warmup alike) pipelined on one connection: each must be
 * answered once, in order, and a connection that closes with several in
 * flight must not take the daemon down. Scenario: issue 14's hostile user,
 * who crashed the daemon (use after free in conn_deliver) within 2-178
 * such connections, because the second job overwrote the connection's
 * ticket and the close cleared only the last. */
static void list_req(Kvpalace__V1__Request *req, Kvpalace__V1__ListCheckpointsRequest *op,
		     uint64_t id)
{
	kvpalace__v1__request__init(req);
	kvpalace__v1__list_checkpoints_request__init(op);
	req->id = id;
	req->op_case = KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS;
	req->list_checkpoints = op;
}

static void test_worker_requests_pipelined(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__ListCheckpointsRequest op[6];
	Kvpalace__V1__Request req[6], *batch[3];
	Kvpalace__V1__Response *resp;
	struct raw r;

	/* Three in three datagrams, three in one: six replies in order. */
	assert_int_equal(raw_open(&r, h->sock), 0);
	r.batched_ok = 1;
	assert_int_equal(raw_hello(&r), 0);
	for (int i = 0; i < 6; i++)
		list_req(&req[i], &op[i], 700 + (uint64_t)i);
	for (int i = 0; i < 3; i++)
		assert_int_equal(raw_send(&r, &req[i]), 0);
	for (int i = 0; i < 3; i++)
		batch[i] = &req[3 + i];
	assert_int_equal(raw_send_batch(&r, batch, 3), 0);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(raw_recv(&r, &resp, NULL), 1);
		assert_int_equal(resp->id, 700 + (uint64_t)i);
		assert_int_equal(resp->status, ST(OK));
		assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP_LIST_CHECKPOINTS);
	}
	raw_close(&r);

	/* Closing with worker requests in flight, many times over. */
	for (int round = 0; round < 300; round++) {
		assert_int_equal(raw_open(&r, h->sock), 0);
		assert_int_equal(raw_hello(&r), 0);
		for (int i = 0; i < 3; i++) {
			list_req(&req[i], &op[i], 800 + (uint64_t)i);
			assert_int_equal(raw_send(&r, &req[i]), 0);
		}
		if (round % 2) {
			for (int i = 0; i < 3; i++)
				batch[i] = &req[3 + i];
			for (int i = 3; i < 6; i++)
				list_req(&req[i], &op[i], 800 + (uint64_t)i);
			assert_int_equal(raw_send_batch(&r, batch, 3), 0);
		}
		raw_close(&r);
		assert_true(harness_daemon_alive(h));
	}
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_hello(&r), 0);
	raw_close(&r);
}

/* Two pipelining connections interleaved: replies never cross over. */
static void test_two_pipelines(void **state)
{
	struct harness *h = *state;
	struct raw a, b;

	assert_int_equal(raw_open(&a, h->sock), 0);
	assert_int_equal(raw_open(&b, h->sock), 0);
	for (int i = 0; i < 50; i++) {
		Kvpalace__V1__Request req;
		Kvpalace__V1__HelloRequest hello;

		raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
		req.id = 1000 + (uint64_t)i;
		assert_int_equal(raw_send(&a, &req), 0);
		req.id = 2000 + (uint64_t)i;
		assert_int_equal(raw_send(&b, &req), 0);
	}
	for (int i = 0; i < 50; i++) {
		Kvpalace__V1__Response *resp;

		assert_int_equal(raw_recv(&b, &resp, NULL), 1);
		assert_true(resp->id >= 2000 && resp->id < 2050);
		assert_int_equal(raw_recv(&a, &resp, NULL), 1);
		assert_true(resp->id >= 1000 && resp->id < 1050);
	}
	raw_close(&a);
	raw_close(&b);
}

/* A client that sends without ever reading its replies fills its socket
 * and stops; it must not stall the daemon for anyone else. */
static void test_client_that_never_reads(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req;
	Kvpalace__V1__StatsRequest stats;
	uint32_t tokens[32];
	struct raw stuck;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	int sent = 0, ret = 0;

	assert_int_equal(raw_open(&stuck, h->sock), 0);
	assert_int_equal(fcntl(stuck.sock, F_SETFL, fcntl(stuck.sock, F_GETFL) | O_NONBLOCK), 0);
	raw_req_stats(&req, &stats);
	while (sent < 1000000 && (ret = raw_send(&stuck, &req)) == 0)
		sent++;
	assert_int_equal(ret, -EAGAIN);
	assert_true(sent > CONN_QUEUE_HINT);

	harness_tokens(tokens, 32, 51, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 32, &s), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 32, &l), 0);
	assert_int_equal(harness_check_lease(l, p, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	raw_close(&stuck);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

/* ---- several frames in one datagram ------------------------------------ */

/* Receives replies (possibly gathered) until the connection closes or
 * `want` replies came; records each id's status in st[] (indexed by
 * id - base), -1 for no reply. Returns the number of replies, and in
 * *ret_closed whether the connection was closed. */
static int collect(struct raw *r, uint64_t base, int *st, int n_ids, int want, int *fds,
		   int *ret_closed)
{
	int got = 0;

	*ret_closed = 0;
	for (int i = 0; i < n_ids; i++)
		st[i] = -1;
	while (got < want) {
		Kvpalace__V1__Response *resp;
		int fd = -1;
		int ret = raw_recv(r, &resp, &fd);

		assert_true(ret >= 0);
		if (ret == 0) {
			*ret_closed = 1;
			break;
		}
		got++;
		if (resp->id < base || resp->id >= base + (uint64_t)n_ids) {
			/* An error about the datagram itself carries no request id. */
			assert_int_equal(resp->id, 0);
			assert_int_equal(resp->status, ST(PROTOCOL));
			if (fd >= 0)
				close(fd);
			continue;
		}
		if (st[resp->id - base] != -1)
			fail_msg("request %llu answered twice", (unsigned long long)resp->id);
		st[resp->id - base] = (int)resp->status;
		if (fds)
			fds[resp->id - base] = fd;
		else if (fd >= 0)
			close(fd);
	}
	return got;
}

static void test_batched_frames(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req[8], *reqs[8];
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__StatsRequest stats;
	Kvpalace__V1__AppendRequest app[3];
	Kvpalace__V1__CloseSessionRequest cl;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	Kvpalace__V1__Response *resp;
	uint32_t tokens[3];
	uint64_t pool_id, sid;
	int st[8], fds[8], closed;
	struct raw r;

	harness_tokens(tokens, 3, 52, 0);
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &sid), 0);
	raw_req_hello(&req[0], &hello, KVP_PROTOCOL_VERSION);
	raw_req_stats(&req[1], &stats);
	for (int i = 0; i < 3; i++)
		raw_req_append(&req[2 + i], &app[i], sid, &tokens[i], 1);
	raw_req_close_session(&req[5], &cl, 777777777);
	raw_req_open_pool(&req[6], &op, &lay, "pipeline-model-2", &harness_layout);
	raw_req_commit(&req[7], &cm, sid, 3);
	for (int i = 0; i < 8; i++) {
		req[i].id = 500 + (uint64_t)i;
		reqs[i] = &req[i];
		fds[i] = -1;
	}
	assert_int_equal(raw_send_batch(&r, reqs, 8), 0);
	r.batched_ok = 1;
	assert_int_equal(collect(&r, 500, st, 8, 8, fds, &closed), 8);
	for (int i = 0; i < 8; i++)
		assert_int_equal(st[i], i == 5 ? ST(NOT_FOUND) : ST(OK));
	/* The OpenPool reply still carries its arena. */
	assert_true(fds[6] >= 0);
	close(fds[6]);

	/* A lone request afterwards gets a lone reply. */
	r.batched_ok = 0;
	raw_req_hello(&req[0], &hello, KVP_PROTOCOL_VERSION);
	assert_int_equal(raw_call(&r, &req[0], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK));
	raw_close(&r);
}

static void test_batch_too_many_frames(void **state)
{
	struct harness *h = *state;
	enum { N = FRAME_MAX_BATCH + 1 };
	Kvpalace__V1__Request req[N], *reqs[N];
	Kvpalace__V1__HelloRequest hello;
	int st[N], closed, got;
	struct raw r;

	raw_req_hello(&req[0], &hello, KVP_PROTOCOL_VERSION);
	for (int i = 0; i < N; i++) {
		req[i] = req[0];
		req[i].id = 1000 + (uint64_t)i;
		reqs[i] = &req[i];
	}
	assert_int_equal(raw_open(&r, h->sock), 0);
	r.batched_ok = 1;
	assert_int_equal(raw_send_batch(&r, reqs, N), 0);
	got = collect(&r, 1000, st, N, N + 1, NULL, &closed);
	assert_true(closed);
	/* No more than the allowed frames were served, and the excess was
	 * reported as a protocol error. */
	assert_int_equal(st[N - 1], -1);
	assert_true(got >= 1);
	raw_close(&r);
}

static void test_batch_bad_frame_in_middle(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req[3];
	Kvpalace__V1__HelloRequest hello;
	int st[4], closed;
	size_t used = 0;
	struct raw r;
	int k;

	assert_int_equal(raw_open(&r, h->sock), 0);
	for (int i = 0; i < 3; i++) {
		raw_req_hello(&req[i], &hello, KVP_PROTOCOL_VERSION);
		req[i].id = 2000 + (uint64_t)i;
		k = frame_pack_request(&req[i], r.buf + used, sizeof(r.buf) - used, sizeof(r.buf));
		assert_true(k > 0);
		if (i == 1)
			memcpy(r.buf + used, "XXXX", 4); /* the second frame: wrong magic */
		used += (size_t)k;
	}
	assert_int_equal(raw_send_bytes(&r, r.buf, used, -1), 0);
	r.batched_ok = 1;
	collect(&r, 2000, st, 3, 4, NULL, &closed);
	assert_true(closed);
	assert_int_equal(st[0], ST(OK)); /* the frame before is served */
	assert_int_equal(st[2], -1);	 /* the one after is not */
	raw_close(&r);

	/* A good frame followed by a few stray bytes. */
	assert_int_equal(raw_open(&r, h->sock), 0);
	raw_req_hello(&req[0], &hello, KVP_PROTOCOL_VERSION);
	req[0].id = 2000;
	k = frame_pack_request(&req[0], r.buf, sizeof(r.buf), sizeof(r.buf));
	assert_true(k > 0);
	memcpy(r.buf + k, "KVP1x", 5);
	assert_int_equal(raw_send_bytes(&r, r.buf, (size_t)k + 5, -1), 0);
	r.batched_ok = 1;
	collect(&r, 2000, st, 1, 3, NULL, &closed);
	assert_true(closed);
	assert_int_equal(st[0], ST(OK));
	raw_close(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_pipelined_ids, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_worker_requests_pipelined, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_two_pipelines, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_client_that_never_reads, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_batched_frames, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_batch_too_many_frames, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_batch_bad_frame_in_middle, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("pipeline", tests, NULL, NULL);
}
