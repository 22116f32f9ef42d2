/* tests/unit/test_spill.c — the spill file format alone (daemon/store/spill.h),
 * on real files in a private temporary directory:
 *  - last-use stamps: they survive encode/decode, a stamp whose seal does
 *    not verify (a flipped byte, one left over from an earlier page of the
 *    extent) reads as none, spill_set_used rewrites one only beside the
 *    header it was written for;
 *  - a format 2 file (no stamps) is still read, its pages found with no
 *    stamp, and becomes format 3;
 *  - a file cut short while the daemon was down: headers whose data is
 *    past the end are not found (issue 13 item 5: 40 pages announced
 *    where 16 remained);
 *  - spill_forget: a forgotten extent is not found again;
 *  - allocating the file's blocks ahead (so O_DIRECT writes need not
 *    allocate, which serialises them): due on a fresh file, the blocks
 *    and size there before any data, a restart finds only the pages
 *    written, none in the blocks ahead; when one is due and what it
 *    covers (a window, a burst, free extents first, the cap), a failure
 *    backs off, a file system without fallocate stops it;
 *  - spill_reclaim: junk named like a spill file and spill files holding
 *    no page are removed at start; a spill file with pages (the warm
 *    restart of a pool not open yet), a file held by another process and
 *    files named otherwise stay (issue 13 item 6).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "spill.h"

/* 1 layer, 1 head, head_dim 8, 4 tokens of f16: one 4 KiB page. */
static const struct shm_layout tiny = {
	.n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .block_tokens = 4, .dtype = SHM_DTYPE_F16};
static const XXH128_hash_t root = {.low64 = 0x1111222233334444ull, .high64 = 0x5555ull};
#define CAP	16u
#define PAGE	4096u
#define UID	1000u
#define FH_FMT	8u   /* daemon/store/spill.c: the file header's format field */
#define FH_SUM	196u /* ... and its checksum */
#define PH_USED 76u  /* the page header's stamp */

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kvp-spill-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[96];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void open_sp(struct spill *sp)
{
	char why[256];

	assert_int_equal(
		spill_open(sp, dir, UID, "m", &tiny, root, (uint64_t)CAP * PAGE, why, sizeof(why)),
		0);
}

/* Writes a valid header for a first page hash (low half h) at extent,
 * with use stamp used, and (when data) its data extent. */
static void put_page(struct spill *sp, uint32_t extent, uint64_t h, uint64_t used, int data)
{
	unsigned char b[SPILL_PAGE_HDR], page[PAGE];
	struct spill_page_hdr ph = {
		.hash = {.low64 = h << 4, .high64 = ~h}, /* keys differ in more than bit 0 */
		.parent = root,
		.flags = SPILL_PAGE_FIRST,
		.stored_bytes = PAGE,
		.used = used,
	};

	memset(page, (int)h, sizeof(page));
	ph.sum = XXH3_64bits(page, sizeof(page));
	spill_hdr_encode(sp, &ph, b);
	assert_int_equal(pwrite(sp->fd_meta, b, sizeof(b), (off_t)spill_hdr_off(extent)),
			 sizeof(b));
	if (data)
		assert_int_equal(
			pwrite(sp->fd_meta, page, sizeof(page), (off_t)spill_data_off(sp, extent)),
			sizeof(page));
}

struct found {
	int n;
	uint32_t extent[CAP];
	struct spill_page_hdr h[CAP];
};

static int collect(void *arg, uint32_t extent, const struct spill_page_hdr *h)
{
	struct found *f = arg;

	f->extent[f->n] = extent;
	f->h[f->n++] = *h;
	return 0;
}

static void test_stamp_round_trip(void **state)
{
	struct spill sp;
	unsigned char b[SPILL_PAGE_HDR];
	struct spill_page_hdr ph = {.hash = {1, 2},
				    .parent = root,
				    .stored_bytes = PAGE,
				    .used = 42},
			      out;

	(void)state;
	open_sp(&sp);
	spill_hdr_encode(&sp, &ph, b);
	assert_int_equal(spill_hdr_decode(&sp, b, &out), 0);
	assert_int_equal(out.used, 42);
	/* A flipped stamp byte: the header still reads, the stamp does not. */
	b[PH_USED] ^= 1;
	assert_int_equal(spill_hdr_decode(&sp, b, &out), 0);
	assert_int_equal(out.used, 0);
	spill_close(&sp);
}

static void test_set_used(void **state)
{
	struct spill sp;
	struct found f = {0};

	(void)state;
	open_sp(&sp);
	put_page(&sp, 0, 0x10, 5, 1);
	put_page(&sp, 1, 0x11, 6, 1);
	assert_int_equal(spill_scan(&sp, collect, &f), 2);
	assert_int_equal(spill_set_used(&sp, 1, f.h[1].hash, 99), 0);
	/* Another page's hash: the extent no longer holds it, no stamp. */
	assert_int_equal(spill_set_used(&sp, 0, f.h[1].hash, 100), -ESTALE);
	spill_close(&sp);
	open_sp(&sp);
	memset(&f, 0, sizeof(f));
	assert_int_equal(spill_scan(&sp, collect, &f), 2);
	for (int i = 0; i < 2; i++)
		assert_int_equal(f.h[i].used, f.extent[i] == 1 ? 99 : 5);
	/* A stamp left over from an earlier page of extent 1 does not
	 * verify beside the next header written there. */
	{
		unsigned char b[SPILL_PAGE_HDR], stamp[16];
		struct found g = {0};

		assert_int_equal(pread(sp.fd_meta, stamp, 16, (off_t)spill_hdr_off(1) + PH_USED),
				 16);
		put_page(&sp, 1, 0x12, 0, 1);
		assert_int_equal(pwrite(sp.fd_meta, stamp, 16, (off_t)spill_hdr_off(1) + PH_USED),
				 16);
		assert_int_equal(pread(sp.fd_meta, b, sizeof(b), (off_t)spill_hdr_off(1)),
				 sizeof(b));
		spill_close(&sp);
		open_sp(&sp);
		assert_int_equal(spill_scan(&sp, collect, &g), 2);
		for (int i = 0; i < 2; i++)
			if (g.extent[i] == 1)
				assert_int_equal(g.h[i].used, 0);
	}
	spill_close(&sp);
}

/* A spill file as format 2 wrote it: file header format 2, page headers
 * without the stamp. */
static void test_format2_still_read(void **state)
{
	struct spill sp;
	struct found f = {0};
	unsigned char fh[SPILL_FILE_HDR], zero[16] = {0};
	uint64_t sum;

	(void)state;
	open_sp(&sp);
	put_page(&sp, 3, 0x30, 7, 1);
	assert_int_equal(pwrite(sp.fd_meta, zero, 16, (off_t)spill_hdr_off(3) + PH_USED), 16);
	assert_int_equal(pread(sp.fd_meta, fh, sizeof(fh), 0), sizeof(fh));
	fh[FH_FMT] = 2;
	sum = XXH3_64bits(fh, FH_SUM);
	for (int i = 0; i < 8; i++)
		fh[FH_SUM + i] = (unsigned char)(sum >> (8 * i));
	assert_int_equal(pwrite(sp.fd_meta, fh, sizeof(fh), 0), sizeof(fh));
	spill_close(&sp);

	open_sp(&sp);
	assert_int_equal(spill_scan(&sp, collect, &f), 1);
	assert_int_equal(f.extent[0], 3);
	assert_int_equal(f.h[0].hash.low64, 0x30 << 4);
	assert_int_equal(f.h[0].used, 0);
	assert_int_equal(pread(sp.fd_meta, fh, sizeof(fh), 0), sizeof(fh));
	assert_int_equal(fh[FH_FMT], SPILL_FORMAT);
	spill_close(&sp);
}

/* Item 5: the file was cut short while the daemon was down. */
static void test_truncated_file(void **state)
{
	struct spill sp;
	struct found f = {0};

	(void)state;
	open_sp(&sp);
	for (uint32_t e = 0; e < 8; e++)
		put_page(&sp, e, 0x40 + e, 0, 1);
	assert_int_equal(ftruncate(sp.fd_meta, (off_t)spill_data_off(&sp, 3)), 0);
	spill_close(&sp);
	open_sp(&sp);
	assert_int_equal(spill_scan(&sp, collect, &f), 3);
	assert_int_equal(sp.n_gone, 5);
	for (int i = 0; i < f.n; i++)
		assert_true(f.extent[i] < 3);
	/* The extents past the end are free again. */
	assert_int_equal(sp.n_used, 3);
	spill_close(&sp);
}

static void test_forget(void **state)
{
	struct spill sp;
	struct found f = {0};

	(void)state;
	open_sp(&sp);
	put_page(&sp, 0, 0x50, 0, 1);
	put_page(&sp, 1, 0x51, 0, 1);
	assert_int_equal(spill_scan(&sp, collect, &f), 2);
	assert_int_equal(spill_forget(&sp, (const uint32_t[]){0}, 1), 0);
	spill_close(&sp);
	open_sp(&sp);
	memset(&f, 0, sizeof(f));
	assert_int_equal(spill_scan(&sp, collect, &f), 1);
	assert_int_equal(f.extent[0], 1);
	spill_close(&sp);
}

static void test_prealloc(void **state)
{
	struct spill sp;
	struct found f = {0};
	struct stat st;
	uint32_t e, from, n;
	int ret;

	(void)state;
	open_sp(&sp);
	if (!sp.direct) {
		/* Without O_DIRECT writes are not serialised: none is due. */
		assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
		spill_close(&sp);
		skip();
	}
	/* A fresh file: due at once, the whole of this small file. */
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 1);
	assert_int_equal(from, 0);
	assert_int_equal(n, CAP);
	ret = spill_prealloc_run(&sp, from, n);
	spill_prealloc_done(&sp, from, n, ret);
	if (ret == -EOPNOTSUPP) {
		assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0); /* never again */
		spill_close(&sp);
		skip();
	}
	assert_int_equal(ret, 0);
	assert_true(spill_preallocated(&sp, CAP - 1));
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
	/* Its size and its blocks, before any byte of data is written. */
	assert_int_equal(fstat(sp.fd_data, &st), 0);
	assert_true((uint64_t)st.st_size >= spill_data_off(&sp, CAP));
	assert_true((uint64_t)st.st_blocks * 512u >= (uint64_t)CAP * PAGE);
	assert_int_equal(spill_alloc(&sp, &e), 0);
	assert_int_equal(e, 0);
	assert_int_equal(spill_alloc(&sp, &e), 0);
	assert_int_equal(e, 1);
	put_page(&sp, 0, 0x70, 0, 1);
	put_page(&sp, 1, 0x71, 0, 1);
	spill_close(&sp);
	/* A restart finds the two pages, none in the blocks ahead. */
	open_sp(&sp);
	assert_int_equal(spill_scan(&sp, collect, &f), 2);
	assert_int_equal(sp.n_gone, 0);
	assert_int_equal(f.extent[0] + f.extent[1], 1);
	spill_close(&sp);
}

/* When an allocation ahead is due and what it covers, in a file of ten
 * windows (sparse: the allocations are told done, not made): a window
 * at first; again once only half of one is left past the highest extent;
 * for a burst, the extents it wants past the free ones and a window more,
 * at most eight windows; after a failure, not again until a window's
 * worth of extents was handed out, then again. */
static void test_prealloc_due(void **state)
{
	const uint32_t win = (uint32_t)(SPILL_PREALLOC_BYTES / PAGE), cap = 10 * win;
	struct spill sp;
	uint32_t e, from, n;
	char why[256];

	(void)state;
	assert_int_equal(
		spill_open(&sp, dir, UID, "m", &tiny, root, (uint64_t)cap * PAGE, why, sizeof(why)),
		0);
	if (!sp.direct) {
		spill_close(&sp);
		skip();
	}
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 1);
	assert_int_equal(from, 0);
	assert_int_equal(n, win);
	spill_prealloc_start(&sp, from, n);
	assert_true(spill_preallocated(&sp, win - 1)); /* counted while it runs */
	assert_false(spill_preallocated(&sp, win));
	spill_prealloc_done(&sp, from, n, 0);
	assert_true(spill_preallocated(&sp, win - 1));
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
	for (uint32_t i = 0; i < win / 2; i++)
		assert_int_equal(spill_alloc(&sp, &e), 0);
	/* Half a window left: the next one, up to a window past hwm. */
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 1);
	assert_int_equal(from, win);
	assert_int_equal(n, win / 2);
	/* A burst of three windows: up to four past hwm. */
	assert_int_equal(spill_prealloc_due(&sp, 3 * win, &from, &n), 1);
	assert_int_equal(from, win);
	assert_int_equal(n, win / 2 + 3 * win);
	/* Free extents are written first: a burst they cover wants none. */
	for (uint32_t x = 0; x < 8; x++)
		spill_free(&sp, x);
	assert_int_equal(spill_prealloc_due(&sp, 8, &from, &n), 1);
	assert_int_equal(n, win / 2); /* as for no burst */
	/* At most eight windows wanted (and one more). */
	assert_int_equal(spill_prealloc_due(&sp, 100 * win, &from, &n), 1);
	assert_int_equal(from + n, sp.hwm + 9 * win);
	/* A failure: not due for a window's worth of extents, then again. */
	spill_prealloc_done(&sp, from, n, -ENOSPC);
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
	while (sp.n_free) /* the freed ones first: hwm stays */
		assert_int_equal(spill_alloc(&sp, &e), 0);
	for (uint32_t i = 0; i < win; i++) {
		assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
		assert_int_equal(spill_alloc(&sp, &e), 0);
	}
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 1);
	assert_int_equal(from, sp.hwm);
	/* A file system that cannot: never again. */
	spill_prealloc_done(&sp, from, n, -EOPNOTSUPP);
	assert_int_equal(spill_prealloc_due(&sp, 0, &from, &n), 0);
	spill_close(&sp);
}

static int exists(const char *name)
{
	char path[256];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return stat(path, &st) == 0;
}

static void write_file(const char *name, size_t n, int c)
{
	char path[256], *buf = malloc(n ? n : 1);
	int fd;

	assert_non_null(buf);
	memset(buf, c, n);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, n), (ssize_t)n);
	close(fd);
	free(buf);
}

/* Item 6: junk is reclaimed at start, warm-restart data is kept. */
static void test_reclaim(void **state)
{
	const XXH128_hash_t empty_root = {.low64 = 7, .high64 = 8},
			    junk_root = {.low64 = 9, .high64 = 10},
			    held_root = {.low64 = 11, .high64 = 12};
	char keep[96], empty[96], junk[96], held[96], path[256], why[256];
	struct spill sp, sp_empty;
	uint64_t bytes;
	uint32_t files;
	int fd;

	(void)state;
	/* The warm restart of a pool not open yet: one page. */
	open_sp(&sp);
	put_page(&sp, 2, 0x60, 0, 1);
	spill_file_name(UID, root, keep, sizeof(keep));
	spill_close(&sp);
	/* A pool that never spilled a page. */
	assert_int_equal(spill_open(&sp_empty, dir, UID, "e", &tiny, empty_root,
				    (uint64_t)CAP * PAGE, why, sizeof(why)),
			 0);
	spill_file_name(UID, empty_root, empty, sizeof(empty));
	spill_close(&sp_empty);
	/* Named like a spill file, no header: junk of 64 KiB. */
	spill_file_name(UID, junk_root, junk, sizeof(junk));
	write_file(junk, 65536, 0xa5);
	/* Junk too, but another process holds it. */
	spill_file_name(UID, held_root, held, sizeof(held));
	write_file(held, 4096, 0);
	snprintf(path, sizeof(path), "%s/%s", dir, held);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX), 0);
	/* Not named like one. */
	write_file("notes.kvs", 4096, 0);
	write_file("spill-1000-00.kvs", 4096, 0);

	assert_int_equal(spill_reclaim(dir, &bytes, &files), 0);
	assert_int_equal(files, 2);
	assert_true(bytes >= 65536);
	assert_true(exists(keep));
	assert_false(exists(empty));
	assert_false(exists(junk));
	assert_true(exists(held));
	assert_true(exists("notes.kvs"));
	assert_true(exists("spill-1000-00.kvs"));
	close(fd);
	/* The kept file still opens with its page. */
	{
		struct found f = {0};

		open_sp(&sp);
		assert_int_equal(spill_scan(&sp, collect, &f), 1);
		spill_close(&sp);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stamp_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_set_used, setup, teardown),
		cmocka_unit_test_setup_teardown(test_format2_still_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncated_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_forget, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prealloc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prealloc_due, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reclaim, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
