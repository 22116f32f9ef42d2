/* daemon/service/stats.h — fills the Stats reply from the cache's counters and
 * pools: a client sees its own pools, an admin connection every pool.
 * Event-loop thread only.
 */
#ifndef KVPD_STATS_H
#define KVPD_STATS_H

#include <stddef.h>
#include <sys/types.h>

#include "cache.h"
#include "clock.h"
#include "kvpalace.pb-c.h"
#include "layout.h"

struct session;

/* Bytes of a request type's name with its NUL (kvpalace.h's struct
 * kvp_latency.request holds as many). */
#define STATS_OP_NAME_BYTES 32

/* The number of the request type of a Request whose op_case is op_case,
 * for its latency histogram (cache_latency_add): below
 * CACHE_LATENCY_OPS, or -1 when op_case names no request type or there
 * are more types than histograms (test_dispatch checks there are not). */
int stats_op_index(int op_case);

/* The name of request type op, the Request field's message name less
 * "Request" ("MatchPrefix"), into buf (cap bytes). Returns 0, -ENOENT
 * when op is no request type, or -ENAMETOOLONG. */
int stats_op_name(unsigned int op, char *buf, size_t cap);

/* The wire form of a layout (out is initialized here). */
void stats_layout(const struct shm_layout *in, Kvpalace__V1__Layout *out);

/* One session's row of ListSessions (out is initialized here); now_ns is
 * clock_now_ns(), idle times are counted from it. */
void stats_session_info(const struct session *s, uint64_t now_ns, Kvpalace__V1__SessionInfo *out);

/* Fills out (initialized by the caller) and allocates what it points to
 * in one block returned in *ret_heap (free() it after packing). Keeps the
 * packed message under max_bytes by leaving out pools (pools_truncated).
 * Returns 0 or -ENOMEM. */
int stats_fill(const struct cache *c, uid_t uid, int admin, uint32_t max_bytes,
	       Kvpalace__V1__StatsResponse *out, void **ret_heap);

/* Sessions one ListSessions reply lists at most, whatever its limit asks
 * (KVP_LIST_SESSIONS_MAX in client/kvpalace.h: test_sizes checks). */
#define STATS_LIST_MAX 1024u

/* Fills out with sessions of uid's pools (every pool when admin; pool_id
 * only when not 0) whose id is above after_id, in id order, at most limit
 * (1..STATS_LIST_MAX, capped by the caller) and as many as fit in
 * max_bytes; sets more when others follow. Storage in *ret_heap (free()
 * it after packing). O(pools · (log sessions + limit)) through the pools'
 * id-ordered sequences, not a walk of every session. Returns 0 or
 * -ENOMEM. */
int stats_list_sessions(const struct cache *c, uid_t uid, int admin, uint64_t pool_id,
			uint64_t after_id, uint32_t limit, uint32_t max_bytes,
			Kvpalace__V1__ListSessionsResponse *out, void **ret_heap);

#endif
