/* daemon/base/guard.h — touching client-shared memory without dying of it.
 *
 * A pool's arena is shared with its clients, who may take memory out from
 * under the daemon: a hole punched into a hugetlb arena
 * (fallocate(FALLOC_FL_PUNCH_HOLE) is allowed by the seals) whose huge
 * page the client then takes for itself makes the daemon's next touch of
 * that range fault with SIGBUS. Every read or write of arena memory by the
 * daemon goes through this guard, which turns such a fault into -EFAULT
 * for that one request: the page is treated as gone (a miss, a failed
 * copy), and everyone else is served on.
 *
 * guard_init installs a SIGBUS handler once per process; guard_run works
 * on any thread (the state is thread-local) and may not nest. A SIGBUS
 * outside a guard is a bug and kills the daemon as before.
 */
#ifndef KVPD_GUARD_H
#define KVPD_GUARD_H

#include <stddef.h>

/* Installs the handler. Returns 0 or a negative errno. */
int guard_init(void);

/* Runs fn(arg) and returns its result, or -EFAULT when it touched memory
 * that is gone (SIGBUS). fn must leave nothing half done that matters
 * when it is cut short: it runs no locks, no allocation, only reads and
 * writes of memory it was handed (kernels, memcpy, checksums). */
int guard_run(int (*fn)(void *arg), void *arg);

/* memcpy of n bytes under the guard: 0, or -EFAULT. */
int guard_memcpy(void *dst, const void *src, size_t n);

#endif
