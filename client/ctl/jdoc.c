/* client/ctl/jdoc.c — kvpalacectl's JSON documents with jansson (see
 * jdoc.h): jansson escapes and formats; this file only makes text from
 * the daemon valid UTF-8 first and turns running out of memory into one
 * clean exit.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "jdoc.h"

static json_t *need(json_t *v)
{
	if (!v) {
		fputs("kvpalacectl: out of memory building the JSON document\n", stderr);
		exit(EXIT_DAEMON);
	}
	return v;
}

json_t *jdoc_object(void)
{
	return need(json_object());
}

json_t *jdoc_array(void)
{
	return need(json_array());
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not
 * one (overlong forms, surrogates and code points above U+10FFFF
 * included). The NUL terminator fails every continuation check, so no
 * read passes the end of s. */
static size_t utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		unsigned char lo = c == 0xe0 ? 0xa0 : 0x80;
		unsigned char hi = c == 0xed ? 0x9f : 0xbf;

		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80)
			return 0;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned char lo = c == 0xf0 ? 0x90 : 0x80;
		unsigned char hi = c == 0xf4 ? 0x8f : 0xbf;

		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

json_t *jdoc_text(const char *str)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t len = strlen(str), at = 0;
	json_t *v;
	char *buf;

	v = json_stringn(str, len); /* NULL for invalid UTF-8 (or no memory) */
	if (v)
		return v;
	/* Each bad byte becomes the 3 bytes of U+FFFD. */
	buf = malloc(3 * len + 1);
	if (!buf)
		return need(NULL);
	while (*s) {
		size_t n = utf8_len(s);

		if (!n) {
			memcpy(buf + at, "\xef\xbf\xbd", 3);
			at += 3;
			s++;
			continue;
		}
		memcpy(buf + at, s, n);
		at += n;
		s += n;
	}
	v = json_stringn(buf, at);
	free(buf);
	return need(v);
}

json_t *jdoc_uint(uint64_t v)
{
	if (v > INT64_MAX)
		return need(json_real((double)v));
	return need(json_integer((json_int_t)v));
}

void jdoc_set(json_t *obj, const char *key, json_t *v)
{
	/* Keys are the program's own ASCII literals; set_new takes v even
	 * when it fails. */
	if (json_object_set_new(obj, key, need(v)) < 0)
		need(NULL);
}

void jdoc_u64(json_t *obj, const char *key, uint64_t v)
{
	jdoc_set(obj, key, jdoc_uint(v));
}

void jdoc_bool(json_t *obj, const char *key, int v)
{
	jdoc_set(obj, key, json_boolean(v));
}

void jdoc_str(json_t *obj, const char *key, const char *s)
{
	jdoc_set(obj, key, jdoc_text(s));
}

void jdoc_str_or_null(json_t *obj, const char *key, const char *s)
{
	jdoc_set(obj, key, s ? jdoc_text(s) : json_null());
}

void jdoc_null(json_t *obj, const char *key)
{
	jdoc_set(obj, key, json_null());
}

void jdoc_real(json_t *obj, const char *key, double v)
{
	jdoc_set(obj, key, json_real(v));
}

void jdoc_push(json_t *arr, json_t *v)
{
	if (json_array_append_new(arr, need(v)) < 0)
		need(NULL);
}

json_t *jdoc_u32_array(const uint32_t *v, size_t n)
{
	json_t *arr = jdoc_array();

	for (size_t i = 0; i < n; i++)
		jdoc_push(arr, jdoc_uint(v[i]));
	return arr;
}

json_t *jdoc_str_array(const char *const *v, size_t n)
{
	json_t *arr = jdoc_array();

	for (size_t i = 0; i < n; i++)
		jdoc_push(arr, jdoc_text(v[i]));
	return arr;
}

json_t *jdoc_layout(const struct kvp_layout *l)
{
	json_t *o = jdoc_object();

	jdoc_u64(o, "n_layers", l->n_layers);
	jdoc_u64(o, "n_kv_heads", l->n_kv_heads);
	jdoc_u64(o, "head_dim", l->head_dim);
	jdoc_u64(o, "block_tokens", l->block_tokens);
	jdoc_str(o, "dtype", dtype_name(l->dtype));
	jdoc_u64(o, "quant_group", l->quant_group);
	jdoc_str(o, "format",
		 l->format == KVP_FORMAT_KV	  ? "kv"
		 : l->format == KVP_FORMAT_LATENT ? "latent"
						  : "?");
	return o;
}

int jdoc_print(FILE *f, json_t *doc)
{
	/* Compact, members in the order they were set (jansson keeps it
	 * since 2.8): the documents the CLI has always printed. Non-ASCII
	 * stays UTF-8; "/" is not escaped. Reals with 15 significant digits,
	 * not 17: 50.9 stays 50.9 instead of 50.899999999999999. */
	int ret = json_dumpf(doc, f, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));

	json_decref(doc);
	if (ret < 0 || fputc('\n', f) == EOF)
		return -EIO;
	return 0;
}
