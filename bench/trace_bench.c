/* bench/trace_bench.c — kvp-bench-trace: replays multi-user, multi-turn
 * conversation traces against a real kvpalaced and holds its prefix-cache
 * hit rate against plain LRU and Belady's optimum simulated offline at the
 * same capacity, on the same trace.
 *
 * Modes:
 *  gen   writes a trace (bench/trace_gen.c: the distributions, the seed,
 *        the file format) to --out FILE.
 *  sim   the offline simulations only (bench/trace_sim.c), at
 *        --capacity-pages pages: no daemon needed.
 *  run   against a running kvpalaced (bench/run starts it; this program
 *        starts nothing): the trace (generated from --seed and the sizes,
 *        or read from --trace FILE) is
 *         1. simulated offline — infinite cache, plain LRU, leaf-LRU (the
 *            daemon's host policy run sequentially) and Belady — at the
 *            capacity of the daemon's pool: its host arena in pages, plus
 *            its spill file's when the pool has a disk tier (run the
 *            daemon with --disk-pool-size 0 to compare host placement
 *            alone, as bench/run's first pass does);
 *         2. replayed by --workers client processes (fork; requests
 *            partitioned by user, user % workers, so each conversation
 *            runs in order), each through its own connection and the real
 *            library, as fast as they can but near trace order: a worker
 *            starts request r only when every request before r - --reorder
 *            (8) has finished, so the daemon sees the trace's order up to
 *            a few requests in flight (free-running workers drift apart by
 *            hundreds of requests, which changes the trace: users of a
 *            fast worker see fewer requests between their turns).
 *            Per request: kvp_match_prefix(prompt) gives the tokens
 *            served from the cache (whole pages); three rows of the
 *            matched K and V (first, middle and last matched token) are
 *            checked against the bytes expected; kvp_lease_fork of the
 *            match (a new session on a miss), the lease released;
 *            kvp_append of the missed prompt tokens and the reply tokens
 *            (retried on -ENOSPC while other workers hold the pages);
 *            every new token's K and V rows written in place; kvp_commit;
 *            kvp_session_close (its full pages stay in the prefix index
 *            for later turns).
 *        The K and V rows of a token are a function of the token ids up
 *        to it (a running hash), as a model's are, so a page is the same
 *        bytes whoever writes it, and a match that returned another
 *        prefix's page would fail the check.
 *
 * The pool: 1 layer, 1 KV head, head_dim 64, f16, 16 tokens a page: 4 KiB
 * pages, 256 bytes per token (small, so a trace of many users fits a
 * modest arena; the policy question depends on pages, not bytes). Hit
 * rate = tokens served from the cache / prompt tokens, counted the same
 * way for the daemon (kvp_lease_tokens of each match) and the
 * simulations (full pages only; a match stops at the first miss).
 *
 * Prints the comparison table, the hit rates by kind of request (a new
 * conversation, a return after a short gap, after a long one) and the
 * share of system-prompt pages each policy failed to serve, and the
 * replay's figures on stderr, and
 * "sample LABEL.NAME VALUE" lines (LABEL: --label, default "trace") for
 * bench/run: hit_rate (the daemon), lru_hit_rate, leaf_lru_hit_rate,
 * leaf_lfu_hit_rate, leaf_window_hit_rate,
 * belady_hit_rate, infinite_hit_rate (these in %), belady_ratio (daemon /
 * Belady), lru_gain (daemon − LRU, percentage points), rps (requests per second, all workers),
 * tokens_served, tokens_recomputed, daemon_tokens (tokens_served exactly), leaf_lru_tokens, leaf_lfu_tokens and
 * leaf_window_tokens (each simulation's tokens served, for a sequential
 * replay to equal), served_mib and recomputed_mib (the
 * matched pages' bytes, and the bytes written into the host arena: missed
 * prompt tokens and replies), spilled_mib and promoted_mib
 * (pool stats × page bytes: host → disk and disk → host), evictions.
 * Any failure exits 1. Each process is single-threaded; the workers
 * share their results and the pacing through one MAP_SHARED mapping (C11
 * atomics). With --workers 1 the replay is sequential and the daemon's
 * hit rate and evictions equal the simulation of its --eviction policy
 * (leaf-LRU, leaf-LFU or leaf-window): a check that the model is the
 * daemon's policy (tests/integration/trace_replay.sh).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_PROG "kvp-bench-trace"
#include "bench_util.h"
#include "kvpalace.h"
#include "trace_gen.h"
#include "trace_sim.h"

#define MODEL	   "kvp-bench-trace"
#define BLOCK	   16u
#define HEAD_DIM   64u
#define ROW_WORDS  (HEAD_DIM * 2u / 8u) /* f16 row as 64-bit words */
#define MAX_WORKER 64u
#define MIB	   (1024.0 * 1024.0)

static const struct kvp_layout layout = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = HEAD_DIM,
	.block_tokens = BLOCK,
	.dtype = KVP_DTYPE_F16,
};

static struct {
	const char *mode;
	const char *sock;
	const char *trace_in;
	const char *mooncake;
	const char *out;
	const char *label;
	unsigned workers;
	unsigned reorder;
	uint32_t capacity_pages;
	double high, low;
	struct trace_params prm;
	struct trace_lfu lfu;
} opt = {
	.label = "trace",
	.workers = 4,
	.reorder = 8,
	.high = 0.95,
	.low = 0.90,
};

static void check(kvp_client *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s (%d)", what, kvp_strerror(c, r), r);
}

/* ---- the trace and the simulations --------------------------------------------- */

static void load_trace(struct trace *t)
{
	int r;

	if (opt.mooncake) {
		FILE *f = fopen(opt.mooncake, "re");
		uint32_t line = 0;

		if (!f)
			die("%s: %s", opt.mooncake, strerror(errno));
		r = trace_read_mooncake(f, BLOCK, t, &line);
		fclose(f);
		if (r < 0)
			die("%s:%u: not a Mooncake trace (%s)", opt.mooncake, line, strerror(-r));
		if (opt.out)
			die("--out cannot write a Mooncake trace");
	} else if (opt.trace_in) {
		FILE *f = fopen(opt.trace_in, "re");

		if (!f)
			die("%s: %s", opt.trace_in, strerror(errno));
		r = trace_read(f, t);
		fclose(f);
		if (r < 0)
			die("%s: not a trace (%s)", opt.trace_in, strerror(-r));
	} else {
		r = trace_generate(&opt.prm, t);
		if (r < 0)
			die("trace_generate: %s", strerror(-r));
	}
	if (opt.out) {
		FILE *f = fopen(opt.out, "we");

		if (!f)
			die("%s: %s", opt.out, strerror(errno));
		r = trace_write(t, f);
		if (fclose(f) || r < 0)
			die("%s: write failed", opt.out);
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The share of distinct full pages (in %) that no prompt after the
 * request that first held them holds again, and the median number of
 * other requests between a conversation's turns. */
static void reuse_stats(const struct trace *t, const struct trace_pages *pg, double *ret_never,
			double *ret_gap)
{
	uint32_t *first = malloc(((size_t)pg->n_pages + 1) * sizeof(uint32_t));
	uint8_t *again = calloc((size_t)pg->n_pages + 1, 1);
	uint32_t *last = malloc(((size_t)t->n_convs + 1) * sizeof(uint32_t));
	uint32_t *gaps = malloc(((size_t)t->n_reqs + 1) * sizeof(uint32_t)), n_gaps = 0, never = 0;

	if (!first || !again || !last || !gaps)
		die("out of memory");
	memset(first, 0xff, ((size_t)pg->n_pages + 1) * sizeof(uint32_t));
	for (uint32_t r = 0; r < t->n_reqs; r++) {
		const struct trace_req *q = &t->reqs[r];
		const uint32_t *ids = pg->conv[q->conv];
		uint32_t np = q->prompt_tokens / BLOCK,
			 n = (q->prompt_tokens + q->reply_tokens) / BLOCK;

		for (uint32_t i = 0; i < np; i++)
			if (first[ids[i]] < r)
				again[ids[i]] = 1;
		for (uint32_t i = 0; i < n; i++)
			if (first[ids[i]] == UINT32_MAX)
				first[ids[i]] = r;
		if (q->turn)
			gaps[n_gaps++] = r - last[q->conv] - 1;
		last[q->conv] = r;
	}
	for (uint32_t p = 0; p < pg->n_pages; p++)
		never += !again[p];
	*ret_never = pg->n_pages ? 100.0 * never / pg->n_pages : 0;
	qsort(gaps, n_gaps, sizeof(*gaps), cmp_u32);
	*ret_gap = n_gaps ? gaps[n_gaps / 2] : 0;
	free(first);
	free(again);
	free(last);
	free(gaps);
}

static void describe_trace(const struct trace *t, const struct trace_pages *pg)
{
	uint64_t prompt = 0, reply = 0, users = 0, gaps[3] = {0};
	double span = t->n_reqs ? t->reqs[t->n_reqs - 1].t_s : 0, never, gap;

	for (uint32_t r = 0; r < t->n_reqs; r++) {
		prompt += t->reqs[r].prompt_tokens;
		reply += t->reqs[r].reply_tokens;
		gaps[t->reqs[r].gap]++;
	}
	for (uint32_t c = 0; c < t->n_convs; c++)
		users = t->convs[c].user + 1 > users ? t->convs[c].user + 1 : users;
	fprintf(stderr,
		"trace: seed %" PRIu64 ", %u requests of %" PRIu64 " users, %u conversations, "
		"%.0f s of virtual time\n"
		"  system prompts:",
		t->prm.seed, t->n_reqs, users, t->n_convs, span);
	for (uint32_t k = 0; k < t->n_system; k++)
		fprintf(stderr, " %u", t->system_tokens[k]);
	fprintf(stderr,
		" tokens (Zipf s=%.2g)\n"
		"  mean prompt %.0f tokens, mean reply %.0f; returns: %" PRIu64 " soon, %" PRIu64
		" later, %" PRIu64 " first requests\n"
		"  %u distinct full pages of %u tokens (%.1f MiB of 4 KiB pages), %" PRIu64
		" prompt page references\n",
		t->prm.zipf_s, (double)prompt / t->n_reqs, (double)reply / t->n_reqs,
		gaps[TRACE_GAP_SOON], gaps[TRACE_GAP_LATER], gaps[TRACE_GAP_FIRST], pg->n_pages,
		pg->block_tokens, pg->n_pages * 4096.0 / MIB, pg->page_refs);
	reuse_stats(t, pg, &never, &gap);
	fprintf(stderr,
		"  shape %s: %.1f%% of the pages never used again; median gap between turns "
		"%.0f requests\n",
		trace_shape_name(t->prm.shape), never, gap);
}

struct sims {
	struct trace_sim_result r[TRACE_SIM_N]; /* by enum trace_policy */
	uint32_t *hits[TRACE_SIM_N];		/* [n_reqs] each request's hit tokens */
};

static double rate(const struct trace_sim_result *r)
{
	return r->prompt_tokens ? (double)r->hit_tokens / (double)r->prompt_tokens : 0;
}

static void run_sims(const struct trace *t, const struct trace_pages *pg, uint32_t cap,
		     struct sims *s)
{
	for (int pol = TRACE_SIM_INFINITE; pol < TRACE_SIM_N; pol++) {
		uint64_t t0 = now_ns();
		int r;

		s->hits[pol] = malloc(((size_t)t->n_reqs + 1) * sizeof(uint32_t));
		if (!s->hits[pol])
			die("out of memory");
		r = trace_sim_run_lfu(t, pg, pol, cap, opt.high, opt.low, &opt.lfu, s->hits[pol],
				      &s->r[pol]);
		if (r < 0)
			die("simulation %s: %s", trace_sim_name(pol), strerror(-r));
		fprintf(stderr,
			"  sim %-8s hit rate %.4f, %" PRIu64 " evictions, %" PRIu64
			" bypassed, peak %u pages (%.2f s)\n",
			trace_sim_name(pol), rate(&s->r[pol]), s->r[pol].evictions,
			s->r[pol].bypassed, s->r[pol].peak_pages, (double)(now_ns() - t0) / 1e9);
	}
}

static void sims_free(struct sims *s)
{
	for (int pol = TRACE_SIM_INFINITE; pol < TRACE_SIM_N; pol++)
		free(s->hits[pol]);
}

/* Where the hits go: by kind of request (a conversation's first turn,
 * a return after a short gap, after a long one), each column's hit rate
 * on that kind, and the system-prompt pages each missed. */
static void breakdown(const struct trace *t, const struct sims *s, const uint32_t *daemon)
{
	static const char *const kinds[] = {"new conversation", "return, short gap",
					    "return, long gap"};
	const uint32_t *col[] = {daemon, s->hits[TRACE_SIM_LRU], s->hits[TRACE_SIM_LEAF_LRU],
				 s->hits[TRACE_SIM_BELADY], s->hits[TRACE_SIM_INFINITE]};
	uint64_t prompt[3] = {0}, hit[3][5] = {{0}}, sys_miss[5] = {0}, sys_total = 0, all = 0;

	for (uint32_t r = 0; r < t->n_reqs; r++) {
		const struct trace_req *q = &t->reqs[r];
		uint32_t k = q->turn == 0 ? 0 : q->gap == TRACE_GAP_LATER ? 2 : 1;
		uint32_t sys = t->system_tokens[t->convs[q->conv].system] / BLOCK * BLOCK;

		prompt[k] += q->prompt_tokens;
		all += q->prompt_tokens;
		sys_total += sys;
		for (int c = 0; c < 5; c++) {
			hit[k][c] += col[c][r];
			sys_miss[c] += col[c][r] < sys ? sys - col[c][r] : 0;
		}
	}
	fprintf(stderr, "  %-22s %6s %9s %9s %9s %9s %9s\n", "by request kind", "tokens",
		"kvpalaced", "LRU", "leaf-LRU", "Belady", "infinite");
	for (int k = 0; k < 3; k++) {
		fprintf(stderr, "  %-22s %5.1f%%", kinds[k], 100.0 * prompt[k] / all);
		for (int c = 0; c < 5; c++)
			fprintf(stderr, " %9.2f", prompt[k] ? 100.0 * hit[k][c] / prompt[k] : 0);
		fputc('\n', stderr);
	}
	fprintf(stderr, "  %-22s %5.1f%%", "system prompts, missed", 100.0 * sys_total / all);
	for (int c = 0; c < 5; c++)
		fprintf(stderr, " %9.2f", sys_total ? 100.0 * sys_miss[c] / sys_total : 0);
	fprintf(stderr,
		"\n  (hit rate in %% of each kind's prompt tokens; last line: the %% of the\n"
		"  system prompts' full pages not served)\n\n");
}

static void label_sample(const char *name, double v)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "%s.%s", opt.label, name);
	sample(buf, v);
}

/* An exact count (sample's %g would round it). */
static void label_count(const char *name, uint64_t v)
{
	printf("sample %s.%s %" PRIu64 "\n", opt.label, name, v);
}

/* ---- the replay ------------------------------------------------------------------ */

/* The hash of tokens[0..pos], from which the K and V rows of pos derive. */
static uint64_t mix(uint64_t h, uint32_t tok)
{
	h = (h ^ tok) * 0x9e3779b97f4a7c15ull;
	return h ^ (h >> 29);
}

static void row_bytes(uint64_t h, uint32_t kv, uint64_t *row)
{
	for (uint32_t j = 0; j < ROW_WORDS; j++)
		row[j] = (h ^ (kv ? 0xa5a5a5a5a5a5a5a5ull : 0)) + j * 0xd1b54a32d192ed03ull;
}

struct worker_result {
	int ok;
	uint64_t requests;
	uint64_t prompt_tokens;
	uint64_t hit_tokens;
	uint64_t written_tokens;
	uint64_t verified_rows;
	uint64_t enospc_retries;
	uint64_t busy_ns;
	uint64_t wait_ns; /* held back to keep near trace order */
};

/* Shared by the workers (MAP_SHARED): their results, each request's hit
 * tokens, and the trace-order pacing: requests 0 .. done_prefix - 1 have
 * all finished, and a worker starts request r only once r < done_prefix +
 * opt.reorder. */
struct replay_shared {
	_Atomic uint32_t done_prefix;
	struct worker_result wr[MAX_WORKER];
	uint32_t *hits;	       /* [n_reqs], in the same mapping */
	_Atomic uint8_t *done; /* [n_reqs], in the same mapping */
};

static void pace_wait(struct replay_shared *sh, uint32_t r, struct worker_result *wr)
{
	uint64_t t0 = 0;

	for (unsigned spins = 0; r >= atomic_load(&sh->done_prefix) + opt.reorder; spins++) {
		if (!t0)
			t0 = now_ns();
		if (spins < 64)
			sched_yield();
		else
			usleep(20);
	}
	if (t0)
		wr->wait_ns += now_ns() - t0;
}

static void pace_done(struct replay_shared *sh, uint32_t r, uint32_t n_reqs)
{
	uint32_t p;

	atomic_store(&sh->done[r], 1);
	p = atomic_load(&sh->done_prefix);
	while (p < n_reqs && atomic_load(&sh->done[p])) {
		if (atomic_compare_exchange_weak(&sh->done_prefix, &p, p + 1))
			p++;
	}
}

/* The running hashes of tokens[0..n): hs[i] covers tokens[0..i]. */
static void prefix_hashes(const uint32_t *tok, uint32_t n, uint64_t *hs)
{
	uint64_t h = 0x6b76702d74726163ull; /* "kvp-trac" */

	for (uint32_t i = 0; i < n; i++)
		hs[i] = h = mix(h, tok[i]);
}

static void verify(kvp_lease *l, const uint64_t *hs, uint64_t hit, struct worker_result *wr)
{
	uint64_t pos[3] = {0, hit / 2, hit - 1}, want[ROW_WORDS];

	for (int i = 0; i < 3; i++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			const void *got = kvp_lease_kv(l, pos[i], 0, kv, 0);

			row_bytes(hs[pos[i]], kv, want);
			if (!got || memcmp(got, want, sizeof(want)))
				die("matched token %" PRIu64 " (%s) holds other bytes than its "
				    "prefix's",
				    pos[i], kv ? "V" : "K");
			wr->verified_rows++;
		}
}

static void replay_one(kvp_client *c, kvp_pool *p, const struct trace *t, const struct trace_req *q,
		       uint64_t *hs, struct worker_result *wr, uint32_t *ret_hit)
{
	const uint32_t *tok = t->convs[q->conv].tokens;
	uint32_t n = q->prompt_tokens + q->reply_tokens, tries = 0;
	uint64_t hit, t0 = now_ns(), row[ROW_WORDS];
	kvp_session *s;
	kvp_lease *l;
	int r;

	prefix_hashes(tok, n, hs);
	check(c, kvp_match_prefix(p, tok, q->prompt_tokens, &l), "kvp_match_prefix");
	hit = kvp_lease_tokens(l);
	if (hit > q->prompt_tokens || hit % BLOCK)
		die("a match of %u tokens gave %" PRIu64, q->prompt_tokens, hit);
	if (hit) {
		verify(l, hs, hit, wr);
		check(c, kvp_lease_fork(l, hit, &s), "kvp_lease_fork");
	} else {
		check(c, kvp_session_create(p, &s), "kvp_session_create");
	}
	check(c, kvp_lease_release(l), "kvp_lease_release");
	while (kvp_session_tokens(s) < n) {
		uint64_t at = kvp_session_tokens(s);

		r = kvp_append(s, tok + at, n - at);
		if (r == -ENOSPC && ++tries < 10000) {
			wr->enospc_retries++;
			usleep(1000);
			continue;
		}
		check(c, r, "kvp_append");
	}
	for (uint64_t pos = hit; pos < n; pos++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			void *dst = kvp_session_kv(s, pos, 0, kv, 0);

			if (!dst)
				die("kvp_session_kv(%" PRIu64 ") gave NULL", pos);
			row_bytes(hs[pos], kv, row);
			memcpy(dst, row, sizeof(row));
		}
	check(c, kvp_commit(s, n - hit), "kvp_commit");
	check(c, kvp_session_close(s), "kvp_session_close");
	wr->requests++;
	wr->prompt_tokens += q->prompt_tokens;
	wr->hit_tokens += hit;
	wr->written_tokens += n - hit;
	wr->busy_ns += now_ns() - t0;
	*ret_hit = (uint32_t)hit;
}

static void replay_worker(unsigned w, const struct trace *t, struct replay_shared *sh, int go_fd)
{
	struct worker_result *wr = &sh->wr[w];
	uint32_t max_n = 0;
	uint64_t *hs;
	kvp_client *c;
	kvp_pool *p;
	char ch;
	int r;

	for (uint32_t i = 0; i < t->n_convs; i++)
		max_n = t->convs[i].n_tokens > max_n ? t->convs[i].n_tokens : max_n;
	hs = malloc(((size_t)max_n + 1) * sizeof(*hs));
	if (!hs)
		die("out of memory");
	r = kvp_connect(opt.sock, &c);
	if (r < 0)
		die("kvp_connect %s: %s", opt.sock, strerror(-r));
	check(c, kvp_pool_open(c, MODEL, &layout, &p), "kvp_pool_open");
	/* Wait for the start: the parent closes the pipe. */
	if (read(go_fd, &ch, 1) < 0)
		die("read: %s", strerror(errno));
	for (uint32_t i = 0; i < t->n_reqs; i++) {
		if (t->reqs[i].user % opt.workers != w)
			continue;
		pace_wait(sh, i, wr);
		replay_one(c, p, t, &t->reqs[i], hs, wr, &sh->hits[i]);
		pace_done(sh, i, t->n_reqs);
	}
	kvp_pool_close(p);
	kvp_disconnect(c);
	free(hs);
	wr->ok = 1;
}

static struct kvp_pool_stats pool_stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps = {0};
	struct kvp_stats *st;
	int found = 0;

	check(c, kvp_stats(c, &st), "kvp_stats");
	for (size_t i = 0; i < st->n_pools; i++)
		if (st->pools[i].pool_id == kvp_pool_id(p)) {
			ps = st->pools[i];
			found = 1;
		}
	kvp_stats_free(st);
	if (!found)
		die("kvp_stats does not list pool %" PRIu64, kvp_pool_id(p));
	return ps;
}

/* Forks the workers, starts them together, waits; returns the wall time. */
static uint64_t replay(const struct trace *t, struct replay_shared *sh)
{
	pid_t pids[MAX_WORKER];
	int go[2], failed = 0;
	uint64_t t0;

	if (pipe2(go, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	for (unsigned w = 0; w < opt.workers; w++) {
		pids[w] = fork();
		if (pids[w] < 0)
			die("fork: %s", strerror(errno));
		if (pids[w] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			close(go[1]);
			replay_worker(w, t, sh, go[0]);
			fflush(stderr);
			_exit(0);
		}
	}
	close(go[0]);
	usleep(100000); /* the workers connect and map the arena */
	t0 = now_ns();
	close(go[1]);
	for (unsigned w = 0; w < opt.workers; w++) {
		int st;

		if (waitpid(pids[w], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
		    !sh->wr[w].ok)
			failed = 1;
	}
	if (failed)
		die("a replay worker failed");
	return now_ns() - t0;
}

static void mode_run(void)
{
	struct kvp_pool_stats ps0, ps1;
	struct worker_result sum = {0};
	struct replay_shared *sh;
	struct trace_pages pg;
	struct trace t;
	struct sims sims = {0};
	uint32_t cap;
	uint64_t wall_ns;
	size_t page_bytes, map_bytes;
	kvp_client *c;
	kvp_pool *p;
	double d, lru, leaf, bel, inf, s, token_bytes, spilled, promoted;
	uint64_t ev;
	int r;

	load_trace(&t);
	r = trace_pages_build(&t, BLOCK, &pg);
	if (r < 0)
		die("trace_pages_build: %s", strerror(-r));
	describe_trace(&t, &pg);

	r = kvp_connect(opt.sock, &c);
	if (r < 0)
		die("kvp_connect %s: %s", opt.sock, strerror(-r));
	check(c, kvp_pool_open(c, MODEL, &layout, &p), "kvp_pool_open");
	page_bytes = kvp_pool_page_bytes(p);
	token_bytes = (double)page_bytes / BLOCK;
	ps0 = pool_stats(c, p);
	if (ps0.indexed_pages || ps0.n_sessions)
		die("the pool is not fresh (%u indexed pages, %u sessions): restart the daemon",
		    ps0.indexed_pages, ps0.n_sessions);
	cap = ps0.n_pages + (ps0.has_disk ? ps0.disk_capacity : 0);
	fprintf(stderr,
		"daemon: host pool %u pages of %zu bytes, %s%u disk pages; simulated capacity %u "
		"pages (watermarks %.2f/%.2f for leaf-LRU)\n",
		ps0.n_pages, page_bytes, ps0.has_disk ? "disk tier of " : "no disk tier, ",
		ps0.disk_capacity, cap, opt.high, opt.low);
	run_sims(&t, &pg, cap, &sims);

	map_bytes = sizeof(*sh) + (sizeof(uint32_t) + 1) * ((size_t)t.n_reqs + 1);
	sh = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	sh->hits = (uint32_t *)(sh + 1);
	sh->done = (_Atomic uint8_t *)(sh->hits + t.n_reqs + 1);
	fprintf(stderr, "replay: %u workers against %s, at most %u requests ahead of the oldest\n",
		opt.workers, opt.sock, opt.reorder);
	wall_ns = replay(&t, sh);
	ps1 = pool_stats(c, p);
	for (unsigned w = 0; w < opt.workers; w++) {
		const struct worker_result *wr = &sh->wr[w];

		sum.requests += wr->requests;
		sum.prompt_tokens += wr->prompt_tokens;
		sum.hit_tokens += wr->hit_tokens;
		sum.written_tokens += wr->written_tokens;
		sum.verified_rows += wr->verified_rows;
		sum.enospc_retries += wr->enospc_retries;
		sum.busy_ns += wr->busy_ns;
		sum.wait_ns += wr->wait_ns;
	}
	if (sum.requests != t.n_reqs)
		die("replayed %" PRIu64 " of %u requests", sum.requests, t.n_reqs);
	if (ps1.verify_failures || ps1.io_errors)
		die("the daemon counts %" PRIu64 " verify failures and %" PRIu64 " I/O errors",
		    ps1.verify_failures, ps1.io_errors);

	s = (double)wall_ns / 1e9;
	d = (double)sum.hit_tokens / (double)sum.prompt_tokens;
	inf = rate(&sims.r[TRACE_SIM_INFINITE]);
	lru = rate(&sims.r[TRACE_SIM_LRU]);
	leaf = rate(&sims.r[TRACE_SIM_LEAF_LRU]);
	bel = rate(&sims.r[TRACE_SIM_BELADY]);
	spilled = (double)(ps1.spilled_pages - ps0.spilled_pages) * page_bytes;
	promoted = (double)(ps1.promoted_pages - ps0.promoted_pages) * page_bytes;
	ev = ps1.evictions - ps0.evictions;
	fprintf(stderr,
		"  %u requests in %.2f s: %.0f requests/s (%.2f ms a request in a worker, "
		"%.2f s waited for trace order)\n"
		"  prompt tokens %" PRIu64 ": served from the cache %" PRIu64
		", recomputed %" PRIu64 " (+ %" PRIu64 " reply tokens written)\n"
		"  host arena: %.1f MiB served from the cache (matched pages), %.1f MiB "
		"written (recomputed prompt and replies)\n"
		"  disk tier: %.1f MiB spilled (host -> disk), %.1f MiB promoted "
		"(disk -> host), %u pages on disk at the end\n"
		"  pool: %" PRIu64 " evictions, %" PRIu64 " dedup pages, %u indexed pages at "
		"the end; %" PRIu64 " rows verified; %" PRIu64 " -ENOSPC retries\n",
		t.n_reqs, s, t.n_reqs / s, (double)sum.busy_ns / 1e6 / (double)t.n_reqs,
		(double)sum.wait_ns / 1e9, sum.prompt_tokens, sum.hit_tokens,
		sum.prompt_tokens - sum.hit_tokens,
		sum.written_tokens - (sum.prompt_tokens - sum.hit_tokens),
		sum.hit_tokens * token_bytes / MIB, sum.written_tokens * token_bytes / MIB,
		spilled / MIB, promoted / MIB, ps1.disk_pages, ev,
		ps1.dedup_pages - ps0.dedup_pages, ps1.indexed_pages, sum.verified_rows,
		sum.enospc_retries);
	fprintf(stderr,
		"\n  %s\n"
		"  %-38s %8.2f %%\n  %-38s %8.2f %%\n  %-38s %8.2f %%\n  %-38s %8.2f %%\n"
		"  %-38s %8.2f %%\n"
		"  %-38s %8.2f %%\n  %-38s %8.3f\n  %-38s %+8.2f pts\n  %-38s %+8.2f pts\n\n",
		"hit rate (% of prompt tokens)",
		ps0.has_disk ? "kvpalaced, host + disk" : "kvpalaced, host only", 100 * d,
		"plain LRU (simulated)", 100 * lru, "leaf-LRU (--eviction lru, simulated)",
		100 * leaf, "leaf-window (--eviction window, sim.)",
		100 * rate(&sims.r[TRACE_SIM_LEAF_WIN]), "Belady MIN (simulated)", 100 * bel,
		"infinite cache (simulated)", 100 * inf, "kvpalaced / Belady",
		bel > 0 ? d / bel : 0, "kvpalaced - LRU", 100 * (d - lru), "kvpalaced - leaf-LRU",
		100 * (d - leaf));
	breakdown(&t, &sims, sh->hits);
	label_sample("hit_rate", 100 * d);
	label_sample("lru_hit_rate", 100 * lru);
	label_sample("leaf_lru_hit_rate", 100 * leaf);
	label_sample("leaf_window_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LEAF_WIN]));
	label_sample("leaf_lfu_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LEAF_LFU]));
	label_sample("belady_hit_rate", 100 * bel);
	label_sample("infinite_hit_rate", 100 * inf);
	label_sample("belady_ratio", bel > 0 ? d / bel : 0);
	label_sample("lru_gain", 100 * (d - lru));
	label_sample("rps", t.n_reqs / s);
	label_sample("tokens_served", (double)sum.hit_tokens);
	/* The simulations' own, to compare with a sequential replay's. */
	label_count("daemon_tokens", sum.hit_tokens);
	label_count("leaf_lru_tokens", sims.r[TRACE_SIM_LEAF_LRU].hit_tokens);
	label_count("leaf_lfu_tokens", sims.r[TRACE_SIM_LEAF_LFU].hit_tokens);
	label_count("leaf_window_tokens", sims.r[TRACE_SIM_LEAF_WIN].hit_tokens);
	label_sample("tokens_recomputed", (double)(sum.prompt_tokens - sum.hit_tokens));
	label_sample("served_mib", sum.hit_tokens * token_bytes / MIB);
	label_sample("recomputed_mib", sum.written_tokens * token_bytes / MIB);
	label_sample("spilled_mib", spilled / MIB);
	label_sample("promoted_mib", promoted / MIB);
	label_sample("evictions", (double)ev);
	munmap(sh, map_bytes);
	sims_free(&sims);
	kvp_pool_close(p);
	kvp_disconnect(c);
	trace_pages_free(&pg);
	trace_free(&t);
}

static void mode_sim(void)
{
	struct trace_pages pg;
	struct trace t;
	struct sims sims = {0};
	int r;

	if (!opt.capacity_pages)
		die("sim wants --capacity-pages");
	load_trace(&t);
	r = trace_pages_build(&t, BLOCK, &pg);
	if (r < 0)
		die("trace_pages_build: %s", strerror(-r));
	describe_trace(&t, &pg);
	fprintf(stderr, "capacity %u pages\n", opt.capacity_pages);
	run_sims(&t, &pg, opt.capacity_pages, &sims);
	label_sample("lru_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LRU]));
	label_sample("leaf_lru_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LEAF_LRU]));
	label_sample("belady_hit_rate", 100 * rate(&sims.r[TRACE_SIM_BELADY]));
	label_sample("infinite_hit_rate", 100 * rate(&sims.r[TRACE_SIM_INFINITE]));
	label_sample("leaf_lfu_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LEAF_LFU]));
	label_sample("lru_belady_ratio",
		     rate(&sims.r[TRACE_SIM_LEAF_LRU]) / rate(&sims.r[TRACE_SIM_BELADY]));
	label_sample("lfu_belady_ratio",
		     rate(&sims.r[TRACE_SIM_LEAF_LFU]) / rate(&sims.r[TRACE_SIM_BELADY]));
	label_sample("leaf_window_hit_rate", 100 * rate(&sims.r[TRACE_SIM_LEAF_WIN]));
	label_sample("window_belady_ratio",
		     rate(&sims.r[TRACE_SIM_LEAF_WIN]) / rate(&sims.r[TRACE_SIM_BELADY]));
	sims_free(&sims);
	trace_pages_free(&pg);
	trace_free(&t);
}

static void mode_gen(void)
{
	struct trace_pages pg;
	struct trace t;
	int r;

	if (!opt.out)
		die("gen wants --out FILE");
	load_trace(&t);
	r = trace_pages_build(&t, BLOCK, &pg);
	if (r < 0)
		die("trace_pages_build: %s", strerror(-r));
	describe_trace(&t, &pg);
	trace_pages_free(&pg);
	trace_free(&t);
}

/* ---- main ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: kvp-bench-trace gen --out FILE [TRACE OPTIONS]\n"
	      "       kvp-bench-trace sim --capacity-pages N [TRACE OPTIONS]\n"
	      "       kvp-bench-trace run --socket PATH [--workers N] [--reorder N]\n"
	      "                           [--label NAME] [--out FILE] [TRACE OPTIONS]\n"
	      "TRACE OPTIONS: --trace FILE (read a trace), --mooncake FILE (read a\n"
	      "  Mooncake JSON-lines trace), or generate one: --shape chat|prod|docs\n"
	      "  (first: it resets the others; default chat) --seed N --users N\n"
	      "  --requests N --systems N --max-context N; prod and docs also\n"
	      "  --gap-median N (requests) --p-continue F --p-doc F --first-mean N\n"
	      "Also: --high-watermark F --low-watermark F (the daemon's, for the\n"
	      "leaf-LRU and leaf-LFU simulations; default 0.95 and 0.90);\n"
	      "--lfu-aging N --lfu-ghost N --lfu-max N (leaf-LFU's\n"
	      "parameters, bench/trace_sim.c; default 32768, 8, 15);\n"
	      "--window N --window-ghost N (leaf-window's probation share in per\n"
	      "mille of the capacity and ghosts per page; default 700, 0).\n"
	      "Replays multi-user conversation traces against a running kvpalaced and\n"
	      "compares its prefix-cache hit rate with LRU and Belady simulated at the same\n"
	      "capacity; prints 'sample NAME VALUE' lines.\n",
	      f);
}

static unsigned parse_uint(const char *s, const char *what, unsigned lo, unsigned hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		die("--%s wants %u..%u", what, lo, hi);
	return (unsigned)v;
}

static double parse_fraction(const char *s, const char *what)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v > 0 && v <= 1))
		die("--%s wants a fraction in (0, 1]", what);
	return v;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"trace", required_argument, NULL, 't'},
		{"mooncake", required_argument, NULL, 'M'},
		{"shape", required_argument, NULL, 'P'},
		{"gap-median", required_argument, NULL, 'g'},
		{"p-continue", required_argument, NULL, 'C'},
		{"p-doc", required_argument, NULL, 'D'},
		{"first-mean", required_argument, NULL, 'F'},
		{"lfu-aging", required_argument, NULL, 'A'},
		{"lfu-ghost", required_argument, NULL, 'G'},
		{"lfu-max", required_argument, NULL, 'X'},
		{"window", required_argument, NULL, 'W'},
		{"window-ghost", required_argument, NULL, 'Y'},
		{"out", required_argument, NULL, 'o'},
		{"label", required_argument, NULL, 'l'},
		{"workers", required_argument, NULL, 'w'},
		{"reorder", required_argument, NULL, 'R'},
		{"capacity-pages", required_argument, NULL, 'c'},
		{"seed", required_argument, NULL, 'S'},
		{"users", required_argument, NULL, 'u'},
		{"requests", required_argument, NULL, 'r'},
		{"systems", required_argument, NULL, 'y'},
		{"max-context", required_argument, NULL, 'x'},
		{"high-watermark", required_argument, NULL, 'H'},
		{"low-watermark", required_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int ch;

	trace_params_default(&opt.prm);
	trace_lfu_default(&opt.lfu);
	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (ch) {
		case 's':
			opt.sock = optarg;
			break;
		case 't':
			opt.trace_in = optarg;
			break;
		case 'M':
			opt.mooncake = optarg;
			break;
		case 'P': { /* resets the trace parameters: give it first */
			int sh = trace_shape_parse(optarg);
			uint64_t seed = opt.prm.seed;

			if (sh < 0)
				die("--shape wants chat, prod or docs");
			trace_params_shape(&opt.prm, (uint32_t)sh);
			opt.prm.seed = seed;
			break;
		}
		case 'g':
			opt.prm.gap_median_reqs = parse_uint(optarg, "gap-median", 1, 1u << 24);
			break;
		case 'C':
			opt.prm.p_continue = parse_fraction(optarg, "p-continue");
			break;
		case 'D':
			opt.prm.p_doc = parse_fraction(optarg, "p-doc");
			break;
		case 'A':
			opt.lfu.aging_uses = parse_uint(optarg, "lfu-aging", 1, 1u << 30);
			break;
		case 'G':
			opt.lfu.ghost_per_page = parse_uint(optarg, "lfu-ghost", 0, 64);
			break;
		case 'X':
			opt.lfu.max_count = parse_uint(optarg, "lfu-max", 1, TRACE_LFU_MAX_COUNT);
			break;
		case 'W':
			opt.lfu.window_permille = parse_uint(optarg, "window", 0, 1000);
			break;
		case 'Y':
			opt.lfu.win_ghost_per_page = parse_uint(optarg, "window-ghost", 0, 64);
			break;
		case 'F':
			opt.prm.first_mean_tokens = parse_uint(optarg, "first-mean", 1, 1u << 16);
			break;
		case 'o':
			opt.out = optarg;
			break;
		case 'l':
			opt.label = optarg;
			break;
		case 'w':
			opt.workers = parse_uint(optarg, "workers", 1, MAX_WORKER);
			break;
		case 'R':
			opt.reorder = parse_uint(optarg, "reorder", 1, 1u << 24);
			break;
		case 'c':
			opt.capacity_pages = parse_uint(optarg, "capacity-pages", 1, 1u << 30);
			break;
		case 'S':
			opt.prm.seed = parse_uint(optarg, "seed", 0, UINT32_MAX);
			break;
		case 'u':
			opt.prm.n_users = parse_uint(optarg, "users", 1, 1u << 20);
			break;
		case 'r':
			opt.prm.n_requests = parse_uint(optarg, "requests", 1, 1u << 24);
			break;
		case 'y':
			opt.prm.n_system = parse_uint(optarg, "systems", 1, TRACE_MAX_SYSTEM);
			break;
		case 'x':
			opt.prm.max_context_tokens =
				parse_uint(optarg, "max-context", 4096, 1u << 20);
			break;
		case 'H':
			opt.high = parse_fraction(optarg, "high-watermark");
			break;
		case 'L':
			opt.low = parse_fraction(optarg, "low-watermark");
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1 || opt.low > opt.high) {
		usage(stderr);
		return 2;
	}
	opt.mode = argv[optind];
	if (!strcmp(opt.mode, "gen")) {
		mode_gen();
	} else if (!strcmp(opt.mode, "sim")) {
		mode_sim();
	} else if (!strcmp(opt.mode, "run")) {
		if (!opt.sock)
			die("run wants --socket PATH");
		mode_run();
	} else {
		usage(stderr);
		return 2;
	}
	return 0;
}
