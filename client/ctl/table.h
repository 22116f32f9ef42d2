/* client/ctl/table.h — kvpalacectl's text tables: rows of cells, each
 * column as wide as its widest cell, numbers right-aligned, and the
 * header line left out on request (--no-headers, for scripts).
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#ifndef KVPCTL_TABLE_H
#define KVPCTL_TABLE_H

#include <stddef.h>
#include <stdio.h>

#define TABLE_MAX_COLS 24
#define TABLE_CELL     48 /* bytes of a cell, its NUL included; longer is cut */

struct table {
	size_t n_cols;
	const char *head[TABLE_MAX_COLS];
	int left[TABLE_MAX_COLS]; /* left-aligned (text), else right (numbers) */
	size_t n_rows, cap_rows;
	char (*cells)[TABLE_CELL]; /* n_rows * n_cols */
	int failed;		   /* out of memory: print says so */
};

/* A column: its header, and '<' for left-aligned text or '>' for numbers. */
void table_col(struct table *t, const char *head, char align);

/* Starts a new row; the cells follow with table_cell, left to right. */
void table_row(struct table *t);
void table_cell(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the table to f with indent spaces before each line (the header
 * too unless no_headers), and frees its rows. Returns 0 or -ENOMEM. */
int table_print(struct table *t, FILE *f, int indent, int no_headers);

#endif
