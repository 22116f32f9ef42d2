/* daemon/session.c — session page tables, two-phase append (see session.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "session.h"

int session_create(struct cache *c, struct pool *p, struct session **ret_session)
{
	struct session *s;

	if (p->n_sessions >= c->cfg->max_sessions_per_pool)
		return -EDQUOT;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->id = cache_new_id(c);
	s->pool = p;
	list_init(&s->writer_link);
	if (idmap_put(&c->sessions, s->id, s) < 0) {
		free(s);
		return -ENOMEM;
	}
	list_add_tail(&p->sessions, &s->pool_link);
	p->n_sessions++;
	*ret_session = s;
	return 0;
}

static void drop_pages_from(struct session *s, uint32_t keep)
{
	while (s->n_pages > keep)
		pagealloc_unref(&s->pool->pa, s->pages[--s->n_pages]);
}

static uint32_t pages_for(const struct session *s, uint64_t n_tokens)
{
	uint32_t bt = s->pool->layout.block_tokens;

	return (uint32_t)((n_tokens + bt - 1) / bt);
}

void session_rollback(struct cache *c, struct session *s)
{
	(void)c;
	s->n_tokens = s->n_committed;
	drop_pages_from(s, pages_for(s, s->n_committed));
	s->writer = NULL;
	list_del(&s->writer_link);
}

void session_close(struct cache *c, struct session *s)
{
	if (!s)
		return;
	session_rollback(c, s);
	drop_pages_from(s, 0);
	idmap_del(&c->sessions, s->id);
	list_del(&s->pool_link);
	s->pool->n_sessions--;
	free(s->tokens);
	free(s->pages);
	free(s);
}

struct session *session_get(struct cache *c, uint64_t id, uid_t uid, int admin)
{
	struct session *s = idmap_get(&c->sessions, id);

	if (!s || (!admin && s->pool->uid != uid))
		return NULL;
	return s;
}

static int grow(void **arr, uint64_t *cap, uint64_t need, size_t elem)
{
	uint64_t n = *cap ? *cap : 64;
	void *p;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	p = realloc(*arr, n * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = n;
	return 0;
}

int session_append(struct cache *c, struct session *s, const void *writer, struct list *writer_list,
		   const uint32_t *tokens, size_t n, uint64_t *ret_first_token)
{
	struct pagealloc *pa = &s->pool->pa;
	uint64_t end = s->n_tokens + n;
	uint32_t need, have = s->n_pages;
	uint64_t cap_pages = s->cap_pages;
	int ret;

	if (s->writer && s->writer != writer)
		return -EBUSY;
	if (end > c->cfg->max_session_tokens)
		return -EDQUOT;
	need = pages_for(s, end);
	if (need - have > pa->n_free)
		return -ENOSPC;
	ret = grow((void **)&s->tokens, &s->cap_tokens, end, sizeof(uint32_t));
	if (ret < 0)
		return ret;
	ret = grow((void **)&s->pages, &cap_pages, need, sizeof(uint32_t));
	if (ret < 0)
		return ret;
	s->cap_pages = (uint32_t)cap_pages;
	for (uint32_t i = have; i < need; i++) {
		ret = pagealloc_get(pa, &s->pages[i]);
		kvp_assert(ret == 0); /* n_free was checked above */
	}
	s->n_pages = need;
	memcpy(s->tokens + s->n_tokens, tokens, n * sizeof(uint32_t));
	*ret_first_token = s->n_tokens;
	s->n_tokens = end;
	if (!s->writer) {
		s->writer = writer;
		list_add_tail(writer_list, &s->writer_link);
	}
	return 0;
}

int session_commit(struct cache *c, struct session *s, const void *writer, uint64_t n)
{
	(void)c;
	if (s->n_tokens == s->n_committed)
		return -ERANGE; /* nothing reserved */
	if (s->writer != writer)
		return -EBUSY;
	if (n > s->n_tokens - s->n_committed)
		return -ERANGE;
	s->n_committed += n;
	if (s->n_committed == s->n_tokens) {
		s->writer = NULL;
		list_del(&s->writer_link);
	}
	return 0;
}

uint32_t session_reserved_pages(const struct session *s)
{
	return s->n_pages - pages_for(s, s->n_committed);
}

uint64_t session_common_prefix(const struct session *s, uint64_t from, const uint32_t *tokens,
			       size_t n)
{
	uint64_t i = 0;

	while (from + i < s->n_committed && i < n && s->tokens[from + i] == tokens[i])
		i++;
	return i;
}
