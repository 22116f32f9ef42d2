/* daemon/base/log.c — stderr logging with syslog priority prefixes, or native
 * journal entries when stderr is connected to the journal (see log.h).
 *
 * Each entry is formatted whole into a stack buffer and written with one
 * call, so lines from the worker threads do not interleave. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include "log.h"

/* The members of struct log_ctx that become fields. */
#define LOG_FIELDS 5

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

/* Meson hands the compiler source paths relative to the build directory
 * ("../daemon/core/pool.c") or absolute ones; every file of the tree gets
 * the same prefix, so this file's own __FILE__ tells what to cut. */
const char *log_src_path(const char *file)
{
	static const char self[] = __FILE__, tail[] = "daemon/base/log.c";
	const size_t cut = sizeof(self) > sizeof(tail) ? sizeof(self) - sizeof(tail) : 0;

	if (!file)
		return "?";
	if (cut && !strcmp(self + cut, tail) && !strncmp(file, self, cut))
		return file + cut;
	return file;
}

/* The fields of ctx: "NAME=value" for the journal in j[], " name=value" for
 * stderr appended to s (cap bytes, NUL-terminated). Returns how many. */
static int ctx_fields(const struct log_ctx *ctx, char j[LOG_FIELDS][40], char *s, size_t cap)
{
	struct field {
		int on;
		const char *journal, *short_name;
		unsigned long long v;
	} f[LOG_FIELDS];
	size_t len = 0;
	int n = 0;

	if (!ctx)
		return 0;
	f[0] = (struct field){ctx->pool_id != 0, "POOL_ID", "pool", ctx->pool_id};
	f[1] = (struct field){ctx->session_id != 0, "SESSION_ID", "session", ctx->session_id};
	f[2] = (struct field){ctx->conn_id != 0, "CONN_ID", "conn", ctx->conn_id};
	f[3] = (struct field){ctx->has_uid, "UID", "uid", (unsigned long long)ctx->uid};
	f[4] = (struct field){ctx->pid > 0, "PID", "pid", (unsigned long long)ctx->pid};
	s[0] = '\0';
	for (int i = 0; i < LOG_FIELDS; i++) {
		if (!f[i].on)
			continue;
		snprintf(j[n++], sizeof(j[0]), "%s=%llu", f[i].journal, f[i].v);
		if (len < cap)
			len += (size_t)snprintf(s + len, cap - len, "%s%s=%llu", len ? " " : " [",
						f[i].short_name, f[i].v);
	}
	if (n && len < cap)
		snprintf(s + len, cap - len, "]");
	return n;
}

/* Sends one native entry (msg is "MESSAGE=..."); returns what
 * sd_journal_sendv_with_location does. */
static int send_journal(int prio, const char *msg, char f[LOG_FIELDS][40], int n_f,
			const char *file, int line, const char *func)
{
	static const char ident[] = "SYSLOG_IDENTIFIER=kvpalaced";
	char pbuf[16], fbuf[256], lbuf[32];
	struct iovec iov[3 + LOG_FIELDS];
	int n = 0;

	snprintf(pbuf, sizeof(pbuf), "PRIORITY=%d", prio);
	snprintf(fbuf, sizeof(fbuf), "CODE_FILE=%s", log_src_path(file));
	snprintf(lbuf, sizeof(lbuf), "CODE_LINE=%d", line);
	iov[n++] = (struct iovec){.iov_base = (void *)msg, .iov_len = strlen(msg)};
	iov[n++] = (struct iovec){.iov_base = pbuf, .iov_len = strlen(pbuf)};
	iov[n++] = (struct iovec){.iov_base = (void *)ident, .iov_len = sizeof(ident) - 1};
	for (int i = 0; i < n_f; i++)
		iov[n++] = (struct iovec){.iov_base = f[i], .iov_len = strlen(f[i])};
	return sd_journal_sendv_with_location(fbuf, lbuf, func ? func : "?", iov, n);
}

void log_full(int prio, const struct log_ctx *ctx, const char *file, int line, const char *func,
	      const char *fmt, ...)
{
	char text[1200], jf[LOG_FIELDS][40], suffix[160];
	va_list ap;
	int n_f, pre;

	if (prio > log_level)
		return;
	if (to_journal < 0)
		to_journal = stderr_is_journal();
	n_f = ctx_fields(ctx, jf, suffix, sizeof(suffix));
	/* "MESSAGE=" for the journal, "<N>" for stderr, then the text
	 * (1024 bytes at most). */
	pre = to_journal ? snprintf(text, sizeof(text), "MESSAGE=")
			 : snprintf(text, sizeof(text), "<%d>", prio);
	va_start(ap, fmt);
	vsnprintf(text + pre, 1024, fmt, ap);
	va_end(ap);
	if (to_journal) {
		if (send_journal(prio, text, jf, n_f, file, line, func) >= 0)
			return;
		/* No journal after all: a plain line instead. */
		fprintf(stderr, "<%d>%s%s\n", prio, text + pre, n_f ? suffix : "");
		return;
	}
	fprintf(stderr, "%s%s\n", text, n_f ? suffix : "");
}

void log_assert_fail(const char *expr, const char *file, int line, const char *func)
{
	log_full(LOG_CRIT, NULL, file, line, func, "assertion failed: %s at %s:%d", expr,
		 log_src_path(file), line);
	abort();
}
