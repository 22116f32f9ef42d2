/* daemon/base/log.c — stderr logging with syslog priority prefixes, or native
 * journal entries when stderr is connected to the journal. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>

#include "log.h"

static int log_level = LOG_INFO;
static int to_journal = -1; /* unknown until the first message */

/* True when $JOURNAL_STREAM names stderr's device and inode: systemd
 * connected stderr to the journal, so native entries (with priority and
 * code location fields) are better than parsed <N> prefixes. */
static int stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_set_level(int level)
{
	log_level = level;
}

int log_get_level(void)
{
	return log_level;
}

int log_parse_level(const char *s)
{
	static const char *const names[] = {"emerg",   "alert",	 "crit", "err",
					    "warning", "notice", "info", "debug"};

	for (int i = 0; i < 8; i++)
		if (!strcmp(s, names[i]))
			return i;
	if (!strcmp(s, "error"))
		return LOG_ERR;
	if (!strcmp(s, "warn"))
		return LOG_WARNING;
	if (s[0] >= '0' && s[0] <= '7' && !s[1])
		return s[0] - '0';
	return -EINVAL;
}

void log_msg(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	if (prio > log_level)
		return;
	if (to_journal < 0)
		to_journal = stderr_is_journal();
	n = to_journal ? 0 : snprintf(line, sizeof(line), "<%d>", prio);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (to_journal && sd_journal_print(prio, "%s", line) >= 0)
		return;
	fprintf(stderr, "%s\n", line);
}

void log_assert_fail(const char *expr, const char *file, int line)
{
	log_msg(LOG_CRIT, "assertion failed: %s at %s:%d", expr, file, line);
	abort();
}
