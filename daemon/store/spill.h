/* daemon/store/spill.h — a pool's spill file: the disk tier's storage.
 *
 * One file per pool, <cache-dir>/spill-<uid>-<pool root>.kvs, named by the
 * pool's identity so a restarted daemon finds it again. Layout:
 *
 *   [0, 4096)                 file header (SPILL_FILE_MAGIC, format, uid,
 *                             model id, layout, page bytes, capacity, root,
 *                             XXH3-64 of the header; then the page
 *                             format, 0 for K/V, with its own XXH3-64,
 *                             both 0 in files of K/V pools)
 *   [4096, 4096 + cap*128)    one 128-byte page header per extent
 *   [data_off, ...)           cap extents of page_bytes, 4096-aligned
 *
 * Page data moves with O_DIRECT (where the file system has it) straight
 * between the host arena and its extent; page headers and the file header
 * are small buffered writes through a second descriptor. A page header
 * names the page (chain hash, parent hash), carries the XXH3-64 of the
 * data, the format the data is stored in (the pool's own, or int8, fp8 or
 * int4 with spill-dtype: daemon/core/tier.c) and its own XXH3-64. Nothing here
 * is trusted on reading: a header that fails its checksum or names another
 * pool is ignored, a header whose data would lie past the end of the file
 * (a file cut short) is not found, and data is verified against the
 * header's sum when it is read back (daemon/core/tier.c), so a torn write, a
 * crash between data and header, or a flipped byte is a miss, never wrong
 * data. Spill data is a cache, never fsynced: what a crash loses is simply
 * not found again.
 *
 * Format 3 adds a last-use stamp after the checksummed part of a page
 * header: a number on the pool's use clock (daemon/store/prefix_index.h), sealed
 * by an XXH3-64 seeded with the header's own checksum, so a stamp is only
 * believed beside the header it was written for (a stamp left over from an
 * earlier page of the extent does not verify). It is written with the
 * header and rewritten alone (16 bytes) when the pool closes
 * (spill_set_used), so a restarted disk tier drops pages in the order they
 * were last used. Format 2 files are read as they are: their headers have
 * no stamp, and count as used in write order before every stamped one;
 * the file header becomes format 3 at open. A stamp only orders eviction:
 * a wrong one costs a page the wrong turn, never a wrong byte.
 *
 * The file is preallocated lazily: extents are handed out from the lowest
 * free one, the file's blocks are allocated ahead of the highest (below,
 * spill_prealloc_*), and a write that fails with ENOSPC lowers the
 * capacity to what the file system holds. An exclusive flock keeps a second daemon off it.
 * Blocking calls (open, spill_scan) run at start or pool creation only;
 * a warm restart scans in steps on a worker (spill_scanner_step) while
 * the loop hands out only the extents already classified. Event-loop
 * thread only, but for spill_scanner_step and spill_forget.
 */
#ifndef KVPD_SPILL_H
#define KVPD_SPILL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <xxhash.h>

#include "idmap.h"
#include "layout.h"

#define SPILL_FORMAT		   3u
#define SPILL_FORMAT_OLD	   2u /* still read: no last-use stamps */
#define SPILL_FILE_HDR		   4096u
#define SPILL_PAGE_HDR		   128u
#define SPILL_PREALLOC_BYTES	   (32ull << 20) /* the file's blocks allocated ahead of use */
#define SPILL_PREALLOC_MAX_WINDOWS 8u		 /* of them for one burst of writes */
#define SPILL_PAGE_FIRST	   1u		 /* flag: the parent hash is a chain root */
#define SPILL_MODEL_ID_MAX	   128u

struct spill_page_hdr {
	XXH128_hash_t hash;    /* the page's chain hash */
	XXH128_hash_t parent;  /* its parent's chain hash, or the root */
	uint64_t sum;	       /* XXH3-64 of the page_bytes of data */
	uint64_t seq;	       /* write order, newest wins on duplicates */
	uint32_t flags;	       /* SPILL_PAGE_* */
	uint32_t dtype;	       /* stored format: 0 the pool's own, else a quantized dtype */
	uint32_t stored_bytes; /* bytes of data in the extent (sum covers them) */
	uint64_t used;	       /* last-use stamp, 0: none (format 2, or a bad seal) */
};

struct spill {
	char path[4200];
	int fd_data; /* O_DIRECT where possible */
	int fd_meta; /* buffered: file and page headers */
	int direct;  /* fd_data has O_DIRECT */
	uid_t uid;
	XXH128_hash_t root; /* the pool's chain root without salt */
	uint64_t page_bytes;
	uint64_t data_off;
	uint32_t cap;		   /* extents the file may hold */
	uint32_t hwm;		   /* extents below this were handed out at least once */
	uint32_t prealloc;	   /* extents below this are allocated in the file */
	uint32_t prealloc_pending; /* ... and below this while an allocation runs */
	uint32_t prealloc_retry; /* after a failed allocation ahead: not before hwm reaches this */
	int prealloc_off;	 /* the file system cannot allocate ahead */
	uint32_t n_used;	 /* extents holding or receiving a page */
	uint32_t *free;		 /* freed extents below hwm, a stack */
	uint32_t n_free;
	uint64_t seq;
	uint32_t n_gone; /* valid headers the last scan found past the end of the file */
	/* A stepwise scan (spill_scan_begin .. spill_scan_end) runs: the
	 * extents below scan_upto are classified, those from scan_virgin on
	 * never held a header (past the last header data of the file), and
	 * spill_alloc hands out none of the others (they may hold a page not
	 * found yet). */
	int scanning;
	uint32_t scan_upto;
	uint32_t scan_virgin;	   /* the first extent past every header written */
	uint32_t scan_virgin_next; /* the next of them spill_alloc hands out */
	uint8_t *scan_map;	   /* [scan_map_len]: 1 in use (found or allocated) */
	uint32_t scan_map_len;
};

/* The file name of a pool's spill file (without the directory). */
void spill_file_name(uid_t uid, XXH128_hash_t root, char *buf, size_t len);

/* Opens or creates the spill file of a pool in dir (created 0700 if
 * missing), for at most cap_bytes of pages. An existing file of the same
 * identity and capacity is kept for spill_scan; one of another identity,
 * capacity or format, or with a bad header, is reset (its pages are
 * lost). Returns 0, -EBUSY when another process holds the file, or
 * -errno with a reason in why. */
int spill_open(struct spill *sp, const char *dir, uid_t uid, const char *model_id,
	       const struct shm_layout *layout, XXH128_hash_t root, uint64_t cap_bytes, char *why,
	       size_t whylen);
void spill_close(struct spill *sp);

/* Reads every page header of the file (blocking) and calls fn for each
 * valid one whose data lies inside the file, newest first when two name
 * the same hash; an extent fn accepts (returns 0) is in use afterwards,
 * the rest are free. Valid headers whose data the file no longer holds (it
 * was cut short) are counted in sp->n_gone and their extents are free.
 * Returns the headers accepted or -errno. */
int spill_scan(struct spill *sp,
	       int (*fn)(void *arg, uint32_t extent, const struct spill_page_hdr *h), void *arg);

/* ---- the stepwise scan of a warm restart ----------------------------------
 *
 * A restart with many pages lists them while the daemon serves: a
 * scanner (owned by a worker job) reads the header region a step at a
 * time, and the loop lists what each step found before the next one.
 * Meanwhile the spill file hands out only extents the steps have
 * classified. */

/* A valid header a step found: newest first when two name one hash, so a
 * later one replaces the copy it names (UINT32_MAX: none). */
struct spill_found {
	struct spill_page_hdr h;
	uint32_t extent;
	uint32_t replaces;
};

struct spill_scanner {
	uint64_t file_bytes; /* the file's size at the start */
	uint32_t cap;	     /* the capacity at the start */
	uint32_t next;	     /* the first extent not read yet */
	int eof;	     /* nothing is left to read */
	uint64_t seq;	     /* the highest sequence number seen */
	uint32_t n_gone;     /* valid headers whose data lies past the end */
	uint32_t estimate;   /* at most this many headers: the written part */
	uint32_t virgin;     /* extents from here on never held a header */
	struct idmap seen;   /* hash.low64 | 1 → index + 1 in rec */
	struct spill_seen {
		uint64_t seq;
		XXH128_hash_t hash;
		uint32_t extent;
	} * rec;
	uint32_t n_rec, cap_rec;
};

/* Starts a scanner on sp (loop thread): it reads the extents below the
 * end of the header data the file holds (s->virgin). Returns 0 or
 * -errno. */
int spill_scanner_init(const struct spill *sp, struct spill_scanner *s);
/* Reads the next step: up to max headers from s->next (holes skipped),
 * writes what verifies to out (at most max) and sets *ret_n, and moves
 * s->next past what it read (s->eof at the end). Touches only s and
 * sp's descriptor and constants, so it runs on a worker thread while the
 * loop uses sp. Returns 0 or -errno (a read failed). */
int spill_scanner_step(const struct spill *sp, struct spill_scanner *s, struct spill_found *out,
		       uint32_t max, uint32_t *ret_n);
void spill_scanner_fini(struct spill_scanner *s);

/* The file's extents become unclassified (none in use, none free) but
 * for those from virgin on (spill_scanner.virgin), which held no header
 * ever: spill_alloc hands those out meanwhile, so pages spill while the
 * scan runs. */
void spill_scan_begin(struct spill *sp, uint32_t virgin);
/* Classifies the extents below to (from scan_upto on): those of v[0..n)
 * are in use, the others free. Returns 0 or -ENOMEM (nothing changed). */
int spill_scan_advance(struct spill *sp, uint32_t to, const struct spill_found *v, uint32_t n);
/* Ends the scan: the free stack is rebuilt from what is in use; when
 * complete is 0 (an error, a stop) the extents never classified stay out
 * of use for this run (the next start reads them). seq and n_gone come
 * from the scanner. */
void spill_scan_end(struct spill *sp, int complete, uint64_t seq, uint32_t n_gone);

/* ---- allocating the file's blocks ahead ------------------------------------
 *
 * O_DIRECT writes that extend the file or fill its holes are serialised by
 * the file system (ext4 takes the inode lock exclusively for them), so a
 * new spill file took its pages one write at a time however many were in
 * flight. The blocks of the next SPILL_PREALLOC_BYTES past the highest
 * extent handed out are allocated (fallocate) before they are needed, and
 * writes land in allocated blocks inside the file's size, side by side.
 * fallocate waits for every O_DIRECT transfer in flight on the file, so
 * it runs on a worker (spill_prealloc_run), never on the loop. */

/* Whether to allocate ahead now, for want extents about to be handed out
 * (those past the free ones, at most SPILL_PREALLOC_MAX_WINDOWS windows,
 * are counted): 1, with
 * the extents [*from, *from + *n) up to a window past them, once fewer
 * than those and half a window are allocated past hwm; 0 when not due,
 * not possible (no O_DIRECT, a file system without fallocate), or backing
 * off after a failure. Loop thread. */
int spill_prealloc_due(const struct spill *sp, uint32_t want, uint32_t *from, uint32_t *n);
/* Allocates the blocks of extents [from, from + n). Touches only sp's data
 * descriptor and constants: runs on a worker thread while the loop uses
 * sp. Returns 0 or -errno. */
int spill_prealloc_run(const struct spill *sp, uint32_t from, uint32_t n);
/* On the loop thread: the allocation of [from, from + n) starts (its
 * extents count as allocated from now on: spill_preallocated), and its
 * result. */
void spill_prealloc_start(struct spill *sp, uint32_t from, uint32_t n);
void spill_prealloc_done(struct spill *sp, uint32_t from, uint32_t n, int ret);
/* Whether extent e's blocks are allocated, or being allocated: a write
 * into it does not grow the file (its space was counted when the
 * allocation started). */
static inline int spill_preallocated(const struct spill *sp, uint32_t e)
{
	return e < sp->prealloc || e < sp->prealloc_pending;
}

/* Takes a free extent. Returns 0, -ENOSPC when the file is full, or
 * -EAGAIN while a scan runs and no classified extent is free. */
int spill_alloc(struct spill *sp, uint32_t *ret_extent);
/* Returns an extent; its old header stays (and names valid data or fails
 * verification), which is harmless. */
void spill_free(struct spill *sp, uint32_t extent);
/* A write into extent failed with ENOSPC: the file system is full. Caps
 * the file at the extents handed out so far. */
void spill_full(struct spill *sp, uint32_t extent);

static inline uint64_t spill_data_off(const struct spill *sp, uint32_t extent)
{
	return sp->data_off + (uint64_t)extent * sp->page_bytes;
}
static inline uint64_t spill_hdr_off(uint32_t extent)
{
	return SPILL_FILE_HDR + (uint64_t)extent * SPILL_PAGE_HDR;
}

/* Rewrites the last-use stamp of the page header of extent (blocking:
 * when a pool closes) after checking that the header there still names
 * hash. Returns 0, -ESTALE when it names something else (or nothing), or
 * -errno. */
int spill_set_used(struct spill *sp, uint32_t extent, XXH128_hash_t hash, uint64_t used);

/* At daemon start, before any pool opens: removes from dir every file
 * named like a spill file (spill-<uid>-<32 hex>.kvs) that is junk — no
 * valid file header (too short, another magic, a bad checksum, an unknown
 * format, a name its header does not match) — or that holds no page a
 * restart could find (no page header verifies with its data inside the
 * file: a pool's spill file is only worth keeping for a warm restart).
 * A file another process holds locked is left alone. Logs each file
 * removed and the total; *ret_bytes gets the bytes freed (allocated
 * blocks), *ret_files the files. Returns 0 or -errno (dir unreadable). */
int spill_reclaim(const char *dir, uint64_t *ret_bytes, uint32_t *ret_files);

/* Encodes h (stamping the next sequence number) as SPILL_PAGE_HDR bytes
 * with its checksum and h->used sealed, for sp's pool. */
void spill_hdr_encode(struct spill *sp, struct spill_page_hdr *h, unsigned char *out);
/* Decodes and checks a page header of sp's pool; h->used is 0 when the
 * stamp's seal does not verify. Returns 0 or -EBADMSG. */
int spill_hdr_decode(const struct spill *sp, const unsigned char *in, struct spill_page_hdr *h);

/* Forgets extents for good (an admin's purge or drop): overwrites each
 * one's page header with zeros, which no scan accepts, then fdatasyncs the
 * file, so no later start finds their pages, whatever the data left in
 * them. The extents stay allocated: the caller frees them (spill_free)
 * once this returned 0; after a failure their headers may survive, and
 * the caller keeps them out of use. Blocking, and thread-safe against the
 * event loop: it touches only sp->fd_meta, which stays open while the
 * spill file does. Returns 0 or -errno (the first write or sync error). */
int spill_forget(const struct spill *sp, const uint32_t *extents, uint32_t n);

#endif
