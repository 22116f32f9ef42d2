/* tests/integration/test_nocudart.c — a daemon built with CUDA on a host
 * whose CUDA runtime cannot be loaded.
 *
 * kvpalaced loads the runtime when it probes the GPU instead of linking it
 * (kernels/cudart.h), so a CUDA build starts where no runtime is
 * installed; before, it died at exec (exit 127, libcudart.so.13 missing).
 * The host without a runtime is played by the dynamic loader itself: the
 * daemon runs as `ld.so --inhibit-cache --library-path /nonexistent
 * kvpalaced`, which finds only what the system directories hold (the
 * libraries a CUDA install adds to ld.so.conf are out of reach). Then
 * $KVPALACED_CUDART, which names the library to load: a path that does
 * not exist, and libc.so.6, a library that is no runtime. Each case checks
 * what a user sees: the daemon starts, logs once why the GPU tier is off,
 * Stats says the same, and a pool serves on the host tier between two
 * processes; the daemon stops cleanly. The last case loads the default
 * library, libcudart.so.<the build's major>: where this test process can
 * load it too, the daemon's probe must get past it to the device count
 * (the no-device status of a runtime without a GPU: CUDA_VISIBLE_DEVICES=""
 * hides any GPU, so the test means the same on a GPU machine).
 *
 * Skips (77) in a build without CUDA, where there is no runtime to load
 * ($KVP_CUDART_SONAME, from meson, is then unset).
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define MODEL	 "nocudart-model"
#define N_TOKENS 200 /* 12 whole pages of 16 and a partial one */
#define SEQ	 21
#define MISSING	 "/nonexistent/kvp-nocudart/libcudart.so.13"
#define NO_GPU	 "no GPU: host and disk tiers only ("

static uint32_t tokens[N_TOKENS];

struct fixture {
	struct harness h;
	char log[64]; /* the daemon's stderr */
};

/* The daemon's log, into the test's own (meson keeps it), then away. */
static void dump_log(const struct fixture *f)
{
	char line[512];
	FILE *in = fopen(f->log, "r");

	while (in && fgets(line, sizeof(line), in))
		fputs(line, stderr);
	if (in)
		fclose(in);
	unlink(f->log);
}

/* The program interpreter (PT_INTERP) of this test, the daemon's too:
 * the first object dl_iterate_phdr reports is the executable. */
static int find_interp(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_INTERP) {
			snprintf(arg, 256, "%s",
				 (const char *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr));
			return 1;
		}
	return 1;
}

/* Starts a daemon with $KVPALACED_CUDART set to lib (unset: NULL), run by
 * the dynamic loader without its cache when bare, and its stderr in a
 * fresh file. */
static int start_with(void **state, const char *lib, int bare)
{
	struct fixture *f = calloc(1, sizeof(*f));
	const char *old = getenv("KVPALACED_WRAPPER");
	char interp[256] = "", wrapper[768], *saved_wrapper = old ? strdup(old) : NULL;
	int fd, saved, ret;

	if (bare)
		dl_iterate_phdr(find_interp, interp);
	if (bare && !*interp)
		fprintf(stderr, "no PT_INTERP in this test program\n");
	if (!f || (bare && !*interp)) {
		free(f);
		free(saved_wrapper);
		return -1;
	}
	snprintf(f->log, sizeof(f->log), "/tmp/kvp-nocudart-XXXXXX");
	fd = mkstemp(f->log);
	if (fd < 0) {
		free(f);
		free(saved_wrapper);
		return -1;
	}
	if (lib)
		setenv("KVPALACED_CUDART", lib, 1);
	else
		unsetenv("KVPALACED_CUDART");
	if (bare) {
		/* After valgrind's words, when meson's valgrind setup set
		 * them: valgrind then runs the loader, which runs the daemon. */
		snprintf(wrapper, sizeof(wrapper),
			 "%s%s%s --inhibit-cache --library-path /nonexistent", old ? old : "",
			 old ? " " : "", interp);
		setenv("KVPALACED_WRAPPER", wrapper, 1);
	}
	saved = dup(STDERR_FILENO);
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	ret = harness_start(&f->h, NULL);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(fd);
	unsetenv("KVPALACED_CUDART");
	if (saved_wrapper)
		setenv("KVPALACED_WRAPPER", saved_wrapper, 1);
	else
		unsetenv("KVPALACED_WRAPPER");
	free(saved_wrapper);
	if (ret < 0) {
		dump_log(f);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int start_not_installed(void **state)
{
	return start_with(state, NULL, 1);
}

static int start_missing(void **state)
{
	return start_with(state, MISSING, 0);
}

static int start_not_a_runtime(void **state)
{
	return start_with(state, "libc.so.6", 0);
}

static int start_default(void **state)
{
	return start_with(state, NULL, 0);
}

static int stop(void **state)
{
	struct fixture *f = *state;
	int ret = harness_stop(&f->h);

	dump_log(f);
	free(f);
	return ret;
}

/* The one line of the daemon's log that holds needle, copied into line;
 * fails the test when there is none or more than one. */
static void log_line(const struct fixture *f, const char *needle, char *line, size_t n)
{
	FILE *in = fopen(f->log, "r");
	char buf[1024];
	int found = 0;

	assert_non_null(in);
	while (fgets(buf, sizeof(buf), in)) {
		if (!strstr(buf, needle))
			continue;
		found++;
		snprintf(line, n, "%s", buf);
	}
	fclose(in);
	if (found != 1)
		fail_msg("%d lines of the daemon's log say \"%s\", want 1", found, needle);
}

/* Stats' GPU status, into status. */
static void gpu_status(const struct fixture *f, char *status, size_t n)
{
	struct kvp_stats *st;
	kvp_client *c;

	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(st->gpu, 0);
	snprintf(status, n, "%s", st->gpu_status);
	kvp_stats_free(st);
	kvp_disconnect(c);
}

/* A writer in another process commits the prefix on the host tier. */
static int writer(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_has_gpu(p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, tokens, N_TOKENS, &s), 0);
	kvp_disconnect(c);
	return 0;
}

/* The pool serves: another process's commit is matched here, every byte
 * right, from the host tier (also when the GPU tier was asked for with
 * the fallback), and the GPU tier alone is refused. */
static void serves_host_tier(const struct fixture *f)
{
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;

	harness_tokens(tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, (void *)&f->h), 0);

	assert_int_equal(kvp_connect(f->h.sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_has_gpu(p), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, N_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), harness_whole(N_TOKENS, 16));
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(
		kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, KVP_TIER_OR_HOST, &l), 0);
	assert_int_equal(kvp_lease_tier(l), KVP_TIER_HOST);
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	l = NULL;
	assert_int_equal(kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, 0, &l),
			 -EOPNOTSUPP);
	assert_null(l);
	assert_non_null(strstr(kvp_strerror(c, -EOPNOTSUPP), "no CUDA runtime"));
	kvp_disconnect(c);
}

/* No runtime where the loader looks, the default name: the daemon starts
 * (it used to exit with 127 before main) and says why, whole in Stats. */
static void test_runtime_not_installed(void **state)
{
	struct fixture *f = *state;
	const char *soname = getenv("KVP_CUDART_SONAME");
	char status[256], line[1024], want[192];

	snprintf(want, sizeof(want),
		 NO_GPU "no CUDA runtime: %s: cannot open shared object file: No such file or "
			"directory)",
		 soname);
	gpu_status(f, status, sizeof(status));
	assert_string_equal(status, want);
	log_line(f, "no CUDA runtime", line, sizeof(line));
	assert_non_null(strstr(line, want));
	serves_host_tier(f);
}

/* No runtime where $KVPALACED_CUDART says: the loader's reason, once. */
static void test_missing_runtime(void **state)
{
	struct fixture *f = *state;
	char status[256], line[1024];

	gpu_status(f, status, sizeof(status));
	/* Stats' status is cut at 127 bytes: the reason's start. */
	assert_non_null(strstr(status, NO_GPU "no CUDA runtime: " MISSING
					      ": cannot open shared object file"));
	log_line(f, "no CUDA runtime", line, sizeof(line));
	assert_non_null(strstr(line, NO_GPU "no CUDA runtime: " MISSING
					    ": cannot open shared object file: No such file or "
					    "directory)"));
	serves_host_tier(f);
}

/* A library that loads but is no runtime: which function it lacks. */
static void test_not_a_runtime(void **state)
{
	struct fixture *f = *state;
	char status[256], line[1024];

	gpu_status(f, status, sizeof(status));
	assert_non_null(
		strstr(status, NO_GPU "no CUDA runtime: libc.so.6 lacks cudaRuntimeGetVersion)"));
	log_line(f, "no CUDA runtime", line, sizeof(line));
	assert_non_null(strstr(line, "libc.so.6 lacks cudaRuntimeGetVersion"));
	serves_host_tier(f);
}

/* The default library: loaded where it is installed (then the probe goes
 * on to the device, which CUDA_VISIBLE_DEVICES hides), else the same
 * refusal as above under its soname. */
static void test_default_runtime(void **state)
{
	struct fixture *f = *state;
	const char *soname = getenv("KVP_CUDART_SONAME");
	void *here = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	char status[256], line[1024], want[160];

	gpu_status(f, status, sizeof(status));
	log_line(f, NO_GPU, line, sizeof(line));
	if (here) {
		print_message("%s loads here: the probe must reach the device count\n", soname);
		assert_null(strstr(status, "no CUDA runtime"));
		assert_non_null(strstr(status, NO_GPU "cudaGetDeviceCount: "));
		assert_non_null(strstr(line, "cudaGetDeviceCount: "));
	} else {
		print_message("%s does not load here: the daemon must say so\n", soname);
		snprintf(want, sizeof(want), NO_GPU "no CUDA runtime: %s: cannot open", soname);
		assert_non_null(strstr(status, want));
		assert_non_null(strstr(line, want));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_runtime_not_installed, start_not_installed,
						stop),
		cmocka_unit_test_setup_teardown(test_missing_runtime, start_missing, stop),
		cmocka_unit_test_setup_teardown(test_not_a_runtime, start_not_a_runtime, stop),
		cmocka_unit_test_setup_teardown(test_default_runtime, start_default, stop),
	};

	if (!getenv("KVP_CUDART_SONAME")) {
		printf("a build without CUDA: no runtime to load, skipping\n");
		return 77;
	}
	/* Whatever the machine has, this daemon sees no GPU. */
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	return cmocka_run_group_tests_name("nocudart", tests, NULL, NULL);
}
