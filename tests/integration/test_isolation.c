/* tests/integration/test_isolation.c — tenants (uids) cannot reach each
 * other's pools, prefixes, bytes, arenas, sessions, checkpoints or the
 * daemon's admin operations.
 *
 * Runs as root and switches child processes to tenant uids 2001 (A), 2002
 * (B) and 2003 (C); skips when not root. Each tenant is a separate
 * process, as a real one is.
 *
 * Where each part of isolation is covered:
 *   test_share.c     another user (nobody) gets a pool of its own for the
 *                    same model, misses root's prefix, sees only its own
 *                    pools in Stats, gets NOT_FOUND for root's pool id
 *                    (CreateSession, MatchPrefix), and EACCES on the admin
 *                    socket; the admin sees every tenant's pools
 *   test_badinput.c  the admin socket refuses client operations
 *                    (PERMISSION); a lease belongs to its connection
 *   test_hostile.c   per-user connection limits; sealed arenas
 *   here             the rest:
 *     prefixes       A and B commit the same tokens of the same model: each
 *                    matches its own pages and reads its own bytes (no
 *                    index or dedup across tenants); C misses both
 *     foreign ids    every request naming another tenant's pool, session
 *                    or lease gets exactly the reply a never-used id gets
 *                    (status and message), so ids reveal nothing, and the
 *                    owner's objects are unchanged
 *     arenas         another tenant's OpenPool returns a different memfd
 *                    holding none of A's bytes; no other reply carries a
 *                    descriptor; /proc cannot lend one, nor can the
 *                    spill directory be read (EACCES)
 *     listings       Stats and ListSessions show a tenant its own pools and
 *                    sessions only, also when it names A's pool
 *     checkpoints    a tenant lists, restores and overwrites only its own
 *                    names; another's uid is PERMISSION on the client
 *                    socket; a path in a name is INVALID; the files are
 *                    not readable by other tenants
 *     admin          every admin operation on the client socket is
 *                    -EPERM, for tenants and for root alike, and changes
 *                    nothing
 *     counters, ids  a tenant's Stats count its own work only, and its ids
 *                    follow each other whatever other tenants make
 *     limits         max-pools-per-tenant counts each tenant apart
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

#define MODEL	 "isolation-model"
#define UID_A	 2001
#define UID_B	 2002
#define UID_C	 2003
#define N_TOKENS 64
#define B_BYTE	 0xb0 /* B writes this byte into every row of its K/V */
#define MARKER	 "kvpalace tenant A secret bytes!"

/* What tenants tell each other through the test (shared memory). */
struct iso {
	const struct harness *h;
	uint32_t tokens[N_TOKENS];
	uint64_t pool_a, session_a, lease_a, pool_b;
	uint64_t session_b1; /* B's session before A's activity */
	dev_t arena_dev_a;
	ino_t arena_ino_a;
	pid_t holder_pid;
	int ready[2], go[2]; /* A holds its lease between them */
};

static struct iso *iso_new(struct harness *h)
{
	struct iso *k =
		mmap(NULL, sizeof(*k), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(k != MAP_FAILED);
	memset(k, 0, sizeof(*k));
	k->h = h;
	harness_tokens(k->tokens, N_TOKENS, 400, 0);
	assert_int_equal(pipe(k->ready), 0);
	assert_int_equal(pipe(k->go), 0);
	return k;
}

static void iso_free(struct iso *k)
{
	close(k->ready[0]);
	close(k->ready[1]);
	close(k->go[0]);
	close(k->go[1]);
	munmap(k, sizeof(*k));
}

struct as_call {
	uid_t uid;
	int (*fn)(struct iso *);
	struct iso *k;
};

static int as_user(void *arg)
{
	const struct as_call *a = arg;

	CHILD_CHECK_EQ(harness_become(a->uid), 0);
	return a->fn(a->k);
}

/* Runs fn(k) in a child process of tenant uid and returns its status. */
static int run_as(uid_t uid, int (*fn)(struct iso *), struct iso *k)
{
	struct as_call a = {uid, fn, k};

	return harness_run_child(as_user, &a);
}

static pid_t fork_as(uid_t uid, int (*fn)(struct iso *), struct iso *k)
{
	static struct as_call a; /* read by the child after the fork */

	a = (struct as_call){uid, fn, k};
	return harness_fork(as_user, &a);
}

/* Small arenas: the arena test writes and reads every page of two. */
static int setup(void **state)
{
	static const char *const extra[] = {
		"--host-tier-size", "256M", "--host-pool-size", "16M", NULL,
	};

	if (geteuid() != 0) {
		print_message("not root: tenants need other uids\n");
		*state = NULL;
		return 0;
	}
	return harness_setup_args(state, extra);
}

static int setup_pools2(void **state)
{
	static const char *const extra[] = {
		"--host-tier-size",
		"256M",
		"--host-pool-size",
		"16M",
		"--max-pools-per-tenant",
		"2",
		NULL,
	};

	if (geteuid() != 0) {
		*state = NULL;
		return 0;
	}
	return harness_setup_args(state, extra);
}

static int teardown(void **state)
{
	return *state ? harness_teardown(state) : 0;
}

#define NEED_ROOT()                                                                                \
	do {                                                                                       \
		if (!*state)                                                                       \
			skip();                                                                    \
	} while (0)

/* Writes B_BYTE into every row of positions [0, n) of s. */
static int write_b_bytes(kvp_pool *p, kvp_session *s, uint64_t n)
{
	const struct kvp_layout *lay = kvp_pool_layout(p);

	for (uint64_t pos = 0; pos < n; pos++)
		for (uint32_t layer = 0; layer < lay->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < lay->n_kv_heads; head++) {
					void *row = kvp_session_kv(s, pos, layer, kv, head);

					if (!row)
						return -1;
					memset(row, B_BYTE, kvp_pool_row_bytes(p));
				}
	return 0;
}

/* Rows of leased positions [0, n) that are not all B_BYTE. */
static uint64_t rows_not_b(const kvp_lease *l, const kvp_pool *p, uint64_t n)
{
	const struct kvp_layout *lay = kvp_pool_layout(p);
	uint64_t bad = 0;

	for (uint64_t pos = 0; pos < n; pos++)
		for (uint32_t layer = 0; layer < lay->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < lay->n_kv_heads; head++) {
					const unsigned char *b =
						kvp_lease_kv(l, pos, layer, kv, head);

					for (size_t i = 0; b && i < kvp_pool_row_bytes(p); i++)
						if (b[i] != B_BYTE) {
							b = NULL;
							break;
						}
					bad += b == NULL;
				}
	return bad;
}

/* ---- prefixes and bytes ------------------------------------------------- */

static int a_commits(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, k->tokens, N_TOKENS, &s), 0);
	/* Kept past this connection, so that the other tenants' tries below
	 * aim at a session that exists. */
	CHILD_CHECK_EQ(kvp_session_set_persistent(s, 1), 0);
	k->pool_a = kvp_pool_id(p);
	k->session_a = kvp_session_id(s);
	kvp_disconnect(c);
	return 0;
}

static int b_commits_same_tokens(struct iso *k)
{
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK(kvp_pool_id(p) != k->pool_a);
	k->pool_b = kvp_pool_id(p);
	/* A's prefix, same model and tokens: a miss. */
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	/* B computes the same tokens itself (with bytes of its own). */
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, k->tokens, N_TOKENS), 0);
	CHILD_CHECK_EQ(write_b_bytes(p, s, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), N_TOKENS);
	CHILD_CHECK_EQ(rows_not_b(l, p, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	/* Nothing was deduplicated against A's identical pages. */
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->n_pools, 1);
	CHILD_CHECK_EQ(st->pools[0].pool_id, k->pool_b);
	CHILD_CHECK_EQ(st->pools[0].dedup_pages, 0);
	kvp_stats_free(st);
	kvp_disconnect(c);
	return 0;
}

static int a_reads_own(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_id(p), k->pool_a);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), N_TOKENS);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, k->tokens, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

static int c_misses(struct iso *k)
{
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK(kvp_pool_id(p) != k->pool_a && kvp_pool_id(p) != k->pool_b);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->n_pools, 1);
	CHILD_CHECK_EQ(st->pools[0].uid, UID_C);
	CHILD_CHECK_EQ(st->pools[0].indexed_pages, 0);
	kvp_stats_free(st);
	kvp_disconnect(c);
	return 0;
}

static void test_prefixes_per_tenant(void **state)
{
	struct iso *k;

	NEED_ROOT();
	k = iso_new(*state);
	assert_int_equal(run_as(UID_A, a_commits, k), 0);
	assert_int_equal(run_as(UID_B, b_commits_same_tokens, k), 0);
	assert_int_equal(run_as(UID_A, a_reads_own, k), 0);
	assert_int_equal(run_as(UID_C, c_misses, k), 0);
	iso_free(k);
}

/* ---- another tenant's ids ------------------------------------------------ */

static uint64_t next_id = 1ull << 40;

static void req_base(Kvpalace__V1__Request *req, Kvpalace__V1__Request__OpCase op)
{
	kvpalace__v1__request__init(req);
	req->id = next_id++;
	req->op_case = op;
}

/* Status and message of req's reply into *status and why (cap bytes).
 * Returns 0 or -1. */
static int reply_of(struct raw *r, Kvpalace__V1__Request *req, int *status, char *why, size_t cap)
{
	Kvpalace__V1__Response *resp;
	int fd = -1;

	if (raw_call(r, req, &resp, &fd) != 1)
		return -1;
	if (fd >= 0) {
		close(fd);
		fprintf(stderr, "a reply to operation %d carried a descriptor\n",
			(int)req->op_case);
		return -1;
	}
	*status = (int)resp->status;
	snprintf(why, cap, "%s", resp->error ? resp->error : "");
	return 0;
}

/* Sends the request built by build for A's id and for a never-used id:
 * both must get NOT_FOUND with the same message. */
#define SAME_AS_BOGUS(r, a_id, bogus_id, build)                                                    \
	do {                                                                                       \
		char why_a[256], why_x[256];                                                       \
		int st_a, st_x;                                                                    \
		uint64_t id_;                                                                      \
                                                                                                   \
		id_ = (a_id);                                                                      \
		build;                                                                             \
		CHILD_CHECK_EQ(reply_of(r, &req, &st_a, why_a, sizeof(why_a)), 0);                 \
		id_ = (bogus_id);                                                                  \
		build;                                                                             \
		CHILD_CHECK_EQ(reply_of(r, &req, &st_x, why_x, sizeof(why_x)), 0);                 \
		CHILD_CHECK_EQ(st_a, ST(NOT_FOUND));                                               \
		CHILD_CHECK_EQ(st_x, ST(NOT_FOUND));                                               \
		CHILD_CHECK(!strcmp(why_a, why_x));                                                \
	} while (0)

static int a_holds_lease(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	char go;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, k->tokens, N_TOKENS, &s), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
	k->pool_a = kvp_pool_id(p);
	k->session_a = kvp_session_id(s);
	CHILD_CHECK_EQ(write(k->ready[1], "r", 1), 1);
	CHILD_CHECK_EQ(read(k->go[0], &go, 1), 1);
	/* After B's attempts: A's session, pages and lease are as they were. */
	CHILD_CHECK_EQ(kvp_session_committed(s), N_TOKENS);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, k->tokens, N_TOKENS), 0);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, k->tokens, 0, N_TOKENS), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	{
		kvp_session *f;

		CHILD_CHECK_EQ(kvp_session_fork(s, 40, &f), 0);
		CHILD_CHECK_EQ(kvp_session_close(f), 0);
	}
	kvp_disconnect(c);
	return 0;
}

/* A raw connection of A that holds a lease for B to try (the library
 * does not show lease ids). */
static int a_holds_raw_lease(struct iso *k)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__ReleaseRequest rel;
	Kvpalace__V1__Response *resp;
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t pool_id;
	char go;

	CHILD_CHECK(r != NULL);
	CHILD_CHECK_EQ(raw_open(r, k->h->sock), 0);
	CHILD_CHECK_EQ(raw_open_pool(r, MODEL, &harness_layout, &pool_id), 0);
	CHILD_CHECK_EQ(pool_id, k->pool_a);
	raw_req_match(&req, &mp, pool_id, k->tokens, N_TOKENS);
	CHILD_CHECK_EQ(raw_call(r, &req, &resp, NULL), 1);
	CHILD_CHECK_EQ(resp->status, ST(OK));
	CHILD_CHECK_EQ(resp->match_prefix->matched_tokens, N_TOKENS);
	k->lease_a = resp->match_prefix->lease_id;
	CHILD_CHECK_EQ(write(k->ready[1], "r", 1), 1);
	CHILD_CHECK_EQ(read(k->go[0], &go, 1), 1);
	/* Still A's to release. */
	raw_req_release(&req, &rel, k->lease_a);
	CHILD_CHECK_EQ(raw_call(r, &req, &resp, NULL), 1);
	CHILD_CHECK_EQ(resp->status, ST(OK));
	raw_close(r);
	free(r);
	return 0;
}

static int b_tries_a_ids(struct iso *k)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__CreateSessionRequest cs;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__PrefetchRequest pf = KVPALACE__V1__PREFETCH_REQUEST__INIT;
	Kvpalace__V1__AppendRequest app;
	Kvpalace__V1__CommitRequest cm;
	Kvpalace__V1__CloseSessionRequest cl;
	Kvpalace__V1__ForkRequest fk;
	Kvpalace__V1__TruncateRequest tr;
	Kvpalace__V1__SessionPagesRequest sp;
	Kvpalace__V1__ReleaseRequest rel;
	Kvpalace__V1__ForkLeaseRequest fl = KVPALACE__V1__FORK_LEASE_REQUEST__INIT;
	Kvpalace__V1__CheckpointRequest ck = KVPALACE__V1__CHECKPOINT_REQUEST__INIT;
	Kvpalace__V1__RestoreRequest rs = KVPALACE__V1__RESTORE_REQUEST__INIT;
	Kvpalace__V1__ListSessionsRequest ls;
	Kvpalace__V1__Response *resp;
	const uint64_t bogus = 1ull << 50; /* never handed out */
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t mine;
	kvp_client *c;

	CHILD_CHECK(r != NULL);
	CHILD_CHECK_EQ(raw_open(r, k->h->sock), 0);
	CHILD_CHECK_EQ(raw_open_pool(r, MODEL, &harness_layout, &mine), 0);
	CHILD_CHECK(mine != k->pool_a);

	/* A's pool. */
	SAME_AS_BOGUS(r, k->pool_a, bogus, raw_req_create_session(&req, &cs, id_));
	SAME_AS_BOGUS(r, k->pool_a, bogus, raw_req_match(&req, &mp, id_, k->tokens, N_TOKENS));
	SAME_AS_BOGUS(r, k->pool_a, bogus,
		      (req_base(&req, KVPALACE__V1__REQUEST__OP_PREFETCH), pf.pool_id = id_,
		       pf.n_tokens = N_TOKENS, pf.tokens = k->tokens, req.prefetch = &pf));
	SAME_AS_BOGUS(r, k->pool_a, bogus,
		      (req_base(&req, KVPALACE__V1__REQUEST__OP_RESTORE), rs.has_pool_id = 1,
		       rs.pool_id = id_, rs.name = "anything", req.restore = &rs));
	/* A's session. */
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_append(&req, &app, id_, k->tokens, N_TOKENS));
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_commit(&req, &cm, id_, 1));
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_fork(&req, &fk, id_, 16));
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_truncate(&req, &tr, id_, 0));
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_session_pages(&req, &sp, id_, 0));
	SAME_AS_BOGUS(r, k->session_a, bogus,
		      (req_base(&req, KVPALACE__V1__REQUEST__OP_CHECKPOINT), ck.session_id = id_,
		       ck.name = "stolen", req.checkpoint = &ck));
	SAME_AS_BOGUS(r, k->session_a, bogus, raw_req_close_session(&req, &cl, id_));
	/* A's lease. */
	SAME_AS_BOGUS(r, k->lease_a, bogus, raw_req_release(&req, &rel, id_));
	SAME_AS_BOGUS(r, k->lease_a, bogus,
		      (req_base(&req, KVPALACE__V1__REQUEST__OP_FORK_LEASE), fl.lease_id = id_,
		       fl.n_tokens = 16, req.fork_lease = &fl));
	SAME_AS_BOGUS(r, k->lease_a, bogus,
		      (raw_req_match(&req, &mp, mine, k->tokens, N_TOKENS), mp.has_lease_id = 1,
		       mp.lease_id = id_));
	/* Listing A's pool lists what a pool that does not exist lists. */
	raw_req_list_sessions(&req, &ls, k->pool_a);
	CHILD_CHECK_EQ(raw_call(r, &req, &resp, NULL), 1);
	CHILD_CHECK_EQ(resp->status, ST(OK));
	CHILD_CHECK_EQ(resp->list_sessions->n_sessions, 0);
	raw_close(r);
	free(r);

	/* Through the library, as kvpalace.h documents. */
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_admin_checkpoint(c, k->session_a, "stolen", NULL), -ENOENT);
	CHILD_CHECK_EQ(kvp_admin_restore(c, "anything", 0, 0, k->pool_a, NULL), -ENOENT);
	{
		struct kvp_session_info *si;
		size_t n;

		CHILD_CHECK_EQ(kvp_list_sessions(c, k->pool_a, &si, &n), 0);
		CHILD_CHECK_EQ(n, 0);
		free(si);
	}
	kvp_disconnect(c);
	return 0;
}

static void test_foreign_ids(void **state)
{
	struct iso *k;
	pid_t a, a2;
	char byte;

	NEED_ROOT();
	k = iso_new(*state);
	a = fork_as(UID_A, a_holds_lease, k);
	assert_true(a > 0);
	assert_int_equal(read(k->ready[0], &byte, 1), 1);
	a2 = fork_as(UID_A, a_holds_raw_lease, k);
	assert_true(a2 > 0);
	assert_int_equal(read(k->ready[0], &byte, 1), 1);
	assert_true(k->lease_a != 0);
	assert_int_equal(run_as(UID_B, b_tries_a_ids, k), 0);
	assert_int_equal(write(k->go[1], "gg", 2), 2);
	assert_int_equal(harness_wait(a2, 60), 0);
	assert_int_equal(harness_wait(a, 60), 0);
	iso_free(k);
}

/* ---- arenas ------------------------------------------------------------- */

/* Opens the pool over a raw connection and keeps the arena descriptor. */
static int arena_fd(struct raw *r, uint64_t *ret_pool, uint64_t *ret_bytes)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	Kvpalace__V1__Response *resp;
	int fd = -1;

	if (raw_hello(r) < 0)
		return -1;
	raw_req_open_pool(&req, &op, &lay, MODEL, &harness_layout);
	if (raw_call(r, &req, &resp, &fd) != 1 || resp->status != ST(OK))
		return -1;
	*ret_pool = resp->open_pool->pool_id;
	*ret_bytes = resp->open_pool->arena_bytes;
	return fd;
}

static int a_marks_arena(struct iso *k)
{
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t pool_id, bytes;
	struct stat st;
	char *m, go;
	int fd;

	CHILD_CHECK(r != NULL);
	CHILD_CHECK_EQ(raw_open(r, k->h->sock), 0);
	fd = arena_fd(r, &pool_id, &bytes);
	CHILD_CHECK(fd >= 0);
	CHILD_CHECK_EQ(fstat(fd, &st), 0);
	k->pool_a = pool_id;
	k->arena_dev_a = st.st_dev;
	k->arena_ino_a = st.st_ino;
	m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHILD_CHECK(m != MAP_FAILED);
	/* A's bytes in every page of its arena. */
	for (uint64_t off = 0; off + sizeof(MARKER) <= bytes; off += 4096)
		memcpy(m + off, MARKER, sizeof(MARKER));
	k->holder_pid = getpid();
	CHILD_CHECK_EQ(write(k->ready[1], "r", 1), 1);
	/* Holds the descriptor and the mapping while B looks. */
	CHILD_CHECK_EQ(read(k->go[0], &go, 1), 1);
	munmap(m, bytes);
	close(fd);
	raw_close(r);
	free(r);
	return 0;
}

static int b_looks_for_a_arena(struct iso *k)
{
	struct raw *r = calloc(1, sizeof(*r));
	char path[96];
	uint64_t pool_id, bytes;
	struct stat st;
	char *m;
	int fd;

	CHILD_CHECK(r != NULL);
	CHILD_CHECK_EQ(raw_open(r, k->h->sock), 0);
	fd = arena_fd(r, &pool_id, &bytes);
	CHILD_CHECK(fd >= 0);
	CHILD_CHECK(pool_id != k->pool_a);
	/* Another memfd than A's... */
	CHILD_CHECK_EQ(fstat(fd, &st), 0);
	CHILD_CHECK(st.st_dev != k->arena_dev_a || st.st_ino != k->arena_ino_a);
	/* ...that holds none of A's bytes. */
	m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
	CHILD_CHECK(m != MAP_FAILED);
	CHILD_CHECK(memmem(m, bytes, MARKER, sizeof(MARKER) - 1) == NULL);
	munmap(m, bytes);
	close(fd);
	/* Opening it again gives B its own arena again, nothing else. */
	{
		uint64_t again;

		fd = arena_fd(r, &again, &bytes);
		CHILD_CHECK(fd >= 0);
		CHILD_CHECK_EQ(again, pool_id);
		CHILD_CHECK_EQ(fstat(fd, &st), 0);
		CHILD_CHECK(st.st_dev != k->arena_dev_a || st.st_ino != k->arena_ino_a);
		close(fd);
	}
	raw_close(r);
	free(r);
	/* Nor can /proc lend B the descriptor the daemon or A holds. */
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)k->h->pid);
	CHILD_CHECK(opendir(path) == NULL);
	CHILD_CHECK_EQ(errno, EACCES);
	for (int i = 0; i < 64; i++) {
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)k->holder_pid, i);
		CHILD_CHECK(open(path, O_RDONLY) < 0);
		CHILD_CHECK(errno == EACCES || errno == ENOENT);
	}
	snprintf(path, sizeof(path), "/proc/%d/mem", (int)k->h->pid);
	CHILD_CHECK(open(path, O_RDONLY) < 0);
	/* The spill files, where A's pages rest on disk, are out of reach. */
	snprintf(path, sizeof(path), "%.50s/cache", k->h->dir);
	CHILD_CHECK(opendir(path) == NULL);
	CHILD_CHECK_EQ(errno, EACCES);
	return 0;
}

static void test_arenas_per_tenant(void **state)
{
	struct iso *k;
	pid_t a;
	char byte;

	NEED_ROOT();
	k = iso_new(*state);
	a = fork_as(UID_A, a_marks_arena, k);
	assert_true(a > 0);
	assert_int_equal(read(k->ready[0], &byte, 1), 1);
	assert_int_equal(run_as(UID_B, b_looks_for_a_arena, k), 0);
	assert_int_equal(write(k->go[1], "g", 1), 1);
	assert_int_equal(harness_wait(a, 60), 0);
	iso_free(k);
}

/* ---- Stats and ListSessions ---------------------------------------------- */

static int a_two_sessions(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s1, *s2;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, k->tokens, N_TOKENS, &s1), 0);
	/* Both outlive this connection (what the other tenants must not
	 * reach has to exist). */
	CHILD_CHECK_EQ(kvp_session_set_persistent(s1, 1), 0);
	CHILD_CHECK_EQ(kvp_session_create_persistent(p, &s2), 0);
	k->pool_a = kvp_pool_id(p);
	k->session_a = kvp_session_id(s1);
	kvp_disconnect(c);
	return 0;
}

static int b_lists(struct iso *k)
{
	struct kvp_session_info *si;
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	size_t n;
	int more;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	/* Listed by the admin after this process is gone. */
	CHILD_CHECK_EQ(kvp_session_create_persistent(p, &s), 0);
	CHILD_CHECK_EQ(kvp_list_sessions(c, 0, &si, &n), 0);
	CHILD_CHECK_EQ(n, 1);
	CHILD_CHECK_EQ(si[0].session_id, kvp_session_id(s));
	CHILD_CHECK_EQ(si[0].uid, UID_B);
	free(si);
	CHILD_CHECK_EQ(kvp_list_sessions(c, k->pool_a, &si, &n), 0);
	CHILD_CHECK_EQ(n, 0);
	free(si);
	/* Paged, from before A's sessions on: still only its own, and
	 * nothing of A's pool. */
	CHILD_CHECK_EQ(kvp_list_sessions_page(c, 0, k->session_a - 1, 1000, &si, &n, &more), 0);
	CHILD_CHECK_EQ(n, 1);
	CHILD_CHECK_EQ(more, 0);
	CHILD_CHECK_EQ(si[0].uid, UID_B);
	free(si);
	CHILD_CHECK_EQ(kvp_list_sessions_page(c, k->pool_a, 0, 1, &si, &n, &more), 0);
	CHILD_CHECK_EQ(n, 0);
	CHILD_CHECK_EQ(more, 0);
	free(si);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->n_pools, 1);
	CHILD_CHECK_EQ(st->pools[0].pool_id, kvp_pool_id(p));
	CHILD_CHECK_EQ(st->pools[0].uid, UID_B);
	CHILD_CHECK_EQ(st->pools[0].n_sessions, 1);
	CHILD_CHECK(harness_find_pool(st, k->pool_a) == NULL);
	kvp_stats_free(st);
	kvp_disconnect(c);
	return 0;
}

static void test_listings_per_tenant(void **state)
{
	struct harness *h = *state;
	struct kvp_session_info *si;
	kvp_client *adm;
	struct iso *k;
	size_t n;

	NEED_ROOT();
	k = iso_new(h);
	assert_int_equal(run_as(UID_A, a_two_sessions, k), 0);
	assert_int_equal(run_as(UID_B, b_lists, k), 0);
	/* The administrator sees all three, of both tenants. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_list_sessions(adm, 0, &si, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(si[0].uid, UID_A);
	assert_int_equal(si[2].uid, UID_B);
	free(si);
	kvp_disconnect(adm);
	iso_free(k);
}

/* ---- checkpoints --------------------------------------------------------- */

#define CKPT "shared-name"

static int a_checkpoints(struct iso *k)
{
	struct kvp_checkpoint_list *l;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, k->tokens, N_TOKENS - 8, &s), 0);
	CHILD_CHECK_EQ(kvp_session_checkpoint(s, CKPT, NULL), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	CHILD_CHECK_EQ(kvp_list_checkpoints(c, 0, 0, &l), 0);
	CHILD_CHECK_EQ(l->n_entries, 1);
	CHILD_CHECK_EQ(l->entries[0].uid, UID_A);
	kvp_checkpoint_list_free(l);
	k->pool_a = kvp_pool_id(p);
	kvp_disconnect(c);
	return 0;
}

static int b_tries_a_checkpoint(struct iso *k)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__RestoreRequest rs = KVPALACE__V1__RESTORE_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_checkpoint_list *l;
	struct kvp_checkpoint_info *e;
	char path[256];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *got;
	kvp_lease *lease;
	struct raw *r = calloc(1, sizeof(*r));

	CHILD_CHECK(r != NULL);
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	/* B's names are B's own: none yet. */
	CHILD_CHECK_EQ(kvp_list_checkpoints(c, 0, 0, &l), 0);
	CHILD_CHECK_EQ(l->n_entries, 0);
	kvp_checkpoint_list_free(l);
	CHILD_CHECK_EQ(kvp_list_checkpoints(c, 1, UID_A, &l), -EPERM);
	CHILD_CHECK_EQ(kvp_session_restore(p, CKPT, &got), -ENOENT);
	CHILD_CHECK_EQ(kvp_admin_restore(c, CKPT, 1, UID_A, kvp_pool_id(p), NULL), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_restore(c, CKPT, 0, 0, k->pool_a, NULL), -ENOENT);
	/* A path in the name reaches no other directory. */
	CHILD_CHECK_EQ(raw_open(r, k->h->sock), 0);
	CHILD_CHECK_EQ(raw_hello(r), 0);
	kvpalace__v1__request__init(&req);
	req.id = next_id++;
	req.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
	rs.has_pool_id = 1;
	rs.pool_id = kvp_pool_id(p);
	rs.name = "../2001/" CKPT;
	req.restore = &rs;
	CHILD_CHECK_EQ(raw_call(r, &req, &resp, NULL), 1);
	CHILD_CHECK_EQ(resp->status, ST(INVALID));
	raw_close(r);
	free(r);
	/* Nor are A's files readable. */
	snprintf(path, sizeof(path), "%s/state/checkpoints/%u/%s", k->h->dir, UID_A, CKPT);
	CHILD_CHECK(open(path, O_RDONLY) < 0);
	CHILD_CHECK_EQ(errno, EACCES);
	/* B saves its own under the same name: A's is not touched. */
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_append(s, k->tokens, N_TOKENS - 8), 0);
	CHILD_CHECK_EQ(write_b_bytes(p, s, N_TOKENS - 8), 0);
	CHILD_CHECK_EQ(kvp_commit(s, N_TOKENS - 8), 0);
	CHILD_CHECK_EQ(kvp_session_checkpoint(s, CKPT, NULL), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	CHILD_CHECK_EQ(kvp_list_checkpoints(c, 0, 0, &l), 0);
	CHILD_CHECK_EQ(l->n_entries, 1);
	e = &l->entries[0];
	CHILD_CHECK_EQ(e->uid, UID_B);
	kvp_checkpoint_list_free(l);
	CHILD_CHECK_EQ(kvp_session_restore(p, CKPT, &got), 0);
	CHILD_CHECK_EQ(kvp_session_committed(got), N_TOKENS - 8);
	CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS - 8, &lease), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(lease), 48);
	CHILD_CHECK_EQ(rows_not_b(lease, p, 48), 0);
	CHILD_CHECK_EQ(kvp_lease_release(lease), 0);
	kvp_disconnect(c);
	return 0;
}

static int a_restores_own(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_restore(p, CKPT, &s), 0);
	CHILD_CHECK_EQ(kvp_session_committed(s), N_TOKENS - 8);
	CHILD_CHECK_EQ(harness_pkv_check_session(p, s, k->tokens, 0, N_TOKENS - 8), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_checkpoints_per_tenant(void **state)
{
	struct harness *h = *state;
	struct kvp_checkpoint_list *l;
	kvp_client *adm;
	struct iso *k;

	NEED_ROOT();
	k = iso_new(h);
	assert_int_equal(run_as(UID_A, a_checkpoints, k), 0);
	assert_int_equal(run_as(UID_B, b_tries_a_checkpoint, k), 0);
	assert_int_equal(run_as(UID_A, a_restores_own, k), 0);
	/* The administrator sees one of each tenant. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_list_checkpoints(adm, 0, 0, &l), 0);
	assert_int_equal(l->n_entries, 2);
	assert_int_equal(l->entries[0].uid, UID_A);
	assert_int_equal(l->entries[1].uid, UID_B);
	kvp_checkpoint_list_free(l);
	kvp_disconnect(adm);
	iso_free(k);
}

/* ---- admin operations on the client socket ------------------------------- */

/* Every admin call through c (a client-socket connection): -EPERM, and
 * nothing of A's changes. */
static int admin_refused(kvp_client *c, const struct iso *k)
{
	struct kvp_session_detail *d;
	struct kvp_drop_session_result ds;
	struct kvp_drop_pool_result dp;
	struct kvp_evict_result *ev;
	struct kvp_config *cfg;
	struct kvp_config_reload *rl;
	struct kvp_warmup_info wi;

	CHILD_CHECK_EQ(kvp_is_admin(c), 0);
	CHILD_CHECK_EQ(kvp_admin_show_session(c, k->session_a, 16, &d), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_drop_session(c, k->session_a, KVP_DROP_FORCE, &ds), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_drop_pool(c, k->pool_a, KVP_DROP_FORCE, &dp), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_evict(c, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &ev), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_config_show(c, &cfg), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_config_reload(c, &rl), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_warmup(c, CKPT, 1, UID_A, &wi), -EPERM);
	CHILD_CHECK_EQ(kvp_admin_warmup(c, CKPT, 0, 0, &wi), -EPERM);
	/* The connection is still served. */
	CHILD_CHECK_EQ(kvp_ping(c), 0);
	return 0;
}

static int b_tries_admin(struct iso *k)
{
	kvp_client *c;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(admin_refused(c, k), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_admin_ops_refused(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	kvp_client *c;
	struct iso *k;

	NEED_ROOT();
	k = iso_new(h);
	assert_int_equal(run_as(UID_A, a_two_sessions, k), 0);
	assert_int_equal(run_as(UID_B, b_tries_admin, k), 0);
	/* Root on the client socket is a tenant like any other. */
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(admin_refused(c, k), 0);
	kvp_disconnect(c);
	/* A's pool and sessions are all there, its pages still indexed. */
	assert_int_equal(kvp_connect(h->admin_sock, &c), 0);
	assert_int_equal(harness_pool_stats(c, k->pool_a, &ps, NULL), 0);
	assert_int_equal(ps.n_sessions, 2);
	assert_int_equal(ps.indexed_pages, N_TOKENS / harness_layout.block_tokens);
	kvp_disconnect(c);
	assert_int_equal(run_as(UID_A, a_reads_own, k), 0);
	iso_free(k);
}

/* ---- counters and ids ------------------------------------------------------ */

/* B makes a session, then A is busy (appends, commits, matches, sessions,
 * a checkpoint), then B looks: its Stats on the client socket count only
 * B's own work, and its next session id follows its last one, so neither
 * says what A did. Scenario: issue 14's tenant that watched another's
 * prompt lengths and hit pattern live through daemon-wide counters and a
 * global id counter. */
static int b_first(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	k->session_b1 = kvp_session_id(s);
	kvp_disconnect(c);
	return 0;
}

static int a_busy(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, k->tokens, N_TOKENS, &s), 0);
	CHILD_CHECK_EQ(kvp_session_checkpoint(s, "a-busy", NULL), 0);
	for (int i = 0; i < 5; i++) {
		CHILD_CHECK_EQ(kvp_match_prefix(p, k->tokens, N_TOKENS, &l), 0);
		CHILD_CHECK(kvp_lease_tokens(l) > 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	}
	for (int i = 0; i < 20; i++) {
		CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
		CHILD_CHECK_EQ(kvp_session_close(s), 0);
	}
	kvp_disconnect(c);
	return 0;
}

static int b_second(struct iso *k)
{
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	CHILD_CHECK_EQ(st->appended_tokens, 0);
	CHILD_CHECK_EQ(st->committed_tokens, 0);
	CHILD_CHECK_EQ(st->match_hits, 0);
	CHILD_CHECK_EQ(st->match_misses, 0);
	CHILD_CHECK_EQ(st->matched_tokens, 0);
	CHILD_CHECK_EQ(st->checkpoints_written, 0);
	CHILD_CHECK_EQ(st->connections, 1);
	CHILD_CHECK(st->requests < 16); /* B's own handful */
	kvp_stats_free(st);
	CHILD_CHECK_EQ(kvp_session_create(p, &s), 0);
	CHILD_CHECK_EQ(kvp_session_id(s), k->session_b1 + 1);
	kvp_disconnect(c);
	return 0;
}

static void test_counters_and_ids_per_tenant(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st;
	kvp_client *adm;
	struct iso *k;

	NEED_ROOT();
	k = iso_new(h);
	assert_int_equal(run_as(UID_B, b_first, k), 0);
	assert_int_equal(run_as(UID_A, a_busy, k), 0);
	assert_int_equal(run_as(UID_B, b_second, k), 0);
	/* The administrator sees A's work. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_stats(adm, &st), 0);
	assert_true(st->match_hits >= 5);
	assert_true(st->committed_tokens >= N_TOKENS);
	assert_true(st->checkpoints_written >= 1);
	kvp_stats_free(st);
	kvp_disconnect(adm);
	iso_free(k);
}

/* ---- host tier shares ------------------------------------------------------ */

/* A host tier of 1 MiB, pools of 512 KiB (64 pages of 8 KiB). */
static int setup_small_tier(void **state)
{
	static const char *const extra[] = {"--host-tier-size",
					    "1M",
					    "--host-pool-size",
					    "512K",
					    "--disk-pool-size",
					    "0",
					    NULL};

	if (geteuid() != 0) {
		*state = NULL;
		return 0;
	}
	return harness_setup_args(state, extra);
}

#define SHARE_TOKENS (60u * 16u) /* 60 pages */

/* A opens four pools (each arena could hold half the tier) and fills two
 * with cached pages, the whole tier. */
static int a_fills_tier(struct iso *k)
{
	uint32_t *t = calloc(SHARE_TOKENS, sizeof(*t));
	kvp_client *c;
	kvp_pool *p[4];

	CHILD_CHECK(t != NULL);
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	for (int i = 0; i < 4; i++) {
		char model[32];

		snprintf(model, sizeof(model), "share-a-%d", i);
		CHILD_CHECK_EQ(kvp_pool_open(c, model, &harness_layout, &p[i]), 0);
	}
	for (int i = 0; i < 2; i++) {
		kvp_session *s;

		harness_tokens(t, SHARE_TOKENS, 600 + (uint32_t)i, 0);
		CHILD_CHECK_EQ(harness_pkv_commit_session(p[i], t, SHARE_TOKENS, &s), 0);
		CHILD_CHECK_EQ(kvp_session_close(s), 0);
	}
	kvp_disconnect(c);
	free(t);
	return 0;
}

/* B opens a pool in the full tier and commits 40 pages: it is under its
 * fair share, so A's cached pages make room. */
static int b_gets_room(struct iso *k)
{
	uint32_t t[40 * 16];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	harness_tokens(t, 40 * 16, 700, 0);
	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "share-b", &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, t, 40 * 16, &s), 0);
	CHILD_CHECK_EQ(kvp_session_close(s), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, t, 40 * 16, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), 40 * 16);
	CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, t, 40 * 16), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	kvp_disconnect(c);
	return 0;
}

/* Scenario: issue 14's tenant that took the host tier from everyone: each
 * pool booked its whole arena when it opened, so with one user's pools
 * open every other user got ENOSPC on the first OpenPool. Arenas now cost
 * the pages they hold, and a tenant under its fair share of a full tier
 * takes room from one over its share (A's cached pages), never the
 * reverse. */
static void test_host_tier_shares(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st;
	kvp_client *adm;
	uint64_t a_pages = 0, b_pages = 0;
	struct iso *k;

	NEED_ROOT();
	k = iso_new(h);
	assert_int_equal(run_as(UID_A, a_fills_tier, k), 0);
	assert_int_equal(run_as(UID_B, b_gets_room, k), 0);
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_stats(adm, &st), 0);
	for (size_t i = 0; i < st->n_pools; i++) {
		uint64_t held = st->pools[i].n_pages - st->pools[i].free_pages;

		if (st->pools[i].uid == UID_A)
			a_pages += held;
		else if (st->pools[i].uid == UID_B)
			b_pages += held;
	}
	print_message("host tier 128 pages: A holds %llu, B %llu\n", (unsigned long long)a_pages,
		      (unsigned long long)b_pages);
	assert_true(a_pages + b_pages <= 128);
	assert_int_equal(b_pages, 40);
	kvp_stats_free(st);
	kvp_disconnect(adm);
	iso_free(k);
}

/* ---- per-tenant limits ---------------------------------------------------- */

static int two_pools_then_limit(struct iso *k)
{
	kvp_client *c;
	kvp_pool *p[3];

	CHILD_CHECK_EQ(kvp_connect(k->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "isolation-1", &harness_layout, &p[0]), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "isolation-2", &harness_layout, &p[1]), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, "isolation-3", &harness_layout, &p[2]), -EDQUOT);
	kvp_disconnect(c);
	return 0;
}

static void test_pool_limit_per_tenant(void **state)
{
	struct iso *k;

	NEED_ROOT();
	k = iso_new(*state);
	assert_int_equal(run_as(UID_A, two_pools_then_limit, k), 0);
	/* A at its limit takes nothing from B. */
	assert_int_equal(run_as(UID_B, two_pools_then_limit, k), 0);
	iso_free(k);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_prefixes_per_tenant),
		T(test_foreign_ids),
		T(test_arenas_per_tenant),
		T(test_listings_per_tenant),
		T(test_checkpoints_per_tenant),
		T(test_admin_ops_refused),
		T(test_counters_and_ids_per_tenant),
		cmocka_unit_test_setup_teardown(test_pool_limit_per_tenant, setup_pools2, teardown),
		cmocka_unit_test_setup_teardown(test_host_tier_shares, setup_small_tier, teardown),
	};

	return cmocka_run_group_tests_name("isolation", tests, NULL, NULL);
}
