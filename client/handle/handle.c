/* client/handle/handle.c — freeing handles and growing their page tables.
 *
 * Layer: handle (client/README.md): above base/ and rpc/, below api/,
 * whose calls open the handles and tell the daemon about their ends;
 * nothing here talks to the daemon. A pool handle owns the handles of its
 * sessions and leases, so freeing a pool (kvp_pool_close, kvp_disconnect)
 * frees those too, then unmaps the host arena and the device arena
 * (devmap.c). Not thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "arena.h"
#include "devmap.h"
#include "handle.h"

int handle_table_reserve(uint32_t **slots, size_t *cap, uint64_t n)
{
	size_t want;
	uint32_t *p;

	if (n <= *cap)
		return 0;
	if (n > SIZE_MAX / sizeof(uint32_t) / 2)
		return -ENOMEM;
	want = *cap ? *cap : 16;
	while (want < n)
		want *= 2;
	p = realloc(*slots, want * sizeof(uint32_t));
	if (!p)
		return -ENOMEM;
	*slots = p;
	*cap = want;
	return 0;
}

void handle_session_free(struct kvp_session *s)
{
	list_del(&s->link);
	free(s->slots);
	free(s->dev_slots);
	free(s);
}

void handle_lease_free(struct kvp_lease *l)
{
	list_del(&l->link);
	free(l->slots);
	free(l->dev_slots);
	free(l);
}

void handle_pool_free(struct kvp_pool *p)
{
	while (!list_empty(&p->leases))
		handle_lease_free(list_entry(p->leases.next, struct kvp_lease, link));
	while (!list_empty(&p->sessions))
		handle_session_free(list_entry(p->sessions.next, struct kvp_session, link));
	shm_arena_unmap(p->arena, p->arena_bytes);
	devmap_unmap(p);
	list_del(&p->link);
	free(p);
}
