/* daemon/core/gpu.c — the device tier (see gpu.h).
 *
 * Layers, top down: the tier (gpu_init, pools, LeaseDevice, GPU appends
 * and their copy back at Commit, admin eviction) and the slot bookkeeping
 * under it (device slots, the content-addressed device cache, lease and
 * session slots, watermarks), then completions (a finished list and an
 * eventfd read on the ring). All of it is plain C with no CUDA: the
 * device under it is a table of operations (gpu_dev.h) chosen once in
 * gpu_init, CUDA (gpu_cuda.c) or, for tests on machines without a GPU,
 * the emulated one in host memory ($KVPALACED_EMULATE_GPU=1: gpu_emu.c).
 * Where the device cannot open (no driver, no GPU, a build without CUDA)
 * gpu_init says why once and every pool stays host-only. This file calls
 * a device only through its table; a device calls nothing here, its
 * completions come back through job_callback, which it was handed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "gpu.h"
#include "gpu_dev.h"
#include "lease.h"
#include "list.h"
#include "log.h"
#include "loop.h"
#include "pool.h"
#include "prefix_index.h"
#include "session.h"
#include "tier.h"

/* One LeaseDevice whose copies are in flight. */
struct gpu_job {
	struct gpu_job *next; /* the finished list */
	struct list link;     /* gpu_pool.jobs */
	struct gpu *g;
	struct cache *c;
	struct pool *p;
	uint64_t lease_id;
	uint32_t from; /* the lease's device slots before the call that made it */
	uint32_t n_copies;
	uint32_t *dev;	/* [n_copies] device slots being written */
	uint32_t *host; /* [n_copies] host slots read (referenced) */
	int error;	/* a copy failed: 0 or -EIO */
	/* A copy back of a session's GPU-appended rows (gpu_session_sync)
	 * instead of a LeaseDevice: device → host, tok_n[i] tokens from
	 * tok_off[i] of each page, and nobody to answer. */
	int sync;
	uint64_t session_id;
	uint64_t sync_to; /* its tokens below this are back on the host */
	uint32_t *tok_off;
	uint32_t *tok_n;
};

struct gpu {
	int available;
	const struct gpu_dev_ops *ops; /* the device: CUDA or emulated */
	struct gpu_dev *dev;	       /* its state (ops->dev_bytes) */
	enum gpu_handle handle;
	unsigned char uuid[GPU_UUID_BYTES];
	char status[GPU_STATUS_BYTES];
	const struct config *cfg;
	struct loop *loop;
	int efd;
	uint64_t efd_val;
	struct loop_op op;
	pthread_mutex_t mu;
	struct gpu_job *finished; /* mu */
	uint32_t n_jobs;	  /* loop thread: jobs not yet done */
	uint64_t tier_bytes;	  /* device arenas of all pools */
};

int gpu_available(const struct gpu *g)
{
	return g && g->available;
}

const char *gpu_status(const struct gpu *g)
{
	return g ? g->status : "no GPU: host and disk tiers only (not probed)";
}

enum gpu_handle gpu_handle_type(const struct gpu *g)
{
	return gpu_available(g) ? g->handle : GPU_HANDLE_NONE;
}

const unsigned char *gpu_uuid(const struct gpu *g)
{
	return g->uuid;
}

int gpu_busy(const struct gpu *g)
{
	return g && g->n_jobs;
}

int gpu_pool_busy(const struct pool *p)
{
	return p->dev.n_jobs != 0;
}

static void no_gpu(struct gpu *g, const char *why)
{
	g->available = 0;
	snprintf(g->status, sizeof(g->status), "no GPU: host and disk tiers only (%s)", why);
	log_notice("%s", g->status);
}

/* ---- slot bookkeeping (no CUDA) ------------------------------------------- */

static uint64_t cache_key(XXH128_hash_t h)
{
	return h.low64 | 1;
}

/* The slot holding a ready or in-flight copy of hash, or -1. */
static int64_t cache_find(const struct gpu_pool *d, XXH128_hash_t h)
{
	uintptr_t v = (uintptr_t)idmap_get(&d->cache, cache_key(h));
	uint32_t s;

	if (!v)
		return -1;
	s = (uint32_t)(v - 1);
	/* The key is 64 bits of a 128-bit hash: check the whole of it. */
	return XXH128_isEqual(d->hash[s], h) ? (int64_t)s : -1;
}

/* Drops the cache's hold on slot s (it goes back to the free stack when
 * no lease or copy holds it). */
static void cache_forget(struct gpu_pool *d, uint32_t s)
{
	uintptr_t v = (uintptr_t)idmap_get(&d->cache, cache_key(d->hash[s]));

	if (v != (uintptr_t)s + 1)
		return;
	idmap_del(&d->cache, cache_key(d->hash[s]));
	pagealloc_unref(&d->pa, s);
}

/* Drops cached slots that only the cache holds, least recently leased
 * first, until want_free slots are free. O(n_pages) per slot dropped;
 * device arenas hold thousands of pages, not millions. */
static void drop_cached(struct gpu_pool *d, uint32_t want_free)
{
	while (d->pa.n_free < want_free) {
		uint64_t oldest = UINT64_MAX;
		int64_t victim = -1;

		for (uint32_t s = 0; s < d->n_pages; s++)
			if (d->pa.refs[s] == 1 && d->used_ns[s] < oldest &&
			    (uintptr_t)idmap_get(&d->cache, cache_key(d->hash[s])) ==
				    (uintptr_t)s + 1) {
				oldest = d->used_ns[s];
				victim = s;
			}
		if (victim < 0)
			return;
		cache_forget(d, (uint32_t)victim);
		d->dropped++;
	}
}

static int only_cached(const struct gpu_pool *d, uint32_t s)
{
	return d->pa.refs[s] == 1 &&
	       (uintptr_t)idmap_get(&d->cache, cache_key(d->hash[s])) == (uintptr_t)s + 1;
}

uint32_t gpu_evictable(const struct pool *p)
{
	uint32_t n = 0;

	for (uint32_t s = 0; p->dev.on && s < p->dev.n_pages; s++)
		n += only_cached(&p->dev, s);
	return n;
}

uint32_t gpu_evict(struct pool *p, uint32_t max_pages, uint64_t *budget)
{
	struct gpu_pool *d = &p->dev;
	uint64_t k = *budget / p->page_bytes;
	uint32_t before;

	if (!d->on)
		return 0;
	if (k > max_pages)
		k = max_pages;
	if (k > d->n_pages - d->pa.n_free)
		k = d->n_pages - d->pa.n_free;
	before = d->pa.n_free;
	drop_cached(d, before + (uint32_t)k);
	*budget -= (uint64_t)(d->pa.n_free - before) * p->page_bytes;
	return d->pa.n_free - before;
}

static uint32_t watermark_free(const struct gpu_pool *d, double mark)
{
	double used = mark * d->n_pages;

	return used >= d->n_pages ? 0 : (uint32_t)(d->n_pages - (uint32_t)used);
}

void gpu_lease_release(struct lease *l)
{
	struct gpu_pool *d = &l->pool->dev;

	while (l->n_dev > 0)
		pagealloc_unref(&d->pa, l->dev_slots[--l->n_dev]);
	free(l->dev_slots);
	l->dev_slots = NULL;
	l->cap_dev = 0;
}

/* Gives back the device slots of pages keep.. of l. */
static void lease_trim(struct lease *l, uint32_t keep)
{
	while (l->n_dev > keep)
		pagealloc_unref(&l->pool->dev.pa, l->dev_slots[--l->n_dev]);
}

int gpu_check(const struct pool *p, uint32_t *refs)
{
	const struct list *it;
	uint32_t n = 0;

	if (!p->dev.on)
		return 0;
	for (it = p->dev.jobs.next; it != &p->dev.jobs; it = it->next) {
		const struct gpu_job *j = list_entry(it, struct gpu_job, link);

		for (uint32_t i = 0; i < j->n_copies; i++) {
			if (j->host[i] >= p->pa.n_pages || j->dev[i] >= p->dev.n_pages)
				return -EUCLEAN;
			refs[j->host[i]]++;
		}
		n++;
	}
	return n == p->dev.n_jobs ? pagealloc_check(&p->dev.pa) : -EUCLEAN;
}

static int pool_tables(struct gpu_pool *d)
{
	int ret = pagealloc_init(&d->pa, d->n_pages);

	if (ret < 0)
		return ret;
	d->hash = calloc(d->n_pages, sizeof(*d->hash));
	d->sum = calloc(d->n_pages, sizeof(*d->sum));
	d->used_ns = calloc(d->n_pages, sizeof(*d->used_ns));
	d->copying = calloc(d->n_pages, sizeof(*d->copying));
	return d->hash && d->sum && d->used_ns && d->copying ? 0 : -ENOMEM;
}

static void pool_tables_free(struct gpu_pool *d)
{
	pagealloc_fini(&d->pa);
	idmap_fini(&d->cache);
	free(d->hash);
	free(d->sum);
	free(d->used_ns);
	free(d->copying);
	d->copying = NULL;
	d->hash = NULL;
	d->sum = d->used_ns = NULL;
}

/* Drops what a job holds: the copies' device slots and host pages. */
static void job_free(struct gpu_job *j)
{
	struct pool *p = j->p;

	for (uint32_t i = 0; i < j->n_copies; i++) {
		p->dev.copying[j->dev[i]] = 0;
		pagealloc_unref(&p->dev.pa, j->dev[i]);
		pagealloc_unref(&p->pa, j->host[i]);
		prefix_index_update(&p->ix, &p->pa, j->host[i]);
	}
	list_del(&j->link);
	p->dev.n_jobs--;
	j->g->n_jobs--;
	free(j->dev);
	free(j->host);
	free(j->tok_off);
	free(j->tok_n);
	free(j);
}

/* ---- completions ----------------------------------------------------------- */

/* The device's done (gpu_dev.h): on a CUDA thread (or, emulated, on the
 * loop thread), so only the list and the eventfd. */
static void job_callback(void *arg)
{
	struct gpu_job *j = arg;
	struct gpu *g = j->g;
	int was_empty;

	pthread_mutex_lock(&g->mu);
	was_empty = g->finished == NULL;
	j->next = g->finished;
	g->finished = j;
	pthread_mutex_unlock(&g->mu);
	if (was_empty)
		eventfd_write(g->efd, 1);
}

static void arm_read(struct gpu *g)
{
	loop_read(g->loop, &g->op, g->efd, &g->efd_val, sizeof(g->efd_val));
}

/* On the loop thread: every copy of j is done (or failed). */
static void sync_done(struct gpu_job *j);

static void job_done(struct gpu_job *j)
{
	struct pool *p = j->p;
	struct gpu_pool *d = &p->dev;
	struct lease *l;

	/* A copy may fail after it was queued: the device says so now. */
	if (!j->error)
		j->error = j->g->ops->copy_error(j->g->dev);
	if (j->sync) {
		sync_done(j);
		return;
	}
	for (uint32_t i = 0; i < j->n_copies; i++) {
		if (j->error) {
			/* Nobody may find a copy that may be torn. */
			cache_forget(d, j->dev[i]);
			d->copy_errors++;
		} else {
			d->copied++;
		}
	}
	/* Its lease (unless released meanwhile) waited for this job. On a
	 * failure it keeps only the slots it had before the call that made
	 * the job: those the call added, copied by this job or by another
	 * lease's it waited for (a failed copy makes the stream's error
	 * sticky, so a fence job sees it too), may be torn. Its LeaseDevice,
	 * run again, answers the error once. */
	l = idmap_get(&j->c->leases, j->lease_id);
	if (j->error)
		log_ctx_err(LOG_POOL_UID(p->id, p->uid), "pool %llu: host→device copy failed",
			    (unsigned long long)p->id);
	if (l) {
		l->dev_jobs--;
		if (j->error) {
			lease_trim(l, j->from);
			l->dev_error = j->error;
		}
	}
	job_free(j);
	/* The LeaseDevice that waits for these copies runs again. */
	tier_wake_all(p);
}

static void on_eventfd(struct loop_op *op, int res, unsigned int flags)
{
	struct gpu *g = container_of(op, struct gpu, op);
	struct gpu_job *list, *fifo = NULL;

	(void)res;
	(void)flags;
	if (!g->loop)
		return;
	pthread_mutex_lock(&g->mu);
	list = g->finished;
	g->finished = NULL;
	pthread_mutex_unlock(&g->mu);
	/* The callbacks pushed in front: turn the list round to answer in
	 * completion order. */
	while (list) {
		struct gpu_job *next = list->next;

		list->next = fifo;
		fifo = list;
		list = next;
	}
	while (fifo) {
		struct gpu_job *j = fifo;

		fifo = j->next;
		job_done(j);
	}
	arm_read(g);
}

/* ---- the device (gpu_dev.h) --------------------------------------------------- */

static int copy_to_device(struct gpu *g, struct pool *p, uint32_t dslot, uint32_t hslot)
{
	return g->ops->copy_to_device(
		g->dev, p->dev.arena.d_base + (uint64_t)dslot * p->page_bytes,
		(const unsigned char *)p->arena + (uint64_t)hslot * p->page_bytes, p->page_bytes);
}

/* Copies tokens [t0, t0 + nt) of device slot dslot back into host slot
 * hslot: their rows of every (layer, K/V, head), and their scales for a
 * quantized layout (the page's per-plane scales for raw fp8); each part is
 * one 2D copy (rows a page-row apart). */
static int copy_rows_to_host(struct gpu *g, struct pool *p, uint32_t dslot, uint32_t hslot,
			     uint32_t t0, uint32_t nt)
{
	const struct shm_layout *l = &p->layout;
	unsigned char *host = (unsigned char *)p->arena + (uint64_t)hslot * p->page_bytes;
	uint64_t dev = p->dev.arena.d_base + (uint64_t)dslot * p->page_bytes;
	uint64_t height = (uint64_t)l->n_layers * shm_layout_planes(l) * l->n_kv_heads;
	uint64_t row = shm_row_bytes(l);
	struct {
		uint64_t off, pitch, width, height;
	} part[2] = {{shm_kv_offset(l, 0, 0, 0, t0), row * l->block_tokens, row * nt, height}};
	int n_parts = 1, ret;

	if (shm_dtype_quantized(l->dtype)) {
		uint64_t srow = (uint64_t)(l->head_dim / l->quant_group) * 2;

		part[1].off = shm_scale_offset(l, 0, 0, 0, t0);
		part[1].pitch = srow * l->block_tokens;
		part[1].width = srow * nt;
		part[1].height = height;
		n_parts = 2;
	} else if (shm_dtype_raw(l->dtype)) {
		/* the page's f32 scales per (layer, plane), written with the rows */
		part[1].off = shm_raw_scale_offset(l, 0, 0);
		part[1].pitch = part[1].width = shm_page_scale_bytes(l);
		part[1].height = 1;
		n_parts = 2;
	}
	for (int k = 0; k < n_parts; k++) {
		ret = g->ops->copy_rows_to_host(g->dev, host, dev, part[k].off, part[k].pitch,
						part[k].width, part[k].height);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* Queues j's completion behind its copies. */
static int launch_done(struct gpu *g, struct gpu_job *j)
{
	return g->ops->launch_done(g->dev, job_callback, j);
}

/* Waits for every copy queued (the error paths, before slots are reused). */
static void dev_sync(struct gpu *g)
{
	g->ops->sync(g->dev);
}

/* ---- the tier -------------------------------------------------------------- */

/* Opens g's device and, when it has one, arms the eventfd its completions
 * come through. The eventfd comes first, so an open device is never
 * closed again for want of it. */
static void dev_open(struct gpu *g)
{
	struct gpu_dev_desc desc = {0};
	const char *why = "unknown";

	g->efd = eventfd(0, EFD_CLOEXEC);
	if (g->efd < 0) {
		no_gpu(g, "cannot create an eventfd");
		return;
	}
	if (g->ops->open(g->dev, g->cfg, &desc, &why) < 0) {
		close(g->efd);
		g->efd = -1;
		no_gpu(g, why);
		return;
	}
	g->handle = desc.handle;
	memcpy(g->uuid, desc.uuid, sizeof(g->uuid));
	memcpy(g->status, desc.status, sizeof(g->status));
	g->available = 1;
	g->op.cb = on_eventfd;
	arm_read(g);
}

int gpu_init(struct gpu **ret_gpu, const struct config *cfg, struct loop *l)
{
	struct gpu *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	if (secure_getenv("KVPALACED_EMULATE_GPU") &&
	    !strcmp(secure_getenv("KVPALACED_EMULATE_GPU"), "1"))
		g->ops = gpu_emu_ops();
	else
		g->ops = gpu_cuda_ops();
	if (g->ops->dev_bytes) {
		g->dev = calloc(1, g->ops->dev_bytes);
		if (!g->dev) {
			free(g);
			return -ENOMEM;
		}
	}
	g->cfg = cfg;
	g->loop = l;
	g->efd = -1;
	pthread_mutex_init(&g->mu, NULL);
	dev_open(g);
	*ret_gpu = g;
	return 0;
}

void gpu_fini(struct gpu *g)
{
	if (!g)
		return;
	if (g->available)
		g->ops->close(g->dev);
	g->loop = NULL;
	if (g->efd >= 0)
		close(g->efd);
	pthread_mutex_destroy(&g->mu);
	free(g->dev);
	free(g);
}

void gpu_pool_open(struct cache *c, struct pool *p)
{
	struct gpu *g = c->gpu;
	struct gpu_pool *d = &p->dev;
	uint64_t want = c->cfg->gpu_pool_bytes;
	int ret;

	memset(d, 0, sizeof(*d));
	d->arena.fd = -1;
	if (!gpu_available(g) || want < p->page_bytes)
		return;
	if (g->tier_bytes + want > c->cfg->gpu_tier_bytes) {
		log_ctx_notice(
			LOG_POOL_UID(p->id, p->uid),
			"pool %llu: no device arena: the GPU tier's %llu MiB (gpu-tier-size) "
			"are taken; host tier only",
			(unsigned long long)p->id,
			(unsigned long long)(c->cfg->gpu_tier_bytes >> 20));
		return;
	}
	ret = g->ops->arena_open(g->dev, p->id, p->arena, p->arena_bytes, want, &d->arena);
	if (ret < 0) {
		log_ctx_err(LOG_POOL_UID(p->id, p->uid),
			    "pool %llu: no device arena of %llu MiB (%s): host tier only",
			    (unsigned long long)p->id, (unsigned long long)(want >> 20),
			    strerror(-ret));
		return;
	}
	d->n_pages = (uint32_t)(d->arena.bytes / p->page_bytes > UINT32_MAX
					? UINT32_MAX
					: d->arena.bytes / p->page_bytes);
	ret = pool_tables(d);
	if (ret < 0) {
		pool_tables_free(d);
		g->ops->arena_close(g->dev, &d->arena);
		log_ctx_err(LOG_POOL_UID(p->id, p->uid),
			    "pool %llu: no memory for the device arena's tables: host tier only",
			    (unsigned long long)p->id);
		memset(d, 0, sizeof(*d));
		d->arena.fd = -1;
		return;
	}
	list_init(&d->jobs);
	g->tier_bytes += d->arena.bytes;
	d->on = 1;
	log_ctx_info(LOG_POOL_UID(p->id, p->uid), "pool %llu: device arena of %llu MiB, %u pages",
		     (unsigned long long)p->id, (unsigned long long)(d->arena.bytes >> 20),
		     d->n_pages);
}

void gpu_pool_close(struct cache *c, struct pool *p)
{
	struct gpu_pool *d = &p->dev;

	if (!d->on)
		return;
	kvp_assert(!d->n_jobs);
	c->gpu->tier_bytes -= d->arena.bytes;
	pool_tables_free(d);
	c->gpu->ops->arena_close(c->gpu->dev, &d->arena);
	d->on = 0;
}

int gpu_lease_device(struct cache *c, struct lease *l, uint64_t first_page, struct tier_park *pk,
		     struct gpu_lease_slots *out, const char **why)
{
	struct gpu *g = c->gpu;
	struct pool *p = l->pool;
	struct gpu_pool *d = &p->dev;
	struct gpu_job *j = NULL;
	uint32_t start = l->n_dev, n_copies = 0;
	int wait = 0; /* a cached slot's copy is still in flight */
	uint64_t now = clock_now_ns();
	int ret;

	if (!d->on) {
		*why = gpu_available(g) ? "this pool has no device arena (gpu-pool-size)"
					: gpu_status(g);
		return -EOPNOTSUPP;
	}
	if (first_page > l->n_pages) {
		*why = "first page past the lease's pages";
		return -ERANGE;
	}
	if (l->dev_error) {
		/* Copies it waited for failed (job_done): answered once. */
		ret = l->dev_error;
		l->dev_error = 0;
		l->dev_copied = 0;
		*why = "a host→device copy failed";
		return ret;
	}
	if (l->n_pages > l->cap_dev) {
		uint32_t *s = realloc(l->dev_slots, (size_t)l->n_pages * sizeof(*s));

		if (!s) {
			*why = "out of memory";
			return -ENOMEM;
		}
		l->dev_slots = s;
		l->cap_dev = l->n_pages;
	}
	if (l->n_pages > start) {
		uint32_t want = l->n_pages - start;

		j = calloc(1, sizeof(*j));
		if (j) {
			j->dev = calloc(want, sizeof(uint32_t));
			j->host = calloc(want, sizeof(uint32_t));
		}
		if (!j || !j->dev || !j->host) {
			if (j) {
				free(j->dev);
				free(j->host);
			}
			free(j);
			*why = "out of memory";
			return -ENOMEM;
		}
	}
	/* Above the high watermark cached copies go first, down to the low
	 * one, so a lease rarely meets a full arena. */
	if (d->pa.n_free < watermark_free(d, c->cfg->gpu_high_watermark))
		drop_cached(d, watermark_free(d, c->cfg->gpu_low_watermark));
	for (uint32_t i = start; i < l->n_pages; i++) {
		int64_t s = cache_find(d, l->hashes[i]);
		uint32_t slot;

		if (s >= 0) {
			/* Another lease's copy may still be on its way: the
			 * stream runs in order, so waiting for a callback queued
			 * now is waiting for it. */
			slot = (uint32_t)s;
			pagealloc_ref(&d->pa, slot);
			wait |= d->copying[slot];
		} else {
			const struct pindex_entry *e;
			int cached;

			if (d->pa.n_free == 0)
				drop_cached(d, 1);
			if (pagealloc_get(&d->pa, &slot) < 0) {
				ret = -ENOSPC;
				*why = "the device arena is full of leased pages";
				goto fail;
			}
			/* That reference is the cache's (the lease's when the
			 * cache cannot take the page); the copy's follows. The
			 * checksum the disk tier took travels with the page. */
			d->hash[slot] = l->hashes[i];
			e = prefix_index_of_slot(&p->ix, l->pages[i]);
			d->sum[slot] = e && e->extent != PINDEX_NONE ? e->disk_sum : 0;
			cached = idmap_put(&d->cache, cache_key(l->hashes[i]),
					   (void *)(uintptr_t)(slot + 1)) == 0;
			ret = copy_to_device(g, p, slot, l->pages[i]);
			if (ret < 0) {
				if (cached)
					cache_forget(d, slot);
				else
					pagealloc_unref(&d->pa, slot);
				*why = "cannot start a host→device copy";
				goto fail;
			}
			if (cached)
				pagealloc_ref(&d->pa, slot); /* the lease's */
			pagealloc_ref(&d->pa, slot);	     /* the copy's */
			pagealloc_ref(&p->pa, l->pages[i]);
			d->copying[slot] = 1;
			j->dev[n_copies] = slot;
			j->host[n_copies] = l->pages[i];
			n_copies++;
		}
		d->used_ns[slot] = now;
		l->dev_slots[l->n_dev++] = slot;
	}
	if (n_copies == 0 && !wait) {
		free(j ? j->dev : NULL);
		free(j ? j->host : NULL);
		free(j);
		if (l->dev_jobs)
			goto park; /* an earlier call's copies are still on their way */
		out->slots = l->dev_slots + first_page;
		out->n_slots = l->n_dev - (uint32_t)first_page;
		out->copied = l->dev_copied;
		l->dev_copied = 0;
		return 0;
	}
	j->g = g;
	j->c = c;
	j->p = p;
	j->lease_id = l->id;
	j->from = start;
	/* With no copy of its own (n_copies 0: it waits for another lease's
	 * copies of cached slots) the job is a fence: the stream runs in
	 * order, so it completes after them and sees their error. */
	j->n_copies = n_copies;
	d->n_jobs++;
	g->n_jobs++;
	list_add_tail(&d->jobs, &j->link);
	ret = launch_done(g, j);
	if (ret < 0) {
		/* The copies were enqueued: wait for them before anything is
		 * reused, then give everything back. */
		dev_sync(g);
		j->error = ret;
		for (uint32_t k = 0; k < j->n_copies; k++)
			cache_forget(d, j->dev[k]);
		lease_trim(l, start);
		job_free(j);
		*why = "cannot queue the completion of host→device copies";
		return ret;
	}
	l->dev_copied += n_copies;
	l->dev_jobs++;
park:
	/* Like a disk read: the request waits on the pool and runs again
	 * when the copies are done (job_done wakes it). Even past
	 * PEER_MAX_PARK_NS (pk->no_park): a device's copies always end, in
	 * order, and the answer waits for them as it always did. */
	pk->park_on = p;
	return -EAGAIN;
fail:
	/* Copies already enqueued finish into slots nobody will find: wait
	 * for them, then undo this call's slots. */
	if (n_copies)
		dev_sync(g);
	for (uint32_t k = 0; k < n_copies; k++) {
		d->copying[j->dev[k]] = 0;
		cache_forget(d, j->dev[k]);
		pagealloc_unref(&d->pa, j->dev[k]);
		pagealloc_unref(&p->pa, j->host[k]);
		prefix_index_update(&p->ix, &p->pa, j->host[k]);
	}
	lease_trim(l, start);
	if (j) {
		free(j->dev);
		free(j->host);
		free(j);
	}
	return ret;
}

/* ---- GPU appends ------------------------------------------------------------ */

static void sync_done(struct gpu_job *j)
{
	struct session *s = idmap_get(&j->c->sessions, j->session_id);

	if (s && s->dev) {
		s->dev->copying = 0;
		if (j->error) {
			s->dev->error = 1;
			j->p->dev.copy_errors++;
			log_ctx_err(LOG_SESSION(s->pool->id, s->id, s->pool->uid),
				    "session %llu: device→host copy failed",
				    (unsigned long long)s->id);
		} else {
			/* Forget what is back on the host. */
			uint32_t k = 0;

			for (uint32_t i = 0; i < s->dev->n_ranges; i++) {
				struct session_dev_range r = s->dev->ranges[i];

				if (r.to <= j->sync_to)
					continue;
				if (r.from < j->sync_to)
					r.from = j->sync_to;
				s->dev->ranges[k++] = r;
			}
			s->dev->n_ranges = k;
			j->p->dev.copied_back += j->n_copies;
		}
	}
	/* The Commit parked on the pool runs again. */
	tier_wake_all(j->p);
	job_free(j);
}

int gpu_session_append(struct cache *c, struct session *s, uint64_t from, uint64_t n,
		       const char **why)
{
	struct pool *p = s->pool;
	struct gpu_pool *d = &p->dev;
	uint32_t bt = p->layout.block_tokens;
	uint32_t first = (uint32_t)(from / bt), last = (uint32_t)((from + n - 1) / bt);
	uint64_t now = clock_now_ns();
	int first_had;

	if (!d->on) {
		*why = "this pool has no device arena";
		return -EOPNOTSUPP;
	}
	if (!n)
		return 0;
	if (!s->dev && !(s->dev = calloc(1, sizeof(*s->dev)))) {
		*why = "out of memory";
		return -ENOMEM;
	}
	if (s->dev->cap < s->n_pages) {
		uint32_t *dp = realloc(s->dev->pages, (size_t)s->cap_pages * sizeof(*dp));

		if (!dp) {
			*why = "out of memory";
			return -ENOMEM;
		}
		for (uint32_t i = s->dev->cap; i < s->cap_pages; i++)
			dp[i] = GPU_NONE;
		s->dev->pages = dp;
		s->dev->cap = s->cap_pages;
	}
	if (s->dev->n_ranges == s->dev->cap_ranges) {
		uint32_t cap = s->dev->cap_ranges ? s->dev->cap_ranges * 2 : 4;
		struct session_dev_range *r = realloc(s->dev->ranges, cap * sizeof(*r));

		if (!r) {
			*why = "out of memory";
			return -ENOMEM;
		}
		s->dev->ranges = r;
		s->dev->cap_ranges = cap;
	}
	if (d->pa.n_free < watermark_free(d, c->cfg->gpu_high_watermark))
		drop_cached(d, watermark_free(d, c->cfg->gpu_low_watermark));
	first_had = s->dev->pages[first] != GPU_NONE;
	for (uint32_t pg = first; pg <= last; pg++) {
		uint32_t slot;

		if (s->dev->pages[pg] != GPU_NONE)
			continue;
		if (d->pa.n_free == 0)
			drop_cached(d, 1);
		if (pagealloc_get(&d->pa, &slot) < 0) {
			/* Give back what this call took: every page after the
			 * first, and the first when it had none before. */
			for (uint32_t q = first + (uint32_t)first_had; q < pg; q++) {
				pagealloc_unref(&d->pa, s->dev->pages[q]);
				s->dev->pages[q] = GPU_NONE;
			}
			*why = "the device arena is full: no device slot for the new pages";
			return -ENOSPC;
		}
		d->hash[slot] = (XXH128_hash_t){0, 0}; /* a session's, never cached */
		d->used_ns[slot] = now;
		s->dev->pages[pg] = slot;
	}
	if (s->dev->n_ranges && s->dev->ranges[s->dev->n_ranges - 1].to == from)
		s->dev->ranges[s->dev->n_ranges - 1].to = from + n;
	else
		s->dev->ranges[s->dev->n_ranges++] = (struct session_dev_range){from, from + n};
	return 0;
}

int gpu_session_sync(struct cache *c, struct session *s, uint64_t n, struct tier_park *pk,
		     const char **why)
{
	struct pool *p = s->pool;
	struct gpu_pool *d = &p->dev;
	uint32_t bt = p->layout.block_tokens;
	uint64_t target = s->n_committed + n;
	struct gpu_job *j;
	uint32_t n_copies = 0, k = 0;
	int ret;

	if (!s->dev || !s->dev->n_ranges || s->dev->ranges[0].from >= target)
		return 0;
	if (s->dev->error) {
		*why = "a device→host copy of this session's GPU-written tokens failed";
		return -EIO;
	}
	if (s->dev->copying)
		goto wait;
	/* One copy per page part of each range below target. */
	for (uint32_t i = 0; i < s->dev->n_ranges && s->dev->ranges[i].from < target; i++) {
		uint64_t b = s->dev->ranges[i].to < target ? s->dev->ranges[i].to : target;

		n_copies += (uint32_t)((b - 1) / bt - s->dev->ranges[i].from / bt + 1);
	}
	j = calloc(1, sizeof(*j));
	if (j) {
		j->dev = calloc(n_copies, sizeof(uint32_t));
		j->host = calloc(n_copies, sizeof(uint32_t));
		j->tok_off = calloc(n_copies, sizeof(uint32_t));
		j->tok_n = calloc(n_copies, sizeof(uint32_t));
	}
	if (!j || !j->dev || !j->host || !j->tok_off || !j->tok_n) {
		if (j) {
			free(j->dev);
			free(j->host);
			free(j->tok_off);
			free(j->tok_n);
		}
		free(j);
		*why = "out of memory";
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->dev->n_ranges && s->dev->ranges[i].from < target; i++) {
		uint64_t a = s->dev->ranges[i].from;
		uint64_t b = s->dev->ranges[i].to < target ? s->dev->ranges[i].to : target;

		while (a < b) {
			uint32_t pg = (uint32_t)(a / bt);
			uint64_t e = (uint64_t)(pg + 1) * bt < b ? (uint64_t)(pg + 1) * bt : b;

			kvp_assert(pg < s->n_pages && s->dev->pages[pg] != GPU_NONE);
			ret = copy_rows_to_host(c->gpu, p, s->dev->pages[pg], s->pages[pg],
						(uint32_t)(a % bt), (uint32_t)(e - a));
			if (ret < 0) {
				if (k)
					dev_sync(c->gpu);
				j->n_copies = 0; /* nothing referenced yet but k */
				for (uint32_t q = 0; q < k; q++) {
					pagealloc_unref(&d->pa, j->dev[q]);
					pagealloc_unref(&p->pa, j->host[q]);
				}
				free(j->dev);
				free(j->host);
				free(j->tok_off);
				free(j->tok_n);
				free(j);
				*why = "cannot start a device→host copy";
				return -EIO;
			}
			pagealloc_ref(&d->pa, s->dev->pages[pg]);
			pagealloc_ref(&p->pa, s->pages[pg]);
			j->dev[k] = s->dev->pages[pg];
			j->host[k] = s->pages[pg];
			j->tok_off[k] = (uint32_t)(a % bt);
			j->tok_n[k] = (uint32_t)(e - a);
			k++;
			a = e;
		}
	}
	j->g = c->gpu;
	j->c = c;
	j->p = p;
	j->sync = 1;
	j->session_id = s->id;
	j->sync_to = target;
	j->n_copies = k;
	d->n_jobs++;
	c->gpu->n_jobs++;
	list_add_tail(&d->jobs, &j->link);
	ret = launch_done(c->gpu, j);
	if (ret < 0) {
		dev_sync(c->gpu);
		job_free(j);
		*why = "cannot queue the completion of device→host copies";
		return ret;
	}
	s->dev->copying = 1;
wait:
	if (pk->no_park) {
		*why = "device→host copies of this session are still in flight: commit again";
		return -EBUSY;
	}
	pk->park_on = p;
	return -EAGAIN;
}

void gpu_session_trim(struct session *s)
{
	struct gpu_pool *d = &s->pool->dev;
	uint32_t k = 0;

	if (!s->dev)
		return;
	for (uint32_t i = 0; i < s->dev->n_ranges; i++) {
		struct session_dev_range r = s->dev->ranges[i];

		if (r.from >= s->n_tokens)
			continue;
		if (r.to > s->n_tokens)
			r.to = s->n_tokens;
		s->dev->ranges[k++] = r;
	}
	s->dev->n_ranges = k;
	for (uint32_t pg = s->n_pages; pg < s->dev->cap; pg++)
		if (s->dev->pages[pg] != GPU_NONE) {
			pagealloc_unref(&d->pa, s->dev->pages[pg]);
			s->dev->pages[pg] = GPU_NONE;
		}
}

void gpu_session_free(struct session *s)
{
	struct gpu_pool *d = &s->pool->dev;

	if (!s->dev)
		return;
	for (uint32_t pg = 0; pg < s->dev->cap; pg++)
		if (s->dev->pages[pg] != GPU_NONE)
			pagealloc_unref(&d->pa, s->dev->pages[pg]);
	free(s->dev->pages);
	free(s->dev->ranges);
	free(s->dev);
	s->dev = NULL;
}

int gpu_pool_forget(struct pool *p, XXH128_hash_t h)
{
	struct gpu_pool *d = &p->dev;
	int64_t s;

	if (!d->on || (s = cache_find(d, h)) < 0)
		return 0;
	cache_forget(d, (uint32_t)s);
	return 1;
}
