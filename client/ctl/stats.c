/* client/ctl/stats.c — kvpalacectl's views of the daemon as a whole:
 * `status`, `ping`, `stats`, `pools` and `sessions`, as text or JSON, and
 * `metrics` through metrics.c. `status`, `stats`, `pools` and `metrics`
 * are views of one Stats reply (kvp_stats); `sessions` pages through
 * ListSessions (kvp_list_sessions).
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
#include "json.h"
#include "metrics.h"
#include "stats.h"

static uint32_t used_pages(const struct kvp_pool_stats *p)
{
	return p->n_pages >= p->free_pages ? p->n_pages - p->free_pages : 0;
}

/* Widths of the MODEL and LAYOUT columns for the pools of st. */
static void pool_widths(const struct kvp_stats *st, int *wmodel, int *wlayout)
{
	char buf[128];

	*wmodel = (int)strlen("MODEL");
	*wlayout = (int)strlen("LAYOUT");
	for (size_t i = 0; i < st->n_pools; i++) {
		int n = (int)strlen(st->pools[i].model_id);

		if (n > *wmodel)
			*wmodel = n;
		layout_text(&st->pools[i].layout, buf, sizeof(buf));
		n = (int)strlen(buf);
		if (n > *wlayout)
			*wlayout = n;
	}
}

static void print_stats_text(const char *path, int admin, const struct kvp_stats *st)
{
	uint64_t s = st->uptime_ms / 1000;
	char buf[512];
	int wmodel, wlayout;

	printf("kvpalaced at %s%s\n", printable(path, buf, sizeof(buf)), admin ? " (admin)" : "");
	printf("  %-18s %" PRIu64 "d %02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 " (%" PRIu64 " ms)\n",
	       "uptime", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60, st->uptime_ms);
	printf("  %-18s %" PRIu64 "\n", "connections", st->connections);
	printf("  %-18s %" PRIu64 "\n", "requests", st->requests);
	printf("  %-18s %" PRIu64 "\n", "errors", st->errors);
	printf("  %-18s %" PRIu64 "\n", "match hits", st->match_hits);
	printf("  %-18s %" PRIu64 "\n", "match misses", st->match_misses);
	printf("  %-18s %" PRIu64 "\n", "matched tokens", st->matched_tokens);
	printf("  %-18s %" PRIu64 "\n", "appended tokens", st->appended_tokens);
	printf("  %-18s %" PRIu64 "\n", "committed tokens", st->committed_tokens);
	printf("  %-18s %" PRIu64 "\n", "evicted pages", st->evictions);
	printf("  %-18s %" PRIu64 "\n", "dedup saved pages", st->dedup_pages);
	printf("  %-18s %" PRIu64 " (%" PRIu64 " purges)\n", "purged pages", st->purged_pages,
	       st->purges);
	printf("  %-18s %" PRIu64 "\n", "bad disconnects", st->disconnects_bad);
	printf("  %-18s %" PRIu64 " written, %" PRIu64 " restored, %" PRIu64 " refused, %" PRIu64
	       " failed, %" PRIu64 " removed; %" PRIu64 " pages warmed up; %" PRIu64
	       " restores waited for room\n",
	       "checkpoints", st->checkpoints_written, st->checkpoints_restored,
	       st->checkpoints_refused, st->checkpoint_failures, st->checkpoints_removed,
	       st->warmed_up_pages, st->restore_waits);
	printf("  %-18s %s", "gpu", st->gpu ? "yes" : "no");
	if (st->gpu_status[0])
		printf(" (%s)", printable(st->gpu_status, buf, sizeof(buf)));
	printf("\n\npools: %zu%s\n", st->n_pools,
	       st->pools_truncated ? " (more exist than fit in one reply)" : "");
	if (!st->n_pools)
		return;

	pool_widths(st, &wmodel, &wlayout);
	printf("  %-6s %-6s %-*s %-*s %8s %8s %8s %8s %8s %8s %9s\n", "POOL", "UID", wmodel,
	       "MODEL", wlayout, "LAYOUT", "PAGES", "FREE", "USED", "RESERVED", "LEASED",
	       "SESSIONS", "PAGE");
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		char model[sizeof(p->model_id)];
		char layout[128];
		char page[32];

		layout_text(&p->layout, layout, sizeof(layout));
		size_text(p->page_bytes, page, sizeof(page));
		printf("  %-6" PRIu64 " %-6u %-*s %-*s %8u %8u %8u %8u %8u %8u %9s\n", p->pool_id,
		       p->uid, wmodel, printable(p->model_id, model, sizeof(model)), wlayout,
		       layout, p->n_pages, p->free_pages, used_pages(p), p->reserved_pages,
		       p->leased_pages, p->n_sessions, page);
	}
}

static void print_pools_text(const struct kvp_stats *st)
{
	int wmodel, wlayout;

	if (!st->n_pools) {
		printf("no pools\n");
		return;
	}
	pool_widths(st, &wmodel, &wlayout);
	printf("%-6s %-6s %-*s %-*s %8s %8s %8s %8s %9s %8s %8s %9s %8s %9s\n", "POOL", "UID",
	       wmodel, "MODEL", wlayout, "LAYOUT", "PAGES", "FREE", "USED", "INDEXED", "EVICTABLE",
	       "LEASED", "SESSIONS", "EVICTIONS", "DEDUP", "PAGE");
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		char model[sizeof(p->model_id)];
		char layout[128];
		char page[32];

		layout_text(&p->layout, layout, sizeof(layout));
		size_text(p->page_bytes, page, sizeof(page));
		printf("%-6" PRIu64 " %-6u %-*s %-*s %8u %8u %8u %8u %9u %8u %8u %9" PRIu64
		       " %8" PRIu64 " %9s\n",
		       p->pool_id, p->uid, wmodel, printable(p->model_id, model, sizeof(model)),
		       wlayout, layout, p->n_pages, p->free_pages, used_pages(p), p->indexed_pages,
		       p->evictable_pages, p->leased_pages, p->n_sessions, p->evictions,
		       p->dedup_pages, page);
	}
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];

		if (p->has_gpu)
			printf("pool %" PRIu64 " device arena: %u pages, %u in use; %" PRIu64
			       " copied to the GPU, %" PRIu64 " back, %" PRIu64 " dropped, %" PRIu64
			       " copy errors\n",
			       p->pool_id, p->device_pages, p->device_used_pages,
			       p->device_copied_pages, p->device_copied_back_pages,
			       p->device_dropped_pages, p->device_copy_errors);
	}
	if (st->pools_truncated)
		printf("(more pools exist than fit in one reply)\n");
}

static void print_sessions_text(const struct kvp_session_info *ss, size_t n)
{
	char idle[32];

	if (!n) {
		printf("no sessions\n");
		return;
	}
	printf("%-8s %-6s %-6s %10s %10s %8s %8s %8s %s\n", "SESSION", "POOL", "UID", "TOKENS",
	       "COMMITTED", "PAGES", "SHARED", "IDLE", "WRITING");
	for (size_t i = 0; i < n; i++) {
		const struct kvp_session_info *s = &ss[i];

		idle_text(s->idle_ms, idle, sizeof(idle));
		printf("%-8" PRIu64 " %-6" PRIu64 " %-6u %10" PRIu64 " %10" PRIu64
		       " %8u %8u %8s %s\n",
		       s->session_id, s->pool_id, s->uid, s->n_tokens, s->committed_tokens,
		       s->n_pages, s->shared_pages, idle, s->writing ? "yes" : "no");
	}
}

/* One pool as a JSON object. */
static void json_pool(FILE *f, const struct kvp_pool_stats *p)
{
	fputc('{', f);
	json_u64(f, "pool_id", p->pool_id, 1);
	json_u64(f, "uid", p->uid, 1);
	json_string(f, "model_id", p->model_id, 1);
	json_layout(f, &p->layout);
	json_u64(f, "page_bytes", p->page_bytes, 1);
	json_u64(f, "n_pages", p->n_pages, 1);
	json_u64(f, "free_pages", p->free_pages, 1);
	json_u64(f, "used_pages", used_pages(p), 1);
	json_u64(f, "reserved_pages", p->reserved_pages, 1);
	json_u64(f, "leased_pages", p->leased_pages, 1);
	json_u64(f, "indexed_pages", p->indexed_pages, 1);
	json_u64(f, "evictable_pages", p->evictable_pages, 1);
	json_u64(f, "n_sessions", p->n_sessions, 1);
	json_u64(f, "evictions", p->evictions, 1);
	json_u64(f, "dedup_pages", p->dedup_pages, p->has_gpu);
	if (p->has_gpu) {
		/* Only pools with a device arena: a daemon without a GPU
		 * prints what it always did. */
		json_key(f, "gpu");
		fputc('{', f);
		json_u64(f, "device_pages", p->device_pages, 1);
		json_u64(f, "device_used_pages", p->device_used_pages, 1);
		json_u64(f, "device_copied_pages", p->device_copied_pages, 1);
		json_u64(f, "device_copied_back_pages", p->device_copied_back_pages, 1);
		json_u64(f, "device_dropped_pages", p->device_dropped_pages, 1);
		json_u64(f, "device_copy_errors", p->device_copy_errors, 0);
		fputc('}', f);
	}
	fputc('}', f);
}

static void json_pools(FILE *f, const struct kvp_stats *st)
{
	json_bool(f, "pools_truncated", st->pools_truncated, 1);
	json_key(f, "pools");
	fputc('[', f);
	for (size_t i = 0; i < st->n_pools; i++) {
		if (i)
			fputc(',', f);
		json_pool(f, &st->pools[i]);
	}
	fputc(']', f);
}

/* The checkpoint counters; a comma after the last one when comma. */
static void json_checkpoint_counters(FILE *f, const struct kvp_stats *st, int comma)
{
	json_u64(f, "checkpoints_written", st->checkpoints_written, 1);
	json_u64(f, "checkpoints_restored", st->checkpoints_restored, 1);
	json_u64(f, "checkpoints_refused", st->checkpoints_refused, 1);
	json_u64(f, "checkpoint_failures", st->checkpoint_failures, 1);
	json_u64(f, "checkpoints_removed", st->checkpoints_removed, 1);
	json_u64(f, "restore_waits", st->restore_waits, 1);
	json_u64(f, "warmed_up_pages", st->warmed_up_pages, comma);
}

static void print_stats_json(const char *path, int admin, const struct kvp_stats *st)
{
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_bool(f, "admin", admin, 1);
	json_u64(f, "uptime_ms", st->uptime_ms, 1);
	json_u64(f, "connections", st->connections, 1);
	json_u64(f, "requests", st->requests, 1);
	json_u64(f, "errors", st->errors, 1);
	json_u64(f, "match_hits", st->match_hits, 1);
	json_u64(f, "match_misses", st->match_misses, 1);
	json_u64(f, "matched_tokens", st->matched_tokens, 1);
	json_u64(f, "appended_tokens", st->appended_tokens, 1);
	json_u64(f, "committed_tokens", st->committed_tokens, 1);
	json_u64(f, "evictions", st->evictions, 1);
	json_u64(f, "dedup_pages", st->dedup_pages, 1);
	json_u64(f, "purges", st->purges, 1);
	json_u64(f, "purged_pages", st->purged_pages, 1);
	json_u64(f, "disconnects_bad", st->disconnects_bad, 1);
	json_checkpoint_counters(f, st, 1);
	json_bool(f, "gpu", st->gpu, 1);
	json_string(f, "gpu_status", st->gpu_status, 1);
	json_pools(f, st);
	fputs("}\n", f);
}

static void print_pools_json(const char *path, int admin, const struct kvp_stats *st)
{
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_bool(f, "admin", admin, 1);
	json_pools(f, st);
	fputs("}\n", f);
}

static void print_sessions_json(const char *path, int admin, uint64_t pool_id,
				const struct kvp_session_info *ss, size_t n)
{
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_bool(f, "admin", admin, 1);
	if (pool_id)
		json_u64(f, "pool_id", pool_id, 1);
	json_key(f, "sessions");
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		const struct kvp_session_info *s = &ss[i];

		fputs(i ? ",{" : "{", f);
		json_u64(f, "session_id", s->session_id, 1);
		json_u64(f, "pool_id", s->pool_id, 1);
		json_u64(f, "uid", s->uid, 1);
		json_u64(f, "n_tokens", s->n_tokens, 1);
		json_u64(f, "committed_tokens", s->committed_tokens, 1);
		json_u64(f, "n_pages", s->n_pages, 1);
		json_u64(f, "shared_pages", s->shared_pages, 1);
		json_u64(f, "idle_ms", s->idle_ms, 1);
		json_bool(f, "writing", s->writing, 0);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* `status`: the daemon in a few lines — uptime, clients, host tier use,
 * GPU, hit rate. */
static void print_status(FILE *f, const char *path, int json, const struct kvp_stats *st)
{
	uint64_t pages = 0, free_pages = 0, hits = st->match_hits;
	uint64_t total = hits + st->match_misses;

	for (size_t i = 0; i < st->n_pools; i++) {
		pages += st->pools[i].n_pages;
		free_pages += st->pools[i].free_pages;
	}
	if (json) {
		fputc('{', f);
		json_string(f, "socket", path, 1);
		json_u64(f, "uptime_ms", st->uptime_ms, 1);
		json_u64(f, "connections", st->connections, 1);
		json_u64(f, "pools", st->n_pools, 1);
		json_u64(f, "host_pages", pages, 1);
		json_u64(f, "host_used_pages", pages - free_pages, 1);
		json_bool(f, "gpu", st->gpu, 1);
		json_u64(f, "match_hits", hits, 1);
		json_u64(f, "match_total", total, 1);
		json_checkpoint_counters(f, st, 0);
		fputs("}\n", f);
		return;
	}
	fprintf(f, "kvpalaced at %s: up %" PRIu64 " s, %" PRIu64 " connections\n", path,
		st->uptime_ms / 1000, st->connections);
	fprintf(f, "host tier: %zu pools, %" PRIu64 " of %" PRIu64 " pages used (%.1f%%)\n",
		st->n_pools, pages - free_pages, pages,
		pages ? 100.0 * (double)(pages - free_pages) / (double)pages : 0.0);
	fprintf(f, "gpu tier: %s%s%s%s\n", st->gpu ? "yes" : "no", st->gpu_status[0] ? " (" : "",
		st->gpu_status, st->gpu_status[0] ? ")" : "");
	if (total)
		fprintf(f, "prefix hit rate: %.1f%% (%" PRIu64 " of %" PRIu64 " matches)\n",
			100.0 * (double)hits / (double)total, hits, total);
	else
		fprintf(f, "prefix hit rate: no matches yet\n");
	fprintf(f,
		"checkpoints: %" PRIu64 " written, %" PRIu64 " restored, %" PRIu64
		" refused, %" PRIu64 " failed, %" PRIu64 " removed\n",
		st->checkpoints_written, st->checkpoints_restored, st->checkpoints_refused,
		st->checkpoint_failures, st->checkpoints_removed);
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
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_key(stdout, "rtt_us");
		printf("%.1f,", rtt);
		json_bool(stdout, "admin", kvp_is_admin(c), 0);
		fputs("}\n", stdout);
	} else {
		printf("pong from %s: round trip %.1f us, admin: %s\n",
		       printable(a->path, buf, sizeof(buf)), rtt, kvp_is_admin(c) ? "yes" : "no");
	}
	return 0;
}

int cmd_stats(kvp_client *c, const struct args *a)
{
	int admin = kvp_is_admin(c);
	struct kvp_stats *st;
	int ret;

	ret = kvp_stats(c, &st);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (!strcmp(a->name, "metrics"))
		print_metrics(stdout, a->path, a->json, st);
	else if (!strcmp(a->name, "status"))
		print_status(stdout, a->path, a->json, st);
	else if (!strcmp(a->name, "pools") && a->json)
		print_pools_json(a->path, admin, st);
	else if (!strcmp(a->name, "pools"))
		print_pools_text(st);
	else if (a->json)
		print_stats_json(a->path, admin, st);
	else
		print_stats_text(a->path, admin, st);
	kvp_stats_free(st);
	return 0;
}

int cmd_sessions(kvp_client *c, const struct args *a)
{
	struct kvp_session_info *ss;
	size_t n;
	int ret;

	ret = kvp_list_sessions(c, a->pool_id, &ss, &n);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json)
		print_sessions_json(a->path, kvp_is_admin(c), a->pool_id, ss, n);
	else
		print_sessions_text(ss, n);
	free(ss);
	return 0;
}
