/* daemon/core/lease.c — read leases (see lease.h). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "lease.h"

int lease_create(struct cache *c, struct pool *p, const void *owner, struct list *owner_list,
		 struct lease **ret_lease)
{
	struct lease *l = malloc(sizeof(*l));

	if (!l)
		return -ENOMEM;
	/* All but the inline tables' room, which nothing reads unwritten. */
	memset(l, 0, offsetof(struct lease, inline_tables));
	l->id = cache_new_id(c, p->uid);
	l->pool = p;
	l->owner = owner;
	l->tenant = cache_tenant(c, p->uid);
	if (idmap_put(&c->leases, l->id, l) < 0) {
		free(l);
		return -ENOMEM;
	}
	list_add_tail(owner_list, &l->owner_link);
	*ret_lease = l;
	return 0;
}

/* Bytes of the tables of n pages of bt tokens: hashes first, for their
 * alignment. */
static uint64_t tables_bytes(uint64_t n, uint32_t bt)
{
	return n * (sizeof(XXH128_hash_t) + sizeof(uint32_t) + (uint64_t)bt * sizeof(uint32_t));
}

int lease_reserve(struct lease *l, uint64_t n_pages)
{
	uint32_t bt = l->pool->layout.block_tokens;
	uint64_t bytes = tables_bytes(n_pages, bt);
	unsigned char *b;

	if (n_pages <= l->cap_pages)
		return 0;
	if (n_pages > UINT32_MAX || bytes > SIZE_MAX)
		return -ENOMEM;
	if (!l->cap_pages && bytes <= sizeof(l->inline_tables)) {
		b = l->inline_tables;
	} else {
		b = malloc((size_t)bytes);
		if (!b)
			return -ENOMEM;
	}
	/* The old tables' used part moves; the block they lay in goes. */
	if (l->n_pages) {
		memcpy(b, l->hashes, l->n_pages * sizeof(XXH128_hash_t));
		memcpy(b + n_pages * sizeof(XXH128_hash_t), l->pages,
		       l->n_pages * sizeof(uint32_t));
		memcpy(b + n_pages * (sizeof(XXH128_hash_t) + sizeof(uint32_t)), l->tokens,
		       (size_t)l->n_pages * bt * sizeof(uint32_t));
	}
	free(l->tables);
	l->tables = b == l->inline_tables ? NULL : b;
	l->hashes = (XXH128_hash_t *)(void *)b;
	l->pages = (uint32_t *)(void *)(b + n_pages * sizeof(XXH128_hash_t));
	l->tokens = (uint32_t *)(void *)(b + n_pages * (sizeof(XXH128_hash_t) + sizeof(uint32_t)));
	l->cap_pages = (uint32_t)n_pages;
	return 0;
}

int lease_add_page(struct lease *l, uint32_t slot, XXH128_hash_t hash, const uint32_t *tokens,
		   uint64_t now_ns)
{
	uint32_t bt = l->pool->layout.block_tokens;

	if (l->n_pages == l->cap_pages) {
		/* The inline room first, then doubling. */
		uint64_t fit = sizeof(l->inline_tables) / tables_bytes(1, bt);
		uint64_t cap = l->cap_pages ? (uint64_t)l->cap_pages * 2 : fit ? fit : 16;

		if (lease_reserve(l, cap) < 0)
			return -ENOMEM;
	}
	pagealloc_pin(&l->pool->pa, slot);
	l->tenant->leased_bytes += l->pool->page_bytes;
	prefix_index_update_at(&l->pool->ix, &l->pool->pa, slot, now_ns);
	memcpy(l->tokens + (uint64_t)l->n_pages * bt, tokens, bt * sizeof(uint32_t));
	l->hashes[l->n_pages] = hash;
	l->pages[l->n_pages++] = slot;
	return 0;
}

void lease_drop_pages(struct lease *l, uint32_t keep)
{
	uint64_t now = prefix_index_now_ns(); /* one use, one time */

	/* Leaves first, so a chain's pages become evictable child before
	 * parent. */
	while (l->n_dev > keep)
		pagealloc_unref(&l->pool->dev.pa, l->dev_slots[--l->n_dev]);
	while (l->n_pages > keep) {
		uint32_t slot = l->pages[--l->n_pages];

		pagealloc_unpin(&l->pool->pa, slot);
		l->tenant->leased_bytes -= l->pool->page_bytes;
		prefix_index_update_at(&l->pool->ix, &l->pool->pa, slot, now);
	}
}

void lease_release(struct cache *c, struct lease *l)
{
	if (!l)
		return;
	lease_drop_pages(l, 0);
	if (l->dev_slots)
		gpu_lease_release(l);
	idmap_del(&c->leases, l->id);
	list_del(&l->owner_link);
	free(l->carry);
	free(l->tables);
	prefix_index_spans_free(&l->spans);
	free(l);
}

struct lease *lease_get(struct cache *c, uint64_t id, const void *owner)
{
	struct lease *l = idmap_get(&c->leases, id);

	return l && l->owner == owner ? l : NULL;
}
