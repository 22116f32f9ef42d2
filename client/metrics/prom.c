/* client/metrics/prom.c — struct kvp_stats as Prometheus metrics (see
 * prom.h). The families are built once as a libjansson tree — name, type,
 * help, and samples with their own name, labels and value — and that
 * tree is written either as the text exposition format or as JSON, so
 * the two forms cannot disagree on a name, a label or a value.
 *
 * Names follow Prometheus' conventions (counters end in _total, units in
 * the name, base units: seconds, bytes) and the field names of struct
 * kvp_stats, which `kvpalacectl stats --json` prints: "evictions" is
 * kvpalace_evictions_total, a pool's "spilled_pages" is
 * kvpalace_pool_spilled_pages_total. A pool's tiers share families with a
 * tier label (host, disk, gpu) where the same question has an answer in
 * each: capacity, pages used and free. Pages become bytes through
 * kvpalace_page_bytes.
 *
 * Layer: metrics, above the library (only kvpalace.h). No global state.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "prom.h"

/* The tree being built: families in order, the current family's samples;
 * err turns -ENOMEM at the first failed allocation (every helper then
 * does nothing, and prom_write reports it). */
struct prom {
	int per_pool; /* prom_source.per_pool */
	json_t *families;
	json_t *samples;
	const char *name; /* the current family */
	int err;
};

/* A JSON string of text this file wrote (names, help, types): ASCII. */
static json_t *jstr(const char *s)
{
	return json_stringn(s, strlen(s));
}

/* A JSON string of s[0..n) (up to a NUL) with every byte that does not
 * start a well-formed UTF-8 sequence replaced by U+FFFD: model ids and
 * request names come from clients, and both JSON and the Prometheus text
 * format want UTF-8. */
static json_t *str_utf8(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	char *buf;
	size_t i = 0, o = 0;
	json_t *j;

	n = strnlen(s, n);
	buf = malloc(3 * n + 1);
	if (!buf)
		return NULL;
	while (i < n) {
		unsigned char c = u[i];
		size_t len = c < 0x80		      ? 1
			     : c >= 0xc2 && c <= 0xdf ? 2
			     : c >= 0xe0 && c <= 0xef ? 3
			     : c >= 0xf0 && c <= 0xf4 ? 4
						      : 0;
		size_t k;

		if (len > n - i)
			len = 0;
		for (k = 1; k < len; k++)
			if ((u[i + k] & 0xc0) != 0x80)
				len = 0;
		/* Overlong three- and four-byte forms, surrogates, > U+10FFFF. */
		if (len == 3 && ((c == 0xe0 && u[i + 1] < 0xa0) || (c == 0xed && u[i + 1] >= 0xa0)))
			len = 0;
		if (len == 4 && ((c == 0xf0 && u[i + 1] < 0x90) || (c == 0xf4 && u[i + 1] >= 0x90)))
			len = 0;
		if (!len) {
			memcpy(buf + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		memcpy(buf + o, u + i, len);
		o += len;
		i += len;
	}
	j = json_stringn(buf, o);
	free(buf);
	return j;
}

/* A counter or gauge that JSON can hold (json_int_t is signed). */
static json_t *num_u64(uint64_t v)
{
	return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* Takes ownership of j; NULL means an allocation failed. */
static void put(struct prom *p, json_t *obj, const char *key, json_t *j)
{
	if (!j || json_object_set_new(obj, key, j) < 0)
		p->err = -ENOMEM;
}

/* Begins family kvpalace_<name>. */
static void family(struct prom *p, const char *name, const char *type, const char *help)
{
	char full[128];
	json_t *fam;

	if (p->err)
		return;
	snprintf(full, sizeof(full), "kvpalace_%s", name);
	fam = json_object();
	p->samples = json_array();
	if (!fam || !p->samples || json_array_append_new(p->families, fam) < 0) {
		json_decref(fam);
		json_decref(p->samples);
		p->samples = NULL;
		p->err = -ENOMEM;
		return;
	}
	put(p, fam, "name", jstr(full));
	put(p, fam, "type", jstr(type));
	put(p, fam, "help", jstr(help));
	put(p, fam, "samples", p->samples);
	p->name = json_string_value(json_object_get(fam, "name"));
}

/* A sample of the current family named after it plus suffix ("" or
 * "_bucket", "_sum", "_count"), with labels (an object, or NULL for
 * none) and value, both taken over. */
static void sample(struct prom *p, const char *suffix, json_t *labels, json_t *value)
{
	char full[160];
	json_t *s;

	if (!labels)
		labels = json_object();
	if (p->err || !p->name || !labels || !value) {
		p->err = -ENOMEM;
		json_decref(labels);
		json_decref(value);
		return;
	}
	snprintf(full, sizeof(full), "%s%s", p->name, suffix);
	s = json_object();
	if (!s || json_array_append_new(p->samples, s) < 0) {
		json_decref(s);
		json_decref(labels);
		json_decref(value);
		p->err = -ENOMEM;
		return;
	}
	put(p, s, "name", jstr(full));
	put(p, s, "labels", labels);
	put(p, s, "value", value);
}

/* The labels every sample of a pool carries (none when the pools are
 * summed); the caller adds its own. */
static json_t *pool_labels(struct prom *p, const struct kvp_pool_stats *pool)
{
	char id[24], uid[16];
	json_t *l = json_object();

	if (!l) {
		p->err = -ENOMEM;
		return NULL;
	}
	if (!p->per_pool)
		return l;
	snprintf(id, sizeof(id), "%" PRIu64, pool->pool_id);
	snprintf(uid, sizeof(uid), "%" PRIu32, pool->uid);
	put(p, l, "pool", jstr(id));
	put(p, l, "uid", jstr(uid));
	put(p, l, "model", str_utf8(pool->model_id, sizeof(pool->model_id)));
	return l;
}

/* pool_labels plus key=value. */
static json_t *pool_labels1(struct prom *p, const struct kvp_pool_stats *pool, const char *key,
			    const char *value)
{
	json_t *l = pool_labels(p, pool);

	if (l)
		put(p, l, key, jstr(value));
	return l;
}

/* The shortest decimal text that reads back as v: what le labels and
 * fractional values are written as ("1e-05", "0.25", "10"). */
static void fmt_double(char *buf, size_t n, double v)
{
	if (isinf(v)) {
		snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	if (isnan(v)) {
		snprintf(buf, n, "NaN");
		return;
	}
	for (int prec = 6; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

/* ---- the families ------------------------------------------------------- */

#define ST(field) offsetof(struct kvp_stats, field), sizeof(((struct kvp_stats *)0)->field)
#define PS(field)                                                                                  \
	offsetof(struct kvp_pool_stats, field), sizeof(((struct kvp_pool_stats *)0)->field)

struct field_metric {
	const char *name, *type, *help;
	size_t off, size;
};

/* An unsigned field of 4 or 8 bytes at off in base. */
static uint64_t field_u64(const void *base, size_t off, size_t size)
{
	uint64_t v64 = 0;
	uint32_t v32 = 0;

	if (size == sizeof(v32)) {
		memcpy(&v32, (const char *)base + off, sizeof(v32));
		return v32;
	}
	memcpy(&v64, (const char *)base + off, sizeof(v64));
	return v64;
}

/* The daemon's (on an admin connection) or the tenant's counters. */
static const struct field_metric daemon_metrics[] = {
	{"connections", "gauge", "Client connections open now.", ST(connections)},
	{"requests_total", "counter", "Requests served.", ST(requests)},
	{"errors_total", "counter", "Requests answered with an error.", ST(errors)},
	{"match_hits_total", "counter", "Prefix matches that found at least one page.",
	 ST(match_hits)},
	{"match_misses_total", "counter", "Prefix matches that found nothing.", ST(match_misses)},
	{"queried_tokens_total", "counter", "Prompt tokens prefix matches asked about.",
	 ST(queried_tokens)},
	{"matched_tokens_total", "counter",
	 "Tokens served from the cache (hit ratio: / queried_tokens_total).", ST(matched_tokens)},
	{"queried_pages_total", "counter", "Whole pages the tokens of prefix matches fill.",
	 ST(queried_pages)},
	{"matched_pages_total", "counter",
	 "Pages served from the cache (hit ratio: / queried_pages_total).", ST(matched_pages)},
	{"appended_tokens_total", "counter", "Tokens reserved by Append.", ST(appended_tokens)},
	{"committed_tokens_total", "counter", "Tokens published by Commit.", ST(committed_tokens)},
	{"evictions_total", "counter",
	 "Cached pages evicted (dropped from every tier; spills to disk are not), every pool.",
	 ST(evictions)},
	{"dedup_pages_total", "counter", "Committed pages replaced by an indexed copy.",
	 ST(dedup_pages)},
	{"purges_total", "counter", "Admin purges served.", ST(purges)},
	{"purged_pages_total", "counter",
	 "Index pages admin purges and drops forgot, in every tier.", ST(purged_pages)},
	{"disconnects_bad_total", "counter", "Connections closed for misbehaviour.",
	 ST(disconnects_bad)},
	{"checkpoints_written_total", "counter", "Checkpoints written.", ST(checkpoints_written)},
	{"checkpoints_restored_total", "counter",
	 "Checkpoints restored into a session or warmed up.", ST(checkpoints_restored)},
	{"checkpoints_refused_total", "counter",
	 "Checkpoint files refused: corrupt, truncated, foreign or newer.",
	 ST(checkpoints_refused)},
	{"checkpoint_failures_total", "counter",
	 "Checkpoint writes that failed (disk full, I/O error).", ST(checkpoint_failures)},
	{"warmed_up_pages_total", "counter", "Pages loaded into prefix indexes by warm-up.",
	 ST(warmed_up_pages)},
	{"checkpoints_removed_total", "counter", "Checkpoints removed.", ST(checkpoints_removed)},
	{"restore_waits_total", "counter",
	 "Restores that waited for the host tier to write cached pages out.", ST(restore_waits)},
	{"sessions_closed_with_connection_total", "counter",
	 "Sessions closed because their connection closed.", ST(sessions_closed_with_connection)},
	{"sessions_expired_total", "counter",
	 "Persistent sessions closed after session-idle-timeout unused.", ST(sessions_expired)},
	{"unowned_sessions", "gauge", "Persistent sessions no open connection owns.",
	 ST(unowned_sessions)},
	{"placed_sessions_total", "counter",
	 "Closing sessions whose indexed pages the hierarchy policy placed by layer.",
	 ST(placed_sessions)},
	{"unplaced_sessions_total", "counter",
	 "Closing sessions left in place because a placement of the tenant was running.",
	 ST(unplaced_sessions)},
};

/* The remote tier, when the daemon has one (the exporter reads the admin
 * socket, which has the cluster client's counters too). */
static const struct field_metric remote_metrics[] = {
	{"remote_nodes_up", "gauge", "Redis Cluster masters serving slots, as last seen.",
	 ST(remote.nodes_up)},
	{"remote_nodes_down", "gauge", "Of them, in a backoff after a failure.",
	 ST(remote.nodes_down)},
	{"remote_pages_written_total", "counter",
	 "Pages handed to the cluster (at commit, first reuse or eviction: remote-write).",
	 ST(remote.pages_written)},
	{"remote_write_failures_total", "counter", "Of them, not stored.",
	 ST(remote.write_failures)},
	{"remote_fetches_total", "counter", "Batches asked of the cluster past the local tiers.",
	 ST(remote.fetches)},
	{"remote_pages_fetched_total", "counter", "Pages fetched, verified and listed.",
	 ST(remote.pages_fetched)},
	{"remote_fetch_misses_total", "counter", "Pages asked for and not had, for any reason.",
	 ST(remote.fetch_misses)},
	{"remote_corrupt_total", "counter", "Fetched values that did not verify.",
	 ST(remote.corrupt)},
	{"remote_timeouts_total", "counter", "Cluster operations that timed out.",
	 ST(remote.timeouts)},
	{"remote_errors_total", "counter", "Other cluster errors (refused, CLUSTERDOWN, ...).",
	 ST(remote.errors)},
	{"remote_dropped_puts_total", "counter", "Puts dropped over the in-flight budget.",
	 ST(remote.dropped_puts)},
	{"remote_dropped_gets_total", "counter", "Gets answered as misses over the budget.",
	 ST(remote.dropped_gets)},
	{"remote_bytes_in_total", "counter", "Value bytes read from the cluster.",
	 ST(remote.bytes_in)},
	{"remote_bytes_out_total", "counter", "Value bytes written to the cluster.",
	 ST(remote.bytes_out)},
};

/* Per pool, every pool; unlabelled beyond pool, uid, model. */
static const struct field_metric pool_metrics[] = {
	{"page_bytes", "gauge", "Bytes of one page of the pool (pages * this = bytes).",
	 PS(page_bytes)},
	{"pool_indexed_pages", "gauge", "Pages held by the prefix index, in any tier.",
	 PS(indexed_pages)},
	{"pool_evictable_pages", "gauge", "Indexed pages eviction may take.", PS(evictable_pages)},
	{"pool_leased_pages", "gauge", "Host pages pinned by read leases.", PS(leased_pages)},
	{"pool_reserved_pages", "gauge", "Host pages held only by uncommitted reservations.",
	 PS(reserved_pages)},
	{"pool_sessions", "gauge", "Sessions in the pool.", PS(n_sessions)},
	{"pool_persistent_sessions", "gauge", "Persistent sessions in the pool.",
	 PS(persistent_sessions)},
	{"pool_unowned_sessions", "gauge", "Persistent sessions no open connection owns.",
	 PS(unowned_sessions)},
	{"pool_evictions_total", "counter",
	 "Pages of the pool evicted (dropped from every tier; spills to disk are not).",
	 PS(evictions)},
	{"pool_dedup_pages_total", "counter", "Committed pages replaced by an indexed copy.",
	 PS(dedup_pages)},
	{"pool_purged_pages_total", "counter", "Index pages an admin purged or dropped.",
	 PS(purged_pages)},
};

/* Per pool with a disk tier (has_disk). */
static const struct field_metric disk_metrics[] = {
	{"pool_host_indexed_pages", "gauge", "Indexed pages with a copy in the host tier.",
	 PS(host_indexed_pages)},
	{"pool_permanent_pages", "gauge", "Indexed pages of permanent spans (leave host last).",
	 PS(permanent_pages)},
	{"pool_spilled_pages_total", "counter", "Pages written to the disk tier.",
	 PS(spilled_pages)},
	{"pool_promoted_pages_total", "counter", "Pages read back from disk and verified.",
	 PS(promoted_pages)},
	{"pool_disk_written_bytes_total", "counter",
	 "Bytes written to the spill file (pages and headers): SSD wear.", PS(disk_written_bytes)},
	{"pool_disk_served_bytes_total", "counter",
	 "Bytes read back from the spill file and verified.", PS(disk_served_bytes)},
	{"pool_disk_unadmitted_pages_total", "counter",
	 "Host victims dropped, not written: no second request used them (disk-admission).",
	 PS(disk_unadmitted_pages)},
	{"pool_prewarm_pages_total", "counter",
	 "Disk pages read back ahead of any request (host-prewarm-watermark).", PS(prewarm_pages)},
	{"pool_prewarm_used_pages_total", "counter",
	 "Of the pages read ahead, those a request used before they left the host tier.",
	 PS(prewarm_used_pages)},
	{"pool_prewarm_unused_pages_total", "counter",
	 "Of the pages read ahead, those that left the host tier unused.",
	 PS(prewarm_unused_pages)},
	{"pool_verify_failures_total", "counter",
	 "Disk pages read back with a wrong checksum (served as misses).", PS(verify_failures)},
	{"pool_io_errors_total", "counter", "Disk reads or writes that failed.", PS(io_errors)},
	{"pool_disk_dropped_pages_total", "counter", "Disk-only pages dropped for room.",
	 PS(disk_dropped)},
	{"pool_restored_pages_total", "counter",
	 "Pages found in the spill file when the daemon started.", PS(restored_pages)},
	{"pool_disk_scanning", "gauge",
	 "1 while the warm restart lists the spill file (pages not listed yet are misses).",
	 PS(disk_scanning)},
	{"pool_quantized_pages_total", "counter", "Pages spilled in spill-dtype (lossy).",
	 PS(quantized_pages)},
	{"pool_disk_gone_pages_total", "counter",
	 "Disk copies the spill file no longer held (served as misses).", PS(disk_gone_pages)},
	{"pool_lossy_replaced_pages_total", "counter",
	 "Lossy disk copies replaced by an exact commit of the same tokens.",
	 PS(lossy_replaced_pages)},
	{"pool_disk_refused_pages_total", "counter",
	 "Spill writes refused for lack of disk share or space (pages dropped).",
	 PS(disk_refused_pages)},
};

/* Per pool with a device arena (has_gpu). */
static const struct field_metric gpu_metrics[] = {
	{"pool_device_copied_pages_total", "counter", "Host to device page copies.",
	 PS(device_copied_pages)},
	{"pool_device_copied_back_pages_total", "counter",
	 "Device to host page copies of GPU appends.", PS(device_copied_back_pages)},
	{"pool_device_dropped_pages_total", "counter",
	 "Cached device copies dropped (watermark, admin evict).", PS(device_dropped_pages)},
	{"pool_device_copy_errors_total", "counter", "Device copies that failed, either way.",
	 PS(device_copy_errors)},
};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* One family per entry of t, one sample per pool that has the tier, or
 * one sum over those pools. */
static void pool_fields(struct prom *p, const struct kvp_stats *st, const struct field_metric *t,
			size_t n, int want_disk, int want_gpu)
{
	for (size_t k = 0; k < n; k++) {
		uint64_t sum = 0;
		size_t summed = 0;

		if (!p->per_pool && !strcmp(t[k].name, "page_bytes"))
			continue; /* pools' page sizes do not add up */
		family(p, t[k].name, t[k].type, t[k].help);
		for (size_t i = 0; i < st->n_pools; i++) {
			const struct kvp_pool_stats *pool = &st->pools[i];
			uint64_t v;

			if ((want_disk && !pool->has_disk) || (want_gpu && !pool->has_gpu))
				continue;
			v = field_u64(pool, t[k].off, t[k].size);
			if (p->per_pool) {
				sample(p, "", pool_labels(p, pool), num_u64(v));
				continue;
			}
			sum = sum + v < sum ? UINT64_MAX : sum + v;
			summed++;
		}
		if (!p->per_pool && summed)
			sample(p, "", pool_labels(p, NULL), num_u64(sum));
	}
}

/* A tier's capacity and use in pages; 0 when the pool lacks it. */
struct tier_pages {
	const char *tier;
	int present;
	uint64_t capacity, used;
};

static void pool_tiers(const struct kvp_pool_stats *pool, struct tier_pages t[3])
{
	t[0] = (struct tier_pages){"host", 1, pool->n_pages,
				   pool->n_pages - (pool->free_pages < pool->n_pages
							    ? pool->free_pages
							    : pool->n_pages)};
	t[1] = (struct tier_pages){"disk", pool->has_disk, pool->disk_capacity, pool->disk_pages};
	t[2] = (struct tier_pages){"gpu", pool->has_gpu, pool->device_pages,
				   pool->device_used_pages};
}

/* Row i of the tier families: pool i's tiers, or (pools summed, i = 0)
 * every pool's added up, present counting the pools that have the tier.
 * Returns the pool, or NULL for the sum. */
static const struct kvp_pool_stats *tier_row(const struct prom *p, const struct kvp_stats *st,
					     size_t i, struct tier_pages t[3])
{
	struct tier_pages u[3];

	if (p->per_pool) {
		pool_tiers(&st->pools[i], t);
		return &st->pools[i];
	}
	t[0] = (struct tier_pages){"host", 0, 0, 0};
	t[1] = (struct tier_pages){"disk", 0, 0, 0};
	t[2] = (struct tier_pages){"gpu", 0, 0, 0};
	for (size_t j = 0; j < st->n_pools; j++) {
		pool_tiers(&st->pools[j], u);
		for (int k = 0; k < 3; k++) {
			if (!u[k].present)
				continue;
			t[k].present++;
			t[k].capacity += u[k].capacity;
			t[k].used += u[k].used;
		}
	}
	return NULL;
}

static void pools(struct prom *p, const struct kvp_stats *st)
{
	size_t rows = p->per_pool ? st->n_pools : 1;
	const struct kvp_pool_stats *pool;
	struct tier_pages t[3];

	family(p, "pools", "gauge", "Pools listed in this page.");
	sample(p, "", NULL, num_u64(st->n_pools));
	family(p, "pools_truncated", "gauge",
	       "1 when more pools exist than the daemon's reply could list.");
	sample(p, "", NULL, json_integer(!!st->pools_truncated));

	family(p, "pool_tier_present", "gauge",
	       p->per_pool ? "1 for each tier the pool has (host, disk, gpu)."
			   : "Pools that have each tier (host, disk, gpu).");
	for (size_t i = 0; i < rows; i++) {
		pool = tier_row(p, st, i, t);
		for (int k = 0; k < 3; k++)
			sample(p, "", pool_labels1(p, pool, "tier", t[k].tier),
			       json_integer(t[k].present));
	}
	family(p, "pool_capacity_pages", "gauge",
	       "Pages a tier of the pool holds: host arena, spill file, device arena.");
	for (size_t i = 0; i < rows; i++) {
		pool = tier_row(p, st, i, t);
		for (int k = 0; k < 3; k++)
			if (t[k].present)
				sample(p, "", pool_labels1(p, pool, "tier", t[k].tier),
				       num_u64(t[k].capacity));
	}
	family(p, "pool_pages", "gauge",
	       "Pages of a tier by state: used and free add up to the tier's capacity.");
	for (size_t i = 0; i < rows; i++) {
		pool = tier_row(p, st, i, t);
		for (int k = 0; k < 3; k++) {
			uint64_t free_pages =
				t[k].capacity > t[k].used ? t[k].capacity - t[k].used : 0;
			json_t *l;

			if (!t[k].present)
				continue;
			l = pool_labels1(p, pool, "tier", t[k].tier);
			if (l)
				put(p, l, "state", jstr("used"));
			sample(p, "", l, num_u64(t[k].used));
			l = pool_labels1(p, pool, "tier", t[k].tier);
			if (l)
				put(p, l, "state", jstr("free"));
			sample(p, "", l, num_u64(free_pages));
		}
	}
	pool_fields(p, st, pool_metrics, N(pool_metrics), 0, 0);
	pool_fields(p, st, disk_metrics, N(disk_metrics), 1, 0);
	pool_fields(p, st, gpu_metrics, N(gpu_metrics), 0, 1);
}

/* kvpalace_request_duration_seconds: each request type's histogram with
 * cumulative le buckets. _count is the +Inf bucket, so the page is
 * consistent even if a daemon's count and buckets disagree. */
static void latencies(struct prom *p, const struct kvp_stats *st)
{
	family(p, "request_duration_seconds", "histogram",
	       "Time from a request's arrival to its reply being queued, by request type.");
	if (!st->latencies)
		return;
	for (size_t i = 0; i < st->n_latencies; i++) {
		const struct kvp_latency *lat = &st->latencies[i];
		uint64_t cum = 0;
		char le[32];

		for (unsigned int b = 0; b < KVP_LATENCY_BUCKETS; b++) {
			json_t *l = json_object();
			uint64_t bound = kvp_latency_bound_ns(b);

			cum += lat->buckets[b];
			if (b == KVP_LATENCY_BUCKETS - 1 || bound == UINT64_MAX)
				snprintf(le, sizeof(le), "+Inf");
			else
				fmt_double(le, sizeof(le), (double)bound / 1e9);
			if (l) {
				put(p, l, "request", str_utf8(lat->request, sizeof(lat->request)));
				put(p, l, "le", jstr(le));
			}
			sample(p, "_bucket", l, num_u64(cum));
			if (!strcmp(le, "+Inf"))
				break;
		}
		json_t *l = json_object();
		if (l)
			put(p, l, "request", str_utf8(lat->request, sizeof(lat->request)));
		sample(p, "_sum", l, json_real((double)lat->sum_ns / 1e9));
		l = json_object();
		if (l)
			put(p, l, "request", str_utf8(lat->request, sizeof(lat->request)));
		sample(p, "_count", l, num_u64(cum));
	}
}

static void build_info(struct prom *p, const struct kvp_stats *st, const struct prom_source *src)
{
	json_t *l;

	family(p, "build_info", "gauge",
	       "1, labelled with a component's version: the daemon and the program that wrote "
	       "this page.");
	if (st) {
		l = json_object();
		if (l) {
			put(p, l, "component", jstr("kvpalaced"));
			put(p, l, "version",
			    st->version[0] ? str_utf8(st->version, sizeof(st->version))
					   : jstr("unknown"));
		}
		sample(p, "", l, json_integer(1));
	}
	l = json_object();
	if (l) {
		put(p, l, "component", str_utf8(src->component, 64));
		put(p, l, "version", str_utf8(src->version, 64));
	}
	sample(p, "", l, json_integer(1));
}

static void build(struct prom *p, const struct kvp_stats *st, const struct prom_source *src)
{
	family(p, "up", "gauge", "1 when kvpalaced's admin socket answered, else 0.");
	sample(p, "", NULL, json_integer(st != NULL));
	build_info(p, st, src);
	if (!st)
		return;
	family(p, "uptime_seconds", "gauge", "Seconds since kvpalaced started.");
	sample(p, "", NULL, json_real((double)st->uptime_ms / 1000.0));
	for (size_t i = 0; i < N(daemon_metrics); i++) {
		family(p, daemon_metrics[i].name, daemon_metrics[i].type, daemon_metrics[i].help);
		sample(p, "", NULL,
		       num_u64(field_u64(st, daemon_metrics[i].off, daemon_metrics[i].size)));
	}
	for (size_t i = 0; st->remote_on && i < N(remote_metrics); i++) {
		family(p, remote_metrics[i].name, remote_metrics[i].type, remote_metrics[i].help);
		sample(p, "", NULL,
		       num_u64(field_u64(st, remote_metrics[i].off, remote_metrics[i].size)));
	}
	family(p, "gpu", "gauge", "1 when a GPU tier is available.");
	sample(p, "", NULL, json_integer(!!st->gpu));
	latencies(p, st);
	pools(p, st);
}

/* ---- writing ------------------------------------------------------------ */

/* A label value or HELP text in the text format: backslash and newline
 * escaped, and the double quote too in label values. */
static void text_escape(FILE *f, const char *s, int quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\\\", f);
		else if (*s == '\n')
			fputs("\\n", f);
		else if (quote && *s == '"')
			fputs("\\\"", f);
		else
			fputc(*s, f);
	}
}

static void text_value(FILE *f, const json_t *v)
{
	char buf[40];

	if (json_is_integer(v)) {
		fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		return;
	}
	fmt_double(buf, sizeof(buf), json_number_value(v));
	fputs(buf, f);
}

static void write_text(FILE *f, const json_t *families)
{
	size_t i, j;
	json_t *fam, *s;

	json_array_foreach(families, i, fam)
	{
		const char *name = json_string_value(json_object_get(fam, "name"));
		const char *key;
		json_t *v;

		fprintf(f, "# HELP %s ", name);
		text_escape(f, json_string_value(json_object_get(fam, "help")), 0);
		fprintf(f, "\n# TYPE %s %s\n", name,
			json_string_value(json_object_get(fam, "type")));
		json_array_foreach(json_object_get(fam, "samples"), j, s)
		{
			json_t *labels = json_object_get(s, "labels");
			int first = 1;

			fputs(json_string_value(json_object_get(s, "name")), f);
			json_object_foreach(labels, key, v)
			{
				fprintf(f, "%s%s=\"", first ? "{" : ",", key);
				text_escape(f, json_string_value(v), 1);
				fputc('"', f);
				first = 0;
			}
			if (!first)
				fputc('}', f);
			fputc(' ', f);
			text_value(f, json_object_get(s, "value"));
			fputc('\n', f);
		}
	}
}

int prom_write(FILE *f, enum prom_format fmt, const struct kvp_stats *st,
	       const struct prom_source *src)
{
	struct prom p = {.families = json_array(), .per_pool = src->per_pool};
	json_t *root = NULL;
	int ret = 0;

	if (!p.families)
		return -ENOMEM;
	build(&p, st, src);
	if (p.err) {
		ret = p.err;
		goto out;
	}
	if (fmt == PROM_TEXT) {
		write_text(f, p.families);
	} else {
		root = json_object();
		if (!root) {
			ret = -ENOMEM;
			goto out;
		}
		if (src->socket)
			put(&p, root, "socket", str_utf8(src->socket, 4096));
		put(&p, root, "up", json_integer(st != NULL));
		put(&p, root, "metrics", json_incref(p.families));
		if (p.err) {
			ret = p.err;
			goto out;
		}
		if (json_dumpf(root, f, JSON_COMPACT | JSON_REAL_PRECISION(15)) < 0)
			ret = -EIO;
		fputc('\n', f);
	}
	if (fflush(f) != 0 || ferror(f))
		ret = -EIO;
out:
	json_decref(root);
	json_decref(p.families);
	return ret;
}
