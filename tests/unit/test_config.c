/* tests/unit/test_config.c — the daemon's configuration: precedence of
 * command line over file over preset over default, every preset, sizes with
 * units, and every kind of bad configuration naming the file, line and key.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"

static char dir[64];

/* Writes text to a file in the test's directory; returns its path. */
static const char *conf(const char *name, const char *text)
{
	static char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

/* Parses argv (NULL-terminated, without argv[0]) over the defaults. */
static int parse(struct config *c, char *err, const char *first, ...)
{
	char *argv[32] = {"kvpalaced"};
	enum config_action act;
	va_list ap;
	int n = 1;

	va_start(ap, first);
	for (const char *a = first; a && n < 31; a = va_arg(ap, const char *))
		argv[n++] = (char *)a;
	va_end(ap);
	config_defaults(c);
	err[0] = 0;
	return config_parse_args(c, n, argv, &act, err, 256);
}

static void test_precedence(void **state)
{
	struct config c;
	char err[256];
	const char *f = conf("p.conf", "preset = chat\n"
				       "[kvpalaced]\n"
				       "max-connections = 77\n"
				       "max-session-tokens = 1000\n");

	(void)state;
	assert_int_equal(parse(&c, err, "--config", f, "--max-session-tokens=500", NULL), 0);
	assert_int_equal(c.max_connections, 77);     /* file over default */
	assert_int_equal(c.max_session_tokens, 500); /* command line over file */
	assert_int_equal(c.max_sessions_per_pool, 65536);
	assert_string_equal(c.preset, "chat");
	assert_string_equal(c.file, f);
	/* The command line's preset wins over the file's. */
	assert_int_equal(parse(&c, err, "--config", f, "--preset", "edge", NULL), 0);
	assert_string_equal(c.preset, "edge");
	assert_int_equal(c.max_sessions_per_pool, 1024); /* edge */
	assert_int_equal(c.max_session_tokens, 1000);	 /* the file over the preset */
}

static void test_presets(void **state)
{
	struct config c, d;
	char err[256];

	(void)state;
	assert_int_equal(parse(&d, err, "--config", conf("empty.conf", ""), NULL), 0);
	assert_int_equal(parse(&c, err, "--config", conf("empty.conf", ""), "--preset",
			       "long-document", NULL),
			 0);
	assert_int_equal(c.max_session_tokens, 1048576);
	assert_true(c.host_low_watermark < d.host_low_watermark);
	/* Token policies: exact by default; each preset brings its own. */
	assert_int_equal(d.session_policy, 0);
	assert_int_equal(c.session_policy, 3); /* importance */
	assert_int_equal(c.session_budget, 32768);
	assert_int_equal(c.session_auto_compact, 0);
	assert_int_equal(
		parse(&c, err, "--config", conf("empty.conf", ""), "--preset", "edge", NULL), 0);
	assert_true(c.host_tier_bytes < d.host_tier_bytes);
	assert_true(c.host_pool_bytes <= c.host_tier_bytes);
	assert_int_equal(c.max_connections, 64);
	assert_int_equal(c.session_policy, 3); /* importance */
	assert_int_equal(c.session_auto_compact, 1);
	assert_int_equal(parse(&c, err, "--config", conf("empty.conf", ""), "--preset", "chat",
			       "--session-budget", "100", NULL),
			 0);
	assert_int_equal(c.session_policy, 4); /* hierarchy */
	assert_int_equal(c.session_budget, 100);
	assert_int_equal(parse(&c, err, "--preset", "nope", NULL), -EINVAL);
	assert_non_null(strstr(err, "nope"));
}

static void test_sizes(void **state)
{
	struct config c;
	char err[256];
	uint64_t v;

	(void)state;
	assert_int_equal(parse(&c, err, "--config", conf("s.conf", "host-pool-size = 64M\n"),
			       "--host-tier-size", "2G", NULL),
			 0);
	assert_int_equal(c.host_pool_bytes, 64ull << 20);
	assert_int_equal(c.host_tier_bytes, 2ull << 30);
	assert_int_equal(config_parse_size("25%", &v), 0);
	assert_true(v > 0);
	assert_int_equal(config_parse_size("0%", &v), -EINVAL);
	assert_int_equal(config_parse_size("12Q", &v), -EINVAL);
	assert_int_equal(config_parse_size("-1", &v), -EINVAL);
}

/* Each bad file names the file, the line and the key. */
static void test_bad_files(void **state)
{
	static const struct {
		const char *text, *want;
		int line;
	} cases[] = {
		{"max-connections = 10\nbogus = 1\n", "key 'bogus': unknown key", 2},
		{"\n\nmax-connections = ten\n", "key 'max-connections': bad value 'ten'", 3},
		{"host-high-watermark = 1.5\n", "key 'host-high-watermark'", 1},
		{"log-level = loud\n", "key 'log-level'", 1},
		{"session-policy = lru\n", "key 'session-policy'", 1},
		{"\nsession-auto-compact = maybe\n", "key 'session-auto-compact'", 2},
		{"[other]\nmax-connections = 1\n", "unknown section [other]", 2},
		{"no equals sign here\n", "syntax error", 1},
	};
	struct config c;
	char err[256], want[300];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *f = conf("bad.conf", cases[i].text);

		assert_int_equal(parse(&c, err, "--config", f, NULL), -EINVAL);
		snprintf(want, sizeof(want), "%s:%d: ", f, cases[i].line);
		assert_non_null(strstr(err, want));
		assert_non_null(strstr(err, cases[i].want));
	}
	assert_int_equal(parse(&c, err, "--config", "/nonexistent/kvp.conf", NULL), -EINVAL);
	assert_non_null(strstr(err, "/nonexistent/kvp.conf"));
}

/* A '#' after a blank starts a comment, as in --print-config's own
 * output, which must read back as the same configuration. */
static void test_inline_comments_and_print_round_trip(void **state)
{
	struct config c, back;
	char err[256], printed[16384], again[16384];
	const char *f = conf("c.conf", "socket = /x/c.sock   # the client socket\n"
				       "max-connections = 33\t# tabs too\n"
				       "state-dir = /x/a#b\n"
				       "log-level = debug ; libinih's own comment\n");
	FILE *out;

	(void)state;
	assert_int_equal(parse(&c, err, "--config", f, NULL), 0);
	assert_string_equal(c.socket_path, "/x/c.sock");
	assert_int_equal(c.max_connections, 33);
	assert_string_equal(c.state_dir, "/x/a#b"); /* no blank before it: kept */
	assert_int_equal(c.log_level, 7);

	out = fmemopen(printed, sizeof(printed), "w");
	assert_non_null(out);
	config_print(&c, out);
	fclose(out);
	f = conf("printed.conf", printed);
	assert_int_equal(parse(&back, err, "--config", f, NULL), 0);
	assert_string_equal(back.socket_path, "/x/c.sock");
	assert_int_equal(back.max_connections, 33);
	assert_string_equal(back.state_dir, "/x/a#b");
	/* Printing it again gives the same values (only the sources differ:
	 * "file" where the first said where each came from). */
	out = fmemopen(again, sizeof(again), "w");
	assert_non_null(out);
	config_print(&back, out);
	fclose(out);
	/* Past the first line, which names the file read. */
	for (char *a = strchr(printed, '\n') + 1, *b = strchr(again, '\n') + 1; *a || *b;) {
		char *ca = strstr(a, " #"), *cb = strstr(b, " #");

		assert_non_null(ca);
		assert_non_null(cb);
		assert_int_equal(ca - a, cb - b);
		assert_memory_equal(a, b, (size_t)(ca - a));
		a = strchr(ca, '\n') + 1;
		b = strchr(cb, '\n') + 1;
	}
}

static void test_bad_command_lines(void **state)
{
	struct config c;
	char err[256];

	(void)state;
	assert_int_equal(parse(&c, err, "--max-connections", "0", NULL), -EINVAL);
	assert_non_null(strstr(err, "--max-connections"));
	assert_int_equal(parse(&c, err, "--bogus", NULL), -EINVAL);
	assert_int_equal(
		parse(&c, err, "--host-low-watermark", "0.9", "--host-high-watermark", "0.5", NULL),
		-EINVAL);
	assert_int_equal(parse(&c, err, "--host-pool-size", "8G", "--host-tier-size", "1G", NULL),
			 -EINVAL);
	assert_int_equal(parse(&c, err, "stray", NULL), -EINVAL);
	/* A dropping policy needs a budget. */
	assert_int_equal(parse(&c, err, "--session-policy", "window", NULL), -EINVAL);
	assert_non_null(strstr(err, "session-budget"));
	/* ...that holds the policy's protected tokens. */
	assert_int_equal(
		parse(&c, err, "--session-policy", "importance", "--session-budget", "50", NULL),
		-EINVAL);
	assert_non_null(strstr(err, "recent"));
}

/* The remote tier's keys: the node list checked, the password file
 * refused unless the daemon's user alone can read it. */
static void test_remote_keys(void **state)
{
	struct config c;
	char err[256], buf[CONFIG_REMOTE_MAX], path[128];
	const char *nodes[4];
	FILE *f;

	(void)state;
	assert_int_equal(parse(&c, err, "--remote-tier", "redis://10.0.0.1:7000,h2:7001",
			       "--remote-user", "kvp", "--remote-threads", "8",
			       "--remote-timeout-ms", "250", "--remote-max-inflight-mb", "64",
			       NULL),
			 0);
	assert_int_equal(config_remote_nodes(&c, buf, nodes, 4), 2);
	assert_string_equal(nodes[0], "10.0.0.1:7000");
	assert_string_equal(nodes[1], "h2:7001");
	assert_string_equal(c.remote_user, "kvp");
	assert_int_equal(c.remote_threads, 8);
	assert_int_equal(c.remote_timeout_ms, 250);
	assert_int_equal(c.remote_max_inflight_bytes, 64u << 20);
	assert_int_equal(config_remote_nodes(&c, buf, nodes, 1), -EINVAL);
	assert_int_equal(parse(&c, err, NULL), 0);
	assert_int_equal(config_remote_nodes(&c, buf, nodes, 4), 0);
	static const char *const bad[] = {"http://h:1",	     "redis://h",    "redis://h:0",
					  "redis://h:65536", "redis://",     "redis://h:1,,",
					  "redis://:1",	     "redis://u@h:1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(parse(&c, err, "--remote-tier", bad[i], NULL), -EINVAL);
		assert_non_null(strstr(err, "remote-tier"));
	}
	assert_int_equal(parse(&c, err, "--remote-threads", "0", NULL), -EINVAL);
	assert_int_equal(parse(&c, err, "--remote-timeout-ms", "0", NULL), -EINVAL);

	snprintf(path, sizeof(path), "%s/pw", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("s3cret\n", f);
	fclose(f);
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(parse(&c, err, "--remote-password-file", path, NULL), -EINVAL);
	assert_non_null(strstr(err, "0600"));
	assert_int_equal(chmod(path, 0600), 0);
	assert_int_equal(parse(&c, err, "--remote-password-file", path, NULL), 0);
	assert_int_equal(config_read_secret(path, buf, sizeof(buf), err, sizeof(err)), 0);
	assert_string_equal(buf, "s3cret");
	assert_int_equal(config_read_secret(path, buf, 4, err, sizeof(err)), -EFBIG);
	assert_int_equal(chmod(path, 0640), 0);
	assert_int_equal(config_read_secret(path, buf, sizeof(buf), err, sizeof(err)), -EPERM);
	unlink(path);
	assert_int_equal(parse(&c, err, "--remote-password-file", path, NULL), -EINVAL);
	assert_non_null(strstr(err, "cannot open"));
}

/* remote-tenants: a name per uid, "*" for the others, never a bare uid;
 * a uid without a name keeps its pools local. */
static void test_remote_tenants(void **state)
{
	struct config c;
	char err[256], name[CONFIG_REMOTE_TENANT_MAX + 1];

	(void)state;
	assert_int_equal(parse(&c, err, "--remote-tenants", "1000=alice,1001=team.b@x", NULL), 0);
	assert_string_equal(config_remote_tenant(&c, 1000, name, sizeof(name)), "alice");
	assert_string_equal(config_remote_tenant(&c, 1001, name, sizeof(name)), "team.b@x");
	assert_null(config_remote_tenant(&c, 0, name, sizeof(name)));
	assert_null(config_remote_tenant(&c, 100, name, sizeof(name)));
	/* "*" stands for every uid without an entry of its own, wherever it is. */
	assert_int_equal(parse(&c, err, "--remote-tenants", "*=fleet,7=seven", NULL), 0);
	assert_string_equal(config_remote_tenant(&c, 7, name, sizeof(name)), "seven");
	assert_string_equal(config_remote_tenant(&c, 8, name, sizeof(name)), "fleet");
	assert_null(config_remote_tenant(&c, 8, name, 3)); /* does not fit */
	assert_int_equal(parse(&c, err, "--remote-tenants", "none", NULL), 0);
	assert_null(config_remote_tenant(&c, 8, name, sizeof(name)));
	static const char *const bad[] = {"alice",   "1000=",	    "=x",	"1000=a b",
					  "1000=a,", "x1=a",	    "1000=a/b", "99999999999=a",
					  "**=a",    "1000=a,,7=b", "-1=a"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(parse(&c, err, "--remote-tenants", bad[i], NULL), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_precedence),
		cmocka_unit_test(test_presets),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_inline_comments_and_print_round_trip),
		cmocka_unit_test(test_bad_command_lines),
		cmocka_unit_test(test_remote_keys),
		cmocka_unit_test(test_remote_tenants),
	};
	int ret;

	snprintf(dir, sizeof(dir), "/tmp/kvp-config-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	for (size_t i = 0; i < 4; i++) {
		static const char *const names[] = {"p.conf", "empty.conf", "s.conf", "bad.conf"};
		char path[128];

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
	return ret;
}
