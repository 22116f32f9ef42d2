/* client/pool.h — a pool handle: the pool's identity, its layout and the
 * mapping of its host arena.
 *
 * A pool handle belongs to one client (on its `pools` list) and owns the
 * handles of the sessions and leases opened through it. Page slot s of the
 * arena starts at `pages + s * page_bytes`. Not thread-safe.
 */
#ifndef KVPC_POOL_H
#define KVPC_POOL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "kvpalace.h"
#include "layout.h"
#include "list.h"

struct kvp_pool {
	struct kvp_client *client;
	struct list link;     /* in client->pools */
	struct list sessions; /* struct kvp_session.link */
	struct list leases;   /* struct kvp_lease.link */
	uint64_t id;
	struct kvp_layout layout;
	struct shm_layout shm; /* the same layout for shm/layout.h */
	uint64_t page_bytes;
	uint64_t row_bytes;
	uint32_t n_pages;
	unsigned char *arena; /* the whole mapping */
	uint64_t arena_bytes;
	unsigned char *pages; /* arena + arena_offset: page slot 0 */
};

/* Frees the pool handle with every session and lease handle opened through
 * it and unmaps the arena, without talking to the daemon (the caller has
 * closed the connection or released the leases). */
void pool_free(struct kvp_pool *p);

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

/* 0 when layer, kv and head are inside the pool's layout, else -ERANGE. */
static inline int pool_check_index(const struct kvp_pool *p, uint32_t layer, uint32_t kv,
				   uint32_t head)
{
	if (layer >= p->layout.n_layers || kv > 1 || head >= p->layout.n_kv_heads)
		return -ERANGE;
	return 0;
}

/* Grows a page table (*slots of *cap entries) to hold at least n entries.
 * Returns 0 or -ENOMEM (the table is unchanged). */
int pool_table_reserve(uint32_t **slots, size_t *cap, uint64_t n);

#endif
