/* daemon/base/config.c — embedded defaults and command-line parsing. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "config.h"
#include "frame.h"
#include "layout.h"
#include "log.h"
#include "policy.h"

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
	/* bench/run --only trace: window ties or beats lru on every shape and
	 * capacity of the simulations (README, Performance). */
	c->eviction = CONFIG_EVICTION_WINDOW;
	c->host_high_watermark = 0.95;
	c->host_low_watermark = 0.90;
	/* A sparse file: disk is used only as pages spill. */
	c->disk_pool_bytes = 8ull << 30;
	c->disk_tier_bytes = 0;
	c->host_tenant_bytes = 0;
	c->disk_tenant_bytes = 32ull << 30;
	c->disk_reserve_bytes = 2ull << 30;
	c->max_message_bytes = FRAME_DEFAULT_MAX_BYTES;
	c->max_pools_per_tenant = 16;
	c->max_sessions_per_pool = 65536;
	c->max_leases_per_conn = 4096;
	c->max_connections = 1024;
	/* Half of max_connections unless set (config_parse_args): no user
	 * alone can take every connection. */
	c->max_connections_per_user = 512;
	/* A pipelining client is served in batches of this many; a client
	 * that stops reading holds at most about this many replies. */
	c->max_requests_in_flight = 256;
	/* 512 MiB of reservation at 8 KiB pages, more with bigger ones. */
	c->max_reserved_pages = 65536;
	/* A lease keeps the tokens and hashes of each page it pins (about
	 * 100 bytes a page): 4M tokens at 16 per page is ~25 MiB a client. */
	c->max_leased_pages = 262144;
	c->max_session_tokens = 4u << 20;
	c->max_tenant_tokens = 32u << 20;
	c->socket_mode = 0666;
	c->admin_socket_mode = 0600;
	c->log_level = LOG_INFO;
	/* Device memory is allocated whole when a pool opens (cuMemCreate
	 * commits it), and inference processes need most of the GPU: a
	 * modest arena per pool, only where a GPU exists. */
	c->gpu_pool_bytes = 1ull << 30;
	c->gpu_tier_bytes = 8ull << 30;
	c->gpu_high_watermark = 0.90;
	c->gpu_low_watermark = 0.80;
	/* The remote tier: a round trip of a 2 MiB value on a LAN is a few ms;
	 * a node that does not answer in half a second is a miss. */
	c->remote_timeout_ms = 500;
	c->remote_threads = 4;
	c->remote_max_inflight_bytes = 256ull << 20;
	/* Long enough for a client to restart and adopt what it left,
	 * short enough that forgotten ones do not pile up for days. */
	c->session_idle_timeout_s = 3600;
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

/* ---- remote-tenants ------------------------------------------------------ */

static int tenant_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       strchr("._-@:", ch) != NULL;
}

/* The entry of "UID=NAME" (or "*=NAME") at s, up to the next comma or the
 * end: *ret_any for "*", else *ret_uid; the name's start and length.
 * Returns the bytes the entry takes, or -EINVAL. */
static int tenant_entry(const char *s, int *ret_any, unsigned long *ret_uid, const char **ret_name,
			size_t *ret_len)
{
	const char *eq = s, *name, *end;
	char *stop;

	while (*eq && *eq != '=' && *eq != ',')
		eq++;
	if (*eq != '=')
		return -EINVAL;
	*ret_any = eq == s + 1 && *s == '*';
	if (!*ret_any) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		*ret_uid = strtoul(s, &stop, 10);
		if (errno || stop != eq || *ret_uid >= (unsigned long)(uid_t)-1)
			return -EINVAL;
	}
	name = end = eq + 1;
	while (*end && *end != ',') {
		if (!tenant_char(*end))
			return -EINVAL;
		end++;
	}
	if (end == name || end - name > CONFIG_REMOTE_TENANT_MAX)
		return -EINVAL;
	*ret_name = name;
	*ret_len = (size_t)(end - name);
	return (int)(end - s) + (*end == ',');
}

static int set_remote_tenants(struct config *c, const char *v)
{
	size_t len = strlen(v);

	if (!strcmp(v, "none")) { /* as config show prints no entry */
		c->remote_tenants[0] = 0;
		return 0;
	}
	if (len >= sizeof(c->remote_tenants))
		return -EINVAL;
	for (const char *s = v; *s;) {
		const char *name;
		size_t n;
		unsigned long uid;
		int any, used = tenant_entry(s, &any, &uid, &name, &n);

		if (used < 0 || (s[used - 1] == ',' && !s[used]))
			return -EINVAL;
		s += used;
	}
	memcpy(c->remote_tenants, v, len + 1);
	return 0;
}

const char *config_remote_tenant(const struct config *c, uid_t uid, char *buf, size_t n)
{
	const char *found = NULL;
	size_t found_len = 0;

	for (const char *s = c->remote_tenants; *s;) {
		const char *name;
		size_t len;
		unsigned long u;
		int any, used = tenant_entry(s, &any, &u, &name, &len);

		if (used < 0)
			return NULL; /* checked when set: not reached */
		if (!any && u == (unsigned long)uid) {
			found = name, found_len = len;
			break;
		}
		if (any && !found)
			found = name, found_len = len;
		s += used;
	}
	if (!found || found_len + 1 > n)
		return NULL;
	memcpy(buf, found, found_len);
	buf[found_len] = 0;
	return buf;
}

uint32_t config_max_tokens_per_request(const struct config *c)
{
	/* Header, envelope and other fields fit comfortably in 256 bytes. */
	return (c->max_message_bytes - FRAME_HEADER_BYTES - 256) / 5;
}

/* ---- keys: one table for the file and the command line ------------------ */

enum config_source {
	SRC_DEFAULT,
	SRC_PRESET,
	SRC_FILE,
	SRC_CLI,
};

static const char *const source_names[] = {"default", "preset", "file", "command line"};

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

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, int base, uint32_t *ret)
{
	uint64_t v;
	int err = parse_u64(s, lo, hi, base, &v);

	if (err == 0)
		*ret = (uint32_t)v;
	return err;
}

/* A fraction in (0, 1], or [0, 1] when may_be_zero. */
static int parse_fraction_from(const char *s, int may_be_zero, double *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !((v > 0.0 || (may_be_zero && v == 0.0)) && v <= 1.0))
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_fraction(const char *s, double *ret)
{
	return parse_fraction_from(s, 0, ret);
}

/* A size of device memory: as config_parse_size, but a percentage would be
 * of host RAM, which says nothing about the GPU's: refused. */
static int parse_device_size(const char *s, uint64_t *ret)
{
	if (strchr(s, '%'))
		return -EINVAL;
	return config_parse_size(s, ret) < 0 ? -EINVAL : 0;
}

/* A duration such as "90", "90s", "30m", "1h" or "7d", at most 366 days;
 * "0" is 0. */
static int parse_duration(const char *s, uint64_t *ret_s)
{
	static const struct {
		char suffix;
		uint64_t s;
	} units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
	uint64_t mult = 1, v;
	char num[24];
	size_t n = strlen(s);

	if (n == 0 || n >= sizeof(num))
		return -EINVAL;
	memcpy(num, s, n + 1);
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (n > 1 && num[n - 1] == units[i].suffix) {
			mult = units[i].s;
			num[n - 1] = '\0';
			break;
		}
	}
	if (parse_u64(num, 0, 366ull * 86400 / mult, 10, &v) < 0)
		return -EINVAL;
	*ret_s = v * mult;
	return 0;
}

/* A duration in the largest unit that shows it exactly. */
static void show_duration(uint64_t s, char *buf, size_t n)
{
	if (s && s % 86400 == 0)
		snprintf(buf, n, "%llud", (unsigned long long)(s / 86400));
	else if (s && s % 3600 == 0)
		snprintf(buf, n, "%lluh", (unsigned long long)(s / 3600));
	else if (s && s % 60 == 0)
		snprintf(buf, n, "%llum", (unsigned long long)(s / 60));
	else if (s)
		snprintf(buf, n, "%llus", (unsigned long long)s);
	else
		snprintf(buf, n, "0");
}

static int set_path(char *dst, size_t cap, const char *src)
{
	if (!*src || strlen(src) >= cap)
		return -EINVAL;
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}

enum key_id {
	K_SOCKET,
	K_ADMIN_SOCKET,
	K_STATE_DIR,
	K_CACHE_DIR,
	K_HOST_TIER,
	K_HOST_POOL,
	K_HIGH_MARK,
	K_LOW_MARK,
	K_MAX_MESSAGE,
	K_MAX_POOLS,
	K_MAX_SESSIONS,
	K_MAX_LEASES,
	K_MAX_CONNS,
	K_MAX_CONNS_USER,
	K_MAX_IN_FLIGHT,
	K_MAX_RESERVED,
	K_MAX_LEASED,
	K_MAX_TOKENS,
	K_SOCKET_MODE,
	K_ADMIN_MODE,
	K_LOG_LEVEL,
	K_DISK_POOL,
	K_IO_BACKEND,
	K_EVENT_LOOP,
	K_WARMUP_DIR,
	K_SESSION_POLICY,
	K_SESSION_BUDGET,
	K_SESSION_AUTO_COMPACT,
	K_SPILL_DTYPE,
	K_GPU_POOL,
	K_GPU_HIGH_MARK,
	K_GPU_LOW_MARK,
	K_GPU_TIER,
	K_DISK_TIER,
	K_DISK_TENANT,
	K_DISK_RESERVE,
	K_HOST_TENANT,
	K_SESSION_IDLE_TIMEOUT,
	K_MAX_TENANT_TOKENS,
	K_EVICTION,
	K_DISK_ADMISSION,
	K_REMOTE_TIER,
	K_REMOTE_USER,
	K_REMOTE_PASSWORD_FILE,
	K_REMOTE_TIMEOUT,
	K_REMOTE_THREADS,
	K_REMOTE_INFLIGHT,
	K_REMOTE_TENANTS,
	K_REMOTE_WRITE,
	K_REMOTE_EVENTS,
	K_PREWARM_MARK,
	K_COUNT,
};
_Static_assert(K_COUNT <= CONFIG_MAX_KEYS, "config.src holds a source per key");

static const char *const key_names[K_COUNT] = {
	[K_SOCKET] = "socket",
	[K_ADMIN_SOCKET] = "admin-socket",
	[K_STATE_DIR] = "state-dir",
	[K_CACHE_DIR] = "cache-dir",
	[K_HOST_TIER] = "host-tier-size",
	[K_HOST_POOL] = "host-pool-size",
	[K_HIGH_MARK] = "host-high-watermark",
	[K_LOW_MARK] = "host-low-watermark",
	[K_MAX_MESSAGE] = "max-message-bytes",
	[K_MAX_POOLS] = "max-pools-per-tenant",
	[K_MAX_SESSIONS] = "max-sessions-per-pool",
	[K_MAX_LEASES] = "max-leases-per-client",
	[K_MAX_CONNS] = "max-connections",
	[K_MAX_CONNS_USER] = "max-connections-per-user",
	[K_MAX_IN_FLIGHT] = "max-requests-in-flight",
	[K_MAX_RESERVED] = "max-reserved-pages-per-client",
	[K_MAX_LEASED] = "max-leased-pages-per-client",
	[K_MAX_TOKENS] = "max-session-tokens",
	[K_SOCKET_MODE] = "socket-mode",
	[K_ADMIN_MODE] = "admin-socket-mode",
	[K_LOG_LEVEL] = "log-level",
	[K_DISK_POOL] = "disk-pool-size",
	[K_IO_BACKEND] = "io-backend",
	[K_EVENT_LOOP] = "event-loop",
	[K_EVICTION] = "eviction",
	[K_DISK_ADMISSION] = "disk-admission",
	[K_WARMUP_DIR] = "warmup-dir",
	[K_SESSION_POLICY] = "session-policy",
	[K_SESSION_BUDGET] = "session-budget",
	[K_SESSION_AUTO_COMPACT] = "session-auto-compact",
	[K_SPILL_DTYPE] = "spill-dtype",
	[K_GPU_POOL] = "gpu-pool-size",
	[K_GPU_HIGH_MARK] = "gpu-high-watermark",
	[K_GPU_LOW_MARK] = "gpu-low-watermark",
	[K_GPU_TIER] = "gpu-tier-size",
	[K_DISK_TIER] = "disk-tier-size",
	[K_DISK_TENANT] = "disk-tenant-size",
	[K_DISK_RESERVE] = "disk-reserve",
	[K_HOST_TENANT] = "host-tenant-size",
	[K_SESSION_IDLE_TIMEOUT] = "session-idle-timeout",
	[K_MAX_TENANT_TOKENS] = "max-tenant-tokens",
	[K_REMOTE_TIER] = "remote-tier",
	[K_REMOTE_USER] = "remote-user",
	[K_REMOTE_PASSWORD_FILE] = "remote-password-file",
	[K_REMOTE_TIMEOUT] = "remote-timeout-ms",
	[K_REMOTE_THREADS] = "remote-threads",
	[K_REMOTE_INFLIGHT] = "remote-max-inflight-mb",
	[K_REMOTE_TENANTS] = "remote-tenants",
	[K_REMOTE_WRITE] = "remote-write",
	[K_REMOTE_EVENTS] = "remote-events",
	[K_PREWARM_MARK] = "host-prewarm-watermark",
};

static const char *const io_backends[] = {"auto", "io_uring", "threads"};
/* Indexed by enum loop_want (daemon/io/loop.h). */
static const char *const event_loops[] = {"auto", "io_uring", "epoll"};
static const char *const evictions[] = {"lru", "lfu", "window"};
static const char *const admissions[] = {"all", "reused"};
static const char *const remote_writes[] = {"commit", "reuse", "eviction"};
/* Indexed by enum policy_kind. */
static const char *const policy_names[] = {"none", "window", "sinks", "importance", "hierarchy"};

static int parse_bool(const char *s, int *ret)
{
	if (!strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "1"))
		*ret = 1;
	else if (!strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "0"))
		*ret = 0;
	else
		return -EINVAL;
	return 0;
}

/* "redis://host:port[,host:port...]", each port 1..65535, at most
 * CONFIG_REMOTE_NODES nodes; "" (none) too. nodes may be NULL (check
 * only); buf (CONFIG_REMOTE_MAX bytes) receives the host:port strings. */
static int split_remote(const char *v, char *buf, const char **nodes, unsigned int max)
{
	static const char scheme[] = "redis://";
	char tmp[CONFIG_REMOTE_MAX];
	char *p, *save = NULL;
	unsigned int n = 0;

	if (!*v)
		return 0;
	if (strncmp(v, scheme, sizeof(scheme) - 1) || strlen(v) >= sizeof(tmp))
		return -EINVAL;
	if (!buf)
		buf = tmp;
	snprintf(buf, CONFIG_REMOTE_MAX, "%s", v + sizeof(scheme) - 1);
	for (save = buf; (p = strsep(&save, ","));) {
		char *colon = strrchr(p, ':'), *end;
		unsigned long port;

		if (!*p || !colon || colon == p || n >= CONFIG_REMOTE_NODES ||
		    (nodes && n >= max) || strpbrk(p, " \t/@?#"))
			return -EINVAL;
		errno = 0;
		port = strtoul(colon + 1, &end, 10);
		if (errno || *end || !colon[1] || port < 1 || port > 65535)
			return -EINVAL;
		if (nodes)
			nodes[n] = p;
		n++;
	}
	return n ? (int)n : -EINVAL;
}

int config_remote_nodes(const struct config *c, char *buf, const char **nodes, unsigned int max)
{
	return split_remote(c->remote_tier, buf, nodes, max);
}

int config_read_secret(const char *path, char *buf, size_t size, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	struct stat st;
	ssize_t n;
	size_t got = 0;
	int ret;

	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return ret;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a regular file", path);
		ret = -EINVAL;
		goto out;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 077)) {
		snprintf(err, errlen,
			 "%s: a password file must be owned by uid %u with mode 0600 or stricter "
			 "(it is uid %u, mode %04o)",
			 path, (unsigned int)geteuid(), (unsigned int)st.st_uid,
			 (unsigned int)(st.st_mode & 07777));
		ret = -EPERM;
		goto out;
	}
	while ((n = read(fd, buf + got, size - got)) > 0) {
		got += (size_t)n;
		if (got == size) {
			snprintf(err, errlen, "%s: longer than %zu bytes", path, size - 1);
			ret = -EFBIG;
			goto out;
		}
	}
	if (n < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (got && buf[got - 1] == '\n')
		got--;
	if (got && buf[got - 1] == '\r')
		got--;
	buf[got] = 0;
	if (!got || memchr(buf, 0, got)) {
		snprintf(err, errlen, "%s: empty, or not text", path);
		ret = -EINVAL;
		goto out;
	}
	ret = 0;
out:
	if (ret < 0)
		explicit_bzero(buf, size);
	close(fd);
	return ret;
}

static int key_of(const char *name)
{
	for (int k = 0; k < K_COUNT; k++)
		if (!strcmp(name, key_names[k]))
			return k;
	return -1;
}

/* Sets key k from text v; returns 0 or -EINVAL. */
static int set_key(struct config *c, int k, const char *v)
{
	int ret;

	switch (k) {
	case K_SOCKET:
		return set_path(c->socket_path, sizeof(c->socket_path), v);
	case K_ADMIN_SOCKET:
		return set_path(c->admin_socket_path, sizeof(c->admin_socket_path), v);
	case K_STATE_DIR:
		return set_path(c->state_dir, sizeof(c->state_dir), v);
	case K_CACHE_DIR:
		return set_path(c->cache_dir, sizeof(c->cache_dir), v);
	case K_HOST_TIER:
		return config_parse_size(v, &c->host_tier_bytes) < 0 ? -EINVAL : 0;
	case K_HOST_POOL:
		return config_parse_size(v, &c->host_pool_bytes) < 0 ? -EINVAL : 0;
	case K_HIGH_MARK:
		return parse_fraction(v, &c->host_high_watermark);
	case K_LOW_MARK:
		return parse_fraction(v, &c->host_low_watermark);
	case K_PREWARM_MARK:
		return parse_fraction_from(v, 1, &c->host_prewarm_watermark);
	case K_MAX_MESSAGE:
		return parse_u32(v, FRAME_MIN_MAX_BYTES, FRAME_MAX_MAX_BYTES, 10,
				 &c->max_message_bytes);
	case K_MAX_POOLS:
		return parse_u32(v, 1, 1u << 20, 10, &c->max_pools_per_tenant);
	case K_MAX_SESSIONS:
		return parse_u32(v, 1, 1u << 30, 10, &c->max_sessions_per_pool);
	case K_MAX_LEASES:
		return parse_u32(v, 1, 1u << 30, 10, &c->max_leases_per_conn);
	case K_MAX_CONNS:
		return parse_u32(v, 1, 1u << 20, 10, &c->max_connections);
	case K_MAX_CONNS_USER:
		return parse_u32(v, 1, 1u << 20, 10, &c->max_connections_per_user);
	case K_MAX_IN_FLIGHT:
		return parse_u32(v, 1, CONFIG_MAX_IN_FLIGHT, 10, &c->max_requests_in_flight);
	case K_MAX_RESERVED:
		return parse_u32(v, 1, 1u << 30, 10, &c->max_reserved_pages);
	case K_MAX_LEASED:
		return parse_u32(v, 1, 1u << 30, 10, &c->max_leased_pages);
	case K_MAX_TOKENS:
		return parse_u64(v, 1, 1ull << 32, 10, &c->max_session_tokens);
	case K_MAX_TENANT_TOKENS:
		return parse_u64(v, 1, 1ull << 40, 10, &c->max_tenant_tokens);
	case K_SOCKET_MODE:
		return parse_u32(v, 0, 0777, 8, &c->socket_mode);
	case K_ADMIN_MODE:
		return parse_u32(v, 0, 0777, 8, &c->admin_socket_mode);
	case K_LOG_LEVEL:
		ret = log_parse_level(v);
		if (ret < 0)
			return -EINVAL;
		c->log_level = ret;
		return 0;
	case K_DISK_POOL:
		return config_parse_size(v, &c->disk_pool_bytes) < 0 ? -EINVAL : 0;
	case K_DISK_TIER:
		return config_parse_size(v, &c->disk_tier_bytes) < 0 ? -EINVAL : 0;
	case K_DISK_TENANT:
		return config_parse_size(v, &c->disk_tenant_bytes) < 0 ? -EINVAL : 0;
	case K_DISK_RESERVE:
		return config_parse_size(v, &c->disk_reserve_bytes) < 0 ? -EINVAL : 0;
	case K_HOST_TENANT:
		return config_parse_size(v, &c->host_tenant_bytes) < 0 ? -EINVAL : 0;
	case K_WARMUP_DIR:
		return set_path(c->warmup_dir, sizeof(c->warmup_dir), v);
	case K_REMOTE_TENANTS:
		return set_remote_tenants(c, v);
	case K_REMOTE_EVENTS:
		if (!strcmp(v, "none")) {
			c->remote_events[0] = 0;
			return 0;
		}
		if (!*v || strlen(v) >= sizeof(c->remote_events))
			return -EINVAL;
		for (const char *q = v; *q; q++)
			if (*q <= ' ' || *q > '~')
				return -EINVAL;
		snprintf(c->remote_events, sizeof(c->remote_events), "%s", v);
		return 0;
	case K_REMOTE_WRITE:
		for (int i = 0; i < (int)(sizeof(remote_writes) / sizeof(remote_writes[0])); i++) {
			if (!strcmp(v, remote_writes[i])) {
				c->remote_write = i;
				return 0;
			}
		}
		return -EINVAL;
	case K_GPU_POOL:
		return parse_device_size(v, &c->gpu_pool_bytes);
	case K_GPU_HIGH_MARK:
		return parse_fraction(v, &c->gpu_high_watermark);
	case K_GPU_LOW_MARK:
		return parse_fraction(v, &c->gpu_low_watermark);
	case K_GPU_TIER:
		return parse_device_size(v, &c->gpu_tier_bytes);
	case K_SESSION_IDLE_TIMEOUT:
		return parse_duration(v, &c->session_idle_timeout_s);
	case K_IO_BACKEND:
		for (int i = 0; i < 3; i++)
			if (!strcmp(v, io_backends[i])) {
				c->io_backend = i;
				return 0;
			}
		return -EINVAL;
	case K_EVENT_LOOP:
		for (int i = 0; i < 3; i++)
			if (!strcmp(v, event_loops[i])) {
				c->event_loop = i;
				return 0;
			}
		return -EINVAL;
	case K_EVICTION:
		for (int i = 0; i < 3; i++)
			if (!strcmp(v, evictions[i])) {
				c->eviction = i;
				return 0;
			}
		return -EINVAL;
	case K_DISK_ADMISSION:
		for (int i = 0; i < 2; i++)
			if (!strcmp(v, admissions[i])) {
				c->disk_admission = i;
				return 0;
			}
		return -EINVAL;
	case K_SESSION_POLICY:
		for (int i = 0; i < 5; i++)
			if (!strcmp(v, policy_names[i])) {
				c->session_policy = i;
				return 0;
			}
		return -EINVAL;
	case K_SESSION_BUDGET:
		return parse_u32(v, 0, UINT32_MAX, 10, &c->session_budget);
	case K_REMOTE_TIER:
		/* "none", as config_print shows no tier, reads back. */
		if (!strcmp(v, "none"))
			v = "";
		if (split_remote(v, NULL, NULL, 0) < 0)
			return -EINVAL;
		snprintf(c->remote_tier, sizeof(c->remote_tier), "%s", v);
		return 0;
	case K_REMOTE_USER:
		if (!strcmp(v, "none")) {
			c->remote_user[0] = 0;
			return 0;
		}
		if (!*v || strlen(v) >= sizeof(c->remote_user) || strpbrk(v, " \t"))
			return -EINVAL;
		snprintf(c->remote_user, sizeof(c->remote_user), "%s", v);
		return 0;
	case K_REMOTE_PASSWORD_FILE:
		if (!strcmp(v, "none")) {
			c->remote_password_file[0] = 0;
			return 0;
		}
		return set_path(c->remote_password_file, sizeof(c->remote_password_file), v);
	case K_REMOTE_TIMEOUT:
		return parse_u32(v, 1, 60000, 10, &c->remote_timeout_ms);
	case K_REMOTE_THREADS:
		return parse_u32(v, 1, 32, 10, &c->remote_threads);
	case K_REMOTE_INFLIGHT: {
		uint64_t mb;

		if (parse_u64(v, 1, 1u << 20, 10, &mb) < 0)
			return -EINVAL;
		c->remote_max_inflight_bytes = mb << 20;
		return 0;
	}
	case K_SESSION_AUTO_COMPACT:
		return parse_bool(v, &c->session_auto_compact);
	case K_SPILL_DTYPE:
		if (!strcmp(v, "same"))
			c->spill_dtype = 0;
		else if (!strcmp(v, "int8"))
			c->spill_dtype = SHM_DTYPE_INT8;
		else if (!strcmp(v, "fp8"))
			c->spill_dtype = SHM_DTYPE_FP8_E4M3;
		else if (!strcmp(v, "int4"))
			c->spill_dtype = SHM_DTYPE_INT4;
		else
			return -EINVAL;
		return 0;
	default:
		return -EINVAL;
	}
}

static void show_key(const struct config *c, int k, char *buf, size_t n)
{
	static const char *const levels[] = {"emerg",	"alert",  "crit", "err",
					     "warning", "notice", "info", "debug"};

	switch (k) {
	case K_SOCKET:
		snprintf(buf, n, "%s", c->socket_path);
		break;
	case K_ADMIN_SOCKET:
		snprintf(buf, n, "%s", c->admin_socket_path);
		break;
	case K_STATE_DIR:
		snprintf(buf, n, "%s", c->state_dir);
		break;
	case K_CACHE_DIR:
		snprintf(buf, n, "%s", c->cache_dir);
		break;
	case K_HOST_TIER:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->host_tier_bytes >> 20));
		break;
	case K_HOST_POOL:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->host_pool_bytes >> 20));
		break;
	case K_HIGH_MARK:
		snprintf(buf, n, "%.2f", c->host_high_watermark);
		break;
	case K_LOW_MARK:
		snprintf(buf, n, "%.2f", c->host_low_watermark);
		break;
	case K_PREWARM_MARK:
		snprintf(buf, n, "%.2f", c->host_prewarm_watermark);
		break;
	case K_MAX_MESSAGE:
		snprintf(buf, n, "%u", c->max_message_bytes);
		break;
	case K_MAX_POOLS:
		snprintf(buf, n, "%u", c->max_pools_per_tenant);
		break;
	case K_MAX_SESSIONS:
		snprintf(buf, n, "%u", c->max_sessions_per_pool);
		break;
	case K_MAX_LEASES:
		snprintf(buf, n, "%u", c->max_leases_per_conn);
		break;
	case K_MAX_CONNS:
		snprintf(buf, n, "%u", c->max_connections);
		break;
	case K_MAX_CONNS_USER:
		snprintf(buf, n, "%u", c->max_connections_per_user);
		break;
	case K_MAX_IN_FLIGHT:
		snprintf(buf, n, "%u", c->max_requests_in_flight);
		break;
	case K_MAX_RESERVED:
		snprintf(buf, n, "%u", c->max_reserved_pages);
		break;
	case K_MAX_LEASED:
		snprintf(buf, n, "%u", c->max_leased_pages);
		break;
	case K_MAX_TOKENS:
		snprintf(buf, n, "%llu", (unsigned long long)c->max_session_tokens);
		break;
	case K_MAX_TENANT_TOKENS:
		snprintf(buf, n, "%llu", (unsigned long long)c->max_tenant_tokens);
		break;
	case K_SOCKET_MODE:
		snprintf(buf, n, "0%o", c->socket_mode);
		break;
	case K_ADMIN_MODE:
		snprintf(buf, n, "0%o", c->admin_socket_mode);
		break;
	case K_DISK_POOL:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->disk_pool_bytes >> 20));
		break;
	case K_DISK_TIER:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->disk_tier_bytes >> 20));
		break;
	case K_DISK_TENANT:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->disk_tenant_bytes >> 20));
		break;
	case K_DISK_RESERVE:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->disk_reserve_bytes >> 20));
		break;
	case K_HOST_TENANT:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->host_tenant_bytes >> 20));
		break;
	case K_IO_BACKEND:
		snprintf(buf, n, "%s", io_backends[c->io_backend]);
		break;
	case K_EVENT_LOOP:
		snprintf(buf, n, "%s", event_loops[c->event_loop]);
		break;
	case K_EVICTION:
		snprintf(buf, n, "%s", evictions[c->eviction]);
		break;
	case K_DISK_ADMISSION:
		snprintf(buf, n, "%s", admissions[c->disk_admission]);
		break;
	case K_GPU_POOL:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->gpu_pool_bytes >> 20));
		break;
	case K_GPU_HIGH_MARK:
		snprintf(buf, n, "%.2f", c->gpu_high_watermark);
		break;
	case K_GPU_LOW_MARK:
		snprintf(buf, n, "%.2f", c->gpu_low_watermark);
		break;
	case K_GPU_TIER:
		snprintf(buf, n, "%lluM", (unsigned long long)(c->gpu_tier_bytes >> 20));
		break;
	case K_SESSION_IDLE_TIMEOUT:
		show_duration(c->session_idle_timeout_s, buf, n);
		break;
	case K_REMOTE_TENANTS:
		snprintf(buf, n, "%s", c->remote_tenants[0] ? c->remote_tenants : "none");
		break;
	case K_REMOTE_WRITE:
		snprintf(buf, n, "%s", remote_writes[c->remote_write]);
		break;
	case K_REMOTE_EVENTS:
		snprintf(buf, n, "%s", c->remote_events[0] ? c->remote_events : "none");
		break;
	case K_WARMUP_DIR:
		if (c->warmup_dir[0])
			snprintf(buf, n, "%s", c->warmup_dir);
		else
			snprintf(buf, n, "%.4000s/warmup", c->state_dir);
		break;
	case K_LOG_LEVEL:
		snprintf(buf, n, "%s",
			 c->log_level >= 0 && c->log_level < 8 ? levels[c->log_level] : "?");
		break;
	case K_SESSION_POLICY:
		snprintf(buf, n, "%s", policy_names[c->session_policy]);
		break;
	case K_SESSION_BUDGET:
		snprintf(buf, n, "%u", c->session_budget);
		break;
	case K_REMOTE_TIER:
		snprintf(buf, n, "%s", c->remote_tier[0] ? c->remote_tier : "none");
		break;
	case K_REMOTE_USER:
		snprintf(buf, n, "%s", c->remote_user[0] ? c->remote_user : "none");
		break;
	case K_REMOTE_PASSWORD_FILE:
		snprintf(buf, n, "%s",
			 c->remote_password_file[0] ? c->remote_password_file : "none");
		break;
	case K_REMOTE_TIMEOUT:
		snprintf(buf, n, "%u", c->remote_timeout_ms);
		break;
	case K_REMOTE_THREADS:
		snprintf(buf, n, "%u", c->remote_threads);
		break;
	case K_REMOTE_INFLIGHT:
		snprintf(buf, n, "%llu", (unsigned long long)(c->remote_max_inflight_bytes >> 20));
		break;
	case K_SESSION_AUTO_COMPACT:
		snprintf(buf, n, "%s", c->session_auto_compact ? "yes" : "no");
		break;
	case K_SPILL_DTYPE:
		snprintf(buf, n, "%s",
			 c->spill_dtype == SHM_DTYPE_INT8	? "int8"
			 : c->spill_dtype == SHM_DTYPE_FP8_E4M3 ? "fp8"
			 : c->spill_dtype == SHM_DTYPE_INT4	? "int4"
								: "same");
		break;
	}
}

/* ---- presets ------------------------------------------------------------- */

/* Named templates per scenario: they set defaults, explicit keys win. */
static const struct {
	const char *preset, *key, *value;
} preset_keys[] = {
	/* Many 4-8k-token conversations. */
	{"chat", "max-session-tokens", "65536"},
	{"chat", "max-sessions-per-pool", "65536"},
	{"chat", "host-high-watermark", "0.95"},
	{"chat", "host-low-watermark", "0.90"},
	{"chat", "session-policy", "hierarchy"},
	{"chat", "session-budget", "8192"},
	/* Few sessions of tens of thousands of tokens, bigger pools. */
	{"long-document", "max-session-tokens", "1048576"},
	{"long-document", "max-sessions-per-pool", "4096"},
	{"long-document", "host-pool-size", "12%"},
	{"long-document", "host-low-watermark", "0.85"},
	{"long-document", "disk-pool-size", "64G"},
	{"long-document", "session-policy", "importance"},
	{"long-document", "session-budget", "32768"},
	/* A small machine: small host tier, few clients. */
	{"edge", "host-tier-size", "10%"},
	{"edge", "host-pool-size", "5%"},
	{"edge", "max-sessions-per-pool", "1024"},
	{"edge", "max-connections", "64"},
	{"edge", "max-session-tokens", "16384"},
	{"edge", "disk-pool-size", "2G"},
	{"edge", "session-policy", "importance"},
	{"edge", "session-budget", "2048"},
	{"edge", "session-auto-compact", "yes"},
};

static int apply_preset(struct config *c, const char *name)
{
	int found = 0;

	for (size_t i = 0; i < sizeof(preset_keys) / sizeof(preset_keys[0]); i++) {
		int k;

		if (strcmp(preset_keys[i].preset, name))
			continue;
		found = 1;
		k = key_of(preset_keys[i].key);
		kvp_assert(k >= 0 && set_key(c, k, preset_keys[i].value) == 0);
		c->src[k] = SRC_PRESET;
	}
	if (!found)
		return -EINVAL;
	snprintf(c->preset, sizeof(c->preset), "%s", name);
	return 0;
}

/* ---- the file (libinih) -------------------------------------------------- */

struct file_ctx {
	struct config *c;
	int pass; /* 0: only find the preset; 1: every other key */
	char preset[32];
	char why[160]; /* the first error */
};

/* value without an inline "# comment": a '#' at its start or after a space
 * or tab begins one, as ';' does for libinih, so that a line of
 * --print-config's output ("key = value   # default") reads back as it
 * was printed. Trailing blanks are trimmed. -ENAMETOOLONG when value does
 * not fit buf (no key takes values that long). */
static int strip_comment(const char *value, char *buf, size_t size)
{
	size_t n = 0;

	for (const char *p = value; *p; p++) {
		if (*p == '#' && (p == value || p[-1] == ' ' || p[-1] == '\t'))
			break;
		n++;
	}
	while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t'))
		n--;
	if (n >= size)
		return -ENAMETOOLONG;
	memcpy(buf, value, n);
	buf[n] = 0;
	return 0;
}

static int on_ini(void *user, const char *section, const char *name, const char *raw)
{
	struct file_ctx *f = user;
	char value[1024];
	int k;

	if (strip_comment(raw, value, sizeof(value)) < 0) {
		if (!f->why[0])
			snprintf(f->why, sizeof(f->why), "key '%.60s': value too long", name);
		return 0;
	}

	if (*section && strcmp(section, "kvpalaced")) {
		if (!f->why[0])
			snprintf(f->why, sizeof(f->why), "unknown section [%s]", section);
		return f->pass == 0; /* reported once, in the second pass */
	}
	if (!strcmp(name, "preset")) {
		if (f->pass == 0)
			snprintf(f->preset, sizeof(f->preset), "%.31s", value);
		return 1;
	}
	if (f->pass == 0)
		return 1;
	k = key_of(name);
	if (k < 0) {
		if (!f->why[0])
			snprintf(f->why, sizeof(f->why), "key '%.60s': unknown key", name);
		return 0;
	}
	if (set_key(f->c, k, value) < 0) {
		if (!f->why[0])
			snprintf(f->why, sizeof(f->why), "key '%s': bad value '%.60s'", name,
				 value);
		return 0;
	}
	f->c->src[k] = SRC_FILE;
	return 1;
}

/* ---- the command line ---------------------------------------------------- */

enum {
	OPT_CONFIG = 1000,
	OPT_PRESET,
	OPT_PRINT,
	OPT_KEY0, /* OPT_KEY0 + key id */
};

static void build_options(struct option *o)
{
	int n = 0;

	for (int k = 0; k < K_COUNT; k++)
		o[n++] = (struct option){key_names[k], required_argument, NULL, OPT_KEY0 + k};
	o[n++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
	o[n++] = (struct option){"preset", required_argument, NULL, OPT_PRESET};
	o[n++] = (struct option){"print-config", no_argument, NULL, OPT_PRINT};
	o[n++] = (struct option){"help", no_argument, NULL, 'h'};
	o[n++] = (struct option){"version", no_argument, NULL, 'V'};
	o[n] = (struct option){0};
}

int config_parse_args(struct config *c, int argc, char **argv, enum config_action *ret_action,
		      char *err, size_t errlen)
{
	struct option opts[K_COUNT + 6];
	const char *file = NULL, *preset = NULL;
	struct file_ctx f = {.c = c};
	int explicit_file = 0;
	int idx, opt, line;

	build_options(opts);
	*ret_action = CONFIG_RUN;
	/* Pass 1: what to do, which file, which preset. */
	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "hV", opts, &idx)) != -1) {
		switch (opt) {
		case 'h':
			*ret_action = CONFIG_HELP;
			return 0;
		case 'V':
			*ret_action = CONFIG_VERSION;
			return 0;
		case OPT_PRINT:
			*ret_action = CONFIG_PRINT;
			break;
		case OPT_CONFIG:
			file = optarg;
			explicit_file = 1;
			break;
		case OPT_PRESET:
			preset = optarg;
			break;
		case '?':
		case ':':
			snprintf(err, errlen, "unknown option or missing value: %s",
				 argv[optind - 1 < argc ? optind - 1 : argc - 1]);
			return -EINVAL;
		default:
			break;
		}
	}
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument: %s", argv[optind]);
		return -EINVAL;
	}
	if (!file)
		file = CONFIG_DEFAULT_FILE;
	if (access(file, F_OK) == 0 || explicit_file) {
		f.pass = 0;
		line = ini_parse(file, on_ini, &f);
		if (line == -1) {
			snprintf(err, errlen, "%s: cannot open: %s", file, strerror(errno));
			return -EINVAL;
		}
		snprintf(c->file, sizeof(c->file), "%s", file);
	}
	if (!preset && f.preset[0])
		preset = f.preset;
	if (preset && apply_preset(c, preset) < 0) {
		snprintf(err, errlen, "unknown preset '%s' (chat, long-document, edge)", preset);
		return -EINVAL;
	}
	if (c->file[0]) {
		f.pass = 1;
		f.why[0] = 0;
		line = ini_parse(c->file, on_ini, &f);
		if (line != 0) {
			snprintf(err, errlen, "%s:%d: %s", c->file, line,
				 f.why[0] ? f.why : "syntax error");
			return -EINVAL;
		}
	}
	/* Pass 2: every key given on the command line wins. */
	optind = 1;
	while ((opt = getopt_long(argc, argv, "hV", opts, &idx)) != -1) {
		int k = opt - OPT_KEY0;

		if (k < 0 || k >= K_COUNT)
			continue;
		if (set_key(c, k, optarg) < 0) {
			snprintf(err, errlen, "bad value for --%s: '%s'", key_names[k], optarg);
			return -EINVAL;
		}
		c->src[k] = SRC_CLI;
	}
	if (c->src[K_ADMIN_SOCKET] == SRC_DEFAULT) {
		/* The admin socket follows the client socket's directory. */
		const char *slash = strrchr(c->socket_path, '/');

		if (slash)
			snprintf(c->admin_socket_path, sizeof(c->admin_socket_path),
				 "%.*s/admin.sock", (int)(slash - c->socket_path), c->socket_path);
		else
			snprintf(c->admin_socket_path, sizeof(c->admin_socket_path), "admin.sock");
	}
	if (c->src[K_MAX_CONNS_USER] == SRC_DEFAULT)
		c->max_connections_per_user =
			c->max_connections > 1 ? c->max_connections / 2 : c->max_connections;
	if (c->src[K_HOST_POOL] == SRC_DEFAULT && c->host_pool_bytes > c->host_tier_bytes)
		c->host_pool_bytes = c->host_tier_bytes;
	if (c->host_low_watermark > c->host_high_watermark) {
		snprintf(err, errlen, "host-low-watermark above host-high-watermark");
		return -EINVAL;
	}
	if (c->host_prewarm_watermark > c->host_low_watermark) {
		snprintf(err, errlen, "host-prewarm-watermark above host-low-watermark");
		return -EINVAL;
	}
	if (c->session_policy != 0) {
		struct policy pol;
		const char *why = NULL;

		policy_defaults(&pol, (enum policy_kind)c->session_policy);
		pol.budget = c->session_budget;
		if (c->session_budget == 0) {
			snprintf(err, errlen, "session-policy %s needs a session-budget",
				 policy_names[c->session_policy]);
			return -EINVAL;
		}
		if (policy_validate(&pol, &why) < 0) {
			snprintf(err, errlen, "session-policy %s with session-budget %u: %s",
				 policy_names[c->session_policy], c->session_budget, why);
			return -EINVAL;
		}
	}
	if (c->gpu_low_watermark > c->gpu_high_watermark) {
		snprintf(err, errlen, "gpu-low-watermark above gpu-high-watermark");
		return -EINVAL;
	}
	if (c->host_pool_bytes < 4096 || c->host_pool_bytes > c->host_tier_bytes) {
		snprintf(err, errlen, "host-pool-size must be between 4K and host-tier-size");
		return -EINVAL;
	}
	if (c->remote_password_file[0]) {
		/* Refused now, with the reason, rather than when the tier
		 * starts: a secret others can read is a mistake to stop on. */
		char secret[1024];
		int ret = config_read_secret(c->remote_password_file, secret, sizeof(secret), err,
					     errlen);

		explicit_bzero(secret, sizeof(secret));
		if (ret < 0)
			return -EINVAL;
	}
	return 0;
}

int config_reload(struct config *live, int argc, char **argv, char *err, size_t errlen)
{
	static const int live_keys[] = {
		K_LOG_LEVEL,
		K_HIGH_MARK,
		K_LOW_MARK,
		K_PREWARM_MARK,
		K_MAX_POOLS,
		K_MAX_SESSIONS,
		K_MAX_LEASES,
		K_MAX_CONNS,
		K_MAX_CONNS_USER,
		K_MAX_IN_FLIGHT,
		K_MAX_RESERVED,
		K_MAX_LEASED,
		K_MAX_TOKENS,
		K_SESSION_POLICY,
		K_SESSION_BUDGET,
		K_SESSION_AUTO_COMPACT,
		K_GPU_HIGH_MARK,
		K_GPU_LOW_MARK,
		K_DISK_TIER,
		K_DISK_TENANT,
		K_DISK_RESERVE,
		K_HOST_TENANT,
		K_SESSION_IDLE_TIMEOUT,
		K_MAX_TENANT_TOKENS,
	};
	enum config_action act;
	struct config next;
	int ret;

	config_defaults(&next);
	ret = config_parse_args(&next, argc, argv, &act, err, errlen);
	if (ret < 0)
		return ret;
	live->log_level = next.log_level;
	live->host_high_watermark = next.host_high_watermark;
	live->host_low_watermark = next.host_low_watermark;
	live->host_prewarm_watermark = next.host_prewarm_watermark;
	live->max_pools_per_tenant = next.max_pools_per_tenant;
	live->max_sessions_per_pool = next.max_sessions_per_pool;
	live->max_leases_per_conn = next.max_leases_per_conn;
	live->max_connections = next.max_connections;
	live->max_connections_per_user = next.max_connections_per_user;
	live->max_requests_in_flight = next.max_requests_in_flight;
	live->max_reserved_pages = next.max_reserved_pages;
	live->max_leased_pages = next.max_leased_pages;
	live->max_session_tokens = next.max_session_tokens;
	live->max_tenant_tokens = next.max_tenant_tokens;
	live->session_policy = next.session_policy;
	live->session_budget = next.session_budget;
	live->session_auto_compact = next.session_auto_compact;
	live->gpu_high_watermark = next.gpu_high_watermark;
	live->gpu_low_watermark = next.gpu_low_watermark;
	live->disk_tier_bytes = next.disk_tier_bytes;
	live->disk_tenant_bytes = next.disk_tenant_bytes;
	live->disk_reserve_bytes = next.disk_reserve_bytes;
	live->host_tenant_bytes = next.host_tenant_bytes;
	live->session_idle_timeout_s = next.session_idle_timeout_s;
	for (size_t i = 0; i < sizeof(live_keys) / sizeof(live_keys[0]); i++)
		live->src[live_keys[i]] = next.src[live_keys[i]];
	return 0;
}

void config_print(const struct config *c, FILE *out)
{
	char v[CONFIG_PATH_MAX];

	fprintf(out, "# kvpalaced effective configuration");
	if (c->file[0])
		fprintf(out, "; file %s", c->file);
	if (c->preset[0])
		fprintf(out, "; preset %s", c->preset);
	fprintf(out, "\n");
	for (int k = 0; k < K_COUNT; k++) {
		show_key(c, k, v, sizeof(v));
		fprintf(out, "%-22s = %-40s # %s\n", key_names[k], v, source_names[c->src[k]]);
	}
}

void config_usage(const char *argv0)
{
	printf("Usage: %s [OPTIONS]\n"
	       "\n"
	       "kvpalaced keeps the attention KV cache of LLM inference processes on this\n"
	       "machine and shares it between them.\n"
	       "\n"
	       "Every KEY below can also be set as `KEY = VALUE` in the configuration file\n"
	       "(INI, optionally under [kvpalaced]); the command line wins over the file,\n"
	       "the file over the preset, the preset over the built-in default.\n"
	       "\n"
	       "  --config FILE             configuration file (default %s,\n"
	       "                            read when it exists)\n"
	       "  --preset NAME             chat, long-document or edge (also `preset =` in the "
	       "file)\n"
	       "  --print-config            print the effective configuration and where each\n"
	       "                            value came from, then exit\n"
	       "  --socket PATH             client socket (default $XDG_RUNTIME_DIR/kvpalace/\n"
	       "                            kvpalace.sock, /run/kvpalace/kvpalace.sock as root)\n"
	       "  --admin-socket PATH       admin socket (default admin.sock beside the client\n"
	       "                            socket)\n"
	       "  --state-dir DIR           durable state: checkpoints (default /var/lib/kvpalace\n"
	       "                            as root)\n"
	       "  --cache-dir DIR           spill files (default /var/cache/kvpalace as root)\n"
	       "  --host-tier-size SIZE     host pages all pools may hold (default 25%%); a\n"
	       "                            user under its fair share takes room from those\n"
	       "                            over theirs\n"
	       "  --host-tenant-size SIZE   host pages one user's pools may hold; 0: no cap but\n"
	       "                            the fair share when the tier is full (default 0)\n"
	       "  --host-pool-size SIZE     host arena of one pool (default min(1G, host tier))\n"
	       "  --host-high-watermark F   a request that would take a pool above this fraction\n"
	       "                            evicts cached pages first (default 0.95)...\n"
	       "  --host-low-watermark F    ...down to this fraction (default 0.90)\n"
	       "  --host-prewarm-watermark F\n"
	       "                            while a pool holds less than this fraction, the\n"
	       "                            disk pages used last are read back ahead of any\n"
	       "                            request, evicting nothing; 0: never (default 0)\n"
	       "  --max-message-bytes N     largest control message, 4096..196608 (default %u)\n"
	       "  --max-pools-per-tenant N  (default 16)\n"
	       "  --max-sessions-per-pool N (default 65536)\n"
	       "  --max-leases-per-client N read leases one connection may hold (default 4096)\n"
	       "  --max-connections N       connections on the client socket, all users\n"
	       "                            together (default 1024)\n"
	       "  --max-connections-per-user N\n"
	       "                            connections of one uid on the client socket\n"
	       "                            (default half of max-connections)\n"
	       "  --max-requests-in-flight N\n"
	       "                            requests of one connection received and not yet\n"
	       "                            answered, or answered and not yet read; beyond it\n"
	       "                            the daemon stops reading that connection, 1..%u\n"
	       "                            (default 256)\n"
	       "  --max-reserved-pages-per-client N\n"
	       "                            pages one connection may hold appended but not\n"
	       "                            committed, over all its sessions (default 65536)\n"
	       "  --max-leased-pages-per-client N\n"
	       "                            pages one connection's read leases may pin, all\n"
	       "                            together (default 262144); a user's leases all\n"
	       "                            together pin less than its share of the host tier\n"
	       "  --max-session-tokens N    (default 4194304)\n"
	       "  --max-tenant-tokens N     slots of one user's sessions together (a token's id\n"
	       "                            and metadata, or a page table entry), about 20\n"
	       "                            bytes of daemon memory each; forks share their\n"
	       "                            source's tokens (default 33554432)\n"
	       "  --socket-mode OCTAL       client socket permissions (default 0666)\n"
	       "  --admin-socket-mode OCTAL admin socket permissions (default 0600)\n"
	       "  --log-level LEVEL         err, warning, notice, info or debug (default info)\n"
	       "  --disk-pool-size SIZE     spill file of one pool in the cache directory; 0\n"
	       "                            turns the disk tier off (default 8G)\n"
	       "  --disk-tier-size SIZE     the spill files of every pool together; 0: no cap\n"
	       "                            but disk-reserve (default 0)\n"
	       "  --disk-tenant-size SIZE   the spill files of one user's pools together\n"
	       "                            (default 32G)\n"
	       "  --disk-reserve SIZE       free space spilling leaves on the cache file\n"
	       "                            system, for checkpoints and others (default 2G)\n"
	       "  --io-backend NAME         disk I/O: auto, io_uring or threads (pread/pwrite)\n"
	       "                            (default auto)\n"
	       "  --event-loop NAME         auto, io_uring or epoll: auto uses epoll where\n"
	       "                            io_uring is denied (a container's seccomp profile)\n"
	       "                            (default auto)\n"
	       "  --eviction NAME           host-tier victim order: lru (least recently used\n"
	       "                            leaf first), lfu (lowest use count with aging\n"
	       "                            and ghosts, leaves first) or window (pages used\n"
	       "                            by one request only go first while they hold\n"
	       "                            over 70 %% of the pages, leaves first) (default "
	       "window)\n"
	       "  --disk-admission NAME     which host victims the disk tier takes: all, or\n"
	       "                            reused (only pages a second request used; the\n"
	       "                            others are dropped, never written) (default all)\n"
	       "  --remote-tier URL         redis://HOST:PORT[,HOST:PORT...]: the Redis Cluster\n"
	       "                            of the remote tier (default none)\n"
	       "  --remote-tenants LIST     UID=NAME,...[,*=NAME]: the remote tenant name of\n"
	       "                            each uid; others stay local (default none)\n"
	       "  --remote-events KEY       the Redis Stream KV events of remote-tier pools go\n"
	       "                            to, trimmed to about 100000 (default none)\n"
	       "  --remote-write WHEN       commit (a page goes to the cluster when committed),\n"
	       "                            reuse (when a match first uses it) or eviction\n"
	       "                            (when it leaves the host tier) (default commit)\n"
	       "  --remote-user NAME        ACL user for AUTH (default none: AUTH PASSWORD)\n"
	       "  --remote-password-file F  the cluster's password; must be owned by the\n"
	       "                            daemon's user, mode 0600 or stricter\n"
	       "  --remote-timeout-ms N     connect, read and write timeout per node (default "
	       "500)\n"
	       "  --remote-threads N        threads (and connections per node) (default 4)\n"
	       "  --remote-max-inflight-mb N  values queued or in flight at most; beyond it\n"
	       "                            puts are dropped, gets are misses (default 256)\n"
	       "  --warmup-dir DIR          checkpoints loaded into the prefix index before the\n"
	       "                            daemon reports ready (default STATE-DIR/warmup)\n"
	       "  --session-policy NAME     token policy new sessions start with: none, window,\n"
	       "                            sinks, importance or hierarchy (default none:\n"
	       "                            exact); clients may set their own per session\n"
	       "  --session-budget N        tokens such a session keeps when compacted\n"
	       "  --session-auto-compact yes|no\n"
	       "                            compact when a commit passes the budget (default no:\n"
	       "                            only on a client's Compact)\n"
	       "  --spill-dtype NAME        format cold pages take on disk: same (as they are,\n"
	       "                            the default), int8, fp8 or int4 (lossy: about\n"
	       "                            half, half or a quarter of the bytes; such pages\n"
	       "                            are never matched again as exact); pages of\n"
	       "                            permanent spans always go as they are\n"
	       "  --gpu-pool-size SIZE      device arena of one pool, allocated when the pool\n"
	       "                            opens and only where a GPU exists; 0 turns the GPU\n"
	       "                            tier off (default 1G)\n"
	       "  --gpu-tier-size SIZE      device arenas of all pools together; a pool past\n"
	       "                            it runs from the host tier (default 8G)\n"
	       "  --gpu-high-watermark F    drop cached device copies when a device arena is\n"
	       "                            fuller than this fraction (default 0.90)...\n"
	       "  --gpu-low-watermark F     ...down to this fraction (default 0.80)\n"
	       "  --session-idle-timeout DURATION\n"
	       "                            a persistent session that no connection owns is\n"
	       "                            closed after this long unused (its full pages stay\n"
	       "                            in the prefix index); 0 keeps it until closed.\n"
	       "                            Sessions that are not persistent close with the\n"
	       "                            connection that made them (default 1h)\n"

	       "  -h, --help                show this help\n"
	       "  -V, --version             show the version\n"
	       "\n"
	       "SIZE accepts K, M, G, T suffixes (powers of 1024) or a percentage of RAM;\n"
	       "DURATION seconds, or s, m, h, d suffixes (at most 366d).\n",
	       argv0, CONFIG_DEFAULT_FILE, FRAME_DEFAULT_MAX_BYTES, CONFIG_MAX_IN_FLIGHT);
}
