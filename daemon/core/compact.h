/* daemon/core/compact.h — a session's context-cache policy: tags, importance
 * scores and compaction.
 *
 * The rules of what is kept live in policy.h (pure functions); this file
 * applies them to a session. Compaction copies the kept tokens' K and V
 * (kref_gather_tokens, bytes unchanged) into fresh pages in session order,
 * drops the session's references to its old pages (the prefix index, leases
 * and other sessions keep theirs: what others see never changes) and marks
 * the session compacted: its pages are private from then on and never
 * enter the prefix index, and each kept token keeps its original position
 * in meta[].pos. Event-loop thread only, but for compact_job_run.
 */
#ifndef KVPD_COMPACT_H
#define KVPD_COMPACT_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "policy.h"
#include "session.h"

/* The most multiply-adds one ReportImportance query may cost the event
 * loop (tokens × query heads × head_dim); a longer session reports the
 * masses its own attention measured instead. */
#define COMPACT_MAX_QUERY_WORK (1ull << 26)

/* Sets s's policy (validated: -EINVAL with *why, also for a budget below
 * the session's summary tokens; -EOPNOTSUPP a token
 * policy in a pool whose pages the kernels cannot read: latent or raw
 * fp8, shm_layout_numeric). The budget it gives for the session's length
 * now goes to *ret_budget. */
int compact_set_policy(struct session *s, const struct policy *pol, uint32_t *ret_budget,
		       const char **why);

/* Summary spans (TOKEN_SUMMARY) are kept by every token policy, so a
 * session holds at most its policy's budget of them (exact sessions: any
 * number, checked when a policy comes). 0 when giving tokens [first,
 * first + n) the tag flags keeps within that (flags without TOKEN_SUMMARY:
 * always), else -EINVAL with *why. Tokens past the session's count as
 * new ones. O(tokens of the session) when flags has TOKEN_SUMMARY. */
int compact_check_summary(const struct session *s, uint64_t first, uint64_t n, unsigned flags,
			  const char **why);

/* Tags tokens [first, first + n): role, flags and, when has_turn, turn.
 * -ERANGE past the session's tokens; -ENOMEM or -EDQUOT
 * (max-tenant-tokens) when the tags are shared with a fork and the
 * session's own copy cannot be made. */
int compact_tag(struct cache *c, struct session *s, uint64_t first, uint64_t n,
		const struct session_tag *tag);

/* One importance step with masses the client measured for tokens
 * [first, first + n) (policy_add_mass). -ERANGE past the tokens;
 * -ENOMEM or -EDQUOT as compact_tag. */
int compact_add_mass(struct cache *c, struct session *s, uint64_t first, const float *mass,
		     size_t n);

/* The work of a request that can take milliseconds, as a job for a
 * worker thread: one importance step computed here from a query
 * (COMPACT_JOB_QUERY: the attention weights of q, [n_q_heads][head_dim],
 * over the committed tokens of layer, summed over heads), topic relevance
 * (COMPACT_JOB_TOPIC: each span — the tokens of one tagged turn — gets as
 * its tokens' score the cosine similarity between the span's mean key of
 * layer, its KV heads side by side, and the topic q with each KV head's
 * query heads averaged, replacing what the scores were), or a compaction
 * (COMPACT_JOB_GATHER: the choice of the tokens kept and the copy of their
 * K/V into fresh pages).
 *
 * A query or topic costs up to COMPACT_MAX_QUERY_WORK multiply-adds (tens
 * of milliseconds); a compaction's choice under an importance or
 * hierarchy policy takes seconds for millions of tokens, and its copy is
 * up to the whole session, so
 * each runs in three steps: a start on the loop checks the request and
 * takes a snapshot — the page slots read, each holding a reference so it
 * is neither freed nor reused while the job reads it, the query, each
 * token's turn, the kept tokens and their fresh pages; compact_job_run on
 * any thread reads (and writes) the arena through the guard; then
 * compact_job_finish on the loop applies the result when the session is
 * still the one the job saw, and releases the snapshot. The pool stays
 * while a job holds it (pool.n_compact_jobs). The fields are private to
 * compact.c. */
enum compact_job_kind {
	COMPACT_JOB_QUERY,
	COMPACT_JOB_TOPIC,
	COMPACT_JOB_GATHER,
};

struct compact_job {
	struct pool *pool; /* held: pool.n_compact_jobs, link on pool.compact_jobs */
	struct list link;
	enum compact_job_kind kind;
	uint64_t session_id;
	uint64_t n;	  /* committed tokens read */
	uint32_t *slots;  /* [n_slots] their pages, one reference each */
	const void **src; /* [n_slots] the same pages in the arena */
	uint32_t n_slots;
	struct shm_layout layout;
	uint32_t layer, n_q_heads;
	float *q;		 /* [n_q_heads * head_dim], a copy */
	uint32_t *turns;	 /* topic: [n] the turn of each token */
	float *out;		 /* query, topic: [n] mass or score of each token */
	uint32_t *keep;		 /* gather: [n] room for the tokens kept, ascending */
	size_t k;		 /* how many (chosen by run when meta is set) */
	struct token_meta *meta; /* gather: [n] a copy to choose from, or NULL */
	struct policy pol;	 /* gather: the session's, with meta */
	uint32_t budget;
	int late;	     /* gather: the budget holds every token: no pages taken yet */
	uint32_t *new_slots; /* gather: [n_new] fresh pages, one reference each */
	void **dst;	     /* [n_new] the same in the arena */
	uint32_t n_new;
	int ret;	 /* of compact_job_run */
	const char *why; /* with it */
};

/* A query (or, with topic, a topic) for s, checked and snapshot into j
 * (zeroed first). Returns 0, -EINVAL (layer, head count or query size
 * wrong; *why says), -E2BIG past COMPACT_MAX_QUERY_WORK, -ENODATA nothing
 * committed, -ENOMEM; nothing is held on error. */
int compact_score_start(struct session *s, int topic, uint32_t layer, uint32_t n_q_heads,
			const float *q, size_t n_q, struct compact_job *j, const char **why);

struct tier_park;
/* s's policy applied now, as a job in j (zeroed first): a copy of the
 * tokens' metadata for the job to choose from, and room made and fresh
 * pages taken for as many tokens as the budget keeps (when the budget
 * holds every token, none: compact_job_finish takes them, without waiting
 * for disk writes, in the rare case the choice dropped some). Returns 0
 * with the job to run,
 * -EINVAL no policy, -EBUSY uncommitted tokens, -EAGAIN with pk->park_on
 * set (room is coming from disk writes; never when pk->no_park), -ENOSPC
 * no room for the new pages, -ENOMEM; nothing is held on error. */
int compact_gather_start(struct cache *c, struct session *s, struct tier_park *pk,
			 struct compact_job *j);

/* The work, on any thread: touches only what j owns and the arena (under
 * the guard). */
void compact_job_run(struct compact_job *j);

/* On the loop: applies the result to the session when it still exists and
 * still holds the same committed tokens in the same pages, then releases
 * j (always). Returns 0 and the tokens scored (query, topic) or dropped
 * (gather) in *ret_n, -EBUSY when the session changed meanwhile
 * (appended, truncated, compacted), -ENOENT when it was closed, -EFAULT
 * when its pages were gone from the arena (*why says each). */
int compact_job_finish(struct cache *c, struct compact_job *j, uint64_t *ret_n, const char **why);

/* Releases what j holds (page references, the pool) without applying
 * anything; accepts a released or zeroed job. Loop thread only. */
void compact_job_release(struct compact_job *j);

/* Jobs of pools of uid in flight. */
uint32_t compact_jobs(const struct cache *c, uid_t uid);

/* Adds the page references the jobs of p hold to refs[] (the cache
 * check). Returns 0 or -EUCLEAN. */
int compact_check(const struct pool *p, uint32_t *refs);

/* Applies s's policy now, on this thread (compact_gather_start, run and
 * finish in one). Returns 0 with the tokens dropped (0 when all fit the
 * budget), -EINVAL no policy, -EBUSY uncommitted tokens, -EAGAIN with
 * pk->park_on set (room is coming from disk writes; never when
 * pk->no_park), -ENOSPC no room for the new pages, -EFAULT pages gone
 * from the arena, -ENOMEM; nothing changed on error. */
int compact_session(struct cache *c, struct session *s, struct tier_park *pk,
		    uint64_t *ret_dropped);

/* Whether s should compact once more of its tokens are committed (0: a
 * commit just done): its policy says auto_compact and it would be past
 * its budget with nothing uncommitted. */
int compact_due(const struct session *s, uint64_t more);

/* After a commit, here on the calling thread: compacts s when
 * compact_due, without parking (a compaction that finds no room waits
 * for the next commit). Returns 1 when it compacted, else 0. For a cache
 * without workers; the daemon compacts on a worker (polop.h). */
int compact_after_commit(struct cache *c, struct session *s);

/* compact_gather_start for a compaction after a commit: without parking
 * (the commit is done either way): pages whose disk writes are in flight
 * stay, and a compaction without room fails (the next commit tries
 * again). */
int compact_gather_start_now(struct cache *c, struct session *s, struct compact_job *j);

#endif
