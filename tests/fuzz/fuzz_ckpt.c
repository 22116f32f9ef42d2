/* tests/fuzz/fuzz_ckpt.c — fuzz target: a checkpoint file through the
 * reader of daemon/store/ckpt.h.
 *
 * Byte 0 of the input holds flags (FUZZ_CKPT_* in fuzz.h); the rest is
 * written as the file "c" of a private temporary directory, then read as
 * the daemon reads one: ckpt_open, ckpt_read_pages into malloc'd pages
 * sized by the verified meta (at most FUZZ_CKPT_MAX_PAGE_BYTES in all),
 * ckpt_close, and ckpt_list over the directory. With FUZZ_CKPT_REPAIR the
 * checksums are recomputed first, wherever the header's own offsets say
 * they lie, so mutations of counts, offsets, layout and token records are
 * not all stopped by the first checksum.
 *
 * Aborts (a finding) when the reader breaks its contract: an error other
 * than those ckpt.h lists, a reason left empty, an accepted meta that
 * disagrees with itself or the file's size, a second ckpt_read_pages
 * that is not -EINVAL, or ckpt_list refusing a file ckpt_open accepted
 * (or describing it differently). Memory errors are the sanitizers'.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt.h"
#include "fuzz.h"

#define FUZZ_CKPT_MAX_PAGE_BYTES (64u << 20)

static struct {
	int ready;
	char dir[64];
	int dir_fd;
} st;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz_ckpt: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

static void teardown(void)
{
	if (!st.ready)
		return;
	unlinkat(st.dir_fd, "c", 0);
	close(st.dir_fd);
	rmdir(st.dir);
	st.ready = 0;
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(st.dir, sizeof(st.dir), "%.40s/kvp-fuzz-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(st.dir))
		die("mkdtemp %s: %s", st.dir, strerror(errno));
	st.dir_fd = open(st.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st.dir_fd < 0)
		die("open %s: %s", st.dir, strerror(errno));
	st.ready = 1;
	atexit(teardown);
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* Recomputes the checksums of a file of n bytes in b where its header
 * says they are (offsets of ckpt.h), checking every offset against n. */
static void repair(unsigned char *b, size_t n)
{
	uint64_t tokens_bytes, pages_off, sums_off, trailer_off, page_bytes, n_pages, span;

	if (n < 512)
		return;
	tokens_bytes = get64(b + 104);
	if (tokens_bytes <= n - 512)
		put64(b + 112, XXH3_64bits(b + 512, tokens_bytes));
	/* Format 4: the key span records after the tokens (32 bytes each). */
	{
		uint64_t n_spans = b[376] | (uint32_t)b[377] << 8 | (uint32_t)b[378] << 16 |
				   (uint32_t)b[379] << 24;

		if (b[8] >= 4 && n_spans && tokens_bytes <= n - 512 &&
		    32 * n_spans <= n - 512 - tokens_bytes)
			put64(b + 384, XXH3_64bits(b + 512 + tokens_bytes, 32 * n_spans));
	}
	put64(b + 16, 0);
	put64(b + 16, XXH3_64bits(b, 512));
	n_pages = b[28] | (uint32_t)b[29] << 8 | (uint32_t)b[30] << 16 | (uint32_t)b[31] << 24;
	page_bytes = get64(b + 48);
	pages_off = get64(b + 120);
	sums_off = get64(b + 128);
	trailer_off = get64(b + 136);
	if (n_pages && page_bytes && n_pages <= n && page_bytes <= n &&
	    !__builtin_mul_overflow(n_pages, page_bytes, &span) && pages_off <= n &&
	    span <= n - pages_off && sums_off <= n && 8 * n_pages <= n - sums_off)
		for (uint64_t i = 0; i < n_pages; i++)
			put64(b + sums_off + 8 * i,
			      XXH3_64bits(b + pages_off + i * page_bytes, page_bytes));
	if (trailer_off <= n && 32 <= n - trailer_off) {
		XXH128_canonical_t c;

		XXH128_canonicalFromHash(&c, XXH3_128bits(b, trailer_off));
		memcpy(b + trailer_off + 16, c.digest, sizeof(c.digest));
	}
}

static int known_error(int err)
{
	return err == -EBADMSG || err == -EPROTONOSUPPORT || err == -ENOMEM || err == -EIO;
}

static int same_meta(const struct ckpt_meta *a, const struct ckpt_meta *b)
{
	return a->version == b->version && a->uid == b->uid && !strcmp(a->model_id, b->model_id) &&
	       !memcmp(&a->layout, &b->layout, sizeof(a->layout)) &&
	       a->page_bytes == b->page_bytes && XXH128_isEqual(a->root, b->root) &&
	       a->n_tokens == b->n_tokens && a->n_pages == b->n_pages &&
	       a->created_ns == b->created_ns && a->file_bytes == b->file_bytes;
}

struct listed {
	int n;
	int err;
	struct ckpt_meta meta;
};

static int on_entry(const char *name, const struct ckpt_meta *m, int err, const char *why,
		    void *arg)
{
	struct listed *l = arg;

	if (strcmp(name, "c"))
		die("ckpt_list: unexpected entry '%s'", name);
	if (m ? err != 0 : err >= 0 || !why || !*why)
		die("ckpt_list: meta %p with error %d and reason '%s'", (const void *)m, err,
		    why ? why : "(null)");
	l->n++;
	l->err = err;
	if (m)
		l->meta = *m;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckpt_reader r;
	struct listed listed = {0};
	struct ckpt_meta meta = {0};
	unsigned char *file;
	size_t n;
	char why[256];
	int fd, ret, opened;

	if (!st.ready)
		setup();
	if (size < 1)
		return 0;
	n = size - 1;
	file = malloc(n ? n : 1);
	if (!file)
		die("out of memory");
	memcpy(file, data + 1, n);
	if (data[0] & FUZZ_CKPT_REPAIR)
		repair(file, n);
	fd = openat(st.dir_fd, "c", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || (n && write(fd, file, n) != (ssize_t)n))
		die("writing the file: %s", strerror(errno));
	close(fd);

	why[0] = '\0';
	ret = ckpt_open(st.dir_fd, "c", &r, why, sizeof(why));
	opened = ret == 0;
	if (ret < 0 && (!known_error(ret) || !why[0]))
		die("ckpt_open: error %d, reason '%s'", ret, why);
	if (opened) {
		const struct ckpt_meta *m = &meta;
		uint64_t bt;
		void **dst = NULL;
		uint32_t got = 0;

		meta = r.meta;
		bt = m->layout.block_tokens;

		if (m->file_bytes != n || !bt || m->n_pages != (m->n_tokens + bt - 1) / bt ||
		    (m->n_tokens && !r.tokens) || m->page_bytes != shm_page_bytes(&m->layout) ||
		    (uint64_t)m->n_pages * m->page_bytes > n)
			die("ckpt_open accepted an inconsistent meta");
		if ((uint64_t)m->n_pages * m->page_bytes <= FUZZ_CKPT_MAX_PAGE_BYTES) {
			dst = calloc(m->n_pages ? m->n_pages : 1, sizeof(*dst));
			if (!dst)
				die("out of memory");
			for (got = 0; got < m->n_pages; got++)
				if (!(dst[got] = malloc(m->page_bytes)))
					die("out of memory");
			why[0] = '\0';
			ret = ckpt_read_pages(&r, dst, why, sizeof(why));
			if (ret < 0 && (!known_error(ret) || !why[0]))
				die("ckpt_read_pages: error %d, reason '%s'", ret, why);
			if (ckpt_read_pages(&r, dst, NULL, 0) != -EINVAL)
				die("a second ckpt_read_pages was not refused");
			for (uint32_t i = 0; i < got; i++)
				free(dst[i]);
			free(dst);
		}
		ckpt_close(&r);
	}
	ckpt_close(&r); /* twice: allowed */

	ret = ckpt_list(st.dir_fd, on_entry, &listed);
	if (ret != 0 || listed.n != 1)
		die("ckpt_list returned %d after %d entries", ret, listed.n);
	if (opened && (listed.err || !same_meta(&listed.meta, &meta)))
		die("ckpt_list refused (%d) or misread a file ckpt_open accepted", listed.err);
	free(file);
	return 0;
}
