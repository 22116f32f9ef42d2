/* tests/unit/test_aio.c — the worker pool (daemon/io/worker.h) and
 * asynchronous file I/O (daemon/io/aio.h), on both backends.
 *
 * Every aio case runs twice, once on io_uring and once on worker threads,
 * against a file in a fresh mkdtemp directory opened with O_DIRECT where
 * the file system has it, with buffers from a sealed memfd mapping
 * registered as fixed buffers (as the host arenas are) and from plain
 * aligned memory. It checks what the disk tier relies on: a batch of
 * writes at scattered offsets is queued without entering the kernel and
 * reads back byte for byte (also through an independent descriptor);
 * reading past end of file is -ENODATA; short transfers (injected) are
 * continued and the bytes are still right; injected -EIO/-ENOSPC, also
 * halfway through a request, reach done() exactly once and are never
 * retried, while -EAGAIN is; fsync works; bad requests fail through
 * done(), never inside aio_submit; every done() runs on the loop thread.
 * Fixed buffers: chunks never straddle a page, a request across two
 * chunks or outside every region goes the plain way. The worker pool:
 * jobs run on other threads with SIGTERM/SIGINT/SIGHUP blocked, done()
 * runs on the loop thread, and worker_fini with jobs queued finishes them
 * without hanging. Single-threaded test, a SIGALRM guard against hangs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "aio.h"
#include "loop.h"
#include "worker.h"

#define PAGE	    4096u
#define FILE_PAGES  32u
#define MEM_PAGES   64u /* the registered memfd mapping */
#define PLAIN_PAGES 32u /* plain aligned memory, never registered */
#define N_THREADS   2u
#define HANG_S	    20u

struct fx;

/* One request and what became of it. */
struct treq {
	struct aio_req r;
	struct fx *f;
	int calls; /* done() calls */
	int res;
	pid_t tid; /* of the last done() */
};

/* What the inject hook does. */
struct inj {
	size_t max_step;	      /* 0: no limit */
	const struct aio_req *target; /* NULL: every request */
	int err;		      /* returned for target ... */
	size_t err_at;		      /* ... once done_so_far reaches this */
	int eagain_once;	      /* -EAGAIN on the first call, once */
	unsigned int calls;
	size_t last_done_so_far;
};

struct fx {
	enum aio_mode mode;
	struct loop loop;
	struct worker w;
	struct aio a;
	char dir[256];
	char path[300];
	int fd;
	int direct;
	int h;
	int memfd;
	unsigned char *mem;   /* [MEM_PAGES * PAGE], registered */
	int mem_chunks;	      /* aio_buffer_add's answer */
	unsigned char *plain; /* [PLAIN_PAGES * PAGE] */
	unsigned int n_done, want;
	pid_t loop_tid;
	struct inj inj;
};

static enum aio_mode mode_uring = AIO_URING, mode_thread = AIO_THREAD;
static int told_direct;

/* Deterministic bytes, different for every (seed, position). */
static void fill(unsigned char *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

static void on_done(struct aio_req *r, int res)
{
	struct treq *t = (struct treq *)((char *)r - offsetof(struct treq, r));
	struct fx *f = t->f;

	t->calls++;
	t->res = res;
	t->tid = gettid();
	if (++f->n_done == f->want)
		loop_stop(&f->loop);
}

/* Runs the loop until want done() calls have happened in all. */
static void run_until(struct fx *f, unsigned int want)
{
	f->want = want;
	if (f->n_done >= want)
		return;
	f->loop.stop = 0;
	assert_int_equal(loop_run(&f->loop), 0);
	assert_int_equal(f->n_done, want);
}

static void req(struct treq *t, struct fx *f, enum aio_op op, void *buf, size_t len, uint64_t off)
{
	memset(t, 0, sizeof(*t));
	t->f = f;
	t->res = 1; /* no result yet */
	t->r.op = op;
	t->r.file = f->h;
	t->r.buf = buf;
	t->r.len = len;
	t->r.off = off;
	t->r.done = on_done;
}

/* Submits t and checks that done() did not run inside aio_submit. */
static void submit(struct fx *f, struct treq *t)
{
	unsigned int before = f->n_done;

	aio_submit(&f->a, &t->r);
	assert_int_equal(f->n_done, before);
	assert_int_equal(t->calls, 0);
}

/* Exactly one done(), with res, on the loop thread. */
static void check_done(const struct fx *f, const struct treq *t, int res)
{
	assert_int_equal(t->calls, 1);
	assert_int_equal(t->res, res);
	assert_int_equal(t->tid, f->loop_tid);
}

/* The file's bytes through a second, buffered descriptor. */
static void read_back(const struct fx *f, void *buf, size_t len, uint64_t off)
{
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
	close(fd);
}

static off_t file_size(const struct fx *f)
{
	struct stat st;

	assert_int_equal(fstat(f->fd, &st), 0);
	return st.st_size;
}

static int inject(void *ctx, const struct aio_req *r, size_t done_so_far, size_t *max_bytes)
{
	struct inj *in = ctx;

	in->calls++;
	in->last_done_so_far = done_so_far;
	if (in->eagain_once) {
		in->eagain_once = 0;
		return -EAGAIN;
	}
	if (in->err && (!in->target || in->target == r) && done_so_far >= in->err_at)
		return in->err;
	if (in->max_step && *max_bytes > in->max_step)
		*max_bytes = in->max_step;
	return 0;
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	const char *tmp = getenv("TMPDIR");
	int ret;

	if (!f)
		return -1;
	alarm(HANG_S);
	f->mode = *(enum aio_mode *)*state;
	f->fd = f->memfd = -1;
	f->loop_tid = gettid();
	ret = loop_init(&f->loop, 256, LOOP_WANT_IO_URING);
	if (ret < 0) {
		fprintf(stderr, "loop_init: %s\n", strerror(-ret));
		return -1;
	}
	if (worker_init(&f->w, &f->loop, N_THREADS) < 0)
		return -1;
	ret = aio_init(&f->a, &f->loop, &f->w, f->mode);
	if (ret < 0) {
		fprintf(stderr, "aio_init: %s\n", strerror(-ret));
		return -1;
	}
	snprintf(f->dir, sizeof(f->dir), "%s/kvp-aio-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->path, sizeof(f->path), "%s/spill", f->dir);
	f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
	f->direct = f->fd >= 0;
	if (f->fd < 0 && errno == EINVAL) {
		if (!told_direct++)
			print_message("no O_DIRECT on %s: testing buffered I/O\n", f->dir);
		f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	}
	if (f->fd < 0)
		return -1;
	f->h = aio_file_add(&f->a, f->fd);
	if (f->h < 0)
		return -1;

	/* A host arena: a sealed memfd mapping. */
	f->memfd = memfd_create("kvp-aio-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (f->memfd < 0 || ftruncate(f->memfd, MEM_PAGES * PAGE) < 0 ||
	    fcntl(f->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		return -1;
	f->mem = mmap(NULL, MEM_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
	if (f->mem == MAP_FAILED)
		return -1;
	f->mem_chunks = aio_buffer_add(&f->a, f->mem, MEM_PAGES * PAGE, PAGE);
	f->plain = aligned_alloc(PAGE, PLAIN_PAGES * PAGE);
	if (!f->plain)
		return -1;
	/* Defined bytes for valgrind, which does not see io_uring's writes. */
	memset(f->plain, 0, PLAIN_PAGES * PAGE);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	aio_fini(&f->a);
	worker_fini(&f->w);
	loop_fini(&f->loop);
	if (f->fd >= 0)
		close(f->fd);
	unlink(f->path);
	rmdir(f->dir);
	if (f->mem && f->mem != MAP_FAILED)
		munmap(f->mem, MEM_PAGES * PAGE);
	if (f->memfd >= 0)
		close(f->memfd);
	free(f->plain);
	free(f);
	alarm(0);
	return 0;
}

static void test_setup_facts(void **state)
{
	struct fx *f = *state;

	if (f->mode == AIO_URING) {
		assert_string_equal(aio_mode_name(&f->a), "io_uring");
		/* A memfd mapping can be pinned: one chunk (64 pages < 1 GiB). */
		assert_int_equal(f->mem_chunks, 1);
		assert_int_equal(f->a.ctr.buf_unregistered, 0);
		assert_true(f->a.files[f->h].fixed);
	} else {
		assert_string_equal(aio_mode_name(&f->a), "threads (pread/pwrite)");
		assert_int_equal(f->mem_chunks, 0);
		assert_false(f->a.files[f->h].fixed);
	}
	if (!f->direct)
		print_message("(file without O_DIRECT)\n");
}

/* N pages at scattered offsets in one batch, some from the registered
 * arena, some from plain memory, and one three-page request; then read
 * back, through aio and through a second descriptor. */
static void test_write_read_batch(void **state)
{
	enum { N = 12 };
	/* File page of each request; request N-1 is three pages long. */
	static const unsigned int at[N] = {17, 3, 29, 0, 8, 21, 12, 5, 26, 1, 14, 9};
	struct fx *f = *state;
	struct treq w[N], r[N];
	unsigned int sq_before, n_fixed = 0;
	size_t total = 0;
	unsigned char *check = aligned_alloc(PAGE, 3 * PAGE);

	assert_non_null(check);
	sq_before = io_uring_sq_ready(&f->loop.ring);
	for (unsigned int i = 0; i < N; i++) {
		size_t len = i == N - 1 ? 3 * PAGE : PAGE;
		unsigned char *src = i % 2 ? f->plain + i * PAGE : f->mem + i * PAGE;

		if (i == N - 1)
			src = f->mem + 20 * PAGE;
		n_fixed += src >= f->mem && src < f->mem + MEM_PAGES * PAGE;
		fill(src, len, i + 1);
		req(&w[i], f, AIO_WRITE, src, len, (uint64_t)at[i] * PAGE);
		submit(f, &w[i]);
		total += len;
	}
	if (f->mode == AIO_URING)
		/* Queued, not submitted: the loop's next turn enters once. */
		assert_int_equal(io_uring_sq_ready(&f->loop.ring), sq_before + N);
	run_until(f, N);
	for (unsigned int i = 0; i < N; i++)
		check_done(f, &w[i], (int)w[i].r.len);

	/* Read into the other half of each memory, zeroed first. */
	memset(f->mem + 32 * PAGE, 0, 32 * PAGE);
	memset(f->plain + 16 * PAGE, 0, 16 * PAGE);
	for (unsigned int i = 0; i < N; i++) {
		unsigned char *dst = i % 2 ? f->plain + (16 + i) * PAGE : f->mem + (32 + i) * PAGE;

		if (i == N - 1)
			dst = f->mem + 50 * PAGE;
		req(&r[i], f, AIO_READ, dst, w[i].r.len, w[i].r.off);
		submit(f, &r[i]);
	}
	run_until(f, 2 * N);
	for (unsigned int i = 0; i < N; i++) {
		check_done(f, &r[i], (int)r[i].r.len);
		assert_memory_equal(r[i].r.buf, w[i].r.buf, w[i].r.len);
		read_back(f, check, w[i].r.len, w[i].r.off);
		assert_memory_equal(check, w[i].r.buf, w[i].r.len);
	}

	assert_int_equal(f->a.ctr.submitted, 2 * N);
	assert_int_equal(f->a.ctr.completed, 2 * N);
	assert_int_equal(aio_in_flight(&f->a), 0);
	assert_int_equal(f->a.ctr.errors, 0);
	assert_int_equal(f->a.ctr.bytes_written, total);
	assert_int_equal(f->a.ctr.bytes_read, total);
	assert_int_equal(f->a.ctr.short_continued, 0);
	if (f->mode == AIO_URING) {
		assert_int_equal(f->a.ctr.fixed_buf, 2 * n_fixed);
		assert_int_equal(f->a.ctr.fixed_file, 2 * N);
	} else {
		assert_int_equal(f->a.ctr.fixed_buf, 0);
		assert_int_equal(f->a.ctr.fixed_file, 0);
	}
	free(check);
}

static void test_read_past_eof(void **state)
{
	struct fx *f = *state;
	struct treq w, r1, r2, r3;

	fill(f->mem, 2 * PAGE, 7);
	req(&w, f, AIO_WRITE, f->mem, 2 * PAGE, 0);
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, 2 * PAGE);
	assert_int_equal(file_size(f), 2 * PAGE);

	/* Straddling the end: the page before it arrives, then -ENODATA. */
	memset(f->plain, 0, 2 * PAGE);
	req(&r1, f, AIO_READ, f->plain, 2 * PAGE, PAGE);
	/* At the end, and far beyond it. */
	req(&r2, f, AIO_READ, f->mem + 8 * PAGE, PAGE, 2 * PAGE);
	req(&r3, f, AIO_READ, f->mem + 9 * PAGE, PAGE, 1000ull * PAGE);
	submit(f, &r1);
	submit(f, &r2);
	submit(f, &r3);
	run_until(f, 4);
	check_done(f, &r1, -ENODATA);
	check_done(f, &r2, -ENODATA);
	check_done(f, &r3, -ENODATA);
	assert_memory_equal(f->plain, f->mem + PAGE, PAGE);
	assert_int_equal(f->a.ctr.errors, 3);
	assert_int_equal(f->a.ctr.bytes_read, PAGE);
}

/* Every step limited to one page: an 8-page write and a 5-page read are
 * continued page by page; one -EAGAIN is retried. */
static void test_short_transfers(void **state)
{
	struct fx *f = *state;
	struct treq w, r, r2;
	unsigned char *expect = malloc(8 * PAGE);

	assert_non_null(expect);
	f->inj.max_step = PAGE;
	f->a.inject = inject;
	f->a.inject_ctx = &f->inj;

	fill(f->mem, 8 * PAGE, 99);
	memcpy(expect, f->mem, 8 * PAGE);
	req(&w, f, AIO_WRITE, f->mem, 8 * PAGE, 4 * PAGE);
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, 8 * PAGE);
	assert_int_equal(f->inj.calls, 8);
	assert_int_equal(f->inj.last_done_so_far, 7 * PAGE);
	assert_int_equal(f->a.ctr.short_continued, 7);

	memset(f->plain, 0, 5 * PAGE);
	req(&r, f, AIO_READ, f->plain, 5 * PAGE, 6 * PAGE);
	f->inj.eagain_once = 1;
	submit(f, &r);
	run_until(f, 2);
	check_done(f, &r, 5 * PAGE);
	assert_memory_equal(f->plain, expect + 2 * PAGE, 5 * PAGE);
	assert_int_equal(f->a.ctr.retried, 1);
	assert_int_equal(f->inj.calls, 8 + 1 + 5);
	assert_int_equal(f->a.ctr.short_continued, 7 + 4);

	/* Short steps that run into the end of the file (12 pages). */
	req(&r2, f, AIO_READ, f->mem + 16 * PAGE, 4 * PAGE, 10 * PAGE);
	submit(f, &r2);
	run_until(f, 3);
	check_done(f, &r2, -ENODATA);
	assert_memory_equal(f->mem + 16 * PAGE, expect + 6 * PAGE, 2 * PAGE);

	assert_int_equal(f->a.ctr.bytes_written, 8 * PAGE);
	assert_int_equal(f->a.ctr.bytes_read, 7 * PAGE);
	assert_int_equal(f->a.ctr.errors, 1);
	read_back(f, expect, 8 * PAGE, 4 * PAGE);
	assert_memory_equal(expect, f->mem, 8 * PAGE);
	free(expect);
}

/* Injected -EIO on a read and -ENOSPC on a write: done() once, no I/O,
 * no retry. Then -EIO halfway through a write: the pages before it are
 * written, done() sees -EIO once. */
static void test_injected_errors(void **state)
{
	struct fx *f = *state;
	struct treq w, r, w2;

	f->a.inject = inject;
	f->a.inject_ctx = &f->inj;
	f->inj.err = -ENOSPC;
	req(&w, f, AIO_WRITE, f->mem, 2 * PAGE, 0);
	f->inj.target = &w.r;
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, -ENOSPC);
	assert_int_equal(f->inj.calls, 1);
	assert_int_equal(file_size(f), 0);

	f->inj.err = -EIO;
	req(&r, f, AIO_READ, f->mem, PAGE, 0);
	f->inj.target = &r.r;
	f->inj.calls = 0;
	submit(f, &r);
	run_until(f, 2);
	check_done(f, &r, -EIO);
	assert_int_equal(f->inj.calls, 1);

	f->inj.max_step = PAGE;
	f->inj.err_at = 2 * PAGE;
	f->inj.calls = 0;
	fill(f->mem, 4 * PAGE, 3);
	req(&w2, f, AIO_WRITE, f->mem, 4 * PAGE, 0);
	f->inj.target = &w2.r;
	submit(f, &w2);
	run_until(f, 3);
	check_done(f, &w2, -EIO);
	assert_int_equal(f->inj.calls, 3);
	assert_int_equal(file_size(f), 2 * PAGE);

	assert_int_equal(f->a.ctr.errors, 3);
	assert_int_equal(f->a.ctr.completed, 3);
	assert_int_equal(f->a.ctr.retried, 0);
	assert_int_equal(f->a.ctr.bytes_written, 2 * PAGE);
	assert_int_equal(f->a.ctr.bytes_read, 0);
	/* Still called once: nothing runs after done(). */
	assert_int_equal(w.calls + r.calls + w2.calls, 3);
}

/* fsync; and requests refused at submit still answer through done(). */
static void test_fsync_and_bad_requests(void **state)
{
	struct fx *f = *state;
	struct treq w, s, bad_file, bad_op, too_long, null_buf, empty, removed;
	int h2;

	fill(f->mem, PAGE, 5);
	req(&w, f, AIO_WRITE, f->mem, PAGE, 0);
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, PAGE);
	req(&s, f, AIO_FSYNC, NULL, 0, 0);
	submit(f, &s);
	run_until(f, 2);
	check_done(f, &s, 0);

	req(&bad_file, f, AIO_READ, f->mem, PAGE, 0);
	bad_file.r.file = 77;
	req(&bad_op, f, AIO_READ, f->mem, PAGE, 0);
	bad_op.r.op = (enum aio_op)42;
	req(&too_long, f, AIO_READ, f->mem, (size_t)AIO_MAX_REQ_BYTES + PAGE, 0);
	req(&null_buf, f, AIO_WRITE, NULL, PAGE, 0);
	req(&empty, f, AIO_READ, f->mem, 0, 0);
	/* A handle that was removed. */
	h2 = aio_file_add(&f->a, f->fd);
	assert_true(h2 >= 0 && h2 != f->h);
	aio_file_remove(&f->a, h2);
	req(&removed, f, AIO_FSYNC, NULL, 0, 0);
	removed.r.file = h2;
	submit(f, &bad_file);
	submit(f, &bad_op);
	submit(f, &too_long);
	submit(f, &null_buf);
	submit(f, &empty);
	submit(f, &removed);
	run_until(f, 8);
	check_done(f, &bad_file, -EBADF);
	check_done(f, &bad_op, -EINVAL);
	check_done(f, &too_long, -EINVAL);
	check_done(f, &null_buf, -EINVAL);
	check_done(f, &empty, 0);
	check_done(f, &removed, -EBADF);
	assert_int_equal(f->a.ctr.errors, 5);
	assert_int_equal(aio_file_add(&f->a, -1), -EBADF);
}

/* Fixed-buffer chunks: a second arena of 8 pages in chunks of at most 3
 * pages is 3 + 3 + 2; a request inside a chunk uses it, one across two
 * chunks or outside every region goes the plain way, and the bytes are
 * right either way. */
static void test_fixed_buffer_chunks(void **state)
{
	struct fx *f = *state;
	unsigned char *m2;
	struct treq w[3], r[3];
	/* (first page, pages) in the second arena; fixed? */
	static const unsigned int pg[3] = {0, 2, 6}, np[3] = {2, 2, 2};
	static const int fixed[3] = {1, 0, 1};
	uint64_t fb;
	int memfd = memfd_create("kvp-aio-test2", MFD_CLOEXEC);

	assert_true(memfd >= 0);
	assert_int_equal(ftruncate(memfd, 8 * PAGE), 0);
	m2 = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	assert_true(m2 != MAP_FAILED);

	f->a.max_chunk_bytes = 3 * PAGE + 100; /* rounds down to 3 pages */
	assert_int_equal(aio_buffer_add(&f->a, m2, 8 * PAGE, 4 * PAGE), -EINVAL);
	assert_int_equal(aio_buffer_add(&f->a, m2, 8 * PAGE, PAGE), f->mode == AIO_URING ? 3 : 0);
	if (f->mode == AIO_URING) {
		assert_int_equal(aio_buffer_add(&f->a, m2 + PAGE, PAGE, PAGE), -EEXIST);
		assert_int_equal(aio_buffer_add(&f->a, f->mem + 60 * PAGE, 8 * PAGE, PAGE),
				 -EEXIST);
	}

	fb = f->a.ctr.fixed_buf;
	for (unsigned int i = 0; i < 3; i++) {
		fill(m2 + pg[i] * PAGE, np[i] * PAGE, 40 + i);
		req(&w[i], f, AIO_WRITE, m2 + pg[i] * PAGE, np[i] * PAGE, (uint64_t)i * 4 * PAGE);
		submit(f, &w[i]);
		if (f->mode == AIO_URING)
			assert_int_equal(w[i].r.buf_slot >= 0, fixed[i]);
	}
	assert_int_equal(f->a.ctr.fixed_buf, f->mode == AIO_URING ? fb + 2 : 0);
	run_until(f, 3);
	for (unsigned int i = 0; i < 3; i++) {
		check_done(f, &w[i], (int)(np[i] * PAGE));
		req(&r[i], f, AIO_READ, f->plain + i * 4 * PAGE, np[i] * PAGE,
		    (uint64_t)i * 4 * PAGE);
		submit(f, &r[i]);
	}
	run_until(f, 6);
	for (unsigned int i = 0; i < 3; i++) {
		check_done(f, &r[i], (int)(np[i] * PAGE));
		assert_memory_equal(f->plain + i * 4 * PAGE, m2 + pg[i] * PAGE, np[i] * PAGE);
	}
	/* Plain memory is never fixed. */
	assert_int_equal(f->a.ctr.fixed_buf, f->mode == AIO_URING ? fb + 2 : 0);

	assert_int_equal(aio_buffer_remove(&f->a, m2), f->mode == AIO_URING ? 0 : -ENOENT);
	assert_int_equal(aio_buffer_remove(&f->a, m2), -ENOENT);
	munmap(m2, 8 * PAGE);
	close(memfd);
}

/* A mapping of a regular file: the kernel may refuse to pin it (ext4 does,
 * tmpfs does not). Refused, it is counted and served the plain way. */
static void test_unpinnable_buffer(void **state)
{
	struct fx *f = *state;
	char path[320];
	unsigned char *m;
	struct treq w, r;
	int fd, ret;

	snprintf(path, sizeof(path), "%s/mapped", f->dir);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 2 * PAGE), 0);
	m = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	ret = aio_buffer_add(&f->a, m, 2 * PAGE, PAGE);
	assert_true(ret >= 0);
	if (f->mode == AIO_URING && ret == 0) {
		print_message("a file mapping in %s is not pinnable: %s\n", f->dir,
			      strerror(-f->a.buf_register_err));
		assert_int_equal(f->a.ctr.buf_unregistered, 1);
		assert_true(f->a.buf_register_err < 0);
	}
	fill(m, 2 * PAGE, 77);
	req(&w, f, AIO_WRITE, m, 2 * PAGE, 0);
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, 2 * PAGE);
	req(&r, f, AIO_READ, f->plain, 2 * PAGE, 0);
	submit(f, &r);
	run_until(f, 2);
	check_done(f, &r, 2 * PAGE);
	assert_memory_equal(f->plain, m, 2 * PAGE);
	assert_int_equal(f->a.ctr.fixed_buf, f->mode == AIO_URING && ret > 0 ? 1 : 0);
	if (ret > 0)
		assert_int_equal(aio_buffer_remove(&f->a, m), 0);
	munmap(m, 2 * PAGE);
	close(fd);
	unlink(path);
}

/* aio_fini with requests in flight abandons them: no done(), no hang,
 * and worker_fini after it finishes cleanly. */
/* Reads with populate into memory never touched (a fresh memfd, as a new
 * arena is), many at once so a pair (populate, read) meets a full
 * submission queue: the bytes arrive, and on io_uring each read faulted
 * its buffer in first where the ring can. */
static void test_populate_read(void **state)
{
	struct fx *f = *state;
	enum { N = 140 }; /* 280 SQEs: past the test ring's 256 */
	static struct treq w, r[N];
	unsigned char *m;
	int fd;

	fd = memfd_create("test_aio-populate", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)N * PAGE), 0);
	m = mmap(NULL, (size_t)N * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	fill(f->plain, PAGE, 91);
	req(&w, f, AIO_WRITE, f->plain, PAGE, 0);
	submit(f, &w);
	run_until(f, 1);
	check_done(f, &w, PAGE);
	for (int i = 0; i < N; i++) {
		req(&r[i], f, AIO_READ, m + (size_t)i * PAGE, PAGE, 0);
		r[i].r.populate = 1;
		submit(f, &r[i]);
	}
	run_until(f, 1 + N);
	for (int i = 0; i < N; i++) {
		check_done(f, &r[i], PAGE);
		assert_memory_equal(m + (size_t)i * PAGE, f->plain, PAGE);
	}
	assert_int_equal(f->a.ctr.populated, f->a.can_populate ? N : 0);
	if (f->mode == AIO_THREAD)
		assert_int_equal(f->a.can_populate, 0);
	munmap(m, (size_t)N * PAGE);
	close(fd);
}

static void test_fini_abandons(void **state)
{
	struct fx *f = *state;
	struct treq w[4];

	for (unsigned int i = 0; i < 4; i++) {
		fill(f->mem + i * PAGE, PAGE, 60 + i);
		req(&w[i], f, AIO_WRITE, f->mem + i * PAGE, PAGE, (uint64_t)i * PAGE);
		submit(f, &w[i]);
	}
	assert_int_equal(aio_in_flight(&f->a), 4);
	aio_fini(&f->a);
	worker_fini(&f->w);
	for (unsigned int i = 0; i < 4; i++)
		assert_int_equal(w[i].calls, 0);
	assert_int_equal(f->n_done, 0);
}

static void test_init_modes(void **state)
{
	struct fx *f = *state;
	struct aio a;

	assert_int_equal(aio_init(&a, &f->loop, NULL, AIO_THREAD), -EINVAL);
	aio_fini(&a);
	assert_int_equal(aio_init(&a, &f->loop, &f->w, (enum aio_mode)9), -EINVAL);
	aio_fini(&a);
	assert_int_equal(aio_init(&a, &f->loop, NULL, AIO_AUTO), 0);
	/* Every kernel this runs on has the opcodes. */
	assert_string_equal(aio_mode_name(&a), "io_uring");
	aio_fini(&a);
	aio_fini(&a);
}

/* Worker pool. */

struct tjob {
	struct worker_job j;
	struct fx *f;
	pid_t run_tid, done_tid;
	int blocked; /* SIGTERM, SIGINT, SIGHUP blocked in run() */
	int runs, dones;
	unsigned int sleep_us;
	struct worker *resubmit; /* done() submits this job again, once */
};

static unsigned int jobs_done;
static unsigned int jobs_want;
static struct loop *jobs_loop;

static void job_run(struct worker_job *j)
{
	struct tjob *t = (struct tjob *)((char *)j - offsetof(struct tjob, j));
	sigset_t cur;

	t->runs++;
	t->run_tid = gettid();
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	t->blocked = sigismember(&cur, SIGTERM) == 1 && sigismember(&cur, SIGINT) == 1 &&
		     sigismember(&cur, SIGHUP) == 1;
	if (t->sleep_us)
		usleep(t->sleep_us);
}

static void job_done(struct worker_job *j)
{
	struct tjob *t = (struct tjob *)((char *)j - offsetof(struct tjob, j));

	t->dones++;
	t->done_tid = gettid();
	if (t->resubmit) {
		struct worker *w = t->resubmit;

		t->resubmit = NULL;
		worker_submit(w, j);
		return;
	}
	if (++jobs_done == jobs_want && jobs_loop)
		loop_stop(jobs_loop);
}

static void test_worker_threads(void **state)
{
	enum { N = 140 }; /* 280 SQEs: past the test ring's 256 */
	struct fx *f = *state;
	struct tjob t[N];
	pid_t tids[N];
	unsigned int n_tids = 0;

	memset(t, 0, sizeof(t));
	jobs_done = 0;
	jobs_want = N;
	jobs_loop = &f->loop;
	for (unsigned int i = 0; i < N; i++) {
		t[i].j.run = job_run;
		t[i].j.done = job_done;
		t[i].sleep_us = i % 4 ? 0 : 500;
		worker_submit(&f->w, &t[i].j);
	}
	assert_int_equal(f->w.n_pending, N);
	assert_int_equal(jobs_done, 0); /* never inside worker_submit */
	f->loop.stop = 0;
	assert_int_equal(loop_run(&f->loop), 0);
	assert_int_equal(jobs_done, N);
	assert_int_equal(f->w.n_pending, 0);
	for (unsigned int i = 0; i < N; i++) {
		unsigned int k;

		assert_int_equal(t[i].runs, 1);
		assert_int_equal(t[i].dones, 1);
		assert_true(t[i].blocked);
		assert_int_not_equal(t[i].run_tid, f->loop_tid);
		assert_int_equal(t[i].done_tid, f->loop_tid);
		for (k = 0; k < n_tids && tids[k] != t[i].run_tid; k++)
			;
		if (k == n_tids)
			tids[n_tids++] = t[i].run_tid;
	}
	assert_true(n_tids >= 1 && n_tids <= N_THREADS);
	/* The loop's own signal mask is untouched. */
	{
		sigset_t cur;

		pthread_sigmask(SIG_BLOCK, NULL, &cur);
		assert_int_equal(sigismember(&cur, SIGTERM), 0);
	}
	jobs_loop = NULL;
}

/* worker_fini with jobs still queued, the loop never run: every job runs,
 * every done() runs on the calling thread, nothing hangs; a job submitted
 * again from its done() during fini runs too. */
static void test_worker_fini_with_jobs_queued(void **state)
{
	enum { N = 64 };
	struct loop l;
	struct worker w;
	struct tjob *t = calloc(N, sizeof(*t));
	pid_t me = gettid();

	(void)state;
	assert_non_null(t);
	alarm(HANG_S);
	assert_int_equal(loop_init(&l, 64, LOOP_WANT_IO_URING), 0);
	assert_int_equal(worker_init(&w, &l, N_THREADS), 0);
	jobs_done = 0;
	jobs_want = 0;
	jobs_loop = NULL;
	for (unsigned int i = 0; i < N; i++) {
		t[i].j.run = job_run;
		t[i].j.done = job_done;
		t[i].sleep_us = 1000;
		if (i == N - 1)
			t[i].resubmit = &w;
		worker_submit(&w, &t[i].j);
	}
	worker_fini(&w);
	for (unsigned int i = 0; i < N; i++) {
		assert_int_equal(t[i].runs, i == N - 1 ? 2 : 1);
		assert_int_equal(t[i].dones, i == N - 1 ? 2 : 1);
		assert_int_equal(t[i].done_tid, me);
	}
	/* The resubmitted job ran during fini, on this thread. */
	assert_int_equal(t[N - 1].run_tid, me);
	assert_int_equal(jobs_done, N);
	worker_fini(&w);
	loop_fini(&l);
	free(t);
	alarm(0);
}

static void test_worker_init_errors(void **state)
{
	struct loop l;
	struct worker w;

	(void)state;
	assert_int_equal(loop_init(&l, 8, LOOP_WANT_IO_URING), 0);
	assert_int_equal(worker_init(&w, &l, 0), -EINVAL);
	worker_fini(&w);
	assert_int_equal(worker_init(&w, &l, WORKER_MAX_THREADS + 1), -EINVAL);
	worker_fini(&w);
	loop_fini(&l);
}

#define CASE(fn, mode) cmocka_unit_test_prestate_setup_teardown(fn, setup, teardown, &(mode))
/* Every aio case, on one backend. */
#define AIO_CASES(mode)                                                                            \
	CASE(test_setup_facts, mode), CASE(test_write_read_batch, mode),                           \
		CASE(test_read_past_eof, mode), CASE(test_short_transfers, mode),                  \
		CASE(test_injected_errors, mode), CASE(test_fsync_and_bad_requests, mode),         \
		CASE(test_fixed_buffer_chunks, mode), CASE(test_unpinnable_buffer, mode),          \
		CASE(test_worker_threads, mode), CASE(test_fini_abandons, mode),                   \
		CASE(test_populate_read, mode)

int main(void)
{
	const struct CMUnitTest uring[] = {
		AIO_CASES(mode_uring),
		CASE(test_init_modes, mode_uring),
	};
	const struct CMUnitTest threads[] = {
		AIO_CASES(mode_thread),
	};
	const struct CMUnitTest worker[] = {
		cmocka_unit_test(test_worker_fini_with_jobs_queued),
		cmocka_unit_test(test_worker_init_errors),
	};
	int fails = 0;

	fails += cmocka_run_group_tests_name("aio on io_uring", uring, NULL, NULL);
	fails += cmocka_run_group_tests_name("aio on threads", threads, NULL, NULL);
	fails += cmocka_run_group_tests_name("worker", worker, NULL, NULL);
	return fails;
}
