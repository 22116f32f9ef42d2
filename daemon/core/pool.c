/* daemon/core/pool.c — pool lookup and creation (see pool.h).
 *
 * Below the sessions and leases that live in a pool: calls only the tiers
 * a pool opens and closes (tier.h, gpu.h) and the registry (cache.h); what
 * sums over a pool's sessions is session.c's (session_pool_reserved_pages).
 * Event-loop thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "log.h"
#include "pool.h"
#include "worker.h"

/* Warming free slots ahead of writers (pool_warm). */
struct warm_job {
	struct worker_job wj;
	struct cache *c;
	struct pool *p;
	int fd; /* the arena's, a dup: the pool may go first (pool_free) */
	uint64_t page_bytes;
	uint32_t pos, n; /* pagealloc_cold_top's */
	int err;	 /* thread: 0 or the errno of fallocate */
	uint32_t *slots; /* [n] stack order, then [n] sorted */
};

static int same_layout(const struct shm_layout *a, const struct shm_layout *b)
{
	return !memcmp(a, b, sizeof(*a));
}

/* The prefix index's removals, as KV events. */
static void entry_gone(void *arg, const struct pindex_entry *e)
{
	struct pool *p = arg;

	kv_events_removed(p->events, p->id, p->uid, p->layout.block_tokens, e->hash,
			  e->slot != PINDEX_NONE ? KV_EVENT_HOST : KV_EVENT_DISK);
}

struct pool *pool_get(struct cache *c, uint64_t id, uid_t uid, int admin)
{
	struct pool *p = idmap_get(&c->pools, id);

	if (!p || (!admin && p->uid != uid))
		return NULL;
	return p;
}

int pool_open(struct cache *c, uid_t uid, const char *model_id, const struct shm_layout *layout,
	      struct pool **ret_pool)
{
	const struct config *cfg = c->cfg;
	uint32_t n_mine = 0;
	uint64_t page_bytes, n_pages, arena_bytes;
	struct list *it, *tmp;
	const char *pages_kind;
	struct pool *p;
	char name[64];
	int ret;

	list_for_each_safe (it, tmp, &c->pool_list) {
		p = list_entry(it, struct pool, link);
		if (p->uid != uid)
			continue;
		if (!strcmp(p->model_id, model_id) && same_layout(&p->layout, layout)) {
			*ret_pool = p;
			return 0;
		}
		n_mine++;
	}
	if (n_mine >= cfg->max_pools_per_tenant)
		return -EDQUOT;
	if (!cache_fd_room(c, CACHE_POOL_FDS))
		return -EMFILE; /* what is left is the admin's */

	page_bytes = shm_page_bytes(layout);
	n_pages = cfg->host_pool_bytes / page_bytes;
	if (n_pages == 0)
		return -ENOSPC;
	if (n_pages > UINT32_MAX)
		n_pages = UINT32_MAX;
	arena_bytes = n_pages * page_bytes;
	/* Round to whole hugepages so the arena can use them when reserved. */
	if (arena_bytes >= 4 * SHM_HUGEPAGE_BYTES)
		arena_bytes = (arena_bytes + SHM_HUGEPAGE_BYTES - 1) / SHM_HUGEPAGE_BYTES *
			      SHM_HUGEPAGE_BYTES;
	/* An arena costs what it holds, not what it could: host-tier-size
	 * bounds held pages (tier_make_room), so opening a pool takes
	 * nothing from anyone (issue 14: five pools of one user used to book
	 * the whole tier). */

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->arena_fd = -1;
	p->spill_data = p->spill_meta = -1;
	list_init(&p->waiters);
	prewarm_init(&p->prewarm, c);
	list_init(&p->ios);
	list_init(&p->jobs);
	list_init(&p->compact_jobs);
	list_init(&p->sessions);
	list_init(&p->link);
	p->id = cache_new_id(c, uid);
	p->uid = uid;
	snprintf(p->model_id, sizeof(p->model_id), "%s", model_id);
	p->layout = *layout;
	p->page_bytes = page_bytes;
	p->arena_bytes = arena_bytes;
	ret = pagealloc_init(&p->pa, (uint32_t)n_pages);
	if (ret == 0)
		ret = prefix_index_init(&p->ix, (uint32_t)n_pages);
	if (ret == 0 && cfg->eviction == CONFIG_EVICTION_LFU)
		ret = prefix_index_set_lfu(&p->ix, (uint32_t)n_pages * PINDEX_LFU_GHOSTS,
					   PINDEX_LFU_AGING_USES);
	if (ret == 0 && cfg->eviction == CONFIG_EVICTION_WINDOW)
		ret = prefix_index_set_window(&p->ix, PINDEX_WIN_PERMILLE);
	if (ret < 0)
		goto fail;
	p->events = &c->events;
	p->ix.gone = entry_gone;
	p->ix.gone_arg = p;
	p->root = prefix_index_root(model_id, layout, NULL, 0);
	rtier_pool_open(c, p);
	snprintf(name, sizeof(name), "kvpalace-pool-%llu", (unsigned long long)p->id);
	ret = shm_arena_create(name, arena_bytes, &p->arena_fd, &p->huge);
	if (ret < 0)
		goto fail;
	ret = shm_arena_map(p->arena_fd, arena_bytes, &p->arena);
	if (ret < 0)
		goto fail;
	ret = idmap_put(&c->pools, p->id, p);
	if (ret < 0)
		goto fail;
	list_add_tail(&c->pool_list, &p->link);
	c->host_bytes += arena_bytes;
	tier_pool_open(c, p);
	gpu_pool_open(c, p);
	/* Say what the arena got: with 4 KiB pages every process takes a
	 * fault and a TLB entry per 4 KiB of it. */
	if (p->huge)
		pages_kind = "hugetlb pages";
	else if (shm_thp_mode() == SHM_THP_ADVISE && arena_bytes >= SHM_HUGEPAGE_BYTES)
		pages_kind = "transparent huge pages (shmem, advised)";
	else
		pages_kind = "4 KiB pages (no hugetlb pages reserved, shmem THP off)";
	log_ctx_info(
		LOG_POOL_UID(p->id, uid),
		"pool %llu: uid %u model '%s' %uL %uH %uD %uT %s%s, %llu pages of %llu bytes, %s",
		(unsigned long long)p->id, (unsigned)uid, model_id, layout->n_layers,
		layout->n_kv_heads, layout->head_dim, layout->block_tokens,
		shm_dtype_name(layout->dtype), layout->format ? " latent" : "",
		(unsigned long long)n_pages, (unsigned long long)page_bytes, pages_kind);
	*ret_pool = p;
	return 0;
fail:
	log_ctx_err(LOG_UID(uid),
		    "pool for uid %u model '%s': cannot create arena of %llu bytes: %s",
		    (unsigned)uid, model_id, (unsigned long long)arena_bytes, strerror(-ret));
	shm_arena_unmap(p->arena, p->arena_bytes);
	if (p->arena_fd >= 0)
		close(p->arena_fd);
	prefix_index_fini(&p->ix, &p->pa);
	pagealloc_fini(&p->pa);
	free(p);
	return ret == -ENOMEM ? -ENOMEM : -ENOSPC;
}

void pool_free(struct cache *c, struct pool *p)
{
	if (!p)
		return;
	kvp_assert(list_empty(&p->sessions) && !tier_pool_busy(p) && list_empty(&p->waiters) &&
		   !p->n_jobs && !p->n_compact_jobs && !p->n_forgets && !gpu_pool_busy(p));
	if (p->warm_job)
		p->warm_job->p = NULL; /* it has a descriptor of its own */
	gpu_pool_close(c, p);
	tier_pool_close(c, p);
	kv_events_cleared(&c->events, p->id, p->uid);
	idmap_del(&c->pools, p->id);
	list_del(&p->link);
	c->host_bytes -= p->arena_bytes;
	shm_arena_unmap(p->arena, p->arena_bytes);
	close(p->arena_fd);
	prefix_index_fini(&p->ix, &p->pa);
	pagealloc_fini(&p->pa);
	idseq_fini(&p->by_id);
	free(p);
}

uint32_t pool_release_free(struct pool *p)
{
	uint32_t slots[256], keep = p->pa.n_pages / 32, n, done = 0;

	/* Not for hugetlb: the huge pages would go back to the reserved
	 * pool, not to the system, and should another process take them the
	 * client writing the slot next would die of SIGBUS. */
	if (p->huge || p->release_failed)
		return 0;
	while (done < POOL_RELEASE_MAX &&
	       (n = pagealloc_release(&p->pa, keep, sizeof(slots) / sizeof(*slots), slots))) {
		/* Sorted: neighbours go in one call. */
		for (uint32_t i = 0, j; i < n; i = j) {
			for (j = i + 1; j < n && slots[j] == slots[j - 1] + 1;)
				j++;
			if (fallocate(p->arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				      (off_t)((uint64_t)slots[i] * p->page_bytes),
				      (off_t)((uint64_t)(j - i) * p->page_bytes)) < 0) {
				log_ctx_warn(LOG_POOL_UID(p->id, p->uid),
					     "pool %llu: cannot give free pages' memory back: %s",
					     (unsigned long long)p->id, strerror(errno));
				p->release_failed = 1;
				return done;
			}
		}
		pagealloc_released(&p->pa, n);
		done += n;
	}
	return done;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Worker thread: allocates (and the kernel zeroes) the slots' memory. A
 * slot the loop handed out meanwhile may be being written: fallocate
 * only fills holes, it never touches a page that is there. */
static void warm_run(struct worker_job *wj)
{
	struct warm_job *j = container_of(wj, struct warm_job, wj);
	uint32_t *s = j->slots + j->n;

	memcpy(s, j->slots, j->n * sizeof(*s));
	qsort(s, j->n, sizeof(*s), cmp_u32);
	for (uint32_t i = 0, k; i < j->n; i = k) {
		for (k = i + 1; k < j->n && s[k] == s[k - 1] + 1;)
			k++;
		if (fallocate(j->fd, FALLOC_FL_KEEP_SIZE, (off_t)((uint64_t)s[i] * j->page_bytes),
			      (off_t)((uint64_t)(k - i) * j->page_bytes)) < 0) {
			j->err = errno;
			return;
		}
	}
}

static void warm_submit(struct cache *c, struct pool *p);

static void warm_done(struct worker_job *wj)
{
	struct warm_job *j = container_of(wj, struct warm_job, wj);
	struct cache *c = j->c;
	struct pool *p = j->p;

	close(j->fd);
	if (p) { /* NULL: the pool went first (pool_free) */
		p->warm_job = NULL;
		if (j->err) {
			/* Out of memory, or a file system that cannot: the
			 * writers fault their pages in as before. */
			log_ctx_info(LOG_POOL_UID(p->id, p->uid),
				     "pool %llu: cannot make free pages' memory resident ahead of "
				     "writers: %s (not tried again)",
				     (unsigned long long)p->id, strerror(j->err));
			p->warm_failed = 1;
		} else {
			pagealloc_warmed(&p->pa, j->pos, j->n, j->slots);
		}
	}
	free(j->slots);
	free(j);
	if (p && p->warm_wanted)
		warm_submit(c, p); /* until the reserve is full */
}

/* One job of at most POOL_WARM_BYTES towards keep free resident slots,
 * unless there is nothing (more) to do. */
static void warm_submit(struct cache *c, struct pool *p)
{
	struct pagealloc *pa = &p->pa;
	uint32_t keep = pa->n_pages / 32, have = pa->n_free - pa->n_released, max;
	struct warm_job *j;

	if (p->warm_job || p->huge || p->warm_failed || !c->worker || !c->worker->loop)
		return;
	if (have >= keep || !pa->n_released || pa->n_free <= 2 * keep) {
		p->warm_wanted = 0;
		return;
	}
	max = (uint32_t)(POOL_WARM_BYTES / p->page_bytes);
	if (max < 1)
		max = 1;
	if (max > keep - have)
		max = keep - have;
	j = calloc(1, sizeof(*j));
	if (j)
		j->slots = malloc(2 * (size_t)max * sizeof(*j->slots));
	if (j && j->slots)
		j->fd = fcntl(p->arena_fd, F_DUPFD_CLOEXEC, 0);
	if (!j || !j->slots || j->fd < 0) {
		if (j)
			free(j->slots);
		free(j);
		return; /* the next tick tries again */
	}
	j->n = pagealloc_cold_top(pa, max, j->slots, &j->pos);
	j->c = c;
	j->p = p;
	j->page_bytes = p->page_bytes;
	j->wj.run = warm_run;
	j->wj.done = warm_done;
	p->warm_job = j;
	worker_submit(c->worker, &j->wj);
}

void pool_warm(struct cache *c, struct pool *p)
{
	uint32_t keep = p->pa.n_pages / 32;

	if (p->pa.n_gets != p->warm_gets) {
		p->warm_gets = p->pa.n_gets;
		p->warm_wanted = 1;
	}
	/* Not for every slot taken: once a quarter of the reserve is gone
	 * (one job per Append would cost the loop more than it saves). */
	if (p->warm_wanted && p->pa.n_free - p->pa.n_released + keep / 4 < keep)
		warm_submit(c, p);
}
