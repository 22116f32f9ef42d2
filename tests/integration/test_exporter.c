/* tests/integration/test_exporter.c — kvpalace-exporter as Prometheus
 * meets it: a real kvpalaced, a pool with committed pages, the exporter
 * on a free loopback port, the page fetched over HTTP and parsed by
 * prometheus_client (check_metrics.py, which also checks the histogram
 * rules and runs promtool where installed), curl for the status codes.
 *
 * Cases: a scrape of a live daemon (up 1, build info, the pool's page
 * gauges and page_bytes, the counters); the same exporter once the daemon
 * is gone (200 with up 0); a daemon that accepts but never answers (up 0
 * within --timeout, twice); 404, 405 and HEAD; and socket activation
 * through systemd-socket-activate (skipped where it is missing); and
 * the units, through systemd-analyze verify and security.
 *
 * The exporter comes from $KVP_EXPORTER, the checker from
 * $KVP_CHECK_METRICS, curl from $PATH (skipped where missing).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL  "exporter \"test\" model"
#define PYTHON "/usr/bin/python3"

static char out[1 << 18];

struct exporter {
	pid_t pid;
	char url[64]; /* http://127.0.0.1:PORT */
};

/* Starts the exporter with args (NULL-terminated) after
 * --listen 127.0.0.1:0 and reads the address it bound from its stdout. */
static void exporter_start(struct exporter *e, const char *admin, const char *const *args)
{
	const char *bin = getenv("KVP_EXPORTER");
	char *argv[16] = {(char *)bin, "--listen", "127.0.0.1:0", "--admin-socket", (char *)admin};
	char line[64] = "";
	size_t n = 5, used = 0;
	int p[2];

	assert_non_null(bin);
	for (; args && *args && n < 15; args++)
		argv[n++] = (char *)*args;
	argv[n] = NULL;
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	fflush(stdout);
	fflush(stderr);
	e->pid = fork();
	assert_true(e->pid >= 0);
	if (e->pid == 0) {
		/* Gone with the test, should an assertion end it first. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(p[1], STDOUT_FILENO);
		execv(bin, argv);
		_exit(127);
	}
	close(p[1]);
	while (used + 1 < sizeof(line) && !strchr(line, '\n')) {
		ssize_t r = read(p[0], line + used, sizeof(line) - 1 - used);

		if (r <= 0)
			break;
		used += (size_t)r;
		line[used] = 0;
	}
	close(p[0]);
	line[strcspn(line, "\n")] = 0;
	if (strncmp(line, "127.0.0.1:", 10))
		fail_msg("the exporter printed no address: '%s'", line);
	snprintf(e->url, sizeof(e->url), "http://%s", line);
}

/* SIGTERM; it must exit 0. */
static void exporter_stop(struct exporter *e)
{
	if (e->pid <= 0)
		return;
	kill(e->pid, SIGTERM);
	assert_int_equal(harness_wait(e->pid, 20), 0);
	e->pid = 0;
}

/* check_metrics.py on url + path with the expectations (NULL-terminated);
 * fails the test with its output unless all hold. */
static void check(const char *url, const char *path, const char *const *expect)
{
	const char *script = getenv("KVP_CHECK_METRICS");
	char full[128];
	char *argv[40] = {PYTHON, (char *)script, full};
	size_t n = 3;
	int rc;

	assert_non_null(script);
	snprintf(full, sizeof(full), "%s%s", url, path);
	for (; expect && *expect && n < 39; expect++)
		argv[n++] = (char *)*expect;
	argv[n] = NULL;
	rc = harness_run_capture(argv, NULL, out, sizeof(out));
	if (rc != 0)
		fail_msg("check_metrics.py %s (exit %d):\n%s", full, rc, out);
}

static int have(const char *path)
{
	return access(path, X_OK) == 0;
}

/* curl's status code for method on url + path; the body's size in
 * *ret_size when not NULL. -1 when curl failed. */
static int http_status(const char *method, const char *url, const char *path, long *ret_size)
{
	char full[128];
	char *argv[] = {"/usr/bin/curl",
			"-s",
			"-o",
			"/dev/null",
			"-w",
			"%{http_code} %{size_download}",
			"-X",
			(char *)method,
			full,
			NULL};
	char *argv_head[] = {"/usr/bin/curl",
			     "-s",
			     "-I",
			     "-o",
			     "/dev/null",
			     "-w",
			     "%{http_code} %{size_download}",
			     full,
			     NULL};
	int code = -1;
	long size = -1;

	snprintf(full, sizeof(full), "%s%s", url, path);
	if (harness_run_capture(strcmp(method, "HEAD") ? argv : argv_head, NULL, out,
				sizeof(out)) != 0)
		return -1;
	if (sscanf(out, "%d %ld", &code, &size) != 2)
		return -1;
	if (ret_size)
		*ret_size = size;
	return code;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int have_python_parser(void)
{
	char *argv[] = {PYTHON, "-c", "import prometheus_client.parser", NULL};

	return have(PYTHON) && harness_run_capture(argv, NULL, out, sizeof(out)) == 0;
}

/* A live daemon with a pool holding 4 committed pages, then the same
 * exporter after the daemon stopped. */
static void test_scrape(void **state)
{
	struct harness h = {0};
	struct exporter e = {0};
	uint32_t tokens[64];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	char pool_l[64], page_bytes[160], used[128], cap[128], indexed[96], sessions[96];
	char build[96];
	long size;

	(void)state;
	assert_int_equal(harness_start(&h, NULL), 0);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	harness_tokens(tokens, 64, 1, 0);
	assert_int_equal(harness_commit_session(p, tokens, 64, &s), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 64, &l), 0);
	assert_int_equal(kvp_lease_release(l), 0);

	/* Summed over the pools by default: whoever reaches the port reads
	 * no tenant's uid or model. */
	exporter_start(&e, h.admin_sock, NULL);
	check(e.url, "/metrics",
	      (const char *[]){"kvpalace_up==1", "kvpalace_pools==1",
			       "kvpalace_pool_pages{tier=host,state=used}>=4",
			       "kvpalace_pool_capacity_pages{tier=host}>=4",
			       "kvpalace_pool_indexed_pages==4", "kvpalace_pool_sessions==1",
			       "kvpalace_pool_tier_present{tier=host}==1", "!kvpalace_page_bytes",
			       "!label:uid", "!label:model", "!label:pool", NULL});
	exporter_stop(&e);

	/* --per-pool: a sample per pool, with its uid and model. */
	exporter_start(&e, h.admin_sock, (const char *[]){"--per-pool", NULL});
	snprintf(pool_l, sizeof(pool_l), "pool=%" PRIu64, kvp_pool_id(p));
	/* The model label as written, quotes and all: check_metrics matches
	 * the parsed (unescaped) value. */
	snprintf(page_bytes, sizeof(page_bytes), "kvpalace_page_bytes{%s,model=%s}==8192", pool_l,
		 MODEL);
	snprintf(used, sizeof(used), "kvpalace_pool_pages{%s,tier=host,state=used}>=4", pool_l);
	snprintf(cap, sizeof(cap), "kvpalace_pool_capacity_pages{%s,tier=host}>=4", pool_l);
	snprintf(indexed, sizeof(indexed), "kvpalace_pool_indexed_pages{%s}==4", pool_l);
	snprintf(sessions, sizeof(sessions), "kvpalace_pool_sessions{%s}==1", pool_l);
	snprintf(build, sizeof(build),
		 "kvpalace_build_info{component=kvpalace-exporter,version=%s}==1", KVP_VERSION);
	check(e.url, "/metrics",
	      (const char *[]){"kvpalace_up==1", build,
			       "kvpalace_build_info{component=kvpalaced}==1", page_bytes, used, cap,
			       indexed, sessions, "kvpalace_committed_tokens_total>=64",
			       "kvpalace_match_hits_total>=1", "kvpalace_matched_tokens_total>=64",
			       "kvpalace_pools>=1", "kvpalace_pool_tier_present{tier=host}==1",
			       "kvpalace_evictions_total>=0", "kvpalace_disconnects_bad_total==0",
			       "!kvpalace_evicted_pages_total", "!kvpalace_bad_disconnects_total",
			       NULL});

	/* The HTTP side, with curl. */
	if (have("/usr/bin/curl")) {
		assert_int_equal(http_status("GET", e.url, "/nope", NULL), 404);
		assert_int_equal(http_status("POST", e.url, "/metrics", NULL), 405);
		assert_int_equal(http_status("DELETE", e.url, "/", NULL), 405);
		assert_int_equal(http_status("GET", e.url, "/", &size), 200);
		assert_true(size > 0);
		assert_int_equal(http_status("HEAD", e.url, "/metrics", &size), 200);
		assert_int_equal(size, 0);
	}

	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	/* Daemon gone: still a page, with up 0 and only the exporter's info. */
	check(e.url, "/metrics",
	      (const char *[]){"kvpalace_up==0", build, "!kvpalace_build_info{component=kvpalaced}",
			       "!kvpalace_requests_total", NULL});
	exporter_stop(&e);
}

/* An admin socket that takes connections and never answers: the scrape
 * must still end within --timeout with up 0, and so must the next one
 * (the first scrape still waits on the daemon). */
static void test_stuck_daemon(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct exporter e = {0};
	char dir[] = "/tmp/kvpexp-XXXXXX";
	double t0;
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/admin.sock", dir);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 8), 0);

	exporter_start(&e, sa.sun_path, (const char *[]){"--timeout", "1", NULL});
	for (int i = 0; i < 2; i++) {
		t0 = now_s();
		check(e.url, "/metrics", (const char *[]){"kvpalace_up==0", NULL});
		if (now_s() - t0 > 8)
			fail_msg("scrape %d of a stuck daemon took %.1f s with --timeout 1", i,
				 now_s() - t0);
	}
	exporter_stop(&e);
	close(fd);
	unlink(sa.sun_path);
	rmdir(dir);
}

/* A free loopback port (bound, read, closed: another process could take
 * it in between, which this test accepts). */
static int free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/* systemd-socket-activate listens and passes the socket, as
 * kvpalace-exporter.socket does; the exporter must serve on it. */
static void test_socket_activation(void **state)
{
	const char *bin = getenv("KVP_EXPORTER");
	struct harness h = {0};
	char listen_arg[32], url[64];
	pid_t pid;
	int port, ok = 0;

	(void)state;
	if (!have("/usr/bin/systemd-socket-activate")) {
		fprintf(stderr, "systemd-socket-activate not found: skipping\n");
		skip();
	}
	assert_int_equal(harness_start(&h, NULL), 0);
	port = free_port();
	snprintf(listen_arg, sizeof(listen_arg), "127.0.0.1:%d", port);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/usr/bin/systemd-socket-activate", "systemd-socket-activate", "-l",
		      listen_arg, bin, "--admin-socket", h.admin_sock, NULL);
		_exit(127);
	}
	/* It listens before it starts the exporter; wait for the port. */
	for (int i = 0; i < 100 && !ok; i++) {
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (!ok)
			usleep(50 * 1000);
	}
	assert_true(ok);
	check(url, "/metrics", (const char *[]){"kvpalace_up==1", "kvpalace_pools==0", NULL});
	/* systemd-socket-activate exec'd the exporter: same pid. */
	kill(pid, SIGTERM);
	assert_int_equal(harness_wait(pid, 20), 0);
	assert_int_equal(harness_stop(&h), 0);
}

/* The units as installed, with ExecStart= on the exporter just built:
 * `systemd-analyze verify` prints nothing, and `systemd-analyze security`
 * rates the service at most 1.5, the daemon's threshold (test_units.c). */
static void test_units(void **state)
{
	const char *unit_dir = getenv("KVP_UNIT_DIR"), *bin = getenv("KVP_EXPORTER");
	const char *analyze = "/usr/bin/systemd-analyze";
	char dir[] = "/tmp/kvpexu-XXXXXX", cmd[1024], svc[64], sock[64];
	int rc;

	(void)state;
	if (!have(analyze)) {
		fprintf(stderr, "systemd-analyze not found: skipping\n");
		skip();
	}
	assert_non_null(unit_dir);
	assert_non_null(mkdtemp(dir));
	snprintf(cmd, sizeof(cmd),
		 "sed 's|^ExecStart=[^ ]*|ExecStart=%s|' '%s/kvpalace-exporter.service' > "
		 "'%s/kvpalace-exporter.service' && cp '%s/kvpalace-exporter.socket' '%s/'",
		 bin, unit_dir, dir, unit_dir, dir);
	assert_int_equal(system(cmd), 0);
	snprintf(svc, sizeof(svc), "%s/kvpalace-exporter.service", dir);
	snprintf(sock, sizeof(sock), "%s/kvpalace-exporter.socket", dir);
	{
		char *argv[] = {(char *)analyze, "verify", "--man=no", svc, sock, NULL};

		rc = harness_run_capture(argv, NULL, out, sizeof(out));
		if (rc != 0 || out[0])
			fail_msg("systemd-analyze verify (exit %d):\n%s", rc, out);
	}
	{
		char *argv[] = {(char *)analyze,
				"security",
				"--offline=true",
				"--threshold=15",
				"--no-pager",
				svc,
				NULL};

		rc = harness_run_capture(argv, NULL, out, sizeof(out));
		if (rc != 0 || !strstr(out, "Overall exposure"))
			fail_msg("systemd-analyze security (exit %d):\n%s", rc, out);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scrape),
		cmocka_unit_test(test_stuck_daemon),
		cmocka_unit_test(test_socket_activation),
		cmocka_unit_test(test_units),
	};

	if (!have_python_parser()) {
		fprintf(stderr, "%s with prometheus_client not found: skipping\n", PYTHON);
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
