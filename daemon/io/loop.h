/* daemon/io/loop.h — the event loop: one thread, one io_uring, or epoll
 * where io_uring is denied.
 *
 * Every asynchronous operation (accept, receive, send, timers, eventfd and
 * signalfd reads) is a struct loop_op embedded in the object that owns it,
 * started by one of the loop_accept/read/recvmsg/sendmsg/timeout calls
 * below; its callback runs on the loop thread with the operation's result
 * when it completes, never from inside the call that started it.
 *
 * Two backends behind one table of operations (loop_backend, in loop.c):
 *  - io_uring (loop_uring.c): each operation is one SQE, its op the SQE's
 *    user_data, res the CQE's. Containers whose seccomp profile denies
 *    io_uring (Docker 25, containerd 2) and kernels with
 *    kernel.io_uring_disabled refuse it.
 *  - epoll (loop_epoll.c): each operation waits for readiness of its fd
 *    (EPOLLONESHOT, re-armed while operations are pending), then makes
 *    the same system call without blocking and reports the same result;
 *    timeouts are a deadline list that bounds epoll_wait.
 * Nothing in the loop blocks. Single-threaded: only the loop thread
 * touches it.
 */
#ifndef KVPD_LOOP_H
#define KVPD_LOOP_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum loop_kind {
	LOOP_IO_URING,
	LOOP_EPOLL,
};

/* Which backend loop_init tries (config's event-loop). */
enum loop_want {
	LOOP_WANT_AUTO,	    /* io_uring, else epoll when io_uring is denied */
	LOOP_WANT_IO_URING, /* io_uring or fail */
	LOOP_WANT_EPOLL,
};

struct loop_op {
	/* res: what the system call (or the CQE) returned — bytes, the
	 * accepted fd, or -errno; -ETIME for a timeout that expired. flags:
	 * the CQE's flags on io_uring, 0 on epoll. */
	void (*cb)(struct loop_op *op, int res, unsigned int flags);

	/* Private to the loop's backends: the operation in flight. */
	struct loop_op *next;
	int kind;
	int fd;
	int flags;
	int res;
	union {
		struct {
			void *buf;
			size_t len;
		} rw;
		struct msghdr *msg;
		struct __kernel_timespec ts; /* io_uring's timeout */
		uint64_t deadline_ns;	     /* epoll's timeout (CLOCK_MONOTONIC) */
	} u;
};

struct loop_backend;
struct loop_epoll;

struct loop {
	const struct loop_backend *be; /* NULL: not set up, or finished */
	int stop;
	struct io_uring ring;  /* io_uring backend */
	struct loop_epoll *ep; /* epoll backend (loop_epoll.c) */
	/* auto only: why io_uring was not used (-errno), else 0. */
	int uring_err;
};

/* Sets up the loop on the backend want asks for: io_uring with single
 * issuer and deferred task running where the kernel has them; for
 * LOOP_WANT_AUTO epoll when io_uring_setup, or a first NOP through the
 * ring (io_uring_enter), fails with -EPERM or -ENOSYS (l->uring_err says
 * why). Logs nothing. Returns 0 or a negative errno
 * (-ENOSYS/-EPERM for LOOP_WANT_IO_URING where io_uring is denied). */
int loop_init(struct loop *l, unsigned int entries, enum loop_want want);
/* Frees the backend; operations still pending never complete (the kernel
 * may still hold io_uring's until the ring closes here). Safe twice and
 * after a failed init. */
void loop_fini(struct loop *l);

/* The backend of a loop set up by loop_init, and its name ("io_uring" or
 * "epoll"; static storage). */
enum loop_kind loop_kind(const struct loop *l);
const char *loop_kind_name(const struct loop *l);

/* The operations. Each completes through op->cb exactly once, later, on
 * the loop thread; op and what it points at stay valid and untouched
 * until then. At most one operation per op at a time.
 *  - accept: accept4(fd, NULL, NULL, flags): res is the new fd.
 *  - read: read(fd, buf, len) (eventfds, signalfds: fd is set
 *    O_NONBLOCK on epoll).
 *  - recvmsg/sendmsg: on a socket; flags as for the system call
 *    (MSG_CMSG_CLOEXEC, MSG_NOSIGNAL); a shutdown() of the socket
 *    completes pending ones (0, -EPIPE) on both backends.
 *  - timeout: res -ETIME after ns nanoseconds. */
void loop_accept(struct loop *l, struct loop_op *op, int fd, int flags);
void loop_read(struct loop *l, struct loop_op *op, int fd, void *buf, size_t len);
void loop_recvmsg(struct loop *l, struct loop_op *op, int fd, struct msghdr *msg, int flags);
void loop_sendmsg(struct loop *l, struct loop_op *op, int fd, const struct msghdr *msg, int flags);
void loop_timeout(struct loop *l, struct loop_op *op, uint64_t ns);

/* fd is about to be closed with an operation still pending on it (a
 * shutdown path): epoll forgets those operations, which then never
 * complete, so the number can be reused; io_uring's hold the file. */
void loop_forget_fd(struct loop *l, int fd);
/* Hands what is queued to the kernel now (io_uring; a no-op on epoll). */
void loop_submit(struct loop *l);

/* io_uring only (aio's io_uring backend, which owns the ring's fixed
 * files and buffers): the ring, NULL on epoll. */
struct io_uring *loop_ring(struct loop *l);
/* io_uring only: a free SQE, submitting queued ones first when the ring
 * is full. Never NULL: the ring is drained until one is free. */
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

/* Runs until loop_stop. Returns 0, or a negative errno when the backend
 * failed. */
int loop_run(struct loop *l);
/* Runs while busy(arg) is true (loop_stop does not end it): to finish
 * what is in flight after loop_run returned. */
int loop_run_while(struct loop *l, int (*busy)(void *arg), void *arg);
void loop_stop(struct loop *l);

#endif
