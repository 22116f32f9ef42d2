/* tests/integration/test_seccomp.c — kvpalaced where io_uring is denied, as
 * under Docker >= 25's and containerd 2's default seccomp profile (issue
 * 16): the daemon runs under tests/integration/noiouring ($KVP_NOIOURING),
 * a seccomp filter that makes io_uring_setup/enter/register fail with EPERM.
 *  - with event-loop auto (the default) it starts, logs once that
 *    io_uring is unavailable and why, and serves everything on epoll with
 *    the threads disk backend (Stats' disk_io): ping, pools (their arenas
 *    come as fds over SCM_RIGHTS), commits and matches from several
 *    processes at once, a working set four times the host tier that
 *    spills to disk and comes back byte for byte, a checkpoint and its
 *    restore, SIGHUP reloads (the signalfd) and a clean stop;
 *  - with event-loop io_uring it refuses to start and says why;
 *  - where only io_uring_enter is denied (the ring sets up, nothing goes
 *    through it) the daemon finds out at start and falls back the same;
 *  - event-loop epoll without the filter uses epoll, and logs no fallback;
 *  - a reload that changes event-loop needs a restart, and says so.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	   "seccomp-model"
#define BT	   16u
#define CONV_PAGES 16u
#define CONV	   (CONV_PAGES * BT)
#define N_CONV	   64
#define FALLBACK   "io_uring unavailable (Operation not permitted"

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: exactly 4096 bytes. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

struct fixture {
	struct harness h;
	char log[64]; /* the daemon's stderr */
};

enum { ALLOWED, DENIED, ENTER_DENIED };

/* Starts a daemon (under the seccomp filter when denied: every io_uring
 * call, or io_uring_enter alone) whose stderr goes to f->log. Returns
 * harness_start's result; f->log stays either way. */
static int start_logged(struct fixture *f, int denied, const char *const *extra)
{
	const char *old = getenv("KVPALACED_WRAPPER");
	int fd, saved, ret;

	snprintf(f->log, sizeof(f->log), "/tmp/kvp-seccomp-XXXXXX");
	fd = mkstemp(f->log);
	assert_true(fd >= 0);
	if (denied) {
		char wrap[512];

		/* Inside whatever wrapper the test setup gives (valgrind). */
		snprintf(wrap, sizeof(wrap), "%s %s%s", old ? old : "", getenv("KVP_NOIOURING"),
			 denied == ENTER_DENIED ? " --enter-only" : "");
		setenv("KVPALACED_WRAPPER", wrap, 1);
	}
	saved = dup(STDERR_FILENO);
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	ret = harness_start(&f->h, extra);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(fd);
	if (denied) {
		if (old)
			setenv("KVPALACED_WRAPPER", old, 1);
		else
			unsetenv("KVPALACED_WRAPPER");
	}
	return ret;
}

/* The log so far (NUL-terminated, malloc'd), also copied to our stderr. */
static char *read_log(const struct fixture *f)
{
	FILE *fp = fopen(f->log, "r");
	char *buf = calloc(1, 1 << 20);
	size_t n;

	assert_non_null(fp);
	assert_non_null(buf);
	n = fread(buf, 1, (1 << 20) - 1, fp);
	buf[n] = '\0';
	fclose(fp);
	fprintf(stderr, "---- daemon log ----\n%s---- end ----\n", buf);
	return buf;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* The log holds needle, waiting up to 5 s for the daemon to write it. */
static int log_has(const struct fixture *f, const char *needle)
{
	for (int i = 0; i < 500; i++) {
		FILE *fp = fopen(f->log, "r");
		char line[1024];
		int found = 0;

		if (fp) {
			while (!found && fgets(line, sizeof(line), fp))
				found = strstr(line, needle) != NULL;
			fclose(fp);
		}
		if (found)
			return 1;
		usleep(10000);
	}
	return 0;
}

static int setup_denied(void **state)
{
	static const char *const extra[] = {"--host-pool-size", "1M", "--disk-pool-size", "16M",
					    NULL};
	struct fixture *f = calloc(1, sizeof(*f));

	if (!getenv("KVP_NOIOURING")) {
		free(f);
		return -1;
	}
	if (start_logged(f, DENIED, extra) < 0) {
		free(read_log(f));
		unlink(f->log);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	int ret = harness_stop(&f->h);

	unlink(f->log);
	free(f);
	return ret;
}

struct job {
	const char *sock;
	const uint32_t *all;
	int from, to;
};

/* A child: writes and commits conversations [from, to) and closes them. */
static int write_convs(void *arg)
{
	const struct job *j = arg;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK(kvp_connect(j->sock, &c) == 0);
	CHILD_CHECK(kvp_ping(c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL, &page4k, &p) == 0);
	for (int i = j->from; i < j->to; i++) {
		kvp_session *s;

		CHILD_CHECK(harness_pkv_commit_session(p, j->all + (size_t)i * CONV, CONV, &s) ==
			    0);
		CHILD_CHECK(kvp_session_close(s) == 0);
	}
	kvp_disconnect(c);
	return 0;
}

/* A child: matches conversations [from, to): every one whole, every byte
 * the one written. */
static int read_convs(void *arg)
{
	const struct job *j = arg;
	kvp_client *c;
	kvp_pool *p;

	CHILD_CHECK(kvp_connect(j->sock, &c) == 0);
	CHILD_CHECK(kvp_pool_open(c, MODEL, &page4k, &p) == 0);
	for (int i = j->from; i < j->to; i++) {
		const uint32_t *t = j->all + (size_t)i * CONV;
		kvp_lease *l;

		CHILD_CHECK(kvp_match_prefix(p, t, CONV, &l) == 0);
		CHILD_CHECK_EQ(kvp_lease_tokens(l), CONV);
		CHILD_CHECK_EQ(harness_pkv_check_lease(l, p, t, CONV), 0);
		CHILD_CHECK(kvp_lease_release(l) == 0);
	}
	kvp_disconnect(c);
	return 0;
}

static void test_fallback_serves(void **state)
{
	struct fixture *f = *state;
	uint32_t *all = calloc((size_t)N_CONV * CONV, sizeof(uint32_t));
	uint32_t tokens[40];
	struct kvp_pool_stats ps;
	struct kvp_stats *st;
	pid_t w[4], r[2];
	kvp_session *s;
	kvp_client *c;
	kvp_pool *p;
	char *log;

	/* One line says why, and what serves instead. */
	log = read_log(f);
	assert_int_equal(count(log, "io_uring unavailable"), 1);
	assert_non_null(strstr(log, FALLBACK));
	assert_non_null(strstr(log, "using epoll and the threads disk backend"));
	assert_non_null(strstr(log, "epoll event loop"));
	free(log);

	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	fprintf(stderr, "disk_io: %s\n", st->disk_io);
	assert_int_equal(strncmp(st->disk_io, "threads", 7), 0);
	assert_string_equal(st->event_loop, "epoll");
	kvp_stats_free(st);

	/* Four writers at once, 4x the host tier between them, then two
	 * readers at once: pages went host -> disk -> host. */
	assert_non_null(all);
	for (int i = 0; i < N_CONV; i++)
		harness_tokens(all + (size_t)i * CONV, CONV, 900 + (uint32_t)i, 0);
	struct job wj[4], rj[2];
	for (int i = 0; i < 4; i++) {
		wj[i] = (struct job){f->h.sock, all, i * N_CONV / 4, (i + 1) * N_CONV / 4};
		w[i] = harness_fork(write_convs, &wj[i]);
	}
	for (int i = 0; i < 4; i++)
		assert_int_equal(harness_wait(w[i], 120), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	fprintf(stderr, "after writing: %llu spilled, %u on disk, %u indexed\n",
		(unsigned long long)ps.spilled_pages, ps.disk_pages, ps.indexed_pages);
	assert_true(ps.has_disk);
	assert_int_equal(ps.indexed_pages, N_CONV * CONV_PAGES);
	assert_true(ps.spilled_pages >= N_CONV * CONV_PAGES - 256);
	for (int i = 0; i < 2; i++) {
		rj[i] = (struct job){f->h.sock, all, i * N_CONV / 2, (i + 1) * N_CONV / 2};
		r[i] = harness_fork(read_convs, &rj[i]);
	}
	for (int i = 0; i < 2; i++)
		assert_int_equal(harness_wait(r[i], 120), 0);
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_true(ps.promoted_pages >= N_CONV * CONV_PAGES - 256);
	assert_int_equal(ps.verify_failures, 0);
	assert_int_equal(ps.io_errors, 0);

	/* A checkpoint (written and read by the workers) and its restore. */
	harness_tokens(tokens, 40, 77, 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_session_checkpoint(s, "in-a-container", NULL), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(kvp_session_restore(p, "in-a-container", &s), 0);
	assert_int_equal(kvp_session_tokens(s), 40);
	assert_int_equal(harness_pkv_check_session(p, s, tokens, 0, 40), 0);
	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
	free(all);

	/* Signals come through the signalfd: a reload, then (teardown) a
	 * clean stop that must exit 0. */
	kill(f->h.pid, SIGHUP);
	assert_true(log_has(f, "SIGHUP: configuration reloaded"));
	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

/* Asked for io_uring where it is denied: no start, and the log says why. */
static void test_forced_uring_refused(void **state)
{
	static const char *const extra[] = {"--event-loop", "io_uring", NULL};
	struct fixture f;
	char *log;

	(void)state;
	if (!getenv("KVP_NOIOURING"))
		skip();
	memset(&f, 0, sizeof(f));
	assert_int_equal(start_logged(&f, DENIED, extra), -1);
	log = read_log(&f);
	assert_non_null(strstr(log, "cannot set up io_uring: Operation not permitted"));
	assert_int_equal(count(log, "io_uring unavailable"), 0);
	free(log);
	unlink(f.log);
}

/* event-loop epoll where io_uring works: epoll, threads, no fallback line. */
static void test_forced_epoll(void **state)
{
	static const char *const extra[] = {"--event-loop", "epoll", "--disk-pool-size", "16M",
					    NULL};
	struct kvp_stats *st;
	struct fixture f;
	kvp_client *c;
	char *log;

	(void)state;
	memset(&f, 0, sizeof(f));
	assert_int_equal(start_logged(&f, ALLOWED, extra), 0);
	assert_int_equal(kvp_connect(f.h.sock, &c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(strncmp(st->disk_io, "threads", 7), 0);
	assert_string_equal(st->event_loop, "epoll");
	kvp_stats_free(st);
	kvp_disconnect(c);
	log = read_log(&f);
	assert_non_null(strstr(log, "epoll event loop"));
	assert_int_equal(count(log, "io_uring unavailable"), 0);
	free(log);
	assert_int_equal(harness_stop(&f.h), 0);
	unlink(f.log);
}

/* A ring that can be set up but not entered: found at start, epoll then. */
static void test_enter_denied(void **state)
{
	static const char *const extra[] = {"--disk-pool-size", "16M", NULL};
	struct kvp_stats *st;
	struct fixture f;
	kvp_client *c;
	char *log;

	(void)state;
	if (!getenv("KVP_NOIOURING"))
		skip();
	memset(&f, 0, sizeof(f));
	assert_int_equal(start_logged(&f, ENTER_DENIED, extra), 0);
	assert_int_equal(kvp_connect(f.h.sock, &c), 0);
	assert_int_equal(kvp_ping(c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(strncmp(st->disk_io, "threads", 7), 0);
	kvp_stats_free(st);
	kvp_disconnect(c);
	log = read_log(&f);
	assert_int_equal(count(log, "io_uring unavailable"), 1);
	assert_non_null(strstr(log, FALLBACK));
	free(log);
	assert_int_equal(harness_stop(&f.h), 0);
	unlink(f.log);
}

/* The event loop is chosen once: a reload leaves it and says so. */
static void test_reload_needs_restart(void **state)
{
	char conf[64], arg[80];
	const char *extra[] = {arg, NULL};
	struct fixture f;
	FILE *fp;

	(void)state;
	snprintf(conf, sizeof(conf), "/tmp/kvp-seccomp-%d.conf", (int)getpid());
	snprintf(arg, sizeof(arg), "--config=%s", conf);
	fp = fopen(conf, "w");
	assert_non_null(fp);
	fprintf(fp, "event-loop = epoll\n");
	fclose(fp);
	memset(&f, 0, sizeof(f));
	assert_int_equal(start_logged(&f, ALLOWED, extra), 0);
	fp = fopen(conf, "w");
	assert_non_null(fp);
	fprintf(fp, "event-loop = io_uring\n");
	fclose(fp);
	kill(f.h.pid, SIGHUP);
	assert_true(log_has(&f, "a restart is needed for event-loop"));
	free(read_log(&f));
	assert_int_equal(harness_stop(&f.h), 0);
	unlink(f.log);
	unlink(conf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fallback_serves, setup_denied, teardown),
		cmocka_unit_test(test_forced_uring_refused),
		cmocka_unit_test(test_enter_denied),
		cmocka_unit_test(test_forced_epoll),
		cmocka_unit_test(test_reload_needs_restart),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
