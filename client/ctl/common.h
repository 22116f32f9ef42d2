/* client/ctl/common.h — what the commands of kvpalacectl share: exit
 * codes, the parsed command line, error reports and text formatting.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * The bottom of ctl/: it calls no other file of the folder.
 */
#ifndef KVPCTL_COMMON_H
#define KVPCTL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kvpalace.h"

#define EXIT_DAEMON  1 /* the daemon refused or failed the request */
#define EXIT_USAGE   2
#define EXIT_CONNECT 3 /* no daemon, no permission on the socket, connection lost */
#define EXIT_PROTO   4 /* a reply that does not decode: the two speak different protocols */

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
	OPT_NO_HEADERS = 1u << 11, /* tables without their header line */
	OPT_WATCH = 1u << 12,	   /* --watch [SECONDS]: a snapshot every SECONDS */
	OPT_COUNT = 1u << 13,	   /* --count N: N snapshots, then exit */
	OPT_EXTRA_KEY = 1u << 14,  /* --extra-key TEXT: with --salt, the chain's extra key */
	OPT_LAST = OPT_EXTRA_KEY,
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
	const char *extra_key; /* --extra-key */
	int64_t unused_since;  /* --unused-since, time(2) seconds */
	uint64_t id;	       /* the ID operand */
	const char *ckpt;      /* the NAME operand: a checkpoint name */
	const char *name;      /* the command's name */
	uint64_t watch_ms;     /* --watch, in milliseconds */
	uint32_t count;	       /* --count; 0 for until interrupted */
};

/* Says why a call failed and picks the exit status: 3 when the daemon
 * cannot be reached any more, 4 when its reply made no sense to us (or our
 * request none to it: a version skew or a bug, not a refusal), 1 when it
 * refused or failed. */
int fail(kvp_client *c, const char *what, int err);

/* Says what is wrong with the command line and returns EXIT_USAGE:
 * "kvpalacectl CMD: what; see 'kvpalacectl CMD --help'" when the command
 * cmd is known, else "kvpalacectl: what" and a pointer at --help. */
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "" for 1, else "s". */
const char *plural(uint64_t n);

/* The names kvpalacectl prints for a dtype and a tier ("?" if unknown). */
const char *dtype_name(uint32_t dtype);
const char *tier_name(uint32_t tier);

/* Copies s into buf replacing anything a terminal could act on. */
const char *printable(const char *s, char *buf, size_t cap);

/* "32L 8H 128D 16T f16[/gN]". */
void layout_text(const struct kvp_layout *l, char *buf, size_t cap);

/* "512 B", "1.5 KiB", "2 GiB". */
void size_text(uint64_t bytes, char *buf, size_t cap);

/* The same in at most 5 characters, for table cells, as df -h writes
 * it: "512", "1.5K", "40K", "8.0G". */
void size_short(uint64_t bytes, char *buf, size_t cap);

/* An idle time in its two largest units: 850ms, 12.5s, 4m07s, 3h25m. */
void idle_text(uint64_t ms, char *buf, size_t cap);

#endif
