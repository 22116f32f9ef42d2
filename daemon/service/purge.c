/* daemon/service/purge.c — forgetting cached pages for good (see purge.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "lease.h"
#include "log.h"
#include "pool.h"
#include "purge.h"
#include "spill.h"
#include "status.h"
#include "tier.h"
#include "worker.h"

/* The extents of one pool's spill file a batch forgets. */
struct forget_pool {
	struct pool *p;
	const struct spill *sp; /* p->spill, which stays open while n_forgets holds p */
	uint32_t *extents;
	uint32_t n, cap;
	int ret; /* the worker's spill_forget */
};

struct forget {
	struct worker_job wj;
	struct ticket t;
	struct cache *c;
	struct forget_pool *pools;
	uint32_t n_pools, cap_pools;
	char dir[CONFIG_PATH_MAX]; /* fsynced after the headers, when set */
	int dir_ret;
	struct reply r; /* sent once the work is durable */
	char why[160];
};

struct forget *forget_new(void)
{
	return calloc(1, sizeof(struct forget));
}

int forget_pending(const struct forget *f)
{
	return f->n_pools || f->dir[0];
}

int forget_extent(struct forget *f, struct pool *p, uint32_t extent)
{
	struct forget_pool *fp = NULL;

	for (uint32_t i = 0; i < f->n_pools; i++)
		if (f->pools[i].p == p)
			fp = &f->pools[i];
	if (!fp) {
		if (f->n_pools == f->cap_pools) {
			uint32_t cap = f->cap_pools ? 2 * f->cap_pools : 4;
			struct forget_pool *v = realloc(f->pools, cap * sizeof(*v));

			if (!v)
				goto nomem;
			f->pools = v;
			f->cap_pools = cap;
		}
		fp = &f->pools[f->n_pools++];
		*fp = (struct forget_pool){.p = p, .sp = p->spill};
		p->n_forgets++;
	}
	if (fp->n == fp->cap) {
		uint32_t cap = fp->cap ? 2 * fp->cap : 64;
		uint32_t *v = realloc(fp->extents, cap * sizeof(*v));

		if (!v)
			goto nomem;
		fp->extents = v;
		fp->cap = cap;
	}
	fp->extents[fp->n++] = extent;
	return 0;
nomem:
	/* Never freed, so never rewritten: its old header may bring the page
	 * back after a restart, which the log has to say. */
	log_ctx_err(LOG_POOL_UID(p->id, p->uid),
		    "pool %llu: out of memory forgetting extent %u; a restart may find its page "
		    "again",
		    (unsigned long long)p->id, extent);
	return -ENOMEM;
}

int forget_dir(struct forget *f, const char *dir)
{
	if (strlen(dir) >= sizeof(f->dir))
		return -ENAMETOOLONG;
	snprintf(f->dir, sizeof(f->dir), "%s", dir);
	return 0;
}

void forget_move_reply(struct reply *dst, struct reply *src)
{
	*dst = *src;
	/* The oneof pointed into src's union. */
	switch (dst->resp.op_case) {
	case KVPALACE__V1__RESPONSE__OP_PURGE:
		dst->resp.purge = &dst->u.purge;
		break;
	case KVPALACE__V1__RESPONSE__OP_DROP_SESSION:
		dst->resp.drop_session = &dst->u.drop_session;
		break;
	case KVPALACE__V1__RESPONSE__OP_DROP_POOL:
		dst->resp.drop_pool = &dst->u.drop_pool;
		break;
	case KVPALACE__V1__RESPONSE__OP_EVICT:
		dst->resp.evict = &dst->u.evict;
		break;
	default:
		kvp_assert(dst->resp.op_case == KVPALACE__V1__RESPONSE__OP__NOT_SET);
	}
	memset(src, 0, sizeof(*src));
	src->pass_fd = -1;
	kvpalace__v1__response__init(&src->resp);
}

/* On a worker thread: the blocking writes and syncs. */
static void forget_run(struct worker_job *j)
{
	struct forget *f = (struct forget *)j;

	for (uint32_t i = 0; i < f->n_pools; i++)
		f->pools[i].ret = spill_forget(f->pools[i].sp, f->pools[i].extents, f->pools[i].n);
	if (f->dir[0]) {
		int fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		f->dir_ret = fd < 0 ? -errno : 0;
		if (fd >= 0 && fsync(fd) < 0)
			f->dir_ret = -errno;
		if (fd >= 0)
			close(fd);
	}
}

static void forget_free(struct forget *f)
{
	for (uint32_t i = 0; i < f->n_pools; i++)
		free(f->pools[i].extents);
	free(f->pools);
	reply_fini(&f->r);
	free(f);
}

/* On the loop thread: the extents go back to their files (or stay out of
 * use after a failure). Returns the first error. */
static int forget_settle(struct forget *f)
{
	int err = f->dir_ret;

	for (uint32_t i = 0; i < f->n_pools; i++) {
		struct forget_pool *fp = &f->pools[i];

		fp->p->n_forgets--;
		if (fp->ret < 0) {
			log_ctx_err(LOG_POOL_UID(fp->p->id, fp->p->uid),
				    "pool %llu: cannot invalidate %u page headers of %s: %s; a "
				    "restart may find those pages again",
				    (unsigned long long)fp->p->id, fp->n, fp->sp->path,
				    strerror(-fp->ret));
			if (!err)
				err = fp->ret;
			continue;
		}
		for (uint32_t k = 0; k < fp->n; k++)
			spill_free(fp->p->spill, fp->extents[k]);
	}
	if (f->dir_ret < 0)
		log_err("cannot sync %s after removing a spill file: %s; a crash may bring the "
			"file back",
			f->dir, strerror(-f->dir_ret));
	return err;
}

/* Turns f's reply into the error err. */
static void fail_reply(struct forget *f, int err)
{
	reply_fini(&f->r);
	f->r.resp.op_case = KVPALACE__V1__RESPONSE__OP__NOT_SET;
	f->r.resp.status = status_from_errno(-EIO);
	snprintf(f->why, sizeof(f->why),
		 "forgotten in memory, but making it durable failed (%s): a restart may find "
		 "those pages again",
		 strerror(-err));
	f->r.resp.error = f->why;
}

static void forget_done(struct worker_job *j)
{
	struct forget *f = (struct forget *)j;
	int err = forget_settle(f);

	if (err < 0)
		fail_reply(f, err);
	ticket_deliver(&f->t, &f->r);
	forget_free(f);
}

int forget_finish(struct forget *f, struct cache *c, struct peer *conn, uint64_t req_id,
		  struct reply *r)
{
	int err;

	if (!forget_pending(f)) {
		forget_free(f);
		return 0;
	}
	f->c = c;
	if (!c->worker) {
		/* No threads (an in-process test): do it here. */
		forget_run(&f->wj);
		err = forget_settle(f);
		forget_free(f);
		if (err < 0) {
			r->resp.op_case = KVPALACE__V1__RESPONSE__OP__NOT_SET;
			return -EIO;
		}
		return 0;
	}
	forget_move_reply(&f->r, r);
	f->wj.run = forget_run;
	f->wj.done = forget_done;
	ticket_start(conn, &f->t, req_id);
	worker_submit(c->worker, &f->wj);
	return -EINPROGRESS;
}

/* ---- choosing what to forget --------------------------------------------- */

struct ctx {
	struct cache *c;
	struct pool *p;
	struct forget *f;
	struct purge_counts *n;
	struct tier_park *pk; /* the request's: the pool to wait on */
	uint8_t *held;	      /* [p->pa.n_pages] slots of forgotten entries others hold */
	/* Purge criteria. */
	int has_salt, has_age;
	XXH128_hash_t root; /* the salt's chain root in p */
	uint64_t unused_before_ns;
	/* purge_session: the entries to forget. */
	struct idmap *chosen;
};

static int pick_purge(void *arg, const struct pindex_entry *e)
{
	const struct ctx *x = arg;
	static const XXH128_hash_t unknown = {0, 0};

	/* A root nobody recorded may be the salt's: any doubt is a purge. */
	if (x->has_salt && !XXH128_isEqual(e->root, x->root) && !XXH128_isEqual(e->root, unknown))
		return 0;
	return !x->has_age || e->used_ns < x->unused_before_ns;
}

static int pick_chosen(void *arg, const struct pindex_entry *e)
{
	const struct ctx *x = arg;

	return idmap_get(x->chosen, e->hash.low64 | 1) == e;
}

static void gone(void *arg, const struct pindex_entry *e)
{
	struct ctx *x = arg;
	struct pool *p = x->p;

	x->n->pages++;
	if (e->slot != PINDEX_NONE) {
		x->n->host_pages++;
		if (p->pa.refs[e->slot] > 1) {
			x->n->held_pages++;
			if (x->held)
				x->held[e->slot] = 1;
		}
	}
	if (e->extent != PINDEX_NONE) {
		x->n->disk_pages++;
		(void)forget_extent(x->f, p, e->extent);
	}
	x->n->device_pages += (uint64_t)gpu_pool_forget(p, e->hash);
}

/* Sessions and leases holding a forgotten page (x->held) must not bring
 * what they compute on it back into the index. */
static void mark_holders(struct ctx *x)
{
	struct cache *c = x->c;
	struct pool *p = x->p;

	for (struct list *it = p->sessions.next; it != &p->sessions; it = it->next) {
		struct session *s = list_entry(it, struct session, pool_link);

		for (uint32_t i = 0; !s->unindexed && i < s->n_pages; i++)
			if (x->held[s->pages[i]]) {
				s->unindexed = 1;
				x->n->sessions_marked++;
			}
	}
	for (size_t i = 0; i < c->leases.cap; i++) {
		struct lease *l = c->leases.slots[i].ptr;

		if (!c->leases.slots[i].id || l->pool != p)
			continue;
		for (uint32_t k = 0; !l->purged && k < l->n_pages; k++)
			if (x->held[l->pages[k]])
				l->purged = l->complete = 1;
	}
}

/* Forgets what pick chooses in x->p (dry: counts it). Returns the entries
 * or -EBUSY with x->pk->park_on set, -ENOMEM. */
static int forget_in_pool(struct ctx *x, int (*pick)(void *, const struct pindex_entry *),
			  int dry_run)
{
	struct pool *p = x->p;
	int n;

	if (dry_run) {
		n = prefix_index_forget(&p->ix, &p->pa, pick, gone, x, 1);
		/* A header write in flight could land after the invalidation
		 * and bring a page back: wait for the pool's I/O. A warm
		 * restart's scan may still list pages the purge would take:
		 * wait for its end too. */
		if (n == -EBUSY || (n > 0 && p->io_inflight) || tier_pool_scanning(p)) {
			x->pk->park_on = p;
			return -EBUSY;
		}
		return n;
	}
	x->held = calloc(p->pa.n_pages ? p->pa.n_pages : 1, 1);
	if (!x->held)
		return -ENOMEM;
	n = prefix_index_forget(&p->ix, &p->pa, pick, gone, x, 0);
	if (n > 0) {
		x->n->pools++;
		if (x->n->held_pages)
			mark_holders(x);
	}
	free(x->held);
	x->held = NULL;
	return n;
}

int purge_session(struct cache *c, struct session *s, struct forget *f, int dry_run,
		  struct tier_park *pk, uint32_t *ret_kept, struct purge_counts *counts)
{
	struct pool *p = s->pool;
	struct idmap chosen = {0};
	struct ctx x = {.c = c, .p = p, .f = f, .n = counts, .pk = pk, .chosen = &chosen};
	uint32_t kept = 0;
	int ret = 0;

	for (uint32_t i = 0; i < s->n_hashes && i < s->n_pages; i++) {
		uint32_t slot = s->pages[i];
		struct pindex_entry *e = prefix_index_of_slot(&p->ix, slot);

		if (!e || !XXH128_isEqual(e->hash, s->hashes[i]))
			continue; /* not indexed: nothing to forget */
		/* The index's reference and ours: nobody else has it. */
		if (p->pa.refs[slot] == 2 && p->pa.pins[slot] == 0) {
			if (idmap_put(&chosen, e->hash.low64 | 1, e) < 0) {
				ret = -ENOMEM;
				goto out;
			}
		} else {
			kept++;
		}
	}
	*ret_kept = kept;
	if (chosen.n)
		ret = forget_in_pool(&x, pick_chosen, dry_run);
out:
	idmap_fini(&chosen);
	return ret;
}

/* The CLOCK_MONOTONIC time before which a page was last used when it was
 * not used since the wall-clock time since_s. */
static uint64_t unused_before(uint64_t since_s)
{
	struct timespec wall;
	uint64_t now = prefix_index_now_ns(), wall_ns, age;

	clock_gettime(CLOCK_REALTIME, &wall);
	wall_ns = (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec;
	if (since_s > UINT64_MAX / 1000000000ull || since_s * 1000000000ull >= wall_ns)
		return UINT64_MAX; /* a time to come: nothing was used since */
	age = wall_ns - since_s * 1000000000ull;
	/* Before this start: only pages unused since the start (0). */
	return age >= now ? 1 : now - age;
}

static int pool_chosen(const struct pool *p, const Kvpalace__V1__PurgeRequest *in)
{
	return (!in->has_pool_id || p->id == in->pool_id) &&
	       (!in->has_uid || (uint32_t)p->uid == in->uid) &&
	       (!in->model_id || !strcmp(p->model_id, in->model_id));
}

int purge_run(struct cache *c, struct peer *conn, uint64_t req_id,
	      const Kvpalace__V1__PurgeRequest *in, struct reply *r, struct tier_park *pk,
	      const char **why)
{
	Kvpalace__V1__PurgeResponse *out = &r->u.purge;
	struct purge_counts n = {0};
	struct ctx x = {
		.c = c,
		.n = &n,
		.pk = pk,
		.has_salt = in->has_cache_salt,
		.has_age = in->has_unused_since_unix_s,
	};
	struct forget *f;
	int ret;

	if (in->has_pool_id && !pool_get(c, in->pool_id, 0, 1)) {
		*why = "no such pool";
		return -ENOENT;
	}
	if (x.has_age)
		x.unused_before_ns = unused_before(in->unused_since_unix_s);
	f = forget_new();
	if (!f) {
		*why = "out of memory";
		return -ENOMEM;
	}
	x.f = f;
	/* Two passes: every pool is checked before any changes, so a purge
	 * that must wait for disk I/O leaves everything as it was. */
	for (int dry = 1; dry >= 0; dry--) {
		for (struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
			x.p = list_entry(it, struct pool, link);
			if (!pool_chosen(x.p, in))
				continue;
			if (x.has_salt)
				x.root = prefix_index_root_keyed(
					x.p->model_id, &x.p->layout, in->cache_salt.data,
					in->cache_salt.len,
					in->has_extra_key ? in->extra_key.data : NULL,
					in->has_extra_key ? in->extra_key.len : 0);
			ret = forget_in_pool(&x, pick_purge, dry);
			if (ret == -EBUSY && dry) {
				forget_free(f);
				if (!pk->no_park)
					return -EAGAIN; /* pk->park_on is set */
				pk->park_on = NULL;
				*why = "a pool's disk I/O is still in flight: try again";
				return -EBUSY;
			}
			if (ret == -ENOMEM && dry) {
				forget_free(f);
				*why = "out of memory";
				return -ENOMEM;
			}
			if (ret == -ENOMEM) /* after some pools changed: say so */
				log_ctx_err(
					LOG_CTX(.pool_id = x.p->id, .uid = conn->uid, .has_uid = 1,
						.pid = conn->pid),
					"purge (pid %d uid %u): out of memory in pool %llu; its "
					"pages stay",
					(int)conn->pid, (unsigned)conn->uid,
					(unsigned long long)x.p->id);
		}
		/* The dry pass counted into n: start over for real. */
		if (dry)
			n = (struct purge_counts){0};
	}
	c->ctr.purges++;
	c->ctr.purged_pages += n.pages;
	log_ctx_notice(
		LOG_CLIENT(conn->uid, conn->pid),
		"admin (pid %d uid %u): purged %llu page%s from %u pool%s (%llu in host, %llu "
		"on disk, %llu on the GPU; %llu still held by sessions or leases)",
		(int)conn->pid, (unsigned)conn->uid, (unsigned long long)n.pages, log_s(n.pages),
		n.pools, log_s(n.pools), (unsigned long long)n.host_pages,
		(unsigned long long)n.disk_pages, (unsigned long long)n.device_pages,
		(unsigned long long)n.held_pages);
	kvpalace__v1__purge_response__init(out);
	out->pages = n.pages;
	out->pools = n.pools;
	out->host_pages = n.host_pages;
	out->disk_pages = n.disk_pages;
	out->device_pages = n.device_pages;
	out->held_pages = n.held_pages;
	out->sessions_marked = n.sessions_marked;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_PURGE;
	r->resp.purge = out;
	ret = forget_finish(f, c, conn, req_id, r);
	if (ret == -EIO)
		*why = "forgotten in memory, but invalidating the disk headers failed: a restart "
		       "may find those pages again";
	return ret;
}
