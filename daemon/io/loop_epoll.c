/* daemon/io/loop_epoll.c — the event loop's epoll backend (see loop.h), for
 * where io_uring is denied (a container's default seccomp profile,
 * kernel.io_uring_disabled).
 *
 * Each fd with operations pending has a slot in a table indexed by fd: a
 * FIFO of operations that wait for input (accept, read, recvmsg) and one
 * of those that wait for output (sendmsg). Submitting only appends the op
 * and marks the fd dirty; before waiting, every dirty fd is (re)armed with
 * EPOLL_CTL_MOD — or ADD when the kernel does not know it, which is also
 * what happens when a number was closed and reused — and EPOLLONESHOT, so
 * an fd that fired is disarmed until something is pending on it again.
 * When an fd is ready the head operations make their system call without
 * blocking (MSG_DONTWAIT; reads and accepts on O_NONBLOCK fds); -EAGAIN
 * leaves them pending, anything else completes them. Completed operations
 * and expired timeouts go to a queue whose callbacks run after the
 * events were looked at, so no callback runs inside the call that
 * submitted its op, as on io_uring.
 *
 * Timeouts are a list ordered by deadline (the server has two); the first
 * bounds epoll_wait.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "loop_backend.h"

#define EP_EVENTS 64

struct ep_fd {
	struct loop_op *in;  /* accept, read, recvmsg */
	struct loop_op *out; /* sendmsg */
	uint32_t armed;	     /* the events the kernel has enabled for it */
	int next_dirty;	     /* -1 ends the list */
	unsigned int dirty : 1;
	unsigned int known : 1; /* added to the epoll set (maybe closed since) */
};

struct loop_epoll {
	int epfd;
	struct ep_fd *fds;
	unsigned int n_fds;
	int dirty, dirty_tail; /* the dirty fds in the order they became so; -1: none */
	struct loop_op *timers;
	struct loop_op *done_head, **done_tail;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ep_init(struct loop *l, unsigned int entries)
{
	struct loop_epoll *ep = calloc(1, sizeof(*ep));

	(void)entries;
	if (!ep)
		return -ENOMEM;
	ep->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ep->epfd < 0) {
		int ret = -errno;

		free(ep);
		return ret;
	}
	ep->dirty = ep->dirty_tail = -1;
	ep->done_tail = &ep->done_head;
	l->ep = ep;
	return 0;
}

static void ep_fini(struct loop *l)
{
	struct loop_epoll *ep = l->ep;

	if (!ep)
		return;
	close(ep->epfd);
	free(ep->fds);
	free(ep);
	l->ep = NULL;
}

static void complete(struct loop_epoll *ep, struct loop_op *op, int res)
{
	op->res = res;
	op->next = NULL;
	*ep->done_tail = op;
	ep->done_tail = &op->next;
}

/* The slot of fd, growing the table; NULL when out of memory. */
static struct ep_fd *slot(struct loop_epoll *ep, int fd)
{
	if ((unsigned int)fd >= ep->n_fds) {
		unsigned int n = ep->n_fds ? ep->n_fds : 64;
		struct ep_fd *t;

		while (n <= (unsigned int)fd)
			n *= 2;
		t = realloc(ep->fds, n * sizeof(*t));
		if (!t)
			return NULL;
		memset(t + ep->n_fds, 0, (n - ep->n_fds) * sizeof(*t));
		for (unsigned int i = ep->n_fds; i < n; i++)
			t[i].next_dirty = -1;
		ep->fds = t;
		ep->n_fds = n;
	}
	return &ep->fds[fd];
}

/* In submission order: fds armed when they are ready already join
 * epoll's ready list in the order they are armed, so operations that can
 * complete at once complete in the order they were submitted, as on
 * io_uring (a client's hang-up is seen before the connection it makes
 * next is accepted). */
static void mark_dirty(struct loop_epoll *ep, int fd)
{
	struct ep_fd *f = &ep->fds[fd];

	if (f->dirty)
		return;
	f->dirty = 1;
	f->next_dirty = -1;
	if (ep->dirty_tail >= 0)
		ep->fds[ep->dirty_tail].next_dirty = fd;
	else
		ep->dirty = fd;
	ep->dirty_tail = fd;
}

static void append(struct loop_op **head, struct loop_op *op)
{
	while (*head)
		head = &(*head)->next;
	op->next = NULL;
	*head = op;
}

/* Reads and accepts must not block where readiness lied (a connection
 * reset before accept, a signal another reader took). */
static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -errno;
	if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static void ep_submit(struct loop *l, struct loop_op *op)
{
	struct loop_epoll *ep = l->ep;
	struct ep_fd *f;
	int ret;

	if (op->kind == LOOP_OP_TIMEOUT) {
		struct loop_op **at = &ep->timers;

		op->u.deadline_ns += now_ns();
		while (*at && (*at)->u.deadline_ns <= op->u.deadline_ns)
			at = &(*at)->next;
		op->next = *at;
		*at = op;
		return;
	}
	if (op->fd < 0) {
		complete(ep, op, -EBADF);
		return;
	}
	if (op->kind == LOOP_OP_ACCEPT || op->kind == LOOP_OP_READ) {
		ret = set_nonblock(op->fd);
		if (ret < 0) {
			complete(ep, op, ret);
			return;
		}
	}
	f = slot(ep, op->fd);
	if (!f) {
		complete(ep, op, -ENOMEM);
		return;
	}
	append(op->kind == LOOP_OP_SENDMSG ? &f->out : &f->in, op);
	mark_dirty(ep, op->fd);
}

static void ep_flush(struct loop *l)
{
	(void)l;
}

/* Every op of list completes with res. */
static void fail_all(struct loop_epoll *ep, struct loop_op **list, int res)
{
	while (*list) {
		struct loop_op *op = *list;

		*list = op->next;
		complete(ep, op, res);
	}
}

/* Arms fd for what its pending operations wait for. */
static void arm(struct loop_epoll *ep, int fd)
{
	struct ep_fd *f = &ep->fds[fd];
	struct epoll_event ev = {0};
	uint32_t want = (f->in ? EPOLLIN : 0) | (f->out ? EPOLLOUT : 0);
	int ret;

	if (!want || want == f->armed)
		return;
	ev.events = want | EPOLLONESHOT;
	ev.data.fd = fd;
	ret = f->known ? epoll_ctl(ep->epfd, EPOLL_CTL_MOD, fd, &ev) : -1;
	if (ret < 0 && (!f->known || errno == ENOENT))
		ret = epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &ev);
	if (ret < 0 && errno == EEXIST)
		ret = epoll_ctl(ep->epfd, EPOLL_CTL_MOD, fd, &ev);
	if (ret < 0) {
		/* A closed fd (-EBADF), one epoll cannot wait on (-EPERM): the
		 * system call answers what it would have. */
		ret = -errno;
		f->known = 0;
		f->armed = 0;
		fail_all(ep, &f->in, ret);
		fail_all(ep, &f->out, ret);
		return;
	}
	f->known = 1;
	f->armed = want;
}

static void ep_forget_fd(struct loop *l, int fd)
{
	struct loop_epoll *ep = l->ep;
	struct ep_fd *f;

	if (!ep || fd < 0 || (unsigned int)fd >= ep->n_fds)
		return;
	f = &ep->fds[fd];
	f->in = f->out = NULL;
	if (f->known)
		epoll_ctl(ep->epfd, EPOLL_CTL_DEL, fd, NULL);
	f->known = 0;
	f->armed = 0;
}

/* One attempt at op's system call: its result, -EAGAIN when it would block. */
static int attempt(struct loop_op *op)
{
	ssize_t n;

	switch (op->kind) {
	case LOOP_OP_ACCEPT:
		n = accept4(op->fd, NULL, NULL, op->flags);
		break;
	case LOOP_OP_READ:
		n = read(op->fd, op->u.rw.buf, op->u.rw.len);
		break;
	case LOOP_OP_RECVMSG:
		n = recvmsg(op->fd, op->u.msg, op->flags | MSG_DONTWAIT);
		break;
	case LOOP_OP_SENDMSG:
		n = sendmsg(op->fd, op->u.msg, op->flags | MSG_DONTWAIT);
		break;
	default:
		return -EINVAL;
	}
	if (n < 0)
		return errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -errno;
	return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* Runs the head operations of list until one would block. */
static void run_list(struct loop_epoll *ep, struct loop_op **list)
{
	while (*list) {
		struct loop_op *op = *list;
		int res = attempt(op);

		if (res == -EAGAIN)
			return;
		*list = op->next;
		complete(ep, op, res);
	}
}

static void expire_timers(struct loop_epoll *ep)
{
	uint64_t now = now_ns();

	while (ep->timers && ep->timers->u.deadline_ns <= now) {
		struct loop_op *op = ep->timers;

		ep->timers = op->next;
		complete(ep, op, -ETIME);
	}
}

/* epoll_wait's timeout: 0 with completions queued, until the first
 * deadline (rounded up to a millisecond), else forever. */
static int wait_ms(struct loop_epoll *ep)
{
	uint64_t now, d;

	if (ep->done_head)
		return 0;
	if (!ep->timers)
		return -1;
	now = now_ns();
	if (ep->timers->u.deadline_ns <= now)
		return 0;
	d = (ep->timers->u.deadline_ns - now + 999999) / 1000000;
	return d > 3600000 ? 3600000 : (int)d;
}

static int ep_turn(struct loop *l)
{
	struct loop_epoll *ep = l->ep;
	struct epoll_event evs[EP_EVENTS];
	int n;

	while (ep->dirty >= 0) {
		int fd = ep->dirty;

		ep->dirty = ep->fds[fd].next_dirty;
		if (ep->dirty < 0)
			ep->dirty_tail = -1;
		ep->fds[fd].next_dirty = -1;
		ep->fds[fd].dirty = 0;
		arm(ep, fd);
	}
	n = epoll_wait(ep->epfd, evs, EP_EVENTS, wait_ms(ep));
	if (n < 0) {
		if (errno != EINTR) {
			int ret = -errno;

			log_err("epoll_wait failed: %s", strerror(-ret));
			return ret;
		}
		n = 0;
	}
	for (int i = 0; i < n; i++) {
		int fd = evs[i].data.fd;
		uint32_t e = evs[i].events;
		struct ep_fd *f;

		if (fd < 0 || (unsigned int)fd >= ep->n_fds)
			continue;
		f = &ep->fds[fd];
		f->armed = 0; /* one shot */
		if (e & (EPOLLIN | EPOLLERR | EPOLLHUP))
			run_list(ep, &f->in);
		if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP))
			run_list(ep, &f->out);
		if (f->in || f->out)
			mark_dirty(ep, fd);
	}
	expire_timers(ep);
	/* Callbacks may submit (and, failing at submit, complete) more: those
	 * run in this turn too, after the ones before them. */
	while (ep->done_head) {
		struct loop_op *op = ep->done_head;

		ep->done_head = op->next;
		if (!ep->done_head)
			ep->done_tail = &ep->done_head;
		op->cb(op, op->res, 0);
	}
	return 0;
}

const struct loop_backend loop_epoll_backend = {
	.kind = LOOP_EPOLL,
	.name = "epoll",
	.init = ep_init,
	.fini = ep_fini,
	.submit = ep_submit,
	.flush = ep_flush,
	.forget_fd = ep_forget_fd,
	.turn = ep_turn,
};
