/* tests/integration/test_events.c — KV events, as a router reads them.
 *
 * A subscriber on a connection of its own sees a stored event for exactly
 * each page a writer commits (hash chain linked page to page, the page's
 * tokens, the host tier), a removed event for exactly each page an admin
 * evicts, and a cleared event when the pool is dropped. Another tenant's
 * subscriber sees none of them, only its own pool's. A subscriber that
 * does not read holds back nobody: the writer commits far more pages than
 * the daemon keeps events for, and the subscriber is then told how many it
 * lost, with what it got and what it lost adding up to what happened.
 * Events are kept per tenant: another tenant's flood costs a slow
 * subscriber none of its own, while an admin's subscriber, which sees
 * every tenant's, is told what the flood cost it; at most 32 tenants
 * have events kept at once, and a 33rd is refused with -EDQUOT.
 * kvpalacectl events prints them as they come.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "events-model"
#define BT    16

static const struct kvp_layout small = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads events of pool_id (others are skipped) into out until want of
 * them came, for at most 10 s. Returns how many came; *lost adds up the
 * lost counts. */
static size_t read_events(kvp_client *sub, uint64_t pool_id, struct kvp_event *out, size_t want,
			  uint64_t *lost)
{
	double end = now_s() + 10;
	size_t got = 0;

	*lost = 0;
	while (got < want && now_s() < end) {
		struct kvp_event *ev;
		size_t n;
		uint64_t l;
		int ret = kvp_events_read(sub, 200, &ev, &n, &l);

		assert_true(ret >= 0);
		if (ret == 0)
			continue;
		*lost += l;
		for (size_t i = 0; i < n; i++) {
			if (ev[i].pool_id != pool_id)
				continue;
			if (got < want) {
				out[got] = ev[i];
				out[got].tokens = NULL; /* freed below */
				if (ev[i].n_tokens) {
					uint32_t *t = malloc(ev[i].n_tokens * sizeof(uint32_t));

					assert_non_null(t);
					memcpy(t, ev[i].tokens, ev[i].n_tokens * sizeof(uint32_t));
					out[got].tokens = t;
				}
			}
			got++;
		}
		kvp_events_free(ev);
	}
	return got;
}

/* Commits pages pages into pool p, per of them a session, tokens from
 * seed on. Returns 0 or the first error. */
static int commit_pages(kvp_pool *p, int pages, int per, uint32_t seed)
{
	uint32_t *tokens = malloc((size_t)per * BT * sizeof(uint32_t));
	int ret = tokens ? 0 : -ENOMEM;

	for (int k = 0; !ret && k < pages / per; k++) {
		kvp_session *s;

		harness_tokens(tokens, (size_t)per * BT, seed + (uint32_t)k, 0);
		ret = harness_pkv_commit_session(p, tokens, (size_t)per * BT, &s);
		if (!ret)
			kvp_session_close(s);
	}
	free(tokens);
	return ret;
}

/* Reads stored events (of pool_id only, unless 0) until got and lost add
 * up to want, for at most 20 s, their numbers growing. */
static void read_stored(kvp_client *sub, uint64_t pool_id, uint64_t want, uint64_t *got,
			uint64_t *lost)
{
	double end = now_s() + 20;
	uint64_t last = 0;

	*got = *lost = 0;
	while (*got + *lost < want && now_s() < end) {
		struct kvp_event *ev;
		size_t n;
		uint64_t l;
		int ret = kvp_events_read(sub, 200, &ev, &n, &l);

		assert_true(ret >= 0);
		*lost += l;
		for (size_t i = 0; i < n; i++) {
			if (pool_id)
				assert_int_equal(ev[i].pool_id, pool_id);
			assert_int_equal(ev[i].kind, KVP_EVENT_STORED);
			assert_true(ev[i].seq > last);
			last = ev[i].seq;
			(*got)++;
		}
		kvp_events_free(ev);
	}
	assert_int_equal(*got + *lost, want);
}

static void free_tokens(struct kvp_event *ev, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free((void *)ev[i].tokens);
}

/* Nothing more comes for pool_id within ms. */
static void assert_quiet(kvp_client *sub, uint64_t pool_id, int ms)
{
	double end = now_s() + ms / 1000.0;

	while (now_s() < end) {
		struct kvp_event *ev;
		size_t n;
		uint64_t l;

		assert_true(kvp_events_read(sub, 50, &ev, &n, &l) >= 0);
		for (size_t i = 0; i < n; i++)
			assert_true(ev[i].pool_id != pool_id);
		kvp_events_free(ev);
	}
}

static void test_stored_removed_cleared(void **state)
{
	enum { PAGES = 5, N = PAGES * BT + 5 };
	struct harness *h = *state;
	struct kvp_event ev[PAGES + 1];
	struct kvp_evict_result *er;
	struct kvp_drop_pool_result dr;
	uint32_t tokens[N];
	kvp_client *c, *sub, *adm;
	kvp_session *s;
	kvp_pool *p;
	uint64_t next, lost, pool_id;

	harness_tokens(tokens, N, 70, 0);
	assert_int_equal(kvp_connect(h->sock, &sub), 0);
	assert_int_equal(kvp_events_subscribe(sub, 0, &next), 0);
	assert_true(next >= 1);
	assert_int_equal(kvp_events_subscribe(sub, 0, NULL), -EEXIST);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	pool_id = kvp_pool_id(p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N, &s), 0);

	/* One stored event a full page, in order, chained, with its tokens. */
	assert_int_equal(read_events(sub, pool_id, ev, PAGES, &lost), PAGES);
	assert_int_equal(lost, 0);
	for (int i = 0; i < PAGES; i++) {
		assert_int_equal(ev[i].kind, KVP_EVENT_STORED);
		assert_int_equal(ev[i].tier, KVP_TIER_HOST);
		assert_int_equal(ev[i].block_tokens, BT);
		assert_int_equal(ev[i].has_parent, i > 0);
		if (i) {
			assert_true(ev[i].seq > ev[i - 1].seq);
			assert_memory_equal(ev[i].parent, ev[i - 1].hash, 16);
			assert_memory_not_equal(ev[i].hash, ev[i - 1].hash, 16);
		}
		assert_int_equal(ev[i].n_tokens, BT);
		assert_memory_equal(ev[i].tokens, tokens + i * BT, BT * sizeof(uint32_t));
	}
	/* The partial last page is no event; neither is the same prefix
	 * committed again (it shares the pages). */
	{
		kvp_session *s2;

		assert_int_equal(harness_pkv_commit_session(p, tokens, N, &s2), 0);
		assert_quiet(sub, pool_id, 300);
		kvp_session_close(s2);
	}
	kvp_session_close(s);

	/* Evicted pages: a removed event for each, no other. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_admin_evict_flags(adm, KVP_TIER_HOST, pool_id, KVP_EVICT_ALL, 0,
					       KVP_EVICT_DISCARD, &er),
			 0);
	free(er);
	{
		struct kvp_event rm[PAGES];
		int seen[PAGES] = {0};

		assert_int_equal(read_events(sub, pool_id, rm, PAGES, &lost), PAGES);
		for (int i = 0; i < PAGES; i++) {
			int j;

			assert_int_equal(rm[i].kind, KVP_EVENT_REMOVED);
			assert_int_equal(rm[i].n_tokens, 0);
			for (j = 0; j < PAGES; j++)
				if (!memcmp(rm[i].hash, ev[j].hash, 16))
					break;
			assert_true(j < PAGES);
			assert_false(seen[j]);
			seen[j] = 1;
		}
		/* Leaves first: the last page goes before its parent. */
		assert_memory_equal(rm[0].hash, ev[PAGES - 1].hash, 16);
		free_tokens(rm, PAGES);
	}
	assert_quiet(sub, pool_id, 200);
	free_tokens(ev, PAGES);

	/* The pool's end. */
	kvp_disconnect(c);
	assert_int_equal(kvp_admin_drop_pool(adm, pool_id, 0, &dr), 0);
	assert_int_equal(read_events(sub, pool_id, ev, 1, &lost), 1);
	assert_int_equal(ev[0].kind, KVP_EVENT_CLEARED);
	kvp_disconnect(adm);
	kvp_disconnect(sub);
}

struct two {
	struct harness *h;
	int to_child[2], to_parent[2];
};

/* In a child: reads want stored events, all of pool_id, numbered next,
 * next + 1, ... with none lost, for at most 20 s. Returns 0, or 1 (said
 * on stderr). */
static int child_read_own(kvp_client *sub, uint64_t pool_id, uint64_t next, size_t want)
{
	double end = now_s() + 20;
	size_t mine = 0;

	while (mine < want && now_s() < end) {
		struct kvp_event *ev;
		size_t n;
		uint64_t lost;
		int ret = kvp_events_read(sub, 200, &ev, &n, &lost);

		CHILD_CHECK(ret >= 0);
		CHILD_CHECK_EQ(lost, 0);
		for (size_t i = 0; i < n; i++) {
			CHILD_CHECK_EQ(ev[i].pool_id, pool_id);
			CHILD_CHECK_EQ(ev[i].kind, KVP_EVENT_STORED);
			CHILD_CHECK_EQ(ev[i].seq, next + mine);
			mine++;
		}
		kvp_events_free(ev);
	}
	CHILD_CHECK_EQ(mine, want);
	return 0;
}

/* Subscribes as nobody, lets the parent commit more pages than the daemon
 * keeps events for, commits into a pool of its own and checks it sees its
 * own pages and nothing of the parent's: not their events, not a gap in
 * its numbers, not a count of lost events (all three would tell it how
 * busy another tenant is). */
static int other_tenant(void *arg)
{
	struct two *t = arg;
	uint32_t tokens[2 * BT];
	kvp_client *sub, *c;
	kvp_session *s;
	kvp_pool *p;
	uint64_t next;
	char b = 0;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &sub), 0);
	CHILD_CHECK_EQ(kvp_events_subscribe(sub, 0, &next), 0);
	CHILD_CHECK_EQ(write(t->to_parent[1], &b, 1), 1);
	CHILD_CHECK_EQ(read(t->to_child[0], &b, 1), 1); /* the parent committed */
	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &small, &p), 0);
	harness_tokens(tokens, 2 * BT, 71, 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, tokens, 2 * BT, &s), 0);
	/* The parent's events came first; none may show. */
	CHILD_CHECK_EQ(child_read_own(sub, kvp_pool_id(p), next, 2), 0);
	kvp_disconnect(c);
	kvp_disconnect(sub);
	return 0;
}

/* Runs child (a tenant of its own) and, once it says it is ready,
 * commits pages pages as root in a pool of root's, then tells it and
 * waits for its verdict. */
static void flood_beside(struct two *t, int (*child)(void *), int pages, uint32_t seed)
{
	kvp_client *c;
	kvp_pool *p;
	pid_t pid;
	char b = 0;

	assert_int_equal(pipe(t->to_child), 0);
	assert_int_equal(pipe(t->to_parent), 0);
	pid = harness_fork(child, t);
	assert_true(pid > 0);
	assert_int_equal(read(t->to_parent[0], &b, 1), 1);
	assert_int_equal(kvp_connect(t->h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(commit_pages(p, pages, 250, seed), 0);
	assert_int_equal(write(t->to_child[1], &b, 1), 1);
	assert_int_equal(harness_wait(pid, 60), 0);
	kvp_disconnect(c);
	for (int i = 0; i < 2; i++) {
		close(t->to_child[i]);
		close(t->to_parent[i]);
	}
}

static void test_other_tenant_sees_nothing(void **state)
{
	struct two t = {.h = *state};

	flood_beside(&t, other_tenant, 20000, 2000);
}

enum { SLOW_PAGES = 8000, FLOOD_PAGES = 20000 };

/* Tenant A, as nobody: subscribes, commits SLOW_PAGES pages without
 * reading (far more than its socket holds, so most of its events wait in
 * the daemon), lets the parent flood, and only then reads: every one of
 * its events, numbered without a gap, none lost. */
static int slow_tenant(void *arg)
{
	struct two *t = arg;
	kvp_client *sub, *c;
	kvp_pool *p;
	uint64_t next;
	char b = 0;

	CHILD_CHECK_EQ(harness_become_nobody(), 0);
	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &sub), 0);
	CHILD_CHECK_EQ(kvp_events_subscribe(sub, 0, &next), 0);
	CHILD_CHECK_EQ(kvp_connect(t->h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &small, &p), 0);
	CHILD_CHECK_EQ(commit_pages(p, SLOW_PAGES, 250, 5000), 0);
	CHILD_CHECK_EQ(write(t->to_parent[1], &b, 1), 1);
	CHILD_CHECK_EQ(read(t->to_child[0], &b, 1), 1); /* the parent flooded */
	CHILD_CHECK_EQ(child_read_own(sub, kvp_pool_id(p), next, SLOW_PAGES), 0);
	kvp_disconnect(c);
	kvp_disconnect(sub);
	return 0;
}

/* One tenant's flood cannot starve another's subscriber: while tenant A
 * (nobody) has thousands of events waiting unread, tenant B (root, on the
 * client socket) commits more pages than a ring keeps events for, and A
 * still gets all of its own. An admin subscriber that did not read
 * either sees every tenant's events, so it lost some to the flood, and
 * is told how many: what it got and what it lost add up to both tenants'
 * pages. */
static void test_flood_spares_other_tenant(void **state)
{
	struct two t = {.h = *state};
	uint64_t got, lost;
	kvp_client *adm;

	assert_int_equal(kvp_connect(t.h->admin_sock, &adm), 0);
	assert_int_equal(kvp_events_subscribe(adm, 0, NULL), 0);
	flood_beside(&t, slow_tenant, FLOOD_PAGES, 3000);
	/* Only stored events: A's pool is not dropped while its
	 * connection's end is on the way, its pages stay. */
	read_stored(adm, 0, SLOW_PAGES + FLOOD_PAGES, &got, &lost);
	assert_true(lost > 0);
	kvp_disconnect(adm);
}

/* At most KV_EVENTS_MAX_TENANTS (32) tenants have events kept for them at
 * once: a subscriber of a 33rd is refused with -EDQUOT, one more of a
 * tenant that subscribes already is not, and the refused one gets in once
 * a tenant's last subscriber left. Connections made with another
 * effective uid are the daemon's peers of that uid. */
static int many_tenants(void *arg)
{
	enum { MAX = 32, BASE = 41000 };
	struct harness *h = arg;
	kvp_client *sub[MAX + 2];
	int ret = -EDQUOT;
	double end;

	for (int i = 0; i <= MAX; i++) {
		CHILD_CHECK_EQ(setresuid(-1, BASE + i, -1), 0);
		CHILD_CHECK_EQ(kvp_connect(h->sock, &sub[i]), 0);
		CHILD_CHECK_EQ(setresuid(-1, 0, -1), 0);
		CHILD_CHECK_EQ(kvp_events_subscribe(sub[i], 0, NULL), i < MAX ? 0 : -EDQUOT);
	}
	kvp_disconnect(sub[MAX]);
	CHILD_CHECK_EQ(setresuid(-1, BASE, -1), 0);
	CHILD_CHECK_EQ(kvp_connect(h->sock, &sub[MAX + 1]), 0);
	CHILD_CHECK_EQ(setresuid(-1, 0, -1), 0);
	CHILD_CHECK_EQ(kvp_events_subscribe(sub[MAX + 1], 0, NULL), 0);
	kvp_disconnect(sub[MAX + 1]);
	kvp_disconnect(sub[0]); /* uid BASE's last subscriber */
	end = now_s() + 10;
	while (ret == -EDQUOT && now_s() < end) {
		CHILD_CHECK_EQ(setresuid(-1, BASE + MAX, -1), 0);
		CHILD_CHECK_EQ(kvp_connect(h->sock, &sub[MAX]), 0);
		CHILD_CHECK_EQ(setresuid(-1, 0, -1), 0);
		ret = kvp_events_subscribe(sub[MAX], 0, NULL);
		if (ret == -EDQUOT) {
			kvp_disconnect(sub[MAX]);
			usleep(20 * 1000); /* the daemon has yet to see sub[0] go */
		}
	}
	CHILD_CHECK_EQ(ret, 0);
	for (int i = 1; i <= MAX; i++)
		kvp_disconnect(sub[i]);
	return 0;
}

static void test_tenant_cap(void **state)
{
	struct harness *h = *state;
	kvp_client *adm;
	pid_t pid;

	/* The admin's ring of every event is no tenant's: not counted. */
	assert_int_equal(kvp_connect(h->admin_sock, &adm), 0);
	assert_int_equal(kvp_events_subscribe(adm, 0, NULL), 0);
	pid = harness_fork(many_tenants, h);
	assert_true(pid > 0);
	assert_int_equal(harness_wait(pid, 60), 0);
	kvp_disconnect(adm);
}

/* A subscriber that never reads while far more pages than the daemon
 * keeps events for are committed: the writer is not held back, and the
 * subscriber learns how many it lost. */
static void test_slow_subscriber_loses_oldest(void **state)
{
	enum { PAGES = 20000, PER = 256 };
	struct harness *h = *state;
	uint64_t got, lost;
	kvp_client *c, *sub;
	kvp_pool *p;

	assert_int_equal(kvp_connect(h->sock, &sub), 0);
	assert_int_equal(kvp_events_subscribe(sub, 0, NULL), 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &small, &p), 0);
	assert_int_equal(commit_pages(p, PAGES, PER, 1000), 0);
	/* The pages stay indexed (nothing evicted them): every event is a
	 * stored one, PAGES of them, got or lost. */
	read_stored(sub, kvp_pool_id(p), (PAGES / PER) * PER, &got, &lost);
	assert_true(lost > 0);
	assert_true(got >= 16384 / 2); /* the ring's worth, less what went meanwhile */
	kvp_disconnect(c);
	kvp_disconnect(sub);
}

/* A subscribed connection is for events; a client that did not subscribe
 * cannot read any. */
static void test_misuse(void **state)
{
	struct harness *h = *state;
	struct kvp_event *ev;
	size_t n;
	uint64_t lost;
	kvp_client *c;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_events_read(c, 0, &ev, &n, &lost), -EINVAL);
	assert_int_equal(kvp_events_subscribe(c, 987654321, NULL), -ENOENT);
	assert_int_equal(kvp_events_subscribe(c, 0, NULL), 0);
	assert_int_equal(kvp_events_read(c, 0, &ev, &n, &lost), 0);
	/* Its replies would be mixed with pushes: refused, nothing sent. */
	assert_int_equal(kvp_ping(c), -EBUSY);
	assert_int_equal(kvp_events_read(c, 0, &ev, &n, &lost), 0);
	kvp_disconnect(c);
}

/* Commits two pages a moment after starting, for kvpalacectl to see. */
static int late_writer(void *arg)
{
	struct harness *h = arg;
	uint32_t tokens[2 * BT];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	usleep(500 * 1000);
	harness_tokens(tokens, 2 * BT, 73, 0);
	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &small, &p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, tokens, 2 * BT, &s), 0);
	kvp_disconnect(c);
	return 0;
}

/* kvpalacectl events follows them as an admin would: one JSON object a
 * line, stopping after --count events. */
static void test_ctl_events(void **state)
{
	struct harness *h = *state;
	const char *bin = getenv("KVPALACECTL");
	static char out[8192];
	char *argv[] = {(char *)bin, "--socket", h->admin_sock, "--json",
			"events",    "--count",	 "2",		NULL};
	const char *l2;
	pid_t pid;

	assert_non_null(bin);
	pid = harness_fork(late_writer, h);
	assert_true(pid > 0);
	if (harness_run_capture(argv, NULL, out, sizeof(out)) != 0)
		fail_msg("kvpalacectl events: %s", out);
	assert_int_equal(harness_wait(pid, 30), 0);
	assert_non_null(strstr(out, "\"kind\":\"stored\""));
	l2 = strchr(out, '\n');
	assert_non_null(l2);
	assert_non_null(strstr(l2 + 1, "\"parent\":"));
	assert_non_null(strchr(l2 + 1, '\n'));
	assert_null(strchr(strchr(l2 + 1, '\n') + 1, '\n')); /* two lines, no more */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stored_removed_cleared, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_other_tenant_sees_nothing, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_slow_subscriber_loses_oldest, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_flood_spares_other_tenant, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_tenant_cap, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_misuse, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_ctl_events, harness_setup, harness_teardown),
	};

	return cmocka_run_group_tests_name("events", tests, NULL, NULL);
}
