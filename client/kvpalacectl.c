/* client/kvpalacectl.c — the control CLI of kvpalaced.
 *
 *   kvpalacectl [--socket PATH] [--json] ping|stats|pools
 *   kvpalacectl [--socket PATH] [--json] sessions [--pool ID]
 *
 * Talks to the daemon's admin socket (--socket, else $KVPALACE_ADMIN_SOCKET,
 * else kvp_default_admin_socket_path()) through the public client library
 * only. `ping` prints the round-trip time of one Hello and whether the
 * connection is an admin one; `stats` prints the daemon's counters and one
 * row per pool; `pools` one row per pool with what its pages hold (free,
 * used, in the prefix index, evictable, leased), evictions and the pages
 * dedup saved; `sessions` one row per session (of one pool with --pool):
 * tokens, committed tokens, pages, pages shared with another holder, idle
 * time, whether a writer holds uncommitted tokens. With --json each prints
 * one JSON object instead (written by hand here, with full string
 * escaping, to need no JSON library). Exit status: 0 success, 1 the daemon
 * could not be reached or refused, 2 usage error. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpalace.h"

#ifndef KVP_VERSION
#define KVP_VERSION "unknown"
#endif

#define EXIT_DAEMON 1
#define EXIT_USAGE  2

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

static void usage(FILE *f)
{
	char def[256];

	if (kvp_default_admin_socket_path(def, sizeof(def)) >= (int)sizeof(def))
		snprintf(def, sizeof(def), "(too long)");
	fprintf(f,
		"Usage: kvpalacectl [OPTIONS] COMMAND\n"
		"Query kvpalaced, the local KV-cache daemon, on its admin socket.\n"
		"\n"
		"Commands:\n"
		"  status          the daemon in a few lines: uptime, clients, host tier use,\n"
		"                  GPU, prefix hit rate\n"
		"  ping            time one round trip; say whether the connection is admin\n"
		"  stats           daemon counters (matches, evictions, dedup) and one row\n"
		"                  per pool\n"
		"  pools           one row per pool: pages free, used, indexed, evictable,\n"
		"                  leased; sessions, evictions, pages saved by dedup\n"
		"  sessions        one row per session: tokens, committed, pages, pages\n"
		"                  shared with another holder, idle time, writing\n"
		"  metrics         the counters in Prometheus text exposition format\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   admin socket (default $KVPALACE_ADMIN_SOCKET, else\n"
		"                      %s)\n"
		"  -p, --pool ID       sessions: only those of pool ID\n"
		"  -j, --json          print one JSON object instead of text\n"
		"  -h, --help          print this help and exit\n"
		"  -V, --version       print the version and exit\n"
		"\n"
		"Exit status: 0 success, 1 the daemon could not be reached or refused,\n"
		"2 usage error.\n",
		def);
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
	printf("  %-18s %" PRIu64 "\n", "bad disconnects", st->disconnects_bad);
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
	const struct kvp_layout *l = &p->layout;

	fputc('{', f);
	json_u64(f, "pool_id", p->pool_id, 1);
	json_u64(f, "uid", p->uid, 1);
	json_string(f, "model_id", p->model_id, 1);
	json_key(f, "layout");
	fputc('{', f);
	json_u64(f, "n_layers", l->n_layers, 1);
	json_u64(f, "n_kv_heads", l->n_kv_heads, 1);
	json_u64(f, "head_dim", l->head_dim, 1);
	json_u64(f, "block_tokens", l->block_tokens, 1);
	json_string(f, "dtype", dtype_name(l->dtype), 1);
	json_u64(f, "quant_group", l->quant_group, 0);
	fputs("},", f);
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
	json_u64(f, "dedup_pages", p->dedup_pages, 0);
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
	json_u64(f, "disconnects_bad", st->disconnects_bad, 1);
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

/* ---- commands ----------------------------------------------------------- */

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmd_ping(kvp_client *c, const char *path, int json)
{
	double t0 = now_us();
	double rtt;
	char buf[512];
	int ret;

	ret = kvp_ping(c);
	rtt = now_us() - t0;
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: ping: %s\n", kvp_strerror(c, ret));
		return EXIT_DAEMON;
	}
	if (json) {
		fputc('{', stdout);
		json_string(stdout, "socket", path, 1);
		json_key(stdout, "rtt_us");
		printf("%.1f,", rtt);
		json_bool(stdout, "admin", kvp_is_admin(c), 0);
		fputs("}\n", stdout);
	} else {
		printf("pong from %s: round trip %.1f us, admin: %s\n",
		       printable(path, buf, sizeof(buf)), rtt, kvp_is_admin(c) ? "yes" : "no");
	}
	return 0;
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

static void prom_head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP kvpalace_%s %s\n# TYPE kvpalace_%s %s\n", name, help, name, type);
}

/* `metrics`: the Stats reply in the Prometheus text exposition format. */
static void print_metrics(FILE *f, const struct kvp_stats *st)
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
		{"bad_disconnects_total", "counter", "Connections closed for misbehaviour.",
		 offsetof(struct kvp_stats, disconnects_bad)},
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

	for (size_t i = 0; i < sizeof(daemon_metrics) / sizeof(daemon_metrics[0]); i++) {
		uint64_t v;

		prom_head(f, daemon_metrics[i].name, daemon_metrics[i].type,
			  daemon_metrics[i].help);
		if (i == 0) {
			fprintf(f, "kvpalace_%s %.3f\n", daemon_metrics[i].name,
				(double)st->uptime_ms / 1000.0);
			continue;
		}
		memcpy(&v, (const char *)st + daemon_metrics[i].off, sizeof(v));
		fprintf(f, "kvpalace_%s %" PRIu64 "\n", daemon_metrics[i].name, v);
	}
	prom_head(f, "gpu", "gauge", "1 when a GPU tier is available.");
	fprintf(f, "kvpalace_gpu %d\n", st->gpu ? 1 : 0);
	for (size_t m = 0; m < sizeof(pool_metrics) / sizeof(pool_metrics[0]); m++) {
		prom_head(f, pool_metrics[m].name, "gauge", pool_metrics[m].help);
		for (size_t i = 0; i < st->n_pools; i++) {
			const struct kvp_pool_stats *p = &st->pools[i];
			uint64_t v[] = {p->n_pages,	    p->free_pages,   p->indexed_pages,
					p->evictable_pages, p->leased_pages, p->n_sessions};

			fprintf(f, "kvpalace_%s{pool=\"%" PRIu64 "\",uid=\"%u\",model=\"",
				pool_metrics[m].name, p->pool_id, p->uid);
			prom_label(f, p->model_id);
			fprintf(f, "\"} %" PRIu64 "\n", v[m]);
		}
	}
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
		json_u64(f, "match_total", total, 0);
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
}

/* `stats` and `pools`: both read one Stats reply. */
/* `status`, `stats`, `pools` and `metrics`: views of one Stats reply. */
static int cmd_stats(kvp_client *c, const char *cmd, const char *path, int json)
{
	int admin = kvp_is_admin(c);
	struct kvp_stats *st;
	int ret;

	ret = kvp_stats(c, &st);
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: %s: %s\n", cmd, kvp_strerror(c, ret));
		return EXIT_DAEMON;
	}
	if (!strcmp(cmd, "metrics"))
		print_metrics(stdout, st);
	else if (!strcmp(cmd, "status"))
		print_status(stdout, path, json, st);
	else if (!strcmp(cmd, "pools") && json)
		print_pools_json(path, admin, st);
	else if (!strcmp(cmd, "pools"))
		print_pools_text(st);
	else if (json)
		print_stats_json(path, admin, st);
	else
		print_stats_text(path, admin, st);
	kvp_stats_free(st);
	return 0;
}

static int cmd_sessions(kvp_client *c, const char *path, int json, uint64_t pool_id)
{
	struct kvp_session_info *ss;
	size_t n;
	int ret;

	ret = kvp_list_sessions(c, pool_id, &ss, &n);
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: sessions: %s\n", kvp_strerror(c, ret));
		return EXIT_DAEMON;
	}
	if (json)
		print_sessions_json(path, kvp_is_admin(c), pool_id, ss, n);
	else
		print_sessions_text(ss, n);
	free(ss);
	return 0;
}

/* Parses a pool id: a decimal number 1..2^64-1. Returns 0 or -EINVAL. */
static int parse_pool_id(const char *s, uint64_t *ret_id)
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

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'}, {"pool", required_argument, NULL, 'p'},
		{"json", no_argument, NULL, 'j'},	  {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},	  {NULL, 0, NULL, 0},
	};
	char def[4096];
	const char *path = NULL;
	const char *pool_arg = NULL;
	const char *cmd;
	uint64_t pool_id = 0;
	kvp_client *c;
	int json = 0;
	int opt;
	int ret;

	while ((opt = getopt_long(argc, argv, "s:p:jhV", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			path = optarg;
			break;
		case 'p':
			pool_arg = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("kvpalacectl %s (protocol %d)\n", KVP_VERSION, KVP_PROTOCOL_VERSION);
			return 0;
		default:
			fprintf(stderr, "Try 'kvpalacectl --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 1)
		return usage_error("%s", optind >= argc ? "missing command" : "too many arguments");
	cmd = argv[optind];
	if (strcmp(cmd, "ping") != 0 && strcmp(cmd, "stats") != 0 && strcmp(cmd, "pools") != 0 &&
	    strcmp(cmd, "sessions") != 0 && strcmp(cmd, "status") != 0 &&
	    strcmp(cmd, "metrics") != 0)
		return usage_error("unknown command '%s'", cmd);
	if (pool_arg && strcmp(cmd, "sessions") != 0)
		return usage_error("--pool goes with the sessions command only");
	if (pool_arg && parse_pool_id(pool_arg, &pool_id) < 0)
		return usage_error("--pool wants a pool id (a number above 0), not '%s'", pool_arg);
	if (!path || !*path)
		path = getenv("KVPALACE_ADMIN_SOCKET");
	if (!path || !*path) {
		if (kvp_default_admin_socket_path(def, sizeof(def)) >= (int)sizeof(def)) {
			fprintf(stderr, "kvpalacectl: default admin socket path too long\n");
			return EXIT_DAEMON;
		}
		path = def;
	}

	ret = kvp_connect(path, &c);
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: cannot connect to %s: %s\n", path,
			kvp_strerror(NULL, ret));
		return EXIT_DAEMON;
	}
	if (strcmp(cmd, "ping") == 0)
		ret = cmd_ping(c, path, json);
	else if (strcmp(cmd, "sessions") == 0)
		ret = cmd_sessions(c, path, json, pool_id);
	else
		ret = cmd_stats(c, cmd, path, json);
	kvp_disconnect(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvpalacectl: writing output failed: %s\n", strerror(errno));
		return EXIT_DAEMON;
	}
	return ret;
}
