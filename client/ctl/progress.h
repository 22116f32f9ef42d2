/* client/ctl/progress.h — a one-line progress bar for long kvpalacectl
 * operations (evict), and a spinner with the time waited for those the
 * daemon answers in one go (checkpoint, restore, warm-up).
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
 * line. A total of 0 means unknown: only the count is shown.
 *
 *	progress_wait_start(&pg, stdout, progress_wanted(stdout) && !json,
 *			    "restoring");
 *	ret = kvp_admin_restore(...);      // one blocking call
 *	progress_wait_end(&pg);            // erases it; print the result
 *
 * A wait is drawn at once, then redrawn by a thread of its own every
 * interval ("restoring / 2.4 s") while the caller blocks, until
 * progress_wait_end stops and joins it. Part of kvpalacectl, not of the
 * library. Not thread-safe: between progress_wait_start and
 * progress_wait_end only that thread touches p and writes to f, so the
 * caller must not write to f meanwhile.
 *
 * Layer: ctl, the control CLI (client/README.md).
 */
#ifndef KVPC_PROGRESS_H
#define KVPC_PROGRESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PROGRESS_INTERVAL_NS 100000000ull /* 10 redraws a second */
#define PROGRESS_BAR_CELLS   30

struct progress {
	FILE *f;
	int on;		      /* drawing at all */
	int bytes;	      /* figures are byte counts: shown with units */
	int elapsed;	      /* a wait: done is milliseconds, shown with a spinner */
	char label[32];	      /* printed before the bar */
	uint64_t total;	      /* 0: unknown */
	uint64_t done;	      /* the last figure given */
	uint64_t last_ns;     /* when it was last drawn, 0 never */
	uint64_t interval_ns; /* between redraws */
	size_t drawn;	      /* width of the line on screen, to erase it */
	/* A wait's drawing thread (progress_wait_start). */
	int thread_on; /* the thread runs */
	int stop;      /* under lock: progress_wait_end wants it gone */
	uint64_t start_ns;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
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

/* Sets p up for a wait of unknown length on f, as progress_start does,
 * and when on draws "label | 0.0 s" at once and starts a thread that
 * redraws it every interval with the next spinner frame and the time
 * waited. When the thread cannot start, the line stays as drawn. */
void progress_wait_start(struct progress *p, FILE *f, int on, const char *label);

/* Stops and joins the thread of progress_wait_start and erases the line. */
void progress_wait_end(struct progress *p);

/* Writes the bar's line for done of total into buf (cap bytes, without
 * the carriage return): "label [#####-----]  50%  32 MiB / 64 MiB"; for a
 * wait, "label / 2.4 s" (the spinner turns a quarter each interval).
 * Exposed for tests. */
void progress_format(const struct progress *p, char *buf, size_t cap);

#endif
