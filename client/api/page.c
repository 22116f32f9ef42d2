/* client/api/page.c — page views: where a session's or a lease's page lies
 * in this process's mapping of the arena, with the strides of its layout
 * (kvp_session_page, kvp_lease_page), so an engine copies whole runs (a
 * page, a layer's K) instead of calling kvp_session_kv once per row.
 *
 * Pure reads of the handle's page table, as kvp_session_kv and
 * kvp_lease_kv are (the view's addresses are theirs: handle_page_view
 * computes them with shm/layout.h's offsets); nothing goes to the daemon.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api (client/README.md): uses handle/ only.
 */
#include <errno.h>

#include "handle.h"

KVP_PUBLIC int kvp_session_page(kvp_session *s, uint64_t page, struct kvp_page_view *ret)
{
	const struct kvp_pool *p;
	uint64_t bt, left;

	if (!s || !ret)
		return -EINVAL;
	p = s->pool;
	/* After a lost connection the daemon has freed our uncommitted slots
	 * and may lend them to someone else: hand out no more addresses. */
	if (p->client->dead)
		return -ENOTCONN;
	bt = p->layout.block_tokens;
	if (page >= pool_pages_for(p, s->n_tokens))
		return -ERANGE;
	left = s->n_tokens - page * bt;
	handle_page_view(p, s->slots[page], page, (uint32_t)(left < bt ? left : bt), ret);
	return 0;
}

KVP_PUBLIC int kvp_lease_page(const kvp_lease *l, uint64_t page, struct kvp_page_view *ret)
{
	const struct kvp_pool *p;

	if (!l || !ret)
		return -EINVAL;
	p = l->pool;
	/* A lost connection ended the lease: the pages may be reused. */
	if (p->client->dead)
		return -ENOTCONN;
	if (page >= l->n_tokens / p->layout.block_tokens)
		return -ERANGE;
	handle_page_view(p, l->slots[page], page, p->layout.block_tokens, ret);
	return 0;
}
