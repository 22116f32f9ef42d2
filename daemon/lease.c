/* daemon/lease.c — read leases (see lease.h). */
#include <errno.h>
#include <stdlib.h>

#include "lease.h"

int lease_create(struct cache *c, struct pool *p, const void *owner, struct list *owner_list,
		 struct lease **ret_lease)
{
	struct lease *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->id = cache_new_id(c);
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

int lease_add_pages(struct lease *l, const uint32_t *slots, uint32_t n)
{
	if ((uint64_t)l->n_pages + n > l->cap_pages) {
		uint64_t cap = l->cap_pages ? l->cap_pages : 16;
		uint32_t *p;

		while (cap < (uint64_t)l->n_pages + n)
			cap *= 2;
		if (cap > UINT32_MAX)
			return -ENOMEM;
		p = realloc(l->pages, cap * sizeof(uint32_t));
		if (!p)
			return -ENOMEM;
		l->pages = p;
		l->cap_pages = (uint32_t)cap;
	}
	for (uint32_t i = 0; i < n; i++) {
		pagealloc_pin(&l->pool->pa, slots[i]);
		prefix_index_update(&l->pool->ix, &l->pool->pa, slots[i]);
		l->pages[l->n_pages++] = slots[i];
	}
	return 0;
}

void lease_release(struct cache *c, struct lease *l)
{
	if (!l)
		return;
	/* Leaves first, so a chain's pages become evictable child before
	 * parent. */
	for (uint32_t i = l->n_pages; i-- > 0;) {
		pagealloc_unpin(&l->pool->pa, l->pages[i]);
		prefix_index_update(&l->pool->ix, &l->pool->pa, l->pages[i]);
	}
	idmap_del(&c->leases, l->id);
	list_del(&l->owner_link);
	free(l->carry);
	free(l->pages);
	free(l);
}

struct lease *lease_get(struct cache *c, uint64_t id, const void *owner)
{
	struct lease *l = idmap_get(&c->leases, id);

	return l && l->owner == owner ? l : NULL;
}
