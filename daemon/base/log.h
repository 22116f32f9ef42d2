/* daemon/base/log.h — the daemon's one place that writes diagnostics.
 *
 * Lines go to stderr with a "<N>" syslog priority prefix, which journald
 * reads when stderr is the journal and which is readable on a terminal.
 * Only daemon/ logs; it logs once, where a decision is made. Thread-safe
 * (one fprintf per line).
 */
#ifndef KVPD_LOG_H
#define KVPD_LOG_H

#include <syslog.h>

/* Messages above this priority (LOG_ERR..LOG_DEBUG) are dropped. */
void log_set_level(int level);
int log_get_level(void);
/* Parses "err", "warning", "notice", "info", "debug" (or 3..7). Returns
 * the level or -EINVAL. */
int log_parse_level(const char *s);

void log_msg(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)	log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)	log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...)	log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)	log_msg(LOG_DEBUG, __VA_ARGS__)

/* Always-on invariant check (Redis habit): logs file:line and aborts.
 * Never used on client-supplied data. */
#define kvp_assert(cond)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			log_assert_fail(#cond, __FILE__, __LINE__);                                \
	} while (0)
void log_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
