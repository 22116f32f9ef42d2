/* tests/integration/test_model.c — the prefix index against a reference
 * model: thousands of random operations, checked after every step.
 *
 * Three clients drive one pool of a real daemon: two connections of this
 * process and one forked process (commands go to it over a socketpair) —
 * Create, Append (K/V written right away), Commit, Match (released at once
 * or held), Release, Fork, Truncate, Close, graceful disconnects, a SIGKILL
 * of the forked process, and closing the persistent sessions a lost client
 * left behind through a raw connection (its other sessions die with it). Sessions use four cache salts (none,
 * "a", "a\0" and 64 bytes) and grow from a few shared stems, so prefixes
 * are shared, deduplicated, forked and diverge at every page offset.
 *
 * The model keeps what the daemon should hold: each session's tokens, its
 * committed length and page table; the prefix index as a trie of full
 * pages per salt (a node is the hash chain h_i); which pages sessions,
 * leases and the index hold. After every step it checks:
 *  - the operation's result (the error the model predicts: -ENOSPC only
 *    when every page is held or pinned), the library's token counts, and
 *    the bytes it read (K/V is a function of the token prefix, so a wrong
 *    page, a stale slot or a chain that forgot its parent shows);
 *  - a match's length, in whole pages, against the trie;
 *  - Stats of the pool: free, reserved, leased, indexed and evictable pages,
 *    sessions, dedup_pages and evictions, and the daemon-wide counters;
 *  - kvp_list_sessions: tokens, committed, pages, shared pages, writing.
 * Which pages eviction takes is the daemon's choice (least recently used
 * leaves): when the evictions counter moves, the model learns which nodes
 * went by matching each evictable leaf's chain (a probe), and checks that
 * only pages nothing but the index held were taken, that the index stayed
 * prefix-closed, and that eviction only happened when the watermark or a
 * request called for it.
 *
 * Seed: $KVP_MODEL_SEED (else from the clock), printed when a check fails
 * together with the last operations; $KVP_MODEL_OPS sets the number of
 * operations of each variant (the `slow` suite runs many more).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	  "model-test"
#define BT	  8u
#define MAX_TOK	  1024u /* tokens of one session */
#define MAX_Q	  (MAX_TOK + 4 * BT)
#define MAX_SP	  (MAX_TOK / BT + 1) /* pages of one session */
#define MAX_SESS  40
#define MAX_LEASE 24
#define N_SALTS	  4
#define N_CLIENTS 3 /* 0 and 1 in this process, 2 a forked process */
#define REMOTE	  2
#define N_STEMS	  4
#define HISTORY	  16
#define LOG_LINES 48

/* 2 layers, 1 KV head of 8: a page is 512 bytes of data, 4096 padded. */
static const struct kvp_layout mlayout = {
	.n_layers = 2,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static const struct {
	const char *bytes;
	size_t n;
} salts[N_SALTS] = {
	{NULL, 0},
	{"a", 1},
	{"a\0", 2}, /* differs from "a" only by its length */
	{"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64},
};

/* ---- the executor: one client's handles, in this or a forked process ---- */

enum xop {
	X_CONNECT,
	X_DISCONNECT,
	X_CREATE,
	X_APPEND,
	X_COMMIT,
	X_FORK,
	X_TRUNCATE,
	X_CLOSE,
	X_MATCH,
	X_RELEASE,
	X_VERIFY_SESSION,
	X_VERIFY_LEASE,
	X_QUIT,
};

struct cmd {
	uint32_t op;
	uint32_t salt;
	int32_t slot;  /* session (or lease for release/verify-lease) */
	int32_t slot2; /* new session of a fork; lease slot of a held match, or -1 */
	uint64_t n;    /* append: new tokens; commit, fork, truncate: count */
	uint64_t from; /* append: tokens before it; commit: committed before it */
	uint32_t n_tok;
	uint32_t tokens[MAX_Q]; /* the session's tokens, or the query */
};

struct res {
	int32_t ret;
	uint64_t val; /* matched tokens; session id of create/fork */
	uint64_t n_tokens, committed;
	uint64_t bad; /* rows that read wrong */
};

struct exec {
	const char *sock;
	kvp_client *c;
	kvp_pool *p[N_SALTS];
	kvp_session *s[MAX_SESS];
	kvp_lease *l[MAX_LEASE];
	uint32_t *ltok[MAX_LEASE]; /* a held lease's query, to verify it later */
};

static int exec_connect(struct exec *x)
{
	int ret = kvp_connect(x->sock, &x->c);

	for (int i = 0; ret == 0 && i < N_SALTS; i++) {
		ret = kvp_pool_open(x->c, MODEL, &mlayout, &x->p[i]);
		if (ret == 0 && salts[i].n)
			ret = kvp_pool_set_salt(x->p[i], salts[i].bytes, salts[i].n);
	}
	return ret;
}

static void exec_drop(struct exec *x)
{
	for (int i = 0; i < MAX_LEASE; i++) {
		free(x->ltok[i]);
		x->ltok[i] = NULL;
	}
	kvp_disconnect(x->c);
	x->c = NULL;
	memset(x->p, 0, sizeof(x->p));
	memset(x->s, 0, sizeof(x->s));
	memset(x->l, 0, sizeof(x->l));
}

static void exec_run(struct exec *x, const struct cmd *c, struct res *r)
{
	kvp_session *s = c->slot >= 0 && c->slot < MAX_SESS ? x->s[c->slot] : NULL;
	kvp_pool *p = x->p[c->salt];
	kvp_lease *l;
	uint64_t at;

	memset(r, 0, sizeof(*r));
	switch (c->op) {
	case X_CONNECT:
		r->ret = exec_connect(x);
		return;
	case X_DISCONNECT:
		exec_drop(x);
		return;
	case X_CREATE:
		/* n: persistent (it outlives the connection). */
		r->ret = c->n ? kvp_session_create_persistent(p, &x->s[c->slot])
			      : kvp_session_create(p, &x->s[c->slot]);
		if (r->ret == 0)
			r->val = kvp_session_id(x->s[c->slot]);
		return;
	case X_APPEND:
		r->ret = kvp_append(s, c->tokens + c->from, c->n);
		/* Whatever was reserved is written, even after a failed chunk. */
		at = kvp_session_tokens(s);
		if (at > c->from && harness_pkv_write_session(p, s, c->tokens, c->from, at) < 0)
			r->bad = 1;
		break;
	case X_COMMIT:
		r->ret = kvp_commit(s, c->n);
		/* Pages the commit filled may now be indexed copies: read them
		 * through fresh pointers. */
		r->bad = harness_pkv_check_session(p, s, c->tokens, c->from / BT * BT, c->n_tok);
		break;
	case X_FORK:
		r->ret = kvp_session_fork(s, c->n, &x->s[c->slot2]);
		if (r->ret == 0) {
			kvp_session *f = x->s[c->slot2];

			r->val = kvp_session_id(f);
			r->bad = harness_pkv_check_session(p, f, c->tokens, 0, c->n);
			r->n_tokens = kvp_session_tokens(f);
			r->committed = kvp_session_committed(f);
			/* The source must read as before. */
			r->bad += harness_pkv_check_session(p, s, c->tokens, 0,
							    kvp_session_tokens(s));
			return;
		}
		break;
	case X_TRUNCATE:
		r->ret = kvp_truncate(s, c->n);
		r->bad = harness_pkv_check_session(p, s, c->tokens, 0, kvp_session_tokens(s));
		break;
	case X_CLOSE:
		r->ret = kvp_session_close(s);
		x->s[c->slot] = NULL;
		return;
	case X_MATCH:
		r->ret = kvp_match_prefix(p, c->tokens, c->n_tok, &l);
		if (r->ret < 0)
			return;
		r->val = kvp_lease_tokens(l);
		r->bad = harness_pkv_check_lease(l, p, c->tokens, r->val);
		if (kvp_lease_kv(l, r->val, 0, 0, 0) != NULL)
			r->bad++;
		if (c->slot2 >= 0) {
			x->l[c->slot2] = l;
			free(x->ltok[c->slot2]);
			x->ltok[c->slot2] = malloc((r->val + 1) * sizeof(uint32_t));
			if (!x->ltok[c->slot2])
				r->bad++;
			else
				memcpy(x->ltok[c->slot2], c->tokens, r->val * sizeof(uint32_t));
		} else {
			r->ret = kvp_lease_release(l);
		}
		return;
	case X_RELEASE:
		r->ret = kvp_lease_release(x->l[c->slot]);
		x->l[c->slot] = NULL;
		return;
	case X_VERIFY_SESSION:
		r->bad = harness_pkv_check_session(p, s, c->tokens, 0, c->n_tok);
		break;
	case X_VERIFY_LEASE:
		l = x->l[c->slot];
		r->val = kvp_lease_tokens(l);
		r->bad = harness_pkv_check_lease(l, x->p[0], x->ltok[c->slot], r->val);
		return;
	default:
		r->ret = -EINVAL;
		return;
	}
	r->n_tokens = kvp_session_tokens(s);
	r->committed = kvp_session_committed(s);
}

/* The forked client: runs commands from fd until X_QUIT or EOF. */
struct remote_arg {
	const char *sock;
	int fd;
};

static int remote_main(void *arg)
{
	struct remote_arg *ra = arg;
	struct cmd *c = malloc(sizeof(*c));
	struct exec x = {.sock = ra->sock};
	struct res r;

	/* Keep only the command socket: a copy of the parent's daemon
	 * connections would keep them open after the parent closes them. */
	if (!c || dup2(ra->fd, 3) < 0 || syscall(SYS_close_range, 4u, ~0u, 0) < 0)
		return 1;
	for (;;) {
		ssize_t n = recv(3, c, sizeof(*c), 0);

		if (n <= 0 || c->op == X_QUIT)
			break;
		exec_run(&x, c, &r);
		if (send(3, &r, sizeof(r), 0) != (ssize_t)sizeof(r))
			break;
	}
	exec_drop(&x);
	free(c);
	return 0;
}

/* ---- the reference model ------------------------------------------------ */

struct mpage {
	int32_t sref; /* session page-table entries */
	int32_t lref; /* lease pins */
	int32_t node; /* the index node listing it, or -1 */
	uint8_t used;
};

struct mnode {
	uint32_t tok[BT];
	int32_t parent; /* -1: first page of the chain of salt */
	int32_t salt;
	int32_t page;
	int32_t n_children;
	int32_t depth;
	int32_t next; /* hash bucket chain */
	uint8_t alive;
};

struct msess {
	uint8_t alive, orphan, persistent;
	int client, salt, stem;
	uint64_t id;
	uint32_t n, committed, n_pages;
	uint32_t tok[MAX_TOK];
	int32_t pages[MAX_SP];
};

struct mlease {
	uint8_t alive;
	int client;
	uint32_t n_pages;
	int32_t pages[MAX_Q / BT];
};

struct client {
	int connected;
	int remote;
	int fd; /* remote: command socket */
	pid_t pid;
	struct exec local;
};

#define N_BUCKETS 4096

struct model {
	struct harness *h;
	uint64_t seed, rng;
	long step, n_ops;
	const char *variant;
	uint64_t pool_id;
	uint32_t n_pages, high;
	struct mpage *pages; /* [2 * n_pages + MAX_SP] */
	int32_t *free_stack;
	uint32_t n_free; /* ids on free_stack */
	uint32_t n_used; /* pages some session, lease or the index holds */
	struct mnode *nodes;
	uint32_t n_nodes, cap_nodes;
	int32_t buckets[N_BUCKETS];
	struct msess sess[MAX_SESS];
	struct mlease lease[MAX_LEASE];
	uint64_t dedup, evictions;
	int evict_possible; /* an allocation of this step may have evicted */
	uint64_t n_evict_steps, n_enospc, n_dedup_steps;
	uint32_t history[HISTORY][MAX_TOK];
	uint32_t history_n[HISTORY], history_salt[HISTORY];
	int n_history;
	struct client cl[N_CLIENTS];
	struct exec observer; /* probes and ListSessions; never disconnects */
	struct raw raw;	      /* Stats, and closing orphaned sessions */
	struct cmd *cmd;
	struct res res;
	char log[LOG_LINES][160];
	long n_log;
};

static struct model *M;

static uint64_t rnd(void)
{
	uint64_t x = M->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	M->rng = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in [0, n); 0 when n is 0. */
static uint32_t below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

static int chance(unsigned percent)
{
	return below(100) < percent;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
	va_list ap;
	char *line = M->log[M->n_log++ % LOG_LINES];

	va_start(ap, fmt);
	vsnprintf(line, sizeof(M->log[0]), fmt, ap);
	va_end(ap);
}

/* Fails the test with the seed, the step and the last operations. */
#define MFAIL(...)                                                                                 \
	do {                                                                                       \
		dump_log();                                                                        \
		fail_msg("model %s, seed %llu (replay: KVP_MODEL_SEED=%llu), step %ld: %s",        \
			 M->variant, (unsigned long long)M->seed, (unsigned long long)M->seed,     \
			 M->step, mfmt(__VA_ARGS__));                                              \
	} while (0)

static const char *mfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *mfmt(const char *fmt, ...)
{
	static char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return buf;
}

static void dump_log(void)
{
	long from = M->n_log > LOG_LINES ? M->n_log - LOG_LINES : 0;

	fprintf(stderr, "model: the last operations (oldest first):\n");
	for (long i = from; i < M->n_log; i++)
		fprintf(stderr, "  %s\n", M->log[i % LOG_LINES]);
}

#define MCHECK_EQ(what, got, want)                                                                 \
	do {                                                                                       \
		long long g_ = (long long)(got), w_ = (long long)(want);                           \
		if (g_ != w_)                                                                      \
			MFAIL("%s: daemon %lld, model %lld", what, g_, w_);                        \
	} while (0)

/* A broken assumption of the model itself. */
#define MASSERT(cond)                                                                              \
	do {                                                                                       \
		if (!(cond))                                                                       \
			MFAIL("model invariant %s failed (%s:%d)", #cond, __FILE__, __LINE__);     \
	} while (0)

/* ---- model pages and index ---- */

/* Model page ids are identities, not slots: during a step that evicts, the
 * model allocates first and learns afterwards which indexed pages made the
 * room, so it has more ids than the pool has pages; n_used is what counts. */
static int32_t page_get(void)
{
	int32_t pg;

	MASSERT(M->n_free > 0);
	pg = M->free_stack[--M->n_free];
	M->pages[pg] = (struct mpage){.node = -1, .used = 1};
	M->n_used++;
	return pg;
}

static void page_maybe_free(int32_t pg)
{
	struct mpage *mp = &M->pages[pg];

	MASSERT(mp->used && mp->sref >= 0 && mp->lref >= 0);
	if (mp->sref == 0 && mp->lref == 0 && mp->node < 0) {
		mp->used = 0;
		M->n_used--;
		M->free_stack[M->n_free++] = pg;
	}
}

static void page_unref(int32_t pg)
{
	M->pages[pg].sref--;
	page_maybe_free(pg);
}

static int index_only(const struct mnode *nd)
{
	const struct mpage *mp = &M->pages[nd->page];

	return mp->sref == 0 && mp->lref == 0;
}

static uint32_t daemon_free(void)
{
	return M->n_used <= M->n_pages ? M->n_pages - M->n_used : 0;
}

/* Pages an allocation can get: free ones, and every page only the index
 * holds (they can all be evicted, leaves first). */
static uint32_t avail_pages(void)
{
	uint32_t n = daemon_free();

	for (uint32_t i = 0; i < M->n_nodes; i++)
		n += M->nodes[i].alive && index_only(&M->nodes[i]);
	return n;
}

/* What the daemon decides before handing out `need` pages: it may evict
 * when the pool would pass its high watermark or has too few free pages.
 * Returns whether `need` pages can be had. */
static int model_room(uint32_t need)
{
	if (M->n_used + need > M->high || daemon_free() < need)
		M->evict_possible = 1;
	return avail_pages() >= need;
}

static uint64_t node_hash(int32_t parent, int32_t salt, const uint32_t *tok)
{
	uint64_t h = (uint64_t)(parent + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)salt << 56;

	for (uint32_t i = 0; i < BT; i++)
		h = harness_prefix_step(h, tok[i]);
	return h;
}

static int32_t node_find(int32_t parent, int32_t salt, const uint32_t *tok)
{
	int32_t i = M->buckets[node_hash(parent, salt, tok) % N_BUCKETS];

	for (; i >= 0; i = M->nodes[i].next) {
		const struct mnode *nd = &M->nodes[i];

		if (nd->parent == parent && nd->salt == salt &&
		    memcmp(nd->tok, tok, sizeof(nd->tok)) == 0)
			return i;
	}
	return -1;
}

static int32_t node_add(int32_t parent, int32_t salt, const uint32_t *tok, int32_t page)
{
	uint64_t b = node_hash(parent, salt, tok) % N_BUCKETS;
	struct mnode *nd;

	if (M->n_nodes == M->cap_nodes) {
		M->cap_nodes = M->cap_nodes ? M->cap_nodes * 2 : 1024;
		M->nodes = realloc(M->nodes, M->cap_nodes * sizeof(*M->nodes));
		MASSERT(M->nodes != NULL);
	}
	nd = &M->nodes[M->n_nodes];
	memcpy(nd->tok, tok, sizeof(nd->tok));
	nd->parent = parent;
	nd->salt = salt;
	nd->page = page;
	nd->n_children = 0;
	nd->depth = parent < 0 ? 0 : M->nodes[parent].depth + 1;
	nd->alive = 1;
	nd->next = M->buckets[b];
	M->buckets[b] = (int32_t)M->n_nodes;
	if (parent >= 0)
		M->nodes[parent].n_children++;
	M->pages[page].node = (int32_t)M->n_nodes;
	return (int32_t)M->n_nodes++;
}

/* The daemon evicted node i: drop it from the trie. */
static void node_evict(int32_t i)
{
	struct mnode *nd = &M->nodes[i];
	int32_t *link = &M->buckets[node_hash(nd->parent, nd->salt, nd->tok) % N_BUCKETS];

	while (*link != i)
		link = &M->nodes[*link].next;
	*link = nd->next;
	nd->alive = 0;
	if (nd->parent >= 0)
		M->nodes[nd->parent].n_children--;
	M->pages[nd->page].node = -1;
	page_maybe_free(nd->page);
}

/* The pages of the longest indexed prefix of q[0..n) under salt. */
static uint32_t model_match(int32_t salt, const uint32_t *q, uint64_t n, int32_t *ret_pages)
{
	int32_t at = -1;
	uint32_t k = 0;

	for (uint64_t i = 0; i + BT <= n; i += BT) {
		int32_t nx = node_find(at, salt, q + i);

		if (nx < 0)
			break;
		at = nx;
		if (ret_pages)
			ret_pages[k] = M->nodes[nx].page;
		k++;
	}
	return k;
}

/* ---- model sessions ---- */

static uint32_t pages_for(uint64_t n)
{
	return (uint32_t)((n + BT - 1) / BT);
}

static void sess_drop_pages(struct msess *s, uint32_t keep)
{
	while (s->n_pages > keep)
		page_unref(s->pages[--s->n_pages]);
}

static void model_commit(struct msess *s, uint32_t k)
{
	uint32_t old = s->committed;

	s->committed += k;
	for (uint32_t i = old / BT; i < s->committed / BT; i++) {
		int32_t parent = i ? M->pages[s->pages[i - 1]].node : -1;
		int32_t nd;

		MASSERT(i == 0 || parent >= 0);
		nd = node_find(parent, s->salt, s->tok + i * BT);
		if (nd >= 0) {
			int32_t own = s->pages[i];

			MASSERT(M->nodes[nd].page != own);
			s->pages[i] = M->nodes[nd].page;
			M->pages[s->pages[i]].sref++;
			page_unref(own);
			MASSERT(!M->pages[own].used);
			M->dedup++;
		} else {
			node_add(parent, s->salt, s->tok + i * BT, s->pages[i]);
		}
	}
}

static void model_close(struct msess *s);

/* The client lost its connection: its leases end, its reservations roll
 * back, its sessions close, but for the persistent ones: they stay
 * (orphans) until someone closes them. */
static void model_disconnect(int ci)
{
	for (int i = 0; i < MAX_LEASE; i++) {
		struct mlease *l = &M->lease[i];

		if (!l->alive || l->client != ci)
			continue;
		for (uint32_t k = 0; k < l->n_pages; k++) {
			M->pages[l->pages[k]].lref--;
			page_maybe_free(l->pages[k]);
		}
		l->alive = 0;
	}
	for (int i = 0; i < MAX_SESS; i++) {
		struct msess *s = &M->sess[i];

		if (!s->alive || s->client != ci || s->orphan)
			continue;
		s->n = s->committed;
		sess_drop_pages(s, pages_for(s->committed));
		if (s->persistent)
			s->orphan = 1;
		else
			model_close(s);
	}
}

static void model_close(struct msess *s)
{
	sess_drop_pages(s, 0);
	if (s->committed) {
		int h = M->n_history++ % HISTORY;

		memcpy(M->history[h], s->tok, s->committed * sizeof(uint32_t));
		M->history_n[h] = s->committed;
		M->history_salt[h] = (uint32_t)s->salt;
	}
	s->alive = 0;
}

/* ---- talking to the clients ------------------------------------------------ */

static void cmd_set(struct cmd *c, enum xop op, int salt, int slot)
{
	c->op = op;
	c->salt = (uint32_t)salt;
	c->slot = slot;
	c->slot2 = -1;
	c->n = c->from = 0;
	c->n_tok = 0;
}

static void cmd_tokens(struct cmd *c, const uint32_t *tokens, uint32_t n)
{
	MASSERT(n <= MAX_Q);
	memcpy(c->tokens, tokens, n * sizeof(uint32_t));
	c->n_tok = n;
}

static void call(int ci, struct cmd *c, struct res *r)
{
	struct client *cl = &M->cl[ci];

	if (!cl->remote) {
		exec_run(&cl->local, c, r);
		return;
	}
	if (send(cl->fd, c, offsetof(struct cmd, tokens) + c->n_tok * sizeof(uint32_t), 0) < 0 ||
	    recv(cl->fd, r, sizeof(*r), 0) != (ssize_t)sizeof(*r))
		MFAIL("the forked client did not answer (it died?)");
}

static void start_remote(void)
{
	struct client *cl = &M->cl[REMOTE];
	struct remote_arg ra = {.sock = M->h->sock};
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		MFAIL("socketpair: %s", strerror(errno));
	ra.fd = sv[1];
	cl->remote = 1;
	cl->fd = sv[0];
	cl->pid = harness_fork(remote_main, &ra);
	close(sv[1]);
	if (cl->pid <= 0)
		MFAIL("fork failed");
}

static uint64_t expected_connections(void)
{
	uint64_t n = 2; /* the observer and the raw connection */

	for (int i = 0; i < N_CLIENTS; i++)
		n += M->cl[i].connected;
	return n;
}

static void connect_client(int ci)
{
	cmd_set(M->cmd, X_CONNECT, 0, -1);
	call(ci, M->cmd, &M->res);
	if (M->res.ret != 0)
		MFAIL("client %d could not connect: %d", ci, M->res.ret);
	M->cl[ci].connected = 1;
}

/* ---- checks after every step -------------------------------------------------- */

/* The evictions counter rose by k: find which pages went by matching the
 * chain of every leaf only the index holds. */
static void resync_evictions(uint64_t k)
{
	int32_t *leaves = malloc(M->n_nodes * sizeof(int32_t) + 1), path[MAX_Q / BT + 1];
	uint32_t *q = malloc(MAX_Q * sizeof(uint32_t) + (size_t)BT * MAX_Q);
	uint32_t n_leaves = 0, removed = 0;

	MASSERT(leaves && q);
	if (!M->evict_possible)
		MFAIL("%llu pages evicted though no allocation of this step needed room "
		      "(%u of %u pages used, high watermark %u)",
		      (unsigned long long)k, M->n_used, M->n_pages, M->high);
	for (uint32_t i = 0; i < M->n_nodes; i++)
		if (M->nodes[i].alive && M->nodes[i].n_children == 0 && index_only(&M->nodes[i]))
			leaves[n_leaves++] = (int32_t)i;
	for (uint32_t li = 0; li < n_leaves; li++) {
		int32_t at = leaves[li];
		int32_t depth = M->nodes[at].depth, salt = M->nodes[at].salt;
		uint64_t matched;
		kvp_lease *l;
		int err;

		if (!M->nodes[at].alive)
			continue;
		MASSERT(depth < (int32_t)(MAX_Q / BT));
		for (int32_t d = depth; d >= 0; d--) {
			path[d] = at;
			memcpy(q + (size_t)d * BT, M->nodes[at].tok, BT * sizeof(uint32_t));
			at = M->nodes[at].parent;
		}
		err = kvp_match_prefix(M->observer.p[salt], q, (size_t)(depth + 1) * BT, &l);
		if (err < 0)
			MFAIL("probe match: %d", err);
		matched = kvp_lease_tokens(l);
		kvp_lease_release(l);
		if (matched % BT || matched > (uint64_t)(depth + 1) * BT)
			MFAIL("probe of a %d-page chain matched %llu tokens", depth + 1,
			      (unsigned long long)matched);
		for (int32_t d = depth; d >= (int32_t)(matched / BT); d--) {
			if (!M->nodes[path[d]].alive)
				continue;
			if (!index_only(&M->nodes[path[d]]))
				MFAIL("page %d of a chain (salt %d) is gone from the index though "
				      "a "
				      "session or lease holds it",
				      d, salt);
			node_evict(path[d]);
			removed++;
		}
	}
	if (removed != k)
		MFAIL("the evictions counter rose by %llu but %u indexed pages are gone "
		      "(a non-leaf or held page evicted, or the counter is wrong)",
		      (unsigned long long)k, removed);
	M->evictions += k;
	M->n_evict_steps++;
	free(leaves);
	free(q);
}

static void check_sessions(void)
{
	struct kvp_session_info *info;
	size_t n, alive = 0;
	int err = kvp_list_sessions(M->observer.c, M->pool_id, &info, &n);

	if (err < 0)
		MFAIL("kvp_list_sessions: %d", err);
	for (int i = 0; i < MAX_SESS; i++) {
		const struct msess *s = &M->sess[i];
		const struct kvp_session_info *si = NULL;
		uint32_t shared = 0;

		if (!s->alive)
			continue;
		alive++;
		for (size_t k = 0; k < n; k++)
			if (info[k].session_id == s->id)
				si = &info[k];
		if (!si)
			MFAIL("session %llu (model slot %d) is not listed",
			      (unsigned long long)s->id, i);
		for (uint32_t k = 0; k < s->n_pages; k++) {
			const struct mpage *mp = &M->pages[s->pages[k]];

			shared += mp->sref > 1 || mp->node >= 0 || mp->lref > 0;
		}
		MCHECK_EQ("listed pool", si->pool_id, M->pool_id);
		MCHECK_EQ("listed uid", si->uid, getuid());
		MCHECK_EQ("listed n_tokens", si->n_tokens, s->n);
		MCHECK_EQ("listed committed_tokens", si->committed_tokens, s->committed);
		MCHECK_EQ("listed n_pages", si->n_pages, s->n_pages);
		MCHECK_EQ("listed shared_pages", si->shared_pages, shared);
		MCHECK_EQ("listed writing", !!si->writing, s->n > s->committed);
	}
	for (size_t k = 1; k < n; k++)
		if (info[k].session_id <= info[k - 1].session_id)
			MFAIL("kvp_list_sessions is not in id order");
	MCHECK_EQ("listed sessions", n, alive);
	free(info);
}

static void check_all(void)
{
	struct harness_pool_info pi;
	uint32_t reserved = 0, leased = 0, n_sess = 0, indexed = 0, evictable = 0;
	int err = raw_pool_info(&M->raw, M->pool_id, &pi);

	if (err < 0)
		MFAIL("Stats: %d", err);
	if (!pi.has_index_fields)
		MFAIL("Stats lacks indexed_pages, evictable_pages, evictions or dedup_pages");
	if (pi.evictions < M->evictions)
		MFAIL("the evictions counter went down");
	if (pi.evictions > M->evictions)
		resync_evictions(pi.evictions - M->evictions);
	if (M->n_used > M->n_pages)
		MFAIL("the model holds %u pages of %u: the daemon made room it did not report",
		      M->n_used, M->n_pages);
	for (int i = 0; i < MAX_SESS; i++) {
		const struct msess *s = &M->sess[i];

		if (!s->alive)
			continue;
		n_sess++;
		reserved += s->n_pages - pages_for(s->committed);
	}
	for (uint32_t i = 0; i < M->n_pages * 2 + MAX_SP; i++)
		leased += M->pages[i].used && M->pages[i].lref > 0;
	for (uint32_t i = 0; i < M->n_nodes; i++) {
		const struct mnode *nd = &M->nodes[i];

		if (!nd->alive)
			continue;
		indexed++;
		evictable += nd->n_children == 0 && index_only(nd);
	}
	MCHECK_EQ("n_pages", pi.n_pages, M->n_pages);
	MCHECK_EQ("free_pages", pi.free_pages, daemon_free());
	MCHECK_EQ("reserved_pages", pi.reserved_pages, reserved);
	MCHECK_EQ("leased_pages", pi.leased_pages, leased);
	MCHECK_EQ("n_sessions", pi.n_sessions, n_sess);
	MCHECK_EQ("indexed_pages", pi.indexed_pages, indexed);
	MCHECK_EQ("evictable_pages", pi.evictable_pages, evictable);
	MCHECK_EQ("dedup_pages", pi.dedup_pages, M->dedup);
	MCHECK_EQ("evictions", pi.evictions, M->evictions);
	MCHECK_EQ("daemon-wide dedup_pages", pi.all_dedup_pages, M->dedup);
	MCHECK_EQ("daemon-wide evictions", pi.all_evictions, M->evictions);
	MCHECK_EQ("open connections", pi.connections, expected_connections());
	check_sessions();
	/* Now and then, the library's copy of the same figures. */
	if (M->step % 64 == 0) {
		const struct kvp_pool_stats *ps;
		struct kvp_stats *st;

		if (kvp_stats(M->observer.c, &st) < 0)
			MFAIL("kvp_stats failed");
		ps = harness_find_pool(st, M->pool_id);
		if (!ps)
			MFAIL("kvp_stats does not list the pool");
		MCHECK_EQ("kvp_stats free_pages", ps->free_pages, pi.free_pages);
		MCHECK_EQ("kvp_stats reserved_pages", ps->reserved_pages, pi.reserved_pages);
		MCHECK_EQ("kvp_stats leased_pages", ps->leased_pages, pi.leased_pages);
		MCHECK_EQ("kvp_stats indexed_pages", ps->indexed_pages, pi.indexed_pages);
		MCHECK_EQ("kvp_stats evictable_pages", ps->evictable_pages, pi.evictable_pages);
		MCHECK_EQ("kvp_stats evictions", ps->evictions, pi.evictions);
		MCHECK_EQ("kvp_stats dedup_pages", ps->dedup_pages, pi.dedup_pages);
		MCHECK_EQ("kvp_stats daemon-wide evictions", st->evictions, pi.all_evictions);
		MCHECK_EQ("kvp_stats daemon-wide dedup_pages", st->dedup_pages, pi.all_dedup_pages);
		kvp_stats_free(st);
	}
}

/* ---- the operations ------------------------------------------------------------- */

static uint32_t max_tok;	/* per session, per variant */
static uint32_t relief_percent; /* per variant */

/* A random live session that a connected client holds (not an orphan)
 * passing filter, or NULL. */
static struct msess *pick_session(int (*filter)(const struct msess *), int *ret_slot)
{
	int cand[MAX_SESS], n = 0;

	for (int i = 0; i < MAX_SESS; i++)
		if (M->sess[i].alive && !M->sess[i].orphan && (!filter || filter(&M->sess[i])))
			cand[n++] = i;
	if (!n)
		return NULL;
	*ret_slot = cand[below((uint32_t)n)];
	return &M->sess[*ret_slot];
}

static int free_session_slot(void)
{
	int n = 0;

	for (int i = 0; i < MAX_SESS; i++)
		n += M->sess[i].alive;
	if (n >= MAX_SESS - 2)
		return -1;
	for (int i = 0; i < MAX_SESS; i++)
		if (!M->sess[i].alive)
			return i;
	return -1;
}

static int free_lease_slot(void)
{
	for (int i = 0; i < MAX_LEASE; i++)
		if (!M->lease[i].alive)
			return i;
	return -1;
}

static void expect_ret(const char *what, int want)
{
	if (M->res.ret != want)
		MFAIL("%s returned %d, the model expects %d", what, M->res.ret, want);
	if (M->res.bad)
		MFAIL("%s: %llu rows read wrong", what, (unsigned long long)M->res.bad);
}

static void expect_lengths(const char *what, const struct msess *s)
{
	MCHECK_EQ(what, M->res.n_tokens, s->n);
	MCHECK_EQ(what, M->res.committed, s->committed);
}

static int op_create(void)
{
	int slot = free_session_slot(), ci = (int)below(N_CLIENTS);
	int salt = chance(55) ? 0 : 1 + (int)below(N_SALTS - 1);
	int persistent = chance(25);
	struct msess *s;

	if (slot < 0)
		return 1;
	cmd_set(M->cmd, X_CREATE, salt, slot);
	M->cmd->n = (uint64_t)persistent;
	call(ci, M->cmd, &M->res);
	note("create slot %d client %d salt %d%s -> %d", slot, ci, salt,
	     persistent ? " persistent" : "", M->res.ret);
	expect_ret("create", 0);
	s = &M->sess[slot];
	*s = (struct msess){.alive = 1,
			    .client = ci,
			    .salt = salt,
			    .stem = (int)below(N_STEMS),
			    .persistent = (uint8_t)persistent,
			    .id = M->res.val};
	return 0;
}

static int can_append(const struct msess *s)
{
	return s->n < max_tok;
}

/* Tokens [from, from + k) of s: its stem, another sequence's tokens at the
 * same positions, or fresh ones. */
static void gen_tokens(struct msess *s, uint32_t from, uint32_t k)
{
	const uint32_t *src = NULL;
	uint32_t src_n = 0, mode = below(100);

	if (mode >= 50 && mode < 75) {
		int j = (int)below(MAX_SESS + HISTORY);

		if (j < MAX_SESS && M->sess[j].alive) {
			src = M->sess[j].tok;
			src_n = M->sess[j].n;
		} else if (j >= MAX_SESS && j - MAX_SESS < M->n_history) {
			src = M->history[j - MAX_SESS];
			src_n = M->history_n[j - MAX_SESS];
		}
	}
	for (uint32_t p = from; p < from + k; p++) {
		if (mode >= 75)
			s->tok[p] = harness_token(7, rnd() & 0xffffff);
		else if (src && p < src_n)
			s->tok[p] = src[p];
		else
			s->tok[p] = harness_token(100 + (uint32_t)s->stem, p);
	}
}

static int op_append(void)
{
	int slot;
	struct msess *s = pick_session(can_append, &slot);
	uint32_t k, r = below(100), need, got;
	int ok;

	if (!s)
		return 1;
	k = r < 40 ? 1 + below(4) : r < 80 ? 5 + below(6 * BT) : 50 + below(250);
	if (k > max_tok - s->n)
		k = max_tok - s->n;
	gen_tokens(s, s->n, k);
	need = pages_for(s->n + k) - s->n_pages;
	ok = model_room(need);
	cmd_set(M->cmd, X_APPEND, s->salt, slot);
	M->cmd->from = s->n;
	M->cmd->n = k;
	cmd_tokens(M->cmd, s->tok, s->n + k);
	call(s->client, M->cmd, &M->res);
	note("append slot %d +%u at %u (%u new pages, %s) -> %d", slot, k, s->n, need,
	     ok ? "room" : "no room", M->res.ret);
	expect_ret("append", ok ? 0 : -ENOSPC);
	got = (uint32_t)(M->res.n_tokens - s->n);
	if (ok ? got != k : got >= k)
		MFAIL("append of %u reserved %u", k, got);
	M->n_enospc += !ok;
	while (s->n_pages < pages_for(s->n + got)) {
		int32_t pg = page_get();

		M->pages[pg].sref = 1;
		s->pages[s->n_pages++] = pg;
	}
	s->n += got;
	expect_lengths("append: library's counts", s);
	return 0;
}

static int can_commit(const struct msess *s)
{
	return s->n > s->committed;
}

static int op_commit(void)
{
	int slot;
	struct msess *s = pick_session(can_commit, &slot);
	uint32_t k;
	uint64_t dedup = M->dedup;

	if (!s)
		return 1;
	k = chance(70) ? s->n - s->committed : 1 + below(s->n - s->committed);
	cmd_set(M->cmd, X_COMMIT, s->salt, slot);
	M->cmd->from = s->committed;
	M->cmd->n = k;
	cmd_tokens(M->cmd, s->tok, s->n);
	call(s->client, M->cmd, &M->res);
	model_commit(s, k);
	note("commit slot %d +%u -> %u committed (%llu dedup) -> %d", slot, k, s->committed,
	     (unsigned long long)(M->dedup - dedup), M->res.ret);
	expect_ret("commit", 0);
	expect_lengths("commit: library's counts", s);
	M->n_dedup_steps += M->dedup != dedup;
	return 0;
}

static int op_match(void)
{
	uint32_t *q = malloc(MAX_Q * sizeof(uint32_t));
	int ci = (int)below(N_CLIENTS), salt = 0, hold = -1;
	uint32_t n = 0, src_n = 0, k;
	const uint32_t *src = NULL;
	int32_t pages[MAX_Q / BT];
	int j = (int)below(MAX_SESS + HISTORY);

	MASSERT(q != NULL);
	if (j < MAX_SESS && M->sess[j].alive) {
		src = M->sess[j].tok;
		src_n = M->sess[j].n;
		salt = M->sess[j].salt;
	} else if (j >= MAX_SESS && j - MAX_SESS < M->n_history) {
		src = M->history[j - MAX_SESS];
		src_n = M->history_n[j - MAX_SESS];
		salt = (int)M->history_salt[j - MAX_SESS];
	}
	if (chance(25))
		salt = (int)below(N_SALTS);
	if (src) {
		n = below(src_n + 3 * BT + 1);
		memcpy(q, src, (n < src_n ? n : src_n) * sizeof(uint32_t));
		for (uint32_t p = src_n; p < n; p++)
			q[p] = harness_token(8, rnd() & 0xffffff);
		if (n && chance(20))
			q[below(n)] ^= 0x40;
	} else {
		n = below(4 * BT);
		harness_tokens(q, n, 9, rnd() & 0xffff);
	}
	if (chance(30))
		hold = free_lease_slot();
	k = model_match(salt, q, n, pages);
	cmd_set(M->cmd, X_MATCH, salt, -1);
	M->cmd->slot2 = hold;
	cmd_tokens(M->cmd, q, n);
	call(ci, M->cmd, &M->res);
	note("match client %d salt %d of %u tokens%s -> %d, %llu matched (model %u)", ci, salt, n,
	     hold >= 0 ? " (held)" : "", M->res.ret, (unsigned long long)M->res.val, k * BT);
	expect_ret("match", 0);
	MCHECK_EQ("matched tokens", M->res.val, k * BT);
	if (hold >= 0) {
		struct mlease *l = &M->lease[hold];

		l->alive = 1;
		l->client = ci;
		l->n_pages = k;
		memcpy(l->pages, pages, k * sizeof(int32_t));
		for (uint32_t i = 0; i < k; i++)
			M->pages[pages[i]].lref++;
	}
	free(q);
	return 0;
}

static void lease_unpin(struct mlease *l)
{
	for (uint32_t k = 0; k < l->n_pages; k++) {
		M->pages[l->pages[k]].lref--;
		page_maybe_free(l->pages[k]);
	}
	l->alive = 0;
}

static int pick_lease(void)
{
	int cand[MAX_LEASE], n = 0;

	for (int i = 0; i < MAX_LEASE; i++)
		if (M->lease[i].alive)
			cand[n++] = i;
	return n ? cand[below((uint32_t)n)] : -1;
}

static int op_release(void)
{
	int i = pick_lease();

	if (i < 0)
		return 1;
	cmd_set(M->cmd, X_RELEASE, 0, i);
	call(M->lease[i].client, M->cmd, &M->res);
	note("release lease %d (%u pages) -> %d", i, M->lease[i].n_pages, M->res.ret);
	expect_ret("release", 0);
	lease_unpin(&M->lease[i]);
	return 0;
}

static int op_verify_lease(void)
{
	int i = pick_lease();

	if (i < 0)
		return 1;
	cmd_set(M->cmd, X_VERIFY_LEASE, 0, i);
	call(M->lease[i].client, M->cmd, &M->res);
	note("verify lease %d -> %llu tokens, %llu bad", i, (unsigned long long)M->res.val,
	     (unsigned long long)M->res.bad);
	expect_ret("verify lease", 0);
	MCHECK_EQ("held lease tokens", M->res.val, M->lease[i].n_pages * BT);
	return 0;
}

/* A count in [0, max] that likes page boundaries and the ends. */
static uint32_t pick_count(uint32_t max, uint32_t likely)
{
	uint32_t r = below(100);

	if (r < 30)
		return likely;
	if (r < 55)
		return max / BT * BT - (max >= BT && chance(50) ? below(max / BT + 1) * BT : 0);
	if (r < 70 && max > 0)
		return max - below(max < 6 ? max + 1 : 6);
	return below(max + 1);
}

static int op_fork(void)
{
	int slot, slot2 = free_session_slot();
	struct msess *s = pick_session(NULL, &slot), *f;
	uint32_t n, need;
	int ok;

	if (!s || slot2 < 0)
		return 1;
	n = pick_count(s->committed, s->committed);
	need = n % BT ? 1 : 0;
	ok = need ? model_room(1) : 1;
	cmd_set(M->cmd, X_FORK, s->salt, slot);
	M->cmd->slot2 = slot2;
	M->cmd->n = n;
	cmd_tokens(M->cmd, s->tok, s->n);
	call(s->client, M->cmd, &M->res);
	note("fork slot %d at %u of %u committed -> slot %d: %d", slot, n, s->committed, slot2,
	     M->res.ret);
	expect_ret("fork", ok ? 0 : -ENOSPC);
	M->n_enospc += !ok;
	if (!ok)
		return 0;
	f = &M->sess[slot2];
	*f = (struct msess){.alive = 1,
			    .client = s->client,
			    .salt = s->salt,
			    .stem = s->stem,
			    .id = M->res.val,
			    .n = n,
			    .committed = n};
	memcpy(f->tok, s->tok, n * sizeof(uint32_t));
	for (uint32_t i = 0; i < n / BT; i++) {
		f->pages[i] = s->pages[i];
		M->pages[f->pages[i]].sref++;
	}
	f->n_pages = n / BT;
	if (need) {
		int32_t pg = page_get();

		M->pages[pg].sref = 1;
		f->pages[f->n_pages++] = pg;
	}
	expect_lengths("fork: library's counts of the new session", f);
	return 0;
}

static int op_truncate(void)
{
	int slot;
	struct msess *s = pick_session(NULL, &slot);
	uint32_t n, last;
	int copy = 0, ok = 1;

	if (!s)
		return 1;
	n = pick_count(s->n, s->committed);
	last = n / BT;
	if (n % BT) {
		const struct mpage *mp = &M->pages[s->pages[last]];

		copy = mp->sref > 1 || mp->node >= 0 || mp->lref > 0;
	}
	if (copy)
		ok = model_room(1);
	cmd_set(M->cmd, X_TRUNCATE, s->salt, slot);
	M->cmd->n = n;
	cmd_tokens(M->cmd, s->tok, s->n);
	call(s->client, M->cmd, &M->res);
	note("truncate slot %d from %u (%u committed) to %u%s -> %d", slot, s->n, s->committed, n,
	     copy ? " (copies its last page)" : "", M->res.ret);
	expect_ret("truncate", ok ? 0 : -ENOSPC);
	M->n_enospc += !ok;
	if (ok) {
		if (copy) {
			int32_t pg = page_get();

			M->pages[pg].sref = 1;
			page_unref(s->pages[last]);
			s->pages[last] = pg;
		}
		sess_drop_pages(s, pages_for(n));
		s->n = n;
		if (s->committed > n)
			s->committed = n;
	}
	expect_lengths("truncate: library's counts", s);
	return 0;
}

static int op_close(void)
{
	int slot;
	struct msess *s = pick_session(NULL, &slot);

	if (!s)
		return 1;
	cmd_set(M->cmd, X_CLOSE, s->salt, slot);
	call(s->client, M->cmd, &M->res);
	note("close slot %d (%u tokens) -> %d", slot, s->n, M->res.ret);
	expect_ret("close", 0);
	model_close(s);
	return 0;
}

static int op_close_orphan(void)
{
	int cand[MAX_SESS], n = 0, slot, err;

	for (int i = 0; i < MAX_SESS; i++)
		if (M->sess[i].alive && M->sess[i].orphan)
			cand[n++] = i;
	if (!n)
		return 1;
	slot = cand[below((uint32_t)n)];
	err = raw_close_session(&M->raw, M->sess[slot].id);
	note("close orphan slot %d through another connection -> %d", slot, err);
	if (err != 0)
		MFAIL("CloseSession of an orphaned session: %d", err);
	model_close(&M->sess[slot]);
	return 0;
}

static int op_verify_session(void)
{
	int slot;
	struct msess *s = pick_session(NULL, &slot);

	if (!s)
		return 1;
	cmd_set(M->cmd, X_VERIFY_SESSION, s->salt, slot);
	cmd_tokens(M->cmd, s->tok, s->n);
	call(s->client, M->cmd, &M->res);
	note("verify slot %d (%u tokens) -> %llu bad", slot, s->n, (unsigned long long)M->res.bad);
	expect_ret("verify session", 0);
	expect_lengths("verify: library's counts", s);
	return 0;
}

static void wait_connections(void)
{
	if (raw_wait_connections(&M->raw, expected_connections()) < 0)
		MFAIL("the daemon did not notice a closed connection");
}

static int op_disconnect(void)
{
	int ci = (int)below(N_CLIENTS);

	cmd_set(M->cmd, X_DISCONNECT, 0, -1);
	call(ci, M->cmd, &M->res);
	note("disconnect client %d", ci);
	M->cl[ci].connected = 0;
	model_disconnect(ci);
	wait_connections();
	connect_client(ci);
	return 0;
}

static int op_kill(void)
{
	struct client *cl = &M->cl[REMOTE];
	int st;

	note("SIGKILL the forked client");
	kill(cl->pid, SIGKILL);
	st = harness_wait(cl->pid, 30);
	if (st != 128 + SIGKILL)
		MFAIL("the forked client ended with %d", st);
	close(cl->fd);
	cl->connected = 0;
	model_disconnect(REMOTE);
	wait_connections();
	start_remote();
	connect_client(REMOTE);
	return 0;
}

/* ---- the run ---------------------------------------------------------------------- */

struct variant {
	const char *name;
	const char *const *args; /* daemon options */
	uint32_t max_tok;
	long default_ops;
	uint32_t relief_percent; /* of the pool held: start giving pages back */
};

static int (*const ops[])(void) = {
	op_create,	 op_append,	op_commit, op_match,	    op_release,
	op_fork,	 op_truncate,	op_close,  op_close_orphan, op_verify_session,
	op_verify_lease, op_disconnect, op_kill,
};
static const unsigned weights[] = {6, 24, 18, 16, 6, 6, 7, 5, 3, 3, 2, 1, 1};

static int pick_op(void)
{
	uint32_t held = M->n_used, total = 0, r;

	for (uint32_t i = 0; i < M->n_nodes; i++)
		held -= M->nodes[i].alive && index_only(&M->nodes[i]);
	/* Under pressure from held pages, give some back. */
	if (held * 100 > M->n_pages * relief_percent && chance(60)) {
		static const int relief[] = {7, 7, 4, 6, 8};

		return relief[below(5)];
	}
	for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++)
		total += weights[i];
	r = below(total);
	for (size_t i = 0;; i++) {
		if (r < weights[i])
			return (int)i;
		r -= weights[i];
	}
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static void run_model(struct harness *h, const struct variant *v)
{
	static struct model model;
	struct timespec ts;
	struct kvp_stats *st = NULL;
	kvp_pool *p;
	int err;

	M = &model;
	memset(M, 0, sizeof(*M));
	clock_gettime(CLOCK_REALTIME, &ts);
	M->h = h;
	M->variant = v->name;
	M->seed = env_u64("KVP_MODEL_SEED", (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 20 ^
						    (uint64_t)getpid() << 40);
	M->rng = M->seed * 0x9e3779b97f4a7c15ull + 1;
	M->n_ops = (long)env_u64("KVP_MODEL_OPS", (uint64_t)v->default_ops);
	max_tok = v->max_tok;
	relief_percent = v->relief_percent;
	memset(M->buckets, 0xff, sizeof(M->buckets));
	M->cmd = malloc(sizeof(*M->cmd));
	assert_non_null(M->cmd);
	fprintf(stderr, "model %s: seed %llu, %ld operations\n", v->name,
		(unsigned long long)M->seed, M->n_ops);

	/* The forked client first, before this process holds connections. */
	start_remote();
	for (int i = 0; i < N_CLIENTS; i++) {
		M->cl[i].local.sock = h->sock;
		connect_client(i);
	}
	M->observer.sock = h->sock;
	assert_int_equal(exec_connect(&M->observer), 0);
	assert_int_equal(raw_open(&M->raw, h->sock), 0);
	assert_int_equal(raw_hello(&M->raw), 0);
	p = M->observer.p[0];
	M->pool_id = kvp_pool_id(p);
	M->n_pages = kvp_pool_n_pages(p);
	M->high = (uint32_t)(0.95 * M->n_pages);
	M->pages = calloc(M->n_pages * 2 + MAX_SP, sizeof(*M->pages));
	M->free_stack = calloc(M->n_pages * 2 + MAX_SP, sizeof(int32_t));
	assert_non_null(M->pages);
	assert_non_null(M->free_stack);
	for (uint32_t i = M->n_pages * 2 + MAX_SP; i-- > 0;)
		M->free_stack[M->n_free++] = (int32_t)i;
	check_all();

	for (M->step = 0; M->step < M->n_ops; M->step++) {
		M->evict_possible = 0;
		while (ops[pick_op()]() != 0)
			;
		check_all();
	}

	/* Everything closed and released: only the index holds pages. */
	for (int i = 0; i < MAX_LEASE; i++)
		if (M->lease[i].alive) {
			cmd_set(M->cmd, X_RELEASE, 0, i);
			call(M->lease[i].client, M->cmd, &M->res);
			expect_ret("final release", 0);
			lease_unpin(&M->lease[i]);
		}
	for (int i = 0; i < MAX_SESS; i++) {
		struct msess *s = &M->sess[i];

		if (!s->alive)
			continue;
		if (s->orphan) {
			assert_int_equal(raw_close_session(&M->raw, s->id), 0);
		} else {
			cmd_set(M->cmd, X_CLOSE, 0, i);
			call(s->client, M->cmd, &M->res);
			expect_ret("final close", 0);
		}
		model_close(s);
	}
	check_all();
	err = kvp_stats(M->observer.c, &st);
	assert_int_equal(err, 0);
	fprintf(stderr,
		"model %s: %ld steps, %u indexed pages left, %llu dedup, %llu evictions in %llu "
		"steps, %llu ENOSPC predicted and seen, %llu matched tokens\n",
		v->name, M->n_ops, M->n_used, (unsigned long long)M->dedup,
		(unsigned long long)M->evictions, (unsigned long long)M->n_evict_steps,
		(unsigned long long)M->n_enospc, (unsigned long long)st->matched_tokens);
	kvp_stats_free(st);
	/* The run must have exercised what it is about. */
	assert_true(M->dedup > 0);

	cmd_set(M->cmd, X_QUIT, 0, -1);
	send(M->cl[REMOTE].fd, M->cmd, offsetof(struct cmd, tokens), 0);
	assert_int_equal(harness_wait(M->cl[REMOTE].pid, 30), 0);
	close(M->cl[REMOTE].fd);
	for (int i = 0; i < N_CLIENTS; i++)
		if (!M->cl[i].remote)
			exec_drop(&M->cl[i].local);
	exec_drop(&M->observer);
	raw_close(&M->raw);
	free(M->pages);
	free(M->free_stack);
	free(M->nodes);
	free(M->cmd);
}

/* Room for everything: no eviction unless a long run outgrows 8192 pages
 * (any eviction must still be one the model allows). */
static const char *const roomy_args[] = {
	"--disk-pool-size", "0", "--host-pool-size", "32M", "--max-message-bytes", "4096", NULL};
/* 256 pages: the index is evicted again and again, and appends meet a
 * pool where everything is held. */
static const char *const tight_args[] = {
	"--disk-pool-size", "0", "--host-pool-size", "1M", "--max-message-bytes", "4096", NULL};

static const struct variant roomy = {"roomy", roomy_args, MAX_TOK, 6000, 70};
static const struct variant tight = {"tight", tight_args, 200, 8000, 90};

static int setup_roomy(void **state)
{
	return harness_setup_args(state, roomy.args);
}

static int setup_tight(void **state)
{
	return harness_setup_args(state, tight.args);
}

static void test_model_roomy(void **state)
{
	run_model(*state, &roomy);
}

static void test_model_tight(void **state)
{
	run_model(*state, &tight);
	assert_true(M->evictions > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_model_roomy, setup_roomy, harness_teardown),
		cmocka_unit_test_setup_teardown(test_model_tight, setup_tight, harness_teardown),
	};

	return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
