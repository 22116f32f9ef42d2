/* client/ctl/table.c — kvpalacectl's text tables (see table.h).
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

void table_col(struct table *t, const char *head, char align)
{
	if (t->n_cols == TABLE_MAX_COLS)
		return;
	t->head[t->n_cols] = head;
	t->left[t->n_cols] = align == '<';
	t->n_cols++;
}

void table_row(struct table *t)
{
	if (t->failed)
		return;
	if (t->n_rows == t->cap_rows) {
		size_t want = t->cap_rows ? 2 * t->cap_rows : 16;
		char(*c)[TABLE_CELL] = realloc(t->cells, want * t->n_cols * TABLE_CELL);

		if (!c) {
			t->failed = 1;
			return;
		}
		t->cells = c;
		t->cap_rows = want;
	}
	memset(t->cells[t->n_rows * t->n_cols], 0, t->n_cols * TABLE_CELL);
	t->n_rows++;
}

/* Cells go into the first empty cell of the last row. */
void table_cell(struct table *t, const char *fmt, ...)
{
	char(*row)[TABLE_CELL];
	va_list ap;
	size_t i = 0;

	if (t->failed || !t->n_rows)
		return;
	row = &t->cells[(t->n_rows - 1) * t->n_cols];
	while (i < t->n_cols && row[i][0])
		i++;
	if (i == t->n_cols)
		return;
	va_start(ap, fmt);
	vsnprintf(row[i], TABLE_CELL, fmt, ap);
	va_end(ap);
	if (!row[i][0])
		snprintf(row[i], TABLE_CELL, "%s", "-"); /* an empty cell would shift the rest */
}

static void print_line(const struct table *t, FILE *f, int indent, const char *const *cells,
		       const int *width)
{
	fprintf(f, "%*s", indent, "");
	for (size_t i = 0; i < t->n_cols; i++) {
		int last = i + 1 == t->n_cols;

		if (t->left[i] && last)
			fputs(cells[i], f); /* no trailing blanks */
		else if (t->left[i])
			fprintf(f, "%-*s", width[i], cells[i]);
		else
			fprintf(f, "%*s", width[i], cells[i]);
		fputs(last ? "\n" : " ", f);
	}
}

int table_print(struct table *t, FILE *f, int indent, int no_headers)
{
	int width[TABLE_MAX_COLS];
	const char *line[TABLE_MAX_COLS];

	if (t->failed) {
		free(t->cells);
		t->cells = NULL;
		return -ENOMEM;
	}
	for (size_t i = 0; i < t->n_cols; i++) {
		width[i] = no_headers ? 1 : (int)strlen(t->head[i]);
		for (size_t r = 0; r < t->n_rows; r++) {
			int n = (int)strlen(t->cells[r * t->n_cols + i]);

			if (n > width[i])
				width[i] = n;
		}
	}
	if (!no_headers)
		print_line(t, f, indent, t->head, width);
	for (size_t r = 0; r < t->n_rows; r++) {
		for (size_t i = 0; i < t->n_cols; i++)
			line[i] = t->cells[r * t->n_cols + i];
		print_line(t, f, indent, line, width);
	}
	free(t->cells);
	t->cells = NULL;
	t->n_rows = t->cap_rows = 0;
	return 0;
}
