/* daemon/base/confview.c — config_print's text as entries (see confview.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "confview.h"

int confview_text(const struct config *c, char **ret_text, size_t *ret_len)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return -ENOMEM;
	config_print(c, f);
	if (fclose(f) != 0 || !text) {
		free(text);
		return -ENOMEM;
	}
	*ret_text = text;
	*ret_len = len;
	return 0;
}

size_t confview_lines(const char *text)
{
	size_t n = 0;

	for (const char *p = text; *p;) {
		const char *nl = strchr(p, '\n');

		n++;
		if (!nl)
			break;
		p = nl + 1;
	}
	return n;
}

int confview_split(char *line, struct confview_entry *ret)
{
	char *eq, *hash, *end;

	if (!*line || *line == '#' || *line == ' ')
		return -EINVAL;
	eq = strstr(line, " = ");
	if (!eq)
		return -EINVAL;
	/* The source is after the last " # ": a value (a path) may hold one. */
	hash = NULL;
	for (char *p = strstr(eq + 2, " # "); p; p = strstr(p + 1, " # "))
		hash = p;
	if (!hash || !hash[3])
		return -EINVAL;
	/* The key is padded with blanks before " = ". */
	end = eq;
	while (end > line && end[-1] == ' ')
		end--;
	if (end == line)
		return -EINVAL;
	*end = '\0';
	ret->key = line;
	ret->value = eq + 3;
	end = hash;
	while (end > ret->value && end[-1] == ' ')
		end--;
	*end = '\0';
	ret->source = hash + 3;
	return 0;
}

/* The entries of a copy of text, in a malloc'd array of *ret_n; the copy
 * is in *ret_buf. Returns 0 or -ENOMEM. */
static int split_all(const char *text, char **ret_buf, struct confview_entry **ret_e, size_t *ret_n)
{
	size_t lines = confview_lines(text), n = 0;
	char *buf = strdup(text);
	struct confview_entry *e = calloc(lines ? lines : 1, sizeof(*e));
	char *p = buf;

	if (!buf || !e) {
		free(buf);
		free(e);
		return -ENOMEM;
	}
	while (p && *p) {
		char *nl = strchr(p, '\n');

		if (nl)
			*nl = '\0';
		if (confview_split(p, &e[n]) == 0)
			n++;
		p = nl ? nl + 1 : NULL;
	}
	*ret_buf = buf;
	*ret_e = e;
	*ret_n = n;
	return 0;
}

int confview_diff(const char *a, const char *b, int with_source,
		  void (*fn)(void *arg, const char *key), void *arg)
{
	struct confview_entry *ea = NULL, *eb = NULL;
	char *ba = NULL, *bb = NULL;
	size_t na, nb;
	int ret;

	ret = split_all(a, &ba, &ea, &na);
	if (ret == 0)
		ret = split_all(b, &bb, &eb, &nb);
	if (ret < 0)
		goto out;
	for (size_t i = 0; i < na; i++) {
		const struct confview_entry *x = &ea[i], *y = NULL;

		for (size_t j = 0; j < nb && !y; j++)
			if (!strcmp(eb[j].key, x->key))
				y = &eb[j];
		if (!y || strcmp(x->value, y->value) ||
		    (with_source && strcmp(x->source, y->source)))
			fn(arg, x->key);
	}
out:
	free(ba);
	free(ea);
	free(bb);
	free(eb);
	return ret;
}
