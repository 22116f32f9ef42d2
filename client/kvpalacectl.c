/* client/kvpalacectl.c — the control CLI of kvpalaced.
 *
 *   kvpalacectl [--socket PATH] ping|stats [--json]
 *
 * Talks to the daemon's admin socket (--socket, else $KVPALACE_ADMIN_SOCKET,
 * else kvp_default_admin_socket_path()) through the public client library
 * only. `ping` prints the round-trip time of one Hello and whether the
 * connection is an admin one; `stats` prints the daemon's counters and one
 * row per pool, or with --json one JSON object (written by hand here, with
 * full string escaping, to need no JSON library). Exit status: 0 success,
 * 1 the daemon could not be reached or refused, 2 usage error.
 * Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
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
		"  ping            time one round trip; say whether the connection is admin\n"
		"  stats           daemon counters and one row per pool\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   admin socket (default $KVPALACE_ADMIN_SOCKET, else\n"
		"                      %s)\n"
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

static void print_stats_text(const char *path, int admin, const struct kvp_stats *st)
{
	uint64_t s = st->uptime_ms / 1000;
	char buf[512];
	int wmodel = (int)strlen("MODEL");
	int wlayout = (int)strlen("LAYOUT");

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
	printf("  %-18s %" PRIu64 "\n", "bad disconnects", st->disconnects_bad);
	printf("  %-18s %s", "gpu", st->gpu ? "yes" : "no");
	if (st->gpu_status[0])
		printf(" (%s)", printable(st->gpu_status, buf, sizeof(buf)));
	printf("\n\npools: %zu%s\n", st->n_pools,
	       st->pools_truncated ? " (more exist than fit in one reply)" : "");
	if (!st->n_pools)
		return;

	for (size_t i = 0; i < st->n_pools; i++) {
		int n = (int)strlen(st->pools[i].model_id);

		if (n > wmodel)
			wmodel = n;
		layout_text(&st->pools[i].layout, buf, sizeof(buf));
		n = (int)strlen(buf);
		if (n > wlayout)
			wlayout = n;
	}
	printf("  %-6s %-6s %-*s %-*s %8s %8s %8s %8s %8s %8s %9s\n", "POOL", "UID", wmodel,
	       "MODEL", wlayout, "LAYOUT", "PAGES", "FREE", "USED", "RESERVED", "LEASED",
	       "SESSIONS", "PAGE");
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		char model[sizeof(p->model_id)];
		char layout[128];
		char page[32];
		uint32_t used = p->n_pages >= p->free_pages ? p->n_pages - p->free_pages : 0;

		layout_text(&p->layout, layout, sizeof(layout));
		size_text(p->page_bytes, page, sizeof(page));
		printf("  %-6" PRIu64 " %-6u %-*s %-*s %8u %8u %8u %8u %8u %8u %9s\n", p->pool_id,
		       p->uid, wmodel, printable(p->model_id, model, sizeof(model)), wlayout,
		       layout, p->n_pages, p->free_pages, used, p->reserved_pages, p->leased_pages,
		       p->n_sessions, page);
	}
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
	json_u64(f, "disconnects_bad", st->disconnects_bad, 1);
	json_bool(f, "gpu", st->gpu, 1);
	json_string(f, "gpu_status", st->gpu_status, 1);
	json_bool(f, "pools_truncated", st->pools_truncated, 1);
	json_key(f, "pools");
	fputc('[', f);
	for (size_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_stats *p = &st->pools[i];
		const struct kvp_layout *l = &p->layout;

		fputs(i ? ",{" : "{", f);
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
		json_u64(f, "used_pages",
			 p->n_pages >= p->free_pages ? p->n_pages - p->free_pages : 0, 1);
		json_u64(f, "reserved_pages", p->reserved_pages, 1);
		json_u64(f, "leased_pages", p->leased_pages, 1);
		json_u64(f, "n_sessions", p->n_sessions, 0);
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

static int cmd_stats(kvp_client *c, const char *path, int json)
{
	struct kvp_stats *st;
	int ret;

	ret = kvp_stats(c, &st);
	if (ret < 0) {
		fprintf(stderr, "kvpalacectl: stats: %s\n", kvp_strerror(c, ret));
		return EXIT_DAEMON;
	}
	if (json)
		print_stats_json(path, kvp_is_admin(c), st);
	else
		print_stats_text(path, kvp_is_admin(c), st);
	kvp_stats_free(st);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	char def[4096];
	const char *path = NULL;
	const char *cmd;
	kvp_client *c;
	int json = 0;
	int opt;
	int ret;

	while ((opt = getopt_long(argc, argv, "s:jhV", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			path = optarg;
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
	if (optind != argc - 1) {
		fprintf(stderr, "kvpalacectl: %s\n",
			optind >= argc ? "missing command" : "too many arguments");
		fprintf(stderr, "Try 'kvpalacectl --help'.\n");
		return EXIT_USAGE;
	}
	cmd = argv[optind];
	if (strcmp(cmd, "ping") != 0 && strcmp(cmd, "stats") != 0) {
		fprintf(stderr, "kvpalacectl: unknown command '%s'\n", cmd);
		fprintf(stderr, "Try 'kvpalacectl --help'.\n");
		return EXIT_USAGE;
	}
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
	else
		ret = cmd_stats(c, path, json);
	kvp_disconnect(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvpalacectl: writing output failed: %s\n", strerror(errno));
		return EXIT_DAEMON;
	}
	return ret;
}
