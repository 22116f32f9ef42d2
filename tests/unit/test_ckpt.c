/* tests/unit/test_ckpt.c — the checkpoint file of daemon/store/ckpt.h.
 *
 * A checkpoint must come back byte for byte or not at all. Round trips
 * with real layouts (a partial last page, a quantized layout, an empty
 * session) compare every meta field, token record and page byte; the
 * on-disk format is checked against its documentation in ckpt.h, offset by
 * offset and checksum by checksum, so a change to it cannot go unnoticed.
 * Every kind of damage is refused with -EBADMSG and a reason naming it: a
 * flipped byte in the header, the token records, the padding, a page, the
 * page checksums and the trailer; truncation at many offsets; trailing
 * bytes. A newer version is -EPROTONOSUPPORT; a header whose counts are
 * huge but self-consistent (checksum recomputed) is refused in a child
 * whose data segment could not hold them. Writes replace a name whole:
 * overwrite, a write failing with EFBIG (RLIMIT_FSIZE) or at the rename
 * leaves the previous checkpoint intact and no temporary behind. Listing
 * skips temporaries and reports what it cannot parse; the start-up cleanup
 * removes a crashed writer's temporary and nothing else. A file names the
 * checkpoint it holds and is refused under another name; a directory
 * created on the way to a file has its parent fsynced. Each test has its
 * own mkdtemp directory. Single-threaded.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ckpt.h"

/* 2 layers, 2 KV heads, head_dim 64, 16 tokens per page, f16: 16 KiB pages. */
static const struct shm_layout lay = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = 16,
	.dtype = SHM_DTYPE_F16,
	.quant_group = 0,
};

/* int4 with per-32 scales: a page whose data is not a multiple of 4096. */
static const struct shm_layout lay_int4 = {
	.n_layers = 3,
	.n_kv_heads = 1,
	.head_dim = 96,
	.block_tokens = 8,
	.dtype = SHM_DTYPE_INT4,
	.quant_group = 32,
};

/* The latent format (MLA) with raw fp8: one plane, f32 scales per layer. */
static const struct shm_layout lay_latent = {
	.n_layers = 3,
	.n_kv_heads = 1,
	.head_dim = 576,
	.block_tokens = 8,
	.dtype = SHM_DTYPE_E4M3_RAW,
	.format = SHM_FORMAT_LATENT,
};

struct dir {
	char path[64];
	int fd;
};

static int setup(void **state)
{
	struct dir *d = calloc(1, sizeof(*d));

	assert_non_null(d);
	strcpy(d->path, "/tmp/test_ckpt.XXXXXX");
	assert_non_null(mkdtemp(d->path));
	d->fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(d->fd >= 0);
	*state = d;
	return 0;
}

/* Removes everything in the directory (files, and directories one level
 * deep that tests made), then the directory. */
static int teardown(void **state)
{
	struct dir *d = *state;
	DIR *ds = opendir(d->path);
	struct dirent *de;

	assert_non_null(ds);
	while ((de = readdir(ds))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (unlinkat(d->fd, de->d_name, 0) < 0)
			assert_int_equal(unlinkat(d->fd, de->d_name, AT_REMOVEDIR), 0);
	}
	closedir(ds);
	close(d->fd);
	assert_int_equal(rmdir(d->path), 0);
	free(d);
	return 0;
}

/* Entries of the directory other than "." and "..". */
static int n_entries(const struct dir *d)
{
	DIR *ds = opendir(d->path);
	struct dirent *de;
	int n = 0;

	assert_non_null(ds);
	while ((de = readdir(ds)))
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	closedir(ds);
	return n;
}

/* ---- sample sessions -------------------------------------------------------- */

struct sample {
	struct ckpt_meta m;
	struct ckpt_token *tokens; /* [n_tokens] */
	void **pages;		   /* [n_pages] → [page_bytes] */
};

static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void sample_make(struct sample *s, const struct shm_layout *l, uint64_t n_tokens,
			uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull | 1;

	memset(s, 0, sizeof(*s));
	s->m.uid = 1000 + (uint32_t)seed;
	snprintf(s->m.model_id, sizeof(s->m.model_id), "test-model-%llu", (unsigned long long)seed);
	s->m.layout = *l;
	s->m.page_bytes = shm_page_bytes(l);
	s->m.root = (XXH128_hash_t){.low64 = next(&x), .high64 = next(&x)};
	s->m.n_tokens = n_tokens;
	s->m.n_pages = (uint32_t)((n_tokens + l->block_tokens - 1) / l->block_tokens);
	s->m.created_ns = 1700000000000000000ull + seed;
	s->tokens = calloc(n_tokens ? n_tokens : 1, sizeof(*s->tokens));
	s->pages = calloc(s->m.n_pages ? s->m.n_pages : 1, sizeof(*s->pages));
	assert_non_null(s->tokens);
	assert_non_null(s->pages);
	for (uint64_t i = 0; i < n_tokens; i++) {
		s->tokens[i] = (struct ckpt_token){
			.id = (uint32_t)next(&x),
			.pos = (uint32_t)i,
			.turn = (uint32_t)(i / 10),
			.role = (uint16_t)(i % 4),
			.flags = (uint16_t)(i % 3 == 0),
		};
	}
	for (uint32_t p = 0; p < s->m.n_pages; p++) {
		uint64_t *w = malloc(s->m.page_bytes);

		assert_non_null(w);
		for (uint64_t i = 0; i < s->m.page_bytes / 8; i++)
			w[i] = next(&x);
		s->pages[p] = w;
	}
}

static void sample_free(struct sample *s)
{
	for (uint32_t p = 0; p < s->m.n_pages; p++)
		free(s->pages[p]);
	free(s->pages);
	free(s->tokens);
}

static void **pages_alloc(const struct ckpt_meta *m)
{
	void **dst = calloc(m->n_pages ? m->n_pages : 1, sizeof(*dst));

	assert_non_null(dst);
	for (uint32_t p = 0; p < m->n_pages; p++) {
		dst[p] = calloc(1, m->page_bytes);
		assert_non_null(dst[p]);
	}
	return dst;
}

static void pages_free(const struct ckpt_meta *m, void **dst)
{
	for (uint32_t p = 0; p < m->n_pages; p++)
		free(dst[p]);
	free(dst);
}

static void write_ok(const struct dir *d, const char *name, const struct sample *s)
{
	char why[256] = "";
	uint64_t bytes = 0;
	struct stat st;
	int ret = ckpt_write(d->fd, name, &s->m, s->tokens, (const void *const *)s->pages, &bytes,
			     why, sizeof(why));

	if (ret)
		fail_msg("ckpt_write(%s): %d %s", name, ret, why);
	assert_int_equal(fstatat(d->fd, name, &st, 0), 0);
	assert_int_equal(bytes, (uint64_t)st.st_size);
	assert_int_equal(st.st_mode & 0777, 0600);
}

/* Opens name, reads its pages, and checks that everything equals s. */
static void expect_same(const struct dir *d, const char *name, const struct sample *s)
{
	struct ckpt_reader r;
	char why[256] = "";
	void **dst;
	int ret = ckpt_open(d->fd, name, &r, why, sizeof(why));

	if (ret)
		fail_msg("ckpt_open(%s): %d %s", name, ret, why);
	assert_int_equal(r.meta.version, CKPT_FORMAT_VERSION);
	assert_int_equal(r.meta.uid, s->m.uid);
	assert_string_equal(r.meta.model_id, s->m.model_id);
	assert_memory_equal(&r.meta.layout, &s->m.layout, sizeof(s->m.layout));
	assert_int_equal(r.meta.page_bytes, s->m.page_bytes);
	assert_true(XXH128_isEqual(r.meta.root, s->m.root));
	assert_int_equal(r.meta.n_tokens, s->m.n_tokens);
	assert_int_equal(r.meta.n_pages, s->m.n_pages);
	assert_int_equal(r.meta.created_ns, s->m.created_ns);
	if (s->m.n_tokens)
		assert_memory_equal(r.tokens, s->tokens, s->m.n_tokens * sizeof(*s->tokens));
	else
		assert_null(r.tokens);
	dst = pages_alloc(&r.meta);
	ret = ckpt_read_pages(&r, dst, why, sizeof(why));
	if (ret)
		fail_msg("ckpt_read_pages(%s): %d %s", name, ret, why);
	for (uint32_t p = 0; p < s->m.n_pages; p++)
		assert_memory_equal(dst[p], s->pages[p], s->m.page_bytes);
	/* Once per reader. */
	assert_int_equal(ckpt_read_pages(&r, dst, why, sizeof(why)), -EINVAL);
	pages_free(&r.meta, dst);
	ckpt_close(&r);
	ckpt_close(&r); /* idempotent */
}

/* Opens name and reads its pages; expects err from one of the two steps,
 * with needle in the reason. */
static void expect_refused(const struct dir *d, const char *name, int err, const char *needle)
{
	struct ckpt_reader r;
	char why[256] = "";
	int ret = ckpt_open(d->fd, name, &r, why, sizeof(why));

	if (ret == 0) {
		void **dst = pages_alloc(&r.meta);

		ret = ckpt_read_pages(&r, dst, why, sizeof(why));
		pages_free(&r.meta, dst);
	}
	ckpt_close(&r);
	if (ret != err || !strstr(why, needle))
		fail_msg("%s: got %d \"%s\", want %d \"...%s...\"", name, ret, why, err, needle);
}

/* ---- raw file helpers ------------------------------------------------------- */

static unsigned char *slurp(const struct dir *d, const char *name, size_t *ret_len)
{
	int fd = openat(d->fd, name, O_RDONLY | O_CLOEXEC);
	struct stat st;
	unsigned char *b;

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	b = malloc((size_t)st.st_size + 1);
	assert_non_null(b);
	assert_int_equal(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
	close(fd);
	*ret_len = (size_t)st.st_size;
	return b;
}

static void spit(const struct dir *d, const char *name, const void *b, size_t len)
{
	int fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, b, len), (ssize_t)len);
	close(fd);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void set32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void set64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* Recomputes the header checksum of b as ckpt.h documents it. */
static void reseal_header(unsigned char *b)
{
	memset(b + 16, 0, 8);
	set64(b + 16, XXH3_64bits(b, 512));
}

/* ---- tests ------------------------------------------------------------------ */

static void reseal_trailer(unsigned char *b, size_t len);

/* Version 4's key spans: written and read back; a file without spans is
 * a version 3 file but for the version (still read as 3); spans a reader
 * cannot trust (overlapping, past the tokens, a flipped byte) are
 * refused; a version 3 file claiming spans is refused. */
static void test_key_spans(void **state)
{
	struct dir *d = *state;
	struct ckpt_span sp[2] = {{3, 5, {1, 2}}, {8, 30, {3, 4}}};
	struct ckpt_reader r;
	struct sample s;
	char why[256] = "";
	unsigned char *b;
	size_t len;

	sample_make(&s, &lay, 40, 21);
	s.m.spans = sp;
	s.m.n_spans = 2;
	write_ok(d, "spans", &s);
	assert_int_equal(ckpt_open(d->fd, "spans", &r, why, sizeof(why)), 0);
	assert_int_equal(r.meta.version, 4);
	assert_int_equal(r.meta.n_spans, 2);
	assert_int_equal(r.meta.spans[1].first_token, 8);
	assert_int_equal(r.meta.spans[1].n_tokens, 30);
	assert_int_equal(r.meta.spans[1].key.low64, 3);
	assert_int_equal(r.meta.spans[1].key.high64, 4);
	assert_int_equal(ckpt_read_pages(&r, NULL, why, sizeof(why)), 0);
	ckpt_close(&r);

	/* A byte of a span record flipped: its checksum says so. */
	b = slurp(d, "spans", &len);
	b[512 + 16 * 40 + 3] ^= 1;
	spit(d, "spans", b, len);
	expect_refused(d, "spans", -EBADMSG, "key span records checksum");
	free(b);

	/* Spans the writer refuses: overlapping, past the tokens. */
	sp[1].first_token = 7;
	assert_int_equal(ckpt_write(d->fd, "bad", &s.m, s.tokens, (const void *const *)s.pages,
				    NULL, why, sizeof(why)),
			 -EINVAL);
	sp[1].first_token = 8;
	sp[1].n_tokens = 33;
	assert_int_equal(ckpt_write(d->fd, "bad", &s.m, s.tokens, (const void *const *)s.pages,
				    NULL, why, sizeof(why)),
			 -EINVAL);
	sp[1].n_tokens = 30;

	/* Without spans, a version 4 file read as version 3 is one. */
	s.m.spans = NULL;
	s.m.n_spans = 0;
	write_ok(d, "nospans", &s);
	b = slurp(d, "nospans", &len);
	set32(b + 8, 3);
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "nospans", b, len);
	assert_int_equal(ckpt_open(d->fd, "nospans", &r, why, sizeof(why)), 0);
	assert_int_equal(r.meta.version, 3);
	assert_int_equal(r.meta.n_spans, 0);
	assert_int_equal(ckpt_read_pages(&r, NULL, why, sizeof(why)), 0);
	ckpt_close(&r);
	/* A version 3 header with a span count: reserved bytes. */
	set32(b + 376, 1);
	reseal_header(b);
	spit(d, "nospans", b, len);
	expect_refused(d, "nospans", -EBADMSG, "reserved");
	free(b);
	sample_free(&s);
}

static void test_names(void **state)
{
	static const char *const good[] = {
		"a",
		"Z",
		"0",
		"_x",
		"session-1",
		"chat.v2",
		"a..b",
		"x.tmp",
		"a-",
		"1234567890123456789012345678901234567890123456789012345678901234", /* 64 */
	};
	static const char *const bad[] = {
		"",
		".",
		"..",
		".hidden",
		".tmp-a-0123456789abcdef",
		"-rf",
		"a/b",
		"../a",
		"a b",
		"a\n",
		"é",
		"a*",
		"12345678901234567890123456789012345678901234567890123456789012345",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!ckpt_name_valid(good[i]))
			fail_msg("\"%s\" should be valid", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (ckpt_name_valid(bad[i]))
			fail_msg("\"%s\" should be invalid", bad[i]);
	assert_false(ckpt_name_valid(NULL));
}

static void test_round_trip(void **state)
{
	struct dir *d = *state;
	struct sample s;

	/* 53 tokens: three full pages and a partial fourth. */
	sample_make(&s, &lay, 3 * 16 + 5, 1);
	assert_int_equal(s.m.page_bytes, 16384);
	assert_int_equal(s.m.n_pages, 4);
	write_ok(d, "sess", &s);
	expect_same(d, "sess", &s);
	assert_int_equal(n_entries(d), 1); /* no temporary left */
	sample_free(&s);
}

static void test_round_trip_other_shapes(void **state)
{
	struct dir *d = *state;
	struct sample q, e, one, full;
	struct ckpt_reader r;
	char why[256];

	sample_make(&q, &lay_int4, 8 * 7 + 1, 2); /* quantized, 8 pages */
	assert_int_equal(shm_layout_check(&lay_int4), 0);
	write_ok(d, "int4", &q);
	expect_same(d, "int4", &q);

	sample_make(&e, &lay, 0, 3); /* an empty session */
	write_ok(d, "empty", &e);
	expect_same(d, "empty", &e);
	assert_int_equal(ckpt_open(d->fd, "empty", &r, why, sizeof(why)), 0);
	assert_int_equal(ckpt_read_pages(&r, NULL, why, sizeof(why)), 0);
	ckpt_close(&r);

	sample_make(&one, &lay, 1, 4); /* one token */
	write_ok(d, "one", &one);
	expect_same(d, "one", &one);

	/* 4096 - 512 bytes of tokens: pages start right at 4096, no padding. */
	sample_make(&full, &lay, (4096 - 512) / 16, 5);
	write_ok(d, "full", &full);
	expect_same(d, "full", &full);

	sample_free(&q);
	sample_free(&e);
	sample_free(&one);
	sample_free(&full);
}

/* The page format is recorded at byte 392 and read back; a file that says
 * K/V there (0, as every file before the field) is another layout, and
 * its page size then disagrees. */
static void test_round_trip_latent(void **state)
{
	struct dir *d = *state;
	struct sample s;
	unsigned char h[512];
	int fd;

	sample_make(&s, &lay_latent, 8 * 2 + 3, 6);
	assert_int_equal(shm_layout_check(&lay_latent), 0);
	assert_int_equal(s.m.page_bytes, shm_page_bytes(&lay_latent));
	write_ok(d, "latent", &s);
	expect_same(d, "latent", &s);
	fd = openat(d->fd, "latent", O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	close(fd);
	assert_int_equal(h[392], SHM_FORMAT_LATENT);
	assert_int_equal(h[393] | h[394] | h[395], 0);
	sample_free(&s);
}

/* The bytes on disk are what ckpt.h says they are. */
static void test_format_as_documented(void **state)
{
	struct dir *d = *state;
	struct sample s;
	unsigned char hdr[512];
	XXH128_canonical_t c;
	uint64_t pages_off, sums_off, trailer_off;
	size_t len;
	unsigned char *b;

	sample_make(&s, &lay, 3 * 16 + 5, 6);
	write_ok(d, "fmt", &s);
	b = slurp(d, "fmt", &len);

	assert_memory_equal(b, "KVPCKPT\0", 8);
	assert_int_equal(le32(b + 8), 4);
	assert_int_equal(le32(b + 12), 512);
	memcpy(hdr, b, 512);
	memset(hdr + 16, 0, 8);
	assert_int_equal(le64(b + 16), XXH3_64bits(hdr, 512));
	assert_int_equal(le32(b + 24), s.m.uid);
	assert_int_equal(le32(b + 28), 4);
	assert_int_equal(le64(b + 32), 53);
	assert_int_equal(le64(b + 40), s.m.created_ns);
	assert_int_equal(le64(b + 48), 16384);
	assert_int_equal(le32(b + 56), 2);
	assert_int_equal(le32(b + 60), 2);
	assert_int_equal(le32(b + 64), 64);
	assert_int_equal(le32(b + 68), 16);
	assert_int_equal(le32(b + 72), SHM_DTYPE_F16);
	assert_int_equal(le32(b + 76), 0);
	XXH128_canonicalFromHash(&c, s.m.root);
	assert_memory_equal(b + 80, c.digest, 16);
	assert_int_equal(le64(b + 96), 512);
	assert_int_equal(le64(b + 104), 53 * 16);
	assert_int_equal(le64(b + 112), XXH3_64bits(b + 512, 53 * 16));
	pages_off = le64(b + 120);
	sums_off = le64(b + 128);
	trailer_off = le64(b + 136);
	assert_int_equal(pages_off, 4096);
	assert_int_equal(sums_off, pages_off + 4 * 16384);
	assert_int_equal(trailer_off, sums_off + 4 * 8);
	assert_int_equal(le64(b + 144), trailer_off + 32);
	assert_int_equal(len, trailer_off + 32);
	assert_string_equal((const char *)b + 152, s.m.model_id);
	for (size_t i = 152 + strlen(s.m.model_id); i < 280; i++)
		assert_int_equal(b[i], 0);
	/* The pool layout: pages stored as they are, the same. */
	for (size_t i = 0; i < 6; i++)
		assert_int_equal(le32(b + 280 + 4 * i), le32(b + 56 + 4 * i));
	/* The name it was written under, NUL-padded to 72 bytes. */
	assert_string_equal((const char *)b + 304, "fmt");
	for (size_t i = 304 + 3; i < 512; i++)
		assert_int_equal(b[i], 0);

	/* Token records, little-endian. */
	for (uint64_t i = 0; i < 53; i++) {
		const unsigned char *t = b + 512 + 16 * i;

		assert_int_equal(le32(t), s.tokens[i].id);
		assert_int_equal(le32(t + 4), s.tokens[i].pos);
		assert_int_equal(le32(t + 8), s.tokens[i].turn);
		assert_int_equal(t[12] | t[13] << 8, s.tokens[i].role);
		assert_int_equal(t[14] | t[15] << 8, s.tokens[i].flags);
	}
	for (uint64_t i = 512 + 53 * 16; i < pages_off; i++)
		assert_int_equal(b[i], 0);
	/* Pages 4096-aligned, each with its XXH3_64 in the table. */
	for (uint32_t p = 0; p < 4; p++) {
		assert_int_equal((pages_off + p * 16384ull) % 4096, 0);
		assert_memory_equal(b + pages_off + p * 16384ull, s.pages[p], 16384);
		assert_int_equal(le64(b + sums_off + 8 * p), XXH3_64bits(s.pages[p], 16384));
	}
	/* Trailer: magic, its own offset, XXH3_128 of everything before it. */
	assert_memory_equal(b + trailer_off, "KVPCEND\0", 8);
	assert_int_equal(le64(b + trailer_off + 8), trailer_off);
	XXH128_canonicalFromHash(&c, XXH3_128bits(b, trailer_off));
	assert_memory_equal(b + trailer_off + 16, c.digest, 16);

	free(b);
	sample_free(&s);
}

static void test_overwrite(void **state)
{
	struct dir *d = *state;
	struct sample a, b;

	sample_make(&a, &lay, 40, 7);
	sample_make(&b, &lay, 70, 8);
	write_ok(d, "name", &a);
	write_ok(d, "name", &b);
	expect_same(d, "name", &b);
	write_ok(d, "name", &a); /* and back to a shorter one */
	expect_same(d, "name", &a);
	assert_int_equal(n_entries(d), 1);
	sample_free(&a);
	sample_free(&b);
}

/* created_ns 0 is stamped with the current time. */
static void test_created_stamp(void **state)
{
	struct dir *d = *state;
	struct sample s;
	struct ckpt_reader r;
	struct timespec before, after;
	char why[256];

	sample_make(&s, &lay, 20, 9);
	s.m.created_ns = 0;
	clock_gettime(CLOCK_REALTIME, &before);
	write_ok(d, "t", &s);
	clock_gettime(CLOCK_REALTIME, &after);
	assert_int_equal(ckpt_open(d->fd, "t", &r, why, sizeof(why)), 0);
	assert_true(r.meta.created_ns >= (uint64_t)before.tv_sec * 1000000000u + before.tv_nsec);
	assert_true(r.meta.created_ns <= (uint64_t)after.tv_sec * 1000000000u + after.tv_nsec);
	ckpt_close(&r);
	sample_free(&s);
}

/* One flipped byte anywhere is refused, with a reason naming where. */
static void test_corruption(void **state)
{
	struct dir *d = *state;
	struct sample s;
	size_t len;
	unsigned char *orig, *b;
	uint64_t pages_off, sums_off, trailer_off;
	struct {
		const char *what;
		uint64_t off;
		const char *needle;
	} cases[9];
	int n = 0;

	sample_make(&s, &lay, 3 * 16 + 5, 10);
	write_ok(d, "c", &s);
	orig = slurp(d, "c", &len);
	pages_off = le64(orig + 120);
	sums_off = le64(orig + 128);
	trailer_off = le64(orig + 136);

	cases[n++] = (typeof(cases[0])){"header uid", 24, "header checksum"};
	cases[n++] = (typeof(cases[0])){"header model id", 160, "header checksum"};
	cases[n++] = (typeof(cases[0])){"header checksum", 17, "header checksum"};
	cases[n++] = (typeof(cases[0])){"token record", 512 + 16 * 7 + 2, "token records checksum"};
	cases[n++] = (typeof(cases[0])){"padding", 512 + 53 * 16 + 100, "padding"};
	cases[n++] = (typeof(cases[0])){"first page", pages_off + 5, "page 0 of 4: checksum"};
	cases[n++] = (typeof(cases[0])){"last page", sums_off - 1, "page 3 of 4: checksum"};
	cases[n++] = (typeof(cases[0])){"page checksum table", sums_off + 8 + 3,
					"page 1 of 4: checksum"};
	cases[n++] = (typeof(cases[0])){"trailer hash", trailer_off + 20, "whole-file checksum"};
	assert_int_equal(n, sizeof(cases) / sizeof(cases[0]));

	for (int i = 0; i < n; i++) {
		b = malloc(len);
		assert_non_null(b);
		memcpy(b, orig, len);
		b[cases[i].off] ^= 0x20;
		spit(d, "c", b, len);
		print_message("  %s\n", cases[i].what);
		expect_refused(d, "c", -EBADMSG, cases[i].needle);
		free(b);
	}

	/* The trailer's magic and offset are checked when opening. */
	b = malloc(len);
	assert_non_null(b);
	memcpy(b, orig, len);
	b[trailer_off + 1] ^= 1;
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "trailer: bad magic");
	memcpy(b, orig, len);
	b[trailer_off + 9] ^= 1;
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "trailer: bad magic or offset");

	/* Not a checkpoint at all. */
	memcpy(b, orig, len);
	b[0] = 'X';
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "bad magic");

	/* Damage with the header checksum recomputed is still refused. */
	memcpy(b, orig, len);
	b[80] ^= 1; /* root: the tokens and pages no longer hash to the trailer */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "whole-file checksum");
	memcpy(b, orig, len);
	b[400] = 1; /* reserved */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "reserved");
	memcpy(b, orig, len);
	b[152 + 100] = 'x'; /* after the model id's NUL */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "NUL-padded");
	memcpy(b, orig, len);
	set32(b + 72, 99); /* unknown dtype */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "layout");
	memcpy(b, orig, len);
	set64(b + 48, 8192); /* page_bytes */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "page size");
	memcpy(b, orig, len);
	set64(b + 120, 8192); /* pages_off */
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "offsets");
	memcpy(b, orig, len);
	b[512 + 16 * 2 + 12] = 9; /* role 9, token checksum recomputed */
	set64(b + 112, XXH3_64bits(b + 512, 53 * 16));
	reseal_header(b);
	spit(d, "c", b, len);
	expect_refused(d, "c", -EBADMSG, "token record 2: unknown role");

	/* The untouched file still reads. */
	spit(d, "c", orig, len);
	expect_same(d, "c", &s);
	free(b);
	free(orig);
	sample_free(&s);
}

static void test_truncated(void **state)
{
	struct dir *d = *state;
	struct sample s;
	size_t len;
	unsigned char *orig;
	uint64_t pages_off, sums_off, trailer_off;

	sample_make(&s, &lay, 3 * 16 + 5, 11);
	write_ok(d, "t", &s);
	orig = slurp(d, "t", &len);
	pages_off = le64(orig + 120);
	sums_off = le64(orig + 128);
	trailer_off = le64(orig + 136);
	{
		const uint64_t at[] = {
			0,
			1,
			100,
			511,
			512,
			512 + 16 * 20,
			pages_off - 1,
			pages_off,
			pages_off + 5000, /* mid-page */
			pages_off + 16384 * 3 + 1,
			sums_off,
			sums_off + 12,
			trailer_off,
			trailer_off + 16,
			len - 1,
		};

		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			print_message("  truncated to %llu of %zu bytes\n",
				      (unsigned long long)at[i], len);
			spit(d, "t", orig, at[i]);
			expect_refused(d, "t", -EBADMSG, "truncated");
		}
	}
	/* And one byte too many. */
	{
		unsigned char *b = calloc(1, len + 1);

		assert_non_null(b);
		memcpy(b, orig, len);
		spit(d, "t", b, len + 1);
		expect_refused(d, "t", -EBADMSG, "longer");
		free(b);
	}
	free(orig);
	sample_free(&s);
}

/* Recomputes the trailer's whole-file checksum of b (len bytes) as
 * ckpt.h documents it. */
static void reseal_trailer(unsigned char *b, size_t len)
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(b, len - 32));
	memcpy(b + len - 16, c.digest, 16);
}

/* A version 1 file (no pool layout: zeros there) is still read, its
 * pages as they are; a pool layout that is not the stored layout's shape
 * unquantized is refused. */
static void test_version_1_and_pool_layout(void **state)
{
	struct dir *d = *state;
	struct ckpt_reader r;
	struct sample s;
	char why[256] = "";
	unsigned char *b, *orig;
	size_t len;
	void **dst;

	sample_make(&s, &lay, 40, 11);
	write_ok(d, "v2", &s);
	orig = slurp(d, "v2", &len);
	b = malloc(len);
	assert_non_null(b);
	memcpy(b, orig, len);
	set32(b + 8, 1);
	memset(b + 280, 0, 24 + 72); /* no pool layout, no name */
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "v1", b, len);
	assert_int_equal(ckpt_open(d->fd, "v1", &r, why, sizeof(why)), 0);
	assert_int_equal(r.meta.version, 1);
	assert_string_equal(r.meta.name, "");
	assert_memory_equal(&r.meta.pool_layout, &s.m.layout, sizeof(s.m.layout));
	dst = pages_alloc(&r.meta);
	assert_int_equal(ckpt_read_pages(&r, dst, why, sizeof(why)), 0);
	for (uint32_t p = 0; p < s.m.n_pages; p++)
		assert_memory_equal(dst[p], s.pages[p], s.m.page_bytes);
	pages_free(&r.meta, dst);
	ckpt_close(&r);
	/* Version 1 with something in the pool layout's place: reserved. */
	set32(b + 280, 2);
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "v1", b, len);
	expect_refused(d, "v1", -EBADMSG, "reserved");
	/* Version 2 whose pool layout is another shape, or quantized. */
	memcpy(b, orig, len);
	set32(b + 280, 3); /* layers */
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "v2", b, len);
	expect_refused(d, "v2", -EBADMSG, "pool layout");
	memcpy(b, orig, len);
	set32(b + 280 + 16, SHM_DTYPE_INT8); /* dtype */
	set32(b + 280 + 20, 32);	     /* quant_group */
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "v2", b, len);
	expect_refused(d, "v2", -EBADMSG, "pool layout");
	free(b);
	free(orig);
	sample_free(&s);
}

/* Issue 13, item 16: checkpoint A's file copied over checkpoint B's name
 * made `restore B` serve A's content. The file records the name it was
 * written under and is refused under any other (listing included);
 * version 2 files, which record none, still open under their file's name
 * (ckpt.h), and so does a version 3 file read under its own name. */
static void test_name_recorded(void **state)
{
	struct dir *d = *state;
	struct ckpt_reader r;
	struct sample a;
	char why[256] = "";
	unsigned char *b;
	size_t len;
	void **dst;

	sample_make(&a, &lay, 40, 21);
	write_ok(d, "alpha", &a);
	b = slurp(d, "alpha", &len);
	spit(d, "beta", b, len); /* cp alpha beta */
	expect_refused(d, "beta", -EBADMSG, "holds checkpoint 'alpha', not 'beta'");
	assert_int_equal(ckpt_open(d->fd, "alpha", &r, why, sizeof(why)), 0);
	assert_string_equal(r.meta.name, "alpha");
	ckpt_close(&r);
	/* A name that is no valid name, or bytes after its NUL. */
	memcpy(b + 304, "../x", 4);
	reseal_header(b);
	spit(d, "gamma", b, len);
	expect_refused(d, "gamma", -EBADMSG, "not a valid name");
	memcpy(b + 304, "gamma\0z", 7);
	reseal_header(b);
	spit(d, "gamma", b, len);
	expect_refused(d, "gamma", -EBADMSG, "NUL-padded");
	/* The same file as version 2: no name recorded, taken as the file's. */
	set32(b + 8, 2);
	memset(b + 304, 0, 72);
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "beta", b, len);
	assert_int_equal(ckpt_open(d->fd, "beta", &r, why, sizeof(why)), 0);
	assert_int_equal(r.meta.version, 2);
	assert_string_equal(r.meta.name, "");
	dst = pages_alloc(&r.meta);
	assert_int_equal(ckpt_read_pages(&r, dst, why, sizeof(why)), 0);
	for (uint32_t p = 0; p < a.m.n_pages; p++)
		assert_memory_equal(dst[p], a.pages[p], a.m.page_bytes);
	pages_free(&r.meta, dst);
	ckpt_close(&r);
	/* A version 2 file with something in the name's place: reserved. */
	b[304] = 'x';
	reseal_header(b);
	reseal_trailer(b, len);
	spit(d, "beta", b, len);
	expect_refused(d, "beta", -EBADMSG, "reserved");
	free(b);
	sample_free(&a);
}

/* A page given no destination is read into a private buffer and checked
 * but not kept; a NULL dst checks every page (issue 13: restores share
 * indexed pages and only verify them in the file; listings verify). */
static void test_read_pages_check_only(void **state)
{
	struct dir *d = *state;
	struct ckpt_reader r;
	struct sample s;
	char why[256] = "";
	unsigned char *b;
	size_t len;
	void **dst;

	sample_make(&s, &lay, 3 * 16 + 5, 22);
	write_ok(d, "c", &s);
	assert_int_equal(ckpt_open(d->fd, "c", &r, why, sizeof(why)), 0);
	dst = pages_alloc(&r.meta);
	free(dst[1]);
	dst[1] = NULL;
	assert_int_equal(ckpt_read_pages(&r, dst, why, sizeof(why)), 0);
	assert_memory_equal(dst[0], s.pages[0], s.m.page_bytes);
	assert_memory_equal(dst[3], s.pages[3], s.m.page_bytes);
	pages_free(&r.meta, dst);
	ckpt_close(&r);
	assert_int_equal(ckpt_open(d->fd, "c", &r, why, sizeof(why)), 0);
	assert_int_equal(ckpt_read_pages(&r, NULL, why, sizeof(why)), 0);
	ckpt_close(&r);
	/* A flipped byte in a page nobody keeps is still refused. */
	b = slurp(d, "c", &len);
	b[4096 + 16384 + 100] ^= 1;
	spit(d, "c", b, len);
	assert_int_equal(ckpt_open(d->fd, "c", &r, why, sizeof(why)), 0);
	assert_int_equal(ckpt_read_pages(&r, NULL, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "page 1 of 4: checksum mismatch"));
	ckpt_close(&r);
	free(b);
	sample_free(&s);
}

static unsigned int dirsyncs;

static int count_dirsyncs(enum ckpt_io op, size_t *max_bytes)
{
	(void)max_bytes;
	dirsyncs += op == CKPT_IO_DIRSYNC;
	return 0;
}

/* Issue 13, item 17: creating checkpoints/<uid>/ was not followed by an
 * fsync of checkpoints/, so a power loss could take a tenant's first
 * checkpoint, reported durable, away with its directory. ckpt_dir_open
 * fsyncs the parent of a directory it creates, and only then; when that
 * fsync fails the directory is removed again, so the next call creates
 * and fsyncs it anew. */
static void test_dir_open(void **state)
{
	struct dir *d = *state;
	int created = -1, fd;

	ckpt_inject = count_dirsyncs;
	dirsyncs = 0;
	fd = ckpt_dir_open(d->fd, "1000", 0, 0700, &created);
	assert_int_equal(fd, -ENOENT);
	fd = ckpt_dir_open(d->fd, "1000", 1, 0700, &created);
	assert_true(fd >= 0);
	assert_int_equal(created, 1);
	assert_int_equal(dirsyncs, 1);
	close(fd);
	fd = ckpt_dir_open(d->fd, "1000", 1, 0700, &created);
	assert_true(fd >= 0);
	assert_int_equal(created, 0);
	assert_int_equal(dirsyncs, 1); /* there already: nothing to sync */
	close(fd);
	assert_int_equal(ckpt_dir_open(d->fd, "..", 1, 0700, NULL), -EINVAL);
	assert_int_equal(ckpt_dir_open(d->fd, "a/b", 1, 0700, NULL), -EINVAL);
	ckpt_inject = NULL;
	assert_int_equal(unlinkat(d->fd, "1000", AT_REMOVEDIR), 0);
}

/* The state directory's missing ancestors too: one fsync per directory
 * created, none for what exists. */
static void test_mkdir_p(void **state)
{
	struct dir *d = *state;
	char path[200];
	int fd;

	snprintf(path, sizeof(path), "%s/a/b/./c/", d->path);
	ckpt_inject = count_dirsyncs;
	dirsyncs = 0;
	fd = ckpt_mkdir_p(path, 0700);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(dirsyncs, 3);
	fd = ckpt_mkdir_p(path, 0700);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(dirsyncs, 3);
	ckpt_inject = NULL;
	snprintf(path, sizeof(path), "%s/a/b/c", d->path);
	assert_int_equal(rmdir(path), 0);
	snprintf(path, sizeof(path), "%s/a/b", d->path);
	assert_int_equal(rmdir(path), 0);
	snprintf(path, sizeof(path), "%s/a", d->path);
	assert_int_equal(rmdir(path), 0);
}

static int fail_dirsync(enum ckpt_io op, size_t *max_bytes)
{
	(void)max_bytes;
	return op == CKPT_IO_DIRSYNC ? -EIO : 0;
}

static void test_dir_open_fsync_fails(void **state)
{
	struct dir *d = *state;
	struct stat st;

	ckpt_inject = fail_dirsync;
	assert_int_equal(ckpt_dir_open(d->fd, "1000", 1, 0700, NULL), -EIO);
	ckpt_inject = NULL;
	/* Gone again: the next call creates it and syncs its parent. */
	assert_int_equal(fstatat(d->fd, "1000", &st, 0), -1);
	assert_int_equal(errno, ENOENT);
}

static void test_newer_version(void **state)
{
	struct dir *d = *state;
	struct sample s;
	size_t len;
	unsigned char *b;
	struct ckpt_reader r;
	char why[256] = "";

	sample_make(&s, &lay, 20, 12);
	write_ok(d, "v", &s);
	b = slurp(d, "v", &len);
	set32(b + 8, CKPT_FORMAT_VERSION + 1);
	reseal_header(b);
	spit(d, "v", b, len);
	assert_int_equal(ckpt_open(d->fd, "v", &r, why, sizeof(why)), -EPROTONOSUPPORT);
	assert_non_null(strstr(why, "newer"));
	ckpt_close(&r);
	/* Even if the rest of the header means something else to that version. */
	memset(b + 12, 0xff, 500);
	spit(d, "v", b, len);
	assert_int_equal(ckpt_open(d->fd, "v", &r, why, sizeof(why)), -EPROTONOSUPPORT);
	/* Version 0 never existed. */
	set32(b + 8, 0);
	spit(d, "v", b, len);
	assert_int_equal(ckpt_open(d->fd, "v", &r, why, sizeof(why)), -EBADMSG);
	free(b);
	sample_free(&s);
}

/* Current data-segment size of this process, from /proc (VmData, kB). */
static uint64_t vm_data_bytes(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmData: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

/* A header that claims more than the file holds, consistently and with a
 * valid checksum, is refused before anything is allocated for it: checked
 * in a child whose data segment (RLIMIT_DATA) has 64 MiB to spare, which
 * the claimed token array (256 MiB at least) would not fit. */
static void test_huge_counts(void **state)
{
	struct dir *d = *state;
	struct sample s;
	size_t len;
	unsigned char *orig, *b;
	const struct {
		uint64_t n_tokens;
		uint32_t n_pages;
		const char *needle;
	} cases[] = {
		{1ull << 24, 1u << 20, "truncated"},		/* 256 MiB of tokens */
		{0xffffffffull * 16, 0xffffffffu, "truncated"}, /* 64 GiB of tokens, 64 TiB pages */
		{UINT64_MAX, 0xffffffffu, "page count"},
		{UINT64_MAX - 15, (uint32_t)(UINT64_MAX / 16), "page count"},
		{20, 0xffffffffu, "page count"},
	};
	pid_t pid;
	int status;

	sample_make(&s, &lay, 20, 13);
	write_ok(d, "h", &s);
	orig = slurp(d, "h", &len);
	b = malloc(len);
	assert_non_null(b);

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit rl;
		int bad = 0;

		getrlimit(RLIMIT_DATA, &rl);
		rl.rlim_cur = vm_data_bytes() + (64u << 20);
		if (setrlimit(RLIMIT_DATA, &rl) < 0)
			_exit(2);
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			uint64_t n = cases[i].n_tokens, np = cases[i].n_pages;
			uint64_t tb = n * 16, po = (512 + tb + 4095) / 4096 * 4096;
			uint64_t so = po + np * 16384, to = so + np * 8;
			struct ckpt_reader r;
			char why[256] = "";
			int ret;

			memcpy(b, orig, len);
			set32(b + 28, cases[i].n_pages);
			set64(b + 32, n);
			set64(b + 104, tb);
			set64(b + 120, po);
			set64(b + 128, so);
			set64(b + 136, to);
			set64(b + 144, to + 32);
			reseal_header(b);
			spit(d, "h", b, len);
			ret = ckpt_open(d->fd, "h", &r, why, sizeof(why));
			ckpt_close(&r);
			if (ret != -EBADMSG || !strstr(why, cases[i].needle)) {
				fprintf(stderr, "case %zu: %d %s\n", i, ret, why);
				bad = 1;
			}
		}
		_exit(bad);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	free(b);
	free(orig);
	sample_free(&s);
}

static void test_bad_input(void **state)
{
	struct dir *d = *state;
	struct sample s;
	struct ckpt_meta m;
	struct ckpt_reader r;
	char why[256];
	const void *const *pages;

	sample_make(&s, &lay, 20, 14);
	pages = (const void *const *)s.pages;
	assert_int_equal(ckpt_write(d->fd, "", &s.m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(ckpt_write(d->fd, "../x", &s.m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(ckpt_write(d->fd, ".tmp-x-0123456789abcdef", &s.m, s.tokens, pages, NULL,
				    why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(ckpt_open(d->fd, "../etc", &r, why, sizeof(why)), -EINVAL);
	assert_int_equal(ckpt_remove(d->fd, ".."), -EINVAL);

	m = s.m;
	m.n_pages++;
	assert_int_equal(ckpt_write(d->fd, "x", &m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "page count"));
	m = s.m;
	m.page_bytes += 4096;
	assert_int_equal(ckpt_write(d->fd, "x", &m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	m = s.m;
	m.layout.head_dim = 0;
	assert_int_equal(ckpt_write(d->fd, "x", &m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	m = s.m;
	m.model_id[0] = '\0';
	assert_int_equal(ckpt_write(d->fd, "x", &m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	m = s.m;
	memset(m.model_id, 'a', sizeof(m.model_id)); /* unterminated */
	assert_int_equal(ckpt_write(d->fd, "x", &m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(ckpt_write(d->fd, "x", &s.m, NULL, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	s.tokens[3].flags = 0x8;
	assert_int_equal(ckpt_write(d->fd, "x", &s.m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	s.tokens[3].flags = 0;
	s.tokens[3].role = 4;
	assert_int_equal(ckpt_write(d->fd, "x", &s.m, s.tokens, pages, NULL, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "token 3"));
	assert_int_equal(n_entries(d), 0);

	/* Missing, a symlink, a directory. */
	assert_int_equal(ckpt_open(d->fd, "nothing", &r, why, sizeof(why)), -ENOENT);
	ckpt_close(&r);
	assert_int_equal(ckpt_remove(d->fd, "nothing"), -ENOENT);
	s.tokens[3].role = 1;
	write_ok(d, "real", &s);
	assert_int_equal(symlinkat("real", d->fd, "link"), 0);
	assert_int_equal(ckpt_open(d->fd, "link", &r, why, sizeof(why)), -ELOOP);
	assert_int_equal(mkdirat(d->fd, "dir", 0700), 0);
	assert_int_equal(ckpt_open(d->fd, "dir", &r, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "regular"));
	ckpt_close(NULL);

	/* Remove. */
	assert_int_equal(ckpt_remove(d->fd, "real"), 0);
	assert_int_equal(ckpt_open(d->fd, "real", &r, why, sizeof(why)), -ENOENT);
	assert_int_equal(ckpt_remove(d->fd, "real"), -ENOENT);
	sample_free(&s);
}

/* Fails the second write of a checkpoint with EIO: the first of its
 * pages (the header is the first write), however the pages are batched. */
static int hook_writes;
static int second_write_fails(enum ckpt_io op, size_t *max_bytes)
{
	(void)max_bytes;
	if (op != CKPT_IO_WRITE)
		return 0;
	return ++hook_writes == 2 ? -EIO : 0;
}

/* Whether the file system of d allocates ahead (fallocate): where it
 * cannot, ckpt_write lets its writes allocate as they go. */
static int can_fallocate(const struct dir *d)
{
	int fd = openat(d->fd, "probe", O_WRONLY | O_CREAT | O_EXCL, 0600), ok;

	assert_true(fd >= 0);
	ok = fallocate(fd, 0, 0, 4096) == 0;
	close(fd);
	assert_int_equal(unlinkat(d->fd, "probe", 0), 0);
	return ok;
}

/* A checkpoint bigger than the file-size limit (EFBIG) is refused before
 * a byte of it is written (its space is reserved first, where the file
 * system can); one whose write of pages fails (EIO) fails too. Either
 * leaves the previous checkpoint of that name intact and no temporary. */
static void test_write_fails_efbig(void **state)
{
	struct dir *d = *state;
	struct sample old, big;
	struct rlimit rl, saved;
	char why[256] = "";
	int ret;

	sample_make(&old, &lay, 10, 15);
	sample_make(&big, &lay, 16 * 8, 16); /* 8 pages, ~132 KiB */
	write_ok(d, "keep", &old);

	assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
	signal(SIGXFSZ, SIG_IGN);
	rl = saved;
	rl.rlim_cur = 40000; /* mid-way through the pages */
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ret = ckpt_write(d->fd, "keep", &big.m, big.tokens, (const void *const *)big.pages, NULL,
			 why, sizeof(why));
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
	signal(SIGXFSZ, SIG_DFL);
	assert_int_equal(ret, -EFBIG);
	assert_non_null(strstr(why, can_fallocate(d) ? "reserving" : "writing"));
	expect_same(d, "keep", &old);
	assert_int_equal(n_entries(d), 1);

	/* A write of the pages fails. */
	why[0] = '\0';
	hook_writes = 0;
	ckpt_inject = second_write_fails;
	ret = ckpt_write(d->fd, "keep", &big.m, big.tokens, (const void *const *)big.pages, NULL,
			 why, sizeof(why));
	ckpt_inject = NULL;
	assert_int_equal(ret, -EIO);
	assert_non_null(strstr(why, "writing pages"));
	expect_same(d, "keep", &old);
	assert_int_equal(n_entries(d), 1);

	/* The limit hit while writing the header too. */
	rl.rlim_cur = 100;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
	signal(SIGXFSZ, SIG_IGN);
	ret = ckpt_write(d->fd, "keep", &big.m, big.tokens, (const void *const *)big.pages, NULL,
			 why, sizeof(why));
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
	signal(SIGXFSZ, SIG_DFL);
	assert_int_equal(ret, -EFBIG);
	expect_same(d, "keep", &old);
	assert_int_equal(n_entries(d), 1);
	sample_free(&old);
	sample_free(&big);
}

/* A write that fails at the rename (the name is a non-empty directory)
 * removes its temporary. */
static void test_write_fails_rename(void **state)
{
	struct dir *d = *state;
	struct sample s;
	char why[256] = "";
	int ret;

	sample_make(&s, &lay, 30, 17);
	assert_int_equal(mkdirat(d->fd, "taken", 0700), 0);
	assert_int_equal(mkdirat(d->fd, "taken/sub", 0700), 0);
	ret = ckpt_write(d->fd, "taken", &s.m, s.tokens, (const void *const *)s.pages, NULL, why,
			 sizeof(why));
	assert_true(ret == -EISDIR || ret == -ENOTEMPTY || ret == -EEXIST);
	assert_non_null(strstr(why, "rename"));
	assert_int_equal(n_entries(d), 1);
	assert_int_equal(unlinkat(d->fd, "taken/sub", AT_REMOVEDIR), 0);
	sample_free(&s);
}

struct seen {
	int n_ok, n_bad, n_calls;
	int stop_after;
	char names[8][80];
	int errs[8];
};

static int list_cb(const char *name, const struct ckpt_meta *m, int err, const char *why, void *arg)
{
	struct seen *s = arg;

	assert_true(s->n_calls < 8);
	snprintf(s->names[s->n_calls], sizeof(s->names[0]), "%s", name);
	s->errs[s->n_calls] = err;
	s->n_calls++;
	if (m) {
		assert_int_equal(err, 0);
		assert_true(m->file_bytes > 0);
		assert_int_equal(m->version, CKPT_FORMAT_VERSION);
		s->n_ok++;
	} else {
		assert_true(err < 0);
		assert_true(why[0] != '\0');
		s->n_bad++;
	}
	return s->stop_after && s->n_calls == s->stop_after ? 42 : 0;
}

static int seen_err(const struct seen *s, const char *name)
{
	for (int i = 0; i < s->n_calls; i++)
		if (!strcmp(s->names[i], name))
			return s->errs[i];
	return 1; /* not listed */
}

static void test_list_and_cleanup(void **state)
{
	struct dir *d = *state;
	struct sample a, b;
	struct seen seen = {0};
	size_t len;
	unsigned char *bytes;
	uint32_t removed = 99;

	sample_make(&a, &lay, 17, 18);
	sample_make(&b, &lay, 33, 19);
	write_ok(d, "alpha", &a);
	write_ok(d, "beta", &b);
	/* A crash after writing a temporary, before the rename. */
	bytes = slurp(d, "alpha", &len);
	spit(d, ".tmp-alpha-0123456789abcdef", bytes, len);
	/* Things that are no checkpoint, under valid names and not. */
	spit(d, "junk", "hello", 5);
	assert_int_equal(mkfifoat(d->fd, "fifo", 0600), 0);
	spit(d, ".hidden", "x", 1);
	spit(d, ".tmp-notours", "x", 1);
	spit(d, ".tmp-alpha-0123456789ABCDEF", "x", 1); /* upper-case: not ours */

	assert_int_equal(ckpt_list(d->fd, list_cb, &seen), 0);
	assert_int_equal(seen.n_ok, 2);
	assert_int_equal(seen.n_bad, 2);
	assert_int_equal(seen_err(&seen, "alpha"), 0);
	assert_int_equal(seen_err(&seen, "beta"), 0);
	assert_int_equal(seen_err(&seen, "junk"), -EBADMSG);
	assert_int_equal(seen_err(&seen, "fifo"), -EBADMSG);
	assert_int_equal(seen_err(&seen, ".tmp-alpha-0123456789abcdef"), 1);

	/* A non-zero return stops the listing and is returned. */
	memset(&seen, 0, sizeof(seen));
	seen.stop_after = 1;
	assert_int_equal(ckpt_list(d->fd, list_cb, &seen), 42);
	assert_int_equal(seen.n_calls, 1);

	assert_int_equal(ckpt_clean_temporaries(d->fd, &removed), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(faccessat(d->fd, ".tmp-alpha-0123456789abcdef", F_OK, 0), -1);
	assert_int_equal(faccessat(d->fd, ".tmp-notours", F_OK, 0), 0);
	assert_int_equal(faccessat(d->fd, ".tmp-alpha-0123456789ABCDEF", F_OK, 0), 0);
	assert_int_equal(faccessat(d->fd, ".hidden", F_OK, 0), 0);
	assert_int_equal(n_entries(d), 7);
	expect_same(d, "alpha", &a);
	expect_same(d, "beta", &b);
	assert_int_equal(ckpt_clean_temporaries(d->fd, &removed), 0);
	assert_int_equal(removed, 0);
	free(bytes);
	sample_free(&a);
	sample_free(&b);
}

/* Writes cut at an odd length: O_DIRECT refuses the rest, which goes
 * through the page cache (ckpt.c, leave_direct). */
static int short_writes(enum ckpt_io op, size_t *max_bytes)
{
	if (op == CKPT_IO_WRITE)
		*max_bytes = 5000;
	return 0;
}

/* Pages where the daemon's are: 4096-aligned in one arena, written from
 * there (O_DIRECT, runs of neighbours in one iovec, batches past 8 MiB
 * and past 64 iovecs), mixed with unaligned ones that go through the
 * bounce buffer; the file restores the same bytes, also when every write
 * comes back short. */
static void test_arena_pages(void **state)
{
	const struct dir *d = *state;
	const uint32_t n_pages = 600, n_runs = 540, n_scattered = 50;
	struct sample s;
	void **orig;
	char *arena;
	size_t pb;

	sample_make(&s, &lay, (uint64_t)n_pages * lay.block_tokens - 5, 7);
	pb = s.m.page_bytes;
	arena = aligned_alloc(4096, (size_t)(n_pages + 50) * pb);
	assert_non_null(arena);
	orig = calloc(n_pages, sizeof(*orig));
	assert_non_null(orig);
	memcpy(orig, s.pages, n_pages * sizeof(*orig));
	for (uint32_t i = 0; i < n_runs + n_scattered; i++) {
		/* Neighbours first, then slots in reverse: no two adjacent. */
		size_t slot = i < n_runs ? i : n_pages + 40 - 2 * (i - n_runs);
		char *at = arena + slot * pb;

		memcpy(at, s.pages[i], pb);
		s.pages[i] = at;
	}
	write_ok(d, "arena", &s);
	expect_same(d, "arena", &s);
	ckpt_inject = short_writes;
	write_ok(d, "arena-short", &s);
	ckpt_inject = NULL;
	expect_same(d, "arena-short", &s);
	memcpy(s.pages, orig, n_pages * sizeof(*orig));
	free(orig);
	free(arena);
	sample_free(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_key_spans, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_latent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_other_shapes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_arena_pages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_format_as_documented, setup, teardown),
		cmocka_unit_test_setup_teardown(test_overwrite, setup, teardown),
		cmocka_unit_test_setup_teardown(test_created_stamp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corruption, setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_version_1_and_pool_layout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_name_recorded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_pages_check_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_open, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_open_fsync_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mkdir_p, setup, teardown),
		cmocka_unit_test_setup_teardown(test_newer_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_huge_counts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_fails_efbig, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_fails_rename, setup, teardown),
		cmocka_unit_test_setup_teardown(test_list_and_cleanup, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
