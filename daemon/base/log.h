/* daemon/base/log.h — the daemon's one place that writes diagnostics.
 *
 * Lines go to stderr with a "<N>" syslog priority prefix, which journald
 * reads when stderr is the journal and which is readable on a terminal;
 * when $JOURNAL_STREAM says stderr is the journal, native entries go
 * there instead. Every entry carries the caller's source location
 * (CODE_FILE relative to the source root, CODE_LINE, CODE_FUNC), and an
 * entry about a pool, a session, a connection or a client carries their ids
 * as fields (struct log_ctx), so `journalctl POOL_ID=7` finds them all.
 * Only daemon/ logs; it logs once, where a decision is made. Thread-safe
 * (one write per line).
 */
#ifndef KVPD_LOG_H
#define KVPD_LOG_H

#include <stdint.h>
#include <sys/types.h>
#include <syslog.h>

/* Messages above this priority (LOG_ERR..LOG_DEBUG) are dropped. */
void log_set_level(int level);
int log_get_level(void);
/* Parses "err", "warning", "notice", "info", "debug" (or 3..7). Returns
 * the level or -EINVAL. */
int log_parse_level(const char *s);

/* What an entry is about, for the journal's fields (and a "[pool=7 uid=1000]"
 * suffix on stderr). A zero member is absent: ids start at 1, pid 0 is no
 * client; uid 0 is root, hence has_uid. The uid and pid are the client's
 * (the one who asked, or the owner of the pool an event is about), not
 * the daemon's own _UID and _PID. kvpalaced(8), LOGGING, lists them. */
struct log_ctx {
	uint64_t pool_id;    /* POOL_ID= */
	uint64_t session_id; /* SESSION_ID= */
	uint64_t conn_id;    /* CONN_ID=: the server's connection number */
	pid_t pid;	     /* PID= */
	uid_t uid;	     /* UID=, when has_uid */
	int has_uid;
};

/* Writes one entry of priority prio (LOG_*) about ctx (NULL: nothing in
 * particular) from file:line in func (the caller's, through the macros
 * below; file as the compiler spells __FILE__). */
void log_full(int prio, const struct log_ctx *ctx, const char *file, int line, const char *func,
	      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define log_at(prio, ctx, ...) log_full(prio, ctx, __FILE__, __LINE__, __func__, __VA_ARGS__)

/* "s" unless n is 1: "%u page%s", n, log_s(n). */
static inline const char *log_s(unsigned long long n)
{
	return n == 1 ? "" : "s";
}

#define log_err(...)	log_at(LOG_ERR, NULL, __VA_ARGS__)
#define log_warn(...)	log_at(LOG_WARNING, NULL, __VA_ARGS__)
#define log_notice(...) log_at(LOG_NOTICE, NULL, __VA_ARGS__)
#define log_info(...)	log_at(LOG_INFO, NULL, __VA_ARGS__)
#define log_debug(...)	log_at(LOG_DEBUG, NULL, __VA_ARGS__)

/* The same about ctx, a const struct log_ctx * (NULL: nothing in
 * particular), usually one of the LOG_* below. */
#define log_ctx_err(ctx, ...)	 log_at(LOG_ERR, ctx, __VA_ARGS__)
#define log_ctx_warn(ctx, ...)	 log_at(LOG_WARNING, ctx, __VA_ARGS__)
#define log_ctx_notice(ctx, ...) log_at(LOG_NOTICE, ctx, __VA_ARGS__)
#define log_ctx_info(ctx, ...)	 log_at(LOG_INFO, ctx, __VA_ARGS__)
#define log_ctx_debug(ctx, ...)	 log_at(LOG_DEBUG, ctx, __VA_ARGS__)

/* A context of the members given, as designated initializers:
 * LOG_CTX(.pool_id = p->id, .uid = uid, .has_uid = 1) (a macro, so that
 * their commas stay inside one argument of the log_ctx_* macros). A
 * compound literal: it lives until the end of the enclosing block. */
#define LOG_CTX(...) (&(struct log_ctx){__VA_ARGS__})
/* Shorthands for the usual contexts. */
#define LOG_POOL(id)	    (LOG_CTX(.pool_id = (id)))
#define LOG_POOL_UID(id, u) (LOG_CTX(.pool_id = (id), .uid = (u), .has_uid = 1))
#define LOG_SESSION(pool, id, u)                                                                   \
	(LOG_CTX(.pool_id = (pool), .session_id = (id), .uid = (u), .has_uid = 1))
#define LOG_UID(u)	   (LOG_CTX(.uid = (u), .has_uid = 1))
#define LOG_CLIENT(u, p)   (LOG_CTX(.uid = (u), .has_uid = 1, .pid = (p)))
#define LOG_CONN(id, u, p) (LOG_CTX(.conn_id = (id), .uid = (u), .has_uid = 1, .pid = (p)))

/* Source paths as the journal shows them: relative to the source root
 * ("daemon/core/pool.c"), whatever the build directory made of them. */
const char *log_src_path(const char *file);

/* Always-on invariant check (Redis habit): logs file:line and aborts.
 * Never used on client-supplied data. */
#define kvp_assert(cond)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			log_assert_fail(#cond, __FILE__, __LINE__, __func__);                      \
	} while (0)
void log_assert_fail(const char *expr, const char *file, int line, const char *func)
	__attribute__((noreturn));

#endif
