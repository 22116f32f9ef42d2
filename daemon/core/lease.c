/* daemon/core/lease.c — read leases (see lease.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "lease.h"

int lease_create(struct cache *c, struct pool *p, const void *owner, struct list *owner_list,
		 struct lease **ret_lease)
{
	struct lease *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->id = cache_new_id(c, p->uid);
	l->pool = p;
	l->owner = owner;
	if (idmap_put(&c->leases, l->id, l) < 0) {
		free(l);
		return -ENOMEM;
	}
	list_add_tail(owner_list, &l->owner_link);
	*ret_lease = l;
	return 0;
}

int lease_reserve(struct lease *l, uint64_t n_pages)
{
	uint32_t bt = l->pool->layout.block_tokens;
	uint32_t *p, *t;
	XXH128_hash_t *h;

	if (n_pages <= l->cap_pages)
		return 0;
	if (n_pages > UINT32_MAX)
		return -ENOMEM;
	p = realloc(l->pages, n_pages * sizeof(*p));
	if (p)
		l->pages = p;
	h = realloc(l->hashes, n_pages * sizeof(*h));
	if (h)
		l->hashes = h;
	t = realloc(l->tokens, n_pages * bt * sizeof(*t));
	if (t)
		l->tokens = t;
	if (!p || !h || !t)
		return -ENOMEM;
	l->cap_pages = (uint32_t)n_pages;
	return 0;
}

int lease_add_page(struct lease *l, uint32_t slot, XXH128_hash_t hash, const uint32_t *tokens,
		   uint64_t now_ns)
{
	uint32_t bt = l->pool->layout.block_tokens;

	if (l->n_pages == l->cap_pages &&
	    lease_reserve(l, l->cap_pages ? (uint64_t)l->cap_pages * 2 : 16) < 0)
		return -ENOMEM;
	pagealloc_pin(&l->pool->pa, slot);
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
	free(l->tokens);
	free(l->hashes);
	free(l->pages);
	free(l);
}

struct lease *lease_get(struct cache *c, uint64_t id, const void *owner)
{
	struct lease *l = idmap_get(&c->leases, id);

	return l && l->owner == owner ? l : NULL;
}
