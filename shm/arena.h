/* shm/arena.h — the host-tier arena: one sealed memfd per pool.
 *
 * The daemon creates the arena and hands its fd to clients over SCM_RIGHTS;
 * both sides map it MAP_SHARED. The memfd is sealed against shrinking and
 * growing (F_SEAL_SHRINK|F_SEAL_GROW, then F_SEAL_SEAL) so no client can
 * truncate it under the daemon, which would turn its next access into
 * SIGBUS. Hugepages are used when the system has them reserved. No
 * allocation, no logging; thread-safe.
 */
#ifndef KVP_SHM_ARENA_H
#define KVP_SHM_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define SHM_HUGEPAGE_BYTES (2u << 20)

/* Creates a sealed memfd of `bytes` (a multiple of 4096) named `name`.
 * Tries MFD_HUGETLB first when bytes is a multiple of 2 MiB and falls back
 * to normal pages. On success stores the fd (O_CLOEXEC) in *ret_fd and
 * whether hugepages were used in *ret_huge (may be NULL). Returns 0 or a
 * negative errno. */
int shm_arena_create(const char *name, uint64_t bytes, int *ret_fd, int *ret_huge);

/* Checks that fd is a memfd of exactly `bytes` that is sealed against
 * shrinking and growing, then maps it shared read-write. Returns 0 and the
 * mapping in *ret_addr, -EBADF/-EINVAL when the fd is not such an arena, or
 * another negative errno. */
int shm_arena_map(int fd, uint64_t bytes, void **ret_addr);

/* Unmaps an arena mapped by shm_arena_map; NULL is accepted. */
void shm_arena_unmap(void *addr, uint64_t bytes);

#endif
