/* tests/integration/test_fakedaemon.c — the client library against a daemon
 * that misbehaves.
 *
 * A forked fake daemon on a socket in a temporary directory answers the
 * library's requests wrongly in one way per test: another protocol
 * version, a garbled or mis-addressed reply, a closed connection, an arena
 * fd that is no sealed arena or is smaller than announced, Append slots
 * outside the arena, a match that is not whole pages, Commit, Truncate and
 * SessionPages (after Fork) replies whose page slots lie outside the arena
 * or at the wrong place, admin replies that contradict their request (a
 * session view with more slots than asked, a drop of another session, an
 * eviction whose pools do not add up). kvpalace.h promises -EPROTONOSUPPORT for another
 * version, -EPROTO (and a closed connection, -ENOTCONN afterwards) for a
 * malformed reply, -EPIPE/-ECONNRESET when the daemon goes away — and, in
 * no case, a pointer outside the arena.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "arena.h"
#include "harness.h"
#include "layout.h"

#define ST(x)	   KVPALACE__V1__STATUS__STATUS_##x
#define FAKE_PAGES 16

enum fake_mode {
	FAKE_GOOD,	      /* behaves */
	FAKE_VERSION_STATUS,  /* Hello: STATUS_VERSION */
	FAKE_VERSION_2,	      /* Hello: OK, protocol_version 2 */
	FAKE_GARBAGE,	      /* Hello: bytes that are no reply */
	FAKE_WRONG_ID,	      /* Hello: the reply carries another id */
	FAKE_CLOSE,	      /* Hello: the connection closes */
	FAKE_NO_FD,	      /* OpenPool: no arena fd */
	FAKE_UNSEALED,	      /* OpenPool: an unsealed memfd */
	FAKE_SMALL_ARENA,     /* OpenPool: more pages than the arena holds */
	FAKE_BAD_SLOTS,	      /* Append: a slot past the arena */
	FAKE_BAD_FIRST_TOKEN, /* Append: reserved at the wrong position */
	FAKE_MATCH_TOO_LONG,  /* MatchPrefix: more tokens than asked */
	FAKE_COMMIT_TOO_MANY, /* Commit: more committed than reserved */
	FAKE_MATCH_PARTIAL,   /* MatchPrefix: a match that ends inside a page */
	FAKE_COMMIT_BAD_SLOT, /* Commit: a filled page moved past the arena */
	FAKE_COMMIT_NO_SLOTS, /* Commit: filled pages, but no slots for them */
	FAKE_TRUNC_BAD_SLOT,  /* Truncate: the copied last page past the arena */
	FAKE_FORK_BAD_SLOT,   /* SessionPages of a fork: a slot past the arena */
	FAKE_ADMIN_GOOD,      /* admin replies that fit their requests */
	FAKE_SHOW_TOO_MANY,   /* ShowSession: more slots than asked for */
	FAKE_DROP_OTHER,      /* DropSession: another session dropped */
	FAKE_EVICT_SUM,	      /* Evict: pools that do not add up to the total */
};

struct fake {
	char dir[80];
	char sock[108];
	int listen_fd;
	enum fake_mode mode;
};

static int send_resp(int c, Kvpalace__V1__Response *resp, int fd)
{
	unsigned char buf[4096];
	int n = frame_pack_response(resp, buf, sizeof(buf), sizeof(buf));

	if (n < 0)
		return n;
	return frame_send(c, buf, (size_t)n, fd);
}

/* Serves one connection the way f->mode says. */
static int fake_daemon(void *arg)
{
	struct fake *f = arg;
	unsigned char buf[FRAME_MAX_MAX_BYTES + 1];
	static unsigned char mem[1 << 20];
	struct frame_arena a;
	struct shm_layout layout = {0};
	uint64_t reserved = 0, committed = 0;
	int c = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);

	if (c < 0)
		return 1;
	for (;;) {
		Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
		Kvpalace__V1__HelloResponse hello = KVPALACE__V1__HELLO_RESPONSE__INIT;
		Kvpalace__V1__OpenPoolResponse op = KVPALACE__V1__OPEN_POOL_RESPONSE__INIT;
		Kvpalace__V1__CreateSessionResponse cs =
			KVPALACE__V1__CREATE_SESSION_RESPONSE__INIT;
		Kvpalace__V1__AppendResponse app = KVPALACE__V1__APPEND_RESPONSE__INIT;
		Kvpalace__V1__CommitResponse cm = KVPALACE__V1__COMMIT_RESPONSE__INIT;
		Kvpalace__V1__MatchPrefixResponse mp = KVPALACE__V1__MATCH_PREFIX_RESPONSE__INIT;
		Kvpalace__V1__ReleaseResponse rel = KVPALACE__V1__RELEASE_RESPONSE__INIT;
		Kvpalace__V1__ForkResponse fk = KVPALACE__V1__FORK_RESPONSE__INIT;
		Kvpalace__V1__TruncateResponse tr = KVPALACE__V1__TRUNCATE_RESPONSE__INIT;
		Kvpalace__V1__SessionPagesResponse sp = KVPALACE__V1__SESSION_PAGES_RESPONSE__INIT;
		Kvpalace__V1__ShowSessionResponse sh = KVPALACE__V1__SHOW_SESSION_RESPONSE__INIT;
		Kvpalace__V1__SessionInfo si = KVPALACE__V1__SESSION_INFO__INIT;
		Kvpalace__V1__Layout sl = KVPALACE__V1__LAYOUT__INIT;
		Kvpalace__V1__DropSessionResponse ds = KVPALACE__V1__DROP_SESSION_RESPONSE__INIT;
		Kvpalace__V1__EvictResponse ev = KVPALACE__V1__EVICT_RESPONSE__INIT;
		Kvpalace__V1__EvictedPool evp[2] = {KVPALACE__V1__EVICTED_POOL__INIT,
						    KVPALACE__V1__EVICTED_POOL__INIT};
		Kvpalace__V1__EvictedPool *evps[2] = {&evp[0], &evp[1]};
		Kvpalace__V1__Request *req;
		uint32_t slots[64];
		int fd = -1, n, len, ret;

		n = frame_recv(c, buf, sizeof(buf), &fd);
		if (n <= 0)
			return 0;
		len = frame_header_check(buf, (size_t)n, sizeof(buf));
		if (len < 0)
			return 1;
		frame_arena_init(&a, mem, sizeof(mem));
		req = frame_unpack_request(&a, buf + FRAME_HEADER_BYTES, (size_t)len);
		if (!req)
			return 1;
		resp.id = req->id;
		switch (req->op_case) {
		case KVPALACE__V1__REQUEST__OP_HELLO:
			if (f->mode == FAKE_CLOSE) {
				close(c);
				return 0;
			}
			if (f->mode == FAKE_GARBAGE) {
				frame_header_encode(buf, 8);
				memset(buf + FRAME_HEADER_BYTES, 0xff, 8);
				frame_send(c, buf, FRAME_HEADER_BYTES + 8, -1);
				continue;
			}
			if (f->mode == FAKE_VERSION_STATUS) {
				resp.status = ST(VERSION);
				resp.error = "fake speaks version 2";
				break;
			}
			if (f->mode == FAKE_WRONG_ID)
				resp.id++;
			hello.protocol_version = f->mode == FAKE_VERSION_2 ? 2 : 1;
			hello.server_version = "fake";
			hello.max_message_bytes = FRAME_DEFAULT_MAX_BYTES;
			hello.max_tokens_per_request = 1000;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_HELLO;
			resp.hello = &hello;
			break;
		case KVPALACE__V1__REQUEST__OP_OPEN_POOL: {
			const Kvpalace__V1__Layout *l = req->open_pool->layout;
			uint64_t bytes;

			layout.n_layers = l->n_layers;
			layout.n_kv_heads = l->n_kv_heads;
			layout.head_dim = l->head_dim;
			layout.block_tokens = l->block_tokens;
			layout.dtype = l->dtype;
			layout.quant_group = l->has_quant_group ? l->quant_group : 0;
			op.pool_id = 5;
			op.page_bytes = shm_page_bytes(&layout);
			op.n_pages = FAKE_PAGES;
			bytes = op.page_bytes * FAKE_PAGES;
			op.arena_bytes = bytes;
			if (f->mode == FAKE_SMALL_ARENA)
				op.arena_bytes = bytes = op.page_bytes * (FAKE_PAGES / 2);
			if (f->mode == FAKE_UNSEALED) {
				fd = memfd_create("fake", MFD_CLOEXEC);
				if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0)
					return 1;
			} else if (f->mode != FAKE_NO_FD) {
				ret = shm_arena_create("fake", bytes, &fd, NULL);
				if (ret < 0)
					return 1;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_OPEN_POOL;
			resp.open_pool = &op;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_CREATE_SESSION:
			cs.session_id = 6;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_CREATE_SESSION;
			resp.create_session = &cs;
			break;
		case KVPALACE__V1__REQUEST__OP_APPEND: {
			uint64_t bt = layout.block_tokens;
			uint64_t end = reserved + req->append->n_tokens;

			app.first_token = reserved;
			app.first_page = reserved / bt;
			app.n_page_slots = (end + bt - 1) / bt - app.first_page;
			if (app.n_page_slots > 64)
				return 1;
			for (size_t i = 0; i < app.n_page_slots; i++)
				slots[i] = (uint32_t)(app.first_page + i);
			if (f->mode == FAKE_BAD_SLOTS)
				slots[app.n_page_slots - 1] = FAKE_PAGES;
			if (f->mode == FAKE_BAD_FIRST_TOKEN)
				app.first_token += 1;
			app.page_slots = slots;
			reserved = end;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_APPEND;
			resp.append = &app;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_COMMIT: {
			/* Page i lives in slot i; the reply lists the pages the
			 * commit filled, as the real daemon does after dedup. */
			uint64_t bt = layout.block_tokens;
			uint64_t first = committed / bt;

			committed += req->commit->n_tokens;
			cm.committed_tokens = committed;
			if (f->mode == FAKE_COMMIT_TOO_MANY)
				cm.committed_tokens = reserved + 5;
			cm.has_first_page = 1;
			cm.first_page = first;
			cm.n_page_slots = committed / bt - first;
			if (cm.n_page_slots > 64)
				return 1;
			for (size_t i = 0; i < cm.n_page_slots; i++)
				slots[i] = (uint32_t)(first + i);
			if (f->mode == FAKE_COMMIT_BAD_SLOT && cm.n_page_slots)
				slots[cm.n_page_slots - 1] = FAKE_PAGES;
			if (f->mode == FAKE_COMMIT_NO_SLOTS)
				cm.n_page_slots = 0;
			cm.page_slots = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_COMMIT;
			resp.commit = &cm;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_FORK:
			fk.session_id = 7;
			fk.n_tokens = req->fork->n_tokens;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_FORK;
			resp.fork = &fk;
			break;
		case KVPALACE__V1__REQUEST__OP_SESSION_PAGES: {
			/* Only the fork (7) is asked for: its pages are copies
			 * in the upper half of the arena. */
			uint64_t bt = layout.block_tokens;

			sp.first_page = req->session_pages->first_page;
			sp.n_tokens = sp.committed_tokens = 20;
			sp.n_page_slots = (20 + bt - 1) / bt - sp.first_page;
			for (size_t i = 0; i < sp.n_page_slots; i++)
				slots[i] = (uint32_t)(FAKE_PAGES / 2 + sp.first_page + i);
			if (f->mode == FAKE_FORK_BAD_SLOT)
				slots[0] = FAKE_PAGES + 3;
			sp.page_slots = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_SESSION_PAGES;
			resp.session_pages = &sp;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_TRUNCATE: {
			/* The new last page is copied to the last slot. */
			uint64_t bt = layout.block_tokens, keep = req->truncate->n_tokens;

			tr.n_tokens = keep;
			reserved = keep;
			if (committed > keep)
				committed = keep;
			tr.committed_tokens = committed;
			if (keep % bt) {
				tr.has_first_page = 1;
				tr.first_page = keep / bt;
				slots[0] = f->mode == FAKE_TRUNC_BAD_SLOT ? FAKE_PAGES
									  : FAKE_PAGES - 1;
				tr.n_page_slots = 1;
				tr.page_slots = slots;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_TRUNCATE;
			resp.truncate = &tr;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_MATCH_PREFIX:
			/* Whole pages of what was asked, in slots 0.. */
			mp.lease_id = 9;
			mp.matched_tokens = req->match_prefix->n_tokens / layout.block_tokens *
					    layout.block_tokens;
			if (f->mode == FAKE_MATCH_TOO_LONG)
				mp.matched_tokens += 16;
			if (f->mode == FAKE_MATCH_PARTIAL)
				mp.matched_tokens = req->match_prefix->n_tokens;
			mp.first_page = 0;
			mp.n_page_slots =
				(mp.matched_tokens + layout.block_tokens - 1) / layout.block_tokens;
			if (mp.n_page_slots > 64)
				return 1;
			for (size_t i = 0; i < mp.n_page_slots; i++)
				slots[i] = (uint32_t)i;
			mp.page_slots = slots;
			mp.complete = 1;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX;
			resp.match_prefix = &mp;
			break;
		case KVPALACE__V1__REQUEST__OP_RELEASE:
			resp.op_case = KVPALACE__V1__RESPONSE__OP_RELEASE;
			resp.release = &rel;
			break;
		case KVPALACE__V1__REQUEST__OP_SHOW_SESSION: {
			/* A 3-page session; as many slots as asked for. */
			uint32_t want = req->show_session->max_page_slots;

			si.session_id = req->show_session->session_id;
			si.n_tokens = si.committed_tokens = 40;
			si.n_pages = 3;
			sh.info = &si;
			sh.model_id = "fake-model";
			sh.layout = &sl;
			sh.n_page_slots = sh.n_page_holders = want < 3 ? want : 3;
			if (f->mode == FAKE_SHOW_TOO_MANY)
				sh.n_page_slots = sh.n_page_holders = want + 1;
			for (size_t i = 0; i < sh.n_page_slots && i < 64; i++)
				slots[i] = (uint32_t)i;
			sh.page_slots = sh.page_holders = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_SHOW_SESSION;
			resp.show_session = &sh;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
			ds.session_id = req->drop_session->session_id;
			if (f->mode == FAKE_DROP_OTHER)
				ds.session_id++;
			ds.n_tokens = ds.committed_tokens = 40;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_SESSION;
			resp.drop_session = &ds;
			break;
		case KVPALACE__V1__REQUEST__OP_EVICT:
			/* Two pools, 3 + 2 pages of 8 KiB. */
			evp[0].pool_id = 5;
			evp[0].pages = 3;
			evp[0].bytes = 3 * 8192;
			evp[1].pool_id = 8;
			evp[1].pages = 2;
			evp[1].bytes = 2 * 8192;
			ev.pages = f->mode == FAKE_EVICT_SUM ? 6 : 5;
			ev.bytes = 5 * 8192;
			ev.n_pools = 2;
			ev.pools = evps;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_EVICT;
			resp.evict = &ev;
			break;
		default:
			resp.status = ST(UNSUPPORTED);
			resp.error = "not in the fake";
			break;
		}
		ret = send_resp(c, &resp, fd);
		if (fd >= 0)
			close(fd);
		if (ret < 0)
			return 0;
	}
}

static int setup(void **state)
{
	struct fake *f = calloc(1, sizeof(*f));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvpf-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->sock, sizeof(f->sock), "%s/fake.sock", f->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->sock);
	f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(f->listen_fd, 4) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fake *f = *state;

	close(f->listen_fd);
	unlink(f->sock);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* Starts the fake in `mode` and returns its pid. */
static pid_t start_fake(struct fake *f, enum fake_mode mode)
{
	pid_t pid;

	f->mode = mode;
	pid = harness_fork(fake_daemon, f);
	assert_true(pid > 0);
	return pid;
}

static void expect_connect_fails(void **state, enum fake_mode mode, int want1, int want2)
{
	struct fake *f = *state;
	kvp_client *c = NULL;
	pid_t pid = start_fake(f, mode);
	int ret = kvp_connect(f->sock, &c);

	if (ret != want1 && ret != want2)
		fail_msg("kvp_connect against fake mode %d: %d", mode, ret);
	assert_null(c);
	harness_wait(pid, 30);
}

static void test_version_status(void **state)
{
	expect_connect_fails(state, FAKE_VERSION_STATUS, -EPROTONOSUPPORT, -EPROTONOSUPPORT);
}

static void test_version_2(void **state)
{
	expect_connect_fails(state, FAKE_VERSION_2, -EPROTONOSUPPORT, -EPROTONOSUPPORT);
}

static void test_garbage_reply(void **state)
{
	expect_connect_fails(state, FAKE_GARBAGE, -EPROTO, -EPROTO);
}

static void test_wrong_reply_id(void **state)
{
	expect_connect_fails(state, FAKE_WRONG_ID, -EPROTO, -EPROTO);
}

static void test_daemon_closes(void **state)
{
	expect_connect_fails(state, FAKE_CLOSE, -ECONNRESET, -EPIPE);
}

static void test_good_fake(void **state)
{
	struct fake *f = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	pid_t pid = start_fake(f, FAKE_GOOD);

	/* The fake itself must be right, or the other cases prove nothing. */
	harness_tokens(tokens, 40, 90, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_check_lease(l, p, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	{
		kvp_session *fk;

		assert_int_equal(kvp_session_fork(s, 20, &fk), 0);
		assert_int_equal(kvp_session_committed(fk), 20);
		assert_non_null(kvp_session_kv(fk, 19, 0, 0, 0));
		assert_int_equal(kvp_truncate(s, 20), 0);
		assert_int_equal(kvp_session_tokens(s), 20);
		assert_non_null(kvp_session_kv(s, 19, 0, 0, 0));
		assert_null(kvp_session_kv(s, 20, 0, 0, 0));
	}
	kvp_disconnect(c);
	assert_int_equal(harness_wait(pid, 30), 0);
}

/* OpenPool replies that must not be mapped. */
static void expect_pool_open_fails(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	kvp_client *c;
	kvp_pool *p = NULL;
	pid_t pid = start_fake(f, mode);
	int ret;

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	ret = kvp_pool_open(c, "fake-model", &harness_layout, &p);
	if (ret != -EPROTO)
		fail_msg("kvp_pool_open against fake mode %d: %d", mode, ret);
	assert_null(p);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_no_arena_fd(void **state)
{
	expect_pool_open_fails(state, FAKE_NO_FD);
}

static void test_unsealed_arena(void **state)
{
	expect_pool_open_fails(state, FAKE_UNSEALED);
}

static void test_arena_smaller_than_announced(void **state)
{
	expect_pool_open_fails(state, FAKE_SMALL_ARENA);
}

/* Replies after a good OpenPool that must break the connection. */
static void expect_broken_after(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l = NULL;
	pid_t pid = start_fake(f, mode);
	int ret = 0;

	harness_tokens(tokens, 40, 91, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	if (mode == FAKE_MATCH_TOO_LONG || mode == FAKE_MATCH_PARTIAL) {
		ret = kvp_match_prefix(p, tokens, 20, &l);
		assert_null(l);
	} else if (mode == FAKE_COMMIT_BAD_SLOT || mode == FAKE_COMMIT_NO_SLOTS) {
		assert_int_equal(kvp_append(s, tokens, 40), 0);
		ret = kvp_commit(s, 40);
		assert_null(kvp_session_kv(s, 0, 0, 0, 0));
	} else if (mode == FAKE_TRUNC_BAD_SLOT || mode == FAKE_FORK_BAD_SLOT) {
		kvp_session *fk = NULL;

		assert_int_equal(kvp_append(s, tokens, 40), 0);
		assert_int_equal(kvp_commit(s, 40), 0);
		if (mode == FAKE_TRUNC_BAD_SLOT) {
			ret = kvp_truncate(s, 20);
		} else {
			ret = kvp_session_fork(s, 20, &fk);
			assert_null(fk);
		}
		assert_null(kvp_session_kv(s, 0, 0, 0, 0));
	} else {
		ret = kvp_append(s, tokens, 40);
		if (mode == FAKE_COMMIT_TOO_MANY) {
			assert_int_equal(ret, 0);
			ret = kvp_commit(s, 40);
		} else {
			/* Nothing past what was properly reserved is writable. */
			assert_null(kvp_session_kv(s, 39, 0, 0, 0));
		}
	}
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_append_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_BAD_SLOTS);
}

static void test_append_at_wrong_position(void **state)
{
	expect_broken_after(state, FAKE_BAD_FIRST_TOKEN);
}

static void test_match_longer_than_asked(void **state)
{
	expect_broken_after(state, FAKE_MATCH_TOO_LONG);
}

static void test_commit_more_than_reserved(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_TOO_MANY);
}

static void test_match_inside_a_page(void **state)
{
	expect_broken_after(state, FAKE_MATCH_PARTIAL);
}

static void test_commit_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_BAD_SLOT);
}

static void test_commit_without_slots(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_NO_SLOTS);
}

static void test_truncate_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_TRUNC_BAD_SLOT);
}

static void test_fork_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_FORK_BAD_SLOT);
}

/* Admin replies that fit their requests are taken as they are; one that
 * contradicts its request breaks the connection. */
static void expect_admin(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	struct kvp_session_detail *d = NULL;
	struct kvp_drop_session_result dr;
	struct kvp_evict_result *er = NULL;
	kvp_client *c;
	pid_t pid = start_fake(f, mode);
	int ret = 0;

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	if (mode == FAKE_ADMIN_GOOD) {
		assert_int_equal(kvp_admin_show_session(c, 6, 2, &d), 0);
		assert_int_equal(d->info.session_id, 6);
		assert_int_equal(d->n_page_slots, 2);
		assert_string_equal(d->model_id, "fake-model");
		free(d);
		assert_int_equal(kvp_admin_drop_session(c, 6, 0, &dr), 0);
		assert_int_equal(dr.session_id, 6);
		assert_int_equal(kvp_admin_evict(c, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &er), 0);
		assert_int_equal(er->pages, 5);
		assert_int_equal(er->n_pools, 2);
		assert_int_equal(er->pools[1].pool_id, 8);
		free(er);
		er = NULL;
		/* Asked for one pool, told about two: a lie. */
		ret = kvp_admin_evict(c, KVP_TIER_HOST, 5, KVP_EVICT_ALL, 0, &er);
	} else if (mode == FAKE_SHOW_TOO_MANY) {
		ret = kvp_admin_show_session(c, 6, 2, &d);
		assert_null(d);
	} else if (mode == FAKE_DROP_OTHER) {
		ret = kvp_admin_drop_session(c, 6, KVP_DROP_FORCE, &dr);
	} else {
		ret = kvp_admin_evict(c, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &er);
	}
	assert_null(er);
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_admin_replies(void **state)
{
	expect_admin(state, FAKE_ADMIN_GOOD);
}

static void test_show_more_slots_than_asked(void **state)
{
	expect_admin(state, FAKE_SHOW_TOO_MANY);
}

static void test_drop_of_another_session(void **state)
{
	expect_admin(state, FAKE_DROP_OTHER);
}

static void test_evict_that_does_not_add_up(void **state)
{
	expect_admin(state, FAKE_EVICT_SUM);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_good_fake),
		T(test_version_status),
		T(test_version_2),
		T(test_garbage_reply),
		T(test_wrong_reply_id),
		T(test_daemon_closes),
		T(test_no_arena_fd),
		T(test_unsealed_arena),
		T(test_arena_smaller_than_announced),
		T(test_append_slot_outside_arena),
		T(test_append_at_wrong_position),
		T(test_match_longer_than_asked),
		T(test_commit_more_than_reserved),
		T(test_match_inside_a_page),
		T(test_commit_slot_outside_arena),
		T(test_commit_without_slots),
		T(test_truncate_slot_outside_arena),
		T(test_fork_slot_outside_arena),
		T(test_admin_replies),
		T(test_show_more_slots_than_asked),
		T(test_drop_of_another_session),
		T(test_evict_that_does_not_add_up),
	};

	return cmocka_run_group_tests_name("fakedaemon", tests, NULL, NULL);
}
