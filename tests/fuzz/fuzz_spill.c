/* tests/fuzz/fuzz_spill.c — fuzz target: spill-file page headers through
 * spill_hdr_decode and spill_scan (daemon/store/spill.h).
 *
 * The input (FUZZ_SPILL_* in fuzz.h) chooses a capacity, a first extent
 * and flags, then gives page headers. Its first 128 header bytes go to
 * spill_hdr_decode; a header that decodes must survive an encode/decode
 * round trip. Then a fresh spill file of that capacity is created with
 * spill_open in a private temporary directory (the pool identity of
 * fuzz.h), the headers are written over its page-header region from the
 * first extent on (the region before stays a hole, so the scan's
 * hole-skipping runs too), the file is sized to hold every extent's data
 * (a hole) or cut right after the headers, and spill_scan lists it.
 *
 * Aborts (a finding) when the scan breaks its contract: an extent past
 * the capacity or reported twice, a page listed from a file cut before
 * its data (a truncated file), a count that disagrees with the
 * callback's, a sequence number above the file's, or free/used accounting
 * that spill_alloc then contradicts (every extent must be handed out
 * exactly once, none that the scan kept). The stepwise scan of a warm
 * restart (spill_scanner_step, spill_scan_advance, spill_scan_end) then
 * runs over the same file in steps of 1 to 7 headers (the flags' upper
 * bits) under the same checks, and in mid-scan spill_alloc must hand out
 * only extents already classified free. Memory errors are the
 * sanitizers'.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "fuzz.h"
#include "spill.h"

static struct {
	int ready;
	char dir[64];
	char path[256];
} st;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz_spill: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

static XXH128_hash_t root(void)
{
	XXH128_hash_t h = {.low64 = FUZZ_SPILL_ROOT_LO, .high64 = FUZZ_SPILL_ROOT_HI};

	return h;
}

static void teardown(void)
{
	if (!st.ready)
		return;
	unlink(st.path);
	rmdir(st.dir);
	st.ready = 0;
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	char name[96];

	snprintf(st.dir, sizeof(st.dir), "%.40s/kvp-fuzz-spill-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(st.dir))
		die("mkdtemp %s: %s", st.dir, strerror(errno));
	spill_file_name(FUZZ_SPILL_UID, root(), name, sizeof(name));
	snprintf(st.path, sizeof(st.path), "%s/%s", st.dir, name);
	st.ready = 1;
	atexit(teardown);
}

struct seen {
	uint32_t cap;
	unsigned char *accepted; /* [cap] */
	unsigned char *called;	 /* [cap] */
	int n_accepted;
	int picky;
	int cut; /* the file ends before the data region */
	uint64_t max_seq;
};

static int on_header(void *arg, uint32_t extent, const struct spill_page_hdr *h)
{
	struct seen *s = arg;

	if (extent >= s->cap)
		die("spill_scan: extent %u past the capacity %u", extent, s->cap);
	if (s->called[extent]++)
		die("spill_scan: extent %u reported twice", extent);
	if (s->cut)
		die("spill_scan: extent %u listed, its data is past the end of the file", extent);
	if (h->seq > s->max_seq)
		s->max_seq = h->seq;
	if (s->picky && extent % 2)
		return -1;
	s->accepted[extent] = 1;
	s->n_accepted++;
	return 0;
}

/* Decodes one header as read from a file; a valid one must encode back. */
static void check_decode(struct spill *sp, const uint8_t *in, size_t n)
{
	unsigned char b[SPILL_PAGE_HDR] = {0}, again[SPILL_PAGE_HDR];
	struct spill_page_hdr h, h2;

	memcpy(b, in, n < sizeof(b) ? n : sizeof(b));
	if (spill_hdr_decode(sp, b, &h) < 0)
		return;
	sp->seq = h.seq - 1; /* encode stamps seq + 1: the same sequence */
	spill_hdr_encode(sp, &h, again);
	if (spill_hdr_decode(sp, again, &h2) < 0 || !XXH128_isEqual(h.hash, h2.hash) ||
	    !XXH128_isEqual(h.parent, h2.parent) || h.sum != h2.sum || h.seq != h2.seq ||
	    h.flags != h2.flags || h.used != h2.used)
		die("a decoded page header does not survive encode and decode");
}

static void check_scan(struct spill *sp, const struct seen *s)
{
	unsigned char *handed = calloc(s->cap, 1);
	uint32_t e, n_handed = 0;

	if (!handed)
		die("out of memory");
	if (s->max_seq > sp->seq)
		die("spill_scan: a header's sequence %llu above the file's %llu",
		    (unsigned long long)s->max_seq, (unsigned long long)sp->seq);
	if (sp->hwm > sp->cap || sp->n_used + sp->n_free != sp->hwm ||
	    sp->n_used != (uint32_t)s->n_accepted)
		die("spill_scan: hwm %u, %u used, %u free, %d accepted, capacity %u", sp->hwm,
		    sp->n_used, sp->n_free, s->n_accepted, sp->cap);
	while (spill_alloc(sp, &e) == 0) {
		if (e >= s->cap || handed[e] || s->accepted[e])
			die("spill_alloc handed out extent %u (capacity %u) twice or while in use",
			    e, s->cap);
		handed[e] = 1;
		n_handed++;
	}
	if (n_handed + (uint32_t)s->n_accepted != s->cap)
		die("spill_alloc handed out %u extents; %d were in use of %u", n_handed,
		    s->n_accepted, s->cap);
	free(handed);
}

/* The stepwise scan of a warm restart over the same file, in steps of
 * step headers, as daemon/core/tier.c drives it: each step's extents are
 * classified before the next, a newer copy frees the one it replaces,
 * picky refuses odd extents; between steps spill_alloc may hand out only
 * classified free extents. Then the same accounting as spill_scan's. */
static void check_steps(struct spill *sp, struct seen *s, uint32_t step)
{
	struct spill_found *v = malloc(step * sizeof(*v));
	struct spill_scanner sc;
	uint32_t n, e;

	if (!v)
		die("out of memory");
	memset(s->accepted, 0, s->cap);
	memset(s->called, 0, s->cap);
	s->n_accepted = 0;
	s->max_seq = 0;
	if (spill_scanner_init(sp, &sc) < 0)
		die("spill_scanner_init failed");
	spill_scan_begin(sp, sc.virgin);
	while (!sc.eof) {
		uint32_t from = sc.next;

		if (spill_scanner_step(sp, &sc, v, step, &n) < 0)
			die("spill_scanner_step failed");
		if (n > step)
			die("spill_scanner_step: %u found in a step of %u", n, step);
		if (spill_scan_advance(sp, sc.next, v, n) < 0)
			goto out; /* out of memory */
		for (uint32_t i = 0; i < n; i++) {
			uint32_t x = v[i].extent;

			if (x >= s->cap || x < from || x >= sc.next)
				die("scanner: extent %u outside its step [%u, %u)", x, from,
				    sc.next);
			if (s->called[x]++)
				die("scanner: extent %u reported twice", x);
			if (s->cut)
				die("scanner: extent %u listed, its data is past the end", x);
			if (v[i].h.seq > s->max_seq)
				s->max_seq = v[i].h.seq;
			if (v[i].replaces != UINT32_MAX) {
				if (v[i].replaces >= x || !s->called[v[i].replaces])
					die("scanner: extent %u replaces %u, not an earlier one", x,
					    v[i].replaces);
				if (s->accepted[v[i].replaces]) {
					s->accepted[v[i].replaces] = 0;
					s->n_accepted--;
					spill_free(sp, v[i].replaces);
				}
			}
			if (s->picky && x % 2) {
				spill_free(sp, x);
				continue;
			}
			s->accepted[x] = 1;
			s->n_accepted++;
		}
		/* Mid-scan: only classified free extents, or ones past every
		 * header written, come out. */
		if (spill_alloc(sp, &e) == 0) {
			if ((e >= sp->scan_upto && e < sc.virgin) || e >= s->cap || s->accepted[e])
				die("spill_alloc in mid-scan handed out extent %u (classified "
				    "below "
				    "%u, fresh from %u, in use: %d)",
				    e, sp->scan_upto, sc.virgin, s->accepted[e]);
			spill_free(sp, e);
		}
	}
	spill_scan_end(sp, 1, sc.seq, sc.n_gone);
	check_scan(sp, s);
out:
	spill_scanner_fini(&sc);
	free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct shm_layout layout = FUZZ_SPILL_LAYOUT;
	unsigned char *hdrs;
	struct spill sp;
	struct seen s = {0};
	uint32_t cap, first;
	uint64_t room, n;
	char why[256];
	int ret, flags;

	if (!st.ready)
		setup();
	if (size < FUZZ_SPILL_CTL)
		return 0;
	cap = 1 + (uint32_t)(data[0] | data[1] << 8) % FUZZ_SPILL_MAX_CAP;
	first = (uint32_t)(data[2] | data[3] << 8) % cap;
	flags = data[4];
	n = size - FUZZ_SPILL_CTL;
	room = (uint64_t)(cap - first) * SPILL_PAGE_HDR;
	if (n > room)
		n = room;
	hdrs = malloc(n ? n : 1);
	if (!hdrs)
		die("out of memory");
	memcpy(hdrs, data + FUZZ_SPILL_CTL, n);
	if (flags & FUZZ_SPILL_REPAIR)
		for (uint64_t at = 0; at + SPILL_PAGE_HDR <= n; at += SPILL_PAGE_HDR) {
			uint64_t sum = XXH3_64bits_withSeed(hdrs + at, FUZZ_SPILL_PH_CHECK,
							    FUZZ_SPILL_ROOT_LO),
				 seal;

			for (int i = 0; i < 8; i++)
				hdrs[at + FUZZ_SPILL_PH_CHECK + i] =
					(unsigned char)(sum >> (8 * i));
			/* The stamp's seal too, so stamps reach the ordering. */
			seal = XXH3_64bits_withSeed(hdrs + at + FUZZ_SPILL_PH_USED, 8, sum);
			for (int i = 0; i < 8; i++)
				hdrs[at + FUZZ_SPILL_PH_USED + 8 + i] =
					(unsigned char)(seal >> (8 * i));
		}

	unlink(st.path); /* a fresh file for every input */
	why[0] = '\0';
	ret = spill_open(&sp, st.dir, FUZZ_SPILL_UID, FUZZ_SPILL_MODEL, &layout, root(),
			 (uint64_t)cap * shm_page_bytes(&layout), why, sizeof(why));
	if (ret < 0)
		die("spill_open: %s", why);
	if (sp.cap != cap)
		die("spill_open: capacity %u, not %u", sp.cap, cap);
	check_decode(&sp, hdrs, n);
	sp.seq = 0;
	if (n && pwrite(sp.fd_meta, hdrs, n, (off_t)spill_hdr_off(first)) != (ssize_t)n)
		die("writing headers: %s", strerror(errno));
	/* The file holds every extent's data (a hole: sparse), so the scan
	 * finds the headers; cut, it holds none and finds none. */
	if ((flags & FUZZ_SPILL_TRUNCATE) &&
	    ftruncate(sp.fd_meta, (off_t)(spill_hdr_off(first) + n)))
		die("truncating: %s", strerror(errno));
	if (!(flags & FUZZ_SPILL_TRUNCATE) &&
	    ftruncate(sp.fd_meta, (off_t)spill_data_off(&sp, cap)))
		die("sizing: %s", strerror(errno));

	s.cap = cap;
	s.picky = !!(flags & FUZZ_SPILL_PICKY);
	s.cut = !!(flags & FUZZ_SPILL_TRUNCATE);
	s.accepted = calloc(cap, 1);
	s.called = calloc(cap, 1);
	if (!s.accepted || !s.called)
		die("out of memory");
	ret = spill_scan(&sp, on_header, &s);
	if (ret == -ENOMEM)
		goto out;
	if (ret != s.n_accepted)
		die("spill_scan returned %d, its callback accepted %d", ret, s.n_accepted);
	check_scan(&sp, &s);
	check_steps(&sp, &s, 1 + (uint32_t)(flags >> 3) % 7);
out:
	spill_close(&sp);
	free(s.accepted);
	free(s.called);
	free(hdrs);
	return 0;
}
