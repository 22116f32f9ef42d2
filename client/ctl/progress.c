/* client/ctl/progress.c — the terminal progress bar and the spinner of a wait
 * (see progress.h). A wait is the one place with a second thread: it
 * sleeps on a condition variable between redraws so progress_wait_end
 * wakes it at once.
 *
 * Layer: ctl, the control CLI (client/README.md); calls no other file of
 * ctl/ and nothing of the library.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int progress_wanted(FILE *f)
{
	const char *term = getenv("TERM");

	return f && isatty(fileno(f)) && !(term && !strcmp(term, "dumb"));
}

void progress_start(struct progress *p, FILE *f, int on, const char *label, uint64_t total,
		    int bytes)
{
	memset(p, 0, sizeof(*p));
	p->f = f;
	p->on = on && f;
	p->bytes = bytes;
	p->total = total;
	p->interval_ns = PROGRESS_INTERVAL_NS;
	snprintf(p->label, sizeof(p->label), "%s", label ? label : "");
}

/* 1536 → "1.5 KiB"; whole numbers without decimals. */
static void figure(const struct progress *p, uint64_t v, char *buf, size_t cap)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned int u = 0;
	double d = (double)v;

	if (!p->bytes) {
		snprintf(buf, cap, "%" PRIu64, v);
		return;
	}
	while (d >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		d /= 1024;
		u++;
	}
	if (u == 0 || d == (double)(uint64_t)d)
		snprintf(buf, cap, "%.0f %s", d, units[u]);
	else
		snprintf(buf, cap, "%.1f %s", d, units[u]);
}

void progress_format(const struct progress *p, char *buf, size_t cap)
{
	char done[32], total[32], bar[PROGRESS_BAR_CELLS + 1];
	unsigned int cells, pct;

	if (p->elapsed) {
		static const char spin[] = "|/-\\";
		uint64_t frame = p->interval_ns ? p->done * 1000000ull / p->interval_ns : 0;

		snprintf(buf, cap, "%s %c %" PRIu64 ".%" PRIu64 " s", p->label, spin[frame % 4],
			 p->done / 1000, p->done % 1000 / 100);
		return;
	}
	figure(p, p->done, done, sizeof(done));
	if (!p->total) {
		snprintf(buf, cap, "%s %s", p->label, done);
		return;
	}
	figure(p, p->total, total, sizeof(total));
	/* 128-bit products: a 2^64 total neither overflows nor rounds up
	 * to 100 % before it is done. */
	pct = (unsigned int)((unsigned __int128)p->done * 100 / p->total);
	cells = (unsigned int)((unsigned __int128)p->done * PROGRESS_BAR_CELLS / p->total);
	if (pct > 100)
		pct = 100;
	if (cells > PROGRESS_BAR_CELLS)
		cells = PROGRESS_BAR_CELLS;
	memset(bar, '#', cells);
	memset(bar + cells, '-', PROGRESS_BAR_CELLS - cells);
	bar[PROGRESS_BAR_CELLS] = '\0';
	snprintf(buf, cap, "%s [%s] %3u%%  %s / %s", p->label, bar, pct, done, total);
}

static void draw(struct progress *p)
{
	char line[160];
	size_t n;

	progress_format(p, line, sizeof(line));
	n = strlen(line);
	/* Pad over what a longer previous line left on screen. */
	fprintf(p->f, "\r%s%*s", line, p->drawn > n ? (int)(p->drawn - n) : 0, "");
	fflush(p->f);
	if (n > p->drawn)
		p->drawn = n;
	p->last_ns = now_ns();
}

void progress_update(struct progress *p, uint64_t done)
{
	int finished;

	if (p->total && done > p->total)
		done = p->total;
	p->done = done;
	if (!p->on)
		return;
	finished = p->total && done == p->total;
	if (p->last_ns && !finished && now_ns() - p->last_ns < p->interval_ns)
		return;
	draw(p);
}

void progress_end(struct progress *p)
{
	if (!p->on || !p->drawn)
		return;
	fprintf(p->f, "\r%*s\r", (int)p->drawn, "");
	fflush(p->f);
	p->drawn = 0;
}

/* The wait's thread: redraws every interval until told to stop. */
static void *wait_thread(void *arg)
{
	struct progress *p = arg;
	struct timespec until;

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		uint64_t at;

		clock_gettime(CLOCK_MONOTONIC, &until);
		at = (uint64_t)until.tv_sec * 1000000000ull + (uint64_t)until.tv_nsec +
		     p->interval_ns;
		until.tv_sec = (time_t)(at / 1000000000ull);
		until.tv_nsec = (long)(at % 1000000000ull);
		if (pthread_cond_timedwait(&p->wake, &p->lock, &until) == ETIMEDOUT && !p->stop) {
			p->done = (now_ns() - p->start_ns) / 1000000ull;
			draw(p);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

void progress_wait_start(struct progress *p, FILE *f, int on, const char *label)
{
	pthread_condattr_t attr;

	progress_start(p, f, on, label, 0, 0);
	p->elapsed = 1;
	p->start_ns = now_ns();
	if (!p->on)
		return;
	draw(p);
	if (pthread_mutex_init(&p->lock, NULL) != 0)
		return;
	/* Deadlines on the monotonic clock: a clock step must not stall it. */
	if (pthread_condattr_init(&attr) != 0)
		goto fail_lock;
	if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&p->wake, &attr) != 0) {
		pthread_condattr_destroy(&attr);
		goto fail_lock;
	}
	pthread_condattr_destroy(&attr);
	if (pthread_create(&p->thread, NULL, wait_thread, p) != 0)
		goto fail_cond;
	p->thread_on = 1;
	return;
fail_cond:
	pthread_cond_destroy(&p->wake);
fail_lock:
	pthread_mutex_destroy(&p->lock);
}

void progress_wait_end(struct progress *p)
{
	if (p->thread_on) {
		pthread_mutex_lock(&p->lock);
		p->stop = 1;
		pthread_cond_signal(&p->wake);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->thread, NULL);
		pthread_cond_destroy(&p->wake);
		pthread_mutex_destroy(&p->lock);
		p->thread_on = 0;
	}
	progress_end(p);
}
