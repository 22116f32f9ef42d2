/* tests/unit/test_confview.c — the configuration as data (daemon/base/confview.h).
 *
 * config_print's text of a real configuration splits into one entry per
 * key with the value and source --print-config shows; a value holding
 * " # " (a path may) keeps it; the heading and odd lines are skipped; a
 * diff names exactly the keys whose value (or source) differs.
 * Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "confview.h"

static void test_split(void **state)
{
	char line[] = "socket                 = /tmp/a # b/kvpalace.sock            # command line";
	char bad1[] = "# kvpalaced effective configuration";
	char bad2[] = "no equals sign # default";
	char bad3[] = "key = value without a source";
	char bad4[] = "";
	struct confview_entry e;

	(void)state;
	assert_int_equal(confview_split(line, &e), 0);
	assert_string_equal(e.key, "socket");
	assert_string_equal(e.value, "/tmp/a # b/kvpalace.sock");
	assert_string_equal(e.source, "command line");
	assert_int_equal(confview_split(bad1, &e), -EINVAL);
	assert_int_equal(confview_split(bad2, &e), -EINVAL);
	assert_int_equal(confview_split(bad3, &e), -EINVAL);
	assert_int_equal(confview_split(bad4, &e), -EINVAL);
}

/* The text of a real configuration: every line but the heading splits. */
static void test_text_of_defaults(void **state)
{
	struct config c;
	struct confview_entry e;
	char *text, *p;
	size_t len, n = 0, lines;
	int found = 0;

	(void)state;
	config_defaults(&c);
	c.max_connections = 77;
	assert_int_equal(confview_text(&c, &text, &len), 0);
	assert_int_equal(strlen(text), len);
	lines = confview_lines(text);
	for (p = text; p && *p;) {
		char *nl = strchr(p, '\n');

		if (nl)
			*nl = '\0';
		if (confview_split(p, &e) == 0) {
			n++;
			assert_string_equal(e.source, "default");
			if (!strcmp(e.key, "max-connections")) {
				assert_string_equal(e.value, "77");
				found = 1;
			}
		}
		p = nl ? nl + 1 : NULL;
	}
	assert_true(found);
	assert_int_equal(n, lines - 1); /* all but the heading */
	free(text);
}

static char seen[8][32];
static int n_seen;

static void note(void *arg, const char *key)
{
	(void)arg;
	snprintf(seen[n_seen++ % 8], sizeof(seen[0]), "%s", key);
}

static void test_diff(void **state)
{
	const char *a = "# heading\n"
			"socket    = /s   # default\n"
			"log-level = info # default\n"
			"max-conns = 10   # file\n";
	const char *b = "# heading\n"
			"socket    = /s   # command line\n"
			"log-level = info # default\n"
			"max-conns = 11   # file\n";

	(void)state;
	n_seen = 0;
	assert_int_equal(confview_diff(a, b, 0, note, NULL), 0);
	assert_int_equal(n_seen, 1);
	assert_string_equal(seen[0], "max-conns");
	n_seen = 0;
	assert_int_equal(confview_diff(a, b, 1, note, NULL), 0);
	assert_int_equal(n_seen, 2);
	assert_string_equal(seen[0], "socket");
	assert_string_equal(seen[1], "max-conns");
	/* A key b lacks counts as changed. */
	n_seen = 0;
	assert_int_equal(confview_diff(a, "# heading\n", 0, note, NULL), 0);
	assert_int_equal(n_seen, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_text_of_defaults),
		cmocka_unit_test(test_diff),
	};

	return cmocka_run_group_tests_name("confview", tests, NULL, NULL);
}
