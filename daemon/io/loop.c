/* daemon/io/loop.c — the event loop's front (see loop.h): picks the
 * backend, fills the operations in and turns the loop; the backends
 * (loop_uring.c, loop_epoll.c) do the rest. */
#include <errno.h>
#include <string.h>

#include "log.h"
#include "loop_backend.h"

int loop_init(struct loop *l, unsigned int entries, enum loop_want want)
{
	int ret;

	memset(l, 0, sizeof(*l));
	l->ring.ring_fd = -1;
	if (want != LOOP_WANT_EPOLL) {
		ret = loop_uring_backend.init(l, entries);
		if (ret == 0) {
			l->be = &loop_uring_backend;
			return 0;
		}
		/* Denied (seccomp, kernel.io_uring_disabled) or absent: epoll
		 * serves. Anything else (-ENOMEM, -EMFILE) would fail epoll
		 * as well, and says more about the machine. */
		if (want == LOOP_WANT_IO_URING || (ret != -EPERM && ret != -ENOSYS))
			return ret;
		l->uring_err = ret;
		l->ring.ring_fd = -1;
	}
	ret = loop_epoll_backend.init(l, entries);
	if (ret < 0)
		return ret;
	l->be = &loop_epoll_backend;
	return 0;
}

void loop_fini(struct loop *l)
{
	if (!l->be)
		return;
	l->be->fini(l);
	l->be = NULL;
}

enum loop_kind loop_kind(const struct loop *l)
{
	return l->be->kind;
}

const char *loop_kind_name(const struct loop *l)
{
	return l->be->name;
}

static void submit(struct loop *l, struct loop_op *op, int kind, int fd, int flags)
{
	kvp_assert(l->be);
	op->kind = kind;
	op->fd = fd;
	op->flags = flags;
	op->next = NULL;
	l->be->submit(l, op);
}

void loop_accept(struct loop *l, struct loop_op *op, int fd, int flags)
{
	submit(l, op, LOOP_OP_ACCEPT, fd, flags);
}

void loop_read(struct loop *l, struct loop_op *op, int fd, void *buf, size_t len)
{
	op->u.rw.buf = buf;
	op->u.rw.len = len;
	submit(l, op, LOOP_OP_READ, fd, 0);
}

void loop_recvmsg(struct loop *l, struct loop_op *op, int fd, struct msghdr *msg, int flags)
{
	op->u.msg = msg;
	submit(l, op, LOOP_OP_RECVMSG, fd, flags);
}

void loop_sendmsg(struct loop *l, struct loop_op *op, int fd, const struct msghdr *msg, int flags)
{
	/* Never written through: sendmsg only reads it. */
	op->u.msg = (struct msghdr *)msg;
	submit(l, op, LOOP_OP_SENDMSG, fd, flags);
}

void loop_timeout(struct loop *l, struct loop_op *op, uint64_t ns)
{
	if (loop_kind(l) == LOOP_IO_URING) {
		op->u.ts.tv_sec = (long long)(ns / 1000000000ull);
		op->u.ts.tv_nsec = (long long)(ns % 1000000000ull);
	} else {
		op->u.deadline_ns = ns;
	}
	submit(l, op, LOOP_OP_TIMEOUT, -1, 0);
}

void loop_forget_fd(struct loop *l, int fd)
{
	if (l->be)
		l->be->forget_fd(l, fd);
}

void loop_submit(struct loop *l)
{
	if (l->be)
		l->be->flush(l);
}

void loop_stop(struct loop *l)
{
	l->stop = 1;
}

int loop_run(struct loop *l)
{
	return loop_run_while(l, NULL, NULL);
}

int loop_run_while(struct loop *l, int (*busy)(void *arg), void *arg)
{
	if (busy)
		l->stop = 0;
	while (busy ? busy(arg) : !l->stop) {
		int ret = l->be->turn(l);

		if (ret < 0)
			return ret;
	}
	return 0;
}
