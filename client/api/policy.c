/* client/api/policy.c — a session's context-cache policy: SetPolicy, tags,
 * importance reports, Compact and per-token metadata (kvpalace.h,
 * "context-cache policies").
 *
 * A compaction rewrites the session's whole page table in the daemon; the
 * handle reads it again (session_reload) before kvp_session_compact
 * returns, so kvp_session_kv never hands out a pointer into a page the
 * session gave up. Replies are checked against what we asked for: a
 * SessionMeta reply for other tokens, or a Compact that claims to keep
 * more than the session had, breaks the client (-EPROTO).
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses rpc/ and
 * base/, and session.c of its own folder.
 */
#include <errno.h>
#include <string.h>

#include "conn.h"
#include "rpc.h"
#include "session.h"

/* The daemon's defaults (daemon/base/policy.c, policy_defaults). */
KVP_PUBLIC void kvp_policy_init(struct kvp_policy *pol, uint32_t kind, uint32_t budget)
{
	if (!pol)
		return;
	memset(pol, 0, sizeof(*pol));
	pol->kind = kind;
	pol->budget = budget;
	pol->sinks = 4;
	pol->recent = 64;
	pol->hot_turns = 4;
	pol->share_permanent = 10;
	pol->share_hot = 30;
	pol->decay = 0.01f;
	for (int i = 0; i < KVP_N_ROLES; i++)
		pol->role_weight[i] = 1.0f;
}

/* The client of s after the usual checks, or NULL with *ret set. */
static struct kvp_client *usable(kvp_session *s, int *ret)
{
	struct kvp_client *c;

	if (!s) {
		*ret = -EINVAL;
		return NULL;
	}
	c = s->pool->client;
	conn_clear_error(c);
	*ret = conn_usable(c);
	return *ret < 0 ? NULL : c;
}

KVP_PUBLIC int kvp_session_set_policy(kvp_session *s, const struct kvp_policy *pol,
				      uint32_t *ret_budget)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SetPolicyRequest sp = KVPALACE__V1__SET_POLICY_REQUEST__INIT;
	Kvpalace__V1__PolicySpec spec = KVPALACE__V1__POLICY_SPEC__INIT;
	Kvpalace__V1__RolePolicy roles[KVP_N_ROLES], *role_ptrs[KVP_N_ROLES];
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	if (!pol)
		return conn_error(c, -EINVAL, "no policy");
	spec.kind = (Kvpalace__V1__Policy)pol->kind;
	spec.has_budget = spec.has_budget_max = spec.has_grow_pct = spec.has_sinks = 1;
	spec.has_recent = spec.has_hot_turns = spec.has_share_permanent = spec.has_share_hot = 1;
	spec.has_decay = spec.has_auto_compact = 1;
	spec.budget = pol->budget;
	spec.budget_max = pol->budget_max;
	spec.grow_pct = pol->grow_pct;
	spec.sinks = pol->sinks;
	spec.recent = pol->recent;
	spec.hot_turns = pol->hot_turns;
	spec.share_permanent = pol->share_permanent;
	spec.share_hot = pol->share_hot;
	spec.decay = pol->decay;
	spec.auto_compact = pol->auto_compact != 0;
	for (int i = 0; i < KVP_N_ROLES; i++) {
		kvpalace__v1__role_policy__init(&roles[i]);
		roles[i].role = (Kvpalace__V1__Role)i;
		roles[i].has_limit = roles[i].has_weight = 1;
		roles[i].limit = pol->role_limit[i];
		roles[i].weight = pol->role_weight[i];
		role_ptrs[i] = &roles[i];
	}
	spec.roles = role_ptrs;
	spec.n_roles = KVP_N_ROLES;
	sp.session_id = s->id;
	sp.policy = &spec;
	req.op_case = KVPALACE__V1__REQUEST__OP_SET_POLICY;
	req.set_policy = &sp;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_SET_POLICY, &resp, NULL);
	if (ret < 0)
		return ret;
	if (ret_budget)
		*ret_budget = resp->set_policy->budget;
	return 0;
}

KVP_PUBLIC int kvp_session_tag(kvp_session *s, uint64_t first, uint64_t n, uint32_t role,
			       uint32_t turn, unsigned int flags)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__TagSpanRequest ts = KVPALACE__V1__TAG_SPAN_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	if (role >= KVP_N_ROLES || (flags & ~(KVP_TAG_PERMANENT | KVP_TAG_SUMMARY)))
		return conn_error(c, -EINVAL, "unknown role or tag flag");
	ts.session_id = s->id;
	ts.first = first;
	ts.n = n;
	ts.has_role = ts.has_turn = ts.has_permanent = 1;
	ts.role = (Kvpalace__V1__Role)role;
	ts.turn = turn;
	ts.permanent = (flags & (KVP_TAG_PERMANENT | KVP_TAG_SUMMARY)) != 0;
	ts.has_summary = ts.summary = (flags & KVP_TAG_SUMMARY) != 0;
	req.op_case = KVPALACE__V1__REQUEST__OP_TAG_SPAN;
	req.tag_span = &ts;
	return rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_TAG_SPAN, &resp, NULL);
}

/* Sends one ReportImportance request (ri filled but for the session). */
static int report(kvp_session *s, struct kvp_client *c, Kvpalace__V1__ReportImportanceRequest *ri)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__Response *resp;

	ri->session_id = s->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE;
	req.report_importance = ri;
	return rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_REPORT_IMPORTANCE, &resp, NULL);
}

KVP_PUBLIC int kvp_session_report_importance(kvp_session *s, uint64_t first, const float *mass,
					     size_t n)
{
	Kvpalace__V1__ReportImportanceRequest ri = KVPALACE__V1__REPORT_IMPORTANCE_REQUEST__INIT;
	struct kvp_client *c;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	if (!mass && n)
		return conn_error(c, -EINVAL, "no masses");
	/* One step: a list longer than one request would decay twice. */
	if (n > c->chunk_tokens)
		return conn_error(c, -EMSGSIZE,
				  "%zu masses in one report; the daemon takes at most %zu", n,
				  (size_t)c->chunk_tokens);
	ri.has_first = 1;
	ri.first = first;
	ri.mass = (float *)mass;
	ri.n_mass = n;
	return report(s, c, &ri);
}

/* A query (or, when topic, a topic vector) for the daemon to score with. */
static int query_report(kvp_session *s, uint32_t layer, const float *q, uint32_t n_q_heads,
			int topic)
{
	Kvpalace__V1__ReportImportanceRequest ri = KVPALACE__V1__REPORT_IMPORTANCE_REQUEST__INIT;
	struct kvp_client *c;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	if (!q || !n_q_heads)
		return conn_error(c, -EINVAL, "no query");
	ri.has_layer = ri.has_n_q_heads = 1;
	ri.layer = layer;
	ri.n_q_heads = n_q_heads;
	ri.query = (float *)q;
	ri.n_query = (size_t)n_q_heads * s->pool->layout.head_dim;
	ri.has_topic = ri.topic = topic != 0;
	return report(s, c, &ri);
}

KVP_PUBLIC int kvp_session_score_query(kvp_session *s, uint32_t layer, const float *q,
				       uint32_t n_q_heads)
{
	return query_report(s, layer, q, n_q_heads, 0);
}

KVP_PUBLIC int kvp_session_score_topic(kvp_session *s, uint32_t layer, const float *topic,
				       uint32_t n_q_heads)
{
	return query_report(s, layer, topic, n_q_heads, 1);
}

KVP_PUBLIC int kvp_session_compact(kvp_session *s, uint64_t *ret_dropped)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CompactRequest cr = KVPALACE__V1__COMPACT_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__CompactResponse *r;
	struct kvp_client *c;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	cr.session_id = s->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_COMPACT, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->compact;
	if (r->n_tokens + r->dropped_tokens != s->n_tokens ||
	    r->n_pages != pool_pages_for(s->pool, r->n_tokens))
		return conn_break(c, -EPROTO,
				  "kvpalaced compacted a session of %llu tokens to %llu tokens "
				  "in %u pages, dropping %llu",
				  (unsigned long long)s->n_tokens, (unsigned long long)r->n_tokens,
				  r->n_pages, (unsigned long long)r->dropped_tokens);
	if (ret_dropped)
		*ret_dropped = r->dropped_tokens;
	if (r->dropped_tokens == 0)
		return 0; /* nothing moved */
	return session_reload(s, r->n_tokens);
}

KVP_PUBLIC int kvp_session_compacted(const kvp_session *s)
{
	return s ? s->compacted : 0;
}

KVP_PUBLIC int kvp_session_meta(kvp_session *s, uint64_t first, size_t n,
				struct kvp_token_info *out)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SessionMetaRequest sm = KVPALACE__V1__SESSION_META_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__SessionMetaResponse *r;
	struct kvp_client *c;
	size_t done = 0;
	int ret;

	c = usable(s, &ret);
	if (!c)
		return ret;
	if (!out && n)
		return conn_error(c, -EINVAL, "nowhere to put the metadata");
	sm.session_id = s->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_SESSION_META;
	req.session_meta = &sm;
	do {
		size_t got;

		sm.first = first + done;
		sm.has_max = 1;
		sm.max = n - done > UINT32_MAX ? UINT32_MAX : (uint32_t)(n - done);
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_SESSION_META, &resp, NULL);
		if (ret < 0)
			return ret;
		r = resp->session_meta;
		got = r->n_positions;
		if (sm.first + n - done > r->n_tokens)
			return conn_error(
				c, -ERANGE, "tokens %llu..%llu asked for, the session has %llu",
				(unsigned long long)first, (unsigned long long)(first + n),
				(unsigned long long)r->n_tokens);
		if (got > n - done || (!got && done < n) || r->n_roles != got ||
		    r->n_turns != got || r->n_permanent != got || r->n_scores != got ||
		    (r->n_summary != got && r->n_summary != 0))
			return conn_break(c, -EPROTO,
					  "kvpalaced answered SessionMeta for %zu tokens with %zu",
					  n - done, got);
		for (size_t i = 0; i < got; i++)
			out[done + i] = (struct kvp_token_info){
				.pos = r->positions[i],
				.role = r->roles[i],
				.turn = r->turns[i],
				.flags = (r->permanent[i] ? KVP_TAG_PERMANENT : 0) |
					 (r->n_summary && r->summary[i] ? KVP_TAG_SUMMARY : 0),
				.score = r->scores[i],
			};
		if (r->compacted)
			s->compacted = 1;
		done += got;
	} while (done < n);
	return 0;
}
