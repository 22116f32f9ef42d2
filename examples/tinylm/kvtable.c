/* examples/tinylm/kvtable.c — page tables of borrowed and private pages
 * (see kvtable.h). Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvtable.h"

void kvtable_init(struct kvtable *t, const struct shm_layout *l)
{
	memset(t, 0, sizeof(*t));
	t->kv.layout = *l;
	t->page_bytes = shm_page_bytes(l);
}

void kvtable_free(struct kvtable *t)
{
	for (uint64_t i = 0; i < t->kv.n_pages; i++)
		free(t->owned[i]);
	free(t->owned);
	free(t->kv.pages);
	t->kv.pages = NULL;
	t->owned = NULL;
	t->kv.n_pages = t->cap = 0;
}

int kvtable_set(struct kvtable *t, uint64_t i, void *page, int owned)
{
	if (i >= t->cap) {
		uint64_t cap = t->cap ? t->cap * 2 : 64;
		void **p, **o;

		while (cap <= i)
			cap *= 2;
		p = realloc(t->kv.pages, cap * sizeof(void *));
		if (!p)
			return -ENOMEM;
		t->kv.pages = p;
		o = realloc(t->owned, cap * sizeof(void *));
		if (!o)
			return -ENOMEM;
		t->owned = o;
		for (uint64_t j = t->cap; j < cap; j++)
			t->kv.pages[j] = t->owned[j] = NULL;
		t->cap = cap;
	}
	if (t->owned[i] && t->owned[i] != page)
		free(t->owned[i]);
	t->kv.pages[i] = page;
	t->owned[i] = owned ? page : NULL;
	if (i >= t->kv.n_pages)
		t->kv.n_pages = i + 1;
	return 0;
}

static int private_page(struct kvtable *t, void **ret_page)
{
	void *page = NULL;

	if (posix_memalign(&page, SHM_PAGE_ALIGN, t->page_bytes))
		return -ENOMEM;
	memset(page, 0, t->page_bytes);
	*ret_page = page;
	return 0;
}

int kvtable_ensure(struct kvtable *t, uint64_t pos)
{
	uint64_t i = pos / t->kv.layout.block_tokens;
	void *page;
	int ret;

	if (i < t->kv.n_pages && t->kv.pages[i])
		return 0;
	ret = private_page(t, &page);
	if (ret == 0) {
		ret = kvtable_set(t, i, page, 1);
		if (ret < 0)
			free(page);
	}
	return ret;
}

int kvtable_restore(struct kvtable *t, const void *const *src, uint64_t m)
{
	const struct shm_layout *l = &t->kv.layout;
	uint64_t full = m / l->block_tokens;
	uint32_t partial = (uint32_t)(m % l->block_tokens);
	uint32_t pos[SHM_MAX_BLOCK_TOKENS];
	void *page;
	int ret;

	if (t->kv.n_pages)
		return -EINVAL;
	for (uint64_t i = 0; i < full; i++) {
		ret = kvtable_set(t, i, (void *)src[i], 0);
		if (ret < 0)
			return ret;
	}
	if (!partial)
		return 0;
	/* positions [full * bt, m) of src, to slots 0.. of a private page */
	for (uint32_t j = 0; j < partial; j++)
		pos[j] = (uint32_t)(full * l->block_tokens + j);
	ret = private_page(t, &page);
	if (ret < 0)
		return ret;
	ret = kref_gather_tokens(l, &page, 0, src, m, pos, partial);
	if (ret == 0)
		ret = kvtable_set(t, full, page, 1);
	if (ret < 0) {
		free(page);
		return ret;
	}
	return (int)partial;
}
