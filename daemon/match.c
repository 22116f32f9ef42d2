/* daemon/match.c — longest committed prefix across sessions (see match.h). */
#include <errno.h>
#include <stdlib.h>

#include "match.h"
#include "session.h"

static uint32_t pages_for(const struct pool *p, uint64_t n_tokens)
{
	return (uint32_t)((n_tokens + p->layout.block_tokens - 1) / p->layout.block_tokens);
}

/* Keeps in l->cands the sessions among `sessions` that match furthest from
 * position `from`; returns that length. */
static uint64_t narrow(struct cache *c, struct lease *l, struct session **sessions, size_t n_sess,
		       uint64_t from, const uint32_t *tokens, size_t n)
{
	uint64_t best = 0;

	(void)c;
	l->n_cands = 0;
	for (size_t i = 0; i < n_sess; i++) {
		uint64_t m = session_common_prefix(sessions[i], from, tokens, n);

		if (m == 0 || m < best)
			continue;
		if (m > best) {
			best = m;
			l->n_cands = 0;
		}
		if (l->n_cands < MATCH_MAX_CANDIDATES)
			l->cands[l->n_cands++] = sessions[i]->id;
	}
	return best;
}

/* Pins the pages of positions [old_end, l->n_tokens) from session s and
 * reports them; the partial page at old_end is re-pinned from s. */
static int extend_pages(struct lease *l, const struct session *s, uint64_t old_end,
			struct match_result *ret)
{
	struct pool *p = l->pool;
	uint32_t bt = p->layout.block_tokens;
	uint32_t from = (uint32_t)(old_end / bt);
	uint32_t need = pages_for(p, l->n_tokens);
	int ret_add;

	if (old_end % bt && from < l->n_pages) {
		/* The old last page ends mid-page: take s's copy of it, which
		 * also holds the positions that follow. */
		pagealloc_pin(&p->pa, s->pages[from]);
		pagealloc_unpin(&p->pa, l->pages[from]);
		l->pages[from] = s->pages[from];
	}
	ret_add = lease_add_pages(l, s->pages + l->n_pages, need - l->n_pages);
	if (ret_add < 0)
		return ret_add;
	ret->first_page = from;
	ret->slots = l->pages + from;
	ret->n_slots = l->n_pages - from;
	return 0;
}

int match_start(struct cache *c, struct pool *p, struct session *only, const void *owner,
		struct list *owner_list, const uint32_t *tokens, size_t n, struct lease **ret_lease,
		struct match_result *ret)
{
	struct session **all;
	struct lease *l;
	size_t n_sess = 0;
	uint64_t m;
	int err;

	*ret = (struct match_result){0};
	all = malloc((only ? 1 : p->n_sessions + 1) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	if (only) {
		all[n_sess++] = only;
	} else {
		for (struct list *it = p->sessions.next; it != &p->sessions; it = it->next)
			all[n_sess++] = list_entry(it, struct session, pool_link);
	}
	err = lease_create(c, p, owner, owner_list, &l);
	if (err < 0)
		goto out;
	l->cands = malloc((n_sess < MATCH_MAX_CANDIDATES ? n_sess : MATCH_MAX_CANDIDATES) *
				  sizeof(uint64_t) +
			  1);
	if (!l->cands) {
		lease_release(c, l);
		err = -ENOMEM;
		goto out;
	}
	m = narrow(c, l, all, n_sess, 0, tokens, n);
	if (m == 0) {
		lease_release(c, l);
		err = 0;
		goto out;
	}
	l->n_tokens = m;
	l->complete = m < n;
	err = extend_pages(l, session_get(c, l->cands[0], p->uid, 0), 0, ret);
	if (err < 0) {
		lease_release(c, l);
		goto out;
	}
	*ret_lease = l;
	err = 1;
out:
	free(all);
	return err;
}

int match_extend(struct cache *c, struct lease *l, const uint32_t *tokens, size_t n,
		 struct match_result *ret)
{
	struct session *alive[MATCH_MAX_CANDIDATES];
	size_t n_alive = 0;
	uint64_t old_end = l->n_tokens, m;

	*ret = (struct match_result){.first_page = l->n_pages};
	if (l->complete)
		return 0;
	for (uint32_t i = 0; i < l->n_cands; i++) {
		struct session *s = session_get(c, l->cands[i], l->pool->uid, 0);

		/* A candidate closed since, or now in another state, is skipped. */
		if (s && s->pool == l->pool && s->n_committed >= old_end)
			alive[n_alive++] = s;
	}
	m = narrow(c, l, alive, n_alive, old_end, tokens, n);
	if (m < n)
		l->complete = 1;
	if (m == 0)
		return 0;
	l->n_tokens += m;
	return extend_pages(l, session_get(c, l->cands[0], l->pool->uid, 0), old_end, ret);
}
