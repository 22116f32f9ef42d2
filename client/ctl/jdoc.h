/* client/ctl/jdoc.h — kvpalacectl's JSON documents, built with jansson:
 * each command with --json builds one object and prints it on one line.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Out of memory while building a document ends the program (exit 1):
 * a half-built document must never be printed as if it were whole.
 * Single-threaded.
 */
#ifndef KVPCTL_JDOC_H
#define KVPCTL_JDOC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpalace.h"

/* A new empty object or array. */
json_t *jdoc_object(void);
json_t *jdoc_array(void);

/* A JSON string of s (NUL-terminated): bytes that are not valid UTF-8
 * become U+FFFD, one for each byte, so text from the daemon (a model id,
 * a path) always yields valid JSON; jansson refuses invalid UTF-8. */
json_t *jdoc_text(const char *s);

/* A number: above INT64_MAX (jansson's integers are signed) a real. */
json_t *jdoc_uint(uint64_t v);

/* obj[key] = v; v is taken (stolen), as json_object_set_new does. */
void jdoc_set(json_t *obj, const char *key, json_t *v);
void jdoc_u64(json_t *obj, const char *key, uint64_t v);
void jdoc_bool(json_t *obj, const char *key, int v);
void jdoc_str(json_t *obj, const char *key, const char *s);
/* obj[key] = s, or null when s is NULL. */
void jdoc_str_or_null(json_t *obj, const char *key, const char *s);
void jdoc_null(json_t *obj, const char *key);
void jdoc_real(json_t *obj, const char *key, double v);

/* Appends v (taken) to arr. */
void jdoc_push(json_t *arr, json_t *v);

/* [numbers], [strings]. */
json_t *jdoc_u32_array(const uint32_t *v, size_t n);
json_t *jdoc_str_array(const char *const *v, size_t n);

/* {"n_layers","n_kv_heads","head_dim","block_tokens","dtype","quant_group"}. */
json_t *jdoc_layout(const struct kvp_layout *l);

/* Writes doc compactly on one line to f, with a newline, and frees it.
 * Returns 0 or -EIO. */
int jdoc_print(FILE *f, json_t *doc);

#endif
