/* daemon/core/tier.c — the host tier's watermarks and the movement of index
 * pages host ⇄ disk, as one subsystem (see tier.h).
 *
 * Writes to the spill file (tier_spill, tier_flush), the host-tier
 * watermarks and tenant shares that decide what leaves and when
 * (tier_make_room, once daemon/core/evict.c: it and tier_spill called each
 * other), reads back (tier_promote) and the warm restart from the spill
 * file. Calls nothing of the core above it; completions come back from
 * daemon/io/aio.h through the aio_req.done pointers stored here, and
 * parked requests are woken through tier_waiter.wake. Event-loop thread
 * only, but for tier_page_unquantize and the run() of the warm restart's
 * scan jobs and of a read's check (daemon/io/worker.h), which touch only
 * their job, the page the read holds and the spill file's descriptor.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio.h"
#include "guard.h"
#include "kernels.h"
#include "list.h"
#include "log.h"
#include "pool.h"
#include "spill.h"
#include "tier.h"
#include "worker.h"

/* After this many I/O errors in a row a pool stops spilling (reads of what
 * is on disk still go on, and fail into misses). */
#define TIER_MAX_ERRORS_IN_ROW 8
/* A spill batch hands its writes to the kernel each time this many bytes
 * are started (aio_push), so the disk starts on the first pages while the
 * loop checksums the rest, and small pages do not cost a system call
 * each. */
#define TIER_PUSH_BYTES (512u << 10)

struct tier_io {
	struct aio_req data;
	struct aio_req meta;
	struct cache *c;
	struct pool *p;
	struct pindex_entry *e;
	uint32_t slot, extent;
	uint64_t sum;
	uint64_t len;	/* bytes moved: the page, or its quantized form */
	uint32_t dtype; /* that form: 0 the pool's own */
	void *bounce;	/* a quantized page on its way to disk */
	int pending;	/* requests not yet completed */
	int holds_slot; /* the data request holds a reference on slot */
	int verify_ret; /* a read's check on a worker: guard_run's result */
	struct worker_job verify;
	struct list link; /* pool.ios */
	unsigned char hdr[SPILL_PAGE_HDR];
};

static void *page_addr(const struct pool *p, uint32_t slot)
{
	return (char *)p->arena + (uint64_t)slot * p->page_bytes;
}

void tier_wait(struct pool *p, struct tier_waiter *w)
{
	list_del(&w->link);
	list_add_tail(&p->waiters, &w->link);
}

void tier_unwait(struct tier_waiter *w)
{
	list_del(&w->link);
}

void tier_wake_all(struct pool *p)
{
	struct list woken, *it;

	/* Move them off first: a woken request may park again. */
	list_init(&woken);
	if (list_empty(&p->waiters))
		return;
	woken.next = p->waiters.next;
	woken.prev = p->waiters.prev;
	woken.next->prev = &woken;
	woken.prev->next = &woken;
	list_init(&p->waiters);
	/* While they run the pool must stay (tier_pool_waking): a woken
	 * connection may run a DropPool queued behind its request, which
	 * would see no waiter left and free the pool under the ones not woken
	 * yet (prewarm's is inside it, an eviction's points into it). */
	p->waking++;
	while ((it = woken.next) != &woken) {
		struct tier_waiter *w = list_entry(it, struct tier_waiter, link);

		list_del(it);
		w->wake(w);
	}
	p->waking--;
}

int tier_check(const struct pool *p, uint32_t *refs)
{
	uint32_t n = 0, reads = 0, writes = 0;

	for (const struct list *it = p->ios.next; it != &p->ios; it = it->next) {
		const struct tier_io *io = list_entry(it, struct tier_io, link);

		n++;
		if (io->holds_slot) {
			if (io->slot >= p->pa.n_pages || !p->spill || io->extent >= p->spill->hwm)
				return -EUCLEAN;
			refs[io->slot]++;
			reads += io->e->io == PINDEX_IO_READ;
			writes += io->e->io == PINDEX_IO_WRITE;
		}
	}
	if (n != p->io_inflight || reads != p->reads_inflight || writes != p->writes_inflight)
		return -EUCLEAN;
	return 0;
}

int tier_pool_busy(const struct pool *p)
{
	/* Remote puts and fetches too: their completions touch the pool;
	 * and waiters being woken (tier_wake_all), off the list for now. */
	return p->io_inflight != 0 || p->scan || p->preallocating || rtier_pool_busy(&p->rt) ||
	       p->waking;
}

static void io_done(struct tier_io *io)
{
	struct pool *p = io->p;

	if (--io->pending)
		return;
	p->io_inflight--;
	list_del(&io->link);
	free(io->bounce);
	free(io);
}

/* The layout p's pages have on disk when stored as dtype. */
static int stored_layout(const struct pool *p, uint32_t dtype, struct shm_layout *ret)
{
	return shm_layout_quantized(&p->layout, dtype, ret);
}

/* Bytes of a page of p stored as dtype (0: as it is). */
static uint64_t stored_bytes(const struct pool *p, uint32_t dtype)
{
	struct shm_layout l;

	return dtype && stored_layout(p, dtype, &l) == 0 ? shm_page_bytes(&l) : p->page_bytes;
}

int tier_page_unquantize(const struct shm_layout *l, void *page, const struct shm_layout *stored)
{
	uint64_t len = shm_page_bytes(stored),
		 used = shm_page_data_bytes(l) + shm_page_scale_bytes(l);
	void *q = malloc(len);
	int ret;

	if (!q)
		return -ENOMEM;
	memcpy(q, page, len);
	ret = kref_convert_pages(l, &page, stored, (const void *const *)&q, 1, 0, l->block_tokens);
	/* The padding as a page written here has it. */
	if (ret == 0)
		memset((char *)page + used, 0, shm_page_bytes(l) - used);
	free(q);
	return ret;
}

static void io_error(struct pool *p, int res, const char *what)
{
	p->tier.io_errors++;
	if (++p->disk_errors_in_row == TIER_MAX_ERRORS_IN_ROW)
		log_ctx_err(LOG_POOL_UID(p->id, p->uid),
			    "pool %llu: %d disk errors in a row (last: %s %s); no more spilling",
			    (unsigned long long)p->id, TIER_MAX_ERRORS_IN_ROW, what,
			    strerror(-res));
}

static void on_meta_written(struct aio_req *r, int res)
{
	struct tier_io *io = container_of(r, struct tier_io, meta);

	/* A success ends a run of errors here as well as for data: the
	 * header writes of a batch complete together, and counting only
	 * their failures would stop a pool's spilling on scattered errors. */
	struct pool *p = io->p;

	if (res < 0)
		io_error(p, res, "header write");
	else
		p->disk_errors_in_row = 0;
	io_done(io);
	/* An admin's purge waits for the pool's header writes too (one that
	 * landed after its invalidation would bring a page back): tell the
	 * waiters when the last one is done. */
	if (p->io_inflight == 0)
		tier_wake_all(p);
}

static void on_written(struct aio_req *r, int res)
{
	struct tier_io *io = container_of(r, struct tier_io, data);
	struct pool *p = io->p;
	struct pindex_entry *e = io->e;
	int gone = 0;

	p->writes_inflight--;
	if (res == (int)io->len) {
		struct spill_page_hdr h = {
			.hash = e->hash,
			/* A first page names its chain root (salt included), so
			 * a purge by salt knows it after a restart too. */
			.parent = e->parent ? e->parent->hash : e->root,
			.sum = io->sum,
			.flags = e->parent ? 0 : SPILL_PAGE_FIRST,
			.dtype = io->dtype,
			.stored_bytes = (uint32_t)io->len,
			.used = e->used,
		};

		p->disk_errors_in_row = 0;
		e->extent = io->extent;
		e->disk_sum = io->sum;
		e->disk_dtype = (uint8_t)io->dtype;
		e->disk_used = e->used;
		p->ix.n_disk++;
		p->tier.spilled++;
		p->tier.written_bytes += io->len + SPILL_PAGE_HDR;
		p->tier.quantized += io->dtype != 0;
		/* The header goes after the data: a crash between the two
		 * leaves an old header whose sum fails, never a new header
		 * over old data that verifies. */
		spill_hdr_encode(p->spill, &h, io->hdr);
		io->meta = (struct aio_req){
			.op = AIO_WRITE,
			.file = p->spill_meta,
			.buf = io->hdr,
			.len = SPILL_PAGE_HDR,
			.off = spill_hdr_off(io->extent),
			.done = on_meta_written,
		};
		io->pending++;
		aio_submit(io->c->aio, &io->meta);
	} else {
		if (res == -ENOSPC || res == -EFBIG)
			spill_full(p->spill, io->extent);
		else
			io_error(p, res, "page write");
		spill_free(p->spill, io->extent);
	}
	/* The write's own reference. A page written to leave the host tier
	 * leaves now unless a match leased it meanwhile (its host copy was
	 * served while in flight: the lease's pin keeps the slot). */
	io->holds_slot = 0;
	pagealloc_unref(&p->pa, io->slot);
	if (e->leaving) {
		gone = e->extent != PINDEX_NONE && p->pa.refs[io->slot] == 1 &&
		       p->pa.pins[io->slot] == 0;
		if (gone)
			prefix_index_detach_host(&p->ix, &p->pa, e);
		prefix_index_set_leaving(&p->ix, &p->pa, e, 0);
	}
	e->io = PINDEX_IO_NONE;
	if (gone)
		prefix_index_reconsider(&p->ix, &p->pa, e); /* the newest on disk */
	else
		/* Back at the cold end: a page that was to leave and could not
		 * (its write failed, or a lease holds it now) is still the
		 * next when nothing holds it; a page written at a stop
		 * (tier_flush) goes nowhere anyway. */
		prefix_index_reconsider_cold(&p->ix, &p->pa, e);
	io_done(io);
	/* Waiters retry once the batch of writes is out, or as pages leave:
	 * a writer parked for room goes on filling pages while the rest of
	 * the batch is still on its way to disk. */
	if (p->writes_inflight == 0 || gone)
		tier_wake_all(p);
}

/* Frees an extent by dropping the least recently used disk-only leaf. */
static int drop_one_disk_page(struct pool *p)
{
	struct pindex_entry *e;
	uint32_t extent;

	if (list_empty(&p->ix.disk_lru))
		return -ENOSPC;
	e = list_entry(p->ix.disk_lru.next, struct pindex_entry, lru_link);
	prefix_index_drop(&p->ix, &p->pa, e, &extent);
	if (extent != PINDEX_NONE)
		spill_free(p->spill, extent);
	p->tier.dropped++;
	return 0;
}

/* What start_write reads of a host page, under the guard (guard.h): the
 * clients' arena may have lost the memory. */
struct prepare {
	const struct shm_layout *ql, *layout; /* ql: the spill-dtype layout, or NULL */
	void *bounce;
	const void *src;
	size_t len;
	uint64_t sum;
};

static int prepare_page(void *arg)
{
	struct prepare *w = arg;

	if (w->ql) {
		memset(w->bounce, 0, w->len);
		kvp_assert(kref_convert_pages(w->ql, &w->bounce, w->layout, &w->src, 1, 0,
					      w->layout->block_tokens) == 0);
	}
	/* Checksummed as written: a client scribbling on an indexed page
	 * during the write only makes its disk copy fail verification. */
	w->sum = XXH3_64bits(w->ql ? w->bounce : w->src, w->len);
	return 0;
}

static int sum_page(void *arg)
{
	struct prepare *w = arg;

	w->sum = XXH3_64bits(w->src, w->len);
	return 0;
}

/* Whether p may take one more extent of disk: 0, or -EDQUOT when its
 * tenant's pools hold disk-tenant-size, -ENOSPC when all pools hold
 * disk-tier-size or a file that must grow would take the cache file
 * system's free space below disk-reserve. A tenant at its share takes
 * nothing from another: start_write then drops its own coldest disk
 * page. O(pools). */
static int disk_room(struct cache *c, const struct pool *p)
{
	const struct config *cfg = c->cfg;
	uint64_t pb = p->page_bytes, tenant = 0, all = 0;
	const struct list *it;

	if (!p->spill->n_free && !spill_preallocated(p->spill, p->spill->hwm) &&
	    c->disk_avail_bytes != UINT64_MAX) {
		/* A new extent grows the file. */
		if (c->disk_avail_bytes < cfg->disk_reserve_bytes + pb)
			return -ENOSPC;
	}
	for (it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *q = list_entry(it, struct pool, link);
		uint64_t used;

		if (!q->spill)
			continue;
		used = (uint64_t)q->spill->n_used * q->page_bytes;
		all += used;
		if (q->uid == p->uid)
			tenant += used;
	}
	if (cfg->disk_tenant_bytes && tenant + pb > cfg->disk_tenant_bytes)
		return -EDQUOT;
	if (cfg->disk_tier_bytes && all + pb > cfg->disk_tier_bytes)
		return -ENOSPC;
	return 0;
}

/* The pool of p's tenant whose spill file holds the most pages (p when
 * none holds more): where a tenant at its share makes room. */
static struct pool *largest_of_tenant(struct cache *c, struct pool *p)
{
	struct pool *best = p;
	struct list *it;

	for (it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		struct pool *q = list_entry(it, struct pool, link);

		if (q->uid == p->uid && q->spill && q->spill->n_used > best->spill->n_used &&
		    !list_empty(&q->ix.disk_lru))
			best = q;
	}
	return best;
}

/* The spill file's blocks allocated ahead of the extents handed out
 * (daemon/store/spill.h), on a worker: fallocate waits for the pool's
 * O_DIRECT transfers in flight. One job a pool at a time; the pool counts
 * as busy meanwhile (tier_pool_busy). */
struct tier_prealloc {
	struct worker_job job;
	struct cache *c;
	struct pool *p;
	uint32_t from, n;
	int ret;
};

/* Counts b more bytes of the cache file system as used (until the next
 * statvfs), or gives them back (b negative). */
static void disk_charge(struct cache *c, int64_t b)
{
	if (c->disk_avail_bytes == UINT64_MAX)
		return;
	if (b >= 0)
		c->disk_avail_bytes -=
			c->disk_avail_bytes > (uint64_t)b ? (uint64_t)b : c->disk_avail_bytes;
	else
		c->disk_avail_bytes += (uint64_t)-b;
}

/* An allocation ahead ended: on failure the space of the extents not
 * handed out meanwhile goes back (those handed out grew the file as they
 * were written, uncounted there: spill_preallocated said they were). */
static void prealloc_end(struct cache *c, struct pool *p, uint32_t from, uint32_t n, int ret)
{
	uint32_t hwm = p->spill->hwm, left_from = hwm > from ? hwm : from;

	spill_prealloc_done(p->spill, from, n, ret);
	if (ret < 0 && from + n > left_from)
		disk_charge(c, -(int64_t)((uint64_t)(from + n - left_from) * p->page_bytes));
}

static void prealloc_run(struct worker_job *j)
{
	struct tier_prealloc *t = container_of(j, struct tier_prealloc, job);

	t->ret = spill_prealloc_run(t->p->spill, t->from, t->n);
}

static void prealloc_done(struct worker_job *j)
{
	struct tier_prealloc *t = container_of(j, struct tier_prealloc, job);
	struct cache *c = t->c;
	struct pool *p = t->p;

	prealloc_end(c, p, t->from, t->n, t->ret);
	p->preallocating = 0;
	free(t);
}

/* Allocates p's spill file ahead when it is due for want new extents,
 * never into the free space disk-reserve keeps (writes then allocate as
 * they go): here when nothing is in flight on the file (fallocate then
 * waits for nothing: well under a millisecond for 32 MiB here), else on
 * a worker (it waits for every O_DIRECT transfer on the file, 7-14 ms in
 * a spill burst here, which the loop must not). A burst of writes calls
 * it first with what it will write (tier_spill), so its extents are
 * allocated before the first write goes out; every write then keeps the
 * file ahead of a steady stream. */
static void prealloc_maybe(struct cache *c, struct pool *p, uint32_t want)
{
	struct tier_prealloc *t;
	uint32_t from, n;

	if (p->preallocating || c->stopping || !spill_prealloc_due(p->spill, want, &from, &n))
		return;
	if (c->disk_avail_bytes != UINT64_MAX) {
		uint64_t room = c->disk_avail_bytes > c->cfg->disk_reserve_bytes
					? c->disk_avail_bytes - c->cfg->disk_reserve_bytes
					: 0;

		if (room / p->page_bytes < n)
			n = (uint32_t)(room / p->page_bytes);
		if (!n)
			return;
	}
	/* Nothing holds the file's inode: no transfer in flight, no purge
	 * writing its headers, no restart scan reading them. */
	if (!p->io_inflight && !p->n_forgets && !p->scan) {
		disk_charge(c, (int64_t)((uint64_t)n * p->page_bytes));
		spill_prealloc_start(p->spill, from, n);
		prealloc_end(c, p, from, n, spill_prealloc_run(p->spill, from, n));
		return;
	}
	if (!c->worker || !c->worker->loop)
		return;
	t = calloc(1, sizeof(*t));
	if (!t)
		return; /* the writes allocate as they go */
	*t = (struct tier_prealloc){.job = {.run = prealloc_run, .done = prealloc_done},
				    .c = c,
				    .p = p,
				    .from = from,
				    .n = n};
	/* Counted now, so the other pools' allocations and writes see it. */
	disk_charge(c, (int64_t)((uint64_t)n * p->page_bytes));
	spill_prealloc_start(p->spill, from, n);
	p->preallocating = 1;
	worker_submit(c->worker, &t->job);
}

/* Starts writing e's host copy to a free extent; leaving: the host copy
 * goes once written (else it stays, clean). Returns 0, -ENOSPC (no extent
 * to be had) or -ENOMEM. */
static int start_write(struct cache *c, struct pool *p, struct pindex_entry *e, int leaving)
{
	struct tier_io *io;
	uint32_t extent;
	int ret;

	/* A share used up makes room in the disk pages of this tenant's
	 * pool that holds the most, never another tenant's. */
	while (disk_room(c, p) < 0)
		if (drop_one_disk_page(largest_of_tenant(c, p)) < 0) {
			p->tier.refused++;
			return -ENOSPC;
		}
	while ((ret = spill_alloc(p->spill, &extent)) == -ENOSPC)
		if (drop_one_disk_page(p) < 0)
			return -ENOSPC;
	if (ret < 0)
		return -ENOSPC; /* a scan runs: no classified or fresh extent is free */
	if (extent >= p->spill->hwm - 1 && !spill_preallocated(p->spill, extent) &&
	    c->disk_avail_bytes != UINT64_MAX)
		/* Grown (not into blocks allocated ahead, counted when they
		 * were): counted until the next statvfs. */
		c->disk_avail_bytes -=
			c->disk_avail_bytes > p->page_bytes ? p->page_bytes : c->disk_avail_bytes;
	io = calloc(1, sizeof(*io));
	if (!io) {
		spill_free(p->spill, extent);
		return -ENOMEM;
	}
	io->c = c;
	io->p = p;
	io->e = e;
	io->slot = e->slot;
	io->extent = extent;
	io->pending = 1;
	io->len = p->page_bytes;
	/* Mixed precision: cold pages go down in spill-dtype, converted by
	 * the kernels; pages of permanent spans, the important ones, keep
	 * their own format. */
	{
		struct shm_layout ql;
		struct prepare w = {
			.layout = &p->layout, .src = page_addr(p, e->slot), .len = p->page_bytes};

		if (p->spill_dtype && !e->permanent) {
			kvp_assert(stored_layout(p, p->spill_dtype, &ql) == 0);
			io->len = shm_page_bytes(&ql);
			if (posix_memalign(&io->bounce, 4096, io->len) == 0) {
				io->dtype = p->spill_dtype;
				w.ql = &ql;
				w.bounce = io->bounce;
				w.len = io->len;
			} else {
				io->bounce = NULL; /* no memory: written as it is */
				io->len = p->page_bytes;
			}
		}
		ret = guard_run(prepare_page, &w);
		if (ret < 0) {
			/* The page's memory is gone from the arena: nothing to
			 * write. */
			free(io->bounce);
			free(io);
			spill_free(p->spill, extent);
			return ret;
		}
		io->sum = w.sum;
	}
	pagealloc_ref(&p->pa, e->slot);
	io->holds_slot = 1;
	list_add_tail(&p->ios, &io->link);
	e->io = PINDEX_IO_WRITE;
	prefix_index_reconsider(&p->ix, &p->pa, e);
	if (leaving)
		prefix_index_set_leaving(&p->ix, &p->pa, e, 1);
	io->data = (struct aio_req){
		.op = AIO_WRITE,
		.file = p->spill_data,
		.buf = io->bounce ? io->bounce : page_addr(p, e->slot),
		.len = io->len,
		.off = spill_data_off(p->spill, extent),
		.done = on_written,
	};
	p->io_inflight++;
	p->writes_inflight++;
	aio_submit(c->aio, &io->data);
	prealloc_maybe(c, p, 0);
	return 0;
}

/* A host copy without a disk copy and no write in flight. */
static int unwritten(const struct pindex_entry *e)
{
	return e->slot != PINDEX_NONE && e->extent == PINDEX_NONE && e->io == PINDEX_IO_NONE;
}

/* Starts writing e after its ancestors that have a host copy but no disk
 * copy, from the top, so a stop killed half way leaves whole prefixes on
 * disk. Everything stays in the host tier. Returns as start_write. */
static int write_chain(struct cache *c, struct pool *p, struct pindex_entry *e)
{
	struct pindex_entry *a, **up = NULL;
	size_t n = 0, i;
	int ret = 0;

	for (a = e->parent; a && a->slot != PINDEX_NONE && a->extent == PINDEX_NONE; a = a->parent)
		n++;
	if (n && !(up = malloc(n * sizeof(*up))))
		return -ENOMEM;
	for (i = 0, a = e->parent; i < n; i++, a = a->parent)
		up[i] = a;
	for (i = n; ret == 0 && i-- > 0;)
		if (unwritten(up[i]))
			ret = start_write(c, p, up[i], 0);
	free(up);
	return ret < 0 ? ret : start_write(c, p, e, 0);
}

uint32_t tier_spill(struct cache *c, struct pool *p, uint32_t want_free)
{
	struct prefix_index *ix = &p->ix;
	uint64_t started = 0; /* bytes since the last push */
	int may_write;

	if (!p->spill)
		return 0;
	may_write = p->disk_errors_in_row < TIER_MAX_ERRORS_IN_ROW;
	/* The victims of eviction, in its order (prefix_index.h: leaves
	 * first, least recently used first, permanent ones last; a parent
	 * whose last child is leaving is next), until the free pages and
	 * those leaving reach want_free, the low mark: a page with a disk
	 * copy leaves at once, one without is written and leaves once
	 * written. Only the victims are written: what stays in the host tier
	 * needs no disk copy, and a child written while its parent stays is
	 * still whole after a clean stop (tier_flush writes the parent) and a
	 * miss after a crash (the start-up scan frees a page whose parent is
	 * not on disk), never a wrong page. */
	prefix_index_leaving_batch(ix, 1); /* the remote tier hears of them in one batch */
	if (may_write && p->pa.n_free + ix->n_leaving < want_free)
		prealloc_maybe(c, p, want_free - p->pa.n_free - ix->n_leaving);
	while (p->pa.n_free + ix->n_leaving < want_free) {
		struct pindex_entry *e = prefix_index_host_next(ix, NULL);

		if (!e)
			break;
		if (e->extent != PINDEX_NONE) {
			prefix_index_detach_host(ix, &p->pa, e);
			continue;
		}
		if (c->cfg->disk_admission == CONFIG_DISK_ADMIT_REUSED && !e->permanent &&
		    !e->n_children && !prefix_index_reused(e)) {
			uint32_t extent;

			/* Not admitted: no request but its writer used it, so
			 * it is likelier never read again than worth a write. */
			prefix_index_drop(ix, &p->pa, e, &extent);
			p->tier.unadmitted++;
			continue;
		}
		if (!may_write || start_write(c, p, e, 1) < 0)
			break;
		if ((started += p->page_bytes) >= TIER_PUSH_BYTES) {
			aio_push(c->aio);
			started = 0;
		}
	}
	prefix_index_leaving_batch(ix, 0);
	return ix->n_leaving;
}

uint32_t tier_flush(struct cache *c, struct pool *p)
{
	uint32_t before = p->writes_inflight;

	if (!p->spill)
		return 0;
	/* A scan still running ends at its next step: what it has not read
	 * stays for the next start. */
	tier_pool_stop_scan(p);
	/* Every page only the index holds, each after its ancestors; they
	 * stay in the host tier (the daemon is stopping). */
	for (uint32_t slot = 0; slot < p->pa.n_pages; slot++) {
		struct pindex_entry *e = prefix_index_of_slot(&p->ix, slot);

		if (e && e->idle && unwritten(e) && write_chain(c, p, e) < 0)
			break;
	}
	return p->writes_inflight - before;
}

/* ---- host-tier watermarks ------------------------------------------------ */

/* One victim order for every way of leaving the host tier: the prefix
 * index's host list (leaves first, least recently used first, permanent
 * pages last). Without a disk tier the victims are dropped here; with one
 * tier_spill takes the same victims, those with a disk copy at once and
 * the others once written, and stops at the same count. */

uint32_t tier_mark_pages(double fraction, uint32_t n_pages)
{
	/* In millionths, exactly: fraction · n_pages in binary floating
	 * point falls just short of an integer for some marks (0.57 · 100 is
	 * 56.999...), which truncated would start eviction a page early. */
	uint64_t ppm = fraction > 0 ? (uint64_t)(fraction * 1e6 + 0.5) : 0;

	if (ppm > 1000000)
		ppm = 1000000;
	return (uint32_t)(ppm * n_pages / 1000000);
}

/* Host bytes held (pages not free) by every pool, by uid's pools, and the
 * tenants holding any. O(pools). */
struct held {
	uint64_t all, mine;
	uint32_t n_tenants;
};

#define HELD_MAX_UIDS 64

static uint64_t pool_held(const struct pool *q)
{
	return (uint64_t)(q->pa.n_pages - q->pa.n_free) * q->page_bytes;
}

static void count_held(const struct cache *c, uid_t uid, struct held *h)
{
	uid_t seen[HELD_MAX_UIDS];
	uint32_t n_seen = 0, extra = 0;

	*h = (struct held){0};
	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *q = list_entry(it, struct pool, link);
		uint64_t b = pool_held(q);
		uint32_t i;

		if (!b)
			continue;
		h->all += b;
		if (q->uid == uid)
			h->mine += b;
		for (i = 0; i < n_seen && seen[i] != q->uid; i++)
			;
		if (i == n_seen) {
			if (n_seen < HELD_MAX_UIDS)
				seen[n_seen++] = q->uid;
			else
				extra++; /* counted per pool past 64 tenants: shares only shrink */
		}
	}
	h->n_tenants = n_seen + extra;
}

static uint64_t tenant_held(const struct cache *c, uid_t uid)
{
	uint64_t b = 0;

	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *q = list_entry(it, struct pool, link);

		if (q->uid == uid)
			b += pool_held(q);
	}
	return b;
}

int tier_lease_room(const struct cache *c, uid_t uid)
{
	const struct cache_tenant *t = idmap_get(&c->tenants, (uint64_t)uid + 1);
	struct held h;

	if (!t || t->leased_bytes < c->cfg->host_tier_bytes / (HELD_MAX_UIDS + 1))
		return 1; /* below any share: no need to count */
	count_held(c, uid, &h);
	return t->leased_bytes < c->cfg->host_tier_bytes / (h.n_tenants + (h.mine == 0) + 1);
}

/* Frees up to want bytes of cached pages (only the index holds them) in
 * the pools of tenants holding more than fair, never uid's. They are
 * dropped, not spilled: the tenant over its share gives way at once to
 * one under it. Returns the bytes freed. */
static uint64_t reclaim_others(struct cache *c, uid_t uid, uint64_t want, uint64_t fair)
{
	uint64_t got = 0;

	for (struct list *it = c->pool_list.next; it != &c->pool_list && got < want;
	     it = it->next) {
		struct pool *q = list_entry(it, struct pool, link);
		uint64_t over, k, before;

		if (q->uid == uid || !q->ix.n_idle)
			continue;
		over = tenant_held(c, q->uid);
		if (over <= fair)
			continue;
		over -= fair;
		k = (want - got < over ? want - got : over) / q->page_bytes + 1;
		if (k > q->ix.n_idle - q->ix.n_idle_busy)
			k = q->ix.n_idle - q->ix.n_idle_busy;
		before = q->pa.n_free;
		prefix_index_evict(&q->ix, &q->pa, q->pa.n_free + (uint32_t)k, 1);
		got += (uint64_t)(q->pa.n_free - before) * q->page_bytes;
	}
	return got;
}

/* Pages p must give up besides those it takes, so that the host tier's
 * held pages stay within host-tier-size and uid's within
 * host-tenant-size: a tenant under its fair share (the tier over the
 * tenants holding pages) first takes room from tenants over theirs; one
 * at or over its share makes room in its own pool. */
static uint32_t share_extra(struct cache *c, struct pool *p, uint32_t need)
{
	const struct config *cfg = c->cfg;
	uint64_t pb = p->page_bytes, add = (uint64_t)need * pb, over = 0, cap;
	struct held h;

	/* Off the Append path while no share can be passed: every arena
	 * together fits the tier and no tenant cap is set. */
	if (c->host_bytes <= cfg->host_tier_bytes && !cfg->host_tenant_bytes)
		return 0;
	count_held(c, p->uid, &h);
	if (h.all + add > cfg->host_tier_bytes) {
		uint64_t fair = cfg->host_tier_bytes / (h.n_tenants + (h.mine == 0));

		over = h.all + add - cfg->host_tier_bytes;
		if (h.mine + add <= fair) {
			uint64_t got = reclaim_others(c, p->uid, over, fair);

			over = got < over ? over - got : 0;
		}
	}
	cap = cfg->host_tenant_bytes;
	if (cap && h.mine + add > cap && h.mine + add - cap > over)
		over = h.mine + add - cap;
	return (uint32_t)((over + pb - 1) / pb);
}

int tier_make_room(struct cache *c, struct pool *p, uint32_t need, struct tier_park *pk)
{
	struct pagealloc *pa = &p->pa;
	uint64_t high = tier_mark_pages(c->cfg->host_high_watermark, pa->n_pages);
	uint64_t low = tier_mark_pages(c->cfg->host_low_watermark, pa->n_pages);
	uint64_t used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	uint64_t want, freeable;
	uint32_t extra;

	if (need > pa->n_pages)
		return -ENOSPC;
	/* The shares first: pages past them come out of this pool. */
	extra = share_extra(c, p, need);
	if (extra) {
		uint32_t k =
			need > pa->n_free && need - pa->n_free > extra ? need - pa->n_free : extra;
		uint32_t target = pa->n_free + k;

		freeable = p->ix.n_idle - (pk->no_park || !p->spill ? p->ix.n_idle_busy : 0);
		if (freeable < k)
			return -ENOSPC;
		if (p->spill && tier_spill(c, p, target) && pa->n_free < target && !pk->no_park) {
			pk->park_on = p;
			return -EAGAIN;
		}
		if (pa->n_free < target)
			prefix_index_evict(&p->ix, pa, target, 1);
		if (pa->n_free < target)
			return -ENOSPC;
		used_after = (uint64_t)(pa->n_pages - pa->n_free) + need;
	}
	if (used_after <= high && pa->n_free >= need)
		return 0;
	/* A request that cannot get its pages changes nothing: eviction
	 * frees at most the host copies only the index holds (those with a
	 * write in flight only once it is done, so not when this request
	 * cannot wait). Decided before anything goes (issue 13: a failed
	 * Append evicted an unrelated chain). */
	freeable = p->ix.n_idle - (pk->no_park || !p->spill ? p->ix.n_idle_busy : 0);
	if ((uint64_t)pa->n_free + freeable < need)
		return -ENOSPC;
	/* Down to the low mark, and at least enough for this request. */
	want = pa->n_pages - (low < pa->n_pages ? low : pa->n_pages);
	if (want < need)
		want = need;
	if (want > pa->n_pages)
		want = pa->n_pages;
	if (!p->spill) {
		prefix_index_evict(&p->ix, pa, (uint32_t)want, 1);
		return pa->n_free >= need ? 0 : -ENOSPC;
	}
	/* With a disk tier the same victims leave, those without a disk copy
	 * once written; a request that cannot wait for the writes drops
	 * leaves as without a disk tier. */
	if (tier_spill(c, p, (uint32_t)want) && pa->n_free < need && !pk->no_park) {
		pk->park_on = p;
		return -EAGAIN;
	}
	if (pa->n_free < need)
		prefix_index_evict(&p->ix, pa, need, 1);
	return pa->n_free >= need ? 0 : -ENOSPC;
}

/* ---- reads back ----------------------------------------------------------- */

/* The end of a read, checked or not (verify: guard_run's result, the sum
 * in io->sum): attaches the page, or drops its disk copy. */
static void read_finish(struct tier_io *io, int res, int verify)
{
	struct pool *p = io->p;
	struct pindex_entry *e = io->e;
	int ok = res == (int)io->len;

	e->io = PINDEX_IO_NONE;
	if (!ok && (res >= 0 || res == -ENODATA)) {
		/* Short, or end of file (daemon/io/aio.c): the file ends inside
		 * the extent (cut under the daemon). The page is gone, the
		 * disk is not failing: a miss, not an error that could turn
		 * spilling off. */
		if (p->tier.gone++ == 0)
			log_ctx_warn(LOG_POOL_UID(p->id, p->uid),
				     "pool %llu: %s ends inside extent %u (cut short?); pages past "
				     "its end are dropped",
				     (unsigned long long)p->id, p->spill->path, io->extent);
	} else if (!ok) {
		io_error(p, res, "page read");
	} else if (verify < 0 || io->sum != e->disk_sum) {
		/* Read back wrong, or into memory a client took away. */
		p->tier.verify_failures++;
		log_ctx_warn(LOG_POOL_UID(p->id, p->uid),
			     "pool %llu: page in extent %u of %s failed verification; dropped",
			     (unsigned long long)p->id, io->extent, p->spill->path);
		ok = 0;
	}
	if (ok) {
		p->tier.promoted++;
		p->tier.served_bytes += io->len;
		p->disk_errors_in_row = 0;
		prefix_index_attach_host(&p->ix, &p->pa, e, io->slot);
	} else {
		/* Any doubt is a miss: the entry loses its disk copy. */
		uint32_t extent;

		prefix_index_unset_prewarmed(&p->ix, e, 1); /* a read ahead that failed */
		spill_free(p->spill, e->extent);
		e->extent = PINDEX_NONE;
		p->ix.n_disk--;
		if (e->n_children == 0)
			prefix_index_drop(&p->ix, &p->pa, e, &extent);
		else
			prefix_index_reconsider(&p->ix, &p->pa, e);
	}
	io->holds_slot = 0;
	pagealloc_unref(&p->pa, io->slot); /* the read's own reference */
	if (ok)
		prefix_index_reconsider(&p->ix, &p->pa, e); /* only the index holds it now */
	io_done(io);
	if (--p->reads_inflight == 0)
		tier_wake_all(p);
}

/* The checksum of a page read in (XXH3 over its bytes) runs on a worker:
 * the first touch of memory the disk just wrote is the costly part (on
 * the project's VM 0.8-0.9 GB/s, against 17 GB/s for the same bytes
 * once touched), and on the loop it held every other client back. The
 * read keeps its slot reference, its entry stays marked as being read
 * and the pool busy until verify_done, as for a read still in flight. */
static void verify_run(struct worker_job *j)
{
	struct tier_io *io = container_of(j, struct tier_io, verify);
	struct prepare check = {.src = page_addr(io->p, io->slot), .len = io->len};

	io->verify_ret = guard_run(sum_page, &check);
	io->sum = check.sum;
}

static void verify_done(struct worker_job *j)
{
	struct tier_io *io = container_of(j, struct tier_io, verify);

	read_finish(io, (int)io->len, io->verify_ret);
}

static void on_read(struct aio_req *r, int res)
{
	struct tier_io *io = container_of(r, struct tier_io, data);
	struct worker *w = io->c->worker;

	if (res == (int)io->len && w && w->loop) {
		io->verify = (struct worker_job){.run = verify_run, .done = verify_done};
		worker_submit(w, &io->verify);
		return;
	}
	if (res == (int)io->len)
		verify_run(&io->verify);
	read_finish(io, res, io->verify_ret);
}

int tier_promote(struct cache *c, struct pool *p, struct pindex_entry *e, struct tier_park *pk)
{
	struct tier_io *io;
	uint32_t slot;
	int ret;

	if (e->slot != PINDEX_NONE && e->io != PINDEX_IO_READ)
		return 0;
	if (e->io == PINDEX_IO_READ)
		return 1;
	/* A lossy copy is not the page that was written: never brought
	 * back as if it were (a commit of the same tokens replaces it). */
	if (e->extent == PINDEX_NONE || !p->spill || e->disk_dtype != 0)
		return -ENOENT;
	/* Off the lists first: making room may drop disk-only leaves. */
	e->io = PINDEX_IO_READ;
	prefix_index_reconsider(&p->ix, &p->pa, e);
	ret = tier_make_room(c, p, 1, pk);
	io = ret < 0 ? NULL : calloc(1, sizeof(*io));
	if (!io) {
		e->io = PINDEX_IO_NONE;
		prefix_index_reconsider(&p->ix, &p->pa, e);
		return ret < 0 ? ret : -ENOSPC;
	}
	ret = pagealloc_get(&p->pa, &slot);
	kvp_assert(ret == 0); /* tier_make_room made room */
	io->c = c;
	io->p = p;
	io->e = e;
	io->slot = slot;
	io->extent = e->extent;
	io->pending = 1;
	io->holds_slot = 1;
	io->len = p->page_bytes;
	list_add_tail(&p->ios, &io->link);
	io->data = (struct aio_req){
		.op = AIO_READ,
		.file = p->spill_data,
		.buf = page_addr(p, slot),
		.len = io->len,
		.off = spill_data_off(p->spill, e->extent),
		/* A slot never used since open (or given back) is not
		 * resident: faulted in off the loop, not in its submission. */
		.populate = 1,
		.done = on_read,
	};
	p->io_inflight++;
	p->reads_inflight++;
	aio_submit(c->aio, &io->data);
	return 1;
}

/* ---- warm restart --------------------------------------------------------- */

/* The scan of a restart runs in steps (issue 17 item 6: 400k pages took
 * 0.4-1.5 s on the loop, and nobody was served meanwhile). Each step is a
 * worker job that reads and verifies SCAN_STEP headers and resolves
 * duplicates (spill_scanner_step); its done() lists what it found, on the
 * loop (1-2 ms for 1024 pages on the project's machine), after submitting
 * the next step, which the worker reads meanwhile. A page is matchable as soon as its step is listed and its
 * parent is: a child found before its parent waits in a map under its
 * parent's hash until the parent comes (the scan reads in extent order,
 * which is not write order once extents are reused), and a child whose
 * parent never comes is freed at the end. The spill file hands out only
 * extents the steps have classified (spill_scan_advance); the free stack
 * is rebuilt and the disk LRU put in last-use order at the end, the sort
 * on a worker and the reordering in steps on the loop. While the scan
 * runs the pool counts as busy (tier_pool_busy: no drop) and scanning
 * (tier_pool_scanning: a purge waits, since a page not found yet could
 * not be forgotten). A stop ends it at the next step (tier_flush) and
 * keeps what was not read for the next start. */
#define SCAN_STEP 1024u

struct scan_wait {
	struct spill_found f;
	uint32_t next; /* index + 1 of the next child of the same parent, 0: none */
	int waiting;   /* still in the map */
};

struct scan_lru {
	uint64_t used, seq;
	XXH128_hash_t hash;
};

struct tier_scan {
	struct worker_job job;
	struct cache *c;
	struct pool *p;
	struct spill_scanner sc; /* the worker's during run() */
	/* [2][SCAN_STEP]: the step in flight fills v[cur] while the loop
	 * lists the other (read ahead: the worker reads and verifies the next
	 * step while the loop lists this one). */
	struct spill_found *v[2];
	int cur;
	uint32_t n;
	int err;	      /* of the step */
	int stop;	      /* the daemon stops: end at the next done() */
	int phase;	      /* 0 reading, 1 sorting, 2 ordering, 3 freeing */
	struct idmap waiting; /* parent.low64 | 1 → index + 1 in wait */
	struct scan_wait *wait;
	uint32_t n_wait, cap_wait, n_waiting;
	struct scan_lru *lru; /* listed pages, for the order at the end */
	size_t n_lru, cap_lru, lru_at;
	uint32_t kept;	   /* short of memory: unlisted, extent kept */
	size_t table_want; /* entries the first step makes the index's table for */
	struct idmap_entry *table;
	size_t table_cap;
	uint32_t delay_ms; /* KVPALACED_DEBUG_SCAN_STEP_MS: a pause per step */
	uint32_t step;
};

int tier_pool_scanning(const struct pool *p)
{
	return p->scan != NULL;
}

static void lru_note(struct tier_scan *ts, const struct spill_found *f)
{
	if (ts->n_lru == ts->cap_lru) {
		size_t cap = ts->cap_lru ? 2 * ts->cap_lru : 1024;
		struct scan_lru *v = realloc(ts->lru, cap * sizeof(*v));

		if (!v)
			return; /* its place in the order is where it was listed */
		ts->lru = v;
		ts->cap_lru = cap;
	}
	ts->lru[ts->n_lru++] =
		(struct scan_lru){.used = f->h.used, .seq = f->h.seq, .hash = f->h.hash};
}

static int wait_for_parent(struct tier_scan *ts, const struct spill_found *f)
{
	uint64_t key = f->h.parent.low64 | 1;
	uintptr_t first = (uintptr_t)idmap_get(&ts->waiting, key);

	if (ts->n_wait == ts->cap_wait) {
		uint32_t cap = ts->cap_wait ? 2 * ts->cap_wait : 256;
		struct scan_wait *v = realloc(ts->wait, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ts->wait = v;
		ts->cap_wait = cap;
	}
	if (first)
		idmap_del(&ts->waiting, key);
	if (idmap_put(&ts->waiting, key, (void *)(uintptr_t)(ts->n_wait + 1)) < 0) {
		if (first)
			idmap_put(&ts->waiting, key, (void *)first); /* room was there */
		return -ENOMEM;
	}
	ts->wait[ts->n_wait++] = (struct scan_wait){.f = *f, .next = (uint32_t)first, .waiting = 1};
	ts->n_waiting++;
	return 0;
}

/* Lists one page found; 1 when the index has its hash afterwards (its
 * waiting children may follow), else 0. final: the scan is over, a
 * missing parent never comes. */
static int list_one(struct tier_scan *ts, const struct spill_found *f, int final)
{
	struct pool *p = ts->p;
	struct pindex_entry *e = prefix_index_find(&p->ix, f->h.hash), *parent = NULL;
	int ret;

	if (e) {
		if (f->replaces != UINT32_MAX && e->extent == f->replaces &&
		    e->io == PINDEX_IO_NONE && e->disk_dtype == f->h.dtype) {
			/* The newer copy of a page listed already takes the old
			 * one's place when nothing uses it. */
			spill_free(p->spill, e->extent);
		} else if (e->extent == PINDEX_NONE && e->io == PINDEX_IO_NONE && f->h.dtype == 0) {
			/* In the index already without a disk copy (a warm-up
			 * checkpoint or a commit came first): this is its copy,
			 * so a stop does not write the page again. */
			p->ix.n_disk++;
			p->tier.restored++;
		} else {
			spill_free(p->spill, f->extent); /* one of the two goes */
			return 1;
		}
		e->extent = f->extent;
		e->disk_sum = f->h.sum;
		e->disk_dtype = (uint8_t)f->h.dtype;
		e->disk_used = f->h.used;
		if (f->h.used > e->used)
			e->used = f->h.used;
		if (f->h.used > p->ix.clock)
			p->ix.clock = f->h.used;
		prefix_index_reconsider(&p->ix, &p->pa, e);
		lru_note(ts, f);
		return 1;
	}
	/* A quantized page this pool cannot turn back is a miss. */
	if (f->h.dtype && stored_bytes(p, f->h.dtype) != f->h.stored_bytes) {
		spill_free(p->spill, f->extent);
		return 0;
	}
	if (!(f->h.flags & SPILL_PAGE_FIRST)) {
		parent = prefix_index_find(&p->ix, f->h.parent);
		if (!parent) {
			if (final) {
				spill_free(p->spill, f->extent); /* can never be matched */
			} else if (wait_for_parent(ts, f) < 0) {
				ts->kept++; /* in use until the next start */
			}
			return 0;
		}
	}
	ret = prefix_index_insert_disk(&p->ix, f->h.hash, parent, f->extent, f->h.sum,
				       (uint8_t)f->h.dtype);
	if (ret == -ENOMEM) {
		/* Kept unlisted: handing the extent out would overwrite a page
		 * the next start can still find. */
		ts->kept++;
		return 0;
	}
	if (ret < 0) {
		spill_free(p->spill, f->extent);
		return 0;
	}
	e = prefix_index_find(&p->ix, f->h.hash);
	/* A first page's header names its chain root. */
	if (f->h.flags & SPILL_PAGE_FIRST)
		e->root = f->h.parent;
	/* Its own stamp, not the tick of listing it; stamps handed out from
	 * now on come after it. */
	e->used = e->disk_used = f->h.used;
	if (f->h.used > p->ix.clock)
		p->ix.clock = f->h.used;
	p->tier.restored++;
	lru_note(ts, f);
	kv_events_stored(p->events, p->id, p->uid, p->layout.block_tokens, f->h.hash,
			 parent ? &parent->hash : NULL, KV_EVENT_DISK, NULL);
	return 1;
}

/* Lists f, then every child that waited for it, and theirs. */
static void list_with_children(struct tier_scan *ts, const struct spill_found *f, int final)
{
	/* By value and by index: waiting again (a 64-bit key shared by two
	 * parents) may move ts->wait. */
	struct spill_found at = *f;
	uint32_t *stack = NULL, n = 0, cap = 0;

	if (!list_one(ts, &at, final) || !ts->n_waiting)
		return;
	for (;;) {
		uintptr_t k = (uintptr_t)idmap_del(&ts->waiting, at.h.hash.low64 | 1);

		while (k) {
			uint32_t i = (uint32_t)(k - 1);
			struct spill_found child = ts->wait[i].f;

			k = ts->wait[i].next;
			ts->wait[i].waiting = 0;
			ts->n_waiting--;
			if (!XXH128_isEqual(child.h.parent, at.h.hash)) {
				/* Another parent with the same 64-bit key: waits on. */
				if (wait_for_parent(ts, &child) < 0)
					ts->kept++;
				continue;
			}
			if (!list_one(ts, &child, final))
				continue;
			if (n == cap) {
				uint32_t c = cap ? 2 * cap : 64;
				uint32_t *st = realloc(stack, c * sizeof(*st));

				if (!st)
					continue; /* its children wait on: listed at the end */
				stack = st;
				cap = c;
			}
			stack[n++] = i;
		}
		if (!n)
			break;
		at = ts->wait[stack[--n]].f;
	}
	free(stack);
}

/* Newest first: by last-use stamp, pages without one (a format 2 file)
 * after the stamped ones, then by write order. */
static int by_last_use_desc(const void *a, const void *b)
{
	const struct scan_lru *x = a, *y = b;

	if (x->used != y->used)
		return x->used > y->used ? -1 : 1;
	return x->seq > y->seq ? -1 : x->seq < y->seq;
}

static void scan_run(struct worker_job *j)
{
	struct tier_scan *ts = (struct tier_scan *)j;

	if (ts->phase == 0) {
		if (ts->delay_ms)
			usleep(ts->delay_ms * 1000u);
		if (ts->table_want) {
			ts->table = idmap_table_new(ts->table_want, &ts->table_cap);
			ts->table_want = 0;
		}
		ts->err = spill_scanner_step(ts->p->spill, &ts->sc, ts->v[ts->cur], SCAN_STEP,
					     &ts->n);
	} else if (ts->phase == 1) {
		/* The reading is over: its maps go here, not on the loop
		 * (freeing tens of MiB took it 10-15 ms). Newest first, the
		 * order scan_order_step walks. */
		spill_scanner_fini(&ts->sc);
		qsort(ts->lru, ts->n_lru, sizeof(*ts->lru), by_last_use_desc);
	} else if (ts->phase == 3) {
		free(ts->lru); /* as above */
		ts->lru = NULL;
		free(ts->wait);
		ts->wait = NULL;
	}
	/* phase 2: nothing here; done() reorders a step's worth on the loop */
}

static void scan_finish(struct tier_scan *ts)
{
	struct pool *p = ts->p;

	p->scan = NULL;
	free(ts->table);
	idmap_fini(&ts->waiting);
	free(ts->wait);
	free(ts->lru);
	free(ts->v[0]);
	free(ts->v[1]);
	spill_scanner_fini(&ts->sc);
	log_ctx_info(LOG_POOL_UID(p->id, p->uid),
		     "pool %llu: disk tier %s: %llu pages found from an earlier run",
		     (unsigned long long)p->id, p->spill->path,
		     (unsigned long long)p->tier.restored);
	free(ts);
	tier_wake_all(p); /* purges that waited for the scan */
}

/* The end of the reading: what waited for a parent that a commit brought
 * meanwhile is listed, the rest can never be matched (freed; kept for the
 * next start when the scan did not complete); the free stack is rebuilt. */
static void scan_end_reading(struct tier_scan *ts, int complete)
{
	struct pool *p = ts->p;

	for (uint32_t i = 0; i < ts->n_wait && ts->n_waiting; i++) {
		struct scan_wait *w = &ts->wait[i];

		if (!w->waiting || !prefix_index_find(&p->ix, w->f.h.parent))
			continue;
		/* Out of its parent's chain first, so it is listed once. */
		{
			uint64_t key = w->f.h.parent.low64 | 1;
			uintptr_t k = (uintptr_t)idmap_del(&ts->waiting, key), keep = 0;

			/* The chain minus w goes back under the key. */
			while (k) {
				struct scan_wait *o = &ts->wait[k - 1];
				uintptr_t next = o->next;

				if (o != w) {
					o->next = (uint32_t)keep;
					keep = k;
				}
				k = next;
			}
			if (keep && idmap_put(&ts->waiting, key, (void *)keep) < 0)
				continue; /* out of memory: those stay as orphans */
		}
		w->waiting = 0;
		ts->n_waiting--;
		list_with_children(ts, &w->f, 1);
	}
	for (uint32_t i = 0; complete && i < ts->n_wait; i++)
		if (ts->wait[i].waiting) {
			ts->wait[i].waiting = 0;
			spill_free(p->spill, ts->wait[i].f.extent);
		}
	idmap_fini(&ts->waiting);
	ts->n_waiting = 0;
	spill_scan_end(p->spill, complete, ts->sc.seq, ts->sc.n_gone);
	if (p->spill->n_gone)
		log_ctx_warn(LOG_POOL_UID(p->id, p->uid),
			     "pool %llu: %u pages of %s lie past its end (the file was cut short): "
			     "not found",
			     (unsigned long long)p->id, p->spill->n_gone, p->spill->path);
	p->tier.gone += p->spill->n_gone;
	if (ts->kept)
		log_ctx_warn(LOG_POOL_UID(p->id, p->uid),
			     "pool %llu: out of memory listing %u pages of %s; kept on disk for "
			     "the next start",
			     (unsigned long long)p->id, ts->kept, p->spill->path);
}

/* Moves the listed pages that are still disk-only leaves to the cold end
 * of the disk LRU, newest first, a step's worth: the oldest ends coldest,
 * pages spilled since the start stay warmer than every one found. */
static void scan_order_step(struct tier_scan *ts)
{
	struct prefix_index *ix = &ts->p->ix;
	size_t end = ts->lru_at + 4 * SCAN_STEP;

	if (end > ts->n_lru)
		end = ts->n_lru;
	for (; ts->lru_at < end; ts->lru_at++) {
		struct pindex_entry *e = prefix_index_find(ix, ts->lru[ts->lru_at].hash);

		if (!e || e->list != PINDEX_LIST_DISK)
			continue;
		list_del(&e->lru_link);
		list_add_tail(ix->disk_lru.next, &e->lru_link); /* before the first: the head */
	}
}

static void scan_done(struct worker_job *j);

static void scan_again(struct tier_scan *ts)
{
	if (ts->c->worker)
		worker_submit(ts->c->worker, &ts->job);
	/* else tier_pool_open runs the steps in a row */
}

static void scan_done(struct worker_job *j)
{
	struct tier_scan *ts = (struct tier_scan *)j;
	struct pool *p = ts->p;
	int stop = ts->stop || !ts->c->aio; /* stopping, or torn down */

	if (ts->phase == 0) {
		const struct spill_found *v = ts->v[ts->cur];
		uint32_t n = ts->n;
		int ret = ts->err ? ts->err : spill_scan_advance(p->spill, ts->sc.next, v, n);
		int more;

		if (ts->table) {
			if (prefix_index_adopt_table(&p->ix, ts->table, ts->table_cap) < 0)
				free(ts->table);
			ts->table = NULL;
		}

		if (ret < 0) {
			log_ctx_err(LOG_POOL_UID(p->id, p->uid),
				    "pool %llu: cannot read the page headers of %s past extent %u: "
				    "%s; the rest waits for the next start",
				    (unsigned long long)p->id, p->spill->path, p->spill->scan_upto,
				    strerror(-ret));
			scan_end_reading(ts, 0);
			scan_finish(ts);
			return;
		}
		/* The next step first, into the other buffer: from here on the
		 * worker owns ts->sc, ts->n, ts->err and v[cur]. */
		more = !ts->sc.eof && !stop;
		if (more) {
			ts->cur ^= 1;
			scan_again(ts);
		}
		for (uint32_t i = 0; i < n; i++)
			list_with_children(ts, &v[i], 0);
		ts->step++;
		if (more)
			return;
		scan_end_reading(ts, ts->sc.eof);
		if (stop || ts->n_lru < 2) {
			scan_finish(ts);
			return;
		}
		ts->phase = 1; /* the sort, on the worker */
		scan_again(ts);
		return;
	}
	if (ts->phase == 3) {
		scan_finish(ts);
		return;
	}
	if (ts->phase == 1) {
		ts->phase = 2;
		ts->lru_at = 0;
	}
	if (!stop)
		scan_order_step(ts);
	if (stop) {
		scan_finish(ts);
		return;
	}
	if (ts->lru_at >= ts->n_lru) {
		ts->phase = 3; /* the frees, on the worker */
		scan_again(ts);
		return;
	}
	scan_again(ts);
}

/* Starts the stepwise scan of p's spill file. Returns 0 or -errno. */
static int scan_start(struct cache *c, struct pool *p)
{
	struct tier_scan *ts = calloc(1, sizeof(*ts));
	const char *dbg = getenv("KVPALACED_DEBUG_SCAN_STEP_MS");
	int ret;

	if (!ts)
		return -ENOMEM;
	ts->v[0] = malloc(SCAN_STEP * sizeof(*ts->v[0]));
	ts->v[1] = malloc(SCAN_STEP * sizeof(*ts->v[1]));
	ret = ts->v[0] && ts->v[1] ? spill_scanner_init(p->spill, &ts->sc) : -ENOMEM;
	if (ret < 0) {
		free(ts->v[0]);
		free(ts->v[1]);
		free(ts);
		return ret;
	}
	/* A debug knob (kvpalaced(8), ENVIRONMENT): tests slow the scan down
	 * to act while it runs. */
	if (dbg)
		ts->delay_ms = (uint32_t)strtoul(dbg, NULL, 10) % 60000u;
	ts->c = c;
	ts->p = p;
	ts->job.run = scan_run;
	ts->job.done = scan_done;
	/* Room for what the file may hold, at once: growing the index's map
	 * or the list of found pages as they come copies all of them on the
	 * loop (20 ms and more at 400k pages). The map's table is made and
	 * faulted in by the first step, on the worker (scan_run). On failure
	 * they grow as they go. */
	if (ts->sc.estimate) {
		uint32_t n = ts->sc.estimate < (1u << 22) ? ts->sc.estimate : 1u << 22;

		ts->table_want = n;
		ts->lru = malloc(n * sizeof(*ts->lru));
		ts->cap_lru = ts->lru ? n : 0;
	}
	spill_scan_begin(p->spill, ts->sc.virgin);
	p->scan = ts;
	if (c->worker) {
		worker_submit(c->worker, &ts->job);
		return 0;
	}
	/* No worker threads: the whole scan here, as before. */
	while (p->scan) {
		scan_run(&ts->job);
		scan_done(&ts->job);
	}
	return 0;
}

void tier_pool_stop_scan(struct pool *p)
{
	if (p->scan)
		p->scan->stop = 1;
}

void tier_pool_open(struct cache *c, struct pool *p)
{
	const struct config *cfg = c->cfg;
	char why[4400];
	int ret;

	if (cfg->disk_pool_bytes == 0 || !c->aio)
		return;
	p->spill = calloc(1, sizeof(*p->spill));
	if (!p->spill)
		return;
	ret = spill_open(p->spill, cfg->cache_dir, p->uid, p->model_id, &p->layout, p->root,
			 cfg->disk_pool_bytes, why, sizeof(why));
	if (ret == 0) {
		p->spill_data = aio_file_add(c->aio, p->spill->fd_data);
		p->spill_meta = aio_file_add(c->aio, p->spill->fd_meta);
		if (p->spill_data < 0 || p->spill_meta < 0)
			ret = p->spill_data < 0 ? p->spill_data : p->spill_meta;
		snprintf(why, sizeof(why), "cannot use %s: %s", p->spill->path, strerror(-ret));
	}
	if (ret < 0) {
		log_ctx_err(LOG_POOL_UID(p->id, p->uid), "pool %llu: no disk tier: %s",
			    (unsigned long long)p->id, why);
		tier_pool_close(c, p);
		return;
	}
	p->ix.disk = 1;
	if (cfg->spill_dtype) {
		struct shm_layout ql;

		if (stored_layout(p, cfg->spill_dtype, &ql) == 0) {
			p->spill_dtype = cfg->spill_dtype;
			log_ctx_info(LOG_POOL_UID(p->id, p->uid),
				     "pool %llu: cold pages go to disk as %s (%llu of %llu bytes)",
				     (unsigned long long)p->id, shm_dtype_name(ql.dtype),
				     (unsigned long long)shm_page_bytes(&ql),
				     (unsigned long long)p->page_bytes);
		} else {
			log_ctx_info(LOG_POOL_UID(p->id, p->uid),
				     "pool %llu: pages go to disk as they are: %s pages of %llu "
				     "bytes gain nothing as %s",
				     (unsigned long long)p->id, shm_dtype_name(p->layout.dtype),
				     (unsigned long long)p->page_bytes,
				     shm_dtype_name(cfg->spill_dtype));
		}
	}
	/* The arena is not registered as io_uring fixed buffers: that
	 * pinned (made resident) every page of it at open, 0.5-0.9 s per GiB
	 * on the loop, for a saving the disk does not notice (the kernel
	 * pins the 2 MiB or so of each request as it starts it; spill and
	 * promote measure the same either way, bench/run's disk area). */
	log_ctx_info(LOG_POOL_UID(p->id, p->uid),
		     "pool %llu: disk tier %s, %u pages%s; looking for pages of an earlier run",
		     (unsigned long long)p->id, p->spill->path, p->spill->cap,
		     p->spill->direct ? " (O_DIRECT)" : " (no O_DIRECT on this file system)");
	ret = scan_start(c, p);
	if (ret < 0) {
		log_ctx_err(LOG_POOL_UID(p->id, p->uid),
			    "pool %llu: no disk tier: cannot scan %s: %s",
			    (unsigned long long)p->id, p->spill->path, strerror(-ret));
		tier_pool_close(c, p);
	}
}

void tier_reclaim(struct cache *c)
{
	uint64_t bytes;
	uint32_t files;
	int ret;

	if (c->cfg->disk_pool_bytes == 0)
		return; /* no disk tier now: its files wait for one */
	ret = spill_reclaim(c->cfg->cache_dir, &bytes, &files);
	if (ret < 0)
		log_warn("%s: cannot look for spill files to reclaim: %s", c->cfg->cache_dir,
			 strerror(-ret));
}

void tier_replace_lossy(struct pool *p, struct pindex_entry *e)
{
	kvp_assert(prefix_index_lossy(e) && e->io == PINDEX_IO_NONE && p->spill);
	/* Its header stays (no blocking write on the loop): a restart that
	 * finds it lists a lossy copy again, which is never matched, and a
	 * newer write of the page wins over it. */
	spill_free(p->spill, e->extent);
	e->extent = PINDEX_NONE;
	e->disk_dtype = 0;
	p->ix.n_disk--;
	p->tier.lossy_replaced++;
	prefix_index_reconsider(&p->ix, &p->pa, e);
}

/* Writes the last-use stamps that moved since their headers were written:
 * the recency a restart rebuilds disk_lru from. */
static void write_stamps(struct pool *p)
{
	const struct idmap *m = &p->ix.by_hash;
	uint32_t n = 0, failed = 0;

	for (size_t i = 0; m->slots && i < m->cap; i++) {
		struct pindex_entry *e = m->slots[i].ptr;

		if (!m->slots[i].id || e->extent == PINDEX_NONE || e->io != PINDEX_IO_NONE ||
		    e->used <= e->disk_used)
			continue;
		if (spill_set_used(p->spill, e->extent, e->hash, e->used) == 0) {
			e->disk_used = e->used;
			n++;
		} else {
			failed++;
		}
	}
	if (n || failed)
		log_ctx_info(LOG_POOL_UID(p->id, p->uid),
			     "pool %llu: last use of %u disk pages written to %s%s",
			     (unsigned long long)p->id, n, p->spill->path,
			     failed ? " (some could not be)" : "");
}

void tier_pool_close(struct cache *c, struct pool *p)
{
	if (!p->spill)
		return;
	kvp_assert(!tier_pool_busy(p));
	write_stamps(p);
	if (c->aio) {
		if (p->spill_data >= 0)
			aio_file_remove(c->aio, p->spill_data);
		if (p->spill_meta >= 0)
			aio_file_remove(c->aio, p->spill_meta);
	}
	spill_close(p->spill);
	free(p->spill);
	p->spill = NULL;
	p->ix.disk = 0;
}
