/* client/api/events.c — KV events: kvp_events_subscribe, kvp_events_read.
 *
 * After SubscribeEvents the daemon pushes KvEvents as replies with id 0
 * on the subscribed connection. Every push is checked before it is handed
 * out (kinds, tiers, hash and token lengths, numbers only growing): a
 * push that is not well formed breaks the client, as any bad reply does.
 *
 * Layer: api (client/README.md), over rpc/ and base/.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conn.h"
#include "le.h"
#include "rpc.h"

KVP_PUBLIC int kvp_events_subscribe(kvp_client *c, uint64_t pool_id, uint64_t *ret_next_seq)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SubscribeEventsRequest se = KVPALACE__V1__SUBSCRIBE_EVENTS_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	int ret;

	if (!c)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (c->events)
		return conn_error(c, -EEXIST, "this client subscribes already");
	if (c->n_async)
		return conn_error(c, -EBUSY, "submitted operations are in flight on this client");
	se.has_pool_id = pool_id != 0;
	se.pool_id = pool_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS;
	req.subscribe_events = &se;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_SUBSCRIBE_EVENTS, &resp, NULL);
	if (ret < 0)
		return ret;
	c->events = 1;
	c->events_next = resp->subscribe_events->next_seq;
	if (ret_next_seq)
		*ret_next_seq = c->events_next;
	return 0;
}

static int hash_field(protobuf_c_boolean has, const ProtobufCBinaryData *f, uint8_t *out)
{
	if (!has)
		return 0;
	if (f->len != 16)
		return -1;
	memcpy(out, f->data, 16);
	return 1;
}

/* Checks event m (the one after seq *last) and copies it into e, its
 * tokens into tok. Returns 0 or -1 (not well formed). */
static int take_event(const Kvpalace__V1__KvEvent *m, uint64_t *last, struct kvp_event *e,
		      uint32_t *tok)
{
	uint32_t kind = (uint32_t)m->kind, tier = (uint32_t)m->tier;
	int h, ph;

	if (m->seq <= *last || kind < KVP_EVENT_STORED || kind > KVP_EVENT_CLEARED)
		return -1;
	*last = m->seq;
	memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->seq = m->seq;
	e->pool_id = m->pool_id;
	if (kind == KVP_EVENT_CLEARED)
		return 0;
	h = hash_field(m->has_block_hash, &m->block_hash, e->hash);
	ph = hash_field(m->has_parent_hash, &m->parent_hash, e->parent);
	if (h != 1 || ph < 0 || (ph && kind != KVP_EVENT_STORED) || !m->has_tier ||
	    (tier != KVP_TIER_HOST && tier != KVP_TIER_DISK) || !m->has_block_tokens ||
	    !m->block_tokens)
		return -1;
	e->has_parent = ph;
	e->tier = tier;
	e->block_tokens = m->block_tokens;
	if (m->has_tokens_le) {
		if (kind != KVP_EVENT_STORED || m->tokens_le.len != 4ull * m->block_tokens)
			return -1;
		le_get32_array(tok, m->tokens_le.data, m->block_tokens);
		e->n_tokens = m->block_tokens;
		e->tokens = tok;
	}
	return 0;
}

KVP_PUBLIC int kvp_events_read(kvp_client *c, int timeout_ms, struct kvp_event **ret_events,
			       size_t *ret_n, uint64_t *ret_lost)
{
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__KvEvents *ev;
	struct kvp_event *out;
	size_t n_tok = 0;
	uint32_t *tok;
	uint64_t last;
	int fd, ret;

	if (!c || !ret_events || !ret_n || !ret_lost)
		return -EINVAL;
	*ret_events = NULL;
	*ret_n = 0;
	*ret_lost = 0;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (!c->events)
		return conn_error(c, -EINVAL, "this client did not subscribe to events");
	ret = rpc_wait(c, timeout_ms);
	if (ret <= 0)
		return ret;
	ret = rpc_recv(c, &resp, &fd);
	if (ret < 0)
		return ret;
	if (fd >= 0)
		close(fd);
	if (resp->id != 0 || resp->status != KVPALACE__V1__STATUS__STATUS_OK ||
	    resp->op_case != KVPALACE__V1__RESPONSE__OP_EVENTS)
		return rpc_stray(c, resp);
	ev = resp->events;
	for (size_t i = 0; i < ev->n_events; i++)
		if (ev->events[i]->has_tokens_le)
			n_tok += ev->events[i]->tokens_le.len / 4;
	out = malloc((ev->n_events ? ev->n_events : 1) * sizeof(*out) + n_tok * sizeof(uint32_t));
	if (!out)
		return conn_error(c, -ENOMEM, "out of memory for %zu events", ev->n_events);
	tok = (uint32_t *)(out + (ev->n_events ? ev->n_events : 1));
	/* The lost events come before these: the numbers skip them. */
	last = c->events_next - 1 + (ev->has_lost ? ev->lost : 0);
	for (size_t i = 0; i < ev->n_events; i++) {
		if (take_event(ev->events[i], &last, &out[i], tok) < 0) {
			free(out);
			return conn_break(c, -EPROTO, "kvpalaced pushed a malformed KV event");
		}
		tok += out[i].n_tokens;
	}
	c->events_next = last + 1;
	*ret_events = out;
	*ret_n = ev->n_events;
	*ret_lost = ev->has_lost ? ev->lost : 0;
	return 1;
}

KVP_PUBLIC void kvp_events_free(struct kvp_event *events)
{
	free(events);
}
