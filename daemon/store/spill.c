/* daemon/store/spill.c — spill file format and extents (see spill.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idmap.h"
#include "le.h"
#include "log.h"
#include "spill.h"

static const char file_magic[8] = {'K', 'V', 'P', 'S', 'P', 'I', 'L', 'L'};
static const char page_magic[8] = {'K', 'V', 'P', 'P', 'A', 'G', 'E', '1'};

/* A 128-bit chain hash, little-endian (le.h), low half first. */
static void put128(unsigned char *p, XXH128_hash_t h)
{
	le_put64(p, h.low64);
	le_put64(p + 8, h.high64);
}
static XXH128_hash_t get128(const unsigned char *p)
{
	XXH128_hash_t h = {.low64 = le_get64(p), .high64 = le_get64(p + 8)};

	return h;
}

void spill_file_name(uid_t uid, XXH128_hash_t root, char *buf, size_t len)
{
	snprintf(buf, len, "spill-%u-%016" PRIx64 "%016" PRIx64 ".kvs", (unsigned)uid, root.high64,
		 root.low64);
}

/* File header: magic, format, uid, page bytes, capacity, layout (6 × u32),
 * root, model id, then the XXH3-64 of all that. */
enum {
	FH_MAGIC = 0,
	FH_FORMAT = 8,
	FH_UID = 12,
	FH_PAGE_BYTES = 16,
	FH_CAP = 24,
	FH_LAYOUT = 28,
	FH_ROOT = 52,
	FH_MODEL = 68,
	FH_SUM = FH_MODEL + SPILL_MODEL_ID_MAX,
	FH_END = FH_SUM + 8,
	/* The page format (shm_layout.format) joined the header later, after
	 * the first sum with a sum of its own: KV pools leave both zero, so
	 * their files are byte for byte what they were, and a file without
	 * the field reads as the KV format. */
	FH_PAGE_FORMAT = FH_END,
	FH_SUM2 = FH_PAGE_FORMAT + 4,
	FH_END2 = FH_SUM2 + 8,
};

static void file_hdr_encode(const struct spill *sp, const char *model_id,
			    const struct shm_layout *l, uint32_t format, unsigned char *b)
{
	memset(b, 0, SPILL_FILE_HDR);
	memcpy(b + FH_MAGIC, file_magic, 8);
	le_put32(b + FH_FORMAT, format);
	le_put32(b + FH_UID, (uint32_t)sp->uid);
	le_put64(b + FH_PAGE_BYTES, sp->page_bytes);
	le_put32(b + FH_CAP, sp->cap);
	le_put32(b + FH_LAYOUT, l->n_layers);
	le_put32(b + FH_LAYOUT + 4, l->n_kv_heads);
	le_put32(b + FH_LAYOUT + 8, l->head_dim);
	le_put32(b + FH_LAYOUT + 12, l->block_tokens);
	le_put32(b + FH_LAYOUT + 16, l->dtype);
	le_put32(b + FH_LAYOUT + 20, l->quant_group);
	put128(b + FH_ROOT, sp->root);
	snprintf((char *)b + FH_MODEL, SPILL_MODEL_ID_MAX, "%s", model_id);
	le_put64(b + FH_SUM, XXH3_64bits(b, FH_SUM));
	if (l->format) {
		le_put32(b + FH_PAGE_FORMAT, l->format);
		le_put64(b + FH_SUM2, XXH3_64bits(b, FH_SUM2));
	}
}

/* Page header: magic, hash, parent, data sum, sequence, flags, then the
 * XXH3-64 of all that seeded with the pool root, so a header copied from
 * another pool's file does not verify here. Format 3: then the last-use
 * stamp and its seal, the XXH3-64 of the stamp seeded with that checksum
 * (outside it, so the stamp can be rewritten alone). */
enum {
	PH_MAGIC = 0,
	PH_HASH = 8,
	PH_PARENT = 24,
	PH_SUM = 40,
	PH_SEQ = 48,
	PH_FLAGS = 56,
	PH_DTYPE = 60,
	PH_STORED = 64,
	PH_CHECK = 68,
	PH_USED = 76,
	PH_USED_SEAL = 84,
	PH_END = 92,
};
_Static_assert(PH_END <= SPILL_PAGE_HDR, "page header fits its slot");
_Static_assert(FH_END2 <= SPILL_FILE_HDR, "file header fits its block");

void spill_hdr_encode(struct spill *sp, struct spill_page_hdr *h, unsigned char *b)
{
	h->seq = ++sp->seq;
	memset(b, 0, SPILL_PAGE_HDR);
	memcpy(b + PH_MAGIC, page_magic, 8);
	put128(b + PH_HASH, h->hash);
	put128(b + PH_PARENT, h->parent);
	le_put64(b + PH_SUM, h->sum);
	le_put64(b + PH_SEQ, h->seq);
	le_put32(b + PH_FLAGS, h->flags);
	le_put32(b + PH_DTYPE, h->dtype);
	le_put32(b + PH_STORED, h->stored_bytes);
	le_put64(b + PH_CHECK, XXH3_64bits_withSeed(b, PH_CHECK, sp->root.low64));
	le_put64(b + PH_USED, h->used);
	le_put64(b + PH_USED_SEAL, XXH3_64bits_withSeed(b + PH_USED, 8, le_get64(b + PH_CHECK)));
}

int spill_hdr_decode(const struct spill *sp, const unsigned char *b, struct spill_page_hdr *h)
{
	if (memcmp(b + PH_MAGIC, page_magic, 8) ||
	    le_get64(b + PH_CHECK) != XXH3_64bits_withSeed(b, PH_CHECK, sp->root.low64))
		return -EBADMSG;
	h->hash = get128(b + PH_HASH);
	h->parent = get128(b + PH_PARENT);
	h->sum = le_get64(b + PH_SUM);
	h->seq = le_get64(b + PH_SEQ);
	h->flags = le_get32(b + PH_FLAGS);
	h->dtype = le_get32(b + PH_DTYPE);
	h->stored_bytes = le_get32(b + PH_STORED);
	/* A format 2 header has zeros here, which do not verify. */
	h->used = le_get64(b + PH_USED_SEAL) ==
				  XXH3_64bits_withSeed(b + PH_USED, 8, le_get64(b + PH_CHECK))
			  ? le_get64(b + PH_USED)
			  : 0;
	/* Data in the pool's own format fills the extent; a quantized page
	 * is smaller, a whole number of 4 KiB blocks (daemon/core/tier.c checks
	 * the format itself). */
	if (h->dtype == 0 ? h->stored_bytes != sp->page_bytes
			  : h->stored_bytes == 0 || h->stored_bytes % 4096 ||
				    h->stored_bytes >= sp->page_bytes)
		return -EBADMSG;
	return 0;
}

static int fail(char *why, size_t whylen, int err, const char *what, const char *path)
{
	snprintf(why, whylen, "%s %s: %s", what, path, strerror(-err));
	return err;
}

int spill_open(struct spill *sp, const char *dir, uid_t uid, const char *model_id,
	       const struct shm_layout *layout, XXH128_hash_t root, uint64_t cap_bytes, char *why,
	       size_t whylen)
{
	unsigned char want[SPILL_FILE_HDR], have[SPILL_FILE_HDR];
	uint64_t page_bytes = shm_page_bytes(layout), cap = cap_bytes / page_bytes;
	char name[96];
	ssize_t n;
	int ret;

	memset(sp, 0, sizeof(*sp));
	sp->fd_data = sp->fd_meta = -1;
	if (cap == 0)
		return fail(why, whylen, -EINVAL, "no room for one page in", dir);
	if (cap > UINT32_MAX - 1)
		cap = UINT32_MAX - 1;
	sp->uid = uid;
	sp->root = root;
	sp->page_bytes = page_bytes;
	sp->cap = (uint32_t)cap;
	sp->data_off = (SPILL_FILE_HDR + cap * SPILL_PAGE_HDR + 4095) / 4096 * 4096;
	sp->free = malloc(sizeof(uint32_t) * 64);
	if (!sp->free)
		return fail(why, whylen, -ENOMEM, "out of memory opening the spill file in", dir);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return fail(why, whylen, -errno, "cannot create", dir);
	spill_file_name(uid, root, name, sizeof(name));
	snprintf(sp->path, sizeof(sp->path), "%s/%s", dir, name);
	sp->fd_meta = open(sp->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (sp->fd_meta < 0) {
		ret = fail(why, whylen, -errno, "cannot open", sp->path);
		goto err;
	}
	/* A daemon killed a moment ago holds the lock until the kernel has
	 * torn its io_uring down: give it two seconds. */
	for (int tries = 0;
	     flock(sp->fd_meta, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK && tries < 20;
	     tries++)
		usleep(100 * 1000);
	if (flock(sp->fd_meta, LOCK_EX | LOCK_NB) < 0) {
		ret = fail(why, whylen, errno == EWOULDBLOCK ? -EBUSY : -errno,
			   "another process holds", sp->path);
		goto err;
	}
	sp->fd_data = open(sp->path, O_RDWR | O_DIRECT | O_CLOEXEC);
	sp->direct = sp->fd_data >= 0;
	if (sp->fd_data < 0 && errno == EINVAL)
		sp->fd_data = open(sp->path, O_RDWR | O_CLOEXEC);
	if (sp->fd_data < 0) {
		ret = fail(why, whylen, -errno, "cannot open", sp->path);
		goto err;
	}
	file_hdr_encode(sp, model_id, layout, SPILL_FORMAT_OLD, want);
	n = pread(sp->fd_meta, have, sizeof(have), 0);
	if (n == (ssize_t)sizeof(have) && !memcmp(have, want, sizeof(have))) {
		/* Format 2: the same pages, without last-use stamps; from now on
		 * headers carry them, so the file says format 3. */
		file_hdr_encode(sp, model_id, layout, SPILL_FORMAT, want);
		if (pwrite(sp->fd_meta, want, sizeof(want), 0) != (ssize_t)sizeof(want)) {
			ret = fail(why, whylen, errno ? -errno : -EIO, "cannot update", sp->path);
			goto err;
		}
		log_info("%s: format %u file read as it is (pages without last-use stamps)",
			 sp->path, SPILL_FORMAT_OLD);
		return 0;
	}
	file_hdr_encode(sp, model_id, layout, SPILL_FORMAT, want);
	if (n == (ssize_t)sizeof(have) && !memcmp(have, want, sizeof(have)))
		return 0;
	if (n > 0)
		log_notice("%s: another identity, capacity or format; starting it afresh",
			   sp->path);
	/* Fresh file: a zero header region, so no stale page header survives. */
	if (ftruncate(sp->fd_meta, 0) < 0 || ftruncate(sp->fd_meta, (off_t)sp->data_off) < 0 ||
	    pwrite(sp->fd_meta, want, sizeof(want), 0) != (ssize_t)sizeof(want)) {
		ret = fail(why, whylen, -errno, "cannot initialise", sp->path);
		goto err;
	}
	return 0;
err:
	spill_close(sp);
	return ret;
}

void spill_close(struct spill *sp)
{
	if (sp->fd_data >= 0)
		close(sp->fd_data);
	if (sp->fd_meta >= 0)
		close(sp->fd_meta);
	free(sp->free);
	sp->free = NULL;
	free(sp->scan_map);
	sp->scan_map = NULL;
	sp->scan_map_len = 0;
	sp->scanning = 0;
	sp->fd_data = sp->fd_meta = -1;
}

static int push_free(struct spill *sp, uint32_t extent)
{
	/* The stack grows by doubling; at most hwm entries. */
	if ((sp->n_free & (sp->n_free - 1)) == 0 && sp->n_free >= 64) {
		uint32_t *f = realloc(sp->free, sizeof(uint32_t) * 2 * sp->n_free);

		if (!f)
			return -ENOMEM;
		sp->free = f;
	}
	sp->free[sp->n_free++] = extent;
	return 0;
}

/* Calls each(arg, extent, h) for every page header of sp that verifies and
 * whose data lies inside a file of file_bytes, in extent order, reading
 * the header region in 512 KiB chunks and skipping holes (a fresh or
 * lightly used file is mostly one); counts the others of sp's pool in
 * sp->n_gone and keeps sp->seq above every sequence number seen. each
 * returns 0 to go on, > 0 to stop there (returned), < 0 for an error
 * (returned). Returns 0 at the end, or -errno from a read. */
static int each_header(struct spill *sp, uint64_t file_bytes,
		       int (*each)(void *arg, uint32_t extent, const struct spill_page_hdr *h),
		       void *arg)
{
	const size_t chunk = 4096 * SPILL_PAGE_HDR; /* headers per read */
	unsigned char *buf = malloc(chunk);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	sp->n_gone = 0;
	for (uint64_t e0 = 0; e0 < sp->cap && ret == 0; e0 += chunk / SPILL_PAGE_HDR) {
		uint64_t want = (sp->cap - e0) * SPILL_PAGE_HDR;
		off_t at = (off_t)spill_hdr_off((uint32_t)e0), data;
		ssize_t n;

		if (want > chunk)
			want = chunk;
		data = lseek(sp->fd_meta, at, SEEK_DATA);
		if (data < 0 || (uint64_t)data >= sp->data_off)
			break; /* no header written from here on */
		if (data >= at + (off_t)want)
			continue;
		n = pread(sp->fd_meta, buf, want, at);
		if (n < 0) {
			ret = -errno;
			break;
		}
		for (size_t i = 0; ret == 0 && i + SPILL_PAGE_HDR <= (size_t)n;
		     i += SPILL_PAGE_HDR) {
			uint32_t extent = (uint32_t)(e0 + i / SPILL_PAGE_HDR);
			struct spill_page_hdr h;

			if (spill_hdr_decode(sp, buf + i, &h) < 0)
				continue;
			if (h.seq > sp->seq)
				sp->seq = h.seq;
			if (spill_data_off(sp, extent) + h.stored_bytes > file_bytes) {
				sp->n_gone++; /* its data is not in the file: not found */
				continue;
			}
			ret = each(arg, extent, &h);
		}
		if ((uint64_t)n < want)
			break; /* the file ends: the rest was never written */
	}
	free(buf);
	return ret;
}

struct dedup {
	struct spill_page_hdr *hdrs;
	uint32_t *keep; /* extent of hdrs[i], UINT32_MAX: a newer copy won */
	uint32_t n, cap;
	struct idmap seen; /* hash → index + 1 of the newest header */
};

/* Keeps the newest header of each hash (each_header's callback). */
static int dedup_one(void *arg, uint32_t extent, const struct spill_page_hdr *h)
{
	struct dedup *d = arg;
	uintptr_t prev;

	if (d->n == d->cap) {
		uint32_t c = d->cap ? d->cap * 2 : 256;
		void *a = realloc(d->hdrs, c * sizeof(*d->hdrs)), *b;

		if (a)
			d->hdrs = a;
		b = realloc(d->keep, c * sizeof(*d->keep));
		if (b)
			d->keep = b;
		if (!a || !b)
			return -ENOMEM;
		d->cap = c;
	}
	prev = (uintptr_t)idmap_get(&d->seen, h->hash.low64 | 1);
	if (prev && d->hdrs[prev - 1].seq >= h->seq)
		return 0; /* an older copy of the same page */
	if (prev) {
		d->keep[prev - 1] = UINT32_MAX;
		idmap_del(&d->seen, h->hash.low64 | 1);
	}
	d->hdrs[d->n] = *h;
	d->keep[d->n] = extent;
	if (idmap_put(&d->seen, h->hash.low64 | 1, (void *)(uintptr_t)(d->n + 1)) < 0)
		return -ENOMEM;
	d->n++;
	return 0;
}

int spill_scan(struct spill *sp,
	       int (*fn)(void *arg, uint32_t extent, const struct spill_page_hdr *h), void *arg)
{
	struct dedup d = {0};
	int accepted = 0, ret;
	struct stat st;

	/* What the file holds now: a file cut short while the daemon was
	 * down keeps headers of pages whose data is gone. */
	if (fstat(sp->fd_meta, &st) < 0)
		return -errno;
	ret = each_header(sp, (uint64_t)st.st_size, dedup_one, &d);
	if (ret < 0)
		goto out;
	/* Parents before children is the caller's business (it sees them all
	 * first); here every extent is either accepted or free. */
	sp->hwm = 0;
	for (uint32_t i = 0; i < d.n; i++)
		if (d.keep[i] != UINT32_MAX && d.keep[i] + 1 > sp->hwm)
			sp->hwm = d.keep[i] + 1;
	{
		unsigned char *used = calloc(sp->hwm ? sp->hwm : 1, 1);

		if (!used) {
			ret = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 0; i < d.n; i++) {
			if (d.keep[i] == UINT32_MAX || fn(arg, d.keep[i], &d.hdrs[i]) < 0)
				continue;
			used[d.keep[i]] = 1;
			accepted++;
		}
		sp->n_used = 0;
		sp->n_free = 0;
		for (uint32_t e = sp->hwm; e-- > 0;) {
			if (used[e])
				sp->n_used++;
			else if (push_free(sp, e) < 0)
				ret = -ENOMEM;
		}
		free(used);
	}
	if (ret == 0)
		ret = accepted;
out:
	idmap_fini(&d.seen);
	free(d.hdrs);
	free(d.keep);
	return ret;
}

/* The scan map covers [0, len): what it did not cover is 0. */
static int scan_map_cover(struct spill *sp, uint32_t len)
{
	uint8_t *m;

	if (len <= sp->scan_map_len)
		return 0;
	m = realloc(sp->scan_map, len);
	if (!m)
		return -ENOMEM;
	memset(m + sp->scan_map_len, 0, len - sp->scan_map_len);
	sp->scan_map = m;
	sp->scan_map_len = len;
	return 0;
}

/* Extents in one allocation ahead: SPILL_PREALLOC_BYTES, at least one. */
static uint32_t prealloc_window(const struct spill *sp)
{
	uint64_t n = SPILL_PREALLOC_BYTES / sp->page_bytes;

	return n ? (uint32_t)n : 1u;
}

int spill_prealloc_due(const struct spill *sp, uint32_t want, uint32_t *from, uint32_t *n)
{
	uint32_t win = prealloc_window(sp), start = sp->prealloc > sp->hwm ? sp->prealloc : sp->hwm;
	uint64_t end;

	if (!sp->direct || sp->prealloc_off || sp->hwm < sp->prealloc_retry || start >= sp->cap)
		return 0;
	want = want > sp->n_free ? want - sp->n_free : 0; /* new extents only */
	if (want > SPILL_PREALLOC_MAX_WINDOWS * win)
		want = SPILL_PREALLOC_MAX_WINDOWS * win;
	/* The extents wanted and half a window beyond them are there: not
	 * yet. */
	if ((uint64_t)sp->prealloc > (uint64_t)sp->hwm + want + win / 2)
		return 0;
	end = (uint64_t)sp->hwm + want + win;
	if (end > sp->cap)
		end = sp->cap;
	*from = start;
	*n = (uint32_t)(end - start);
	return 1;
}

int spill_prealloc_run(const struct spill *sp, uint32_t from, uint32_t n)
{
	int ret;

	while ((ret = fallocate(sp->fd_data, 0, (off_t)spill_data_off(sp, from),
				(off_t)((uint64_t)n * sp->page_bytes)) < 0
			      ? -errno
			      : 0) == -EINTR)
		;
	return ret;
}

void spill_prealloc_start(struct spill *sp, uint32_t from, uint32_t n)
{
	sp->prealloc_pending = from + n;
}

void spill_prealloc_done(struct spill *sp, uint32_t from, uint32_t n, int ret)
{
	sp->prealloc_pending = 0;
	if (ret == 0) {
		if (from + n > sp->prealloc)
			sp->prealloc = from + n;
	} else if (ret == -EOPNOTSUPP || ret == -ENOSYS) {
		sp->prealloc_off = 1; /* the file system cannot: never again */
	} else {
		/* Full, over a limit, failing: writes allocate as they go
		 * for a window's worth of extents before the next try. */
		sp->prealloc_retry = sp->hwm + prealloc_window(sp);
	}
}

int spill_alloc(struct spill *sp, uint32_t *ret_extent)
{
	if (sp->n_free) {
		*ret_extent = sp->free[--sp->n_free];
		if (sp->scanning)
			sp->scan_map[*ret_extent] = 1;
	} else if (sp->scanning) {
		uint32_t e = sp->scan_virgin_next;

		/* Only past every header written: the rest may hold pages not
		 * found yet. */
		if (e >= sp->cap || scan_map_cover(sp, e + 1) < 0)
			return -EAGAIN;
		sp->scan_map[e] = 1;
		sp->scan_virgin_next++;
		if (e + 1 > sp->hwm)
			sp->hwm = e + 1; /* handed out: below hwm, as tier_check expects */
		*ret_extent = e;
	} else if (sp->hwm < sp->cap) {
		*ret_extent = sp->hwm++;
	} else {
		return -ENOSPC;
	}
	sp->n_used++;
	return 0;
}

void spill_free(struct spill *sp, uint32_t extent)
{
	sp->n_used--;
	if (sp->scanning && extent < sp->scan_map_len)
		sp->scan_map[extent] = 0;
	if (extent >= sp->cap)
		return; /* beyond a capacity lowered by ENOSPC: never again */
	if (push_free(sp, extent) < 0) {
		/* Lost until restart; the scan finds it free again. */
		log_warn("%s: extent %u leaked: out of memory", sp->path, extent);
	}
}

void spill_full(struct spill *sp, uint32_t extent)
{
	uint32_t keep = 0, cap = extent < sp->hwm ? extent : sp->hwm;

	if (cap >= sp->cap)
		return; /* capped there already */
	log_warn("%s: file system full at %u pages; disk tier capped there", sp->path, cap);
	/* Extents at or above the one that failed were never written; drop
	 * them from the free stack and stop handing out new ones. */
	sp->cap = cap;
	for (uint32_t i = 0; i < sp->n_free; i++)
		if (sp->free[i] < sp->cap)
			sp->free[keep++] = sp->free[i];
	sp->n_free = keep;
}

int spill_set_used(struct spill *sp, uint32_t extent, XXH128_hash_t hash, uint64_t used)
{
	unsigned char b[SPILL_PAGE_HDR];
	struct spill_page_hdr h;
	off_t at = (off_t)spill_hdr_off(extent);

	if (extent >= sp->hwm)
		return -ESTALE;
	if (pread(sp->fd_meta, b, sizeof(b), at) != (ssize_t)sizeof(b))
		return -ESTALE;
	if (spill_hdr_decode(sp, b, &h) < 0 || !XXH128_isEqual(h.hash, hash))
		return -ESTALE;
	le_put64(b + PH_USED, used);
	le_put64(b + PH_USED_SEAL, XXH3_64bits_withSeed(b + PH_USED, 8, le_get64(b + PH_CHECK)));
	if (pwrite(sp->fd_meta, b + PH_USED, PH_END - PH_USED, at + PH_USED) != PH_END - PH_USED)
		return errno ? -errno : -EIO;
	return 0;
}

/* ---- the stepwise scan ------------------------------------------------------ */

int spill_scanner_init(const struct spill *sp, struct spill_scanner *s)
{
	struct stat st;

	memset(s, 0, sizeof(*s));
	/* What the file holds now: a file cut short while the daemon was
	 * down keeps headers of pages whose data is gone. */
	if (fstat(sp->fd_meta, &st) < 0)
		return -errno;
	s->file_bytes = (uint64_t)st.st_size;
	s->cap = sp->cap;
	s->eof = s->cap == 0;
	/* The end of the header data: extents past it never held a header
	 * (handed out from the lowest up, never cut). A few data runs are
	 * followed (a dense file has one); past that, or where the file
	 * system has no SEEK_DATA, every extent counts as written. */
	{
		uint64_t end = SPILL_FILE_HDR, n;
		off_t at = SPILL_FILE_HDR;

		for (int runs = 0;; runs++) {
			off_t d = lseek(sp->fd_meta, at, SEEK_DATA), h;

			if (d < 0 || (uint64_t)d >= sp->data_off)
				break;
			h = runs < 64 ? lseek(sp->fd_meta, d, SEEK_HOLE) : -1;
			if (h < 0 || (uint64_t)h >= sp->data_off) {
				end = sp->data_off;
				break;
			}
			end = (uint64_t)h;
			at = h;
		}
		n = (end - SPILL_FILE_HDR + SPILL_PAGE_HDR - 1) / SPILL_PAGE_HDR;
		s->virgin = s->estimate = n < s->cap ? (uint32_t)n : s->cap;
		s->cap = s->virgin; /* the loop writes past it meanwhile */
		s->eof = s->cap == 0;
	}
	/* Room for them at once: a map and an array that grow as they go
	 * copy everything at each doubling (on the worker, but beside the
	 * loop on a machine of two cores). Only address space until used;
	 * on failure they grow as they go. */
	if (s->estimate) {
		uint32_t n = s->estimate < (1u << 22) ? s->estimate : 1u << 22;

		s->rec = malloc((size_t)n * sizeof(*s->rec));
		s->cap_rec = s->rec ? n : 0;
		(void)idmap_reserve(&s->seen, n);
	}
	return 0;
}

void spill_scanner_fini(struct spill_scanner *s)
{
	idmap_fini(&s->seen);
	free(s->rec);
	s->rec = NULL;
}

/* Records h at extent as the newest copy of its hash; sets *ret_replaces
 * to the extent of the copy it supersedes. Returns 1 when h is older than
 * a copy seen already (skip it), 0, or -ENOMEM. */
static int scanner_seen(struct spill_scanner *s, uint32_t extent, const struct spill_page_hdr *h,
			uint32_t *ret_replaces)
{
	uint64_t key = h->hash.low64 | 1;
	uintptr_t k = (uintptr_t)idmap_get(&s->seen, key);

	*ret_replaces = UINT32_MAX;
	if (k && XXH128_isEqual(s->rec[k - 1].hash, h->hash)) {
		if (s->rec[k - 1].seq >= h->seq)
			return 1;
		*ret_replaces = s->rec[k - 1].extent;
		s->rec[k - 1].seq = h->seq;
		s->rec[k - 1].extent = extent;
		return 0;
	}
	if (k)
		return 0; /* another hash with the same key: the index refuses one */
	if (s->n_rec == s->cap_rec) {
		uint32_t c = s->cap_rec ? 2 * s->cap_rec : 1024;
		void *v = realloc(s->rec, c * sizeof(*s->rec));

		if (!v)
			return -ENOMEM;
		s->rec = v;
		s->cap_rec = c;
	}
	s->rec[s->n_rec] = (struct spill_seen){.seq = h->seq, .hash = h->hash, .extent = extent};
	if (idmap_put(&s->seen, key, (void *)(uintptr_t)(s->n_rec + 1)) < 0)
		return -ENOMEM;
	s->n_rec++;
	return 0;
}

int spill_scanner_step(const struct spill *sp, struct spill_scanner *s, struct spill_found *out,
		       uint32_t max, uint32_t *ret_n)
{
	unsigned char buf[512 * SPILL_PAGE_HDR];
	uint32_t n_out = 0;

	*ret_n = 0;
	while (!s->eof && n_out < max) {
		uint64_t want = (uint64_t)(s->cap - s->next) * SPILL_PAGE_HDR;
		off_t at = (off_t)spill_hdr_off(s->next), data;
		ssize_t n;

		if (want > sizeof(buf))
			want = sizeof(buf);
		if (want > (uint64_t)(max - n_out) * SPILL_PAGE_HDR)
			want = (uint64_t)(max - n_out) * SPILL_PAGE_HDR;
		/* Skip holes: a fresh or lightly used file is mostly one. */
		data = lseek(sp->fd_meta, at, SEEK_DATA);
		if (data < 0 || (uint64_t)data >= sp->data_off) {
			s->eof = 1; /* no header written from here on */
			break;
		}
		if (data >= at + (off_t)want) {
			s->next = (uint32_t)(((uint64_t)data - SPILL_FILE_HDR) / SPILL_PAGE_HDR);
			continue;
		}
		n = pread(sp->fd_meta, buf, want, at);
		if (n < 0)
			return -errno;
		for (size_t i = 0; i + SPILL_PAGE_HDR <= (size_t)n; i += SPILL_PAGE_HDR) {
			uint32_t extent = (uint32_t)(s->next + i / SPILL_PAGE_HDR), replaces;
			struct spill_page_hdr h;
			int ret;

			if (spill_hdr_decode(sp, buf + i, &h) < 0)
				continue;
			if (h.seq > s->seq)
				s->seq = h.seq;
			if (spill_data_off(sp, extent) + h.stored_bytes > s->file_bytes) {
				s->n_gone++; /* its data is not in the file: not found */
				continue;
			}
			ret = scanner_seen(s, extent, &h, &replaces);
			if (ret < 0)
				return ret;
			if (ret == 0)
				out[n_out++] = (struct spill_found){
					.h = h, .extent = extent, .replaces = replaces};
		}
		s->next += (uint32_t)((size_t)n / SPILL_PAGE_HDR);
		if ((uint64_t)n < want || s->next >= s->cap)
			s->eof = 1; /* the file ends: the rest was never written */
	}
	*ret_n = n_out;
	return 0;
}

void spill_scan_begin(struct spill *sp, uint32_t virgin)
{
	sp->scanning = 1;
	sp->scan_upto = 0;
	sp->scan_virgin = sp->scan_virgin_next = virgin;
	sp->hwm = virgin; /* tier_check sees what may be in use */
	sp->n_free = 0;
	sp->n_used = 0;
	free(sp->scan_map);
	sp->scan_map = NULL;
	sp->scan_map_len = 0;
}

int spill_scan_advance(struct spill *sp, uint32_t to, const struct spill_found *v, uint32_t n)
{
	uint32_t from = sp->scan_upto;

	if (to > sp->scan_virgin)
		to = sp->scan_virgin; /* the scanner reads nothing past it */
	if (to > from && scan_map_cover(sp, to) < 0)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		if (v[i].extent >= from && v[i].extent < to && !sp->scan_map[v[i].extent]) {
			sp->scan_map[v[i].extent] = 1;
			sp->n_used++;
		}
	/* Highest first, so the lowest free extent is handed out first. */
	for (uint32_t e = to; e-- > from;)
		if (!sp->scan_map[e] && push_free(sp, e) < 0)
			sp->scan_map[e] = 1; /* out of memory: kept out of use */
	if (to > from)
		sp->scan_upto = to;
	return 0;
}

void spill_scan_end(struct spill *sp, int complete, uint64_t seq, uint32_t n_gone)
{
	uint32_t hwm = 0;

	if (seq > sp->seq)
		sp->seq = seq;
	sp->n_gone = n_gone;
	for (uint32_t e = sp->scan_map_len; e-- > 0;)
		if (sp->scan_map[e]) {
			hwm = e + 1;
			break;
		}
	/* Not complete: between scan_upto and scan_virgin pages may wait for
	 * the next start; none of those extents is handed out in this run
	 * (below hwm, never on the free stack). */
	if (!complete && hwm < sp->scan_virgin)
		hwm = sp->scan_virgin;
	sp->hwm = hwm;
	sp->n_free = 0;
	for (uint32_t e = hwm; e-- > 0;) {
		if (!complete && e >= sp->scan_upto && e < sp->scan_virgin)
			continue;
		if ((e >= sp->scan_map_len || !sp->scan_map[e]) && push_free(sp, e) < 0)
			break; /* lost until a restart: the scan finds them free */
	}
	free(sp->scan_map);
	sp->scan_map = NULL;
	sp->scan_map_len = 0;
	sp->scanning = 0;
}

/* ---- reclaiming junk at start ------------------------------------------- */

static int found_page(void *arg, uint32_t extent, const struct spill_page_hdr *h)
{
	(void)arg;
	(void)extent;
	(void)h;
	return 1; /* one is enough: stop */
}

/* Why the spill file open as fd, named for (uid, root), is not worth
 * keeping, or NULL when it holds pages a restart can find. */
static const char *junk_reason(int fd, uid_t uid, XXH128_hash_t root, const struct stat *st)
{
	unsigned char b[SPILL_FILE_HDR];
	struct spill sp = {.fd_meta = fd, .fd_data = -1, .uid = uid, .root = root};
	uint32_t format;
	uint64_t cap;
	int ret;

	if (st->st_size < (off_t)SPILL_FILE_HDR ||
	    pread(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b) || memcmp(b, file_magic, 8) ||
	    le_get64(b + FH_SUM) != XXH3_64bits(b, FH_SUM) ||
	    (le_get32(b + FH_PAGE_FORMAT) && le_get64(b + FH_SUM2) != XXH3_64bits(b, FH_SUM2)))
		return "no valid file header";
	format = le_get32(b + FH_FORMAT);
	if (format != SPILL_FORMAT && format != SPILL_FORMAT_OLD)
		return "an unknown format";
	if (le_get32(b + FH_UID) != (uint32_t)uid || !XXH128_isEqual(get128(b + FH_ROOT), root))
		return "a header of another pool than its name";
	sp.page_bytes = le_get64(b + FH_PAGE_BYTES);
	cap = le_get32(b + FH_CAP);
	if (sp.page_bytes == 0 || sp.page_bytes % 4096 || sp.page_bytes > (1ull << 40) ||
	    cap == 0 || cap > UINT32_MAX - 1)
		return "a header with impossible sizes";
	sp.cap = (uint32_t)cap;
	sp.data_off = (SPILL_FILE_HDR + cap * SPILL_PAGE_HDR + 4095) / 4096 * 4096;
	/* Only whether one page is there: the first that verifies ends the
	 * look (a full scan of every file here would delay the start by the
	 * time of every pool's warm restart). */
	ret = each_header(&sp, (uint64_t)st->st_size, found_page, NULL);
	if (ret < 0)
		return NULL; /* unreadable now: not proof of junk */
	return ret > 0 ? NULL : "no page a restart could find";
}

int spill_reclaim(const char *dir, uint64_t *ret_bytes, uint32_t *ret_files)
{
	uint64_t bytes = 0;
	uint32_t files = 0;
	struct dirent *d;
	DIR *dp;
	int dfd, waits = 20; /* 100 ms each, for all files together */

	*ret_bytes = 0;
	*ret_files = 0;
	dp = opendir(dir);
	if (!dp)
		return errno == ENOENT ? 0 : -errno;
	dfd = dirfd(dp);
	while ((d = readdir(dp))) {
		char want[96], hex[33];
		unsigned int uid;
		XXH128_hash_t root;
		const char *why;
		struct stat st;
		int fd, len = 0;

		/* Exactly the names spill_file_name gives, nothing else. */
		if (sscanf(d->d_name, "spill-%u-%32[0-9a-f].kvs%n", &uid, hex, &len) != 2 ||
		    d->d_name[len] != '\0' || strlen(hex) != 32)
			continue;
		{
			char hi[17], lo[17];

			memcpy(hi, hex, 16);
			hi[16] = '\0';
			memcpy(lo, hex + 16, 17);
			root.high64 = strtoull(hi, NULL, 16);
			root.low64 = strtoull(lo, NULL, 16);
		}
		spill_file_name((uid_t)uid, root, want, sizeof(want));
		if (strcmp(want, d->d_name))
			continue; /* spelled another way (leading zeros): not ours */
		fd = openat(dfd, d->d_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0)
			continue;
		/* A file another daemon holds is that daemon's business; one
		 * killed a moment ago holds its files until the kernel has torn
		 * its io_uring down (as in spill_open). */
		while (flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK && waits > 0) {
			waits--;
			usleep(100 * 1000);
		}
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
		    flock(fd, LOCK_EX | LOCK_NB) < 0) {
			close(fd);
			continue;
		}
		why = junk_reason(fd, (uid_t)uid, root, &st);
		if (why && unlinkat(dfd, d->d_name, 0) == 0) {
			log_notice("%s/%s: %s; removed, %llu bytes reclaimed", dir, d->d_name, why,
				   (unsigned long long)st.st_blocks * 512);
			bytes += (uint64_t)st.st_blocks * 512;
			files++;
		}
		close(fd);
	}
	closedir(dp);
	if (files)
		log_notice("%s: %u spill files without pages to restart from removed, %llu bytes "
			   "reclaimed",
			   dir, files, (unsigned long long)bytes);
	*ret_bytes = bytes;
	*ret_files = files;
	return 0;
}

int spill_forget(const struct spill *sp, const uint32_t *extents, uint32_t n)
{
	static const unsigned char zero[SPILL_PAGE_HDR];
	int ret = 0;

	for (uint32_t i = 0; i < n && ret == 0; i++) {
		ssize_t w =
			pwrite(sp->fd_meta, zero, sizeof(zero), (off_t)spill_hdr_off(extents[i]));

		if (w != (ssize_t)sizeof(zero))
			ret = w < 0 ? -errno : -EIO;
	}
	/* Never retried: after a failed sync the page cache may say
	 * anything about what reached the disk. */
	if (ret == 0 && n && fdatasync(sp->fd_meta) < 0)
		ret = -errno;
	return ret;
}
