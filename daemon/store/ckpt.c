/* daemon/store/ckpt.c — the durable checkpoint file (format and contracts in
 * ckpt.h).
 *
 * The writer builds the header, the token records and their padding in
 * one buffer, then hashes each page where it lies in the arena and writes
 * runs of pages from there with O_DIRECT (pwritev, no copy; the page
 * cache only where the file system refuses O_DIRECT). A client that
 * scribbles on a page meanwhile makes the file fail its checksums at
 * restore: refused, never restored wrong. Quantized pages go through a
 * bounce buffer, where the kernels write them. The reader
 * decodes the header into a candidate meta and checks it against itself
 * and the file's size before allocating anything; the whole-file XXH3_128
 * runs across ckpt_open (header, tokens) and ckpt_read_pages (padding,
 * pages, checksums). Blocking, no logging, no globals but the test hook
 * ckpt_inject (set once at start): thread-safe.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "guard.h"
#include "kernels.h"
#include "le.h"

#define HDR_BYTES     512u
#define TOKEN_BYTES   16u
#define SUM_BYTES     8u
#define TRAILER_BYTES 32u

static const char hdr_magic[8] = "KVPCKPT";
static const char end_magic[8] = "KVPCEND";

/* Header field offsets (see ckpt.h). */
enum {
	H_MAGIC = 0,
	H_VERSION = 8,
	H_HDR_BYTES = 12,
	H_HDR_XXH = 16,
	H_UID = 24,
	H_N_PAGES = 28,
	H_N_TOKENS = 32,
	H_CREATED = 40,
	H_PAGE_BYTES = 48,
	H_LAYOUT = 56,
	H_ROOT = 80,
	H_TOKENS_OFF = 96,
	H_TOKENS_BYTES = 104,
	H_TOKENS_XXH = 112,
	H_PAGES_OFF = 120,
	H_SUMS_OFF = 128,
	H_TRAILER_OFF = 136,
	H_FILE_BYTES = 144,
	H_MODEL_ID = 152,
	H_POOL_LAYOUT = H_MODEL_ID + CKPT_MODEL_ID_BYTES,
	H_NAME = H_POOL_LAYOUT + 24,
	H_NAME_BYTES = 72,
	H_RESERVED = H_NAME + H_NAME_BYTES,
	H_N_SPANS = H_RESERVED,	      /* version 4 */
	H_SPANS_ZERO = H_N_SPANS + 4, /* u32 zero */
	H_SPANS_XXH = H_SPANS_ZERO + 4,
	H_RESERVED_4 = H_SPANS_XXH + 8,
	H_PAGE_FORMAT = H_RESERVED_4, /* version 4, written later: 0 in older files */
	H_RESERVED_4F = H_PAGE_FORMAT + 4,
};
#define SPAN_BYTES 32u
_Static_assert(H_POOL_LAYOUT == 280 && H_NAME == 304 && H_RESERVED == 376 &&
		       H_NAME_BYTES > CKPT_NAME_MAX && H_RESERVED < HDR_BYTES,
	       "header fields fit");

/* Trailer field offsets. */
enum {
	T_MAGIC = 0,
	T_TRAILER_OFF = 8,
	T_FILE_XXH = 16,
};

/* ---- helpers ---------------------------------------------------------------- */

static void say(char *why, size_t whylen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void say(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;

	if (!why || !whylen)
		return;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
}

/* strerror without a shared buffer. */
static const char *errstr(int err)
{
	const char *s = strerrordesc_np(err < 0 ? -err : err);

	return s ? s : "unknown error";
}

int (*ckpt_inject)(enum ckpt_io op, size_t *max_bytes);

/* What the test hook says about the next call of op moving up to *n
 * bytes: 0 (with *n possibly lowered) or the -errno to fail it with. */
static int inject(enum ckpt_io op, size_t *n)
{
	int (*hook)(enum ckpt_io, size_t *) = ckpt_inject;
	size_t max = *n;
	int ret;

	if (!hook)
		return 0;
	ret = hook(op, &max);
	if (ret < 0)
		return ret;
	if (max && max < *n)
		*n = max;
	return 0;
}

/* fsync, or what the test hook fails it with. */
static int sync_fd(int fd, enum ckpt_io op)
{
	size_t none = 0;
	int ret = inject(op, &none);

	if (ret < 0)
		return ret;
	return fsync(fd) < 0 ? -errno : 0;
}

/* Reads n bytes at off. Returns 0, -ENODATA when the file ends first, or
 * -errno. */
static int pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	unsigned char *p = buf;

	while (n) {
		size_t step = n;
		ssize_t got;
		int ret = inject(CKPT_IO_READ, &step);

		if (ret == -EINTR)
			continue;
		if (ret < 0)
			return ret;
		got = pread(fd, p, step, (off_t)off);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (got == 0)
			return -ENODATA;
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

/* O_DIRECT refused a write (an alignment the file system wants and we do
 * not have, or a test hook's odd short write): the rest goes through the
 * page cache, which the fsync before the rename makes as durable. Returns
 * 1 when it switched, 0 when fd was not O_DIRECT (the error stands). */
static int leave_direct(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || !(fl & O_DIRECT))
		return 0;
	return fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

/* Writes n bytes at off. Returns 0 or -errno. */
static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	const unsigned char *p = buf;

	while (n) {
		size_t step = n;
		ssize_t put;
		int ret = inject(CKPT_IO_WRITE, &step);

		if (ret == -EINTR)
			continue;
		if (ret < 0)
			return ret;
		put = pwrite(fd, p, step, (off_t)off);
		if (put < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && leave_direct(fd))
				continue;
			return -errno;
		}
		if (put == 0)
			return -EIO;
		p += put;
		n -= (size_t)put;
		off += (uint64_t)put;
	}
	return 0;
}

/* Writes the n (<= IOV_MAX) buffers of iov back to back at off; iov is
 * consumed. Returns 0 or -errno. */
static int pwritev_full(int fd, struct iovec *iov, int n, uint64_t off)
{
	while (n) {
		size_t total = 0, step;
		ssize_t put;
		int ret;

		for (int i = 0; i < n; i++)
			total += iov[i].iov_len;
		step = total;
		ret = inject(CKPT_IO_WRITE, &step);
		if (ret == -EINTR)
			continue;
		if (ret < 0)
			return ret;
		if (step < total) /* the hook cut it short: at most step bytes */
			put = pwrite(fd, iov[0].iov_base,
				     step < iov[0].iov_len ? step : iov[0].iov_len, (off_t)off);
		else
			put = pwritev(fd, iov, n, (off_t)off);
		if (put < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && leave_direct(fd))
				continue;
			return -errno;
		}
		if (put == 0)
			return -EIO;
		off += (uint64_t)put;
		while (put > 0) {
			size_t k = (size_t)put < iov->iov_len ? (size_t)put : iov->iov_len;

			iov->iov_base = (char *)iov->iov_base + k;
			iov->iov_len -= k;
			put -= (ssize_t)k;
			if (!iov->iov_len) {
				iov++;
				n--;
			}
		}
	}
	return 0;
}

/* Where the sections of a checkpoint with these counts lie. The callers
 * bound the counts first (n_tokens ≤ n_pages * block_tokens ≤ 2^44,
 * page_bytes ≤ 2^28), so nothing here overflows. */
struct geom {
	uint64_t tokens_bytes;
	uint64_t spans_bytes; /* after the token records */
	uint64_t spans_xxh;   /* decode_header: the header's XXH3_64 of them */
	uint64_t pages_off;
	uint64_t sums_off;
	uint64_t trailer_off;
	uint64_t file_bytes;
};

static void geom_of(uint64_t n_tokens, uint32_t n_spans, uint32_t n_pages, uint64_t page_bytes,
		    struct geom *g)
{
	g->tokens_bytes = n_tokens * TOKEN_BYTES;
	g->spans_bytes = (uint64_t)n_spans * SPAN_BYTES;
	g->pages_off = (HDR_BYTES + g->tokens_bytes + g->spans_bytes + SHM_PAGE_ALIGN - 1) /
		       SHM_PAGE_ALIGN * SHM_PAGE_ALIGN;
	g->sums_off = g->pages_off + (uint64_t)n_pages * page_bytes;
	g->trailer_off = g->sums_off + (uint64_t)n_pages * SUM_BYTES;
	g->file_bytes = g->trailer_off + TRAILER_BYTES;
}

/* Length of a valid model id in a CKPT_MODEL_ID_BYTES buffer, else 0. */
static size_t model_id_len(const char *s)
{
	size_t n = strnlen(s, CKPT_MODEL_ID_BYTES);

	if (n == 0 || n == CKPT_MODEL_ID_BYTES)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return 0;
	return n;
}

/* What is wrong with m's layout, page size and counts, or NULL. */
static const char *meta_problem(const struct ckpt_meta *m)
{
	uint32_t bt = m->layout.block_tokens;

	if (!model_id_len(m->model_id))
		return "model id is not 1..127 printable ASCII bytes";
	if (shm_layout_check(&m->layout) < 0)
		return "layout refused";
	if (m->page_bytes != shm_page_bytes(&m->layout))
		return "page size does not match the layout";
	if (m->n_pages != m->n_tokens / bt + (m->n_tokens % bt != 0))
		return "page count is not ceil(tokens / tokens per page)";
	if (m->n_spans > CKPT_MAX_SPANS)
		return "more than 65536 key spans";
	if (!memcmp(&m->pool_layout, &m->layout, sizeof(m->layout)))
		return NULL;
	/* Stored quantized: the pool has the same shape, unquantized. */
	if (shm_layout_check(&m->pool_layout) < 0 ||
	    m->pool_layout.n_layers != m->layout.n_layers ||
	    m->pool_layout.n_kv_heads != m->layout.n_kv_heads ||
	    m->pool_layout.head_dim != m->layout.head_dim || m->pool_layout.block_tokens != bt ||
	    shm_dtype_quantized(m->pool_layout.dtype) || !shm_dtype_quantized(m->layout.dtype))
		return "pool layout is not the stored layout's shape unquantized";
	return NULL;
}

/* Why spans[0..n) are no key spans of n_tokens tokens (ckpt.h), or NULL. */
static const char *spans_problem(const struct ckpt_span *spans, uint32_t n, uint64_t n_tokens)
{
	for (uint32_t i = 0; i < n; i++) {
		if (!spans[i].n_tokens || spans[i].first_token >= n_tokens ||
		    spans[i].n_tokens > n_tokens - spans[i].first_token)
			return "a key span is empty or ends past the tokens";
		if (i && spans[i].first_token < spans[i - 1].first_token + spans[i - 1].n_tokens)
			return "key spans not sorted or overlapping";
	}
	return NULL;
}

static void put_layout(unsigned char *p, const struct shm_layout *l)
{
	const uint32_t v[6] = {l->n_layers,	l->n_kv_heads, l->head_dim,
			       l->block_tokens, l->dtype,      l->quant_group};

	for (int i = 0; i < 6; i++)
		le_put32(p + 4 * i, v[i]);
}

static struct shm_layout get_layout(const unsigned char *p)
{
	return (struct shm_layout){le_get32(p),
				   le_get32(p + 4),
				   le_get32(p + 8),
				   le_get32(p + 12),
				   le_get32(p + 16),
				   le_get32(p + 20),
				   0};
}

static int token_ok(uint16_t role, uint16_t flags)
{
	return role <= CKPT_ROLE_ASSISTANT && !(flags & ~CKPT_TOKEN_FLAGS);
}

/* ---- names ------------------------------------------------------------------ */

static int name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

int ckpt_name_valid(const char *name)
{
	size_t n;

	if (!name)
		return 0;
	n = strnlen(name, CKPT_NAME_MAX + 1);
	if (n == 0 || n > CKPT_NAME_MAX || name[0] == '.' || name[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!name_char(name[i]))
			return 0;
	return 1;
}

/* Whether name is one ckpt_write could have used as a temporary:
 * CKPT_TMP_PREFIX, a valid name, '-', 16 lower-case hex digits. */
static int tmp_name(const char *name)
{
	const size_t pre = sizeof(CKPT_TMP_PREFIX) - 1;
	size_t n = strlen(name);
	char base[CKPT_NAME_MAX + 1];

	if (strncmp(name, CKPT_TMP_PREFIX, pre) || n < pre + 1 + 1 + 16 ||
	    n > pre + CKPT_NAME_MAX + 1 + 16 || name[n - 17] != '-')
		return 0;
	for (size_t i = n - 16; i < n; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
			return 0;
	memcpy(base, name + pre, n - 17 - pre);
	base[n - 17 - pre] = '\0';
	return ckpt_name_valid(base);
}

/* A fresh temporary name for name in buf (CKPT_TMP_PREFIX + 64 + 1 + 16 + NUL). */
#define TMP_NAME_BYTES (sizeof(CKPT_TMP_PREFIX) + CKPT_NAME_MAX + 1 + 16)

static void make_tmp_name(char *buf, const char *name)
{
	uint64_t r;
	struct timespec ts;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		r = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		r ^= (uint64_t)gettid() << 40 ^ (uint64_t)(uintptr_t)buf;
	}
	snprintf(buf, TMP_NAME_BYTES, CKPT_TMP_PREFIX "%s-%016llx", name, (unsigned long long)r);
}

/* ---- writing ---------------------------------------------------------------- */

static void encode_header(unsigned char *h, const struct ckpt_meta *m, const char *name,
			  uint64_t created_ns, const struct geom *g, uint64_t tokens_xxh,
			  uint64_t spans_xxh)
{
	const struct shm_layout *l = &m->layout;
	const uint32_t lay[6] = {l->n_layers,	  l->n_kv_heads, l->head_dim,
				 l->block_tokens, l->dtype,	 l->quant_group};
	XXH128_canonical_t root;

	memset(h, 0, HDR_BYTES);
	memcpy(h + H_MAGIC, hdr_magic, sizeof(hdr_magic));
	le_put32(h + H_VERSION, CKPT_FORMAT_VERSION);
	le_put32(h + H_HDR_BYTES, HDR_BYTES);
	le_put32(h + H_UID, m->uid);
	le_put32(h + H_N_PAGES, m->n_pages);
	le_put64(h + H_N_TOKENS, m->n_tokens);
	le_put64(h + H_CREATED, created_ns);
	le_put64(h + H_PAGE_BYTES, m->page_bytes);
	for (int i = 0; i < 6; i++)
		le_put32(h + H_LAYOUT + 4 * i, lay[i]);
	XXH128_canonicalFromHash(&root, m->root);
	memcpy(h + H_ROOT, root.digest, sizeof(root.digest));
	le_put64(h + H_TOKENS_OFF, HDR_BYTES);
	le_put64(h + H_TOKENS_BYTES, g->tokens_bytes);
	le_put64(h + H_TOKENS_XXH, tokens_xxh);
	le_put32(h + H_N_SPANS, m->n_spans);
	le_put64(h + H_SPANS_XXH, spans_xxh);
	le_put64(h + H_PAGES_OFF, g->pages_off);
	le_put64(h + H_SUMS_OFF, g->sums_off);
	le_put64(h + H_TRAILER_OFF, g->trailer_off);
	le_put64(h + H_FILE_BYTES, g->file_bytes);
	memcpy(h + H_MODEL_ID, m->model_id, model_id_len(m->model_id));
	put_layout(h + H_POOL_LAYOUT, &m->pool_layout);
	le_put32(h + H_PAGE_FORMAT, m->layout.format);
	/* ckpt_write checked it: 1..CKPT_NAME_MAX bytes, NUL-padded here. */
	memcpy(h + H_NAME, name, strlen(name));
	le_put64(h + H_HDR_XXH, XXH3_64bits(h, HDR_BYTES));
}

static void encode_token(unsigned char *p, const struct ckpt_token *t)
{
	le_put32(p, t->id);
	le_put32(p + 4, t->pos);
	le_put32(p + 8, t->turn);
	le_put16(p + 12, t->role);
	le_put16(p + 14, t->flags);
}

/* A page copied (or quantized) into the writer's bounce buffer. */
struct to_bounce {
	void *bounce;
	const void *page;
	const struct ckpt_meta *m;
	const struct shm_layout *pool_layout;
	int quantize;
};

static int copy_to_bounce(void *arg)
{
	struct to_bounce *t = arg;

	if (t->quantize) {
		/* Fresh zeros for the padding, then the kernels' codes. */
		memset(t->bounce, 0, t->m->page_bytes);
		kref_convert_pages(&t->m->layout, (void *const *)&t->bounce, t->pool_layout,
				   &t->page, 1, 0, t->m->layout.block_tokens);
	} else {
		memcpy(t->bounce, t->page, t->m->page_bytes);
	}
	return 0;
}

/* Hashes a page of the arena where it lies (written from there, or read
 * into it), under the guard (guard.h): its own sum and the file's. */
struct page_hash {
	const void *page;
	size_t n;
	uint64_t sum;
	XXH3_state_t *xs;
};

static int hash_page(void *arg)
{
	struct page_hash *h = arg;

	h->sum = XXH3_64bits(h->page, h->n);
	XXH3_128bits_update(h->xs, h->page, h->n);
	return 0;
}

/* Pages written by one pwritev: enough for the disk to stream. */
#define WRITE_BATCH_BYTES (8u << 20)
#define WRITE_BATCH_IOVS  64

/* The pages' batches go out on a private io_uring, one in flight while
 * the writer hashes the next (the two hashes of a page took about a third
 * of a checkpoint's time, the write the rest: in a row, the disk waited
 * for the hashes). Where the daemon's disk I/O does not use io_uring
 * (ckpt_uring 0), no ring can be had, the ring fails, or the test hook is
 * set, each batch is written with pwritev as it comes, as before. */
struct wpipe {
	struct io_uring ring;
	int ring_ok;
	int busy; /* batch [cur ^ 1] is in flight */
	int cur;  /* the iov set being filled */
	struct iovec iov[2][WRITE_BATCH_IOVS];
	int n_iov[2];
	uint64_t at[2], len[2];
};

int ckpt_uring = 1;

static void wpipe_init(struct wpipe *w)
{
	w->busy = w->cur = 0;
	w->ring_ok = ckpt_uring && !ckpt_inject && io_uring_queue_init(2, &w->ring, 0) == 0;
}

/* Drops the ring. A write still in flight (only after a failed wait)
 * has its iovecs (copied at submission) and reads the arena, which stays
 * mapped; nothing else of the caller's is touched after this. */
static void wpipe_off(struct wpipe *w)
{
	if (w->ring_ok)
		io_uring_queue_exit(&w->ring);
	w->ring_ok = w->busy = 0;
}

/* Waits for the batch in flight, if any. A short write or one O_DIRECT
 * refused is written again whole with pwritev (the same bytes at the same
 * place). Returns 0 or -errno. */
static int wpipe_wait(struct wpipe *w, int fd)
{
	struct io_uring_cqe *cqe;
	int b = w->cur ^ 1, ret, res;

	if (!w->busy)
		return 0;
	while ((ret = io_uring_wait_cqe(&w->ring, &cqe)) == -EINTR)
		;
	if (ret < 0) {
		/* The ring failed: the write's fate is unknown, and it may
		 * still land (after anything written again now): the
		 * checkpoint fails, and a late write lands in its temporary,
		 * which is removed. */
		wpipe_off(w);
		return -EIO;
	}
	res = cqe->res;
	io_uring_cqe_seen(&w->ring, cqe);
	w->busy = 0;
	if (res >= 0 && (uint64_t)res == w->len[b])
		return 0;
	if (res >= 0 || res == -EINVAL || res == -EAGAIN || res == -EINTR)
		return pwritev_full(fd, w->iov[b], w->n_iov[b], w->at[b]);
	return res;
}

/* Writes the n_iov buffers of the current set, len bytes at at: starts
 * them on the ring after the batch before has landed, or writes them now.
 * Returns 0 or -errno. */
static int wpipe_put(struct wpipe *w, int fd, int n_iov, uint64_t at, uint64_t len)
{
	struct io_uring_sqe *sqe;
	int ret;

	ret = wpipe_wait(w, fd);
	if (ret < 0)
		return ret;
	sqe = w->ring_ok ? io_uring_get_sqe(&w->ring) : NULL;
	if (!sqe)
		return pwritev_full(fd, w->iov[w->cur], n_iov, at);
	io_uring_prep_writev(sqe, fd, w->iov[w->cur], (unsigned)n_iov, at);
	w->n_iov[w->cur] = n_iov;
	w->at[w->cur] = at;
	w->len[w->cur] = len;
	if (io_uring_submit(&w->ring) != 1) {
		/* Not taken, but still queued in the ring (a later submit
		 * would send it over other bytes): the ring goes, and this
		 * batch and the rest are written without it. */
		wpipe_off(w);
		return pwritev_full(fd, w->iov[w->cur], n_iov, at);
	}
	w->busy = 1;
	w->cur ^= 1;
	return 0;
}

/* A failed checkpoint: waits for the write in flight, whatever it gives,
 * and drops the ring. */
static void wpipe_drop(struct wpipe *w)
{
	struct io_uring_cqe *cqe;

	if (w->busy)
		while (io_uring_wait_cqe(&w->ring, &cqe) == -EINTR)
			;
	wpipe_off(w);
}

int ckpt_write(int dir_fd, const char *name, const struct ckpt_meta *m,
	       const struct ckpt_token *tokens, const void *const *pages, uint64_t *ret_bytes,
	       char *why, size_t whylen)
{
	char tmp[TMP_NAME_BYTES];
	unsigned char *head = NULL, *tail = NULL, *bounce = NULL;
	XXH3_state_t *xs = NULL;
	XXH128_canonical_t digest;
	const char *problem, *step = NULL;
	uint64_t created_ns;
	struct timespec now;
	struct geom g;
	struct ckpt_meta mm = *m;
	struct wpipe wp = {.ring_ok = 0};
	int fd = -1, made = 0, quantize, ret;

	if (!ckpt_name_valid(name)) {
		say(why, whylen, "invalid checkpoint name");
		return -EINVAL;
	}
	if (!mm.pool_layout.n_layers)
		mm.pool_layout = mm.layout;
	quantize = memcmp(&mm.pool_layout, &mm.layout, sizeof(mm.layout)) != 0;
	problem = meta_problem(&mm);
	if (problem) {
		say(why, whylen, "checkpoint meta: %s", problem);
		return -EINVAL;
	}
	if ((m->n_tokens && !tokens) || (m->n_pages && !pages)) {
		say(why, whylen, "checkpoint meta: missing token or page array");
		return -EINVAL;
	}
	for (uint32_t i = 0; i < m->n_pages; i++) {
		if (!pages[i]) {
			say(why, whylen, "checkpoint page %u is NULL", i);
			return -EINVAL;
		}
	}
	for (uint64_t i = 0; i < m->n_tokens; i++) {
		if (!token_ok(tokens[i].role, tokens[i].flags)) {
			say(why, whylen, "token %llu: unknown role %u or flags %#x",
			    (unsigned long long)i, tokens[i].role, tokens[i].flags);
			return -EINVAL;
		}
	}
	if ((m->n_spans && !m->spans) || spans_problem(m->spans, m->n_spans, m->n_tokens)) {
		say(why, whylen, "checkpoint meta: %s",
		    m->n_spans && !m->spans ? "missing key span array"
					    : spans_problem(m->spans, m->n_spans, m->n_tokens));
		return -EINVAL;
	}
	created_ns = m->created_ns;
	if (!created_ns) {
		clock_gettime(CLOCK_REALTIME, &now);
		created_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
	}
	geom_of(m->n_tokens, m->n_spans, m->n_pages, m->page_bytes, &g);

	/* Header, token records and padding: [0, pages_off). Page checksums
	 * and trailer: [sums_off, file_bytes). One page: the bounce buffer. */
	ret = -ENOMEM;
	step = "allocating buffers";
	if (posix_memalign((void **)&head, SHM_PAGE_ALIGN, g.pages_off))
		head = NULL;
	else
		memset(head, 0, g.pages_off);
	tail = malloc(g.file_bytes - g.sums_off);
	if (m->n_pages && posix_memalign((void **)&bounce, SHM_PAGE_ALIGN, m->page_bytes))
		bounce = NULL;
	xs = XXH3_createState();
	if (!head || !tail || (m->n_pages && !bounce) || !xs)
		goto fail;
	for (uint64_t i = 0; i < m->n_tokens; i++)
		encode_token(head + HDR_BYTES + i * TOKEN_BYTES, &tokens[i]);
	for (uint32_t i = 0; i < m->n_spans; i++) {
		unsigned char *p = head + HDR_BYTES + g.tokens_bytes + (uint64_t)i * SPAN_BYTES;

		le_put64(p, m->spans[i].first_token);
		le_put64(p + 8, m->spans[i].n_tokens);
		XXH128_canonicalFromHash((XXH128_canonical_t *)(p + 16), m->spans[i].key);
	}
	encode_header(
		head, &mm, name, created_ns, &g, XXH3_64bits(head + HDR_BYTES, g.tokens_bytes),
		m->n_spans ? XXH3_64bits(head + HDR_BYTES + g.tokens_bytes, g.spans_bytes) : 0);
	XXH3_128bits_reset(xs);
	XXH3_128bits_update(xs, head, g.pages_off);

	step = "creating the temporary";
	for (int tries = 0; tries < 16; tries++) {
		make_tmp_name(tmp, name);
		/* O_DIRECT: the pages go from the arena to the disk, no copy
		 * in the page cache; where the file system refuses it, without. */
		fd = openat(dir_fd, tmp,
			    O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_DIRECT, 0600);
		if (fd < 0 && errno == EINVAL)
			fd = openat(dir_fd, tmp,
				    O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		ret = -errno;
		goto fail;
	}
	made = 1;

	/* The file's blocks first: a file system too full for the
	 * checkpoint fails here, before a byte of it is written (a large
	 * checkpoint used to find out at its end). Where the file system
	 * cannot allocate ahead, writes allocate as they go. */
	step = "reserving the file's space";
	while ((ret = fallocate(fd, 0, 0, (off_t)g.file_bytes) < 0 ? -errno : 0) == -EINTR)
		;
	if (ret < 0 && ret != -EOPNOTSUPP && ret != -ENOSYS)
		goto fail;
	step = "writing the header";
	ret = pwrite_full(fd, head, g.pages_off, 0);
	if (ret < 0)
		goto fail;
	step = "writing pages";
	wpipe_init(&wp);
	for (uint32_t i = 0; i < m->n_pages;) {
		struct iovec *iov = wp.iov[wp.cur];
		uint64_t at = g.pages_off + (uint64_t)i * m->page_bytes, batch = 0;
		int n_iov = 0;

		/* Pages stored as they are and aligned go from the arena as
		 * they lie, hashed there first: a client scribbling on one
		 * meanwhile makes the file fail its checks at restore (a
		 * refused checkpoint, never wrong KV), as a spilled page's
		 * does. Neighbours in the arena share one iovec. */
		for (; !quantize && i < m->n_pages && batch < WRITE_BATCH_BYTES; i++) {
			struct page_hash ah = {pages[i], m->page_bytes, 0, xs};

			if ((uintptr_t)pages[i] % SHM_PAGE_ALIGN)
				break;
			if (n_iov && (char *)iov[n_iov - 1].iov_base + iov[n_iov - 1].iov_len ==
					     (const char *)pages[i]) {
				iov[n_iov - 1].iov_len += m->page_bytes;
			} else if (n_iov < WRITE_BATCH_IOVS) {
				iov[n_iov].iov_base = (void *)pages[i];
				iov[n_iov++].iov_len = m->page_bytes;
			} else {
				break;
			}
			/* The arena is the clients': memory they took away is
			 * a failed checkpoint, not a dead daemon (guard.h). */
			if (guard_run(hash_page, &ah) < 0) {
				ret = -EFAULT;
				step = "reading a page (its memory is gone from the arena)";
				goto fail;
			}
			le_put64(tail + (uint64_t)i * SUM_BYTES, ah.sum);
			batch += m->page_bytes;
		}
		if (n_iov) {
			ret = wpipe_put(&wp, fd, n_iov, at, batch);
			if (ret < 0)
				goto fail;
			continue;
		}
		/* Quantized or unaligned: through the bounce buffer, after
		 * what is in flight. */
		ret = wpipe_wait(&wp, fd);
		if (ret < 0)
			goto fail;
		struct to_bounce tb = {bounce, pages[i], m, &mm.pool_layout, quantize};

		ret = guard_run(copy_to_bounce, &tb);
		if (ret < 0) {
			step = "reading a page (its memory is gone from the arena)";
			goto fail;
		}
		le_put64(tail + (uint64_t)i * SUM_BYTES, XXH3_64bits(bounce, m->page_bytes));
		XXH3_128bits_update(xs, bounce, m->page_bytes);
		ret = pwrite_full(fd, bounce, m->page_bytes, at);
		if (ret < 0)
			goto fail;
		i++;
	}
	ret = wpipe_wait(&wp, fd);
	wpipe_off(&wp);
	if (ret < 0)
		goto fail;
	XXH3_128bits_update(xs, tail, g.trailer_off - g.sums_off);
	{
		unsigned char *t = tail + (g.trailer_off - g.sums_off);

		memcpy(t + T_MAGIC, end_magic, sizeof(end_magic));
		le_put64(t + T_TRAILER_OFF, g.trailer_off);
		XXH128_canonicalFromHash(&digest, XXH3_128bits_digest(xs));
		memcpy(t + T_FILE_XXH, digest.digest, sizeof(digest.digest));
	}
	/* Its length is no multiple of 4096: through the page cache. */
	step = "writing the trailer";
	leave_direct(fd);
	ret = pwrite_full(fd, tail, g.file_bytes - g.sums_off, g.sums_off);
	if (ret < 0)
		goto fail;

	/* A failed fsync is final: the page cache may have dropped the
	 * dirty pages, so a retry could "succeed" over lost data. */
	step = "fsync";
	ret = sync_fd(fd, CKPT_IO_FSYNC);
	if (ret < 0)
		goto fail;
	step = "close";
	ret = close(fd) < 0 ? -errno : 0;
	fd = -1;
	if (ret < 0 && ret != -EINTR)
		goto fail;
	step = "rename";
	if (renameat(dir_fd, tmp, dir_fd, name) < 0) {
		ret = -errno;
		goto fail;
	}
	made = 0;
	ret = sync_fd(dir_fd, CKPT_IO_DIRSYNC);
	if (ret < 0) {
		say(why, whylen,
		    "fsync of the checkpoint directory: %s (the new checkpoint is in place but "
		    "may not survive a crash)",
		    errstr(ret));
		goto out;
	}
	if (ret_bytes)
		*ret_bytes = g.file_bytes;
	ret = 0;
	goto out;

fail:
	say(why, whylen, "checkpoint write, %s: %s", step, errstr(ret));
	wpipe_drop(&wp);
	if (fd >= 0)
		close(fd);
	if (made)
		unlinkat(dir_fd, tmp, 0);
out:
	XXH3_freeState(xs);
	free(bounce);
	free(tail);
	free(head);
	return ret;
}

/* ---- reading ---------------------------------------------------------------- */

/* Decodes and checks the header h of a file of file_bytes bytes into m,
 * g and *ret_tokens_xxh. Returns 0, -EBADMSG or -EPROTONOSUPPORT. */
static int decode_header(const unsigned char *h, uint64_t file_bytes, struct ckpt_meta *m,
			 struct geom *g, uint64_t *ret_tokens_xxh, char *why, size_t whylen)
{
	unsigned char z[HDR_BYTES];
	XXH128_canonical_t root;
	uint32_t lay[6];
	const char *problem;

	if (memcmp(h + H_MAGIC, hdr_magic, sizeof(hdr_magic))) {
		say(why, whylen, "not a checkpoint: bad magic");
		return -EBADMSG;
	}
	memset(m, 0, sizeof(*m));
	m->version = le_get32(h + H_VERSION);
	if (m->version > CKPT_FORMAT_VERSION) {
		say(why, whylen, "format version %u is newer than this daemon's %u", m->version,
		    CKPT_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (m->version == 0 || le_get32(h + H_HDR_BYTES) != HDR_BYTES) {
		say(why, whylen, "header: bad version or header size");
		return -EBADMSG;
	}
	memcpy(z, h, HDR_BYTES);
	memset(z + H_HDR_XXH, 0, 8);
	if (XXH3_64bits(z, HDR_BYTES) != le_get64(h + H_HDR_XXH)) {
		say(why, whylen, "header checksum mismatch");
		return -EBADMSG;
	}

	m->uid = le_get32(h + H_UID);
	m->n_pages = le_get32(h + H_N_PAGES);
	m->n_tokens = le_get64(h + H_N_TOKENS);
	m->created_ns = le_get64(h + H_CREATED);
	m->page_bytes = le_get64(h + H_PAGE_BYTES);
	for (int i = 0; i < 6; i++)
		lay[i] = le_get32(h + H_LAYOUT + 4 * i);
	m->layout = (struct shm_layout){lay[0], lay[1], lay[2], lay[3], lay[4], lay[5], 0};
	memcpy(root.digest, h + H_ROOT, sizeof(root.digest));
	m->root = XXH128_hashFromCanonical(&root);
	memcpy(m->model_id, h + H_MODEL_ID, CKPT_MODEL_ID_BYTES);
	/* Version 1 has zeros there: its pages are stored as they are. */
	m->pool_layout = m->version >= 2 ? get_layout(h + H_POOL_LAYOUT) : m->layout;
	/* The page format of both: K/V (0) in files written before it. */
	m->layout.format = m->pool_layout.format =
		m->version >= 4 ? le_get32(h + H_PAGE_FORMAT) : 0;
	for (size_t i = strnlen(m->model_id, CKPT_MODEL_ID_BYTES); i < CKPT_MODEL_ID_BYTES; i++) {
		if (m->model_id[i]) {
			say(why, whylen, "header: model id not NUL-padded");
			return -EBADMSG;
		}
	}
	if (m->version >= 3) {
		/* The name: valid, then zeros to the end of its field. */
		memcpy(m->name, h + H_NAME, CKPT_NAME_MAX);
		m->name[CKPT_NAME_MAX] = '\0';
		for (size_t i = strlen(m->name); i < H_NAME_BYTES; i++) {
			if (h[H_NAME + i]) {
				say(why, whylen, "header: name not NUL-padded");
				return -EBADMSG;
			}
		}
		if (!ckpt_name_valid(m->name)) {
			say(why, whylen, "header: the recorded name is not a valid name");
			return -EBADMSG;
		}
	}
	m->n_spans = m->version >= 4 ? le_get32(h + H_N_SPANS) : 0;
	m->spans = NULL;
	g->spans_xxh = m->version >= 4 ? le_get64(h + H_SPANS_XXH) : 0;
	for (size_t i = m->version >= 4	  ? H_SPANS_ZERO
			: m->version >= 3 ? H_RESERVED
			: m->version >= 2 ? H_NAME
					  : H_POOL_LAYOUT;
	     i < HDR_BYTES; i++) {
		if (h[i] && !(m->version >= 4 && i >= H_SPANS_XXH && i < H_RESERVED_4F)) {
			say(why, whylen, "header: reserved bytes not zero");
			return -EBADMSG;
		}
	}
	/* Bounds the counts (see geom_of) before any arithmetic on them. */
	problem = meta_problem(m);
	if (problem) {
		say(why, whylen, "header: %s", problem);
		return -EBADMSG;
	}
	geom_of(m->n_tokens, m->n_spans, m->n_pages, m->page_bytes, g);
	if (le_get64(h + H_TOKENS_OFF) != HDR_BYTES ||
	    le_get64(h + H_TOKENS_BYTES) != g->tokens_bytes ||
	    le_get64(h + H_PAGES_OFF) != g->pages_off || le_get64(h + H_SUMS_OFF) != g->sums_off ||
	    le_get64(h + H_TRAILER_OFF) != g->trailer_off ||
	    le_get64(h + H_FILE_BYTES) != g->file_bytes) {
		say(why, whylen, "header: section offsets disagree with the counts");
		return -EBADMSG;
	}
	if (file_bytes < g->file_bytes) {
		say(why, whylen, "truncated: the file is %llu bytes, its header describes %llu",
		    (unsigned long long)file_bytes, (unsigned long long)g->file_bytes);
		return -EBADMSG;
	}
	if (file_bytes > g->file_bytes) {
		say(why, whylen,
		    "the file is %llu bytes, longer than the %llu its header describes",
		    (unsigned long long)file_bytes, (unsigned long long)g->file_bytes);
		return -EBADMSG;
	}
	m->file_bytes = g->file_bytes;
	*ret_tokens_xxh = le_get64(h + H_TOKENS_XXH);
	return 0;
}

/* Checks the trailer at g->trailer_off: its magic and offset, and, when
 * want is not NULL, its whole-file checksum. */
static int check_trailer(int fd, const struct geom *g, const XXH128_hash_t *want, char *why,
			 size_t whylen)
{
	unsigned char t[TRAILER_BYTES];
	XXH128_canonical_t c;
	int ret = pread_full(fd, t, sizeof(t), g->trailer_off);

	if (ret == -ENODATA) {
		say(why, whylen, "truncated: the trailer is missing");
		return -EBADMSG;
	}
	if (ret < 0) {
		say(why, whylen, "reading the trailer: %s", errstr(ret));
		return ret;
	}
	if (memcmp(t + T_MAGIC, end_magic, sizeof(end_magic)) ||
	    le_get64(t + T_TRAILER_OFF) != g->trailer_off) {
		say(why, whylen, "trailer: bad magic or offset");
		return -EBADMSG;
	}
	if (want) {
		XXH128_canonicalFromHash(&c, *want);
		if (memcmp(t + T_FILE_XXH, c.digest, sizeof(c.digest))) {
			say(why, whylen, "trailer: whole-file checksum mismatch");
			return -EBADMSG;
		}
	}
	return 0;
}

/* Opens name and checks its header and trailer magic. Returns 0 with the
 * fd in *ret_fd and the raw header in h, or a negative errno. */
static int open_header(int dir_fd, const char *name, int *ret_fd, unsigned char *h,
		       struct ckpt_meta *m, struct geom *g, uint64_t *ret_tokens_xxh, char *why,
		       size_t whylen)
{
	struct stat st;
	int fd, ret;

	if (!ckpt_name_valid(name)) {
		say(why, whylen, "invalid checkpoint name");
		return -EINVAL;
	}
	fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		ret = -errno;
		say(why, whylen, "open: %s", errstr(ret));
		return ret;
	}
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		say(why, whylen, "fstat: %s", errstr(ret));
		goto fail;
	}
	ret = -EBADMSG;
	if (!S_ISREG(st.st_mode)) {
		say(why, whylen, "not a regular file");
		goto fail;
	}
	if ((uint64_t)st.st_size < HDR_BYTES) {
		say(why, whylen, "truncated: the file is %llu bytes, shorter than a header",
		    (unsigned long long)st.st_size);
		goto fail;
	}
	ret = pread_full(fd, h, HDR_BYTES, 0);
	if (ret == -ENODATA) {
		say(why, whylen, "truncated: the header is incomplete");
		ret = -EBADMSG;
	} else if (ret < 0) {
		say(why, whylen, "reading the header: %s", errstr(ret));
	}
	if (ret < 0)
		goto fail;
	ret = decode_header(h, (uint64_t)st.st_size, m, g, ret_tokens_xxh, why, whylen);
	if (ret < 0)
		goto fail;
	/* A file copied or renamed over another name is not that checkpoint
	 * (older versions record no name: taken to be the file's, ckpt.h). */
	if (m->name[0] && strcmp(m->name, name)) {
		say(why, whylen, "the file holds checkpoint '%s', not '%s' (copied or renamed?)",
		    m->name, name);
		ret = -EBADMSG;
		goto fail;
	}
	ret = check_trailer(fd, g, NULL, why, whylen);
	if (ret < 0)
		goto fail;
	*ret_fd = fd;
	return 0;
fail:
	close(fd);
	return ret;
}

/* Reads and checks the key span records after the token records, adding
 * them to the whole-file hash. */
static int read_spans(struct ckpt_reader *r, const struct geom *g, char *why, size_t whylen)
{
	const char *problem;
	unsigned char *raw;
	int ret;

	if (!r->meta.n_spans) {
		if (g->spans_xxh) {
			say(why, whylen, "key span records checksum mismatch");
			return -EBADMSG;
		}
		return 0;
	}
	raw = malloc(g->spans_bytes);
	r->spans = malloc(r->meta.n_spans * sizeof(*r->spans));
	if (!raw || !r->spans) {
		free(raw);
		say(why, whylen, "out of memory for %u key spans", r->meta.n_spans);
		return -ENOMEM;
	}
	ret = pread_full(r->fd, raw, g->spans_bytes, HDR_BYTES + g->tokens_bytes);
	if (ret == -ENODATA) {
		say(why, whylen, "truncated: key span records incomplete");
		ret = -EBADMSG;
	} else if (ret < 0) {
		say(why, whylen, "reading key span records: %s", errstr(ret));
	}
	if (ret == 0 && XXH3_64bits(raw, g->spans_bytes) != g->spans_xxh) {
		say(why, whylen, "key span records checksum mismatch");
		ret = -EBADMSG;
	}
	if (ret < 0) {
		free(raw);
		return ret;
	}
	XXH3_128bits_update(r->file_xxh, raw, g->spans_bytes);
	for (uint32_t i = 0; i < r->meta.n_spans; i++) {
		const unsigned char *p = raw + (uint64_t)i * SPAN_BYTES;

		r->spans[i].first_token = le_get64(p);
		r->spans[i].n_tokens = le_get64(p + 8);
		r->spans[i].key = XXH128_hashFromCanonical((const XXH128_canonical_t *)(p + 16));
	}
	free(raw);
	problem = spans_problem(r->spans, r->meta.n_spans, r->meta.n_tokens);
	if (problem) {
		say(why, whylen, "key span records: %s", problem);
		return -EBADMSG;
	}
	r->meta.spans = r->spans;
	return 0;
}

int ckpt_open(int dir_fd, const char *name, struct ckpt_reader *r, char *why, size_t whylen)
{
	unsigned char h[HDR_BYTES];
	uint64_t tokens_xxh;
	unsigned char *raw;
	struct geom g;
	int ret;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	ret = open_header(dir_fd, name, &r->fd, h, &r->meta, &g, &tokens_xxh, why, whylen);
	if (ret < 0)
		return ret;
	r->is_open = 1;
	r->tokens_end = HDR_BYTES + g.tokens_bytes + g.spans_bytes;
	r->pages_off = g.pages_off;
	r->sums_off = g.sums_off;
	r->trailer_off = g.trailer_off;

	ret = -ENOMEM;
	r->file_xxh = XXH3_createState();
	if (!r->file_xxh) {
		say(why, whylen, "out of memory");
		goto fail;
	}
	XXH3_128bits_reset(r->file_xxh);
	XXH3_128bits_update(r->file_xxh, h, HDR_BYTES);
	if (!r->meta.n_tokens) {
		if (XXH3_64bits(NULL, 0) != tokens_xxh) {
			say(why, whylen, "token records checksum mismatch");
			ret = -EBADMSG;
			goto fail;
		}
		/* No tokens: spans_problem refuses any span. */
		ret = read_spans(r, &g, why, whylen);
		if (ret < 0)
			goto fail;
		return 0;
	}

	/* The header's counts fit in the file, so this is at most its size. */
	r->tokens = malloc(g.tokens_bytes);
	if (!r->tokens) {
		say(why, whylen, "out of memory for %llu token records",
		    (unsigned long long)r->meta.n_tokens);
		goto fail;
	}
	raw = (unsigned char *)r->tokens;
	ret = pread_full(r->fd, raw, g.tokens_bytes, HDR_BYTES);
	if (ret == -ENODATA) {
		say(why, whylen, "truncated: token records incomplete");
		ret = -EBADMSG;
	} else if (ret < 0) {
		say(why, whylen, "reading token records: %s", errstr(ret));
	}
	if (ret < 0)
		goto fail;
	if (XXH3_64bits(raw, g.tokens_bytes) != tokens_xxh) {
		say(why, whylen, "token records checksum mismatch");
		ret = -EBADMSG;
		goto fail;
	}
	XXH3_128bits_update(r->file_xxh, raw, g.tokens_bytes);
	/* Decode in place: a record and its struct have the same size, and
	 * each record is read whole before its struct is written. */
	for (uint64_t i = 0; i < r->meta.n_tokens; i++) {
		const unsigned char *p = raw + i * TOKEN_BYTES;
		struct ckpt_token t = {le_get32(p), le_get32(p + 4), le_get32(p + 8),
				       le_get16(p + 12), le_get16(p + 14)};

		if (!token_ok(t.role, t.flags)) {
			say(why, whylen, "token record %llu: unknown role %u or flags %#x",
			    (unsigned long long)i, t.role, t.flags);
			ret = -EBADMSG;
			goto fail;
		}
		r->tokens[i] = t;
	}
	ret = read_spans(r, &g, why, whylen);
	if (ret < 0)
		goto fail;
	return 0;
fail:
	ckpt_close(r);
	return ret;
}

int ckpt_read_pages(struct ckpt_reader *r, void *const *dst, char *why, size_t whylen)
{
	const struct ckpt_meta *m = &r->meta;
	unsigned char pad[SHM_PAGE_ALIGN];
	unsigned char *sums = NULL, *scratch = NULL;
	uint64_t n_pad = r->pages_off - r->tokens_end;
	uint64_t sums_bytes = r->trailer_off - r->sums_off;
	struct geom g = {.trailer_off = r->trailer_off};
	XXH128_hash_t file_xxh;
	int ret;

	if (!r->is_open || r->pages_read) {
		say(why, whylen, "reader not open, or pages already read");
		return -EINVAL;
	}
	r->pages_read = 1;

	ret = pread_full(r->fd, pad, n_pad, r->tokens_end);
	if (ret < 0)
		goto io;
	for (uint64_t i = 0; i < n_pad; i++) {
		if (pad[i]) {
			say(why, whylen, "padding before the pages is not zero");
			return -EBADMSG;
		}
	}
	XXH3_128bits_update(r->file_xxh, pad, n_pad);

	if (sums_bytes) {
		sums = malloc(sums_bytes);
		if (!sums) {
			say(why, whylen, "out of memory");
			return -ENOMEM;
		}
		ret = pread_full(r->fd, sums, sums_bytes, r->sums_off);
		if (ret < 0)
			goto io;
	}
	for (uint32_t i = 0; i < m->n_pages; i++) {
		/* A page checked but not kept goes through one private page. */
		unsigned char *to = dst ? dst[i] : NULL;

		if (!to) {
			if (!scratch && !(scratch = malloc(m->page_bytes))) {
				say(why, whylen, "out of memory");
				ret = -ENOMEM;
				goto out;
			}
			to = scratch;
		}
		ret = pread_full(r->fd, to, m->page_bytes, r->pages_off + i * m->page_bytes);
		if (ret < 0)
			goto io;
		struct page_hash ph = {to, m->page_bytes, 0, r->file_xxh};

		if (guard_run(hash_page, &ph) < 0) {
			say(why, whylen, "page %u of %u: its arena memory is gone", i, m->n_pages);
			ret = -EFAULT;
			goto out;
		}
		if (ph.sum != le_get64(sums + (uint64_t)i * SUM_BYTES)) {
			say(why, whylen, "page %u of %u: checksum mismatch", i, m->n_pages);
			ret = -EBADMSG;
			goto out;
		}
	}
	XXH3_128bits_update(r->file_xxh, sums, sums_bytes);
	file_xxh = XXH3_128bits_digest(r->file_xxh);
	ret = check_trailer(r->fd, &g, &file_xxh, why, whylen);
	goto out;

io:
	if (ret == -ENODATA) {
		say(why, whylen, "truncated while reading pages");
		ret = -EBADMSG;
	} else {
		say(why, whylen, "reading pages: %s", errstr(ret));
	}
out:
	free(scratch);
	free(sums);
	return ret;
}

void ckpt_close(struct ckpt_reader *r)
{
	if (!r || !r->is_open)
		return;
	close(r->fd);
	free(r->tokens);
	free(r->spans);
	XXH3_freeState(r->file_xxh);
	memset(r, 0, sizeof(*r));
	r->fd = -1;
}

/* ---- the directory ---------------------------------------------------------- */

int ckpt_dir_sync(int dir_fd)
{
	return sync_fd(dir_fd, CKPT_IO_DIRSYNC);
}

int ckpt_dir_open(int parent_fd, const char *name, int create, unsigned int mode, int *ret_created)
{
	int created = 0, fd, ret;

	if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	if (create) {
		if (mkdirat(parent_fd, name, (mode_t)mode) == 0)
			created = 1;
		else if (errno != EEXIST)
			return -errno;
	}
	if (created) {
		/* The new entry lives in parent's blocks: without this fsync a
		 * power loss can take the directory, and every file fsynced in
		 * it, away. A failed fsync is not retried: the directory goes
		 * again, so whoever comes next creates and fsyncs it anew. */
		ret = sync_fd(parent_fd, CKPT_IO_DIRSYNC);
		if (ret < 0) {
			unlinkat(parent_fd, name, AT_REMOVEDIR);
			return ret;
		}
	}
	fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ret_created)
		*ret_created = created;
	return fd;
}

int ckpt_mkdir_p(const char *path, unsigned int mode)
{
	char buf[4096], *comp, *save = NULL;
	int cur, next;

	if (!path || !path[0] || strlen(path) >= sizeof(buf))
		return -EINVAL;
	snprintf(buf, sizeof(buf), "%s", path);
	cur = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cur < 0)
		return -errno;
	for (comp = strtok_r(buf, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		if (!strcmp(comp, "."))
			continue;
		if (!strcmp(comp, "..")) {
			next = openat(cur, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			next = next < 0 ? -errno : next;
		} else {
			next = ckpt_dir_open(cur, comp, 1, mode, NULL);
		}
		close(cur);
		if (next < 0)
			return next;
		cur = next;
	}
	return cur;
}

int ckpt_remove(int dir_fd, const char *name)
{
	if (!ckpt_name_valid(name))
		return -EINVAL;
	if (unlinkat(dir_fd, name, 0) < 0)
		return -errno;
	return sync_fd(dir_fd, CKPT_IO_DIRSYNC);
}

/* Opens a second description of dir_fd, so the listing has its own
 * position. Returns the stream or NULL with errno set. */
static DIR *open_dir(int dir_fd)
{
	int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d) {
		int e = errno;

		close(fd);
		errno = e;
	}
	return d;
}

int ckpt_list(int dir_fd,
	      int (*fn)(const char *name, const struct ckpt_meta *m, int err, const char *why,
			void *arg),
	      void *arg)
{
	unsigned char h[HDR_BYTES];
	struct ckpt_meta m;
	struct dirent *de;
	uint64_t tokens_xxh;
	struct geom g;
	char why[160];
	int ret = 0, fd, err;
	DIR *d = open_dir(dir_fd);

	if (!d)
		return -errno;
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			ret = -errno;
			break;
		}
		if (!ckpt_name_valid(de->d_name))
			continue;
		why[0] = '\0';
		err = open_header(dir_fd, de->d_name, &fd, h, &m, &g, &tokens_xxh, why,
				  sizeof(why));
		if (!err)
			close(fd);
		if (err == -ENOENT) /* removed since readdir */
			continue;
		ret = fn(de->d_name, err ? NULL : &m, err, why, arg);
		if (ret)
			break;
	}
	closedir(d);
	return ret;
}

int ckpt_clean_temporaries(int dir_fd, uint32_t *ret_removed)
{
	struct dirent *de;
	uint32_t removed = 0;
	int ret = 0;
	DIR *d = open_dir(dir_fd);

	if (!d)
		return -errno;
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			if (errno && !ret)
				ret = -errno;
			break;
		}
		if (!tmp_name(de->d_name))
			continue;
		if (unlinkat(dir_fd, de->d_name, 0) == 0)
			removed++;
		else if (errno != ENOENT && !ret)
			ret = -errno;
	}
	closedir(d);
	if (ret < 0)
		return ret;
	if (ret_removed)
		*ret_removed = removed;
	return 0;
}
