/* client/api/gpu.c — the GPU tier in the client library: a pool's device
 * arena, device copies of read leases, and GPU-tier matches.
 *
 * Layer: api (client/README.md): the public calls, above handle/, rpc/
 * and base/.
 *
 * A pool whose OpenPool reply says it has a device arena is mapped into
 * this process on first use (kvp_pool_gpu_open): OpenDeviceArena returns
 * the arena's POSIX fd over SCM_RIGHTS (or a legacy CUDA IPC handle) and
 * the device's UUID, which handle/devmap.c imports. In a build without
 * CUDA, or where this process sees no such device, the pool stays
 * host-only: kvp_pool_gpu_open says why and every host call keeps working.
 *
 * A GPU-tier match is an ordinary match (the daemon pins host pages) that
 * asked for TIER_GPU, followed by LeaseDevice, which the daemon answers
 * once its host→device copies are done. Library code: never logs. Not
 * thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmap.h"
#include "handle.h"
#include "keys.h"
#include "lease.h"
#include "rpc.h"

KVP_PUBLIC int kvp_pool_has_gpu(const kvp_pool *p)
{
	return p && p->dev_arena;
}

KVP_PUBLIC uint32_t kvp_pool_gpu_pages(const kvp_pool *p)
{
	return p && p->dev_arena ? p->dev_n_pages : 0;
}

KVP_PUBLIC int kvp_pool_gpu_open(kvp_pool *p)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenDeviceArenaRequest op = KVPALACE__V1__OPEN_DEVICE_ARENA_REQUEST__INIT;
	const Kvpalace__V1__OpenDeviceArenaResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	int fd = -1;
	int ret;

	if (!p)
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	if (p->dev_base)
		return 0;
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (!p->dev_arena)
		return conn_error(c, -EOPNOTSUPP,
				  "the daemon gave this pool no device arena (no GPU tier)");
	op.pool_id = p->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA;
	req.open_device_arena = &op;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_OPEN_DEVICE_ARENA, &resp, &fd);
	if (ret < 0)
		return ret;
	r = resp->open_device_arena;
	if (r->pool_id != p->id || r->page_bytes != p->page_bytes || !r->page_bytes ||
	    r->n_pages > r->arena_bytes / r->page_bytes) {
		if (fd >= 0)
			close(fd);
		return conn_break(c, -EPROTO, "kvpalaced sent a device arena that does not fit");
	}
	ret = devmap_import(p, r, fd);
	/* The mapping holds the allocation; the fd is not needed any more. */
	if (fd >= 0)
		close(fd);
	if (ret == -EPROTO)
		return conn_break(c, ret, "kvpalaced sent an unusable device arena handle");
	if (ret == -EOPNOTSUPP)
		return conn_error(c, ret, "libkvpalace was built without CUDA");
	if (ret < 0)
		return conn_error(c, ret,
				  ret == -ENODEV ? "this process cannot see the daemon's GPU"
						 : "cannot map the pool's device arena");
	p->dev_n_pages = r->n_pages;
	return 0;
}

/* Asks the daemon for device copies of every page of l (LeaseDevice) and
 * records their device slots. Returns 0 or a negative errno. */
static int lease_device(struct kvp_lease *l)
{
	struct kvp_pool *p = l->pool;
	struct kvp_client *c = p->client;
	uint64_t n_pages = l->n_tokens / p->layout.block_tokens;
	int ret;

	if (!l->id || !n_pages)
		return 0;
	ret = handle_table_reserve(&l->dev_slots, &l->dev_cap, n_pages);
	if (ret < 0)
		return conn_error(c, ret, "out of memory");
	while (l->n_dev < n_pages) {
		Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
		Kvpalace__V1__LeaseDeviceRequest ld = KVPALACE__V1__LEASE_DEVICE_REQUEST__INIT;
		const Kvpalace__V1__LeaseDeviceResponse *r;
		Kvpalace__V1__Response *resp;

		ld.lease_id = l->id;
		ld.has_first_page = 1;
		ld.first_page = l->n_dev;
		req.op_case = KVPALACE__V1__REQUEST__OP_LEASE_DEVICE;
		req.lease_device = &ld;
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_LEASE_DEVICE, &resp, NULL);
		if (ret < 0)
			return ret;
		r = resp->lease_device;
		if (r->lease_id != l->id || r->first_page != l->n_dev || !r->n_device_slots ||
		    r->n_device_slots > n_pages - l->n_dev)
			return conn_break(c, -EPROTO,
					  "kvpalaced answered LeaseDevice with %zu "
					  "slots from page %llu",
					  r->n_device_slots, (unsigned long long)r->first_page);
		for (size_t i = 0; i < r->n_device_slots; i++)
			if (r->device_slots[i] >= p->dev_n_pages)
				return conn_break(c, -EPROTO,
						  "kvpalaced gave a device slot past the arena");
		memcpy(l->dev_slots + l->n_dev, r->device_slots,
		       r->n_device_slots * sizeof(uint32_t));
		l->n_dev += r->n_device_slots;
	}
	return 0;
}

KVP_PUBLIC int kvp_match_prefix_tier(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
				     unsigned int flags, kvp_lease **ret_lease)
{
	return lease_match_any(p, tokens, n, tier, flags, NULL, ret_lease);
}

KVP_PUBLIC int kvp_match_prefix_opts(kvp_pool *p, const uint32_t *tokens, size_t n,
				     const struct kvp_match_opts *opts, kvp_lease **ret_lease)
{
	struct kvp_match_opts o;
	int ret = keys_match_opts(p, opts, &o);

	if (ret < 0)
		return ret;
	if (!ret_lease)
		return -EINVAL;
	return lease_match_any(p, tokens, n, o.tier ? o.tier : KVP_TIER_HOST, o.flags, &o,
			       ret_lease);
}

int lease_match_any(struct kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		    unsigned int flags, const struct kvp_match_opts *keys,
		    struct kvp_lease **ret_lease)
{
	struct kvp_client *c;
	struct kvp_lease *l;
	int or_host = (flags & KVP_TIER_OR_HOST) != 0;
	int ret;

	if (!p || !ret_lease || (flags & ~KVP_TIER_OR_HOST) ||
	    (tier != KVP_TIER_GPU && tier != KVP_TIER_HOST))
		return -EINVAL;
	c = p->client;
	if (tier == KVP_TIER_HOST)
		return lease_match_tier(p, tokens, n, KVP_TIER_HOST, 0, keys, ret_lease);
	/* Map the arena first: when this process cannot, the daemon need not
	 * pin anything for a GPU lease. */
	if (p->dev_arena && !p->dev_base) {
		ret = kvp_pool_gpu_open(p);
		if (ret < 0 && c->dead)
			return ret;
		if (ret < 0 && !or_host)
			return ret;
	}
	ret = lease_match_tier(p, tokens, n,
			       p->dev_base ? KVP_TIER_GPU : (p->dev_arena ? KVP_TIER_HOST : tier),
			       or_host, keys, &l);
	if (ret < 0)
		return ret;
	if (l->tier == KVP_TIER_GPU) {
		ret = lease_device(l);
		if (ret < 0 && !c->dead && or_host) {
			/* The host pages are pinned already: serve those. */
			l->tier = KVP_TIER_HOST;
			l->n_dev = 0;
			ret = 0;
		}
		if (ret < 0) {
			/* Give the lease back; report why it failed. */
			int code = c->err_code;
			char msg[CONN_ERR_MSG_BYTES];

			memcpy(msg, c->err_msg, sizeof(msg));
			kvp_lease_release(l);
			c->err_code = code;
			memcpy(c->err_msg, msg, sizeof(msg));
			return ret;
		}
	}
	*ret_lease = l;
	return 0;
}

KVP_PUBLIC uint32_t kvp_lease_tier(const kvp_lease *l)
{
	return l ? l->tier : 0;
}

KVP_PUBLIC void *kvp_lease_device_kv(const kvp_lease *l, uint64_t pos, uint32_t layer, uint32_t kv,
				     uint32_t kv_head)
{
	const struct kvp_pool *p;
	uint64_t page;

	if (!l || l->tier != KVP_TIER_GPU || pos >= l->n_tokens)
		return NULL;
	p = l->pool;
	page = pos / p->layout.block_tokens;
	if (p->client->dead || !p->dev_base || page >= l->n_dev ||
	    pool_check_index(p, layer, kv, kv_head) < 0)
		return NULL;
	return (void *)(uintptr_t)(p->dev_base + (uint64_t)l->dev_slots[page] * p->page_bytes +
				   shm_kv_offset(&p->shm, layer, kv, kv_head,
						 (uint32_t)(pos % p->layout.block_tokens)));
}

KVP_PUBLIC void *kvp_session_device_kv(kvp_session *s, uint64_t pos, uint32_t layer, uint32_t kv,
				       uint32_t kv_head)
{
	const struct kvp_pool *p;
	uint64_t page;

	if (!s || pos >= s->n_tokens)
		return NULL;
	p = s->pool;
	page = pos / p->layout.block_tokens;
	if (p->client->dead || !p->dev_base || page >= s->dev_cap ||
	    s->dev_slots[page] == SESSION_NO_DEV || pool_check_index(p, layer, kv, kv_head) < 0)
		return NULL;
	return (void *)(uintptr_t)(p->dev_base + (uint64_t)s->dev_slots[page] * p->page_bytes +
				   shm_kv_offset(&p->shm, layer, kv, kv_head,
						 (uint32_t)(pos % p->layout.block_tokens)));
}
