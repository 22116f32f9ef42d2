/* daemon/admin.c — admin-socket operations (see admin.h).
 *
 * Replies point into daemon tables where those outlive the reply (a
 * session's page table) and into one malloc'd block in r->heap otherwise;
 * a reply is sized against max_message_bytes before it is filled, so none
 * can exceed the cap. Leases belong to connections (struct conn), which
 * count them: releasing another connection's lease when its pool is
 * dropped keeps that count right.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "confview.h"
#include "frame.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "server.h"
#include "session.h"
#include "stats.h"
#include "tier.h"

int admin_is_admin_op(Kvpalace__V1__Request__OpCase op)
{
	switch (op) {
	case KVPALACE__V1__REQUEST__OP_SHOW_SESSION:
	case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
	case KVPALACE__V1__REQUEST__OP_DROP_POOL:
	case KVPALACE__V1__REQUEST__OP_EVICT:
	case KVPALACE__V1__REQUEST__OP_CONFIG_SHOW:
	case KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD:
		return 1;
	default:
		return 0;
	}
}

/* Bytes of a reply left for repeated fields after the envelope and the
 * fixed fields (generously: 512 bytes). */
static size_t reply_budget(const struct cache *cache)
{
	return cache->cfg->max_message_bytes - FRAME_HEADER_BYTES - 512;
}

struct show_heap {
	Kvpalace__V1__SessionInfo info;
	Kvpalace__V1__Layout layout;
	uint32_t holders[]; /* [n listed slots] */
};

static int show_session(struct cache *cache, const Kvpalace__V1__ShowSessionRequest *in,
			struct reply *r, const char **why)
{
	Kvpalace__V1__ShowSessionResponse *out = &r->u.show_session;
	struct session *s = session_get(cache, in->session_id, 0, 1);
	uint32_t want = in->has_max_page_slots ? in->max_page_slots : ADMIN_SHOW_SLOTS_DEFAULT;
	/* A packed slot and its holder count take at most 5 bytes each. */
	size_t fit = reply_budget(cache) / 10;
	struct show_heap *h;
	uint32_t n;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	n = s->n_pages < want ? s->n_pages : want;
	if (n > fit)
		n = (uint32_t)fit;
	h = calloc(1, sizeof(*h) + (size_t)(n ? n : 1) * sizeof(uint32_t));
	if (!h) {
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = h;
	stats_session_info(s, cache_now_ns(), &h->info);
	stats_layout(&s->pool->layout, &h->layout);
	for (uint32_t i = 0; i < n; i++)
		h->holders[i] = s->pool->pa.refs[s->pages[i]];
	kvpalace__v1__show_session_response__init(out);
	out->info = &h->info;
	out->model_id = s->pool->model_id;
	out->layout = &h->layout;
	out->salted = !XXH128_isEqual(s->root, s->pool->root);
	out->reserved_pages = session_reserved_pages(s);
	if (s->writer) {
		/* Only connections write (dispatch passes its struct conn). */
		out->has_writer_pid = 1;
		out->writer_pid = (uint32_t)((const struct conn *)s->writer)->pid;
	}
	out->has_policy = out->has_budget = out->has_compacted = out->has_dropped_tokens = 1;
	out->policy = (Kvpalace__V1__Policy)s->pol.kind;
	out->budget = s->pol.kind ? policy_budget(&s->pol, s->n_tokens) : 0;
	out->compacted = s->compacted;
	out->dropped_tokens = s->dropped_tokens;
	out->n_page_slots = n;
	out->page_slots = s->pages;
	out->n_page_holders = n;
	out->page_holders = h->holders;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_SHOW_SESSION;
	r->resp.show_session = out;
	return 0;
}

static int drop_session(struct cache *cache, const struct conn *c,
			const Kvpalace__V1__DropSessionRequest *in, struct reply *r,
			const char **why)
{
	Kvpalace__V1__DropSessionResponse *out = &r->u.drop_session;
	struct session *s = session_get(cache, in->session_id, 0, 1);
	struct pagealloc *pa;
	uint32_t free_before;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	if (s->writer && !(in->has_force && in->force)) {
		*why = "a client is writing this session (uncommitted tokens): force rolls them "
		       "back";
		return -EBUSY;
	}
	pa = &s->pool->pa;
	free_before = pa->n_free;
	kvpalace__v1__drop_session_response__init(out);
	out->session_id = s->id;
	out->pool_id = s->pool->id;
	out->n_tokens = s->n_tokens;
	out->committed_tokens = s->n_committed;
	out->was_writing = s->writer != NULL;
	session_close(cache, s);
	out->freed_pages = pa->n_free - free_before;
	log_notice("admin (pid %d uid %u): dropped session %llu of pool %llu: %llu tokens "
		   "(%llu committed)%s, %u pages freed",
		   (int)c->pid, (unsigned)c->uid, (unsigned long long)out->session_id,
		   (unsigned long long)out->pool_id, (unsigned long long)out->n_tokens,
		   (unsigned long long)out->committed_tokens,
		   out->was_writing ? ", its writer's reservation rolled back" : "",
		   out->freed_pages);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_SESSION;
	r->resp.drop_session = out;
	return 0;
}

/* The leases on pool p, in a malloc'd array of *ret_n (NULL when none).
 * Returns 0 or -ENOMEM. */
static int leases_of(struct cache *cache, const struct pool *p, struct lease ***ret, size_t *ret_n)
{
	struct lease **all = NULL;
	size_t n = 0;

	for (size_t i = 0; i < cache->leases.cap; i++) {
		struct lease *l = cache->leases.slots[i].ptr;

		if (!cache->leases.slots[i].id || l->pool != p)
			continue;
		if (!all) {
			all = calloc(cache->leases.n, sizeof(*all));
			if (!all)
				return -ENOMEM;
		}
		all[n++] = l;
	}
	*ret = all;
	*ret_n = n;
	return 0;
}

static int drop_pool(struct cache *cache, const struct conn *c,
		     const Kvpalace__V1__DropPoolRequest *in, struct reply *r, const char **why)
{
	Kvpalace__V1__DropPoolResponse *out = &r->u.drop_pool;
	struct pool *p = pool_get(cache, in->pool_id, 0, 1);
	struct lease **leases;
	size_t n_leases;
	char *model;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	/* Collected first: releasing reorders the lease map. */
	if (leases_of(cache, p, &leases, &n_leases) < 0) {
		*why = "out of memory";
		return -ENOMEM;
	}
	if (tier_pool_busy(p) || !list_empty(&p->waiters) || p->n_jobs || gpu_pool_busy(p)) {
		free(leases);
		*why = "the pool has disk I/O or a checkpoint in flight: try again";
		return -EBUSY;
	}
	if ((p->n_sessions || n_leases) && !(in->has_force && in->force)) {
		free(leases);
		*why = "the pool has sessions or read leases: force closes and releases them";
		return -EBUSY;
	}
	model = strdup(p->model_id); /* the reply outlives the pool */
	if (!model) {
		free(leases);
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = model;
	kvpalace__v1__drop_pool_response__init(out);
	out->pool_id = p->id;
	out->uid = (uint32_t)p->uid;
	out->model_id = model;
	out->sessions_closed = p->n_sessions;
	out->leases_released = (uint32_t)n_leases;
	out->arena_bytes = p->arena_bytes;
	while (!list_empty(&p->sessions))
		session_close(cache, list_entry(p->sessions.next, struct session, pool_link));
	for (size_t i = 0; i < n_leases; i++) {
		/* Every lease is owned by a connection, which counts it. */
		struct conn *owner = (struct conn *)leases[i]->owner;

		owner->n_leases--;
		owner->n_leased_pages -= leases[i]->n_pages;
		lease_release(cache, leases[i]);
	}
	free(leases);
	pool_free(cache, p);
	log_notice("admin (pid %d uid %u): dropped pool %llu (uid %u, model '%s'): %u sessions "
		   "closed, %u leases released, %llu bytes of host tier freed",
		   (int)c->pid, (unsigned)c->uid, (unsigned long long)out->pool_id, out->uid, model,
		   out->sessions_closed, out->leases_released,
		   (unsigned long long)out->arena_bytes);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_POOL;
	r->resp.drop_pool = out;
	return 0;
}

struct evict_entry {
	Kvpalace__V1__EvictedPool ep;
};

/* Evicts from pool p up to max_pages pages and at most *budget bytes;
 * returns the pages evicted and takes their bytes off *budget. */
static uint32_t evict_pool(struct pool *p, uint32_t max_pages, uint64_t *budget)
{
	uint64_t k = *budget / p->page_bytes;
	uint64_t want;
	uint32_t got;

	if (k > max_pages)
		k = max_pages;
	if (k > p->ix.n_entries)
		k = p->ix.n_entries;
	if (!k)
		return 0;
	want = (uint64_t)p->pa.n_free + k;
	if (want > p->pa.n_pages)
		want = p->pa.n_pages;
	/* Pages with a disk copy leave the host tier, the others are
	 * dropped: an admin asking for room wants it now. */
	got = prefix_index_evict(&p->ix, &p->pa, (uint32_t)want, 1);
	*budget -= (uint64_t)got * p->page_bytes;
	return got;
}

static int evict(struct cache *cache, const struct conn *c, const Kvpalace__V1__EvictRequest *in,
		 struct reply *r, const char **why)
{
	Kvpalace__V1__EvictResponse *out = &r->u.evict;
	struct pool *only = NULL;
	uint64_t budget = in->has_max_bytes ? in->max_bytes : UINT64_MAX;
	uint32_t pages_left = ADMIN_EVICT_MAX_PAGES;
	/* An entry takes at most 3 tags, 3 varints and its length: 35 bytes. */
	size_t max_entries = reply_budget(cache) / 40, n = 0;
	struct evict_entry *e;
	Kvpalace__V1__EvictedPool **ptrs;
	struct list *it;
	void *heap;

	int gpu = in->tier == KVPALACE__V1__TIER__TIER_GPU;

	switch (in->tier) {
	case KVPALACE__V1__TIER__TIER_HOST:
		break;
	case KVPALACE__V1__TIER__TIER_GPU:
		if (gpu_available(cache->gpu))
			break;
		*why = "no such tier in this daemon: there is no GPU tier (host tier only)";
		return -EOPNOTSUPP;
	case KVPALACE__V1__TIER__TIER_DISK:
		*why = "no such tier in this daemon: there is no disk tier (host tier only)";
		return -EOPNOTSUPP;
	default:
		*why = "unknown tier";
		return -EINVAL; /* validate_request refused it already */
	}
	if (in->has_pool_id) {
		only = pool_get(cache, in->pool_id, 0, 1);
		if (!only) {
			*why = "no such pool";
			return -ENOENT;
		}
	}
	if (in->has_max_pages && in->max_pages < pages_left)
		pages_left = in->max_pages;
	if (max_entries > cache->pools.n)
		max_entries = cache->pools.n;
	heap = calloc(max_entries ? max_entries : 1, sizeof(*e) + sizeof(*ptrs));
	if (!heap) {
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = heap;
	e = heap;
	ptrs = (Kvpalace__V1__EvictedPool **)(e + (max_entries ? max_entries : 1));
	kvpalace__v1__evict_response__init(out);
	for (it = cache->pool_list.next; it != &cache->pool_list; it = it->next) {
		struct pool *p = list_entry(it, struct pool, link);
		uint32_t got;

		if (only && p != only)
			continue;
		if (!pages_left || n == max_entries) {
			/* Stopped at this request's limits: say whether more
			 * could go in another. */
			if ((gpu ? gpu_evictable(p) : p->ix.n_evictable) &&
			    budget >= p->page_bytes) {
				out->more = 1;
				break;
			}
			continue;
		}
		got = gpu ? gpu_evict(p, pages_left, &budget) : evict_pool(p, pages_left, &budget);
		if (!got)
			continue;
		pages_left -= got;
		kvpalace__v1__evicted_pool__init(&e[n].ep);
		e[n].ep.pool_id = p->id;
		e[n].ep.pages = got;
		e[n].ep.bytes = (uint64_t)got * p->page_bytes;
		out->pages += got;
		out->bytes += e[n].ep.bytes;
		ptrs[n] = &e[n].ep;
		n++;
		/* This pool may still hold pages past the request's limit. */
		if (!pages_left && (gpu ? gpu_evictable(p) : p->ix.n_evictable) &&
		    budget >= p->page_bytes)
			out->more = 1;
	}
	out->n_pools = n;
	out->pools = ptrs;
	if (out->pages)
		log_info("admin (pid %d uid %u): evicted %llu pages (%llu bytes) from the %s "
			 "tier",
			 (int)c->pid, (unsigned)c->uid, (unsigned long long)out->pages,
			 (unsigned long long)out->bytes, gpu ? "GPU" : "host");
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_EVICT;
	r->resp.evict = out;
	return 0;
}

static int do_config_show(struct cache *cache, struct reply *r, const char **why)
{
	Kvpalace__V1__ConfigShowResponse *out = &r->u.config_show;
	const struct config *cfg = cache->cfg;
	size_t budget = reply_budget(cache), len, lines;
	Kvpalace__V1__ConfigEntry *e, **ptrs;
	char *text, *copy, *p;
	void *heap;

	if (confview_text(cfg, &text, &len) < 0) {
		*why = "out of memory";
		return -ENOMEM;
	}
	lines = confview_lines(text);
	/* One block: entries, their pointers and the text they point into. */
	heap = malloc((lines ? lines : 1) * (sizeof(*e) + sizeof(*ptrs)) + len + 1);
	if (!heap) {
		free(text);
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = heap;
	e = heap;
	ptrs = (Kvpalace__V1__ConfigEntry **)(e + (lines ? lines : 1));
	copy = (char *)(ptrs + (lines ? lines : 1));
	memcpy(copy, text, len + 1);
	free(text);

	kvpalace__v1__config_show_response__init(out);
	/* A tag, a length and the bytes: 8 bytes are plenty for the first two. */
	if (cfg->file[0] && strlen(cfg->file) + 8 < budget) {
		out->file = (char *)cfg->file;
		budget -= strlen(cfg->file) + 8;
	}
	if (cfg->preset[0] && strlen(cfg->preset) + 8 < budget) {
		out->preset = (char *)cfg->preset;
		budget -= strlen(cfg->preset) + 8;
	}
	out->truncated = (cfg->file[0] && !out->file) || (cfg->preset[0] && !out->preset);
	for (p = copy; p && *p;) {
		char *nl = strchr(p, '\n');
		struct confview_entry ce;
		size_t sz;

		if (nl)
			*nl = '\0';
		if (confview_split(p, &ce) == 0) {
			Kvpalace__V1__ConfigEntry *x = &e[out->n_entries];

			kvpalace__v1__config_entry__init(x);
			x->key = ce.key;
			x->value = ce.value;
			x->source = ce.source;
			sz = kvpalace__v1__config_entry__get_packed_size(x) + 4;
			if (sz > budget) {
				out->truncated = 1;
				break;
			}
			budget -= sz;
			ptrs[out->n_entries++] = x;
		}
		p = nl ? nl + 1 : NULL;
	}
	out->entries = ptrs;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_CONFIG_SHOW;
	r->resp.config_show = out;
	return 0;
}

struct reload_heap {
	struct server_reload rl;
	char *changed[CONFIG_MAX_KEYS];
	char *restart_needed[CONFIG_MAX_KEYS];
	char err[256];
};

static int do_config_reload(struct conn *c, struct reply *r, const char **why)
{
	Kvpalace__V1__ConfigReloadResponse *out = &r->u.config_reload;
	struct reload_heap *h = calloc(1, sizeof(*h));
	char who[96];
	int ret;

	if (!h) {
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = h;
	snprintf(who, sizeof(who), "admin (pid %d uid %u)", (int)c->pid, (unsigned)c->uid);
	ret = server_reload_config(c->srv, who, &h->rl, h->err, sizeof(h->err));
	if (ret < 0) {
		*why = h->err;
		return ret;
	}
	kvpalace__v1__config_reload_response__init(out);
	for (uint32_t i = 0; i < h->rl.n_changed; i++)
		h->changed[i] = h->rl.changed[i];
	for (uint32_t i = 0; i < h->rl.n_restart_needed; i++)
		h->restart_needed[i] = h->rl.restart_needed[i];
	out->n_changed = h->rl.n_changed;
	out->changed = h->changed;
	out->n_restart_needed = h->rl.n_restart_needed;
	out->restart_needed = h->restart_needed;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_CONFIG_RELOAD;
	r->resp.config_reload = out;
	return 0;
}

int admin_run(struct cache *cache, struct conn *c, const Kvpalace__V1__Request *req,
	      struct reply *r, const char **why)
{
	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_SHOW_SESSION:
		return show_session(cache, req->show_session, r, why);
	case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
		return drop_session(cache, c, req->drop_session, r, why);
	case KVPALACE__V1__REQUEST__OP_DROP_POOL:
		return drop_pool(cache, c, req->drop_pool, r, why);
	case KVPALACE__V1__REQUEST__OP_EVICT:
		return evict(cache, c, req->evict, r, why);
	case KVPALACE__V1__REQUEST__OP_CONFIG_SHOW:
		return do_config_show(cache, r, why);
	case KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD:
		return do_config_reload(c, r, why);
	default:
		*why = "unknown operation";
		return -EPROTO;
	}
}
