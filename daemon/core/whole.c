/* daemon/core/whole.c — the whole cache at once: the invariant check and
 * the teardown (see whole.h).
 *
 * Both walk every pool, session and lease and what holds their pages, so
 * they sit at the top of the core and call down into every file of it:
 * once they were cache.c's, which made the registry at the bottom call the
 * pools, sessions and leases that call it (issue 15).
 *
 * Checkpoint jobs (daemon/service/ckptop.c, above the core) hold page
 * references too; the check must count them or every slot a job holds
 * would read as leaked. They reach it through a hook, cache.check_pool_refs,
 * which ckptop_init sets to ckptop_check — the function pointer an upper
 * layer hands down (loop_op.cb, tier_waiter.wake) — rather than through a
 * count kept in a core-level structure: the job's own slot list (with its
 * slots not yet taken) stays the one record the check reads, where a second
 * count updated beside it at every take and release could drift from it
 * exactly as the check is there to catch, and would say how many references
 * but not on which slots. With no hook set, a pool with jobs fails the
 * check. Event-loop thread only.
 */
#include <errno.h>
#include <stdlib.h>

#include "compact.h"
#include "gpu.h"
#include "lease.h"
#include "pool.h"
#include "session.h"
#include "tier.h"
#include "tokvec.h"
#include "whole.h"

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
	/* Every session has let go of it: the cache's reference is the last. */
	session_policy_unref(c->default_pol);
	c->default_pol = NULL;
	kv_events_fini(&c->events);
	cache_registry_fini(c);
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
	if (persistent != p->n_persistent || unowned != p->n_unowned ||
	    session_pool_reserved_pages(p) != p->reserved_pages ||
	    idseq_count(&p->by_id) != p->n_sessions)
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
	/* Jobs above the core (checkpoints) hold pages too: counted by the
	 * hook their layer set, and none may exist without it. */
	if (tier_check(p, refs) < 0 || rtier_check(p, refs) < 0 ||
	    (c->check_pool_refs ? c->check_pool_refs(p, refs) < 0
				: p->n_jobs || !list_empty(&p->jobs)) ||
	    compact_check(p, refs) < 0 || gpu_check(p, refs) < 0)
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
