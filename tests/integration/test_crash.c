/* tests/integration/test_crash.c — kill -9 at random moments during spills
 * and checkpoints, restart, and compare every byte.
 *
 * Scenario (the crash-consistency runs of LMCache's and Mooncake's disk
 * backends, and memcached extstore's "any doubt is a miss"): a writer
 * process commits conversations that share a system prompt into a pool
 * whose host tier holds a few of them, so pages keep spilling to the disk
 * tier, and checkpoints every third one; a reader process matches earlier
 * conversations at the same time, so promotions and leases are in flight.
 * At a random moment the daemon is killed with SIGKILL and started again
 * on the same state and cache directories. Then:
 *
 * - every checkpoint the writer was told is durable (kvp_session_checkpoint
 *   returned 0) restores, with every row as written: nothing reported
 *   durable is lost;
 * - every conversation ever committed matches some whole-page prefix of
 *   itself (possibly none), and every matched row is the one written: no
 *   wrong byte, before or after any crash;
 * - the reader never read a wrong row while the daemon ran.
 *
 * The rows are keyed by the whole token prefix (harness_pkv_*), so a page
 * of another conversation, a stale slot or a torn page reads wrong.
 * $KVP_CRASH_SEED replays a run, $KVP_CRASH_ROUNDS sets the rounds (6).
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

#define MODEL	      "crash-model"
#define BT	      16u
#define CONV_PAGES    8u
#define CONV	      (CONV_PAGES * BT)
#define PROMPT_TOKENS (2u * BT) /* shared by every conversation */
#define CONVS_PER_RND 1000u	/* more than a round gets through */
#define MAX_ROUNDS    64u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* A host tier of 64 pages (eight conversations), a disk tier of 1,024. */
static const char *const args[] = {"--host-pool-size", "256K", "--disk-pool-size", "4M", NULL};

enum rec_kind { REC_COMMITTED = 1, REC_DURABLE = 2 };
struct rec {
	uint32_t kind;
	uint32_t conv;
};

struct child {
	const char *sock;
	uint32_t first, n; /* conversations [first, first + n) */
	int fd;		   /* the writer's record pipe */
};

static void conv_tokens(uint32_t *t, uint32_t conv)
{
	for (uint32_t i = 0; i < CONV; i++)
		t[i] = harness_token(i < PROMPT_TOKENS ? 0 : 1 + conv, i);
}

static void ckpt_name(char *buf, size_t n, uint32_t conv)
{
	snprintf(buf, n, "crash-%u", conv);
}

/* The daemon went away (killed): the end of a child's round. */
static int gone(int err)
{
	return err == -ENOTCONN || err == -EPIPE || err == -ECONNRESET || err == -ECONNREFUSED ||
	       err == -ENOENT;
}

/* Commits conversations in order, checkpointing every third, and records
 * each success. Exits 0 when the daemon is gone. */
static int writer(void *arg)
{
	const struct child *ch = arg;
	uint32_t tokens[CONV];
	kvp_client *c;
	kvp_pool *p;
	int ret;

	ret = kvp_connect(ch->sock, &c);
	if (ret < 0)
		return gone(ret) ? 0 : 1;
	ret = kvp_pool_open(c, MODEL, &page4k, &p);
	if (ret < 0)
		return gone(ret) ? 0 : 1;
	for (uint32_t conv = ch->first; conv < ch->first + ch->n; conv++) {
		struct rec r = {REC_COMMITTED, conv};
		kvp_session *s;
		char name[32];

		conv_tokens(tokens, conv);
		ret = harness_pkv_commit_session(p, tokens, CONV, &s);
		if (ret == -ENOSPC || ret == -EDQUOT)
			continue; /* pressure, not a crash */
		if (ret < 0) {
			if (gone(ret))
				return 0;
			fprintf(stderr, "child %d: commit of conversation %u: %s\n", (int)getpid(),
				conv, kvp_strerror(c, ret));
			return 1;
		}
		CHILD_CHECK(write(ch->fd, &r, sizeof(r)) == (ssize_t)sizeof(r));
		if (conv % 3 == 0) {
			ckpt_name(name, sizeof(name), conv);
			ret = kvp_session_checkpoint(s, name, NULL);
			if (ret == 0) {
				r.kind = REC_DURABLE;
				CHILD_CHECK(write(ch->fd, &r, sizeof(r)) == (ssize_t)sizeof(r));
			} else if (gone(ret)) {
				return 0;
			} else if (ret != -ENOSPC) {
				fprintf(stderr, "child %d: checkpoint of %u: %s\n", (int)getpid(),
					conv, kvp_strerror(c, ret));
				return 1;
			}
		}
		ret = kvp_session_close(s);
		if (ret < 0)
			return gone(ret) ? 0 : 1;
	}
	kvp_disconnect(c);
	return 0;
}

/* Matches conversations of the range over and over while the writer
 * writes them; any matched row must be right. Exits 0 when the daemon is
 * gone, 1 on a wrong row. */
static int reader(void *arg)
{
	const struct child *ch = arg;
	uint32_t tokens[CONV];
	kvp_client *c;
	kvp_pool *p;
	int ret;

	ret = kvp_connect(ch->sock, &c);
	if (ret < 0)
		return gone(ret) ? 0 : 1;
	ret = kvp_pool_open(c, MODEL, &page4k, &p);
	if (ret < 0)
		return gone(ret) ? 0 : 1;
	for (uint32_t i = 0;; i++) {
		uint32_t conv = ch->first + (uint32_t)(harness_token(7, i) % ch->n);
		kvp_lease *l;
		uint64_t got;

		conv_tokens(tokens, conv);
		ret = kvp_match_prefix(p, tokens, CONV, &l);
		if (ret < 0)
			return gone(ret) ? 0 : 1;
		got = kvp_lease_tokens(l);
		CHILD_CHECK(got <= CONV && got % BT == 0);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, tokens, got), 0);
		ret = kvp_lease_release(l);
		if (ret < 0)
			return gone(ret) ? 0 : 1;
	}
}

/* After a restart: every committed conversation matches right (or short),
 * every durable checkpoint restores right. */
static void verify(const struct harness *h, const unsigned char *committed,
		   const unsigned char *durable, uint32_t n_convs, uint32_t *ret_matched,
		   uint32_t *ret_restored)
{
	uint32_t tokens[CONV];
	kvp_client *c;
	kvp_pool *p;

	*ret_matched = *ret_restored = 0;
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	for (uint32_t conv = 0; conv < n_convs; conv++) {
		kvp_session *s;
		kvp_lease *l;
		uint64_t got, bad;
		char name[32];
		int ret;

		if (!committed[conv])
			continue;
		conv_tokens(tokens, conv);
		assert_int_equal(kvp_match_prefix(p, tokens, CONV, &l), 0);
		got = kvp_lease_tokens(l);
		assert_true(got <= CONV && got % BT == 0);
		bad = harness_pkv_check_lease(l, p, tokens, got);
		if (bad)
			fail_msg("conversation %u: %llu of %llu matched rows wrong", conv,
				 (unsigned long long)bad, (unsigned long long)got);
		*ret_matched += got == CONV;
		assert_int_equal(kvp_lease_release(l), 0);
		if (!durable[conv])
			continue;
		ckpt_name(name, sizeof(name), conv);
		ret = kvp_session_restore(p, name, &s);
		if (ret < 0)
			fail_msg("checkpoint %s was reported durable; restore: %s", name,
				 kvp_strerror(c, ret));
		assert_int_equal(kvp_session_committed(s), CONV);
		bad = harness_pkv_check_session(p, s, tokens, 0, CONV);
		if (bad)
			fail_msg("checkpoint %s: %llu rows wrong", name, (unsigned long long)bad);
		(*ret_restored)++;
		assert_int_equal(kvp_session_close(s), 0);
	}
	kvp_disconnect(c);
}

static void test_kill9_during_spills_and_checkpoints(void **state)
{
	const char *seed_env = getenv("KVP_CRASH_SEED");
	const char *rounds_env = getenv("KVP_CRASH_ROUNDS");
	unsigned int seed = seed_env ? (unsigned int)strtoul(seed_env, NULL, 0)
				     : (unsigned int)time(NULL) ^ (unsigned int)getpid();
	uint32_t rounds = rounds_env ? (uint32_t)strtoul(rounds_env, NULL, 0) : 6;
	uint32_t n_convs = 0, total_committed = 0, total_durable = 0;
	unsigned char *committed, *durable;
	struct harness h;

	(void)state;
	if (rounds < 1 || rounds > MAX_ROUNDS)
		rounds = 6;
	committed = calloc(rounds * CONVS_PER_RND, 1);
	durable = calloc(rounds * CONVS_PER_RND, 1);
	assert_non_null(committed);
	assert_non_null(durable);
	printf("KVP_CRASH_SEED=%u, %u rounds\n", seed, rounds);
	srand(seed);
	assert_int_equal(harness_start(&h, args), 0);
	for (uint32_t round = 0; round < rounds; round++) {
		struct child ch = {h.sock, round * CONVS_PER_RND, CONVS_PER_RND, -1};
		struct rec r;
		uint32_t matched, restored, got_commits = 0;
		struct timespec ts;
		int pfd[2];
		pid_t w, rd;
		long ms;

		assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
		ch.fd = pfd[1];
		w = harness_fork(writer, &ch);
		assert_true(w > 0);
		close(pfd[1]);
		/* The reader starts on what the writer has already done. */
		usleep(20000);
		rd = harness_fork(reader, &ch);
		assert_true(rd > 0);
		ms = 100 + rand() % 700;
		ts.tv_sec = ms / 1000;
		ts.tv_nsec = (ms % 1000) * 1000000L;
		nanosleep(&ts, NULL);
		assert_int_equal(harness_restart(&h, SIGKILL, args), 0);
		assert_int_equal(harness_wait(w, 60), 0);
		assert_int_equal(harness_wait(rd, 60), 0);
		while (read(pfd[0], &r, sizeof(r)) == (ssize_t)sizeof(r)) {
			assert_true(r.conv >= ch.first && r.conv < ch.first + ch.n);
			if (r.kind == REC_COMMITTED) {
				committed[r.conv] = 1;
				got_commits++;
			} else {
				durable[r.conv] = 1;
				total_durable++;
			}
		}
		close(pfd[0]);
		total_committed += got_commits;
		n_convs = ch.first + ch.n;
		verify(&h, committed, durable, n_convs, &matched, &restored);
		printf("round %u: killed after %ld ms, %u committed this round; after restart "
		       "%u of %u conversations matched whole, %u of %u durable checkpoints "
		       "restored\n",
		       round, ms, got_commits, matched, total_committed, restored, total_durable);
		assert_int_equal(restored, total_durable);
	}
	assert_true(total_committed > 0);
	assert_true(total_durable > 0);
	assert_int_equal(harness_stop(&h), 0);
	free(committed);
	free(durable);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9_during_spills_and_checkpoints),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
