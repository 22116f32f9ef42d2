/* daemon/core/cache.c — the registry at the bottom of the core (see
 * cache.h): the id maps of pools, sessions and leases, tenants and their
 * ids and counters, and the descriptor room. It calls nothing of the core:
 * what walks or frees every object (cache_check, cache_fini) is whole.c,
 * at the top. Event-loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "clock.h"

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
	kv_events_init(&c->events);
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

static void latency_add(struct cache_latency *l, uint64_t ns)
{
	l->count++;
	l->sum_ns += ns;
	l->buckets[latency_bucket(ns)]++;
}

void cache_latency_add(struct cache *c, uid_t uid, unsigned int op, uint64_t ns)
{
	if (op >= CACHE_LATENCY_OPS)
		return;
	latency_add(&c->ctr.latency[op], ns);
	latency_add(&cache_tenant_ctr(c, uid)->latency[op], ns);
}

void cache_registry_fini(struct cache *c)
{
	idmap_fini(&c->pools);
	idmap_fini(&c->sessions);
	idmap_fini(&c->leases);
	for (size_t i = 0; i < c->tenants.cap; i++)
		if (c->tenants.slots[i].id)
			free(c->tenants.slots[i].ptr);
	idmap_fini(&c->tenants);
}
