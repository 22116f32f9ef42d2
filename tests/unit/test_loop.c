/* tests/unit/test_loop.c — the event loop's contract (daemon/io/loop.h), the
 * same on both backends: every case runs on io_uring and on epoll.
 *  - an operation that could complete at once still completes from the
 *    loop, never inside the call that started it;
 *  - recvmsg with MSG_CMSG_CLOEXEC receives an SCM_RIGHTS fd, close-on-exec;
 *  - shutdown() completes a pending recvmsg (0) and sendmsg (-EPIPE): the
 *    connection code frees connections on those completions;
 *  - accept gives the new fd, reads of a (blocking) eventfd give 8 bytes;
 *  - timeouts expire in deadline order with -ETIME;
 *  - loop_forget_fd: an fd closed with a read pending, its number reused,
 *    serves the new file's operation and never calls the forgotten one;
 *  - operations that can complete together complete in submission order.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "list.h"
#include "loop.h"

struct rec {
	struct loop_op op;
	int res;
	int calls;
	int order; /* completion rank, from 1 */
};

static int n_completed;
static int in_submit; /* set around submitting calls */

static void on_done(struct loop_op *op, int res, unsigned int flags)
{
	struct rec *r = container_of(op, struct rec, op);

	(void)flags;
	assert_false(in_submit);
	r->res = res;
	r->calls++;
	r->order = ++n_completed;
}

static void rec_init(struct rec *r)
{
	memset(r, 0, sizeof(*r));
	r->op.cb = on_done;
}

struct until {
	int n;
};

static int not_yet(void *arg)
{
	return n_completed < ((struct until *)arg)->n;
}

/* Turns the loop until n operations completed in all. */
static void run_until(struct loop *l, int n)
{
	struct until u = {n};

	assert_int_equal(loop_run_while(l, not_yet, &u), 0);
}

static int setup(void **state)
{
	enum loop_want want = *(enum loop_want *)*state;
	struct loop *l = calloc(1, sizeof(*l));
	int ret;

	assert_non_null(l);
	ret = loop_init(l, 64, want);
	n_completed = 0;
	*state = l;
	if (ret < 0) {
		fprintf(stderr, "loop_init: %s\n", strerror(-ret));
		/* No io_uring here: those cases skip, epoll's still run. */
		memset(l, 0, sizeof(*l));
		return want == LOOP_WANT_IO_URING ? 0 : -1;
	}
	assert_int_equal(loop_kind(l), want == LOOP_WANT_EPOLL ? LOOP_EPOLL : LOOP_IO_URING);
	return 0;
}

static int teardown(void **state)
{
	struct loop *l = *state;

	loop_fini(l);
	loop_fini(l); /* twice is safe */
	free(l);
	return 0;
}

/* The loop, or a skip where setup found no io_uring. */
static struct loop *loop_of(void **state)
{
	struct loop *l = *state;

	if (l->be == NULL)
		skip();
	return l;
}

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_not_reentrant(void **state)
{
	struct loop *l = loop_of(state);
	char out[] = "hello", in[16] = {0};
	struct iovec iov = {in, sizeof(in)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	struct rec r;
	int sv[2];

	pair(sv);
	assert_int_equal(write(sv[0], out, sizeof(out)), sizeof(out));
	rec_init(&r);
	in_submit = 1;
	loop_recvmsg(l, &r.op, sv[1], &msg, MSG_CMSG_CLOEXEC);
	in_submit = 0;
	assert_int_equal(r.calls, 0);
	run_until(l, 1);
	assert_int_equal(r.calls, 1);
	assert_int_equal(r.res, sizeof(out));
	loop_kernel_wrote(in, sizeof(in));
	assert_string_equal(in, out);
	close(sv[0]);
	close(sv[1]);
}

static void test_fd_passing(void **state)
{
	struct loop *l = loop_of(state);
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} scb, rcb;
	char byte = 'x', got = 0;
	struct iovec siov = {&byte, 1}, riov = {&got, 1};
	struct msghdr smsg = {.msg_iov = &siov, .msg_iovlen = 1};
	struct msghdr rmsg = {.msg_iov = &riov, .msg_iovlen = 1};
	struct stat a, b;
	struct cmsghdr *cm;
	struct rec s, r;
	int sv[2], efd, fd;

	pair(sv);
	efd = eventfd(0, EFD_CLOEXEC);
	assert_true(efd >= 0);
	memset(&scb, 0, sizeof(scb));
	smsg.msg_control = scb.b;
	smsg.msg_controllen = sizeof(scb.b);
	cm = CMSG_FIRSTHDR(&smsg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &efd, sizeof(int));
	rmsg.msg_control = rcb.b;
	rmsg.msg_controllen = sizeof(rcb.b);
	rec_init(&s);
	rec_init(&r);
	loop_recvmsg(l, &r.op, sv[1], &rmsg, MSG_CMSG_CLOEXEC);
	loop_sendmsg(l, &s.op, sv[0], &smsg, MSG_NOSIGNAL);
	run_until(l, 2);
	assert_int_equal(s.res, 1);
	assert_int_equal(r.res, 1);
	/* As conn.c does: what io_uring wrote, valgrind did not see. */
	loop_kernel_wrote(&got, 1);
	loop_kernel_wrote(rcb.b, sizeof(rcb.b));
	loop_kernel_wrote(&rmsg, sizeof(rmsg));
	assert_int_equal(got, 'x');
	cm = CMSG_FIRSTHDR(&rmsg);
	assert_non_null(cm);
	assert_int_equal(cm->cmsg_type, SCM_RIGHTS);
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(fstat(efd, &b), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	close(fd);
	close(efd);
	close(sv[0]);
	close(sv[1]);
}

static void test_shutdown_wakes(void **state)
{
	struct loop *l = loop_of(state);
	static char big[4096];
	char in[16];
	struct iovec riov = {in, sizeof(in)}, siov = {big, sizeof(big)};
	struct msghdr rmsg = {.msg_iov = &riov, .msg_iovlen = 1};
	struct msghdr smsg = {.msg_iov = &siov, .msg_iovlen = 1};
	struct rec r, s;
	int sv[2], small = 4096;

	pair(sv);
	/* sv[0]'s sends block: its buffer is full and nobody reads. */
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	while (send(sv[0], big, sizeof(big), MSG_DONTWAIT) > 0)
		;
	rec_init(&r);
	rec_init(&s);
	loop_recvmsg(l, &r.op, sv[0], &rmsg, 0);
	loop_sendmsg(l, &s.op, sv[0], &smsg, MSG_NOSIGNAL);
	/* Both are pending; a timeout lets the loop turn meanwhile. */
	{
		struct rec t;

		rec_init(&t);
		loop_timeout(l, &t.op, 20000000);
		run_until(l, 1);
		assert_int_equal(t.res, -ETIME);
	}
	assert_int_equal(r.calls + s.calls, 0);
	shutdown(sv[0], SHUT_RDWR);
	run_until(l, 3);
	assert_int_equal(r.res, 0);
	assert_int_equal(s.res, -EPIPE);
	close(sv[0]);
	close(sv[1]);
}

static void test_accept(void **state)
{
	struct loop *l = loop_of(state);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct rec r;
	int ls, c;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/kvp-test-loop-%d.sock", (int)getpid());
	unlink(sa.sun_path);
	ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(ls, 4), 0);
	rec_init(&r);
	loop_accept(l, &r.op, ls, SOCK_CLOEXEC);
	c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
	run_until(l, 1);
	assert_true(r.res >= 0);
	assert_true(fcntl(r.res, F_GETFD) & FD_CLOEXEC);
	close(r.res);
	close(c);
	close(ls);
	unlink(sa.sun_path);
}

static void test_eventfd_and_forget(void **state)
{
	struct loop *l = loop_of(state);
	uint64_t v1 = 0, v2 = 0;
	struct rec r1, r2;
	int e1, e2;

	e1 = eventfd(0, EFD_CLOEXEC);
	assert_true(e1 >= 0);
	rec_init(&r1);
	loop_read(l, &r1.op, e1, &v1, sizeof(v1));
	/* Nothing yet; a timeout proves the read waits. */
	{
		struct rec t;

		rec_init(&t);
		loop_timeout(l, &t.op, 10000000);
		run_until(l, 1);
	}
	assert_int_equal(r1.calls, 0);
	/* Closed with the read pending, as worker_fini does: forgotten. */
	loop_submit(l);
	loop_forget_fd(l, e1);
	close(e1);
	e2 = eventfd(0, EFD_CLOEXEC);
	assert_int_equal(e2, e1); /* the number is reused */
	rec_init(&r2);
	loop_read(l, &r2.op, e2, &v2, sizeof(v2));
	assert_int_equal(eventfd_write(e2, 5), 0);
	run_until(l, 2);
	assert_int_equal(r2.res, 8);
	loop_kernel_wrote(&v2, sizeof(v2));
	assert_int_equal(v2, 5);
	if (loop_kind(l) == LOOP_EPOLL)
		assert_int_equal(r1.calls, 0);
	close(e2);
}

static void test_timeouts(void **state)
{
	struct loop *l = loop_of(state);
	struct timespec t0, t1;
	struct rec t[3];
	const uint64_t ms[3] = {30, 10, 20};

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 3; i++) {
		rec_init(&t[i]);
		loop_timeout(l, &t[i].op, ms[i] * 1000000);
	}
	run_until(l, 3);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(t[1].order, 1);
	assert_int_equal(t[2].order, 2);
	assert_int_equal(t[0].order, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(t[i].res, -ETIME);
	assert_true((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= 29);
}

/* Three receives on three ready sockets complete in the order submitted. */
static void test_submission_order(void **state)
{
	struct loop *l = loop_of(state);
	int sv[3][2];
	char buf[3][4];
	struct iovec iov[3];
	struct msghdr msg[3];
	struct rec r[3];

	for (int i = 0; i < 3; i++) {
		pair(sv[i]);
		assert_int_equal(write(sv[i][0], "abc", 4), 4);
	}
	for (int i = 2; i >= 0; i--) {
		iov[i] = (struct iovec){buf[i], sizeof(buf[i])};
		memset(&msg[i], 0, sizeof(msg[i]));
		msg[i].msg_iov = &iov[i];
		msg[i].msg_iovlen = 1;
		rec_init(&r[i]);
		loop_recvmsg(l, &r[i].op, sv[i][1], &msg[i], 0);
	}
	run_until(l, 3);
	assert_int_equal(r[2].order, 1);
	assert_int_equal(r[1].order, 2);
	assert_int_equal(r[0].order, 3);
	for (int i = 0; i < 3; i++) {
		close(sv[i][0]);
		close(sv[i][1]);
	}
}

static enum loop_want uring = LOOP_WANT_IO_URING, epoll = LOOP_WANT_EPOLL;

#define BOTH(t)                                                                                    \
	cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, &uring),                      \
		cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, &epoll)

int main(void)
{
	const struct CMUnitTest tests[] = {
		BOTH(test_not_reentrant),      BOTH(test_fd_passing),
		BOTH(test_shutdown_wakes),     BOTH(test_accept),
		BOTH(test_eventfd_and_forget), BOTH(test_timeouts),
		BOTH(test_submission_order),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
