/* client/ctl/json.h — the hand-written JSON stream writer that only
 * metrics.c still uses: every other command builds its document with
 * jansson (jdoc.h). It goes once metrics.c moves to jansson too (issue 16:
 * metrics moves into a library shared with the HTTP exporter).
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Each writer of a member takes comma: 1 writes the comma that separates
 * it from the next member.
 */
#ifndef KVPCTL_JSON_H
#define KVPCTL_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpalace.h"

/* Writes s as a JSON string: quotes, backslashes and control characters
 * escaped, invalid UTF-8 replaced by U+FFFD. */
void json_str(FILE *f, const char *str);

/* "key": */
void json_key(FILE *f, const char *key);

/* "key":"string", and a comma after it when comma. */
void json_string(FILE *f, const char *key, const char *v, int comma);

#endif
