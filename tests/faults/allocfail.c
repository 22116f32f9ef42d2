/* tests/faults/allocfail.c — an LD_PRELOAD module that fails the Nth
 * allocation of the process it is loaded into, on the test's command
 * (allocfail.h has the protocol).
 *
 * It interposes malloc, calloc, realloc, posix_memalign, aligned_alloc,
 * memalign and free, forwarding to the next definition (glibc's, or the
 * sanitizer runtime's under ASan: run with verify_asan_link_order=0, since
 * this module is loaded ahead of it; the module itself is built without
 * sanitizers, as its code runs before theirs is set up). glibc's own
 * internal allocations (strdup, fdopendir, ...) come through here too.
 * Without $KVP_ALLOCFAIL_CTL, or while not armed, it only forwards.
 * Allocations before its constructor ran, and those of dlsym while it
 * looks the real functions up, come from a static buffer.
 *
 * Threading: any thread; the control block is read and written with
 * atomic builtins.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "allocfail.h"

#define EXPORT __attribute__((visibility("default")))

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

static struct allocfail_ctl *ctl;

/* Allocations made before the constructor ran (the dynamic loader's, a
 * sanitizer runtime's start-up) or while dlsym runs: single-threaded
 * times, served by a bump allocator that takes back its last block. */
static _Alignas(64) unsigned char boot[1 << 18];
static size_t boot_used, boot_last;
static int ready;     /* the constructor ran: dlsym may be called */
static int resolving; /* dlsym is running */

static int in_boot(const void *p)
{
	return (const unsigned char *)p >= boot && (const unsigned char *)p < boot + sizeof(boot);
}

static void *boot_alloc_aligned(size_t n, size_t align)
{
	size_t at = boot_used;

	if (align > 64) {
		uintptr_t base = (uintptr_t)boot;

		at = (size_t)((base + at + align - 1) / align * align - base);
	}
	if (at > sizeof(boot) || n > sizeof(boot) - at)
		return NULL;
	boot_last = at;
	boot_used = at + (n + 63) / 64 * 64;
	return memset(boot + at, 0, n);
}

static void *boot_alloc(size_t n)
{
	return boot_alloc_aligned(n, 64);
}

static void boot_free(const void *p)
{
	if ((const unsigned char *)p == boot + boot_last && boot_last < boot_used)
		boot_used = boot_last;
}

static void resolve(void)
{
	if (__atomic_load_n(&real_free, __ATOMIC_ACQUIRE) || !ready || resolving)
		return;
	resolving = 1;
	real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
	real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
	real_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
	__atomic_store_n(&real_free, (void (*)(void *))dlsym(RTLD_NEXT, "free"), __ATOMIC_RELEASE);
	resolving = 0;
}

__attribute__((constructor)) static void allocfail_load(void)
{
	const char *path = getenv(ALLOCFAIL_ENV);
	void *m;
	int fd;

	ready = 1;
	resolve();
	if (!path || !*path)
		return;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	m = mmap(NULL, ALLOCFAIL_CTL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return;
	if (((struct allocfail_ctl *)m)->magic != ALLOCFAIL_MAGIC) {
		munmap(m, ALLOCFAIL_CTL_BYTES);
		return;
	}
	ctl = m;
	__atomic_store_n(&ctl->loaded, 1, __ATOMIC_RELEASE);
}

/* Counts one allocation; 1 when it is the one to fail. */
static int should_fail(const char *what, void *caller)
{
	struct allocfail_ctl *c = ctl;
	uint64_t k;
	Dl_info info;

	if (!c || !__atomic_load_n(&c->armed, __ATOMIC_ACQUIRE))
		return 0;
	k = __atomic_add_fetch(&c->count, 1, __ATOMIC_ACQ_REL);
	if (k != __atomic_load_n(&c->target, __ATOMIC_ACQUIRE))
		return 0;
	/* dladdr takes the loader's lock but allocates nothing. */
	memset(c->caller_obj, 0, sizeof(c->caller_obj));
	c->caller_off = (uint64_t)(uintptr_t)caller;
	if (dladdr(caller, &info) && info.dli_fname) {
		size_t n = strlen(info.dli_fname);

		if (n >= sizeof(c->caller_obj))
			n = sizeof(c->caller_obj) - 1;
		memcpy(c->caller_obj, info.dli_fname, n);
		c->caller_off = (uint64_t)((uintptr_t)caller - (uintptr_t)info.dli_fbase);
	}
	memset(c->what, 0, sizeof(c->what));
	memcpy(c->what, what, strnlen(what, sizeof(c->what) - 1));
	__atomic_store_n(&c->fired, 1, __ATOMIC_RELEASE);
	return 1;
}

EXPORT void *malloc(size_t n)
{
	resolve();
	if (!real_malloc)
		return boot_alloc(n);
	if (should_fail("malloc", __builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real_malloc(n);
}

EXPORT void *calloc(size_t n, size_t size)
{
	resolve();
	if (!real_calloc) {
		if (size && n > SIZE_MAX / size)
			return NULL;
		return boot_alloc(n * size);
	}
	if (should_fail("calloc", __builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t n)
{
	resolve();
	if (in_boot(p)) {
		/* Its size is unknown: copy what the buffer can hold. */
		void *q = malloc(n);
		size_t have = (size_t)(boot + sizeof(boot) - (unsigned char *)p);

		if (q)
			memcpy(q, p, n < have ? n : have);
		return q;
	}
	if (!real_realloc)
		return p ? NULL : boot_alloc(n);
	if (n && should_fail("realloc", __builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real_realloc(p, n);
}

EXPORT void free(void *p)
{
	void (*f)(void *);

	if (!p)
		return;
	if (in_boot(p)) {
		boot_free(p);
		return;
	}
	resolve();
	f = __atomic_load_n(&real_free, __ATOMIC_ACQUIRE);
	if (f)
		f(p);
}

EXPORT int posix_memalign(void **ret, size_t align, size_t n)
{
	resolve();
	if (!real_posix_memalign) {
		*ret = boot_alloc_aligned(n, align);
		return *ret ? 0 : ENOMEM;
	}
	if (should_fail("posix_memalign", __builtin_return_address(0)))
		return ENOMEM;
	return real_posix_memalign(ret, align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	resolve();
	if (!real_aligned_alloc)
		return boot_alloc_aligned(n, align);
	if (should_fail("aligned_alloc", __builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real_aligned_alloc(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	resolve();
	if (!real_memalign)
		return boot_alloc_aligned(n, align);
	if (should_fail("memalign", __builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real_memalign(align, n);
}
