/* daemon/base/confview.h — the effective configuration as data.
 *
 * config_print (config.c) is the one place that knows how each key is
 * shown and where its value came from; --print-config writes it to
 * stdout. The admin socket needs the same view as data (kvpalacectl config
 * show) and the reload path needs to know which keys a reload changed, so
 * this file captures config_print's text in memory (open_memstream) and
 * splits its lines, `key = value # source`, into entries, instead of
 * keeping a second copy of the key table. Event-loop thread only (it
 * reads the live configuration).
 */
#ifndef KVPD_CONFVIEW_H
#define KVPD_CONFVIEW_H

#include <stddef.h>

#include "config.h"

struct confview_entry {
	char *key;
	char *value;
	char *source; /* "default", "preset", "file", "command line" */
};

/* What config_print writes for c, NUL-terminated, in *ret_text (free()
 * it) with its length in *ret_len. Returns 0 or -ENOMEM. */
int confview_text(const struct config *c, char **ret_text, size_t *ret_len);

/* Splits one line of that text (without its newline) in place into *ret.
 * Returns 0, or -EINVAL for the heading comment, an empty line or a line
 * of another shape. A value is what lies between " = " and the last
 * " # ", trailing blanks removed. */
int confview_split(char *line, struct confview_entry *ret);

/* Lines of text: the number of '\n'-terminated or final pieces. */
size_t confview_lines(const char *text);

/* Calls fn(arg, key) for each key of text a whose value (and, when
 * with_source, source) differs in text b or that b lacks. The texts are
 * left unchanged. Returns 0 or -ENOMEM. */
int confview_diff(const char *a, const char *b, int with_source,
		  void (*fn)(void *arg, const char *key), void *arg);

#define CONFVIEW_KEY_NAME_MAX 48

/* What a reload did: keys whose running value (or its source) changed, and
 * keys whose value in the re-read configuration differs from the running
 * one but can change only at a restart (sockets, directories, sizes). */
struct confview_reload {
	uint32_t n_changed;
	uint32_t n_restart_needed;
	char changed[CONFIG_MAX_KEYS][CONFVIEW_KEY_NAME_MAX];
	char restart_needed[CONFIG_MAX_KEYS][CONFVIEW_KEY_NAME_MAX];
};

#endif
