/* tests/integration/test_units.c — the systemd units and the sysusers.d
 * snippet are valid and the service is hardened.
 *
 * `systemd-analyze verify` on the built units must print nothing at all
 * (it exits 0 on unknown keys, printing warnings). It checks that
 * ExecStart= names an executable, so the units are verified as copies
 * whose ExecStart= points at the kvpalaced just built ($KVPALACED); man
 * page lookups are off (--man=no), as the page is not installed yet.
 * `systemd-analyze security --offline=true` must rate the service's
 * exposure at most KVP_EXPOSURE_THRESHOLD (in tenths: 15 = 1.5 on its
 * 0–10 scale). `systemd-sysusers --dry-run` into an empty root must accept
 * the snippet. Skips (77) without systemd-analyze.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

/* systemd-analyze's --threshold= is in tenths of its exposure score. */
#define KVP_EXPOSURE_THRESHOLD "15"

static const char *const units[] = {"kvpalaced.service", "kvpalaced.socket",
				    "kvpalaced-admin.socket"};

static char dir[96];
static char out[65536];

static char analyze[256], sysusers[256];

/* Finds tool on $PATH: its path in buf, 0; -1 when missing. */
static int which(const char *tool, char *buf, size_t size)
{
	char cmd[128];
	FILE *f;
	int ok;

	snprintf(cmd, sizeof(cmd), "command -v %s 2>/dev/null", tool);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	ok = fgets(buf, (int)size, f) != NULL;
	if (pclose(f) != 0 || !ok || buf[0] != '/')
		return -1;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* Copies the built units into dir with ExecStart= on $KVPALACED. */
static int setup(void **state)
{
	const char *unit_dir = getenv("KVP_UNIT_DIR"), *daemon = getenv("KVPALACED");
	const char *tmp = getenv("TMPDIR");
	char cmd[1024];

	(void)state;
	if (!unit_dir || !daemon) {
		fprintf(stderr, "$KVP_UNIT_DIR or $KVPALACED not set (meson sets them)\n");
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s/kvpu-XXXXXX", tmp && strlen(tmp) < 60 ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return -1;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		snprintf(cmd, sizeof(cmd),
			 "sed 's|^ExecStart=[^ ]*|ExecStart=%s|' '%s/%s' > '%s/%s'", daemon,
			 unit_dir, units[i], dir, units[i]);
		if (system(cmd) != 0)
			return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	char cmd[160];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_verify_silent(void **state)
{
	char paths[3][160];
	char *argv[] = {analyze, "verify", "--man=no", paths[0], paths[1], paths[2], NULL};
	int rc;

	(void)state;
	for (int i = 0; i < 3; i++)
		snprintf(paths[i], sizeof(paths[i]), "%s/%s", dir, units[i]);
	rc = harness_run_capture(argv, NULL, out, sizeof(out));
	if (rc != 0 || out[0])
		fprintf(stderr, "systemd-analyze verify (exit %d):\n%s", rc, out);
	assert_int_equal(rc, 0);
	assert_string_equal(out, "");
}

static void test_security_threshold(void **state)
{
	char path[160];
	char *argv[] = {analyze,
			"security",
			"--offline=true",
			"--threshold=" KVP_EXPOSURE_THRESHOLD,
			"--no-pager",
			path,
			NULL};
	const char *overall;
	int rc;

	(void)state;
	snprintf(path, sizeof(path), "%s/kvpalaced.service", dir);
	rc = harness_run_capture(argv, NULL, out, sizeof(out));
	overall = strstr(out, "Overall exposure");
	if (rc != 0)
		fprintf(stderr, "%s\n", out);
	else if (overall)
		fprintf(stderr, "%.*s (threshold %s tenths)\n", (int)strcspn(overall, "\n"),
			overall, KVP_EXPOSURE_THRESHOLD);
	assert_non_null(overall);
	assert_int_equal(rc, 0);
}

static void test_sysusers(void **state)
{
	const char *conf = getenv("KVP_SYSUSERS_CONF");
	char cmd[1024];

	(void)state;
	if (which("systemd-sysusers", sysusers, sizeof(sysusers)) < 0)
		skip();
	assert_non_null(conf);
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p '%s/root/etc' '%s/root/usr/lib/sysusers.d' && cp '%s' "
		 "'%s/root/usr/lib/sysusers.d/kvpalace.conf'",
		 dir, dir, conf, dir);
	assert_int_equal(system(cmd), 0);
	{
		char root[192];
		char *argv[] = {sysusers, root, "--dry-run", NULL};

		snprintf(root, sizeof(root), "--root=%s/root", dir);
		assert_int_equal(harness_run_capture(argv, NULL, out, sizeof(out)), 0);
	}
	assert_non_null(strstr(out, "Creating user 'kvpalace'"));
	assert_non_null(strstr(out, "Creating group 'kvpalace-admin'"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_verify_silent),
		cmocka_unit_test(test_security_threshold),
		cmocka_unit_test(test_sysusers),
	};

	if (which("systemd-analyze", analyze, sizeof(analyze)) < 0) {
		fprintf(stderr, "systemd-analyze not found: skipping\n");
		return 77;
	}
	return cmocka_run_group_tests_name("units", tests, setup, teardown);
}
