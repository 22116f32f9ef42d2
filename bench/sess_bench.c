/* bench/sess_bench.c — what many sessions cost: Stats and ListSessions
 * latency with N sessions, and the daemon's memory per session.
 *
 * One client through libkvpalace against a daemon bench/run started (its
 * pid given, for /proc/PID/status):
 *  - memory: in a pool of its own per size, N sessions of 16 tokens (and
 *    N/--big-div of 1024), each created, appended and committed with
 *    tokens of its own (no K/V written: the arena is not touched); the
 *    daemon's VmRSS before and after, per session. Two sizes give the
 *    fixed and the per-token cost.
 *  - Stats with those sessions, alternating with kvp_ping (A/B/A/B, one
 *    call each, the median of each): Stats should cost a round trip
 *    whatever the sessions; and Stats with one session in each pool, the
 *    same way, so the growth shows (each in pings: the round trip drifts
 *    between the two windows).
 *  - ListSessions: the whole listing paged with kvp_list_sessions_page
 *    (limit KVP_LIST_SESSIONS_MAX), the median page beside the ping; the
 *    first and the last pages' medians.
 * Prints "sample NAME VALUE" lines (bench/run) and a summary on stderr.
 */
#define BENCH_PROG "kvp-bench-sess"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvpalace.h"

static const struct kvp_layout tiny = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = 16,
	.dtype = KVP_DTYPE_F16,
};

static void check(int ret, const char *what)
{
	if (ret < 0)
		die("%s: %s", what, strerror(-ret));
}

/* The daemon's resident memory in bytes (VmRSS). */
static double rss_bytes(int pid)
{
	char path[64], line[256];
	double kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	if (!f)
		die("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lf kB", &kb) == 1)
			break;
	fclose(f);
	if (kb < 0)
		die("no VmRSS in %s", path);
	return kb * 1024;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* n sessions of t tokens each in a pool of their own (model id by t):
 * the daemon's RSS growth per session. The sessions stay (this
 * connection owns them). */
static double fill(kvp_client *c, int pid, uint32_t n, uint32_t t)
{
	char model[64];
	uint32_t *tok = malloc(t * sizeof(*tok));
	kvp_pool *p;
	double before, after;

	if (!tok)
		die("out of memory");
	snprintf(model, sizeof(model), "kvp-bench-sess-%u", t);
	check(kvp_pool_open(c, model, &tiny, &p), "kvp_pool_open");
	before = rss_bytes(pid);
	for (uint32_t i = 0; i < n; i++) {
		kvp_session *s;

		/* Tokens of its own: no page shared, every session pays for
		 * its pages' index entries as a conversation would. */
		for (uint32_t k = 0; k < t; k++)
			tok[k] = i * 2654435761u + k * 40503u + t;
		check(kvp_session_create(p, &s), "kvp_session_create");
		check(kvp_append(s, tok, t), "kvp_append");
		check(kvp_commit(s, t), "kvp_commit");
	}
	after = rss_bytes(pid);
	free(tok);
	return (after - before) / n;
}

/* Stats and ping alternated reps times: their medians in µs. */
static void stats_vs_ping(kvp_client *c, int reps, double *ret_stats, double *ret_ping)
{
	double *a = calloc((size_t)reps, sizeof(double)), *b = calloc((size_t)reps, sizeof(double));

	if (!a || !b)
		die("out of memory");
	for (int i = 0; i < reps; i++) {
		struct kvp_stats *st;
		uint64_t t0 = now_ns();

		check(kvp_stats(c, &st), "kvp_stats");
		a[i] = (double)(now_ns() - t0) / 1e3;
		kvp_stats_free(st);
		t0 = now_ns();
		check(kvp_ping(c), "kvp_ping");
		b[i] = (double)(now_ns() - t0) / 1e3;
	}
	*ret_stats = median(a, (size_t)reps);
	*ret_ping = median(b, (size_t)reps);
	free(a);
	free(b);
}

/* The whole listing, page by page, reps times; medians in µs of a page,
 * of the first and of the last page, and the ping between pages. */
static void list_pages(kvp_client *c, int reps, uint64_t want, double *ret_page, double *ret_first,
		       double *ret_last, double *ret_ping)
{
	size_t cap = 1024, n_pages = 0, n_pings = 0;
	double *pg = malloc(cap * sizeof(double)), *pi = malloc(cap * sizeof(double));
	double *first = calloc((size_t)reps, sizeof(double)),
	       *last = calloc((size_t)reps, sizeof(double));

	if (!pg || !pi || !first || !last)
		die("out of memory");
	for (int r = 0; r < reps; r++) {
		uint64_t after = 0, total = 0;
		int more = 1, k = 0;

		while (more) {
			struct kvp_session_info *si;
			size_t n;
			uint64_t t0 = now_ns();
			double us;

			check(kvp_list_sessions_page(c, 0, after, KVP_LIST_SESSIONS_MAX, &si, &n,
						     &more),
			      "kvp_list_sessions_page");
			us = (double)(now_ns() - t0) / 1e3;
			if (n)
				after = si[n - 1].session_id;
			total += n;
			free(si);
			if (n_pages == cap) {
				cap *= 2;
				pg = realloc(pg, cap * sizeof(double));
				pi = realloc(pi, cap * sizeof(double));
				if (!pg || !pi)
					die("out of memory");
			}
			pg[n_pages++] = us;
			if (k++ == 0)
				first[r] = us;
			last[r] = us;
			t0 = now_ns();
			check(kvp_ping(c), "kvp_ping");
			pi[n_pings++] = (double)(now_ns() - t0) / 1e3;
		}
		if (total != want)
			die("listed %llu sessions, %llu exist", (unsigned long long)total,
			    (unsigned long long)want);
	}
	*ret_page = median(pg, n_pages);
	*ret_ping = median(pi, n_pings);
	*ret_first = median(first, (size_t)reps);
	*ret_last = median(last, (size_t)reps);
	free(pg);
	free(pi);
	free(first);
	free(last);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"daemon-pid", required_argument, NULL, 'p'},
		{"sessions", required_argument, NULL, 'n'},
		{"big-div", required_argument, NULL, 'b'},
		{"reps", required_argument, NULL, 'r'},
		{NULL, 0, NULL, 0},
	};
	const char *sock = NULL;
	int pid = 0, reps = 200, big_div = 20, o;
	uint32_t n = 100000, n_big;
	double b16, b1024, per_tok, fixed, s0, p0, s1, p1, page, pfirst, plast, pping;
	kvp_client *c;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			sock = optarg;
			break;
		case 'p':
			pid = atoi(optarg);
			break;
		case 'n':
			n = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'b':
			big_div = atoi(optarg);
			break;
		case 'r':
			reps = atoi(optarg);
			break;
		default:
			die("usage: kvp-bench-sess --socket PATH --daemon-pid PID [--sessions N] "
			    "[--big-div D] [--reps R]");
		}
	}
	if (!sock || pid <= 0 || n < 2 || big_div < 1 || reps < 1)
		die("--socket and --daemon-pid are required; --sessions >= 2");
	n_big = n / (uint32_t)big_div ? n / (uint32_t)big_div : 1;
	check(kvp_connect(sock, &c), "kvp_connect");

	/* Stats with one session of each size: the same pools and request
	 * types in its reply as later (it lists a latency histogram per type
	 * served), so what differs later is only the number of sessions. */
	fill(c, pid, 1, 16);
	fill(c, pid, 1, 1024);
	stats_vs_ping(c, reps, &s0, &p0);
	b16 = fill(c, pid, n, 16);
	b1024 = fill(c, pid, n_big, 1024);
	per_tok = (b1024 - b16) / (1024 - 16);
	fixed = b16 - 16 * per_tok;
	stats_vs_ping(c, reps, &s1, &p1);
	list_pages(c, reps / 50 ? reps / 50 : 1, (uint64_t)n + n_big + 2, &page, &pfirst, &plast,
		   &pping);

	sample("sess.bytes_16", b16);
	sample("sess.bytes_1024", b1024);
	/* The same figures again, for bench/run's records against Redis. */
	sample("sess.bytes_16_vs_redis", b16);
	sample("sess.bytes_1024_vs_redis", b1024);
	sample("sess.stats_vs_ping_us", s1);
	/* Stats in pings, with the sessions and with none: the round trip
	 * itself drifts between windows (TOOLCHAIN-NOTES), the ratio to a
	 * ping interleaved with it does not. */
	sample("sess.stats_pings", s1 / p1);
	sample("sess.stats_empty_pings", s0 / p0);
	sample("sess.bytes_per_token", per_tok);
	sample("sess.bytes_fixed", fixed);
	sample("sess.goal_16", 512 + 8 * 16);
	sample("sess.goal_1024", 512 + 8 * 1024);
	sample("sess.goal_per_token", 8);
	sample("sess.stats_us", s1);
	sample("sess.stats_empty_us", s0);
	sample("sess.ping_us", p1);
	sample("sess.list_page_us", page);
	sample("sess.list_first_page_us", pfirst);
	sample("sess.list_last_page_us", plast);
	sample("sess.list_ping_us", pping);
	fprintf(stderr,
		"sessions: %u of 16 tokens, %u of 1024\n"
		"  bytes per session: 16 tokens %.0f, 1024 tokens %.0f; fixed %.0f + %.2f per "
		"token (goal 512 + 8)\n"
		"  Stats %.1f us with them, %.1f us with none; ping %.1f us / %.1f us\n"
		"  ListSessions page of %u: median %.1f us (first %.1f, last %.1f); ping %.1f us\n",
		n, n_big, b16, b1024, fixed, per_tok, s1, s0, p1, p0, KVP_LIST_SESSIONS_MAX, page,
		pfirst, plast, pping);
	kvp_disconnect(c);
	return 0;
}
