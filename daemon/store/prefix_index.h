/* daemon/store/prefix_index.h — a pool's content-addressed index of full pages.
 *
 * Full committed pages of exact sessions are addressed by a hash chain,
 * h_i = XXH3_128(h_{i-1} ‖ tokens of page i), whose root h_{-1} is derived
 * from the pool's identity (model id, layout, format version) and the
 * client's optional cache salt. The hash is deterministic — no per-process
 * seed — so the same tokens give the same hashes in every process and after
 * every restart. Each pool has its own index and pools are per tenant.
 *
 * An entry has up to two copies of its page: one in a host slot (the index
 * holds one reference on it) and one in an extent of the pool's spill file
 * (daemon/store/spill.h), with the XXH3-64 of the bytes written there. Entries
 * without a host copy are still found by prefix_index_find; a caller that
 * needs the bytes promotes them first (daemon/core/tier.h). An entry with
 * neither copy is dead (a read that failed verification): it is a miss
 * and stays only while it has children, so their parent pointers hold.
 *
 * Two LRU lists, least recently used first:
 *   - host: entries whose host copy nothing but the index holds (no
 *     session, no lease, no I/O) and none of whose children keeps a host
 *     copy. They can leave the host tier. A child is useless without its
 *     parent, so a chain leaves the host tier from its end, leaves first,
 *     with a disk tier (where leaving means being written to disk) as
 *     without one (where it means being dropped): whatever stays in the
 *     host tier is whole prefixes, matched without a disk read. A
 *     parent whose last child left is as cold as that child: it goes to
 *     the cold end, next in line (issue 13: spilling took parents while
 *     their children stayed). Entries
 *     marked permanent (pages of spans a client tagged permanent: system
 *     prompts, profiles, summaries; the hierarchy's top layer) sit on a
 *     second host list that is only reached once the first is used up, so
 *     they are the last to leave the host tier (prefix_index_host_next
 *     walks both in that order).
 *   - disk: entries without a host copy and without children: they can be
 *     dropped when the disk tier is full.
 * Callers tell the index whenever a page's holders change
 * (prefix_index_update).
 *
 * Recency survives a restart: the index keeps a use clock, and an entry
 * takes the next tick (e->used) whenever it is used — it joins the warm
 * end of the host list (a commit, a lease released, a promotion) or is
 * touched; leaving the host tier is no use. The disk tier writes the
 * stamp into the page's spill header and rebuilds disk_lru from it at
 * start, least recently used first (daemon/core/tier.h).
 *
 * Lossy copies: a disk copy stored quantized (spill-dtype) is not the
 * page a client wrote. An entry whose only copy is such a one is lossy
 * (prefix_index_lossy): it is never matched, promoted or shared as exact,
 * and a commit of the same tokens replaces it (daemon/core/session.c).
 * Event-loop thread only.
 */
#ifndef KVPD_PREFIX_INDEX_H
#define KVPD_PREFIX_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "ghost.h"
#include "idmap.h"
#include "layout.h"
#include "list.h"
#include "pagealloc.h"

/* Bumped whenever what is hashed changes: it is part of every root. */
#define PREFIX_INDEX_FORMAT   1u
#define PREFIX_INDEX_MAX_SALT 64u

#define PINDEX_NONE UINT32_MAX

enum pindex_io {
	PINDEX_IO_NONE,
	PINDEX_IO_WRITE, /* host copy being written to disk */
	PINDEX_IO_READ,	 /* disk copy being read into a host slot */
};

enum pindex_list {
	PINDEX_LIST_NONE,
	PINDEX_LIST_HOST,
	PINDEX_LIST_DISK,
};

/* Laid out for the walk (core/match.c): a match's lookup, pin and
 * release of a page read and write only the first 64 bytes (hash to
 * disk_dtype) but for a leaf's list links, which used to be spread over
 * all 136. 120 bytes in all: a 128-byte malloc chunk, 16 bytes a page
 * less than before. */
struct pindex_entry {
	XXH128_hash_t hash;
	uint32_t slot;		  /* host slot, or PINDEX_NONE */
	uint32_t n_children;	  /* entries whose parent this is */
	uint32_t n_host_children; /* children whose host copy stays (not leaving) */
	uint8_t io;		  /* enum pindex_io */
	uint8_t list;		  /* enum pindex_list: the LRU list it is on */
	uint8_t idle;		  /* counted in n_idle */
	uint8_t idle_busy;	  /* counted in n_idle_busy */
	uint64_t used;		  /* the use clock when last used, 0: never this run */
	uint64_t used_ns;	  /* last use (CLOCK_MONOTONIC), 0: not since the daemon started */
	struct pindex_entry *parent; /* NULL for a first page */
	uint8_t demoted;	     /* prefix_index_demote: may leave before its children */
	uint8_t prewarmed;	     /* read in ahead of any request, not used since */
	uint8_t leaving;	     /* host copy goes once its write to disk is done */
	uint8_t remote;		     /* written to the remote tier (or from it), core/rtier.c */
	uint8_t lfu_count : 4;	     /* 0 .. PINDEX_LFU_BUCKETS - 1 */
	uint8_t lfu_bucket : 4;	     /* the host_lfu list it is on (--eviction window: its class) */
	uint8_t permanent;	     /* leaves the host tier last (prefix_index_mark_permanent) */
	uint8_t mark;		     /* scratch of prefix_index_forget, 0 between calls */
	uint8_t disk_dtype;	     /* the disk copy's format: 0 the pool's own, else quantized */
	/* 64 bytes: what only eviction, the disk tier and purges need. */
	struct list lru_link;
	/* The root its chain starts from (pool identity + cache salt), so an
	 * admin can purge one salt's pages; {0, 0} when unknown (a page found
	 * in a spill file written before roots were recorded there). */
	XXH128_hash_t root;
	uint64_t disk_sum;  /* XXH3-64 of the bytes in extent */
	uint64_t disk_used; /* the stamp the disk copy's header carries */
	uint32_t extent;    /* spill-file extent, or PINDEX_NONE */
	uint32_t lfu_epoch; /* --eviction lfu: lfu_count as of this aging step */
};

/* --eviction lfu (prefix_index_set_lfu). */
#define PINDEX_LFU_BUCKETS    16u /* counts 0..15: lfu_count and lfu_bucket are 4 bits */
#define PINDEX_LFU_AGING_USES 32768u
#define PINDEX_LFU_GHOSTS     8u /* ghosts per host page */
/* --eviction window (prefix_index_set_window): host_lfu[0] lists the
 * probation class's leaves, host_lfu[1] the main class's. */
#define PINDEX_WIN_PERMILLE  700u /* probation's share of the pages */
#define PINDEX_WIN_PROBATION 0u
#define PINDEX_WIN_MAIN	     1u

struct prefix_index {
	struct idmap by_hash;	       /* low 64 bits of the hash (| 1) → entry */
	struct pindex_entry **by_slot; /* [n_pages] entry holding each slot, or NULL */
	uint32_t n_pages;
	int disk;	      /* a disk tier backs this index */
	struct list host_lru; /* host copies only the index holds, LRU first */
	struct list keep_lru; /* the same for permanent entries */
	struct list disk_lru; /* droppable entries without a host copy, LRU first */
	uint32_t n_entries;   /* every entry, dead ones included */
	uint32_t n_host;      /* entries with a host copy */
	uint32_t n_disk;      /* entries with a disk copy */
	uint32_t n_evictable; /* on the host list */
	uint32_t n_droppable; /* on the disk list */
	uint32_t n_permanent; /* entries marked permanent */
	uint64_t clock;	      /* the use clock: last stamp handed out */
	/* Entries used at or after this stamp are no victims (0: none), while
	 * a match brings its chain in (prefix_index_keep_walk). */
	uint64_t keep_from;
	uint32_t n_leaving;   /* entries whose host copy goes once written */
	uint32_t n_idle;      /* host copies only the index (and a write) holds */
	uint32_t n_idle_busy; /* of those, with disk I/O in flight */
	uint64_t evictions;   /* entries dropped (host or disk), not demoted */
	uint64_t forgotten;   /* entries an admin purged or dropped (prefix_index_forget) */
	uint64_t dedup_pages;
	/* Pages read in ahead of any request (prefix_index_set_prewarmed),
	 * and of them those a request used before they left the host tier
	 * and those that left unused. */
	uint64_t prewarm_pages, prewarm_used, prewarm_unused;
	/* Told of every entry about to leave the index (evicted, dropped,
	 * purged; not at prefix_index_fini): how the core learns what to
	 * announce (KV events). NULL: nobody asks. */
	void (*gone)(void *arg, const struct pindex_entry *e);
	void *gone_arg;
	/* Told of every host copy about to leave the host tier by eviction
	 * (prefix_index_detach_host, prefix_index_drop of an entry with a
	 * host copy, prefix_index_evict), while its bytes are still in its
	 * slot; then with e NULL once the call that evicted is over (one
	 * prefix_index_evict run, or a run between prefix_index_leaving_batch
	 * 1 and 0, is one batch). Not told of a purge
	 * (prefix_index_forget) or prefix_index_fini: those pages are not
	 * kept anywhere. It must neither change the index nor keep the slot:
	 * eviction goes on at once. NULL: nobody asks. How the core writes
	 * pages to the remote tier on eviction (core/rtier.c). */
	void (*leaving)(void *arg, struct pindex_entry *e);
	void *leaving_arg;
	uint32_t evicting; /* batches open (prefix_index_leaving_batch): one NULL call at the end */
	int left_in_batch; /* of them, a host copy left */
	/* --eviction lfu: the host list is PINDEX_LFU_BUCKETS lists by use
	 * count, lowest first (least recently joined first inside each). */
	int lfu;
	struct list host_lfu[PINDEX_LFU_BUCKETS];
	uint32_t lfu_epoch;	 /* aging steps so far */
	uint64_t lfu_uses;	 /* uses since the last step */
	uint64_t lfu_aging_uses; /* a step every this many */
	struct ghost ghost;	 /* evicted pages' counts */
	/* --eviction window: the classes' lists are host_lfu[0] and [1]. */
	int win;
	uint32_t win_limit; /* probation pages held before probation goes first */
	uint32_t n_prob;    /* host copies of the probation class */
};

/* Returns 0 or -ENOMEM. */
int prefix_index_init(struct prefix_index *ix, uint32_t n_pages);
/* Makes the host tier's victim order LFU (before any entry exists): the
 * victims stay leaves first with permanent entries last, but among
 * leaves the lowest use count goes first, least recently used first
 * among equals. A use is an entry's host copy becoming idle (a session,
 * lease or job let go of it: once a request that matched or wrote it);
 * counts saturate at 15 and halve every aging_uses uses (the lists are
 * re-sorted then); a dropped entry's count is remembered in a FIFO of
 * n_ghosts ghosts (daemon/store/ghost.h) and given back if the page is
 * indexed again while its ghost lives. bench/trace_sim.c's leaf-LFU is
 * the same order. Returns 0, -EINVAL (entries exist), -ENOMEM. */
int prefix_index_set_lfu(struct prefix_index *ix, uint32_t n_ghosts, uint64_t aging_uses);

/* Makes the host tier's victim order a probation window in front of an
 * LRU main segment (before any entry exists): leaves first, permanent
 * entries last, and every entry of one of two classes. A new entry is
 * on probation; one used a second time (its host copy became idle twice:
 * the request that wrote it and another) joins main for good. While
 * host copies on probation number more than permille / 1000 of the
 * pages, probation's least recently used leaf goes first, else main's
 * (and probation's when main has no leaf). bench/trace_sim.c's
 * leaf-window is the same order. Returns 0 or -EINVAL (entries exist,
 * permille over 1000). */
int prefix_index_set_window(struct prefix_index *ix, uint32_t permille);

/* True when a request other than the one that wrote e used it (its host
 * copy became idle twice, under every victim order): the disk tier's
 * admission test under --disk-admission reused. */
static inline int prefix_index_reused(const struct pindex_entry *e)
{
	return e->lfu_count >= 2;
}

/* Drops every entry's reference through pa and frees the index. */
void prefix_index_fini(struct prefix_index *ix, struct pagealloc *pa);
/* Gives the hash map a larger table at once (idmap_table_new, made on a
 * worker), so listing many entries (a warm restart) never pauses to
 * rehash them all or to fault a large table in. Returns 0, or -ENOSPC
 * (not larger: the caller frees slots; the map grows as it goes). */
int prefix_index_adopt_table(struct prefix_index *ix, struct idmap_entry *slots, size_t cap);

/* The chain root of a pool identity and salt (salt_len ≤ 64). */
XXH128_hash_t prefix_index_root(const char *model_id, const struct shm_layout *layout,
				const void *salt, size_t salt_len);
/* h_i from h_{i-1} and the n tokens of page i. */
XXH128_hash_t prefix_index_hash_page(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n);

/* Extra keys (issue 18): what the tokens alone do not say about the KV.
 *
 * A whole-chain extra key (a LoRA adapter id; bytes, ≤ 64, distinct from
 * the salt, which isolates tenants) is folded into the root:
 * prefix_index_root_keyed. Without one (len 0) the root is
 * prefix_index_root's.
 *
 * A key span says that tokens [first_token, first_token + n_tokens) of a
 * sequence (absolute positions) stand for content the key names: an
 * image's content hash behind its placeholder tokens. A page that
 * overlaps spans hashes, after its parent and tokens, each such span's
 * start relative to the page's first token (int64: negative for a span
 * that began on an earlier page) and its key's digest, in order; the same
 * image at another position, or another image behind the same tokens,
 * gives other hashes. A page that overlaps no span hashes exactly as
 * prefix_index_hash_page (existing pools, spill files and checkpoints keep
 * their hashes). The span's length only decides which pages it overlaps,
 * so a span cut short (a truncate inside it) keeps the hashes of the pages
 * before the cut. Spans of one sequence are sorted by first_token and do
 * not overlap (callers validate that). */
#define PREFIX_INDEX_MAX_KEY   64u  /* bytes of an extra key or a span's key */
#define PREFIX_INDEX_MAX_SPANS 256u /* spans in one request */

struct pindex_span {
	uint64_t first_token; /* absolute position of its first token */
	uint64_t n_tokens;    /* ≥ 1 */
	XXH128_hash_t key;    /* prefix_index_key_digest of its key bytes */
};

/* The root of a pool identity, salt and extra key (each ≤ 64 bytes);
 * prefix_index_root's when extra_len is 0. */
XXH128_hash_t prefix_index_root_keyed(const char *model_id, const struct shm_layout *layout,
				      const void *salt, size_t salt_len, const void *extra,
				      size_t extra_len);
/* The digest a span's key bytes (≤ 64) are folded in as. */
XXH128_hash_t prefix_index_key_digest(const void *key, size_t len);
/* The index of the first of spans[0..n) that ends after pos (n if none). */
uint32_t prefix_index_span_seek(const struct pindex_span *spans, uint32_t n, uint64_t pos);
/* The hash of the page of n tokens whose first token is at absolute
 * position pos, after parent, under the sorted spans[0..n_spans) of its
 * sequence (those that overlap no part of the page are skipped; NULL
 * with 0 for none). */
XXH128_hash_t prefix_index_hash_keyed(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n,
				      uint64_t pos, const struct pindex_span *spans,
				      uint32_t n_spans);

/* A sequence's spans (a session's, a lease's), sorted and disjoint. */
struct pindex_spans {
	struct pindex_span *v; /* [cap], n used */
	uint32_t n, cap;
};
/* Frees s's array; s is empty after. */
void prefix_index_spans_free(struct pindex_spans *s);
/* Adds add[0..n) after s's spans (the caller checked the order). Returns
 * 0, -EDQUOT when s would hold more than max, or -ENOMEM (s unchanged). */
int prefix_index_spans_add(struct pindex_spans *s, const struct pindex_span *add, uint32_t n,
			   uint32_t max);
/* Keeps what of s lies before position n_tokens: later spans go, one
 * crossing it is cut short there (the hashes of the pages before stay). */
void prefix_index_spans_cut(struct pindex_spans *s, uint64_t n_tokens);
/* dst (empty) gets src's spans cut at n_tokens. Returns 0 or -ENOMEM. */
int prefix_index_spans_copy(struct pindex_spans *dst, const struct pindex_span *src, uint32_t n_src,
			    uint64_t n_tokens);

/* The entry of hash, or NULL. It may have no host copy (check e->slot). */
struct pindex_entry *prefix_index_find(const struct prefix_index *ix, XXH128_hash_t hash);
/* The entry of hash when its page is in a host slot, or NULL. */
struct pindex_entry *prefix_index_find_host(const struct prefix_index *ix, XXH128_hash_t hash);
/* Starts loading what prefix_index_find of hash reads first: a walk
 * hashes a few pages ahead and prefetches, so that its lookups' cache
 * misses overlap instead of following one another. */
void prefix_index_prefetch(const struct prefix_index *ix, XXH128_hash_t hash);
/* True when e's only copy is a lossy one (a disk copy stored quantized):
 * its bytes are not the ones written, so it is no exact page. Host copies
 * are always exact: they come from commits and from disk copies stored as
 * they were (daemon/core/tier.c never promotes a lossy one). */
static inline int prefix_index_lossy(const struct pindex_entry *e)
{
	return e->slot == PINDEX_NONE && e->extent != PINDEX_NONE && e->disk_dtype != 0;
}

/* The entry listing slot, or NULL. */
static inline struct pindex_entry *prefix_index_of_slot(const struct prefix_index *ix,
							uint32_t slot)
{
	return ix->by_slot[slot];
}

/* Lists slot (a held page) under hash, child of parent (may be NULL),
 * taking a reference on it. A child inherits its parent's root; a first
 * page's root is the caller's to set. Returns 0, -EEXIST when hash or its
 * 64-bit key is taken (the page simply stays unindexed), or -ENOMEM. */
int prefix_index_insert(struct prefix_index *ix, struct pagealloc *pa, XXH128_hash_t hash,
			struct pindex_entry *parent, uint32_t slot);

/* Lists a page that is only on disk (warm restart): extent holds bytes
 * in format dtype (as disk_dtype) whose XXH3-64 is sum; root as for
 * prefix_index_insert. Its last use is unknown (0). Returns 0, -EEXIST or
 * -ENOMEM. */
int prefix_index_insert_disk(struct prefix_index *ix, XXH128_hash_t hash,
			     struct pindex_entry *parent, uint32_t extent, uint64_t sum,
			     uint8_t dtype);

/* Re-evaluates which list slot's entry, if any, belongs on after its
 * holders changed. An entry that joins a list goes to its most recently
 * used end. */
void prefix_index_update(struct prefix_index *ix, const struct pagealloc *pa, uint32_t slot);
/* The same with the time of the use given (prefix_index_now_ns), for
 * callers that update many pages at once. */
void prefix_index_update_at(struct prefix_index *ix, const struct pagealloc *pa, uint32_t slot,
			    uint64_t now_ns);
/* The same for an entry whose I/O state or copies changed. */
void prefix_index_reconsider(struct prefix_index *ix, const struct pagealloc *pa,
			     struct pindex_entry *e);

/* Marks e recently used: to the warm end of the list it is on; a demoted
 * entry is demoted no more. */
void prefix_index_touch(struct prefix_index *ix, const struct pagealloc *pa,
			struct pindex_entry *e);

/* Moves e to the cold end of its list: the first to leave the host tier
 * (or to be dropped from disk) next. With a disk tier a demoted entry may
 * leave the host tier before its children (a policy's tier placement:
 * the hierarchy sends its rest layer to disk while later turns stay),
 * until it is touched. */
void prefix_index_demote(struct prefix_index *ix, const struct pagealloc *pa,
			 struct pindex_entry *e);

/* Marks e permanent (for good): it moves to the host list that leaves the
 * host tier last. */
void prefix_index_mark_permanent(struct prefix_index *ix, const struct pagealloc *pa,
				 struct pindex_entry *e);

/* The host list in the order pages should leave the host tier: the entry
 * after e (NULL: the first), ordinary entries least recently used first,
 * then permanent ones least recently used first; NULL at the end. While
 * a walk is kept (prefix_index_keep_walk) the entries it used are
 * skipped. */
struct pindex_entry *prefix_index_host_next(const struct prefix_index *ix,
					    const struct pindex_entry *e);

/* e's disk copy is being read in ahead of any request (core/prewarm.c;
 * e->io is PINDEX_IO_READ next). Until a request uses it (a touch, or a
 * session or lease holding it) the page is no use: it joins its host list
 * at the cold end, first to leave, and its use count stays. Counted in
 * prewarm_pages, then in prewarm_used or, when its host copy leaves
 * first, prewarm_unused. */
void prefix_index_set_prewarmed(struct prefix_index *ix, struct pindex_entry *e);
/* The read of prewarmed e did not start (counted 0: as if never asked) or
 * failed (1: it left unused). */
void prefix_index_unset_prewarmed(struct prefix_index *ix, struct pindex_entry *e, int counted);
/* Entries on the disk list from the most recently used: the one before e
 * (NULL: the last), NULL at the start. */
struct pindex_entry *prefix_index_disk_prev(const struct prefix_index *ix,
					    const struct pindex_entry *e);

/* A match bringing its chain back (core/match.c's prefetch walk) makes
 * room for each page it reads from disk; the victims must not be the
 * pages the same walk found in the host tier or read before. Under LRU
 * they are the warmest and the walk's room rule keeps it short of them,
 * but a victim order by class (--eviction window: main before probation
 * while probation is under its share) takes a promoted chain's own
 * leaf first, its parent next, and the walk evicted what it read until
 * the request's park limit. On (keep 1) until turned off (0): every entry
 * used from now on (touched, or joining the host list) is no victim;
 * making room finds other victims or none (the walk stops and serves the
 * prefix it has). */
void prefix_index_keep_walk(struct prefix_index *ix, int keep);

/* Moves e to the list it belongs on, at the cold end when it joins one:
 * for a page written to disk while its children left the host tier, which
 * makes it next in line. */
void prefix_index_reconsider_cold(struct prefix_index *ix, const struct pagealloc *pa,
				  struct pindex_entry *e);

/* Marks e, whose host copy is being written to disk (e->io is
 * PINDEX_IO_WRITE), as leaving the host tier once written (leaving 1), or
 * as staying after all (0). A leaving page no longer counts as its
 * parent's host child, so the parent may be next. */
void prefix_index_set_leaving(struct prefix_index *ix, const struct pagealloc *pa,
			      struct pindex_entry *e, int leaving);

/* Gives e (which has no host copy) the held page slot as its host copy,
 * taking a reference on it. */
void prefix_index_attach_host(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
			      uint32_t slot);
/* Drops e's host copy (its reference on the slot); e keeps its disk copy,
 * or is dropped when it has none and no children. */
void prefix_index_detach_host(struct prefix_index *ix, struct pagealloc *pa,
			      struct pindex_entry *e);
/* Removes e from the index: its host reference goes, its extent is
 * returned in *ret_extent (PINDEX_NONE if none) for the caller to free.
 * e must have no children and no I/O in flight. */
void prefix_index_drop(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
		       uint32_t *ret_extent);

/* Frees host slots synchronously, in the order of the host list (leaves
 * first, least recently used first), until pa has want_free free pages or
 * nothing more can go: entries with a disk copy lose their host copy and,
 * when may_drop, leaves without one are dropped; the others stay (the
 * disk tier writes them, daemon/core/tier.h). Returns the slots freed. */
/* Opens (1) or closes (0) a batch of host copies leaving: the leaving
 * hook hears of each, and once with NULL when the outermost batch closes
 * having had any (for a caller evicting many pages one call at a time,
 * as core/tier.c's spill does). prefix_index_evict is one batch. */
void prefix_index_leaving_batch(struct prefix_index *ix, int open);
uint32_t prefix_index_evict(struct prefix_index *ix, struct pagealloc *pa, uint32_t want_free,
			    int may_drop);

/* Forgets entries for good, in every copy the index knows: every entry
 * pick(arg, e) accepts and all their descendants (a child is useless, and
 * would still name the forgotten tokens, without its parent). Each is
 * removed from the index — no lookup finds it any more — after gone(arg,
 * e) was called for it (children before parents), where the caller takes
 * what outlives the entry: its extent (which the index does not free),
 * its hash for device copies. Its host reference goes; a slot that a
 * session or lease also holds stays theirs until they let it go. With
 * dry_run nothing changes and gone is not called. Returns the entries
 * forgotten (or that would be), or -EBUSY when one of them has disk I/O in
 * flight (nothing changed: try again once the pool's I/O is done). O(n). */
int prefix_index_forget(struct prefix_index *ix, struct pagealloc *pa,
			int (*pick)(void *arg, const struct pindex_entry *e),
			void (*gone)(void *arg, const struct pindex_entry *e), void *arg,
			int dry_run);

/* Takes e's disk copy away (admin eviction from the disk tier): its
 * extent goes to *ret_extent for the caller to forget and free; an entry
 * left with no copy and no children is dropped. e must have a disk copy
 * and no I/O in flight. */
void prefix_index_detach_disk(struct prefix_index *ix, struct pagealloc *pa, struct pindex_entry *e,
			      uint32_t *ret_extent);

/* The CLOCK_MONOTONIC time entries' used_ns are stamped with (coarse:
 * a few milliseconds late at most). */
uint64_t prefix_index_now_ns(void);

/* Checks entries against pa: by_slot and by_hash agree, child counts (and
 * host child counts) are right, each LRU list holds exactly the entries
 * that belong on it, the idle and leaving counts agree. Adds each entry's
 * reference to refs[slot]. Returns 0 or -EUCLEAN. */
int prefix_index_check(const struct prefix_index *ix, const struct pagealloc *pa, uint32_t *refs);

#endif
