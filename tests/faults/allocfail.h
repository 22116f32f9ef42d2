/* tests/faults/allocfail.h — the control block shared between an
 * allocation-failure test and the preload module (allocfail.c) loaded into
 * the daemon it starts.
 *
 * The test creates a file of ALLOCFAIL_CTL_BYTES, maps it shared, names it
 * in $KVP_ALLOCFAIL_CTL and starts kvpalaced with LD_PRELOAD naming the
 * module, which maps the same file at load. While `armed` is set, the
 * module counts every malloc, calloc, realloc, posix_memalign,
 * aligned_alloc and memalign of every thread of the daemon and fails the
 * `target`-th one (1-based) with ENOMEM, once; the others go through. The
 * test arms it right before a request, disarms it after the reply, and
 * reads back whether the failure happened (`fired`), how many allocations
 * the request made (`count`) and who called the failed one (`caller`, an
 * object path and offset for addr2line). Fields are accessed with atomic
 * builtins from both processes.
 */
#ifndef KVP_TEST_ALLOCFAIL_H
#define KVP_TEST_ALLOCFAIL_H

#include <stdint.h>

#define ALLOCFAIL_ENV	    "KVP_ALLOCFAIL_CTL"
#define ALLOCFAIL_MAGIC	    0x6b766166u /* "kvaf" */
#define ALLOCFAIL_CTL_BYTES 4096u

struct allocfail_ctl {
	uint32_t magic;	 /* ALLOCFAIL_MAGIC, written by the test */
	uint32_t loaded; /* set by the module once it mapped the block */
	uint32_t armed;	 /* 1: count allocations, fail the target-th */
	uint32_t pad;
	uint64_t target;      /* 1-based */
	uint64_t count;	      /* allocations since arming */
	uint64_t fired;	      /* 1 once the target-th failed */
	uint64_t caller_off;  /* the failed allocation's return address, in its object */
	char what[16];	      /* "malloc", "calloc", ... of the failed one */
	char caller_obj[256]; /* the object holding the return address */
};
_Static_assert(sizeof(struct allocfail_ctl) <= ALLOCFAIL_CTL_BYTES, "fits its file");

#endif
