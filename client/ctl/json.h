/* client/ctl/json.h — kvpalacectl's JSON writer: one object per command
 * with --json, written by hand with full string escaping so that the CLI
 * needs no JSON library.
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

/* "key":number, "key":true|false, "key":"string". */
void json_u64(FILE *f, const char *key, uint64_t v, int comma);
void json_bool(FILE *f, const char *key, int v, int comma);
void json_string(FILE *f, const char *key, const char *v, int comma);

/* "key":[numbers], "key":[strings]. */
void json_u32_array(FILE *f, const char *key, const uint32_t *v, size_t n, int comma);
void json_str_array(FILE *f, const char *key, const char *const *v, size_t n, int comma);

/* "layout":{...}, with its comma. */
void json_layout(FILE *f, const struct kvp_layout *l);

#endif
