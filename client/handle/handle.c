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
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "devmap.h"
#include "handle.h"
#include "rpc.h"

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
	while (!list_empty(&p->async)) {
		struct handle_async *op = list_entry(p->async.next, struct handle_async, link);

		list_del(&op->link);
		rpc_forget(p->client, op);
		op->free(op);
	}
	while (!list_empty(&p->leases))
		handle_lease_free(list_entry(p->leases.next, struct kvp_lease, link));
	while (!list_empty(&p->sessions))
		handle_session_free(list_entry(p->sessions.next, struct kvp_session, link));
	shm_arena_unmap(p->arena, p->arena_bytes);
	if (p->arena_fd >= 0)
		close(p->arena_fd);
	free(p->prefaulted);
	devmap_unmap(p);
	list_del(&p->link);
	free(p);
}

static int prefault_on(struct kvp_pool *p)
{
	const char *e;

	if (!p->prefault) {
		e = getenv("KVPALACE_PREFAULT");
		p->prefault = e && !strcmp(e, "0") ? -1 : 1;
		/* Our mapping is advised and aligned: THP when the kernel's
		 * setting gives it. (A hugetlb arena faults per 2 MiB
		 * anyway.) */
		p->prefault_huge = shm_thp_mode() == SHM_THP_ADVISE;
	}
	if (p->prefault > 0 && !p->prefaulted) {
		/* A bit per slot: 4 KiB for a 64 GiB arena of 2 MiB pages. */
		p->prefaulted = calloc((size_t)p->n_pages / 64 + 1, sizeof(uint64_t));
		if (!p->prefaulted)
			return 0; /* try again next time */
	}
	return p->prefault > 0;
}

static int prefaulted(const struct kvp_pool *p, uint32_t slot)
{
	return (p->prefaulted[slot / 64] >> (slot % 64)) & 1;
}

void handle_populate(struct kvp_pool *p, const uint32_t *slots, uint64_t n, int write)
{
	uint64_t i = 0, j;
	int ret;

	if (!n || !prefault_on(p) || (!write && !p->prefault_huge))
		return;
	while (i < n) {
		if (slots[i] >= p->n_pages || prefaulted(p, slots[i])) {
			i++;
			continue;
		}
		/* A run of neighbouring slots not done yet: one call. */
		for (j = i + 1; j < n && slots[j] == slots[j - 1] + 1 && slots[j] < p->n_pages &&
				!prefaulted(p, slots[j]);
		     j++)
			;
		ret = shm_populate(p->pages + (uint64_t)slots[i] * p->page_bytes,
				   (j - i) * p->page_bytes);
		if (ret == -EINVAL) {
			/* Older than Linux 5.14: faults it is. */
			p->prefault = -1;
			return;
		}
		if (ret == 0)
			for (uint64_t k = i; k < j; k++)
				p->prefaulted[slots[k] / 64] |= UINT64_C(1) << (slots[k] % 64);
		i = j;
	}
}

void handle_lease_populate(struct kvp_lease *l)
{
	if (l->id && l->tier == KVP_TIER_HOST)
		handle_populate(l->pool, l->slots, pool_pages_for(l->pool, l->n_tokens), 0);
}

void handle_page_view(const struct kvp_pool *p, uint32_t slot, uint64_t page, uint32_t n_tokens,
		      struct kvp_page_view *v)
{
	const struct shm_layout *l = &p->shm;
	unsigned char *base = p->pages + (uint64_t)slot * p->page_bytes;

	memset(v, 0, sizeof(*v));
	v->base = base;
	v->first_pos = page * l->block_tokens;
	v->n_tokens = n_tokens;
	v->slot = slot;
	v->row_bytes = (size_t)shm_row_bytes(l);
	v->token_stride = v->row_bytes;
	/* data[layer][k|v][kv_head][token][head_dim], latent data[layer][token]
	 * [head_dim]: one plane, kv_stride = layer_stride (shm/layout.h) */
	v->head_stride = v->token_stride * l->block_tokens;
	v->kv_stride = v->head_stride * l->n_kv_heads;
	v->layer_stride = shm_layout_planes(l) * v->kv_stride;
	v->data_bytes = (size_t)shm_page_data_bytes(l);
	v->page_bytes = (size_t)p->page_bytes;
	if (shm_dtype_quantized(l->dtype)) {
		size_t srow = (size_t)(l->head_dim / l->quant_group) * 2;

		v->scales = base + shm_scale_offset(l, 0, 0, 0, 0);
		v->scale_row_bytes = srow;
		v->scale_token_stride = srow;
		v->scale_head_stride = srow * l->block_tokens;
		v->scale_kv_stride = v->scale_head_stride * l->n_kv_heads;
		v->scale_layer_stride = shm_layout_planes(l) * v->scale_kv_stride;
	} else if (shm_dtype_raw(l->dtype)) {
		/* one f32 per (layer, plane): scales[layer][k|v] */
		v->scales = base + shm_raw_scale_offset(l, 0, 0);
		v->scale_row_bytes = 4;
		v->scale_kv_stride = 4;
		v->scale_layer_stride = shm_layout_planes(l) * 4;
	}
}
