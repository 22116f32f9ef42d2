/* daemon/io/loop.h — the event loop: one thread, one io_uring.
 *
 * Every asynchronous operation (accept, receive, send, timers, signal
 * reads) is a struct loop_op embedded in the object that owns it; the
 * op's address is the SQE's user_data and its callback runs with the
 * CQE's result when the operation completes. Nothing in the loop blocks.
 * Single-threaded: only the loop thread touches the ring.
 */
#ifndef KVPD_LOOP_H
#define KVPD_LOOP_H

#include <liburing.h>

struct loop_op {
	void (*cb)(struct loop_op *op, int res, unsigned int flags);
};

struct loop {
	struct io_uring ring;
	int stop;
};

/* Sets up the ring (single issuer, deferred task running where the kernel
 * has them). Returns 0 or a negative errno (-ENOSYS/-EPERM when io_uring is
 * disabled). */
int loop_init(struct loop *l, unsigned int entries);
void loop_fini(struct loop *l);

/* A free SQE, submitting queued ones first when the ring is full. Never
 * NULL: the ring is drained until one is free. */
struct io_uring_sqe *loop_sqe(struct loop *l);
static inline void loop_sqe_set_op(struct io_uring_sqe *sqe, struct loop_op *op)
{
	io_uring_sqe_set_data(sqe, op);
}

/* The kernel wrote n bytes at buf for an operation of the ring (a read, a
 * recvmsg), which valgrind's memcheck cannot see: tells it, so their use
 * is not reported as uninitialised (nor everything computed from them).
 * A few instructions when not under valgrind; nothing without its header. */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define loop_kernel_wrote(buf, n) ((void)VALGRIND_MAKE_MEM_DEFINED((buf), (n)))
#endif
#endif
#ifndef loop_kernel_wrote
#define loop_kernel_wrote(buf, n) ((void)(buf), (void)(n))
#endif

/* Runs until loop_stop. Returns 0, or a negative errno when the ring
 * failed. */
int loop_run(struct loop *l);
/* Runs while busy(arg) is true (loop_stop does not end it): to finish
 * what is in flight after loop_run returned. */
int loop_run_while(struct loop *l, int (*busy)(void *arg), void *arg);
void loop_stop(struct loop *l);

#endif
