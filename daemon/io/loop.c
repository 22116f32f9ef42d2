/* daemon/io/loop.c — the io_uring event loop (see loop.h). */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "log.h"
#include "loop.h"

int loop_init(struct loop *l, unsigned int entries)
{
	struct io_uring_params p;
	int ret;

	memset(l, 0, sizeof(*l));
	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
	ret = io_uring_queue_init_params(entries, &l->ring, &p);
	if (ret == -EINVAL) {
		/* Kernels before 6.1 lack these flags. */
		memset(&p, 0, sizeof(p));
		ret = io_uring_queue_init_params(entries, &l->ring, &p);
	}
	return ret;
}

void loop_fini(struct loop *l)
{
	io_uring_queue_exit(&l->ring);
}

struct io_uring_sqe *loop_sqe(struct loop *l)
{
	struct io_uring_sqe *sqe;

	while (!(sqe = io_uring_get_sqe(&l->ring)))
		io_uring_submit(&l->ring);
	return sqe;
}

void loop_stop(struct loop *l)
{
	l->stop = 1;
}

int loop_run(struct loop *l)
{
	return loop_run_while(l, NULL, NULL);
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

int loop_run_while(struct loop *l, int (*busy)(void *arg), void *arg)
{
	if (busy)
		l->stop = 0;
	while (busy ? busy(arg) : !l->stop) {
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
	}
	return 0;
}
