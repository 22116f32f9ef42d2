/* daemon/base/config.h — the daemon's configuration: embedded defaults, named
 * presets, the INI file (libinih) and command-line options.
 *
 * Every key can be given in the file (`key = value`, optionally under
 * [kvpalaced]) and as --key=value; the command line wins over the file, the
 * file over the preset, the preset over the built-in default, and each
 * value remembers where it came from (--print-config shows it). A bad key
 * or value stops the start with the file, line and key named.
 *
 * Every limit on a client-controlled resource lives here. The defaults are
 * the "embedded default" a daemon started without options runs on: sockets
 * under $XDG_RUNTIME_DIR/kvpalace/ (or /run/kvpalace/ as root), a host tier
 * sized from the machine's memory, logging to stderr.
 */
#ifndef KVPD_CONFIG_H
#define KVPD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* remote-write: when a page goes to the remote tier. */
enum config_remote_write {
	CONFIG_REMOTE_WRITE_COMMIT,   /* when a commit lists it */
	CONFIG_REMOTE_WRITE_REUSE,    /* when a match uses it (the second use) */
	CONFIG_REMOTE_WRITE_EVICTION, /* when it leaves the host tier (core/rtier.c) */
};

enum config_disk_admission {
	CONFIG_DISK_ADMIT_ALL,	  /* every host victim is written to disk */
	CONFIG_DISK_ADMIT_REUSED, /* only pages a second request used (prefix_index_reused) */
};

enum config_eviction {
	CONFIG_EVICTION_LRU,	/* least recently used leaf first */
	CONFIG_EVICTION_LFU,	/* prefix_index_set_lfu */
	CONFIG_EVICTION_WINDOW, /* prefix_index_set_window */
};

#define CONFIG_PATH_MAX		  4096
#define CONFIG_SOCKET_PATH_MAX	  108 /* sizeof(sun_path) */
#define CONFIG_MAX_KEYS		  64
#define CONFIG_REMOTE_MAX	  1024 /* remote-tier's text */
#define CONFIG_REMOTE_NODES	  64   /* its nodes */
#define CONFIG_REMOTE_TENANTS_MAX 1024
#define CONFIG_REMOTE_TENANT_MAX  64  /* bytes of one name */
#define CONFIG_REMOTE_EVENTS_MAX  128 /* remote-events: the stream's key, with its NUL */
#define CONFIG_DEFAULT_FILE	  "/etc/kvpalace/kvpalaced.conf"
/* The largest max-requests-in-flight: a connection that stops reading
 * holds about that many replies of up to max-message-bytes each. */
#define CONFIG_MAX_IN_FLIGHT 4096u

struct config {
	char socket_path[CONFIG_SOCKET_PATH_MAX];
	char admin_socket_path[CONFIG_SOCKET_PATH_MAX];
	char state_dir[CONFIG_PATH_MAX];
	char cache_dir[CONFIG_PATH_MAX];
	uint64_t host_tier_bytes;   /* arenas of all pools together */
	uint64_t host_pool_bytes;   /* one pool's arena */
	double host_high_watermark; /* evict above this fraction of a pool's pages... */
	double host_low_watermark;  /* ...down to this one */
	/* While a pool holds fewer host pages than this fraction, the disk
	 * pages used last are read back ahead of requests (core/prewarm.h);
	 * 0: never. At most host_low_watermark. */
	double host_prewarm_watermark;
	uint32_t max_message_bytes;
	uint32_t max_pools_per_tenant;
	uint32_t max_sessions_per_pool;
	uint32_t max_leases_per_conn;
	uint32_t max_connections;	   /* on the client socket, all users together */
	uint32_t max_connections_per_user; /* on the client socket, one uid */
	uint32_t max_requests_in_flight;   /* one connection: unanswered + unsent replies */
	uint32_t max_reserved_pages;	   /* one connection: appended, uncommitted pages */
	uint32_t max_leased_pages;	   /* one connection: pages its leases pin */
	uint64_t max_session_tokens;
	uint64_t max_tenant_tokens; /* token slots of one tenant's sessions together */
	uint32_t socket_mode;	    /* client socket permissions */
	uint32_t admin_socket_mode; /* admin socket permissions */
	int log_level;
	/* A persistent session no connection owns is closed after this long
	 * unused; 0: never. */
	uint64_t session_idle_timeout_s;
	uint64_t disk_pool_bytes; /* one pool's spill file; 0: no disk tier */
	/* Disk tier shares (tier_disk_room): of every pool together (0: no
	 * cap but the reserve), of one tenant's pools, and the free space
	 * spilling leaves on the cache file system (checkpoints and everyone
	 * else keep it). */
	uint64_t disk_tier_bytes;
	/* Host pages one tenant's pools may hold together; 0: no cap but its
	 * fair share when the tier is full (tier.c). */
	uint64_t host_tenant_bytes;
	uint64_t disk_tenant_bytes;
	uint64_t disk_reserve_bytes;
	int io_backend;
	int event_loop;	    /* enum loop_want: auto, io_uring, epoll */
	int eviction;	    /* enum config_eviction: the host tier's victim order */
	int disk_admission; /* enum config_disk_admission */
	/* The policy new sessions start with (daemon/base/policy.h); clients may
	 * set their own per session. */
	int session_policy; /* enum policy_kind */
	uint32_t session_budget;
	int session_auto_compact;
	uint32_t spill_dtype; /* shm dtype cold pages are written to disk in, 0: as they are */
	char warmup_dir[CONFIG_PATH_MAX];
	uint64_t gpu_pool_bytes;   /* one pool's device arena; 0: no GPU tier */
	uint64_t gpu_tier_bytes;   /* device arenas of all pools together */
	double gpu_high_watermark; /* drop cached device copies above this fraction... */
	double gpu_low_watermark;  /* ...down to this one */
	/* The remote tier (daemon/remote/): "redis://host:port[,host:port...]"
	 * or "" for none; parsed for phase 2, which starts the tier. */
	char remote_tier[CONFIG_REMOTE_MAX];
	char remote_user[256];
	char remote_password_file[CONFIG_PATH_MAX]; /* "" for none: checked at parse */
	uint32_t remote_timeout_ms;
	uint32_t remote_threads;
	uint64_t remote_max_inflight_bytes;
	/* remote-tenants: "UID=NAME,...,*=NAME", checked when set (see
	 * config_remote_tenant); "" when no uid takes part. */
	char remote_tenants[CONFIG_REMOTE_TENANTS_MAX];
	int remote_write; /* enum config_remote_write */
	/* remote-events: the Redis Stream KV events go to, "" for none. */
	char remote_events[CONFIG_REMOTE_EVENTS_MAX];
	/* "" means <state_dir>/warmup */   /* enum aio_mode: auto, io_uring, threads */
	unsigned char src[CONFIG_MAX_KEYS]; /* where each key's value came from */
	char file[CONFIG_PATH_MAX];	    /* the configuration file read, or "" */
	char preset[32];		    /* the preset applied, or "" */
};

/* The remote tier's tenant name of uid (remote-tenants: the entry of uid,
 * else the "*" entry) into buf (n bytes, NUL-terminated). Returns buf, or
 * NULL when uid has none: its pools stay local. A name is 1..64 bytes of
 * letters, digits and "._-@:"; uids are decimal. */
const char *config_remote_tenant(const struct config *c, uid_t uid, char *buf, size_t n);

enum config_action {
	CONFIG_RUN,
	CONFIG_HELP,
	CONFIG_VERSION,
	CONFIG_PRINT, /* --print-config */
};

/* Fills the embedded defaults (reads $XDG_RUNTIME_DIR, the uid and the
 * machine's memory). */
void config_defaults(struct config *c);

/* Applies, over the defaults in c, the preset (--preset, else `preset =` in
 * the file), the configuration file (--config FILE, else
 * CONFIG_DEFAULT_FILE when it exists) and the command-line keys. Returns 0
 * and what to do in *ret_action, or -EINVAL with a message in err (errlen
 * bytes) naming the option, or the file, line and key. */
int config_parse_args(struct config *c, int argc, char **argv, enum config_action *ret_action,
		      char *err, size_t errlen);

/* Parses a size such as "4096", "64K", "512M", "4G" or "25%" (of physical
 * memory). Returns 0 and the bytes, or -EINVAL / -ERANGE. */
int config_parse_size(const char *s, uint64_t *ret_bytes);

/* Tokens one request may carry so that it fits max_message_bytes (a
 * packed uint32 takes at most 5 bytes). */
uint32_t config_max_tokens_per_request(const struct config *c);

/* Re-reads the configuration as at start (the same argc/argv: file,
 * preset, command line) and applies to live what may change while
 * serving: log level, watermarks and the per-client limits. Sockets,
 * directories, tier and pool sizes and the message cap need a restart.
 * Returns 0, or -EINVAL with the reason in err and live unchanged. */
int config_reload(struct config *live, int argc, char **argv, char *err, size_t errlen);

/* Reads a secret (remote-password-file) into buf (size bytes, NUL
 * terminated, one trailing newline dropped), refusing a file that is not
 * a regular file owned by the effective user with no permission for
 * group or others (mode 0600 or stricter). Returns 0, or -EPERM (owner,
 * mode), -EINVAL (not a regular file, empty, a NUL inside), -EFBIG (does
 * not fit) or -errno from open/read, with the reason in err. The caller
 * should explicit_bzero buf after use. */
int config_read_secret(const char *path, char *buf, size_t size, char *err, size_t errlen);

/* The nodes of remote-tier ("host:port" each) into nodes[max], NUL
 * terminated in buf (CONFIG_REMOTE_MAX bytes). Returns their count (0 for
 * no remote tier) or -EINVAL. */
int config_remote_nodes(const struct config *c, char *buf, const char **nodes, unsigned int max);

/* Prints the effective configuration, each key with its source. */
void config_print(const struct config *c, FILE *out);

/* Prints the --help text to stdout. */
void config_usage(const char *argv0);

#endif
