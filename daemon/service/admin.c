/* daemon/service/admin.c — admin-socket operations (see admin.h).
 *
 * Replies point into daemon tables where those outlive the reply (a
 * session's page table) and into one malloc'd block in r->heap otherwise;
 * a reply is sized against max_message_bytes before it is filled, so none
 * can exceed the cap. Leases belong to connections (struct peer), which
 * count them: releasing another connection's lease when its pool is
 * dropped keeps that count right.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin.h"
#include "clock.h"
#include "confview.h"
#include "frame.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "purge.h"
#include "session.h"
#include "spill.h"
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
	case KVPALACE__V1__REQUEST__OP_PURGE:
		return 1;
	default:
		return 0;
	}
}

/* Bytes of a reply left for repeated fields after the envelope and the
 * fixed fields (generously: 512 bytes). */
static size_t reply_budget(const struct cache *cache)
{
	return reply_room(cache->cfg->max_message_bytes, 512);
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
	stats_session_info(s, clock_now_ns(), &h->info);
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
		/* Only connections write (dispatch passes its struct peer). */
		out->has_writer_pid = 1;
		out->writer_pid = (uint32_t)((const struct peer *)s->writer)->pid;
	}
	out->has_policy = out->has_budget = out->has_compacted = out->has_dropped_tokens = 1;
	out->policy = (Kvpalace__V1__Policy)s->pol->kind;
	out->budget = s->pol->kind ? policy_budget(s->pol, s->n_tokens) : 0;
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

/* A forget that must wait for pool I/O: park the request (nothing was
 * changed) or, when it waited often enough, refuse it. */
static int busy(struct tier_park *pk, const char **why)
{
	if (!pk->no_park && pk->park_on)
		return -EAGAIN;
	pk->park_on = NULL;
	*why = "the pool's disk I/O is still in flight: try again";
	return -EBUSY;
}

static int drop_session(struct cache *cache, struct peer *c, uint64_t req_id,
			const Kvpalace__V1__DropSessionRequest *in, struct reply *r,
			struct tier_park *pk, const char **why)
{
	Kvpalace__V1__DropSessionResponse *out = &r->u.drop_session;
	struct session *s = session_get(cache, in->session_id, 0, 1);
	struct purge_counts n = {0};
	struct pagealloc *pa;
	uint32_t free_before, kept;
	struct forget *f;
	int ret;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	if (s->writer && !(in->has_force && in->force)) {
		*why = "a client is writing this session (uncommitted tokens): force rolls them "
		       "back";
		return -EBUSY;
	}
	/* What was dropped is never matched again: the index pages only this
	 * session holds go with it, in every tier (checked first, so a drop
	 * that must wait for disk I/O changes nothing). */
	ret = purge_session(cache, s, NULL, 1, pk, &kept, &n);
	if (ret == -EBUSY)
		return busy(pk, why);
	f = ret < 0 ? NULL : forget_new();
	if (!f) {
		*why = "out of memory";
		return -ENOMEM;
	}
	pa = &s->pool->pa;
	free_before = pa->n_free;
	kvpalace__v1__drop_session_response__init(out);
	out->session_id = s->id;
	out->pool_id = s->pool->id;
	out->n_tokens = s->n_tokens;
	out->committed_tokens = s->n_committed;
	out->was_writing = s->writer != NULL;
	n = (struct purge_counts){0};
	ret = purge_session(cache, s, f, 0, pk, &kept, &n);
	if (ret == -ENOMEM)
		log_ctx_err(LOG_SESSION(s->pool->id, s->id, s->pool->uid),
			    "admin: out of memory forgetting the pages of session %llu; they stay "
			    "cached",
			    (unsigned long long)s->id);
	session_close(cache, s);
	out->freed_pages = pa->n_free - free_before;
	out->has_forgotten_pages = out->has_kept_pages = 1;
	out->forgotten_pages = (uint32_t)n.pages;
	out->kept_pages = kept;
	cache->ctr.purged_pages += n.pages;
	log_ctx_notice(
		LOG_CTX(.pool_id = out->pool_id, .session_id = out->session_id, .uid = c->uid,
			.has_uid = 1, .pid = c->pid),
		"admin (pid %d uid %u): dropped session %llu of pool %llu: %llu tokens "
		"(%llu committed)%s, %u page%s freed, %u index page%s forgotten (%llu on disk), "
		"%u shared one%s kept",
		(int)c->pid, (unsigned)c->uid, (unsigned long long)out->session_id,
		(unsigned long long)out->pool_id, (unsigned long long)out->n_tokens,
		(unsigned long long)out->committed_tokens,
		out->was_writing ? ", its writer's reservation rolled back" : "", out->freed_pages,
		log_s(out->freed_pages), out->forgotten_pages, log_s(out->forgotten_pages),
		(unsigned long long)n.disk_pages, kept, log_s(kept));
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_SESSION;
	r->resp.drop_session = out;
	ret = forget_finish(f, cache, c, req_id, r);
	if (ret == -EIO)
		*why = "dropped, but invalidating its pages' disk headers failed: a restart may "
		       "find them again";
	return ret;
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

struct drop_heap {
	char model[128];
	char why[4400];
};

static int drop_pool(struct cache *cache, struct peer *c, uint64_t req_id,
		     const Kvpalace__V1__DropPoolRequest *in, struct reply *r, const char **why)
{
	Kvpalace__V1__DropPoolResponse *out = &r->u.drop_pool;
	struct pool *p = pool_get(cache, in->pool_id, 0, 1);
	struct drop_heap *h;
	struct lease **leases;
	struct forget *f;
	size_t n_leases;
	char *model;
	int ret;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	/* Collected first: releasing reorders the lease map. */
	if (leases_of(cache, p, &leases, &n_leases) < 0) {
		*why = "out of memory";
		return -ENOMEM;
	}
	if (tier_pool_busy(p) || !list_empty(&p->waiters) || p->n_jobs || p->n_compact_jobs ||
	    p->n_forgets || gpu_pool_busy(p)) {
		free(leases);
		*why = "the pool has disk I/O or a checkpoint in flight: try again";
		return -EBUSY;
	}
	if ((p->n_sessions || n_leases) && !(in->has_force && in->force)) {
		free(leases);
		*why = "the pool has sessions or read leases: force closes and releases them";
		return -EBUSY;
	}
	h = calloc(1, sizeof(*h)); /* the reply outlives the pool */
	f = h ? forget_new() : NULL;
	if (!f) {
		free(leases);
		free(h);
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = h;
	model = h->model;
	snprintf(model, sizeof(h->model), "%s", p->model_id);
	/* Its pages on disk go with it: a pool of the same identity would
	 * find the file again, in this run or after a restart. Removed first,
	 * so a drop that cannot remove it drops nothing. */
	if (p->spill && unlink(p->spill->path) < 0 && errno != ENOENT) {
		ret = -errno;
		snprintf(h->why, sizeof(h->why), "cannot remove the pool's spill file %s: %s",
			 p->spill->path, strerror(errno));
		forget_finish(f, cache, c, req_id, r);
		free(leases);
		*why = h->why;
		return ret;
	}
	kvpalace__v1__drop_pool_response__init(out);
	out->pool_id = p->id;
	out->uid = (uint32_t)p->uid;
	out->model_id = model;
	out->sessions_closed = p->n_sessions;
	out->leases_released = (uint32_t)n_leases;
	out->arena_bytes = p->arena_bytes;
	out->has_disk_pages = out->has_spill_removed = 1;
	out->disk_pages = p->ix.n_disk;
	out->spill_removed = p->spill != NULL;
	cache->ctr.purged_pages += p->ix.n_entries;
	while (!list_empty(&p->sessions))
		session_close(cache, list_entry(p->sessions.next, struct session, pool_link));
	for (size_t i = 0; i < n_leases; i++) {
		/* Every lease is owned by a connection, which counts it. */
		struct peer *owner = (struct peer *)leases[i]->owner;

		owner->n_leases--;
		owner->n_leased_pages -= leases[i]->n_pages;
		lease_release(cache, leases[i]);
	}
	free(leases);
	pool_free(cache, p);
	log_ctx_notice(
		LOG_CTX(.pool_id = out->pool_id, .uid = c->uid, .has_uid = 1, .pid = c->pid),
		"admin (pid %d uid %u): dropped pool %llu (uid %u, model '%s'): %u session%s "
		"closed, %u lease%s released, %llu bytes of host tier freed%s",
		(int)c->pid, (unsigned)c->uid, (unsigned long long)out->pool_id, out->uid, model,
		out->sessions_closed, log_s(out->sessions_closed), out->leases_released,
		log_s(out->leases_released), (unsigned long long)out->arena_bytes,
		out->spill_removed ? ", spill file removed" : "");
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_POOL;
	r->resp.drop_pool = out;
	/* The removal is durable before the reply says so. */
	if (out->spill_removed && forget_dir(f, cache->cfg->cache_dir) < 0)
		log_err("cannot sync %s: path too long", cache->cfg->cache_dir);
	ret = forget_finish(f, cache, c, req_id, r);
	if (ret == -EIO)
		*why = "dropped, but syncing the removal of its spill file failed: a crash may "
		       "bring it back";
	return ret;
}

struct evict_entry {
	Kvpalace__V1__EvictedPool ep;
};

/* What one pool gave an Evict request. */
struct evict_got {
	uint32_t pages;	  /* left the tier, or on their way (started) */
	uint32_t demoted; /* of pages: still cached below */
	uint32_t dropped; /* of pages: gone from the cache */
	uint32_t started; /* of pages and demoted: disk writes started */
};

/* Pages of p an Evict request may take at most. */
static uint32_t evict_quota(const struct pool *p, uint32_t max_pages, uint64_t budget,
			    uint32_t have)
{
	uint64_t k = budget / p->page_bytes;

	if (k > max_pages)
		k = max_pages;
	if (k > have)
		k = have;
	return (uint32_t)k;
}

/* The host tier of p: up to max_pages pages and *budget bytes. Pages
 * with a disk copy leave at once; without discard, the others are written
 * to disk by the disk tier's own spill path and leave once written (the
 * caller waits for them); with discard, or without a disk tier, they are
 * dropped, leaves first. */
static struct evict_got evict_host(struct cache *cache, struct pool *p, int discard,
				   uint32_t max_pages, uint64_t *budget)
{
	uint32_t k = evict_quota(p, max_pages, *budget, p->ix.n_entries), want;
	struct evict_got g = {0};

	if (!k)
		return g;
	want = p->pa.n_free + k > p->pa.n_pages ? p->pa.n_pages : p->pa.n_free + k;
	if (discard || !p->spill) {
		uint64_t before = p->ix.evictions;

		g.pages = prefix_index_evict(&p->ix, &p->pa, want, 1);
		g.dropped = (uint32_t)(p->ix.evictions - before);
		g.demoted = g.pages - g.dropped;
	} else {
		g.pages = g.demoted = prefix_index_evict(&p->ix, &p->pa, want, 0);
		if (g.pages < k) {
			uint32_t before = p->writes_inflight;

			tier_spill(cache, p, p->pa.n_free + before + (k - g.pages));
			g.started = p->writes_inflight - before;
			g.pages += g.started;
			g.demoted += g.started;
		}
	}
	/* Parents written along may take it past the budget. */
	*budget -= (uint64_t)g.pages * p->page_bytes < *budget ? (uint64_t)g.pages * p->page_bytes
							       : *budget;
	return g;
}

/* The disk tier of p: up to max_pages disk copies and *budget bytes, into
 * f (their headers are invalidated before the reply). Disk-only leaves
 * go first, least recently used first (their entries with them), then
 * the disk copies of pages that stay in the host tier, in slot order. */
static struct evict_got evict_disk(struct pool *p, uint32_t max_pages, uint64_t *budget,
				   struct forget *f)
{
	uint32_t k = evict_quota(p, max_pages, *budget, p->ix.n_disk), extent;
	struct evict_got g = {0};
	struct pindex_entry *e;

	while (g.pages < k && !list_empty(&p->ix.disk_lru)) {
		e = list_entry(p->ix.disk_lru.next, struct pindex_entry, lru_link);
		prefix_index_drop(&p->ix, &p->pa, e, &extent);
		if (extent == PINDEX_NONE)
			continue;
		(void)forget_extent(f, p, extent);
		g.pages++;
		g.dropped++;
	}
	/* By slot, not by the host list: that lists only leaves (a parent
	 * whose child keeps a host copy is on no list). */
	for (uint32_t slot = 0; slot < p->ix.n_pages && g.pages < k; slot++) {
		e = p->ix.by_slot[slot];
		if (!e || e->extent == PINDEX_NONE || e->io != PINDEX_IO_NONE)
			continue;
		/* It keeps its host copy and its place on the host list. */
		prefix_index_detach_disk(&p->ix, &p->pa, e, &extent);
		(void)forget_extent(f, p, extent);
		g.pages++;
	}
	*budget -= (uint64_t)g.pages * p->page_bytes;
	return g;
}

/* ---- one log line per eviction ------------------------------------------ */

/* kvpalacectl evicts 400 MiB as a few hundred requests of 1024 pages (so
 * the loop never stalls): a line for each would bury the log. The peer's
 * evict_run sums a run of them; the line comes when the reply of the last
 * tells the client to stop, or when something else ends the run. */

static uint64_t evict_asked(const Kvpalace__V1__EvictRequest *in)
{
	return in->has_max_bytes ? in->max_bytes : UINT64_MAX;
}

/* What the client asks next when it goes on after the run so far:
 * kvpalacectl asks for what is left of its --bytes. */
static uint64_t evict_run_left(const struct evict_run *run)
{
	if (run->asked_bytes == UINT64_MAX)
		return UINT64_MAX;
	return run->asked_bytes - (run->bytes < run->asked_bytes ? run->bytes : run->asked_bytes);
}

/* True when request in goes on with run: the same tier, pool and
 * discard, asking for what the run left. */
static int evict_run_goes_on(const struct evict_run *run, const Kvpalace__V1__EvictRequest *in)
{
	return run->active && run->tier == (uint32_t)in->tier &&
	       run->pool_id == (in->has_pool_id ? in->pool_id : 0) &&
	       run->discard == (in->has_discard && in->discard) &&
	       evict_run_left(run) == evict_asked(in);
}

/* True when the client stops after this reply, as kvpalacectl does:
 * nothing more to evict, nothing evicted, or all it asked for. */
static int evict_run_over(uint64_t asked, const Kvpalace__V1__EvictResponse *out)
{
	return !out->more || !out->pages || out->bytes >= asked;
}

static const char *size_text(uint64_t bytes, char buf[32])
{
	static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u && v != (double)(uint64_t)v)
		snprintf(buf, 32, "%.1f %s", v, unit[u]);
	else
		snprintf(buf, 32, "%.0f %s", v, unit[u]);
	return buf;
}

static const char *tier_text(uint32_t tier)
{
	switch (tier) {
	case KVPALACE__V1__TIER__TIER_GPU:
		return "GPU";
	case KVPALACE__V1__TIER__TIER_DISK:
		return "disk";
	default:
		return "host";
	}
}

/* Logs c's run, with how it ended (NULL: the client had all it asked
 * for, or all there was), and forgets it. */
static void evict_run_end(struct peer *c, const char *end)
{
	struct evict_run *run = &c->evict_run;
	char got[32], size[32], asked[48] = "", of_pool[40] = "", split[80] = "";
	double ms = (double)(clock_now_ns() - run->start_ns) / 1e6;

	if (!run->active)
		return;
	if (run->pool_id)
		snprintf(of_pool, sizeof(of_pool), " of pool %llu",
			 (unsigned long long)run->pool_id);
	if (run->asked_bytes != UINT64_MAX)
		snprintf(asked, sizeof(asked), ", %s asked", size_text(run->asked_bytes, size));
	if (run->tier == KVPALACE__V1__TIER__TIER_HOST)
		snprintf(split, sizeof(split), ": %llu demoted to the disk tier, %llu dropped",
			 (unsigned long long)run->demoted, (unsigned long long)run->dropped);
	else if (run->tier == KVPALACE__V1__TIER__TIER_DISK)
		snprintf(split, sizeof(split), ": %llu kept in the host tier, %llu dropped",
			 (unsigned long long)(run->pages - run->dropped),
			 (unsigned long long)run->dropped);
	log_at(run->pages ? LOG_NOTICE : LOG_INFO,
	       LOG_CTX(.pool_id = run->pool_id, .uid = c->uid, .has_uid = 1, .pid = c->pid),
	       "admin (pid %d uid %u): evict from the %s tier%s%s%s: %llu page%s (%s) from %u "
	       "pool%s in %u request%s, %.1f ms%s%s%s",
	       (int)c->pid, (unsigned)c->uid, tier_text(run->tier), of_pool,
	       run->discard ? " (discard)" : "", asked, (unsigned long long)run->pages,
	       log_s(run->pages), size_text(run->bytes, got), run->n_pools, log_s(run->n_pools),
	       run->requests, log_s(run->requests), ms, split, end ? "; stopped: " : "",
	       end ? end : "");
	free(run->pool_ids);
	*run = (struct evict_run){0};
}

void admin_peer_gone(struct peer *c)
{
	evict_run_end(c, "the client went before the end");
}

/* Starts c's run with request in unless in goes on with the one under
 * way (which then ends: another eviction begins). */
static void evict_run_begin(struct peer *c, const Kvpalace__V1__EvictRequest *in)
{
	struct evict_run *run = &c->evict_run;

	if (evict_run_goes_on(run, in))
		return;
	evict_run_end(c, NULL);
	*run = (struct evict_run){
		.active = 1,
		.tier = (uint32_t)in->tier,
		.discard = in->has_discard && in->discard,
		.pool_id = in->has_pool_id ? in->pool_id : 0,
		.asked_bytes = evict_asked(in),
		.start_ns = clock_now_ns(),
	};
}

/* Adds one request's reply to c's run. */
static void evict_run_add(struct peer *c, const Kvpalace__V1__EvictResponse *out)
{
	struct evict_run *run = &c->evict_run;

	run->requests++;
	run->pages += out->pages;
	run->bytes += out->bytes;
	run->demoted += out->demoted;
	run->dropped += out->dropped;
	for (size_t i = 0; i < out->n_pools; i++) {
		uint64_t id = out->pools[i]->pool_id;
		uint32_t k = 0;

		while (k < run->n_pools && run->pool_ids[k] != id)
			k++;
		if (k < run->n_pools)
			continue;
		if (run->n_pools == run->cap_pools) {
			uint32_t cap = run->cap_pools ? 2 * run->cap_pools : 16;
			uint64_t *v = realloc(run->pool_ids, cap * sizeof(*v));

			if (!v)
				continue; /* the line counts fewer pools */
			run->pool_ids = v;
			run->cap_pools = cap;
		}
		run->pool_ids[run->n_pools++] = id;
	}
}

/* An Evict that waits for the disk writes it started in one pool. */
struct evict_wait {
	struct tier_waiter w;
	struct ticket t;
	struct pool *p;
	uint64_t spilled_before; /* p->tier.spilled when the writes started */
	uint32_t started;
	uint64_t asked;		       /* the request's max_bytes (UINT64_MAX: none) */
	Kvpalace__V1__EvictedPool *ep; /* p's entry in the reply */
	struct reply r;
};

static void evict_woken(struct tier_waiter *w)
{
	struct evict_wait *ew = (struct evict_wait *)w;
	Kvpalace__V1__EvictResponse *out = &ew->r.u.evict;
	struct pool *p = ew->p;
	uint64_t written, lost;

	if (p->writes_inflight) {
		tier_wait(p, &ew->w); /* woken by reads: not yet */
		return;
	}
	/* Writes that failed left their pages in the host tier. (Counted by
	 * what the pool spilled meanwhile: a watermark's writes of the same
	 * moment could hide a failure of ours, never invent one.) */
	written = p->tier.spilled - ew->spilled_before;
	if (written > ew->started)
		written = ew->started;
	lost = ew->started - written;
	out->pages -= lost;
	out->bytes -= lost * p->page_bytes;
	out->demoted -= lost;
	ew->ep->pages -= lost;
	ew->ep->bytes -= lost * p->page_bytes;
	if (ew->t.peer) {
		struct evict_run *run = &ew->t.peer->evict_run;

		/* Counted when the writes started: now the run knows. */
		run->pages -= lost;
		run->bytes -= lost * p->page_bytes;
		run->demoted -= lost;
		if (evict_run_over(ew->asked, out))
			evict_run_end(ew->t.peer, NULL);
	}
	ticket_deliver(&ew->t, &ew->r);
	reply_fini(&ew->r);
	free(ew);
}

/* One Evict request, added to c's run; *over when the client stops after
 * its reply (not known yet when it returns -EINPROGRESS waiting for
 * writes: evict_woken decides then). */
static int evict_one(struct cache *cache, struct peer *c, uint64_t req_id,
		     const Kvpalace__V1__EvictRequest *in, struct reply *r, struct tier_park *pk,
		     const char **why, int *over)
{
	Kvpalace__V1__EvictResponse *out = &r->u.evict;
	struct pool *only = NULL, *wait_on = NULL;
	uint64_t budget = in->has_max_bytes ? in->max_bytes : UINT64_MAX, spilled_before = 0;
	uint32_t pages_left = ADMIN_EVICT_MAX_PAGES, started = 0;
	/* An entry takes at most 3 tags, 3 varints and its length: 35 bytes. */
	size_t max_entries = reply_budget(cache) / 40, n = 0;
	int discard = in->has_discard && in->discard;
	int has_disk = cache->cfg->disk_pool_bytes && cache->aio;
	struct evict_entry *e;
	Kvpalace__V1__EvictedPool **ptrs;
	struct forget *f = NULL;
	const char *tier_name;
	struct list *it;
	void *heap;
	int ret;

	switch (in->tier) {
	case KVPALACE__V1__TIER__TIER_HOST:
		tier_name = "host";
		break;
	case KVPALACE__V1__TIER__TIER_GPU:
		tier_name = "GPU";
		if (gpu_available(cache->gpu))
			break;
		*why = has_disk ? "no such tier in this daemon: there is no GPU tier (host and "
				  "disk tiers only)"
				: "no such tier in this daemon: there is no GPU tier (host tier "
				  "only)";
		return -EOPNOTSUPP;
	case KVPALACE__V1__TIER__TIER_DISK:
		tier_name = "disk";
		if (has_disk)
			break;
		*why = cache->cfg->disk_pool_bytes
			       ? "no such tier in this daemon: there is no disk tier (no disk I/O "
				 "backend could start)"
			       : "no such tier in this daemon: there is no disk tier "
				 "(disk-pool-size is 0)";
		return -EOPNOTSUPP;
	default:
		*why = "unknown tier";
		return -EINVAL; /* validate_request refused it already */
	}
	if (discard && in->tier != KVPALACE__V1__TIER__TIER_HOST) {
		*why = "discard goes with the host tier only";
		return -EINVAL;
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
	if (in->tier == KVPALACE__V1__TIER__TIER_DISK && heap)
		f = forget_new();
	if (!heap || (in->tier == KVPALACE__V1__TIER__TIER_DISK && !f)) {
		free(heap);
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = heap;
	e = heap;
	ptrs = (Kvpalace__V1__EvictedPool **)(e + (max_entries ? max_entries : 1));
	kvpalace__v1__evict_response__init(out);
	out->has_demoted = out->has_dropped = in->tier != KVPALACE__V1__TIER__TIER_GPU;
	for (it = cache->pool_list.next; it != &cache->pool_list; it = it->next) {
		struct pool *p = list_entry(it, struct pool, link);
		uint32_t left;
		struct evict_got g = {0};

		if (only && p != only)
			continue;
		switch (in->tier) {
		case KVPALACE__V1__TIER__TIER_GPU:
			left = gpu_evictable(p);
			break;
		case KVPALACE__V1__TIER__TIER_DISK:
			left = p->ix.n_disk;
			break;
		default:
			/* Every host copy only the index holds: the host list
			 * shows only those that may leave first. */
			left = p->ix.n_idle;
		}
		if (!pages_left || n == max_entries || wait_on) {
			/* Stopped at this request's limits: say whether more
			 * could go in another. */
			if (left && budget >= p->page_bytes) {
				out->more = 1;
				break;
			}
			continue;
		}
		if (in->tier == KVPALACE__V1__TIER__TIER_DISK && p->io_inflight && left) {
			/* A header write in flight could land after the
			 * invalidation: wait for the pool's I/O (or let the
			 * next request do it when this one changed things). */
			if (n == 0 && !pk->no_park) {
				forget_finish(f, cache, c, req_id, r);
				pk->park_on = p;
				return -EAGAIN;
			}
			out->more = 1;
			break;
		}
		switch (in->tier) {
		case KVPALACE__V1__TIER__TIER_GPU:
			g.pages = gpu_evict(p, pages_left, &budget);
			break;
		case KVPALACE__V1__TIER__TIER_DISK:
			g = evict_disk(p, pages_left, &budget, f);
			break;
		default: {
			uint64_t spilled = p->tier.spilled;

			g = evict_host(cache, p, discard, pages_left, &budget);
			if (g.pages)
				prewarm_hold(p); /* what left is not read back by itself */
			if (g.started) {
				/* The reply waits for these writes: no other
				 * pool's in this request. */
				wait_on = p;
				started = g.started;
				spilled_before = spilled;
			}
		}
		}
		if (!g.pages)
			continue;
		pages_left -= g.pages < pages_left ? g.pages : pages_left;
		kvpalace__v1__evicted_pool__init(&e[n].ep);
		e[n].ep.pool_id = p->id;
		e[n].ep.pages = g.pages;
		e[n].ep.bytes = (uint64_t)g.pages * p->page_bytes;
		out->pages += g.pages;
		out->bytes += e[n].ep.bytes;
		out->demoted += g.demoted;
		out->dropped += g.dropped;
		ptrs[n] = &e[n].ep;
		n++;
		/* This pool may still hold pages past the request's limit. */
		if (!pages_left && left > g.pages && budget >= p->page_bytes)
			out->more = 1;
	}
	out->n_pools = n;
	out->pools = ptrs;
	evict_run_add(c, out);
	*over = !wait_on && evict_run_over(evict_asked(in), out);
	if (out->pages)
		log_debug("admin (pid %d uid %u): %s %llu pages (%llu bytes) from the %s tier "
			  "(%llu demoted, %llu dropped%s)",
			  (int)c->pid, (unsigned)c->uid, started ? "evicting" : "evicted",
			  (unsigned long long)out->pages, (unsigned long long)out->bytes, tier_name,
			  (unsigned long long)out->demoted, (unsigned long long)out->dropped,
			  started ? ", waiting for disk writes" : "");
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_EVICT;
	r->resp.evict = out;
	if (f) {
		ret = forget_finish(f, cache, c, req_id, r);
		if (ret == -EIO)
			*why = "evicted, but invalidating the disk headers failed: a restart may "
			       "find those pages again";
		return ret;
	}
	if (wait_on) {
		struct evict_wait *ew = calloc(1, sizeof(*ew));

		if (!ew) {
			/* Answer now: the writes go on, the pages leave when
			 * written. */
			return 0;
		}
		ew->w.wake = evict_woken;
		list_init(&ew->w.link);
		ew->p = wait_on;
		ew->started = started;
		ew->spilled_before = spilled_before;
		ew->asked = evict_asked(in);
		ew->ep = &e[n - 1].ep; /* the waiting pool is the last listed */
		forget_move_reply(&ew->r, r);
		ticket_start(c, &ew->t, req_id);
		tier_wait(wait_on, &ew->w);
		return -EINPROGRESS;
	}
	return 0;
}

/* Evict: one request of an eviction run (evict_run), logged when the run
 * ends. */
static int evict(struct cache *cache, struct peer *c, uint64_t req_id,
		 const Kvpalace__V1__EvictRequest *in, struct reply *r, struct tier_park *pk,
		 const char **why)
{
	int over = 0, ret;

	evict_run_begin(c, in);
	ret = evict_one(cache, c, req_id, in, r, pk, why, &over);
	if (ret == -EAGAIN) /* run again later: nothing happened */
		return ret;
	if (ret < 0 && ret != -EINPROGRESS) {
		/* The client stops at an error. */
		if (!c->evict_run.requests)
			c->evict_run.requests = 1;
		evict_run_end(c, *why);
	} else if (over) {
		evict_run_end(c, NULL);
	}
	return ret;
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
	struct confview_reload rl;
	char *changed[CONFIG_MAX_KEYS];
	char *restart_needed[CONFIG_MAX_KEYS];
	char err[256];
};

static int do_config_reload(struct peer *c, struct reply *r, const char **why)
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
	ret = c->ops->reload_config(c, who, &h->rl, h->err, sizeof(h->err));
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

int admin_run(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req,
	      struct reply *r, struct tier_park *pk, const char **why)
{
	/* Another command: the eviction before it is over. */
	if (req->op_case != KVPALACE__V1__REQUEST__OP_EVICT)
		evict_run_end(c, NULL);
	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_SHOW_SESSION:
		return show_session(cache, req->show_session, r, why);
	case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
		return drop_session(cache, c, req->id, req->drop_session, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_DROP_POOL:
		return drop_pool(cache, c, req->id, req->drop_pool, r, why);
	case KVPALACE__V1__REQUEST__OP_EVICT:
		return evict(cache, c, req->id, req->evict, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_PURGE:
		return purge_run(cache, c, req->id, req->purge, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_CONFIG_SHOW:
		return do_config_show(cache, r, why);
	case KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD:
		return do_config_reload(c, r, why);
	default:
		*why = "unknown operation";
		return -EPROTO;
	}
}
