/* daemon/compact.h — a session's context-cache policy: tags, importance
 * scores and compaction.
 *
 * The rules of what is kept live in policy.h (pure functions); this file
 * applies them to a session. Compaction copies the kept tokens' K and V
 * (kref_gather_tokens, bytes unchanged) into fresh pages in session order,
 * drops the session's references to its old pages (the prefix index, leases
 * and other sessions keep theirs: what others see never changes) and marks
 * the session compacted: its pages are private from then on and never
 * enter the prefix index, and each kept token keeps its original position
 * in meta[].pos. Event-loop thread only.
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

/* Sets s's policy (validated: -EINVAL with *why). The budget it gives for
 * the session's length now goes to *ret_budget. */
int compact_set_policy(struct session *s, const struct policy *pol, uint32_t *ret_budget,
		       const char **why);

/* Tags tokens [first, first + n): role, flags and, when has_turn, turn.
 * -ERANGE past the session's tokens. */
int compact_tag(struct session *s, uint64_t first, uint64_t n, const struct session_tag *tag);

/* One importance step with masses the client measured for tokens
 * [first, first + n) (policy_add_mass). -ERANGE past the tokens. */
int compact_add_mass(struct session *s, uint64_t first, const float *mass, size_t n);

/* One importance step computed here: the attention weights of q
 * ([n_q_heads][head_dim]) over the committed tokens of layer, summed over
 * heads. Returns 0 and the tokens scored, -EINVAL (layer, head count or
 * query size wrong; *why says), -E2BIG past COMPACT_MAX_QUERY_WORK,
 * -ENODATA nothing committed, -ENOMEM. */
int compact_score_query(struct session *s, uint32_t layer, uint32_t n_q_heads, const float *q,
			size_t n_q, uint64_t *ret_scored, const char **why);

/* Topic relevance (the hierarchy's temporary layer by similarity): each
 * span — the tokens of one tagged turn — gets as its tokens' score the
 * cosine similarity between the span's mean key of layer (its KV heads
 * side by side) and the topic q ([n_q_heads][head_dim], the query heads
 * of each KV head averaged), replacing what the scores were. Returns 0
 * and the tokens scored, or the errors of compact_score_query. */
int compact_score_topic(struct session *s, uint32_t layer, uint32_t n_q_heads, const float *q,
			size_t n_q, uint64_t *ret_scored, const char **why);

/* Tier placement by the hierarchy for an exact session that is closing:
 * of its first n_hashes full pages (indexed), those holding only tokens
 * outside the budget (LAYER_REST) go to the cold end of the index's lists,
 * so they leave the host tier first, while pages of the permanent, hot and
 * temporary layers keep their place. Call after the session dropped its
 * page references. */
void compact_place(struct session *s, uint32_t n_hashes);

/* Applies s's policy now. Returns 0 with the tokens dropped (0 when all
 * fit the budget), -EINVAL no policy, -EBUSY uncommitted tokens, -EAGAIN
 * (parked: room is coming from disk writes), -ENOSPC no room for the new
 * pages, -ENOMEM; nothing changed on error. */
int compact_session(struct cache *c, struct session *s, uint64_t *ret_dropped);

/* After a commit: compacts s when its policy says auto_compact and it is
 * past its budget with nothing uncommitted, without parking (a compaction
 * that finds no room waits for the next commit). Returns 1 when it
 * compacted, else 0. */
int compact_after_commit(struct cache *c, struct session *s);

#endif
