/* daemon/service/polop.c — policy requests (see polop.h).
 *
 * A ReportImportance with a query costs up to COMPACT_MAX_QUERY_WORK
 * multiply-adds, tens of milliseconds, and a Compact copies up to the
 * whole session: on the loop thread that stalled every other client
 * (issue 14 item 7: another tenant's ping went from 0.014 ms to 20 ms).
 * They run on a worker instead (compact.h's jobs), answered through a
 * ticket, and a tenant has at most POLOP_JOBS_PER_TENANT of them in
 * flight: its further requests wait in their connections, parked on a
 * pool where one of its jobs runs, so one tenant never fills the worker
 * queue that checkpoints and the disk fallback of everyone share.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "compact.h"
#include "frame.h"
#include "list.h"
#include "log.h"
#include "polop.h"
#include "session.h"
#include "status.h"
#include "tier.h"
#include "worker.h"

/* Jobs (queries, compactions) one tenant may have queued or running on
 * the workers. */
#define POLOP_JOBS_PER_TENANT 1u

/* A ReportImportance query, a Compact or a compaction after a Commit on
 * a worker. */
struct polop_job {
	struct worker_job wj;
	struct ticket t;
	struct cache *c;
	struct compact_job cj;
	int after_commit; /* the ticket answers a Commit */
};

/* Metadata entries one SessionMeta reply carries at most: a packed entry
 * takes at most 5 + 5 + 5 + 1 + 4 bytes. */
#define META_PER_REPLY_MAX 16384u

int polop_is_policy_op(Kvpalace__V1__Request__OpCase op)
{
	switch (op) {
	case KVPALACE__V1__REQUEST__OP_SET_POLICY:
	case KVPALACE__V1__REQUEST__OP_TAG_SPAN:
	case KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE:
	case KVPALACE__V1__REQUEST__OP_COMPACT:
	case KVPALACE__V1__REQUEST__OP_SESSION_META:
		return 1;
	default:
		return 0;
	}
}

void polop_from_spec(const Kvpalace__V1__PolicySpec *in, struct policy *pol)
{
	policy_defaults(pol, (enum policy_kind)in->kind);
	/* An out-of-range kind stays visible to policy_validate. */
	pol->kind = (uint8_t)((unsigned)in->kind > 255 ? 255 : (unsigned)in->kind);
	if (in->has_budget)
		pol->budget = in->budget;
	if (in->has_budget_max)
		pol->budget_max = in->budget_max;
	if (in->has_grow_pct)
		pol->grow_pct = in->grow_pct;
	if (in->has_sinks)
		pol->sinks = in->sinks;
	if (in->has_recent)
		pol->recent = in->recent;
	if (in->has_hot_turns)
		pol->hot_turns = in->hot_turns;
	if (in->has_share_permanent)
		pol->share_permanent =
			(uint8_t)(in->share_permanent > 255 ? 255 : in->share_permanent);
	if (in->has_share_hot)
		pol->share_hot = (uint8_t)(in->share_hot > 255 ? 255 : in->share_hot);
	if (in->has_decay)
		pol->decay = in->decay;
	if (in->has_auto_compact)
		pol->auto_compact = (uint8_t)in->auto_compact;
	for (size_t i = 0; i < in->n_roles; i++) {
		const Kvpalace__V1__RolePolicy *rp = in->roles[i];
		unsigned role = (unsigned)rp->role;

		if (role >= POLICY_N_ROLES)
			continue; /* validated in do_set_policy */
		if (rp->has_limit)
			pol->role_limit[role] = rp->limit;
		if (rp->has_weight)
			pol->role_weight[role] = rp->weight;
	}
}

static struct session *own_session(struct cache *cache, struct peer *c, uint64_t id,
				   const char **why)
{
	struct session *s = session_get(cache, id, c->uid, 0);

	if (!s)
		*why = "no such session";
	return s;
}

int polop_tag(int has_role, Kvpalace__V1__Role role, int has_turn, uint32_t turn, int has_perm,
	      int perm, int summary, struct session_tag *tag, const char **why)
{
	memset(tag, 0, sizeof(*tag));
	if (has_role && (unsigned)role >= POLICY_N_ROLES) {
		*why = "unknown role";
		return -EINVAL;
	}
	tag->role = has_role ? (uint8_t)role : ROLE_NONE;
	tag->flags = has_perm && perm ? TOKEN_PERMANENT : 0;
	if (summary)
		tag->flags |= TOKEN_SUMMARY | TOKEN_PERMANENT;
	tag->has_turn = (uint8_t)has_turn;
	tag->turn = turn;
	return 0;
}

static int do_set_policy(struct cache *cache, struct peer *c,
			 const Kvpalace__V1__SetPolicyRequest *in, struct reply *r,
			 const char **why)
{
	struct session *s = own_session(cache, c, in->session_id, why);
	struct policy pol;
	uint32_t budget;
	int ret;

	if (!s)
		return -ENOENT;
	for (size_t i = 0; i < in->policy->n_roles; i++)
		if ((unsigned)in->policy->roles[i]->role >= POLICY_N_ROLES) {
			*why = "unknown role in the policy";
			return -EINVAL;
		}
	polop_from_spec(in->policy, &pol);
	ret = compact_set_policy(s, &pol, &budget, why);
	if (ret < 0)
		return ret;
	kvpalace__v1__set_policy_response__init(&r->u.set_policy);
	r->u.set_policy.budget = budget;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_SET_POLICY;
	r->resp.set_policy = &r->u.set_policy;
	return 0;
}

static int do_tag_span(struct cache *cache, struct peer *c, const Kvpalace__V1__TagSpanRequest *in,
		       struct reply *r, const char **why)
{
	struct session *s = own_session(cache, c, in->session_id, why);
	struct session_tag tag;
	int ret;

	if (!s)
		return -ENOENT;
	ret = polop_tag(in->has_role, in->role, in->has_turn, in->turn, in->has_permanent,
			in->permanent, in->has_summary && in->summary, &tag, why);
	if (ret < 0)
		return ret;
	if (in->first <= s->n_tokens && in->n <= s->n_tokens - in->first) {
		ret = compact_check_summary(s, in->first, in->n, tag.flags, why);
		if (ret < 0)
			return ret;
	}
	ret = compact_tag(cache, s, in->first, in->n, &tag);
	if (ret < 0) {
		*why = ret == -ERANGE ? "span past the session's tokens"
				      : "no room for the session's own copy of its tags "
					"(max-tenant-tokens)";
		return ret;
	}
	kvpalace__v1__tag_span_response__init(&r->u.tag_span);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_TAG_SPAN;
	r->resp.tag_span = &r->u.tag_span;
	return 0;
}

static void importance_reply(struct reply *r, uint64_t scored)
{
	kvpalace__v1__report_importance_response__init(&r->u.report_importance);
	r->u.report_importance.scored_tokens = scored;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_REPORT_IMPORTANCE;
	r->resp.report_importance = &r->u.report_importance;
}

static void compact_reply(struct reply *r, const struct session *s, uint64_t dropped)
{
	kvpalace__v1__compact_response__init(&r->u.compact);
	r->u.compact.n_tokens = s->n_tokens;
	r->u.compact.dropped_tokens = dropped;
	r->u.compact.n_pages = s->n_pages;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_COMPACT;
	r->resp.compact = &r->u.compact;
}

static const char *compact_why(int err)
{
	return err == -EINVAL	? "the session has no token policy: SetPolicy first"
	       : err == -EBUSY	? "the session has uncommitted tokens: commit first"
	       : err == -ENOSPC ? "host tier full: no pages for the compacted copy"
	       : err == -EFAULT ? "the session's pages are gone from the arena"
				: "cannot compact";
}

static void job_run(struct worker_job *wj)
{
	struct polop_job *j = container_of(wj, struct polop_job, wj);

	compact_job_run(&j->cj);
}

/* Back on the loop: apply, wake the tenant's requests that waited for
 * their share, answer (a connection that closed meanwhile gets nothing). */
static void job_done(struct worker_job *wj)
{
	struct polop_job *j = container_of(wj, struct polop_job, wj);
	struct pool *p = j->cj.pool;
	enum compact_job_kind kind = j->cj.kind;
	uint64_t sid = j->cj.session_id, n = 0;
	uid_t uid = p->uid;
	const char *why = "failed";
	struct reply r;
	int ret = compact_job_finish(j->c, &j->cj, &n, &why);

	memset(&r, 0, sizeof(r));
	kvpalace__v1__response__init(&r.resp);
	r.pass_fd = -1;
	if (j->after_commit) {
		/* The commit was done before the job started, whatever became
		 * of the compaction: the client reads the table again. */
		const struct session *s = session_get(j->c, sid, uid, 0);

		if (ret < 0)
			log_ctx_debug(LOG_CTX(.session_id = sid, .uid = uid, .has_uid = 1),
				      "session %llu: compaction after a commit: %s",
				      (unsigned long long)sid, why);
		kvpalace__v1__commit_response__init(&r.u.commit);
		r.u.commit.committed_tokens = s ? s->n_committed : 0;
		r.u.commit.has_compacted = 1;
		r.u.commit.compacted = 1;
		r.resp.op_case = KVPALACE__V1__RESPONSE__OP_COMMIT;
		r.resp.commit = &r.u.commit;
	} else if (ret < 0) {
		r.resp.status = status_from_errno(ret);
		r.resp.error = (char *)why;
	} else if (kind == COMPACT_JOB_GATHER) {
		compact_reply(&r, session_get(j->c, sid, uid, 0), n); /* finish found it */
	} else {
		importance_reply(&r, n);
	}
	/* The waiters first: they had waited longer than this connection's
	 * next request, which runs from ticket_deliver. */
	tier_wake_all(p);
	ticket_deliver(&j->t, &r);
	cache_debug_check(j->c);
	free(j);
}

/* Whether c's tenant has its share of jobs in flight: then the request
 * waits in its connection (-EAGAIN, parked on a pool where one of them
 * runs, woken when it ends). One that waited PEER_MAX_PARK_NS runs anyway
 * (pk->no_park). */
static int over_share(struct cache *cache, struct peer *c, struct tier_park *pk, const char **why)
{
	if (pk->no_park || compact_jobs(cache, c->uid) < POLOP_JOBS_PER_TENANT)
		return 0;
	for (struct list *it = cache->pool_list.next; it != &cache->pool_list; it = it->next) {
		struct pool *p = list_entry(it, struct pool, link);

		if (p->uid == c->uid && p->n_compact_jobs) {
			pk->park_on = p;
			*why = "waiting for the tenant's other jobs";
			return -EAGAIN;
		}
	}
	return 0;
}

static int submit(struct cache *cache, struct peer *c, uint64_t req_id, struct polop_job *j)
{
	j->c = cache;
	j->wj.run = job_run;
	j->wj.done = job_done;
	ticket_start(c, &j->t, req_id);
	worker_submit(cache->worker, &j->wj);
	return -EINPROGRESS;
}

int polop_commit_wait(struct cache *cache, struct peer *c, const struct session *s, uint64_t n,
		      struct tier_park *pk, const char **why)
{
	if (!cache->worker || n > s->n_tokens - s->n_committed)
		return 0;
	return compact_due(s, n) ? over_share(cache, c, pk, why) : 0;
}

int polop_compact_after_commit(struct cache *cache, struct peer *c, uint64_t req_id,
			       struct session *s)
{
	struct polop_job *j;

	if (!compact_due(s, 0))
		return 0;
	if (!cache->worker)
		return compact_after_commit(cache, s);
	/* A tenant still at its share of jobs (polop_commit_wait let a
	 * commit that waited PEER_MAX_PARK_NS through) compacts at a later
	 * commit: this one is done. */
	if (compact_jobs(cache, c->uid) >= POLOP_JOBS_PER_TENANT)
		return 0;
	j = calloc(1, sizeof(*j));
	if (!j)
		return 0;
	if (compact_gather_start_now(cache, s, &j->cj) < 0) {
		free(j);
		return 0;
	}
	j->after_commit = 1;
	return submit(cache, c, req_id, j);
}

/* A query's scoring: on a worker (-EINPROGRESS, answered later), parked
 * (-EAGAIN) while the tenant has its share of jobs in flight, or here
 * when the cache has no workers (an in-process test's). */
static int score(struct cache *cache, struct peer *c, uint64_t req_id, struct session *s,
		 const Kvpalace__V1__ReportImportanceRequest *in, struct reply *r,
		 struct tier_park *pk, const char **why)
{
	int topic = in->has_topic && in->topic;
	struct polop_job *j;
	uint64_t scored = 0;
	int ret;

	if (!cache->worker) {
		struct compact_job cj;

		ret = compact_score_start(s, topic, in->layer, in->n_q_heads, in->query,
					  in->n_query, &cj, why);
		if (ret == 0) {
			compact_job_run(&cj);
			ret = compact_job_finish(cache, &cj, &scored, why);
		}
		if (ret < 0)
			return ret;
		importance_reply(r, scored);
		return 0;
	}
	ret = over_share(cache, c, pk, why);
	if (ret < 0)
		return ret;
	j = calloc(1, sizeof(*j));
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	ret = compact_score_start(s, topic, in->layer, in->n_q_heads, in->query, in->n_query,
				  &j->cj, why);
	if (ret < 0) {
		free(j);
		return ret;
	}
	return submit(cache, c, req_id, j);
}

static int do_report_importance(struct cache *cache, struct peer *c, uint64_t req_id,
				const Kvpalace__V1__ReportImportanceRequest *in, struct reply *r,
				struct tier_park *pk, const char **why)
{
	struct session *s = own_session(cache, c, in->session_id, why);
	int ret;

	if (!s)
		return -ENOENT;
	if (in->n_query && in->n_mass) {
		*why = "give masses or a query, not both";
		return -EINVAL;
	}
	if (in->n_query) {
		if (!in->has_layer || !in->has_n_q_heads) {
			*why = "a query needs its layer and n_q_heads";
			return -EINVAL;
		}
		ret = score(cache, c, req_id, s, in, r, pk, why);
		return ret == -ENODATA ? -ERANGE : ret;
	}
	ret = compact_add_mass(cache, s, in->has_first ? in->first : 0, in->mass, in->n_mass);
	if (ret < 0) {
		*why = ret == -ERANGE ? "masses past the session's tokens"
				      : "no room for the session's own copy of its scores "
					"(max-tenant-tokens)";
		return ret;
	}
	importance_reply(r, in->n_mass);
	return 0;
}

/* Compact: the copy of the kept tokens on a worker, as a query's
 * scoring. */
static int do_compact(struct cache *cache, struct peer *c, uint64_t req_id,
		      const Kvpalace__V1__CompactRequest *in, struct reply *r, struct tier_park *pk,
		      const char **why)
{
	struct session *s = own_session(cache, c, in->session_id, why);
	struct polop_job *j;
	uint64_t dropped = 0;
	int ret;

	if (!s)
		return -ENOENT;
	if (!cache->worker) {
		ret = compact_session(cache, s, pk, &dropped);
		if (ret < 0) {
			*why = compact_why(ret);
			return ret;
		}
		compact_reply(r, s, dropped);
		return 0;
	}
	ret = over_share(cache, c, pk, why);
	if (ret < 0)
		return ret;
	j = calloc(1, sizeof(*j));
	if (!j) {
		*why = "out of memory";
		return -ENOMEM;
	}
	ret = compact_gather_start(cache, s, pk, &j->cj);
	if (ret < 0) {
		free(j);
		*why = compact_why(ret);
		return ret;
	}
	return submit(cache, c, req_id, j);
}

static int do_session_meta(struct cache *cache, struct peer *c,
			   const Kvpalace__V1__SessionMetaRequest *in, struct reply *r,
			   const char **why)
{
	Kvpalace__V1__SessionMetaResponse *out = &r->u.session_meta;
	struct session *s = own_session(cache, c, in->session_id, why);
	uint64_t n, fit;
	char *heap;

	if (!s)
		return -ENOENT;
	if (in->first > s->n_tokens) {
		*why = "first token past the session's tokens";
		return -ERANGE;
	}
	fit = reply_fit(cache->cfg->max_message_bytes, 256, 20);
	if (fit > META_PER_REPLY_MAX)
		fit = META_PER_REPLY_MAX;
	if (in->has_max && in->max < fit)
		fit = in->max;
	n = s->n_tokens - in->first;
	if (n > fit)
		n = fit;
	/* One block for the six arrays: reply_fini frees it. */
	heap = malloc((n ? n : 1) * (4 * sizeof(uint32_t) + 2 * sizeof(protobuf_c_boolean)));
	if (!heap) {
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = heap;
	kvpalace__v1__session_meta_response__init(out);
	out->n_tokens = s->n_tokens;
	out->compacted = s->compacted;
	out->policy = (Kvpalace__V1__Policy)s->pol->kind;
	out->positions = (uint32_t *)heap;
	out->roles = out->positions + n;
	out->turns = out->roles + n;
	out->scores = (float *)(out->turns + n);
	out->permanent = (protobuf_c_boolean *)(out->scores + n);
	out->summary = out->permanent + n;
	out->n_positions = out->n_roles = out->n_turns = out->n_scores = out->n_permanent = n;
	out->n_summary = n;
	for (uint64_t i = 0; i < n; i++) {
		const struct token_meta m_ = tokvec_meta(&s->tok, in->first + i), *m = &m_;

		out->positions[i] = m->pos;
		out->roles[i] = m->role;
		out->turns[i] = m->turn;
		out->scores[i] = m->score;
		out->permanent[i] = (m->flags & TOKEN_PERMANENT) != 0;
		out->summary[i] = (m->flags & TOKEN_SUMMARY) != 0;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_SESSION_META;
	r->resp.session_meta = out;
	return 0;
}

int polop_run(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req,
	      struct reply *r, struct tier_park *pk, const char **why)
{
	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_SET_POLICY:
		return do_set_policy(cache, c, req->set_policy, r, why);
	case KVPALACE__V1__REQUEST__OP_TAG_SPAN:
		return do_tag_span(cache, c, req->tag_span, r, why);
	case KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE:
		return do_report_importance(cache, c, req->id, req->report_importance, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_COMPACT:
		return do_compact(cache, c, req->id, req->compact, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_SESSION_META:
		return do_session_meta(cache, c, req->session_meta, r, why);
	default:
		*why = "unknown operation";
		return -EPROTO;
	}
}
