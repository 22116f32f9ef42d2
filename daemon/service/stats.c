/* daemon/service/stats.c — the Stats reply (see stats.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "aio.h"
#include "clock.h"
#include "frame.h"
#include "pool.h"
#include "reply.h"
#include "session.h"
#include "spill.h"
#include "stats.h"

struct pool_entry {
	Kvpalace__V1__PoolStats ps;
	Kvpalace__V1__Layout layout;
};

struct latency_entry {
	Kvpalace__V1__Latency lat;
	char name[STATS_OP_NAME_BYTES];
	/* A copy: the Stats request itself is counted (dispatch) after
	 * stats_fill and before its reply is packed. */
	uint64_t buckets[LATENCY_BUCKETS];
};

/* Request types are numbered by their field's place in Request's
 * descriptor (0 is the id, never a type): dense, whatever numbers
 * kvpalace.proto gives them, and the same in the name table below. */
int stats_op_index(int op_case)
{
	const ProtobufCMessageDescriptor *d = &kvpalace__v1__request__descriptor;
	const ProtobufCFieldDescriptor *f;
	size_t i;

	if (op_case <= 0)
		return -1;
	f = protobuf_c_message_descriptor_get_field(d, (unsigned int)op_case);
	if (!f || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || f->type != PROTOBUF_C_TYPE_MESSAGE)
		return -1;
	i = (size_t)(f - d->fields);
	return i < CACHE_LATENCY_OPS ? (int)i : -1;
}

int stats_op_name(unsigned int op, char *buf, size_t cap)
{
	const ProtobufCMessageDescriptor *d = &kvpalace__v1__request__descriptor;
	const ProtobufCMessageDescriptor *m;
	const char *name;
	size_t n;

	if (op >= d->n_fields || !(d->fields[op].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ||
	    d->fields[op].type != PROTOBUF_C_TYPE_MESSAGE)
		return -ENOENT;
	m = d->fields[op].descriptor;
	name = m->short_name;
	n = strlen(name);
	if (n > 7 && !strcmp(name + n - 7, "Request"))
		n -= 7;
	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(buf, name, n);
	buf[n] = '\0';
	return 0;
}

void stats_layout(const struct shm_layout *in, Kvpalace__V1__Layout *out)
{
	kvpalace__v1__layout__init(out);
	out->n_layers = in->n_layers;
	out->n_kv_heads = in->n_kv_heads;
	out->head_dim = in->head_dim;
	out->block_tokens = in->block_tokens;
	out->dtype = (Kvpalace__V1__DType)in->dtype;
	out->has_quant_group = in->quant_group != 0;
	out->quant_group = in->quant_group;
	out->has_format = in->format != 0;
	out->format = in->format;
}

void stats_session_info(const struct session *s, uint64_t now_ns, Kvpalace__V1__SessionInfo *out)
{
	kvpalace__v1__session_info__init(out);
	out->session_id = s->id;
	out->pool_id = s->pool->id;
	out->uid = (uint32_t)s->pool->uid;
	out->n_tokens = s->n_tokens;
	out->committed_tokens = s->n_committed;
	out->n_pages = s->n_pages;
	out->shared_pages = session_shared_pages(s);
	out->idle_ms = (now_ns - s->last_use_ns) / 1000000;
	out->writing = s->writer != NULL;
}

/* Fills out's latencies from ctr's histograms of the types served, in
 * le[] and lp[] (CACHE_LATENCY_OPS entries each), as many as fit in
 * *budget bytes (taken from it). */
static void fill_latencies(const struct cache_counters *ctr, struct latency_entry *le,
			   Kvpalace__V1__Latency **lp, size_t *budget,
			   Kvpalace__V1__StatsResponse *out)
{
	size_t k = 0;

	for (unsigned int op = 0; op < CACHE_LATENCY_OPS; op++) {
		const struct cache_latency *h = &ctr->latency[op];
		Kvpalace__V1__Latency *m = &le[k].lat;
		size_t sz;

		if (!h->count || stats_op_name(op, le[k].name, sizeof(le[k].name)) < 0)
			continue;
		kvpalace__v1__latency__init(m);
		m->request = le[k].name;
		m->count = h->count;
		m->sum_ns = h->sum_ns;
		memcpy(le[k].buckets, h->buckets, sizeof(le[k].buckets));
		m->n_buckets = LATENCY_BUCKETS;
		m->buckets = le[k].buckets;
		sz = kvpalace__v1__latency__get_packed_size(m) + 8;
		if (sz > *budget)
			break;
		*budget -= sz;
		lp[k++] = m;
	}
	out->n_latencies = k;
	out->latencies = lp;
}

/* The remote tier's figures (proto's RemoteTierStats): the caller's pools'
 * page counts; the client's counters and node states for the admin, whose
 * they are (they would tell a tenant of the others' traffic). */
static void fill_remote(const struct cache *c, uid_t uid, int admin,
			Kvpalace__V1__RemoteTierStats *rs)
{
	struct remote_stats st;

	kvpalace__v1__remote_tier_stats__init(rs);
	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *p = list_entry(it, struct pool, link);

		if (!admin && p->uid != uid)
			continue;
		rs->pages_written += p->rt.ctr.puts;
		rs->write_failures += p->rt.ctr.puts_failed;
		rs->fetches += p->rt.ctr.fetches;
		rs->pages_fetched += p->rt.ctr.fetched;
		rs->fetch_misses += p->rt.ctr.fetch_misses;
		rs->fetched_bytes += p->rt.ctr.fetch_bytes;
	}
	remote_stats(c->remote, &st);
	rs->nodes_up = st.nodes_up;
	rs->nodes_down = st.nodes_down;
	if (!admin)
		return;
	rs->has_gets = rs->has_hits = rs->has_misses = rs->has_corrupt = 1;
	rs->has_timeouts = rs->has_errors = rs->has_puts = rs->has_stored = 1;
	rs->has_dropped_puts = rs->has_dropped_gets = rs->has_bytes_in = 1;
	rs->has_bytes_out = rs->has_inflight_bytes = 1;
	rs->gets = st.gets;
	rs->hits = st.hits;
	rs->misses = st.misses;
	rs->corrupt = st.corrupt;
	rs->timeouts = st.timeouts;
	for (unsigned int k = 0; k < CLUSTER_RESULT_COUNT; k++)
		if (k != CLUSTER_HIT && k != CLUSTER_MISS && k != CLUSTER_ERR_TIMEOUT)
			rs->errors += st.errors[k];
	rs->puts = st.puts;
	rs->stored = st.stored;
	rs->dropped_puts = st.dropped_puts;
	rs->dropped_gets = st.dropped_gets;
	rs->bytes_in = st.bytes_in;
	rs->bytes_out = st.bytes_out;
	rs->inflight_bytes = st.inflight_bytes;
}

int stats_fill(const struct cache *c, uid_t uid, int admin, uint32_t max_bytes,
	       Kvpalace__V1__StatsResponse *out, void **ret_heap)
{
	const struct list *it;
	size_t n = 0, i = 0, budget, fixed;
	static const struct cache_counters none;
	const struct cache_counters *ctr;
	struct pool_entry *e;
	Kvpalace__V1__PoolStats **ptrs;
	struct latency_entry *le;
	Kvpalace__V1__Latency **lp;
	void *heap;

	for (it = c->pool_list.next; it != &c->pool_list; it = it->next)
		n += admin || list_entry(it, struct pool, link)->uid == uid;
	heap = calloc(1, (n ? n : 1) * (sizeof(*e) + sizeof(*ptrs)) +
				 CACHE_LATENCY_OPS * (sizeof(*le) + sizeof(*lp)) +
				 sizeof(Kvpalace__V1__RemoteTierStats));
	if (!heap)
		return -ENOMEM;
	e = heap;
	ptrs = (Kvpalace__V1__PoolStats **)(e + (n ? n : 1));
	le = (struct latency_entry *)(ptrs + (n ? n : 1));
	lp = (Kvpalace__V1__Latency **)(le + CACHE_LATENCY_OPS);
	if (c->remote) {
		out->remote = (Kvpalace__V1__RemoteTierStats *)(lp + CACHE_LATENCY_OPS);
		fill_remote(c, uid, admin, out->remote);
	}

	/* The admin sees the daemon's counters, a user its tenant's own. */
	if (admin)
		ctr = &c->ctr;
	else if (!(ctr = cache_tenant_find(c, uid)))
		ctr = &none;
	out->has_queried_tokens = out->has_queried_pages = out->has_matched_pages = 1;
	out->queried_tokens = ctr->queried_tokens;
	out->queried_pages = ctr->queried_pages;
	out->matched_pages = ctr->matched_pages;
	out->version = (char *)KVP_VERSION;
	if (c->loop)
		out->event_loop = (char *)loop_kind_name(c->loop);
	out->uptime_ms = (clock_now_ns() - c->start_ns) / 1000000;
	out->connections = ctr->connections;
	out->requests = ctr->requests;
	out->errors = ctr->errors;
	out->match_hits = ctr->match_hits;
	out->match_misses = ctr->match_misses;
	out->matched_tokens = ctr->matched_tokens;
	out->appended_tokens = ctr->appended_tokens;
	out->committed_tokens = ctr->committed_tokens;
	out->disconnects_bad = ctr->disconnects_bad;
	out->has_evictions = out->has_dedup_pages = 1;
	for (it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *p = list_entry(it, struct pool, link);

		if (admin || p->uid == uid) {
			out->evictions += p->ix.evictions;
			out->dedup_pages += p->ix.dedup_pages;
			out->spilled_pages += p->tier.spilled;
			out->promoted_pages += p->tier.promoted;
			out->disk_written_bytes += p->tier.written_bytes;
			out->disk_served_bytes += p->tier.served_bytes;
			out->disk_unadmitted_pages += p->tier.unadmitted;
			out->prewarm_pages += p->ix.prewarm_pages;
			out->prewarm_used_pages += p->ix.prewarm_used;
			out->prewarm_unused_pages += p->ix.prewarm_unused;
			out->verify_failures += p->tier.verify_failures;
			out->io_errors += p->tier.io_errors;
			out->unowned_sessions += p->n_unowned;
		}
	}
	out->has_checkpoints_written = out->has_checkpoints_restored = 1;
	out->has_checkpoints_refused = out->has_checkpoint_failures = 1;
	out->has_warmed_up_pages = 1;
	out->checkpoints_written = ctr->checkpoints_written;
	out->checkpoints_restored = ctr->checkpoints_restored;
	out->checkpoints_refused = ctr->checkpoints_refused;
	out->checkpoint_failures = ctr->checkpoint_failures;
	out->warmed_up_pages = ctr->warmed_up_pages;
	out->has_checkpoints_removed = out->has_restore_waits = 1;
	out->checkpoints_removed = ctr->checkpoints_removed;
	out->restore_waits = ctr->restore_waits;
	out->has_purges = out->has_purged_pages = 1;
	out->purges = ctr->purges;
	out->purged_pages = ctr->purged_pages;
	out->has_sessions_closed_with_connection = out->has_sessions_expired = 1;
	out->has_unowned_sessions = 1;
	out->sessions_closed_with_connection = ctr->sessions_closed_with_conn;
	out->sessions_expired = ctr->sessions_expired;
	out->has_placed_sessions = out->has_unplaced_sessions = 1;
	out->placed_sessions = ctr->placed_sessions;
	out->unplaced_sessions = ctr->unplaced_sessions;
	if (c->aio && c->cfg->disk_pool_bytes) {
		out->disk_io = (char *)aio_mode_name(c->aio);
		out->has_spilled_pages = out->has_promoted_pages = 1;
		out->has_disk_written_bytes = out->has_disk_served_bytes = 1;
		out->has_disk_unadmitted_pages = 1;
		out->has_prewarm_pages = out->has_prewarm_used_pages = 1;
		out->has_prewarm_unused_pages = 1;
		out->has_verify_failures = out->has_io_errors = 1;
	}
	out->gpu = gpu_available(c->gpu);
	out->gpu_status = (char *)gpu_status(c->gpu);

	/* Room for the envelope (64 bytes will do) and the counters above,
	 * at least 512 as before they were measured; each latency and pool
	 * entry is measured as it is added. */
	fixed = kvpalace__v1__stats_response__get_packed_size(out) + 64;
	budget = reply_room(max_bytes, fixed > 512 ? fixed : 512);
	fill_latencies(ctr, le, lp, &budget, out);
	for (it = c->pool_list.next; it != &c->pool_list && i < n; it = it->next) {
		const struct pool *p = list_entry(it, struct pool, link);
		Kvpalace__V1__PoolStats *ps = &e[i].ps;
		Kvpalace__V1__Layout *l = &e[i].layout;
		size_t sz;

		if (!admin && p->uid != uid)
			continue;
		kvpalace__v1__pool_stats__init(ps);
		stats_layout(&p->layout, l);
		ps->pool_id = p->id;
		ps->uid = (uint32_t)p->uid;
		ps->model_id = (char *)p->model_id;
		ps->layout = l;
		ps->page_bytes = p->page_bytes;
		ps->n_pages = p->pa.n_pages;
		ps->free_pages = p->pa.n_free;
		ps->reserved_pages = p->reserved_pages;
		ps->leased_pages = pagealloc_n_pinned(&p->pa);
		ps->n_sessions = p->n_sessions;
		ps->has_persistent_sessions = ps->has_unowned_sessions = 1;
		ps->persistent_sessions = p->n_persistent;
		ps->unowned_sessions = p->n_unowned;
		ps->has_indexed_pages = ps->has_evictable_pages = 1;
		ps->has_evictions = ps->has_dedup_pages = 1;
		ps->indexed_pages = p->ix.n_entries;
		ps->evictable_pages = p->ix.n_evictable;
		ps->evictions = p->ix.evictions;
		ps->dedup_pages = p->ix.dedup_pages;
		ps->has_purged_pages = 1;
		ps->purged_pages = p->ix.forgotten;
		if (p->dev.on) {
			ps->has_device_pages = ps->has_device_used_pages = 1;
			ps->has_device_copied_pages = ps->has_device_dropped_pages = 1;
			ps->device_pages = p->dev.n_pages;
			ps->device_used_pages = p->dev.n_pages - p->dev.pa.n_free;
			ps->device_copied_pages = p->dev.copied;
			ps->device_dropped_pages = p->dev.dropped;
			ps->has_device_copied_back_pages = ps->has_device_copy_errors = 1;
			ps->device_copied_back_pages = p->dev.copied_back;
			ps->device_copy_errors = p->dev.copy_errors;
		}
		ps->has_host_indexed_pages = ps->has_permanent_pages = 1;
		ps->host_indexed_pages = p->ix.n_host;
		ps->permanent_pages = p->ix.n_permanent;
		ps->has_quantized_pages = 1;
		ps->quantized_pages = p->tier.quantized;
		if (p->spill) {
			ps->has_disk_pages = ps->has_disk_capacity = ps->has_spilled_pages = 1;
			ps->has_promoted_pages = ps->has_verify_failures = ps->has_io_errors = 1;
			ps->has_disk_dropped = ps->has_restored_pages = 1;
			ps->disk_pages = p->ix.n_disk;
			ps->disk_capacity = p->spill->cap;
			ps->spilled_pages = p->tier.spilled;
			ps->promoted_pages = p->tier.promoted;
			ps->has_disk_written_bytes = ps->has_disk_served_bytes = 1;
			ps->has_disk_unadmitted_pages = 1;
			ps->disk_written_bytes = p->tier.written_bytes;
			ps->disk_served_bytes = p->tier.served_bytes;
			ps->disk_unadmitted_pages = p->tier.unadmitted;
			ps->has_prewarm_pages = ps->has_prewarm_used_pages = 1;
			ps->has_prewarm_unused_pages = 1;
			ps->prewarm_pages = p->ix.prewarm_pages;
			ps->prewarm_used_pages = p->ix.prewarm_used;
			ps->prewarm_unused_pages = p->ix.prewarm_unused;
			ps->verify_failures = p->tier.verify_failures;
			ps->io_errors = p->tier.io_errors;
			ps->disk_dropped = p->tier.dropped;
			ps->restored_pages = p->tier.restored;
			ps->has_disk_gone_pages = ps->has_lossy_replaced_pages = 1;
			ps->disk_gone_pages = p->tier.gone;
			ps->lossy_replaced_pages = p->tier.lossy_replaced;
			ps->has_disk_refused_pages = 1;
			ps->disk_refused_pages = p->tier.refused;
			ps->has_disk_scanning = 1;
			ps->disk_scanning = tier_pool_scanning(p) != 0;
		}
		sz = kvpalace__v1__pool_stats__get_packed_size(ps) + 8;
		if (sz > budget) {
			out->has_pools_truncated = 1;
			out->pools_truncated = 1;
			break;
		}
		budget -= sz;
		ptrs[i] = ps;
		i++;
	}
	out->n_pools = i;
	out->pools = ptrs;
	*ret_heap = heap;
	return 0;
}

/* Where a listing stands in one pool's id-ordered sessions. */
struct list_cursor {
	const struct idseq *q;
	size_t at; /* a live entry, or q->n when the pool has no more */
};

int stats_list_sessions(const struct cache *c, uid_t uid, int admin, uint64_t pool_id,
			uint64_t after_id, uint32_t limit, uint32_t max_bytes,
			Kvpalace__V1__ListSessionsResponse *out, void **ret_heap)
{
	size_t n_pools = 0, n_cur = 0, i = 0, budget = reply_room(max_bytes, 64);
	uint64_t now = clock_now_ns();
	const struct list *it;
	struct list_cursor *cur;
	Kvpalace__V1__SessionInfo *e, **ptrs;
	void *heap;

	kvp_assert(limit >= 1 && limit <= STATS_LIST_MAX);
	for (it = c->pool_list.next; it != &c->pool_list; it = it->next)
		n_pools++;
	heap = calloc(1, (n_pools ? n_pools : 1) * sizeof(*cur) +
				 limit * (sizeof(*e) + sizeof(*ptrs)));
	if (!heap)
		return -ENOMEM;
	e = heap;
	ptrs = (Kvpalace__V1__SessionInfo **)(e + limit);
	cur = (struct list_cursor *)(ptrs + limit);
	/* The pools the caller may see, each from its first session past
	 * after_id. A pool's ids grow with its tenant's counter, so every
	 * pool's sequence is in id order and the page merges them. */
	for (it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *p = list_entry(it, struct pool, link);

		if ((!admin && p->uid != uid) || (pool_id && p->id != pool_id))
			continue;
		cur[n_cur].q = &p->by_id;
		cur[n_cur].at = idseq_live(&p->by_id, idseq_after(&p->by_id, after_id));
		n_cur++;
	}
	out->more = 0;
	for (;;) {
		struct list_cursor *best = NULL;
		const struct session *s;
		size_t sz;

		for (size_t k = 0; k < n_cur; k++)
			if (cur[k].at < cur[k].q->n &&
			    (!best || cur[k].q->v[cur[k].at].id < best->q->v[best->at].id))
				best = &cur[k];
		if (!best)
			break;
		if (i == limit) {
			out->more = 1;
			break;
		}
		s = best->q->v[best->at].ptr;
		stats_session_info(s, now, &e[i]);
		sz = kvpalace__v1__session_info__get_packed_size(&e[i]) + 8;
		if (sz > budget) {
			out->more = 1;
			break;
		}
		budget -= sz;
		ptrs[i] = &e[i];
		i++;
		best->at = idseq_live(best->q, best->at + 1);
	}
	out->n_sessions = i;
	out->sessions = ptrs;
	*ret_heap = heap;
	return 0;
}
