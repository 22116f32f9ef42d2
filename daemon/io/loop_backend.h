/* daemon/io/loop_backend.h — the table of operations behind loop.h, one
 * per backend (loop_uring.c, loop_epoll.c), private to daemon/io/.
 *
 * loop.c fills a struct loop_op's private fields (kind, fd, flags, u) and
 * hands it to submit(); the backend completes it later, from turn(), by
 * calling op->cb. A backend calls nothing of loop.c.
 */
#ifndef KVPD_LOOP_BACKEND_H
#define KVPD_LOOP_BACKEND_H

#include "loop.h"

enum loop_op_kind {
	LOOP_OP_ACCEPT,
	LOOP_OP_READ,
	LOOP_OP_RECVMSG,
	LOOP_OP_SENDMSG,
	LOOP_OP_TIMEOUT,
};

struct loop_backend {
	enum loop_kind kind;
	const char *name;
	/* 0 or -errno; on failure nothing is left to fini. */
	int (*init)(struct loop *l, unsigned int entries);
	void (*fini)(struct loop *l);
	void (*submit)(struct loop *l, struct loop_op *op);
	void (*flush)(struct loop *l);
	void (*forget_fd)(struct loop *l, int fd);
	/* Waits for at least one completion (or a timer) and runs the
	 * callbacks of those that came. 0 or -errno when the backend broke. */
	int (*turn)(struct loop *l);
};

extern const struct loop_backend loop_uring_backend;
extern const struct loop_backend loop_epoll_backend;

#endif
