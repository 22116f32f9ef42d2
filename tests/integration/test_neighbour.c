/* tests/integration/test_neighbour.c — a hostile tenant beside an
 * ordinary one, all at once, in one daemon (issue 14).
 *
 * Tenant M (uid 2011) does everything issue 14 found could hurt another
 * tenant, at the same time, from four processes: it fills the whole host
 * tier with its pools, forks a 64K-token session 40 times, loops on
 * ReportImportance queries at the work cap, and holds every connection
 * its uid may open. Tenant V (uid 2012) meanwhile must find the daemon as
 * it was: its pings near what they were alone (measured in the same run),
 * its OpenPool and a 64-page commit served from M's share, its bytes read
 * back, its Stats counting its own work only; the admin gets in; and the
 * daemon's heap holds M's forks at about their page tables.
 *
 * Runs as root (uids are switched in child processes, as test_isolation
 * does) and skips otherwise.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define UID_M	   2011
#define UID_V	   2012
#define MODEL_M	   "neighbour-m"
#define MODEL_V	   "neighbour-v"
#define POOL_PAGES 4096u  /* 32 MiB pools of harness_layout */
#define TIER_PAGES 12288u /* 96 MiB */
#define N_POOLS_M  3
/* M's pages: the forked session's pool, the query session's 1024 pages,
 * and two pools filled so that the tier has 32 pages left, fewer than V
 * needs. */
#define FILL_PAGES  ((TIER_PAGES - 32u - POOL_PAGES - 1024u) / 2u)
#define FORK_TOKENS (POOL_PAGES * 16u)
#define N_FORKS	    40
#define N_Q_HEADS   (64u * 2u)
#define Q_TOKENS    (16384u - 8u) /* at the work cap with N_Q_HEADS heads */
#define PER_USER    8
#define N_SOLO	    2000u
#define N_BESIDE    8000u
#define V_PAGES	    64u

/* What the processes share (MAP_SHARED). */
struct shared {
	volatile int go, stop;
	volatile int ready; /* M's processes at work */
	volatile int failed;
	volatile uint64_t queries; /* M's queries answered */
	volatile long heap_before_kb, heap_forked_kb;
	volatile int forked;	  /* M's forks measured: its queries may start */
	volatile int conns_held;  /* M's connections open */
	volatile int m_connected; /* M's roles 0 and 1 connected: role 2 may take the rest */
	double solo[N_SOLO];
	double beside[N_BESIDE];
	volatile uint32_t n_beside;
	volatile int v_served;	  /* V's pool, commit, match and stats checked */
	volatile uint64_t leased; /* pages M's leases pin (test_lease_hog) */
	volatile int refused;	  /* M's match refused with -EDQUOT */
};

struct m_arg {
	struct harness *h;
	struct shared *sh;
	int role;
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* Fills pool p with committed sessions closed again: its pages stay
 * cached in the index, held against the tier. */
static int fill_pool(kvp_pool *p, uint32_t seed, uint32_t pages)
{
	uint32_t n = pages * 16u, *tokens = malloc(n * sizeof(*tokens));
	kvp_session *s;
	int ret;

	if (!tokens)
		return -ENOMEM;
	harness_tokens(tokens, n, seed, 0);
	ret = harness_commit_session(p, tokens, n, &s);
	if (ret == 0)
		ret = kvp_session_close(s);
	free(tokens);
	return ret;
}

/* Role 0: fills the tier and forks; 1: queries; 2: holds connections. */
static int m_main(void *arg)
{
	struct m_arg *a = arg;
	struct shared *sh = a->sh;
	kvp_client *c, *held[PER_USER];
	kvp_pool *p[N_POOLS_M];
	kvp_session *s, *f[N_FORKS];
	float *q;
	uint32_t *tokens;
	int n = 0;

	CHILD_CHECK(harness_become(UID_M) == 0);
	while (!sh->go)
		sleep_ms(1);
	if (a->role == 2) {
		/* Every connection this uid may have: the rest are refused.
		 * Once the other two roles have theirs, or it may take them
		 * (seen in a loaded run: role 0 refused). */
		for (int i = 0; i < 60000 && sh->m_connected < 2; i++)
			sleep_ms(1);
		while (n < PER_USER && kvp_connect(a->h->sock, &held[n]) == 0)
			n++;
		sh->conns_held = n;
		__sync_fetch_and_add(&sh->ready, 1);
		while (!sh->stop)
			sleep_ms(5);
		while (n > 0)
			kvp_disconnect(held[--n]);
		return 0;
	}
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	__sync_fetch_and_add(&sh->m_connected, 1);
	if (a->role == 1) {
		q = malloc((size_t)N_Q_HEADS * harness_layout.head_dim * sizeof(float));
		tokens = malloc(Q_TOKENS * sizeof(*tokens));
		CHILD_CHECK(q && tokens);
		for (size_t i = 0; i < (size_t)N_Q_HEADS * harness_layout.head_dim; i++)
			q[i] = (float)((i % 7) + 1) * 0.01f;
		harness_tokens(tokens, Q_TOKENS, 2, 0);
		/* A query's job holds 8 MiB of attention weights: not while
		 * the forks' memory is measured. */
		while (!sh->forked && !sh->stop)
			sleep_ms(1);
		CHILD_CHECK(kvp_pool_open(c, MODEL_M "-q", &harness_layout, &p[0]) == 0);
		CHILD_CHECK(harness_commit_session(p[0], tokens, Q_TOKENS, &s) == 0);
		CHILD_CHECK_EQ(kvp_session_score_query(s, 1, q, N_Q_HEADS), 0);
		__sync_fetch_and_add(&sh->ready, 1);
		while (!sh->stop) {
			CHILD_CHECK_EQ(kvp_session_score_query(s, 1, q, N_Q_HEADS), 0);
			sh->queries++;
		}
		kvp_disconnect(c);
		free(q);
		free(tokens);
		return 0;
	}
	/* Role 0: a 64K-token session forked 40 times, then the rest of the
	 * tier filled with cached pages. */
	tokens = malloc(FORK_TOKENS * sizeof(*tokens));
	CHILD_CHECK(tokens != NULL);
	harness_tokens(tokens, FORK_TOKENS, 1, 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL_M "-0", &harness_layout, &p[0]) == 0);
	CHILD_CHECK(kvp_session_create(p[0], &s) == 0);
	for (uint32_t at = 0; at < FORK_TOKENS; at += 8192) {
		CHILD_CHECK_EQ(kvp_append(s, tokens + at, 8192), 0);
		CHILD_CHECK_EQ(kvp_commit(s, 8192), 0);
	}
	sh->heap_before_kb = harness_proc_kb(a->h->pid, "RssAnon");
	for (int i = 0; i < N_FORKS; i++)
		CHILD_CHECK_EQ(kvp_session_fork(s, FORK_TOKENS, &f[i]), 0);
	sh->heap_forked_kb = harness_proc_kb(a->h->pid, "RssAnon");
	sh->forked = 1;
	for (int i = 1; i < N_POOLS_M; i++) {
		char model[64];

		snprintf(model, sizeof(model), MODEL_M "-%d", i);
		CHILD_CHECK(kvp_pool_open(c, model, &harness_layout, &p[i]) == 0);
		CHILD_CHECK_EQ(fill_pool(p[i], 10 + (uint32_t)i, FILL_PAGES), 0);
	}
	__sync_fetch_and_add(&sh->ready, 1);
	while (!sh->stop)
		sleep_ms(5);
	kvp_disconnect(c);
	free(tokens);
	return 0;
}

/* V's own work beside M: a pool, a commit of V_PAGES pages (the tier is
 * all but full of M's pages: V, under its fair share, takes room from
 * M's cached ones), its bytes back, and Stats of its own. */
static int v_work(struct harness *h, kvp_client *c)
{
	uint32_t tokens[V_PAGES * 16];
	struct kvp_stats *st;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	harness_tokens(tokens, V_PAGES * 16, 99, 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL_V, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(harness_commit_session(p, tokens, V_PAGES * 16, &s), 0);
	CHILD_CHECK_EQ(kvp_match_prefix(p, tokens, V_PAGES * 16, &l), 0);
	CHILD_CHECK_EQ(kvp_lease_tokens(l), V_PAGES * 16);
	CHILD_CHECK_EQ(harness_check_lease(l, p, tokens, V_PAGES * 16), 0);
	CHILD_CHECK_EQ(kvp_lease_release(l), 0);
	CHILD_CHECK_EQ(kvp_stats(c, &st), 0);
	/* Its own counts: M committed over 200K tokens meanwhile. */
	CHILD_CHECK_EQ(st->committed_tokens, V_PAGES * 16);
	CHILD_CHECK_EQ(st->match_hits, 1);
	CHILD_CHECK_EQ(st->n_pools, 1);
	kvp_stats_free(st);
	(void)h;
	return 0;
}

/* V alone: its pool, a commit, a match and its bytes, its Stats. */
static int v_work_main(void *arg)
{
	struct m_arg *a = arg;
	kvp_client *c;

	CHILD_CHECK(harness_become(UID_V) == 0);
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	CHILD_CHECK(v_work(a->h, c) == 0);
	kvp_disconnect(c);
	return 0;
}

static int v_main(void *arg)
{
	struct m_arg *a = arg;
	struct shared *sh = a->sh;
	kvp_client *c;
	double t0;
	uint32_t n = 0;

	CHILD_CHECK(harness_become(UID_V) == 0);
	CHILD_CHECK(kvp_connect(a->h->sock, &c) == 0);
	for (int i = 0; i < 200; i++)
		CHILD_CHECK(kvp_ping(c) == 0);
	for (uint32_t i = 0; i < N_SOLO; i++) {
		double t = now_ms();

		CHILD_CHECK(kvp_ping(c) == 0);
		sh->solo[i] = now_ms() - t;
	}
	sh->go = 1;
	for (int i = 0; i < 120000 && sh->ready < 3; i++)
		sleep_ms(1);
	CHILD_CHECK_EQ(sh->ready, 3);
	CHILD_CHECK(v_work(a->h, c) == 0);
	sh->v_served = 1;
	t0 = now_ms();
	while (now_ms() - t0 < 2000 && n < N_BESIDE) {
		double t = now_ms();

		CHILD_CHECK(kvp_ping(c) == 0);
		sh->beside[n++] = now_ms() - t;
		usleep(500);
	}
	sh->n_beside = n;
	kvp_disconnect(c);
	return 0;
}

#define HOG_PAGES 256u /* a session of M's in test_lease_hog */

/* M commits sessions into its pools and keeps a read lease on each, until
 * the daemon refuses a match (its share of the tier is pinned) or its
 * pools are full of its leases; then holds them until told to stop. */
static int hog_main(void *arg)
{
	struct m_arg *a = arg;
	struct shared *sh = a->sh;
	uint32_t *tokens = malloc(HOG_PAGES * 16u * sizeof(*tokens)), seed = 1;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	char model[32];

	CHILD_CHECK(tokens != NULL);
	CHILD_CHECK(harness_become(UID_M) == 0);
	CHILD_CHECK_EQ(kvp_connect(a->h->sock, &c), 0);
	for (int i = 0; i < N_POOLS_M && !sh->refused; i++) {
		snprintf(model, sizeof(model), "%s-%d", MODEL_M, i);
		CHILD_CHECK_EQ(kvp_pool_open(c, model, &harness_layout, &p), 0);
		for (;;) {
			int ret;

			harness_tokens(tokens, HOG_PAGES * 16u, seed++, 0);
			if (harness_commit_session(p, tokens, HOG_PAGES * 16u, &s) < 0)
				break; /* this pool is full of what M pins */
			CHILD_CHECK_EQ(kvp_session_close(s), 0);
			ret = kvp_match_prefix(p, tokens, HOG_PAGES * 16u, &l);
			if (ret == -EDQUOT) {
				sh->refused = 1;
				break;
			}
			CHILD_CHECK_EQ(ret, 0);
			sh->leased += kvp_lease_tokens(l) / 16u;
		}
	}
	sh->ready = 1;
	while (!sh->stop)
		sleep_ms(1);
	kvp_disconnect(c);
	free(tokens);
	return 0;
}

/* A tenant's read leases pin at most its share of the host tier, however
 * many pools and connections it spreads them over (a review found one
 * uid pinning the whole tier with leases: another uid's every append then
 * failed with ENOSPC). Alone, M pins at most half the tier; V then
 * commits, matches and reads its pages back beside M's leases. */
static void test_lease_hog(void **state)
{
	struct harness *h = *state;
	struct shared *sh;
	struct m_arg ma, va;
	pid_t m, v;

	if (!h)
		skip();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	ma = (struct m_arg){.h = h, .sh = sh};
	m = harness_fork(hog_main, &ma);
	assert_true(m > 0);
	for (int i = 0; i < 120000 && !sh->ready; i++)
		sleep_ms(1);
	assert_true(sh->ready);
	print_message("M's leases pin %llu of %u pages (refused: %d)\n",
		      (unsigned long long)sh->leased, TIER_PAGES, sh->refused);
	assert_true(sh->refused);
	/* The check comes before a match: one match may pass it by its pages. */
	assert_true(sh->leased <= TIER_PAGES / 2 + HOG_PAGES);
	va = (struct m_arg){.h = h, .sh = sh};
	v = harness_fork(v_work_main, &va);
	assert_true(v > 0);
	assert_int_equal(harness_wait(v, 120), 0);
	sh->stop = 1;
	assert_int_equal(harness_wait(m, 120), 0);
	munmap(sh, sizeof(*sh));
}

static int setup(void **state)
{
	static const char *const extra[] = {
		"--host-tier-size",
		"96M",
		"--host-pool-size",
		"32M",
		"--disk-pool-size",
		"0",
		"--max-connections-per-user",
		"8",
		NULL,
	};

	if (geteuid() != 0) {
		print_message("not root: the tenants are uids, skipped\n");
		*state = NULL;
		return 0;
	}
	/* Big blocks the daemon frees go back at once, so its anonymous
	 * memory is what it holds. */
	setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", 1);
	return harness_setup_args(state, extra);
}

static int teardown(void **state)
{
	unsetenv("GLIBC_TUNABLES");
	return *state ? harness_teardown(state) : 0;
}

static void test_bad_neighbour(void **state)
{
	struct harness *h = *state;
	struct shared *sh;
	struct m_arg ma[3], va;
	pid_t m[3], v;
	double solo50, solo99, bes50, bes99;
	long forks_kb;
	kvp_client *admin;

	if (!h)
		skip();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	for (int i = 0; i < 3; i++) {
		ma[i] = (struct m_arg){.h = h, .sh = sh, .role = i};
		m[i] = harness_fork(m_main, &ma[i]);
		assert_true(m[i] > 0);
	}
	va = (struct m_arg){.h = h, .sh = sh};
	v = harness_fork(v_main, &va);
	assert_true(v > 0);
	assert_int_equal(harness_wait(v, 180), 0);
	/* The admin gets in while M holds every connection it may. */
	/* (Its other two processes hold one each.) */
	assert_int_equal(sh->conns_held, PER_USER - 2);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_ping(admin), 0);
	kvp_disconnect(admin);
	sh->stop = 1;
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_wait(m[i], 120), 0);
	assert_true(sh->v_served);

	forks_kb = sh->heap_forked_kb - sh->heap_before_kb;
	solo50 = harness_quantile(sh->solo, N_SOLO, 0.5);
	solo99 = harness_quantile(sh->solo, N_SOLO, 0.99);
	assert_true(sh->n_beside > 20);
	bes50 = harness_quantile(sh->beside, sh->n_beside, 0.5);
	bes99 = harness_quantile(sh->beside, sh->n_beside, 0.99);
	print_message("V's ping alone p50 %.3f ms p99 %.3f ms; beside M p50 %.3f ms p99 %.3f ms "
		      "(%u pings, %llu of M's queries at the cap meanwhile)\n",
		      solo50, solo99, bes50, bes99, sh->n_beside, (unsigned long long)sh->queries);
	print_message("M's %d forks of %u tokens: daemon heap +%ld KiB; M held %d connections\n",
		      N_FORKS, FORK_TOKENS, forks_kb, sh->conns_held);
	/* M was at work while V pinged. */
	assert_true(sh->queries >= 1);
#if defined(KVP_DEBUG_CHECKS) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* Instrumented: a whole-cache check after every one of M's requests
	 * runs on the loop, ASan keeps freed memory in quarantine, TSan
	 * slows everything: the figures measure the instruments. */
	print_message("instrumented build: bounds not checked\n");
#else
	/* The forks cost their page tables (20 bytes a page: 3.2 MiB), not a
	 * copy of the tokens (20 bytes a token: 52 MiB). */
	assert_true(forks_kb < (long)N_FORKS * FORK_TOKENS * 4 / 1024);
	/* As test_fairness: the median under 10 times alone plus 2 ms, p99
	 * under 20 ms or 4 times alone plus 2 ms. */
	assert_true(sh->queries >= 5);
	assert_true(bes50 < 10 * solo50 + 2);
	assert_true(bes99 < (4 * solo99 + 2 > 20 ? 4 * solo99 + 2 : 20));
#endif
	assert_true(harness_daemon_alive(h));
	munmap(sh, sizeof(*sh));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_bad_neighbour, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lease_hog, setup, teardown),
	};

	return cmocka_run_group_tests_name("neighbour", tests, NULL, NULL);
}
