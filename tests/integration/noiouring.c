/* tests/integration/noiouring.c — runs a command the way Docker >= 25 and
 * containerd 2 run a container with their default seccomp profile, as far
 * as io_uring goes: io_uring_setup, io_uring_enter and io_uring_register
 * fail with EPERM; every other system call is allowed.
 *
 *     noiouring [--enter-only] COMMAND [ARG...]
 *
 * --enter-only denies io_uring_enter alone (rings can be set up but never
 * used), as a narrower profile might.
 * For the tests (test_seccomp.c, the *-epoll runs of the integration
 * suite, via $KVPALACED_WRAPPER). The filter is inherited across execve
 * and cannot be lifted; libseccomp sets no_new_privs, so no privilege is
 * needed.
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	static const int denied[] = {
		SCMP_SYS(io_uring_enter), /* first: --enter-only */
		SCMP_SYS(io_uring_setup),
		SCMP_SYS(io_uring_register),
	};
	size_t n = sizeof(denied) / sizeof(denied[0]);
	scmp_filter_ctx ctx;
	int ret, arg = 1;

	if (argc > 1 && !strcmp(argv[1], "--enter-only")) {
		n = 1;
		arg++;
	}
	if (argc <= arg) {
		fprintf(stderr, "usage: %s [--enter-only] COMMAND [ARG...]\n", argv[0]);
		return 2;
	}
	ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx) {
		fprintf(stderr, "noiouring: seccomp_init failed\n");
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		ret = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), denied[i], 0);
		if (ret < 0) {
			fprintf(stderr, "noiouring: seccomp_rule_add: %s\n", strerror(-ret));
			seccomp_release(ctx);
			return 1;
		}
	}
	ret = seccomp_load(ctx);
	seccomp_release(ctx);
	if (ret < 0) {
		fprintf(stderr, "noiouring: seccomp_load: %s\n", strerror(-ret));
		return 1;
	}
	execvp(argv[arg], argv + arg);
	fprintf(stderr, "noiouring: exec %s: %s\n", argv[arg], strerror(errno));
	return 127;
}
