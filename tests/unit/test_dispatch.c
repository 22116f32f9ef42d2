/* tests/unit/test_dispatch.c — requests through the service layer's
 * dispatch (daemon/service/dispatch.h), with no server, socket or
 * connection above it.
 *
 * Each request is a Kvpalace__V1__Request built in C, as a client's
 * library would send it, handed to dispatch(cache, peer, req, no_park,
 * reply) the way daemon/server/conn.c does (dispatch runs
 * validate_request itself; conn.c validates nothing before it). The
 * peers are struct peer made with peer_init over this file's own
 * peer_ops table: ticket_start records the ticket, deliver records the
 * late reply, reload_config counts its calls — as tests/fuzz/fuzz_request.c
 * does. A peer closing is what conn_close does to the daemon's state
 * (fuzz_request's conn_drop): leases released, reservations rolled back,
 * sessions closed unless persistent. The cache has no worker threads
 * (cache->worker NULL) but in the one test that starts a real loop and
 * worker (daemon/io) to see -EINPROGRESS and -EAGAIN.
 *
 * What a client checks: Hello's answer; OpenPool gives the same pool for
 * the same uid, model and layout, another for another uid, and another
 * uid's pool id is NOT_FOUND with the same reason as an id that never
 * existed; CreateSession / Append / Commit / MatchPrefix / Release answer
 * the counts and page slots that let a second process read the first
 * one's K/V through its own mapping of the arena; another uid's session id
 * and another connection's lease id are NOT_FOUND; admin operations on a
 * client socket are PERMISSION and change nothing; max-leases-per-client
 * refuses with LIMIT and pins nothing; a peer that goes leaves cache_check
 * == 0; dispatch returns 0 (an error is a Status), -EINPROGRESS only with
 * a worker (a Checkpoint without worker threads is answered INTERNAL at
 * once) and -EAGAIN only when it may park. Every reply passes
 * protobuf_c_message_check, and cache_check agrees after every request.
 * Single-threaded but for the worker's threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cache.h"
#include "config.h"
#include "dispatch.h"
#include "kvpalace.pb-c.h"
#include "le.h"
#include "lease.h"
#include "log.h"
#include "loop.h"
#include "peer.h"
#include "reply.h"
#include "session.h"
#include "stats.h"
#include "worker.h"

#define UID_A	   1000
#define UID_B	   2000
#define N_PAGES	   64u
#define PAGE	   4096u
#define BT	   4u
#define MAX_LEASES 2u

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

enum { PEER_A, PEER_A2, PEER_B, PEER_ADMIN, N_PEERS };

/* A reply that came through a ticket (deliver), as the client got it. */
struct late {
	int n;
	uint64_t id;
	int status;
	int op_case;
	uint64_t n_tokens, dropped;
};

struct dfx {
	struct config cfg;
	struct cache c;
	struct peer peers[N_PEERS];
	uint64_t next_id;
	/* What the peer_ops saw. */
	int n_tickets;
	struct ticket *ticket[N_PEERS];
	struct late late[N_PEERS];
	int n_reloads;
	/* The checkpoint directory of the one test that has one. */
	char dir[256];
	/* The loop and worker of the one test that has them. */
	struct loop loop;
	struct worker w;
	int have_worker;
};

static struct dfx *the; /* for the peer_ops, which get no context */

static int peer_index(const struct peer *p)
{
	for (int i = 0; i < N_PEERS; i++)
		if (p == &the->peers[i])
			return i;
	fail_msg("unknown peer");
	return -1;
}

/* ---- what the server would do (service/peer.h) ------------------------- */

static void t_ticket_start(struct peer *p, struct ticket *t, uint64_t id)
{
	int i = peer_index(p);

	/* One request of a connection at a time is answered later. */
	assert_null(the->ticket[i]);
	t->peer = p;
	t->id = id;
	t->batch = 0;
	the->ticket[i] = t;
	the->n_tickets++;
}

static void t_deliver(struct ticket *t, struct reply *r)
{
	int i = peer_index(t->peer);
	struct late *l = &the->late[i];

	assert_ptr_equal(the->ticket[i], t);
	assert_true(protobuf_c_message_check(&r->resp.base));
	the->ticket[i] = NULL;
	t->peer = NULL;
	l->n++;
	l->id = t->id;
	l->status = r->resp.status;
	l->op_case = r->resp.op_case;
	if (r->resp.op_case == KVPALACE__V1__RESPONSE__OP_COMPACT) {
		l->n_tokens = r->resp.compact->n_tokens;
		l->dropped = r->resp.compact->dropped_tokens;
	}
	if (r->pass_fd >= 0)
		close(r->pass_fd);
	r->pass_fd = -1;
}

static int t_reload(struct peer *p, const char *who, struct confview_reload *ret, char *err,
		    size_t errlen)
{
	(void)p;
	(void)who;
	(void)err;
	(void)errlen;
	memset(ret, 0, sizeof(*ret));
	the->n_reloads++;
	return 0;
}

static const struct peer_ops test_ops = {
	.ticket_start = t_ticket_start,
	.deliver = t_deliver,
	.reload_config = t_reload,
};

static void peer_open(struct dfx *f, int i)
{
	uid_t uid = i == PEER_ADMIN ? 0 : i == PEER_B ? UID_B : UID_A;

	peer_init(&f->peers[i], &test_ops, uid, uid, getpid(), i == PEER_ADMIN);
}

/* What conn_close does to the daemon's state (release_client_state). */
static void peer_close(struct dfx *f, int i)
{
	struct peer *c = &f->peers[i];
	struct session_left left = {0};
	struct list *it, *tmp;

	if (f->ticket[i])
		f->ticket[i]->peer = NULL;
	f->ticket[i] = NULL;
	list_for_each_safe (it, tmp, &c->leases)
		lease_release(&f->c, list_entry(it, struct lease, owner_link));
	c->n_leases = 0;
	c->n_leased_pages = 0;
	list_for_each_safe (it, tmp, &c->writing.sessions)
		session_rollback(&f->c, list_entry(it, struct session, writer_link));
	assert_int_equal(c->writing.reserved_pages, 0);
	session_owner_release(&f->c, &c->sessions, &left);
	assert_int_equal(cache_check(&f->c), 0);
}

static int setup(void **state)
{
	struct dfx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	log_set_level(LOG_WARNING);
	config_defaults(&f->cfg);
	f->cfg.host_pool_bytes = (uint64_t)N_PAGES * PAGE;
	f->cfg.host_tier_bytes = 16 * f->cfg.host_pool_bytes;
	f->cfg.host_tenant_bytes = 0;
	f->cfg.host_high_watermark = 1.0;
	f->cfg.host_low_watermark = 1.0;
	f->cfg.disk_pool_bytes = 0;
	f->cfg.gpu_pool_bytes = 0;
	f->cfg.max_leases_per_conn = MAX_LEASES;
	cache_init(&f->c, &f->cfg);
	for (int i = 0; i < N_PEERS; i++)
		peer_open(f, i);
	the = f;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct dfx *f = *state;

	for (int i = 0; i < N_PEERS; i++)
		peer_close(f, i);
	if (f->have_worker) {
		/* A test that failed half-way left jobs: they finish here
		 * (done() on this thread), their peers gone. */
		worker_fini(&f->w);
		f->c.worker = NULL;
		loop_fini(&f->loop);
	}
	assert_int_equal(cache_check(&f->c), 0);
	if (f->c.ckpt_dir_fd >= 0)
		close(f->c.ckpt_dir_fd);
	f->c.ckpt_dir_fd = -1;
	cache_fini(&f->c);
	if (f->dir[0])
		rmdir(f->dir);
	free(f);
	the = NULL;
	return 0;
}

/* ---- requests ---------------------------------------------------------- */

/* dispatch as conn.c calls it; a reply it made is checked as a client
 * would decode it. Returns dispatch's result; r must be reply_fini'd. */
static int send_req(struct dfx *f, int peer, Kvpalace__V1__Request *req, int no_park,
		    struct reply *r)
{
	int ret;

	req->id = ++f->next_id;
	ret = dispatch(&f->c, &f->peers[peer], req, no_park, r);
	if (ret == 0) {
		assert_true(protobuf_c_message_check(&r->resp.base));
		assert_int_equal(r->resp.id, req->id);
		if (r->resp.status != ST(OK)) {
			assert_int_equal(r->resp.op_case, KVPALACE__V1__RESPONSE__OP__NOT_SET);
			assert_non_null(r->resp.error);
			assert_int_equal(r->pass_fd, -1);
		}
	}
	assert_int_equal(cache_check(&f->c), 0);
	return ret;
}

/* The status of a request answered at once, and its reason in why[]. */
static int status_of(struct dfx *f, int peer, Kvpalace__V1__Request *req, char *why, size_t n)
{
	struct reply r;
	int status;

	assert_int_equal(send_req(f, peer, req, 0, &r), 0);
	status = r.resp.status;
	if (why)
		snprintf(why, n, "%s", r.resp.error ? r.resp.error : "");
	if (r.pass_fd >= 0)
		close(r.pass_fd);
	reply_fini(&r);
	return status;
}

static Kvpalace__V1__Layout test_layout(void)
{
	Kvpalace__V1__Layout l = KVPALACE__V1__LAYOUT__INIT;

	l.n_layers = 1;
	l.n_kv_heads = 1;
	l.head_dim = 8;
	l.block_tokens = BT;
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	return l;
}

struct arena {
	uint8_t *map;
	uint64_t bytes, page_bytes;
};

/* OpenPool as peer; OK asserted. With a, the arena is mapped from the
 * descriptor the reply passed, as the client library maps it. */
static uint64_t open_pool(struct dfx *f, int peer, const char *model, struct arena *a)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Layout l = test_layout();
	struct reply r;
	uint64_t id;

	op.model_id = (char *)model;
	op.layout = &l;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;
	assert_int_equal(send_req(f, peer, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.op_case, KVPALACE__V1__RESPONSE__OP_OPEN_POOL);
	assert_true(r.pass_fd >= 0);
	assert_int_equal(r.resp.open_pool->n_pages, N_PAGES);
	assert_int_equal(r.resp.open_pool->page_bytes, PAGE);
	assert_true(r.resp.open_pool->arena_bytes >= (uint64_t)N_PAGES * PAGE);
	id = r.resp.open_pool->pool_id;
	if (a) {
		a->bytes = r.resp.open_pool->arena_bytes;
		a->page_bytes = r.resp.open_pool->page_bytes;
		a->map = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.pass_fd, 0);
		assert_true(a->map != MAP_FAILED);
	}
	close(r.pass_fd);
	reply_fini(&r);
	return id;
}

static void arena_unmap(struct arena *a)
{
	munmap(a->map, a->bytes);
}

static Kvpalace__V1__Request create_session_req(Kvpalace__V1__CreateSessionRequest *op,
						uint64_t pool_id)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__create_session_request__init(op);
	op->pool_id = pool_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	req.create_session = op;
	return req;
}

static uint64_t create_session(struct dfx *f, int peer, uint64_t pool_id, int persistent)
{
	Kvpalace__V1__CreateSessionRequest op;
	Kvpalace__V1__Request req = create_session_req(&op, pool_id);
	struct reply r;
	uint64_t id;

	if (persistent)
		op.has_persistent = op.persistent = 1;
	assert_int_equal(send_req(f, peer, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	id = r.resp.create_session->session_id;
	assert_true(id != 0);
	reply_fini(&r);
	return id;
}

static Kvpalace__V1__Request append_req(Kvpalace__V1__AppendRequest *op, uint64_t sid,
					uint32_t *tokens, size_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__append_request__init(op);
	op->session_id = sid;
	op->tokens = tokens;
	op->n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = op;
	return req;
}

static Kvpalace__V1__Request commit_req(Kvpalace__V1__CommitRequest *op, uint64_t sid, uint64_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__commit_request__init(op);
	op->session_id = sid;
	op->n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = op;
	return req;
}

static Kvpalace__V1__Request match_req(Kvpalace__V1__MatchPrefixRequest *op, uint64_t pool_id,
				       uint32_t *tokens, size_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__match_prefix_request__init(op);
	op->pool_id = pool_id;
	op->tokens = tokens;
	op->n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	req.match_prefix = op;
	return req;
}

static Kvpalace__V1__Request release_req(Kvpalace__V1__ReleaseRequest *op, uint64_t lease_id)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__release_request__init(op);
	op->lease_id = lease_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = op;
	return req;
}

static void tokens(uint32_t *ids, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = base + i;
}

/* Appends tokens base.. base+n-1, writes byte (v + i) into page slot i
 * of those the reply names through the mapping, commits them; returns
 * the session's page slots (n_pages of them) in slots[]. */
static void append_write_commit(struct dfx *f, int peer, uint64_t sid, const struct arena *a,
				uint32_t base, uint32_t n, uint8_t v, uint32_t *slots)
{
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__CommitRequest cm;
	uint32_t *ids = malloc(n * sizeof(*ids));
	Kvpalace__V1__Request req;
	uint32_t n_pages = (n + BT - 1) / BT;
	struct reply r;

	assert_non_null(ids);
	tokens(ids, n, base);
	req = append_req(&ap, sid, ids, n);
	assert_int_equal(send_req(f, peer, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.append->first_token, 0);
	assert_int_equal(r.resp.append->first_page, 0);
	assert_int_equal(r.resp.append->n_page_slots, n_pages);
	for (uint32_t i = 0; i < n_pages; i++) {
		slots[i] = r.resp.append->page_slots[i];
		assert_true(slots[i] < N_PAGES);
		if (a)
			memset(a->map + (uint64_t)slots[i] * a->page_bytes, v + i, a->page_bytes);
	}
	reply_fini(&r);

	req = commit_req(&cm, sid, n);
	assert_int_equal(send_req(f, peer, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.commit->committed_tokens, n);
	if (n / BT) {
		/* The pages it filled, with their slots after dedup. */
		assert_true(r.resp.commit->has_first_page);
		assert_int_equal(r.resp.commit->first_page, 0);
		assert_int_equal(r.resp.commit->n_page_slots, n / BT);
		for (uint32_t i = 0; i < n / BT; i++)
			slots[i] = r.resp.commit->page_slots[i];
	}
	reply_fini(&r);
	free(ids);
}

/* MatchPrefix of tokens base.. base+n-1 as peer: the lease id (0 for a
 * miss), the tokens matched and the slots. */
static uint64_t match(struct dfx *f, int peer, uint64_t pool_id, uint32_t base, uint32_t n,
		      uint64_t *ret_matched, uint32_t *slots)
{
	Kvpalace__V1__MatchPrefixRequest mp;
	uint32_t *ids = malloc(n * sizeof(*ids));
	Kvpalace__V1__Request req;
	struct reply r;
	uint64_t lease;

	assert_non_null(ids);
	tokens(ids, n, base);
	req = match_req(&mp, pool_id, ids, n);
	assert_int_equal(send_req(f, peer, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.op_case, KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX);
	lease = r.resp.match_prefix->lease_id;
	*ret_matched = r.resp.match_prefix->matched_tokens;
	assert_int_equal(r.resp.match_prefix->n_page_slots, *ret_matched / BT);
	for (size_t i = 0; slots && i < r.resp.match_prefix->n_page_slots; i++)
		slots[i] = r.resp.match_prefix->page_slots[i];
	reply_fini(&r);
	free(ids);
	return lease;
}

/* ---- the tests ----------------------------------------------------------- */

/* Hello: version 1 is spoken and the answer says who asked; another
 * version is STATUS_VERSION. */
static void test_hello(void **state)
{
	struct dfx *f = *state;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__HelloRequest h = KVPALACE__V1__HELLO_REQUEST__INIT;
	struct reply r;

	h.protocol_version = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &h;
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.op_case, KVPALACE__V1__RESPONSE__OP_HELLO);
	assert_int_equal(r.resp.hello->protocol_version, 1);
	assert_int_equal(r.resp.hello->uid, UID_A);
	assert_false(r.resp.hello->admin);
	assert_int_equal(r.resp.hello->max_message_bytes, f->cfg.max_message_bytes);
	assert_true(r.resp.hello->max_tokens_per_request > 0);
	reply_fini(&r);
	assert_int_equal(send_req(f, PEER_ADMIN, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_true(r.resp.hello->admin);
	reply_fini(&r);
	h.protocol_version = 2;
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(VERSION));
	/* A request with no operation is the validator's: PROTOCOL. */
	req.op_case = KVPALACE__V1__REQUEST__OP__NOT_SET;
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(PROTOCOL));
}

/* OpenPool: one pool per uid, model and layout, whichever connection
 * asks; another uid gets its own, and cannot tell the first uid's id from
 * one that never existed. */
static void test_open_pool_per_tenant(void **state)
{
	struct dfx *f = *state;
	uint64_t pa = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t pa2 = open_pool(f, PEER_A2, "model-x", NULL);
	uint64_t pother = open_pool(f, PEER_A, "model-y", NULL);
	uint64_t pb = open_pool(f, PEER_B, "model-x", NULL);
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Request req;
	char why_real[256], why_none[256];
	uint32_t ids[4];

	assert_int_equal(pa, pa2);
	assert_int_not_equal(pa, pother);
	assert_int_not_equal(pa, pb);
	assert_int_equal(open_pool(f, PEER_B, "model-x", NULL), pb);

	/* B on A's pool: NOT_FOUND, worded as for an id nobody has. */
	req = create_session_req(&cs, pa);
	assert_int_equal(status_of(f, PEER_B, &req, why_real, sizeof(why_real)), ST(NOT_FOUND));
	req = create_session_req(&cs, pa + pb + pother + 12345);
	assert_int_equal(status_of(f, PEER_B, &req, why_none, sizeof(why_none)), ST(NOT_FOUND));
	assert_string_equal(why_real, why_none);
	tokens(ids, 4, 1);
	req = match_req(&mp, pa, ids, 4);
	assert_int_equal(status_of(f, PEER_B, &req, why_real, sizeof(why_real)), ST(NOT_FOUND));
	req = match_req(&mp, pa + pb + pother + 12345, ids, 4);
	assert_int_equal(status_of(f, PEER_B, &req, why_none, sizeof(why_none)), ST(NOT_FOUND));
	assert_string_equal(why_real, why_none);
	/* A's own pool works for A. */
	req = create_session_req(&cs, pa);
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(OK));
}

/* One process computes a prompt and commits it; another process of the
 * same user matches it and reads the same bytes through its own mapping;
 * a third commits the same prompt and is handed the first one's pages. */
static void test_session_append_commit_match_release(void **state)
{
	struct dfx *f = *state;
	struct arena a, a2;
	uint64_t pool = open_pool(f, PEER_A, "model-x", &a);
	uint64_t s1, s2, lease, matched;
	uint32_t slots[3], got[3], again[3];
	Kvpalace__V1__ReleaseRequest rl;
	Kvpalace__V1__Request req;

	assert_int_equal(open_pool(f, PEER_A2, "model-x", &a2), pool);
	s1 = create_session(f, PEER_A, pool, 0);
	append_write_commit(f, PEER_A, s1, &a, 100, 10, 0x40, slots);

	lease = match(f, PEER_A2, pool, 100, 10, &matched, got);
	assert_true(lease != 0);
	assert_int_equal(matched, 8); /* the two full pages */
	assert_int_equal(got[0], slots[0]);
	assert_int_equal(got[1], slots[1]);
	for (uint32_t i = 0; i < 2; i++)
		for (uint64_t b = 0; b < a2.page_bytes; b++)
			assert_int_equal(a2.map[(uint64_t)got[i] * a2.page_bytes + b], 0x40 + i);
	assert_int_equal(f->peers[PEER_A2].n_leases, 1);
	assert_int_equal(f->peers[PEER_A2].n_leased_pages, 2);

	/* A prompt nobody computed: a miss, and no lease. */
	assert_int_equal(match(f, PEER_A2, pool, 9000, 8, &matched, NULL), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(f->peers[PEER_A2].n_leases, 1);

	/* The same prompt again, as a third session: after its commit its
	 * full pages are the first session's. */
	s2 = create_session(f, PEER_A2, pool, 0);
	append_write_commit(f, PEER_A2, s2, &a2, 100, 10, 0x70, again);
	assert_int_equal(again[0], slots[0]);
	assert_int_equal(again[1], slots[1]);
	assert_int_not_equal(again[2], slots[2]);
	assert_int_equal(a.map[(uint64_t)slots[0] * a.page_bytes], 0x40);

	/* The lease is A2's connection's: A (same uid) cannot release it. */
	req = release_req(&rl, lease);
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(NOT_FOUND));
	assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(OK));
	assert_int_equal(f->peers[PEER_A2].n_leases, 0);
	assert_int_equal(f->peers[PEER_A2].n_leased_pages, 0);
	assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(NOT_FOUND));
	arena_unmap(&a);
	arena_unmap(&a2);
}

/* MatchPrefix with tokens_le: bytes at any address (the daemon reads them
 * in place only when they are 4-aligned) match as the varint form does and
 * answer with the same slots in page_slots_le. */
static void test_match_tokens_le_any_alignment(void **state)
{
	struct dfx *f = *state;
	struct arena a;
	uint64_t pool = open_pool(f, PEER_A, "model-x", &a);
	uint64_t s1, matched;
	uint32_t slots[3], got[3], ids[10];
	unsigned char buf[4 * 10 + 8];
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rl;
	Kvpalace__V1__Request req;
	struct reply r;

	s1 = create_session(f, PEER_A, pool, 0);
	append_write_commit(f, PEER_A, s1, &a, 100, 10, 0x40, slots);
	assert_true(match(f, PEER_A2, pool, 100, 10, &matched, got) != 0);
	assert_int_equal(matched, 8);
	tokens(ids, 10, 100);
	for (size_t off = 0; off < 4; off++) {
		for (size_t i = 0; i < 10; i++)
			le_put32(buf + off + 4 * i, ids[i]);
		req = match_req(&mp, pool, NULL, 0);
		mp.has_tokens_le = 1;
		mp.tokens_le.data = buf + off;
		mp.tokens_le.len = 40;
		assert_int_equal(send_req(f, PEER_A2, &req, 0, &r), 0);
		assert_int_equal(r.resp.status, ST(OK));
		assert_int_equal(r.resp.match_prefix->matched_tokens, 8);
		assert_int_equal(r.resp.match_prefix->n_page_slots, 0);
		assert_true(r.resp.match_prefix->has_page_slots_le);
		assert_int_equal(r.resp.match_prefix->page_slots_le.len, 8);
		assert_int_equal(le_get32(r.resp.match_prefix->page_slots_le.data), got[0]);
		assert_int_equal(le_get32(r.resp.match_prefix->page_slots_le.data + 4), got[1]);
		req = release_req(&rl, r.resp.match_prefix->lease_id);
		reply_fini(&r);
		assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(OK));
	}
	arena_unmap(&a);
}

/* A first chunk that declares a long prompt reserves the lease's tables
 * for it (lease_reserve), but what the client's leases reserve together
 * stays within max-leased-pages: a client holding many one-page matches
 * of declared max-session-tokens prompts must not make the daemon
 * allocate max-leased-pages of tables for each of them. */
static void test_match_declared_prompt_reserve_capped(void **state)
{
	struct dfx *f = *state;
	struct arena a;
	uint64_t pool = open_pool(f, PEER_A, "model-x", &a);
	uint64_t s1, leased_cap = 0, n = 0;
	uint32_t ids[BT], slots[1];
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__Request req;
	struct reply r;

	f->cfg.max_leased_pages = 4096;
	f->cfg.max_leases_per_conn = 64;
	s1 = create_session(f, PEER_A, pool, 0);
	append_write_commit(f, PEER_A, s1, &a, 100, BT, 0x40, slots);
	tokens(ids, BT, 100);
	for (int i = 0; i < 16; i++) {
		req = match_req(&mp, pool, ids, BT);
		mp.has_prompt_tokens = 1;
		mp.prompt_tokens = f->cfg.max_session_tokens;
		assert_int_equal(send_req(f, PEER_A2, &req, 0, &r), 0);
		assert_int_equal(r.resp.status, ST(OK));
		assert_int_equal(r.resp.match_prefix->matched_tokens, BT);
		reply_fini(&r);
	}
	for (struct list *it = f->peers[PEER_A2].leases.next; it != &f->peers[PEER_A2].leases;
	     it = it->next, n++)
		leased_cap += list_entry(it, struct lease, owner_link)->cap_pages;
	assert_int_equal(n, 16);
	/* Each lease may keep its inline room and its own page besides. */
	assert_true(leased_cap <= f->cfg.max_leased_pages + n * (LEASE_INLINE_BYTES / 16 + 1));
	arena_unmap(&a);
}

/* Another uid presenting a session id it did not make gets NOT_FOUND for
 * every operation, and the session is untouched. */
static void test_other_tenants_session_not_found(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__CloseSessionRequest cl = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__Request req;
	struct session *s;
	uint32_t ids[6], slots[2];

	open_pool(f, PEER_B, "model-x", NULL);
	tokens(ids, 6, 500);
	append_write_commit(f, PEER_A, sid, NULL, 500, 6, 0, slots);
	req = append_req(&ap, sid, ids, 6);
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	req = commit_req(&cm, sid, 1);
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	cl.session_id = sid;
	req = (Kvpalace__V1__Request)KVPALACE__V1__REQUEST__INIT;
	req.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
	req.close_session = &cl;
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	/* Nor can it adopt it. */
	req = create_session_req(&cs, pool);
	cs.has_session_id = 1;
	cs.session_id = sid;
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	s = session_get(&f->c, sid, UID_A, 0);
	assert_non_null(s);
	assert_int_equal(s->n_tokens, 6);
	assert_int_equal(s->n_committed, 6);
	assert_ptr_equal(s->owner, &f->peers[PEER_A].sessions);
}

/* Admin operations on a client's socket are PERMISSION and change
 * nothing; client operations on the admin socket too. */
static void test_admin_ops_refused(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	Kvpalace__V1__DropPoolRequest dp = KVPALACE__V1__DROP_POOL_REQUEST__INIT;
	Kvpalace__V1__ConfigReloadRequest cr = KVPALACE__V1__CONFIG_RELOAD_REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	dp.pool_id = pool;
	dp.has_force = dp.force = 1;
	req.op_case = KVPALACE__V1__REQUEST__OP_DROP_POOL;
	req.drop_pool = &dp;
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(PERMISSION));
	assert_non_null(session_get(&f->c, sid, UID_A, 0));
	assert_int_equal(open_pool(f, PEER_A, "model-x", NULL), pool);

	req = (Kvpalace__V1__Request)KVPALACE__V1__REQUEST__INIT;
	req.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD;
	req.config_reload = &cr;
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(PERMISSION));
	assert_int_equal(f->n_reloads, 0);
	/* The admin's goes to the server's reload (peer_ops). */
	assert_int_equal(status_of(f, PEER_ADMIN, &req, NULL, 0), ST(OK));
	assert_int_equal(f->n_reloads, 1);

	/* The admin socket serves no client operation. */
	req = create_session_req(&cs, pool);
	assert_int_equal(status_of(f, PEER_ADMIN, &req, NULL, 0), ST(PERMISSION));
	assert_int_equal(f->c.pool_list.next != &f->c.pool_list, 1);
}

/* max-leases-per-client: the third lease is LIMIT, pins nothing and
 * changes no count; after a Release the next match works. */
static void test_lease_limit(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	struct peer *p = &f->peers[PEER_A2];
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rl;
	Kvpalace__V1__Request req;
	uint32_t slots[2], ids[8], refs[2], pins[2];
	uint64_t l1, l2, matched;

	append_write_commit(f, PEER_A, sid, NULL, 700, 8, 0, slots);
	l1 = match(f, PEER_A2, pool, 700, 8, &matched, NULL);
	assert_int_equal(matched, 8);
	l2 = match(f, PEER_A2, pool, 700, 4, &matched, NULL);
	assert_int_equal(matched, 4);
	assert_int_not_equal(l1, l2);
	assert_int_equal(p->n_leases, MAX_LEASES);
	{
		struct pool *pl = list_entry(f->c.pool_list.next, struct pool, link);

		for (int i = 0; i < 2; i++) {
			refs[i] = pl->pa.refs[slots[i]];
			pins[i] = pl->pa.pins[slots[i]];
		}
		tokens(ids, 8, 700);
		req = match_req(&mp, pool, ids, 8);
		assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(LIMIT));
		for (int i = 0; i < 2; i++) {
			assert_int_equal(pl->pa.refs[slots[i]], refs[i]);
			assert_int_equal(pl->pa.pins[slots[i]], pins[i]);
		}
	}
	assert_int_equal(p->n_leases, MAX_LEASES);
	assert_int_equal(p->n_leased_pages, 3);
	/* Another connection has its own count. */
	assert_true(match(f, PEER_A, pool, 700, 8, &matched, NULL) != 0);
	req = release_req(&rl, l1);
	assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(OK));
	assert_int_equal(p->n_leased_pages, 1);
	assert_true(match(f, PEER_A2, pool, 700, 8, &matched, NULL) != 0);
	assert_int_equal(p->n_leases, MAX_LEASES);
}

/* A connection that goes: its leases unpinned, its uncommitted tokens
 * rolled back, its sessions closed but the persistent one, which another
 * connection of the same user adopts; cache_check == 0 throughout and
 * every page not in the index is free again. */
static void test_peer_close_leaves_a_clean_cache(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t s1 = create_session(f, PEER_A, pool, 0);
	uint64_t s2 = create_session(f, PEER_A, pool, 1);
	uint64_t s3 = create_session(f, PEER_A, pool, 0), matched;
	struct pool *pl = list_entry(f->c.pool_list.next, struct pool, link);
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__Request req;
	uint32_t slots[3], ids[5];
	struct reply r;

	append_write_commit(f, PEER_A, s1, NULL, 800, 10, 0, slots); /* 2 indexed */
	append_write_commit(f, PEER_A, s2, NULL, 900, 6, 0, slots);  /* 1 indexed */
	tokens(ids, 5, 950);
	req = append_req(&ap, s3, ids, 5); /* reserved, never committed */
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	reply_fini(&r);
	assert_true(match(f, PEER_A, pool, 800, 10, &matched, NULL) != 0);
	assert_int_equal(f->peers[PEER_A].writing.reserved_pages, 2);
	assert_int_equal(pl->pa.n_free, N_PAGES - 3 - 2 - 2);

	peer_close(f, PEER_A);
	peer_open(f, PEER_A);
	assert_int_equal(pagealloc_n_pinned(&pl->pa), 0);
	/* s2 (persistent) keeps its 2 pages; the index the other 2 of s1. */
	assert_int_equal(pl->pa.n_free, N_PAGES - 4);
	assert_null(session_get(&f->c, s1, UID_A, 0));
	assert_null(session_get(&f->c, s3, UID_A, 0));
	req = create_session_req(&cs, pool);
	cs.has_session_id = 1;
	cs.session_id = s1;
	assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(NOT_FOUND));
	cs.session_id = s2;
	assert_int_equal(status_of(f, PEER_A2, &req, NULL, 0), ST(OK));
	assert_int_equal(match(f, PEER_A2, pool, 800, 10, &matched, NULL) != 0, 1);
	assert_int_equal(matched, 8);
	peer_close(f, PEER_A2);
	peer_open(f, PEER_A2);
	/* Adopted without saying: it stays persistent, and outlives A2. */
	assert_non_null(session_get(&f->c, s2, UID_A, 0));
}

/* Checkpoint and Restore need worker threads: without them dispatch
 * answers at once (0, INTERNAL, the reason says so) and starts no
 * ticket; nothing is written to the checkpoint directory. */
static void test_checkpoint_without_worker(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	Kvpalace__V1__CheckpointRequest ck = KVPALACE__V1__CHECKPOINT_REQUEST__INIT;
	Kvpalace__V1__RestoreRequest rs = KVPALACE__V1__RESTORE_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	const char *tmp = getenv("TMPDIR");
	char why[256];
	uint32_t slots[2];

	snprintf(f->dir, sizeof(f->dir), "%s/kvp-dispatch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	assert_non_null(mkdtemp(f->dir));
	f->c.ckpt_dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(f->c.ckpt_dir_fd >= 0);
	assert_null(f->c.worker);
	append_write_commit(f, PEER_A, sid, NULL, 1000, 8, 0, slots);

	ck.session_id = sid;
	ck.name = "ck1";
	req.op_case = KVPALACE__V1__REQUEST__OP_CHECKPOINT;
	req.checkpoint = &ck;
	assert_int_equal(status_of(f, PEER_A, &req, why, sizeof(why)), ST(INTERNAL));
	assert_non_null(strstr(why, "worker"));
	rs.has_pool_id = 1;
	rs.pool_id = pool;
	rs.name = "ck1";
	req.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
	req.restore = &rs;
	assert_int_equal(status_of(f, PEER_A, &req, why, sizeof(why)), ST(INTERNAL));
	assert_non_null(strstr(why, "worker"));
	assert_int_equal(f->n_tickets, 0);
	/* A session of another uid is NOT_FOUND before anything else. */
	ck.session_id = sid;
	req.op_case = KVPALACE__V1__REQUEST__OP_CHECKPOINT;
	req.checkpoint = &ck;
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	assert_int_equal(rmdir(f->dir), 0); /* still empty */
	f->dir[0] = 0;
}

/* A real loop and one worker thread under the cache, as the server
 * has: 0, or -1 (the caller returns: the machine has no io_uring). */
static int start_worker(struct dfx *f)
{
	int ret = loop_init(&f->loop, 64, LOOP_WANT_AUTO);

	if (ret < 0) {
		print_message("loop_init: %s: the worker half is not run\n", strerror(-ret));
		return -1;
	}
	if (worker_init(&f->w, &f->loop, 1) < 0) {
		loop_fini(&f->loop);
		fail_msg("worker_init failed");
	}
	f->have_worker = 1;
	f->c.worker = &f->w;
	return 0;
}

static int worker_busy(void *arg)
{
	return ((const struct worker *)arg)->n_pending > 0;
}

static Kvpalace__V1__Request compact_req(Kvpalace__V1__CompactRequest *op, uint64_t sid)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	kvpalace__v1__compact_request__init(op);
	op->session_id = sid;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMPACT;
	req.compact = op;
	return req;
}

static void set_window(struct dfx *f, int peer, uint64_t sid, uint32_t budget)
{
	Kvpalace__V1__SetPolicyRequest sp = KVPALACE__V1__SET_POLICY_REQUEST__INIT;
	Kvpalace__V1__PolicySpec ps = KVPALACE__V1__POLICY_SPEC__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;

	ps.kind = KVPALACE__V1__POLICY__POLICY_WINDOW;
	ps.has_budget = 1;
	ps.budget = budget;
	sp.session_id = sid;
	sp.policy = &ps;
	req.op_case = KVPALACE__V1__REQUEST__OP_SET_POLICY;
	req.set_policy = &sp;
	assert_int_equal(status_of(f, peer, &req, NULL, 0), ST(OK));
}

/* Compact without a worker is answered at once (compact_session on the
 * loop); with a worker it is -EINPROGRESS with a ticket, a second one of
 * the same user while it runs is -EAGAIN (parked on the pool, nothing
 * changed) unless it may not park, and the replies come through deliver
 * once the loop runs the jobs' completions. */
static void test_compact_returns(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t s1 = create_session(f, PEER_A, pool, 0);
	uint64_t s2 = create_session(f, PEER_A2, pool, 0);
	uint64_t s3 = create_session(f, PEER_A2, pool, 0);
	Kvpalace__V1__CompactRequest cp;
	Kvpalace__V1__Request req;
	uint32_t slots[4];
	struct reply r;
	uint64_t id1, id2;

	append_write_commit(f, PEER_A, s1, NULL, 1100, 12, 0, slots);
	append_write_commit(f, PEER_A2, s2, NULL, 1200, 12, 0, slots);
	append_write_commit(f, PEER_A2, s3, NULL, 1300, 12, 0, slots);
	set_window(f, PEER_A, s1, 4);
	set_window(f, PEER_A2, s2, 5);
	set_window(f, PEER_A2, s3, 6);

	/* No worker: the answer now. */
	req = compact_req(&cp, s3);
	assert_int_equal(send_req(f, PEER_A2, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.compact->n_tokens, 6);
	assert_int_equal(r.resp.compact->dropped_tokens, 6);
	assert_int_equal(r.resp.compact->n_pages, 2);
	reply_fini(&r);
	assert_int_equal(f->n_tickets, 0);

	if (start_worker(f) < 0)
		return;
	/* Another user's session is NOT_FOUND before any job. */
	req = compact_req(&cp, s1);
	assert_int_equal(status_of(f, PEER_B, &req, NULL, 0), ST(NOT_FOUND));
	assert_int_equal(f->n_tickets, 0);

	req = compact_req(&cp, s1);
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), -EINPROGRESS);
	id1 = req.id;
	reply_fini(&r);
	assert_int_equal(f->n_tickets, 1);
	assert_non_null(f->ticket[PEER_A]);
	assert_int_equal(f->ticket[PEER_A]->id, id1);

	/* The tenant's share of jobs is running: the next waits. */
	req = compact_req(&cp, s2);
	assert_int_equal(send_req(f, PEER_A2, &req, 0, &r), -EAGAIN);
	assert_non_null(r.park);
	assert_int_equal(r.pass_fd, -1);
	reply_fini(&r);
	assert_int_equal(f->n_tickets, 1);
	assert_int_equal(session_get(&f->c, s2, UID_A, 0)->n_tokens, 12);
	/* Its latency runs on while it is parked. */
	usleep(60000);
	/* Waited long enough (no_park): it runs anyway, as conn.c runs a
	 * parked frame again, with the same id. */
	f->next_id--;
	assert_int_equal(send_req(f, PEER_A2, &req, 1, &r), -EINPROGRESS);
	id2 = req.id;
	reply_fini(&r);
	assert_int_equal(f->n_tickets, 2);

	/* The loop turns until both jobs' completions ran (done on this
	 * thread, as in the daemon). */
	assert_int_equal(loop_run_while(&f->loop, worker_busy, &f->w), 0);
	assert_int_equal(f->w.n_pending, 0);
	assert_int_equal(cache_check(&f->c), 0);
	assert_int_equal(f->late[PEER_A].n, 1);
	assert_int_equal(f->late[PEER_A].id, id1);
	assert_int_equal(f->late[PEER_A].status, ST(OK));
	assert_int_equal(f->late[PEER_A].n_tokens, 4);
	assert_int_equal(f->late[PEER_A].dropped, 8);
	assert_int_equal(f->late[PEER_A2].n, 1);
	assert_int_equal(f->late[PEER_A2].id, id2);
	assert_int_equal(f->late[PEER_A2].n_tokens, 5);
	assert_int_equal(f->late[PEER_A2].dropped, 7);
	assert_null(f->ticket[PEER_A]);
	assert_null(f->ticket[PEER_A2]);

	/* Three Compacts answered, the parked one counted once; the two
	 * that spanned the sleep (the first job's and the parked one's, from
	 * its first dispatch) took more than 50 ms, until their replies. */
	{
		const struct cache_counters *t = cache_tenant_find(&f->c, UID_A);
		int op = stats_op_index(KVPALACE__V1__REQUEST__OP_COMPACT);
		const struct cache_latency *l;
		uint64_t slow = 0;

		assert_non_null(t);
		assert_true(op > 0);
		l = &t->latency[op];
		assert_int_equal(l->count, 3);
		for (unsigned int b = 0; b < LATENCY_BUCKETS; b++)
			if (b > 0 && latency_bound_ns(b - 1) >= 50000000ull)
				slow += l->buckets[b];
		assert_int_equal(slow, 2);
		assert_true(l->sum_ns >= 2 * 60000000ull);
		/* Daemon-wide, B's refused one too. */
		assert_int_equal(f->c.ctr.latency[op].count, 4);
	}
}

/* auto_compact without a worker: the Commit that takes the session past
 * its budget answers compacted, with the kept length and no page slots;
 * SessionPages then gives the new table, whose pages hold the last
 * tokens' bytes as the client wrote them. */
static void test_commit_compacts_without_worker(void **state)
{
	struct dfx *f = *state;
	struct arena a;
	uint64_t pool = open_pool(f, PEER_A, "model-x", &a);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	Kvpalace__V1__SetPolicyRequest sp = KVPALACE__V1__SET_POLICY_REQUEST__INIT;
	Kvpalace__V1__PolicySpec ps = KVPALACE__V1__POLICY_SPEC__INIT;
	Kvpalace__V1__SessionPagesRequest pg = KVPALACE__V1__SESSION_PAGES_REQUEST__INIT;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__CommitRequest cm;
	uint32_t ids[12], slots[3];
	uint64_t row = 16; /* head_dim 8 f16 */
	struct reply r;

	ps.kind = KVPALACE__V1__POLICY__POLICY_WINDOW;
	ps.has_budget = ps.has_auto_compact = 1;
	ps.budget = 8;
	ps.auto_compact = 1;
	sp.session_id = sid;
	sp.policy = &ps;
	req.op_case = KVPALACE__V1__REQUEST__OP_SET_POLICY;
	req.set_policy = &sp;
	assert_int_equal(status_of(f, PEER_A, &req, NULL, 0), ST(OK));

	tokens(ids, 12, 1500);
	req = append_req(&ap, sid, ids, 12);
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.append->n_page_slots, 3);
	/* Page i filled with byte 0x50 + i: token t's rows carry 0x50 + t / 4. */
	for (uint32_t i = 0; i < 3; i++)
		memset(a.map + (uint64_t)r.resp.append->page_slots[i] * a.page_bytes, 0x50 + i,
		       a.page_bytes);
	reply_fini(&r);
	req = commit_req(&cm, sid, 12);
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_true(r.resp.commit->has_compacted && r.resp.commit->compacted);
	assert_int_equal(r.resp.commit->committed_tokens, 8);
	assert_int_equal(r.resp.commit->n_page_slots, 0);
	reply_fini(&r);
	assert_int_equal(f->n_tickets, 0);

	pg.session_id = sid;
	pg.first_page = 0;
	req = (Kvpalace__V1__Request)KVPALACE__V1__REQUEST__INIT;
	req.op_case = KVPALACE__V1__REQUEST__OP_SESSION_PAGES;
	req.session_pages = &pg;
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), 0);
	assert_int_equal(r.resp.status, ST(OK));
	assert_int_equal(r.resp.session_pages->n_tokens, 8);
	assert_int_equal(r.resp.session_pages->n_page_slots, 2);
	for (uint32_t i = 0; i < 2; i++) {
		slots[i] = r.resp.session_pages->page_slots[i];
		/* Tokens 4..11 now at 0..7: K row of the first token of
		 * page i came from page i + 1. */
		assert_int_equal(a.map[(uint64_t)slots[i] * a.page_bytes], 0x51 + i);
		assert_int_equal(a.map[(uint64_t)slots[i] * a.page_bytes + row - 1], 0x51 + i);
	}
	reply_fini(&r);
	arena_unmap(&a);
}

/* A client that goes while its Compact runs on the worker: its session
 * closes under the job, the job's answer goes nowhere (no deliver), and
 * once the loop ran the completion nothing is left held: cache_check == 0
 * and the pages only the session held are free. */
static void test_peer_gone_during_a_job(void **state)
{
	struct dfx *f = *state;
	uint64_t pool = open_pool(f, PEER_A, "model-x", NULL);
	uint64_t sid = create_session(f, PEER_A, pool, 0);
	struct pool *pl = list_entry(f->c.pool_list.next, struct pool, link);
	Kvpalace__V1__CompactRequest cp;
	Kvpalace__V1__Request req;
	uint32_t slots[5];
	struct reply r;

	append_write_commit(f, PEER_A, sid, NULL, 1400, 18, 0, slots); /* 4 indexed */
	set_window(f, PEER_A, sid, 5);
	if (start_worker(f) < 0)
		return;
	req = compact_req(&cp, sid);
	assert_int_equal(send_req(f, PEER_A, &req, 0, &r), -EINPROGRESS);
	reply_fini(&r);
	assert_int_equal(pl->n_compact_jobs, 1);
	peer_close(f, PEER_A); /* the job still holds its pages */
	assert_null(session_get(&f->c, sid, UID_A, 0));
	assert_int_equal(loop_run_while(&f->loop, worker_busy, &f->w), 0);
	assert_int_equal(f->late[PEER_A].n, 0);
	assert_int_equal(pl->n_compact_jobs, 0);
	assert_int_equal(cache_check(&f->c), 0);
	assert_int_equal(pl->pa.n_free, N_PAGES - 4);
	peer_open(f, PEER_A);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hello, setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_pool_per_tenant, setup, teardown),
		cmocka_unit_test_setup_teardown(test_session_append_commit_match_release, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_match_tokens_le_any_alignment, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_match_declared_prompt_reserve_capped, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_other_tenants_session_not_found, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_admin_ops_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lease_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_close_leaves_a_clean_cache, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_without_worker, setup, teardown),
		cmocka_unit_test_setup_teardown(test_commit_compacts_without_worker, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_compact_returns, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_gone_during_a_job, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
