/* daemon/config.c — embedded defaults and command-line parsing. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "config.h"
#include "frame.h"
#include "log.h"

static uint64_t physical_bytes(void)
{
	struct sysinfo si;

	if (sysinfo(&si) < 0)
		return 4ull << 30;
	return (uint64_t)si.totalram * si.mem_unit;
}

void config_defaults(struct config *c)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[CONFIG_PATH_MAX];
	uint64_t ram = physical_bytes();

	memset(c, 0, sizeof(*c));
	if (geteuid() != 0 && xdg && xdg[0] == '/')
		snprintf(dir, sizeof(dir), "%s/kvpalace", xdg);
	else
		snprintf(dir, sizeof(dir), "/run/kvpalace");
	snprintf(c->socket_path, sizeof(c->socket_path), "%.90s/kvpalace.sock", dir);
	snprintf(c->admin_socket_path, sizeof(c->admin_socket_path), "%.90s/admin.sock", dir);
	if (geteuid() == 0) {
		snprintf(c->state_dir, sizeof(c->state_dir), "/var/lib/kvpalace");
		snprintf(c->cache_dir, sizeof(c->cache_dir), "/var/cache/kvpalace");
	} else {
		const char *home = getenv("HOME");

		snprintf(c->state_dir, sizeof(c->state_dir), "%s/.local/state/kvpalace",
			 home ? home : "/tmp");
		snprintf(c->cache_dir, sizeof(c->cache_dir), "%s/.cache/kvpalace",
			 home ? home : "/tmp");
	}
	/* Arenas are memfds: memory is only used once pages are written, but
	 * the sum is capped at a quarter of RAM so a full cache cannot push
	 * the inference processes it serves into swap. */
	c->host_tier_bytes = ram / 4;
	c->host_pool_bytes = c->host_tier_bytes < (1ull << 30) ? c->host_tier_bytes : 1ull << 30;
	c->host_high_watermark = 0.95;
	c->host_low_watermark = 0.90;
	c->max_message_bytes = FRAME_DEFAULT_MAX_BYTES;
	c->max_pools_per_tenant = 16;
	c->max_sessions_per_pool = 65536;
	c->max_leases_per_conn = 4096;
	c->max_connections = 1024;
	c->max_session_tokens = 4u << 20;
	c->socket_mode = 0666;
	c->admin_socket_mode = 0600;
	c->log_level = LOG_INFO;
}

int config_parse_size(const char *s, uint64_t *ret_bytes)
{
	char *end;
	unsigned long long v;
	uint64_t mult = 1;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
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
	case '%':
		if (end[1] || v == 0 || v > 100)
			return -EINVAL;
		*ret_bytes = physical_bytes() / 100 * v;
		return 0;
	default:
		return -EINVAL;
	}
	if (*end && end[1] && !((end[1] == 'B' || end[1] == 'b') && !end[2]) &&
	    !((end[1] == 'i') && (end[2] == 'B') && !end[3]))
		return -EINVAL;
	if (v > UINT64_MAX / mult)
		return -ERANGE;
	*ret_bytes = v * mult;
	return 0;
}

uint32_t config_max_tokens_per_request(const struct config *c)
{
	/* Header, envelope and other fields fit comfortably in 256 bytes. */
	return (c->max_message_bytes - FRAME_HEADER_BYTES - 256) / 5;
}

void config_usage(const char *argv0)
{
	printf("Usage: %s [OPTIONS]\n"
	       "\n"
	       "kvpalaced keeps the attention KV cache of LLM inference processes on this\n"
	       "machine and shares it between them.\n"
	       "\n"
	       "  --socket PATH             client socket (default "
	       "$XDG_RUNTIME_DIR/kvpalace/kvpalace.sock,\n"
	       "                            /run/kvpalace/kvpalace.sock as root)\n"
	       "  --admin-socket PATH       admin socket (default admin.sock beside the client "
	       "socket)\n"
	       "  --state-dir DIR           durable state: checkpoints (default /var/lib/kvpalace "
	       "as root)\n"
	       "  --cache-dir DIR           spill files (default /var/cache/kvpalace as root)\n"
	       "  --host-tier-size SIZE     host memory for all pools (default 25%%)\n"
	       "  --host-pool-size SIZE     host arena of one pool (default min(1G, host tier))\n"
	       "  --host-high-watermark F   evict cached pages when a pool is fuller than this\n"
	       "                            fraction (default 0.95)...\n"
	       "  --host-low-watermark F    ...down to this fraction (default 0.90)\n"
	       "  --max-message-bytes N     largest control message, 4096..196608 (default %u)\n"
	       "  --max-pools-per-tenant N  (default 16)\n"
	       "  --max-sessions-per-pool N (default 65536)\n"
	       "  --max-leases-per-client N (default 4096)\n"
	       "  --max-connections N       (default 1024)\n"
	       "  --max-session-tokens N    (default 4194304)\n"
	       "  --socket-mode OCTAL       client socket permissions (default 0666)\n"
	       "  --admin-socket-mode OCTAL admin socket permissions (default 0600)\n"
	       "  --log-level LEVEL         err, warning, notice, info or debug (default info)\n"
	       "  -h, --help                show this help\n"
	       "  -V, --version             show the version\n"
	       "\n"
	       "SIZE accepts K, M, G, T suffixes (powers of 1024) or a percentage of RAM.\n",
	       argv0, FRAME_DEFAULT_MAX_BYTES);
}

enum {
	OPT_SOCKET = 256,
	OPT_ADMIN_SOCKET,
	OPT_STATE_DIR,
	OPT_CACHE_DIR,
	OPT_HOST_TIER,
	OPT_HOST_POOL,
	OPT_MAX_MESSAGE,
	OPT_MAX_POOLS,
	OPT_MAX_SESSIONS,
	OPT_MAX_LEASES,
	OPT_MAX_CONNS,
	OPT_MAX_TOKENS,
	OPT_SOCKET_MODE,
	OPT_ADMIN_MODE,
	OPT_LOG_LEVEL,
	OPT_HIGH_MARK,
	OPT_LOW_MARK,
};

static int parse_fraction(const char *s, double *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0.0 && v <= 1.0))
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, int base, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, base);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int set_path(char *dst, size_t cap, const char *src)
{
	if (!*src || strlen(src) >= cap)
		return -EINVAL;
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}

int config_parse_args(struct config *c, int argc, char **argv, enum config_action *ret_action,
		      char *err, size_t errlen)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, OPT_SOCKET},
		{"admin-socket", required_argument, NULL, OPT_ADMIN_SOCKET},
		{"state-dir", required_argument, NULL, OPT_STATE_DIR},
		{"cache-dir", required_argument, NULL, OPT_CACHE_DIR},
		{"host-tier-size", required_argument, NULL, OPT_HOST_TIER},
		{"host-pool-size", required_argument, NULL, OPT_HOST_POOL},
		{"max-message-bytes", required_argument, NULL, OPT_MAX_MESSAGE},
		{"max-pools-per-tenant", required_argument, NULL, OPT_MAX_POOLS},
		{"max-sessions-per-pool", required_argument, NULL, OPT_MAX_SESSIONS},
		{"max-leases-per-client", required_argument, NULL, OPT_MAX_LEASES},
		{"max-connections", required_argument, NULL, OPT_MAX_CONNS},
		{"max-session-tokens", required_argument, NULL, OPT_MAX_TOKENS},
		{"socket-mode", required_argument, NULL, OPT_SOCKET_MODE},
		{"admin-socket-mode", required_argument, NULL, OPT_ADMIN_MODE},
		{"log-level", required_argument, NULL, OPT_LOG_LEVEL},
		{"host-high-watermark", required_argument, NULL, OPT_HIGH_MARK},
		{"host-low-watermark", required_argument, NULL, OPT_LOW_MARK},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{0},
	};
	int admin_set = 0, host_pool_set = 0;
	int idx = -1;
	int opt, ret = 0;
	uint64_t v;

	*ret_action = CONFIG_RUN;
	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "hV", opts, &idx)) != -1) {
		const char *name = idx >= 0 ? opts[idx].name : "?";

		switch (opt) {
		case 'h':
			*ret_action = CONFIG_HELP;
			return 0;
		case 'V':
			*ret_action = CONFIG_VERSION;
			return 0;
		case OPT_SOCKET:
			ret = set_path(c->socket_path, sizeof(c->socket_path), optarg);
			break;
		case OPT_ADMIN_SOCKET:
			ret = set_path(c->admin_socket_path, sizeof(c->admin_socket_path), optarg);
			admin_set = 1;
			break;
		case OPT_STATE_DIR:
			ret = set_path(c->state_dir, sizeof(c->state_dir), optarg);
			break;
		case OPT_CACHE_DIR:
			ret = set_path(c->cache_dir, sizeof(c->cache_dir), optarg);
			break;
		case OPT_HOST_TIER:
			ret = config_parse_size(optarg, &c->host_tier_bytes);
			break;
		case OPT_HOST_POOL:
			ret = config_parse_size(optarg, &c->host_pool_bytes);
			host_pool_set = 1;
			break;
		case OPT_MAX_MESSAGE:
			ret = parse_u64(optarg, FRAME_MIN_MAX_BYTES, FRAME_MAX_MAX_BYTES, 10, &v);
			c->max_message_bytes = (uint32_t)v;
			break;
		case OPT_MAX_POOLS:
			ret = parse_u64(optarg, 1, 1u << 20, 10, &v);
			c->max_pools_per_tenant = (uint32_t)v;
			break;
		case OPT_MAX_SESSIONS:
			ret = parse_u64(optarg, 1, 1u << 30, 10, &v);
			c->max_sessions_per_pool = (uint32_t)v;
			break;
		case OPT_MAX_LEASES:
			ret = parse_u64(optarg, 1, 1u << 30, 10, &v);
			c->max_leases_per_conn = (uint32_t)v;
			break;
		case OPT_MAX_CONNS:
			ret = parse_u64(optarg, 1, 1u << 20, 10, &v);
			c->max_connections = (uint32_t)v;
			break;
		case OPT_MAX_TOKENS:
			ret = parse_u64(optarg, 1, 1ull << 32, 10, &c->max_session_tokens);
			break;
		case OPT_SOCKET_MODE:
			ret = parse_u64(optarg, 0, 0777, 8, &v);
			c->socket_mode = (uint32_t)v;
			break;
		case OPT_ADMIN_MODE:
			ret = parse_u64(optarg, 0, 0777, 8, &v);
			c->admin_socket_mode = (uint32_t)v;
			break;
		case OPT_HIGH_MARK:
			ret = parse_fraction(optarg, &c->host_high_watermark);
			break;
		case OPT_LOW_MARK:
			ret = parse_fraction(optarg, &c->host_low_watermark);
			break;
		case OPT_LOG_LEVEL:
			ret = log_parse_level(optarg);
			if (ret >= 0) {
				c->log_level = ret;
				ret = 0;
			}
			break;
		default:
			snprintf(err, errlen, "unknown option or missing value: %s",
				 argv[optind - 1 < argc ? optind - 1 : argc - 1]);
			return -EINVAL;
		}
		if (ret < 0) {
			snprintf(err, errlen, "bad value for --%s: '%s'", name, optarg);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument: %s", argv[optind]);
		return -EINVAL;
	}
	if (!admin_set) {
		/* The admin socket follows the client socket's directory. */
		const char *slash = strrchr(c->socket_path, '/');
		int dirlen = slash ? (int)(slash - c->socket_path) : 0;

		if (slash)
			snprintf(c->admin_socket_path, sizeof(c->admin_socket_path),
				 "%.*s/admin.sock", dirlen, c->socket_path);
		else
			snprintf(c->admin_socket_path, sizeof(c->admin_socket_path), "admin.sock");
	}
	if (!host_pool_set && c->host_pool_bytes > c->host_tier_bytes)
		c->host_pool_bytes = c->host_tier_bytes;
	if (c->host_low_watermark > c->host_high_watermark) {
		snprintf(err, errlen, "host low watermark above the high watermark");
		return -EINVAL;
	}
	if (c->host_pool_bytes < 4096 || c->host_pool_bytes > c->host_tier_bytes) {
		snprintf(err, errlen, "host pool size must be between 4K and the host tier size");
		return -EINVAL;
	}
	return 0;
}
