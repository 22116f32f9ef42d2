/* tests/redis/test_remote.c — the remote tier (daemon/remote/) against a
 * real 6-node Redis Cluster started for the run (rcluster.c): pages put
 * and fetched through remote_put/remote_get on a real loop from several
 * threads, the value cap, bounded in-flight memory, corrupt values, tenant
 * scopes, credentials, MOVED and ASK while a slot moves, a master killed
 * (failover), the whole cluster down and back. Skips (77) without
 * redis-server. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "loop.h"
#include "rcluster.h"
#include "remote.h"
#include "slots.h"

#define TIMEOUT_MS 500u
#define BACKOFF_MS 200u
#define MAX_PAGE   (256u << 10)

static struct rcluster rc;
static struct loop loop;
static int n_done, want_done, in_submit, reentrant;

static char seed0[32], seed1[32];
static const char *const seeds[] = {seed0, seed1};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void on_done(struct remote_req *req)
{
	(void)req;
	if (in_submit)
		reentrant = 1;
	if (++n_done >= want_done)
		loop_stop(&loop);
}

/* Turns the loop until n more done() calls came. */
static void wait_done(int n)
{
	want_done = n_done + n;
	if (n_done >= want_done)
		return;
	loop.stop = 0;
	assert_int_equal(loop_run(&loop), 0);
	assert_int_equal(n_done, want_done);
	assert_int_equal(reentrant, 0);
}

static int start_remote(struct remote *r, const char *user, const char *pw, unsigned int threads,
			uint64_t max_inflight)
{
	struct remote_config cfg = {
		.nodes = seeds,
		.n_nodes = 2,
		.user = user,
		.password = pw,
		.timeout_ms = TIMEOUT_MS,
		.backoff_ms = BACKOFF_MS,
		.threads = threads,
		.max_inflight_bytes = max_inflight,
		.max_page_bytes = MAX_PAGE,
		.expiry_ms = 600000,
	};

	return remote_init(r, &loop, &cfg);
}

static void ident(struct remote_identity *id, const char *tenant, uint8_t pool)
{
	remote_scope_digest(tenant, id->scope);
	memset(id->pool, pool, sizeof(id->pool));
}

static void fill(void *buf, size_t n, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

static void chain_of(uint8_t chain[16], uint64_t n)
{
	memset(chain, 0, 16);
	memcpy(chain, &n, sizeof(n));
	chain[15] = 0xa5;
}

/* One request of n pages (chains base..base+n-1, sizes from size()),
 * buffers allocated; put fills them. */
struct batch {
	struct remote_req req;
	struct remote_page pages[REMOTE_MAX_PAGES];
};

static size_t page_size(uint64_t n)
{
	return 1024 + (size_t)(n * 7919 % (60 * 1024));
}

static void batch_init(struct batch *b, const struct remote_identity *id, uint64_t base,
		       unsigned int n, int filled)
{
	memset(b, 0, sizeof(*b));
	b->req.id = *id;
	b->req.pages = b->pages;
	b->req.n_pages = n;
	b->req.done = on_done;
	for (unsigned int i = 0; i < n; i++) {
		chain_of(b->pages[i].chain, base + i);
		b->pages[i].bytes = page_size(base + i);
		b->pages[i].buf = calloc(1, b->pages[i].bytes);
		assert_non_null(b->pages[i].buf);
		if (filled)
			fill(b->pages[i].buf, b->pages[i].bytes, base + i);
	}
}

static void batch_free(struct batch *b)
{
	for (unsigned int i = 0; i < b->req.n_pages; i++)
		free(b->pages[i].buf);
}

static void submit(struct remote *r, struct batch *b, int put)
{
	in_submit = 1;
	assert_int_equal(put ? remote_put(r, &b->req) : remote_get(r, &b->req), 0);
	in_submit = 0;
}

/* Puts and waits; every page stored. */
static void put_pages(struct remote *r, const struct remote_identity *id, uint64_t base,
		      unsigned int n)
{
	struct batch *b = malloc(sizeof(*b));

	batch_init(b, id, base, n, 1);
	submit(r, b, 1);
	wait_done(1);
	for (unsigned int i = 0; i < n; i++)
		assert_int_equal(b->pages[i].result, REMOTE_HIT);
	batch_free(b);
	free(b);
}

/* Gets and waits: how many pages came back, each checked byte for byte. */
static unsigned int get_pages(struct remote *r, const struct remote_identity *id, uint64_t base,
			      unsigned int n, int *ret_why)
{
	struct batch *b = malloc(sizeof(*b));
	unsigned int hits = 0;

	batch_init(b, id, base, n, 0);
	submit(r, b, 0);
	wait_done(1);
	for (unsigned int i = 0; i < n; i++) {
		if (ret_why)
			*ret_why = b->pages[i].why;
		if (b->pages[i].result != REMOTE_HIT)
			continue;
		void *want = malloc(b->pages[i].bytes);
		fill(want, b->pages[i].bytes, base + i);
		assert_memory_equal(b->pages[i].buf, want, b->pages[i].bytes);
		free(want);
		hits++;
	}
	batch_free(b);
	free(b);
	return hits;
}

static redisReply *cmd(int port, const char *fmt, ...)
{
	redisContext *c = rcluster_connect(port);
	redisReply *r;
	va_list ap;

	assert_non_null(c);
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	redisFree(c);
	assert_non_null(r);
	return r;
}

static void cmd_ok(int port, const char *fmt, const char *a, const char *b)
{
	redisReply *r = cmd(port, fmt, a, b);

	if (r->type == REDIS_REPLY_ERROR)
		fail_msg("%d: %s: %s", port, fmt, r->str);
	freeReplyObject(r);
}

static void page_key(const struct remote_identity *id, uint64_t n, char key[REMOTE_KEY_BYTES])
{
	uint8_t chain[16];

	chain_of(chain, n);
	remote_key(id, chain, key);
}

/* ---- tests ------------------------------------------------------------- */

/* Our slot function agrees with the server's CLUSTER KEYSLOT. */
static void test_keyslot(void **state)
{
	(void)state;
	for (int i = 0; i < 200; i++) {
		char key[64];
		redisReply *r;

		snprintf(key, sizeof(key), i % 3 ? "k%d:{t%d}x" : "{}%d-%d", i, i * 31);
		r = cmd(rc.base, "CLUSTER KEYSLOT %s", key);
		assert_int_equal(r->type, REDIS_REPLY_INTEGER);
		assert_int_equal(r->integer, slots_key_slot(key, strlen(key)));
		freeReplyObject(r);
	}
}

/* 64 requests of 8 pages from 4 threads at once, over every master. */
static void test_many(void **state)
{
	enum { N_REQ = 64, PER = 8 };
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	struct batch *b = calloc(N_REQ, sizeof(*b));
	int masters[3], seen[3] = {0}, n_m;
	uint64_t bytes = 0;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 4, 64u << 20), 0);
	ident(&id, "alice", 1);
	for (int i = 0; i < N_REQ; i++) {
		batch_init(&b[i], &id, 1000 + (uint64_t)i * PER, PER, 1);
		submit(&r, &b[i], 1);
	}
	wait_done(N_REQ);
	for (int i = 0; i < N_REQ; i++) {
		for (int k = 0; k < PER; k++) {
			assert_int_equal(b[i].pages[k].result, REMOTE_HIT);
			bytes += b[i].pages[k].bytes + REMOTE_HEADER_BYTES;
		}
		batch_free(&b[i]);
	}
	for (int i = 0; i < N_REQ; i++) {
		batch_init(&b[i], &id, 1000 + (uint64_t)i * PER, PER, 0);
		submit(&r, &b[i], 0);
	}
	wait_done(N_REQ);
	n_m = rcluster_masters(&rc, masters);
	assert_int_equal(n_m, 3);
	for (int i = 0; i < N_REQ; i++) {
		for (int k = 0; k < PER; k++) {
			struct remote_page *pg = &b[i].pages[k];
			char key[REMOTE_KEY_BYTES];
			void *want = malloc(pg->bytes);
			int owner;

			assert_int_equal(pg->result, REMOTE_HIT);
			fill(want, pg->bytes, 1000 + (uint64_t)i * PER + k);
			assert_memory_equal(pg->buf, want, pg->bytes);
			free(want);
			if (k == 0) {
				page_key(&id, 1000 + (uint64_t)i * PER, key);
				owner = rcluster_owner(&rc, key);
				for (int m = 0; m < 3; m++)
					seen[m] |= owner == masters[m];
			}
		}
		batch_free(&b[i]);
	}
	assert_true(seen[0] && seen[1] && seen[2]);
	remote_stats(&r, &st);
	assert_int_equal(st.puts, N_REQ * PER);
	assert_int_equal(st.stored, N_REQ * PER);
	assert_int_equal(st.gets, N_REQ * PER);
	assert_int_equal(st.hits, N_REQ * PER);
	assert_int_equal(st.misses, 0);
	assert_int_equal(st.corrupt, 0);
	assert_int_equal(st.bytes_out, bytes);
	assert_int_equal(st.bytes_in, bytes);
	assert_int_equal(st.inflight_bytes, 0);
	assert_int_equal(st.nodes_up, 3);
	assert_int_equal(st.nodes_down, 0);
	remote_fini(&r);
	free(b);
}

/* The same chain hash under another tenant's scope, or another pool, is
 * not found; a value copied under another scope's key does not verify. */
static void test_scopes(void **state)
{
	struct remote r;
	struct remote_identity alice, bob, other_pool;
	struct remote_stats st;
	char ka[REMOTE_KEY_BYTES], kb[REMOTE_KEY_BYTES];
	redisReply *v, *s;
	int why = -1;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 2, 64u << 20), 0);
	ident(&alice, "alice", 2);
	ident(&bob, "bob", 2);
	ident(&other_pool, "alice", 3);
	put_pages(&r, &alice, 5000, 4);
	assert_int_equal(get_pages(&r, &alice, 5000, 4, NULL), 4);
	assert_int_equal(get_pages(&r, &bob, 5000, 4, &why), 0);
	assert_int_equal(why, CLUSTER_MISS);
	assert_int_equal(get_pages(&r, &other_pool, 5000, 4, &why), 0);
	assert_int_equal(why, CLUSTER_MISS);
	/* The key holds no bare uid, only digests. */
	page_key(&alice, 5000, ka);
	assert_int_equal(strncmp(ka, "kvp:", 4), 0);
	assert_int_equal(strlen(ka), REMOTE_KEY_BYTES - 1);
	/* Alice's value planted under Bob's key: its identity says alice. */
	page_key(&bob, 5000, kb);
	v = cmd(rcluster_owner(&rc, ka), "GET %s", ka);
	assert_int_equal(v->type, REDIS_REPLY_STRING);
	s = cmd(rcluster_owner(&rc, kb), "SET %s %b", kb, v->str, v->len);
	assert_int_equal(s->type, REDIS_REPLY_STATUS);
	freeReplyObject(s);
	freeReplyObject(v);
	assert_int_equal(get_pages(&r, &bob, 5000, 1, &why), 0);
	assert_int_equal(why, CLUSTER_RESULT_COUNT);
	remote_stats(&r, &st);
	assert_int_equal(st.corrupt, 1);
	remote_fini(&r);
}

/* The key and the value header are what remote.h documents. */
static void test_format(void **state)
{
	struct remote r;
	struct remote_identity id;
	char key[REMOTE_KEY_BYTES];
	const unsigned char *v;
	redisReply *x;

	(void)state;
	memset(&id, 0, sizeof(id));
	memset(id.scope, 0xab, 16);
	memset(id.pool, 0x01, 16);
	page_key(&id, 0x0102, key);
	assert_string_equal(key, "kvp:abababababababababababababababab:"
				 "01010101010101010101010101010101:"
				 "020100000000000000000000000000a5");
	assert_int_equal(start_remote(&r, NULL, NULL, 1, 16u << 20), 0);
	put_pages(&r, &id, 0x0102, 1);
	x = cmd(rcluster_owner(&rc, key), "GET %s", key);
	assert_int_equal(x->type, REDIS_REPLY_STRING);
	assert_int_equal(x->len, REMOTE_HEADER_BYTES + page_size(0x0102));
	v = (const unsigned char *)x->str;
	assert_memory_equal(v, "KVPR", 4);
	assert_int_equal(v[4] | v[5] << 8, REMOTE_VERSION);
	assert_int_equal(v[6] | v[7] << 8, REMOTE_HEADER_BYTES);
	assert_memory_equal(v + 8, id.scope, 16);
	assert_memory_equal(v + 24, id.pool, 16);
	assert_int_equal(v[40], 0x02);
	assert_int_equal(v[41], 0x01);
	assert_int_equal(v[55], 0xa5);
	assert_int_equal(v[56] | v[57] << 8 | v[58] << 16, page_size(0x0102));
	freeReplyObject(x);
	/* The expiry is set (the cluster is a cache). */
	x = cmd(rcluster_owner(&rc, key), "PTTL %s", key);
	assert_int_equal(x->type, REDIS_REPLY_INTEGER);
	assert_true(x->integer > 0 && x->integer <= 600000);
	freeReplyObject(x);
	remote_fini(&r);
}

/* A value damaged in the cluster is a miss and counts as corrupt. */
static void test_corrupt(void **state)
{
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	char key[REMOTE_KEY_BYTES];
	redisReply *x;
	int owner;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 2, 64u << 20), 0);
	ident(&id, "carol", 4);
	put_pages(&r, &id, 6000, 1);
	page_key(&id, 6000, key);
	owner = rcluster_owner(&rc, key);
	/* One payload byte. */
	x = cmd(owner, "SETRANGE %s %d %s", key, REMOTE_HEADER_BYTES + 100, "Z");
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 0);
	/* One header byte (the version). */
	put_pages(&r, &id, 6000, 1);
	x = cmd(owner, "SETRANGE %s %d %s", key, 4, "\x07");
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 0);
	/* Garbage, and a value cut short. */
	x = cmd(owner, "SET %s %s", key, "garbage");
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 0);
	put_pages(&r, &id, 6000, 1);
	x = cmd(owner, "SETRANGE %s %d %s", key, 0, "");
	freeReplyObject(x);
	x = cmd(owner, "GETRANGE %s 0 %d", key, REMOTE_HEADER_BYTES + 10);
	assert_int_equal(x->type, REDIS_REPLY_STRING);
	{
		redisReply *y = cmd(owner, "SET %s %b", key, x->str, x->len);

		freeReplyObject(y);
	}
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 0);
	/* A list under the key: a reply of the wrong type. */
	x = cmd(owner, "DEL %s", key);
	freeReplyObject(x);
	x = cmd(owner, "RPUSH %s a b", key);
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 0);
	remote_stats(&r, &st);
	assert_int_equal(st.corrupt, 4);
	assert_int_equal(st.errors[CLUSTER_ERR_REPLY], 1);
	assert_int_equal(st.hits, 0);
	/* Stored again, served again. */
	x = cmd(owner, "DEL %s", key);
	freeReplyObject(x);
	put_pages(&r, &id, 6000, 1);
	assert_int_equal(get_pages(&r, &id, 6000, 1, NULL), 1);
	remote_fini(&r);
}

/* Pages above the cap are refused; a value above it in the cluster is an
 * error, never read into the page. */
static void test_cap(void **state)
{
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	struct batch *b = malloc(sizeof(*b));
	char key[REMOTE_KEY_BYTES];
	size_t big = MAX_PAGE + REMOTE_HEADER_BYTES + 1;
	char *val = calloc(1, big);
	redisReply *x;
	int why = -1;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 1, 64u << 20), 0);
	ident(&id, "dave", 5);
	batch_init(b, &id, 7000, 1, 1);
	free(b->pages[0].buf);
	b->pages[0].bytes = MAX_PAGE + 1;
	b->pages[0].buf = calloc(1, MAX_PAGE + 1);
	assert_int_equal(remote_put(&r, &b->req), -EINVAL);
	assert_int_equal(remote_get(&r, &b->req), -EINVAL);
	batch_free(b);
	page_key(&id, 7000, key);
	x = cmd(rcluster_owner(&rc, key), "SET %s %b", key, val, big);
	freeReplyObject(x);
	assert_int_equal(get_pages(&r, &id, 7000, 1, &why), 0);
	assert_int_equal(why, CLUSTER_ERR_TOOBIG);
	remote_stats(&r, &st);
	assert_int_equal(st.errors[CLUSTER_ERR_TOOBIG], 1);
	assert_int_equal(st.misses, 1);
	remote_fini(&r);
	free(val);
	free(b);
}

/* Beyond max-inflight bytes puts are dropped and gets answered as misses,
 * through done on a later turn, never from inside the call. */
static void test_inflight(void **state)
{
	enum { N = 16 };
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	struct batch *b = calloc(N, sizeof(*b));

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 1, 200u << 10), 0);
	ident(&id, "erin", 6);
	for (int i = 0; i < N; i++) {
		batch_init(&b[i], &id, 8000 + (uint64_t)i * 4, 4, 1);
		submit(&r, &b[i], 1);
	}
	remote_stats(&r, &st);
	assert_true(st.dropped_puts > 0);
	assert_true(st.inflight_bytes <= 200u << 10);
	wait_done(N);
	for (int i = 0; i < N; i++)
		batch_free(&b[i]);
	for (int i = 0; i < N; i++) {
		batch_init(&b[i], &id, 8000 + (uint64_t)i * 4, 4, 0);
		submit(&r, &b[i], 0);
	}
	wait_done(N);
	remote_stats(&r, &st);
	assert_true(st.dropped_gets > 0);
	assert_int_equal(st.stored + st.dropped_puts, N * 4);
	assert_int_equal(st.hits + st.misses, N * 4);
	assert_int_equal(st.inflight_bytes, 0);
	for (int i = 0; i < N; i++)
		batch_free(&b[i]);
	free(b);
	remote_fini(&r);
}

/* ACL credentials: wrong ones stop init with a clear reason. */
static void test_auth(void **state)
{
	struct remote r;
	struct remote_identity id;

	(void)state;
	for (int i = 0; i < RCLUSTER_NODES; i++)
		cmd_ok(rc.base + i, "ACL SETUSER kvp on >s3cret ~* &* +@all%s%s", "", "");
	assert_int_equal(start_remote(&r, "kvp", "wrong", 1, 1u << 20), -EACCES);
	assert_non_null(strstr(remote_why(&r), "AUTH refused"));
	assert_non_null(strstr(remote_why(&r), "WRONGPASS"));
	remote_fini(&r);
	assert_int_equal(start_remote(&r, "nobody", "s3cret", 1, 1u << 20), -EACCES);
	remote_fini(&r);
	assert_int_equal(start_remote(&r, "kvp", "s3cret", 2, 16u << 20), 0);
	assert_string_equal(remote_why(&r), "");
	ident(&id, "frank", 7);
	put_pages(&r, &id, 9000, 8);
	assert_int_equal(get_pages(&r, &id, 9000, 8, NULL), 8);
	remote_fini(&r);
}

/* A chain whose key is served by port want_not's master... any: the
 * first chain >= from whose key lives on owner != avoid. */
static uint64_t chain_on(const struct remote_identity *id, uint64_t from, int *ret_owner)
{
	char key[REMOTE_KEY_BYTES];

	page_key(id, from, key);
	*ret_owner = rcluster_owner(&rc, key);
	assert_true(*ret_owner > 0);
	return from;
}

static int other_master(int port)
{
	int m[3];

	assert_int_equal(rcluster_masters(&rc, m), 3);
	return m[0] != port ? m[0] : m[1];
}

/* Moves key's slot from port a to port b; migrate: the key too; final:
 * the slot assigned to b everywhere. */
static void move_slot(const char *key, int a, int b, int final)
{
	char ida[41], idb[41], slot[8];
	redisReply *x;
	int m[3];

	snprintf(slot, sizeof(slot), "%u", slots_key_slot(key, strlen(key)));
	assert_int_equal(rcluster_id(a, ida), 0);
	assert_int_equal(rcluster_id(b, idb), 0);
	cmd_ok(b, "CLUSTER SETSLOT %s IMPORTING %s", slot, ida);
	cmd_ok(a, "CLUSTER SETSLOT %s MIGRATING %s", slot, idb);
	x = cmd(a, "MIGRATE 127.0.0.1 %d %s 0 5000", b, key);
	if (x->type == REDIS_REPLY_ERROR)
		fail_msg("MIGRATE: %s", x->str);
	freeReplyObject(x);
	if (!final)
		return;
	assert_int_equal(rcluster_masters(&rc, m), 3);
	cmd_ok(b, "CLUSTER SETSLOT %s NODE %s", slot, idb);
	cmd_ok(a, "CLUSTER SETSLOT %s NODE %s", slot, idb);
	for (int i = 0; i < 3; i++)
		if (m[i] != a && m[i] != b)
			cmd_ok(m[i], "CLUSTER SETSLOT %s NODE %s", slot, idb);
}

static int reply_starts(int port, const char *key, const char *word)
{
	redisReply *x = cmd(port, "GET %s", key);
	int ok = x->type == REDIS_REPLY_ERROR && !strncmp(x->str, word, strlen(word));

	freeReplyObject(x);
	return ok;
}

/* One thread, its map loaded, then the slot moves: MOVED, then a hit. */
static void test_moved(void **state)
{
	struct remote_stats st;
	struct remote r;
	struct remote_identity id;
	char key[REMOTE_KEY_BYTES];
	int a, b;
	uint64_t c;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 1, 16u << 20), 0);
	ident(&id, "grace", 8);
	c = chain_on(&id, 10000, &a);
	put_pages(&r, &id, c, 1);
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	b = other_master(a);
	page_key(&id, c, key);
	move_slot(key, a, b, 1);
	assert_true(reply_starts(a, key, "MOVED"));
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	assert_int_equal(rcluster_owner(&rc, key), b);
	remote_stats(&r, &st);
	assert_int_equal(st.moved, 1);
	assert_int_equal(st.asked, 0);
	/* The slot's new owner is remembered: no redirection again. */
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	remote_stats(&r, &st);
	assert_int_equal(st.moved, 1);
	remote_fini(&r);
}

/* During a migration, with the key already on the importing node: ASK,
 * ASKING there, a hit. */
static void test_ask(void **state)
{
	struct remote_stats st;
	struct remote r;
	struct remote_identity id;
	char key[REMOTE_KEY_BYTES];
	int a, b;
	uint64_t c;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 1, 16u << 20), 0);
	ident(&id, "heidi", 9);
	c = chain_on(&id, 11000, &a);
	put_pages(&r, &id, c, 1);
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	b = other_master(a);
	page_key(&id, c, key);
	move_slot(key, a, b, 0);
	assert_true(reply_starts(a, key, "ASK"));
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	/* ASK is for one command: both went to a first, then to b. */
	remote_stats(&r, &st);
	assert_int_equal(st.asked, 2);
	assert_int_equal(st.moved, 0);
	move_slot(key, a, b, 1);
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	remote_fini(&r);
}

/* A master killed: misses at once, then hits again once its replica took
 * over (cluster-node-timeout 1000 ms). */
static void test_failover(void **state)
{
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	uint64_t c, t0;
	int a, why = -1, hits = 0;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 2, 16u << 20), 0);
	ident(&id, "ivan", 10);
	c = chain_on(&id, 12000, &a);
	put_pages(&r, &id, c, 1);
	/* The replica has it before the master goes. */
	{
		redisReply *x = cmd(a, "WAIT 1 2000");

		assert_int_equal(x->type, REDIS_REPLY_INTEGER);
		assert_int_equal(x->integer, 1);
		freeReplyObject(x);
	}
	assert_int_equal(get_pages(&r, &id, c, 1, NULL), 1);
	assert_int_equal(rcluster_script(&rc, "kill", a), 0);
	t0 = now_ms();
	assert_int_equal(get_pages(&r, &id, c, 1, &why), 0);
	assert_true(now_ms() - t0 < 2 * TIMEOUT_MS);
	assert_true(why == CLUSTER_ERR_CONN || why == CLUSTER_ERR_DOWN ||
		    why == CLUSTER_ERR_TIMEOUT);
	while (now_ms() - t0 < 20000) {
		hits = (int)get_pages(&r, &id, c, 1, NULL);
		if (hits)
			break;
		usleep(100000);
	}
	assert_int_equal(hits, 1);
	fprintf(stderr, "# hits again %llu ms after the master was killed\n",
		(unsigned long long)(now_ms() - t0));
	remote_stats(&r, &st);
	assert_true(st.misses >= 1);
	remote_fini(&r);
	/* The old master comes back as a replica. */
	assert_int_equal(rcluster_script(&rc, "restart", 0), 0);
}

/* The whole cluster down: every request completes as a miss within the
 * timeout; back up, the tier works again by itself. */
static void test_cluster_down(void **state)
{
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	uint64_t t0;
	int hits = 0;

	(void)state;
	assert_int_equal(start_remote(&r, NULL, NULL, 2, 16u << 20), 0);
	ident(&id, "judy", 11);
	put_pages(&r, &id, 13000, 8);
	assert_int_equal(get_pages(&r, &id, 13000, 8, NULL), 8);
	assert_int_equal(rcluster_script(&rc, "stop", 0), 0);
	for (int i = 0; i < 5; i++) {
		t0 = now_ms();
		assert_int_equal(get_pages(&r, &id, 13000, 8, NULL), 0);
		assert_true(now_ms() - t0 < 2 * TIMEOUT_MS);
		usleep(100000);
	}
	remote_stats(&r, &st);
	assert_true(st.nodes_down > 0);
	assert_int_equal(rcluster_script(&rc, "restart", 0), 0);
	t0 = now_ms();
	while (now_ms() - t0 < 20000) {
		struct batch *b = malloc(sizeof(*b));

		/* Nothing was persisted: store again, then read. */
		batch_init(b, &id, 13000, 8, 1);
		submit(&r, b, 1);
		wait_done(1);
		batch_free(b);
		free(b);
		hits = (int)get_pages(&r, &id, 13000, 8, NULL);
		if (hits == 8)
			break;
		usleep(100000);
	}
	assert_int_equal(hits, 8);
	remote_stats(&r, &st);
	assert_int_equal(st.nodes_down, 0);
	remote_fini(&r);
}

/* No node reachable at start: init succeeds (a cache starts without its
 * cluster), every request is a miss. */
static void test_no_cluster(void **state)
{
	static const char *const none[] = {"127.0.0.1:1"};
	struct remote_config cfg = {
		.nodes = none,
		.n_nodes = 1,
		.timeout_ms = TIMEOUT_MS,
		.threads = 1,
		.max_inflight_bytes = 1u << 20,
		.max_page_bytes = MAX_PAGE,
	};
	static const char *const bad[] = {"no-port"};
	struct remote r;
	struct remote_identity id;

	(void)state;
	assert_int_equal(remote_init(&r, &loop, &cfg), 0);
	assert_non_null(strstr(remote_why(&r), "127.0.0.1:1"));
	ident(&id, "kim", 12);
	assert_int_equal(get_pages(&r, &id, 1, 2, NULL), 0);
	remote_fini(&r);
	cfg.nodes = bad;
	assert_int_equal(remote_init(&r, &loop, &cfg), -EINVAL);
	remote_fini(&r);
}

/* ---- a hostile node: a thread that speaks just enough RESP ---------------- */

static _Atomic int
	fake_mode; /* what GET gets: 0 nil+extra bytes, 1 huge length, 2 array, 3 silence,
		    * 4 a value one byte at a time, each within the timeout */
static int fake_fd, fake_port;

static void *fake_main(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(fake_fd, NULL, NULL);
		char buf[4096];
		ssize_t n;

		if (c < 0)
			return NULL;
		while ((n = recv(c, buf, sizeof(buf) - 1, 0)) > 0) {
			char out[512];
			int len;

			buf[n] = 0;
			if (strstr(buf, "SLOTS"))
				len = snprintf(out, sizeof(out),
					       "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0."
					       "1\r\n:%d\r\n",
					       fake_port);
			else if (fake_mode == 0)
				len = snprintf(out, sizeof(out), "$-1\r\n+SURPRISE\r\n");
			else if (fake_mode == 1)
				len = snprintf(out, sizeof(out), "$999999999999\r\nabc");
			else if (fake_mode == 2)
				len = snprintf(out, sizeof(out), "*2\r\n$1\r\na\r\n$1\r\nb\r\n");
			else if (fake_mode == 4) {
				/* Until the client gives up and closes. */
				if (send(c, "$1000\r\n", 7, MSG_NOSIGNAL) == 7)
					while (send(c, "x", 1, MSG_NOSIGNAL) == 1)
						usleep(100000);
				break;
			} else
				len = 0;
			if (len > 0 && send(c, out, (size_t)len, MSG_NOSIGNAL) < 0)
				break;
		}
		close(c);
	}
}

/* A node that lies (bytes after a reply, a length of a terabyte, an
 * array for a GET, silence, a value a byte at a time, each byte within
 * the timeout): each is a miss within a few timeouts, nothing allocated
 * for the lie, and the daemon's requests keep completing. */
static void test_hostile_node(void **state)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t alen = sizeof(a);
	static char node[32];
	const char *nodes[] = {node};
	struct remote_config cfg = {
		.nodes = nodes,
		.n_nodes = 1,
		.timeout_ms = 300,
		.backoff_ms = 1,
		.threads = 1,
		.max_inflight_bytes = 1u << 20,
		.max_page_bytes = MAX_PAGE,
	};
	struct remote r;
	struct remote_identity id;
	struct remote_stats st;
	pthread_t t;
	int why = -1;

	(void)state;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fake_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fake_fd >= 0);
	assert_int_equal(bind(fake_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fake_fd, 8), 0);
	assert_int_equal(getsockname(fake_fd, (struct sockaddr *)&a, &alen), 0);
	fake_port = ntohs(a.sin_port);
	snprintf(node, sizeof(node), "127.0.0.1:%d", fake_port);
	assert_int_equal(pthread_create(&t, NULL, fake_main, NULL), 0);
	assert_int_equal(remote_init(&r, &loop, &cfg), 0);
	assert_string_equal(remote_why(&r), "");
	ident(&id, "mallory", 13);
	for (fake_mode = 0; fake_mode < 5; fake_mode++) {
		uint64_t t0 = now_ms();

		usleep(5000); /* past the backoff of the mode before */
		assert_int_equal(get_pages(&r, &id, 1, 2, &why), 0);
		/* The drip: the round's deadline, 4 timeouts. */
		assert_true(now_ms() - t0 < (fake_mode == 4 ? 6 : 3) * cfg.timeout_ms);
		assert_int_not_equal(why, CLUSTER_HIT);
	}
	remote_stats(&r, &st);
	assert_int_equal(st.hits, 0);
	assert_int_equal(st.misses, 10);
	assert_true(st.timeouts >= 1);			/* silence */
	assert_true(st.errors[CLUSTER_ERR_REPLY] >= 1); /* bytes after, array */
	remote_fini(&r);
	shutdown(fake_fd, SHUT_RDWR);
	close(fake_fd);
	pthread_join(t, NULL);
}

static int setup(void **state)
{
	int ret;

	(void)state;
	ret = rcluster_start(&rc);
	if (ret == 77)
		exit(77);
	if (ret)
		return -1;
	snprintf(seed0, sizeof(seed0), "127.0.0.1:%d", rc.base);
	snprintf(seed1, sizeof(seed1), "127.0.0.1:%d", rc.base + 1);
	return loop_init(&loop, 256, LOOP_WANT_AUTO) < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	loop_fini(&loop);
	rcluster_stop(&rc);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keyslot),	     cmocka_unit_test(test_many),
		cmocka_unit_test(test_scopes),	     cmocka_unit_test(test_format),
		cmocka_unit_test(test_corrupt),	     cmocka_unit_test(test_cap),
		cmocka_unit_test(test_inflight),     cmocka_unit_test(test_no_cluster),
		cmocka_unit_test(test_moved),	     cmocka_unit_test(test_ask),
		cmocka_unit_test(test_failover),     cmocka_unit_test(test_auth),
		cmocka_unit_test(test_cluster_down), cmocka_unit_test(test_hostile_node),
	};

	signal(SIGPIPE, SIG_IGN);
	alarm(170);
	return cmocka_run_group_tests(tests, setup, teardown);
}
