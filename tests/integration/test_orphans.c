/* tests/integration/test_orphans.c — what a client that goes away leaves
 * behind (issue 14, item 10).
 *
 * A session belongs to the connection that made it and dies with it,
 * unless the client made it persistent; its committed full pages stay in
 * the prefix index either way. Scenarios, each a client behaviour seen in
 * the field:
 *  - clients that send CreateSession, Fork, ForkLease or Restore and close
 *    before reading the reply (a timeout, a crash between send and
 *    receive): nothing of theirs stays — before, each left a session
 *    holding pages forever (41 after 30 such closes);
 *  - a writer SIGKILLed after committing: its session is gone, its
 *    committed pages still match from another process, and the daemon's
 *    log says what it left;
 *  - a persistent session outlives its connection, is listed, and a later
 *    process adopts it and goes on with it; an admin's restore is
 *    persistent and nobody's; a client-socket kvp_admin_restore is
 *    persistent;
 *  - a persistent session nobody owns expires after session-idle-timeout
 *    (1 s here), and the expiry is logged; one a live connection owns does
 *    not.
 * The daemon's stderr goes to a file the tests read (as test_checkpoint
 * does): the log lines are what an administrator looks for. Waits are
 * bounded polls of Stats, never assertions on time.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL  "orphans-model"
#define N_TOK  40u /* 2 full pages and 8 tokens of a third */
#define N_FULL 32u
#define N_RAW  30
#define CKPT   "orphan-src"

struct fixture {
	struct harness h;
	char log[64]; /* the daemon's stderr */
};

/* Starts a daemon whose stderr goes to a fresh file. */
static int start_logged(void **state, const char *const *extra)
{
	struct fixture *f = calloc(1, sizeof(*f));
	int fd, saved, ret;

	if (!f)
		return -1;
	snprintf(f->log, sizeof(f->log), "/tmp/kvp-orphans-XXXXXX");
	fd = mkstemp(f->log);
	if (fd < 0) {
		free(f);
		return -1;
	}
	saved = dup(STDERR_FILENO);
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	ret = harness_start(&f->h, extra);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(fd);
	if (ret < 0) {
		unlink(f->log);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int start(void **state)
{
	return start_logged(state, NULL);
}

static int start_short_idle(void **state)
{
	static const char *const extra[] = {"--session-idle-timeout", "1s", NULL};

	return start_logged(state, extra);
}

static int stop(void **state)
{
	struct fixture *f = *state;
	int ret = harness_stop(&f->h);
	char line[512];
	FILE *in = fopen(f->log, "r");

	/* The daemon's log, into the test's own (meson keeps it). */
	while (in && fgets(line, sizeof(line), in))
		fputs(line, stderr);
	if (in)
		fclose(in);
	unlink(f->log);
	free(f);
	return ret;
}

/* Whether the daemon's log holds needle (so far). */
static int log_has(const struct fixture *f, const char *needle)
{
	FILE *in = fopen(f->log, "r");
	char *buf;
	size_t n;
	int found;

	assert_non_null(in);
	buf = calloc(1, 1 << 20);
	assert_non_null(buf);
	n = fread(buf, 1, (1 << 20) - 1, in);
	fclose(in);
	buf[n] = '\0';
	found = strstr(buf, needle) != NULL;
	free(buf);
	return found;
}

static void sleep_ms(long ms)
{
	const struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000};

	nanosleep(&ts, NULL);
}

/* The counters of this tenant (Stats through c). */
static struct kvp_stats *stats(kvp_client *c)
{
	struct kvp_stats *st;

	assert_int_equal(kvp_stats(c, &st), 0);
	return st;
}

/* Waits (bounded: 30 s) until this tenant has `want` open connections:
 * the daemon has handled every close before. */
static void wait_connections(kvp_client *c, uint64_t want)
{
	for (int i = 0; i < 3000; i++) {
		struct kvp_stats *st = stats(c);
		uint64_t n = st->connections;

		kvp_stats_free(st);
		if (n == want)
			return;
		sleep_ms(10);
	}
	fail_msg("the daemon never noticed the closed connections");
}

/* Whether session id is listed in pool_id (through c). */
static int listed(kvp_client *c, uint64_t pool_id, uint64_t id)
{
	struct kvp_session_info *si;
	size_t n;
	int found = 0;

	assert_int_equal(kvp_list_sessions(c, pool_id, &si, &n), 0);
	for (size_t i = 0; i < n; i++)
		found |= si[i].session_id == id;
	free(si);
	return found;
}

static struct kvp_pool_stats pool_stats(kvp_client *c, uint64_t pool_id)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, pool_id, &ps, NULL), 0);
	return ps;
}

/* ---- closing before the reply ---------------------------------------------- */

/* A raw connection that opened the pool. */
static void raw_pool(struct fixture *f, struct raw *r)
{
	uint64_t pool_id;

	assert_int_equal(raw_open(r, f->h.sock), 0);
	assert_int_equal(raw_open_pool(r, MODEL, &harness_layout, &pool_id), 0);
}

/* Sends req on a fresh connection of the pool and closes it at once,
 * without reading the reply. */
static void send_and_close(struct fixture *f, struct raw *r, Kvpalace__V1__Request *req)
{
	assert_int_equal(raw_send(r, req), 0);
	raw_close(r);
}

/* Issue 14 item 10: 30 clients each send CreateSession, Fork, ForkLease
 * and Restore (of an existing checkpoint) and close before the reply.
 * Today each left its session behind, holding pages, forever. Now every
 * one is closed with its connection — a restore the worker finishes
 * after the connection went is closed when it finishes — so the pool's
 * sessions and free pages are back where they were, and Stats counts the
 * 120 sessions closed with their connections. */
static void test_closed_before_reply(void **state)
{
	struct fixture *f = *state;
	static struct raw r;
	uint32_t tokens[N_TOK];
	uint64_t closed_before, restored_before;
	struct kvp_pool_stats before, after;
	struct kvp_session_info *si;
	struct kvp_stats *st;
	kvp_client *c, *adm;
	kvp_pool *p;
	kvp_session *src;
	size_t n;

	harness_tokens(tokens, N_TOK, 141, 0);
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &src), 0);
	assert_int_equal(kvp_session_checkpoint(src, CKPT, NULL), 0);
	before = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(before.n_sessions, 1);
	st = stats(c);
	closed_before = st->sessions_closed_with_connection;
	restored_before = st->checkpoints_restored;
	kvp_stats_free(st);

	for (int i = 0; i < N_RAW; i++) {
		Kvpalace__V1__Request req;
		Kvpalace__V1__CreateSessionRequest cs;
		Kvpalace__V1__ForkRequest fk;
		Kvpalace__V1__ForkLeaseRequest fl;
		Kvpalace__V1__MatchPrefixRequest mp;
		Kvpalace__V1__RestoreRequest rs;
		Kvpalace__V1__Response *resp;

		raw_pool(f, &r);
		raw_req_create_session(&req, &cs, kvp_pool_id(p));
		send_and_close(f, &r, &req);

		/* A fork copies the partial last page: one page each. */
		raw_pool(f, &r);
		raw_req_fork(&req, &fk, kvp_session_id(src), N_TOK);
		send_and_close(f, &r, &req);

		/* A fork of the connection's own lease. */
		raw_pool(f, &r);
		raw_req_match(&req, &mp, kvp_pool_id(p), tokens, N_TOK);
		assert_int_equal(raw_call(&r, &req, &resp, NULL), 1);
		assert_int_equal(resp->match_prefix->matched_tokens, N_FULL);
		kvpalace__v1__request__init(&req);
		kvpalace__v1__fork_lease_request__init(&fl);
		req.id = 7;
		req.op_case = KVPALACE__V1__REQUEST__OP_FORK_LEASE;
		fl.lease_id = resp->match_prefix->lease_id;
		fl.n_tokens = N_FULL;
		req.fork_lease = &fl;
		send_and_close(f, &r, &req);

		/* A restore, answered by a worker after the close. */
		raw_pool(f, &r);
		kvpalace__v1__request__init(&req);
		kvpalace__v1__restore_request__init(&rs);
		req.id = 8;
		req.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
		rs.has_pool_id = 1;
		rs.pool_id = kvp_pool_id(p);
		rs.name = CKPT;
		req.restore = &rs;
		send_and_close(f, &r, &req);
	}
	wait_connections(c, 1);
	/* Every restore has finished (and found nobody to answer). */
	for (int i = 0;; i++) {
		uint64_t restored;

		st = stats(c);
		restored = st->checkpoints_restored;
		kvp_stats_free(st);
		if (restored == restored_before + N_RAW)
			break;
		if (i == 3000)
			fail_msg("%llu of %d restores finished",
				 (unsigned long long)(restored - restored_before), N_RAW);
		sleep_ms(10);
	}

	after = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(after.n_sessions, before.n_sessions);
	assert_int_equal(after.free_pages, before.free_pages);
	assert_int_equal(after.reserved_pages, 0);
	assert_int_equal(after.leased_pages, 0);
	st = stats(c);
	assert_int_equal(st->sessions_closed_with_connection - closed_before, 4 * N_RAW);
	kvp_stats_free(st);
	/* The admin's listing agrees: only the source session is left. */
	assert_int_equal(kvp_connect(f->h.admin_sock, &adm), 0);
	assert_int_equal(kvp_list_sessions(adm, 0, &si, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(si[0].session_id, kvp_session_id(src));
	free(si);
	kvp_disconnect(adm);
	assert_true(log_has(f, "finished after its client disconnected") ||
		    log_has(f, "closed: 1 session closed with it"));
	kvp_disconnect(c);
}

/* ---- a writer killed after committing -------------------------------------- */

struct writer {
	const char *sock;
	uint32_t tokens[N_TOK + 8];
	int fd; /* the session id goes here */
};

/* Commits N_TOK tokens, reserves 8 more, reports the session id and waits
 * to be killed. */
static int killed_writer(void *arg)
{
	struct writer *w = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	uint64_t id;

	CHILD_CHECK_EQ(kvp_connect(w->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, w->tokens, N_TOK, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, w->tokens + N_TOK, 8), 0);
	id = kvp_session_id(s);
	CHILD_CHECK(write(w->fd, &id, sizeof(id)) == (ssize_t)sizeof(id));
	for (;;)
		pause();
}

/* Another process, after the writer died: its committed full pages match
 * and read right. */
static int reader(void *arg)
{
	struct writer *w = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(w->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, w->tokens, N_TOK, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), N_FULL);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, w->tokens, N_FULL), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

/* Issue 14 item 10: a writer SIGKILLed after committing left its session
 * and its pages forever, and nothing said so. Now the session dies with
 * the connection (its uncommitted tail rolled back first), the committed
 * full pages stay matchable from another process, the partial page is
 * free again, and one log line names the dead client and what it left. */
static void test_sigkilled_writer(void **state)
{
	struct fixture *f = *state;
	struct writer *w = calloc(1, sizeof(*w));
	struct kvp_pool_stats ps;
	char line[256];
	uint64_t id;
	kvp_client *c;
	kvp_pool *p;
	int pfd[2];
	pid_t pid;

	assert_non_null(w);
	w->sock = f->h.sock;
	harness_tokens(w->tokens, N_TOK + 8, 142, 0);
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(pipe(pfd), 0);
	w->fd = pfd[1];
	pid = harness_fork(killed_writer, w);
	assert_true(pid > 0);
	close(pfd[1]);
	assert_int_equal(read(pfd[0], &id, sizeof(id)), (ssize_t)sizeof(id));
	close(pfd[0]);
	assert_true(listed(c, kvp_pool_id(p), id));

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(harness_wait(pid, 30), 128 + SIGKILL);
	wait_connections(c, 1);

	assert_false(listed(c, kvp_pool_id(p), id));
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.n_sessions, 0);
	assert_int_equal(ps.reserved_pages, 0);
	/* Only the two full pages are held: by the prefix index. */
	assert_int_equal(ps.free_pages, ps.n_pages - 2);
	assert_int_equal(ps.indexed_pages, 2);
	assert_int_equal(harness_run_child(reader, w), 0);
	snprintf(line, sizeof(line),
		 "(pid %d uid %u) closed: 1 session closed with it (%u tokens, 3 pages, 1 freed), "
		 "0 persistent kept; 0 leases released (0 pages); 8 uncommitted tokens rolled back",
		 (int)pid, (unsigned)getuid(), N_TOK);
	assert_true(log_has(f, line));
	kvp_disconnect(c);
	free(w);
}

/* ---- persistent sessions ----------------------------------------------------- */

struct keeper {
	const char *sock;
	uint32_t tokens[N_TOK];
	uint64_t kept, gone; /* session ids, written back through a pipe */
	int fd;
};

/* Commits a persistent session and a plain one, reports their ids and
 * exits without closing either. */
static int keeper(void *arg)
{
	struct keeper *k = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *t;
	uint64_t ids[2];

	CHILD_CHECK_EQ(kvp_connect(k->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create_persistent(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, k->tokens, N_TOK), 0);
	CHILD_CHECK_EQ(harness_pkv_write_session(p, s, k->tokens, 0, N_TOK), 0);
	CHILD_CHECK_EQ(kvp_commit(s, N_TOK), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &t), 0);
	ids[0] = kvp_session_id(s);
	ids[1] = kvp_session_id(t);
	CHILD_CHECK(write(k->fd, ids, sizeof(ids)) == (ssize_t)sizeof(ids));
	kvp_disconnect(c);
	return 0;
}

static void run_keeper(struct fixture *f, struct keeper *k)
{
	uint64_t ids[2];
	int pfd[2];

	k->sock = f->h.sock;
	assert_int_equal(pipe(pfd), 0);
	k->fd = pfd[1];
	assert_int_equal(harness_run_child(keeper, k), 0);
	close(pfd[1]);
	assert_int_equal(read(pfd[0], ids, sizeof(ids)), (ssize_t)sizeof(ids));
	close(pfd[0]);
	k->kept = ids[0];
	k->gone = ids[1];
}

/* A conversation a later process goes on with: the persistent session
 * outlives the process that made it (its plain one does not), is listed
 * and counted as nobody's, and the next process adopts it, reads its K/V,
 * appends to it, and hands it back to the plain lifetime: then it closes
 * with that process too. */
static void test_persistent_adopted(void **state)
{
	struct fixture *f = *state;
	struct keeper *k = calloc(1, sizeof(*k));
	struct kvp_pool_stats ps;
	struct kvp_stats *st;
	uint32_t more[8];
	kvp_client *c, *d, *adm;
	kvp_pool *p, *q;
	kvp_session *s, *dup;
	struct kvp_session_info *si;
	size_t n;

	assert_non_null(k);
	harness_tokens(k->tokens, N_TOK, 143, 0);
	harness_tokens(more, 8, 144, 0);
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	run_keeper(f, k);
	wait_connections(c, 1);

	assert_true(listed(c, kvp_pool_id(p), k->kept));
	assert_false(listed(c, kvp_pool_id(p), k->gone));
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.n_sessions, 1);
	assert_int_equal(ps.persistent_sessions, 1);
	assert_int_equal(ps.unowned_sessions, 1);
	st = stats(c);
	assert_int_equal(st->unowned_sessions, 1);
	kvp_stats_free(st);
	assert_true(log_has(f, "closed: 1 session closed with it (0 tokens, 0 pages, 0 freed), "
			       "1 persistent kept"));

	/* Adopted: a handle with all its tokens, the K/V right. */
	assert_int_equal(kvp_session_adopt(p, k->kept + 1000, &s), -ENOENT);
	assert_int_equal(kvp_session_adopt(p, k->kept, &s), 0);
	assert_int_equal(kvp_session_adopt(p, k->kept, &dup), -EEXIST);
	assert_int_equal(kvp_session_tokens(s), N_TOK);
	assert_int_equal(kvp_session_committed(s), N_TOK);
	assert_int_equal(harness_pkv_check_session(p, s, k->tokens, 0, N_TOK), 0);
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.persistent_sessions, 1);
	assert_int_equal(ps.unowned_sessions, 0);
	/* And it goes on. */
	assert_int_equal(kvp_append(s, more, 8), 0);
	assert_int_equal(kvp_commit(s, 8), 0);
	assert_int_equal(kvp_session_committed(s), N_TOK + 8);

	/* Another process of the tenant cannot take it while we write it. */
	assert_int_equal(kvp_append(s, more, 1), 0);
	assert_int_equal(kvp_connect(f->h.sock, &d), 0);
	assert_int_equal(kvp_pool_open(d, MODEL, &harness_layout, &q), 0);
	assert_int_equal(kvp_session_adopt(q, k->kept, &dup), -EBUSY);
	kvp_disconnect(d);
	assert_int_equal(kvp_truncate(s, N_TOK + 8), 0);

	/* Plain again: it closes with this connection. */
	assert_int_equal(kvp_session_set_persistent(s, 0), 0);
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.persistent_sessions, 0);
	kvp_disconnect(c);
	assert_int_equal(kvp_connect(f->h.admin_sock, &adm), 0);
	for (int i = 0;; i++) {
		assert_int_equal(kvp_list_sessions(adm, 0, &si, &n), 0);
		free(si);
		if (n == 0)
			break;
		if (i == 3000)
			fail_msg("the adopted session outlived its new connection");
		sleep_ms(10);
	}
	kvp_disconnect(adm);
	free(k);
}

/* A restore with no handle to come back to (kvp_admin_restore) is
 * persistent: on the admin socket it is nobody's from the start, on the
 * client socket it outlives the caller; the tenant adopts either by id. */
static void test_admin_restore_persistent(void **state)
{
	struct fixture *f = *state;
	struct kvp_restore_info ri, rj;
	struct kvp_pool_stats ps;
	uint32_t tokens[N_TOK];
	kvp_client *c, *adm, *e;
	kvp_pool *p;
	kvp_session *s, *a;

	harness_tokens(tokens, N_TOK, 145, 0);
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "orphan-admin", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);

	assert_int_equal(kvp_connect(f->h.admin_sock, &adm), 0);
	assert_int_equal(
		kvp_admin_restore(adm, "orphan-admin", 1, (uint32_t)getuid(), kvp_pool_id(p), &ri),
		0);
	kvp_disconnect(adm);
	assert_int_equal(kvp_connect(f->h.sock, &e), 0);
	assert_int_equal(kvp_admin_restore(e, "orphan-admin", 0, 0, kvp_pool_id(p), &rj), 0);
	kvp_disconnect(e);
	wait_connections(c, 1);

	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.n_sessions, 2);
	assert_int_equal(ps.persistent_sessions, 2);
	assert_int_equal(ps.unowned_sessions, 2);
	assert_int_equal(kvp_session_adopt(p, ri.session_id, &a), 0);
	assert_int_equal(harness_pkv_check_session(p, a, tokens, 0, N_TOK), 0);
	assert_int_equal(kvp_session_close(a), 0);
	assert_int_equal(kvp_session_adopt(p, rj.session_id, &a), 0);
	assert_int_equal(harness_pkv_check_session(p, a, tokens, 0, N_TOK), 0);
	assert_int_equal(kvp_session_close(a), 0);
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.n_sessions, 0);
	kvp_disconnect(c);
}

/* ---- idle expiry ------------------------------------------------------------- */

/* A persistent session nobody owns and nobody uses is closed after
 * session-idle-timeout (1 s here) and the expiry is logged; its full pages
 * stay matchable. One this connection owns — older, so idle for longer —
 * is not: the timeout is for what dead clients left. */
static void test_idle_expiry(void **state)
{
	struct fixture *f = *state;
	struct keeper *k = calloc(1, sizeof(*k));
	struct kvp_pool_stats ps;
	struct kvp_stats *st;
	char line[128];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *mine;
	kvp_lease *l;

	assert_non_null(k);
	harness_tokens(k->tokens, N_TOK, 146, 0);
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create_persistent(p, &mine), 0);
	run_keeper(f, k);
	for (int i = 0;; i++) {
		uint64_t expired;

		st = stats(c);
		expired = st->sessions_expired;
		kvp_stats_free(st);
		if (expired == 1)
			break;
		if (i == 3000)
			fail_msg("the persistent session never expired");
		sleep_ms(10);
	}
	assert_false(listed(c, kvp_pool_id(p), k->kept));
	assert_true(listed(c, kvp_pool_id(p), kvp_session_id(mine)));
	ps = pool_stats(c, kvp_pool_id(p));
	assert_int_equal(ps.n_sessions, 1);
	assert_int_equal(ps.unowned_sessions, 0);
	snprintf(line, sizeof(line),
		 "session %llu of pool %llu (uid %u): persistent, owned by no "
		 "connection and unused for",
		 (unsigned long long)k->kept, (unsigned long long)kvp_pool_id(p),
		 (unsigned)getuid());
	assert_true(log_has(f, line));
	assert_int_equal(kvp_match_prefix(p, k->tokens, N_TOK, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), N_FULL);
	assert_int_equal(harness_pkv_check_lease(l, p, k->tokens, N_FULL), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	free(k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_closed_before_reply, start, stop),
		cmocka_unit_test_setup_teardown(test_sigkilled_writer, start, stop),
		cmocka_unit_test_setup_teardown(test_persistent_adopted, start, stop),
		cmocka_unit_test_setup_teardown(test_admin_restore_persistent, start, stop),
		cmocka_unit_test_setup_teardown(test_idle_expiry, start_short_idle, stop),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
