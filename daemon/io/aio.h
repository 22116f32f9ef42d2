/* daemon/io/aio.h — asynchronous file I/O for the disk tier, on io_uring or
 * on worker threads.
 *
 * A struct aio_req reads, writes or fdatasyncs a range of a file; its
 * done() runs on the loop thread once every byte has moved or the request
 * failed. Short transfers are continued from where they stopped, -EAGAIN
 * and -EINTR are retried, and every other error is handed to done() once,
 * never retried (a failed fsync is not to be trusted a second time).
 *
 * Two backends behave the same:
 *  - io_uring: each step is one SQE on the loop's ring. aio_submit only
 *    queues it; the loop submits everything queued in one io_uring_enter
 *    per turn. Files can be registered as fixed files and buffers (the
 *    host arenas) as fixed buffers, which saves the kernel a file lookup
 *    and a page pinning per request. No SQPOLL.
 *  - threads: each step is a worker job doing a pread/pwrite/fdatasync
 *    loop, for where io_uring cannot do file I/O.
 * O_DIRECT files need 4096-aligned buffers, offsets and lengths; aio does
 * not check that, the kernel answers -EINVAL on both backends.
 *
 * aio owns the ring's fixed-file and fixed-buffer tables: nothing else may
 * register files or buffers on the loop's ring.
 *
 * Threading: every function here, the inject hook and every done() run
 * on the loop thread.
 */
#ifndef KVPD_AIO_H
#define KVPD_AIO_H

#include <stddef.h>
#include <stdint.h>

#include "loop.h"
#include "worker.h"

#define AIO_MAX_FILES	    256u	 /* handles; as many fixed-file slots */
#define AIO_MAX_BUF_SLOTS   1024u	 /* fixed-buffer slots (chunks) */
#define AIO_MAX_CHUNK_BYTES (1ull << 30) /* the kernel's limit per fixed buffer */
#define AIO_MAX_REQ_BYTES   (1u << 30)	 /* len of one request, so it fits done's int */

enum aio_mode {
	AIO_AUTO,   /* io_uring when the ring has every opcode aio needs, else threads */
	AIO_URING,  /* io_uring or fail */
	AIO_THREAD, /* pread/pwrite/fdatasync on worker threads */
};

enum aio_op {
	AIO_READ,
	AIO_WRITE,
	AIO_FSYNC, /* fdatasync: enough for data and the file size */
};

struct aio;

struct aio_req {
	enum aio_op op;
	int file;     /* handle from aio_file_add */
	void *buf;    /* [len] bytes; O_DIRECT: 4096-aligned */
	size_t len;   /* 0..AIO_MAX_REQ_BYTES; O_DIRECT: a multiple of 4096 */
	uint64_t off; /* O_DIRECT: a multiple of 4096 */
	/* AIO_READ into memory that may not be resident yet (an arena page
	 * never touched, or given back): on io_uring, fault buf's pages in
	 * first, off the loop (a MADV_POPULATE_WRITE linked before the
	 * read, in the kernel's workers), instead of inside the submission
	 * on the loop thread. Ignored where the ring lacks IORING_OP_MADVISE
	 * and on threads (whose pread faults on the worker). */
	int populate;
	/* Loop thread, exactly once per aio_submit, never from inside
	 * aio_submit. res: len when every byte moved, 0 for AIO_FSYNC (and
	 * for len 0), -ENODATA when a read reaches end of file before len
	 * bytes (the bytes before it are in buf), -EIO when a write moves
	 * nothing, -EBADF for an unknown handle, -EINVAL for a bad op, NULL
	 * buf or len over AIO_MAX_REQ_BYTES, else the -errno of the kernel
	 * (-EIO, -ENOSPC, ...). The request belongs to the caller again when
	 * done() runs: it may be freed or submitted again from done(). */
	void (*done)(struct aio_req *r, int res);

	/* Private to aio.c. */
	struct aio *aio;
	struct loop_op lop;    /* io_uring: the step in flight */
	struct loop_op pop;    /* io_uring: the populate linked before it */
	struct worker_job job; /* threads: the step in flight */
	size_t moved;	       /* bytes transferred so far */
	size_t step;	       /* bytes the step in flight may move */
	int result;	       /* set at submit: complete with it, no I/O */
	int injected;	       /* the step in flight fails with this, no I/O */
	size_t step_got;       /* threads: bytes the step moved */
	int step_res;	       /* threads: 1, or what stopped the step (0, -errno) */
	unsigned int n_short;  /* threads: shorts continued inside the step */
	int fd;		       /* the fd, or the fixed-file slot */
	int buf_slot;	       /* io_uring: fixed buffer, or -1 */
	unsigned int fixed_file : 1;
	unsigned int has_result : 1;
};

struct aio_counters {
	uint64_t submitted;	  /* aio_submit calls */
	uint64_t completed;	  /* done() calls */
	uint64_t fixed_buf;	  /* requests that used a fixed buffer */
	uint64_t fixed_file;	  /* requests that used a fixed file */
	uint64_t short_continued; /* transfers continued after a short one */
	uint64_t retried;	  /* steps retried after -EAGAIN/-EINTR */
	uint64_t errors;	  /* done() calls with res < 0 */
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t buf_unregistered; /* aio_buffer_add calls left on plain I/O */
	uint64_t populated;	   /* reads that faulted their buffer in first */
};

struct aio_file {
	int fd;	   /* -1: free handle */
	int fixed; /* the handle is also this fixed-file slot */
};

struct aio_region {
	char *base;
	size_t len;
	size_t chunk_bytes; /* every chunk but the last is this long */
	unsigned int slot;  /* fixed-buffer slot of the first chunk */
	unsigned int n_chunks;
};

struct aio {
	struct loop *loop; /* NULL: not set up, or finished */
	struct worker *worker;
	int abandoned;	    /* aio_fini ran; read by worker threads (atomic) */
	enum aio_mode mode; /* AIO_URING or AIO_THREAD once set up */
	struct aio_counters ctr;

	/* Fault injection (tests): called before every step of a request
	 * (done_so_far bytes already moved; *max_bytes the bytes remaining,
	 * 0 for fsync). Returning a -errno completes the step with that
	 * result as if the kernel had returned it, without doing I/O
	 * (-EAGAIN/-EINTR are retried, calling the hook again; anything else
	 * reaches done()). Lowering *max_bytes makes the step move at most
	 * that many bytes (0 reads as end of file; O_DIRECT files need a
	 * multiple of 4096), so the rest is continued by another step. */
	int (*inject)(void *ctx, const struct aio_req *r, size_t done_so_far, size_t *max_bytes);
	void *inject_ctx;

	/* Fixed buffers are registered in chunks of at most this many bytes;
	 * AIO_MAX_CHUNK_BYTES unless a test lowers it before aio_buffer_add. */
	size_t max_chunk_bytes;

	struct aio_file files[AIO_MAX_FILES];
	int files_registered; /* the sparse fixed-file table exists */
	int files_refused;    /* registering it failed: plain fds only */

	struct aio_region *regions;
	unsigned int n_regions;
	unsigned char *slot_used; /* [AIO_MAX_BUF_SLOTS] */
	int bufs_registered;	  /* the sparse fixed-buffer table exists */
	int can_populate;	  /* the ring has IORING_OP_MADVISE */
	int buf_register_err;	  /* the last registration failure, -errno, or 0 */
};

/* Sets up a on l (which must outlive it) with w's threads for AIO_THREAD
 * (w may be NULL for AIO_URING, and for AIO_AUTO where io_uring works).
 * Returns 0, -EOPNOTSUPP for AIO_URING on a ring that lacks the opcodes
 * (or AIO_AUTO with neither), -EINVAL (mode, or AIO_THREAD without w),
 * -ENOMEM. */
int aio_init(struct aio *a, struct loop *l, struct worker *w, enum aio_mode mode);

/* Unregisters files and buffers and frees the tables. Call it after the
 * loop stopped, best once aio_in_flight is 0 (run the loop until then),
 * and for AIO_THREAD before worker_fini. Requests still in flight are
 * abandoned: their done() is never called (thread steps not yet started
 * do no I/O), but the kernel or a worker may still touch them, their
 * buffers and a until loop_fini and worker_fini, so keep all three valid
 * until then. Safe after a failed init, and twice. */
void aio_fini(struct aio *a);

/* "io_uring" or "threads (pread/pwrite)"; static storage. */
const char *aio_mode_name(const struct aio *a);

/* Makes fd usable by requests; registers it as a fixed file where the
 * ring allows (a failure there is silent: the plain fd is used). fd stays
 * the caller's, and must stay open until aio_file_remove. Returns a handle
 * >= 0, -EBADF (fd < 0), or -EMFILE when AIO_MAX_FILES handles are taken. */
int aio_file_add(struct aio *a, int fd);
/* Forgets a handle (does not close the fd). No request on it may be
 * queued or in flight. Unknown handles are ignored. */
void aio_file_remove(struct aio *a, int handle);

/* Registers [base, base+len) as fixed buffers (io_uring), in chunks of
 * the largest multiple of unit up to max_chunk_bytes, so that no unit-
 * aligned page straddles two. A request whose [buf, buf+len) lies inside
 * one chunk then uses READ_FIXED/WRITE_FIXED. Failing to register
 * (RLIMIT_MEMLOCK, a file mapping the kernel will not pin, no slots left)
 * is not an error: the range is served with plain reads and writes,
 * ctr.buf_unregistered counts it and buf_register_err says why. Returns
 * the chunks registered (> 0), 0 when plain I/O will be used (always so
 * for AIO_THREAD), -EINVAL (NULL base, len or unit 0, unit over
 * max_chunk_bytes), -EEXIST when the range overlaps a registered one, or
 * -ENOMEM. */
int aio_buffer_add(struct aio *a, void *base, size_t len, size_t unit);
/* Unregisters the range aio_buffer_add registered at base. No request
 * into it may be queued or in flight. Returns 0 or -ENOENT. */
int aio_buffer_remove(struct aio *a, void *base);

/* Starts r (its public fields set). done() follows from the loop; on
 * io_uring the SQE goes to the kernel in the loop's next turn. r must stay
 * valid and untouched until then. */
void aio_submit(struct aio *a, struct aio_req *r);
/* Hands the requests queued so far to the kernel now, not at the end of
 * the loop's turn: a caller starting many (a spill batch, each after a
 * checksum of its page) lets the disk work on the first ones while it
 * prepares the rest. A no-op on threads (their jobs start at once). */
void aio_push(struct aio *a);

/* Requests submitted whose done() has not run yet. */
static inline uint64_t aio_in_flight(const struct aio *a)
{
	return a->ctr.submitted - a->ctr.completed;
}

#endif
