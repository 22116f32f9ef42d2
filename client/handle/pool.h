/* client/handle/pool.h — a pool handle: the pool's identity, its layout, the
 * mapping of its host arena and the cache salt of the handle.
 *
 * A pool handle belongs to one client (on its `pools` list) and owns the
 * handles of the sessions and leases opened through it. Page slot s of the
 * arena starts at `pages + s * page_bytes`. The salt (kvp_pool_set_salt)
 * goes with every CreateSession and with the first MatchPrefix chunk sent
 * through the handle. Not thread-safe.
 */
#ifndef KVPC_POOL_H
#define KVPC_POOL_H

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
	unsigned char salt[POOL_SALT_MAX_BYTES];
	size_t salt_bytes; /* 0: no salt */
	/* The device arena (client/gpu.c): offered by the daemon (dev_arena)
	 * and, once kvp_pool_gpu_open mapped it, at dev_base in this
	 * process's device address space. */
	int dev_arena;
	uint64_t dev_arena_bytes;
	uint32_t dev_n_pages;
	uint64_t dev_base; /* 0: not mapped */
	void *dev_map;	   /* struct vmm_map (CUDA builds) */
	int dev_emulated;  /* a daemon's emulated device: a memfd at dev_base */
};

/* Unmaps the pool's device arena, if mapped (client/gpu.c). */
void pool_gpu_unmap(struct kvp_pool *p);

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

/* Puts the handle's salt, if any, into an optional bytes field of a
 * request (valid while p is). */
static inline void pool_salt_field(struct kvp_pool *p, protobuf_c_boolean *has,
				   ProtobufCBinaryData *field)
{
	*has = p->salt_bytes != 0;
	field->data = p->salt;
	field->len = p->salt_bytes;
}

/* Grows a page table (*slots of *cap entries) to hold at least n entries.
 * Returns 0 or -ENOMEM (the table is unchanged). */
int pool_table_reserve(uint32_t **slots, size_t *cap, uint64_t n);

#endif
