/* client/stats.c — the daemon's counters and per-pool statistics.
 *
 * kvp_stats() copies a Stats reply into one caller-owned struct kvp_stats
 * (its pools in a second allocation), so nothing points into the
 * connection's buffers. Not thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "rpc.h"

static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = src ? strnlen(src, cap - 1) : 0;

	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
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
	}
	*ret_stats = st;
	return 0;
}

KVP_PUBLIC void kvp_stats_free(struct kvp_stats *st)
{
	if (!st)
		return;
	free(st->pools);
	free(st);
}
