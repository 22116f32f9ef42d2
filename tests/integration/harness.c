/* tests/integration/harness.c — daemon lifecycle, child processes,
 * deterministic K/V and a raw protocol client for the integration tests
 * (see harness.h). Single-threaded; each process uses its own copies.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "demo_kv.h"
#include "harness.h"
#include "status.h"

const struct kvp_layout harness_layout = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 32,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
	.quant_group = 0,
};

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* In a child: be killed when the test process ends, so a child left
 * waiting by a failed assertion, or a daemon of a crashed test, never
 * outlives it. */
static void die_with_parent(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
}

/* ---- daemon ------------------------------------------------------------- */

static int can_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int ok;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void describe_status(const char *what, int status)
{
	if (WIFEXITED(status))
		fprintf(stderr, "harness: kvpalaced %s with status %d\n", what,
			WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		fprintf(stderr, "harness: kvpalaced %s by signal %d (%s)\n", what, WTERMSIG(status),
			strsignal(WTERMSIG(status)));
}

const char *harness_eviction;

/* Starts the daemon in h->dir (which exists) and waits until it serves. */
static int spawn(struct harness *h, const char *daemon, const char *const *extra)
{
	char state[160], cache[160], wrap[512], *save = NULL;
	const char *argv[64], *wrapper = getenv("KVPALACED_WRAPPER");
	const char *eviction = harness_eviction, *more = getenv("KVP_TEST_DAEMON_ARGS");
	char more_buf[512];
	int argc = 0;
	double deadline;
	pid_t parent;

	snprintf(state, sizeof(state), "%s/state", h->dir);
	snprintf(cache, sizeof(cache), "%s/cache", h->dir);
	/* $KVPALACED_WRAPPER (meson test --setup valgrind sets it): words
	 * run before the daemon, split at blanks, the first looked up in
	 * $PATH — "valgrind --error-exitcode=1 ...". */
	if (wrapper && *wrapper) {
		snprintf(wrap, sizeof(wrap), "%s", wrapper);
		for (char *w = strtok_r(wrap, " \t", &save); w && argc < 24;
		     w = strtok_r(NULL, " \t", &save))
			argv[argc++] = w;
	}
	argv[argc++] = daemon;
	argv[argc++] = "--socket";
	argv[argc++] = h->sock;
	argv[argc++] = "--admin-socket";
	argv[argc++] = h->admin_sock;
	argv[argc++] = "--state-dir";
	argv[argc++] = state;
	argv[argc++] = "--cache-dir";
	argv[argc++] = cache;
	/* $KVP_TEST_EVICTION and $KVP_TEST_DAEMON_ARGS (harness.h): the
	 * whole suite under another victim order or with options added. */
	if (!eviction || !*eviction)
		eviction = getenv("KVP_TEST_EVICTION");
	if (eviction && *eviction) {
		argv[argc++] = "--eviction";
		argv[argc++] = eviction;
	}
	if (more && *more) {
		snprintf(more_buf, sizeof(more_buf), "%s", more);
		for (char *w = strtok_r(more_buf, " \t", &save); w && argc < 40;
		     w = strtok_r(NULL, " \t", &save))
			argv[argc++] = w;
	}
	for (int i = 0; extra && extra[i] && argc < 62; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;

	fflush(stdout);
	fflush(stderr);
	parent = getpid();
	h->pid = fork();
	if (h->pid < 0) {
		perror("harness: fork");
		h->pid = 0;
		return -1;
	}
	if (h->pid == 0) {
		/* The daemon's log goes to the test's stderr, into meson's log. */
		die_with_parent(parent);
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "harness: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}

	deadline = now_s() + 30;
	while (now_s() < deadline) {
		int status;

		if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
			describe_status("exited before it was ready", status);
			h->pid = 0;
			harness_stop(h);
			return -1;
		}
		if (can_connect(h->sock) && can_connect(h->admin_sock))
			return 0;
		sleep_ms(10);
	}
	fprintf(stderr, "harness: kvpalaced did not accept connections on %s\n", h->sock);
	harness_stop(h);
	return -1;
}

int harness_start(struct harness *h, const char *const *extra)
{
	const char *daemon = getenv("KVPALACED");
	const char *tmp = getenv("TMPDIR");

	memset(h, 0, sizeof(*h));
	if (!daemon || !*daemon) {
		fprintf(stderr, "harness: $KVPALACED is not set (meson sets it)\n");
		return -1;
	}
	/* Socket paths must fit sun_path: fall back to /tmp for long $TMPDIR. */
	if (!tmp || strlen(tmp) > 60)
		tmp = "/tmp";
	snprintf(h->dir, sizeof(h->dir), "%s/kvpt-XXXXXX", tmp);
	if (!mkdtemp(h->dir)) {
		perror("harness: mkdtemp");
		return -1;
	}
	/* Searchable by everyone so a test can connect as another user. */
	chmod(h->dir, 0755);
	snprintf(h->sock, sizeof(h->sock), "%s/kvpalace.sock", h->dir);
	snprintf(h->admin_sock, sizeof(h->admin_sock), "%s/admin.sock", h->dir);
	return spawn(h, daemon, extra);
}

int harness_restart(struct harness *h, int sig, const char *const *extra)
{
	int ret = 0;

	if (h->pid > 0) {
		int st;

		kill(h->pid, sig);
		st = harness_wait(h->pid, 20);
		if (st < 0 || (sig == SIGTERM && st != 0)) {
			fprintf(stderr, "harness: kvpalaced ended with %d after signal %d\n", st,
				sig);
			ret = -1;
		}
		h->pid = 0;
	}
	if (ret < 0) {
		harness_stop(h);
		return -1;
	}
	/* A killed daemon's sockets accept connections until the kernel has
	 * torn its io_uring down: wait for that, or readiness would lie. */
	for (int i = 0; i < 500 && (can_connect(h->sock) || can_connect(h->admin_sock)); i++)
		sleep_ms(10);
	return spawn(h, getenv("KVPALACED"), extra);
}

int harness_daemon_alive(struct harness *h)
{
	int status;

	if (!h->pid)
		return 0;
	if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
		describe_status("died", status);
		h->pid = 0;
		return 0;
	}
	return 1;
}

int harness_stop(struct harness *h)
{
	int ret = 0;

	if (!h)
		return 0;
	if (h->pid > 0) {
		int status = 0;
		double deadline = now_s() + 20;
		pid_t w = 0;

		if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
			describe_status("had died during the test", status);
			ret = -1;
		} else {
			kill(h->pid, SIGTERM);
			while ((w = waitpid(h->pid, &status, WNOHANG)) == 0 && now_s() < deadline)
				sleep_ms(10);
			if (w != h->pid) {
				fprintf(stderr, "harness: kvpalaced ignored SIGTERM; killing it\n");
				kill(h->pid, SIGKILL);
				waitpid(h->pid, &status, 0);
				ret = -1;
			} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
				describe_status("stopped", status);
				ret = -1;
			}
		}
		h->pid = 0;
	}
	if (h->dir[0]) {
		nftw(h->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		h->dir[0] = '\0';
	}
	return ret;
}

int harness_setup_args(void **state, const char *const *extra)
{
	struct harness *h = calloc(1, sizeof(*h));

	if (!h)
		return -1;
	if (harness_start(h, extra) < 0) {
		free(h);
		return -1;
	}
	*state = h;
	return 0;
}

int harness_setup(void **state)
{
	return harness_setup_args(state, NULL);
}

int harness_teardown(void **state)
{
	struct harness *h = *state;
	int ret = harness_stop(h);

	free(h);
	return ret;
}

/* ---- child processes ---------------------------------------------------- */

pid_t harness_fork(int (*fn)(void *), void *arg)
{
	pid_t parent = getpid();
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) {
		int ret;

		die_with_parent(parent);
		ret = fn(arg);

		fflush(stdout);
		fflush(stderr);
		_exit(ret & 0xff);
	}
	return pid;
}

int harness_wait(pid_t pid, int timeout_s)
{
	double deadline = now_s() + timeout_s;
	int status;
	pid_t w;

	if (pid <= 0)
		return -1;
	while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < deadline)
		sleep_ms(5);
	if (w != pid) {
		fprintf(stderr, "harness: child %d did not finish in %d s; killing it\n", (int)pid,
			timeout_s);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		return -1;
	}
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}

int harness_run_child(int (*fn)(void *), void *arg)
{
	return harness_wait(harness_fork(fn, arg), 120);
}

int harness_run_capture(char *const argv[], char *const env[], char *out, size_t cap)
{
	int p[2];
	size_t used = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		dup2(p[1], STDERR_FILENO);
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(p[1]);
	for (;;) {
		char sink[512];
		ssize_t n;

		if (used + 1 < cap)
			n = read(p[0], out + used, cap - 1 - used);
		else
			n = read(p[0], sink, sizeof(sink));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (used + 1 < cap)
			used += (size_t)n;
	}
	out[used] = '\0';
	close(p[0]);
	return harness_wait(pid, 60);
}

int harness_ctl(char *out, size_t cap, const char *sock, ...)
{
	char *bin = getenv("KVPALACECTL"), *argv[24] = {bin, "--socket", (char *)sock};
	int n = 3;
	va_list ap;

	if (!bin)
		return -1;
	va_start(ap, sock);
	while (n < 23 && (argv[n] = va_arg(ap, char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	return harness_run_capture(argv, NULL, out, cap);
}

int harness_spill_open(const struct harness *h)
{
	char pattern[160];
	glob_t g;
	int fd = -1;

	snprintf(pattern, sizeof(pattern), "%s/cache/spill-*.kvs", h->dir);
	if (glob(pattern, 0, NULL, &g) != 0)
		return -1;
	if (g.gl_pathc == 1)
		fd = open(g.gl_pathv[0], O_RDWR | O_CLOEXEC);
	globfree(&g);
	return fd;
}

int harness_become_nobody(void)
{
	if (geteuid() != 0)
		return -1;
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		return -1;
	return geteuid() == 65534 ? 0 : -1;
}

int harness_become(uid_t uid)
{
	pid_t parent = getppid();

	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		return -1;
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		return -1;
	return geteuid() == uid ? 0 : -1;
}

long harness_proc_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t flen = strlen(field);
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, flen) && line[flen] == ':') {
			kb = strtol(line + flen + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kb;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double harness_quantile(double *v, size_t n, double q)
{
	size_t i;

	qsort(v, n, sizeof(*v), cmp_double);
	i = (size_t)(q * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

/* ---- deterministic K/V -------------------------------------------------- */

uint32_t harness_token(uint32_t seq, uint64_t pos)
{
	/* Ids up to ~150k like real vocabularies; multi-byte varints. */
	return (uint32_t)(demo_mix(((uint64_t)seq << 40) ^ pos) % 150000u) + 1000u;
}

void harness_tokens(uint32_t *tokens, size_t n, uint32_t seq, uint64_t from)
{
	for (size_t i = 0; i < n; i++)
		tokens[i] = harness_token(seq, from + i);
}

/* The demo's f16 formula (examples/demo_kv.h), keyed by position and token
 * id together: the same position of two different sequences differs, so
 * pages of the wrong session show up too. */
static uint64_t kv_key(uint32_t token, uint64_t pos)
{
	return (uint64_t)token << 40 ^ pos;
}

void harness_kv_fill(uint16_t *row, uint32_t head_dim, uint32_t token, uint64_t pos, uint32_t layer,
		     uint32_t kv, uint32_t head)
{
	for (uint32_t d = 0; d < head_dim; d++)
		row[d] = demo_kv_elem(kv_key(token, pos), layer, kv, head, d);
}

int harness_kv_check(const uint16_t *row, uint32_t head_dim, uint32_t token, uint64_t pos,
		     uint32_t layer, uint32_t kv, uint32_t head)
{
	for (uint32_t d = 0; d < head_dim; d++)
		if (row[d] != demo_kv_elem(kv_key(token, pos), layer, kv, head, d))
			return -1;
	return 0;
}

int harness_write_session(const kvp_pool *p, kvp_session *s, uint64_t from, const uint32_t *tokens,
			  size_t n)
{
	const struct kvp_layout *l = kvp_pool_layout(p);

	if (l->dtype != KVP_DTYPE_F16 || kvp_pool_row_bytes(p) != l->head_dim * 2u)
		return -1;
	for (size_t i = 0; i < n; i++)
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < l->n_kv_heads; head++) {
					void *row = kvp_session_kv(s, from + i, layer, kv, head);

					if (!row)
						return -1;
					harness_kv_fill(row, l->head_dim, tokens[i], from + i,
							layer, kv, head);
				}
	return 0;
}

int harness_commit_session(kvp_pool *p, const uint32_t *tokens, size_t n, kvp_session **ret_session)
{
	kvp_session *s;
	int ret = kvp_session_create(p, &s);

	if (ret < 0)
		return ret;
	ret = kvp_append(s, tokens, n);
	if (ret == 0 && harness_write_session(p, s, 0, tokens, n) < 0)
		ret = -EFAULT;
	if (ret == 0)
		ret = kvp_commit(s, n);
	if (ret < 0) {
		kvp_session_close(s);
		return ret;
	}
	*ret_session = s;
	return 0;
}

uint64_t harness_check_lease(const kvp_lease *lease, const kvp_pool *p, const uint32_t *tokens,
			     uint64_t n)
{
	const struct kvp_layout *l = kvp_pool_layout(p);
	uint64_t bad = 0;

	for (uint64_t pos = 0; pos < n; pos++)
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < l->n_kv_heads; head++) {
					const void *row = kvp_lease_kv(lease, pos, layer, kv, head);

					if (!row || harness_kv_check(row, l->head_dim, tokens[pos],
								     pos, layer, kv, head) < 0)
						bad++;
				}
	if (bad)
		fprintf(stderr, "harness: %llu of %llu rows differ\n", (unsigned long long)bad,
			(unsigned long long)(n * l->n_layers * 2 * l->n_kv_heads));
	return bad;
}

/* ---- K/V keyed by the token prefix -------------------------------------- */

uint64_t harness_prefix_step(uint64_t ph, uint32_t token)
{
	return demo_mix(ph ^ ((uint64_t)token * 0xff51afd7ed558ccdull));
}

static uint64_t pkv_seed(uint64_t ph, uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head)
{
	return demo_mix(ph ^ demo_mix(pos ^ (uint64_t)layer << 32 ^ (uint64_t)kv << 48 ^
				      (uint64_t)head << 52));
}

/* Element d of a row from its seed: finite, normal f16 values. */
static uint16_t pkv_elem(uint64_t *x)
{
	uint64_t h;

	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	h = *x;
	return (uint16_t)((((h >> 15) & 1u) << 15) | ((9u + ((h >> 10) & 7u)) << 10) |
			  (h & 0x3ffu));
}

void harness_pkv_fill(uint16_t *row, uint32_t head_dim, uint64_t ph, uint64_t pos, uint32_t layer,
		      uint32_t kv, uint32_t head)
{
	uint64_t x = pkv_seed(ph, pos, layer, kv, head) | 1;

	for (uint32_t d = 0; d < head_dim; d++)
		row[d] = pkv_elem(&x);
}

int harness_pkv_check(const uint16_t *row, uint32_t head_dim, uint64_t ph, uint64_t pos,
		      uint32_t layer, uint32_t kv, uint32_t head)
{
	uint64_t x = pkv_seed(ph, pos, layer, kv, head) | 1;

	for (uint32_t d = 0; d < head_dim; d++)
		if (row[d] != pkv_elem(&x))
			return -1;
	return 0;
}

int harness_pkv_write_session(const kvp_pool *p, kvp_session *s, const uint32_t *tokens,
			      uint64_t from, uint64_t to)
{
	const struct kvp_layout *l = kvp_pool_layout(p);
	uint64_t ph = HARNESS_PREFIX_SEED;

	if (l->dtype != KVP_DTYPE_F16 || kvp_pool_row_bytes(p) != l->head_dim * 2u)
		return -1;
	for (uint64_t pos = 0; pos < to; pos++) {
		ph = harness_prefix_step(ph, tokens[pos]);
		if (pos < from)
			continue;
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < l->n_kv_heads; head++) {
					void *row = kvp_session_kv(s, pos, layer, kv, head);

					if (!row)
						return -1;
					harness_pkv_fill(row, l->head_dim, ph, pos, layer, kv,
							 head);
				}
	}
	return 0;
}

float harness_f16_to_float(uint16_t x)
{
	int e = (x >> 10) & 0x1f;
	float v =
		e ? ldexpf((float)((x & 0x3ff) | 0x400), e - 25) : ldexpf((float)(x & 0x3ff), -24);

	return x & 0x8000 ? -v : v;
}

uint64_t harness_pkv_check_int8(const kvp_pool *p, const kvp_lease *l, kvp_session *s,
				const uint32_t *tokens, uint64_t n, uint64_t *ret_inexact)
{
	const struct kvp_layout *lo = kvp_pool_layout(p);
	uint64_t ph = HARNESS_PREFIX_SEED, bad = 0;
	uint16_t want[1024]; /* head_dim is at most 1024 */

	*ret_inexact = 0;
	for (uint64_t pos = 0; pos < n; pos++) {
		ph = harness_prefix_step(ph, tokens[pos]);
		for (uint32_t layer = 0; layer < lo->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t hd = 0; hd < lo->n_kv_heads; hd++) {
					const uint16_t *row =
						l ? kvp_lease_kv(l, pos, layer, kv, hd)
						  : kvp_session_kv(s, pos, layer, kv, hd);
					int off = 0;

					if (!row) {
						bad++;
						continue;
					}
					harness_pkv_fill(want, lo->head_dim, ph, pos, layer, kv,
							 hd);
					*ret_inexact += memcmp(row, want, lo->head_dim * 2u) != 0;
					for (uint32_t g = 0; g < lo->head_dim; g += 32) {
						float amax = 0;

						for (uint32_t d = g; d < g + 32; d++)
							amax = fmaxf(amax,
								     fabsf(harness_f16_to_float(
									     want[d])));
						for (uint32_t d = g; d < g + 32; d++) {
							float w = harness_f16_to_float(want[d]);

							off |= fabsf(harness_f16_to_float(row[d]) -
								     w) >
							       amax / 127 * 0.51f + fabsf(w) / 1024;
						}
					}
					bad += off;
				}
	}
	return bad;
}

/* Checks rows of [from, to) read through get(obj, pos, ...). */
static uint64_t pkv_check_rows(const struct kvp_layout *l, const uint32_t *tokens, uint64_t from,
			       uint64_t to,
			       const void *(*get)(const void *obj, uint64_t pos, uint32_t layer,
						  uint32_t kv, uint32_t head),
			       const void *obj, const char *what)
{
	uint64_t ph = HARNESS_PREFIX_SEED, bad = 0, first = UINT64_MAX;

	for (uint64_t pos = 0; pos < to; pos++) {
		ph = harness_prefix_step(ph, tokens[pos]);
		if (pos < from)
			continue;
		for (uint32_t layer = 0; layer < l->n_layers; layer++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t head = 0; head < l->n_kv_heads; head++) {
					const void *row = get(obj, pos, layer, kv, head);

					if (!row || harness_pkv_check(row, l->head_dim, ph, pos,
								      layer, kv, head) < 0) {
						if (!bad)
							first = pos;
						bad++;
					}
				}
	}
	if (bad)
		fprintf(stderr,
			"harness: %s: %llu rows of positions [%llu, %llu) differ, the first at "
			"position %llu\n",
			what, (unsigned long long)bad, (unsigned long long)from,
			(unsigned long long)to, (unsigned long long)first);
	return bad;
}

static const void *session_row(const void *obj, uint64_t pos, uint32_t layer, uint32_t kv,
			       uint32_t head)
{
	return kvp_session_kv((kvp_session *)obj, pos, layer, kv, head);
}

static const void *lease_row(const void *obj, uint64_t pos, uint32_t layer, uint32_t kv,
			     uint32_t head)
{
	return kvp_lease_kv(obj, pos, layer, kv, head);
}

uint64_t harness_pkv_check_session(const kvp_pool *p, kvp_session *s, const uint32_t *tokens,
				   uint64_t from, uint64_t to)
{
	return pkv_check_rows(kvp_pool_layout(p), tokens, from, to, session_row, s, "session");
}

uint64_t harness_pkv_check_lease(const kvp_lease *l, const kvp_pool *p, const uint32_t *tokens,
				 uint64_t n)
{
	return pkv_check_rows(kvp_pool_layout(p), tokens, 0, n, lease_row, l, "lease");
}

int harness_pkv_commit_session(kvp_pool *p, const uint32_t *tokens, size_t n,
			       kvp_session **ret_session)
{
	kvp_session *s;
	int ret = kvp_session_create(p, &s);

	if (ret < 0)
		return ret;
	ret = kvp_append(s, tokens, n);
	if (ret == 0 && harness_pkv_write_session(p, s, tokens, 0, n) < 0)
		ret = -EFAULT;
	if (ret == 0)
		ret = kvp_commit(s, n);
	if (ret < 0) {
		kvp_session_close(s);
		return ret;
	}
	*ret_session = s;
	return 0;
}

const struct kvp_pool_stats *harness_find_pool(const struct kvp_stats *st, uint64_t pool_id)
{
	for (size_t i = 0; i < st->n_pools; i++)
		if (st->pools[i].pool_id == pool_id)
			return &st->pools[i];
	return NULL;
}

int harness_pool_stats(kvp_client *c, uint64_t pool_id, struct kvp_pool_stats *ret,
		       uint64_t *ret_connections)
{
	const struct kvp_pool_stats *ps;
	struct kvp_stats *st;
	int err = kvp_stats(c, &st);

	if (err < 0)
		return err;
	ps = harness_find_pool(st, pool_id);
	if (ps) {
		*ret = *ps;
		if (ret_connections)
			*ret_connections = st->connections;
	}
	kvp_stats_free(st);
	return ps ? 0 : -ENOENT;
}

/* ---- raw protocol client ------------------------------------------------ */

int raw_open(struct raw *r, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 10};
	int ret;

	r->sock = -1;
	r->rx_len = r->rx_off = 0;
	r->batched_ok = 0;
	r->mem_bytes = frame_arena_bytes(FRAME_MAX_MAX_BYTES);
	r->mem = malloc(r->mem_bytes);
	if (!r->mem)
		return -ENOMEM;
	frame_arena_init(&r->arena, r->mem, r->mem_bytes);
	r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (r->sock < 0)
		goto fail;
	if (setsockopt(r->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(r->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		goto fail;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	return 0;
fail:
	ret = -errno;
	raw_close(r);
	return ret;
}

void raw_close(struct raw *r)
{
	if (r->sock >= 0)
		close(r->sock);
	r->sock = -1;
	free(r->mem);
	r->mem = NULL;
}

int raw_send_bytes(struct raw *r, const void *buf, size_t n, int fd)
{
	return frame_send(r->sock, buf, n, fd);
}

int raw_send(struct raw *r, const Kvpalace__V1__Request *req)
{
	int n = frame_pack_request(req, r->buf, sizeof(r->buf), sizeof(r->buf));

	if (n < 0)
		return n;
	return frame_send(r->sock, r->buf, (size_t)n, -1);
}

int raw_send_batch(struct raw *r, Kvpalace__V1__Request *const *reqs, size_t n)
{
	size_t used = 0;

	for (size_t i = 0; i < n; i++) {
		int k = frame_pack_request(reqs[i], r->buf + used, sizeof(r->buf) - used,
					   sizeof(r->buf));

		if (k < 0)
			return k;
		used += (size_t)k;
	}
	return frame_send(r->sock, r->buf, used, -1);
}

int raw_recv(struct raw *r, Kvpalace__V1__Response **ret, int *ret_fd)
{
	Kvpalace__V1__Response *resp;
	const uint8_t *payload;
	size_t len;
	int fd = -1, n;

	if (r->rx_off >= r->rx_len) {
		n = frame_recv(r->sock, r->rbuf, sizeof(r->rbuf), &fd);
		if (n == -EWOULDBLOCK)
			return -EAGAIN;
		if (n < 0)
			return n == -ECONNRESET ? 0 : n;
		if (n == 0)
			return 0;
		r->rx_len = (size_t)n;
		r->rx_off = 0;
	}
	if (frame_next(r->rbuf, r->rx_len, &r->rx_off, sizeof(r->rbuf), &payload, &len) != 1)
		goto bad;
	if (!r->batched_ok && r->rx_off != r->rx_len) {
		fprintf(stderr, "raw: a reply datagram of several frames\n");
		goto bad;
	}
	frame_arena_reset(&r->arena);
	resp = frame_unpack_response(&r->arena, payload, len);
	if (!resp)
		goto bad;
	if (ret_fd)
		*ret_fd = fd;
	else if (fd >= 0)
		close(fd);
	*ret = resp;
	return 1;
bad:
	r->rx_off = r->rx_len;
	if (fd >= 0)
		close(fd);
	return -EBADMSG;
}

int raw_call(struct raw *r, Kvpalace__V1__Request *req, Kvpalace__V1__Response **ret, int *ret_fd)
{
	int n = raw_send(r, req);

	if (n < 0)
		return n;
	n = raw_recv(r, ret, ret_fd);
	if (n == 1 && (*ret)->id != req->id) {
		fprintf(stderr, "raw: reply id %llu to request %llu\n",
			(unsigned long long)(*ret)->id, (unsigned long long)req->id);
		return -EBADMSG;
	}
	return n;
}

static void req_init(Kvpalace__V1__Request *req, Kvpalace__V1__Request__OpCase op)
{
	static uint64_t next_id = 1;

	kvpalace__v1__request__init(req);
	req->id = next_id++;
	req->op_case = op;
}

void raw_req_hello(Kvpalace__V1__Request *req, Kvpalace__V1__HelloRequest *op, uint32_t version)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_HELLO);
	kvpalace__v1__hello_request__init(op);
	op->protocol_version = version;
	op->client_name = "kvpalace-tests";
	req->hello = op;
}

void raw_req_open_pool(Kvpalace__V1__Request *req, Kvpalace__V1__OpenPoolRequest *op,
		       Kvpalace__V1__Layout *lay, const char *model_id,
		       const struct kvp_layout *layout)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_OPEN_POOL);
	kvpalace__v1__open_pool_request__init(op);
	kvpalace__v1__layout__init(lay);
	lay->n_layers = layout->n_layers;
	lay->n_kv_heads = layout->n_kv_heads;
	lay->head_dim = layout->head_dim;
	lay->block_tokens = layout->block_tokens;
	lay->dtype = (Kvpalace__V1__DType)layout->dtype;
	lay->has_quant_group = layout->quant_group != 0;
	lay->quant_group = layout->quant_group;
	lay->has_format = layout->format != 0;
	lay->format = layout->format;
	op->model_id = (char *)model_id;
	op->layout = lay;
	req->open_pool = op;
}

void raw_req_create_session(Kvpalace__V1__Request *req, Kvpalace__V1__CreateSessionRequest *op,
			    uint64_t pool_id)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_CREATE_SESSION);
	kvpalace__v1__create_session_request__init(op);
	op->pool_id = pool_id;
	req->create_session = op;
}

void raw_req_append(Kvpalace__V1__Request *req, Kvpalace__V1__AppendRequest *op,
		    uint64_t session_id, uint32_t *tokens, size_t n)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_APPEND);
	kvpalace__v1__append_request__init(op);
	op->session_id = session_id;
	op->tokens = tokens;
	op->n_tokens = n;
	req->append = op;
}

void raw_req_commit(Kvpalace__V1__Request *req, Kvpalace__V1__CommitRequest *op,
		    uint64_t session_id, uint64_t n)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_COMMIT);
	kvpalace__v1__commit_request__init(op);
	op->session_id = session_id;
	op->n_tokens = n;
	req->commit = op;
}

void raw_req_match(Kvpalace__V1__Request *req, Kvpalace__V1__MatchPrefixRequest *op,
		   uint64_t pool_id, uint32_t *tokens, size_t n)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_MATCH_PREFIX);
	kvpalace__v1__match_prefix_request__init(op);
	op->pool_id = pool_id;
	op->tokens = tokens;
	op->n_tokens = n;
	req->match_prefix = op;
}

void raw_req_release(Kvpalace__V1__Request *req, Kvpalace__V1__ReleaseRequest *op,
		     uint64_t lease_id)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_RELEASE);
	kvpalace__v1__release_request__init(op);
	op->lease_id = lease_id;
	req->release = op;
}

void raw_req_close_session(Kvpalace__V1__Request *req, Kvpalace__V1__CloseSessionRequest *op,
			   uint64_t session_id)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_CLOSE_SESSION);
	kvpalace__v1__close_session_request__init(op);
	op->session_id = session_id;
	req->close_session = op;
}

void raw_req_stats(Kvpalace__V1__Request *req, Kvpalace__V1__StatsRequest *op)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_STATS);
	kvpalace__v1__stats_request__init(op);
	req->stats = op;
}

void raw_req_fork(Kvpalace__V1__Request *req, Kvpalace__V1__ForkRequest *op, uint64_t session_id,
		  uint64_t n)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_FORK);
	kvpalace__v1__fork_request__init(op);
	op->session_id = session_id;
	op->n_tokens = n;
	req->fork = op;
}

void raw_req_truncate(Kvpalace__V1__Request *req, Kvpalace__V1__TruncateRequest *op,
		      uint64_t session_id, uint64_t n)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_TRUNCATE);
	kvpalace__v1__truncate_request__init(op);
	op->session_id = session_id;
	op->n_tokens = n;
	req->truncate = op;
}

void raw_req_session_pages(Kvpalace__V1__Request *req, Kvpalace__V1__SessionPagesRequest *op,
			   uint64_t session_id, uint64_t first_page)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_SESSION_PAGES);
	kvpalace__v1__session_pages_request__init(op);
	op->session_id = session_id;
	op->first_page = first_page;
	req->session_pages = op;
}

void raw_req_list_sessions(Kvpalace__V1__Request *req, Kvpalace__V1__ListSessionsRequest *op,
			   uint64_t pool_id)
{
	req_init(req, KVPALACE__V1__REQUEST__OP_LIST_SESSIONS);
	kvpalace__v1__list_sessions_request__init(op);
	op->has_pool_id = pool_id != 0;
	op->pool_id = pool_id;
	req->list_sessions = op;
}

int raw_hello(struct raw *r)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__Response *resp;
	int n;

	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	n = raw_call(r, &req, &resp, NULL);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	return status_to_errno(resp->status);
}

int raw_close_session(struct raw *r, uint64_t session_id)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__CloseSessionRequest op;
	Kvpalace__V1__Response *resp;
	int n;

	raw_req_close_session(&req, &op, session_id);
	n = raw_call(r, &req, &resp, NULL);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	return status_to_errno(resp->status);
}

int raw_pool_info(struct raw *r, uint64_t pool_id, struct harness_pool_info *ret)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__StatsRequest op;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__StatsResponse *st;
	int n;

	raw_req_stats(&req, &op);
	n = raw_call(r, &req, &resp, NULL);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return status_to_errno(resp->status);
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_STATS)
		return -EBADMSG;
	st = resp->stats;
	for (size_t i = 0; i < st->n_pools; i++) {
		const Kvpalace__V1__PoolStats *ps = st->pools[i];

		if (ps->pool_id != pool_id)
			continue;
		memset(ret, 0, sizeof(*ret));
		ret->n_pages = ps->n_pages;
		ret->free_pages = ps->free_pages;
		ret->reserved_pages = ps->reserved_pages;
		ret->leased_pages = ps->leased_pages;
		ret->n_sessions = ps->n_sessions;
		ret->indexed_pages = ps->indexed_pages;
		ret->evictable_pages = ps->evictable_pages;
		ret->evictions = ps->evictions;
		ret->dedup_pages = ps->dedup_pages;
		ret->has_index_fields = ps->has_indexed_pages && ps->has_evictable_pages &&
					ps->has_evictions && ps->has_dedup_pages;
		ret->connections = st->connections;
		ret->all_evictions = st->evictions;
		ret->all_dedup_pages = st->dedup_pages;
		return 0;
	}
	return -ENOENT;
}

int harness_pool_info(const struct harness *h, uint64_t pool_id, struct harness_pool_info *ret)
{
	struct raw r;
	int err = raw_open(&r, h->sock);

	if (err < 0)
		return err;
	err = raw_hello(&r);
	if (err == 0)
		err = raw_pool_info(&r, pool_id, ret);
	raw_close(&r);
	return err;
}

int raw_wait_connections(struct raw *r, uint64_t want)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__StatsRequest op;
	Kvpalace__V1__Response *resp;
	uint64_t have = 0;

	for (int i = 0; i < 2000; i++) {
		raw_req_stats(&req, &op);
		if (raw_call(r, &req, &resp, NULL) != 1 ||
		    resp->op_case != KVPALACE__V1__RESPONSE__OP_STATS)
			return -EBADMSG;
		have = resp->stats->connections;
		if (have == want)
			return 0;
		sleep_ms(10);
	}
	fprintf(stderr, "harness: %llu connections open, waited for %llu\n",
		(unsigned long long)have, (unsigned long long)want);
	return -ETIMEDOUT;
}

int raw_open_pool(struct raw *r, const char *model_id, const struct kvp_layout *layout,
		  uint64_t *ret_pool_id)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__HelloRequest hello;
	Kvpalace__V1__OpenPoolRequest op;
	Kvpalace__V1__Layout lay;
	Kvpalace__V1__Response *resp;
	int fd = -1, n;

	raw_req_hello(&req, &hello, KVP_PROTOCOL_VERSION);
	n = raw_call(r, &req, &resp, NULL);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return status_to_errno(resp->status);
	raw_req_open_pool(&req, &op, &lay, model_id, layout);
	n = raw_call(r, &req, &resp, &fd);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	if (fd >= 0)
		close(fd);
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return status_to_errno(resp->status);
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_OPEN_POOL)
		return -EBADMSG;
	*ret_pool_id = resp->open_pool->pool_id;
	return 0;
}

int raw_create_session(struct raw *r, uint64_t pool_id, uint64_t *ret_session_id)
{
	Kvpalace__V1__Request req;
	Kvpalace__V1__CreateSessionRequest op;
	Kvpalace__V1__Response *resp;
	int n;

	raw_req_create_session(&req, &op, pool_id);
	n = raw_call(r, &req, &resp, NULL);
	if (n != 1)
		return n < 0 ? n : -ECONNRESET;
	if (resp->status != KVPALACE__V1__STATUS__STATUS_OK)
		return status_to_errno(resp->status);
	if (resp->op_case != KVPALACE__V1__RESPONSE__OP_CREATE_SESSION)
		return -EBADMSG;
	*ret_session_id = resp->create_session->session_id;
	return 0;
}

int harness_wait_scans(struct harness *h)
{
	/* A purge of a salt nobody uses forgets nothing, but waits for the
	 * warm-restart scan of every pool (a page not listed yet could not
	 * be forgotten): once it answers, every page is listed. Retried while
	 * the daemon is short of memory or busy (fault-injection tests). */
	static const char salt[] = "harness: no page has this salt";
	struct kvp_purge_spec spec = {
		.flags = KVP_PURGE_SALT, .salt = salt, .salt_len = sizeof(salt) - 1};
	kvp_client *admin;
	int r = -EAGAIN;

	for (int tries = 0; tries < 100 && r < 0; tries++) {
		if (tries)
			usleep(10 * 1000);
		r = kvp_connect(h->admin_sock, &admin);
		if (r < 0)
			continue;
		r = kvp_admin_purge(admin, &spec, NULL);
		kvp_disconnect(admin);
		if (r < 0 && r != -ENOMEM && r != -EBUSY && r != -EIO)
			return r;
	}
	return r < 0 ? r : 0;
}

int harness_pool_open(struct harness *h, kvp_client *c, const char *model_id,
		      const struct kvp_layout *layout, kvp_pool **ret)
{
	int r = kvp_pool_open(c, model_id, layout, ret);

	return r < 0 ? r : harness_wait_scans(h);
}
