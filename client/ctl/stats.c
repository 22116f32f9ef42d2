/* client/ctl/stats.c — kvpalacectl's views of the daemon as a whole:
 * `status`, `ping`, `stats`, `pools` and `sessions`, as text or JSON, and
 * `metrics` through metrics.c. `status`, `stats`, `pools` and `metrics`
 * are views of one Stats reply (kvp_stats); `sessions` pages through
 * ListSessions (kvp_list_sessions).
 *
 * Every tier is shown wherever tiers are: the host tier (the pool's
 * arena), the disk tier (its spill file) and the GPU tier (its device
 * arena), each with its pages, its bytes (pages times the pool's page
 * size), what moved in and out of it and what failed. The prefix cache is
 * judged by its token hit ratio, prompt tokens served from the cache over
 * prompt tokens asked about; the count of matches that found anything at
 * all is shown as such, never as a hit rate.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "jdoc.h"
#include "latency.h"
#include "metrics.h"
#include "stats.h"
#include "table.h"

static uint32_t used_pages(const struct kvp_pool_stats *p)
{
	return p->n_pages >= p->free_pages ? p->n_pages - p->free_pages : 0;
}

/* Every pool of st added up, tier by tier. */
struct tiers {
	uint64_t host_pages, host_used, host_bytes, host_used_bytes, evictions, dedup;
	int disk;
	uint64_t disk_pages, disk_capacity, disk_bytes, disk_capacity_bytes;
	uint64_t spilled, promoted, verify_failures, io_errors, disk_dropped, disk_refused,
		disk_gone, restored;
	int gpu;
	uint64_t device_pages, device_used, device_bytes, device_used_bytes;
	uint64_t copied, copied_back, device_dropped, copy_errors;
};

static void tiers_sum(const struct kvp_stats *st, struct tiers *t)
{
	memset(t, 0, sizeof(*t));
	t->disk = st->disk_io[0] != '\0';
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		uint64_t pb = p->page_bytes;

		t->host_pages += p->n_pages;
		t->host_used += used_pages(p);
		t->host_bytes += p->n_pages * pb;
		t->host_used_bytes += used_pages(p) * pb;
		t->evictions += p->evictions;
		t->dedup += p->dedup_pages;
		if (p->has_disk) {
			t->disk = 1;
			t->disk_pages += p->disk_pages;
			t->disk_capacity += p->disk_capacity;
			t->disk_bytes += p->disk_pages * pb;
			t->disk_capacity_bytes += p->disk_capacity * pb;
			t->spilled += p->spilled_pages;
			t->promoted += p->promoted_pages;
			t->verify_failures += p->verify_failures;
			t->io_errors += p->io_errors;
			t->disk_dropped += p->disk_dropped;
			t->disk_refused += p->disk_refused_pages;
			t->disk_gone += p->disk_gone_pages;
			t->restored += p->restored_pages;
		}
		if (p->has_gpu) {
			t->gpu = 1;
			t->device_pages += p->device_pages;
			t->device_used += p->device_used_pages;
			t->device_bytes += p->device_pages * pb;
			t->device_used_bytes += p->device_used_pages * pb;
			t->copied += p->device_copied_pages;
			t->copied_back += p->device_copied_back_pages;
			t->device_dropped += p->device_dropped_pages;
			t->copy_errors += p->device_copy_errors;
		}
	}
	t->gpu |= st->gpu;
}

static double percent(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* ---- text --------------------------------------------------------------- */

/* "5/64" and "40K/512K" cells, or "-" without the tier. */
static void cell_pages(struct table *t, int has, uint64_t used, uint64_t all)
{
	if (has)
		table_cell(t, "%" PRIu64 "/%" PRIu64, used, all);
	else
		table_cell(t, "-");
}

static void cell_bytes(struct table *t, int has, uint64_t used, uint64_t all)
{
	char u[16], a[16];

	if (!has) {
		table_cell(t, "-");
		return;
	}
	size_short(used, u, sizeof(u));
	size_short(all, a, sizeof(a));
	table_cell(t, "%s/%s", u, a);
}

/* The pools as one table, a row each: where their pages are in each
 * tier, what the prefix index holds, what moved. reserved adds the
 * RESERVED column (stats). */
static int pools_table(const struct kvp_stats *st, int indent, int no_headers, int reserved)
{
	struct table t = {0};

	table_col(&t, "POOL", '<');
	table_col(&t, "UID", '<');
	table_col(&t, "MODEL", '<');
	table_col(&t, "LAYOUT", '<');
	table_col(&t, "PAGE", '>');
	table_col(&t, "HOST", '>');
	table_col(&t, "HOST-BYTES", '>');
	table_col(&t, "DISK", '>');
	table_col(&t, "DISK-BYTES", '>');
	table_col(&t, "GPU", '>');
	table_col(&t, "GPU-BYTES", '>');
	table_col(&t, "INDEXED", '>');
	table_col(&t, "EVICTABLE", '>');
	if (reserved)
		table_col(&t, "RESERVED", '>');
	table_col(&t, "LEASED", '>');
	table_col(&t, "SESSIONS", '>');
	table_col(&t, "EVICTIONS", '>');
	table_col(&t, "SPILLED", '>');
	table_col(&t, "PROMOTED", '>');
	table_col(&t, "ERRORS", '>');
	table_col(&t, "DEDUP", '>');
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		uint64_t pb = p->page_bytes;
		char model[sizeof(p->model_id)], layout[128], page[16];

		layout_text(&p->layout, layout, sizeof(layout));
		size_short(pb, page, sizeof(page));
		table_row(&t);
		table_cell(&t, "%" PRIu64, p->pool_id);
		table_cell(&t, "%u", p->uid);
		table_cell(&t, "%s", printable(p->model_id, model, sizeof(model)));
		table_cell(&t, "%s", layout);
		table_cell(&t, "%s", page);
		cell_pages(&t, 1, used_pages(p), p->n_pages);
		cell_bytes(&t, 1, used_pages(p) * pb, p->n_pages * pb);
		cell_pages(&t, p->has_disk, p->disk_pages, p->disk_capacity);
		cell_bytes(&t, p->has_disk, p->disk_pages * pb, p->disk_capacity * (uint64_t)pb);
		cell_pages(&t, p->has_gpu, p->device_used_pages, p->device_pages);
		cell_bytes(&t, p->has_gpu, p->device_used_pages * pb, p->device_pages * pb);
		table_cell(&t, "%u", p->indexed_pages);
		table_cell(&t, "%u", p->evictable_pages);
		if (reserved)
			table_cell(&t, "%u", p->reserved_pages);
		table_cell(&t, "%u", p->leased_pages);
		table_cell(&t, "%u", p->n_sessions);
		table_cell(&t, "%" PRIu64, p->evictions);
		table_cell(&t, "%" PRIu64, p->spilled_pages);
		table_cell(&t, "%" PRIu64, p->promoted_pages);
		table_cell(&t, "%" PRIu64,
			   p->verify_failures + p->io_errors + p->device_copy_errors);
		table_cell(&t, "%" PRIu64, p->dedup_pages);
	}
	return table_print(&t, stdout, indent, no_headers);
}

/* Below the table: each pool's disk and GPU moves and errors in words. */
static void pools_detail(const struct kvp_stats *st)
{
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];

		if (p->has_disk)
			printf("pool %" PRIu64 " spill file: %u of %u page%s; %" PRIu64
			       " spilled, %" PRIu64 " promoted, %" PRIu64
			       " dropped for room, %" PRIu64 " refused, %" PRIu64
			       " restored at start%s; %" PRIu64 " verify failure%s, %" PRIu64
			       " I/O error%s\n",
			       p->pool_id, p->disk_pages, p->disk_capacity,
			       plural(p->disk_capacity), p->spilled_pages, p->promoted_pages,
			       p->disk_dropped, p->disk_refused_pages, p->restored_pages,
			       p->disk_scanning ? " (still scanning the file)" : "",
			       p->verify_failures, plural(p->verify_failures), p->io_errors,
			       plural(p->io_errors));
		if (p->has_gpu)
			printf("pool %" PRIu64 " device arena: %u page%s, %u in use; %" PRIu64
			       " copied to the GPU, %" PRIu64 " back, %" PRIu64 " dropped, %" PRIu64
			       " copy error%s\n",
			       p->pool_id, p->device_pages, plural(p->device_pages),
			       p->device_used_pages, p->device_copied_pages,
			       p->device_copied_back_pages, p->device_dropped_pages,
			       p->device_copy_errors, plural(p->device_copy_errors));
	}
}

/* "8.0% (800 of 10000 prompt tokens)", or why there is no ratio. */
static void ratio_text(uint64_t part, uint64_t whole, const char *what, const struct kvp_stats *st,
		       char *buf, size_t cap)
{
	if (whole)
		snprintf(buf, cap, "%.1f%% (%" PRIu64 " of %" PRIu64 " %s%s)", percent(part, whole),
			 part, whole, what, plural(whole));
	else if (st->match_hits + st->match_misses)
		snprintf(buf, cap, "not reported by this daemon");
	else
		snprintf(buf, cap, "no queries yet");
}

static void print_stats_text(const char *path, int admin, const struct kvp_stats *st)
{
	uint64_t s = st->uptime_ms / 1000;
	char buf[512];

	printf("kvpalaced %s%sat %s%s\n", st->version[0] ? printable(st->version, buf, 64) : "",
	       st->version[0] ? " " : "", printable(path, buf + 64, sizeof(buf) - 64),
	       admin ? " (admin)" : "");
	printf("  %-18s %" PRIu64 "d %02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 " (%" PRIu64 " ms)\n",
	       "uptime", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60, st->uptime_ms);
	printf("  %-18s %" PRIu64 "\n", "connections", st->connections);
	printf("  %-18s %" PRIu64 "\n", "requests", st->requests);
	printf("  %-18s %" PRIu64 "\n", "errors", st->errors);
	printf("  %-18s %" PRIu64 "\n", "match hits", st->match_hits);
	printf("  %-18s %" PRIu64 "\n", "match misses", st->match_misses);
	printf("  %-18s %" PRIu64 "\n", "queried tokens", st->queried_tokens);
	printf("  %-18s %" PRIu64 "\n", "matched tokens", st->matched_tokens);
	printf("  %-18s %" PRIu64 "\n", "queried pages", st->queried_pages);
	printf("  %-18s %" PRIu64 "\n", "matched pages", st->matched_pages);
	ratio_text(st->matched_tokens, st->queried_tokens, "prompt token", st, buf, sizeof(buf));
	printf("  %-18s %s\n", "token hit ratio", buf);
	ratio_text(st->matched_pages, st->queried_pages, "prompt page", st, buf, sizeof(buf));
	printf("  %-18s %s\n", "page hit ratio", buf);
	printf("  %-18s %" PRIu64 "\n", "appended tokens", st->appended_tokens);
	printf("  %-18s %" PRIu64 "\n", "committed tokens", st->committed_tokens);
	printf("  %-18s %" PRIu64 "\n", "evicted pages", st->evictions);
	printf("  %-18s %" PRIu64 "\n", "dedup saved pages", st->dedup_pages);
	printf("  %-18s %" PRIu64 " (%" PRIu64 " purge%s)\n", "purged pages", st->purged_pages,
	       st->purges, plural(st->purges));
	printf("  %-18s %" PRIu64 "\n", "bad disconnects", st->disconnects_bad);
	printf("  %-18s %" PRIu64 " closed with their connection, %" PRIu64 " expired, %" PRIu64
	       " unowned now\n",
	       "sessions", st->sessions_closed_with_connection, st->sessions_expired,
	       st->unowned_sessions);
	printf("  %-18s %" PRIu64 " written, %" PRIu64 " restored, %" PRIu64 " refused, %" PRIu64
	       " failed, %" PRIu64 " removed; %" PRIu64 " pages warmed up; %" PRIu64
	       " restores waited for room\n",
	       "checkpoints", st->checkpoints_written, st->checkpoints_restored,
	       st->checkpoints_refused, st->checkpoint_failures, st->checkpoints_removed,
	       st->warmed_up_pages, st->restore_waits);
	if (st->disk_io[0]) {
		printf("  %-18s %s I/O; %" PRIu64 " pages spilled, %" PRIu64 " promoted; %" PRIu64
		       " verify failure%s, %" PRIu64 " I/O error%s\n",
		       "disk", printable(st->disk_io, buf, sizeof(buf)), st->spilled_pages,
		       st->promoted_pages, st->verify_failures, plural(st->verify_failures),
		       st->io_errors, plural(st->io_errors));
		printf("  %-18s %" PRIu64 " bytes written, %" PRIu64 " bytes served", "disk wear",
		       st->disk_written_bytes, st->disk_served_bytes);
		if (st->disk_served_bytes)
			printf(" (%.2f written per byte served)",
			       (double)st->disk_written_bytes / (double)st->disk_served_bytes);
		printf("; %" PRIu64 " victims not admitted\n", st->disk_unadmitted_pages);
		if (st->prewarm_pages)
			printf("  %-18s %" PRIu64 " pages read ahead, %" PRIu64 " used, %" PRIu64
			       " left unused\n",
			       "prewarm", st->prewarm_pages, st->prewarm_used_pages,
			       st->prewarm_unused_pages);
	} else
		printf("  %-18s no\n", "disk");
	printf("  %-18s %s", "gpu", st->gpu ? "yes" : "no");
	if (st->gpu_status[0])
		printf(" (%s)", printable(st->gpu_status, buf, sizeof(buf)));
	printf("\n\n%zu pool%s%s\n", st->n_pools, plural(st->n_pools),
	       st->pools_truncated ? " (more exist than fit in one reply)" : "");
	if (!st->n_pools)
		return;
	pools_table(st, 2, 0, 1);
}

static int print_pools_text(const struct kvp_stats *st, int no_headers)
{
	if (!st->n_pools) {
		if (!no_headers)
			printf("no pools\n");
		return 0;
	}
	if (pools_table(st, 0, no_headers, 0) < 0)
		return -1;
	/* Scripts asking for rows get rows only; the words are for people. */
	if (no_headers)
		return 0;
	pools_detail(st);
	if (st->pools_truncated)
		printf("(more pools exist than fit in one reply)\n");
	return 0;
}

static void print_sessions_text(const struct kvp_session_info *ss, size_t n, int no_headers)
{
	struct table t = {0};
	char idle[32];

	if (!n) {
		if (!no_headers)
			printf("no sessions\n");
		return;
	}
	table_col(&t, "SESSION", '<');
	table_col(&t, "POOL", '<');
	table_col(&t, "UID", '<');
	table_col(&t, "TOKENS", '>');
	table_col(&t, "COMMITTED", '>');
	table_col(&t, "PAGES", '>');
	table_col(&t, "SHARED", '>');
	table_col(&t, "IDLE", '>');
	table_col(&t, "WRITING", '<');
	for (size_t i = 0; i < n; i++) {
		const struct kvp_session_info *s = &ss[i];

		idle_text(s->idle_ms, idle, sizeof(idle));
		table_row(&t);
		table_cell(&t, "%" PRIu64, s->session_id);
		table_cell(&t, "%" PRIu64, s->pool_id);
		table_cell(&t, "%u", s->uid);
		table_cell(&t, "%" PRIu64, s->n_tokens);
		table_cell(&t, "%" PRIu64, s->committed_tokens);
		table_cell(&t, "%u", s->n_pages);
		table_cell(&t, "%u", s->shared_pages);
		table_cell(&t, "%s", idle);
		table_cell(&t, "%s", s->writing ? "yes" : "no");
	}
	table_print(&t, stdout, 0, no_headers);
}

/* ---- JSON --------------------------------------------------------------- */

/* One pool as a JSON object: the struct's fields, and bytes for pages. */
static json_t *json_pool(const struct kvp_pool_stats *p)
{
	json_t *o = jdoc_object();
	uint64_t pb = p->page_bytes;

	jdoc_u64(o, "pool_id", p->pool_id);
	jdoc_u64(o, "uid", p->uid);
	jdoc_str(o, "model_id", p->model_id);
	jdoc_set(o, "layout", jdoc_layout(&p->layout));
	jdoc_u64(o, "page_bytes", pb);
	jdoc_u64(o, "n_pages", p->n_pages);
	jdoc_u64(o, "free_pages", p->free_pages);
	jdoc_u64(o, "used_pages", used_pages(p));
	jdoc_u64(o, "arena_bytes", p->n_pages * pb);
	jdoc_u64(o, "used_bytes", used_pages(p) * pb);
	jdoc_u64(o, "reserved_pages", p->reserved_pages);
	jdoc_u64(o, "leased_pages", p->leased_pages);
	jdoc_u64(o, "indexed_pages", p->indexed_pages);
	jdoc_u64(o, "host_indexed_pages", p->host_indexed_pages);
	jdoc_u64(o, "evictable_pages", p->evictable_pages);
	jdoc_u64(o, "permanent_pages", p->permanent_pages);
	jdoc_u64(o, "n_sessions", p->n_sessions);
	jdoc_u64(o, "persistent_sessions", p->persistent_sessions);
	jdoc_u64(o, "unowned_sessions", p->unowned_sessions);
	jdoc_u64(o, "evictions", p->evictions);
	jdoc_u64(o, "dedup_pages", p->dedup_pages);
	jdoc_u64(o, "purged_pages", p->purged_pages);
	/* A tier the pool lacks is absent, not zero: a daemon without a
	 * GPU prints what it always did. */
	if (p->has_disk) {
		json_t *d = jdoc_object();

		jdoc_u64(d, "disk_pages", p->disk_pages);
		jdoc_u64(d, "disk_capacity", p->disk_capacity);
		jdoc_u64(d, "disk_bytes", p->disk_pages * pb);
		jdoc_u64(d, "disk_capacity_bytes", p->disk_capacity * pb);
		jdoc_u64(d, "spilled_pages", p->spilled_pages);
		jdoc_u64(d, "promoted_pages", p->promoted_pages);
		jdoc_u64(d, "disk_written_bytes", p->disk_written_bytes);
		jdoc_u64(d, "disk_served_bytes", p->disk_served_bytes);
		jdoc_u64(d, "disk_unadmitted_pages", p->disk_unadmitted_pages);
		jdoc_u64(d, "prewarm_pages", p->prewarm_pages);
		jdoc_u64(d, "prewarm_used_pages", p->prewarm_used_pages);
		jdoc_u64(d, "prewarm_unused_pages", p->prewarm_unused_pages);
		jdoc_u64(d, "verify_failures", p->verify_failures);
		jdoc_u64(d, "io_errors", p->io_errors);
		jdoc_u64(d, "disk_dropped", p->disk_dropped);
		jdoc_u64(d, "disk_refused_pages", p->disk_refused_pages);
		jdoc_u64(d, "disk_gone_pages", p->disk_gone_pages);
		jdoc_u64(d, "restored_pages", p->restored_pages);
		jdoc_u64(d, "quantized_pages", p->quantized_pages);
		jdoc_u64(d, "lossy_replaced_pages", p->lossy_replaced_pages);
		jdoc_set(o, "disk", d);
	}
	if (p->has_gpu) {
		json_t *g = jdoc_object();

		jdoc_u64(g, "device_pages", p->device_pages);
		jdoc_u64(g, "device_used_pages", p->device_used_pages);
		jdoc_u64(g, "device_bytes", p->device_pages * pb);
		jdoc_u64(g, "device_used_bytes", p->device_used_pages * pb);
		jdoc_u64(g, "device_copied_pages", p->device_copied_pages);
		jdoc_u64(g, "device_copied_back_pages", p->device_copied_back_pages);
		jdoc_u64(g, "device_dropped_pages", p->device_dropped_pages);
		jdoc_u64(g, "device_copy_errors", p->device_copy_errors);
		jdoc_set(o, "gpu", g);
	}
	return o;
}

static void json_pools(json_t *doc, const struct kvp_stats *st)
{
	json_t *arr = jdoc_array();

	jdoc_bool(doc, "pools_truncated", st->pools_truncated);
	for (size_t i = 0; i < st->n_pools; i++)
		jdoc_push(arr, json_pool(&st->pools[i]));
	jdoc_set(doc, "pools", arr);
}

static void json_checkpoint_counters(json_t *doc, const struct kvp_stats *st)
{
	jdoc_u64(doc, "checkpoints_written", st->checkpoints_written);
	jdoc_u64(doc, "checkpoints_restored", st->checkpoints_restored);
	jdoc_u64(doc, "checkpoints_refused", st->checkpoints_refused);
	jdoc_u64(doc, "checkpoint_failures", st->checkpoint_failures);
	jdoc_u64(doc, "checkpoints_removed", st->checkpoints_removed);
	jdoc_u64(doc, "restore_waits", st->restore_waits);
	jdoc_u64(doc, "warmed_up_pages", st->warmed_up_pages);
}

static void json_version(json_t *doc, const struct kvp_stats *st)
{
	jdoc_str_or_null(doc, "version", st->version[0] ? st->version : NULL);
	jdoc_str_or_null(doc, "event_loop", st->event_loop[0] ? st->event_loop : NULL);
}

/* The prefix cache's counters: what was asked, what was served. */
static void json_match(json_t *doc, const struct kvp_stats *st)
{
	jdoc_u64(doc, "queried_tokens", st->queried_tokens);
	jdoc_u64(doc, "matched_tokens", st->matched_tokens);
	jdoc_u64(doc, "queried_pages", st->queried_pages);
	jdoc_u64(doc, "matched_pages", st->matched_pages);
}

static void json_latencies(json_t *doc, const struct kvp_stats *st)
{
	json_t *arr = jdoc_array();

	for (size_t i = 0; i < st->n_latencies; i++)
		jdoc_push(arr, latency_json(&st->latencies[i]));
	jdoc_set(doc, "latencies", arr);
}

static json_t *stats_json(const char *path, int admin, const struct kvp_stats *st)
{
	json_t *doc = jdoc_object();

	jdoc_str(doc, "socket", path);
	jdoc_bool(doc, "admin", admin);
	json_version(doc, st);
	jdoc_u64(doc, "uptime_ms", st->uptime_ms);
	jdoc_u64(doc, "connections", st->connections);
	jdoc_u64(doc, "requests", st->requests);
	jdoc_u64(doc, "errors", st->errors);
	jdoc_u64(doc, "match_hits", st->match_hits);
	jdoc_u64(doc, "match_misses", st->match_misses);
	jdoc_u64(doc, "matched_tokens", st->matched_tokens);
	jdoc_u64(doc, "queried_tokens", st->queried_tokens);
	jdoc_u64(doc, "queried_pages", st->queried_pages);
	jdoc_u64(doc, "matched_pages", st->matched_pages);
	jdoc_u64(doc, "appended_tokens", st->appended_tokens);
	jdoc_u64(doc, "committed_tokens", st->committed_tokens);
	jdoc_u64(doc, "evictions", st->evictions);
	jdoc_u64(doc, "dedup_pages", st->dedup_pages);
	jdoc_u64(doc, "purges", st->purges);
	jdoc_u64(doc, "purged_pages", st->purged_pages);
	jdoc_u64(doc, "disconnects_bad", st->disconnects_bad);
	jdoc_u64(doc, "sessions_closed_with_connection", st->sessions_closed_with_connection);
	jdoc_u64(doc, "sessions_expired", st->sessions_expired);
	jdoc_u64(doc, "unowned_sessions", st->unowned_sessions);
	jdoc_u64(doc, "placed_sessions", st->placed_sessions);
	jdoc_u64(doc, "unplaced_sessions", st->unplaced_sessions);
	json_checkpoint_counters(doc, st);
	jdoc_str_or_null(doc, "disk_io", st->disk_io[0] ? st->disk_io : NULL);
	jdoc_u64(doc, "spilled_pages", st->spilled_pages);
	jdoc_u64(doc, "promoted_pages", st->promoted_pages);
	jdoc_u64(doc, "verify_failures", st->verify_failures);
	jdoc_u64(doc, "io_errors", st->io_errors);
	jdoc_bool(doc, "gpu", st->gpu);
	jdoc_str(doc, "gpu_status", st->gpu_status);
	json_latencies(doc, st);
	json_pools(doc, st);
	return doc;
}

static json_t *pools_json(const char *path, int admin, const struct kvp_stats *st)
{
	json_t *doc = jdoc_object();

	jdoc_str(doc, "socket", path);
	jdoc_bool(doc, "admin", admin);
	json_pools(doc, st);
	return doc;
}

static json_t *sessions_json(const char *path, int admin, uint64_t pool_id,
			     const struct kvp_session_info *ss, size_t n)
{
	json_t *doc = jdoc_object(), *arr = jdoc_array();

	jdoc_str(doc, "socket", path);
	jdoc_bool(doc, "admin", admin);
	if (pool_id)
		jdoc_u64(doc, "pool_id", pool_id);
	for (size_t i = 0; i < n; i++) {
		const struct kvp_session_info *s = &ss[i];
		json_t *o = jdoc_object();

		jdoc_u64(o, "session_id", s->session_id);
		jdoc_u64(o, "pool_id", s->pool_id);
		jdoc_u64(o, "uid", s->uid);
		jdoc_u64(o, "n_tokens", s->n_tokens);
		jdoc_u64(o, "committed_tokens", s->committed_tokens);
		jdoc_u64(o, "n_pages", s->n_pages);
		jdoc_u64(o, "shared_pages", s->shared_pages);
		jdoc_u64(o, "idle_ms", s->idle_ms);
		jdoc_bool(o, "writing", s->writing);
		jdoc_push(arr, o);
	}
	jdoc_set(doc, "sessions", arr);
	return doc;
}

/* ---- status ------------------------------------------------------------- */

/* The remote tier's figures, when the daemon has one. */
static void json_remote(json_t *doc, const struct kvp_stats *st)
{
	const struct kvp_remote_stats *r = &st->remote;
	json_t *o;

	if (!st->remote_on)
		return;
	o = jdoc_object();
	jdoc_u64(o, "nodes_up", r->nodes_up);
	jdoc_u64(o, "nodes_down", r->nodes_down);
	jdoc_u64(o, "pages_written", r->pages_written);
	jdoc_u64(o, "write_failures", r->write_failures);
	jdoc_u64(o, "fetches", r->fetches);
	jdoc_u64(o, "pages_fetched", r->pages_fetched);
	jdoc_u64(o, "fetch_misses", r->fetch_misses);
	jdoc_u64(o, "fetched_bytes", r->fetched_bytes);
	if (st->remote_client) {
		jdoc_u64(o, "gets", r->gets);
		jdoc_u64(o, "hits", r->hits);
		jdoc_u64(o, "misses", r->misses);
		jdoc_u64(o, "corrupt", r->corrupt);
		jdoc_u64(o, "timeouts", r->timeouts);
		jdoc_u64(o, "errors", r->errors);
		jdoc_u64(o, "puts", r->puts);
		jdoc_u64(o, "stored", r->stored);
		jdoc_u64(o, "dropped_puts", r->dropped_puts);
		jdoc_u64(o, "dropped_gets", r->dropped_gets);
		jdoc_u64(o, "bytes_in", r->bytes_in);
		jdoc_u64(o, "bytes_out", r->bytes_out);
		jdoc_u64(o, "inflight_bytes", r->inflight_bytes);
	}
	jdoc_set(doc, "remote", o);
}

static void print_remote(const struct kvp_stats *st)
{
	const struct kvp_remote_stats *r = &st->remote;
	char a[32];

	if (!st->remote_on)
		return;
	size_text(r->fetched_bytes, a, sizeof(a));
	if (r->nodes_up + r->nodes_down)
		printf("remote tier: %u node%s up, %u down\n", r->nodes_up, plural(r->nodes_up),
		       r->nodes_down);
	else
		printf("remote tier: no slot map (the cluster has not answered yet)\n");
	printf("  moves: %" PRIu64 " page%s written (%" PRIu64 " failed), %" PRIu64
	       " fetched (%s) in %" PRIu64 " batch%s, %" PRIu64 " asked for and not had\n",
	       r->pages_written, plural(r->pages_written), r->write_failures, r->pages_fetched, a,
	       r->fetches, r->fetches == 1 ? "" : "es", r->fetch_misses);
	if (st->remote_client)
		printf("  client: %" PRIu64 " gets (%" PRIu64 " hits), %" PRIu64 " puts (%" PRIu64
		       " stored); %" PRIu64 " corrupt, %" PRIu64 " timeouts, %" PRIu64
		       " other errors, %" PRIu64 " puts and %" PRIu64 " gets dropped over the "
		       "in-flight budget\n",
		       r->gets, r->hits, r->puts, r->stored, r->corrupt, r->timeouts, r->errors,
		       r->dropped_puts, r->dropped_gets);
}

static json_t *status_json(const char *path, const struct kvp_stats *st, const struct tiers *t)
{
	json_t *doc = jdoc_object();

	jdoc_str(doc, "socket", path);
	json_version(doc, st);
	jdoc_u64(doc, "uptime_ms", st->uptime_ms);
	jdoc_u64(doc, "connections", st->connections);
	jdoc_u64(doc, "pools", st->n_pools);
	jdoc_bool(doc, "pools_truncated", st->pools_truncated);
	jdoc_u64(doc, "host_pages", t->host_pages);
	jdoc_u64(doc, "host_used_pages", t->host_used);
	jdoc_bool(doc, "gpu", st->gpu);
	jdoc_u64(doc, "match_hits", st->match_hits);
	jdoc_u64(doc, "match_total", st->match_hits + st->match_misses);
	json_match(doc, st);
	json_remote(doc, st);
	{
		json_t *h = jdoc_object();

		jdoc_u64(h, "n_pages", t->host_pages);
		jdoc_u64(h, "used_pages", t->host_used);
		jdoc_u64(h, "arena_bytes", t->host_bytes);
		jdoc_u64(h, "used_bytes", t->host_used_bytes);
		jdoc_u64(h, "evictions", t->evictions);
		jdoc_u64(h, "dedup_pages", t->dedup);
		jdoc_set(doc, "host", h);
	}
	if (t->disk) {
		json_t *d = jdoc_object();

		jdoc_str(d, "disk_io", st->disk_io);
		jdoc_u64(d, "disk_pages", t->disk_pages);
		jdoc_u64(d, "disk_capacity", t->disk_capacity);
		jdoc_u64(d, "disk_bytes", t->disk_bytes);
		jdoc_u64(d, "disk_capacity_bytes", t->disk_capacity_bytes);
		jdoc_u64(d, "spilled_pages", t->spilled);
		jdoc_u64(d, "promoted_pages", t->promoted);
		jdoc_u64(d, "disk_dropped", t->disk_dropped);
		jdoc_u64(d, "disk_refused_pages", t->disk_refused);
		jdoc_u64(d, "restored_pages", t->restored);
		jdoc_u64(d, "verify_failures", t->verify_failures);
		jdoc_u64(d, "io_errors", t->io_errors);
		jdoc_u64(d, "disk_gone_pages", t->disk_gone);
		jdoc_set(doc, "disk", d);
	} else {
		jdoc_null(doc, "disk");
	}
	{
		json_t *g = jdoc_object();

		jdoc_str(g, "gpu_status", st->gpu_status);
		jdoc_u64(g, "device_pages", t->device_pages);
		jdoc_u64(g, "device_used_pages", t->device_used);
		jdoc_u64(g, "device_bytes", t->device_bytes);
		jdoc_u64(g, "device_used_bytes", t->device_used_bytes);
		jdoc_u64(g, "device_copied_pages", t->copied);
		jdoc_u64(g, "device_copied_back_pages", t->copied_back);
		jdoc_u64(g, "device_dropped_pages", t->device_dropped);
		jdoc_u64(g, "device_copy_errors", t->copy_errors);
		jdoc_set(doc, "gpu_tier", t->gpu ? g : (json_decref(g), json_null()));
	}
	json_latencies(doc, st);
	json_checkpoint_counters(doc, st);
	return doc;
}

/* `status`: the daemon in a few lines — version, uptime, clients, each
 * tier's use, moves and errors, the prefix cache's hit ratios, the
 * busiest requests' latencies, checkpoints. */
static void print_status(const char *path, const struct kvp_stats *st, const struct tiers *t)
{
	char buf[512], a[32], b[32];
	uint64_t total = st->match_hits + st->match_misses;

	printf("kvpalaced %s%sat %s: up %" PRIu64 " s, %" PRIu64 " connection%s",
	       st->version[0] ? printable(st->version, a, sizeof(a)) : "",
	       st->version[0] ? " " : "", printable(path, buf, sizeof(buf)), st->uptime_ms / 1000,
	       st->connections, plural(st->connections));
	if (st->event_loop[0])
		printf(", %s event loop", printable(st->event_loop, a, sizeof(a)));
	printf("\n");
	size_text(t->host_used_bytes, a, sizeof(a));
	size_text(t->host_bytes, b, sizeof(b));
	if (st->pools_truncated)
		printf("(more pools exist than fit in the daemon's reply: the tier figures below "
		       "cover the first %zu)\n",
		       st->n_pools);
	printf("host tier: %zu pool%s, %" PRIu64 " of %" PRIu64 " page%s used (%.1f%%), %s of %s\n",
	       st->n_pools, plural(st->n_pools), t->host_used, t->host_pages, plural(t->host_pages),
	       percent(t->host_used, t->host_pages), a, b);
	printf("  moves: %" PRIu64 " page%s evicted, %" PRIu64 " deduplicated\n", t->evictions,
	       plural(t->evictions), t->dedup);
	if (t->disk) {
		size_text(t->disk_bytes, a, sizeof(a));
		size_text(t->disk_capacity_bytes, b, sizeof(b));
		printf("disk tier: %" PRIu64 " of %" PRIu64 " page%s used (%.1f%%), %s of %s",
		       t->disk_pages, t->disk_capacity, plural(t->disk_capacity),
		       percent(t->disk_pages, t->disk_capacity), a, b);
		if (st->disk_io[0])
			printf(", %s I/O", printable(st->disk_io, buf, sizeof(buf)));
		printf("\n  moves: %" PRIu64 " page%s spilled, %" PRIu64 " promoted, %" PRIu64
		       " dropped for room, %" PRIu64 " refused, %" PRIu64 " restored at start\n",
		       t->spilled, plural(t->spilled), t->promoted, t->disk_dropped,
		       t->disk_refused, t->restored);
		printf("  errors: %" PRIu64 " verify failure%s, %" PRIu64 " I/O error%s, %" PRIu64
		       " page%s gone from the file\n",
		       t->verify_failures, plural(t->verify_failures), t->io_errors,
		       plural(t->io_errors), t->disk_gone, plural(t->disk_gone));
	} else {
		printf("disk tier: no\n");
	}
	printf("gpu tier: %s", st->gpu ? "yes" : "no");
	if (st->gpu_status[0])
		printf(" (%s)", printable(st->gpu_status, buf, sizeof(buf)));
	if (t->device_pages) {
		size_text(t->device_used_bytes, a, sizeof(a));
		size_text(t->device_bytes, b, sizeof(b));
		printf(", %" PRIu64 " of %" PRIu64 " slot%s used (%.1f%%), %s of %s\n",
		       t->device_used, t->device_pages, plural(t->device_pages),
		       percent(t->device_used, t->device_pages), a, b);
		printf("  moves: %" PRIu64 " page%s copied to the GPU, %" PRIu64 " back, %" PRIu64
		       " dropped\n",
		       t->copied, plural(t->copied), t->copied_back, t->device_dropped);
		printf("  errors: %" PRIu64 " copy error%s\n", t->copy_errors,
		       plural(t->copy_errors));
	} else {
		printf("\n");
	}
	print_remote(st);
	ratio_text(st->matched_tokens, st->queried_tokens, "prompt token", st, buf, sizeof(buf));
	printf("token hit ratio: %s\n", buf);
	ratio_text(st->matched_pages, st->queried_pages, "prompt page", st, buf, sizeof(buf));
	printf("page hit ratio: %s\n", buf);
	if (total)
		printf("matches with a hit: %" PRIu64 " of %" PRIu64 " (%.1f%%)\n", st->match_hits,
		       total, percent(st->match_hits, total));
	else
		printf("matches with a hit: no matches yet\n");
	if (st->n_latencies) {
		size_t order[3] = {0};
		size_t *all = calloc(st->n_latencies, sizeof(*all));

		if (all) {
			latency_order(st, all);
			memcpy(order, all,
			       (st->n_latencies < 3 ? st->n_latencies : 3) * sizeof(*order));
			free(all);
			printf("latency:");
			for (size_t k = 0; k < st->n_latencies && k < 3; k++) {
				const struct kvp_latency *l = &st->latencies[order[k]];
				char name[sizeof(l->request)];

				duration_text(latency_quantile_ns(l, 0.5), a, sizeof(a));
				duration_text(latency_quantile_ns(l, 0.99), b, sizeof(b));
				printf("%s %s p50 %s p99 %s (%" PRIu64 ")", k ? ";" : "",
				       printable(l->request, name, sizeof(name)), a, b, l->count);
			}
			printf("\n");
		}
	}
	printf("checkpoints: %" PRIu64 " written, %" PRIu64 " restored, %" PRIu64
	       " refused, %" PRIu64 " failed, %" PRIu64 " removed\n",
	       st->checkpoints_written, st->checkpoints_restored, st->checkpoints_refused,
	       st->checkpoint_failures, st->checkpoints_removed);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int cmd_ping(kvp_client *c, const struct args *a)
{
	double t0 = now_us();
	double rtt;
	char buf[512];
	int ret;

	ret = kvp_ping(c);
	rtt = now_us() - t0;
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_real(doc, "rtt_us", (double)(int64_t)(rtt * 10 + 0.5) / 10);
		jdoc_bool(doc, "admin", kvp_is_admin(c));
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("pong from %s: round trip %.1f us, admin: %s\n",
	       printable(a->path, buf, sizeof(buf)), rtt, kvp_is_admin(c) ? "yes" : "no");
	return 0;
}

int cmd_stats(kvp_client *c, const struct args *a)
{
	int admin = kvp_is_admin(c), no_headers = !!(a->given & OPT_NO_HEADERS);
	struct kvp_stats *st;
	json_t *doc = NULL;
	struct tiers t;
	int ret;

	ret = kvp_stats(c, &st);
	if (ret < 0)
		return fail(c, a->name, ret);
	tiers_sum(st, &t);
	ret = 0;
	if (!strcmp(a->name, "metrics"))
		print_metrics(stdout, a->path, a->json, st);
	else if (!strcmp(a->name, "status") && a->json)
		doc = status_json(a->path, st, &t);
	else if (!strcmp(a->name, "status"))
		print_status(a->path, st, &t);
	else if (!strcmp(a->name, "pools") && a->json)
		doc = pools_json(a->path, admin, st);
	else if (!strcmp(a->name, "pools"))
		ret = print_pools_text(st, no_headers) < 0 ? EXIT_DAEMON : 0;
	else if (a->json)
		doc = stats_json(a->path, admin, st);
	else
		print_stats_text(a->path, admin, st);
	if (doc && jdoc_print(stdout, doc) < 0)
		ret = EXIT_DAEMON;
	kvp_stats_free(st);
	return ret;
}

/* Whether pool_id is none of the pools Stats lists (an empty listing of
 * it then means no such pool, as the other commands say; a list cut
 * short proves nothing). 0 when it is listed or cannot be told. */
static int pool_missing(kvp_client *c, uint64_t pool_id)
{
	struct kvp_stats *st;
	int missing;

	if (kvp_stats(c, &st) < 0)
		return 0;
	missing = !st->pools_truncated;
	for (size_t i = 0; i < st->n_pools && missing; i++)
		missing = st->pools[i].pool_id != pool_id;
	kvp_stats_free(st);
	return missing;
}

int cmd_sessions(kvp_client *c, const struct args *a)
{
	struct kvp_session_info *ss;
	size_t n;
	int ret = 0;

	ret = kvp_list_sessions(c, a->pool_id, &ss, &n);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (!n && (a->given & OPT_POOL) && pool_missing(c, a->pool_id)) {
		free(ss);
		fprintf(stderr, "kvpalacectl: %s: no such pool %" PRIu64 "\n", a->name, a->pool_id);
		return EXIT_DAEMON;
	}
	if (a->json)
		ret = jdoc_print(stdout,
				 sessions_json(a->path, kvp_is_admin(c), a->pool_id, ss, n)) < 0
			      ? EXIT_DAEMON
			      : 0;
	else
		print_sessions_text(ss, n, a->given & OPT_NO_HEADERS);
	free(ss);
	return ret;
}
