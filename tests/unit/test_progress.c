/* tests/unit/test_progress.c — kvpalacectl's progress bar (client/ctl/progress.h).
 *
 * The line it draws for known and unknown totals, byte and plain counts,
 * and a total near 2^64 (no overflow, no 100 % before the end); nothing
 * at all when it is off (the stream is no terminal); on a stream, redraws
 * with a carriage return, padding over a longer previous line, and erases
 * itself at the end. A wait's spinner: its line, drawn at once and erased
 * at the end (its redraws come from a thread of its own).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "progress.h"

static void test_format(void **state)
{
	struct progress p;
	char line[160];

	(void)state;
	progress_start(&p, stdout, 0, "evicting", 64ull << 20, 1);
	progress_update(&p, 32ull << 20);
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line,
			    "evicting [###############---------------]  50%  32 MiB / 64 MiB");
	progress_update(&p, 100ull << 20); /* clamped to the total */
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line,
			    "evicting [##############################] 100%  64 MiB / 64 MiB");
	progress_update(&p, 0);
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line, "evicting [------------------------------]   0%  0 B / 64 MiB");

	progress_start(&p, stdout, 0, "copying", 0, 1);
	progress_update(&p, 1536);
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line, "copying 1.5 KiB");

	progress_start(&p, stdout, 0, "pages", 3, 0);
	progress_update(&p, 1);
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line, "pages [##########--------------------]  33%  1 / 3");

	progress_start(&p, stdout, 0, "big", UINT64_MAX, 0);
	progress_update(&p, UINT64_MAX - 1);
	progress_format(&p, line, sizeof(line));
	assert_non_null(strstr(line, " 99%"));
	assert_non_null(strstr(line, "#############################-]"));
}

static void test_draws_only_when_on(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct progress p;

	(void)state;
	assert_non_null(f);
	progress_start(&p, f, 0, "evicting", 10, 0);
	progress_update(&p, 5);
	progress_update(&p, 10);
	progress_end(&p);
	fflush(f);
	assert_int_equal(len, 0);
	/* A memory stream is no terminal. */
	assert_false(progress_wanted(f));

	progress_start(&p, f, 1, "evicting", 10, 0);
	progress_update(&p, 5);	 /* first update: drawn */
	progress_update(&p, 6);	 /* within the interval: not drawn */
	progress_update(&p, 10); /* done: drawn */
	progress_end(&p);
	fclose(f);
	assert_string_equal(buf, "\revicting [###############---------------]  50%  5 / 10"
				 "\revicting [##############################] 100%  10 / 10"
				 "\r                                                       \r");
	free(buf);
}

static void test_pads_over_a_longer_line(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct progress p;

	(void)state;
	progress_start(&p, f, 1, "n", 0, 0);
	p.interval_ns = 0;
	progress_update(&p, 1000);
	progress_update(&p, 7);
	progress_end(&p);
	fclose(f);
	assert_string_equal(buf, "\rn 1000\rn 7   \r      \r");
	free(buf);
}

static void test_wait(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct progress p;
	char line[160];

	(void)state;
	assert_non_null(f);
	/* The spinner turns a quarter each interval (100 ms). */
	progress_wait_start(&p, f, 0, "restoring");
	p.done = 2400;
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line, "restoring | 2.4 s");
	p.done = 2650;
	progress_format(&p, line, sizeof(line));
	assert_string_equal(line, "restoring - 2.6 s");
	progress_wait_end(&p);
	fflush(f);
	assert_int_equal(len, 0);

	progress_wait_start(&p, f, 1, "restoring");
	progress_wait_end(&p);
	fclose(f);
	assert_int_equal(strncmp(buf, "\rrestoring | 0.0 s\r", strlen("\rrestoring | 0.0 s\r")), 0);
	/* Whatever the thread redrew, the line ends erased. */
	assert_int_equal(buf[len - 1], '\r');
	assert_int_equal(buf[len - 2], ' ');
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_draws_only_when_on),
		cmocka_unit_test(test_pads_over_a_longer_line),
		cmocka_unit_test(test_wait),
	};

	return cmocka_run_group_tests_name("progress", tests, NULL, NULL);
}
