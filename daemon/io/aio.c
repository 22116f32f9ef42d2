/* daemon/io/aio.c — asynchronous file I/O on io_uring or worker threads (see
 * aio.h).
 *
 * A request advances in steps. issue() asks the inject hook (if any) how
 * far this step may go and hands the step to the backend: one SQE on
 * io_uring, one worker job on threads. Both report back to after_step() on
 * the loop thread as (bytes moved, what stopped the step), so continuing
 * short transfers, retrying -EAGAIN/-EINTR and mapping end of file to
 * -ENODATA happen in one place for both. A thread step loops over
 * pread/pwrite itself and reports where it stopped, exactly as the
 * sequence of kernel results it saw would have been reported one by one.
 * Errors found at submit (a bad handle, op or length) also travel through
 * the backend, so done() never runs from inside aio_submit.
 *
 * Threading: loop thread, except thread_run, which runs on a worker and
 * touches only its request's private step fields (handed over through
 * the worker's mutex).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "aio.h"
#include "list.h"
#include "log.h"

/* The opcodes the io_uring backend issues. */
static const unsigned char aio_uring_ops[] = {
	IORING_OP_NOP,	      IORING_OP_READ,	     IORING_OP_WRITE,
	IORING_OP_READ_FIXED, IORING_OP_WRITE_FIXED, IORING_OP_FSYNC,
};

/* Whether l is an io_uring loop whose ring has them (an epoll loop, where
 * io_uring is denied, has no ring: threads then). */
static int ring_has_ops(struct loop *l)
{
	struct io_uring *ring = loop_ring(l);
	struct io_uring_probe *p = ring ? io_uring_get_probe_ring(ring) : NULL;
	int ok = p != NULL;

	for (size_t i = 0; ok && i < sizeof(aio_uring_ops); i++)
		ok = io_uring_opcode_supported(p, aio_uring_ops[i]);
	if (p)
		io_uring_free_probe(p);
	return ok;
}

static void issue(struct aio *a, struct aio_req *r);

static void finish(struct aio *a, struct aio_req *r, int res)
{
	a->ctr.completed++;
	if (res < 0)
		a->ctr.errors++;
	/* r is the caller's from here on. */
	r->done(r, res);
}

/* The step in flight moved n bytes, then stopped: stop is 1 when it simply
 * ended (all it asked for, or a short transfer), else the result that
 * stopped it (0: nothing moved — end of file —, or -errno). */
static void after_step(struct aio *a, struct aio_req *r, size_t n, int stop)
{
	if (r->has_result) {
		finish(a, r, r->result);
		return;
	}
	kvp_assert(n <= r->step);
	if (n) {
		r->moved += n;
		if (r->op == AIO_READ)
			a->ctr.bytes_read += n;
		else
			a->ctr.bytes_written += n;
	}
	if (stop == -EAGAIN || stop == -EINTR) {
		a->ctr.retried++;
		issue(a, r);
		return;
	}
	if (stop < 0) {
		finish(a, r, stop);
		return;
	}
	if (r->op == AIO_FSYNC) {
		finish(a, r, 0);
		return;
	}
	if (r->moved == r->len) {
		finish(a, r, (int)r->len);
		return;
	}
	if (stop == 0) {
		/* Nothing moved: end of file for a read; a write that makes
		 * no progress would loop forever. */
		finish(a, r, r->op == AIO_READ ? -ENODATA : -EIO);
		return;
	}
	a->ctr.short_continued++;
	issue(a, r);
}

/* io_uring backend. */

static void on_cqe(struct loop_op *op, int res, unsigned int flags)
{
	struct aio_req *r = container_of(op, struct aio_req, lop);
	struct aio *a = r->aio;

	(void)flags;
	if (!a->loop)
		return; /* abandoned by aio_fini */
	if (res > 0 && !r->injected && r->op == AIO_READ)
		loop_kernel_wrote((char *)r->buf + r->moved, (size_t)res);
	if (r->injected)
		after_step(a, r, 0, r->injected);
	else if (res > 0)
		after_step(a, r, (size_t)res, 1);
	else
		after_step(a, r, 0, res);
}

/* The populate's completion: nothing to do (a failure only means the
 * read faults the pages in itself). It always comes before the read's,
 * which the kernel starts once the populate is done (a hard link). */
static void on_populated(struct loop_op *op, int res, unsigned int flags)
{
	(void)op;
	(void)res;
	(void)flags;
}

/* Whether the ring can run a MADV_POPULATE_WRITE (IORING_OP_MADVISE). */
static int ring_can_populate(struct loop *l)
{
	struct io_uring *ring = loop_ring(l);
	struct io_uring_probe *p = ring ? io_uring_get_probe_ring(ring) : NULL;
	int ok = p && io_uring_opcode_supported(p, IORING_OP_MADVISE);

	if (p)
		io_uring_free_probe(p);
	return ok;
}

static void uring_issue(struct aio *a, struct aio_req *r)
{
	struct io_uring_sqe *sqe;
	char *p = (char *)r->buf + r->moved;
	uint64_t off = r->off + r->moved;
	unsigned int n = (unsigned int)r->step;

	if (r->op == AIO_READ && r->populate && a->can_populate && r->moved == 0 &&
	    !r->has_result && !r->injected && n) {
		/* Both in one submission, so the link holds. */
		if (io_uring_sq_space_left(loop_ring(a->loop)) < 2)
			io_uring_submit(loop_ring(a->loop));
		sqe = loop_sqe(a->loop);
		io_uring_prep_madvise(sqe, p, n, MADV_POPULATE_WRITE);
		sqe->flags |= IOSQE_IO_HARDLINK; /* the read goes on whatever it says */
		r->pop.cb = on_populated;
		loop_sqe_set_op(sqe, &r->pop);
		a->ctr.populated++;
	}
	sqe = loop_sqe(a->loop);
	r->lop.cb = on_cqe;
	if (r->has_result || r->injected) {
		io_uring_prep_nop(sqe);
		loop_sqe_set_op(sqe, &r->lop);
		return;
	}
	switch (r->op) {
	case AIO_READ:
		if (r->buf_slot >= 0)
			io_uring_prep_read_fixed(sqe, r->fd, p, n, off, r->buf_slot);
		else
			io_uring_prep_read(sqe, r->fd, p, n, off);
		break;
	case AIO_WRITE:
		if (r->buf_slot >= 0)
			io_uring_prep_write_fixed(sqe, r->fd, p, n, off, r->buf_slot);
		else
			io_uring_prep_write(sqe, r->fd, p, n, off);
		break;
	case AIO_FSYNC:
		io_uring_prep_fsync(sqe, r->fd, IORING_FSYNC_DATASYNC);
		break;
	}
	if (r->fixed_file)
		sqe->flags |= IOSQE_FIXED_FILE;
	loop_sqe_set_op(sqe, &r->lop);
}

/* Thread backend. */

/* On a worker thread: one step, continuing short transfers itself. */
static void thread_run(struct worker_job *j)
{
	struct aio_req *r = container_of(j, struct aio_req, job);
	char *p = (char *)r->buf + r->moved;
	uint64_t off = r->off + r->moved;
	size_t got = 0;
	int stop = 1;

	r->n_short = 0;
	if (r->has_result || r->injected)
		goto out;
	if (__atomic_load_n(&r->aio->abandoned, __ATOMIC_ACQUIRE)) {
		/* aio_fini ran: the descriptor may be closed and reused. */
		stop = -ECANCELED;
		goto out;
	}
	if (r->op == AIO_FSYNC) {
		stop = fdatasync(r->fd) < 0 ? -errno : 0;
		goto out;
	}
	/* At least one call, so a step of 0 bytes reports what the kernel
	 * says to one (0), as on io_uring. */
	do {
		ssize_t n;

		if (got > 0)
			r->n_short++;
		if (r->op == AIO_READ)
			n = pread(r->fd, p + got, r->step - got, (off_t)(off + got));
		else
			n = pwrite(r->fd, p + got, r->step - got, (off_t)(off + got));
		if (n <= 0) {
			stop = n < 0 ? -errno : 0;
			break;
		}
		got += (size_t)n;
	} while (got < r->step);
out:
	r->step_got = got;
	r->step_res = stop;
}

static void thread_done(struct worker_job *j)
{
	struct aio_req *r = container_of(j, struct aio_req, job);
	struct aio *a = r->aio;

	if (!a->loop)
		return; /* abandoned by aio_fini */
	a->ctr.short_continued += r->n_short;
	if (r->injected)
		after_step(a, r, 0, r->injected);
	else
		after_step(a, r, r->step_got, r->step_res);
}

/* Starts the next step of r: from r->moved, as far as the hook allows. */
static void issue(struct aio *a, struct aio_req *r)
{
	r->injected = 0;
	r->step = r->op == AIO_FSYNC ? 0 : r->len - r->moved;
	if (!r->has_result && a->inject) {
		size_t max = r->step;
		int ret = a->inject(a->inject_ctx, r, r->moved, &max);

		if (ret < 0)
			r->injected = ret;
		else if (max < r->step)
			r->step = max;
	}
	if (a->mode == AIO_URING) {
		uring_issue(a, r);
		return;
	}
	r->job.run = thread_run;
	r->job.done = thread_done;
	worker_submit(a->worker, &r->job);
}

/* The fixed-buffer slot holding all of [buf, buf+len), or -1. */
static int find_buf_slot(const struct aio *a, const void *buf, size_t len)
{
	const char *p = buf;

	for (unsigned int i = 0; i < a->n_regions; i++) {
		const struct aio_region *g = &a->regions[i];
		size_t off, idx, end;

		if (p < g->base || p >= g->base + g->len)
			continue;
		off = (size_t)(p - g->base);
		idx = off / g->chunk_bytes;
		end = (idx + 1) * g->chunk_bytes;
		if (end > g->len)
			end = g->len;
		return len <= end - off ? (int)(g->slot + idx) : -1;
	}
	return -1;
}

static void set_result(struct aio_req *r, int res)
{
	r->has_result = 1;
	r->result = res;
}

void aio_submit(struct aio *a, struct aio_req *r)
{
	kvp_assert(a->loop);
	r->aio = a;
	r->moved = 0;
	r->step = 0;
	r->result = 0;
	r->injected = 0;
	r->has_result = 0;
	r->fixed_file = 0;
	r->buf_slot = -1;
	r->fd = -1;
	a->ctr.submitted++;
	if (r->file < 0 || r->file >= (int)AIO_MAX_FILES || a->files[r->file].fd < 0) {
		set_result(r, -EBADF);
	} else if (r->op != AIO_READ && r->op != AIO_WRITE && r->op != AIO_FSYNC) {
		set_result(r, -EINVAL);
	} else if (r->op != AIO_FSYNC && (r->len > AIO_MAX_REQ_BYTES || (!r->buf && r->len))) {
		set_result(r, -EINVAL);
	} else if (r->op != AIO_FSYNC && r->len == 0) {
		set_result(r, 0);
	} else {
		const struct aio_file *f = &a->files[r->file];

		r->fd = f->fd;
		if (a->mode == AIO_URING) {
			if (f->fixed) {
				r->fixed_file = 1;
				r->fd = r->file;
				a->ctr.fixed_file++;
			}
			if (r->op != AIO_FSYNC)
				r->buf_slot = find_buf_slot(a, r->buf, r->len);
			if (r->buf_slot >= 0)
				a->ctr.fixed_buf++;
		}
	}
	issue(a, r);
}

void aio_push(struct aio *a)
{
	if (a->mode == AIO_URING)
		loop_submit(a->loop);
}

int aio_init(struct aio *a, struct loop *l, struct worker *w, enum aio_mode mode)
{
	memset(a, 0, sizeof(*a));
	for (unsigned int i = 0; i < AIO_MAX_FILES; i++)
		a->files[i].fd = -1;
	a->max_chunk_bytes = AIO_MAX_CHUNK_BYTES;
	switch (mode) {
	case AIO_AUTO:
		if (ring_has_ops(l))
			mode = AIO_URING;
		else if (w)
			mode = AIO_THREAD;
		else
			return -EOPNOTSUPP;
		break;
	case AIO_URING:
		if (!ring_has_ops(l))
			return -EOPNOTSUPP;
		break;
	case AIO_THREAD:
		if (!w)
			return -EINVAL;
		break;
	default:
		return -EINVAL;
	}
	if (mode == AIO_URING) {
		a->can_populate = ring_can_populate(l);
		a->slot_used = calloc(AIO_MAX_BUF_SLOTS, 1);
		if (!a->slot_used)
			return -ENOMEM;
	}
	a->loop = l;
	a->worker = w;
	a->mode = mode;
	return 0;
}

void aio_fini(struct aio *a)
{
	if (!a->loop)
		return;
	__atomic_store_n(&a->abandoned, 1, __ATOMIC_RELEASE);
	if (a->bufs_registered)
		io_uring_unregister_buffers(loop_ring(a->loop));
	if (a->files_registered)
		io_uring_unregister_files(loop_ring(a->loop));
	free(a->regions);
	a->regions = NULL;
	a->n_regions = 0;
	free(a->slot_used);
	a->slot_used = NULL;
	a->bufs_registered = a->files_registered = 0;
	a->loop = NULL;
}

const char *aio_mode_name(const struct aio *a)
{
	return a->mode == AIO_URING ? "io_uring" : "threads (pread/pwrite)";
}

int aio_file_add(struct aio *a, int fd)
{
	struct aio_file *f = NULL;
	int h;

	if (fd < 0)
		return -EBADF;
	for (h = 0; h < (int)AIO_MAX_FILES; h++) {
		if (a->files[h].fd < 0) {
			f = &a->files[h];
			break;
		}
	}
	if (!f)
		return -EMFILE;
	f->fd = fd;
	f->fixed = 0;
	if (a->mode != AIO_URING || a->files_refused)
		return h;
	if (!a->files_registered) {
		/* One sparse table, slot = handle. A refusal (an old kernel,
		 * RLIMIT_NOFILE) leaves plain fds, which work as well. */
		if (io_uring_register_files_sparse(loop_ring(a->loop), AIO_MAX_FILES) < 0) {
			a->files_refused = 1;
			return h;
		}
		a->files_registered = 1;
	}
	if (io_uring_register_files_update(loop_ring(a->loop), (unsigned int)h, &fd, 1) == 1)
		f->fixed = 1;
	return h;
}

void aio_file_remove(struct aio *a, int handle)
{
	struct aio_file *f;

	if (handle < 0 || handle >= (int)AIO_MAX_FILES)
		return;
	f = &a->files[handle];
	if (f->fd < 0)
		return;
	if (f->fixed) {
		int none = -1;

		io_uring_register_files_update(loop_ring(a->loop), (unsigned int)handle, &none, 1);
	}
	f->fd = -1;
	f->fixed = 0;
}

/* The first of n consecutive free fixed-buffer slots, or -1. */
static int find_free_slots(const struct aio *a, unsigned int n)
{
	unsigned int run = 0;

	for (unsigned int i = 0; i < AIO_MAX_BUF_SLOTS; i++) {
		run = a->slot_used[i] ? 0 : run + 1;
		if (run == n)
			return (int)(i + 1 - n);
	}
	return -1;
}

/* Empties slots [slot, slot+n) in the kernel's table and in ours. */
static void clear_slots(struct aio *a, unsigned int slot, unsigned int n)
{
	struct iovec none = {NULL, 0};

	for (unsigned int i = 0; i < n; i++) {
		io_uring_register_buffers_update_tag(loop_ring(a->loop), slot + i, &none, NULL, 1);
		a->slot_used[slot + i] = 0;
	}
}

int aio_buffer_add(struct aio *a, void *base, size_t len, size_t unit)
{
	struct aio_region *g;
	size_t chunk, n_chunks;
	unsigned int n;
	int slot, ret;

	if (!a->loop || !base || !len || !unit || unit > a->max_chunk_bytes)
		return -EINVAL;
	if (a->mode != AIO_URING)
		return 0;
	for (unsigned int i = 0; i < a->n_regions; i++) {
		const struct aio_region *o = &a->regions[i];

		if ((char *)base < o->base + o->len && o->base < (char *)base + len)
			return -EEXIST;
	}
	g = realloc(a->regions, (a->n_regions + 1) * sizeof(*g));
	if (!g)
		return -ENOMEM;
	a->regions = g;
	chunk = a->max_chunk_bytes / unit * unit;
	n_chunks = (len - 1) / chunk + 1;
	slot = n_chunks <= AIO_MAX_BUF_SLOTS ? find_free_slots(a, (unsigned int)n_chunks) : -1;
	if (slot < 0) {
		ret = -ENOSPC;
		goto refused;
	}
	n = (unsigned int)n_chunks;
	if (!a->bufs_registered) {
		ret = io_uring_register_buffers_sparse(loop_ring(a->loop), AIO_MAX_BUF_SLOTS);
		if (ret < 0)
			goto refused;
		a->bufs_registered = 1;
	}
	/* One chunk at a time, so a failure says why. The kernel pins the
	 * pages here and charges them to RLIMIT_MEMLOCK. */
	for (unsigned int i = 0; i < n; i++) {
		size_t off = (size_t)i * chunk;
		struct iovec iov = {(char *)base + off, len - off < chunk ? len - off : chunk};

		ret = io_uring_register_buffers_update_tag(loop_ring(a->loop),
							   (unsigned int)slot + i, &iov, NULL, 1);
		if (ret != 1) {
			clear_slots(a, (unsigned int)slot, i);
			if (ret >= 0)
				ret = -EIO;
			goto refused;
		}
		a->slot_used[slot + i] = 1;
	}
	g = &a->regions[a->n_regions++];
	g->base = base;
	g->len = len;
	g->chunk_bytes = chunk;
	g->slot = (unsigned int)slot;
	g->n_chunks = n;
	return (int)n;

refused:
	a->ctr.buf_unregistered++;
	a->buf_register_err = ret;
	return 0;
}

int aio_buffer_remove(struct aio *a, void *base)
{
	for (unsigned int i = 0; i < a->n_regions; i++) {
		struct aio_region *g = &a->regions[i];

		if (g->base != base)
			continue;
		clear_slots(a, g->slot, g->n_chunks);
		memmove(g, g + 1, (a->n_regions - i - 1) * sizeof(*g));
		a->n_regions--;
		return 0;
	}
	return -ENOENT;
}
