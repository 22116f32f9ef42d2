/* client/api/checkpoint.c — checkpoints: writing a session to the daemon's
 * disk under a name, restoring it into a pool, listing a tenant's
 * checkpoints (their headers, or every page), removing one, and the admin
 * socket's checkpoint, restore and warm-up.
 *
 * Names are checked here with the daemon's rule (1..64 bytes of
 * [A-Za-z0-9._-], the first a letter, digit or '_') so a bad one costs no
 * round trip and can never reach a path. A restore's reply is a new
 * session's id, length and the start of its page table, as a fork's is:
 * session_adopt() (session.c) checks it against the pool and reads the
 * rest of the table. A list is copied into one caller-owned allocation
 * and sorted (the daemon lists in directory order). The admin calls copy
 * their replies into caller-owned memory; a reply that contradicts its request (another pool than asked
 * for, more slots or shared pages than pages) breaks the client, as in
 * admin.c. Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses handle/,
 * rpc/ and base/, and session.c of its own folder.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "handle.h"
#include "rpc.h"
#include "session.h"

KVP_PUBLIC int kvp_checkpoint_name_check(const char *name)
{
	size_t n;

	if (!name)
		return -EINVAL;
	for (n = 0; name[n]; n++) {
		char ch = name[n];
		int alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			    (ch >= '0' && ch <= '9');

		if (n >= KVP_CHECKPOINT_NAME_MAX)
			return -EINVAL;
		if (!alnum && ch != '_' && (n == 0 || (ch != '.' && ch != '-')))
			return -EINVAL;
	}
	return n ? 0 : -EINVAL;
}

/* Clears the error and checks the connection and the name. */
static int begin(struct kvp_client *c, const char *name)
{
	int ret;

	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (kvp_checkpoint_name_check(name) < 0)
		return conn_error(c, -EINVAL,
				  "a checkpoint name is 1..%u bytes of A-Z a-z 0-9 . _ -, "
				  "starting with a letter, a digit or _",
				  KVP_CHECKPOINT_NAME_MAX);
	return 0;
}

/* Sends Checkpoint of session_id as name, its pages stored as dtype (0:
 * as they are); the file's size to *ret_bytes (may be NULL). p, when not
 * NULL, is the session's pool: its pages must then be those of the tokens
 * written. */
static int checkpoint_call(struct kvp_client *c, const struct kvp_pool *p, uint64_t session_id,
			   const char *name, uint32_t dtype, uint64_t *ret_bytes)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CheckpointRequest op = KVPALACE__V1__CHECKPOINT_REQUEST__INIT;
	const Kvpalace__V1__CheckpointResponse *r;
	Kvpalace__V1__Response *resp;
	int ret;

	op.session_id = session_id;
	op.name = (char *)name;
	op.has_dtype = dtype != 0;
	op.dtype = (Kvpalace__V1__DType)dtype;
	req.op_case = KVPALACE__V1__REQUEST__OP_CHECKPOINT;
	req.checkpoint = &op;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_CHECKPOINT, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->checkpoint;
	if ((p && r->n_pages != pool_pages_for(p, r->n_tokens)) ||
	    (uint64_t)r->n_pages > r->n_tokens)
		return conn_break(c, -EPROTO, "kvpalaced checkpointed %llu tokens in %u pages",
				  (unsigned long long)r->n_tokens, r->n_pages);
	if (ret_bytes)
		*ret_bytes = r->bytes;
	return 0;
}

KVP_PUBLIC int kvp_session_checkpoint_as(kvp_session *s, const char *name, uint32_t dtype,
					 uint64_t *ret_bytes)
{
	struct kvp_client *c;
	int ret;

	if (!s)
		return -EINVAL;
	c = s->pool->client;
	ret = begin(c, name);
	if (ret < 0)
		return ret;
	return checkpoint_call(c, s->pool, s->id, name, dtype, ret_bytes);
}

KVP_PUBLIC int kvp_session_checkpoint(kvp_session *s, const char *name, uint64_t *ret_bytes)
{
	return kvp_session_checkpoint_as(s, name, 0, ret_bytes);
}

KVP_PUBLIC int kvp_admin_checkpoint(kvp_client *c, uint64_t session_id, const char *name,
				    uint64_t *ret_bytes)
{
	int ret;

	if (!c)
		return -EINVAL;
	ret = begin(c, name);
	if (ret < 0)
		return ret;
	return checkpoint_call(c, NULL, session_id, name, 0, ret_bytes);
}

KVP_PUBLIC int kvp_session_restore(kvp_pool *p, const char *name, kvp_session **ret_session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__RestoreRequest op = KVPALACE__V1__RESTORE_REQUEST__INIT;
	const Kvpalace__V1__RestoreResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	struct kvp_session *s;
	int ret;

	if (!p || !ret_session)
		return -EINVAL;
	c = p->client;
	ret = begin(c, name);
	if (ret < 0)
		return ret;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	op.has_pool_id = 1;
	op.pool_id = p->id;
	op.name = (char *)name;
	req.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
	req.restore = &op;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_RESTORE, &resp, NULL);
	if (ret < 0)
		goto fail;
	r = resp->restore;
	if (r->pool_id != p->id || r->n_pages != pool_pages_for(p, r->n_tokens) ||
	    r->shared_pages > r->n_pages) {
		ret = conn_break(c, -EPROTO,
				 "kvpalaced restored %llu tokens in %u pages (%u shared) into "
				 "pool %llu when asked for pool %llu",
				 (unsigned long long)r->n_tokens, r->n_pages, r->shared_pages,
				 (unsigned long long)r->pool_id, (unsigned long long)p->id);
		goto fail;
	}
	ret = session_adopt(p, s, r->session_id, r->n_tokens, r->page_slots, r->n_page_slots,
			    "restore", 1);
	if (ret < 0)
		goto fail;
	*ret_session = s;
	return 0;
fail:
	free(s);
	return ret;
}

KVP_PUBLIC int kvp_admin_restore(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				 uint64_t pool_id, struct kvp_restore_info *ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__RestoreRequest op = KVPALACE__V1__RESTORE_REQUEST__INIT;
	const Kvpalace__V1__RestoreResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_restore_info info;
	int err;

	if (!c)
		return -EINVAL;
	err = begin(c, name);
	if (err < 0)
		return err;
	op.has_pool_id = pool_id != 0;
	op.pool_id = pool_id;
	op.name = (char *)name;
	op.has_uid = !!has_uid;
	op.uid = uid;
	req.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
	req.restore = &op;
	err = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_RESTORE, &resp, NULL);
	if (err < 0)
		return err;
	r = resp->restore;
	if ((pool_id && r->pool_id != pool_id) || r->shared_pages > r->n_pages ||
	    r->n_page_slots > r->n_pages || (r->n_tokens && !r->n_pages) ||
	    (uint64_t)r->n_pages > r->n_tokens)
		return conn_break(c, -EPROTO,
				  "kvpalaced restored %llu tokens in %u pages (%u shared) into "
				  "pool %llu%s",
				  (unsigned long long)r->n_tokens, r->n_pages, r->shared_pages,
				  (unsigned long long)r->pool_id,
				  pool_id ? ", not the pool asked for" : "");
	/* No handle comes back, so the session must outlive this
	 * connection: the admin socket's restores are persistent already,
	 * a client's is made so (were the connection to go first, the
	 * session would go with it, as the call failed). */
	memset(&info, 0, sizeof(info));
	info.session_id = r->session_id;
	info.pool_id = r->pool_id;
	info.n_tokens = r->n_tokens;
	info.n_pages = r->n_pages;
	info.shared_pages = r->shared_pages;
	if (!c->admin) {
		/* r is gone after this call. */
		err = session_own_call(c, info.pool_id, info.session_id, 1, 1);
		if (err < 0)
			return err;
	}
	if (ret)
		*ret = info;
	return 0;
}

KVP_PUBLIC int kvp_admin_warmup(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				struct kvp_warmup_info *ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__WarmupRequest op = KVPALACE__V1__WARMUP_REQUEST__INIT;
	const Kvpalace__V1__WarmupResponse *r;
	Kvpalace__V1__Response *resp;
	int err;

	if (!c)
		return -EINVAL;
	err = begin(c, name);
	if (err < 0)
		return err;
	op.name = (char *)name;
	op.has_uid = !!has_uid;
	op.uid = uid;
	req.op_case = KVPALACE__V1__REQUEST__OP_WARMUP;
	req.warmup = &op;
	err = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_WARMUP, &resp, NULL);
	if (err < 0)
		return err;
	r = resp->warmup;
	/* Only full pages enter the index. */
	if (r->shared_pages > r->indexed_pages || (uint64_t)r->indexed_pages > r->n_tokens)
		return conn_break(c, -EPROTO,
				  "kvpalaced warmed up %llu tokens into %u indexed pages, %u "
				  "of them shared",
				  (unsigned long long)r->n_tokens, r->indexed_pages,
				  r->shared_pages);
	if (ret) {
		memset(ret, 0, sizeof(*ret));
		ret->pool_id = r->pool_id;
		ret->n_tokens = r->n_tokens;
		ret->indexed_pages = r->indexed_pages;
		ret->shared_pages = r->shared_pages;
	}
	return 0;
}

/* Order of a list: by uid, then by name (the daemon lists in directory
 * order). */
static int info_cmp(const void *a, const void *b)
{
	const struct kvp_checkpoint_info *x = a, *y = b;

	if (x->uid != y->uid)
		return x->uid < y->uid ? -1 : 1;
	return strcmp(x->name, y->name);
}

static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;

	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

KVP_PUBLIC int kvp_list_checkpoints_ex(kvp_client *c, int has_uid, uint32_t uid, const char *name,
				       unsigned int flags, struct kvp_checkpoint_list **ret)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ListCheckpointsRequest op = KVPALACE__V1__LIST_CHECKPOINTS_REQUEST__INIT;
	const Kvpalace__V1__ListCheckpointsResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_checkpoint_list *out;
	size_t bytes, n;
	char *at;
	int err;

	if (!c || !ret || (flags & ~KVP_LIST_VERIFY))
		return -EINVAL;
	if (name) {
		err = begin(c, name);
	} else {
		conn_clear_error(c);
		err = conn_usable(c);
	}
	if (err < 0)
		return err;
	op.has_uid = !!has_uid;
	op.uid = uid;
	op.has_verify = !!(flags & KVP_LIST_VERIFY);
	op.verify = op.has_verify;
	op.name = (char *)name;
	req.op_case = KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS;
	req.list_checkpoints = &op;
	err = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_LIST_CHECKPOINTS, &resp, NULL);
	if (err < 0)
		return err;
	r = resp->list_checkpoints;
	n = r->n_checkpoints;
	/* The daemon lists only files with valid names. Strings come from one
	 * reply under the message cap: the sum cannot overflow. */
	bytes = sizeof(*out) + (n ? n : 1) * sizeof(*out->entries);
	for (size_t i = 0; i < n; i++) {
		const Kvpalace__V1__CheckpointInfo *in = r->checkpoints[i];

		/* The client socket lists the caller's own only. */
		if (kvp_checkpoint_name_check(in->name) < 0 || (has_uid && in->uid != uid) ||
		    (!c->admin && in->uid != c->uid) || (name && strcmp(in->name, name)) ||
		    (in->has_verified && in->verified && !op.verify))
			return conn_break(c, -EPROTO,
					  "kvpalaced listed a checkpoint of uid %u that was not "
					  "asked for, or with an invalid name",
					  in->uid);
		if (in->error)
			bytes += strlen(in->error) + 1;
	}
	out = calloc(1, bytes);
	if (!out)
		return -ENOMEM;
	out->entries = (struct kvp_checkpoint_info *)(out + 1);
	at = (char *)(out->entries + (n ? n : 1));
	out->truncated = r->has_truncated && r->truncated;
	out->n_entries = n;
	for (size_t i = 0; i < n; i++) {
		const Kvpalace__V1__CheckpointInfo *in = r->checkpoints[i];
		struct kvp_checkpoint_info *e = &out->entries[i];
		const Kvpalace__V1__Layout *l = in->layout;

		copy_str(e->name, sizeof(e->name), in->name);
		e->uid = in->uid;
		copy_str(e->model_id, sizeof(e->model_id), in->model_id);
		if (l) {
			e->layout.n_layers = l->n_layers;
			e->layout.n_kv_heads = l->n_kv_heads;
			e->layout.head_dim = l->head_dim;
			e->layout.block_tokens = l->block_tokens;
			e->layout.dtype = (uint32_t)l->dtype;
			e->layout.quant_group = l->has_quant_group ? l->quant_group : 0;
			e->layout.format = l->has_format ? l->format : 0;
		}
		e->n_tokens = in->has_n_tokens ? in->n_tokens : 0;
		e->bytes = in->has_bytes ? in->bytes : 0;
		e->created_unix_ms = in->has_created_unix_ms ? in->created_unix_ms : 0;
		e->format_version = in->has_format_version ? in->format_version : 0;
		e->verified = !in->error && in->has_verified && in->verified;
		if (in->error) {
			size_t len = strlen(in->error) + 1;

			memcpy(at, in->error, len);
			e->error = at;
			at += len;
		}
	}
	qsort(out->entries, n, sizeof(*out->entries), info_cmp);
	*ret = out;
	return 0;
}

KVP_PUBLIC int kvp_list_checkpoints(kvp_client *c, int has_uid, uint32_t uid,
				    struct kvp_checkpoint_list **ret)
{
	return kvp_list_checkpoints_ex(c, has_uid, uid, NULL, 0, ret);
}

KVP_PUBLIC int kvp_checkpoint_remove(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				     uint64_t *ret_bytes)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DeleteCheckpointRequest op = KVPALACE__V1__DELETE_CHECKPOINT_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	int err;

	if (!c)
		return -EINVAL;
	err = begin(c, name);
	if (err < 0)
		return err;
	op.name = (char *)name;
	op.has_uid = !!has_uid;
	op.uid = uid;
	req.op_case = KVPALACE__V1__REQUEST__OP_DELETE_CHECKPOINT;
	req.delete_checkpoint = &op;
	err = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_DELETE_CHECKPOINT, &resp, NULL);
	if (err < 0)
		return err;
	if (ret_bytes)
		*ret_bytes = resp->delete_checkpoint->bytes;
	return 0;
}

KVP_PUBLIC void kvp_checkpoint_list_free(struct kvp_checkpoint_list *l)
{
	free(l);
}
