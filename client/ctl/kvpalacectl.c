/* client/ctl/kvpalacectl.c — the control CLI of kvpalaced.
 *
 *   kvpalacectl [--socket PATH] [--json] COMMAND [ARGS] [OPTIONS]
 *   kvpalacectl help [COMMAND]          kvpalacectl COMMAND --help
 *
 * Talks to the daemon's admin socket (--socket, else $KVPALACE_ADMIN_SOCKET,
 * else kvp_default_admin_socket_path()) through the public client library
 * only. Views: `status`, `ping`, `stats`, `pools`, `sessions`, `metrics`,
 * `session show ID` and `checkpoints`; steering: `drop session ID`, `drop
 * pool ID`, `evict --tier TIER --bytes SIZE`, `purge ...`, `config show`, `config
 * reload`, `checkpoint SESSION_ID NAME`, `checkpoint rm NAME`, `restore
 * NAME`, `warmup NAME`.
 * Every command is described once, in the command table below, which
 * drives parsing (its operands and options), `help` and `--help`. With
 * --json each prints one JSON object instead of text (written by hand
 * here, with full string escaping, to need no JSON library); long
 * operations draw a progress bar (progress.h) when stdout is a terminal
 * and --json is not given: evict's moves with each request, as does
 * `checkpoints --verify`'s with each file verified, and the checkpoint
 * commands, which the daemon answers once the disk work is done, show a
 * spinner and the time waited.
 *
 * Exit status: 0 success, 1 the daemon refused or failed the request,
 * 2 usage error (a malformed checkpoint name included), 3 the daemon
 * cannot be reached (no socket, no permission, connection lost), 4 a
 * protocol error (a reply that does not decode).
 * Single-threaded, but for the spinner's drawing thread (progress.c).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpalace.h"
#include "progress.h"

#ifndef KVP_VERSION
#define KVP_VERSION "unknown"
#endif

#define EXIT_DAEMON  1 /* the daemon refused or failed the request */
#define EXIT_USAGE   2
#define EXIT_CONNECT 3 /* no daemon, no permission on the socket, connection lost */
#define EXIT_PROTO   4 /* a reply that does not decode: the two speak different protocols */

/* Page slots `session show` lists unless --pages says otherwise. */
#define SHOW_SLOTS_DEFAULT 16u
/* Pages one Evict request asks for: a long eviction is many requests, so
 * the daemon's loop never stalls and the progress bar moves. */
#define EVICT_CHUNK_PAGES 1024u

static const char *dtype_name(uint32_t dtype)
{
	switch (dtype) {
	case KVP_DTYPE_F16:
		return "f16";
	case KVP_DTYPE_BF16:
		return "bf16";
	case KVP_DTYPE_F32:
		return "f32";
	case KVP_DTYPE_INT8:
		return "int8";
	case KVP_DTYPE_FP8_E4M3:
		return "fp8-e4m3";
	case KVP_DTYPE_INT4:
		return "int4";
	default:
		return "?";
	}
}

/* ---- JSON output -------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not
 * one. */
static size_t utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		unsigned char lo = c == 0xe0 ? 0xa0 : 0x80;
		unsigned char hi = c == 0xed ? 0x9f : 0xbf;

		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80)
			return 0;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned char lo = c == 0xf0 ? 0x90 : 0x80;
		unsigned char hi = c == 0xf4 ? 0x8f : 0xbf;

		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

/* Writes s as a JSON string: quotes, backslashes and control characters
 * escaped, invalid UTF-8 replaced by U+FFFD. The NUL terminator stops every
 * continuation check above, so no read passes the end of s. */
static void json_str(FILE *f, const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	fputc('"', f);
	while (*s) {
		size_t n;

		switch (*s) {
		case '"':
			fputs("\\\"", f);
			s++;
			continue;
		case '\\':
			fputs("\\\\", f);
			s++;
			continue;
		case '\b':
			fputs("\\b", f);
			s++;
			continue;
		case '\f':
			fputs("\\f", f);
			s++;
			continue;
		case '\n':
			fputs("\\n", f);
			s++;
			continue;
		case '\r':
			fputs("\\r", f);
			s++;
			continue;
		case '\t':
			fputs("\\t", f);
			s++;
			continue;
		default:
			break;
		}
		if (*s < 0x20 || *s == 0x7f) {
			fprintf(f, "\\u%04x", *s);
			s++;
			continue;
		}
		n = utf8_len(s);
		if (!n) {
			fputs("\\ufffd", f);
			s++;
			continue;
		}
		fwrite(s, 1, n, f);
		s += n;
	}
	fputc('"', f);
}

static void json_key(FILE *f, const char *key)
{
	json_str(f, key);
	fputc(':', f);
}

static void json_u64(FILE *f, const char *key, uint64_t v, int comma)
{
	json_key(f, key);
	fprintf(f, "%" PRIu64 "%s", v, comma ? "," : "");
}

static void json_bool(FILE *f, const char *key, int v, int comma)
{
	json_key(f, key);
	fprintf(f, "%s%s", v ? "true" : "false", comma ? "," : "");
}

static void json_string(FILE *f, const char *key, const char *v, int comma)
{
	json_key(f, key);
	json_str(f, v);
	if (comma)
		fputc(',', f);
}

/* ---- text output -------------------------------------------------------- */

/* Copies s into buf replacing anything a terminal could act on. */
static const char *printable(const char *s, char *buf, size_t cap)
{
	size_t i = 0;

	for (; s[i] && i + 1 < cap; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	buf[i] = '\0';
	return buf;
}

static void layout_text(const struct kvp_layout *l, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%uL %uH %uD %uT %s", l->n_layers, l->n_kv_heads, l->head_dim,
			 l->block_tokens, dtype_name(l->dtype));

	if (l->quant_group && n > 0 && (size_t)n < cap)
		snprintf(buf + n, cap - (size_t)n, "/g%u", l->quant_group);
}

static void size_text(uint64_t bytes, char *buf, size_t cap)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned int u = 0;
	double v = (double)bytes;

	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0 || v == (double)(uint64_t)v)
		snprintf(buf, cap, "%.0f %s", v, units[u]);
	else
		snprintf(buf, cap, "%.1f %s", v, units[u]);
}

/* "1d 02:03:04"-style text is for uptime; idle times read better as the
 * two largest units: 850ms, 12.5s, 4m07s, 3h25m, 2d07h. */
static void idle_text(uint64_t ms, char *buf, size_t cap)
{
	uint64_t s = ms / 1000;

	if (ms < 1000)
		snprintf(buf, cap, "%" PRIu64 "ms", ms);
	else if (s < 60)
		snprintf(buf, cap, "%" PRIu64 ".%" PRIu64 "s", s, ms % 1000 / 100);
	else if (s < 3600)
		snprintf(buf, cap, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, cap, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else
		snprintf(buf, cap, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
}

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

/* "layout":{...}, with its comma. */
static void json_layout(FILE *f, const struct kvp_layout *l)
{
	json_key(f, "layout");
	fputc('{', f);
	json_u64(f, "n_layers", l->n_layers, 1);
	json_u64(f, "n_kv_heads", l->n_kv_heads, 1);
	json_u64(f, "head_dim", l->head_dim, 1);
	json_u64(f, "block_tokens", l->block_tokens, 1);
	json_string(f, "dtype", dtype_name(l->dtype), 1);
	json_u64(f, "quant_group", l->quant_group, 0);
	fputs("},", f);
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

/* Prometheus label value: backslash, quote and newline escaped. */
static void prom_label(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*v, f);
	}
}

/* The metrics in either form: the Prometheus text exposition format, or
 * with --json {"metrics":[{"name","type","help","samples":[{"labels",
 * "value"}]}]}. */
struct metrics_out {
	FILE *f;
	int json;
	unsigned int families; /* begun so far */
	unsigned int samples;  /* in the current family */
};

static void metrics_family(struct metrics_out *m, const char *name, const char *type,
			   const char *help)
{
	FILE *f = m->f;

	if (!m->json) {
		fprintf(f, "# HELP kvpalace_%s %s\n# TYPE kvpalace_%s %s\n", name, help, name,
			type);
		m->families++;
		return;
	}
	fputs(m->families ? "]},{" : "{", f);
	fprintf(f, "\"name\":\"kvpalace_%s\",", name);
	json_string(f, "type", type, 1);
	json_string(f, "help", help, 1);
	json_key(f, "samples");
	fputc('[', f);
	m->families++;
	m->samples = 0;
}

/* One sample of the current family; value is a number's text, pool the
 * pool whose labels it carries, or NULL. */
static void metrics_sample(struct metrics_out *m, const char *name,
			   const struct kvp_pool_stats *pool, const char *value)
{
	FILE *f = m->f;

	if (!m->json) {
		fprintf(f, "kvpalace_%s", name);
		if (pool) {
			fprintf(f, "{pool=\"%" PRIu64 "\",uid=\"%u\",model=\"", pool->pool_id,
				pool->uid);
			prom_label(f, pool->model_id);
			fputs("\"}", f);
		}
		fprintf(f, " %s\n", value);
		return;
	}
	fputs(m->samples++ ? ",{" : "{", f);
	json_key(f, "labels");
	fputc('{', f);
	if (pool) {
		char id[24], uid[16];

		snprintf(id, sizeof(id), "%" PRIu64, pool->pool_id);
		snprintf(uid, sizeof(uid), "%u", pool->uid);
		json_string(f, "pool", id, 1);
		json_string(f, "uid", uid, 1);
		json_string(f, "model", pool->model_id, 0);
	}
	fputs("},", f);
	json_key(f, "value");
	fprintf(f, "%s}", value);
}

/* `metrics`: the Stats reply as metrics. */
static void print_metrics(FILE *f, const char *path, int json, const struct kvp_stats *st)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} daemon_metrics[] = {
		{"uptime_seconds", "gauge", "Seconds since kvpalaced started.", 0},
		{"connections", "gauge", "Client connections open now.",
		 offsetof(struct kvp_stats, connections)},
		{"requests_total", "counter", "Requests served.",
		 offsetof(struct kvp_stats, requests)},
		{"errors_total", "counter", "Requests answered with an error.",
		 offsetof(struct kvp_stats, errors)},
		{"match_hits_total", "counter", "Prefix matches that found at least one page.",
		 offsetof(struct kvp_stats, match_hits)},
		{"match_misses_total", "counter", "Prefix matches that found nothing.",
		 offsetof(struct kvp_stats, match_misses)},
		{"matched_tokens_total", "counter", "Tokens served from the cache.",
		 offsetof(struct kvp_stats, matched_tokens)},
		{"appended_tokens_total", "counter", "Tokens reserved by Append.",
		 offsetof(struct kvp_stats, appended_tokens)},
		{"committed_tokens_total", "counter", "Tokens published by Commit.",
		 offsetof(struct kvp_stats, committed_tokens)},
		{"evicted_pages_total", "counter", "Cached pages evicted.",
		 offsetof(struct kvp_stats, evictions)},
		{"dedup_pages_total", "counter", "Committed pages replaced by an indexed copy.",
		 offsetof(struct kvp_stats, dedup_pages)},
		{"purges_total", "counter", "Admin purges served.",
		 offsetof(struct kvp_stats, purges)},
		{"purged_pages_total", "counter",
		 "Index pages admin purges and drops forgot, in every tier.",
		 offsetof(struct kvp_stats, purged_pages)},
		{"bad_disconnects_total", "counter", "Connections closed for misbehaviour.",
		 offsetof(struct kvp_stats, disconnects_bad)},
		{"checkpoints_written_total", "counter", "Checkpoints written.",
		 offsetof(struct kvp_stats, checkpoints_written)},
		{"checkpoints_restored_total", "counter",
		 "Checkpoints restored into a session or warmed up.",
		 offsetof(struct kvp_stats, checkpoints_restored)},
		{"checkpoints_refused_total", "counter",
		 "Checkpoint files refused: corrupt, truncated, foreign or newer.",
		 offsetof(struct kvp_stats, checkpoints_refused)},
		{"checkpoint_failures_total", "counter",
		 "Checkpoint writes that failed (disk full, I/O error).",
		 offsetof(struct kvp_stats, checkpoint_failures)},
		{"warmed_up_pages_total", "counter", "Pages loaded into prefix indexes by warm-up.",
		 offsetof(struct kvp_stats, warmed_up_pages)},
		{"checkpoints_removed_total", "counter", "Checkpoints removed.",
		 offsetof(struct kvp_stats, checkpoints_removed)},
		{"restore_waits_total", "counter",
		 "Restores that waited for the host tier to write cached pages out.",
		 offsetof(struct kvp_stats, restore_waits)},
	};
	static const struct {
		const char *name, *help;
	} pool_metrics[] = {
		{"pool_pages", "Pages in the pool's host arena."},
		{"pool_free_pages", "Free pages."},
		{"pool_indexed_pages", "Pages held by the prefix index."},
		{"pool_evictable_pages", "Indexed pages eviction may take."},
		{"pool_leased_pages", "Pages pinned by read leases."},
		{"pool_sessions", "Sessions in the pool."},
	};
	struct metrics_out m = {.f = f, .json = json};
	char value[32];

	if (json) {
		fputc('{', f);
		json_string(f, "socket", path, 1);
		json_key(f, "metrics");
		fputc('[', f);
	}
	for (size_t i = 0; i < sizeof(daemon_metrics) / sizeof(daemon_metrics[0]); i++) {
		uint64_t v;

		metrics_family(&m, daemon_metrics[i].name, daemon_metrics[i].type,
			       daemon_metrics[i].help);
		if (i == 0) {
			snprintf(value, sizeof(value), "%.3f", (double)st->uptime_ms / 1000.0);
		} else {
			memcpy(&v, (const char *)st + daemon_metrics[i].off, sizeof(v));
			snprintf(value, sizeof(value), "%" PRIu64, v);
		}
		metrics_sample(&m, daemon_metrics[i].name, NULL, value);
	}
	metrics_family(&m, "gpu", "gauge", "1 when a GPU tier is available.");
	metrics_sample(&m, "gpu", NULL, st->gpu ? "1" : "0");
	for (size_t k = 0; k < sizeof(pool_metrics) / sizeof(pool_metrics[0]); k++) {
		metrics_family(&m, pool_metrics[k].name, "gauge", pool_metrics[k].help);
		for (size_t i = 0; i < st->n_pools; i++) {
			const struct kvp_pool_stats *p = &st->pools[i];
			uint64_t v[] = {p->n_pages,	    p->free_pages,   p->indexed_pages,
					p->evictable_pages, p->leased_pages, p->n_sessions};

			snprintf(value, sizeof(value), "%" PRIu64, v[k]);
			metrics_sample(&m, pool_metrics[k].name, p, value);
		}
	}
	if (json)
		fputs("]}]}\n", f);
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

/* ---- commands ----------------------------------------------------------- */

/* Options a command may take besides --socket, --json and --help. */
enum {
	OPT_POOL = 1u << 0,
	OPT_TIER = 1u << 1,
	OPT_BYTES = 1u << 2,
	OPT_FORCE = 1u << 3,
	OPT_PAGES = 1u << 4,
	OPT_UID = 1u << 5,
	OPT_VERIFY = 1u << 6,
	OPT_DISCARD = 1u << 7,
	OPT_MODEL = 1u << 8,
	OPT_SALT = 1u << 9,
	OPT_UNUSED = 1u << 10,
	OPT_LAST = OPT_UNUSED,
};

/* The command line, parsed. */
struct args {
	const char *path; /* the admin socket */
	int json;
	unsigned int given;	/* OPT_* seen */
	uint64_t pool_id;	/* --pool */
	uint32_t tier;		/* --tier, enum kvp_tier */
	uint64_t bytes;		/* --bytes; KVP_EVICT_ALL for "all" */
	uint32_t pages;		/* --pages */
	uint32_t uid;		/* --uid */
	const char *model;	/* --model */
	unsigned char salt[64]; /* --salt, --salt-hex */
	size_t salt_len;
	int64_t unused_since; /* --unused-since, time(2) seconds */
	uint64_t id;	      /* the ID operand */
	const char *ckpt;     /* the NAME operand: a checkpoint name */
	const char *name;     /* the command's name */
};

/* Says why a call failed and picks the exit status: 3 when the daemon
 * cannot be reached any more, 4 when its reply made no sense to us (or our
 * request none to it: a version skew or a bug, not a refusal), 1 when it
 * refused or failed. */
static int fail(kvp_client *c, const char *what, int err)
{
	fprintf(stderr, "kvpalacectl: %s: %s\n", what, kvp_strerror(c, err));
	if (err == -ENOTCONN || err == -EPIPE || err == -ECONNRESET)
		return EXIT_CONNECT;
	if (err == -EPROTO || err == -EPROTONOSUPPORT)
		return EXIT_PROTO;
	return EXIT_DAEMON;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int cmd_ping(kvp_client *c, const struct args *a)
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

/* `status`, `stats`, `pools` and `metrics`: views of one Stats reply. */
static int cmd_stats(kvp_client *c, const struct args *a)
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

static int cmd_sessions(kvp_client *c, const struct args *a)
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

static void json_u32_array(FILE *f, const char *key, const uint32_t *v, size_t n, int comma)
{
	json_key(f, key);
	fputc('[', f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%" PRIu32, i ? "," : "", v[i]);
	fprintf(f, "]%s", comma ? "," : "");
}

static const char *policy_name(uint32_t kind)
{
	static const char *const names[] = {"none", "window", "sinks", "importance", "hierarchy"};

	return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

static void print_session_json(const char *path, const struct kvp_session_detail *d)
{
	const struct kvp_session_info *s = &d->info;
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_u64(f, "session_id", s->session_id, 1);
	json_u64(f, "pool_id", s->pool_id, 1);
	json_u64(f, "uid", s->uid, 1);
	json_string(f, "model_id", d->model_id, 1);
	json_layout(f, &d->layout);
	json_u64(f, "n_tokens", s->n_tokens, 1);
	json_u64(f, "committed_tokens", s->committed_tokens, 1);
	json_u64(f, "n_pages", s->n_pages, 1);
	json_u64(f, "shared_pages", s->shared_pages, 1);
	json_u64(f, "reserved_pages", d->reserved_pages, 1);
	json_u64(f, "idle_ms", s->idle_ms, 1);
	json_bool(f, "writing", s->writing, 1);
	json_key(f, "writer_pid");
	if (d->writer_pid)
		fprintf(f, "%" PRIu32 ",", d->writer_pid);
	else
		fputs("null,", f);
	json_bool(f, "salted", d->salted, 1);
	json_string(f, "policy", policy_name(d->policy), 1);
	json_u64(f, "budget", d->budget, 1);
	json_bool(f, "compacted", d->compacted, 1);
	json_u64(f, "dropped_tokens", d->dropped_tokens, 1);
	json_u32_array(f, "page_slots", d->page_slots, d->n_page_slots, 1);
	json_u32_array(f, "page_holders", d->page_holders, d->n_page_slots, 0);
	fputs("}\n", f);
}

static void print_session_text(const struct kvp_session_detail *d)
{
	const struct kvp_session_info *s = &d->info;
	char model[sizeof(d->model_id)], layout[128], idle[32];

	layout_text(&d->layout, layout, sizeof(layout));
	idle_text(s->idle_ms, idle, sizeof(idle));
	printf("session %" PRIu64 "\n", s->session_id);
	printf("  %-12s %" PRIu64 " (uid %u, model %s, %s)\n", "pool", s->pool_id, s->uid,
	       printable(d->model_id, model, sizeof(model)), layout);
	printf("  %-12s %" PRIu64 " (%" PRIu64 " committed, %" PRIu64 " reserved)\n", "tokens",
	       s->n_tokens, s->committed_tokens, s->n_tokens - s->committed_tokens);
	printf("  %-12s %u (%u shared with another holder, %u holding only reserved tokens)\n",
	       "pages", s->n_pages, s->shared_pages, d->reserved_pages);
	if (d->writer_pid)
		printf("  %-12s pid %" PRIu32 " holds uncommitted tokens\n", "writer",
		       d->writer_pid);
	else
		printf("  %-12s none\n", "writer");
	printf("  %-12s %s\n", "idle", idle);
	printf("  %-12s %s\n", "cache salt", d->salted ? "yes" : "no");
	if (d->policy)
		printf("  %-12s %s, budget %u tokens%s (%" PRIu64 " dropped)\n", "policy",
		       policy_name(d->policy), d->budget, d->compacted ? ", compacted" : "",
		       d->dropped_tokens);
	else
		printf("  %-12s none (exact)\n", "policy");
	printf("  %-12s", "page slots");
	if (!d->n_page_slots)
		printf(" none");
	for (size_t i = 0; i < d->n_page_slots; i++)
		printf(" %" PRIu32 "(%" PRIu32 ")", d->page_slots[i], d->page_holders[i]);
	if (d->n_page_slots < s->n_pages)
		printf(" ... (%zu of %u)", d->n_page_slots, s->n_pages);
	printf("\n  %-12s slot(holders) of pages 0..; holders: sessions, leases, the prefix "
	       "index\n",
	       "");
}

static int cmd_session_show(kvp_client *c, const struct args *a)
{
	struct kvp_session_detail *d;
	int ret;

	ret = kvp_admin_show_session(c, a->id, a->given & OPT_PAGES ? a->pages : SHOW_SLOTS_DEFAULT,
				     &d);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json)
		print_session_json(a->path, d);
	else
		print_session_text(d);
	free(d);
	return 0;
}

static const char *plural(uint64_t n)
{
	return n == 1 ? "" : "s";
}

static int cmd_drop_session(kvp_client *c, const struct args *a)
{
	struct kvp_drop_session_result r;
	int ret;

	ret = kvp_admin_drop_session(c, a->id, a->given & OPT_FORCE ? KVP_DROP_FORCE : 0, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "dropped", "session", 1);
		json_u64(stdout, "session_id", r.session_id, 1);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "n_tokens", r.n_tokens, 1);
		json_u64(stdout, "committed_tokens", r.committed_tokens, 1);
		json_u64(stdout, "freed_pages", r.freed_pages, 1);
		json_bool(stdout, "was_writing", r.was_writing, 0);
		fputs("}\n", stdout);
		return 0;
	}
	printf("dropped session %" PRIu64 " of pool %" PRIu64 ": %" PRIu64 " tokens (%" PRIu64
	       " committed), %u page%s freed%s; its cached pages no other session or lease "
	       "holds are forgotten in every tier\n",
	       r.session_id, r.pool_id, r.n_tokens, r.committed_tokens, r.freed_pages,
	       plural(r.freed_pages),
	       r.was_writing ? "; a writer's uncommitted tokens were rolled back" : "");
	return 0;
}

static int cmd_drop_pool(kvp_client *c, const struct args *a)
{
	struct kvp_drop_pool_result r;
	char model[sizeof(r.model_id)], size[32];
	int ret;

	ret = kvp_admin_drop_pool(c, a->id, a->given & OPT_FORCE ? KVP_DROP_FORCE : 0, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "dropped", "pool", 1);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "uid", r.uid, 1);
		json_string(stdout, "model_id", r.model_id, 1);
		json_u64(stdout, "sessions_closed", r.sessions_closed, 1);
		json_u64(stdout, "leases_released", r.leases_released, 1);
		json_u64(stdout, "arena_bytes", r.arena_bytes, 0);
		fputs("}\n", stdout);
		return 0;
	}
	size_text(r.arena_bytes, size, sizeof(size));
	printf("dropped pool %" PRIu64 " (uid %u, model %s): %u session%s closed, %u lease%s "
	       "released, %s of host tier freed, its spill file (if any) removed\n",
	       r.pool_id, r.uid, printable(r.model_id, model, sizeof(model)), r.sessions_closed,
	       plural(r.sessions_closed), r.leases_released, plural(r.leases_released), size);
	return 0;
}

static const char *tier_name(uint32_t tier)
{
	switch (tier) {
	case KVP_TIER_GPU:
		return "gpu";
	case KVP_TIER_HOST:
		return "host";
	case KVP_TIER_DISK:
		return "disk";
	default:
		return "?";
	}
}

/* Adds one request's per-pool figures to the running totals in *sum (n
 * used, cap allocated). Returns 0 or -ENOMEM. */
static int evict_add(struct kvp_evicted_pool **sum, size_t *n, size_t *cap,
		     const struct kvp_evict_result *r)
{
	for (size_t i = 0; i < r->n_pools; i++) {
		size_t j = 0;

		while (j < *n && (*sum)[j].pool_id != r->pools[i].pool_id)
			j++;
		if (j == *n) {
			if (*n == *cap) {
				size_t want = *cap ? *cap * 2 : 16;
				struct kvp_evicted_pool *p = realloc(*sum, want * sizeof(*p));

				if (!p)
					return -ENOMEM;
				*sum = p;
				*cap = want;
			}
			(*sum)[j] = (struct kvp_evicted_pool){.pool_id = r->pools[i].pool_id};
			(*n)++;
		}
		(*sum)[j].pages += r->pools[i].pages;
		(*sum)[j].bytes += r->pools[i].bytes;
	}
	return 0;
}

/* Bytes the prefix index holds in the pools evict may touch: the most an
 * eviction can free, for the progress bar. 0 when unknown. */
static uint64_t indexed_bytes(kvp_client *c, uint64_t pool_id)
{
	struct kvp_stats *st;
	uint64_t sum = 0;

	if (kvp_stats(c, &st) < 0)
		return 0;
	for (size_t i = 0; i < st->n_pools; i++)
		if (!pool_id || st->pools[i].pool_id == pool_id)
			sum += (uint64_t)st->pools[i].indexed_pages * st->pools[i].page_bytes;
	kvp_stats_free(st);
	return sum;
}

static int cmd_evict(kvp_client *c, const struct args *a)
{
	struct kvp_evicted_pool *sum = NULL;
	size_t n = 0, cap = 0;
	uint64_t left = a->bytes, pages = 0, bytes = 0, demoted = 0, dropped = 0, total;
	struct progress pg;
	char size[32], asked[32];
	int ret = 0;

	if ((a->given & OPT_DISCARD) && a->tier != KVP_TIER_HOST)
		return usage_error("--discard goes with --tier host only");
	/* The bar's 100 %: what was asked, or what the index holds if less. */
	total = a->tier == KVP_TIER_HOST ? indexed_bytes(c, a->pool_id) : 0;
	if (a->bytes != KVP_EVICT_ALL && (!total || a->bytes < total))
		total = a->bytes;
	progress_start(&pg, stdout, !a->json && progress_wanted(stdout), "evicting", total, 1);
	for (;;) {
		struct kvp_evict_result *r;

		ret = kvp_admin_evict_flags(c, a->tier, a->pool_id, left, EVICT_CHUNK_PAGES,
					    a->given & OPT_DISCARD ? KVP_EVICT_DISCARD : 0, &r);
		if (ret < 0)
			break;
		ret = evict_add(&sum, &n, &cap, r);
		pages += r->pages;
		bytes += r->bytes;
		demoted += r->demoted;
		dropped += r->dropped;
		if (left != KVP_EVICT_ALL)
			left -= r->bytes < left ? r->bytes : left;
		progress_update(&pg, bytes);
		if (ret < 0 || !r->more || !r->pages || !left) {
			free(r);
			break;
		}
		free(r);
	}
	progress_end(&pg);
	if (ret < 0) {
		free(sum);
		ret = fail(c, a->name, ret);
		if (pages)
			fprintf(stderr,
				"kvpalacectl: %s: %" PRIu64 " pages were evicted before that\n",
				a->name, pages);
		return ret;
	}
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "tier", tier_name(a->tier), 1);
		json_key(stdout, "pool_id");
		if (a->pool_id)
			printf("%" PRIu64 ",", a->pool_id);
		else
			fputs("null,", stdout);
		json_key(stdout, "max_bytes");
		if (a->bytes != KVP_EVICT_ALL)
			printf("%" PRIu64 ",", a->bytes);
		else
			fputs("null,", stdout);
		json_u64(stdout, "pages", pages, 1);
		json_u64(stdout, "bytes", bytes, 1);
		if (a->tier != KVP_TIER_GPU) {
			json_u64(stdout, "demoted", demoted, 1);
			json_u64(stdout, "dropped", dropped, 1);
		}
		json_key(stdout, "pools");
		fputc('[', stdout);
		for (size_t i = 0; i < n; i++) {
			fputs(i ? ",{" : "{", stdout);
			json_u64(stdout, "pool_id", sum[i].pool_id, 1);
			json_u64(stdout, "pages", sum[i].pages, 1);
			json_u64(stdout, "bytes", sum[i].bytes, 0);
			fputc('}', stdout);
		}
		fputs("]}\n", stdout);
	} else {
		size_text(bytes, size, sizeof(size));
		if (a->bytes != KVP_EVICT_ALL)
			size_text(a->bytes, asked, sizeof(asked));
		printf("evicted %" PRIu64 " page%s (%s) from the %s tier%s%s%s", pages,
		       plural(pages), size, tier_name(a->tier),
		       a->bytes != KVP_EVICT_ALL ? " (at most " : "",
		       a->bytes != KVP_EVICT_ALL ? asked : "",
		       a->bytes != KVP_EVICT_ALL ? " asked)" : "");
		if (a->tier == KVP_TIER_HOST)
			printf(": %" PRIu64 " demoted to the disk tier, %" PRIu64 " dropped",
			       demoted, dropped);
		else if (a->tier == KVP_TIER_DISK)
			printf(": %" PRIu64 " kept in the host tier, %" PRIu64 " dropped",
			       pages - dropped, dropped);
		printf("\n");
		for (size_t i = 0; i < n; i++) {
			size_text(sum[i].bytes, size, sizeof(size));
			printf("  pool %-6" PRIu64 " %8" PRIu64 " page%s %12s\n", sum[i].pool_id,
			       sum[i].pages, plural(sum[i].pages), size);
		}
	}
	free(sum);
	return 0;
}

static int cmd_purge(kvp_client *c, const struct args *a)
{
	struct kvp_purge_spec spec = {0};
	struct kvp_purge_result r;
	int ret;

	if (a->given & OPT_POOL) {
		spec.flags |= KVP_PURGE_POOL;
		spec.pool_id = a->pool_id;
	}
	if (a->given & OPT_UID) {
		spec.flags |= KVP_PURGE_UID;
		spec.uid = a->uid;
	}
	if (a->given & OPT_MODEL) {
		spec.flags |= KVP_PURGE_MODEL;
		spec.model_id = a->model;
	}
	if (a->given & OPT_SALT) {
		spec.flags |= KVP_PURGE_SALT;
		spec.salt = a->salt;
		spec.salt_len = a->salt_len;
	}
	if (a->given & OPT_UNUSED) {
		spec.flags |= KVP_PURGE_UNUSED_SINCE;
		spec.unused_since = a->unused_since;
	}
	if (!spec.flags) {
		fprintf(stderr, "kvpalacectl: purge wants at least one of --pool, --uid, --model, "
				"--salt, --salt-hex, --unused-since\n");
		return EXIT_USAGE;
	}
	ret = kvp_admin_purge(c, &spec, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_u64(stdout, "pages", r.pages, 1);
		json_u64(stdout, "pools", r.pools, 1);
		json_u64(stdout, "host_pages", r.host_pages, 1);
		json_u64(stdout, "disk_pages", r.disk_pages, 1);
		json_u64(stdout, "device_pages", r.device_pages, 1);
		json_u64(stdout, "held_pages", r.held_pages, 1);
		json_u64(stdout, "sessions_marked", r.sessions_marked, 0);
		fputs("}\n", stdout);
		return 0;
	}
	printf("purged %" PRIu64 " page%s from %u pool%s: %" PRIu64 " in the host tier, %" PRIu64
	       " on disk (invalidated and synced), %" PRIu64 " GPU cop%s\n",
	       r.pages, plural(r.pages), r.pools, plural(r.pools), r.host_pages, r.disk_pages,
	       r.device_pages, r.device_pages == 1 ? "y" : "ies");
	if (r.held_pages)
		printf("  %" PRIu64
		       " page%s still held by sessions or leases, freed when they end; "
		       "%u session%s will index nothing more\n",
		       r.held_pages, plural(r.held_pages), r.sessions_marked,
		       plural(r.sessions_marked));
	return 0;
}

static int cmd_config_show(kvp_client *c, const struct args *a)
{
	struct kvp_config *cfg;
	char buf[4200], src[64];
	int ret;

	ret = kvp_admin_config_show(c, &cfg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_key(stdout, "file");
		if (cfg->file)
			json_str(stdout, cfg->file);
		else
			fputs("null", stdout);
		fputc(',', stdout);
		json_key(stdout, "preset");
		if (cfg->preset)
			json_str(stdout, cfg->preset);
		else
			fputs("null", stdout);
		fputc(',', stdout);
		json_bool(stdout, "truncated", cfg->truncated, 1);
		json_key(stdout, "config");
		fputc('{', stdout);
		for (size_t i = 0; i < cfg->n_entries; i++) {
			if (i)
				fputc(',', stdout);
			json_key(stdout, cfg->entries[i].key);
			fputc('{', stdout);
			json_string(stdout, "value", cfg->entries[i].value, 1);
			json_string(stdout, "source", cfg->entries[i].source, 0);
			fputc('}', stdout);
		}
		fputs("}}\n", stdout);
		free(cfg);
		return 0;
	}
	/* As kvpalaced --print-config prints it. */
	printf("# kvpalaced effective configuration");
	if (cfg->file)
		printf("; file %s", printable(cfg->file, buf, sizeof(buf)));
	if (cfg->preset)
		printf("; preset %s", printable(cfg->preset, buf, sizeof(buf)));
	printf("\n");
	for (size_t i = 0; i < cfg->n_entries; i++) {
		char key[64];

		printf("%-22s = ", printable(cfg->entries[i].key, key, sizeof(key)));
		printf("%-40s", printable(cfg->entries[i].value, buf, sizeof(buf)));
		printf(" # %s\n", printable(cfg->entries[i].source, src, sizeof(src)));
	}
	if (cfg->truncated)
		printf("# (more keys than fit in one reply)\n");
	free(cfg);
	return 0;
}

static void json_str_array(FILE *f, const char *key, const char *const *v, size_t n, int comma)
{
	json_key(f, key);
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		if (i)
			fputc(',', f);
		json_str(f, v[i]);
	}
	fprintf(f, "]%s", comma ? "," : "");
}

static int cmd_config_reload(kvp_client *c, const struct args *a)
{
	struct kvp_config_reload *r;
	char buf[64];
	int ret;

	ret = kvp_admin_config_reload(c, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_bool(stdout, "reloaded", 1, 1);
		json_str_array(stdout, "changed", r->changed, r->n_changed, 1);
		json_str_array(stdout, "restart_needed", r->restart_needed, r->n_restart_needed, 0);
		fputs("}\n", stdout);
		free(r);
		return 0;
	}
	printf("configuration reloaded: ");
	if (!r->n_changed)
		printf("nothing changed");
	for (size_t i = 0; i < r->n_changed; i++)
		printf("%s%s", i ? ", " : "changed ", printable(r->changed[i], buf, sizeof(buf)));
	printf("\n");
	if (r->n_restart_needed) {
		printf("a restart is needed for:");
		for (size_t i = 0; i < r->n_restart_needed; i++)
			printf(" %s", printable(r->restart_needed[i], buf, sizeof(buf)));
		printf("\n");
	}
	free(r);
	return 0;
}

/* ---- checkpoints -------------------------------------------------------- */

/* "YYYY-MM-DD HH:MM:SS" in local time, or "-" for 0. */
static void time_text(uint64_t unix_ms, char *buf, size_t cap)
{
	time_t t = (time_t)(unix_ms / 1000);
	struct tm tm;

	if (!unix_ms || !localtime_r(&t, &tm) || !strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(buf, cap, "-");
}

/* "uid":U, or "uid":null without --uid; with its comma. */
static void json_uid_opt(FILE *f, const struct args *a)
{
	json_key(f, "uid");
	if (a->given & OPT_UID)
		fprintf(f, "%" PRIu32 ",", a->uid);
	else
		fputs("null,", f);
}

/* Starts the spinner of a command the daemon answers once, on a terminal
 * without --json. */
static void wait_start(struct progress *pg, const struct args *a, const char *label)
{
	progress_wait_start(pg, stdout, !a->json && progress_wanted(stdout), label);
}

static int cmd_checkpoint(kvp_client *c, const struct args *a)
{
	struct progress pg;
	uint64_t bytes;
	char size[32];
	int ret;

	wait_start(&pg, a, "checkpointing");
	ret = kvp_admin_checkpoint(c, a->id, a->ckpt, &bytes);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_u64(stdout, "session_id", a->id, 1);
		json_string(stdout, "name", a->ckpt, 1);
		json_u64(stdout, "bytes", bytes, 0);
		fputs("}\n", stdout);
		return 0;
	}
	size_text(bytes, size, sizeof(size));
	printf("checkpointed session %" PRIu64 " as %s (%s written)\n", a->id, a->ckpt, size);
	return 0;
}

static int cmd_restore(kvp_client *c, const struct args *a)
{
	struct kvp_restore_info r;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "restoring");
	ret = kvp_admin_restore(c, a->ckpt, !!(a->given & OPT_UID), a->uid, a->pool_id, &r);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "name", a->ckpt, 1);
		json_uid_opt(stdout, a);
		json_u64(stdout, "session_id", r.session_id, 1);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "n_tokens", r.n_tokens, 1);
		json_u64(stdout, "n_pages", r.n_pages, 1);
		json_u64(stdout, "shared_pages", r.shared_pages, 0);
		fputs("}\n", stdout);
		return 0;
	}
	printf("restored %s as session %" PRIu64 " of pool %" PRIu64 ": %" PRIu64
	       " token%s in %u page%s, %u of them already in the prefix index\n",
	       a->ckpt, r.session_id, r.pool_id, r.n_tokens, plural(r.n_tokens), r.n_pages,
	       plural(r.n_pages), r.shared_pages);
	return 0;
}

static int cmd_warmup(kvp_client *c, const struct args *a)
{
	struct kvp_warmup_info r;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "warming up");
	ret = kvp_admin_warmup(c, a->ckpt, !!(a->given & OPT_UID), a->uid, &r);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "name", a->ckpt, 1);
		json_uid_opt(stdout, a);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "n_tokens", r.n_tokens, 1);
		json_u64(stdout, "indexed_pages", r.indexed_pages, 1);
		json_u64(stdout, "shared_pages", r.shared_pages, 0);
		fputs("}\n", stdout);
		return 0;
	}
	printf("warmed up %s: %" PRIu64 " token%s, %u full page%s in the prefix index of pool "
	       "%" PRIu64 " (%u there already)\n",
	       a->ckpt, r.n_tokens, plural(r.n_tokens), r.indexed_pages, plural(r.indexed_pages),
	       r.pool_id, r.shared_pages);
	return 0;
}

static void print_checkpoints_json(const char *path, const struct args *a,
				   const struct kvp_checkpoint_list *l)
{
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_uid_opt(f, a);
	json_bool(f, "truncated", l->truncated, 1);
	json_key(f, "checkpoints");
	fputc('[', f);
	for (size_t i = 0; i < l->n_entries; i++) {
		const struct kvp_checkpoint_info *e = &l->entries[i];

		fputs(i ? ",{" : "{", f);
		json_string(f, "name", e->name, 1);
		json_u64(f, "uid", e->uid, 1);
		if (e->error) {
			/* What the file would hold is unknown. */
			fputs("\"model_id\":null,\"layout\":null,\"n_tokens\":null,", f);
		} else {
			json_string(f, "model_id", e->model_id, 1);
			json_layout(f, &e->layout);
			json_u64(f, "n_tokens", e->n_tokens, 1);
		}
		json_key(f, "bytes");
		fprintf(f, e->bytes || !e->error ? "%" PRIu64 "," : "null,", e->bytes);
		json_key(f, "created_unix_ms");
		fprintf(f, e->created_unix_ms || !e->error ? "%" PRIu64 "," : "null,",
			e->created_unix_ms);
		json_u64(f, "format_version", e->format_version, 1);
		json_bool(f, "verified", e->verified, 1);
		json_key(f, "error");
		if (e->error)
			json_str(f, e->error);
		else
			fputs("null", f);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

static void print_checkpoints_text(const struct kvp_checkpoint_list *l)
{
	int wname = (int)strlen("NAME"), wmodel = (int)strlen("MODEL");
	char model[128], size[32], when[32], why[256];

	if (!l->n_entries) {
		printf("no checkpoints\n");
		return;
	}
	for (size_t i = 0; i < l->n_entries; i++) {
		int n = (int)strlen(l->entries[i].name);

		if (n > wname)
			wname = n;
		n = (int)strlen(l->entries[i].model_id);
		if (n > wmodel)
			wmodel = n;
	}
	printf("%-*s %-6s %-*s %10s %10s  %-19s  %s\n", wname, "NAME", "UID", wmodel, "MODEL",
	       "TOKENS", "SIZE", "CREATED", "CHECKED");
	for (size_t i = 0; i < l->n_entries; i++) {
		const struct kvp_checkpoint_info *e = &l->entries[i];

		/* Names are checked by the library: nothing to escape. */
		if (e->error) {
			printf("%-*s %-6u cannot be restored: %s\n", wname, e->name, e->uid,
			       printable(e->error, why, sizeof(why)));
			continue;
		}
		size_text(e->bytes, size, sizeof(size));
		time_text(e->created_unix_ms, when, sizeof(when));
		/* A listing reads headers only unless --verify: say so, a
		 * damaged page shows only when the pages are read. */
		printf("%-*s %-6u %-*s %10" PRIu64 " %10s  %-19s  %s%s\n", wname, e->name, e->uid,
		       wmodel, printable(e->model_id, model, sizeof(model)), e->n_tokens, size,
		       when,
		       e->verified ? "every page verified" : "header valid, pages not checked",
		       e->format_version && e->format_version < 3
			       ? " (old format: its name is not recorded)"
			       : "");
	}
	if (l->truncated)
		printf("(more checkpoints exist than fit in one reply)\n");
}

/* Verifies each listed checkpoint that the header check passed, one
 * request per file so a bar can show the bytes read (on a terminal),
 * and copies each verdict into l. The verdicts' lists go to *ret_keep
 * (their strings are what l's entries point at now). */
static int verify_each(kvp_client *c, const struct args *a, struct kvp_checkpoint_list *l,
		       struct kvp_checkpoint_list ***ret_keep)
{
	struct kvp_checkpoint_list **keep = calloc(l->n_entries ? l->n_entries : 1, sizeof(*keep));
	uint64_t total = 0, done = 0;
	struct progress pg;
	int ret = 0;

	if (!keep)
		return -ENOMEM;
	for (size_t i = 0; i < l->n_entries; i++)
		total += l->entries[i].error ? 0 : l->entries[i].bytes;
	progress_start(&pg, stdout, !a->json && progress_wanted(stdout), "verifying", total, 1);
	for (size_t i = 0; i < l->n_entries && ret == 0; i++) {
		struct kvp_checkpoint_info *e = &l->entries[i];

		if (e->error)
			continue;
		ret = kvp_list_checkpoints_ex(c, 1, e->uid, e->name, KVP_LIST_VERIFY, &keep[i]);
		if (ret == 0 && keep[i]->n_entries == 1) {
			e->error = keep[i]->entries[0].error;
			e->verified = keep[i]->entries[0].verified;
		} else if (ret == 0) {
			e->error = "removed while it was being verified";
		}
		done += e->bytes;
		progress_update(&pg, done);
	}
	progress_end(&pg);
	*ret_keep = keep;
	return ret;
}

static int cmd_checkpoints(kvp_client *c, const struct args *a)
{
	struct kvp_checkpoint_list *l, **keep = NULL;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "listing");
	ret = kvp_list_checkpoints(c, !!(a->given & OPT_UID), a->uid, &l);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->given & OPT_VERIFY)
		ret = verify_each(c, a, l, &keep);
	if (ret < 0) {
		ret = fail(c, a->name, ret);
	} else {
		if (a->json)
			print_checkpoints_json(a->path, a, l);
		else
			print_checkpoints_text(l);
		ret = 0;
	}
	for (size_t i = 0; keep && i < l->n_entries; i++)
		kvp_checkpoint_list_free(keep[i]);
	free(keep);
	kvp_checkpoint_list_free(l);
	return ret;
}

static int cmd_checkpoint_rm(kvp_client *c, const struct args *a)
{
	uint32_t uid = a->given & OPT_UID ? a->uid : (uint32_t)getuid();
	struct progress pg;
	uint64_t bytes = 0;
	char size[32];
	int ret;

	wait_start(&pg, a, "removing");
	ret = kvp_checkpoint_remove(c, a->ckpt, !!(a->given & OPT_UID), a->uid, &bytes);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "name", a->ckpt, 1);
		json_u64(stdout, "uid", uid, 1);
		json_u64(stdout, "bytes", bytes, 0);
		fputs("}\n", stdout);
		return 0;
	}
	size_text(bytes, size, sizeof(size));
	printf("removed checkpoint %s of uid %u (%s)\n", a->ckpt, uid, size);
	return 0;
}

/* ---- the command table, help -------------------------------------------- */

struct command {
	const char *name;     /* one or two words */
	const char *operands; /* "ID", or NULL for none */
	unsigned int opts;    /* OPT_* it accepts */
	unsigned int needed;  /* OPT_* it requires */
	const char *synopsis; /* options after the name, for the usage line */
	const char *summary;  /* one line for the command list */
	const char *help;     /* what `help NAME` prints after the usage line */
	int (*run)(kvp_client *c, const struct args *a);
};

static const struct command commands[] = {
	{"status", NULL, 0, 0, "", "the daemon in a few lines",
	 "The daemon in a few lines: uptime, open connections, host tier use (pools,\n"
	 "pages used of all), GPU tier, prefix-match hit rate, checkpoints written,\n"
	 "restored, refused and failed.\n",
	 cmd_stats},
	{"ping", NULL, 0, 0, "", "time one round trip",
	 "Time one round trip to the daemon (a Hello) and say whether the connection\n"
	 "is an admin connection.\n",
	 cmd_ping},
	{"stats", NULL, 0, 0, "", "daemon counters and one row per pool",
	 "The daemon's counters (requests, errors, prefix-match hits and misses,\n"
	 "matched, appended and committed tokens, evictions, dedup, bad\n"
	 "disconnects, checkpoints, GPU status) and one row per pool: uid, model,\n"
	 "layout, pages in all, free, used, reserved, leased, sessions, page size.\n",
	 cmd_stats},
	{"pools", NULL, 0, 0, "", "one row per pool: what its pages hold",
	 "One row per pool: id, owning uid, model id, layout, pages in all, free,\n"
	 "used, held by the prefix index (INDEXED), indexed leaves eviction may\n"
	 "take (EVICTABLE), pinned by read leases, sessions, pages evicted, pages\n"
	 "saved by dedup, page size.\n",
	 cmd_stats},
	{"sessions", NULL, OPT_POOL, 0, " [--pool ID]", "one row per session",
	 "One row per session, in id order: id, pool, owning uid, tokens, committed\n"
	 "tokens, pages, pages another holder shares (SHARED), idle time, whether a\n"
	 "client holds uncommitted tokens (WRITING).\n"
	 "\n"
	 "  -p, --pool ID       only the sessions of pool ID\n",
	 cmd_sessions},
	{"metrics", NULL, 0, 0, "", "the counters in Prometheus text format",
	 "The daemon's counters and each pool's page counts in the Prometheus text\n"
	 "exposition format (names start with kvpalace_; pool gauges carry pool,\n"
	 "uid and model labels). With --json, one object whose \"metrics\" array\n"
	 "holds each family's name, type, help and samples (labels, value).\n",
	 cmd_stats},
	{"session show", "ID", OPT_PAGES, 0, " [--pages N]", "one session in detail",
	 "One session in detail: pool, owning uid, model and layout, tokens\n"
	 "(committed and reserved), pages (shared with another holder, holding only\n"
	 "reserved tokens), the pid of the client writing it if any, idle time,\n"
	 "whether it has a cache salt, its token policy and budget (compacted, tokens\n"
	 "dropped), and the arena slots of its first pages with\n"
	 "how many holders (sessions, leases, the prefix index) each has.\n"
	 "\n"
	 "  --pages N           list the slots of the first N pages (0..4096,\n"
	 "                      default 16)\n",
	 cmd_session_show},
	{"drop session", "ID", OPT_FORCE, 0, " [--force]", "close a session, forget its pages",
	 "Close a session of any user, as its owner's CloseSession would, and forget\n"
	 "in every tier the cached pages of its prefix that no other session or read\n"
	 "lease holds, with every cached page continuing them: no match finds them\n"
	 "again, after a restart either (disk copies are invalidated and synced\n"
	 "first). Pages another holder shares stay cached (see purge). A session a\n"
	 "client is writing (it holds uncommitted tokens) is refused unless --force;\n"
	 "then the writer's reservation is rolled back and its next request on the\n"
	 "session fails (the session is gone).\n"
	 "\n"
	 "  -f, --force         drop it even while a client is writing it\n",
	 cmd_drop_session},
	{"drop pool", "ID", OPT_FORCE, 0, " [--force]", "free a pool and its arena",
	 "Free a pool of any user: its arena, its prefix index, every page, and its\n"
	 "spill file in the disk tier (removed and synced first, so a pool of the same\n"
	 "model and layout starts empty, after a restart too). Refused\n"
	 "while the pool has sessions or read leases unless --force; then its\n"
	 "sessions are closed and the leases on it released first, and their\n"
	 "owners' next requests on them fail (not found). Processes that mapped the\n"
	 "arena keep a valid mapping of memory nobody else uses any more.\n"
	 "\n"
	 "  -f, --force         drop it even with sessions and leases\n",
	 cmd_drop_pool},
	{"evict", NULL, OPT_TIER | OPT_BYTES | OPT_POOL | OPT_DISCARD, OPT_TIER | OPT_BYTES,
	 " --tier TIER --bytes SIZE [--pool ID] [--discard]", "move cached pages out of a tier",
	 "Evict cached pages that nothing but the prefix index holds (no session,\n"
	 "no lease), least recently used first, pool by pool (oldest pool first),\n"
	 "until SIZE bytes are freed (whole pages, never more than SIZE) or nothing\n"
	 "is left to evict. From the host tier pages go down to the disk tier, as\n"
	 "the watermarks move them (written first where they have no disk copy);\n"
	 "with --discard, or without a disk tier, they are dropped instead, leaves\n"
	 "of the hash chain first. From the disk tier their disk copies go for good\n"
	 "(a page in the host tier stays there). From the GPU tier, device copies\n"
	 "no lease holds. Prints the pages and bytes evicted, how many were demoted\n"
	 "or dropped, per pool. Runs as many short requests; a bar shows progress\n"
	 "when standard output is a terminal.\n"
	 "\n"
	 "  -t, --tier TIER     host, disk or gpu; a daemon without that tier\n"
	 "                      refuses it\n"
	 "  -d, --discard       host: drop pages instead of writing them to disk\n"
	 "  -b, --bytes SIZE    at most SIZE bytes: 4096, 64K, 512M, 2G (powers of\n"
	 "                      1024), or all\n"
	 "  -p, --pool ID       only from pool ID\n",
	 cmd_evict},
	{"purge", NULL, OPT_POOL | OPT_UID | OPT_MODEL | OPT_SALT | OPT_UNUSED, 0,
	 " [--pool ID] [--uid UID] [--model ID] [--salt TEXT|--salt-hex HEX]"
	 " [--unused-since TIME]",
	 "forget suspect cached pages in every tier",
	 "Forget for good the cached pages (prefix-index pages) that match every\n"
	 "option given, with every cached page continuing them in the hash chain,\n"
	 "from every tier at once: no match finds them afterwards, after a restart\n"
	 "either (their disk copies are invalidated and synced before the answer).\n"
	 "For a cache a client poisoned: a bad engine build (--model), a leaked\n"
	 "salt (--salt), a pool or a user. A page a session or read lease holds\n"
	 "stays with it until it ends, but is matched no more, and that session\n"
	 "puts nothing more into the cache. Pages found on disk at start count as\n"
	 "unused since the start unless used since. Checkpoints are left alone.\n"
	 "Prints the pages forgotten: in all, in the host tier, on disk, on the GPU,\n"
	 "still held.\n"
	 "\n"
	 "  -p, --pool ID       pages of pool ID\n"
	 "  -u, --uid UID       pages of user UID's pools\n"
	 "  -m, --model ID      pages of pools of model id ID\n"
	 "  --salt TEXT         pages committed under the cache salt TEXT (its\n"
	 "                      bytes; \"\" for no salt)\n"
	 "  --salt-hex HEX      the same, the salt given in hexadecimal\n"
	 "  --unused-since TIME pages not used since TIME: @SECONDS since the epoch,\n"
	 "                      or a duration ago such as 90s, 30m, 12h, 7d\n",
	 cmd_purge},
	{"config show", NULL, 0, 0, "", "the effective configuration",
	 "The daemon's effective configuration, each key with its value and where it\n"
	 "came from (default, preset, file, command line), as kvpalaced\n"
	 "--print-config prints it.\n",
	 cmd_config_show},
	{"config reload", NULL, 0, 0, "", "re-read the configuration (as SIGHUP)",
	 "Re-read the configuration as SIGHUP does (file, preset, command line) and\n"
	 "apply what may change while serving: log level, watermarks, limits. Says\n"
	 "which keys changed, and which differ in the file but need a restart. A\n"
	 "bad file is refused with the file, line and key named (exit status 1);\n"
	 "the running configuration stays.\n",
	 cmd_config_reload},
	{"checkpoint rm", "NAME", OPT_UID, 0, " [--uid UID]", "remove checkpoint NAME",
	 "Remove checkpoint NAME of user UID (default: the user running\n"
	 "kvpalacectl) durably: the daemon unlinks the file and syncs its directory\n"
	 "before it answers, so the removal survives a crash. Only that user's own\n"
	 "checkpoints can be named. Prints the size of the file removed.\n"
	 "\n"
	 "  -u, --uid UID       a checkpoint of user UID\n",
	 cmd_checkpoint_rm},
	{"checkpoint", "SESSION_ID NAME", 0, 0, "", "write a session to disk as NAME",
	 "Write the committed tokens of a session of any user, and their pages, to\n"
	 "the daemon's disk as checkpoint NAME of the session's owner (replacing an\n"
	 "older one of that name once the new one is durable). NAME is 1..64 of\n"
	 "A-Z a-z 0-9 . _ -, starting with a letter, a digit or _. The daemon\n"
	 "answers once the file is written and synced; a spinner shows the wait\n"
	 "when standard output is a terminal. Prints the size of the file.\n",
	 cmd_checkpoint},
	{"restore", "NAME", OPT_UID | OPT_POOL, 0, " [--uid UID] [--pool ID]",
	 "rebuild a session from checkpoint NAME",
	 "Rebuild a session from checkpoint NAME of user UID (default: the user\n"
	 "running kvpalacectl), in pool ID or else in the pool of the checkpoint's\n"
	 "model and layout under that user (created if needed). Its full pages are\n"
	 "shared with the prefix index where it holds the same content. A missing,\n"
	 "corrupt or truncated file, a newer format, or another model or layout\n"
	 "than the pool's is refused and nothing is restored. Prints the new\n"
	 "session's id, pool, tokens and pages; the session stays until closed or\n"
	 "dropped.\n"
	 "\n"
	 "  -u, --uid UID       a checkpoint of user UID\n"
	 "  -p, --pool ID       into pool ID (of the checkpoint's model and layout)\n",
	 cmd_restore},
	{"checkpoints", NULL, OPT_UID | OPT_VERIFY, 0, " [--uid UID] [--verify]",
	 "one row per checkpoint",
	 "One row per checkpoint of every user (or of UID): name, owning uid,\n"
	 "model id, tokens, size of the file, when it was written (local time) and\n"
	 "what was checked, or why it cannot be restored (corrupt, truncated, newer\n"
	 "format, the file of another checkpoint or user). Only each file's header\n"
	 "is read and checked (\"header valid, pages not checked\"): a damaged page\n"
	 "shows at a restore, or with --verify, which reads and checks every page\n"
	 "of every file (as long as reading them takes; a bar shows progress when\n"
	 "standard output is a terminal).\n"
	 "\n"
	 "  -u, --uid UID       only the checkpoints of user UID\n"
	 "  -v, --verify        read and check every page too\n",
	 cmd_checkpoints},
	{"warmup", "NAME", OPT_UID, 0, " [--uid UID]", "load a checkpoint into the prefix index",
	 "Load the full pages of a checkpoint into the prefix index of its pool\n"
	 "(created if needed) without keeping a session, so later prompts with that\n"
	 "prefix match it: file NAME of the daemon's warm-up directory (which the\n"
	 "daemon loads at start too), or checkpoint NAME of user UID with --uid.\n"
	 "Prints the pool and how many pages entered the index and were there\n"
	 "already.\n"
	 "\n"
	 "  -u, --uid UID       checkpoint NAME of user UID\n",
	 cmd_warmup},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char exit_text[] = "Exit status: 0 success, 1 the daemon refused or failed the "
				"request, 2 usage\n"
				"error, 3 the daemon cannot be reached (no socket, no "
				"permission, connection\nlost), 4 protocol error (a reply "
				"that does not decode).\n";

static void usage(FILE *f)
{
	char def[256];

	if (kvp_default_admin_socket_path(def, sizeof(def)) >= (int)sizeof(def))
		snprintf(def, sizeof(def), "(too long)");
	fprintf(f, "Usage: kvpalacectl [OPTIONS] COMMAND [ARGS]\n"
		   "Query and steer kvpalaced, the local KV-cache daemon, on its admin socket.\n"
		   "\n"
		   "Commands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++) {
		char head[40];

		snprintf(head, sizeof(head), "%s%s%s", commands[i].name,
			 commands[i].operands ? " " : "",
			 commands[i].operands ? commands[i].operands : "");
		fprintf(f, "  %-26s %s\n", head, commands[i].summary);
	}
	fprintf(f,
		"  %-26s %s\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   admin socket (default $KVPALACE_ADMIN_SOCKET, else\n"
		"                      %s)\n"
		"  -j, --json          print one JSON object instead of text\n"
		"  -h, --help          print this help (after a command: its help) and exit\n"
		"  -V, --version       print the version and exit\n"
		"\n"
		"'kvpalacectl help COMMAND' or 'kvpalacectl COMMAND --help' describes a\n"
		"command and its options.\n"
		"\n"
		"%s",
		"help [COMMAND]", "describe the commands, or one", def, exit_text);
}

static void command_help(FILE *f, const struct command *cmd)
{
	fprintf(f, "Usage: kvpalacectl [--socket PATH] [--json] %s%s%s%s\n\n%s\n", cmd->name,
		cmd->operands ? " " : "", cmd->operands ? cmd->operands : "", cmd->synopsis,
		cmd->help);
	fprintf(f,
		"  -s, --socket PATH   the admin socket\n"
		"  -j, --json          print one JSON object instead of text\n"
		"\n%s",
		exit_text);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Says what is wrong with the command line and returns EXIT_USAGE. */
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("kvpalacectl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'kvpalacectl --help'.\n", stderr);
	return EXIT_USAGE;
}

/* The command named by words[0] (and words[1] for two-word names), and
 * how many words its name took in *ret_used; NULL when there is none,
 * with *ret_used 1 when words[0] starts some two-word name (a group such
 * as "drop"). */
static const struct command *find_command(char *const *words, int n, int *ret_used)
{
	size_t len0;

	*ret_used = 0;
	if (n < 1)
		return NULL;
	len0 = strlen(words[0]);
	for (size_t i = 0; i < N_COMMANDS; i++) {
		const char *name = commands[i].name;

		if (!strcmp(name, words[0])) {
			*ret_used = 1;
			return &commands[i];
		}
		if (!strncmp(name, words[0], len0) && name[len0] == ' ') {
			*ret_used = 1; /* a group */
			if (n >= 2 && !strcmp(name + len0 + 1, words[1])) {
				*ret_used = 2;
				return &commands[i];
			}
		}
	}
	return NULL;
}

/* "session" → "show"; "drop" → "session, pool". */
static void group_members(const char *group, char *buf, size_t cap)
{
	size_t len = strlen(group), at = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < N_COMMANDS && at < cap; i++) {
		const char *name = commands[i].name;

		if (!strncmp(name, group, len) && name[len] == ' ') {
			int w = snprintf(buf + at, cap - at, "%s%s", at ? ", " : "",
					 name + len + 1);

			if (w < 0)
				break;
			at += (size_t)w;
		}
	}
}

/* Resolves words[0..n) to a command or explains why not (EXIT_USAGE). */
static int resolve(char *const *words, int n, const struct command **ret, int *ret_used)
{
	char members[128];

	*ret = find_command(words, n, ret_used);
	if (*ret)
		return 0;
	if (*ret_used == 0)
		return usage_error("unknown command '%s'", words[0]);
	group_members(words[0], members, sizeof(members));
	if (n < 2)
		return usage_error("'%s' wants one of: %s", words[0], members);
	return usage_error("unknown command '%s %s' ('%s' wants one of: %s)", words[0], words[1],
			   words[0], members);
}

/* ---- parsing ------------------------------------------------------------ */

/* Parses an id: a decimal number 1..2^64-1. Returns 0 or -EINVAL. */
static int parse_id(const char *s, uint64_t *ret_id)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || !v)
		return -EINVAL;
	*ret_id = v;
	return 0;
}

/* Parses "4096", "64K", "512M", "2G", "1T" (powers of 1024, an optional
 * trailing "B" or "iB"), or "all" (KVP_EVICT_ALL). Returns 0, or -EINVAL
 * for anything else, zero or an overflow. */
static int parse_size(const char *s, uint64_t *ret)
{
	unsigned long long v;
	uint64_t mult = 1;
	const char *unit;
	char *end;

	if (!strcmp(s, "all")) {
		*ret = KVP_EVICT_ALL;
		return 0;
	}
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || !v)
		return -EINVAL;
	unit = end;
	switch (*unit) {
	case '\0':
		break;
	case 'k':
	case 'K':
		mult = 1ull << 10;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		break;
	case 't':
	case 'T':
		mult = 1ull << 40;
		break;
	default:
		return -EINVAL;
	}
	if (*unit && unit[1] && strcmp(unit + 1, "B") && strcmp(unit + 1, "iB"))
		return -EINVAL;
	if (v > (UINT64_MAX - 1) / mult)
		return -EINVAL;
	*ret = v * mult;
	return 0;
}

/* Parses a decimal count 0..max. Returns 0 or -EINVAL. */
static int parse_count(const char *s, uint32_t max, uint32_t *ret)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

/* Parses up to cap bytes of hexadecimal (two digits a byte). Returns 0
 * or -EINVAL. */
static int parse_hex(const char *s, unsigned char *buf, size_t cap, size_t *ret_len)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > cap)
		return -EINVAL;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned int v;
		char two[3] = {s[2 * i], s[2 * i + 1], '\0'};
		char *end;

		if (!isxdigit((unsigned char)two[0]) || !isxdigit((unsigned char)two[1]))
			return -EINVAL;
		v = (unsigned int)strtoul(two, &end, 16);
		buf[i] = (unsigned char)v;
	}
	*ret_len = n / 2;
	return 0;
}

/* Parses "@SECONDS" (since the epoch) or a duration ago: N followed by s,
 * m, h or d. Returns 0 and the time(2) seconds, or -EINVAL. */
static int parse_since(const char *s, int64_t *ret)
{
	unsigned long long v;
	uint64_t mult;
	char *end;

	if (*s == '@') {
		s++;
		if (*s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		v = strtoull(s, &end, 10);
		if (errno || *end || v > INT64_MAX)
			return -EINVAL;
		*ret = (int64_t)v;
		return 0;
	}
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end[0] == '\0' || end[1] != '\0')
		return -EINVAL;
	switch (*end) {
	case 's':
		mult = 1;
		break;
	case 'm':
		mult = 60;
		break;
	case 'h':
		mult = 3600;
		break;
	case 'd':
		mult = 86400;
		break;
	default:
		return -EINVAL;
	}
	if (v > (uint64_t)time(NULL) / mult)
		v = (uint64_t)time(NULL) / mult; /* before the epoch: since the epoch */
	*ret = (int64_t)time(NULL) - (int64_t)(v * mult);
	return 0;
}

static int parse_tier(const char *s, uint32_t *ret)
{
	if (!strcmp(s, "host"))
		*ret = KVP_TIER_HOST;
	else if (!strcmp(s, "gpu"))
		*ret = KVP_TIER_GPU;
	else if (!strcmp(s, "disk"))
		*ret = KVP_TIER_DISK;
	else
		return -EINVAL;
	return 0;
}

static const char *opt_name(unsigned int opt)
{
	switch (opt) {
	case OPT_POOL:
		return "--pool";
	case OPT_TIER:
		return "--tier";
	case OPT_BYTES:
		return "--bytes";
	case OPT_FORCE:
		return "--force";
	case OPT_PAGES:
		return "--pages";
	case OPT_UID:
		return "--uid";
	case OPT_VERIFY:
		return "--verify";
	case OPT_DISCARD:
		return "--discard";
	case OPT_MODEL:
		return "--model";
	case OPT_SALT:
		return "--salt";
	case OPT_UNUSED:
		return "--unused-since";
	default:
		return "?";
	}
}

/* Takes the operands of cmd from words[0..n): each word of
 * cmd->operands names one, an id when it ends in "ID" (into a->id), a
 * checkpoint name when it is "NAME" (into a->ckpt). Returns 0 or
 * EXIT_USAGE after saying what is wrong. */
static int parse_operands(const struct command *cmd, char *const *words, int n, struct args *a)
{
	const char *op = cmd->operands;
	int k = 0;

	for (; op && *op; k++) {
		size_t len = strcspn(op, " ");
		int is_id = len >= 2 && !strncmp(op + len - 2, "ID", 2);

		if (k >= n) {
			if (!strcmp(cmd->operands, "ID"))
				return usage_error("%s wants a%s ID", cmd->name,
						   strstr(cmd->name, "pool") ? " pool"
									     : " session");
			return usage_error("%s wants %s", cmd->name, cmd->operands);
		}
		if (is_id && parse_id(words[k], &a->id) < 0)
			return usage_error("%s wants an id (a number above 0), not '%s'", cmd->name,
					   words[k]);
		if (!is_id) {
			if (kvp_checkpoint_name_check(words[k]) < 0)
				return usage_error("'%s' is not a checkpoint name: 1..%d of A-Z "
						   "a-z 0-9 . _ -, starting with a letter, a "
						   "digit or _",
						   words[k], KVP_CHECKPOINT_NAME_MAX);
			a->ckpt = words[k];
		}
		op += len;
		op += *op == ' ';
	}
	if (n > k)
		return usage_error("%s: unexpected argument '%s'", cmd->name, words[k]);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"pool", required_argument, NULL, 'p'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{"tier", required_argument, NULL, 't'},
		{"bytes", required_argument, NULL, 'b'},
		{"force", no_argument, NULL, 'f'},
		{"pages", required_argument, NULL, 'P'},
		{"uid", required_argument, NULL, 'u'},
		{"verify", no_argument, NULL, 'v'},
		{"discard", no_argument, NULL, 'd'},
		{"model", required_argument, NULL, 'm'},
		{"salt", required_argument, NULL, 'S'},
		{"salt-hex", required_argument, NULL, 'X'},
		{"unused-since", required_argument, NULL, 'U'},
		{NULL, 0, NULL, 0},
	};
	struct args a = {0};
	const struct command *cmd;
	char def[4096];
	char *const *words;
	int help = 0, n_words, used, opt, ret;
	kvp_client *c;

	while ((opt = getopt_long(argc, argv, "s:p:jhVt:b:fu:vdm:", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			a.path = optarg;
			break;
		case 'p':
			if (parse_id(optarg, &a.pool_id) < 0)
				return usage_error("--pool wants a pool id (a number above 0), "
						   "not '%s'",
						   optarg);
			a.given |= OPT_POOL;
			break;
		case 'j':
			a.json = 1;
			break;
		case 'h':
			help = 1;
			break;
		case 'V':
			printf("kvpalacectl %s (protocol %d)\n", KVP_VERSION, KVP_PROTOCOL_VERSION);
			return 0;
		case 't':
			if (parse_tier(optarg, &a.tier) < 0)
				return usage_error("--tier wants host, gpu or disk, not '%s'",
						   optarg);
			a.given |= OPT_TIER;
			break;
		case 'b':
			if (parse_size(optarg, &a.bytes) < 0)
				return usage_error("--bytes wants a size above 0 such as 4096, "
						   "64K, 512M, 2G, or all, not '%s'",
						   optarg);
			a.given |= OPT_BYTES;
			break;
		case 'f':
			a.given |= OPT_FORCE;
			break;
		case 'v':
			a.given |= OPT_VERIFY;
			break;
		case 'd':
			a.given |= OPT_DISCARD;
			break;
		case 'm':
			if (!*optarg || strlen(optarg) > 127)
				return usage_error("--model wants a model id of 1..127 characters");
			a.model = optarg;
			a.given |= OPT_MODEL;
			break;
		case 'S':
			if (strlen(optarg) > sizeof(a.salt))
				return usage_error("--salt wants at most 64 bytes");
			a.salt_len = strlen(optarg);
			memcpy(a.salt, optarg, a.salt_len);
			a.given |= OPT_SALT;
			break;
		case 'X':
			if (parse_hex(optarg, a.salt, sizeof(a.salt), &a.salt_len) < 0)
				return usage_error("--salt-hex wants up to 64 bytes in hexadecimal "
						   "(two digits each), not '%s'",
						   optarg);
			a.given |= OPT_SALT;
			break;
		case 'U':
			if (parse_since(optarg, &a.unused_since) < 0)
				return usage_error(
					"--unused-since wants @SECONDS since the epoch or "
					"a duration such as 90s, 30m, 12h, 7d, not '%s'",
					optarg);
			a.given |= OPT_UNUSED;
			break;
		case 'u':
			if (parse_count(optarg, UINT32_MAX, &a.uid) < 0)
				return usage_error("--uid wants a user id (a number), not '%s'",
						   optarg);
			a.given |= OPT_UID;
			break;
		case 'P':
			if (parse_count(optarg, 4096, &a.pages) < 0)
				return usage_error("--pages wants a number of pages from 0 to "
						   "4096, not '%s'",
						   optarg);
			a.given |= OPT_PAGES;
			break;
		default:
			fprintf(stderr, "Try 'kvpalacectl --help'.\n");
			return EXIT_USAGE;
		}
	}
	words = argv + optind;
	n_words = argc - optind;

	/* help [COMMAND], COMMAND --help, --help. */
	if (n_words && !strcmp(words[0], "help")) {
		help = 1;
		words++;
		n_words--;
	}
	if (help) {
		if (!n_words) {
			usage(stdout);
			return 0;
		}
		cmd = find_command(words, n_words, &used);
		if (!cmd && used == 1 && n_words == 1) {
			/* A group ("drop"): the help of each of its commands. */
			size_t len = strlen(words[0]);

			for (size_t i = 0, k = 0; i < N_COMMANDS; i++) {
				if (strncmp(commands[i].name, words[0], len) ||
				    commands[i].name[len] != ' ')
					continue;
				if (k++)
					printf("\n");
				command_help(stdout, &commands[i]);
			}
			return 0;
		}
		ret = resolve(words, n_words, &cmd, &used);
		if (ret)
			return ret;
		command_help(stdout, cmd);
		return 0;
	}
	if (!n_words)
		return usage_error("missing command");
	ret = resolve(words, n_words, &cmd, &used);
	if (ret)
		return ret;
	a.name = cmd->name;
	words += used;
	n_words -= used;
	ret = parse_operands(cmd, words, n_words, &a);
	if (ret)
		return ret;
	for (unsigned int o = 1; o <= OPT_LAST; o <<= 1) {
		if ((a.given & o) && !(cmd->opts & o))
			return usage_error("%s does not go with the %s command", opt_name(o),
					   cmd->name);
		if ((cmd->needed & o) && !(a.given & o))
			return usage_error("%s wants %s", cmd->name, opt_name(o));
	}

	if (!a.path || !*a.path)
		a.path = getenv("KVPALACE_ADMIN_SOCKET");
	if (!a.path || !*a.path) {
		if (kvp_default_admin_socket_path(def, sizeof(def)) >= (int)sizeof(def)) {
			fprintf(stderr, "kvpalacectl: default admin socket path too long\n");
			return EXIT_CONNECT;
		}
		a.path = def;
	}
	ret = kvp_connect(a.path, &c);
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: cannot connect to %s: %s\n", a.path,
			kvp_strerror(NULL, ret));
		return EXIT_CONNECT;
	}
	ret = cmd->run(c, &a);
	kvp_disconnect(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvpalacectl: writing output failed: %s\n", strerror(errno));
		return EXIT_DAEMON;
	}
	return ret;
}
