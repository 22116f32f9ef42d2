/* shm/arena.c — sealed memfd arenas (see arena.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"

#define ARENA_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

static int create_sized(const char *name, uint64_t bytes, unsigned int flags)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
	int ret;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0)
		goto fail;
	if (fcntl(fd, F_ADD_SEALS, ARENA_SEALS | F_SEAL_SEAL) < 0)
		goto fail;
	return fd;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

int shm_arena_create(const char *name, uint64_t bytes, int *ret_fd, int *ret_huge)
{
	int fd = -ENOMEM;
	int huge = 0;

	if (!bytes || bytes % 4096)
		return -EINVAL;
	if (bytes % SHM_HUGEPAGE_BYTES == 0) {
		/* Hugetlb memfds fail with ENOMEM/EINVAL when none are reserved. */
		fd = create_sized(name, bytes, MFD_HUGETLB | MFD_HUGE_2MB);
		if (fd >= 0) {
			/* Hugepages are reserved at the first mmap, which fails
			 * with ENOMEM when too few are free: try it now. The
			 * reservation stays with the file. */
			void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

			if (p == MAP_FAILED) {
				close(fd);
				fd = -ENOMEM;
			} else {
				munmap(p, bytes);
			}
		}
		huge = fd >= 0;
	}
	if (fd < 0)
		fd = create_sized(name, bytes, 0);
	if (fd < 0)
		return fd;
	*ret_fd = fd;
	if (ret_huge)
		*ret_huge = huge;
	return 0;
}

int shm_arena_map(int fd, uint64_t bytes, void **ret_addr)
{
	struct stat st;
	int seals;
	void *p;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != bytes)
		return -EINVAL;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EBADF : -errno;
	if ((seals & ARENA_SEALS) != ARENA_SEALS)
		return -EINVAL;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	*ret_addr = p;
	return 0;
}

void shm_arena_unmap(void *addr, uint64_t bytes)
{
	if (addr)
		munmap(addr, bytes);
}
