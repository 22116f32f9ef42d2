/* tests/integration/test_logging.c — what the daemon's log says, as an
 * administrator reads it.
 *
 * test_logging evict: `kvpalacectl evict` is many Evict requests (1024
 * pages each); the daemon's stderr, captured into a file, has exactly one
 * line at notice level or above for each command — with the pages the
 * command printed — however many requests it took: from the host tier
 * (demotions that wait for disk writes) and from the disk tier (headers
 * invalidated before the reply).
 *
 * test_logging journal: a real systemd-journald, started in a mount
 * namespace of this test's own over a private /run (root only; exits 77
 * elsewhere), receives the daemon's native entries ($JOURNAL_STREAM names
 * its stderr, as systemd sets it): the entry of a pool opened carries
 * CODE_FILE=daemon/core/pool.c (the caller, not log.c, and no "../"),
 * CODE_LINE, CODE_FUNC=pool_open, POOL_ID and UID fields, and no entry
 * names log.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL "logging-model"
#define BT    16u

/* 1 layer, 1 head, head_dim 64, 16 tokens of f16: 4096-byte pages. */
static const struct kvp_layout page4k = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 64,
	.block_tokens = BT,
	.dtype = KVP_DTYPE_F16,
};

static char log_path[128];
static int saved_stderr = -1;

/* Until restore_stderr(), this process's stderr — and so that of a
 * daemon started meanwhile, which keeps it — goes to a new file,
 * log_path; *st gets its stat. */
static void capture_stderr(struct stat *st)
{
	int fd;

	snprintf(log_path, sizeof(log_path), "/tmp/kvp-logging.%d.log", (int)getpid());
	fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	fflush(stderr);
	saved_stderr = dup(STDERR_FILENO);
	assert_true(saved_stderr >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	close(fd);
	if (st)
		assert_int_equal(fstat(STDERR_FILENO, st), 0);
}

static void restore_stderr(void)
{
	if (saved_stderr < 0)
		return;
	fflush(stderr);
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	saved_stderr = -1;
}

/* The captured log, NUL-terminated (malloc'd). */
static char *read_log(void)
{
	FILE *f = fopen(log_path, "r");
	char *buf;
	long n;

	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* Commits n_conv conversations of pages pages each, all different, into
 * pool p and closes them: their pages stay in the prefix index only. */
static void fill(kvp_pool *p, uint32_t n_conv, uint32_t pages)
{
	size_t n = (size_t)pages * BT;
	uint32_t *tok = malloc(n * sizeof(*tok));

	assert_non_null(tok);
	for (uint32_t c = 0; c < n_conv; c++) {
		kvp_session *s;

		for (size_t i = 0; i < n; i++)
			tok[i] = 1000003u * (c + 1) + (uint32_t)i;
		assert_int_equal(harness_commit_session(p, tok, n, &s), 0);
		assert_int_equal(kvp_session_close(s), 0);
	}
	free(tok);
}

static char ctl_out[1 << 14];

/* kvpalacectl --socket sock evict --tier tier [--bytes bytes]; returns
 * the pages it says it evicted. */
static unsigned long long ctl_evict(const char *sock, const char *tier, const char *bytes)
{
	char *argv[] = {getenv("KVPALACECTL"), "--socket", (char *)sock,  "evict", "--tier",
			(char *)tier,	       "--bytes",  (char *)bytes, NULL};
	unsigned long long pages = 0;
	const char *at;

	assert_non_null(argv[0]);
	if (harness_run_capture(argv, NULL, ctl_out, sizeof(ctl_out)) != 0)
		fail_msg("kvpalacectl evict --tier %s: %s", tier, ctl_out);
	at = strstr(ctl_out, "evicted ");
	if (!at || sscanf(at, "evicted %llu page", &pages) != 1)
		fail_msg("kvpalacectl evict says: %s", ctl_out);
	return pages;
}

/* Lines of log at priority notice or above (<0>..<5>) and at info (<6>)
 * that contain every one of the NULL-terminated words; the last such
 * line in *ret_line (cap bytes) when not NULL. */
static void count_lines(const char *log, const char *const *words, int *ret_loud, int *ret_info,
			char *ret_line, size_t cap)
{
	const char *line = log;

	*ret_loud = *ret_info = 0;
	while (*line) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		char buf[2048];
		int all = 1;

		snprintf(buf, sizeof(buf), "%.*s", (int)len, line);
		for (size_t i = 0; words[i]; i++)
			all &= strstr(buf, words[i]) != NULL;
		if (all && buf[0] == '<' && buf[1] >= '0' && buf[1] <= '6' && buf[2] == '>') {
			if (buf[1] == '6')
				(*ret_info)++;
			else
				(*ret_loud)++;
			if (ret_line)
				snprintf(ret_line, cap, "%s", buf);
		}
		line += len + (nl ? 1 : 0);
	}
}

/* After the n-th eviction command, from tier, that evicted pages pages:
 * n lines about evictions at info or above in the log so far, whatever
 * their wording (one per command, however many requests it took: the
 * requests themselves only at debug level), the last at notice, naming the
 * tier and the pages the command printed, with the admin's uid and pid
 * as fields. */
static void expect_lines(int n, const char *tier, unsigned long long pages)
{
	static const char *const words[] = {"admin (pid", "evict", NULL};
	char line[2048] = "", want[64];
	char *log = read_log();
	int loud, info;

	count_lines(log, words, &loud, &info, line, sizeof(line));
	if (loud + info != n)
		fail_msg("%d lines about evictions after %d eviction commands:\n%s", loud + info, n,
			 log);
	free(log);
	if (line[1] > '5')
		fail_msg("the eviction logged below notice: %s", line);
	snprintf(want, sizeof(want), "from the %s tier", tier);
	if (!strstr(line, want))
		fail_msg("the %s tier's eviction logged as: %s", tier, line);
	snprintf(want, sizeof(want), ": %llu pages (", pages);
	if (!strstr(line, want))
		fail_msg("kvpalacectl evicted %llu pages, the log says: %s", pages, line);
	if (!strstr(line, "[uid=") || !strstr(line, " pid="))
		fail_msg("no [uid= pid=] fields on the line: %s", line);
}

static void test_evict_one_line(void **state)
{
	/* 4096 pages of 4 KiB in the host tier: 3840 of them cached. */
	static const char *const extra[] = {"--host-pool-size", "16M", "--log-level", "info", NULL};
	unsigned long long pages;
	struct harness h;
	int ret;
	kvp_client *c;
	kvp_pool *p;

	(void)state;
	capture_stderr(NULL);
	ret = harness_start(&h, extra);
	/* The daemon keeps the file as its stderr; this test's messages go
	 * where they went. */
	restore_stderr();
	if (ret < 0)
		fail_msg("no daemon: see %s", log_path);
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	fill(p, 60, 64);
	/* 12 MiB of 15: three requests of 1024 pages, each waiting for the
	 * disk writes of its pages. (The line is written before the last
	 * reply goes.) */
	pages = ctl_evict(h.admin_sock, "host", "12M");
	assert_true(pages >= 3 * 1024);
	expect_lines(1, "host", pages);
	/* Everything on disk, in requests that invalidate its headers. */
	pages = ctl_evict(h.admin_sock, "disk", "1G");
	assert_true(pages >= 3 * 1024);
	expect_lines(2, "disk", pages);
	kvp_pool_close(p);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	unlink(log_path);
}

/* ---- a real journal ----------------------------------------------------- */

static pid_t journald = -1;
static const char *journalctl;

static int exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

/* A systemd-journald of this test's own: a private mount namespace with a
 * tmpfs on /run (and on /var/log/journal, so nothing reaches the host's
 * journal), where it binds /run/systemd/journal/socket. Returns 0, or -1
 * when that cannot be had here (not root, no journald, no namespaces). */
static int start_journald(void)
{
	static const char *const bins[] = {"/lib/systemd/systemd-journald",
					   "/usr/lib/systemd/systemd-journald"};
	const char *bin = NULL;

	for (size_t i = 0; i < 2 && !bin; i++)
		if (access(bins[i], X_OK) == 0)
			bin = bins[i];
	journalctl = access("/usr/bin/journalctl", X_OK) == 0 ? "/usr/bin/journalctl"
							      : "/bin/journalctl";
	if (!bin || geteuid() != 0 || access(journalctl, X_OK) < 0) {
		printf("# skip: needs root and %s\n", bin ? bin : "systemd-journald");
		return -1;
	}
	if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") < 0) {
		printf("# skip: no private /run: %s\n", strerror(errno));
		return -1;
	}
	if (exists("/var/log/journal") &&
	    mount("tmpfs", "/var/log/journal", "tmpfs", 0, "mode=0755") < 0) {
		printf("# skip: cannot hide /var/log/journal: %s\n", strerror(errno));
		return -1;
	}
	if (mkdir("/run/systemd", 0755) < 0 || mkdir("/run/systemd/journal", 0755) < 0 ||
	    mkdir("/run/log", 0755) < 0 || mkdir("/run/log/journal", 0755) < 0)
		return -1;
	journald = fork();
	if (journald < 0)
		return -1;
	if (journald == 0) {
		int null = open("/dev/null", O_RDWR);

		/* Gone with this test, whatever becomes of it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);

		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		execl(bin, bin, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 100; i++) {
		if (exists("/run/systemd/journal/socket"))
			return 0;
		usleep(50 * 1000);
	}
	printf("# skip: %s did not start\n", bin);
	kill(journald, SIGKILL);
	waitpid(journald, NULL, 0);
	journald = -1;
	return -1;
}

static void stop_journald(void)
{
	if (journald <= 0)
		return;
	kill(journald, SIGTERM);
	waitpid(journald, NULL, 0);
	journald = -1;
}

static char export_buf[1 << 20];

/* The daemon's entries, `journalctl -o export` (one "FIELD=value" line
 * each, a blank line between entries), into export_buf. */
static void read_journal(pid_t pid)
{
	char match[32];
	char *argv[] = {(char *)journalctl, "-D", "/run/log/journal", "-o", "export", match, NULL};

	snprintf(match, sizeof(match), "_PID=%d", (int)pid);
	if (harness_run_capture(argv, NULL, export_buf, sizeof(export_buf)) != 0)
		fail_msg("journalctl: %s", export_buf);
}

/* A copy in buf of the first entry whose MESSAGE starts with prefix,
 * each of its lines after a '\n'; NULL when none. */
static char *find_entry(const char *prefix, char *buf, size_t cap)
{
	const char *at, *start, *end;
	char want[256];

	snprintf(want, sizeof(want), "\nMESSAGE=%s", prefix);
	at = strstr(export_buf, want);
	if (!at)
		return NULL;
	for (start = at; start > export_buf + 1 && !(start[-1] == '\n' && start[-2] == '\n');)
		start--;
	end = strstr(at + 1, "\n\n");
	if (!end)
		end = at + strlen(at);
	snprintf(buf, cap, "\n%.*s\n", (int)(end - start), start);
	return buf;
}

/* The value of field name in entry (of find_entry), in val (cap bytes);
 * -1 when absent. */
static int field(const char *entry, const char *name, char *val, size_t cap)
{
	const char *at, *nl;
	char want[64];

	snprintf(want, sizeof(want), "\n%s=", name);
	at = strstr(entry, want);
	if (!at)
		return -1;
	at += strlen(want);
	nl = strchr(at, '\n');
	snprintf(val, cap, "%.*s", (int)(nl - at), at);
	return 0;
}

static void test_journal_fields(void **state)
{
	static const char *const extra[] = {"--log-level", "debug", NULL};
	char stream[64], entry[8192], msg[64], val[256], uid[16];
	struct harness h;
	struct stat st;
	kvp_client *c;
	kvp_pool *p;
	uint64_t id;
	pid_t pid;
	int ret;

	(void)state;
	capture_stderr(&st);
	/* systemd's way of saying "stderr is the journal". */
	snprintf(stream, sizeof(stream), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", stream, 1);
	ret = harness_start(&h, extra);
	/* The daemon keeps the file as its stderr; this test's messages go
	 * where they went. */
	restore_stderr();
	if (ret < 0)
		fail_msg("no daemon: see %s", log_path);
	unsetenv("JOURNAL_STREAM");
	pid = h.pid;
	assert_int_equal(kvp_connect(h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &page4k, &p), 0);
	id = kvp_pool_id(p);
	kvp_pool_close(p);
	kvp_disconnect(c);
	assert_int_equal(harness_stop(&h), 0);
	unlink(log_path);

	/* The daemon's entries, once journald has written them. */
	snprintf(msg, sizeof(msg), "pool %llu: uid ", (unsigned long long)id);
	for (int i = 0; i < 100; i++) {
		read_journal(pid);
		if (find_entry(msg, entry, sizeof(entry)) && strstr(export_buf, "MESSAGE=stopped"))
			break;
		usleep(50 * 1000);
	}
	if (!find_entry(msg, entry, sizeof(entry)))
		fail_msg("no entry '%s...' in the journal:\n%s", msg, export_buf);
	/* Where it was decided, relative to the source root. */
	if (field(entry, "CODE_FILE", val, sizeof(val)) < 0 || strcmp(val, "daemon/core/pool.c"))
		fail_msg("CODE_FILE is not daemon/core/pool.c:\n%s", entry);
	if (field(entry, "CODE_FUNC", val, sizeof(val)) < 0 || strcmp(val, "pool_open"))
		fail_msg("CODE_FUNC is not pool_open:\n%s", entry);
	if (field(entry, "CODE_LINE", val, sizeof(val)) < 0 || atoi(val) <= 0)
		fail_msg("no CODE_LINE:\n%s", entry);
	/* What it is about. */
	snprintf(msg, sizeof(msg), "%llu", (unsigned long long)id);
	if (field(entry, "POOL_ID", val, sizeof(val)) < 0 || strcmp(val, msg))
		fail_msg("POOL_ID is not %s:\n%s", msg, entry);
	snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
	if (field(entry, "UID", val, sizeof(val)) < 0 || strcmp(val, uid))
		fail_msg("UID is not %s:\n%s", uid, entry);
	if (field(entry, "PRIORITY", val, sizeof(val)) < 0 || strcmp(val, "6"))
		fail_msg("PRIORITY is not 6 (info):\n%s", entry);
	if (field(entry, "SYSLOG_IDENTIFIER", val, sizeof(val)) < 0 || strcmp(val, "kvpalaced"))
		fail_msg("SYSLOG_IDENTIFIER is not kvpalaced:\n%s", entry);
	/* A connection's entries name it and its client. */
	if (!find_entry("connection ", entry, sizeof(entry)) ||
	    field(entry, "CONN_ID", val, sizeof(val)) < 0 ||
	    field(entry, "PID", val, sizeof(val)) < 0 || atoi(val) != (int)getpid())
		fail_msg("no connection entry with CONN_ID and PID=%d:\n%s", (int)getpid(),
			 export_buf);
	/* No entry says it came from the logging code itself, or from a path
	 * only the build directory makes sense of. */
	if (strstr(export_buf, "CODE_FILE=daemon/base/log.c") || strstr(export_buf, "/log.c\n") ||
	    strstr(export_buf, "CODE_FILE=../") || strstr(export_buf, "CODE_FILE=/"))
		fail_msg("entries from log.c or with build-relative paths:\n%s", export_buf);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest evict_tests[] = {
		cmocka_unit_test(test_evict_one_line),
	};
	const struct CMUnitTest journal_tests[] = {
		cmocka_unit_test(test_journal_fields),
	};
	int ret;

	if (argc > 1 && !strcmp(argv[1], "journal")) {
		if (start_journald() < 0)
			return 77;
		ret = cmocka_run_group_tests(journal_tests, NULL, NULL);
		stop_journald();
		return ret;
	}
	return cmocka_run_group_tests(evict_tests, NULL, NULL);
}
