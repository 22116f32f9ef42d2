/* daemon/service/evsub.c — KV event subscriptions (see evsub.h).
 *
 * Layer: service, beside reply.c and peer.c: uses core/ (the cache's
 * event rings, pool_get) and proto's types; dispatch.c and the server
 * call it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "evsub.h"
#include "frame.h"
#include "le.h"
#include "pool.h"

/* Packed bytes an event of n tokens takes at most, with its place in the
 * repeated field: tags, lengths and varints at their widest. */
#define EVENT_FIXED_BYTES 96u
#define EVENT_BYTES(n)	  (EVENT_FIXED_BYTES + 4u * (n))
/* The Response envelope and KvEvents.lost. */
#define PUSH_FIXED_BYTES 48u

int evsub_subscribe(struct cache *cache, struct peer *p,
		    const Kvpalace__V1__SubscribeEventsRequest *in, struct reply *r,
		    const char **why)
{
	Kvpalace__V1__SubscribeEventsResponse *out = &r->u.subscribe_events;
	int ret;

	if (p->ev_sub) {
		*why = "this connection subscribes already";
		return -EEXIST;
	}
	if (in->has_pool_id && !pool_get(cache, in->pool_id, p->uid, p->admin)) {
		*why = "no such pool";
		return -ENOENT;
	}
	ret = kv_events_subscribe(&cache->events, p->admin, p->uid, &p->ev_ring);
	if (ret < 0) {
		*why = ret == -EDQUOT ? "too many users subscribe to KV events; try again later"
				      : "out of memory for the event ring";
		return ret;
	}
	p->ev_sub = 1;
	p->ev_pool = in->has_pool_id ? in->pool_id : 0;
	p->ev_next = p->ev_ring->next;
	p->ev_vnext = p->ev_pool ? kv_events_pool_next(&cache->events, p->ev_pool)
				 : kv_events_uid_next(&cache->events, p->uid);
	kvpalace__v1__subscribe_events_response__init(out);
	out->next_seq = p->admin ? p->ev_next : p->ev_vnext;
	out->keep = KV_EVENTS_KEEP;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_SUBSCRIBE_EVENTS;
	r->resp.subscribe_events = out;
	return 0;
}

static int sees(const struct peer *p, const struct kv_event *e)
{
	return (p->admin || e->uid == p->uid) && (!p->ev_pool || e->pool_id == p->ev_pool);
}

/* The number p is shown for e: the daemon's for the admin, else the
 * tenant's (or the pool's, for a subscriber of one pool), so that another
 * tenant's traffic shows neither in the numbers nor in what was lost. 0
 * when the daemon had no memory to number it. */
static uint64_t seq_for(const struct peer *p, const struct kv_event *e)
{
	if (p->admin)
		return e->seq;
	return p->ev_pool ? e->pseq : e->useq;
}

/* What one event becomes on the wire; hashes and tokens go into bytes,
 * which the caller sized. */
static void event_msg(Kvpalace__V1__KvEvent *m, const struct kv_event *e, uint64_t seq,
		      unsigned char *bytes)
{
	kvpalace__v1__kv_event__init(m);
	m->kind = (Kvpalace__V1__KvEvent__Kind)e->kind;
	m->seq = seq;
	m->pool_id = e->pool_id;
	if (e->kind == KV_EVENT_CLEARED)
		return;
	m->has_block_tokens = 1;
	m->block_tokens = e->block_tokens;
	m->has_tier = 1;
	m->tier = (Kvpalace__V1__Tier)e->tier;
	le_put64(bytes, e->hash.low64);
	le_put64(bytes + 8, e->hash.high64);
	m->has_block_hash = 1;
	m->block_hash.data = bytes;
	m->block_hash.len = 16;
	if (e->has_parent) {
		le_put64(bytes + 16, e->parent.low64);
		le_put64(bytes + 24, e->parent.high64);
		m->has_parent_hash = 1;
		m->parent_hash.data = bytes + 16;
		m->parent_hash.len = 16;
	}
	if (e->n_tokens) {
		le_put32_array(bytes + 32, e->tokens, e->n_tokens);
		m->has_tokens_le = 1;
		m->tokens_le.data = bytes + 32;
		m->tokens_le.len = 4u * e->n_tokens;
	}
}

int evsub_next(struct cache *cache, struct peer *p, struct reply *r, uint32_t max_message_bytes)
{
	const struct kv_ring *ring = p->ev_ring;
	Kvpalace__V1__KvEvents *out = &r->u.events;
	size_t room = reply_room(max_message_bytes, PUSH_FIXED_BYTES), used = 0, n = 0, cap;
	uint64_t oldest, lost = 0, seq, vseq;
	Kvpalace__V1__KvEvent *msgs, **ptrs;
	unsigned char *bytes;

	kvpalace__v1__response__init(&r->resp);
	r->heap = NULL;
	r->park = NULL;
	r->pass_fd = -1;
	(void)cache;
	if (!p->ev_sub)
		return 0;
	oldest = kv_ring_oldest(ring);
	if (p->ev_next < oldest) {
		/* The admin is told how many of the daemon's events went,
		 * a tenant's subscriber how many of its tenant's (its ring
		 * holds nothing else, numbered by useq as it is shown them);
		 * one of a single pool learns what it lost of the pool's
		 * from the numbers of the next it sees. */
		if (p->admin || !p->ev_pool)
			lost = oldest - p->ev_next;
		if (!p->admin && !p->ev_pool)
			p->ev_vnext = oldest;
		p->ev_next = oldest;
	}
	cap = room / EVENT_FIXED_BYTES;
	if (cap > ring->next - p->ev_next)
		cap = ring->next - p->ev_next;
	if (!cap && !lost)
		return 0;
	r->heap = malloc((cap ? cap : 1) *
			 (sizeof(*msgs) + sizeof(*ptrs) + 32 + 4 * KV_EVENT_MAX_TOKENS));
	if (!r->heap) {
		p->ev_next -= lost; /* not told yet */
		if (!p->admin && !p->ev_pool)
			p->ev_vnext -= lost;
		return -ENOMEM;
	}
	msgs = r->heap;
	ptrs = (Kvpalace__V1__KvEvent **)(msgs + cap);
	bytes = (unsigned char *)(ptrs + cap);
	for (seq = p->ev_next; seq < ring->next && n < cap; seq++) {
		const struct kv_event *e = kv_ring_at(ring, seq);

		vseq = seq_for(p, e);
		/* An event the daemon could not number for its tenant is
		 * not shown to it (the numbers it sees only grow). */
		if (!sees(p, e) || !vseq)
			continue;
		if (used + EVENT_BYTES(e->n_tokens) > room)
			break;
		used += EVENT_BYTES(e->n_tokens);
		if (!p->admin) {
			if (vseq > p->ev_vnext)
				lost += vseq - p->ev_vnext;
			p->ev_vnext = vseq + 1;
		}
		event_msg(&msgs[n], e, vseq, bytes + n * (32 + 4 * KV_EVENT_MAX_TOKENS));
		ptrs[n] = &msgs[n];
		n++;
	}
	p->ev_next = seq;
	if (!n && !lost)
		return 0;
	kvpalace__v1__kv_events__init(out);
	out->n_events = n;
	out->events = ptrs;
	out->has_lost = lost != 0;
	out->lost = lost;
	r->resp.id = 0;
	r->resp.status = KVPALACE__V1__STATUS__STATUS_OK;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_EVENTS;
	r->resp.events = out;
	return 1;
}

void evsub_gone(struct cache *cache, struct peer *p)
{
	if (!p->ev_sub)
		return;
	kv_events_unsubscribe(&cache->events, p->ev_ring);
	p->ev_ring = NULL;
	p->ev_sub = 0;
}
