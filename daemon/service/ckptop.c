/* daemon/service/ckptop.c — checkpoint requests on worker threads (see ckptop.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptop.h"
#include "clock.h"
#include "frame.h"
#include "guard.h"
#include "list.h"
#include "log.h"
#include "pool.h"
#include "session.h"
#include "stats.h"
#include "status.h"
#include "tier.h"
#include "worker.h"

#define REASON_MAX 320

enum job_op {
	OP_CHECKPOINT,
	OP_RESTORE,
	OP_WARMUP,
	OP_LIST,
	OP_REMOVE,
};

/* A slot of j->slots that holds nothing. */
#define NO_SLOT UINT32_MAX

/* The journal fields of job j: its tenant, and its pool once it has one. */
#define JOB_LOG(j)                                                                                 \
	(LOG_CTX(.pool_id = (j)->pool ? (j)->pool->id : 0, .uid = (j)->uid, .has_uid = 1))

/* The checkpoint's key span records are the session's spans as they lie. */
_Static_assert(sizeof(struct ckpt_span) == sizeof(struct pindex_span) &&
		       offsetof(struct ckpt_span, first_token) ==
			       offsetof(struct pindex_span, first_token) &&
		       offsetof(struct ckpt_span, n_tokens) ==
			       offsetof(struct pindex_span, n_tokens) &&
		       offsetof(struct ckpt_span, key) == offsetof(struct pindex_span, key),
	       "ckpt_span is pindex_span");

struct list_item {
	char name[CKPT_NAME_MAX + 1];
	uint32_t uid;
	int err;      /* 0: meta valid */
	int verified; /* every page was read and checked */
	struct ckpt_meta meta;
	char why[192]; /* room for two names */
};

struct job {
	struct worker_job wj;
	struct ticket t;
	struct peer *asker; /* until started: who asks, for the ticket */
	uint64_t req_id;
	struct cache *c;
	enum job_op op;
	int stage; /* restore: 0 open, 1 read pages */
	char name[CKPT_NAME_MAX + 1];
	uint32_t uid;
	int uid_dir;	   /* the file is <checkpoints>/<uid>/<name>, else in the warm-up dir */
	int all_uids;	   /* list: every tenant's directory */
	int verify;	   /* list: read and check every page too */
	int only_name;	   /* list: name only */
	int admin;	   /* restore: asked on the admin socket (persistent, nobody's) */
	int list_dir;	   /* list: the directory being listed (run_list's) */
	struct pool *pool; /* the pool worked on (p->n_jobs holds it) */
	struct list link;  /* pool.jobs while pool is set */
	struct ckpt_meta meta;
	struct ckpt_token *tokens; /* checkpoint: the copy written */
	struct ckpt_span *spans;   /* checkpoint: the key spans written (meta.spans) */
	const void **src;	   /* checkpoint: the pages written */
	void **dst;	 /* restore: where the pages are read (NULL: shared, checked only) */
	uint32_t *slots; /* [n_slots] host slots held (one reference each), or NO_SLOT */
	uint32_t n_slots;
	/* Restore: full pages found in the prefix index before anything was
	 * allocated (their slots are shared, not read into), with the
	 * hashes they were found under, and the pages still to allocate. */
	XXH128_hash_t *hashes; /* [n_pages] */
	uint8_t *shared;       /* [n_pages] 1: slots[i] is the index's page */
	uint32_t n_shared, n_missing;
	struct tier_waiter waiter; /* restore: parked until its pool's writes finish */
	struct pool *park_on;	   /* the pool waited on (take_room) */
	uint64_t parked_ns;	   /* when it first waited for room, 0: never */
	struct ckpt_reader rd;
	int ret;
	char why[REASON_MAX];
	uint64_t bytes;
	struct list_item *items; /* list */
	size_t n_items, cap_items;
};

/* ---- directories (worker threads) ---------------------------------------- */

/* Opens the directory holding the job's file; creates a tenant's
 * directory when create. Returns an fd or -errno. */
static int open_dir(const struct job *j, int create)
{
	const struct config *cfg = j->c->cfg;
	char path[CONFIG_PATH_MAX + 32];
	int fd;

	if (!j->uid_dir) {
		if (cfg->warmup_dir[0])
			snprintf(path, sizeof(path), "%s", cfg->warmup_dir);
		else
			snprintf(path, sizeof(path), "%s/warmup", cfg->state_dir);
		fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	if (j->c->ckpt_dir_fd < 0)
		return -ENOENT;
	/* A tenant's first checkpoint creates its directory, made durable
	 * (checkpoints/ fsynced) before anything in it is reported so. */
	snprintf(path, sizeof(path), "%u", j->uid);
	return ckpt_dir_open(j->c->ckpt_dir_fd, path, create, 0700, NULL);
}

/* Why a file in a tenant's directory is not that tenant's, or NULL: the
 * owner recorded in it (every version records one) must be the tenant
 * whose directory holds it, or a copy would restore into, or as, another
 * tenant's. */
static const char *foreign(const struct job *j, const struct ckpt_meta *m, char *buf, size_t cap)
{
	if (!j->uid_dir || m->uid == j->uid)
		return NULL;
	snprintf(buf, cap, "the file holds a checkpoint of uid %u, not of uid %u (copied?)", m->uid,
		 j->uid);
	return buf;
}

__attribute__((format(printf, 2, 3))) static void set_why(struct job *j, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(j->why, sizeof(j->why), fmt, ap);
	va_end(ap);
}

/* ---- the worker side ------------------------------------------------------ */

static void run_checkpoint(struct job *j)
{
	char why[REASON_MAX - 32];
	int dir = open_dir(j, 1);

	if (dir < 0) {
		j->ret = dir;
		set_why(j, "cannot open the checkpoint directory: %s", strerror(-dir));
		return;
	}
	why[0] = '\0';
	j->ret = ckpt_write(dir, j->name, &j->meta, j->tokens, j->src, &j->bytes, why, sizeof(why));
	if (j->ret < 0)
		set_why(j, "checkpoint not written: %s", why);
	close(dir);
}

static void run_restore_open(struct job *j)
{
	char why[REASON_MAX - 32];
	int dir = open_dir(j, 0);

	if (dir < 0) {
		j->ret = dir == -ENOENT ? -ENOENT : dir;
		set_why(j, "no such checkpoint (%s)", strerror(-dir));
		return;
	}
	why[0] = '\0';
	j->ret = ckpt_open(dir, j->name, &j->rd, why, sizeof(why));
	close(dir);
	if (j->ret == 0 && foreign(j, &j->rd.meta, why, sizeof(why))) {
		ckpt_close(&j->rd);
		j->ret = -EBADMSG;
	}
	if (j->ret == -ENOENT)
		set_why(j, "no such checkpoint%s", "");
	else if (j->ret < 0)
		set_why(j, "checkpoint refused: %s", why);
	else
		j->meta = j->rd.meta;
}

struct unquantize {
	const struct shm_layout *pool_layout, *stored;
	void *page;
};

static int do_unquantize(void *arg)
{
	struct unquantize *u = arg;

	return tier_page_unquantize(u->pool_layout, u->page, u->stored);
}

static void run_restore_read(struct job *j)
{
	char why[REASON_MAX - 32];

	why[0] = '\0';
	j->ret = ckpt_read_pages(&j->rd, j->dst, why, sizeof(why));
	if (j->ret < 0) {
		set_why(j, "checkpoint refused: %s", why);
		return;
	}
	/* Pages stored quantized go back to the pool's format (none of
	 * them is shared: lossy pages stay out of the prefix index). */
	if (memcmp(&j->meta.layout, &j->meta.pool_layout, sizeof(j->meta.layout)))
		for (uint32_t i = 0; i < j->meta.n_pages && j->ret == 0; i++) {
			struct unquantize u = {&j->meta.pool_layout, &j->meta.layout, j->dst[i]};

			/* Into the clients' arena: see guard.h. */
			if (j->dst[i])
				j->ret = guard_run(do_unquantize, &u);
		}
	if (j->ret < 0)
		set_why(j, "%s",
			j->ret == -EFAULT ? "the arena's memory is gone (a hole in it)"
					  : "out of memory converting the pages");
}

/* Reads and checks every page of dir/name (after its header was read):
 * 0 or the refusal, with its reason in why. */
static int verify_file(int dir, const char *name, char *why, size_t cap)
{
	struct ckpt_reader r;
	int ret = ckpt_open(dir, name, &r, why, cap);

	if (ret == 0)
		ret = ckpt_read_pages(&r, NULL, why, cap);
	ckpt_close(&r);
	return ret;
}

static int collect(const char *name, const struct ckpt_meta *m, int err, const char *why, void *arg)
{
	struct job *j = arg;
	struct list_item *it;
	char buf[160];
	int verified = 0;

	if (m && foreign(j, m, buf, sizeof(buf))) {
		m = NULL;
		err = -EBADMSG;
		why = buf;
	}
	if (m && j->verify) {
		buf[0] = '\0';
		err = verify_file(j->list_dir, name, buf, sizeof(buf));
		if (err == -ENOENT)
			return 0; /* removed meanwhile */
		if (err < 0) {
			m = NULL;
			why = buf;
		}
		verified = err == 0;
	}

	if (j->n_items == j->cap_items) {
		size_t cap = j->cap_items ? 2 * j->cap_items : 64;
		struct list_item *v = realloc(j->items, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		j->items = v;
		j->cap_items = cap;
	}
	it = &j->items[j->n_items++];
	memset(it, 0, sizeof(*it));
	snprintf(it->name, sizeof(it->name), "%s", name);
	it->uid = j->uid;
	it->verified = verified;
	it->err = m ? 0 : (err ? err : -EBADMSG);
	if (m)
		it->meta = *m;
	else
		snprintf(it->why, sizeof(it->why), "%s", why);
	return 0;
}

/* Lists the one checkpoint j->name of the directory dir (none when it
 * does not exist), as ckpt_list would. */
static int list_one(struct job *j, int dir)
{
	struct ckpt_reader r;
	char why[160];
	int ret;

	why[0] = '\0';
	ret = ckpt_open(dir, j->name, &r, why, sizeof(why));
	if (ret == -ENOENT)
		return 0;
	ret = collect(j->name, ret == 0 ? &r.meta : NULL, ret, why, j);
	ckpt_close(&r);
	return ret;
}

static void run_list(struct job *j)
{
	DIR *d;
	struct dirent *de;
	int dir;

	if (!j->all_uids) {
		dir = open_dir(j, 0);
		if (dir >= 0) {
			j->list_dir = dir;
			j->ret = j->only_name ? list_one(j, dir) : ckpt_list(dir, collect, j);
			close(dir);
		}
		return; /* no directory: no checkpoints */
	}
	dir = j->c->ckpt_dir_fd >= 0 ? fcntl(j->c->ckpt_dir_fd, F_DUPFD_CLOEXEC, 3) : -1;
	d = dir >= 0 ? fdopendir(dir) : NULL;
	if (!d) {
		if (dir >= 0)
			close(dir);
		return;
	}
	rewinddir(d);
	while ((de = readdir(d)) && j->ret == 0) {
		char *end;
		unsigned long uid = strtoul(de->d_name, &end, 10);

		if (*end || end == de->d_name || uid > UINT32_MAX)
			continue;
		j->uid = (uint32_t)uid;
		dir = open_dir(j, 0);
		if (dir < 0)
			continue;
		j->list_dir = dir;
		j->ret = j->only_name ? list_one(j, dir) : ckpt_list(dir, collect, j);
		close(dir);
	}
	closedir(d);
}

/* Removes the tenant's checkpoint: unlink, then the directory fsynced,
 * so a removal reported done stays done after a crash. */
static void run_remove(struct job *j)
{
	struct stat st;
	int dir = open_dir(j, 0);

	if (dir < 0) {
		j->ret = dir;
		set_why(j, "no such checkpoint%s", "");
		return;
	}
	if (fstatat(dir, j->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
		j->bytes = (uint64_t)st.st_size;
	j->ret = ckpt_remove(dir, j->name);
	close(dir);
	if (j->ret == -ENOENT)
		set_why(j, "no such checkpoint%s", "");
	else if (j->ret == -EISDIR || j->ret == -EPERM)
		set_why(j, "%s", "not a checkpoint file");
	else if (j->ret < 0)
		set_why(j, "removing the checkpoint: %s (it may come back after a crash)",
			strerror(-j->ret));
}

static void job_run(struct worker_job *wj)
{
	struct job *j = container_of(wj, struct job, wj);

	j->ret = 0;
	switch (j->op) {
	case OP_CHECKPOINT:
		run_checkpoint(j);
		break;
	case OP_RESTORE:
	case OP_WARMUP:
		if (j->stage == 0)
			run_restore_open(j);
		else
			run_restore_read(j);
		break;
	case OP_LIST:
		run_list(j);
		break;
	case OP_REMOVE:
		run_remove(j);
		break;
	}
}

/* ---- the loop side -------------------------------------------------------- */

static void job_free(struct job *j)
{
	struct pool *p = j->pool;

	tier_unwait(&j->waiter);
	if (p) {
		for (uint32_t i = 0; i < j->n_slots; i++) {
			if (j->slots[i] == NO_SLOT)
				continue;
			pagealloc_unref(&p->pa, j->slots[i]);
			prefix_index_update(&p->ix, &p->pa, j->slots[i]);
		}
		p->n_jobs--;
		list_del(&j->link);
	}
	free(j->hashes);
	free(j->shared);
	ckpt_close(&j->rd);
	free(j->tokens);
	free(j->spans);
	free(j->src);
	free(j->dst);
	free(j->slots);
	free(j->items);
	free(j);
}

static void reply_init(struct reply *r)
{
	memset(r, 0, sizeof(*r));
	kvpalace__v1__response__init(&r->resp);
	r->pass_fd = -1;
}

/* Answers a failed job. File-system errors the client cannot act on
 * otherwise become "no space" when they mean it. */
static void deliver_error(struct job *j, int err)
{
	struct reply r;

	if (err == -EFBIG || err == -EDQUOT)
		err = -ENOSPC;
	reply_init(&r);
	r.resp.status = status_from_errno(err);
	r.resp.error = j->why[0] ? j->why : (char *)"failed";
	ticket_deliver(&j->t, &r);
}

static void done_checkpoint(struct job *j)
{
	struct cache *c = j->c;
	struct reply r;

	if (j->ret < 0) {
		cache_count(c, j->uid, checkpoint_failures, 1);
		log_ctx_err(JOB_LOG(j), "checkpoint '%s' of uid %u: %s", j->name, j->uid, j->why);
		deliver_error(j, j->ret);
		return;
	}
	cache_count(c, j->uid, checkpoints_written, 1);
	log_ctx_info(JOB_LOG(j), "checkpoint '%s' of uid %u written: %llu tokens, %llu bytes",
		     j->name, j->uid, (unsigned long long)j->meta.n_tokens,
		     (unsigned long long)j->bytes);
	reply_init(&r);
	kvpalace__v1__checkpoint_response__init(&r.u.checkpoint);
	r.u.checkpoint.bytes = j->bytes;
	r.u.checkpoint.n_tokens = j->meta.n_tokens;
	r.u.checkpoint.n_pages = j->meta.n_pages;
	r.resp.op_case = KVPALACE__V1__RESPONSE__OP_CHECKPOINT;
	r.resp.checkpoint = &r.u.checkpoint;
	ticket_deliver(&j->t, &r);
}

static int same_identity(const struct pool *p, const struct ckpt_meta *m)
{
	return p->uid == (uid_t)m->uid && !strcmp(p->model_id, m->model_id) &&
	       !memcmp(&p->layout, &m->pool_layout, sizeof(p->layout));
}

/* Restore, after the header and tokens verified: checks the tokens and
 * the identity, finds the pool, and shares the full pages the prefix
 * index holds in the host tier already (a reference each, so they stay
 * while the file is read) before anything is allocated: a restore into
 * a pool that holds its pages needs room for the others only. Returns 0
 * or -errno with j->why set. */
static int take_pool(struct job *j)
{
	struct cache *c = j->c;
	struct pool *p = j->pool;
	uint32_t n = j->meta.n_pages, bt = j->meta.layout.block_tokens;
	int exact = 1,
	    lossy = memcmp(&j->meta.layout, &j->meta.pool_layout, sizeof(j->meta.layout));
	uint32_t *ids = NULL;
	XXH128_hash_t parent;
	int ret;

	/* A compacted session's tokens keep their original positions, which
	 * only ever grow; warm-up fills the prefix index, which holds
	 * prefixes only. */
	for (uint64_t i = 0; i < j->meta.n_tokens; i++) {
		const struct ckpt_token *t = &j->rd.tokens[i];

		if (i && t->pos <= j->rd.tokens[i - 1].pos) {
			set_why(j, "token %llu: positions do not increase", (unsigned long long)i);
			return -EBADMSG;
		}
		if (t->pos != i && j->op == OP_WARMUP) {
			set_why(j, "%s", "a compacted session cannot warm up the prefix index");
			return -EINVAL;
		}
		exact &= t->pos == i;
	}
	if (j->op == OP_WARMUP && lossy) {
		set_why(j, "%s",
			"pages stored quantized cannot warm up the prefix index (others "
			"would match them as exact)");
		return -EINVAL;
	}
	if (!p) {
		ret = pool_open(c, (uid_t)j->meta.uid, j->meta.model_id, &j->meta.pool_layout, &p);
		if (ret < 0) {
			set_why(j, "cannot open the checkpoint's pool: %s", strerror(-ret));
			return ret;
		}
		j->pool = p;
		p->n_jobs++;
		list_add_tail(&p->jobs, &j->link);
	} else if (!same_identity(p, &j->meta)) {
		set_why(j, "%s", "checkpoint of another tenant, model or layout than this pool");
		return -EINVAL;
	}
	if (j->meta.n_tokens > c->cfg->max_session_tokens) {
		set_why(j, "%s", "checkpoint longer than max-session-tokens");
		return -EDQUOT;
	}
	j->slots = malloc((n ? n : 1) * sizeof(uint32_t));
	j->dst = calloc(n ? n : 1, sizeof(void *));
	j->hashes = calloc(n ? n : 1, sizeof(*j->hashes));
	j->shared = calloc(n ? n : 1, 1);
	ids = malloc((size_t)bt * sizeof(uint32_t));
	if (!j->slots || !j->dst || !j->hashes || !j->shared || !ids) {
		free(ids);
		set_why(j, "%s", "out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		j->slots[i] = NO_SLOT;
	j->n_slots = n;
	j->n_missing = n;
	/* Only exact pages enter the index (session_restore): only those
	 * can be found there. A page being read back from disk is not
	 * there yet; one being written out is, and stays while we hold it. */
	parent = j->meta.root;
	for (uint32_t i = 0; exact && !lossy && i < j->meta.n_tokens / bt; i++) {
		struct pindex_entry *e;

		for (uint32_t k = 0; k < bt; k++)
			ids[k] = j->rd.tokens[(uint64_t)i * bt + k].id;
		/* ckpt_span and pindex_span: the same three fields. */
		parent = j->hashes[i] = prefix_index_hash_keyed(
			parent, ids, bt, (uint64_t)i * bt,
			(const struct pindex_span *)j->meta.spans, j->meta.n_spans);
		e = prefix_index_find_host(&p->ix, parent);
		if (!e || e->io == PINDEX_IO_READ)
			continue;
		pagealloc_ref(&p->pa, e->slot);
		prefix_index_update(&p->ix, &p->pa, e->slot);
		j->slots[i] = e->slot;
		j->shared[i] = 1;
		j->n_shared++;
		j->n_missing--;
	}
	free(ids);
	return 0;
}

/* Takes a host slot for every page the index did not have. Returns 0;
 * -EAGAIN when room comes once the pool's disk writes in flight finish
 * (j->park_on is the pool to wait on), which the caller waits for at
 * most PEER_MAX_PARK_NS, as a match does; or -ENOSPC with
 * j->why set. */
static int take_room(struct job *j, int may_wait)
{
	struct cache *c = j->c;
	struct pool *p = j->pool;
	/* The job's own wait, not the request's it may run within. */
	struct tier_park pk = {
		.no_park = !may_wait ||
			   (j->parked_ns && clock_now_ns() - j->parked_ns >= PEER_MAX_PARK_NS),
	};
	int ret;

	ret = tier_make_room(c, p, j->n_missing, &pk);
	if (ret == -EAGAIN && pk.park_on) {
		j->park_on = pk.park_on;
		return -EAGAIN;
	}
	if (ret < 0) {
		set_why(j, "%s", "host tier full: no room for the checkpoint's pages");
		return -ENOSPC;
	}
	for (uint32_t i = 0; i < j->meta.n_pages; i++) {
		if (j->shared[i])
			continue; /* checked in the file, not kept: the index's page */
		ret = pagealloc_get(&p->pa, &j->slots[i]);
		kvp_assert(ret == 0); /* tier_make_room made room */
		j->dst[i] = (char *)p->arena + (uint64_t)j->slots[i] * p->page_bytes;
	}
	return 0;
}

/* Restore, after every page verified: the session. */
static int build(struct job *j, struct session **ret_s, uint32_t *ret_shared)
{
	uint64_t n = j->meta.n_tokens ? j->meta.n_tokens : 1;
	struct pool *p = j->pool;
	uint32_t *ids, shared = 0;
	struct token_meta *meta;
	int ret;

	/* The pages shared at the start are still the index's (an entry
	 * whose page we hold cannot be dropped): else the session would
	 * adopt the index's new page over one it believes its own. */
	for (uint32_t i = 0; i < j->meta.n_pages; i++) {
		const struct pindex_entry *e;

		if (!j->shared[i])
			continue;
		e = prefix_index_find(&p->ix, j->hashes[i]);
		if (!e || e->slot != j->slots[i]) {
			set_why(j, "%s", "the prefix index changed during the restore: try again");
			return -EAGAIN;
		}
	}
	ids = malloc(n * sizeof(uint32_t));
	meta = malloc(n * sizeof(*meta));
	if (!ids || !meta) {
		free(ids);
		free(meta);
		set_why(j, "%s", "out of memory");
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < j->meta.n_tokens; i++) {
		const struct ckpt_token *t = &j->rd.tokens[i];

		ids[i] = t->id;
		meta[i] = (struct token_meta){
			.pos = t->pos,
			.turn = t->turn,
			.role = (uint8_t)t->role,
			.flags = (uint8_t)t->flags,
		};
	}
	ret = session_restore(
		j->c, j->pool, j->meta.root, ids, meta, j->meta.n_tokens, j->slots,
		memcmp(&j->meta.layout, &j->meta.pool_layout, sizeof(j->meta.layout)) != 0,
		(const struct pindex_span *)j->meta.spans, j->meta.n_spans, ret_s, &shared);
	free(ids);
	free(meta);
	if (ret < 0) {
		set_why(j, "%s",
			ret == -EDQUOT ? "too many sessions in this pool"
				       : "cannot create session");
		return ret;
	}
	j->n_slots = 0; /* the session holds them now */
	/* Shared before they were read: dedup as the session's own would be. */
	p->ix.dedup_pages += j->n_shared;
	*ret_shared = shared + j->n_shared;
	return 0;
}

static void deliver_restored(struct job *j, struct session *s, uint32_t shared)
{
	Kvpalace__V1__RestoreResponse *out;
	Kvpalace__V1__WarmupResponse *w;
	struct reply r;
	uint64_t fit;

	reply_init(&r);
	if (j->op == OP_WARMUP) {
		w = &r.u.warmup;
		kvpalace__v1__warmup_response__init(w);
		w->pool_id = j->pool->id;
		w->n_tokens = j->meta.n_tokens;
		w->indexed_pages = (uint32_t)(j->meta.n_tokens / j->pool->layout.block_tokens);
		w->shared_pages = shared;
		r.resp.op_case = KVPALACE__V1__RESPONSE__OP_WARMUP;
		r.resp.warmup = w;
		ticket_deliver(&j->t, &r);
		return;
	}
	out = &r.u.restore;
	kvpalace__v1__restore_response__init(out);
	out->session_id = s->id;
	out->n_tokens = s->n_tokens;
	out->pool_id = j->pool->id;
	out->n_pages = s->n_pages;
	out->shared_pages = shared;
	/* The start of the page table, as a fork's reply has it. */
	fit = reply_fit(j->c->cfg->max_message_bytes, 256, 5);
	out->page_slots = s->pages;
	out->n_page_slots = s->n_pages < fit ? s->n_pages : fit;
	r.resp.op_case = KVPALACE__V1__RESPONSE__OP_RESTORE;
	r.resp.restore = out;
	ticket_deliver(&j->t, &r);
}

/* Counts and logs a refused or failed restore. */
static void restore_failed(struct job *j, int err)
{
	if (err == -EBADMSG || err == -EPROTONOSUPPORT || err == -EINVAL)
		cache_count(j->c, j->uid, checkpoints_refused, 1);
	log_ctx_notice(JOB_LOG(j), "%s of checkpoint '%s' (uid %u): %s",
		       j->op == OP_WARMUP ? "warm-up" : "restore", j->name, j->uid, j->why);
}

static void restore_finish(struct job *j, int ret);

/* Gives the session a restore built to whoever asked: the client's
 * connection owns it (it dies with it, as a created one does); an admin's
 * restore has no handle to come back to, so it is persistent and nobody's
 * (reached by id; session-idle-timeout ends it). A client that went while
 * the restore ran left nobody to own it: closed, its full pages stay in
 * the prefix index as a warm-up's do. Returns 1, or 0 when it was closed. */
static int restore_owner(struct job *j, struct session *s)
{
	if (j->admin) {
		session_own(j->c, s, NULL, 1);
		return 1;
	}
	if (j->t.peer) {
		session_own(j->c, s, &j->t.peer->sessions, 0);
		return 1;
	}
	log_ctx_info(
		LOG_CTX(.pool_id = s->pool->id, .session_id = s->id, .uid = j->uid, .has_uid = 1),
		"restore of checkpoint '%s' of uid %u finished after its client disconnected: "
		"session %llu closed (%llu tokens); its full pages stay indexed",
		j->name, j->uid, (unsigned long long)s->id, (unsigned long long)s->n_tokens);
	cache_count(j->c, j->uid, sessions_closed_with_conn, 1);
	session_close(j->c, s);
	return 0;
}

/* The pool a parked restore waits on finished its writes: try again. */
static void on_wake(struct tier_waiter *w)
{
	struct job *j = container_of(w, struct job, waiter);

	restore_finish(j, 0);
}

/* Takes the slots, or parks j (on the pool whose writes make room) and
 * returns 1. Returns 0 when j may go on, or -errno. */
static int restore_room(struct job *j)
{
	int ret = take_room(j, 1);

	if (ret == -EAGAIN) {
		if (!j->parked_ns) {
			j->parked_ns = clock_now_ns();
			cache_count(j->c, j->uid, restore_waits, 1); /* once per restore */
		}
		j->waiter.wake = on_wake;
		tier_wait(j->park_on, &j->waiter);
		return 1;
	}
	return ret;
}

/* Restore after its stage 0 (ret: the file's header and tokens verified,
 * or why not) or after a wait for room: on to reading the pages, or to
 * the end. Frees j when it is over. */
static void restore_finish(struct job *j, int ret)
{
	struct session *s = NULL;
	uint32_t shared = 0;

	if (ret == 0 && j->stage == 0) {
		if (!j->slots)
			ret = take_pool(j);
		if (ret == 0) {
			ret = restore_room(j);
			if (ret == 1)
				return; /* parked: on_wake comes back here */
		}
		if (ret == 0) {
			j->stage = 1;
			worker_submit(j->c->worker, &j->wj);
			return;
		}
	}
	if (ret == 0)
		ret = build(j, &s, &shared);
	if (ret < 0) {
		restore_failed(j, ret);
		deliver_error(j, ret);
	} else {
		cache_count(j->c, j->uid, checkpoints_restored, 1);
		if (j->op == OP_WARMUP) {
			cache_count(j->c, j->uid, warmed_up_pages,
				    j->meta.n_tokens / j->pool->layout.block_tokens);
			session_close(j->c, s);
		}
		log_ctx_info(JOB_LOG(j),
			     "%s checkpoint '%s' of uid %u: %llu tokens, %u pages already indexed",
			     j->op == OP_WARMUP ? "warmed up" : "restored", j->name, j->uid,
			     (unsigned long long)j->meta.n_tokens, shared);
		/* A restore nobody is left to answer closed its session. */
		if (j->op == OP_WARMUP || restore_owner(j, s))
			deliver_restored(j, s, shared);
	}
	cache_debug_check(j->c);
	job_free(j);
}

static void done_list(struct job *j)
{
	Kvpalace__V1__ListCheckpointsResponse *out;
	Kvpalace__V1__CheckpointInfo *infos, **ptrs;
	Kvpalace__V1__Layout *lays;
	size_t budget = reply_room(j->c->cfg->max_message_bytes, 256), n = 0;
	struct reply r;

	reply_init(&r);
	out = &r.u.list_checkpoints;
	kvpalace__v1__list_checkpoints_response__init(out);
	infos = calloc(j->n_items ? j->n_items : 1, sizeof(*infos) + sizeof(*ptrs) + sizeof(*lays));
	if (!infos) {
		set_why(j, "%s", "out of memory");
		deliver_error(j, -ENOMEM);
		return;
	}
	r.heap = infos;
	ptrs = (Kvpalace__V1__CheckpointInfo **)(infos + j->n_items);
	lays = (Kvpalace__V1__Layout *)(ptrs + j->n_items);
	for (size_t i = 0; i < j->n_items; i++) {
		struct list_item *it = &j->items[i];
		Kvpalace__V1__CheckpointInfo *ci = &infos[n];
		size_t sz;

		kvpalace__v1__checkpoint_info__init(ci);
		ci->name = it->name;
		ci->uid = it->uid;
		if (it->err == 0) {
			stats_layout(&it->meta.layout, &lays[n]);
			ci->model_id = it->meta.model_id;
			ci->layout = &lays[n];
			ci->has_n_tokens = ci->has_bytes = ci->has_created_unix_ms = 1;
			ci->n_tokens = it->meta.n_tokens;
			ci->bytes = it->meta.file_bytes;
			ci->created_unix_ms = it->meta.created_ns / 1000000;
			ci->has_format_version = 1;
			ci->format_version = it->meta.version;
			ci->has_verified = 1;
			ci->verified = it->verified;
		} else {
			ci->error = it->why;
		}
		sz = kvpalace__v1__checkpoint_info__get_packed_size(ci) + 8;
		if (sz > budget) {
			out->has_truncated = out->truncated = 1;
			break;
		}
		budget -= sz;
		ptrs[n++] = ci;
	}
	out->checkpoints = ptrs;
	out->n_checkpoints = n;
	r.resp.op_case = KVPALACE__V1__RESPONSE__OP_LIST_CHECKPOINTS;
	r.resp.list_checkpoints = out;
	ticket_deliver(&j->t, &r);
	free(r.heap);
}

static void done_remove(struct job *j)
{
	struct reply r;

	if (j->ret < 0) {
		log_ctx_notice(JOB_LOG(j), "removing checkpoint '%s' of uid %u: %s", j->name,
			       j->uid, j->why);
		deliver_error(j, j->ret);
		return;
	}
	cache_count(j->c, j->uid, checkpoints_removed, 1);
	log_ctx_info(JOB_LOG(j), "checkpoint '%s' of uid %u removed (%llu bytes)", j->name, j->uid,
		     (unsigned long long)j->bytes);
	reply_init(&r);
	kvpalace__v1__delete_checkpoint_response__init(&r.u.delete_checkpoint);
	r.u.delete_checkpoint.bytes = j->bytes;
	r.resp.op_case = KVPALACE__V1__RESPONSE__OP_DELETE_CHECKPOINT;
	r.resp.delete_checkpoint = &r.u.delete_checkpoint;
	ticket_deliver(&j->t, &r);
}

static void job_done(struct worker_job *wj)
{
	struct job *j = container_of(wj, struct job, wj);

	switch (j->op) {
	case OP_CHECKPOINT:
		done_checkpoint(j);
		break;
	case OP_RESTORE:
	case OP_WARMUP:
		restore_finish(j, j->ret); /* frees j when done */
		return;
	case OP_LIST:
		done_list(j);
		break;
	case OP_REMOVE:
		done_remove(j);
		break;
	}
	cache_debug_check(j->c);
	job_free(j);
}

static struct job *job_new(struct cache *cache, struct peer *c, uint64_t req_id, enum job_op op,
			   const char *name)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->wj.run = job_run;
	j->wj.done = job_done;
	list_init(&j->link);
	list_init(&j->waiter.link);
	j->c = cache;
	j->op = op;
	j->rd.fd = -1;
	if (name)
		snprintf(j->name, sizeof(j->name), "%s", name);
	j->asker = c;
	j->req_id = req_id;
	return j;
}

/* Jobs run on the worker threads; a cache without them (an in-process
 * test's, such as the fuzz target's) refuses the request rather than hand
 * it to nobody. */
static int no_worker(const char **why)
{
	*why = "no worker threads for checkpoint work";
	return -EIO;
}

static int start(struct job *j)
{
	if (j->pool) {
		j->pool->n_jobs++;
		list_add_tail(&j->pool->jobs, &j->link);
	}
	ticket_start(j->asker, &j->t, j->req_id);
	worker_submit(j->c->worker, &j->wj);
	return -EINPROGRESS;
}

int ckptop_checkpoint(struct cache *cache, struct peer *c, uint64_t req_id,
		      const Kvpalace__V1__CheckpointRequest *in, const char **why)
{
	struct session *s = session_get(cache, in->session_id, c->uid, c->admin);
	struct shm_layout stored;
	struct pool *p;
	struct job *j;
	uint64_t n;
	uint32_t n_pages;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	/* Mixed precision on disk: the pages stored quantized. */
	stored = s->pool->layout;
	if (in->has_dtype &&
	    shm_layout_quantized(&s->pool->layout, (uint32_t)in->dtype, &stored) < 0) {
		*why = "this pool's pages cannot be stored in that dtype (a quantized dtype, of an "
		       "unquantized pool, that makes them smaller)";
		return -EINVAL;
	}
	if (cache->ckpt_dir_fd < 0) {
		*why = "no checkpoint directory (see the log at start)";
		return -EIO;
	}
	if (!cache->worker)
		return no_worker(why);
	p = s->pool;
	n = s->n_committed;
	n_pages = (uint32_t)((n + p->layout.block_tokens - 1) / p->layout.block_tokens);
	j = job_new(cache, c, req_id, OP_CHECKPOINT, in->name);
	if (j) {
		j->tokens = calloc(n ? n : 1, sizeof(*j->tokens));
		j->src = calloc(n_pages ? n_pages : 1, sizeof(*j->src));
		j->slots = calloc(n_pages ? n_pages : 1, sizeof(*j->slots));
	}
	if (!j || !j->tokens || !j->src || !j->slots) {
		if (j)
			job_free(j);
		*why = "out of memory";
		return -ENOMEM;
	}
	/* The key spans within the committed tokens, the last cut there. */
	{
		struct pindex_spans cut = {0};

		if (prefix_index_spans_copy(&cut, s->spans.v, s->spans.n, n) < 0) {
			job_free(j);
			*why = "out of memory";
			return -ENOMEM;
		}
		j->spans = (struct ckpt_span *)cut.v; /* the same layout: asserted above */
		j->meta.spans = j->spans;
		j->meta.n_spans = cut.n;
	}
	j->uid = (uint32_t)p->uid;
	j->uid_dir = 1;
	j->pool = p;
	j->meta.uid = (uint32_t)p->uid;
	snprintf(j->meta.model_id, sizeof(j->meta.model_id), "%s", p->model_id);
	j->meta.pool_layout = p->layout;
	j->meta.layout = stored;
	j->meta.page_bytes = shm_page_bytes(&j->meta.layout);
	j->meta.root = s->root;
	j->meta.n_tokens = n;
	j->meta.n_pages = n_pages;
	for (uint64_t i = 0; i < n; i++)
		j->tokens[i] = (struct ckpt_token){
			.id = tokvec_id(&s->tok, i),
			.pos = tokvec_meta(&s->tok, i).pos,
			.turn = tokvec_meta(&s->tok, i).turn,
			.role = tokvec_meta(&s->tok, i).role,
			.flags = tokvec_meta(&s->tok, i).flags & CKPT_TOKEN_FLAGS,
		};
	/* References keep the pages' slots from being freed or reused while
	 * the worker reads them; committed positions are never rewritten. */
	for (uint32_t i = 0; i < n_pages; i++) {
		j->slots[i] = s->pages[i];
		pagealloc_ref(&p->pa, s->pages[i]);
		prefix_index_update(&p->ix, &p->pa, s->pages[i]);
		j->src[i] = (char *)p->arena + (uint64_t)s->pages[i] * p->page_bytes;
	}
	j->n_slots = n_pages;
	return start(j);
}

int ckptop_restore(struct cache *cache, struct peer *c, uint64_t req_id,
		   const Kvpalace__V1__RestoreRequest *in, const char **why)
{
	struct pool *p = NULL;
	struct job *j;

	if (in->has_pool_id) {
		p = pool_get(cache, in->pool_id, c->uid, c->admin);
		if (!p) {
			*why = "no such pool";
			return -ENOENT;
		}
	} else if (!c->admin) {
		*why = "restore into which pool? (pool_id)";
		return -EINVAL;
	}
	if (in->has_uid && !c->admin) {
		*why = "only the admin socket restores another tenant's checkpoint";
		return -EPERM;
	}
	if (!cache->worker)
		return no_worker(why);
	j = job_new(cache, c, req_id, OP_RESTORE, in->name);
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	j->uid_dir = 1;
	j->pool = p;
	j->admin = c->admin;
	j->uid = p ? (uint32_t)p->uid : in->has_uid ? in->uid : (uint32_t)c->uid;
	return start(j);
}

int ckptop_warmup(struct cache *cache, struct peer *c, uint64_t req_id,
		  const Kvpalace__V1__WarmupRequest *in, const char **why)
{
	struct job *j;

	if (!cache->worker)
		return no_worker(why);
	j = job_new(cache, c, req_id, OP_WARMUP, in->name);
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	j->uid_dir = in->has_uid;
	j->uid = in->has_uid ? in->uid : (uint32_t)c->uid;
	return start(j);
}

int ckptop_list(struct cache *cache, struct peer *c, uint64_t req_id,
		const Kvpalace__V1__ListCheckpointsRequest *in, const char **why)
{
	struct job *j;

	if (in->has_uid && !c->admin) {
		*why = "only the admin socket lists another tenant's checkpoints";
		return -EPERM;
	}
	if (!cache->worker)
		return no_worker(why);
	j = job_new(cache, c, req_id, OP_LIST, NULL);
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	j->uid_dir = 1;
	j->uid = in->has_uid ? in->uid : (uint32_t)c->uid;
	j->all_uids = c->admin && !in->has_uid;
	j->verify = in->has_verify && in->verify;
	if (in->name) {
		j->only_name = 1;
		snprintf(j->name, sizeof(j->name), "%s", in->name);
	}
	return start(j);
}

int ckptop_remove(struct cache *cache, struct peer *c, uint64_t req_id,
		  const Kvpalace__V1__DeleteCheckpointRequest *in, const char **why)
{
	struct job *j;

	/* Only the caller's own directory: another tenant's names are not
	 * even looked at (the admin socket names a tenant with uid). */
	if (in->has_uid && !c->admin) {
		*why = "only the admin socket removes another tenant's checkpoint";
		return -EPERM;
	}
	if (cache->ckpt_dir_fd < 0) {
		*why = "no checkpoint directory (see the log at start)";
		return -EIO;
	}
	if (!cache->worker)
		return no_worker(why);
	j = job_new(cache, c, req_id, OP_REMOVE, in->name);
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	j->uid_dir = 1;
	j->uid = in->has_uid ? in->uid : (uint32_t)c->uid;
	return start(j);
}

int ckptop_check(const struct pool *p, uint32_t *refs)
{
	uint32_t n = 0;

	for (const struct list *it = p->jobs.next; it != &p->jobs; it = it->next) {
		const struct job *j = list_entry(it, struct job, link);

		for (uint32_t i = 0; i < j->n_slots; i++) {
			if (j->slots[i] == NO_SLOT)
				continue; /* not taken yet */
			if (j->slots[i] >= p->pa.n_pages)
				return -EUCLEAN;
			refs[j->slots[i]]++;
		}
		n++;
	}
	return n == p->n_jobs ? 0 : -EUCLEAN;
}

/* ---- start-up ------------------------------------------------------------- */

int ckptop_init(struct cache *c)
{
	char path[CONFIG_PATH_MAX + 16];
	struct dirent *de;
	uint32_t removed = 0;
	int state, created = 0, ret, err;
	DIR *d;
	int fd;

	c->ckpt_dir_fd = -1;
	/* The whole-cache check counts the pages jobs hold (daemon/core/whole.h). */
	c->check_pool_refs = ckptop_check;
	/* Every directory on the way to a checkpoint file is fsynced into
	 * its parent when created (ckpt_dir_open): a checkpoint reported
	 * durable never vanishes with a directory a power loss forgot. */
	state = ckpt_mkdir_p(c->cfg->state_dir, 0755);
	if (state < 0) {
		log_err("cannot create %s: %s; no checkpoints", c->cfg->state_dir,
			strerror(-state));
		return state;
	}
	snprintf(path, sizeof(path), "%s/checkpoints", c->cfg->state_dir);
	ret = ckpt_dir_open(state, "checkpoints", 1, 0700, &created);
	/* One created by a run that crashed before its fsync. A failure
	 * here is logged, not fatal: every directory this daemon creates is
	 * fsynced before anything in it is reported durable (ckpt_dir_open),
	 * so only one a crash left half-made is at stake. */
	err = ret >= 0 && !created ? ckpt_dir_sync(state) : 0;
	if (err < 0)
		log_err("cannot fsync %s: %s; a checkpoint directory a crash left may not be "
			"durable",
			c->cfg->state_dir, strerror(-err));
	close(state);
	if (ret < 0) {
		log_err("cannot create %s: %s; no checkpoints", path, strerror(-ret));
		return ret;
	}
	c->ckpt_dir_fd = ret;
	/* Tenants' directories created by a run that crashed before their
	 * fsync: made durable before anything new is reported so. */
	ret = ckpt_dir_sync(c->ckpt_dir_fd);
	if (ret < 0)
		log_err("cannot fsync %s: %s; a tenant's directory a crash left may not be "
			"durable",
			path, strerror(-ret));
	/* Temporaries of writes a crash interrupted. */
	fd = fcntl(c->ckpt_dir_fd, F_DUPFD_CLOEXEC, 3);
	d = fd >= 0 ? fdopendir(fd) : NULL;
	while (d && (de = readdir(d))) {
		uint32_t n = 0;
		int sub;

		if (de->d_name[0] == '.')
			continue;
		sub = openat(c->ckpt_dir_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (sub < 0)
			continue;
		ckpt_clean_temporaries(sub, &n);
		removed += n;
		close(sub);
	}
	if (d)
		closedir(d);
	else if (fd >= 0)
		close(fd);
	if (removed)
		log_notice("removed %u unfinished checkpoint files left by a crash", removed);
	return 0;
}

void ckptop_fini(struct cache *c)
{
	if (c->ckpt_dir_fd >= 0)
		close(c->ckpt_dir_fd);
	c->ckpt_dir_fd = -1;
}

int ckptop_warmup_dir(struct cache *c)
{
	struct job probe = {.c = c};
	struct dirent *de;
	int dir = open_dir(&probe, 0), loaded = 0;
	DIR *d;

	if (dir < 0)
		return 0; /* no warm-up directory: nothing to do */
	d = fdopendir(dir);
	if (!d) {
		close(dir);
		return 0;
	}
	while ((de = readdir(d))) {
		struct job *j;
		struct session *s;
		uint32_t shared;
		int ret;

		if (!ckpt_name_valid(de->d_name))
			continue;
		j = calloc(1, sizeof(*j));
		if (!j)
			break;
		j->c = c;
		j->op = OP_WARMUP;
		j->rd.fd = -1;
		list_init(&j->link);
		list_init(&j->waiter.link);
		snprintf(j->name, sizeof(j->name), "%.64s", de->d_name);
		/* The worker's steps, run here: nothing is served yet, and
		 * nothing can wait for disk writes (cold pages are dropped). */
		run_restore_open(j);
		ret = j->ret;
		if (ret == 0)
			ret = take_pool(j);
		if (ret == 0)
			ret = take_room(j, 0);
		if (ret == 0) {
			run_restore_read(j);
			ret = j->ret;
		}
		if (ret == 0)
			ret = build(j, &s, &shared);
		if (ret < 0) {
			restore_failed(j, ret);
		} else {
			cache_count(c, j->pool->uid, checkpoints_restored, 1);
			cache_count(c, j->pool->uid, warmed_up_pages,
				    j->meta.n_tokens / j->pool->layout.block_tokens);
			session_close(c, s);
			loaded++;
			log_ctx_info(JOB_LOG(j), "warm-up: %s, %llu tokens into pool %llu", j->name,
				     (unsigned long long)j->meta.n_tokens,
				     (unsigned long long)j->pool->id);
		}
		job_free(j);
	}
	closedir(d);
	return loaded;
}
