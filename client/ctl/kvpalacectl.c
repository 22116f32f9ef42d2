/* client/ctl/kvpalacectl.c — the control CLI of kvpalaced: its command
 * table, help, command-line parsing and main().
 *
 *   kvpalacectl [--socket PATH] [--json] COMMAND [ARGS] [OPTIONS]
 *   kvpalacectl help [COMMAND]          kvpalacectl COMMAND --help
 *
 * Talks to the daemon's admin socket (--socket, else $KVPALACE_ADMIN_SOCKET,
 * else kvp_default_admin_socket_path()) through the public client library
 * only. Views: `status`, `ping`, `stats`, `pools`, `sessions`, `latency`,
 * `metrics`, `session show ID` and `checkpoints`; steering: `drop session ID`, `drop
 * pool ID`, `evict --tier TIER --bytes SIZE`, `purge ...`, `config show`, `config
 * reload`, `checkpoint SESSION_ID NAME`, `checkpoint rm NAME`, `restore
 * NAME`, `warmup NAME`.
 * Every command is described once, in the command table below, which
 * drives parsing (its operands and options), `help` and `--help`; each
 * runs in the file of its section: stats.c (status, ping, stats, pools,
 * sessions) with metrics.c, latency.c, session.c (session show, drop),
 * evict.c (evict, purge), config.c, checkpoint.c (checkpoint, restore,
 * warmup, checkpoints, checkpoint rm); common.c, table.c and jdoc.c hold
 * what they share. With --json each prints one JSON object instead of
 * text (built with jansson in jdoc.c); tables take --no-headers, and the
 * views --watch [SECONDS] and --count N (watch.c), which run the command
 * again on the same connection. Usage errors are said once the command is
 * known, naming it and its --help, whatever the order of the words; long
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
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * This file is the top of ctl/: it calls the section files, none calls
 * it.
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

#include "checkpoint.h"
#include "common.h"
#include "config.h"
#include "events.h"
#include "evict.h"
#include "kvpalace.h"
#include "latency.h"
#include "session.h"
#include "stats.h"
#include "watch.h"

#ifndef KVP_VERSION
#define KVP_VERSION "unknown"
#endif

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
	{"status", NULL, OPT_WATCH | OPT_COUNT, 0, "", "the daemon in a few lines",
	 "The daemon in a few lines: its version, uptime, open connections; each tier\n"
	 "(host, disk, GPU) with its pages and bytes used of all, what moved (evicted,\n"
	 "spilled, promoted, copied) and what failed (verify failures, I/O and copy\n"
	 "errors); the prefix cache's token hit ratio (prompt tokens served from the\n"
	 "cache of those asked about), page hit ratio, and matches that found\n"
	 "anything; p50 and p99 latency of the three busiest request types;\n"
	 "checkpoints written, restored, refused, failed and removed.\n",
	 cmd_stats},
	{"ping", NULL, 0, 0, "", "time one round trip",
	 "Time one round trip to the daemon (a Hello) and say whether the connection\n"
	 "is an admin connection.\n",
	 cmd_ping},
	{"stats", NULL, OPT_WATCH | OPT_COUNT, 0, "", "daemon counters and one row per pool",
	 "The daemon's counters (requests, errors, prefix-match hits and misses,\n"
	 "queried and matched tokens and pages with the hit ratios, appended and\n"
	 "committed tokens, evictions, dedup, purges, bad disconnects, sessions,\n"
	 "checkpoints, the disk tier's I/O and its spilled, promoted, verify\n"
	 "failures and I/O errors, GPU status) and the pools' table as `pools`\n"
	 "shows it, with pages held by uncommitted reservations (RESERVED).\n",
	 cmd_stats},
	{"pools", NULL, OPT_NO_HEADERS | OPT_WATCH | OPT_COUNT, 0, "",
	 "one row per pool: its pages in each tier",
	 "One row per pool: id, owning uid, model id, layout, page size (PAGE); pages\n"
	 "used of all in each tier, and their bytes (HOST and HOST-BYTES for the\n"
	 "pool's arena, DISK and DISK-BYTES for its spill file, GPU and GPU-BYTES for\n"
	 "its device arena; - where the pool has no such tier); pages held by the\n"
	 "prefix index in any tier (INDEXED), indexed leaves eviction may take\n"
	 "(EVICTABLE), pages pinned by read leases, sessions, pages evicted from the\n"
	 "host tier, written to disk (SPILLED) and read back (PROMOTED), verify\n"
	 "failures, I/O and copy errors (ERRORS), pages saved by dedup. Then each\n"
	 "pool's spill file and device arena in words (not with --no-headers).\n",
	 cmd_stats},
	{"sessions", NULL, OPT_POOL | OPT_NO_HEADERS | OPT_WATCH | OPT_COUNT, 0, " [--pool ID]",
	 "one row per session",
	 "One row per session, in id order: id, pool, owning uid, tokens, committed\n"
	 "tokens, pages, pages another holder shares (SHARED), idle time, whether a\n"
	 "client holds uncommitted tokens (WRITING).\n"
	 "\n"
	 "  -p, --pool ID       only the sessions of pool ID\n",
	 cmd_sessions},
	{"latency", NULL, OPT_NO_HEADERS | OPT_WATCH | OPT_COUNT, 0, "",
	 "how long the daemon takes to answer",
	 "How long the daemon took to answer each request type since it started, from\n"
	 "the request's arrival to its reply being queued, busiest first: requests\n"
	 "answered, mean, and the 50th, 90th and 99th percentiles. The daemon counts\n"
	 "them in buckets (10us, 25us, 50us, 100us, ... 10s, above), so a percentile\n"
	 "is the upper bound of its bucket: \"p99 1ms\" is \"99% took at most 1 ms\".\n"
	 "On the client socket, the caller's own requests. With --json, the buckets\n"
	 "and their bounds too.\n",
	 cmd_latency},
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
	 "no lease), in the pool's eviction order (kvpalaced --eviction), pool by\n"
	 "pool (oldest pool first), until SIZE bytes are freed (whole pages, never\n"
	 "more than SIZE) or nothing is left to evict. From the host tier pages go\n"
	 "down to the disk tier, as the watermarks move them: a page with a disk\n"
	 "copy leaves at once and stays on disk, the others are written first;\n"
	 "with --discard, or without a disk tier, those without a disk copy are\n"
	 "dropped instead, leaves of the hash chain first (to forget pages in\n"
	 "every tier, evict the disk tier too, or purge). From the disk tier their\n"
	 "disk copies go for good (a page in the host tier stays there). From the\n"
	 "GPU tier, device copies no lease holds. Prints the pages and bytes\n"
	 "evicted, how many were demoted or dropped, per pool. Runs as many short\n"
	 "requests; a bar shows progress when standard output is a terminal.\n"
	 "\n"
	 "  -t, --tier TIER     host, disk or gpu; a daemon without that tier\n"
	 "                      refuses it\n"
	 "  -d, --discard       host: drop pages without a disk copy instead of\n"
	 "                      writing them to disk\n"
	 "  -b, --bytes SIZE    at most SIZE bytes: 4096, 64K, 512M, 2G (powers of\n"
	 "                      1024), or all\n"
	 "  -p, --pool ID       only from pool ID\n",
	 cmd_evict},
	{"purge", NULL, OPT_POOL | OPT_UID | OPT_MODEL | OPT_SALT | OPT_EXTRA_KEY | OPT_UNUSED, 0,
	 " [--pool ID] [--uid UID] [--model ID] [--salt TEXT|--salt-hex HEX [--extra-key TEXT]]"
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
	 "  --extra-key TEXT    with --salt: the pages of that salt committed under\n"
	 "                      the extra key TEXT (a LoRA adapter's id; without it,\n"
	 "                      those under none)\n"
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
	{"checkpoints", NULL, OPT_UID | OPT_VERIFY | OPT_NO_HEADERS, 0, " [--uid UID] [--verify]",
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
	{"events", NULL, OPT_POOL | OPT_COUNT, 0, " [--pool ID] [--count N]",
	 "follow the KV events routers read",
	 "Follow the daemon's KV events, one line each as they come, until\n"
	 "interrupted: a page that entered a pool's prefix index (stored: committed,\n"
	 "or found on disk at a restart) with its hash chain and its parent's, one\n"
	 "that left it (removed: evicted, dropped, purged), and a pool that ended\n"
	 "(cleared). Each line: the event's number, kind, pool, tier and hash. On\n"
	 "the admin socket every pool's; a line says when events were lost because\n"
	 "this reader fell behind. With --json, one object per line (with the\n"
	 "page's tokens where the event carries them).\n"
	 "\n"
	 "  -p, --pool ID       only the events of pool ID\n"
	 "  -n, --count N       stop after N events\n",
	 cmd_events},
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
		"                      $XDG_RUNTIME_DIR/kvpalace/admin.sock where a\n"
		"                      socket is there, else /run/kvpalace/admin.sock;\n"
		"                      here: %s)\n"
		"  -j, --json          print one JSON object instead of text\n"
		"  -h, --help          print this help (after a command: its help) and exit\n"
		"  -V, --version       print the version and exit\n"
		"\n"
		"'kvpalacectl help COMMAND' or 'kvpalacectl COMMAND --help' describes a\n"
		"command and its options: the tables take --no-headers, the views\n"
		"--watch [SECONDS] and --count N.\n"
		"\n"
		"%s",
		"help [COMMAND]", "describe the commands, or one", def, exit_text);
}

static void command_help(FILE *f, const struct command *cmd)
{
	fprintf(f, "Usage: kvpalacectl [--socket PATH] [--json] %s%s%s%s%s%s\n\n%s", cmd->name,
		cmd->operands ? " " : "", cmd->operands ? cmd->operands : "", cmd->synopsis,
		cmd->opts & OPT_NO_HEADERS ? " [--no-headers]" : "",
		cmd->opts & OPT_WATCH ? " [--watch [SECONDS]] [--count N]" : "", cmd->help);
	if (cmd->opts & (OPT_NO_HEADERS | OPT_WATCH))
		fprintf(f, "%s", strstr(cmd->help, "\n  -") ? "" : "\n");
	if (cmd->opts & OPT_NO_HEADERS)
		fprintf(f, "  -H, --no-headers    the table's rows only, no header line (for\n"
			   "                      scripts)\n");
	if (cmd->opts & OPT_WATCH)
		fprintf(f,
			"  -w, --watch [SECONDS]\n"
			"                      show it again every SECONDS (default 2, at least\n"
			"                      0.1) until interrupted (Ctrl-C, exit status 0): on\n"
			"                      a terminal each view replaces the last; otherwise\n"
			"                      views are appended, each after a \"--- TIME ---\"\n"
			"                      line, or with --json one object a line\n"
			"  -n, --count N       stop after N views (with or without --watch)\n");
	fprintf(f, "\n");
	fprintf(f,
		"  -s, --socket PATH   the admin socket\n"
		"  -j, --json          print one JSON object instead of text\n"
		"\n%s",
		exit_text);
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
		return usage_error(NULL, "unknown command '%s'", words[0]);
	group_members(words[0], members, sizeof(members));
	if (n < 2)
		return usage_error(words[0], "missing one of: %s", members);
	return usage_error(words[0], "unknown command '%s %s' (one of: %s)", words[0], words[1],
			   members);
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
	case OPT_EXTRA_KEY:
		return "--extra-key";
	case OPT_UNUSED:
		return "--unused-since";
	case OPT_NO_HEADERS:
		return "--no-headers";
	case OPT_WATCH:
		return "--watch";
	case OPT_COUNT:
		return "--count";
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
				return usage_error(cmd->name, "missing the %s ID",
						   strstr(cmd->name, "pool") ? "pool" : "session");
			return usage_error(cmd->name, "missing %s", op);
		}
		if (is_id && parse_id(words[k], &a->id) < 0)
			return usage_error(cmd->name,
					   "%.*s wants an id (a number above 0), not '%s'",
					   (int)len, op, words[k]);
		if (!is_id) {
			if (kvp_checkpoint_name_check(words[k]) < 0)
				return usage_error(cmd->name,
						   "'%s' is not a checkpoint name: 1..%d of A-Z "
						   "a-z 0-9 . _ -, starting with a letter, a "
						   "digit or _",
						   words[k], KVP_CHECKPOINT_NAME_MAX);
			a->ckpt = words[k];
		}
		op += len;
		op += *op == ' ';
	}
	if (n > k)
		return usage_error(cmd->name, "unexpected argument '%s'", words[k]);
	return 0;
}

/* The first mistake found among the options, said once the command they
 * go with is known (getopt reads every option before the words). */
static char opt_error[512];

static void defer_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void defer_error(const char *fmt, ...)
{
	va_list ap;

	if (opt_error[0])
		return;
	va_start(ap, fmt);
	vsnprintf(opt_error, sizeof(opt_error), fmt, ap);
	va_end(ap);
}

#define DEFER(...)                                                                                 \
	{                                                                                          \
		defer_error(__VA_ARGS__);                                                          \
		continue;                                                                          \
	}

/* Parses seconds for --watch: "2", "0.5"; 0.1 to a day. Returns 0 and
 * the milliseconds, or -EINVAL. */
static int parse_seconds(const char *s, uint64_t *ret_ms)
{
	double v;
	char *end;

	if ((*s < '0' || *s > '9') && *s != '.')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !(v >= 0.1 && v <= 86400))
		return -EINVAL;
	*ret_ms = (uint64_t)(v * 1000 + 0.5);
	return 0;
}

/* What an option takes, for "missing --bytes SIZE". */
static const char *opt_operand(unsigned int opt)
{
	switch (opt) {
	case OPT_POOL:
		return " ID";
	case OPT_TIER:
		return " TIER";
	case OPT_BYTES:
		return " SIZE";
	case OPT_PAGES:
	case OPT_COUNT:
		return " N";
	case OPT_UID:
		return " UID";
	default:
		return "";
	}
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
		{"extra-key", required_argument, NULL, 'K'},
		{"unused-since", required_argument, NULL, 'U'},
		{"no-headers", no_argument, NULL, 'H'},
		{"watch", optional_argument, NULL, 'w'},
		{"count", required_argument, NULL, 'n'},
		{NULL, 0, NULL, 0},
	};
	struct args a = {0};
	const struct command *cmd;
	char def[4096];
	char *const *words;
	int help = 0, n_words, used, opt, ret;
	kvp_client *c;

	opterr = 0; /* its messages name no command: ours do */
	while ((opt = getopt_long(argc, argv, ":s:p:jhVt:b:fu:vdm:Hw::n:", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			a.path = optarg;
			break;
		case 'p':
			if (parse_id(optarg, &a.pool_id) < 0)
				DEFER("--pool wants a pool id (a number above 0), "
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
				DEFER("--tier wants host, gpu or disk, not '%s'", optarg);
			a.given |= OPT_TIER;
			break;
		case 'b':
			if (parse_size(optarg, &a.bytes) < 0)
				DEFER("--bytes wants a size above 0 such as 4096, "
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
				DEFER("--model wants a model id of 1..127 characters");
			a.model = optarg;
			a.given |= OPT_MODEL;
			break;
		case 'S':
			if (strlen(optarg) > sizeof(a.salt))
				DEFER("--salt wants at most 64 bytes");
			a.salt_len = strlen(optarg);
			memcpy(a.salt, optarg, a.salt_len);
			a.given |= OPT_SALT;
			break;
		case 'X':
			if (parse_hex(optarg, a.salt, sizeof(a.salt), &a.salt_len) < 0)
				DEFER("--salt-hex wants up to 64 bytes in hexadecimal "
				      "(two digits each), not '%s'",
				      optarg);
			a.given |= OPT_SALT;
			break;
		case 'K':
			if (!*optarg || strlen(optarg) > 64)
				DEFER("--extra-key wants 1..64 bytes");
			a.extra_key = optarg;
			a.given |= OPT_EXTRA_KEY;
			break;
		case 'U':
			if (parse_since(optarg, &a.unused_since) < 0)
				DEFER("--unused-since wants @SECONDS since the epoch or "
				      "a duration such as 90s, 30m, 12h, 7d, not '%s'",
				      optarg);
			a.given |= OPT_UNUSED;
			break;
		case 'u':
			if (parse_count(optarg, UINT32_MAX, &a.uid) < 0)
				DEFER("--uid wants a user id (a number), not '%s'", optarg);
			a.given |= OPT_UID;
			break;
		case 'P':
			if (parse_count(optarg, 4096, &a.pages) < 0)
				DEFER("--pages wants a number of pages from 0 to "
				      "4096, not '%s'",
				      optarg);
			a.given |= OPT_PAGES;
			break;
		case 'H':
			a.given |= OPT_NO_HEADERS;
			break;
		case 'w':
			/* --watch SECONDS as well as --watch=SECONDS: the next word
			 * when it is a number (no command is one). */
			if (!optarg && optind < argc && argv[optind][0] &&
			    strspn(argv[optind], "0123456789.") == strlen(argv[optind]))
				optarg = argv[optind++];
			if (optarg && parse_seconds(optarg, &a.watch_ms) < 0)
				DEFER("--watch wants seconds from 0.1 to 86400 such as 2 or 0.5, "
				      "not '%s'",
				      optarg);
			a.given |= OPT_WATCH;
			break;
		case 'n':
			if (parse_count(optarg, UINT32_MAX, &a.count) < 0 || !a.count)
				DEFER("--count wants a number of views above 0, not '%s'", optarg);
			a.given |= OPT_COUNT;
			break;
		case ':':
			DEFER("option '%s' wants an argument", argv[optind - 1]);
		default:
			if (optopt && optopt != '?')
				DEFER("unknown option '-%c'", optopt);
			DEFER("unknown option '%s'", argv[optind - 1]);
		}
	}
	words = argv + optind;
	n_words = argc - optind;
	if (opt_error[0]) {
		int skip = n_words && !strcmp(words[0], "help");

		cmd = find_command(words + skip, n_words - skip, &used);
		return usage_error(cmd ? cmd->name : used ? words[skip] : NULL, "%s", opt_error);
	}

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
		return usage_error(NULL, "missing command");
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
			return usage_error(cmd->name, "%s does not go with %s", opt_name(o),
					   cmd->name);
		if ((cmd->needed & o) && !(a.given & o))
			return usage_error(cmd->name, "missing %s%s", opt_name(o), opt_operand(o));
	}
	/* --count alone watches at the default pace; --watch alone, forever
	 * (events counts events, it watches nothing). */
	if ((a.given & (OPT_WATCH | OPT_COUNT)) && (cmd->opts & OPT_WATCH) && !a.watch_ms)
		a.watch_ms = WATCH_DEFAULT_MS;

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
	if ((a.given & (OPT_WATCH | OPT_COUNT)) && (cmd->opts & OPT_WATCH))
		ret = watch_run(c, &a, cmd->run);
	else
		ret = cmd->run(c, &a);
	kvp_disconnect(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvpalacectl: writing output failed: %s\n", strerror(errno));
		return EXIT_DAEMON;
	}
	return ret;
}
