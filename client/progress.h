/* client/progress.h — a one-line progress bar for long kvpalacectl
 * operations (evict now; checkpoint, restore and warm-up later).
 *
 *	struct progress pg;
 *	progress_start(&pg, stdout, progress_wanted(stdout) && !json, "evicting",
 *		       total_bytes, 1);
 *	while (...)
 *		progress_update(&pg, done_bytes);
 *	progress_end(&pg);   // erases the bar; print the result after it
 *
 * It draws only when told to (progress_wanted: the stream is a terminal
 * that is not "dumb"), so output that goes to a file or a pipe, or JSON,
 * never carries it. The bar is redrawn in place with a carriage return at
 * most every PROGRESS_INTERVAL_NS (always on the first and the last
 * update), and erased by progress_end so what follows starts on a clean
 * line. A total of 0 means unknown: only the count is shown. Part of
 * kvpalacectl, not of the library; not thread-safe.
 */
#ifndef KVPC_PROGRESS_H
#define KVPC_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PROGRESS_INTERVAL_NS 100000000ull /* 10 redraws a second */
#define PROGRESS_BAR_CELLS   30

struct progress {
	FILE *f;
	int on;		      /* drawing at all */
	int bytes;	      /* figures are byte counts: shown with units */
	char label[32];	      /* printed before the bar */
	uint64_t total;	      /* 0: unknown */
	uint64_t done;	      /* the last figure given */
	uint64_t last_ns;     /* when it was last drawn, 0 never */
	uint64_t interval_ns; /* between redraws */
	size_t drawn;	      /* width of the line on screen, to erase it */
};

/* True when f is a terminal worth drawing on: isatty and $TERM is not
 * "dumb". */
int progress_wanted(FILE *f);

/* Sets p up to draw on f when on; label (truncated to 31 bytes) names the
 * operation, total is the figure that means done (0: unknown), bytes
 * shows the figures as sizes (KiB, MiB, ...). Draws nothing yet. */
void progress_start(struct progress *p, FILE *f, int on, const char *label, uint64_t total,
		    int bytes);

/* Records done (clamped to total when known) and redraws when the last
 * draw is older than the interval, or when done reaches total. */
void progress_update(struct progress *p, uint64_t done);

/* Erases the bar (when one was drawn) and leaves the cursor at the start
 * of the now empty line. */
void progress_end(struct progress *p);

/* Writes the bar's line for done of total into buf (cap bytes, without
 * the carriage return): "label [#####-----]  50%  32 MiB / 64 MiB".
 * Exposed for tests. */
void progress_format(const struct progress *p, char *buf, size_t cap);

#endif
