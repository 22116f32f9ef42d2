/* shm/arena.c — sealed memfd arenas (see arena.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <string.h>
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

/* Maps fd shared at a 2 MiB boundary when it is that big: a huge page can
 * back a range only where virtual and file offsets are both aligned, and
 * mmap does not promise that for a memfd. Reserves the span plus 2 MiB of
 * address space, maps the file at the aligned address inside it and gives
 * the rest back. */
static void *map_aligned(int fd, uint64_t bytes)
{
	const uintptr_t a = SHM_HUGEPAGE_BYTES;
	unsigned char *r, *at;
	void *p;
	int e;

	if (bytes < a)
		return mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r = mmap(NULL, bytes + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r == MAP_FAILED)
		return mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	at = (unsigned char *)(((uintptr_t)r + a - 1) & ~(a - 1));
	p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED) {
		e = errno;
		munmap(r, bytes + a);
		errno = e;
		return MAP_FAILED;
	}
	if (at > r)
		munmap(r, (size_t)(at - r));
	if (at + bytes < r + bytes + a)
		munmap(at + bytes, (size_t)(r + bytes + a - (at + bytes)));
	/* Only a request: without THP for shmem it changes nothing, and a
	 * hugetlb mapping refuses it (it has huge pages already). */
	madvise(p, bytes, MADV_HUGEPAGE);
	return p;
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
	p = map_aligned(fd, bytes);
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

/* The bracketed word of a sysfs mode file ("always [advise] never"), or
 * "" when the file cannot be read. */
static void read_mode(const char *path, char *word, size_t n)
{
	char buf[256];
	char *b, *e;
	ssize_t got;
	int fd;

	word[0] = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	got = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (got <= 0)
		return;
	buf[got] = 0;
	b = strchr(buf, '[');
	e = b ? strchr(b, ']') : NULL;
	if (!b || !e || (size_t)(e - b - 1) >= n)
		return;
	memcpy(word, b + 1, (size_t)(e - b - 1));
	word[e - b - 1] = 0;
}

int shm_thp_mode(void)
{
	char w[32];

	/* Kernels with several THP sizes (6.8+) have a knob per size;
	 * "inherit" defers to the global one. */
	read_mode("/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled", w,
		  sizeof(w));
	if (!w[0] || !strcmp(w, "inherit"))
		read_mode("/sys/kernel/mm/transparent_hugepage/shmem_enabled", w, sizeof(w));
	if (!strcmp(w, "advise") || !strcmp(w, "within_size") || !strcmp(w, "always") ||
	    !strcmp(w, "force"))
		return SHM_THP_ADVISE;
	return SHM_THP_NONE;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

int shm_populate(void *addr, uint64_t bytes)
{
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)4095;
	uintptr_t end = ((uintptr_t)addr + bytes + 4095) & ~(uintptr_t)4095;
	int ret;

	if (!bytes)
		return 0;
	do
		ret = madvise((void *)start, end - start, MADV_POPULATE_READ);
	while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : 0;
}
