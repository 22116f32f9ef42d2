/* daemon/core/session.c — page tables, two-phase append, commit with dedup,
 * fork and truncate, and who owns a session until when (see session.h).
 *
 * Calls only down the core: the tiers for room and lossy copies (tier.h,
 * gpu.h), the closing session's placement (place.h) and the registry
 * (cache.h); compaction (compact.c) calls sessions, never the other
 * way. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "guard.h"
#include "lease.h"
#include "log.h"
#include "place.h"
#include "rtier.h"
#include "session.h"
#include "tier.h"

static uint32_t pages_for(const struct session *s, uint64_t n_tokens)
{
	uint32_t bt = s->pool->layout.block_tokens;

	return (uint32_t)((n_tokens + bt - 1) / bt);
}

static void unref_page(struct pool *p, uint32_t slot)
{
	pagealloc_unref(&p->pa, slot);
	prefix_index_update(&p->ix, &p->pa, slot);
}

static void ref_page(struct pool *p, uint32_t slot)
{
	pagealloc_ref(&p->pa, slot);
	prefix_index_update(&p->ix, &p->pa, slot);
}

/* Brings the writer's and the pool's counts of reserved pages up to date
 * with s. */
static void account_reserved(struct session *s)
{
	uint32_t now = s->account ? session_reserved_pages(s) : 0;

	if (s->account)
		s->account->reserved_pages = s->account->reserved_pages - s->reserved_counted + now;
	s->pool->reserved_pages = s->pool->reserved_pages - s->reserved_counted + now;
	s->reserved_counted = now;
}

/* The writer's hold ends: its account and the pool forget s. */
static void end_writer(struct session *s)
{
	if (s->account)
		s->account->reserved_pages -= s->reserved_counted;
	s->pool->reserved_pages -= s->reserved_counted;
	s->account = NULL;
	s->reserved_counted = 0;
	s->writer = NULL;
	list_del(&s->writer_link);
}

static struct session_policy *policy_of(const struct session *s)
{
	return (struct session_policy *)((char *)s->pol - offsetof(struct session_policy, pol));
}

void session_policy_unref(struct session_policy *sp)
{
	if (sp && --sp->refs == 0)
		free(sp);
}

/* The configured policy, shared: the cache's while the configuration
 * still says the same (a reload makes a new one for new sessions; the
 * old one lives while its sessions do). A reference for the caller, or
 * NULL (no memory). */
static struct session_policy *default_policy(struct cache *c)
{
	struct session_policy *sp = c->default_pol;
	struct policy want;

	memset(&want, 0, sizeof(want)); /* compared whole, padding included */
	policy_defaults(&want, (enum policy_kind)c->cfg->session_policy);
	want.budget = c->cfg->session_budget;
	want.auto_compact = (uint8_t)c->cfg->session_auto_compact;
	if (!sp || memcmp(&sp->pol, &want, sizeof(want))) {
		sp = calloc(1, sizeof(*sp));
		if (!sp)
			return NULL;
		sp->refs = 1; /* the cache's */
		sp->pol = want;
		session_policy_unref(c->default_pol);
		c->default_pol = sp;
	}
	sp->refs++;
	return sp;
}

int session_set_policy(struct session *s, const struct policy *pol)
{
	struct session_policy *sp = calloc(1, sizeof(*sp));

	if (!sp)
		return -ENOMEM;
	sp->refs = 1;
	sp->pol = *pol;
	session_policy_unref(policy_of(s));
	s->pol = &sp->pol;
	return 0;
}

int session_create(struct cache *c, struct pool *p, XXH128_hash_t root,
		   struct session **ret_session)
{
	struct session_policy *sp;
	struct session *s;

	if (p->n_sessions >= c->cfg->max_sessions_per_pool)
		return -EDQUOT;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	/* The configured policy; a client may set its own (compact.h). */
	sp = default_policy(c);
	if (!sp) {
		free(s);
		return -ENOMEM;
	}
	s->pol = &sp->pol;
	s->id = cache_new_id(c, p->uid);
	s->pool = p;
	tokvec_init(&s->tok, p->layout.block_tokens, &cache_tenant(c, p->uid)->meta_tokens);
	s->root = root;
	s->last_use_ns = clock_now_ns();
	list_init(&s->writer_link);
	list_init(&s->owner_link);
	if (idmap_put(&c->sessions, s->id, s) < 0) {
		session_policy_unref(sp);
		free(s);
		return -ENOMEM;
	}
	if (idseq_add(&p->by_id, s->id, s) < 0) {
		idmap_del(&c->sessions, s->id);
		session_policy_unref(sp);
		free(s);
		return -ENOMEM;
	}
	list_add_tail(&p->sessions, &s->pool_link);
	p->n_sessions++;
	*ret_session = s;
	return 0;
}

/* Drops pages from the end (leaves first) until keep remain. */
static void drop_pages_from(struct session *s, uint32_t keep)
{
	while (s->n_pages > keep)
		unref_page(s->pool, s->pages[--s->n_pages]);
	if (s->n_hashes > keep)
		s->n_hashes = keep;
}

void session_rollback(struct cache *c, struct session *s)
{
	(void)c;
	s->n_tokens = s->n_committed;
	tokvec_cut(&s->tok, s->n_tokens);
	drop_pages_from(s, pages_for(s, s->n_committed));
	gpu_session_trim(s);
	end_writer(s);
}

/* s leaves its owner's list (or the unowned one): owned by nobody, and
 * listed nowhere. */
static void disown(struct session *s)
{
	if (s->owner)
		s->owner->n_sessions--;
	else if (s->persistent)
		s->pool->n_unowned--;
	list_del(&s->owner_link);
	s->owner = NULL;
}

void session_own(struct cache *c, struct session *s, struct session_owner *o, int persistent)
{
	disown(s);
	if (s->persistent != !!persistent) {
		s->pool->n_persistent += persistent ? 1 : (uint32_t)-1;
		s->persistent = !!persistent;
	}
	s->owner = o;
	if (o) {
		list_add_tail(&o->sessions, &s->owner_link);
		o->n_sessions++;
	} else if (s->persistent) {
		list_add_tail(&c->unowned, &s->owner_link);
		s->pool->n_unowned++;
	}
}

void session_close(struct cache *c, struct session *s)
{
	uint32_t n_hashes;

	if (!s)
		return;
	disown(s);
	if (s->persistent)
		s->pool->n_persistent--;
	session_rollback(c, s);
	n_hashes = s->n_hashes;
	drop_pages_from(s, 0);
	place_session(c, s, n_hashes);
	gpu_session_free(s);
	idmap_del(&c->sessions, s->id);
	idseq_del(&s->pool->by_id, s->id);
	list_del(&s->pool_link);
	s->pool->n_sessions--;
	tokvec_fini(&s->tok);
	*s->tok.account -= s->cap_pages;
	free(s->hashes); /* and the pages after them */
	prefix_index_spans_free(&s->spans);
	session_policy_unref(policy_of(s));
	free(s);
}

int session_check_spans(const struct pindex_spans *have, const struct pindex_span *add, uint32_t n,
			uint64_t done, uint64_t to, const char **why)
{
	uint64_t after =
		have->n ? have->v[have->n - 1].first_token + have->v[have->n - 1].n_tokens : 0;

	if (n && add[0].first_token < after) {
		*why = "a key span overlaps or precedes one sent before";
		return -EINVAL;
	}
	if (n && add[0].first_token < done) {
		*why = "a key span starts on a page already hashed";
		return -EINVAL;
	}
	if (n && add[n - 1].first_token >= to) {
		*why = "a key span starts past the tokens it comes with";
		return -EINVAL;
	}
	return 0;
}

struct session *session_get(struct cache *c, uint64_t id, uid_t uid, int admin)
{
	struct session *s = idmap_get(&c->sessions, id);

	if (!s || (!admin && s->pool->uid != uid))
		return NULL;
	/* A client asked for it: in use (an admin's look is not). */
	if (!admin)
		s->last_use_ns = clock_now_ns();
	return s;
}

void session_owner_release(struct cache *c, struct session_owner *o, struct session_left *ret)
{
	struct list *it, *tmp;

	list_for_each_safe (it, tmp, &o->sessions) {
		struct session *s = list_entry(it, struct session, owner_link);
		struct pool *p = s->pool;
		uint32_t free_before = p->pa.n_free;

		if (s->persistent) {
			session_own(c, s, NULL, 1);
			ret->persistent++;
			continue;
		}
		ret->closed++;
		ret->tokens += s->n_tokens;
		ret->pages += s->n_pages;
		cache_count(c, p->uid, sessions_closed_with_conn, 1);
		session_close(c, s);
		ret->freed += p->pa.n_free - free_before;
	}
	kvp_assert(o->n_sessions == 0);
}

/* Expiries logged one by one per sweep; the rest in one line. */
#define EXPIRED_LOGGED_PER_SWEEP 16u

uint32_t session_expire_idle(struct cache *c, uint64_t now_ns, uint64_t timeout_ns)
{
	uint64_t tokens = 0, pages = 0;
	uint32_t n = 0;
	struct list *it, *tmp;

	list_for_each_safe (it, tmp, &c->unowned) {
		struct session *s = list_entry(it, struct session, owner_link);
		uint64_t idle = now_ns > s->last_use_ns ? now_ns - s->last_use_ns : 0;

		/* A live connection holding uncommitted tokens is using it. */
		if (s->writer || idle < timeout_ns)
			continue;
		if (n < EXPIRED_LOGGED_PER_SWEEP)
			log_ctx_notice(
				LOG_SESSION(s->pool->id, s->id, s->pool->uid),
				"session %llu of pool %llu (uid %u): persistent, owned by no "
				"connection and unused for %llu s (session-idle-timeout "
				"%llu s): closed, %llu tokens in %u pages",
				(unsigned long long)s->id, (unsigned long long)s->pool->id,
				(unsigned)s->pool->uid, (unsigned long long)(idle / 1000000000ull),
				(unsigned long long)(timeout_ns / 1000000000ull),
				(unsigned long long)s->n_tokens, s->n_pages);
		else {
			tokens += s->n_tokens;
			pages += s->n_pages;
		}
		cache_count(c, s->pool->uid, sessions_expired, 1);
		session_close(c, s);
		n++;
	}
	if (n > EXPIRED_LOGGED_PER_SWEEP)
		log_notice("%u more idle persistent sessions closed (session-idle-timeout): %llu "
			   "tokens in %llu pages",
			   n - EXPIRED_LOGGED_PER_SWEEP, (unsigned long long)tokens,
			   (unsigned long long)pages);
	return n;
}

/* The page and hash tables' first capacity: a short session (most of
 * them, by count) pays for two pages, not 64 (1.3 KB); longer ones
 * double from there, so growing stays O(1) amortized. */
#define SESSION_MIN_PAGES 2u

/* Makes positions [from, to) writable (to may pass n_tokens: room to
 * append), charged to the session's tenant, whose sessions together hold
 * at most max-tenant-tokens slots. -EDQUOT past it. */
static int prepare_tokens(struct cache *c, struct session *s, uint64_t from, uint64_t to,
			  int with_meta)
{
	return tokvec_prepare(&s->tok, s->n_tokens, from, to, c->cfg->max_tenant_tokens, with_meta);
}

int session_own_meta(struct cache *c, struct session *s, uint64_t from, uint64_t to)
{
	kvp_assert(from <= to && to <= s->n_tokens);
	return prepare_tokens(c, s, from, to, 1);
}

/* Untagged metadata of tokens [from, to) (prepared) at positions pos0
 * onwards. A chunk without metadata of its own already says so when
 * positions are indexes and the turn is 0 (the caller prepared with_meta
 * otherwise). */
static void default_meta(struct session *s, uint64_t from, uint64_t to, uint64_t pos0,
			 uint32_t turn)
{
	for (uint64_t i = from; i < to; i++) {
		if (!tokvec_has_meta(&s->tok, i)) {
			kvp_assert(pos0 + i - from == i && turn == 0);
			continue;
		}
		*tokvec_meta_w(&s->tok, i) =
			(struct token_meta){.pos = (uint32_t)(pos0 + i - from), .turn = turn};
	}
}

uint64_t session_next_pos(const struct session *s)
{
	return s->n_tokens ? (uint64_t)tokvec_meta(&s->tok, s->n_tokens - 1).pos + 1 : 0;
}

/* The slots growing the page and hash tables to need pages charges: they
 * double from SESSION_MIN_PAGES. */
static uint64_t pages_charge(const struct session *s, uint32_t need)
{
	uint64_t n = s->cap_pages ? s->cap_pages : SESSION_MIN_PAGES;

	if (need <= s->cap_pages)
		return 0;
	while (n < need)
		n *= 2;
	return n - s->cap_pages;
}

/* Makes room in the page and hash tables for need pages: a slot of about
 * 20 bytes each, charged with the tokens (-EDQUOT past
 * max-tenant-tokens). */
static int reserve_pages(struct cache *c, struct session *s, uint32_t need)
{
	uint64_t more = pages_charge(s, need), cap = s->cap_pages + more;
	XXH128_hash_t *h;

	if (!more)
		return 0;
	if (*s->tok.account + more > c->cfg->max_tenant_tokens)
		return -EDQUOT;
	/* One allocation for both tables, the hashes first (their
	 * alignment), the slots after them: a short session makes one
	 * malloc, not two. */
	h = malloc(cap * (sizeof(*s->hashes) + sizeof(*s->pages)));
	if (!h)
		return -ENOMEM;
	if (s->cap_pages) {
		memcpy(h, s->hashes, s->n_hashes * sizeof(*h));
		memcpy(h + cap, s->pages, s->n_pages * sizeof(*s->pages));
	}
	free(s->hashes);
	s->hashes = h;
	s->pages = (uint32_t *)(h + cap);
	*s->tok.account += more;
	s->cap_pages = (uint32_t)cap;
	return 0;
}

int session_append(struct cache *c, struct session *s, const void *writer, struct session_writer *w,
		   const uint32_t *tokens, size_t n, const struct session_tag *tag,
		   struct tier_park *pk, uint64_t *ret_first_token)
{
	struct pagealloc *pa = &s->pool->pa;
	uint64_t end = s->n_tokens + n, more, pos0;
	uint32_t need, have = s->n_pages, turn;
	int ret, with_meta;

	if (s->writer && s->writer != writer)
		return -EBUSY;
	if (end > c->cfg->max_session_tokens)
		return -EDQUOT;
	need = pages_for(s, end);
	/* Only new pages count: the tail of a partly committed last page
	 * was the session's already. */
	if (need > have && (uint64_t)w->reserved_pages + (need - have) > c->cfg->max_reserved_pages)
		return -EDQUOT;
	/* The tenant's slots too (the token chunks and page tables that
	 * prepare_tokens and reserve_pages charge below), before room is
	 * made: an append refused for max-tenant-tokens evicts nothing
	 * (tier.h). Making room changes no session's slots, so both pass
	 * after it. */
	more = tokvec_charge(&s->tok, s->n_tokens, end) + pages_charge(s, need);
	if (more && *s->tok.account + more > c->cfg->max_tenant_tokens)
		return -EDQUOT;
	ret = tier_make_room(c, s->pool, need - have, pk);
	if (ret < 0)
		return ret;
	/* Metadata is stored only where it differs from the default
	 * (position = index, untagged): an exact, untagged session keeps
	 * none (tokvec.h). */
	pos0 = session_next_pos(s);
	turn = tag && tag->has_turn ? tag->turn : s->cur_turn;
	with_meta = pos0 != s->n_tokens || turn || (tag && (tag->role || tag->flags));
	ret = prepare_tokens(c, s, s->n_tokens, end, with_meta);
	if (ret == 0)
		ret = reserve_pages(c, s, need);
	if (ret < 0)
		return ret;
	s->cur_turn = turn;
	default_meta(s, s->n_tokens, end, pos0, s->cur_turn);
	for (uint64_t i = s->n_tokens; tag && (tag->role || tag->flags) && i < end; i++) {
		tokvec_meta_w(&s->tok, i)->role = tag->role;
		tokvec_meta_w(&s->tok, i)->flags = tag->flags;
	}
	for (uint32_t i = have; i < need; i++) {
		ret = pagealloc_get(pa, &s->pages[i]);
		kvp_assert(ret == 0); /* tier_make_room made room */
	}
	s->n_pages = need;
	tokvec_put(&s->tok, s->n_tokens, n, tokens, NULL);
	*ret_first_token = s->n_tokens;
	s->n_tokens = end;
	s->last_use_ns = clock_now_ns();
	if (!s->writer) {
		s->writer = writer;
		s->account = w;
		list_add_tail(&w->sessions, &s->writer_link);
	}
	account_reserved(s);
	return 0;
}

/* Hashes full committed page i and lists it in the index, or adopts the
 * indexed page of the same content in place of the session's own. */
static void index_page(struct cache *c, struct pool *p, struct session *s, uint32_t i)
{
	uint32_t bt = p->layout.block_tokens;
	XXH128_hash_t parent = i ? s->hashes[i - 1] : s->root;
	XXH128_hash_t h = prefix_index_hash_keyed(parent, tokvec_ids_at(&s->tok, (uint64_t)i * bt),
						  bt, (uint64_t)i * bt, s->spans.v, s->spans.n);
	struct pindex_entry *e = prefix_index_find(&p->ix, h);
	int permanent = 0;

	for (uint64_t t = (uint64_t)i * bt; t < (uint64_t)(i + 1) * bt; t++)
		permanent |= tokvec_meta(&s->tok, t).flags & TOKEN_PERMANENT;
	s->hashes[i] = h;
	if (e && e->slot != PINDEX_NONE && e->slot != s->pages[i]) {
		/* Someone committed the same tokens after the same prefix:
		 * share their page, free ours (only we held it). */
		uint32_t own = s->pages[i];

		ref_page(p, e->slot);
		s->pages[i] = e->slot;
		kvp_assert(pagealloc_unref(&p->pa, own) == 0);
		p->ix.dedup_pages++;
	} else if (e && e->slot == PINDEX_NONE && e->io == PINDEX_IO_NONE) {
		/* Indexed on disk only (or dead): our page becomes its host
		 * copy, which saves reading it back. A lossy disk copy is
		 * not the same content: ours replaces it, it never stands in
		 * for ours. */
		if (prefix_index_lossy(e))
			tier_replace_lossy(p, e);
		prefix_index_attach_host(&p->ix, &p->pa, e, s->pages[i]);
	} else if (!e) {
		struct pindex_entry *pe = i ? prefix_index_find(&p->ix, parent) : NULL;

		/* -EEXIST (a 64-bit key collision) or -ENOMEM leave the page
		 * private: never indexed, never matched, still correct. So
		 * does a parent that is not indexed (it was never, or an
		 * admin purged it): no match could reach the page. */
		if ((!i || pe) && prefix_index_insert(&p->ix, &p->pa, h, pe, s->pages[i]) == 0) {
			if (!i)
				prefix_index_find(&p->ix, h)->root =
					s->root; /* for a purge by salt */
			kv_events_stored(p->events, p->id, p->uid, bt, h, i ? &parent : NULL,
					 KV_EVENT_HOST, tokvec_ids_at(&s->tok, (uint64_t)i * bt));
			rtier_committed(c, p, prefix_index_find(&p->ix, h));
		}
	}
	/* A page of a permanent span (system prompt, profile, summary)
	 * leaves the host tier last. */
	e = permanent ? prefix_index_find(&p->ix, h) : NULL;
	if (e)
		prefix_index_mark_permanent(&p->ix, &p->pa, e);
}

int session_commit(struct cache *c, struct session *s, const void *writer, uint64_t n,
		   uint32_t *ret_first_filled)
{
	uint32_t bt = s->pool->layout.block_tokens;
	uint64_t max_filled = config_max_tokens_per_request(c->cfg);
	uint32_t full;

	if (s->n_tokens == s->n_committed)
		return -ERANGE; /* nothing reserved */
	if (s->writer != writer)
		return -EBUSY;
	if (n > s->n_tokens - s->n_committed)
		return -ERANGE;
	/* The reply lists every page filled: refuse before changing anything
	 * what one reply could not list. */
	if ((s->n_committed + n) / bt - s->n_committed / bt > max_filled)
		return -E2BIG;
	/* The first page this commit may fill; a compacted session's pages
	 * fill without entering the index, so not n_hashes. */
	*ret_first_filled = (uint32_t)(s->n_committed / bt);
	s->n_committed += n;
	s->last_use_ns = clock_now_ns();
	full = (uint32_t)(s->n_committed / bt);
	/* A compacted session's pages hold kept tokens, not a prefix: they
	 * never enter the index. */
	while (!s->unindexed && s->n_hashes < full)
		index_page(c, s->pool, s, s->n_hashes++);
	rtier_commit_end(c, s->pool);
	account_reserved(s);
	if (s->n_committed == s->n_tokens)
		end_writer(s);
	return 0;
}

/* Replaces the session's page i by a private copy. */
static int copy_page(struct cache *c, struct session *s, uint32_t i, struct tier_park *pk)
{
	struct pool *p = s->pool;
	uint32_t slot;
	int ret;

	ret = tier_make_room(c, p, 1, pk);
	if (ret < 0)
		return ret;
	ret = pagealloc_get(&p->pa, &slot);
	kvp_assert(ret == 0);
	/* A client may have taken the memory away (guard.h). */
	ret = guard_memcpy((char *)p->arena + (uint64_t)slot * p->page_bytes,
			   (char *)p->arena + (uint64_t)s->pages[i] * p->page_bytes, p->page_bytes);
	if (ret < 0) {
		pagealloc_unref(&p->pa, slot);
		return ret;
	}
	unref_page(p, s->pages[i]);
	s->pages[i] = slot;
	return 0;
}

int session_truncate(struct cache *c, struct session *s, const void *writer, uint64_t n,
		     struct tier_park *pk, int *ret_copied)
{
	uint32_t bt = s->pool->layout.block_tokens;
	uint32_t keep = pages_for(s, n);
	int ret;

	if (s->writer && s->writer != writer)
		return -EBUSY;
	if (n > s->n_tokens)
		return -ERANGE;
	*ret_copied = 0;
	/* The new last page will be written again: it must be ours alone. */
	if (n % bt && s->pool->pa.refs[s->pages[keep - 1]] > 1) {
		ret = copy_page(c, s, keep - 1, pk);
		if (ret < 0)
			return ret;
		*ret_copied = 1;
	}
	drop_pages_from(s, keep);
	s->n_tokens = n;
	tokvec_cut(&s->tok, n);
	prefix_index_spans_cut(&s->spans, n);
	gpu_session_trim(s);
	if (s->n_committed > n)
		s->n_committed = n;
	if (s->n_hashes > s->n_committed / bt)
		s->n_hashes = (uint32_t)(s->n_committed / bt);
	account_reserved(s);
	if (s->writer && s->n_committed == s->n_tokens)
		end_writer(s);
	s->last_use_ns = clock_now_ns();
	return 0;
}

/* Gives empty session s the n tokens ids[0..n) with metadata meta[0..n)
 * (NULL: positions 0..n, untagged). */
static int set_tokens(struct cache *c, struct session *s, const uint32_t *ids,
		      const struct token_meta *meta, uint64_t n)
{
	int ret = prepare_tokens(c, s, 0, n, meta != NULL);

	if (ret < 0)
		return ret;
	tokvec_put(&s->tok, 0, n, ids, meta);
	if (!meta)
		default_meta(s, 0, n, 0, 0);
	return 0;
}

/* A new session of p holding the first n tokens of src (shared with it)
 * or, when src is NULL, the ids[0..n) untagged, whose page i is pages[i]
 * and whose full page i has chain hash hashes[i] (n_hashes known): full
 * pages shared, the partial last page copied. */
static int fork_from(struct cache *c, struct pool *p, XXH128_hash_t root, const struct tokvec *src,
		     const uint32_t *ids, const uint32_t *pages, const XXH128_hash_t *hashes,
		     uint32_t n_hashes, const struct pindex_spans *spans, uint64_t n,
		     struct tier_park *pk, struct session **ret_session)
{
	uint32_t bt = p->layout.block_tokens;
	uint32_t full = (uint32_t)(n / bt), need = (uint32_t)((n + bt - 1) / bt);
	struct session *f;
	int ret;

	ret = session_create(c, p, root, &f);
	if (ret < 0)
		return ret;
	ret = src ? tokvec_share(&f->tok, src, n) : set_tokens(c, f, ids, NULL, n);
	if (ret == 0)
		ret = prefix_index_spans_copy(&f->spans, spans->v, spans->n, n);
	if (ret == 0)
		ret = reserve_pages(c, f, need ? need : 1);
	if (ret < 0)
		goto fail;
	for (uint32_t i = 0; i < full; i++) {
		f->pages[i] = pages[i];
		ref_page(p, f->pages[i]);
	}
	f->n_pages = full;
	f->n_hashes = full < n_hashes ? full : n_hashes;
	if (f->n_hashes)
		memcpy(f->hashes, hashes, f->n_hashes * sizeof(XXH128_hash_t));
	if (need > full) {
		/* The partial last page: the fork gets its own copy. */
		f->pages[full] = pages[full];
		ref_page(p, f->pages[full]);
		f->n_pages = need;
		ret = copy_page(c, f, full, pk);
		if (ret < 0)
			goto fail;
	}
	f->n_tokens = f->n_committed = n;
	*ret_session = f;
	return 0;
fail:
	session_close(c, f);
	return ret;
}

int session_fork(struct cache *c, struct session *s, uint64_t n, struct tier_park *pk,
		 struct session **ret_session)
{
	int ret;

	if (n > s->n_committed)
		return -ERANGE;
	s->last_use_ns = clock_now_ns();
	ret = fork_from(c, s->pool, s->root, &s->tok, NULL, s->pages, s->hashes, s->n_hashes,
			&s->spans, n, pk, ret_session);
	if (ret == 0) {
		/* The fork keeps the policy, the tags and, when compacted, the
		 * privacy of its pages. */
		session_policy_unref(policy_of(*ret_session));
		policy_of(s)->refs++;
		(*ret_session)->pol = s->pol;
		(*ret_session)->cur_turn = s->cur_turn;
		(*ret_session)->compacted = s->compacted;
		(*ret_session)->unindexed = s->unindexed;
	}
	return ret;
}

int session_fork_lease(struct cache *c, const struct lease *l, uint64_t n, struct tier_park *pk,
		       struct session **ret_session)
{
	int ret;

	if (n > l->n_tokens)
		return -ERANGE;
	ret = fork_from(c, l->pool, l->root, NULL, l->tokens, l->pages, l->hashes, l->n_pages,
			&l->spans, n, pk, ret_session);
	/* What is computed on purged pages must not enter the index either. */
	if (ret == 0)
		(*ret_session)->unindexed = l->purged;
	return ret;
}

uint32_t session_reserved_pages(const struct session *s)
{
	return s->n_pages - pages_for(s, s->n_committed);
}

uint32_t session_pool_reserved_pages(const struct pool *p)
{
	const struct list *it;
	uint32_t n = 0;

	for (it = p->sessions.next; it != &p->sessions; it = it->next)
		n += session_reserved_pages(list_entry(it, struct session, pool_link));
	return n;
}

uint32_t session_shared_pages(const struct session *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->n_pages; i++)
		n += s->pool->pa.refs[s->pages[i]] > 1;
	return n;
}

int session_restore(struct cache *c, struct pool *p, XXH128_hash_t root, const uint32_t *tokens,
		    const struct token_meta *meta, uint64_t n, const uint32_t *slots, int lossy,
		    const struct pindex_span *spans, uint32_t n_spans, struct session **ret_session,
		    uint32_t *ret_shared)
{
	uint32_t bt = p->layout.block_tokens;
	uint32_t need = (uint32_t)((n + bt - 1) / bt), full = (uint32_t)(n / bt);
	uint64_t dedup_before = p->ix.dedup_pages;
	struct session *s;
	int ret;

	if (n > c->cfg->max_session_tokens)
		return -EDQUOT;
	ret = session_create(c, p, root, &s);
	if (ret < 0)
		return ret;
	ret = set_tokens(c, s, tokens, meta, n);
	if (ret == 0)
		ret = prefix_index_spans_copy(&s->spans, spans, n_spans, n);
	if (ret == 0)
		ret = reserve_pages(c, s, need ? need : 1);
	if (ret < 0) {
		session_close(c, s);
		return ret;
	}
	for (uint64_t i = 0; i < n; i++)
		s->compacted |= tokvec_meta(&s->tok, i).pos != i;
	s->unindexed = s->compacted || lossy;
	if (n)
		s->cur_turn = tokvec_meta(&s->tok, n - 1).turn;
	/* The session takes over the slots' references. */
	memcpy(s->pages, slots, need * sizeof(uint32_t));
	s->n_pages = need;
	s->n_tokens = s->n_committed = n;
	while (!s->unindexed && s->n_hashes < full)
		index_page(c, p, s, s->n_hashes++);
	rtier_commit_end(c, p);
	*ret_shared = (uint32_t)(p->ix.dedup_pages - dedup_before);
	*ret_session = s;
	return 0;
}
