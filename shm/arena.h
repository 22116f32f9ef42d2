/* shm/arena.h — the host-tier arena: one sealed memfd per pool.
 *
 * The daemon creates the arena and hands its fd to clients over SCM_RIGHTS;
 * both sides map it MAP_SHARED. The memfd is sealed against shrinking and
 * growing (F_SEAL_SHRINK|F_SEAL_GROW, then F_SEAL_SEAL) so no client can
 * truncate it under the daemon, which would turn its next access into
 * SIGBUS. Hugepages are used when the system has them reserved
 * (hugetlb); otherwise every mapping is placed on a 2 MiB boundary and
 * advised MADV_HUGEPAGE, so that where the kernel backs shared memory with
 * transparent huge pages (shmem_enabled `advise`, `within_size` or
 * `always`) a page is one fault and one TLB entry instead of 512. Mappings
 * are never made resident wholesale: shm_populate() prefaults exactly the
 * ranges a caller is about to touch. No allocation, no logging;
 * thread-safe.
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
 * shrinking and growing, then maps it shared read-write, 2 MiB aligned when
 * it is at least that big, advised MADV_HUGEPAGE (ignored where the kernel
 * has no transparent huge pages). Returns 0 and the mapping in *ret_addr,
 * -EBADF/-EINVAL when the fd is not such an arena, or another negative
 * errno. */
int shm_arena_map(int fd, uint64_t bytes, void **ret_addr);

/* Unmaps an arena mapped by shm_arena_map; NULL is accepted. */
void shm_arena_unmap(void *addr, uint64_t bytes);

/* What shared-memory huge pages the kernel gives a mapping advised
 * MADV_HUGEPAGE, from /sys/kernel/mm/transparent_hugepage (the 2 MiB size's
 * own shmem_enabled, else the global one): SHM_THP_ADVISE when `advise`,
 * `within_size`, `always` or `force`, SHM_THP_NONE when `never`, `deny`,
 * or the files are missing (no THP in this kernel). */
enum { SHM_THP_NONE = 0, SHM_THP_ADVISE = 1 };
int shm_thp_mode(void);

/* Prefaults the page tables of [addr, addr + bytes) of a mapping made by
 * shm_arena_map without touching the bytes (MADV_POPULATE_READ, Linux
 * 5.14): pages the memfd holds are mapped with the kernel's fault-around,
 * 16 per step, and writable (a shared memfd mapping needs no write
 * notification); holes get a page, as a first touch would. Measured on
 * 4 KiB pages: a writer's pages cost a third of what write faults cost
 * (which map one page each), and MADV_POPULATE_WRITE costs about twice
 * this; a reader's cost about what read faults cost (they fault around
 * too). What is read afterwards is what was there. addr is rounded down
 * and the end up to 4 KiB. Returns 0, -EINVAL where the kernel does not
 * know the advice (the caller should stop asking), or another negative
 * errno (nothing is wrong with the mapping: touching the bytes faults
 * them in as before). */
int shm_populate(void *addr, uint64_t bytes);

#endif
