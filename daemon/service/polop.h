/* daemon/service/polop.h — the requests of context-cache policies: SetPolicy,
 * TagSpan, ReportImportance, Compact and SessionMeta (proto ops 50-54),
 * on the caller's own sessions. The work is compact.h's; this file turns
 * requests into calls and results into replies; a ReportImportance query
 * is computed on a worker thread. Event-loop thread only.
 */
#ifndef KVPD_POLOP_H
#define KVPD_POLOP_H

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "policy.h"
#include "reply.h"

/* True for the operations this file serves. */
int polop_is_policy_op(Kvpalace__V1__Request__OpCase op);

struct tier_park;
/* Runs one of them: 0 with the reply in r, or -errno with *why, or
 * -EAGAIN with pk->park_on set when a Compact waits for disk writes or
 * a query waits for its tenant's scoring jobs (never when pk->no_park),
 * or -EINPROGRESS when a worker scores a query (a ticket of c answers
 * it). */
int polop_run(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req,
	      struct reply *r, struct tier_park *pk, const char **why);

struct session;
/* Before c's Commit of n tokens of s: -EAGAIN (pk->park_on set, *why)
 * when the commit would make s due for compaction (compact_due) while
 * c's tenant has its share of worker jobs in flight, so the commit waits
 * for them; else 0. Without the wait, a tenant's sessions would grow past
 * their budgets, commit after commit, for as long as a slow job runs.
 * Never -EAGAIN when pk->no_park. */
int polop_commit_wait(struct cache *cache, struct peer *c, const struct session *s, uint64_t n,
		      struct tier_park *pk, const char **why);

/* After c's Commit (request req_id) of s: compacts s when compact_due,
 * on a worker. Returns -EINPROGRESS when a worker compacts (a ticket of c
 * answers the Commit then, saying compacted), 1 when it compacted here (a
 * cache without workers), or 0 when it did not (not due; the tenant has
 * its share of jobs in flight, or no room now: a later commit tries
 * again) and the Commit answers as usual. */
int polop_compact_after_commit(struct cache *cache, struct peer *c, uint64_t req_id,
			       struct session *s);

struct session_tag;
/* The tags of a TagSpan or an Append from their protocol fields (summary:
 * TOKEN_SUMMARY and TOKEN_PERMANENT). Returns 0, or -EINVAL (*why) for a
 * role out of range. */
int polop_tag(int has_role, Kvpalace__V1__Role role, int has_turn, uint32_t turn, int has_perm,
	      int perm, int summary, struct session_tag *tag, const char **why);

/* A policy from its protocol form, defaults filled in (not validated). */
void polop_from_spec(const Kvpalace__V1__PolicySpec *in, struct policy *pol);

#endif
