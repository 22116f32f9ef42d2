/* client/api/admin.c — the admin socket's operations: one session in detail,
 * dropping sessions and pools, eviction, purges, the configuration.
 *
 * Each call is one request and one reply, copied into one caller-owned
 * allocation (free() it) so nothing points into the connection's buffers.
 * A reply that contradicts its request (another id, more slots than asked
 * for, per-pool figures that do not add up) breaks the client: a confused
 * daemon must not make kvpalacectl print numbers it made up.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses rpc/ and
 * base/.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "rpc.h"

/* Sends req and waits for a reply carrying op. */
static int call(kvp_client *c, Kvpalace__V1__Request *req, int op, Kvpalace__V1__Response **resp)
{
	int ret;

	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	return rpc_call(c, req, op, resp, NULL);
}

static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;

	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

KVP_PUBLIC int kvp_admin_show_session(kvp_client *c, uint64_t session_id, uint32_t max_slots,
				      struct kvp_session_detail **ret_detail)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ShowSessionRequest op = KVPALACE__V1__SHOW_SESSION_REQUEST__INIT;
	const Kvpalace__V1__ShowSessionResponse *r;
	const Kvpalace__V1__SessionInfo *in;
	const Kvpalace__V1__Layout *l;
	Kvpalace__V1__Response *resp;
	struct kvp_session_detail *d;
	size_t n;
	int ret;

	if (!c || !ret_detail || max_slots > 4096)
		return -EINVAL;
	op.session_id = session_id;
	op.has_max_page_slots = 1;
	op.max_page_slots = max_slots;
	req.op_case = KVPALACE__V1__REQUEST__OP_SHOW_SESSION;
	req.show_session = &op;
	ret = call(c, &req, KVPALACE__V1__RESPONSE__OP_SHOW_SESSION, &resp);
	if (ret < 0)
		return ret;
	r = resp->show_session;
	in = r->info;
	l = r->layout;
	n = r->n_page_slots;
	if (in->session_id != session_id || in->committed_tokens > in->n_tokens || n > max_slots ||
	    n > in->n_pages || r->n_page_holders != n)
		return conn_break(c, -EPROTO,
				  "kvpalaced described session %llu when asked for %llu, or "
				  "listed %zu page slots for %u pages (%u asked for)",
				  (unsigned long long)in->session_id,
				  (unsigned long long)session_id, n, in->n_pages, max_slots);
	d = calloc(1, sizeof(*d) + 2 * (n ? n : 1) * sizeof(uint32_t));
	if (!d)
		return -ENOMEM;
	d->page_slots = (uint32_t *)(d + 1);
	d->page_holders = d->page_slots + (n ? n : 1);
	d->info.session_id = in->session_id;
	d->info.pool_id = in->pool_id;
	d->info.uid = in->uid;
	d->info.n_tokens = in->n_tokens;
	d->info.committed_tokens = in->committed_tokens;
	d->info.n_pages = in->n_pages;
	d->info.shared_pages = in->shared_pages;
	d->info.idle_ms = in->idle_ms;
	d->info.writing = !!in->writing;
	copy_str(d->model_id, sizeof(d->model_id), r->model_id);
	d->layout.n_layers = l->n_layers;
	d->layout.n_kv_heads = l->n_kv_heads;
	d->layout.head_dim = l->head_dim;
	d->layout.block_tokens = l->block_tokens;
	d->layout.dtype = (uint32_t)l->dtype;
	d->layout.quant_group = l->has_quant_group ? l->quant_group : 0;
	d->layout.format = l->has_format ? l->format : 0;
	d->salted = !!r->salted;
	d->reserved_pages = r->reserved_pages;
	d->writer_pid = r->has_writer_pid ? r->writer_pid : 0;
	d->policy = r->has_policy ? (uint32_t)r->policy : 0;
	d->budget = r->budget;
	d->compacted = r->has_compacted && r->compacted;
	d->dropped_tokens = r->dropped_tokens;
	d->n_page_slots = n;
	if (n) {
		memcpy(d->page_slots, r->page_slots, n * sizeof(uint32_t));
		memcpy(d->page_holders, r->page_holders, n * sizeof(uint32_t));
	}
	*ret_detail = d;
	return 0;
}

KVP_PUBLIC int kvp_admin_drop_session(kvp_client *c, uint64_t session_id, unsigned int flags,
				      struct kvp_drop_session_result *ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DropSessionRequest op = KVPALACE__V1__DROP_SESSION_REQUEST__INIT;
	const Kvpalace__V1__DropSessionResponse *r;
	Kvpalace__V1__Response *resp;
	int err;

	if (!c || (flags & ~KVP_DROP_FORCE))
		return -EINVAL;
	op.session_id = session_id;
	op.has_force = (flags & KVP_DROP_FORCE) != 0;
	op.force = op.has_force;
	req.op_case = KVPALACE__V1__REQUEST__OP_DROP_SESSION;
	req.drop_session = &op;
	err = call(c, &req, KVPALACE__V1__RESPONSE__OP_DROP_SESSION, &resp);
	if (err < 0)
		return err;
	r = resp->drop_session;
	if (r->session_id != session_id || r->committed_tokens > r->n_tokens)
		return conn_break(c, -EPROTO, "kvpalaced dropped session %llu when asked for %llu",
				  (unsigned long long)r->session_id,
				  (unsigned long long)session_id);
	if (ret) {
		memset(ret, 0, sizeof(*ret));
		ret->session_id = r->session_id;
		ret->pool_id = r->pool_id;
		ret->n_tokens = r->n_tokens;
		ret->committed_tokens = r->committed_tokens;
		ret->freed_pages = r->freed_pages;
		ret->was_writing = !!r->was_writing;
	}
	return 0;
}

KVP_PUBLIC int kvp_admin_drop_pool(kvp_client *c, uint64_t pool_id, unsigned int flags,
				   struct kvp_drop_pool_result *ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DropPoolRequest op = KVPALACE__V1__DROP_POOL_REQUEST__INIT;
	const Kvpalace__V1__DropPoolResponse *r;
	Kvpalace__V1__Response *resp;
	int err;

	if (!c || (flags & ~KVP_DROP_FORCE))
		return -EINVAL;
	op.pool_id = pool_id;
	op.has_force = (flags & KVP_DROP_FORCE) != 0;
	op.force = op.has_force;
	req.op_case = KVPALACE__V1__REQUEST__OP_DROP_POOL;
	req.drop_pool = &op;
	err = call(c, &req, KVPALACE__V1__RESPONSE__OP_DROP_POOL, &resp);
	if (err < 0)
		return err;
	r = resp->drop_pool;
	if (r->pool_id != pool_id)
		return conn_break(c, -EPROTO, "kvpalaced dropped pool %llu when asked for %llu",
				  (unsigned long long)r->pool_id, (unsigned long long)pool_id);
	if (ret) {
		memset(ret, 0, sizeof(*ret));
		ret->pool_id = r->pool_id;
		ret->uid = r->uid;
		copy_str(ret->model_id, sizeof(ret->model_id), r->model_id);
		ret->sessions_closed = r->sessions_closed;
		ret->leases_released = r->leases_released;
		ret->arena_bytes = r->arena_bytes;
	}
	return 0;
}

KVP_PUBLIC int kvp_admin_evict(kvp_client *c, uint32_t tier, uint64_t pool_id, uint64_t max_bytes,
			       uint32_t max_pages, struct kvp_evict_result **ret_result)
{
	return kvp_admin_evict_flags(c, tier, pool_id, max_bytes, max_pages, 0, ret_result);
}

KVP_PUBLIC int kvp_admin_evict_flags(kvp_client *c, uint32_t tier, uint64_t pool_id,
				     uint64_t max_bytes, uint32_t max_pages, unsigned int flags,
				     struct kvp_evict_result **ret_result)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__EvictRequest op = KVPALACE__V1__EVICT_REQUEST__INIT;
	const Kvpalace__V1__EvictResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_evict_result *out;
	uint64_t pages = 0, bytes = 0;
	int demoting = tier == KVP_TIER_HOST && !(flags & KVP_EVICT_DISCARD);
	int ret;

	if (!c || !ret_result || max_bytes == 0 || (flags & ~KVP_EVICT_DISCARD) ||
	    ((flags & KVP_EVICT_DISCARD) && tier != KVP_TIER_HOST))
		return -EINVAL;
	op.tier = (Kvpalace__V1__Tier)tier;
	op.has_discard = op.discard = (flags & KVP_EVICT_DISCARD) != 0;
	op.has_pool_id = pool_id != 0;
	op.pool_id = pool_id;
	op.has_max_bytes = max_bytes != KVP_EVICT_ALL;
	op.max_bytes = max_bytes;
	op.has_max_pages = max_pages != 0;
	op.max_pages = max_pages;
	req.op_case = KVPALACE__V1__REQUEST__OP_EVICT;
	req.evict = &op;
	ret = call(c, &req, KVPALACE__V1__RESPONSE__OP_EVICT, &resp);
	if (ret < 0)
		return ret;
	r = resp->evict;
	for (size_t i = 0; i < r->n_pools; i++) {
		const Kvpalace__V1__EvictedPool *ep = r->pools[i];

		if ((pool_id && ep->pool_id != pool_id) || ep->pages > r->pages ||
		    ep->bytes > r->bytes)
			break;
		pages += ep->pages;
		bytes += ep->bytes;
	}
	/* Demoting from the host tier may take a page's parent along (the
	 * disk tier writes parents first): only then may it exceed what was
	 * asked for. */
	if (pages != r->pages || bytes != r->bytes ||
	    (!demoting && max_pages && r->pages > max_pages) ||
	    (!demoting && max_bytes != KVP_EVICT_ALL && r->bytes > max_bytes) ||
	    r->demoted + r->dropped > r->pages)
		return conn_break(c, -EPROTO,
				  "kvpalaced reported an eviction whose pools do not add up to "
				  "its total, or that exceeds what was asked for");
	out = calloc(1, sizeof(*out) + (r->n_pools ? r->n_pools : 1) * sizeof(*out->pools));
	if (!out)
		return -ENOMEM;
	out->pools = (struct kvp_evicted_pool *)(out + 1);
	out->pages = r->pages;
	out->bytes = r->bytes;
	out->more = !!r->more;
	out->demoted = r->demoted;
	out->dropped = r->dropped;
	out->n_pools = r->n_pools;
	for (size_t i = 0; i < r->n_pools; i++) {
		out->pools[i].pool_id = r->pools[i]->pool_id;
		out->pools[i].pages = r->pools[i]->pages;
		out->pools[i].bytes = r->pools[i]->bytes;
	}
	*ret_result = out;
	return 0;
}

KVP_PUBLIC int kvp_admin_purge(kvp_client *c, const struct kvp_purge_spec *spec,
			       struct kvp_purge_result *ret)
{
	const unsigned int all = KVP_PURGE_POOL | KVP_PURGE_UID | KVP_PURGE_MODEL | KVP_PURGE_SALT |
				 KVP_PURGE_UNUSED_SINCE;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PurgeRequest op = KVPALACE__V1__PURGE_REQUEST__INIT;
	const Kvpalace__V1__PurgeResponse *r;
	Kvpalace__V1__Response *resp;
	int err;

	if (!c || !spec || !(spec->flags & all) || (spec->flags & ~all) ||
	    ((spec->flags & KVP_PURGE_POOL) && !spec->pool_id) ||
	    ((spec->flags & KVP_PURGE_MODEL) && !spec->model_id) ||
	    ((spec->flags & KVP_PURGE_SALT) &&
	     (spec->salt_len > 64 || (spec->salt_len && !spec->salt))))
		return -EINVAL;
	op.has_pool_id = (spec->flags & KVP_PURGE_POOL) != 0;
	op.pool_id = spec->pool_id;
	op.has_uid = (spec->flags & KVP_PURGE_UID) != 0;
	op.uid = spec->uid;
	if (spec->flags & KVP_PURGE_MODEL)
		op.model_id = (char *)spec->model_id;
	op.has_cache_salt = (spec->flags & KVP_PURGE_SALT) != 0;
	op.cache_salt.data = (uint8_t *)spec->salt;
	op.cache_salt.len = spec->salt_len;
	op.has_extra_key = (spec->flags & KVP_PURGE_SALT) && spec->extra_key_len;
	op.extra_key.data = (uint8_t *)(uintptr_t)spec->extra_key;
	op.extra_key.len = spec->extra_key_len;
	op.has_unused_since_unix_s = (spec->flags & KVP_PURGE_UNUSED_SINCE) != 0;
	op.unused_since_unix_s = spec->unused_since > 0 ? (uint64_t)spec->unused_since : 0;
	req.op_case = KVPALACE__V1__REQUEST__OP_PURGE;
	req.purge = &op;
	err = call(c, &req, KVPALACE__V1__RESPONSE__OP_PURGE, &resp);
	if (err < 0)
		return err;
	r = resp->purge;
	if (r->host_pages > r->pages || r->held_pages > r->host_pages || r->disk_pages > r->pages ||
	    (r->pages && !r->pools))
		return conn_break(c, -EPROTO,
				  "kvpalaced reported a purge whose parts exceed its total");
	if (ret) {
		memset(ret, 0, sizeof(*ret));
		ret->pages = r->pages;
		ret->pools = r->pools;
		ret->host_pages = r->host_pages;
		ret->disk_pages = r->disk_pages;
		ret->device_pages = r->device_pages;
		ret->held_pages = r->held_pages;
		ret->sessions_marked = r->sessions_marked;
	}
	return 0;
}

/* Copies s (NULL stays NULL) to *at and advances it. */
static const char *put_str(char **at, const char *s)
{
	char *dst = *at;
	size_t n;

	if (!s)
		return NULL;
	n = strlen(s) + 1;
	memcpy(dst, s, n);
	*at += n;
	return dst;
}

KVP_PUBLIC int kvp_admin_config_show(kvp_client *c, struct kvp_config **ret_config)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ConfigShowRequest op = KVPALACE__V1__CONFIG_SHOW_REQUEST__INIT;
	const Kvpalace__V1__ConfigShowResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_config *out;
	size_t bytes;
	char *at;
	int ret;

	if (!c || !ret_config)
		return -EINVAL;
	req.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_SHOW;
	req.config_show = &op;
	ret = call(c, &req, KVPALACE__V1__RESPONSE__OP_CONFIG_SHOW, &resp);
	if (ret < 0)
		return ret;
	r = resp->config_show;
	/* Strings come from one reply under the message cap: no overflow. */
	bytes = sizeof(*out) + (r->n_entries ? r->n_entries : 1) * sizeof(*out->entries);
	bytes += (r->file ? strlen(r->file) + 1 : 0) + (r->preset ? strlen(r->preset) + 1 : 0);
	for (size_t i = 0; i < r->n_entries; i++)
		bytes += strlen(r->entries[i]->key) + strlen(r->entries[i]->value) +
			 strlen(r->entries[i]->source) + 3;
	out = calloc(1, bytes);
	if (!out)
		return -ENOMEM;
	out->entries = (struct kvp_config_entry *)(out + 1);
	at = (char *)(out->entries + (r->n_entries ? r->n_entries : 1));
	out->file = put_str(&at, r->file);
	out->preset = put_str(&at, r->preset);
	out->truncated = !!r->truncated;
	out->n_entries = r->n_entries;
	for (size_t i = 0; i < r->n_entries; i++) {
		out->entries[i].key = put_str(&at, r->entries[i]->key);
		out->entries[i].value = put_str(&at, r->entries[i]->value);
		out->entries[i].source = put_str(&at, r->entries[i]->source);
	}
	*ret_config = out;
	return 0;
}

KVP_PUBLIC int kvp_admin_config_reload(kvp_client *c, struct kvp_config_reload **ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ConfigReloadRequest op = KVPALACE__V1__CONFIG_RELOAD_REQUEST__INIT;
	const Kvpalace__V1__ConfigReloadResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_config_reload *out;
	size_t bytes, n;
	char *at;
	int err;

	if (!c)
		return -EINVAL;
	req.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD;
	req.config_reload = &op;
	err = call(c, &req, KVPALACE__V1__RESPONSE__OP_CONFIG_RELOAD, &resp);
	if (err < 0 || !ret)
		return err;
	r = resp->config_reload;
	n = r->n_changed + r->n_restart_needed;
	bytes = sizeof(*out) + (n ? n : 1) * sizeof(char *);
	for (size_t i = 0; i < r->n_changed; i++)
		bytes += strlen(r->changed[i]) + 1;
	for (size_t i = 0; i < r->n_restart_needed; i++)
		bytes += strlen(r->restart_needed[i]) + 1;
	out = calloc(1, bytes);
	if (!out)
		return -ENOMEM;
	out->changed = (const char **)(out + 1);
	out->restart_needed = out->changed + r->n_changed;
	at = (char *)(out->changed + (n ? n : 1));
	out->n_changed = r->n_changed;
	out->n_restart_needed = r->n_restart_needed;
	for (size_t i = 0; i < r->n_changed; i++)
		out->changed[i] = put_str(&at, r->changed[i]);
	for (size_t i = 0; i < r->n_restart_needed; i++)
		out->restart_needed[i] = put_str(&at, r->restart_needed[i]);
	*ret = out;
	return 0;
}
