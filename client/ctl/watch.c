/* client/ctl/watch.c — the watch mode of the view commands (see
 * watch.h), as watch(1) or `redis-cli --stat` would do it, but on one
 * connection kept open between snapshots.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded; the signal handler only sets a flag.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "watch.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* Sleeps ms or until a signal sets stop. */
static void pause_ms(uint64_t ms)
{
	struct timespec left = {.tv_sec = (time_t)(ms / 1000),
				.tv_nsec = (long)(ms % 1000) * 1000000};

	while (!stop && nanosleep(&left, &left) < 0 && errno == EINTR)
		;
}

int watch_run(kvp_client *c, const struct args *a, int (*run)(kvp_client *, const struct args *))
{
	/* No SA_RESTART: a signal during a request or the sleep ends it. */
	struct sigaction sa = {.sa_handler = on_signal};
	int tty = !a->json && isatty(STDOUT_FILENO);
	char when[32];

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	for (uint32_t n = 0; !stop;) {
		time_t now = time(NULL);
		struct tm tm;
		int ret;

		if (!localtime_r(&now, &tm) ||
		    !strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm))
			snprintf(when, sizeof(when), "-");
		if (tty)
			printf("\033[H\033[2JEvery %.1fs: kvpalacectl %s%*s%s\n\n",
			       (double)a->watch_ms / 1000, a->name, 8, "", when);
		else if (!a->json && !(a->given & OPT_NO_HEADERS)) /* rows only: no separator */
			printf("%s--- %s ---\n", n ? "\n" : "", when);
		ret = run(c, a);
		fflush(stdout);
		if (stop)
			break;
		if (ret)
			return ret;
		if (++n == a->count)
			break;
		pause_ms(a->watch_ms);
	}
	return 0;
}
