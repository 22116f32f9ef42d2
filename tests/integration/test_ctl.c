/* tests/integration/test_ctl.c — kvpalacectl against the admin socket.
 *
 * Runs the real binary ($KVPALACECTL) as a user would, against a real
 * daemon: `ping`, `stats`, `status`, `pools`, `sessions` and `metrics`
 * report what a client committed; `session show` describes one session
 * (tokens, pages, writer, salt, page slots); `drop session` and `drop
 * pool` refuse what is in use without --force and with it leave leases
 * readable; `evict` frees whole pages of the prefix index in several
 * requests and draws a progress bar only on a terminal; `config show`
 * and `config reload` read and re-read a configuration file. Each
 * command's --json output is valid JSON, and golden tests compare whole
 * documents (volatile fields such as ids and times masked), so a field
 * that disappears or changes name fails. Every command has help (`help
 * CMD`, `CMD --help`); exit statuses are 0 success, 1 the daemon refused,
 * 2 usage, 3 cannot connect; the client socket refuses every admin
 * operation with STATUS_PERMISSION (through the raw protocol).
 * Checkpoints: `checkpoint` writes a session's file (its size as the
 * format says), `checkpoints` lists it (and says why a truncated file
 * cannot be restored), `restore` rebuilds it (into its own pool, a given
 * pool, another user's; its pages shared with the index and reading
 * right through the library), `warmup` refills a dropped pool's index
 * from a checkpoint or from the warm-up directory so a match reads the
 * same K/V; corrupt, truncated, foreign and missing files are refused
 * (exit 1), bad names never reach the daemon (exit 2), the counters show
 * in status, stats and metrics, and a spinner is drawn only on a
 * terminal.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "ctl-test-model"
#define ST(x) KVPALACE__V1__STATUS__STATUS_##x

static char out[1 << 16];

static int ctl6(char *env_entry, const char *a1, const char *a2, const char *a3, const char *a4,
		const char *a5, const char *a6)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[8] = {(char *)bin, (char *)a1, (char *)a2, (char *)a3,
			 (char *)a4,  (char *)a5, (char *)a6, NULL};
	char *env[2] = {env_entry, NULL};

	assert_non_null(bin);
	return harness_run_capture(argv, env, out, sizeof(out));
}

static int ctl(char *env_entry, const char *a1, const char *a2, const char *a3, const char *a4)
{
	return ctl6(env_entry, a1, a2, a3, a4, NULL, NULL);
}

/* Runs kvpalacectl --socket sock with the NULL-terminated arguments after
 * sock; output in out. Returns the exit status. */
static int ctlv(const char *sock, ...)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[24] = {(char *)bin, "--socket", (char *)sock};
	int n = 3;
	va_list ap;

	assert_non_null(bin);
	va_start(ap, sock);
	while (n < 23 && (argv[n] = va_arg(ap, char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	return harness_run_capture(argv, NULL, out, sizeof(out));
}

/* ctlv that fails the test unless the exit status is want. */
#define CTL_EXPECT(want, ...)                                                                      \
	do {                                                                                       \
		int st_ = ctlv(__VA_ARGS__, NULL);                                                 \
		if (st_ != (want))                                                                 \
			fail_msg("%s:%d: kvpalacectl exited %d, expected %d:\n%s", __FILE__,       \
				 __LINE__, st_, (want), out);                                      \
	} while (0)

/* Fails unless out contains the text of fmt. */
static void expect_out(const char *what, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void expect_out(const char *what, const char *fmt, ...)
{
	char want[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(want, sizeof(want), fmt, ap);
	va_end(ap);
	if (!strstr(out, want))
		fail_msg("%s: no '%s' in:\n%s", what, want, out);
}

/* ---- JSON checks -------------------------------------------------------- */

/* A small recursive-descent JSON syntax check: returns the end of the
 * value at s, or NULL when it is not valid JSON. */
static const char *json_ws(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	return s;
}

static const char *json_value(const char *s, int depth);

static const char *json_string_end(const char *s)
{
	if (*s++ != '"')
		return NULL;
	while (*s && *s != '"') {
		if ((unsigned char)*s < 0x20)
			return NULL;
		if (*s == '\\') {
			s++;
			if (*s == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i])
						return NULL;
				s += 4;
			} else if (!*s || !strchr("\"\\/bfnrt", *s)) {
				return NULL;
			}
		}
		s++;
	}
	return *s == '"' ? s + 1 : NULL;
}

static const char *json_number_end(const char *s)
{
	const char *start = s;

	if (*s == '-')
		s++;
	if (*s == '0')
		s++;
	else if (*s >= '1' && *s <= '9')
		while (*s >= '0' && *s <= '9')
			s++;
	else
		return NULL;
	if (*s == '.') {
		s++;
		if (*s < '0' || *s > '9')
			return NULL;
		while (*s >= '0' && *s <= '9')
			s++;
	}
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '+' || *s == '-')
			s++;
		if (*s < '0' || *s > '9')
			return NULL;
		while (*s >= '0' && *s <= '9')
			s++;
	}
	return s > start ? s : NULL;
}

static const char *json_value(const char *s, int depth)
{
	if (depth > 64)
		return NULL;
	s = json_ws(s);
	if (*s == '{' || *s == '[') {
		char close = *s == '{' ? '}' : ']';

		s = json_ws(s + 1);
		if (*s == close)
			return s + 1;
		for (;;) {
			if (close == '}') {
				s = json_string_end(json_ws(s));
				if (!s)
					return NULL;
				s = json_ws(s);
				if (*s++ != ':')
					return NULL;
			}
			s = json_value(s, depth + 1);
			if (!s)
				return NULL;
			s = json_ws(s);
			if (*s == close)
				return s + 1;
			if (*s++ != ',')
				return NULL;
		}
	}
	if (*s == '"')
		return json_string_end(s);
	if (!strncmp(s, "true", 4))
		return s + 4;
	if (!strncmp(s, "false", 5))
		return s + 5;
	if (!strncmp(s, "null", 4))
		return s + 4;
	return json_number_end(s);
}

/* Fails unless out is exactly one JSON object and a newline. */
static void expect_json(const char *what)
{
	const char *end = out[0] == '{' ? json_value(out, 0) : NULL;

	if (!end || strcmp(end, "\n") != 0)
		fail_msg("%s: not one JSON object and a newline:\n%s", what, out);
}

/* Replaces the value of every "key": in out by *, so a golden document
 * can ignore what varies from run to run (ids, times, paths); null stays,
 * so a field that is absent still shows. */
static void mask(const char *key)
{
	char pat[64];
	char *p = out;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	while ((p = strstr(p, pat)) != NULL) {
		char *v = p + strlen(pat), *end;

		if (!strncmp(v, "null", 4)) {
			p = v + 4;
			continue;
		}
		end = (char *)(*v == '"' ? json_string_end(v) : json_value(v, 0));
		assert_non_null(end);
		*v = '*';
		memmove(v + 1, end, strlen(end) + 1);
		p = v + 1;
	}
}

/* Replaces every occurrence of what in out by with. */
static void replace_all(const char *what, const char *with)
{
	size_t wl = strlen(what), nl = strlen(with);
	char *p = out;

	while ((p = strstr(p, what)) != NULL) {
		assert_true(strlen(out) + nl - wl < sizeof(out));
		memmove(p + nl, p + wl, strlen(p + wl) + 1);
		memcpy(p, with, nl);
		p += nl;
	}
}

/* Fails unless out, once masked, is the document want (and a newline). */
static void expect_golden(const char *what, const char *want)
{
	size_t n = strlen(out);

	if (n && out[n - 1] == '\n')
		out[n - 1] = '\0';
	if (strcmp(out, want) != 0)
		fail_msg("%s: the JSON document changed.\n got: %s\nwant: %s", what, out, want);
}

static void test_ctl(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char want[128], env_entry[160];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	int ret;

	harness_tokens(tokens, 40, 60, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, tokens, 40), 0);
	assert_int_equal(kvp_commit(s, 40), 0);

	ret = ctl(NULL, "--socket", h->admin_sock, "ping", NULL);
	if (ret != 0)
		fail_msg("ping exited %d: %s", ret, out);

	ret = ctl(NULL, "--socket", h->admin_sock, "stats", NULL);
	if (ret != 0)
		fail_msg("stats exited %d: %s", ret, out);
	assert_non_null(strstr(out, MODEL));

	ret = ctl(NULL, "--socket", h->admin_sock, "stats", "--json");
	if (ret != 0)
		fail_msg("stats --json exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	assert_non_null(strstr(out, "\"" MODEL "\""));
	snprintf(want, sizeof(want), "\"pool_id\":%" PRIu64, kvp_pool_id(p));
	if (!strstr(out, want))
		fail_msg("no %s in %s", want, out);
	/* 40 tokens of 16 per page: 3 pages used. */
	if (!strstr(out, "\"used_pages\":3"))
		fail_msg("no used_pages 3 in %s", out);
	if (!strstr(out, "\"committed_tokens\":40"))
		fail_msg("no committed_tokens 40 in %s", out);

	/* The socket from the environment. */
	snprintf(env_entry, sizeof(env_entry), "KVPALACE_ADMIN_SOCKET=%s", h->admin_sock);
	ret = ctl(env_entry, "stats", NULL, NULL, NULL);
	if (ret != 0)
		fail_msg("stats with $KVPALACE_ADMIN_SOCKET exited %d: %s", ret, out);
	assert_non_null(strstr(out, MODEL));

	/* No daemon there: exit 3. A bad command: exit 2. */
	snprintf(env_entry, sizeof(env_entry), "%s/nobody-listens.sock", h->dir);
	assert_int_equal(ctl(NULL, "--socket", env_entry, "ping", NULL), 3);
	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, "frobnicate", NULL), 2);
	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, NULL, NULL), 2);

	assert_int_equal(kvp_session_close(s), 0);
	kvp_disconnect(c);
}

static void test_ctl_pools_sessions(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char pool_id[32], pool_id_num[32];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s1, *s2, *s3;
	int ret;

	harness_tokens(tokens, 40, 61, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, MODEL "-other", &harness_layout, &q), 0);
	/* s1: 40 committed (2 full pages indexed); s2: the same 40, 20 of
	 * them committed (its first page deduplicated), still writing. */
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s1), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, tokens, 40), 0);
	assert_int_equal(harness_pkv_write_session(p, s2, tokens, 0, 40), 0);
	assert_int_equal(kvp_commit(s2, 20), 0);
	assert_int_equal(kvp_session_create(q, &s3), 0);
	snprintf(pool_id, sizeof(pool_id), "%" PRIu64, kvp_pool_id(p));
	snprintf(pool_id_num, sizeof(pool_id_num), "%" PRIu64, kvp_pool_id(p));

	ret = ctl(NULL, "--socket", h->admin_sock, "pools", NULL);
	if (ret != 0)
		fail_msg("pools exited %d: %s", ret, out);
	expect_out("pools", "%s", MODEL);
	expect_out("pools", "%s", "INDEXED");
	ret = ctl(NULL, "--socket", h->admin_sock, "--json", "pools");
	if (ret != 0)
		fail_msg("pools --json exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	expect_out("pools --json", "\"pool_id\":%s", pool_id);
	expect_out("pools --json", "\"indexed_pages\":%d", 2);
	expect_out("pools --json", "\"dedup_pages\":%d", 1);
	expect_out("pools --json", "\"n_sessions\":%d", 2);
	expect_out("pools --json", "\"used_pages\":%d", 5);

	ret = ctl(NULL, "--socket", h->admin_sock, "sessions", NULL);
	if (ret != 0)
		fail_msg("sessions exited %d: %s", ret, out);
	expect_out("sessions", "%" PRIu64 " ", kvp_session_id(s1));
	expect_out("sessions", "%" PRIu64 " ", kvp_session_id(s3));
	expect_out("sessions", "%s", "yes");
	ret = ctl6(NULL, "--socket", h->admin_sock, "--json", "sessions", "--pool", pool_id);
	if (ret != 0)
		fail_msg("sessions --json --pool exited %d: %s", ret, out);
	assert_int_equal(out[0], '{');
	expect_out("sessions --json", "\"session_id\":%" PRIu64, kvp_session_id(s1));
	expect_out("sessions --json", "\"session_id\":%" PRIu64, kvp_session_id(s2));
	expect_out("sessions --json", "\"committed_tokens\":%d", 20);
	expect_out("sessions --json", "\"shared_pages\":%d", 2);
	expect_out("sessions --json", "\"writing\":%s", "true");
	snprintf(pool_id, sizeof(pool_id), "\"session_id\":%" PRIu64, kvp_session_id(s3));
	if (strstr(out, pool_id))
		fail_msg("sessions --pool lists a session of another pool: %s", out);

	/* status and metrics read the same counters. */
	ret = ctl(NULL, "--socket", h->admin_sock, "status", NULL);
	if (ret != 0)
		fail_msg("status exited %d: %s", ret, out);
	expect_out("status", "%s", "host tier: 2 pools, 5 of ");
	expect_out("status", "%s", "gpu tier: no");
	ret = ctl(NULL, "--socket", h->admin_sock, "--json", "status");
	if (ret != 0)
		fail_msg("status --json exited %d: %s", ret, out);
	expect_out("status --json", "\"pools\":%d,", 2);
	expect_out("status --json", "\"host_used_pages\":%d,", 5);
	ret = ctl(NULL, "--socket", h->admin_sock, "metrics", NULL);
	if (ret != 0)
		fail_msg("metrics exited %d: %s", ret, out);
	expect_out("metrics", "%s", "# TYPE kvpalace_requests_total counter\n");
	expect_out("metrics", "%s", "\nkvpalace_dedup_pages_total 1\n");
	expect_out("metrics",
		   "kvpalace_pool_indexed_pages{pool=\"%s\",uid=\"%u\",model=\"%s\"} 2\n",
		   pool_id_num, (unsigned)getuid(), MODEL);
	expect_out("metrics", "kvpalace_pool_sessions{pool=\"%s\",uid=\"%u\",model=\"%s\"} 2\n",
		   pool_id_num, (unsigned)getuid(), MODEL);

	assert_int_equal(ctl(NULL, "--socket", h->admin_sock, "sessions", "--pool"), 2);
	assert_int_equal(ctl6(NULL, "--socket", h->admin_sock, "sessions", "--pool", "0", NULL), 2);
	assert_int_equal(ctl6(NULL, "--socket", h->admin_sock, "stats", "--pool", "1", NULL), 2);
	kvp_disconnect(c);
}

/* ---- help and exit statuses --------------------------------------------- */

static const char *const all_commands[][2] = {
	{"status", NULL},     {"ping", NULL},	 {"stats", NULL},	{"pools", NULL},
	{"sessions", NULL},   {"metrics", NULL}, {"session", "show"},	{"drop", "session"},
	{"drop", "pool"},     {"evict", NULL},	 {"config", "show"},	{"config", "reload"},
	{"checkpoint", NULL}, {"restore", NULL}, {"checkpoints", NULL}, {"warmup", NULL},
	{"latency", NULL},
};
#define N_ALL (sizeof(all_commands) / sizeof(all_commands[0]))

static void test_help(void **state)
{
	static char first[sizeof(out)];

	static char list[sizeof(out)];

	(void)state;
	assert_int_equal(ctl(NULL, "--help", NULL, NULL, NULL), 0);
	snprintf(list, sizeof(list), "%s", out);
	for (size_t i = 0; i < N_ALL; i++) {
		const char *w1 = all_commands[i][0], *w2 = all_commands[i][1];
		char name[64], line[80];

		snprintf(name, sizeof(name), "%s%s%s", w1, w2 ? " " : "", w2 ? w2 : "");
		snprintf(line, sizeof(line), "\n  %s ", name);
		if (!strstr(list, line))
			fail_msg("--help does not list %s:\n%s", name, list);
		/* help CMD and CMD --help print the same text. */
		if (ctl(NULL, "help", w1, w2, NULL) != 0)
			fail_msg("help %s exited non-zero: %s", name, out);
		expect_out(name, "Usage: kvpalacectl [--socket PATH] [--json] %s", name);
		expect_out(name, "%s", "--json");
		expect_out(name, "%s", "Exit status: 0 success, 1 the daemon refused");
		snprintf(first, sizeof(first), "%s", out);
		if (ctl(NULL, w1, w2 ? w2 : "--help", w2 ? "--help" : NULL, NULL) != 0)
			fail_msg("%s --help exited non-zero: %s", name, out);
		if (strcmp(first, out) != 0)
			fail_msg("help %s and %s --help differ:\n%s\n---\n%s", name, name, first,
				 out);
	}
	/* A group shows each of its commands. */
	assert_int_equal(ctl(NULL, "help", "drop", NULL, NULL), 0);
	expect_out("help drop", "%s", "drop session ID [--force]");
	expect_out("help drop", "%s", "drop pool ID [--force]");
	assert_int_equal(ctl(NULL, "help", NULL, NULL, NULL), 0);
	expect_out("help", "%s", "Commands:");
	assert_int_equal(ctl(NULL, "help", "frobnicate", NULL, NULL), 2);
	assert_int_equal(ctl(NULL, "help", "drop", "table", NULL), 2);
	assert_int_equal(ctl(NULL, "--version", NULL, NULL, NULL), 0);
	expect_out("--version", "%s", "kvpalacectl ");
}

static void test_exit_codes(void **state)
{
	struct harness *h = *state;
	char nobody[160];

	CTL_EXPECT(0, h->admin_sock, "ping");
	/* 1: the daemon refused: no such object, or not the admin socket. */
	CTL_EXPECT(1, h->admin_sock, "drop", "session", "999999");
	expect_out("drop session 999999", "%s", "no such session");
	CTL_EXPECT(1, h->admin_sock, "drop", "pool", "999999");
	CTL_EXPECT(1, h->admin_sock, "session", "show", "999999");
	CTL_EXPECT(1, h->sock, "config", "show");
	expect_out("config show on the client socket", "%s", "admin socket");
	/* The daemon has a disk tier (the default): evicting from it works
	 * (issue 13: it used to say "there is no disk tier"). */
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "disk", "--bytes", "1M");
	expect_out("evict --tier disk", "%s", "evicted 0 pages (0 B) from the disk tier");
	CTL_EXPECT(1, h->admin_sock, "evict", "--tier", "gpu", "--bytes", "1M");
	expect_out("evict --tier gpu", "%s",
		   "no such tier in this daemon: there is no GPU tier (host and disk tiers only)");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "gpu", "--bytes", "1M", "--discard");
	CTL_EXPECT(2, h->admin_sock, "purge");
	/* 2: usage. */
	CTL_EXPECT(2, h->admin_sock, "frobnicate");
	CTL_EXPECT(2, h->admin_sock, "drop");
	CTL_EXPECT(2, h->admin_sock, "drop", "table", "3");
	CTL_EXPECT(2, h->admin_sock, "session", "show");
	CTL_EXPECT(2, h->admin_sock, "session", "show", "x1");
	CTL_EXPECT(2, h->admin_sock, "session", "show", "0");
	CTL_EXPECT(2, h->admin_sock, "session", "show", "1", "2");
	CTL_EXPECT(2, h->admin_sock, "session", "show", "1", "--pages", "5000");
	CTL_EXPECT(2, h->admin_sock, "drop", "session", "1", "--pool", "1");
	CTL_EXPECT(2, h->admin_sock, "stats", "--force");
	CTL_EXPECT(2, h->admin_sock, "evict", "--bytes", "1M");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "tape", "--bytes", "1M");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host", "--bytes", "0");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host", "--bytes", "12Q");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host", "--bytes", "-5");
	CTL_EXPECT(2, h->admin_sock, "config");
	CTL_EXPECT(2, h->admin_sock, "config", "show", "now");
	CTL_EXPECT(2, h->admin_sock, "--no-such-option", "ping");
	/* 3: nobody listens there. */
	snprintf(nobody, sizeof(nobody), "%s/nobody-listens.sock", h->dir);
	CTL_EXPECT(3, nobody, "ping");
	expect_out("no daemon", "%s", "cannot connect");
	CTL_EXPECT(3, nobody, "config", "reload");
}

/* ---- session show ------------------------------------------------------- */

static void test_session_show(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40], other[40];
	char id1[24], id2[24], id3[24];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s1, *s2, *s3;

	harness_tokens(tokens, 40, 62, 0);
	harness_tokens(other, 40, 63, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	/* s1: 40 committed tokens (2 full pages, indexed); s2: 40 reserved,
	 * none committed (this process writes it); s3: salted. */
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s1), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, other, 40), 0);
	assert_int_equal(kvp_pool_set_salt(p, "tenant-a", 8), 0);
	assert_int_equal(kvp_session_create(p, &s3), 0);
	assert_int_equal(kvp_pool_set_salt(p, NULL, 0), 0);
	snprintf(id1, sizeof(id1), "%" PRIu64, kvp_session_id(s1));
	snprintf(id2, sizeof(id2), "%" PRIu64, kvp_session_id(s2));
	snprintf(id3, sizeof(id3), "%" PRIu64, kvp_session_id(s3));

	CTL_EXPECT(0, h->admin_sock, "session", "show", id1);
	expect_out("session show", "session %s\n", id1);
	expect_out("session show", "pool         %" PRIu64 " (uid %u, model %s, 2L 2H 32D 16T f16)",
		   kvp_pool_id(p), (unsigned)getuid(), MODEL);
	expect_out("session show", "%s", "tokens       40 (40 committed, 0 reserved)");
	expect_out("session show", "%s", "pages        3 (2 shared with another holder, 0 ");
	expect_out("session show", "%s", "writer       none");
	expect_out("session show", "%s", "cache salt   no");
	expect_out("session show", "%s", "page slots  ");

	/* The whole document, ids and times masked. */
	CTL_EXPECT(0, h->admin_sock, "--json", "session", "show", id1);
	expect_json("session show --json");
	mask("socket");
	mask("session_id");
	mask("pool_id");
	mask("uid");
	mask("idle_ms");
	expect_golden("session show --json",
		      "{\"socket\":*,\"session_id\":*,\"pool_id\":*,\"uid\":*,\"model_id\":"
		      "\"ctl-test-model\",\"layout\":{\"n_layers\":2,\"n_kv_heads\":2,\"head_dim\":"
		      "32,\"block_tokens\":16,\"dtype\":\"f16\",\"quant_group\":0,\"format\":"
		      "\"kv\"},\"n_tokens\":40,"
		      "\"committed_tokens\":40,\"n_pages\":3,\"shared_pages\":2,\"reserved_pages\":"
		      "0,\"idle_ms\":*,\"writing\":false,\"writer_pid\":null,\"salted\":false,"
		      "\"policy\":\"none\",\"budget\":0,\"compacted\":false,\"dropped_tokens\":0,"
		      "\"page_slots\":[0,1,2],\"page_holders\":[2,2,1]}");

	/* A session being written names its writer. */
	CTL_EXPECT(0, h->admin_sock, "session", "show", id2);
	expect_out("session show (writing)", "writer       pid %d holds uncommitted tokens",
		   (int)getpid());
	expect_out("session show (writing)", "%s", "tokens       40 (0 committed, 40 reserved)");
	CTL_EXPECT(0, h->admin_sock, "session", "show", id2, "--json");
	expect_json("session show --json (writing)");
	expect_out("session show --json (writing)", "\"writing\":true,\"writer_pid\":%d,",
		   (int)getpid());
	expect_out("session show --json (writing)", "%s", "\"reserved_pages\":3,");

	CTL_EXPECT(0, h->admin_sock, "session", "show", id3);
	expect_out("session show (salted)", "%s", "cache salt   yes");
	expect_out("session show (salted)", "%s", "policy       none (exact)");
	expect_out("session show (salted)", "%s", "page slots   none");
	CTL_EXPECT(0, h->admin_sock, "--json", "session", "show", id3);
	expect_out("session show --json (salted)", "%s", "\"salted\":true,");
	expect_out("session show --json (salted)", "%s", "\"page_slots\":[],\"page_holders\":[]}");

	/* --pages bounds the slots listed. */
	CTL_EXPECT(0, h->admin_sock, "session", "show", id1, "--pages", "1");
	expect_out("session show --pages 1", "%s", "... (1 of 3)");
	CTL_EXPECT(0, h->admin_sock, "--json", "session", "show", id1, "--pages", "1");
	expect_out("session show --json --pages 1", "%s", "\"page_slots\":[0],");
	CTL_EXPECT(0, h->admin_sock, "--json", "session", "show", id1, "--pages", "0");
	expect_out("session show --json --pages 0", "%s", "\"page_slots\":[],");
	kvp_disconnect(c);
}

/* ---- drop --------------------------------------------------------------- */

static void test_drop_session(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40], other[40];
	char id1[24], id2[24];
	kvp_client *c, *reader;
	kvp_pool *p, *rp;
	kvp_session *s1, *s2;
	kvp_lease *l;

	harness_tokens(tokens, 40, 64, 0);
	harness_tokens(other, 40, 65, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s1), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	assert_int_equal(kvp_append(s2, other, 40), 0);
	assert_int_equal(harness_pkv_write_session(p, s2, other, 0, 40), 0);
	/* Another process reads s1's prefix under a lease. */
	assert_int_equal(kvp_connect(h->sock, &reader), 0);
	assert_int_equal(kvp_pool_open(reader, MODEL, &harness_layout, &rp), 0);
	assert_int_equal(kvp_match_prefix(rp, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	snprintf(id1, sizeof(id1), "%" PRIu64, kvp_session_id(s1));
	snprintf(id2, sizeof(id2), "%" PRIu64, kvp_session_id(s2));

	/* Being written: refused without --force. */
	CTL_EXPECT(1, h->admin_sock, "drop", "session", id2);
	expect_out("drop session (writing)", "%s", "writing");
	CTL_EXPECT(0, h->admin_sock, "--json", "drop", "session", id2, "--force");
	expect_json("drop session --json");
	mask("socket");
	mask("session_id");
	mask("pool_id");
	expect_golden("drop session --json",
		      "{\"socket\":*,\"dropped\":\"session\",\"session_id\":*,\"pool_id\":*,"
		      "\"n_tokens\":40,\"committed_tokens\":0,\"freed_pages\":3,\"was_writing\":"
		      "true}");
	/* The writer finds its session gone. */
	assert_int_equal(kvp_commit(s2, 40), -ENOENT);

	/* s1: its two full pages stay (the lease pins them, the index holds
	 * them); only the partial last page goes. */
	CTL_EXPECT(0, h->admin_sock, "drop", "session", id1);
	expect_out("drop session",
		   "dropped session %s of pool %" PRIu64 ": 40 tokens (40 committed), 1 page freed",
		   id1, kvp_pool_id(p));
	assert_int_equal(harness_pkv_check_lease(l, rp, tokens, 32), 0);
	CTL_EXPECT(1, h->admin_sock, "drop", "session", id1);
	expect_out("drop session twice", "%s", "no such session");
	/* The prefix is still matchable. */
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(rp, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_pkv_check_lease(l, rp, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_disconnect(reader);
	kvp_disconnect(c);
}

static int start_one_lease(void **state)
{
	static const char *const extra[] = {"--max-leases-per-client", "1", "--host-pool-size",
					    "32M", NULL};

	return harness_setup_args(state, extra);
}

static void test_drop_pool(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char id[24], id_empty[24], want[64];
	kvp_client *c, *reader;
	kvp_pool *p, *rp, *empty, *again;
	kvp_session *s1, *s2;
	kvp_lease *l;

	harness_tokens(tokens, 40, 66, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	/* Opened once its spill file's scan is over: a drop waits for it. */
	assert_int_equal(harness_pool_open(h, c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s1), 0);
	assert_int_equal(kvp_connect(h->sock, &reader), 0);
	assert_int_equal(kvp_pool_open(reader, MODEL, &harness_layout, &rp), 0);
	assert_int_equal(kvp_match_prefix(rp, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	snprintf(id, sizeof(id), "%" PRIu64, kvp_pool_id(p));

	CTL_EXPECT(1, h->admin_sock, "drop", "pool", id);
	expect_out("drop pool (in use)", "%s", "sessions or read leases");
	CTL_EXPECT(0, h->admin_sock, "drop", "pool", id, "--force", "--json");
	expect_json("drop pool --json");
	mask("socket");
	mask("pool_id");
	mask("uid");
	expect_golden("drop pool --json",
		      "{\"socket\":*,\"dropped\":\"pool\",\"pool_id\":*,\"uid\":*,\"model_id\":"
		      "\"ctl-test-model\",\"sessions_closed\":1,\"leases_released\":1,"
		      "\"arena_bytes\":33554432}");
	/* The reader's mapping still holds what it read; its lease is gone. */
	assert_int_equal(harness_pkv_check_lease(l, rp, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), -ENOENT);
	assert_int_equal(kvp_session_create(p, &s2), -ENOENT);
	assert_int_equal(kvp_append(s1, tokens, 8), -ENOENT);
	CTL_EXPECT(0, h->admin_sock, "--json", "pools");
	snprintf(want, sizeof(want), "\"pool_id\":%s,", id);
	if (strstr(out, want))
		fail_msg("pool %s still listed: %s", id, out);
	/* The pool comes back, empty, under a new id; the reader's lease
	 * count was given back with the lease (the limit is 1). */
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &again), 0);
	assert_true(kvp_pool_id(again) != kvp_pool_id(p));
	assert_int_equal(harness_pkv_commit_session(again, tokens, 40, &s2), 0);
	kvp_pool_close(rp);
	assert_int_equal(kvp_pool_open(reader, MODEL, &harness_layout, &rp), 0);
	assert_int_equal(kvp_match_prefix(rp, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(kvp_lease_release(l), 0);

	/* An unused pool goes without --force. */
	assert_int_equal(harness_pool_open(h, c, MODEL "-empty", &harness_layout, &empty), 0);
	snprintf(id_empty, sizeof(id_empty), "%" PRIu64, kvp_pool_id(empty));
	CTL_EXPECT(0, h->admin_sock, "drop", "pool", id_empty);
	expect_out("drop pool",
		   "dropped pool %s (uid %u, model %s-empty): 0 sessions closed, "
		   "0 leases released, 32 MiB of host tier freed",
		   id_empty, (unsigned)getuid(), MODEL);
	CTL_EXPECT(1, h->admin_sock, "drop", "pool", id_empty);
	assert_int_equal(kvp_ping(reader), 0);
	kvp_disconnect(reader);
	kvp_disconnect(c);
}

/* ---- evict -------------------------------------------------------------- */

/* Runs kvpalacectl with args (NULL-terminated, after the binary) on a
 * pseudo-terminal, as a user at a terminal would; what it wrote goes to
 * out. Returns the exit status. */
static int ctl_pty(char *const *args)
{
	const char *bin = getenv("KVPALACECTL");
	char *argv[24] = {(char *)bin};
	size_t used = 0;
	int master, status, n = 1;
	pid_t pid;

	assert_non_null(bin);
	while (n < 23 && args[n - 1])
		argv[n] = args[n - 1], n++;
	argv[n] = NULL;
	fflush(stdout);
	fflush(stderr);
	pid = forkpty(&master, NULL, NULL, NULL);
	assert_true(pid >= 0);
	if (pid == 0) {
		setenv("TERM", "xterm", 1);
		execv(argv[0], argv);
		_exit(127);
	}
	for (;;) {
		ssize_t k = read(master, out + used, sizeof(out) - 1 - used);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) /* EIO once the child closed the terminal */
			break;
		used += (size_t)k;
		if (used + 1 == sizeof(out))
			break;
	}
	out[used] = '\0';
	close(master);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int start_evict(void **state)
{
	static const char *const extra[] = {"--host-pool-size", "32M", NULL};

	return harness_setup_args(state, extra);
}

static void test_evict(void **state)
{
	struct harness *h = *state;
	enum { BIG_PAGES = 2100, BIG_TOKENS = BIG_PAGES * 16 };
	uint32_t *big = malloc(BIG_TOKENS * sizeof(uint32_t));
	uint32_t small[40], keep[40];
	struct harness_pool_info info;
	char big_id[24], small_id[24], missing[24];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s, *k;

	assert_non_null(big);
	harness_tokens(big, BIG_TOKENS, 67, 0);
	harness_tokens(small, 40, 68, 0);
	harness_tokens(keep, 40, 69, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, MODEL "-small", &harness_layout, &q), 0);
	/* P: 2100 full pages that only the index holds once the session is
	 * closed, and a session that keeps 2 full pages. Q: 2 pages. */
	assert_int_equal(kvp_session_create(p, &s), 0);
	assert_int_equal(kvp_append(s, big, BIG_TOKENS), 0);
	assert_int_equal(kvp_commit(s, BIG_TOKENS), 0);
	assert_int_equal(kvp_session_close(s), 0);
	assert_int_equal(harness_pkv_commit_session(p, keep, 40, &k), 0);
	assert_int_equal(kvp_session_create(q, &s), 0);
	assert_int_equal(kvp_append(s, small, 40), 0);
	assert_int_equal(kvp_commit(s, 40), 0);
	assert_int_equal(kvp_session_close(s), 0);
	snprintf(big_id, sizeof(big_id), "%" PRIu64, kvp_pool_id(p));
	snprintf(small_id, sizeof(small_id), "%" PRIu64, kvp_pool_id(q));

	/* Dropping (--discard; the default writes them to the disk tier,
	 * test_purge.c): whole pages, never more than asked: 12K is one 8K
	 * page. */
	CTL_EXPECT(0, h->admin_sock, "--json", "evict", "--tier", "host", "--bytes", "12K",
		   "--pool", small_id, "--discard");
	expect_json("evict --json");
	mask("socket");
	mask("pool_id");
	expect_golden("evict --json",
		      "{\"socket\":*,\"tier\":\"host\",\"pool_id\":*,\"max_bytes\":12288,"
		      "\"pages\":1,\"bytes\":8192,\"demoted\":0,\"dropped\":1,\"pools\":[{\"pool_"
		      "id\":*,\"pages\":1,"
		      "\"bytes\":8192}]}");

	/* On a terminal: a progress bar, erased before the result. 9M is
	 * 1152 pages, more than one request takes. */
	{
		char *args[] = {"--socket", h->admin_sock, "evict", "--tier",	 "host", "--bytes",
				"9M",	    "--pool",	   big_id,  "--discard", NULL};

		assert_int_equal(ctl_pty(args), 0);
	}
	expect_out("evict on a terminal", "%s", "\revicting [");
	expect_out("evict on a terminal", "%s", "100%  9 MiB / 9 MiB");
	expect_out("evict on a terminal", "%s",
		   "evicted 1152 pages (9 MiB) from the host tier (at most 9 MiB asked)");
	expect_out("evict on a terminal", "  pool %-6s %8d pages %12s", big_id, 1152, "9 MiB");

	/* Everything left, through a pipe: no bar. Pools oldest first; the
	 * session's pages stay. */
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "host", "--bytes", "all", "--json",
		   "--discard");
	expect_json("evict all --json");
	if (strchr(out, '\r'))
		fail_msg("a progress bar on a pipe: %s", out);
	mask("socket");
	mask("pool_id");
	expect_golden(
		"evict all --json",
		"{\"socket\":*,\"tier\":\"host\",\"pool_id\":null,\"max_bytes\":null,"
		"\"pages\":949,\"bytes\":7774208,\"demoted\":0,\"dropped\":949,\"pools\":[{\"pool_"
		"id\":"
		"*,\"pages\":948,\"bytes\":7766016},{\"pool_id\":*,\"pages\":1,\"bytes\":8192}]}"
		"");
	assert_int_equal(harness_pool_info(h, kvp_pool_id(p), &info), 0);
	assert_int_equal(info.indexed_pages, 2);
	assert_int_equal(info.evictions, BIG_PAGES);
	assert_int_equal(harness_pkv_check_session(p, k, keep, 0, 40), 0);

	/* Nothing left: still a success, in words. */
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "host", "--bytes", "1G");
	expect_out("evict (nothing left)", "%s",
		   "evicted 0 pages (0 B) from the host tier (at most 1 GiB asked)");
	snprintf(missing, sizeof(missing), "%" PRIu64, kvp_pool_id(q) + 1000);
	CTL_EXPECT(1, h->admin_sock, "evict", "--tier", "host", "--bytes", "1G", "--pool", missing);
	expect_out("evict --pool (missing)", "%s", "no such pool");
	/* Listing the sessions of a pool that does not exist says so too. */
	CTL_EXPECT(1, h->admin_sock, "sessions", "--pool", missing);
	expect_out("sessions --pool (missing)", "%s", "no such pool");
	free(big);
	kvp_disconnect(c);
}

/* ---- config ------------------------------------------------------------- */

static char conf_dir[64], conf_path[128];

static void write_conf(const char *text)
{
	FILE *f = fopen(conf_path, "w");

	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

static int start_with_conf(void **state)
{
	static const char *const extra[] = {
		"--config", conf_path, "--host-tier-size", "256M", "--host-pool-size", "32M", NULL};
	FILE *f;

	snprintf(conf_dir, sizeof(conf_dir), "/tmp/kvpc-XXXXXX");
	if (!mkdtemp(conf_dir))
		return -1;
	snprintf(conf_path, sizeof(conf_path), "%s/kvpalaced.conf", conf_dir);
	f = fopen(conf_path, "w");
	if (!f)
		return -1;
	fputs("# a test file\nlog-level = info\nmax-sessions-per-pool = 100\n", f);
	fclose(f);
	return harness_setup_args(state, extra);
}

static int stop_with_conf(void **state)
{
	unlink(conf_path);
	rmdir(conf_dir);
	return harness_teardown(state);
}

static void test_config(void **state)
{
	struct harness *h = *state;

	CTL_EXPECT(0, h->admin_sock, "config", "show");
	expect_out("config show", "# kvpalaced effective configuration; file %s\n", conf_path);
	expect_out("config show", "%s", "\nmax-sessions-per-pool  = 100 ");
	expect_out("config show", "%s", " # file\n");
	expect_out("config show", "%s", "\nmax-connections        = 1024 ");
	expect_out("config show", "%s", " # default\n");
	expect_out("config show", "\nsocket                 = %s/kvpalace.sock ", h->dir);

	CTL_EXPECT(0, h->admin_sock, "config", "show", "--json");
	expect_json("config show --json");
	replace_all(h->dir, "$DIR");
	replace_all(conf_dir, "$CONF");
	expect_golden(
		"config show --json",
		"{\"socket\":\"$DIR/admin.sock\",\"file\":\"$CONF/kvpalaced.conf\",\"preset\":null,"
		"\"truncated\":false,\"config\":{"
		"\"socket\":{\"value\":\"$DIR/kvpalace.sock\",\"source\":\"command line\"},"
		"\"admin-socket\":{\"value\":\"$DIR/admin.sock\",\"source\":\"command line\"},"
		"\"state-dir\":{\"value\":\"$DIR/state\",\"source\":\"command line\"},"
		"\"cache-dir\":{\"value\":\"$DIR/cache\",\"source\":\"command line\"},"
		"\"host-tier-size\":{\"value\":\"256M\",\"source\":\"command line\"},"
		"\"host-pool-size\":{\"value\":\"32M\",\"source\":\"command line\"},"
		"\"host-high-watermark\":{\"value\":\"0.95\",\"source\":\"default\"},"
		"\"host-low-watermark\":{\"value\":\"0.90\",\"source\":\"default\"},"
		"\"max-message-bytes\":{\"value\":\"65536\",\"source\":\"default\"},"
		"\"max-pools-per-tenant\":{\"value\":\"16\",\"source\":\"default\"},"
		"\"max-sessions-per-pool\":{\"value\":\"100\",\"source\":\"file\"},"
		"\"max-leases-per-client\":{\"value\":\"4096\",\"source\":\"default\"},"
		"\"max-connections\":{\"value\":\"1024\",\"source\":\"default\"},"
		"\"max-connections-per-user\":{\"value\":\"512\",\"source\":\"default\"},"
		"\"max-requests-in-flight\":{\"value\":\"256\",\"source\":\"default\"},"
		"\"max-reserved-pages-per-client\":{\"value\":\"65536\",\"source\":\"default\"},"
		"\"max-leased-pages-per-client\":{\"value\":\"262144\",\"source\":\"default\"},"
		"\"max-session-tokens\":{\"value\":\"4194304\",\"source\":\"default\"},"
		"\"socket-mode\":{\"value\":\"0666\",\"source\":\"default\"},"
		"\"admin-socket-mode\":{\"value\":\"0600\",\"source\":\"default\"},"
		"\"log-level\":{\"value\":\"info\",\"source\":\"file\"},"
		"\"disk-pool-size\":{\"value\":\"8192M\",\"source\":\"default\"},"
		"\"io-backend\":{\"value\":\"auto\",\"source\":\"default\"},"
		"\"event-loop\":{\"value\":\"auto\",\"source\":\"default\"},"
		"\"warmup-dir\":{\"value\":\"$DIR/state/warmup\",\"source\":\"default\"},"
		"\"session-policy\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"session-budget\":{\"value\":\"0\",\"source\":\"default\"},"
		"\"session-auto-compact\":{\"value\":\"no\",\"source\":\"default\"},"
		"\"spill-dtype\":{\"value\":\"same\",\"source\":\"default\"},"
		"\"gpu-pool-size\":{\"value\":\"1024M\",\"source\":\"default\"},"
		"\"gpu-high-watermark\":{\"value\":\"0.90\",\"source\":\"default\"},"
		"\"gpu-low-watermark\":{\"value\":\"0.80\",\"source\":\"default\"},"
		"\"gpu-tier-size\":{\"value\":\"8192M\",\"source\":\"default\"},"
		"\"disk-tier-size\":{\"value\":\"0M\",\"source\":\"default\"},"
		"\"disk-tenant-size\":{\"value\":\"32768M\",\"source\":\"default\"},"
		"\"disk-reserve\":{\"value\":\"2048M\",\"source\":\"default\"},"
		"\"host-tenant-size\":{\"value\":\"0M\",\"source\":\"default\"},"
		"\"session-idle-timeout\":{\"value\":\"1h\",\"source\":\"default\"},"
		"\"max-tenant-tokens\":{\"value\":\"33554432\",\"source\":\"default\"},"
		"\"eviction\":{\"value\":\"window\",\"source\":\"default\"},"
		"\"disk-admission\":{\"value\":\"all\",\"source\":\"default\"},"
		"\"remote-tier\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"remote-user\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"remote-password-file\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"remote-timeout-ms\":{\"value\":\"500\",\"source\":\"default\"},"
		"\"remote-threads\":{\"value\":\"4\",\"source\":\"default\"},"
		"\"remote-max-inflight-mb\":{\"value\":\"256\",\"source\":\"default\"},"
		"\"remote-tenants\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"remote-write\":{\"value\":\"commit\",\"source\":\"default\"},"
		"\"remote-events\":{\"value\":\"none\",\"source\":\"default\"},"
		"\"host-prewarm-watermark\":{\"value\":\"0.00\",\"source\":\"default\"}}}");

	/* A reload says what changed and what waits for a restart. */
	write_conf("log-level = notice\nmax-sessions-per-pool = 100\nmax-message-bytes = 8192\n");
	CTL_EXPECT(0, h->admin_sock, "--json", "config", "reload");
	expect_json("config reload --json");
	mask("socket");
	expect_golden("config reload --json",
		      "{\"socket\":*,\"reloaded\":true,\"changed\":[\"log-level\"],"
		      "\"restart_needed\":[\"max-message-bytes\"]}");
	CTL_EXPECT(0, h->admin_sock, "--json", "config", "show");
	expect_out("config show after reload", "%s",
		   "\"log-level\":{\"value\":\"notice\",\"source\":\"file\"}");
	expect_out("config show after reload", "%s",
		   "\"max-message-bytes\":{\"value\":\"65536\",\"source\":\"default\"}");

	/* A bad file: refused with where it is bad; nothing changes. */
	write_conf("log-level = info\nmax-sessions-per-pool = many\n");
	CTL_EXPECT(1, h->admin_sock, "config", "reload");
	expect_out("config reload (bad file)", "%s:2: key 'max-sessions-per-pool': bad value",
		   conf_path);
	CTL_EXPECT(0, h->admin_sock, "config", "show");
	expect_out("config show after a bad reload", "%s", "\nlog-level              = notice ");

	write_conf("max-sessions-per-pool = 100\n");
	CTL_EXPECT(0, h->admin_sock, "config", "reload");
	expect_out("config reload", "%s", "configuration reloaded: changed log-level\n");
	if (strstr(out, "restart"))
		fail_msg("nothing waits for a restart: %s", out);
	CTL_EXPECT(0, h->admin_sock, "config", "reload");
	expect_out("config reload (again)", "%s", "configuration reloaded: nothing changed\n");
	/* SIGHUP goes the same way and the daemon keeps serving. */
	assert_int_equal(kill(h->pid, SIGHUP), 0);
	CTL_EXPECT(0, h->admin_sock, "ping");
}

/* Paths near PATH_MAX and the smallest message cap: config show leaves
 * out what does not fit and says so, instead of failing. */
static char long_root[64], long_state[4096], long_cache[4096];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void long_path(char *buf, size_t cap, char fill)
{
	size_t n = (size_t)snprintf(buf, cap, "%s", long_root);

	for (int i = 0; i < 12; i++) {
		buf[n++] = '/';
		memset(buf + n, fill, 250);
		n += 250;
	}
	buf[n] = '\0';
}

static int start_long_paths(void **state)
{
	static const char *const extra[] = {
		"--max-message-bytes", "4096",	   "--state-dir", long_state,
		"--cache-dir",	       long_cache, NULL};

	snprintf(long_root, sizeof(long_root), "/tmp/kvpl-XXXXXX");
	if (!mkdtemp(long_root))
		return -1;
	long_path(long_state, sizeof(long_state), 's');
	long_path(long_cache, sizeof(long_cache), 'c');
	return harness_setup_args(state, extra);
}

static int stop_long_paths(void **state)
{
	nftw(long_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return harness_teardown(state);
}

static void test_config_show_truncated(void **state)
{
	struct harness *h = *state;

	CTL_EXPECT(0, h->admin_sock, "--json", "config", "show");
	expect_json("config show --json (long paths)");
	expect_out("config show --json (long paths)", "%s", "\"truncated\":true,");
	expect_out("config show --json (long paths)", "{\"value\":\"%s\",", long_state);
	CTL_EXPECT(0, h->admin_sock, "config", "show");
	expect_out("config show (long paths)", "%s", "# (more keys than fit in one reply)\n");
}

/* More pools than one Stats reply holds (found by a review: status
 * printed the listed pools' totals as the daemon's): status says its
 * tier figures cover only the pools listed, and --json says
 * pools_truncated. */
static int start_small_replies(void **state)
{
	static const char *const extra[] = {"--max-message-bytes",
					    "4096",
					    "--max-pools-per-tenant",
					    "64",
					    "--host-pool-size",
					    "1M",
					    NULL};

	return harness_setup_args(state, extra);
}

static void test_status_truncated(void **state)
{
	struct harness *h = *state;
	kvp_client *c;
	kvp_pool *p[64];
	char model[32];

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	for (int i = 0; i < 64; i++) {
		snprintf(model, sizeof(model), "truncated-model-%d", i);
		assert_int_equal(kvp_pool_open(c, model, &harness_layout, &p[i]), 0);
	}
	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status (truncated)", "%s",
		   "(more pools exist than fit in the daemon's reply: the tier figures below "
		   "cover the first ");
	CTL_EXPECT(0, h->admin_sock, "--json", "status");
	expect_json("status --json (truncated)");
	expect_out("status --json (truncated)", "%s", "\"pools_truncated\":true");
	kvp_disconnect(c);
}

/* ---- the client socket refuses admin operations ------------------------- */

static void test_client_socket_refuses_admin_ops(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__ShowSessionRequest show = KVPALACE__V1__SHOW_SESSION_REQUEST__INIT;
	Kvpalace__V1__DropSessionRequest drop_s = KVPALACE__V1__DROP_SESSION_REQUEST__INIT;
	Kvpalace__V1__DropPoolRequest drop_p = KVPALACE__V1__DROP_POOL_REQUEST__INIT;
	Kvpalace__V1__EvictRequest ev = KVPALACE__V1__EVICT_REQUEST__INIT;
	Kvpalace__V1__ConfigShowRequest cshow = KVPALACE__V1__CONFIG_SHOW_REQUEST__INIT;
	Kvpalace__V1__ConfigReloadRequest creload = KVPALACE__V1__CONFIG_RELOAD_REQUEST__INIT;
	Kvpalace__V1__Request reqs[6];
	Kvpalace__V1__Response *resp;
	uint64_t pool_id, session_id, next_id = 1000;
	struct raw r;

	/* Real ids, so a refusal cannot be a "not found" in disguise. */
	assert_int_equal(raw_open(&r, h->sock), 0);
	assert_int_equal(raw_open_pool(&r, MODEL, &harness_layout, &pool_id), 0);
	assert_int_equal(raw_create_session(&r, pool_id, &session_id), 0);
	show.session_id = drop_s.session_id = session_id;
	drop_p.pool_id = ev.pool_id = pool_id;
	drop_s.has_force = drop_p.has_force = 1;
	drop_s.force = drop_p.force = 1;
	ev.tier = KVPALACE__V1__TIER__TIER_HOST;
	ev.has_pool_id = 1;
	for (int i = 0; i < 6; i++)
		kvpalace__v1__request__init(&reqs[i]);
	reqs[0].op_case = KVPALACE__V1__REQUEST__OP_SHOW_SESSION;
	reqs[0].show_session = &show;
	reqs[1].op_case = KVPALACE__V1__REQUEST__OP_DROP_SESSION;
	reqs[1].drop_session = &drop_s;
	reqs[2].op_case = KVPALACE__V1__REQUEST__OP_DROP_POOL;
	reqs[2].drop_pool = &drop_p;
	reqs[3].op_case = KVPALACE__V1__REQUEST__OP_EVICT;
	reqs[3].evict = &ev;
	reqs[4].op_case = KVPALACE__V1__REQUEST__OP_CONFIG_SHOW;
	reqs[4].config_show = &cshow;
	reqs[5].op_case = KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD;
	reqs[5].config_reload = &creload;
	for (int i = 0; i < 6; i++) {
		reqs[i].id = next_id++;
		assert_int_equal(raw_call(&r, &reqs[i], &resp, NULL), 1);
		if (resp->status != ST(PERMISSION))
			fail_msg("admin op %d on the client socket: status %d (%s)",
				 (int)reqs[i].op_case, resp->status,
				 resp->error ? resp->error : "");
		assert_int_equal(resp->op_case, KVPALACE__V1__RESPONSE__OP__NOT_SET);
		assert_non_null(resp->error);
	}
	/* Nothing happened, and the client is still served. */
	assert_int_equal(raw_close_session(&r, session_id), 0);
	raw_close(&r);

	/* On the admin socket the same operations are checked field by field. */
	assert_int_equal(raw_open(&r, h->admin_sock), 0);
	assert_int_equal(raw_hello(&r), 0);
	ev.tier = (Kvpalace__V1__Tier)0;
	reqs[3].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[3], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(INVALID));
	ev.tier = (Kvpalace__V1__Tier)9;
	reqs[3].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[3], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(INVALID));
	ev.tier = KVPALACE__V1__TIER__TIER_HOST;
	ev.has_max_bytes = 1;
	ev.max_bytes = 0;
	reqs[3].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[3], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(INVALID));
	ev.max_bytes = 1 << 20;
	ev.tier = KVPALACE__V1__TIER__TIER_DISK;
	reqs[3].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[3], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(OK)); /* this daemon has a disk tier */
	show.has_max_page_slots = 1;
	show.max_page_slots = 4097;
	reqs[0].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[0], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(INVALID));
	show.max_page_slots = 4;
	reqs[0].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[0], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(NOT_FOUND)); /* closed above */
	drop_p.pool_id = 0;
	reqs[2].id = next_id++;
	assert_int_equal(raw_call(&r, &reqs[2], &resp, NULL), 1);
	assert_int_equal(resp->status, ST(NOT_FOUND));
	assert_int_equal(raw_hello(&r), 0);
	raw_close(&r);
}

/* ---- checkpoints -------------------------------------------------------- */

/* The size of a checkpoint of 40 tokens in 3 pages of 8 KiB, as
 * daemon/store/ckpt.h lays it out: header and token records padded to 4096,
 * the pages, 8 bytes of checksum per page, a 32-byte trailer. */
#define CKPT_40_BYTES 28728

/* Copies src to dst (created 0600). */
static void copy_file(const char *src, const char *dst)
{
	static char buf[1 << 16];
	int in = open(src, O_RDONLY | O_CLOEXEC);
	int o = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ssize_t n;

	assert_true(in >= 0);
	assert_true(o >= 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(o, buf, (size_t)n), n);
	assert_int_equal(n, 0);
	close(in);
	assert_int_equal(close(o), 0);
}

/* Flips one byte of a file at off. */
static void flip_byte(const char *path, off_t off)
{
	unsigned char b;
	int fd = open(path, O_RDWR | O_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* The number after "key": in out; fails when there is none. */
static uint64_t json_number(const char *key)
{
	char pat[64];
	const char *at;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	at = strstr(out, pat);
	if (!at)
		fail_msg("no %s in %s", pat, out);
	return strtoull(at + strlen(pat), NULL, 10);
}

static void test_checkpoints(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char sid[24], pid[24], qid[24], uid[16], dir[200], path[256], want[512];
	uint64_t bytes = 0, now_ms;
	struct stat sb;
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s, *rs;
	kvp_lease *l;

	harness_tokens(tokens, 40, 72, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_open(c, MODEL "-other", &harness_layout, &q), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	snprintf(sid, sizeof(sid), "%" PRIu64, kvp_session_id(s));
	snprintf(pid, sizeof(pid), "%" PRIu64, kvp_pool_id(p));
	snprintf(qid, sizeof(qid), "%" PRIu64, kvp_pool_id(q));
	snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
	snprintf(dir, sizeof(dir), "%s/state/checkpoints/%s", h->dir, uid);

	/* checkpoint: the file is there, of the size the format says. */
	CTL_EXPECT(0, h->admin_sock, "checkpoint", sid, "chat-1");
	expect_out("checkpoint", "checkpointed session %s as chat-1 (28.1 KiB written)\n", sid);
	snprintf(path, sizeof(path), "%s/chat-1", dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, CKPT_40_BYTES);
	CTL_EXPECT(0, h->admin_sock, "--json", "checkpoint", sid, "chat-2");
	expect_json("checkpoint --json");
	mask("socket");
	mask("session_id");
	expect_golden("checkpoint --json",
		      "{\"socket\":*,\"session_id\":*,\"name\":\"chat-2\",\"bytes\":28728}");
	/* The library's own call writes the same file. */
	assert_int_equal(kvp_session_checkpoint(s, "lib-1", &bytes), 0);
	assert_int_equal(bytes, CKPT_40_BYTES);

	/* checkpoints: a table, and the whole document sorted by name. */
	CTL_EXPECT(0, h->admin_sock, "checkpoints");
	expect_out("checkpoints", "%s",
		   "NAME   UID    MODEL              TOKENS       SIZE  CREATED              "
		   "CHECKED\n");
	expect_out("checkpoints", "chat-1 %-6s %s         40   28.1 KiB  2", uid, MODEL);
	expect_out("checkpoints", "%s", "  header valid, pages not checked\n");
	expect_out("checkpoints", "lib-1  %-6s %s         40   28.1 KiB  2", uid, MODEL);
	CTL_EXPECT(0, h->admin_sock, "--json", "checkpoints", "--uid", uid);
	expect_json("checkpoints --json");
	now_ms = (uint64_t)time(NULL) * 1000;
	if (json_number("created_unix_ms") + 600000 < now_ms ||
	    json_number("created_unix_ms") > now_ms + 600000)
		fail_msg("checkpoints: created_unix_ms is not about now (%" PRIu64 "): %s", now_ms,
			 out);
	mask("socket");
	mask("created_unix_ms");
	{
		char doc[2048], e[3][512];
		const char *const names[3] = {"chat-1", "chat-2", "lib-1"};

		for (int i = 0; i < 3; i++)
			snprintf(e[i], sizeof(e[i]),
				 "{\"name\":\"%s\",\"uid\":%s,\"model_id\":\"ctl-test-model\","
				 "\"layout\":{\"n_layers\":2,\"n_kv_heads\":2,\"head_dim\":32,"
				 "\"block_tokens\":16,\"dtype\":\"f16\",\"quant_group\":0,"
				 "\"format\":\"kv\"},"
				 "\"n_tokens\":40,\"bytes\":28728,\"created_unix_ms\":*,"
				 "\"format_version\":4,\"verified\":false,\"error\":null}",
				 names[i], uid);
		snprintf(doc, sizeof(doc),
			 "{\"socket\":*,\"uid\":%s,\"truncated\":false,\"checkpoints\":[%s,%s,%s]}",
			 uid, e[0], e[1], e[2]);
		expect_golden("checkpoints --json", doc);
	}

	/* restore: into the checkpoint's own pool; its full pages are the
	 * index's (shared), its last page its own. */
	CTL_EXPECT(0, h->admin_sock, "restore", "chat-1");
	expect_out("restore", "%s", "restored chat-1 as session ");
	expect_out("restore",
		   " of pool %s: 40 tokens in 3 pages, 2 of them already in the prefix index\n",
		   pid);
	CTL_EXPECT(0, h->admin_sock, "--json", "restore", "chat-1", "--pool", pid);
	expect_json("restore --json");
	assert_int_equal(json_number("pool_id"), kvp_pool_id(p));
	mask("socket");
	mask("session_id");
	mask("pool_id");
	expect_golden("restore --json",
		      "{\"socket\":*,\"name\":\"chat-1\",\"uid\":null,\"session_id\":*,\"pool_id\":"
		      "*,\"n_tokens\":40,\"n_pages\":3,\"shared_pages\":2}");
	CTL_EXPECT(0, h->admin_sock, "--json", "restore", "--uid", uid, "chat-1");
	expect_out("restore --uid", "\"uid\":%s,", uid);
	CTL_EXPECT(0, h->admin_sock, "--json", "sessions", "--pool", pid);
	expect_out("sessions after restores", "%s", "\"n_tokens\":40,\"committed_tokens\":40,");
	/* Through the library: the same K/V, readable as a fork's. */
	assert_int_equal(kvp_session_restore(p, "chat-1", &rs), 0);
	assert_int_equal(kvp_session_tokens(rs), 40);
	assert_int_equal(kvp_session_committed(rs), 40);
	assert_int_equal(harness_pkv_check_session(p, rs, tokens, 0, 40), 0);

	/* warmup: the pool and its index gone, the checkpoint refills the
	 * index of a new pool and a match reads the same K/V. */
	CTL_EXPECT(0, h->admin_sock, "drop", "pool", pid, "--force");
	kvp_pool_close(p);
	CTL_EXPECT(0, h->admin_sock, "--json", "warmup", "chat-1", "--uid", uid);
	expect_json("warmup --json");
	mask("socket");
	mask("pool_id");
	snprintf(want, sizeof(want),
		 "{\"socket\":*,\"name\":\"chat-1\",\"uid\":%s,\"pool_id\":*,\"n_tokens\":40,"
		 "\"indexed_pages\":2,\"shared_pages\":0}",
		 uid);
	expect_golden("warmup --json", want);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	snprintf(pid, sizeof(pid), "%" PRIu64, kvp_pool_id(p));
	assert_int_equal(kvp_match_prefix(p, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	/* s went with the pool: a session of the new one for what follows. */
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	snprintf(sid, sizeof(sid), "%" PRIu64, kvp_session_id(s));
	CTL_EXPECT(0, h->admin_sock, "warmup", "--uid", uid, "chat-1");
	expect_out("warmup",
		   "warmed up chat-1: 40 tokens, 2 full pages in the prefix index of pool %s "
		   "(2 there already)\n",
		   pid);
	/* Without --uid: the warm-up directory. */
	CTL_EXPECT(1, h->admin_sock, "warmup", "chat-1");
	snprintf(path, sizeof(path), "%s/state/warmup", h->dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/state/warmup/chat-1", h->dir);
	snprintf(want, sizeof(want), "%s/chat-1", dir);
	copy_file(want, path);
	CTL_EXPECT(0, h->admin_sock, "warmup", "chat-1");
	expect_out("warmup (directory)", "%s", "warmed up chat-1: 40 tokens, 2 full pages");

	/* Refusals: exit 1, nothing restored. A truncated file is listed
	 * with why; a page that fails its checksum, another model's pool, a
	 * missing name and a missing session are refused. */
	snprintf(path, sizeof(path), "%s/chat-2", dir);
	assert_int_equal(truncate(path, 1000), 0);
	snprintf(want, sizeof(want), "%s/chat-3", dir);
	assert_int_equal(kvp_session_checkpoint(s, "chat-3", NULL), 0);
	flip_byte(want, 4096 + 8192 + 100); /* in page 1 */
	CTL_EXPECT(1, h->admin_sock, "restore", "chat-2");
	expect_out("restore of a truncated file", "%s", "truncated");
	CTL_EXPECT(1, h->admin_sock, "restore", "chat-3");
	expect_out("restore of a corrupt page", "%s", "checksum mismatch");
	CTL_EXPECT(1, h->admin_sock, "restore", "chat-1", "--pool", qid);
	expect_out("restore into another model's pool", "%s", "model");
	/* The same refusals through the library, as errno. */
	rs = NULL;
	assert_int_equal(kvp_session_restore(p, "chat-2", &rs), -EBADMSG);
	assert_int_equal(kvp_session_restore(p, "chat-3", &rs), -EBADMSG);
	assert_int_equal(kvp_session_restore(q, "chat-1", &rs), -EINVAL);
	assert_int_equal(kvp_session_restore(p, "no-such-name", &rs), -ENOENT);
	assert_null(rs);
	assert_int_equal(kvp_ping(c), 0);
	CTL_EXPECT(1, h->admin_sock, "restore", "no-such-name");
	CTL_EXPECT(1, h->admin_sock, "warmup", "--uid", uid, "no-such-name");
	CTL_EXPECT(1, h->admin_sock, "checkpoint", "999999", "chat-9");
	expect_out("checkpoint of a missing session", "%s", "no such session");
	CTL_EXPECT(0, h->admin_sock, "checkpoints");
	expect_out("checkpoints (truncated file)", "chat-2 %-6s cannot be restored: ", uid);
	CTL_EXPECT(0, h->admin_sock, "--json", "checkpoints");
	expect_json("checkpoints --json (truncated file)");
	snprintf(want, sizeof(want),
		 "{\"name\":\"chat-2\",\"uid\":%s,\"model_id\":null,\"layout\":null,\"n_tokens\":"
		 "null,\"bytes\":null,\"created_unix_ms\":null,\"format_version\":0,"
		 "\"verified\":false,\"error\":\"",
		 uid);
	expect_out("checkpoints --json (truncated file)", "%s", want);

	/* Issue 13, item 10: a listing reads headers only, and listed chat-3,
	 * whose page 1 is damaged, as restorable; its restore then failed.
	 * The listing says what it checked, and --verify reads every page
	 * and names the damage, with a bar on a terminal. */
	CTL_EXPECT(0, h->admin_sock, "checkpoints");
	expect_out("checkpoints (damaged page)", "%s", "chat-3 ");
	if (strstr(out, "chat-3 ") && !strstr(strstr(out, "chat-3 "), "header valid, pages not"))
		fail_msg("checkpoints: chat-3 listed as checked:\n%s", out);
	CTL_EXPECT(0, h->admin_sock, "checkpoints", "--verify");
	expect_out("checkpoints --verify",
		   "chat-3 %-6s cannot be restored: page 1 of 3: checksum "
		   "mismatch\n",
		   uid);
	expect_out("checkpoints --verify", "%s", "every page verified\n");
	expect_out("checkpoints --verify", "chat-2 %-6s cannot be restored: truncated", uid);
	if (strchr(out, '\r'))
		fail_msg("a bar on a pipe: %s", out);
	CTL_EXPECT(0, h->admin_sock, "--json", "checkpoints", "--verify", "--uid", uid);
	expect_json("checkpoints --verify --json");
	expect_out("checkpoints --verify --json", "%s",
		   "\"format_version\":4,\"verified\":true,\"error\":null}");
	expect_out("checkpoints --verify --json", "%s",
		   "\"verified\":false,\"error\":\"page 1 of 3: checksum mismatch\"}");
	{
		char *args[] = {"--socket", h->admin_sock, "checkpoints", "--verify", NULL};
		int ret = ctl_pty(args);

		if (ret != 0)
			fail_msg("checkpoints --verify on a terminal exited %d:\n%s", ret, out);
	}
	expect_out("checkpoints --verify on a terminal", "%s", "verifying [");
	expect_out("checkpoints --verify on a terminal", "%s", "page 1 of 3: checksum mismatch");
	/* The library: one name, verified; only the header without the flag. */
	{
		struct kvp_checkpoint_list *one;

		assert_int_equal(kvp_list_checkpoints_ex(c, 0, 0, "chat-3", KVP_LIST_VERIFY, &one),
				 0);
		assert_int_equal(one->n_entries, 1);
		assert_non_null(one->entries[0].error);
		assert_non_null(strstr(one->entries[0].error, "checksum mismatch"));
		kvp_checkpoint_list_free(one);
		assert_int_equal(kvp_list_checkpoints_ex(c, 0, 0, "lib-1", KVP_LIST_VERIFY, &one),
				 0);
		assert_int_equal(one->n_entries, 1);
		assert_null(one->entries[0].error);
		assert_int_equal(one->entries[0].verified, 1);
		assert_int_equal(one->entries[0].format_version, 4);
		kvp_checkpoint_list_free(one);
		assert_int_equal(kvp_list_checkpoints_ex(c, 0, 0, "chat-3", 0, &one), 0);
		assert_null(one->entries[0].error);
		assert_int_equal(one->entries[0].verified, 0);
		kvp_checkpoint_list_free(one);
		assert_int_equal(kvp_list_checkpoints_ex(c, 0, 0, "no-such", KVP_LIST_VERIFY, &one),
				 0);
		assert_int_equal(one->n_entries, 0);
		kvp_checkpoint_list_free(one);
	}

	/* checkpoint rm: gone, durably (answered after the directory's
	 * fsync), and a second time there is nothing to remove. */
	CTL_EXPECT(0, h->admin_sock, "checkpoint", "rm", "chat-3");
	expect_out("checkpoint rm", "removed checkpoint chat-3 of uid %s (28.1 KiB)\n", uid);
	assert_int_equal(stat(want, &sb), -1);
	CTL_EXPECT(1, h->admin_sock, "checkpoint", "rm", "chat-3");
	expect_out("checkpoint rm (again)", "%s", "no such checkpoint");
	CTL_EXPECT(0, h->admin_sock, "--json", "checkpoint", "rm", "--uid", uid, "chat-2");
	expect_json("checkpoint rm --json");
	mask("socket");
	snprintf(want, sizeof(want), "{\"socket\":*,\"name\":\"chat-2\",\"uid\":%s,\"bytes\":1000}",
		 uid);
	expect_golden("checkpoint rm --json", want);
	CTL_EXPECT(2, h->admin_sock, "checkpoint", "rm", "../x");
	CTL_EXPECT(2, h->admin_sock, "checkpoint", "rm");
	/* The client socket removes the caller's own, never another's. */
	CTL_EXPECT(1, h->sock, "checkpoint", "rm", "--uid", "12345", "lib-1");
	expect_out("checkpoint rm --uid on the client socket", "%s", "admin socket");
	assert_int_equal(kvp_checkpoint_remove(c, "lib-1", 1, 12345, NULL), -EPERM);
	{
		uint64_t gone = 0;

		assert_int_equal(kvp_checkpoint_remove(c, "lib-1", 0, 0, &gone), 0);
		assert_int_equal(gone, CKPT_40_BYTES);
		assert_int_equal(kvp_checkpoint_remove(c, "lib-1", 0, 0, NULL), -ENOENT);
		assert_int_equal(kvp_checkpoint_remove(c, "../x", 0, 0, NULL), -EINVAL);
	}

	/* Bad names never reach the daemon: usage errors. */
	CTL_EXPECT(2, h->admin_sock, "checkpoint", sid, "../x");
	expect_out("checkpoint ../x", "%s", "is not a checkpoint name");
	CTL_EXPECT(2, h->admin_sock, "checkpoint", sid, ".hidden");
	CTL_EXPECT(2, h->admin_sock, "restore", "a b");
	CTL_EXPECT(2, h->admin_sock, "warmup", "x/y");
	CTL_EXPECT(2, h->admin_sock, "restore",
		   "a1234567890123456789012345678901234567890123456789012345678901234");
	CTL_EXPECT(2, h->admin_sock, "checkpoint", sid);
	CTL_EXPECT(2, h->admin_sock, "checkpoint", "chat-1", sid);
	CTL_EXPECT(2, h->admin_sock, "checkpoint", sid, "a", "b");
	CTL_EXPECT(2, h->admin_sock, "restore");
	CTL_EXPECT(2, h->admin_sock, "restore", "chat-1", "--uid", "x");
	CTL_EXPECT(2, h->admin_sock, "checkpoints", "--pool", "1");
	CTL_EXPECT(2, h->admin_sock, "checkpoints", "chat-1");
	CTL_EXPECT(2, h->admin_sock, "warmup", "chat-1", "--pool", "1");
	CTL_EXPECT(2, h->admin_sock, "sessions", "--uid", "0");
	/* The client socket: the caller's own list, no warm-up. */
	CTL_EXPECT(0, h->sock, "checkpoints");
	expect_out("checkpoints on the client socket", "%s", "chat-1 ");
	CTL_EXPECT(1, h->sock, "warmup", "chat-1");
	expect_out("warmup on the client socket", "%s", "admin socket");

	/* A spinner on a terminal, erased before the result; none in a pipe. */
	{
		char *args[] = {"--socket", h->admin_sock, "checkpoint", sid, "chat-pty", NULL};
		int ret = ctl_pty(args);

		if (ret != 0)
			fail_msg("checkpoint on a terminal exited %d:\n%s", ret, out);
	}
	expect_out("checkpoint on a terminal", "%s", "\rcheckpointing | 0.0 s");
	expect_out("checkpoint on a terminal", "checkpointed session %s as chat-pty", sid);
	CTL_EXPECT(0, h->admin_sock, "checkpoint", sid, "chat-pipe");
	if (strchr(out, '\r'))
		fail_msg("a spinner on a pipe: %s", out);

	/* The counters: 6 written (chat-1, chat-2, lib-1, chat-3, chat-pty,
	 * chat-pipe); 7 restored or warmed up; 6 refused (truncated,
	 * checksum, other model; by kvpalacectl and by the library); 3
	 * removed (chat-3, chat-2, lib-1); 6 pages warmed up; no restore
	 * had to wait for room. */
	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status", "%s",
		   "checkpoints: 6 written, 7 restored, 6 refused, 0 failed, 3 removed\n");
	CTL_EXPECT(0, h->admin_sock, "--json", "status");
	expect_json("status --json");
	expect_out("status --json", "%s",
		   "\"checkpoints_written\":6,\"checkpoints_restored\":7,\"checkpoints_refused\":6,"
		   "\"checkpoint_failures\":0,\"checkpoints_removed\":3,\"restore_waits\":0,"
		   "\"warmed_up_pages\":6}");
	CTL_EXPECT(0, h->admin_sock, "stats");
	expect_out("stats", "%s",
		   "checkpoints        6 written, 7 restored, 6 refused, 0 failed, 3 removed; 6 "
		   "pages warmed up; 0 restores waited for room\n");
	CTL_EXPECT(0, h->admin_sock, "--json", "stats");
	expect_out("stats --json", "%s",
		   "\"checkpoints_written\":6,\"checkpoints_restored\":7,\"checkpoints_refused\":6,"
		   "\"checkpoint_failures\":0,\"checkpoints_removed\":3,\"restore_waits\":0,"
		   "\"warmed_up_pages\":6,");
	CTL_EXPECT(0, h->admin_sock, "metrics");
	expect_out("metrics", "%s", "# TYPE kvpalace_checkpoints_written_total counter\n");
	expect_out("metrics", "%s", "\nkvpalace_checkpoints_written_total 6\n");
	expect_out("metrics", "%s", "\nkvpalace_checkpoints_restored_total 7\n");
	expect_out("metrics", "%s", "\nkvpalace_checkpoints_refused_total 6\n");
	expect_out("metrics", "%s", "\nkvpalace_checkpoint_failures_total 0\n");
	expect_out("metrics", "%s", "\nkvpalace_warmed_up_pages_total 6\n");
	expect_out("metrics", "%s", "\nkvpalace_checkpoints_removed_total 3\n");
	expect_out("metrics", "%s", "\nkvpalace_restore_waits_total 0\n");
	kvp_disconnect(c);
}

/* ---- --json on every command -------------------------------------------- */

static void test_json_everywhere(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char sid[24], pid[24], sid2[24];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *s2;

	harness_tokens(tokens, 40, 71, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "json \"quoted\"\\model", &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_session_create(p, &s2), 0);
	snprintf(sid, sizeof(sid), "%" PRIu64, kvp_session_id(s));
	snprintf(sid2, sizeof(sid2), "%" PRIu64, kvp_session_id(s2));
	snprintf(pid, sizeof(pid), "%" PRIu64, kvp_pool_id(p));

	CTL_EXPECT(0, h->admin_sock, "--json", "status");
	expect_json("status");
	CTL_EXPECT(0, h->admin_sock, "--json", "ping");
	expect_json("ping");
	CTL_EXPECT(0, h->admin_sock, "--json", "stats");
	expect_json("stats");
	CTL_EXPECT(0, h->admin_sock, "--json", "pools");
	expect_json("pools");
	CTL_EXPECT(0, h->admin_sock, "--json", "sessions");
	expect_json("sessions");
	CTL_EXPECT(0, h->admin_sock, "--json", "metrics");
	expect_json("metrics");
	expect_out("metrics --json", "%s",
		   "{\"name\":\"kvpalace_requests_total\",\"type\":\"counter\",\"help\":"
		   "\"Requests served.\",\"samples\":[{\"name\":\"kvpalace_requests_total\","
		   "\"labels\":{},\"value\":");
	expect_out("metrics --json",
		   "{\"name\":\"kvpalace_pool_sessions\",\"labels\":{\"pool\":\"%s\",\"uid\":"
		   "\"%u\",\"model\":\"json "
		   "\\\"quoted\\\"\\\\model\"},\"value\":2}",
		   pid, (unsigned)getuid());
	CTL_EXPECT(0, h->admin_sock, "--json", "session", "show", sid);
	expect_json("session show");
	CTL_EXPECT(0, h->admin_sock, "--json", "config", "show");
	expect_json("config show");
	CTL_EXPECT(0, h->admin_sock, "--json", "config", "reload");
	expect_json("config reload");
	CTL_EXPECT(0, h->admin_sock, "--json", "evict", "--tier", "host", "--bytes", "8K");
	expect_json("evict");
	CTL_EXPECT(0, h->admin_sock, "--json", "drop", "session", sid2);
	expect_json("drop session");
	CTL_EXPECT(0, h->admin_sock, "--json", "drop", "pool", pid, "--force");
	expect_json("drop pool");
	expect_out("drop pool --json", "%s", "\"model_id\":\"json \\\"quoted\\\"\\\\model\",");
	kvp_disconnect(c);
}

/* ---- issue 16: tiers, hit ratios, scripts, watch, completion ------------ */

static char pyout[8192];

/* Runs Debian's Python on out, parsed as JSON by its json module (one
 * document, or with lines one document a line) into d, then script, whose
 * asserts fail the check. Returns the exit status; Python's words go to
 * pyout. */
static int py_json(struct harness *h, int lines, const char *script)
{
	char path[160], prog[4096];
	char *argv[] = {"/usr/bin/python3", "-c", prog, path, NULL};
	FILE *f;

	snprintf(path, sizeof(path), "%s/doc.json", h->dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(out, f);
	assert_int_equal(fclose(f), 0);
	snprintf(prog, sizeof(prog),
		 "import json, sys\n"
		 "%s\n%s\n",
		 lines ? "ds = [json.loads(l) for l in open(sys.argv[1], encoding='utf-8')]"
		       : "d = json.load(open(sys.argv[1], encoding='utf-8'))",
		 script);
	return harness_run_capture(argv, NULL, pyout, sizeof(pyout));
}

#define PY_EXPECT(h, lines, what, script)                                                          \
	do {                                                                                       \
		if (py_json((h), (lines), (script)) != 0)                                          \
			fail_msg("%s: the JSON check failed:\n%s\nof:\n%s", (what), pyout, out);   \
	} while (0)

/* The line of out that starts with prefix, copied into buf. */
static const char *line_of(const char *prefix, char *buf, size_t cap)
{
	const char *p = out;

	while (p && *p) {
		if (!strncmp(p, prefix, strlen(prefix))) {
			size_t n = strcspn(p, "\n");

			snprintf(buf, cap, "%.*s", (int)n, p);
			return buf;
		}
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	fail_msg("no line starting '%s' in:\n%s", prefix, out);
	return NULL;
}

/* Issue 16: the disk tier could not be seen. After a spill, pools shows
 * the pages in each tier (DISK used/capacity), status a section per tier
 * with what moved, and both JSON documents carry the counters under the
 * struct's names, parsed by a real JSON parser. */
static void test_tiers(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char pid[24], line[512], want[128];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	harness_tokens(tokens, 40, 81, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_session_close(s), 0);
	snprintf(pid, sizeof(pid), "%" PRIu64, kvp_pool_id(p));

	/* Before the spill: 3 host pages (2 indexed full pages and the
	 * partial one went with the session: 2), nothing on disk. */
	CTL_EXPECT(0, h->admin_sock, "pools");
	expect_out("pools", "%s", "HOST-BYTES");
	expect_out("pools", "%s", " DISK ");
	expect_out("pools", "%s", "DISK-BYTES");
	expect_out("pools", "%s", " SPILLED ");
	line_of(pid, line, sizeof(line));
	if (!strstr(line, " 2/") || !strstr(line, " 0/"))
		fail_msg("pools: no host 2/N and disk 0/N cells in '%s'", line);

	/* The spill: evicting from host writes the pages to the disk tier. */
	CTL_EXPECT(0, h->admin_sock, "evict", "--tier", "host", "--bytes", "all");
	expect_out("evict", "%s", "2 demoted to the disk tier");

	CTL_EXPECT(0, h->admin_sock, "pools");
	line_of(pid, line, sizeof(line));
	/* POOL UID MODEL 2L 2H 32D 16T f16 PAGE HOST HOST-BYTES DISK ...:
	 * the host tier empty, 2 pages (16 KiB) in the spill file. */
	if (!strstr(line, " 8.0K 0/") || !strstr(line, " 2/") || !strstr(line, " 16K/"))
		fail_msg("pools after a spill: no empty host and 2 disk pages in '%s'", line);
	snprintf(want, sizeof(want), "pool %s spill file: 2 of ", pid);
	expect_out("pools after a spill", "%s", want);
	expect_out("pools after a spill", "%s", "; 2 spilled, 0 promoted, ");
	expect_out("pools after a spill", "%s", "; 0 verify failures, 0 I/O errors\n");

	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status", "%s", "host tier: 1 pool, 0 of ");
	expect_out("status", "%s", "\ndisk tier: 2 of ");
	expect_out("status", "%s", "  moves: 2 pages spilled, 0 promoted, ");
	expect_out("status", "%s", "  errors: 0 verify failures, 0 I/O errors, ");
	expect_out("status", "%s", "\ngpu tier: no");
	CTL_EXPECT(0, h->admin_sock, "stats");
	expect_out("stats", "%s", " I/O; 2 pages spilled, 0 promoted; 0 verify failures");

	CTL_EXPECT(0, h->admin_sock, "--json", "pools");
	snprintf(line, sizeof(line),
		 "p = [p for p in d['pools'] if p['pool_id'] == %s][0]\n"
		 "assert p['used_pages'] == 0, p\n"
		 "k = p['disk']\n"
		 "assert k['disk_pages'] == 2 and k['spilled_pages'] == 2, k\n"
		 "assert k['disk_bytes'] == 2 * p['page_bytes'], k\n"
		 "assert k['disk_capacity'] > 0 and k['io_errors'] == 0, k\n"
		 "assert 'gpu' not in p\n",
		 pid);
	PY_EXPECT(h, 0, "pools --json", line);

	CTL_EXPECT(0, h->admin_sock, "--json", "status");
	PY_EXPECT(h, 0, "status --json",
		  "assert d['pools'] == 1 and d['host_used_pages'] == 0, d\n"
		  "assert d['host']['n_pages'] > 0 and d['host']['used_bytes'] == 0, d\n"
		  "assert d['disk']['disk_pages'] == 2 and d['disk']['spilled_pages'] == 2, d\n"
		  "assert d['disk']['disk_io'] in ('io_uring', 'threads'), d\n"
		  "assert d['disk']['verify_failures'] == 0, d\n"
		  "assert d['gpu_tier'] is None and d['gpu'] is False, d\n"
		  "for k in ('queried_tokens', 'matched_tokens', 'queried_pages',\n"
		  "          'matched_pages', 'match_hits', 'match_total'):\n"
		  "    assert isinstance(d[k], int), k\n"
		  "assert 'version' in d and isinstance(d['latencies'], list), d\n"
		  "assert d['warmed_up_pages'] == 0\n");
	CTL_EXPECT(0, h->admin_sock, "--json", "stats");
	PY_EXPECT(h, 0, "stats --json",
		  "assert d['spilled_pages'] == 2 and d['io_errors'] == 0, d\n"
		  "assert d['pools'][0]['disk']['spilled_pages'] == 2\n");
	kvp_pool_close(p);
	kvp_disconnect(c);
}

/* status reports the token and page hit ratios (prompt tokens served of
 * those asked about) and the matches that found anything as just that. */
static void test_hit_ratio(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[64], other[64];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;

	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status (no queries)", "%s", ", 1 connection, "); /* kvpalacectl's own */
	expect_out("status (no queries)", "%s", "host tier: 0 pools, ");
	expect_out("status (no queries)", "%s", "token hit ratio: no queries yet\n");
	expect_out("status (no queries)", "%s", "matches with a hit: no matches yet\n");

	harness_tokens(tokens, 64, 82, 0);
	harness_tokens(other, 64, 83, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 32, &s), 0);
	/* Asked: 64 + 64 tokens; served: the 32 committed of the first. */
	assert_int_equal(kvp_match_prefix(p, tokens, 64, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(kvp_lease_release(l), 0);
	kvp_match_prefix(p, other, 64, &l);
	if (l)
		kvp_lease_release(l);

	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status", "%s", "matches with a hit: 1 of 2 (50.0%)\n");
	if (strstr(out, "prefix hit rate"))
		fail_msg("status still calls matches a hit rate:\n%s", out);
	CTL_EXPECT(0, h->admin_sock, "--json", "status");
	/* The daemon's counting lands with the lead's change; until then it
	 * reports 0 asked and status says so instead of a ratio. */
	if (json_number("queried_tokens") == 0) {
		CTL_EXPECT(0, h->admin_sock, "status");
		expect_out("status (older daemon)", "%s",
			   "token hit ratio: not reported by this daemon\n");
	} else {
		assert_int_equal(json_number("queried_tokens"), 128);
		assert_int_equal(json_number("matched_tokens"), 32);
		CTL_EXPECT(0, h->admin_sock, "status");
		expect_out("status", "%s", "token hit ratio: 25.0% (32 of 128 prompt tokens)\n");
		expect_out("status", "%s", "page hit ratio: 25.0% (2 of 8 prompt pages)\n");
	}
	kvp_disconnect(c);
}

/* --no-headers: the rows of a table and nothing else, for scripts;
 * singular and plural as the numbers say. */
static void test_no_headers_plural(void **state)
{
	struct harness *h = *state;
	uint32_t tokens[40];
	char pid[24], sid[24], want[64];
	kvp_client *c;
	kvp_pool *p, *q;
	kvp_session *s;

	harness_tokens(tokens, 40, 84, 0);
	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(harness_pkv_commit_session(p, tokens, 40, &s), 0);
	snprintf(pid, sizeof(pid), "%" PRIu64, kvp_pool_id(p));
	snprintf(sid, sizeof(sid), "%" PRIu64, kvp_session_id(s));

	CTL_EXPECT(0, h->admin_sock, "pools", "--no-headers");
	snprintf(want, sizeof(want), "%s ", pid);
	if (strncmp(out, want, strlen(want)) || strchr(out, '\n') != out + strlen(out) - 1)
		fail_msg("pools --no-headers: not one row of pool %s:\n%s", pid, out);
	if (strstr(out, "POOL") || strstr(out, "spill file"))
		fail_msg("pools --no-headers: more than rows:\n%s", out);
	CTL_EXPECT(0, h->admin_sock, "sessions", "--no-headers");
	snprintf(want, sizeof(want), "%s ", sid);
	if (strncmp(out, want, strlen(want)) || strstr(out, "SESSION"))
		fail_msg("sessions --no-headers:\n%s", out);
	CTL_EXPECT(0, h->admin_sock, "sessions");
	expect_out("sessions", "%s", "SESSION ");
	CTL_EXPECT(0, h->admin_sock, "checkpoints", "--no-headers");
	if (out[0])
		fail_msg("checkpoints --no-headers with none: '%s'", out);
	CTL_EXPECT(0, h->admin_sock, "latency", "--no-headers");
	if (strstr(out, "REQUEST"))
		fail_msg("latency --no-headers: %s", out);
	CTL_EXPECT(2, h->admin_sock, "status", "--no-headers");

	/* Plurals: 1 pool, 2 connections (the test's and kvpalacectl's);
	 * then 2 pools. */
	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status", "%s", "host tier: 1 pool, ");
	expect_out("status", "%s", ", 2 connections, ");
	CTL_EXPECT(0, h->admin_sock, "stats");
	expect_out("stats", "%s", "\n1 pool\n");
	assert_int_equal(kvp_pool_open(c, MODEL "-2", &harness_layout, &q), 0);
	CTL_EXPECT(0, h->admin_sock, "status");
	expect_out("status", "%s", "host tier: 2 pools, ");
	CTL_EXPECT(0, h->admin_sock, "stats");
	expect_out("stats", "%s", "\n2 pools\n");
	CTL_EXPECT(0, h->admin_sock, "drop", "session", sid);
	expect_out("drop session", "%s", "3 pages freed"); /* test_drop_session: "1 page" */
	kvp_disconnect(c);
}

/* Usage errors name the program and the command and point at the
 * command's own help; exit status 2, as kvpalacectl(1) documents. */
static void test_usage_errors(void **state)
{
	struct harness *h = *state;

	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host");
	expect_out("evict", "%s",
		   "kvpalacectl evict: missing --bytes SIZE; see 'kvpalacectl evict --help'\n");
	CTL_EXPECT(2, h->admin_sock, "evict", "--tier", "host", "--bytes", "12Q");
	expect_out("evict --bytes 12Q", "%s", "kvpalacectl evict: --bytes wants a size");
	expect_out("evict --bytes 12Q", "%s", "not '12Q'; see 'kvpalacectl evict --help'\n");
	CTL_EXPECT(2, h->admin_sock, "session", "show");
	expect_out("session show", "%s",
		   "kvpalacectl session show: missing the session ID; see 'kvpalacectl "
		   "session show --help'\n");
	CTL_EXPECT(2, h->admin_sock, "drop");
	expect_out("drop", "%s",
		   "kvpalacectl drop: missing one of: session, pool; see 'kvpalacectl drop "
		   "--help'\n");
	CTL_EXPECT(2, h->admin_sock, "stats", "--force");
	expect_out("stats --force", "%s",
		   "kvpalacectl stats: --force does not go with stats; see 'kvpalacectl stats "
		   "--help'\n");
	CTL_EXPECT(2, h->admin_sock, "pools", "--frobnicate");
	expect_out("pools --frobnicate", "%s",
		   "kvpalacectl pools: unknown option '--frobnicate'; see 'kvpalacectl pools "
		   "--help'\n");
	CTL_EXPECT(2, h->admin_sock, "pools", "--count");
	expect_out("pools --count", "%s", "kvpalacectl pools: option '--count' wants an argument");
	CTL_EXPECT(2, h->admin_sock, "status", "--watch", "0.01");
	expect_out("status --watch 0.01", "%s", "--watch wants seconds");
	CTL_EXPECT(2, h->admin_sock, "checkpoint", "1", "../x");
	expect_out("checkpoint ../x", "%s", "kvpalacectl checkpoint: '../x' is not a checkpoint");
	CTL_EXPECT(2, h->admin_sock, "purge");
	expect_out("purge", "%s", "kvpalacectl purge: missing what to purge");
	CTL_EXPECT(2, h->admin_sock, "frobnicate");
	expect_out("frobnicate", "%s",
		   "kvpalacectl: unknown command 'frobnicate'\nTry 'kvpalacectl --help'.\n");
	/* What the usage errors point at exists, and names the option. */
	CTL_EXPECT(0, h->admin_sock, "evict", "--help");
	expect_out("evict --help", "%s", "-b, --bytes SIZE");
	CTL_EXPECT(0, h->admin_sock, "help", "latency");
	expect_out("help latency", "%s", "[--no-headers] [--watch [SECONDS]] [--count N]");
}

/* Watch mode: appended snapshots off a terminal, --count of them at the
 * pace asked; JSON ones one object a line; on a terminal each replaces
 * the last; Ctrl-C ends it with status 0. */
static void test_watch(void **state)
{
	struct harness *h = *state;
	struct timespec t0, t1;
	double secs;
	int n = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	CTL_EXPECT(0, h->admin_sock, "pools", "--watch", "0.2", "--count", "3");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (const char *p = out; (p = strstr(p, "--- ")) != NULL; p++)
		n++;
	if (n != 3)
		fail_msg("pools --watch 0.2 --count 3: %d snapshots:\n%s", n, out);
	secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (secs < 0.4 || secs > 5)
		fail_msg("3 snapshots 0.2 s apart took %.2f s", secs);
	if (strchr(out, '\033'))
		fail_msg("screen control codes on a pipe:\n%s", out);

	CTL_EXPECT(0, h->admin_sock, "--json", "status", "--count", "2", "--watch=0.1");
	PY_EXPECT(h, 1, "status --json --count 2",
		  "assert len(ds) == 2 and all('uptime_ms' in d for d in ds), ds\n");

	{
		char *args[] = {"--socket", h->admin_sock, "status", "--watch",
				"0.1",	    "--count",	   "2",	     NULL};

		assert_int_equal(ctl_pty(args), 0);
	}
	expect_out("status --watch on a terminal", "%s",
		   "\033[H\033[2JEvery 0.1s: kvpalacectl status");
	expect_out("status --watch on a terminal", "%s", "host tier: ");

	/* Ctrl-C: SIGINT to a watch that would run forever. */
	{
		char path[160];
		const char *bin = getenv("KVPALACECTL");
		pid_t pid;
		int fd, st;

		snprintf(path, sizeof(path), "%s/watch.out", h->dir);
		fflush(stdout);
		fflush(stderr);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
			execl(bin, bin, "--socket", h->admin_sock, "status", "--watch", "0.2",
			      (char *)NULL);
			_exit(127);
		}
		for (int i = 0; i < 100; i++) {
			struct stat sb;

			if (stat(path, &sb) == 0 && sb.st_size > 0)
				break;
			usleep(50000);
		}
		usleep(300000);
		assert_int_equal(kill(pid, SIGINT), 0);
		st = harness_wait(pid, 10);
		if (st != 0)
			fail_msg("status --watch after Ctrl-C exited %d", st);
	}
}

/* The bash completion script: sourced by bash, its function completes
 * commands, two-word commands, each command's options and tier names. */
static void test_completion(void **state)
{
	const char *script = getenv("KVPALACECTL_COMPLETION");
	char *argv[] = {"/bin/bash",
			"--norc",
			"--noprofile",
			"-c",
			"source \"$1\" || exit 9\n"
			"c() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1));\n"
			"  COMP_LINE=\"$*\"; COMP_POINT=${#COMP_LINE}; COMPREPLY=();\n"
			"  _kvpalacectl; echo \"[$*] ${COMPREPLY[*]}\"; }\n"
			"c kvpalacectl po\n"
			"c kvpalacectl drop ''\n"
			"c kvpalacectl evict --ti\n"
			"c kvpalacectl evict --tier ''\n"
			"c kvpalacectl --socket /x pools --no\n"
			"c kvpalacectl session ''\n"
			"c kvpalacectl help lat\n"
			"complete -p kvpalacectl\n",
			"bash",
			(char *)script,
			NULL};

	(void)state;
	assert_non_null(script);
	if (harness_run_capture(argv, NULL, out, sizeof(out)) != 0)
		fail_msg("bash with the completion script failed:\n%s", out);
	expect_out("completion", "%s", "[kvpalacectl po] pools\n");
	expect_out("completion", "%s", "[kvpalacectl drop ] session pool\n");
	expect_out("completion", "%s", "[kvpalacectl evict --ti] --tier\n");
	expect_out("completion", "%s", "[kvpalacectl evict --tier ] host disk gpu\n");
	expect_out("completion", "%s", "[kvpalacectl --socket /x pools --no] --no-headers\n");
	expect_out("completion", "%s", "[kvpalacectl session ] show\n");
	expect_out("completion", "%s", "[kvpalacectl help lat] latency\n");
	expect_out("completion", "%s", "complete -F _kvpalacectl kvpalacectl\n");
}

/* Text that is not UTF-8 still makes valid JSON: a socket path with a
 * byte that is no UTF-8 (through a symbolic link to the admin socket)
 * comes out as U+FFFD; jansson itself would refuse it. */
static void test_json_invalid_utf8(void **state)
{
	struct harness *h = *state;
	char link[200];

	snprintf(link, sizeof(link), "%s/bad-\xff\xc3(.sock", h->dir);
	assert_int_equal(symlink(h->admin_sock, link), 0);
	CTL_EXPECT(0, link, "--json", "ping");
	expect_json("ping --json (invalid UTF-8)");
	PY_EXPECT(h, 0, "ping --json (invalid UTF-8)",
		  "assert d['socket'].endswith('/bad-\\ufffd\\ufffd(.sock'), d\n");
	CTL_EXPECT(0, link, "--json", "status");
	PY_EXPECT(h, 0, "status --json (invalid UTF-8)", "assert '\\ufffd' in d['socket'], d\n");
	unlink(link);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ctl, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_ctl_pools_sessions, harness_setup,
						harness_teardown),
		cmocka_unit_test(test_help),
		cmocka_unit_test_setup_teardown(test_exit_codes, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_session_show, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_drop_session, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_drop_pool, start_one_lease, harness_teardown),
		cmocka_unit_test_setup_teardown(test_evict, start_evict, harness_teardown),
		cmocka_unit_test_setup_teardown(test_config, start_with_conf, stop_with_conf),
		cmocka_unit_test_setup_teardown(test_status_truncated, start_small_replies,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_config_show_truncated, start_long_paths,
						stop_long_paths),
		cmocka_unit_test_setup_teardown(test_client_socket_refuses_admin_ops, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_json_everywhere, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_checkpoints, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_tiers, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_hit_ratio, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_no_headers_plural, harness_setup,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_usage_errors, harness_setup, harness_teardown),
		cmocka_unit_test_setup_teardown(test_watch, harness_setup, harness_teardown),
		cmocka_unit_test(test_completion),
		cmocka_unit_test_setup_teardown(test_json_invalid_utf8, harness_setup,
						harness_teardown),
	};

	return cmocka_run_group_tests_name("ctl", tests, NULL, NULL);
}
