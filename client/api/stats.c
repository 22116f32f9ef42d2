/* client/api/stats.c — what the daemon holds: its counters, per-pool
 * statistics and the list of sessions.
 *
 * kvp_stats() copies a Stats reply into one caller-owned struct kvp_stats
 * (its pools in a second allocation), so nothing points into the
 * connection's buffers. kvp_list_sessions() pages through ListSessions
 * (each reply holds as many sessions as fit in one message, in id order)
 * into one growing caller-owned array; a reply that does not move forward
 * in id order, or names a pool we did not ask for, breaks the client, so
 * a confused daemon cannot keep us looping. Counters a daemon of the
 * foundation release does not send read as 0.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses rpc/ and
 * base/.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "latency.h"
#include "rpc.h"

static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;

	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

/* The daemon fills LATENCY_BUCKETS buckets with the bounds both take from
 * common/latency.h; the public struct must hold as many. */
_Static_assert(KVP_LATENCY_BUCKETS == LATENCY_BUCKETS,
	       "kvpalace.h's KVP_LATENCY_BUCKETS is not common/latency.h's");

KVP_PUBLIC uint64_t kvp_latency_bound_ns(unsigned int i)
{
	return latency_bound_ns(i);
}

/* One Latency of a reply into out: the buckets we know, any further ones
 * (a daemon with finer buckets) added to the last, unbounded one. */
static void copy_latency(struct kvp_latency *out, const Kvpalace__V1__Latency *in)
{
	memset(out, 0, sizeof(*out));
	copy_str(out->request, sizeof(out->request), in->request);
	out->count = in->count;
	out->sum_ns = in->sum_ns;
	for (size_t b = 0; b < in->n_buckets; b++)
		out->buckets[b < KVP_LATENCY_BUCKETS ? b : KVP_LATENCY_BUCKETS - 1] +=
			in->buckets[b];
}

static void copy_layout(struct kvp_layout *dst, const Kvpalace__V1__Layout *src)
{
	memset(dst, 0, sizeof(*dst));
	if (!src)
		return;
	dst->n_layers = src->n_layers;
	dst->n_kv_heads = src->n_kv_heads;
	dst->head_dim = src->head_dim;
	dst->block_tokens = src->block_tokens;
	dst->dtype = (uint32_t)src->dtype;
	dst->quant_group = src->has_quant_group ? src->quant_group : 0;
	dst->format = src->has_format ? src->format : 0;
}

KVP_PUBLIC int kvp_stats(kvp_client *c, struct kvp_stats **ret_stats)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__StatsRequest sr = KVPALACE__V1__STATS_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__StatsResponse *r;
	struct kvp_stats *st;
	int ret;

	if (!c || !ret_stats)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	req.op_case = KVPALACE__V1__REQUEST__OP_STATS;
	req.stats = &sr;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_STATS, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->stats;

	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	if (r->n_pools) {
		st->pools = calloc(r->n_pools, sizeof(*st->pools));
		if (!st->pools) {
			free(st);
			return -ENOMEM;
		}
	}
	if (r->n_latencies) {
		st->latencies = calloc(r->n_latencies, sizeof(*st->latencies));
		if (!st->latencies) {
			kvp_stats_free(st);
			return -ENOMEM;
		}
	}
	st->uptime_ms = r->uptime_ms;
	st->connections = r->connections;
	st->requests = r->requests;
	st->errors = r->errors;
	st->match_hits = r->match_hits;
	st->match_misses = r->match_misses;
	st->matched_tokens = r->matched_tokens;
	st->appended_tokens = r->appended_tokens;
	st->committed_tokens = r->committed_tokens;
	st->disconnects_bad = r->disconnects_bad;
	st->gpu = !!r->gpu;
	copy_str(st->gpu_status, sizeof(st->gpu_status), r->gpu_status);
	st->n_pools = r->n_pools;
	st->pools_truncated = r->has_pools_truncated && r->pools_truncated;
	st->evictions = r->has_evictions ? r->evictions : 0;
	st->dedup_pages = r->has_dedup_pages ? r->dedup_pages : 0;
	if (r->disk_io)
		snprintf(st->disk_io, sizeof(st->disk_io), "%s", r->disk_io);
	st->spilled_pages = r->spilled_pages;
	st->promoted_pages = r->promoted_pages;
	st->disk_written_bytes = r->has_disk_written_bytes ? r->disk_written_bytes : 0;
	st->disk_served_bytes = r->has_disk_served_bytes ? r->disk_served_bytes : 0;
	st->disk_unadmitted_pages = r->has_disk_unadmitted_pages ? r->disk_unadmitted_pages : 0;
	st->prewarm_pages = r->has_prewarm_pages ? r->prewarm_pages : 0;
	st->prewarm_used_pages = r->has_prewarm_used_pages ? r->prewarm_used_pages : 0;
	st->prewarm_unused_pages = r->has_prewarm_unused_pages ? r->prewarm_unused_pages : 0;
	st->verify_failures = r->verify_failures;
	st->io_errors = r->io_errors;
	st->checkpoints_written = r->checkpoints_written;
	st->checkpoints_restored = r->checkpoints_restored;
	st->checkpoints_refused = r->checkpoints_refused;
	st->checkpoint_failures = r->checkpoint_failures;
	st->warmed_up_pages = r->warmed_up_pages;
	st->checkpoints_removed = r->has_checkpoints_removed ? r->checkpoints_removed : 0;
	st->restore_waits = r->has_restore_waits ? r->restore_waits : 0;
	st->purges = r->purges;
	st->purged_pages = r->purged_pages;
	st->sessions_closed_with_connection = r->sessions_closed_with_connection;
	st->sessions_expired = r->sessions_expired;
	st->unowned_sessions = r->unowned_sessions;
	st->placed_sessions = r->placed_sessions;
	st->unplaced_sessions = r->unplaced_sessions;
	st->queried_tokens = r->queried_tokens;
	st->queried_pages = r->queried_pages;
	st->matched_pages = r->matched_pages;
	copy_str(st->version, sizeof(st->version), r->version);
	copy_str(st->event_loop, sizeof(st->event_loop), r->event_loop);
	if (r->remote) {
		const Kvpalace__V1__RemoteTierStats *rs = r->remote;
		struct kvp_remote_stats *o = &st->remote;

		st->remote_on = 1;
		st->remote_client = rs->has_gets;
		o->nodes_up = rs->nodes_up;
		o->nodes_down = rs->nodes_down;
		o->pages_written = rs->pages_written;
		o->write_failures = rs->write_failures;
		o->fetches = rs->fetches;
		o->pages_fetched = rs->pages_fetched;
		o->fetch_misses = rs->fetch_misses;
		o->fetched_bytes = rs->fetched_bytes;
		o->gets = rs->gets;
		o->hits = rs->hits;
		o->misses = rs->misses;
		o->corrupt = rs->corrupt;
		o->timeouts = rs->timeouts;
		o->errors = rs->errors;
		o->puts = rs->puts;
		o->stored = rs->stored;
		o->dropped_puts = rs->dropped_puts;
		o->dropped_gets = rs->dropped_gets;
		o->bytes_in = rs->bytes_in;
		o->bytes_out = rs->bytes_out;
		o->inflight_bytes = rs->inflight_bytes;
	}
	st->n_latencies = r->n_latencies;
	for (size_t i = 0; i < r->n_latencies; i++)
		copy_latency(&st->latencies[i], r->latencies[i]);
	for (size_t i = 0; i < r->n_pools; i++) {
		const Kvpalace__V1__PoolStats *in = r->pools[i];
		struct kvp_pool_stats *out = &st->pools[i];

		out->pool_id = in->pool_id;
		out->uid = in->uid;
		copy_str(out->model_id, sizeof(out->model_id), in->model_id);
		copy_layout(&out->layout, in->layout);
		out->page_bytes = in->page_bytes;
		out->n_pages = in->n_pages;
		out->free_pages = in->free_pages;
		out->reserved_pages = in->reserved_pages;
		out->leased_pages = in->leased_pages;
		out->n_sessions = in->n_sessions;
		out->indexed_pages = in->has_indexed_pages ? in->indexed_pages : 0;
		out->evictable_pages = in->has_evictable_pages ? in->evictable_pages : 0;
		out->evictions = in->has_evictions ? in->evictions : 0;
		out->dedup_pages = in->has_dedup_pages ? in->dedup_pages : 0;
		out->has_gpu = in->has_device_pages;
		out->device_pages = in->device_pages;
		out->device_used_pages = in->device_used_pages;
		out->device_copied_pages = in->device_copied_pages;
		out->device_dropped_pages = in->device_dropped_pages;
		out->device_copied_back_pages = in->device_copied_back_pages;
		out->device_copy_errors = in->device_copy_errors;
		out->purged_pages = in->purged_pages;
		out->persistent_sessions = in->persistent_sessions;
		out->unowned_sessions = in->unowned_sessions;
		out->host_indexed_pages = in->host_indexed_pages;
		out->permanent_pages = in->has_permanent_pages ? in->permanent_pages : 0;
		out->quantized_pages = in->has_quantized_pages ? in->quantized_pages : 0;
		out->has_disk = in->has_disk_capacity;
		out->disk_pages = in->disk_pages;
		out->disk_capacity = in->disk_capacity;
		out->spilled_pages = in->spilled_pages;
		out->promoted_pages = in->promoted_pages;
		out->verify_failures = in->verify_failures;
		out->io_errors = in->io_errors;
		out->disk_dropped = in->disk_dropped;
		out->restored_pages = in->restored_pages;
		out->disk_gone_pages = in->has_disk_gone_pages ? in->disk_gone_pages : 0;
		out->lossy_replaced_pages =
			in->has_lossy_replaced_pages ? in->lossy_replaced_pages : 0;
		out->disk_refused_pages = in->has_disk_refused_pages ? in->disk_refused_pages : 0;
		out->disk_scanning = in->has_disk_scanning && in->disk_scanning;
		out->disk_written_bytes = in->has_disk_written_bytes ? in->disk_written_bytes : 0;
		out->disk_served_bytes = in->has_disk_served_bytes ? in->disk_served_bytes : 0;
		out->disk_unadmitted_pages =
			in->has_disk_unadmitted_pages ? in->disk_unadmitted_pages : 0;
		out->prewarm_pages = in->has_prewarm_pages ? in->prewarm_pages : 0;
		out->prewarm_used_pages = in->has_prewarm_used_pages ? in->prewarm_used_pages : 0;
		out->prewarm_unused_pages =
			in->has_prewarm_unused_pages ? in->prewarm_unused_pages : 0;
	}
	*ret_stats = st;
	return 0;
}

KVP_PUBLIC void kvp_stats_free(struct kvp_stats *st)
{
	if (!st)
		return;
	free(st->pools);
	free(st->latencies);
	free(st);
}

/* Appends the sessions of one ListSessions reply to *arr (n used, cap
 * allocated), checking that they follow after_id in id order and belong to
 * pool_id when it is not 0. Returns 0, -EPROTO or -ENOMEM. */
static int list_take(const Kvpalace__V1__ListSessionsResponse *r, uint64_t pool_id,
		     uint64_t after_id, struct kvp_session_info **arr, size_t *n, size_t *cap)
{
	uint64_t last = after_id;

	for (size_t i = 0; i < r->n_sessions; i++) {
		const Kvpalace__V1__SessionInfo *in = r->sessions[i];

		if (in->session_id <= last || (pool_id && in->pool_id != pool_id) ||
		    in->committed_tokens > in->n_tokens)
			return -EPROTO;
		last = in->session_id;
	}
	if (r->n_sessions > *cap - *n) {
		size_t want = *cap ? *cap : 64;
		struct kvp_session_info *p;

		while (want - *n < r->n_sessions) {
			if (want > SIZE_MAX / 2 / sizeof(**arr))
				return -ENOMEM;
			want *= 2;
		}
		p = realloc(*arr, want * sizeof(**arr));
		if (!p)
			return -ENOMEM;
		*arr = p;
		*cap = want;
	}
	for (size_t i = 0; i < r->n_sessions; i++) {
		const Kvpalace__V1__SessionInfo *in = r->sessions[i];
		struct kvp_session_info *out = &(*arr)[(*n)++];

		memset(out, 0, sizeof(*out));
		out->session_id = in->session_id;
		out->pool_id = in->pool_id;
		out->uid = in->uid;
		out->n_tokens = in->n_tokens;
		out->committed_tokens = in->committed_tokens;
		out->n_pages = in->n_pages;
		out->shared_pages = in->shared_pages;
		out->idle_ms = in->idle_ms;
		out->writing = !!in->writing;
	}
	return 0;
}

/* One ListSessions round trip: the sessions of pool_id (0: every pool
 * the caller sees) after after_id, at most limit (0: the daemon's cap),
 * appended to *arr; *ret_more and *ret_last (the last id listed, after_id
 * when none) say where the next page starts. Returns 0 or a negative
 * errno (the connection broken on a reply that breaks the rules). */
static int list_page(kvp_client *c, uint64_t pool_id, uint64_t after_id, uint32_t limit,
		     struct kvp_session_info **arr, size_t *n, size_t *cap, int *ret_more,
		     uint64_t *ret_last)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ListSessionsRequest lr = KVPALACE__V1__LIST_SESSIONS_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__ListSessionsResponse *r;
	size_t before = *n;
	int ret;

	lr.has_pool_id = pool_id != 0;
	lr.pool_id = pool_id;
	lr.has_after_id = after_id != 0;
	lr.after_id = after_id;
	lr.has_limit = limit != 0;
	lr.limit = limit;
	req.op_case = KVPALACE__V1__REQUEST__OP_LIST_SESSIONS;
	req.list_sessions = &lr;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_LIST_SESSIONS, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->list_sessions;
	/* A reply that promises more must move us forward, and may not list
	 * more than asked. */
	if ((r->more && !r->n_sessions) || (limit && r->n_sessions > limit))
		return conn_break(c, -EPROTO,
				  "kvpalaced listed %zu sessions after session %llu (limit %u), "
				  "promising %s",
				  r->n_sessions, (unsigned long long)after_id, limit,
				  r->more ? "more" : "no more");
	ret = list_take(r, pool_id, after_id, arr, n, cap);
	if (ret == -EPROTO)
		return conn_break(c, -EPROTO,
				  "kvpalaced listed %zu sessions after session %llu that are out "
				  "of id order, of another pool or commit more tokens than they "
				  "hold",
				  r->n_sessions, (unsigned long long)after_id);
	if (ret < 0)
		return ret;
	*ret_more = !!r->more;
	*ret_last = *n > before ? (*arr)[*n - 1].session_id : after_id;
	return 0;
}

/* Never NULL on success, so free() and a NULL check both work. */
static int list_done(struct kvp_session_info *arr, size_t n, struct kvp_session_info **ret_sessions,
		     size_t *ret_n)
{
	if (!arr) {
		arr = calloc(1, sizeof(*arr));
		if (!arr)
			return -ENOMEM;
	}
	*ret_sessions = arr;
	*ret_n = n;
	return 0;
}

KVP_PUBLIC int kvp_list_sessions(kvp_client *c, uint64_t pool_id,
				 struct kvp_session_info **ret_sessions, size_t *ret_n)
{
	struct kvp_session_info *arr = NULL;
	size_t n = 0, cap = 0;
	uint64_t after = 0;
	int ret, more = 1;

	if (!c || !ret_sessions || !ret_n)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	while (more) {
		ret = list_page(c, pool_id, after, 0, &arr, &n, &cap, &more, &after);
		if (ret < 0)
			goto fail;
	}
	ret = list_done(arr, n, ret_sessions, ret_n);
	if (ret == 0)
		return 0;
fail:
	free(arr);
	return ret;
}

KVP_PUBLIC int kvp_list_sessions_page(kvp_client *c, uint64_t pool_id, uint64_t after_id,
				      uint32_t limit, struct kvp_session_info **ret_sessions,
				      size_t *ret_n, int *ret_more)
{
	struct kvp_session_info *arr = NULL;
	size_t n = 0, cap = 0;
	uint64_t last;
	int ret, more;

	if (!c || !ret_sessions || !ret_n || !ret_more || limit == 0)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	ret = list_page(c, pool_id, after_id, limit, &arr, &n, &cap, &more, &last);
	if (ret == 0)
		ret = list_done(arr, n, ret_sessions, ret_n);
	if (ret < 0) {
		free(arr);
		return ret;
	}
	*ret_more = more;
	return 0;
}
