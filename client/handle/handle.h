/* client/handle/handle.h — the handles: what the library keeps of a
 * pool, a session and a read lease, and their teardown.
 *
 * Layer: handle (client/README.md), above base/ and rpc/, below api/.
 * Everything here is local: freeing a handle and growing a page table
 * never talk to the daemon (the calls that do are api/'s).
 *
 * A pool handle belongs to one client (on its `pools` list) and owns the
 * handles of the sessions and leases opened through it. Page slot s of the
 * arena starts at `pages + s * page_bytes`. The salt (kvp_pool_set_salt)
 * goes with every CreateSession and with the first MatchPrefix chunk sent
 * through the handle.
 *
 * A session handle is the client's copy of a session's page table:
 * slots[i] is the arena slot of page i of the session (positions
 * i * block_tokens onwards); the table covers every reserved token and
 * grows as Append replies extend it. Commit replies rewrite the entries of
 * the pages they filled (dedup), Truncate shrinks the table and may move
 * the new last page, and a fork's or a restored checkpoint's table is
 * read with SessionPages.
 *
 * A read lease handle holds the page table of a matched prefix: slots[i]
 * is the arena slot of page i of the match; the daemon keeps those pages
 * pinned until the lease is released or the connection closes. A miss is
 * a lease of id 0 and no tokens, which the daemon does not know.
 * Not thread-safe: one thread at a time per client.
 */
#ifndef KVPC_HANDLE_H
#define KVPC_HANDLE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "kvpalace.h"
#include "kvpalace.pb-c.h"
#include "layout.h"
#include "list.h"

/* Bytes of a cache salt at most (the daemon's limit, kvpalace.proto). */
#define POOL_SALT_MAX_BYTES 64u

/* An operation submitted without waiting (api/async.c), on its pool's
 * list until it completes. When the pool closes first, its request is
 * forgotten (the reply will be dropped) and free() is called: the api
 * layer's destructor, handed down. */
struct handle_async {
	struct list link; /* in kvp_pool.async */
	void (*free)(struct handle_async *op);
};

struct kvp_pool {
	struct kvp_client *client;
	struct list link;     /* in client->pools */
	struct list sessions; /* struct kvp_session.link */
	struct list leases;   /* struct kvp_lease.link */
	struct list async;    /* struct handle_async.link: submitted, not completed */
	uint64_t id;
	struct kvp_layout layout;
	struct shm_layout shm; /* the same layout for shm/layout.h */
	uint64_t page_bytes;
	uint64_t row_bytes;
	uint32_t n_pages;
	unsigned char *arena; /* the whole mapping */
	uint64_t arena_bytes;
	/* The arena's memfd, kept for kvp_session_write / kvp_lease_read
	 * (pwrite/pread need no page tables in this process); -1 when
	 * none. */
	int arena_fd;
	/* The arena is on hugetlbfs, which has no write(2): kvp_session_write
	 * copies through the mapping instead (pread works). */
	int arena_hugetlb;
	unsigned char *pages; /* arena + arena_offset: page slot 0 */
	unsigned char salt[POOL_SALT_MAX_BYTES];
	size_t salt_bytes; /* 0: no salt */
	/* The device arena (api/gpu.c, handle/devmap.c): offered by the daemon (dev_arena)
	 * and, once kvp_pool_gpu_open mapped it, at dev_base in this
	 * process's device address space. */
	int dev_arena;
	uint64_t dev_arena_bytes;
	uint32_t dev_n_pages;
	uint64_t dev_base; /* 0: not mapped */
	void *dev_map;	   /* struct vmm_map (CUDA builds) */
	int dev_emulated;  /* a daemon's emulated device: a memfd at dev_base */
			   /* Prefaulting (handle_populate): 0 not decided yet, 1 on, -1 off
	 * ($KVPALACE_PREFAULT=0, or a kernel without MADV_POPULATE_READ);
	 * prefault_huge: the arena may be backed by transparent huge pages,
	 * where prefaulting a reader's pages pays too;
	 * prefaulted[] has a bit per arena slot this process prefaulted
	 * (NULL until the first). */
	int prefault;
	int prefault_huge;
	uint64_t *prefaulted;
};

struct kvp_session {
	struct kvp_pool *pool;
	struct list link; /* in pool->sessions */
	uint64_t id;
	uint64_t n_tokens;  /* reserved, committed or not */
	uint64_t committed; /* committed, <= n_tokens */
	uint32_t *slots;    /* [cap] page table; pool_pages_for(n_tokens) entries used */
	size_t cap;
	int compacted; /* seen compacted: positions are not indexes */
	/* Device slots of pages a GPU-tier append touched (api/gpu.c):
	 * [dev_cap], SESSION_NO_DEV for none; NULL until the first one. */
	uint32_t *dev_slots;
	size_t dev_cap;
};

#define SESSION_NO_DEV UINT32_MAX

struct kvp_lease {
	struct kvp_pool *pool;
	struct list link; /* in pool->leases */
	uint64_t id;	  /* 0: a miss, nothing to release */
	uint64_t n_tokens;
	uint32_t *slots; /* [cap] page table; pool_pages_for(n_tokens) entries used */
	size_t cap;
	uint32_t want_tier;  /* asked for (enum kvp_tier) */
	int or_host;	     /* the host tier will do when the GPU cannot */
	uint32_t tier;	     /* the tier the daemon serves it from */
	uint32_t *dev_slots; /* [dev_cap] device slot of page i, i < n_dev */
	size_t dev_cap;
	uint64_t n_dev;
};

/* Frees the pool handle with every session and lease handle opened through
 * it and unmaps the arena and the device arena, without talking to the
 * daemon (the caller has closed the connection or released the leases). */
void handle_pool_free(struct kvp_pool *p);

/* Frees the session handle (off its pool's list) without telling the
 * daemon. */
void handle_session_free(struct kvp_session *s);

/* Frees the lease handle (off its pool's list) without telling the
 * daemon. */
void handle_lease_free(struct kvp_lease *l);

/* Pages needed for n tokens. */
static inline uint64_t pool_pages_for(const struct kvp_pool *p, uint64_t n_tokens)
{
	return n_tokens / p->layout.block_tokens + (n_tokens % p->layout.block_tokens != 0);
}

/* Address of element 0 of (layer, kv, head) of token `pos` stored in page
 * slot `slot` (pos counts from the start of the sequence). Indices must
 * have been checked against the layout and the slot against n_pages. */
static inline unsigned char *pool_kv(const struct kvp_pool *p, uint32_t slot, uint64_t pos,
				     uint32_t layer, uint32_t kv, uint32_t head)
{
	uint32_t token = (uint32_t)(pos % p->layout.block_tokens);

	return p->pages + (uint64_t)slot * p->page_bytes +
	       shm_kv_offset(&p->shm, layer, kv, head, token);
}

/* 0 when layer, kv and head are inside the pool's layout (kv is 0 in a
 * latent layout: one plane), else -ERANGE. */
static inline int pool_check_index(const struct kvp_pool *p, uint32_t layer, uint32_t kv,
				   uint32_t head)
{
	if (layer >= p->layout.n_layers || kv >= shm_layout_planes(&p->shm) ||
	    head >= p->layout.n_kv_heads)
		return -ERANGE;
	return 0;
}

/* Puts the handle's salt, if any, into an optional bytes field of a
 * request (valid while p is). */
static inline void pool_salt_field(struct kvp_pool *p, protobuf_c_boolean *has,
				   ProtobufCBinaryData *field)
{
	*has = p->salt_bytes != 0;
	field->data = p->salt;
	field->len = p->salt_bytes;
}

/* Prefaults this process's page tables for the arena pages of slots[0..n)
 * (shm_populate), runs of neighbouring slots in one system call, skipping
 * slots it did before. For a writer (`write`: a reservation's new pages)
 * always: the pages it is handed are then mapped writable 16 at a time
 * instead of faulting once per 4 KiB. For a reader only where the arena
 * has huge pages: with 4 KiB pages its read faults map 16 pages each
 * already, and prefaulting measured no faster. Only the pages handed out
 * are touched, never the rest of the arena. Changes no byte; failures are
 * ignored (the pages fault in on first touch as without it). A slot's bit
 * stays set after the daemon gave its memory back (a hole punched in a
 * free slot unmaps it): it faults in again. */
void handle_populate(struct kvp_pool *p, const uint32_t *slots, uint64_t n, int write);

/* handle_populate of the pages of a read lease served from the host
 * tier (a GPU-tier lease is read on the device). */
void handle_lease_populate(struct kvp_lease *l);

/* Fills *v for page `page` (an index into a page table) stored in arena
 * slot `slot`, of which n_tokens tokens are held (see struct
 * kvp_page_view in kvpalace.h). */
void handle_page_view(const struct kvp_pool *p, uint32_t slot, uint64_t page, uint32_t n_tokens,
		      struct kvp_page_view *v);

/* Grows a page table (*slots of *cap entries) to hold at least n entries.
 * Returns 0 or -ENOMEM (the table is unchanged). */
int handle_table_reserve(uint32_t **slots, size_t *cap, uint64_t n);

#endif
