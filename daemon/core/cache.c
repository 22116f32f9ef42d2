/* daemon/core/cache.c — the metadata root: id maps, counters, invariants. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "ckptop.h"
#include "clock.h"
#include "compact.h"
#include "lease.h"
#include "pool.h"
#include "session.h"
#include "tier.h"
#include "tokvec.h"

void cache_init(struct cache *c, const struct config *cfg)
{
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	list_init(&c->pool_list);
	list_init(&c->unowned);
	c->ckpt_dir_fd = -1;
	c->start_ns = clock_now_ns();
	c->next_tag = 1; /* the sink has tag 0 */
	c->disk_avail_bytes = UINT64_MAX;
}

/* A tenant's ids: its tag above bit 40, its own counter below; a tenant
 * that used up 2^40 ids takes a new tag. Ids stay below 2^53, exact in
 * JSON's doubles, for the first 8,191 tags of a run, and unique after. */
#define ID_COUNTER_BITS 40
#define ID_COUNTER_MAX	((1ull << ID_COUNTER_BITS) - 1)

static struct cache_tenant *tenant_get(struct cache *c, uid_t uid)
{
	struct cache_tenant *t = idmap_get(&c->tenants, (uint64_t)uid + 1);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t || idmap_put(&c->tenants, (uint64_t)uid + 1, t) < 0) {
		/* Shared by every tenant we had no memory for: its ids stay
		 * unique, its counters mixed. */
		free(t);
		return &c->sink;
	}
	t->uid = uid;
	t->tag = c->next_tag++;
	return t;
}

uint64_t cache_new_id(struct cache *c, uid_t uid)
{
	struct cache_tenant *t = tenant_get(c, uid);

	if (t->next_id >= ID_COUNTER_MAX) {
		t->tag = c->next_tag++;
		t->next_id = 0;
	}
	return t->tag << ID_COUNTER_BITS | ++t->next_id;
}

int cache_fd_room(const struct cache *c, uint64_t n)
{
	return !c->fd_room ||
	       c->ctr.connections + CACHE_POOL_FDS * (uint64_t)c->pools.n + n <= c->fd_room;
}

int cache_fd_room_conn(const struct cache *c, uint64_t n_client)
{
	return !c->fd_room || (cache_fd_room(c, 1) && n_client + 1 <= c->fd_room / 4 * 3);
}

struct cache_tenant *cache_tenant(struct cache *c, uid_t uid)
{
	return tenant_get(c, uid);
}

struct cache_counters *cache_tenant_ctr(struct cache *c, uid_t uid)
{
	return &tenant_get(c, uid)->ctr;
}

const struct cache_counters *cache_tenant_find(const struct cache *c, uid_t uid)
{
	const struct cache_tenant *t = idmap_get(&c->tenants, (uint64_t)uid + 1);

	return t ? &t->ctr : NULL;
}

void cache_fini(struct cache *c)
{
	/* Leases first: they pin pages of pools freed below. Connections
	 * normally released theirs already. */
	while (c->leases.n) {
		size_t i = 0;

		while (!c->leases.slots[i].id)
			i++;
		lease_release(c, c->leases.slots[i].ptr);
	}
	while (!list_empty(&c->pool_list)) {
		struct pool *p = list_entry(c->pool_list.next, struct pool, link);

		while (!list_empty(&p->sessions))
			session_close(c, list_entry(p->sessions.next, struct session, pool_link));
		pool_free(c, p);
	}
	idmap_fini(&c->pools);
	idmap_fini(&c->sessions);
	idmap_fini(&c->leases);
	for (size_t i = 0; i < c->tenants.cap; i++)
		if (c->tenants.slots[i].id)
			free(c->tenants.slots[i].ptr);
	idmap_fini(&c->tenants);
}

static int check_pool(const struct cache *c, const struct pool *p)
{
	uint32_t *refs = calloc(p->pa.n_pages ? p->pa.n_pages : 1, sizeof(uint32_t));
	uint32_t *pins = calloc(p->pa.n_pages ? p->pa.n_pages : 1, sizeof(uint32_t));
	const struct list *it;
	uint32_t persistent = 0, unowned = 0;
	int ret = -EUCLEAN;

	if (!refs || !pins) {
		ret = -ENOMEM;
		goto out;
	}
	ret = pagealloc_check(&p->pa);
	if (ret < 0) {
		ret = ret == -ENOMEM ? ret : -EUCLEAN;
		goto out;
	}
	ret = -EUCLEAN;
	for (it = p->sessions.next; it != &p->sessions; it = it->next) {
		const struct session *s = list_entry(it, struct session, pool_link);
		uint32_t bt = p->layout.block_tokens;

		if (s->n_committed > s->n_tokens || s->n_pages != (s->n_tokens + bt - 1) / bt ||
		    (!s->writer && s->n_committed != s->n_tokens))
			goto out;
		persistent += s->persistent;
		unowned += s->persistent && !s->owner;
		for (uint32_t i = 0; i < s->n_pages; i++) {
			if (s->pages[i] >= p->pa.n_pages)
				goto out;
			refs[s->pages[i]]++;
		}
	}
	if (persistent != p->n_persistent || unowned != p->n_unowned)
		goto out;
	for (size_t i = 0; i < c->leases.cap; i++) {
		const struct lease *l = c->leases.slots[i].ptr;

		if (!c->leases.slots[i].id || l->pool != p)
			continue;
		for (uint32_t j = 0; j < l->n_pages; j++) {
			if (l->pages[j] >= p->pa.n_pages)
				goto out;
			refs[l->pages[j]]++;
			pins[l->pages[j]]++;
		}
	}
	ret = prefix_index_check(&p->ix, &p->pa, refs);
	if (ret < 0) {
		ret = ret == -ENOMEM ? ret : -EUCLEAN;
		goto out;
	}
	ret = -EUCLEAN;
	if (tier_check(p, refs) < 0 || ckptop_check(p, refs) < 0 || compact_check(p, refs) < 0 ||
	    gpu_check(p, refs) < 0)
		goto out;
	for (uint32_t i = 0; i < p->pa.n_pages; i++)
		if (refs[i] != p->pa.refs[i] || pins[i] != p->pa.pins[i])
			goto out;
	ret = 0;
out:
	free(refs);
	free(pins);
	return ret;
}

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t) * (const void *const *)a,
		  y = (uintptr_t) * (const void *const *)b;

	return (x > y) - (x < y);
}

/* What one tenant's sessions hold: token chunks and page tables. */
struct charge {
	const uint64_t *account;
	uint64_t slots;
};

static struct charge *charge_of(struct charge *ch, size_t *n, const uint64_t *account)
{
	for (size_t i = 0; i < *n; i++)
		if (ch[i].account == account)
			return &ch[i];
	ch[*n] = (struct charge){account, 0};
	return &ch[(*n)++];
}

/* The sessions' token chunks (tokvec.h): each held as often as its count
 * says, covering its session's tokens; and each tenant's max-tenant-tokens
 * count equal to what its sessions hold, shared chunks once. */
static int check_token_slots(const struct cache *c)
{
	size_t n = 0, k = 0, n_charges = 0, max_charges = c->tenants.n + c->sessions.n + 1;
	const struct tokvec_chunk **all;
	struct charge *ch;
	int ret = -EUCLEAN;

	for (size_t i = 0; i < c->sessions.cap; i++)
		if (c->sessions.slots[i].id)
			n += ((const struct session *)c->sessions.slots[i].ptr)->tok.n_chunks;
	all = malloc((n ? n : 1) * sizeof(*all));
	ch = malloc(max_charges * sizeof(*ch));
	if (!all || !ch) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < c->sessions.cap; i++) {
		const struct session *s = c->sessions.slots[i].ptr;
		const struct tokvec *v;

		if (!c->sessions.slots[i].id)
			continue;
		v = &s->tok;
		for (uint64_t at = 0; at < s->n_tokens; at += v->per_chunk) {
			uint64_t need =
				s->n_tokens - at < v->per_chunk ? s->n_tokens - at : v->per_chunk;

			if (at / v->per_chunk >= v->n_chunks ||
			    v->chunks[at / v->per_chunk]->cap < need)
				goto out;
		}
		for (uint32_t j = 0; j < v->n_chunks; j++)
			all[k++] = v->chunks[j];
		charge_of(ch, &n_charges, v->account)->slots += s->cap_pages;
	}
	qsort(all, n, sizeof(*all), cmp_ptr);
	for (size_t i = 0; i < n;) {
		size_t j = i;

		while (j < n && all[j] == all[i])
			j++;
		if (all[i]->refs != j - i)
			goto out;
		charge_of(ch, &n_charges, all[i]->account)->slots += all[i]->cap;
		i = j;
	}
	/* Every account is a tenant's (or the sink's) and matches. */
	for (size_t i = 0; i < n_charges; i++) {
		int known = ch[i].account == &c->sink.meta_tokens;

		for (size_t t = 0; !known && t < c->tenants.cap; t++)
			known = c->tenants.slots[t].id &&
				ch[i].account ==
					&((const struct cache_tenant *)c->tenants.slots[t].ptr)
						 ->meta_tokens;
		if (!known || *ch[i].account != ch[i].slots)
			goto out;
	}
	for (size_t t = 0; t < c->tenants.cap; t++) {
		const struct cache_tenant *tn = c->tenants.slots[t].ptr;

		if (c->tenants.slots[t].id && tn->meta_tokens &&
		    charge_of(ch, &n_charges, &tn->meta_tokens)->slots != tn->meta_tokens)
			goto out;
	}
	ret = 0;
out:
	free(all);
	free(ch);
	return ret;
}

int cache_check(const struct cache *c)
{
	const struct list *it;
	int ret = check_token_slots(c);

	if (ret < 0)
		return ret;
	for (it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		ret = check_pool(c, list_entry(it, struct pool, link));
		if (ret < 0)
			return ret;
	}
	return 0;
}
