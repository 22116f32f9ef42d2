/* daemon/io/loop_uring.c — the event loop's io_uring backend (see loop.h):
 * each operation is one SQE whose user_data is the op; the loop submits
 * what is queued and waits in one io_uring_enter per turn. */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "log.h"
#include "loop_backend.h"

static int uring_init(struct loop *l, unsigned int entries)
{
	struct io_uring_params p;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	int ret;

	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
	ret = io_uring_queue_init_params(entries, &l->ring, &p);
	if (ret == -EINVAL) {
		/* Kernels before 6.1 lack these flags. */
		memset(&p, 0, sizeof(p));
		ret = io_uring_queue_init_params(entries, &l->ring, &p);
	}
	if (ret < 0)
		return ret;
	/* A filter may allow the setup and deny io_uring_enter: one NOP
	 * through the ring finds out now, while another backend can still
	 * be chosen, rather than at the loop's first turn. */
	sqe = io_uring_get_sqe(&l->ring);
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data(sqe, NULL);
	ret = io_uring_submit_and_wait(&l->ring, 1);
	if (ret >= 0 && io_uring_peek_cqe(&l->ring, &cqe) == 0) {
		io_uring_cqe_seen(&l->ring, cqe);
		return 0;
	}
	io_uring_queue_exit(&l->ring);
	return ret < 0 ? ret : -EIO;
}

static void uring_fini(struct loop *l)
{
	io_uring_queue_exit(&l->ring);
}

struct io_uring *loop_ring(struct loop *l)
{
	return l->be == &loop_uring_backend ? &l->ring : NULL;
}

struct io_uring_sqe *loop_sqe(struct loop *l)
{
	struct io_uring_sqe *sqe;

	kvp_assert(l->be == &loop_uring_backend);
	while (!(sqe = io_uring_get_sqe(&l->ring)))
		io_uring_submit(&l->ring);
	return sqe;
}

static void uring_submit(struct loop *l, struct loop_op *op)
{
	struct io_uring_sqe *sqe = loop_sqe(l);

	switch (op->kind) {
	case LOOP_OP_ACCEPT:
		io_uring_prep_accept(sqe, op->fd, NULL, NULL, op->flags);
		break;
	case LOOP_OP_READ:
		io_uring_prep_read(sqe, op->fd, op->u.rw.buf, (unsigned int)op->u.rw.len, 0);
		break;
	case LOOP_OP_RECVMSG:
		io_uring_prep_recvmsg(sqe, op->fd, op->u.msg, (unsigned int)op->flags);
		break;
	case LOOP_OP_SENDMSG:
		io_uring_prep_sendmsg(sqe, op->fd, op->u.msg, (unsigned int)op->flags);
		break;
	case LOOP_OP_TIMEOUT:
		io_uring_prep_timeout(sqe, &op->u.ts, 0, 0);
		break;
	}
	loop_sqe_set_op(sqe, op);
}

static void uring_flush(struct loop *l)
{
	io_uring_submit(&l->ring);
}

static void uring_forget_fd(struct loop *l, int fd)
{
	/* The kernel holds the file of every submitted operation. */
	(void)l;
	(void)fd;
}

/* Waits for at least one completion, submitting what is queued. */
static int submit_and_wait(struct loop *l)
{
#ifdef RUNNING_ON_VALGRIND
	/* valgrind (3.19) runs one thread at a time and keeps the CPU with
	 * a thread blocked in io_uring_enter: worker threads would starve
	 * while the loop waits for them. Under valgrind only, wait in slices
	 * of 2 ms and yield between them. */
	if (RUNNING_ON_VALGRIND) {
		struct __kernel_timespec ts = {.tv_nsec = 2000000};
		struct io_uring_cqe *cqe;
		int ret = io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);

		sched_yield();
		return ret == -ETIME ? 0 : ret;
	}
#endif
	return io_uring_submit_and_wait(&l->ring, 1);
}

static int uring_turn(struct loop *l)
{
	struct io_uring_cqe *cqe;
	unsigned int head, n = 0;
	int ret;

	ret = submit_and_wait(l);
	if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
		log_err("io_uring submit failed: %s", strerror(-ret));
		return ret;
	}
	io_uring_for_each_cqe (&l->ring, head, cqe) {
		struct loop_op *op = io_uring_cqe_get_data(cqe);

		n++;
		if (op)
			op->cb(op, cqe->res, cqe->flags);
	}
	io_uring_cq_advance(&l->ring, n);
	return 0;
}

const struct loop_backend loop_uring_backend = {
	.kind = LOOP_IO_URING,
	.name = "io_uring",
	.init = uring_init,
	.fini = uring_fini,
	.submit = uring_submit,
	.flush = uring_flush,
	.forget_fd = uring_forget_fd,
	.turn = uring_turn,
};
