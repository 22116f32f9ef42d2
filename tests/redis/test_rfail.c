/* tests/redis/test_rfail.c — the remote tier's failures seen through the
 * daemons: two real kvpalaced daemons ("machines" A and B, sockets and
 * state directories of their own) on one real 6-node Redis Cluster
 * (rcluster.c). A writes conversations through to the cluster; B, which
 * never saw them, matches them and reads the bytes.
 *
 *  - Slots move while B fetches: with the slots of a conversation's pages
 *    half migrated (the moved keys answer ASK at their old owner), with
 *    slots moved to another master behind B's slot map (MOVED), and with
 *    a child process resharding every page's slot while B matches one
 *    conversation after another. B's matches give the right bytes or a
 *    shorter match (a miss), never wrong bytes; once the slots are still,
 *    B matches every conversation in full.
 *  - A master killed (its replica has every write): B's matches miss or
 *    come back shorter, never wrong; what B holds (pages it fetched, its
 *    own commits) keeps matching; once the replica took over, B matches
 *    the whole conversation again, without a restart, and A's next
 *    conversation reaches B at the first try (A's first writes to the
 *    dead master's slots, on a connection it left or with none, go to
 *    the new master: cluster.c sends them once more).
 *  - The whole cluster stopped: both daemons serve what they hold, A
 *    still caches new conversations, and B's matches of pages it never
 *    had end as misses (each in a child the test waits for, a bounded
 *    wait, never a hang); the counters and `kvpalacectl status` on B say
 *    the nodes are down and the fetches failed. The cluster started again
 *    (empty: the nodes persist nothing): the tier comes back by itself, B
 *    finds A's new pages, and status says the nodes are up.
 *
 * No timing assertions: bounded waits with retries. Skips (77) without
 * redis-server.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "rcluster.h"

#define MODEL "rfail-model"
#define BT    16
/* Conversations of the resharding phase, their pages each. */
#define N_CONV	   10
#define CONV_PAGES 4
#define REMOTE_MS  "300"
#define MAX_KEYS   128

static const struct kvp_layout small = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static struct rcluster rc;
static struct harness a, b;
static char tier_arg[96];
static uint32_t next_seq = 300;
static char keys[MAX_KEYS][RCLUSTER_KEY_MAX];
static char out[16384];

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int start(struct harness *h)
{
	const char *const extra[] = {"--remote-tier",
				     tier_arg,
				     "--remote-tenants",
				     "0=team-a",
				     "--remote-timeout-ms",
				     REMOTE_MS,
				     "--host-pool-size",
				     "16M",
				     NULL};

	return harness_start(h, extra);
}

/* A conversation: its tokens, n of them. */
struct conv {
	uint32_t tokens[8 * BT];
	size_t n;
};

static void conv_new(struct conv *cv, size_t pages)
{
	cv->n = pages * BT;
	harness_tokens(cv->tokens, cv->n, next_seq++, 0);
}

/* Commits cv on h (its full pages go to the cluster). */
static void commit_on(struct harness *h, const struct conv *cv)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, cv->tokens, cv->n, &s), 0);
	kvp_disconnect(c);
}

/* What one match on a daemon gave: tokens matched (-1: a call failed)
 * and rows that differ from what the writer wrote. */
struct seen {
	long long got;
	uint64_t bad;
};

/* Usable in a child (no cmocka). */
static struct seen match_on(struct harness *h, const struct conv *cv)
{
	struct seen r = {-1, 0};
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l;

	if (kvp_connect(h->sock, &c) < 0)
		return r;
	if (kvp_pool_open(c, MODEL, &small, &p) == 0 &&
	    kvp_match_prefix(p, cv->tokens, cv->n, &l) == 0) {
		r.got = (long long)kvp_lease_tokens(l);
		r.bad = r.got ? harness_pkv_check_lease(l, p, cv->tokens, (uint64_t)r.got) : 0;
		kvp_lease_release(l);
	}
	kvp_disconnect(c);
	return r;
}

/* Matches cv on h until it matches in full (up to secs; a page the
 * cluster did not have is not asked for again for 2 s); every answer on
 * the way has right bytes. The last answer. */
static struct seen match_until_full(struct harness *h, const struct conv *cv, double secs)
{
	double end = now_s() + secs;
	struct seen r;

	for (;;) {
		r = match_on(h, cv);
		assert_int_equal(r.bad, 0);
		if (r.got == (long long)cv->n || now_s() > end)
			return r;
		usleep(200000);
	}
}

/* Waits until the cluster holds n page keys (A's writes are
 * asynchronous), then lists them into keys[]. */
static int wait_keys(int n)
{
	double end = now_s() + 10;
	int have = -1;

	while (now_s() < end) {
		have = rcluster_keys(&rc, keys, MAX_KEYS);
		if (have >= n)
			return have;
		usleep(20000);
	}
	return have;
}

/* Commits a new conversation of pages pages on A, again (another one each
 * try) until B matches one in full, up to secs (A's writes are best
 * effort: one that meets a node in its backoff is lost). Returns the
 * tries, or -1; *cv is the last. */
static int reach_b(struct conv *cv, size_t pages, double secs)
{
	double end = now_s() + secs;

	for (int tries = 1; now_s() < end; tries++) {
		conv_new(cv, pages);
		commit_on(&a, cv);
		if (match_until_full(&b, cv, 3).got == (long long)cv->n)
			return tries;
	}
	return -1;
}

/* The daemon's remote figures, as an admin sees them. */
static struct kvp_remote_stats remote_of(struct harness *h)
{
	struct kvp_remote_stats r;
	struct kvp_stats *st;
	kvp_client *c;

	assert_int_equal(kvp_connect(h->admin_sock, &c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_true(st->remote_on && st->remote_client);
	r = st->remote;
	kvp_stats_free(st);
	kvp_disconnect(c);
	return r;
}

/* `kvpalacectl --socket SOCK status` into out; its exit status. */
static int status_of(struct harness *h)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[] = {(char *)bin, "--socket", h->admin_sock, "status", NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, NULL, out, sizeof(out));
}

/* The "remote tier: U nodes up, D down" line of out: 0, or -1. */
static int status_nodes(unsigned int *up, unsigned int *down)
{
	const char *l = strstr(out, "remote tier: ");
	const char *u = l ? strstr(l, " up, ") : NULL;

	if (!u || sscanf(l, "remote tier: %u", up) != 1 || sscanf(u, " up, %u down", down) != 1) {
		fprintf(stderr, "# no remote tier line in:\n%s", out);
		return -1;
	}
	return 0;
}

/* Another master than port (the next one of the slot map's). */
static int other_master(int port)
{
	int m[3];

	assert_int_equal(rcluster_masters(&rc, m), 3);
	for (int i = 0; i < 3; i++)
		if (m[i] == port)
			return m[(i + 1) % 3];
	return m[0];
}

/* The GET of key at port is answered with an error starting with word
 * (MOVED, ASK). */
static int answers(int port, const char *key, const char *word)
{
	redisContext *c = rcluster_connect(port);
	redisReply *r = c ? redisCommand(c, "GET %s", key) : NULL;
	int yes = r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, word, strlen(word));

	if (r)
		freeReplyObject(r);
	if (c)
		redisFree(c);
	return yes;
}

/* The keys of keys[0..n) that are not in old[0..n_old): moved to the
 * front of keys; their count. */
static int new_keys(int n, char (*old)[RCLUSTER_KEY_MAX], int n_old)
{
	int k = 0;

	for (int i = 0; i < n; i++) {
		int seen = 0;

		for (int j = 0; j < n_old && !seen; j++)
			seen = !strcmp(keys[i], old[j]);
		if (!seen)
			memmove(keys[k++], keys[i], RCLUSTER_KEY_MAX);
	}
	return k;
}

/* ---- slots moving ------------------------------------------------------ */

struct reshard {
	int n;
	char (*keys)[RCLUSTER_KEY_MAX];
};

/* In a child: moves the slot of every key to another master, one after
 * another. */
static int reshard_child(void *arg)
{
	struct reshard *rs = arg;

	for (int i = 0; i < rs->n; i++) {
		int from = rcluster_owner(&rc, rs->keys[i]);

		CHILD_CHECK(from > 0);
		CHILD_CHECK_EQ(rcluster_move_slot(&rc, rs->keys[i], from, other_master(from), 1, 1),
			       0);
	}
	return 0;
}

static void test_slots_move(void **state)
{
	static char ask_keys[MAX_KEYS][RCLUSTER_KEY_MAX], all[MAX_KEYS][RCLUSTER_KEY_MAX];
	static struct conv conv[N_CONV];
	struct conv c_ask, c_moved, after;
	int n, n_ask, n_moved, from[8], asked = 0, moved = 0, short_ones = 0;
	struct seen r;

	(void)state;
	assert_int_equal(rcluster_flush(&rc), 0);
	/* ASK: the slots of c_ask's pages migrating, every other key already
	 * on the importing master, when B fetches them. */
	conv_new(&c_ask, 8);
	commit_on(&a, &c_ask);
	n_ask = wait_keys(8);
	assert_int_equal(n_ask, 8);
	memcpy(ask_keys, keys, sizeof(keys[0]) * 8);
	for (int i = 0; i < 8; i++) {
		from[i] = rcluster_owner(&rc, ask_keys[i]);
		assert_true(from[i] > 0);
		assert_int_equal(rcluster_move_slot(&rc, ask_keys[i], from[i],
						    other_master(from[i]), i % 2 == 0, 0),
				 0);
	}
	for (int i = 0; i < 8; i += 2)
		asked += answers(from[i], ask_keys[i], "ASK");
	assert_true(asked >= 1);
	r = match_on(&b, &c_ask);
	assert_int_equal(r.bad, 0);
	assert_int_equal(r.got, 8 * BT);
	/* The migration ends: the rest of the keys go, the slots are the
	 * importing masters' everywhere. */
	for (int i = 0; i < 8; i++)
		assert_int_equal(
			rcluster_move_slot(&rc, ask_keys[i], from[i], other_master(from[i]), 1, 1),
			0);

	/* MOVED: c_moved's slots reassigned behind B's slot map. */
	conv_new(&c_moved, 8);
	commit_on(&a, &c_moved);
	n = wait_keys(16);
	assert_int_equal(n, 16);
	n_moved = new_keys(n, ask_keys, 8);
	assert_int_equal(n_moved, 8);
	for (int i = 0; i < 8; i++) {
		from[i] = rcluster_owner(&rc, keys[i]);
		assert_int_equal(
			rcluster_move_slot(&rc, keys[i], from[i], other_master(from[i]), 1, 1), 0);
		moved += answers(from[i], keys[i], "MOVED");
	}
	assert_int_equal(moved, 8);
	r = match_on(&b, &c_moved);
	assert_int_equal(r.bad, 0);
	assert_int_equal(r.got, 8 * BT);

	/* Resharding while B fetches: a child moves the slot of every page of
	 * N_CONV conversations while B matches them one after another. */
	assert_int_equal(rcluster_flush(&rc), 0);
	for (int i = 0; i < N_CONV; i++) {
		conv_new(&conv[i], CONV_PAGES);
		commit_on(&a, &conv[i]);
	}
	n = wait_keys(N_CONV * CONV_PAGES);
	assert_int_equal(n, N_CONV * CONV_PAGES);
	memcpy(all, keys, sizeof(keys[0]) * (size_t)n);
	{
		struct reshard rs = {n, all};
		pid_t pid = harness_fork(reshard_child, &rs);

		assert_true(pid > 0);
		for (int i = 0; i < N_CONV; i++) {
			r = match_on(&b, &conv[i]);
			assert_int_equal(r.bad, 0);
			assert_true(r.got >= 0 && r.got <= (long long)conv[i].n && r.got % BT == 0);
			short_ones += r.got < (long long)conv[i].n;
		}
		assert_int_equal(harness_wait(pid, 60), 0);
	}
	fprintf(stderr, "# resharding: %d of %d conversations came back short on B\n", short_ones,
		N_CONV);
	/* The slots still: every conversation in full on B, and a new one. */
	for (int i = 0; i < N_CONV; i++)
		assert_int_equal(match_until_full(&b, &conv[i], 15).got, (long long)conv[i].n);
	conv_new(&after, 6);
	commit_on(&a, &after);
	assert_int_equal(wait_keys(N_CONV * CONV_PAGES + 6), N_CONV * CONV_PAGES + 6);
	assert_int_equal(match_until_full(&b, &after, 15).got, 6 * BT);
	assert_true(harness_daemon_alive(&a) && harness_daemon_alive(&b));
}

/* ---- a master killed --------------------------------------------------- */

static void test_master_killed(void **state)
{
	static char held[8][RCLUSTER_KEY_MAX];
	struct conv fetched, own, conv;
	struct kvp_remote_stats before, after;
	pid_t pid_b = b.pid;
	int n, victim = -1;
	struct seen r;

	(void)state;
	assert_int_equal(rcluster_flush(&rc), 0);
	/* What B holds before: pages it fetched, and its own. */
	conv_new(&fetched, 4);
	commit_on(&a, &fetched);
	assert_int_equal(wait_keys(4), 4);
	assert_int_equal(match_until_full(&b, &fetched, 10).got, 4 * BT);
	conv_new(&own, 4);
	commit_on(&b, &own); /* B writes its pages through too */
	assert_int_equal(wait_keys(8), 8);
	memcpy(held, keys, sizeof(held));
	/* The conversation B will look for, on the replicas too. */
	conv_new(&conv, 8);
	commit_on(&a, &conv);
	n = wait_keys(16);
	assert_int_equal(n, 16);
	assert_int_equal(rcluster_wait_replicas(&rc), 0);
	/* A master that serves a page of conv. */
	assert_int_equal(new_keys(n, held, 8), 8);
	victim = rcluster_owner(&rc, keys[0]);
	assert_true(victim > 0);
	before = remote_of(&b);
	assert_int_equal(rcluster_script(&rc, "kill", victim), 0);

	r = match_on(&b, &conv);
	assert_int_equal(r.bad, 0);
	fprintf(stderr, "# master %d killed: B matched %lld of %zu tokens\n", victim, r.got,
		conv.n);
	/* B's local tiers go on. */
	r = match_on(&b, &fetched);
	assert_int_equal(r.bad, 0);
	assert_int_equal(r.got, 4 * BT);
	r = match_on(&b, &own);
	assert_int_equal(r.bad, 0);
	assert_int_equal(r.got, 4 * BT);
	/* The replica takes over: the whole conversation, same daemon. */
	r = match_until_full(&b, &conv, 30);
	assert_int_equal(r.got, 8 * BT);
	assert_int_equal(b.pid, pid_b);
	assert_true(harness_daemon_alive(&b));
	after = remote_of(&b);
	assert_true(after.pages_fetched > before.pages_fetched);
	assert_int_equal(after.corrupt, before.corrupt);
	/* A's next conversation reaches B: A's first writes to the dead
	 * master's slots since the kill find its connection gone, or no
	 * connection at all, and go to the new master. */
	n = reach_b(&conv, 8, 30);
	fprintf(stderr, "# after the failover A's conversation reached B at try %d\n", n);
	assert_int_equal(n, 1);
	/* The old master comes back, as a replica. */
	assert_int_equal(rcluster_script(&rc, "restart", 0), 0);
}

/* ---- the whole cluster stopped ---------------------------------------- */

static struct conv lost;

/* In a child: B's match of a conversation it never had, the cluster
 * down: a miss, not an error and not a hang (the parent's wait is
 * bounded). */
static int miss_child(void *arg)
{
	struct seen r = match_on(&b, arg);

	CHILD_CHECK_EQ(r.got, 0);
	return 0;
}

static void test_cluster_stopped(void **state)
{
	struct conv on_a, on_b, fetched, later;
	struct kvp_remote_stats a0, b0, a1, b1, b2;
	unsigned int up = 0, down = 0;
	struct seen r;
	pid_t pids[3];
	double t0, end;
	int tries;

	(void)state;
	assert_int_equal(rcluster_flush(&rc), 0);
	conv_new(&on_a, 4);
	commit_on(&a, &on_a);
	conv_new(&on_b, 4);
	commit_on(&b, &on_b);
	assert_true(reach_b(&fetched, 4, 30) > 0);
	a0 = remote_of(&a);
	b0 = remote_of(&b);

	assert_int_equal(rcluster_script(&rc, "stop", 0), 0);
	/* Both serve what they hold; A caches a new conversation. */
	r = match_on(&a, &on_a);
	assert_true(r.got == 4 * BT && r.bad == 0);
	r = match_on(&b, &on_b);
	assert_true(r.got == 4 * BT && r.bad == 0);
	r = match_on(&b, &fetched);
	assert_true(r.got == 4 * BT && r.bad == 0);
	conv_new(&lost, 4);
	commit_on(&a, &lost);
	r = match_on(&a, &lost);
	assert_true(r.got == 4 * BT && r.bad == 0);
	/* B: misses, three at once, each ended (bounded wait). */
	t0 = now_s();
	for (int i = 0; i < 3; i++) {
		pids[i] = harness_fork(miss_child, &lost);
		assert_true(pids[i] > 0);
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_wait(pids[i], 10), 0);
	fprintf(stderr, "# cluster down: three misses on B in %.0f ms (remote timeout %s ms)\n",
		(now_s() - t0) * 1e3, REMOTE_MS);
	/* The figures say so. */
	end = now_s() + 10;
	do {
		usleep(100000);
		a1 = remote_of(&a);
		b1 = remote_of(&b);
	} while (a1.write_failures == a0.write_failures && now_s() < end);
	assert_true(a1.write_failures >= a0.write_failures + 4);
	assert_true(b1.fetch_misses > b0.fetch_misses);
	assert_true(b1.timeouts + b1.errors > b0.timeouts + b0.errors);
	assert_true(b1.nodes_down > 0);
	assert_int_equal(b1.pages_fetched, b0.pages_fetched);
	assert_int_equal(status_of(&b), 0);
	assert_int_equal(status_nodes(&up, &down), 0);
	assert_true(down > 0);
	assert_true(harness_daemon_alive(&a) && harness_daemon_alive(&b));

	/* Back, empty: A's pages from now on reach B, by themselves. */
	assert_int_equal(rcluster_script(&rc, "restart", 0), 0);
	tries = reach_b(&later, 4, 30);
	fprintf(stderr, "# cluster back: A's conversation reached B at try %d\n", tries);
	assert_true(tries > 0);
	b2 = remote_of(&b);
	assert_true(b2.pages_fetched >= b1.pages_fetched + 4);
	assert_int_equal(b2.nodes_up, 3);
	assert_int_equal(b2.nodes_down, 0);
	assert_int_equal(status_of(&b), 0);
	assert_int_equal(status_nodes(&up, &down), 0);
	assert_int_equal(up, 3);
	assert_int_equal(down, 0);
	assert_int_equal(b2.corrupt, 0);
}

static int setup(void **state)
{
	(void)state;
	if (rcluster_start_or_skip(&rc) < 0)
		return -1;
	rcluster_tier_arg(&rc, tier_arg, sizeof(tier_arg));
	return start(&a) < 0 || start(&b) < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	int ret = harness_stop(&a);

	(void)state;
	ret |= harness_stop(&b);
	rcluster_stop(&rc);
	return ret ? -1 : 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slots_move),
		cmocka_unit_test(test_master_killed),
		cmocka_unit_test(test_cluster_stopped),
	};

	signal(SIGPIPE, SIG_IGN);
	alarm(280);
	return cmocka_run_group_tests(tests, setup, teardown);
}
