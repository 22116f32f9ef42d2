/* client/api/pool.c — opening pools and mapping their host arenas.
 *
 * kvp_pool_open() checks the model id and layout here (so a bad argument
 * costs no round trip), sends OpenPool, checks that the daemon's geometry
 * agrees with shm/layout.h and fits the arena, and maps the arena memfd
 * that came with the reply (shm_arena_map checks its seals and size). The
 * handle keeps the fd (close-on-exec) for kvp_session_write and
 * kvp_lease_read, which copy through it with pwrite/pread. A pool handle owns the handles of its sessions
 * and leases, and keeps the cache salt that kvp_pool_set_salt() gives it
 * (purely local: it travels with later CreateSession and MatchPrefix
 * requests). Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses handle/
 * (the pool handle and its teardown), rpc/ and base/, and lease.c of its
 * own folder.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include "arena.h"
#include "handle.h"
#include "rpc.h"

#define POOL_MODEL_ID_MAX 127u

static int model_id_check(const char *s)
{
	size_t n = 0;

	for (; s[n]; n++)
		if (s[n] < 0x20 || s[n] > 0x7e || n >= POOL_MODEL_ID_MAX)
			return -EINVAL;
	return n ? 0 : -EINVAL;
}

static void layout_to_shm(const struct kvp_layout *in, struct shm_layout *out)
{
	out->n_layers = in->n_layers;
	out->n_kv_heads = in->n_kv_heads;
	out->head_dim = in->head_dim;
	out->block_tokens = in->block_tokens;
	out->dtype = in->dtype;
	out->quant_group = in->quant_group;
	out->format = in->format;
}

/* Checks the geometry of an OpenPool reply against the layout we asked
 * for and the arena's size. */
static int pool_check_reply(struct kvp_pool *p, const Kvpalace__V1__OpenPoolResponse *r)
{
	uint64_t room;

	if (r->page_bytes != shm_page_bytes(&p->shm))
		return -EPROTO;
	if (!r->arena_bytes || r->arena_bytes > SIZE_MAX || r->arena_offset > r->arena_bytes)
		return -EPROTO;
	room = r->arena_bytes - r->arena_offset;
	if (r->n_pages > room / r->page_bytes)
		return -EPROTO;
	return 0;
}

KVP_PUBLIC int kvp_pool_open_opts(kvp_client *c, const char *model_id,
				  const struct kvp_layout *layout, const struct kvp_pool_opts *opts,
				  kvp_pool **ret_pool)
{
	char id[POOL_MODEL_ID_MAX + 2];
	int n;

	if (!opts || opts->tp_size <= 1) {
		if (opts && opts->tp_rank)
			return c ? conn_error(c, -EINVAL, "tp_rank %u without tp_size",
					      opts->tp_rank)
				 : -EINVAL;
		return kvp_pool_open(c, model_id, layout, ret_pool);
	}
	if (!c || !model_id || !layout || !ret_pool)
		return -EINVAL;
	conn_clear_error(c);
	if (model_id_check(model_id) < 0)
		return conn_error(c, -EINVAL, "model id must be 1..%u bytes of printable ASCII",
				  POOL_MODEL_ID_MAX);
	if (opts->tp_rank >= opts->tp_size || opts->tp_size > KVP_TP_SIZE_MAX)
		return conn_error(c, -EINVAL, "tp_rank %u of tp_size %u (at most %u ranks)",
				  opts->tp_rank, opts->tp_size, KVP_TP_SIZE_MAX);
	/* The rank is part of the pool's identity, so two ranks' pages,
	 * whose heads differ behind the same tokens and the same per-rank
	 * layout, never meet in one prefix index, spill file or checkpoint
	 * check. */
	n = snprintf(id, sizeof(id), "%s#tp%u/%u", model_id, opts->tp_rank, opts->tp_size);
	if (n < 0 || (size_t)n > POOL_MODEL_ID_MAX)
		return conn_error(c, -EINVAL,
				  "model id with its rank (\"#tp%u/%u\") must be 1..%u bytes",
				  opts->tp_rank, opts->tp_size, POOL_MODEL_ID_MAX);
	return kvp_pool_open(c, id, layout, ret_pool);
}

KVP_PUBLIC int kvp_pool_open(kvp_client *c, const char *model_id, const struct kvp_layout *layout,
			     kvp_pool **ret_pool)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenPoolRequest op = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;
	Kvpalace__V1__Layout wl = KVPALACE__V1__LAYOUT__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__OpenPoolResponse *r;
	struct kvp_pool *p;
	struct statfs fs;
	void *addr;
	int fd = -1;
	int ret;

	if (!c || !model_id || !layout || !ret_pool)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (model_id_check(model_id) < 0)
		return conn_error(c, -EINVAL, "model id must be 1..%u bytes of printable ASCII",
				  POOL_MODEL_ID_MAX);
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->client = c;
	p->arena_fd = -1;
	p->layout = *layout;
	layout_to_shm(layout, &p->shm);
	list_init(&p->link);
	list_init(&p->sessions);
	list_init(&p->leases);
	list_init(&p->async);
	if (shm_layout_check(&p->shm) < 0) {
		ret = conn_error(c, -EINVAL, "invalid layout: %s", shm_layout_why(&p->shm));
		goto fail;
	}

	wl.n_layers = layout->n_layers;
	wl.n_kv_heads = layout->n_kv_heads;
	wl.head_dim = layout->head_dim;
	wl.block_tokens = layout->block_tokens;
	wl.dtype = (Kvpalace__V1__DType)layout->dtype;
	wl.has_quant_group = layout->quant_group != 0;
	wl.quant_group = layout->quant_group;
	wl.has_format = layout->format != 0;
	wl.format = layout->format;
	op.model_id = (char *)model_id;
	op.layout = &wl;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	req.open_pool = &op;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_OPEN_POOL, &resp, &fd);
	if (ret < 0)
		goto fail;
	r = resp->open_pool;
	if (fd < 0) {
		ret = conn_break(c, -EPROTO, "kvpalaced sent no arena with OpenPool");
		goto fail;
	}
	if (pool_check_reply(p, r) < 0) {
		ret = conn_break(c, -EPROTO, "kvpalaced sent an arena geometry that does not fit");
		goto fail;
	}
	ret = shm_arena_map(fd, r->arena_bytes, &addr);
	if (ret == -EINVAL || ret == -EBADF) {
		ret = conn_break(c, -EPROTO, "kvpalaced sent an fd that is not a sealed arena");
		goto fail;
	}
	if (ret < 0) {
		ret = conn_error(c, ret, "cannot map the pool's arena");
		goto fail;
	}
	p->arena_fd = fd;
	fd = -1;
	p->arena_hugetlb = fstatfs(p->arena_fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
	p->id = r->pool_id;
	p->page_bytes = r->page_bytes;
	p->row_bytes = shm_row_bytes(&p->shm);
	p->n_pages = r->n_pages;
	p->arena = addr;
	p->arena_bytes = r->arena_bytes;
	p->pages = p->arena + r->arena_offset;
	if (r->has_device_arena && r->device_arena && r->has_device_n_pages &&
	    r->has_device_arena_bytes && r->device_n_pages) {
		p->dev_arena = 1;
		p->dev_arena_bytes = r->device_arena_bytes;
		p->dev_n_pages = r->device_n_pages;
	}
	list_add_tail(&c->pools, &p->link);
	*ret_pool = p;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	free(p);
	return ret;
}

KVP_PUBLIC void kvp_pool_close(kvp_pool *p)
{
	if (!p)
		return;
	conn_clear_error(p->client);
	/* Leases pin pages in the daemon until released; their pointers die
	 * with the mapping, so give them back now. Sessions stay in the
	 * daemon (other processes may match them); only their handles go. */
	while (!list_empty(&p->leases))
		kvp_lease_release(list_entry(p->leases.next, struct kvp_lease, link));
	handle_pool_free(p);
}

KVP_PUBLIC int kvp_pool_set_salt(kvp_pool *p, const void *salt, size_t n)
{
	if (!p || (!salt && n))
		return -EINVAL;
	conn_clear_error(p->client);
	if (n > POOL_SALT_MAX_BYTES)
		return conn_error(p->client, -EINVAL, "a cache salt has at most %u bytes",
				  POOL_SALT_MAX_BYTES);
	if (n)
		memcpy(p->salt, salt, n);
	p->salt_bytes = n;
	return 0;
}

KVP_PUBLIC uint64_t kvp_pool_id(const kvp_pool *p)
{
	return p ? p->id : 0;
}

KVP_PUBLIC size_t kvp_pool_page_bytes(const kvp_pool *p)
{
	return p ? (size_t)p->page_bytes : 0;
}

KVP_PUBLIC size_t kvp_pool_row_bytes(const kvp_pool *p)
{
	return p ? (size_t)p->row_bytes : 0;
}

KVP_PUBLIC uint32_t kvp_pool_n_pages(const kvp_pool *p)
{
	return p ? p->n_pages : 0;
}

KVP_PUBLIC const struct kvp_layout *kvp_pool_layout(const kvp_pool *p)
{
	return p ? &p->layout : NULL;
}
