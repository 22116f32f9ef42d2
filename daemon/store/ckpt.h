/* daemon/store/ckpt.h — the durable checkpoint file: one session of the daemon,
 * its token metadata and its pages, under <state-dir>/checkpoints/<name>.
 *
 * A checkpoint is written whole to a temporary name in the same directory,
 * fsynced, renamed over its name and the directory fsynced, so a reader
 * sees either the previous checkpoint of that name or the new one, never a
 * mixture. It is read back in two steps: ckpt_open checks the header and
 * the token records, ckpt_read_pages reads every page and checks the page
 * checksums and the whole-file checksum. Files on disk are untrusted: every
 * count and offset is checked against the others and against the file's
 * size before anything is allocated, and any doubt is -EBADMSG with the
 * reason in the caller's `why` buffer. The daemon restores nothing from a
 * checkpoint that any step refused.
 *
 * Everything here blocks on the file system: call it from a worker thread,
 * never from the event loop. Plain syscalls only (openat, pread, pwrite,
 * fsync, renameat, unlinkat), no logging, no globals but a test hook
 * (ckpt_inject, below): thread-safe. Two
 * writers of one name both succeed and the last rename wins; a reader
 * keeps the file it opened. dir_fd is a directory opened
 * O_RDONLY|O_DIRECTORY (not O_PATH: ckpt_write and ckpt_remove fsync it).
 * Functions taking `why` write a one-line reason there on failure (when why
 * is not NULL and whylen > 0, NUL-terminated, truncated to whylen) and
 * leave it alone on success. Files are created 0600.
 *
 * On-disk format, version 4. Versions 1 to 3 are read too: version 3 is
 * version 4 without key spans (zeros where 4 has their count and
 * checksum, none after the token records); version 2 is
 * version 3 without the name field (zero there), version 1 is version 2
 * with pages stored as they are and the pool layout field zero. A file of
 * version 1 or 2 records no name: it is taken to be the checkpoint its
 * file is named, as those versions always were (meta.name is "" then;
 * restoring it and checkpointing it again gives it a version 3 file).
 * Integers are little-endian, fixed width; no
 * struct is written as it lies in memory. XXH3 is xxHash's XXH3 with seed
 * 0; a 128-bit hash is stored in xxHash's canonical (big-endian) form.
 *
 *   offset            size              section
 *   0                 512               header
 *   512               16 * n_tokens     token records
 *   512 + 16 * n_tok  32 * n_spans      key span records (version 4)
 *                                       zero padding up to the next 4096
 *   pages_off         page_bytes each   n_pages pages, back to back; each
 *                                       starts 4096-aligned (page_bytes is
 *                                       a multiple of SHM_PAGE_ALIGN)
 *   sums_off          8 * n_pages       XXH3_64 of each page, in order
 *   trailer_off       32                trailer; ends the file
 *
 * Header (512 bytes):
 *
 *   0    8    magic "KVPCKPT\0"
 *   8    4    format version (CKPT_FORMAT_VERSION)
 *   12   4    header bytes (512)
 *   16   8    XXH3_64 of the 512 header bytes with these 8 bytes zeroed
 *   24   4    uid: the owner, whose directory holds the file (a restore,
 *             a warm-up or a listing of checkpoints/<uid>/ refuses a
 *             file of another uid there: daemon/service/ckptop.c)
 *   28   4    n_pages = ceil(n_tokens / block_tokens)
 *   32   8    n_tokens
 *   40   8    created_ns
 *   48   8    page_bytes = shm_page_bytes(layout)
 *   56   24   layout: n_layers, n_kv_heads, head_dim, block_tokens, dtype,
 *             quant_group (u32 each, in struct shm_layout order)
 *   80   16   root, canonical XXH128
 *   96   8    tokens_off (512)
 *   104  8    tokens_bytes (16 * n_tokens)
 *   112  8    XXH3_64 of the token records (tokens_bytes bytes)
 *   120  8    pages_off (tokens_off + tokens_bytes rounded up to 4096)
 *   128  8    sums_off (pages_off + n_pages * page_bytes)
 *   136  8    trailer_off (sums_off + 8 * n_pages)
 *   144  8    file_bytes (trailer_off + 32)
 *   152  128  model_id: 1..127 printable ASCII bytes, NUL, zeros
 *   280  24   pool layout (version 2): the layout the session's pool has,
 *             which restores convert the pages back to. Equal to layout
 *             when pages are stored as they are; else the same shape
 *             (layers, heads, head_dim, block_tokens), an unquantized
 *             dtype, and layout's dtype is a quantized one (a checkpoint
 *             written quantized: mixed precision on disk)
 *   304  72   name (version 3): the name the checkpoint was written
 *             under, 1..CKPT_NAME_MAX bytes that ckpt_name_valid accepts,
 *             NUL-padded. A file read under another name (copied or
 *             renamed over another checkpoint's name) is refused, so a
 *             name never serves another checkpoint's content
 *   376  4    n_spans (version 4): key span records, ≤ CKPT_MAX_SPANS
 *   380  4    zero
 *   384  8    XXH3_64 of the key span records (version 4), 0 without any
 *             (a version 4 file without spans is a version 3 file but
 *             for the version field)
 *   392  4    page format (version 4): shm_layout.format of layout and
 *             pool layout, 0 (K/V) in files written before the field
 *   396  116  reserved, zero
 *
 * Token record (16 bytes): id u32, pos u32, turn u32, role u16, flags u16.
 *
 * Key span record (32 bytes): first_token u64, n_tokens u64, key digest
 * (canonical XXH128). Sorted by first_token, disjoint, n_tokens ≥ 1,
 * each within the n_tokens tokens; the session's extra key is in root. 
 *
 * Trailer (32 bytes):
 *
 *   0    8    magic "KVPCEND\0"
 *   8    8    trailer_off again
 *   16   16   XXH3_128 of bytes [0, trailer_off) — header, tokens, padding,
 *             pages and page checksums — canonical
 *
 * Every offset in the header is redundant with the counts and must equal
 * the value computed from them; the file's size must equal file_bytes. A
 * reader refuses a version newer than its own (-EPROTONOSUPPORT) before
 * checking anything that version may have moved, so a header whose version
 * field itself is damaged upwards is refused that way rather than as
 * corrupt; both are refusals.
 */
#ifndef KVPD_CKPT_H
#define KVPD_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "layout.h"

#define CKPT_FORMAT_VERSION 4u
/* Most key spans one checkpoint records (a session's SESSION_MAX_SPANS). */
#define CKPT_MAX_SPANS 65536u
/* Longest checkpoint name, in bytes, without the terminating NUL. */
#define CKPT_NAME_MAX 64u
/* Bytes of model_id in struct ckpt_meta and in the header, NUL included. */
#define CKPT_MODEL_ID_BYTES 128u
/* Temporaries are named CKPT_TMP_PREFIX <name> "-" <16 hex digits>; a
 * valid name never starts with '.', so no name can be a temporary. */
#define CKPT_TMP_PREFIX ".tmp-"

/* Token roles and flags. */
enum ckpt_role {
	CKPT_ROLE_UNKNOWN = 0,
	CKPT_ROLE_SYSTEM = 1,
	CKPT_ROLE_USER = 2,
	CKPT_ROLE_ASSISTANT = 3,
};
#define CKPT_TOKEN_PERMANENT 0x1u
#define CKPT_TOKEN_SUMMARY   0x2u /* a summary span's token (issue 22), with PERMANENT */
#define CKPT_TOKEN_FLAGS     (CKPT_TOKEN_PERMANENT | CKPT_TOKEN_SUMMARY) /* every defined flag */

/* Per-token metadata; 16 bytes on disk, little-endian, in this order. */
struct ckpt_token {
	uint32_t id;	/* token id */
	uint32_t pos;	/* original position (equals the index for exact sessions) */
	uint32_t turn;	/* turn index, 0 when unknown */
	uint16_t role;	/* enum ckpt_role */
	uint16_t flags; /* CKPT_TOKEN_* */
};
_Static_assert(sizeof(struct ckpt_token) == 16, "ckpt_token is a 16-byte record");

/* A key span of the session (daemon/store/prefix_index.h): tokens
 * [first_token, first_token + n_tokens) hash with key, the digest of the
 * client's key bytes. 32 bytes on disk: u64, u64, canonical XXH128. */
struct ckpt_span {
	uint64_t first_token;
	uint64_t n_tokens;
	XXH128_hash_t key;
};

struct ckpt_meta {
	uint32_t version; /* filled by ckpt_open; ckpt_write writes CKPT_FORMAT_VERSION */
	uint32_t uid;	  /* tenant */
	char model_id[CKPT_MODEL_ID_BYTES]; /* 1..127 printable ASCII, NUL-terminated */
	struct shm_layout layout;	    /* of the pages as stored */
	/* The pool's layout: pages are converted from it when written and to
	 * it when read, when it differs from layout (see the format). A zero
	 * n_layers means "the same as layout" to ckpt_write. */
	struct shm_layout pool_layout;
	uint64_t page_bytes; /* shm_page_bytes(&layout) */
	XXH128_hash_t root;  /* the session's hash-chain root (pool identity + salt) */
	uint64_t n_tokens;   /* committed tokens */
	uint32_t n_pages;    /* ceil(n_tokens / layout.block_tokens) */
	uint64_t created_ns; /* CLOCK_REALTIME; ckpt_write stamps the current time for 0 */
	uint64_t file_bytes; /* filled by ckpt_open, ckpt_list and ckpt_write; ignored on input */
	/* The name recorded in the file: filled by ckpt_open and ckpt_list
	 * ("" for a version 1 or 2 file, which records none); ignored by
	 * ckpt_write, which records the name it writes under. */
	char name[CKPT_NAME_MAX + 1];
	/* Key spans (version 4; 0 for older files): ckpt_write reads
	 * n_spans records from spans (sorted, disjoint, within n_tokens);
	 * ckpt_open points spans at the reader's own copy, valid until
	 * ckpt_close. */
	uint32_t n_spans;
	const struct ckpt_span *spans;
};

/* An open checkpoint. fd, meta and tokens are the caller's to read; the
 * rest is private. tokens holds meta.n_tokens records (NULL when there are
 * none) and stays valid until ckpt_close. */
struct ckpt_reader {
	int fd;
	struct ckpt_meta meta;
	struct ckpt_token *tokens;
	struct ckpt_span *spans; /* meta.n_spans, or NULL */
	/* private */
	int is_open;
	int pages_read;		/* ckpt_read_pages was called */
	uint64_t tokens_end;	/* end of the token records */
	uint64_t pages_off;	/* offset of page 0 */
	uint64_t sums_off;	/* offset of the page checksums */
	uint64_t trailer_off;	/* offset of the trailer */
	XXH3_state_t *file_xxh; /* whole-file XXH3_128 over [0, tokens_end) so far */
};

/* Test hook (daemon/server/faults.c, for $KVPALACED_FAULTS): when not NULL, ckpt.c
 * calls it before each read, write and fsync it makes on a checkpoint
 * file or directory, on whatever thread makes the call. A -errno return
 * fails that call with it, without making it (-EINTR is retried as a real
 * one is); for a read or write, lowering *max_bytes (to at least 1) makes
 * the call move at most that many bytes, a short transfer the caller
 * continues. The hook must be thread-safe. Set once at start, before any
 * checkpoint I/O, and cleared after the last: the one global here. */
enum ckpt_io {
	CKPT_IO_READ,
	CKPT_IO_WRITE,
	CKPT_IO_FSYNC,	 /* the file's fsync before the rename */
	CKPT_IO_DIRSYNC, /* a directory's fsync: after a rename or unlink in it, after a
			  * directory was created in it, ckpt_dir_sync */
};
extern int (*ckpt_inject)(enum ckpt_io op, size_t *max_bytes);

/* Whether ckpt_write may write pages on an io_uring of its own (1, the
 * default): set once at start, to 0 where the daemon's disk I/O does not
 * use io_uring (the threads backend: io_uring refused or not trusted with
 * file I/O there). */
extern int ckpt_uring;

/* Returns 1 when name may name a checkpoint: 1..CKPT_NAME_MAX bytes of
 * [A-Za-z0-9._-], the first a letter, digit or '_' (so never ".", "..", a
 * hidden file, a temporary or something a command line takes for an
 * option), else 0. NULL is not valid. */
int ckpt_name_valid(const char *name);

/* Writes a checkpoint durably under dir_fd/name: m's meta (version and
 * file_bytes are ignored), then tokens and pages. tokens: // [n_tokens];
 * pages: // [n_pages] pointers, each to a page in m->pool_layout, read but
 * not kept (each is copied once — converted to m->layout by the reference
 * kernels when the two differ — and the copy hashed and written, so a
 * page changing meanwhile cannot make the file disagree with its
 * checksums); either may be NULL when its count is 0.
 *
 * The file goes to a fresh temporary in the same directory, is fsynced and
 * closed, renamed over name, and then dir_fd is fsynced. On failure before
 * the rename, the temporary is unlinked and an existing checkpoint of that
 * name is untouched. A failed fsync is reported, never retried. Only the
 * last step, the directory fsync, fails after the rename: then name holds
 * the new, complete checkpoint (its data was fsynced), the previous one is
 * gone, and the error says the rename may not survive a crash.
 *
 * Returns 0 and the file's size in *ret_bytes (which may be NULL); or
 * -EINVAL (invalid name, or meta inconsistent: layout refused by
 * shm_layout_check, page_bytes not shm_page_bytes(layout), n_pages not
 * ceil(n_tokens / block_tokens), model_id not 1..127 printable bytes, an
 * unknown role or flag in a token, a NULL page); -ENOMEM; or the negative
 * errno of the failing call (-ENOSPC, -EDQUOT, -EFBIG, -EIO, ...). */
int ckpt_write(int dir_fd, const char *name, const struct ckpt_meta *m,
	       const struct ckpt_token *tokens, const void *const *pages, uint64_t *ret_bytes,
	       char *why, size_t whylen);

/* Opens dir_fd/name and checks, in order: a regular file (not followed if
 * a symlink) at least a header long; the magic; the version (newer than
 * CKPT_FORMAT_VERSION: -EPROTONOSUPPORT); the header size and checksum;
 * the model id, the recorded name (version 3: it must be name), reserved
 * bytes, the layout (shm_layout_check) and
 * page_bytes; n_pages against n_tokens, and every offset against the
 * counts; the file's size against file_bytes (so no count can claim more
 * than the file holds); the trailer's magic and offset; then it reads the
 * token records and checks their checksum, roles and flags. Memory is
 * allocated only after the counts are known to fit in the file.
 *
 * Returns 0 with r open (release it with ckpt_close), or, with r closed
 * and why (when not NULL) saying which check failed: -EINVAL (invalid
 * name), -ENOENT, -EBADMSG (corrupt, truncated, not a checkpoint, or the
 * file of another checkpoint: its recorded name is not name),
 * -EPROTONOSUPPORT, -ENOMEM, or another negative errno (-ELOOP for a
 * symlink, -EIO, ...). */
int ckpt_open(int dir_fd, const char *name, struct ckpt_reader *r, char *why, size_t whylen);

/* Reads every page of an open checkpoint into dst (// [meta.n_pages]
 * pointers, each to meta.page_bytes writable bytes, or NULL for a page
 * that is to be checked but not kept: it is read into a private buffer),
 * checking that the padding before the pages is zero, each page against
 * its XXH3_64, and the trailer's whole-file XXH3_128. Once per reader.
 * dst itself may be NULL to check every page without keeping any (a
 * verification), and when n_pages is 0.
 *
 * Returns 0; -EBADMSG (a page or trailer checksum mismatch, a truncated
 * file: why says which); -EINVAL (r not open, or called twice); -ENOMEM;
 * or another negative errno. On failure the dst contents are undefined
 * (the caller throws them away); r stays open and must be closed. */
int ckpt_read_pages(struct ckpt_reader *r, void *const *dst, char *why, size_t whylen);

/* Closes r and frees its tokens. Accepts NULL, a zeroed reader, one whose
 * ckpt_open failed, and one already closed. */
void ckpt_close(struct ckpt_reader *r);

/* Opens the directory parent_fd/name (O_RDONLY|O_DIRECTORY), creating it
 * (mode) first when create and it does not exist. A directory created
 * here is made durable before it is used: parent_fd is fsynced (through
 * the test hook, as CKPT_IO_DIRSYNC), so a file later reported durable
 * inside it cannot vanish with its directory at a power loss. When that
 * fsync fails the new, empty directory is removed again (best effort) so
 * the next call creates and fsyncs it anew; *ret_created (may be NULL)
 * says whether it was created. name is one path component (no '/', not
 * "." or ".."). Returns the fd, or -EINVAL, -ENOENT (absent and not
 * create), -ENOTDIR, or the negative errno of mkdirat, fsync or open. */
int ckpt_dir_open(int parent_fd, const char *name, int create, unsigned int mode, int *ret_created);

/* mkdir -p that makes what it creates durable: each missing component of
 * path is created (mode) with ckpt_dir_open, its parent fsynced. Returns
 * an fd of the directory (O_RDONLY|O_DIRECTORY) or -errno. */
int ckpt_mkdir_p(const char *path, unsigned int mode);

/* fsyncs the directory dir_fd (through the test hook, as
 * CKPT_IO_DIRSYNC). Returns 0 or -errno. */
int ckpt_dir_sync(int dir_fd);

/* Removes dir_fd/name and fsyncs dir_fd. Returns 0, -EINVAL (invalid
 * name), -ENOENT, or another negative errno (-EISDIR, -EIO, ...). When only
 * the directory fsync failed the name is gone but may come back after a
 * crash. */
int ckpt_remove(int dir_fd, const char *name);

/* Lists the checkpoints in dir_fd for an admin: reads each validly named
 * entry's header only (the checks of ckpt_open up to the trailer's magic;
 * neither the token records nor the pages are read or checked) and calls
 * fn for it, in directory order (unsorted). Entries whose name is not
 * valid — temporaries, hidden files, "." and ".." — are skipped silently,
 * as is one removed between reading the directory and opening it.
 *
 * fn gets the entry's meta (file_bytes filled) with err 0 and why ""; or,
 * for an entry that is no checkpoint ckpt_open would accept, m NULL, err
 * its error (-EBADMSG, -EPROTONOSUPPORT, -ELOOP, -EIO, ...) and why the
 * reason. name, m and why are valid during the call only. A non-zero
 * return stops the listing.
 *
 * Returns 0, the first non-zero value fn returned, or a negative errno
 * from reading the directory (-ENOMEM, -EIO, ...). */
int ckpt_list(int dir_fd,
	      int (*fn)(const char *name, const struct ckpt_meta *m, int err, const char *why,
			void *arg),
	      void *arg);

/* Removes every temporary from dir_fd — a name of exactly the form
 * CKPT_TMP_PREFIX, valid name, '-', 16 lower-case hex digits, as
 * ckpt_write makes them — the leftovers of a writer that crashed. Other
 * files, hidden or not, are left alone. Call it at daemon start, before
 * any ckpt_write on dir_fd (a ckpt_write in flight would lose its
 * temporary and fail; nothing else would be harmed). Returns 0 and the
 * temporaries removed in *ret_removed (which may be NULL), or the first
 * negative errno met; it still tries every temporary. */
int ckpt_clean_temporaries(int dir_fd, uint32_t *ret_removed);

#endif
