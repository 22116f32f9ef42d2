/* tests/integration/test_checkpoint.c — durable checkpoints, restore and
 * warm-up against a real daemon.
 *
 *  - round trip: a session with a partial last page is checkpointed,
 *    closed, evicted from everywhere, restored: every token and every K/V
 *    byte is back; a restore while its pages are still indexed shares them;
 *  - durability: after a clean stop and after SIGKILL, what Checkpoint
 *    reported is restored exactly;
 *  - refusals (nothing restored, counted): a missing name, a flipped byte
 *    in the header, the tokens or a page, a truncated file, a newer format
 *    version, a pool of another layout, another tenant's checkpoint
 *    (which it can neither restore nor remove);
 *  - a full file system (a 512 KiB tmpfs; skipped where mounting is not
 *    allowed): Checkpoint fails with
 *    -ENOSPC, the earlier checkpoint of that name restores unchanged, the
 *    daemon serves on;
 *  - crash loop: 50 rounds of a client checkpointing (new names and one
 *    name rewritten) in a pool small enough that its closed sessions spill
 *    to the disk tier, while the daemon is SIGKILLed at a random moment;
 *    after each restart every checkpoint whose call had returned success
 *    restores to exactly its content, the rewritten name restores to one
 *    complete version, never a mixture; spilled pages are found again
 *    and every match reads right bytes;
 *  - warm-up: a checkpoint placed in the warm-up directory is matchable as
 *    soon as the restarted daemon accepts connections;
 *  - issue 13: a file copied over another checkpoint's name, or into
 *    another tenant's directory, is refused; a restore shares the pages
 *    the prefix index holds before it allocates, and waits for room while
 *    the host tier drains to disk; every directory created on the way to
 *    a checkpoint is fsynced into its parent.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "ckpt-model"
#define BT    16u
#define N_TOK 200u /* 12 full pages and a partial one */

static const struct kvp_layout lay = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static const struct kvp_layout other_lay = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = 32,
	.dtype = KVP_DTYPE_F16,
};

static const char *const args[] = {"--host-pool-size", "16M", NULL};
/* 16 pages: the crash loop's closed sessions spill to the disk tier. */
static const char *const crash_args[] = {"--host-pool-size", "256K", NULL};

static void connect_pool(struct harness *h, kvp_client **c, kvp_pool **p)
{
	assert_int_equal(kvp_connect(h->sock, c), 0);
	assert_int_equal(kvp_pool_open(*c, MODEL, &lay, p), 0);
}

/* Restores name into p and checks tokens[0..n) and every K/V byte. */
static void expect_restored(kvp_pool *p, const char *name, const uint32_t *tokens, uint64_t n)
{
	kvp_session *s;

	assert_int_equal(kvp_session_restore(p, name, &s), 0);
	assert_int_equal(kvp_session_tokens(s), n);
	assert_int_equal(kvp_session_committed(s), n);
	assert_int_equal(harness_pkv_check_session(p, s, tokens, 0, n), 0);
	assert_int_equal(kvp_session_close(s), 0);
}

static struct kvp_stats *stats(kvp_client *c)
{
	struct kvp_stats *st;

	assert_int_equal(kvp_stats(c, &st), 0);
	return st;
}

static void test_round_trip(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[N_TOK];
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	uint64_t bytes = 0;

	harness_tokens(tokens, N_TOK, 7, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "conv-1", &bytes), 0);
	assert_true(bytes > 13 * 16384);
	assert_int_equal(kvp_session_close(s), 0);
	/* Still indexed: the restore shares its 12 full pages (dedup). */
	{
		struct kvp_pool_stats before, after;

		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &before, NULL), 0);
		expect_restored(p, "conv-1", tokens, N_TOK);
		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &after, NULL), 0);
		assert_int_equal(after.dedup_pages - before.dedup_pages, N_TOK / BT);
	}
	/* Out of the index (and the disk tier off): read from the file. */
	assert_int_equal(harness_restart(h, SIGTERM,
					 (const char *const[]){"--host-pool-size", "16M",
							       "--disk-pool-size", "0", NULL}),
			 0);
	kvp_disconnect(c);
	connect_pool(h, &c, &p);
	expect_restored(p, "conv-1", tokens, N_TOK);
	st = stats(c);
	assert_int_equal(st->checkpoints_restored, 1);
	assert_int_equal(st->checkpoints_refused, 0);
	kvp_stats_free(st);
	kvp_disconnect(c);
}

static void durable(struct harness *h, int sig)
{
	uint32_t tokens[N_TOK];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(tokens, N_TOK, 11, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "kept", NULL), 0);
	/* Killed right after the reply: the reply meant durable. */
	assert_int_equal(harness_restart(h, sig, args), 0);
	kvp_disconnect(c);
	connect_pool(h, &c, &p);
	expect_restored(p, "kept", tokens, N_TOK);
	kvp_disconnect(c);
}

/* A checkpoint written as int8 (mixed precision on disk): a smaller file
 * that restores within int8's bound into the f16 pool it came from; the
 * same one as it is restores bit-exact. A pool whose pages cannot take
 * the form is refused. */
static void test_quantized(void **state)
{
	/* 2 layers, 2 heads of 64, 16 tokens, f16: 16 KiB pages, 12 KiB as int8. */
	static const struct kvp_layout l16k = {
		.n_layers = 2,
		.n_kv_heads = 2,
		.head_dim = 64,
		.block_tokens = BT,
		.dtype = KVP_DTYPE_F16,
	};
	struct harness *h = *state;
	uint32_t tokens[N_TOK];
	uint64_t plain, q, inexact;
	kvp_client *c;
	kvp_pool *p, *p8;
	kvp_session *s, *r;

	harness_tokens(tokens, N_TOK, 21, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "ckpt-q", &l16k, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "plain", &plain), 0);
	assert_int_equal(kvp_session_checkpoint_as(s, "int8", KVP_DTYPE_INT8, &q), 0);
	/* 13 pages of 16 KiB against 13 of 12 KiB, plus the same tokens. */
	assert_int_equal(plain - q, 13 * 4096);
	assert_int_equal(kvp_session_close(s), 0);
	/* A fresh daemon without a disk tier: the prefix index holds none of
	 * these pages, so the restore takes every page from the file (with
	 * the index, it would share the exact pages instead). */
	kvp_disconnect(c);
	assert_int_equal(
		harness_restart(h, SIGTERM, (const char *const[]){"--disk-pool-size", "0", NULL}),
		0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "ckpt-q", &l16k, &p), 0);

	assert_int_equal(kvp_session_restore(p, "int8", &r), 0);
	assert_int_equal(kvp_session_tokens(r), N_TOK);
	assert_int_equal(harness_pkv_check_int8(p, NULL, r, tokens, N_TOK, &inexact), 0);
	assert_true(inexact > N_TOK); /* it went through int8 */
	assert_int_equal(kvp_session_close(r), 0);
	/* Its lossy pages stayed out of the prefix index: the plain
	 * checkpoint restores exact, and the int8 one cannot warm it up. */
	assert_int_equal(kvp_session_restore(p, "plain", &r), 0);
	assert_int_equal(harness_pkv_check_session(p, r, tokens, 0, N_TOK), 0);
	assert_int_equal(kvp_session_close(r), 0);
	{
		struct kvp_warmup_info wi;
		kvp_client *admin;

		assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
		assert_int_equal(kvp_admin_warmup(admin, "int8", 1, (uint32_t)getuid(), &wi),
				 -EINVAL);
		assert_non_null(strstr(kvp_strerror(admin, -EINVAL), "quantized"));
		kvp_disconnect(admin);
	}

	/* int8 pages cannot be quantized again; f16 is not a quantized form. */
	{
		struct kvp_layout l8 = l16k;

		l8.dtype = KVP_DTYPE_INT8;
		l8.quant_group = 32;
		assert_int_equal(kvp_pool_open(c, "ckpt-q8", &l8, &p8), 0);
		assert_int_equal(kvp_session_create(p8, &s), 0);
		assert_int_equal(kvp_append(s, tokens, 20), 0);
		assert_int_equal(kvp_commit(s, 20), 0);
		assert_int_equal(kvp_session_checkpoint_as(s, "q8", KVP_DTYPE_INT4, NULL), -EINVAL);
		assert_int_equal(kvp_session_close(s), 0);
	}
	assert_int_equal(harness_pkv_commit_session(p, tokens, 20, &s), 0);
	assert_int_equal(kvp_session_checkpoint_as(s, "f16", KVP_DTYPE_F16, NULL), -EINVAL);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

static void test_durable_clean_stop(void **state)
{
	durable(*state, SIGTERM);
}

static void test_durable_sigkill(void **state)
{
	durable(*state, SIGKILL);
}

/* The file of checkpoint name of uid 0. */
static void ckpt_path(struct harness *h, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%.80s/state/checkpoints/0/%.64s", h->dir, name);
}

static void copy_file(const char *from, const char *to)
{
	char cmd[1400];

	snprintf(cmd, sizeof(cmd), "cp '%.600s' '%.600s'", from, to);
	assert_int_equal(system(cmd), 0);
}

static void flip_at(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static void test_refusals(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[N_TOK];
	char good[512], bad[512];
	struct kvp_stats *st;
	struct stat sb;
	kvp_client *c;
	kvp_pool *p, *p2;
	kvp_session *s;
	/* Offsets inside the file: the header's uid field, a token record,
	 * the middle of the first page (daemon/store/ckpt.h has the layout). */
	static const off_t flips[] = {24, 512 + 16 * 5, 4096 + 1000};
	char names[3][16];

	harness_tokens(tokens, N_TOK, 13, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "good", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	ckpt_path(h, "good", good, sizeof(good));

	assert_int_equal(kvp_session_restore(p, "missing", &s), -ENOENT);
	for (int i = 0; i < 3; i++) {
		snprintf(names[i], sizeof(names[i]), "flip%d", i);
		ckpt_path(h, names[i], bad, sizeof(bad));
		copy_file(good, bad);
		flip_at(bad, flips[i]);
		assert_int_equal(kvp_session_restore(p, names[i], &s), -EBADMSG);
	}
	/* Truncated in the middle of the pages. */
	ckpt_path(h, "short", bad, sizeof(bad));
	copy_file(good, bad);
	assert_int_equal(stat(bad, &sb), 0);
	assert_int_equal(truncate(bad, sb.st_size / 2), 0);
	assert_int_equal(kvp_session_restore(p, "short", &s), -EBADMSG);
	/* A newer format version (byte 8, refused before the checksum). */
	ckpt_path(h, "newer", bad, sizeof(bad));
	copy_file(good, bad);
	flip_at(bad, 8);
	assert_int_equal(kvp_session_restore(p, "newer", &s), -EPROTONOSUPPORT);
	/* Another layout. */
	assert_int_equal(kvp_pool_open(c, MODEL, &other_lay, &p2), 0);
	assert_int_equal(kvp_session_restore(p2, "good", &s), -EINVAL);

	st = stats(c);
	assert_int_equal(st->checkpoints_refused, 6);
	assert_int_equal(st->checkpoints_restored, 0);
	kvp_stats_free(st);
	/* Nothing was half-restored: no session, no page held. */
	{
		struct kvp_pool_stats ps;

		assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
		assert_int_equal(ps.n_sessions, 0);
		assert_int_equal(ps.reserved_pages, 0);
	}
	/* The good one still restores. */
	expect_restored(p, "good", tokens, N_TOK);
	kvp_disconnect(c);
}

struct other_tenant {
	const char *sock;
};

static int restore_as_nobody(void *arg)
{
	const struct other_tenant *o = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK(harness_become_nobody() == 0);
	CHILD_CHECK(kvp_connect(o->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL, &lay, &p) == 0);
	CHILD_CHECK(kvp_session_restore(p, "mine", &s) == -ENOENT);
	/* Removing: only its own directory is looked at, and uid is the
	 * admin socket's. */
	CHILD_CHECK(kvp_checkpoint_remove(c, "mine", 0, 0, NULL) == -ENOENT);
	CHILD_CHECK(kvp_checkpoint_remove(c, "mine", 1, 0, NULL) == -EPERM);
	kvp_disconnect(c);
	return 0;
}

static void test_other_tenant(void **state)
{
	struct harness *h = *state;
	struct other_tenant o = {h->sock};
	uint32_t tokens[N_TOK];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(tokens, N_TOK, 17, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "mine", NULL), 0);
	assert_int_equal(harness_run_child(restore_as_nobody, &o), 0);
	expect_restored(p, "mine", tokens, N_TOK); /* still there */
	kvp_disconnect(c);
}

static void test_disk_full(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[N_TOK], other[N_TOK * 4];
	char dir[512], cmd[700];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *big;

	/* The tenant's checkpoint directory on a 512 KiB tmpfs: a 13-page
	 * checkpoint (~220 KiB) fits, a 50-page one (~820 KiB) does not. */
	snprintf(dir, sizeof(dir), "%.80s/state/checkpoints/0", h->dir);
	mkdir(dir, 0700);
	snprintf(cmd, sizeof(cmd),
		 "mount -t tmpfs -o size=512k,mode=0700 kvpt-full '%s' 2>/dev/null", dir);
	if (system(cmd) != 0)
		skip(); /* not allowed to mount here */

	harness_tokens(tokens, N_TOK, 19, 0);
	harness_tokens(other, N_TOK * 4, 23, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "name", NULL), 0);
	assert_int_equal(harness_pkv_commit_session(p, other, N_TOK * 4, &big), 0);
	assert_int_equal(kvp_session_checkpoint(big, "name", NULL), -ENOSPC);
	/* The earlier checkpoint of that name is intact; the daemon serves. */
	expect_restored(p, "name", tokens, N_TOK);
	assert_int_equal(harness_pkv_check_session(p, big, other, 0, N_TOK * 4), 0);
	kvp_disconnect(c);
	snprintf(cmd, sizeof(cmd), "umount '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* ---- issue 13: names, owners, room, directories ------------------------------ */

/* Item 16: copying checkpoint A's file over checkpoint B's name made
 * `restore B` serve A's content. The file records its name and owner: the
 * copy is refused with a clear reason (and counted), listed as such, and
 * B's own file restores again once it is back; an admin restore of a
 * file copied into another tenant's directory is refused too (it used to
 * restore into the pool of the uid the file names). */
static void test_copied_file_refused(void **state)
{
	struct harness *h = *state;
	uint32_t ta[N_TOK], tb[N_TOK];
	char pa[512], pb[512], keep[600], other[512];
	struct kvp_checkpoint_list *l;
	struct kvp_restore_info ri;
	struct kvp_stats *st;
	kvp_client *c, *admin;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(ta, N_TOK, 31, 0);
	harness_tokens(tb, N_TOK, 32, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, ta, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "conv-a", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_pkv_commit_session(p, tb, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "conv-b", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	ckpt_path(h, "conv-a", pa, sizeof(pa));
	ckpt_path(h, "conv-b", pb, sizeof(pb));
	snprintf(keep, sizeof(keep), "%s.keep", pa);
	copy_file(pb, keep);
	copy_file(pa, pb); /* cp conv-a conv-b */

	s = NULL;
	assert_int_equal(kvp_session_restore(p, "conv-b", &s), -EBADMSG);
	assert_null(s);
	assert_non_null(
		strstr(kvp_strerror(c, -EBADMSG), "holds checkpoint 'conv-a', not 'conv-b'"));
	assert_int_equal(kvp_list_checkpoints(c, 0, 0, &l), 0);
	for (size_t i = 0; i < l->n_entries; i++) {
		if (!strcmp(l->entries[i].name, "conv-b"))
			assert_non_null(strstr(l->entries[i].error ? l->entries[i].error : "",
					       "holds checkpoint 'conv-a'"));
		if (!strcmp(l->entries[i].name, "conv-a"))
			assert_null(l->entries[i].error);
	}
	kvp_checkpoint_list_free(l);
	st = stats(c);
	assert_int_equal(st->checkpoints_refused, 1);
	kvp_stats_free(st);
	copy_file(keep, pb);
	unlink(keep);
	expect_restored(p, "conv-b", tb, N_TOK);

	/* Into another tenant's directory (uid 4242): refused by owner. */
	snprintf(other, sizeof(other), "%.80s/state/checkpoints/4242", h->dir);
	assert_int_equal(mkdir(other, 0700), 0);
	snprintf(other, sizeof(other), "%.80s/state/checkpoints/4242/conv-a", h->dir);
	copy_file(pa, other);
	assert_int_equal(kvp_connect(h->admin_sock, &admin), 0);
	assert_int_equal(kvp_admin_restore(admin, "conv-a", 1, 4242, 0, &ri), -EBADMSG);
	assert_non_null(strstr(kvp_strerror(admin, -EBADMSG), "of uid 0, not of uid 4242"));
	assert_int_equal(kvp_admin_warmup(admin, "conv-a", 1, 4242, NULL), -EBADMSG);
	assert_int_equal(kvp_list_checkpoints(admin, 1, 4242, &l), 0);
	assert_int_equal(l->n_entries, 1);
	assert_non_null(l->entries[0].error);
	kvp_checkpoint_list_free(l);
	kvp_disconnect(admin);
	kvp_disconnect(c);
}

/* Item 11: restoring a checkpoint into a pool that holds all its full
 * pages in the prefix index failed with "host tier full": the restore
 * took a slot for every page before it looked at the index. A 16-page
 * pool whose session holds the 15 pages of a checkpoint (nothing left to
 * evict) restores it, sharing all 15, allocating none. */
static void test_restore_shares_before_allocating(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[15 * BT];
	struct kvp_pool_stats before, after;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *r;

	harness_tokens(tokens, 15 * BT, 41, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 15 * BT, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "indexed", NULL), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &before, NULL), 0);
	assert_int_equal(before.n_pages, 16);
	assert_int_equal(kvp_session_restore(p, "indexed", &r), 0);
	assert_int_equal(kvp_session_tokens(r), 15 * BT);
	assert_int_equal(harness_pkv_check_session(p, r, tokens, 0, 15 * BT), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &after, NULL), 0);
	assert_int_equal(after.free_pages, before.free_pages); /* nothing allocated */
	assert_int_equal(after.dedup_pages - before.dedup_pages, 15);
	assert_int_equal(kvp_session_close(r), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

/* Item 15: a restore answered "host tier full" while the host tier was
 * full of prefix-index pages being written to the disk tier that nothing
 * pins (about 5 % of restores under pressure needed a retry). Here the
 * 16-page pool holds 15 such pages when the restore of 15 pages comes:
 * making room starts their writes, and the restore waits for them, as a
 * match does, instead of failing. */
static void test_restore_waits_for_drain(void **state)
{
	struct harness *h = *state;
	uint32_t ta[15 * BT], tb[15 * BT];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(tb, 15 * BT, 43, 0);
	harness_tokens(ta, 15 * BT, 44, 0);
	connect_pool(h, &c, &p);
	/* B's pages: checkpointed, then only the index holds them. */
	assert_int_equal(harness_pkv_commit_session(p, tb, 15 * BT, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "drain-b", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	/* A's session pushes them to disk; closed, A's pages are index
	 * pages that were never written out. */
	assert_int_equal(harness_pkv_commit_session(p, ta, 15 * BT, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	/* Room for B means writing A's pages out first: wait, not fail. */
	assert_int_equal(kvp_session_restore(p, "drain-b", &s), 0);
	assert_int_equal(harness_pkv_check_session(p, s, tb, 0, 15 * BT), 0);
	assert_int_equal(kvp_session_close(s), 0);
	{
		struct kvp_stats *st = stats(c);

		assert_int_equal(st->restore_waits, 1); /* and said so */
		kvp_stats_free(st);
	}
	kvp_disconnect(c);
}

/* Item 17: creating checkpoints/<uid>/ (and checkpoints/, and the state
 * directory) was not followed by an fsync of its parent, so after a
 * power loss a tenant's first checkpoint, reported durable, could vanish
 * with its directory. Counted through the fault layer's directory-fsync
 * hook (a rule that never fires; the daemon logs its count at stop):
 * the first checkpoint in a fresh state directory takes the fsyncs of
 * state/ into its parent, checkpoints/ into state/, <uid>/ into
 * checkpoints/ and the file's rename in <uid>/ — today's code made the
 * last one only. */
static void test_created_dirs_synced(void **state)
{
	struct harness h;
	uint32_t tokens[N_TOK];
	char log[] = "/tmp/kvp-dirsync-XXXXXX", buf[65536], *at;
	unsigned long long calls = 0;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int fd, saved, n;

	(void)state;
	fd = mkstemp(log);
	assert_true(fd >= 0);
	saved = dup(STDERR_FILENO);
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	setenv("KVPALACED_FAULTS", "ckpt:dirsync:EIO:after=1000000", 1);
	n = harness_start(&h, args);
	unsetenv("KVPALACED_FAULTS");
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	assert_int_equal(n, 0);

	harness_tokens(tokens, N_TOK, 47, 0);
	connect_pool(&h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "first", NULL), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);

	n = (int)pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	unlink(log);
	assert_true(n > 0);
	buf[n] = '\0';
	at = strstr(buf, "rule 'ckpt:dirsync:EIO:after=1000000' matched ");
	assert_non_null(at);
	assert_int_equal(sscanf(at, "rule 'ckpt:dirsync:EIO:after=1000000' matched %llu", &calls),
			 1);
	fprintf(stderr, "directory fsyncs for a first checkpoint: %llu\n", calls);
	assert_true(calls >= 4);
}

/* ---- crash loop ------------------------------------------------------------ */

#define ROUNDS	     50
#define CRASH_TOKENS 72u

struct writer {
	const char *sock;
	const char *log; /* "name seq\n" per checkpoint that returned success */
	int round;
};

static uint32_t seq_of(int round, int k)
{
	return 1000u + (uint32_t)round * 64u + (uint32_t)k;
}

/* Checkpoints fresh names and rewrites "same" until the daemon dies. */
static int crash_writer(void *arg)
{
	const struct writer *w = arg;
	FILE *log = fopen(w->log, "a");
	uint32_t tokens[CRASH_TOKENS];
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK(log != NULL);
	if (kvp_connect(w->sock, &c) < 0) {
		fclose(log);
		return 0;
	}
	if (kvp_pool_open(c, MODEL, &lay, &p) < 0) {
		kvp_disconnect(c); /* a leak valgrind would report */
		fclose(log);
		return 0;
	}
	for (int k = 0; k < 64; k++) {
		uint32_t seq = seq_of(w->round, k);
		char name[32];
		kvp_session *s;

		harness_tokens(tokens, CRASH_TOKENS, seq, 0);
		if (harness_pkv_commit_session(p, tokens, CRASH_TOKENS, &s) < 0)
			break;
		snprintf(name, sizeof(name), k % 2 ? "same" : "r%d-%d", w->round, k);
		if (kvp_session_checkpoint(s, name, NULL) < 0)
			break;
		fprintf(log, "%s %u\n", name, seq);
		fflush(log);
		kvp_session_close(s);
	}
	fclose(log);
	kvp_disconnect(c);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_crash_loop(void **state)
{
	struct harness *h = *state;
	char log[160], line[128];
	uint32_t tokens[CRASH_TOKENS];
	unsigned int seed = 12345, verified = 0, same_ok = 0;
	uint32_t last_same = 0; /* the newest "same" reported durable */
	uint64_t restored_pages = 0;
	double t0 = now_s();

	/* Kills come 5–45 ms into each round: a daemon under valgrind (meson
	 * test --setup valgrind) has not written one checkpoint by then. */
	if (getenv("KVPALACED_WRAPPER"))
		skip();

	snprintf(log, sizeof(log), "%s/written.log", h->dir);
	for (int round = 0; round < ROUNDS; round++) {
		struct writer w = {h->sock, log, round};
		pid_t pid = harness_fork(crash_writer, &w);
		kvp_client *c;
		kvp_pool *p;
		kvp_session *s;
		uint32_t round_same = 0;
		FILE *f;

		usleep(5000 + rand_r(&seed) % 40000);
		assert_int_equal(harness_restart(h, SIGKILL, crash_args), 0);
		assert_int_equal(harness_wait(pid, 60), 0);

		/* Everything reported durable restores exactly. */
		connect_pool(h, &c, &p);
		f = fopen(log, "r");
		assert_non_null(f);
		while (fgets(line, sizeof(line), f)) {
			char name[32];
			unsigned int seq;

			assert_int_equal(sscanf(line, "%31s %u", name, &seq), 2);
			if (!strcmp(name, "same")) {
				round_same = seq; /* the newest durable version */
				continue;
			}
			harness_tokens(tokens, CRASH_TOKENS, seq, 0);
			expect_restored(p, name, tokens, CRASH_TOKENS);
			verified++;
			/* Its prefix, spilled before the kill, matches again
			 * (restored above, so it is there either way): the
			 * bytes are right. */
			{
				kvp_lease *l;

				assert_int_equal(kvp_match_prefix(p, tokens, CRASH_TOKENS, &l), 0);
				assert_int_equal(
					harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)),
					0);
				assert_int_equal(kvp_lease_release(l), 0);
			}
		}
		fclose(f);
		/* The rewritten name: one complete version — the last one known
		 * durable or one written in this round — never a mixture. */
		{
			int ret = kvp_session_restore(p, "same", &s), found = 0;
			uint32_t on_disk = 0;

			if (ret == 0) {
				assert_int_equal(kvp_session_tokens(s), CRASH_TOKENS);
				for (int k = -1; k < 64 && !found; k += 2) {
					uint32_t seq = k < 0 ? last_same : seq_of(round, k);

					if (k < 0 && !last_same)
						continue;
					harness_tokens(tokens, CRASH_TOKENS, seq, 0);
					/* Quietly by the first row, then every byte. */
					found = harness_pkv_check(
							kvp_session_kv(s, 0, 0, 0, 0), lay.head_dim,
							harness_prefix_step(HARNESS_PREFIX_SEED,
									    tokens[0]),
							0, 0, 0, 0) == 0;
					if (found)
						on_disk = seq;
				}
				assert_true(found);
				assert_int_equal(
					harness_pkv_check_session(p, s, tokens, 0, CRASH_TOKENS),
					0);
				/* A version written but killed before its reply may
				 * be the one on disk: it is what later rounds see. */
				assert_true(!round_same || on_disk >= round_same);
				assert_int_equal(kvp_session_close(s), 0);
				same_ok++;
			} else {
				assert_int_equal(ret, -ENOENT);
				assert_int_equal(last_same, 0);
			}
			if (on_disk)
				last_same = on_disk;
		}
		{
			struct kvp_pool_stats ps;

			assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
			restored_pages += ps.restored_pages;
			assert_int_equal(ps.verify_failures, 0);
		}
		/* Start the next round with the log of what is known durable. */
		kvp_disconnect(c);
		unlink(log);
	}
	fprintf(stderr,
		"crash loop: %d rounds in %.1f s, %u checkpoints verified after a kill, "
		"'same' restored whole %u times, %llu spilled pages found at restarts\n",
		ROUNDS, now_s() - t0, verified, same_ok, (unsigned long long)restored_pages);
	assert_true(verified > 0);
	assert_true(restored_pages > 0);
}

/* ---- warm-up --------------------------------------------------------------- */

static void test_warmup_dir(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[N_TOK];
	char from[512], dir[512], to[600];
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	harness_tokens(tokens, N_TOK, 29, 0);
	connect_pool(h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, tokens, N_TOK, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "opening", NULL), 0);
	kvp_disconnect(c);
	ckpt_path(h, "opening", from, sizeof(from));
	snprintf(dir, sizeof(dir), "%.80s/state/warmup", h->dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(to, sizeof(to), "%.500s/opening", dir);
	copy_file(from, to);

	/* A fresh daemon without a disk tier: only warm-up can have it. */
	assert_int_equal(harness_restart(h, SIGTERM,
					 (const char *const[]){"--host-pool-size", "16M",
							       "--disk-pool-size", "0", NULL}),
			 0);
	connect_pool(h, &c, &p);
	assert_int_equal(kvp_match_prefix(p, tokens, N_TOK, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), harness_whole(N_TOK, BT));
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	st = stats(c);
	assert_int_equal(st->warmed_up_pages, N_TOK / BT);
	kvp_stats_free(st);
	kvp_disconnect(c);
}

static int setup(void **state)
{
	return harness_setup_args(state, args);
}

static int setup_crash(void **state)
{
	return harness_setup_args(state, crash_args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_round_trip, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_quantized, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_durable_clean_stop, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_durable_sigkill, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_refusals, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_other_tenant, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_disk_full, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_crash_loop, setup_crash, harness_teardown),
		cmocka_unit_test_setup_teardown(test_warmup_dir, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_copied_file_refused, setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_restore_shares_before_allocating, setup_crash,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_restore_waits_for_drain, setup_crash,
						harness_teardown),
		cmocka_unit_test(test_created_dirs_synced),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
