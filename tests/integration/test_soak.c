/* tests/integration/test_soak.c — a bounded soak: many client processes,
 * abrupt disconnects, a working set larger than the host tier.
 *
 * SOAK_CLIENTS child processes run for $KVP_SOAK_SECONDS (default 20 s;
 * suite `slow` runs 180 s on each disk I/O backend) against one daemon
 * whose host tier ($KVP_SOAK_HOST_POOL, default 512 KiB: 128 pages) is far
 * smaller than what they write (24 documents of 12 pages shared by every
 * client, with tails of their own: thousands of distinct pages), over a
 * 16 MiB disk tier (4096 pages), which overflows too. The host tier is
 * small enough that appends, forks and restores also meet -ENOSPC. Each child
 * picks operations at random: new conversations (appended and committed
 * in pieces, sometimes left uncommitted for a while), prefix matches
 * (kept as leases for a while), forks of its sessions and of leases,
 * truncations, checkpoints and restores (names any client may restore,
 * since a name says which tokens it holds), prefetches, Stats, closes, and
 * once in 10000 operations an exit without cleaning up. Every byte a match, a fork, a
 * restore or a commit gives back is checked against the prefix-keyed
 * formula of the harness: a child that sees one wrong byte exits 1, one
 * that gets an error it should not exits 2 (-ENOSPC, the host tier full of
 * pages that sessions and leases hold, is counted, not an error).
 *
 * Meanwhile the parent SIGKILLs a random child every 0.2–1.2 s and starts
 * a new one in its place. A session dies with the connection that made it
 * (kvpalace.h): after each death the parent checks on the admin socket
 * that the daemon closed the sessions the dead child recorded (children
 * record their session ids in shared memory) — nobody drops them for it.
 *
 * At the end every child is told to stop and must exit 0, and no session
 * is left, not even one a killed child made before it could record it;
 * then page accounting must balance: every
 * page is free or held by the prefix index (free + host-indexed = total),
 * none reserved or leased, no session left, no page that failed
 * verification, no I/O error; a fresh process matches every document and
 * reads right bytes; the daemon's peak RSS (VmHWM) stays within
 * SOAK_RSS_BOUND_MIB in a build without sanitizers (they inflate memory
 * by design: there the figure is printed only), and its RSS does not keep
 * growing after the first quarter of the run; the daemon stops with
 * status 0 (under ASan: no leak). In a -Ddebug-checks=true build the
 * daemon checks its page accounting after every request.
 *
 * It prints the requests served, the client kills survived, the
 * operations, matches and verified tokens, and the daemon's peak RSS.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	     "soak-model"
#define BT	     16u
#define SOAK_CLIENTS 8
#define MAX_OPEN     2	/* sessions a child keeps open */
#define MAX_LEASES   2	/* leases a child keeps held */
#define MAX_REC	     16 /* session ids a child records */

/* Shared documents: N_DOCS of up to DOC_TOKENS tokens (12 pages each). */
#define N_DOCS	   24
#define DOC_TOKENS 192u
/* Tails: FREE_TAILS sequences any client may use, up to TAIL_TOKENS. */
#define FREE_TAILS  64
#define TAIL_TOKENS 80u
#define MAX_TOKENS  (DOC_TOKENS + 3 * TAIL_TOKENS)
/* Conversations that may be checkpointed have a name that says what they
 * hold: 8 documents × 3 lengths × 4 tails × 2 tail lengths = 192 names at
 * most, so the checkpoint directory stays small. */
#define CK_DOCS	 8
#define CK_TAILS 4
static const uint32_t ck_doc_len[] = {48, 100, 192};
static const uint32_t ck_tail_len[] = {0, 37};

/* What a peak RSS above this means in a build without sanitizers: memory
 * that grows with the load (the host tier is 512 KiB, the arena mapped
 * once; everything else is bounded per connection and per request; about
 * 8 MiB is measured). */
#define SOAK_RSS_BOUND_MIB 32
/* Growth allowed between the first quarter of the run and its end. */
#define SOAK_RSS_GROWTH_MIB 16

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SOAK_SANITIZED 1
#endif
#endif
#ifndef SOAK_SANITIZED
#define SOAK_SANITIZED 0
#endif

/* 2 layers, 1 KV head, head_dim 32, 16 tokens of f16: 4096-byte pages. */
static const struct kvp_layout soak_layout = {
	.n_layers = 2,
	.n_kv_heads = 1,
	.head_dim = 32,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* Counters a child adds to; read by the parent at the end. */
struct soak_counts {
	uint64_t ops;
	uint64_t requests_ok; /* library calls that succeeded */
	uint64_t matches;
	uint64_t match_hits;
	uint64_t verified_tokens; /* tokens whose every row was checked */
	uint64_t forks;
	uint64_t lease_forks;
	uint64_t truncates;
	uint64_t checkpoints;
	uint64_t restores;
	uint64_t enospc;
	uint64_t abrupt_exits;
};

/* One child slot: the running child's recorded sessions, its counters. */
struct soak_slot {
	uint64_t sessions[MAX_REC]; /* ids of the child's sessions, 0 = free */
	struct soak_counts n;
};

struct soak_shared {
	int stop;
	struct soak_slot slot[SOAK_CLIENTS];
};

struct soak_child {
	const char *sock;
	struct soak_shared *sh;
	int slot;
	unsigned int seed;
};

/* ---- the tokens --------------------------------------------------------- */

static uint32_t doc_seq(int d)
{
	return 100u + (uint32_t)d;
}

static uint32_t tail_seq(int t)
{
	return 20000u + (uint32_t)t;
}

static uint32_t ck_tail_seq(int t)
{
	return 10000u + (uint32_t)t;
}

/* A conversation: doc d's first ndoc tokens, then ntail of sequence tseq. */
static size_t conv_tokens(uint32_t *out, int d, uint32_t ndoc, uint32_t tseq, uint32_t ntail)
{
	harness_tokens(out, ndoc, doc_seq(d), 0);
	harness_tokens(out + ndoc, ntail, tseq, 0);
	return ndoc + ntail;
}

static void ck_name(char *buf, size_t n, int d, uint32_t ndoc, int t, uint32_t ntail)
{
	snprintf(buf, n, "d%d.%u.t%d.%u", d, ndoc, t, ntail);
}

/* Parses a checkpoint name back into its tokens; returns the count or 0. */
static size_t ck_parse(const char *name, uint32_t *out)
{
	int d, t, end = 0;
	unsigned int ndoc, ntail;

	if (sscanf(name, "d%d.%u.t%d.%u%n", &d, &ndoc, &t, &ntail, &end) != 4 || name[end] ||
	    d < 0 || d >= N_DOCS || t < 0 || t >= CK_TAILS || ndoc > DOC_TOKENS ||
	    ntail > TAIL_TOKENS)
		return 0;
	return conv_tokens(out, d, ndoc, ck_tail_seq(t), ntail);
}

/* ---- a child ------------------------------------------------------------ */

struct csess {
	kvp_session *s;
	uint32_t tokens[MAX_TOKENS];
	uint64_t n;	   /* tokens appended */
	uint64_t n_commit; /* committed */
	char ck[48];	   /* its checkpoint name, "" when not checkpointable */
};

struct clease {
	kvp_lease *l;
	uint32_t tokens[MAX_TOKENS];
	uint64_t n;
};

struct cstate {
	struct soak_child *a;
	struct soak_slot *me;
	kvp_client *c;
	kvp_pool *p;
	struct csess *open[MAX_OPEN];
	struct clease *held[MAX_LEASES];
	unsigned int seed;
};

static unsigned int rnd(struct cstate *st, unsigned int n)
{
	return n ? (unsigned int)rand_r(&st->seed) % n : 0;
}

/* Fails the child (exit 2) on an error other than ENOSPC, which is counted. */
#define SOAK_OK(st, call)                                                                          \
	({                                                                                         \
		int r_ = (call);                                                                   \
		if (r_ == -ENOSPC) {                                                               \
			(st)->me->n.enospc++;                                                      \
		} else if (r_ < 0) {                                                               \
			fprintf(stderr, "soak child %d: %s:%d: %s failed: %s\n", (int)getpid(),    \
				__FILE__, __LINE__, #call, strerror(-r_));                         \
			return 2;                                                                  \
		} else {                                                                           \
			(st)->me->n.requests_ok++;                                                 \
		}                                                                                  \
		r_;                                                                                \
	})

/* Exits 1 when rows differ (the harness has printed which). */
#define SOAK_BYTES(st, bad, ntok)                                                                  \
	do {                                                                                       \
		uint64_t b_ = (bad);                                                               \
		if (b_) {                                                                          \
			fprintf(stderr, "soak child %d: %s:%d: WRONG BYTES: %llu rows\n",          \
				(int)getpid(), __FILE__, __LINE__, (unsigned long long)b_);        \
			return 1;                                                                  \
		}                                                                                  \
		(st)->me->n.verified_tokens += (ntok);                                             \
	} while (0)

static void record(struct cstate *st, uint64_t id)
{
	for (int i = 0; i < MAX_REC; i++)
		if (!__atomic_load_n(&st->me->sessions[i], __ATOMIC_RELAXED)) {
			__atomic_store_n(&st->me->sessions[i], id, __ATOMIC_RELEASE);
			return;
		}
}

static void unrecord(struct cstate *st, uint64_t id)
{
	for (int i = 0; i < MAX_REC; i++)
		if (__atomic_load_n(&st->me->sessions[i], __ATOMIC_RELAXED) == id) {
			__atomic_store_n(&st->me->sessions[i], 0, __ATOMIC_RELEASE);
			return;
		}
}

static int close_sess(struct cstate *st, struct csess *cs)
{
	uint64_t id = kvp_session_id(cs->s);

	SOAK_OK(st, kvp_session_close(cs->s));
	unrecord(st, id);
	free(cs);
	return 0;
}

/* Takes a free slot for a new session, closing the oldest when full. */
static int make_room(struct cstate *st, int *ret_i)
{
	for (int i = 0; i < MAX_OPEN; i++)
		if (!st->open[i]) {
			*ret_i = i;
			return 0;
		}
	if (close_sess(st, st->open[0]))
		return 2;
	memmove(st->open, st->open + 1, (MAX_OPEN - 1) * sizeof(st->open[0]));
	st->open[MAX_OPEN - 1] = NULL;
	*ret_i = MAX_OPEN - 1;
	return 0;
}

/* Commits what cs has appended but not committed, and checks all of it. */
static int finish_commit(struct cstate *st, struct csess *cs)
{
	if (cs->n_commit == cs->n)
		return 0;
	if (SOAK_OK(st, kvp_commit(cs->s, cs->n - cs->n_commit)) < 0)
		return 0; /* ENOSPC cannot come from a commit; keep going */
	cs->n_commit = cs->n;
	SOAK_BYTES(st, harness_pkv_check_session(st->p, cs->s, cs->tokens, 0, cs->n), cs->n);
	return 0;
}

/* Appends tokens[from, to) of cs (already in cs->tokens), writes their
 * K/V and commits them in up to three pieces, the last one sometimes left
 * uncommitted until the session is next used. Returns 0 (an ENOSPC leaves
 * cs as far as it got), or the child's exit code. */
static int grow(struct cstate *st, struct csess *cs, uint64_t to)
{
	while (cs->n < to) {
		uint64_t step = 1 + rnd(st, (unsigned int)(to - cs->n));
		int ret;

		ret = SOAK_OK(st, kvp_append(cs->s, cs->tokens + cs->n, step));
		if (ret < 0) {
			/* Chunks before a failing one stay reserved: they are
			 * written, to be committed with the rest. */
			uint64_t got = kvp_session_tokens(cs->s);

			if (got > cs->n &&
			    harness_pkv_write_session(st->p, cs->s, cs->tokens, cs->n, got) < 0)
				return 1;
			cs->n = got;
			break;
		}
		if (harness_pkv_write_session(st->p, cs->s, cs->tokens, cs->n, cs->n + step) < 0) {
			fprintf(stderr, "soak child %d: no pointer for a reserved row\n",
				(int)getpid());
			return 1;
		}
		cs->n += step;
		if (cs->n < to || rnd(st, 5)) {
			ret = finish_commit(st, cs);
			if (ret)
				return ret;
		}
	}
	if (kvp_session_tokens(cs->s) != cs->n) {
		fprintf(stderr, "soak child %d: session holds %llu tokens, expected %llu\n",
			(int)getpid(), (unsigned long long)kvp_session_tokens(cs->s),
			(unsigned long long)cs->n);
		return 2;
	}
	return 0;
}

static int op_new(struct cstate *st)
{
	struct csess *cs = calloc(1, sizeof(*cs));
	size_t n;
	int i, ret;

	if (!cs)
		return 2;
	if (rnd(st, 3) == 0) {
		int d = (int)rnd(st, CK_DOCS), t = (int)rnd(st, CK_TAILS);
		uint32_t ndoc = ck_doc_len[rnd(st, 3)], ntail = ck_tail_len[rnd(st, 2)];

		n = conv_tokens(cs->tokens, d, ndoc, ck_tail_seq(t), ntail);
		ck_name(cs->ck, sizeof(cs->ck), d, ndoc, t, ntail);
	} else {
		n = conv_tokens(cs->tokens, (int)rnd(st, N_DOCS), rnd(st, DOC_TOKENS + 1),
				tail_seq((int)rnd(st, FREE_TAILS)), 1 + rnd(st, TAIL_TOKENS));
	}
	ret = make_room(st, &i);
	if (ret) {
		free(cs);
		return ret;
	}
	if (SOAK_OK(st, kvp_session_create(st->p, &cs->s)) < 0) {
		free(cs);
		return 0;
	}
	record(st, kvp_session_id(cs->s));
	st->open[i] = cs;
	return grow(st, cs, n);
}

/* A query shaped like a conversation somebody may have written. */
static size_t query(struct cstate *st, uint32_t *q)
{
	if (rnd(st, 2))
		return conv_tokens(q, (int)rnd(st, CK_DOCS), ck_doc_len[rnd(st, 3)],
				   ck_tail_seq((int)rnd(st, CK_TAILS)), TAIL_TOKENS);
	return conv_tokens(q, (int)rnd(st, N_DOCS), rnd(st, DOC_TOKENS + 1),
			   tail_seq((int)rnd(st, FREE_TAILS)), TAIL_TOKENS);
}

static int release_lease(struct cstate *st, int i)
{
	SOAK_OK(st, kvp_lease_release(st->held[i]->l));
	free(st->held[i]);
	memmove(st->held + i, st->held + i + 1, (MAX_LEASES - 1 - i) * sizeof(st->held[0]));
	st->held[MAX_LEASES - 1] = NULL;
	return 0;
}

/* Matches; the lease's bytes are checked, and it is kept a while. Returns
 * the index of the held lease in *ret_i, -1 when none was kept. */
static int op_match(struct cstate *st, int *ret_i)
{
	struct clease *cl = calloc(1, sizeof(*cl));
	size_t n;
	int i;

	if (ret_i)
		*ret_i = -1;
	if (!cl)
		return 2;
	n = query(st, cl->tokens);
	if (SOAK_OK(st, kvp_match_prefix(st->p, cl->tokens, n, &cl->l)) < 0) {
		free(cl);
		return 0;
	}
	cl->n = kvp_lease_tokens(cl->l);
	st->me->n.matches++;
	st->me->n.match_hits += cl->n > 0;
	if (cl->n % BT || cl->n > n) {
		fprintf(stderr, "soak child %d: a match of %llu tokens\n", (int)getpid(),
			(unsigned long long)cl->n);
		return 2;
	}
	SOAK_BYTES(st, harness_pkv_check_lease(cl->l, st->p, cl->tokens, cl->n), cl->n);
	if (st->held[MAX_LEASES - 1] && release_lease(st, 0))
		return 2;
	for (i = 0; st->held[i]; i++)
		;
	st->held[i] = cl;
	if (ret_i)
		*ret_i = i;
	/* Most leases go at once; some stay pinned across other work. */
	if (!ret_i && rnd(st, 3))
		return release_lease(st, i);
	return 0;
}

static struct csess *pick_open(struct cstate *st)
{
	int n = 0;

	while (n < MAX_OPEN && st->open[n])
		n++;
	return n ? st->open[rnd(st, (unsigned int)n)] : NULL;
}

/* Adopts a new session (fork, lease fork, restore) holding tokens[0..n),
 * all committed; checks its bytes, then continues it with a tail. */
static int adopt(struct cstate *st, kvp_session *s, const uint32_t *tokens, uint64_t n)
{
	struct csess *cs = calloc(1, sizeof(*cs));
	uint32_t ntail = 1 + rnd(st, TAIL_TOKENS);
	int i, ret;

	if (!cs)
		return 2;
	cs->s = s;
	record(st, kvp_session_id(s));
	memcpy(cs->tokens, tokens, n * sizeof(*tokens));
	cs->n = cs->n_commit = n;
	if (kvp_session_tokens(s) != n || kvp_session_committed(s) != n) {
		fprintf(stderr, "soak child %d: new session holds %llu/%llu tokens, not %llu\n",
			(int)getpid(), (unsigned long long)kvp_session_tokens(s),
			(unsigned long long)kvp_session_committed(s), (unsigned long long)n);
		return 2;
	}
	SOAK_BYTES(st, harness_pkv_check_session(st->p, s, tokens, 0, n), n);
	ret = make_room(st, &i);
	if (ret) {
		close_sess(st, cs);
		return ret;
	}
	st->open[i] = cs;
	if (n + ntail > MAX_TOKENS)
		return 0;
	harness_tokens(cs->tokens + n, ntail, tail_seq((int)rnd(st, FREE_TAILS)), 0);
	return grow(st, cs, n + ntail);
}

static int op_fork(struct cstate *st)
{
	struct csess *cs = pick_open(st);
	kvp_session *f;
	uint64_t n;
	int ret;

	if (!cs)
		return 0;
	ret = finish_commit(st, cs);
	if (ret)
		return ret;
	n = rnd(st, (unsigned int)cs->n_commit + 1);
	if (SOAK_OK(st, kvp_session_fork(cs->s, n, &f)) < 0)
		return 0;
	st->me->n.forks++;
	return adopt(st, f, cs->tokens, n);
}

static int op_lease_fork(struct cstate *st)
{
	struct clease *cl;
	kvp_session *f;
	uint64_t n;
	int i, ret = op_match(st, &i);

	if (ret || i < 0)
		return ret;
	cl = st->held[i];
	if (cl->n) {
		n = 1 + rnd(st, (unsigned int)cl->n);
		if (SOAK_OK(st, kvp_lease_fork(cl->l, n, &f)) == 0) {
			st->me->n.lease_forks++;
			ret = adopt(st, f, cl->tokens, n);
		}
	}
	/* cl may have moved if adopt released nothing; find it again. */
	for (i = 0; i < MAX_LEASES; i++)
		if (st->held[i] == cl)
			return ret ? ret : release_lease(st, i);
	return ret;
}

static int op_truncate(struct cstate *st)
{
	struct csess *cs = pick_open(st);
	uint32_t ntail = 1 + rnd(st, TAIL_TOKENS);
	uint64_t n;
	int ret;

	if (!cs)
		return 0;
	ret = finish_commit(st, cs);
	if (ret)
		return ret;
	n = rnd(st, (unsigned int)cs->n + 1);
	if (SOAK_OK(st, kvp_truncate(cs->s, n)) < 0)
		return 0;
	st->me->n.truncates++;
	cs->n = cs->n_commit = n;
	cs->ck[0] = '\0';
	SOAK_BYTES(st, harness_pkv_check_session(st->p, cs->s, cs->tokens, 0, n), n);
	if (n + ntail > MAX_TOKENS)
		return 0;
	harness_tokens(cs->tokens + n, ntail, tail_seq((int)rnd(st, FREE_TAILS)), 0);
	return grow(st, cs, n + ntail);
}

static int op_checkpoint(struct cstate *st)
{
	struct csess *cs = NULL;
	int ret;

	for (int i = 0; i < MAX_OPEN; i++)
		if (st->open[i] && st->open[i]->ck[0])
			cs = st->open[i];
	if (!cs)
		return 0;
	ret = finish_commit(st, cs);
	if (ret)
		return ret;
	/* Only a session that holds exactly what its name says. */
	if (cs->n_commit != ck_parse(cs->ck, (uint32_t[MAX_TOKENS]){0}))
		return 0;
	SOAK_OK(st, kvp_session_checkpoint(cs->s, cs->ck, NULL));
	st->me->n.checkpoints++;
	return 0;
}

static int op_restore(struct cstate *st)
{
	struct kvp_checkpoint_list *list;
	uint32_t tokens[MAX_TOKENS];
	kvp_session *s;
	size_t n;
	int ret;

	SOAK_OK(st, kvp_list_checkpoints(st->c, 0, 0, &list));
	if (!list->n_entries) {
		kvp_checkpoint_list_free(list);
		return 0;
	}
	{
		const struct kvp_checkpoint_info *e = &list->entries[rnd(st, list->n_entries)];
		char name[KVP_CHECKPOINT_NAME_MAX + 1];

		snprintf(name, sizeof(name), "%s", e->name);
		if (e->error) {
			fprintf(stderr, "soak child %d: checkpoint %s cannot be restored: %s\n",
				(int)getpid(), e->name, e->error);
			kvp_checkpoint_list_free(list);
			return 2;
		}
		kvp_checkpoint_list_free(list);
		n = ck_parse(name, tokens);
		if (!n) {
			fprintf(stderr, "soak child %d: a checkpoint named %s\n", (int)getpid(),
				name);
			return 2;
		}
		ret = SOAK_OK(st, kvp_session_restore(st->p, name, &s));
	}
	if (ret < 0)
		return 0;
	st->me->n.restores++;
	return adopt(st, s, tokens, n);
}

static int op_prefetch(struct cstate *st)
{
	uint32_t q[MAX_TOKENS];
	size_t n = query(st, q);
	uint32_t coming;

	SOAK_OK(st, kvp_prefetch(st->p, q, n, &coming));
	return 0;
}

static int op_stats(struct cstate *st)
{
	struct kvp_stats *s;

	if (SOAK_OK(st, kvp_stats(st->c, &s)) == 0)
		kvp_stats_free(s);
	return 0;
}

static int op_close(struct cstate *st)
{
	struct csess *cs = pick_open(st);
	int i, ret;

	if (!cs)
		return 0;
	/* Half the time what it holds is checked first. */
	if (rnd(st, 2)) {
		ret = finish_commit(st, cs);
		if (ret)
			return ret;
		SOAK_BYTES(st, harness_pkv_check_session(st->p, cs->s, cs->tokens, 0, cs->n),
			   cs->n);
	}
	for (i = 0; st->open[i] != cs; i++)
		;
	memmove(st->open + i, st->open + i + 1, (MAX_OPEN - 1 - i) * sizeof(st->open[0]));
	st->open[MAX_OPEN - 1] = NULL;
	return close_sess(st, cs);
}

static int soak_child(void *arg)
{
	struct soak_child *a = arg;
	struct cstate st = {.a = a, .me = &a->sh->slot[a->slot], .seed = a->seed};
	int ret = 0;

	CHILD_CHECK_EQ(kvp_connect(a->sock, &st.c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(st.c, MODEL, &soak_layout, &st.p), 0);
	while (!__atomic_load_n(&a->sh->stop, __ATOMIC_ACQUIRE) && ret == 0) {
		unsigned int r = rnd(&st, 1000);

		st.me->n.ops++;
		if (r < 250)
			ret = op_new(&st);
		else if (r < 550)
			ret = op_match(&st, NULL);
		else if (r < 640)
			ret = op_fork(&st);
		else if (r < 690)
			ret = op_lease_fork(&st);
		else if (r < 720)
			ret = op_truncate(&st);
		else if (r < 790)
			ret = op_checkpoint(&st);
		else if (r < 850)
			ret = op_restore(&st);
		else if (r < 880)
			ret = op_prefetch(&st);
		else if (r < 900)
			ret = op_stats(&st);
		else if (r < 999 || rnd(&st, 10))
			ret = op_close(&st);
		else {
			/* One operation in 10000: gone without a word, leases,
			 * reservations and sessions left behind, the socket
			 * closed by exit. */
			st.me->n.abrupt_exits++;
			fflush(stderr);
			_exit(3);
		}
	}
	if (ret)
		return ret;
	/* Told to stop: put everything back properly. */
	for (int i = 0; i < MAX_LEASES && st.held[0]; i++)
		if (release_lease(&st, 0))
			return 2;
	for (int i = 0; i < MAX_OPEN; i++) {
		if (!st.open[i])
			continue;
		ret = finish_commit(&st, st.open[i]);
		if (ret)
			return ret;
		ret = close_sess(&st, st.open[i]);
		if (ret)
			return ret;
		st.open[i] = NULL;
	}
	kvp_disconnect(st.c);
	return 0;
}

/* ---- the parent --------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* VmHWM and VmRSS of pid in KiB; 0 when unreadable. */
static void proc_rss(pid_t pid, uint64_t *hwm_kib, uint64_t *rss_kib)
{
	char path[64], line[256];
	FILE *f;

	*hwm_kib = *rss_kib = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long v;

		if (sscanf(line, "VmHWM: %llu kB", &v) == 1)
			*hwm_kib = v;
		else if (sscanf(line, "VmRSS: %llu kB", &v) == 1)
			*rss_kib = v;
	}
	fclose(f);
}

/* Waits (bounded: 20 s) until the daemon has closed every session a dead
 * child recorded — they die with its connection — and forgets them.
 * Returns how many there were. */
static int gone_with_child(kvp_client *admin, struct soak_shared *sh, int dead_slot)
{
	int n_rec = 0;

	for (int tries = 0;; tries++) {
		struct kvp_session_info *si;
		size_t n;
		int left = 0;

		assert_int_equal(kvp_list_sessions(admin, 0, &si, &n), 0);
		for (int i = 0; i < MAX_REC; i++) {
			uint64_t id = sh->slot[dead_slot].sessions[i];

			for (size_t k = 0; id && k < n; k++)
				left += si[k].session_id == id;
		}
		free(si);
		if (!left)
			break;
		if (tries == 2000)
			fail_msg("%d sessions of the dead child in slot %d outlived it", left,
				 dead_slot);
		usleep(10000);
	}
	for (int i = 0; i < MAX_REC; i++) {
		n_rec += sh->slot[dead_slot].sessions[i] != 0;
		sh->slot[dead_slot].sessions[i] = 0;
	}
	return n_rec;
}

/* A fresh process matches every document at full length: right bytes. */
static int final_reader(void *arg)
{
	const char *sock = arg;
	uint32_t tokens[DOC_TOKENS];
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK_EQ(kvp_connect(sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &soak_layout, &p), 0);
	for (int d = 0; d < N_DOCS; d++) {
		kvp_lease *l;

		harness_tokens(tokens, DOC_TOKENS, doc_seq(d), 0);
		CHILD_CHECK_EQ(kvp_match_prefix(p, tokens, DOC_TOKENS, &l), 0);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
		CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	}
	kvp_disconnect(c);
	return 0;
}

static pid_t spawn_child(struct harness *h, struct soak_shared *sh, struct soak_child *a, int slot,
			 unsigned int seed)
{
	a->sock = h->sock;
	a->sh = sh;
	a->slot = slot;
	a->seed = seed;
	return harness_fork(soak_child, a);
}

/* Waits for the child of a slot; a bad exit fails the test. Returns 1
 * when our SIGKILL ended it, 2 when it had left abruptly on purpose
 * (either way the daemon closes its sessions), 0 when it stopped cleanly. */
static int reap(pid_t pid, int slot, int expect_kill)
{
	int st = harness_wait(pid, expect_kill ? 30 : 120);

	if (st == 128 + SIGKILL && expect_kill)
		return 1;
	if (st == 3)
		return 2; /* left without cleaning up, on purpose */
	if (st != 0)
		fprintf(stderr, "soak: child in slot %d (pid %d) ended with %d\n", slot, (int)pid,
			st);
	assert_int_equal(st, 0);
	return 0;
}

static void test_soak(void **state)
{
	struct harness *h = *state;
	const char *env = getenv("KVP_SOAK_SECONDS");
	double seconds = env && *env ? atof(env) : 20, t0 = now_s(), quarter_t;
	struct soak_shared *sh;
	struct soak_child args[SOAK_CLIENTS];
	pid_t pids[SOAK_CLIENTS];
	unsigned int seed = (unsigned int)time(NULL), spawned = 0;
	uint64_t kills = 0, orphans = 0, rss_quarter = 0, rss_max = 0, hwm = 0, rss = 0;
	struct kvp_pool_stats ps;
	struct kvp_stats *st;
	struct soak_counts tot = {0};
	kvp_client *c, *admin;
	kvp_pool *p;
	int balanced = 0;

	if (getenv("KVP_SOAK_SEED"))
		seed = (unsigned int)strtoul(getenv("KVP_SOAK_SEED"), NULL, 0);
	fprintf(stderr, "soak: %.0f s, %d clients, seed %u ($KVP_SOAK_SEED sets it), I/O %s\n",
		seconds, SOAK_CLIENTS, seed,
		getenv("KVP_SOAK_IO_BACKEND") ? getenv("KVP_SOAK_IO_BACKEND") : "auto");
	quarter_t = t0 + seconds / 4;
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &soak_layout, &p), 0);
	assert_true(kvp_pool_n_pages(p) <= 512);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);

	for (int i = 0; i < SOAK_CLIENTS; i++) {
		pids[i] = spawn_child(h, sh, &args[i], i, seed + spawned++ * 7919u);
		assert_true(pids[i] > 0);
	}
	while (now_s() < t0 + seconds) {
		int victim = rand_r(&seed) % SOAK_CLIENTS;

		usleep(200000 + rand_r(&seed) % 1000000);
		assert_true(harness_daemon_alive(h));
		proc_rss(h->pid, &hwm, &rss);
		if (rss > rss_max)
			rss_max = rss;
		if (!rss_quarter && now_s() >= quarter_t)
			rss_quarter = rss;
		/* Children that left on their own. */
		for (int i = 0; i < SOAK_CLIENTS; i++) {
			int status;

			if (i == victim || waitpid(pids[i], &status, WNOHANG) != pids[i])
				continue;
			assert_true(WIFEXITED(status));
			if (WEXITSTATUS(status) != 3)
				fprintf(stderr, "soak: child in slot %d ended with %d\n", i,
					WEXITSTATUS(status));
			assert_int_equal(WEXITSTATUS(status), 3);
			orphans += gone_with_child(admin, sh, i);
			pids[i] = spawn_child(h, sh, &args[i], i, seed + spawned++ * 7919u);
			assert_true(pids[i] > 0);
		}
		kill(pids[victim], SIGKILL);
		if (reap(pids[victim], victim, 1) == 1)
			kills++;
		orphans += gone_with_child(admin, sh, victim);
		pids[victim] = spawn_child(h, sh, &args[victim], victim, seed + spawned++ * 7919u);
		assert_true(pids[victim] > 0);
	}
	/* Stop: every child puts back what it holds and exits 0. */
	__atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < SOAK_CLIENTS; i++)
		if (reap(pids[i], i, 0))
			orphans += gone_with_child(admin, sh, i);
	for (int i = 0; i < SOAK_CLIENTS; i++)
		for (int k = 0; k < MAX_REC; k++)
			assert_int_equal(sh->slot[i].sessions[k], 0);

	/* Accounting: free + held by the index = every page, once the
	 * daemon has finished what was in flight. */
	for (int tries = 0; tries < 100 && !balanced; tries++) {
		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
		balanced = ps.free_pages + ps.host_indexed_pages == ps.n_pages &&
			   ps.reserved_pages == 0 && ps.leased_pages == 0 && ps.n_sessions == 0;
		if (!balanced)
			usleep(100000);
	}
	fprintf(stderr,
		"soak: pool: %u pages, %u free, %u indexed in host, %u on disk, %u reserved, "
		"%u leased, %u sessions; spilled %llu, promoted %llu, dropped from disk %llu, "
		"evictions %llu, dedup %llu, verify failures %llu, I/O errors %llu\n",
		ps.n_pages, ps.free_pages, ps.host_indexed_pages, ps.disk_pages, ps.reserved_pages,
		ps.leased_pages, ps.n_sessions, (unsigned long long)ps.spilled_pages,
		(unsigned long long)ps.promoted_pages, (unsigned long long)ps.disk_dropped,
		(unsigned long long)ps.evictions, (unsigned long long)ps.dedup_pages,
		(unsigned long long)ps.verify_failures, (unsigned long long)ps.io_errors);
	assert_true(balanced);
	assert_int_equal(ps.verify_failures, 0);
	assert_int_equal(ps.io_errors, 0);
	assert_true(ps.spilled_pages > 0); /* the working set did exceed the host tier */

	assert_int_equal(harness_run_child(final_reader, h->sock), 0);

	for (int i = 0; i < SOAK_CLIENTS; i++) {
		const struct soak_counts *n = &sh->slot[i].n;

		tot.ops += n->ops;
		tot.requests_ok += n->requests_ok;
		tot.matches += n->matches;
		tot.match_hits += n->match_hits;
		tot.verified_tokens += n->verified_tokens;
		tot.forks += n->forks;
		tot.lease_forks += n->lease_forks;
		tot.truncates += n->truncates;
		tot.checkpoints += n->checkpoints;
		tot.restores += n->restores;
		tot.enospc += n->enospc;
		tot.abrupt_exits += n->abrupt_exits;
	}
	assert_int_equal(kvp_stats(c, &st), 0);
	proc_rss(h->pid, &hwm, &rss);
	if (rss > rss_max)
		rss_max = rss;
	fprintf(stderr,
		"soak: %.0f s, %d client processes (%u started): %llu requests served; "
		"%llu client faults survived: %llu SIGKILLed, %llu exits without cleanup; "
		"%llu sessions closed with their dead clients\n"
		"soak: %llu operations: %llu matches (%llu hits), %llu forks, %llu lease forks, "
		"%llu truncates, %llu checkpoints, %llu restores, %llu ENOSPC; %llu tokens "
		"verified byte for byte\n"
		"soak: daemon peak RSS (VmHWM) %.1f MiB, RSS %.1f MiB after a quarter, %.1f MiB "
		"at most, %.1f MiB at the end%s\n",
		now_s() - t0, SOAK_CLIENTS, spawned, (unsigned long long)st->requests,
		(unsigned long long)(kills + tot.abrupt_exits), (unsigned long long)kills,
		(unsigned long long)tot.abrupt_exits, (unsigned long long)orphans,
		(unsigned long long)tot.ops, (unsigned long long)tot.matches,
		(unsigned long long)tot.match_hits, (unsigned long long)tot.forks,
		(unsigned long long)tot.lease_forks, (unsigned long long)tot.truncates,
		(unsigned long long)tot.checkpoints, (unsigned long long)tot.restores,
		(unsigned long long)tot.enospc, (unsigned long long)tot.verified_tokens,
		hwm / 1024.0, rss_quarter / 1024.0, rss_max / 1024.0, rss / 1024.0,
		SOAK_SANITIZED || getenv("KVPALACED_WRAPPER")
			? " (sanitized or wrapped: not bounded)"
			: "");
	assert_true(st->requests > 0);
	assert_true(kills > 0);
	assert_true(tot.match_hits > 0);
	assert_true(tot.verified_tokens > 0);
	kvp_stats_free(st);
	if (!SOAK_SANITIZED && !getenv("KVPALACED_WRAPPER")) {
		assert_true(hwm > 0);
		assert_true(hwm <= SOAK_RSS_BOUND_MIB * 1024ull);
		if (rss_quarter)
			assert_true(rss_max <= rss_quarter + SOAK_RSS_GROWTH_MIB * 1024ull);
	}
	kvp_disconnect(admin);
	kvp_disconnect(c);
	munmap(sh, sizeof(*sh));
}

/* $KVP_SOAK_IO_BACKEND picks the disk tier's I/O: io_uring (the default
 * where the kernel has it) or threads, whose worker threads the TSan run
 * wants busy. */
static int setup(void **state)
{
	const char *io = getenv("KVP_SOAK_IO_BACKEND");
	const char *host = getenv("KVP_SOAK_HOST_POOL");
	const char *args[] = {"--host-pool-size",
			      host && *host ? host : "512K",
			      "--disk-pool-size",
			      "16M",
			      "--log-level",
			      "notice",
			      "--io-backend",
			      io && *io ? io : "auto",
			      NULL};

	return harness_setup_args(state, args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_soak, setup, harness_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
