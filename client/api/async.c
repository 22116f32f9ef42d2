/* client/api/async.c — submitting without waiting: kvp_lookup_submit,
 * kvp_prefetch_submit, and kvp_complete on the client's pollable socket.
 *
 * An engine's scheduler loop cannot block on one round trip per waiting
 * request: it submits, goes on with its own work, and collects answers
 * when the socket (kvp_client_fd) polls readable. A submitted operation
 * is a handle_async on its pool's list; its request is in flight under
 * rpc_submit's bookkeeping, which keeps replies that arrive while a
 * blocking call waits for its own. kvp_complete reaps replies and steps
 * each operation: a lookup batch longer than one request sends its next
 * piece from here, and completes when its last reply is applied. An
 * operation whose pool closes first is dropped with it (its reply is
 * forgotten). Not thread-safe: one thread at a time per client, as every
 * call.
 *
 * Layer: api (client/README.md): uses lookup.c's state machine, handle/,
 * rpc/ and base/.
 */
#include <errno.h>
#include <stdlib.h>

#include "conn.h"
#include "handle.h"
#include "lookup.h"
#include "rpc.h"

struct async_op {
	struct handle_async h; /* first: the pool's list holds it */
	uint32_t op;	       /* enum kvp_async_op */
	uint64_t user_data;
	kvp_pool *p;
	struct lookup_state *lookup; /* KVP_ASYNC_LOOKUP */
	int ready;		     /* complete, no request in flight */
};

static void async_free(struct handle_async *h)
{
	struct async_op *o = (struct async_op *)h;

	lookup_state_free(o->lookup);
	free(o);
}

KVP_PUBLIC int kvp_client_fd(const kvp_client *c)
{
	if (!c)
		return -EINVAL;
	return c->dead || c->fd < 0 ? -ENOTCONN : c->fd;
}

_Static_assert(KVP_ASYNC_MAX == CONN_ASYNC_MAX, "the header's limit is rpc's");

KVP_PUBLIC size_t kvp_in_flight(const kvp_client *c)
{
	const struct list *pl, *ol;
	size_t n = 0;

	if (!c)
		return 0;
	for (pl = c->pools.next; pl != &c->pools; pl = pl->next) {
		const struct kvp_pool *p = list_entry(pl, struct kvp_pool, link);

		for (ol = p->async.next; ol != &p->async; ol = ol->next)
			n++;
	}
	return n;
}

static struct async_op *async_new(kvp_pool *p, uint32_t op, uint64_t user_data)
{
	struct async_op *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	o->h.free = async_free;
	o->op = op;
	o->user_data = user_data;
	o->p = p;
	list_init(&o->h.link);
	return o;
}

KVP_PUBLIC int kvp_lookup_submit(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				 struct kvp_lookup_result *out, uint64_t user_data)
{
	Kvpalace__V1__Request req;
	struct async_op *o;
	int ret = lookup_check(p, queries, n, out);

	if (ret < 0)
		return ret;
	o = async_new(p, KVP_ASYNC_LOOKUP, user_data);
	if (!o)
		return conn_error(p->client, -ENOMEM, "out of memory");
	o->lookup = lookup_start(p, queries, n, out);
	if (!o->lookup) {
		async_free(&o->h);
		return conn_error(p->client, -ENOMEM, "out of memory");
	}
	/* Queries all shorter than a page are answered already: the
	 * operation is ready, and completes like any other. */
	ret = o->lookup->pending ? lookup_build(o->lookup, &req) : 0;
	if (ret == 0 && o->lookup->pending)
		ret = rpc_submit(p->client, &req, o);
	if (ret < 0) {
		async_free(&o->h);
		return ret;
	}
	o->ready = !o->lookup->pending;
	list_add_tail(&p->async, &o->h.link);
	return 0;
}

KVP_PUBLIC int kvp_prefetch_submit(kvp_pool *p, const uint32_t *tokens, size_t n,
				   uint64_t user_data)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PrefetchRequest pf = KVPALACE__V1__PREFETCH_REQUEST__INIT;
	struct async_op *o;
	int ret;

	if (!p || (!tokens && n))
		return -EINVAL;
	conn_clear_error(p->client);
	ret = conn_usable(p->client);
	if (ret < 0)
		return ret;
	o = async_new(p, KVP_ASYNC_PREFETCH, user_data);
	if (!o)
		return conn_error(p->client, -ENOMEM, "out of memory");
	/* As kvp_prefetch: the first request's worth of tokens. */
	pf.pool_id = p->id;
	pf.tokens = (uint32_t *)(uintptr_t)tokens;
	pf.n_tokens = n < p->client->chunk_tokens ? n : p->client->chunk_tokens;
	pool_salt_field(p, &pf.has_cache_salt, &pf.cache_salt);
	req.op_case = KVPALACE__V1__REQUEST__OP_PREFETCH;
	req.prefetch = &pf;
	ret = rpc_submit(p->client, &req, o);
	if (ret < 0) {
		async_free(&o->h);
		return ret;
	}
	list_add_tail(&p->async, &o->h.link);
	return 0;
}

/* Steps o with its reply: 1 when it completed (*result set), 0 when its
 * next request went out, a negative errno when the client broke. */
static int async_step(struct async_op *o, const Kvpalace__V1__Response *resp, int *result)
{
	struct kvp_client *c = o->p->client;
	Kvpalace__V1__Request req;
	int ret;

	if (o->op == KVP_ASYNC_PREFETCH) {
		ret = rpc_status(c, resp, KVPALACE__V1__RESPONSE__OP_PREFETCH);
		*result = ret < 0 ? ret : (int)resp->prefetch->pages_coming;
		return c->dead ? ret : 1;
	}
	ret = rpc_status(c, resp, KVPALACE__V1__RESPONSE__OP_LOOKUP);
	if (ret == 0)
		ret = lookup_apply(o->lookup, resp);
	if (ret == 0 && o->lookup->pending) {
		ret = lookup_build(o->lookup, &req);
		if (ret == 0)
			ret = rpc_submit(c, &req, o);
		if (ret == 0)
			return 0;
	}
	*result = ret;
	return c->dead ? ret : 1;
}

static void async_done(struct async_op *o, int result, struct kvp_completion *out)
{
	*out = (struct kvp_completion){.user_data = o->user_data, .result = result, .op = o->op};
	list_del(&o->h.link);
	async_free(&o->h);
}

KVP_PUBLIC int kvp_complete(kvp_client *c, struct kvp_completion *out, size_t max, int timeout_ms)
{
	struct list *pl, *ol, *next;
	size_t got = 0;
	int ret;

	if (!c || (max && !out))
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	/* Those answered without a request first. */
	for (pl = c->pools.next; pl != &c->pools; pl = pl->next) {
		struct kvp_pool *p = list_entry(pl, struct kvp_pool, link);

		list_for_each_safe (ol, next, &p->async) {
			struct async_op *o =
				(struct async_op *)list_entry(ol, struct handle_async, link);

			if (got == max)
				return (int)got;
			if (o->ready)
				async_done(o, 0, &out[got++]);
		}
	}
	while (got < max) {
		Kvpalace__V1__Response *resp;
		void *tag;
		int result;

		ret = rpc_reap(c, got ? 0 : timeout_ms, &tag, &resp);
		if (ret < 0)
			return ret;
		if (ret == 0)
			break;
		ret = async_step(tag, resp, &result);
		if (ret < 0)
			return ret;
		if (ret == 1)
			async_done(tag, result, &out[got++]);
	}
	return (int)got;
}
