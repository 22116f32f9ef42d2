/* tests/faults/test_iofaults.c — I/O faults in spill and checkpoint I/O.
 *
 * kvpalaced runs with $KVPALACED_FAULTS (daemon/server/faults.h, kvpalaced(8)
 * TESTING): EIO, ENOSPC, ECANCELED, EINTR/EAGAIN and short transfers are
 * injected at aio's completion layer (spill reads and writes, on the
 * io_uring and on the threads backend) and into ckpt.c's reads, writes
 * and fsyncs (checkpoint and restore), and each time:
 *
 *  - spill: a working set four times the host tier is written and matched
 *    back; every match returns right bytes (each row checked against the
 *    prefix formula) or a shorter match, never wrong bytes; Stats count
 *    the I/O errors; short transfers and retried calls are continued
 *    transparently (every conversation matches whole, no error counted);
 *    after a clean stop the daemon restarts without faults and whatever
 *    it finds in the spill file again still reads right;
 *  - checkpoints: a name holding an earlier checkpoint is rewritten and a
 *    new name written under the fault; a write that fails is an error
 *    reply (never a success whose file does not restore), leaves no
 *    temporary behind and the earlier checkpoint of that name restores
 *    unchanged; after the daemon is killed and restarted without faults,
 *    every checkpoint reported durable restores to exactly its content. A
 *    failed fsync of the directory after the rename is the one failure
 *    that leaves the new file in place (ckpt.h): the name then restores
 *    to one complete version, old or new. Restores under read faults fail
 *    with an error or restore right bytes.
 */
#include <dirent.h>
#include <errno.h>
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

#define BT	   16u
#define CONV_PAGES 8u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   32u /* 256 pages: 4 times the host tier */
#define MODEL	   "iof-model"
#define N_OLD	   200u /* tokens of the earlier checkpoint */
#define N_NEW	   264u /* tokens of the one written under the fault */

/* 2 layers, 2 KV heads, head_dim 64, 16 tokens of f16: 16 KiB pages, which
 * a short transfer on an O_DIRECT spill file can cut in whole blocks. */
static const struct kvp_layout lay = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

/* The daemon's options: a 1 MiB host pool (64 pages) over a 16 MiB spill
 * file, on one backend. */
static void daemon_args(const char *backend, const char **argv)
{
	static const char *const base[] = {"--host-pool-size", "1M",	 "--disk-pool-size", "16M",
					   "--log-level",      "notice", "--io-backend"};
	size_t i;

	for (i = 0; i < sizeof(base) / sizeof(base[0]); i++)
		argv[i] = base[i];
	argv[i++] = backend;
	argv[i] = NULL;
}

/* Starts (restarts, when h runs) the daemon with $KVPALACED_FAULTS set to
 * rules (NULL: unset), after a stop by sig. */
static int start(struct harness *h, int sig, const char *backend, const char *rules)
{
	const char *argv[16];
	int ret;

	daemon_args(backend, argv);
	if (rules)
		setenv("KVPALACED_FAULTS", rules, 1);
	ret = h->pid ? harness_restart(h, sig, argv) : harness_start(h, argv);
	unsetenv("KVPALACED_FAULTS");
	return ret;
}

static uint32_t *conv_tokens(void)
{
	uint32_t *all = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));

	assert_non_null(all);
	for (uint32_t i = 0; i < N_CONV; i++)
		harness_tokens(all + (size_t)i * CONV, CONV, 900 + i, 0);
	return all;
}

static void connect_pool(struct harness *h, kvp_client **c, kvp_pool **p)
{
	assert_int_equal(kvp_connect(h->sock, c), 0);
	assert_int_equal(harness_pool_open(h, *c, MODEL, &lay, p), 0);
}

static struct kvp_pool_stats pool_stats(kvp_client *c, kvp_pool *p)
{
	struct kvp_pool_stats ps;

	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	return ps;
}

/* Matches every conversation: right bytes always; returns how many
 * matched whole. */
static uint32_t match_all(kvp_pool *p, const uint32_t *all)
{
	uint32_t whole = 0;

	for (uint32_t i = 0; i < N_CONV; i++) {
		const uint32_t *t = all + (size_t)i * CONV;
		kvp_lease *l;
		uint64_t m;

		assert_int_equal(kvp_match_prefix(p, t, CONV, &l), 0);
		m = kvp_lease_tokens(l);
		assert_true(m <= CONV && m % BT == 0);
		assert_int_equal(harness_pkv_check_lease(l, p, t, m), 0);
		whole += m == CONV;
		assert_int_equal(kvp_lease_release(l), 0);
	}
	return whole;
}

/* ---- spill ------------------------------------------------------------------ */

struct spill_case {
	const char *rules;
	int errors;	 /* the faults are errors: Stats must count I/O errors */
	int transparent; /* nothing may be lost: every conversation whole */
};

static const struct spill_case spill_cases[] = {
	{"aio:write:EIO:every=3", 1, 0},
	{"aio:read:EIO:every=3", 1, 0},
	{"aio:any:ECANCELED:every=4", 1, 0},
	{"aio:write:ENOSPC:every=7", 0, 0},
	{"aio:read:short;aio:write:short", 0, 1},
	{"aio:read:EINTR:every=2;aio:write:EAGAIN:every=3", 0, 1},
	{"aio:any:EIO:every=5;aio:any:short:every=2", 1, 0},
};

static void spill_one(const char *backend, const struct spill_case *sc)
{
	uint32_t *all = conv_tokens();
	struct harness h = {0};
	struct kvp_pool_stats ps;
	struct timespec t0, t1;
	uint32_t whole, again;
	kvp_client *c;
	kvp_pool *p;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(start(&h, 0, backend, sc->rules), 0);
	connect_pool(&h, &c, &p);
	for (uint32_t i = 0; i < N_CONV; i++) {
		kvp_session *s;

		assert_int_equal(harness_pkv_commit_session(p, all + (size_t)i * CONV, CONV, &s),
				 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	/* Twice: the second pass reads back what the first brought in and
	 * pushed out again. */
	whole = match_all(p, all);
	again = match_all(p, all);
	if (again < whole)
		whole = again;
	ps = pool_stats(c, p);
	assert_true(ps.has_disk);
	assert_int_equal(ps.verify_failures, 0);
	if (sc->errors)
		assert_true(ps.io_errors > 0);
	if (sc->transparent) {
		assert_int_equal(ps.io_errors, 0);
		assert_int_equal(whole, N_CONV);
	}
	assert_true(ps.spilled_pages > 0);
	assert_int_equal(ps.leased_pages, 0);
	kvp_disconnect(c);

	/* A clean stop writes what only the host held (still under the
	 * fault); the daemon comes back without it and finds the spill
	 * file: whatever it lists reads right. */
	assert_int_equal(start(&h, SIGTERM, backend, NULL), 0);
	connect_pool(&h, &c, &p);
	again = match_all(p, all);
	if (sc->transparent)
		assert_int_equal(again, N_CONV);
	{
		/* A header write that failed left the extent's earlier header
		 * over new data: listed again, it fails verification (a miss,
		 * counted) rather than read wrong bytes. */
		struct kvp_pool_stats ps2 = pool_stats(c, p);

		if (sc->transparent)
			assert_int_equal(ps2.verify_failures, 0);
		assert_int_equal(ps2.io_errors, 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		fprintf(stderr,
			"%-8s %-46s %3llu spilled, %3llu promoted, %3llu I/O errors; %2u/%u whole; "
			"restarted: %3llu restored, %llu failed verification, %2u/%u whole; %.2f "
			"s\n",
			backend, sc->rules, (unsigned long long)ps.spilled_pages,
			(unsigned long long)ps.promoted_pages, (unsigned long long)ps.io_errors,
			whole, N_CONV, (unsigned long long)ps2.restored_pages,
			(unsigned long long)ps2.verify_failures, again, N_CONV,
			(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	}
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	free(all);
}

static void test_spill(void **state)
{
	const char *backend = *(const char *const *)*state;

	for (size_t i = 0; i < sizeof(spill_cases) / sizeof(spill_cases[0]); i++)
		spill_one(backend, &spill_cases[i]);
}

/* ---- checkpoints ------------------------------------------------------------ */

enum ck_expect {
	CK_OK,	     /* the checkpoint must succeed */
	CK_MAY_FAIL, /* may fail; a failure leaves the earlier one */
	CK_DIRSYNC,  /* may fail after the rename: the name holds old or new */
};

struct ck_case {
	const char *rules;
	enum ck_expect write;
	int read_may_fail; /* restores under the fault may fail */
};

/* Writes are the header (with the token records), one per page, then
 * the checksums and trailer: nth=1 fails the first file's header, nth=9
 * a page in the middle, nth=19 the second file's. Directory fsyncs are
 * the state and checkpoint directories' at start, then one per rename:
 * nth=3 fails the rewrite's. */
static const struct ck_case ck_cases[] = {
	{"ckpt:write:EIO:nth=1", CK_MAY_FAIL, 0},
	{"ckpt:write:EIO:nth=9", CK_MAY_FAIL, 0},
	{"ckpt:write:ENOSPC:nth=19", CK_MAY_FAIL, 0},
	{"ckpt:write:EDQUOT:every=5", CK_MAY_FAIL, 0},
	{"ckpt:write:ECANCELED:nth=3", CK_MAY_FAIL, 0},
	{"ckpt:fsync:EIO:once", CK_MAY_FAIL, 0},
	{"ckpt:fsync:EIO", CK_MAY_FAIL, 0},
	{"ckpt:dirsync:EIO:nth=3", CK_DIRSYNC, 0},
	{"ckpt:write:short", CK_OK, 0},
	{"ckpt:write:EINTR:every=2", CK_OK, 0},
	{"ckpt:read:short", CK_OK, 0},
	{"ckpt:read:EINTR:every=3", CK_OK, 0},
	{"ckpt:read:EIO:every=4", CK_OK, 1},
	{"ckpt:read:ECANCELED:nth=2", CK_OK, 1},
	{"ckpt:any:EIO:every=6;ckpt:any:short:every=2", CK_MAY_FAIL, 1},
};

/* Restores name into p: 0 with the tokens it holds checked byte for byte
 * against old (N_OLD tokens) or new (N_NEW), *ret_which 1 or 2; or the
 * error. */
static int restore_check(kvp_pool *p, const char *name, const uint32_t *old, const uint32_t *new,
			 int *ret_which)
{
	kvp_session *s;
	uint64_t n;
	int ret = kvp_session_restore(p, name, &s);

	if (ret < 0)
		return ret;
	n = kvp_session_tokens(s);
	assert_true(n == N_OLD || n == N_NEW);
	assert_int_equal(kvp_session_committed(s), n);
	assert_int_equal(harness_pkv_check_session(p, s, n == N_OLD ? old : new, 0, n), 0);
	assert_int_equal(kvp_session_close(s), 0);
	*ret_which = n == N_OLD ? 1 : 2;
	return 0;
}

/* No temporary is left in the tenant's checkpoint directory. */
static int temporaries(struct harness *h)
{
	char path[200];
	struct dirent *de;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "%.100s/state/checkpoints/%u", h->dir, (unsigned)getuid());
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		n += !strncmp(de->d_name, ".tmp-", 5);
	closedir(d);
	return n;
}

static void ck_one(const char *backend, const struct ck_case *cc, uint32_t *counts)
{
	uint32_t old[N_OLD], new[N_NEW];
	struct harness h = {0};
	struct kvp_stats *st;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int r_rewrite, r_new, which, ret;

	harness_tokens(old, N_OLD, 31, 0);
	harness_tokens(new, N_NEW, 32, 0);
	/* Without faults: the earlier checkpoint of "ck". */
	assert_int_equal(start(&h, 0, backend, NULL), 0);
	connect_pool(&h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, old, N_OLD, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "ck", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);

	/* Under the fault: rewrite "ck", write "ck-new". */
	assert_int_equal(start(&h, SIGTERM, backend, cc->rules), 0);
	connect_pool(&h, &c, &p);
	assert_int_equal(harness_pkv_commit_session(p, new, N_NEW, &s), 0);
	r_rewrite = kvp_session_checkpoint(s, "ck", NULL);
	r_new = kvp_session_checkpoint(s, "ck-new", NULL);
	assert_int_equal(kvp_session_close(s), 0);
	if (cc->write == CK_OK) {
		assert_int_equal(r_rewrite, 0);
		assert_int_equal(r_new, 0);
	}
	assert_true(r_rewrite == 0 || r_rewrite == -EIO || r_rewrite == -ENOSPC ||
		    r_rewrite == -ECANCELED);
	assert_true(r_new == 0 || r_new == -EIO || r_new == -ENOSPC || r_new == -ECANCELED);
	assert_int_equal(temporaries(&h), 0);
	st = NULL;
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(st->checkpoint_failures, (r_rewrite < 0) + (r_new < 0));
	kvp_stats_free(st);

	/* Restores under the fault: an error (read faults) or right bytes
	 * of the version the name must hold. */
	ret = restore_check(p, "ck", old, new, &which);
	if (ret < 0) {
		assert_true(cc->read_may_fail);
		counts[2]++;
	} else if (cc->write != CK_DIRSYNC) {
		assert_int_equal(which, r_rewrite == 0 ? 2 : 1);
	}
	ret = restore_check(p, "ck-new", old, new, &which);
	if (r_new == 0 || cc->write == CK_DIRSYNC) {
		if (ret < 0) {
			assert_true(cc->read_may_fail ||
				    (cc->write == CK_DIRSYNC && ret == -ENOENT));
			counts[2]++;
		} else {
			assert_int_equal(which, 2);
		}
	} else {
		assert_int_equal(ret, -ENOENT);
	}
	kvp_disconnect(c);

	/* Killed and restarted without the fault: every checkpoint reported
	 * durable restores exactly; a failed rewrite left the earlier one. */
	assert_int_equal(start(&h, SIGKILL, backend, NULL), 0);
	connect_pool(&h, &c, &p);
	assert_int_equal(restore_check(p, "ck", old, new, &which), 0);
	if (cc->write != CK_DIRSYNC || r_rewrite == 0)
		assert_int_equal(which, r_rewrite == 0 ? 2 : 1);
	ret = restore_check(p, "ck-new", old, new, &which);
	if (r_new == 0) {
		assert_int_equal(ret, 0);
		assert_int_equal(which, 2);
	} else if (cc->write != CK_DIRSYNC) {
		assert_int_equal(ret, -ENOENT);
	}
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	counts[0] += (r_rewrite < 0) + (r_new < 0);
	counts[1] += (r_rewrite == 0) + (r_new == 0);
	fprintf(stderr, "%-8s %-46s rewrite: %-24s new name: %s\n", backend, cc->rules,
		r_rewrite ? strerror(-r_rewrite) : "durable", r_new ? strerror(-r_new) : "durable");
}

static void test_checkpoint(void **state)
{
	const char *backend = *(const char *const *)*state;
	uint32_t counts[3] = {0};
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; i < sizeof(ck_cases) / sizeof(ck_cases[0]); i++)
		ck_one(backend, &ck_cases[i], counts);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr,
		"%s: %zu checkpoint fault rules: %u writes failed with an error, %u durable "
		"(all restored after SIGKILL), %u restores failed under read faults; %.1f s\n",
		backend, sizeof(ck_cases) / sizeof(ck_cases[0]), counts[0], counts[1], counts[2],
		(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
}

/* A bad specification stops the daemon at start. */
static void test_bad_spec(void **state)
{
	static const char *const bad[] = {
		"aio:write",
		"disk:write:EIO",
		"aio:dirsync:EIO",
		"aio:write:EPERM",
		"aio:write:EIO:every=0",
		"aio:read:EINTR",
		"ckpt:any:EAGAIN:after=2",
	};
	struct harness h = {0};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		h.pid = 0;
		fprintf(stderr, "expecting a refusal of '%s':\n", bad[i]);
		assert_int_not_equal(start(&h, 0, "auto", bad[i]), 0);
	}
}

int main(void)
{
	static const char *uring = "io_uring", *threads = "threads";
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_spec),
		cmocka_unit_test_prestate(test_spill, &uring),
		cmocka_unit_test_prestate(test_spill, &threads),
		cmocka_unit_test_prestate(test_checkpoint, &uring),
		cmocka_unit_test_prestate(test_checkpoint, &threads),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
