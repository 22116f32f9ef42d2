/* daemon/base/guard.c — SIGBUS on arena memory becomes -EFAULT (see guard.h).
 *
 * The handler runs on the faulting thread: when that thread is inside
 * guard_run it jumps back there, else it restores the default action and
 * returns, so the fault repeats and kills the process with its core. The
 * handler is installed with SA_NODEFER, so SIGBUS is not left blocked
 * after the jump and sigsetjmp need not save the signal mask (a system
 * call on every guarded copy).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "guard.h"

static __thread sigjmp_buf *volatile guard_jmp;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	sigjmp_buf *jb = guard_jmp;

	(void)si;
	(void)uctx;
	if (jb) {
		guard_jmp = NULL;
		siglongjmp(*jb, 1);
	}
	signal(sig, SIG_DFL);
}

int guard_init(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL) < 0 ? -errno : 0;
}

int guard_run(int (*fn)(void *arg), void *arg)
{
	sigjmp_buf jb;
	int ret;

	if (sigsetjmp(jb, 0)) {
		guard_jmp = NULL;
		return -EFAULT;
	}
	guard_jmp = &jb;
	ret = fn(arg);
	guard_jmp = NULL;
	return ret;
}

struct copy {
	void *dst;
	const void *src;
	size_t n;
};

static int do_copy(void *arg)
{
	struct copy *c = arg;

	memcpy(c->dst, c->src, c->n);
	return 0;
}

int guard_memcpy(void *dst, const void *src, size_t n)
{
	struct copy c = {dst, src, n};

	return guard_run(do_copy, &c);
}
