/* exporter/exporter.c — kvpalace-exporter: kvpalaced's metrics over HTTP
 * for Prometheus, so the daemon itself stays off the network
 * (PrivateNetwork=yes in its unit). GET /metrics asks the daemon's admin
 * socket for Stats and answers the page client/metrics/prom.c writes,
 * the same page `kvpalacectl metrics` prints; / answers a pointer to
 * /metrics; anything else 404; methods other than GET and HEAD 405.
 *
 * Listening: the socket systemd passes (kvpalace-exporter.socket,
 * sd_listen_fds), else --listen ADDR:PORT (default 127.0.0.1:9746; port 0
 * picks a free one, and the address bound is printed on stdout).
 *
 * Threads: libmicrohttpd runs a thread per HTTP connection, at most
 * --max-connections of them. The daemon is asked by one scrape thread
 * (struct scraper): a handler asks it for a fresh page and waits at most
 * --timeout seconds. A daemon that does not answer leaves only that thread
 * waiting on its connection; until it answers or goes away every scrape
 * gets, in time, a page saying kvpalace_up 0 — never a hung scrape, and
 * never more than one connection to a stuck daemon. The main thread waits
 * for SIGTERM or SIGINT.
 *
 * Logs go to stderr with <N> priority prefixes (journald reads them),
 * once per change between reachable and not.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <systemd/sd-daemon.h>

#include "kvpalace.h"
#include "prom.h"

#define DEFAULT_LISTEN "127.0.0.1:9746"

static const char index_page[] =
	"<html><head><title>kvpalace exporter</title></head><body>\n"
	"<h1>kvpalace exporter</h1>\n"
	"<p><a href=\"/metrics\">/metrics</a>: kvpalaced's metrics (man kvpalace-exporter).</p>\n"
	"</body></html>\n";

/* ---- the scrape thread -------------------------------------------------- */

struct scraper {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const char *admin; /* admin socket path */
	/* Generations: handlers raise `asked`; the thread takes it into
	 * `started`, and publishes the page as `done`. */
	uint64_t asked, started, done;
	char *page; /* the page of generation done (text format), malloc'd */
	size_t page_len;
	int up;	  /* the page of `done` says kvpalace_up 1 */
	int busy; /* the thread is asking the daemon now */
	int stop;
	int last_err; /* of the last failed scrape, for logging changes only */
};

/* per_pool only with --per-pool: whoever reaches the port (any local
 * user, on loopback) reads the page, and per-pool samples name every
 * tenant's uid and model. */
static struct prom_source exporter_source = {
	.component = "kvpalace-exporter",
	.version = KVP_VERSION,
};

/* libmicrohttpd's messages (a connection refused at the limit, ...):
 * with a priority for journald, and at most one a second, so that a
 * client opening connections in a loop cannot flood the journal. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static time_t last;
	static unsigned long dropped;
	time_t now = time(NULL);

	(void)cls;
	pthread_mutex_lock(&lock);
	if (now == last) {
		dropped++;
		pthread_mutex_unlock(&lock);
		return;
	}
	last = now;
	fputs("<4>kvpalace-exporter: ", stderr);
	vfprintf(stderr, fmt, ap);
	if (dropped)
		fprintf(stderr, " (%lu more messages in the last second%s)", dropped,
			dropped == 1 ? " not shown" : "s not shown");
	if (fmt[0] && fmt[strlen(fmt) - 1] != '\n')
		fputc('\n', stderr);
	dropped = 0;
	pthread_mutex_unlock(&lock);
}

/* The page for st (NULL: daemon unreachable) in memory. Returns 0 and a
 * malloc'd page, or a negative errno. */
static int render(const struct kvp_stats *st, char **ret_page, size_t *ret_len)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int ret;

	if (!f)
		return -errno;
	ret = prom_write(f, PROM_TEXT, st, &exporter_source);
	if (fclose(f) != 0 && ret == 0)
		ret = -EIO;
	if (ret < 0) {
		free(buf);
		return ret;
	}
	*ret_page = buf;
	*ret_len = len;
	return 0;
}

/* Connects to the admin socket, asks for Stats, renders, disconnects.
 * Returns 0 when the daemon answered, else its negative errno; *page is
 * set either way (the down page when it did not answer), NULL only when
 * memory ran out. */
static int scrape_once(const char *admin, char **page, size_t *len)
{
	kvp_client *c = NULL;
	struct kvp_stats *st = NULL;
	int ret;

	*page = NULL;
	ret = kvp_connect(admin, &c);
	if (ret == 0)
		ret = kvp_stats(c, &st);
	if (ret == 0 && render(st, page, len) < 0)
		ret = -ENOMEM;
	kvp_stats_free(st);
	kvp_disconnect(c);
	if (ret < 0 && render(NULL, page, len) < 0)
		*page = NULL;
	return ret;
}

static void *scraper_main(void *arg)
{
	struct scraper *s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		uint64_t gen;
		char *page;
		size_t len = 0;
		int ret;

		while (!s->stop && s->asked == s->started)
			pthread_cond_wait(&s->cond, &s->lock);
		if (s->stop)
			break;
		gen = s->started = s->asked;
		s->busy = 1;
		pthread_mutex_unlock(&s->lock);

		ret = scrape_once(s->admin, &page, &len);

		pthread_mutex_lock(&s->lock);
		s->busy = 0;
		if (ret < 0 && ret != s->last_err)
			fprintf(stderr, "<4>kvpalace-exporter: %s: %s: kvpalace_up is 0\n",
				s->admin, strerror(-ret));
		else if (ret == 0 && s->last_err)
			fprintf(stderr, "<5>kvpalace-exporter: %s answers again\n", s->admin);
		s->last_err = ret;
		if (page) {
			free(s->page);
			s->page = page;
			s->page_len = len;
			s->up = ret == 0;
		}
		s->done = gen;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* A fresh page (asked for after this call began), within timeout_s. On
 * timeout, or when the thread is stuck on an earlier scrape, the down
 * page. Returns 0 and a malloc'd copy, or -ENOMEM. */
static int scrape(struct scraper *s, int timeout_s, char **ret_page, size_t *ret_len)
{
	struct timespec deadline;
	uint64_t want;
	int ret = 0;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += timeout_s;
	pthread_mutex_lock(&s->lock);
	want = ++s->asked;
	pthread_cond_broadcast(&s->cond);
	while (s->done < want && ret == 0)
		ret = pthread_cond_timedwait(&s->cond, &s->lock, &deadline);
	if (s->done >= want && s->page) {
		char *copy = malloc(s->page_len ? s->page_len : 1);

		if (copy)
			memcpy(copy, s->page, s->page_len);
		*ret_page = copy;
		*ret_len = s->page_len;
		pthread_mutex_unlock(&s->lock);
		return copy ? 0 : -ENOMEM;
	}
	if (s->last_err != -ETIMEDOUT) {
		fprintf(stderr,
			"<4>kvpalace-exporter: %s did not answer within %d s: "
			"kvpalace_up is 0\n",
			s->admin, timeout_s);
		s->last_err = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&s->lock);
	return render(NULL, ret_page, ret_len);
}

/* ---- HTTP --------------------------------------------------------------- */

struct server {
	struct scraper *scraper;
	int timeout_s;
};

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned int status, const char *type,
			      void *body, size_t len, enum MHD_ResponseMemoryMode mode,
			      const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	enum MHD_Result ret;

	if (!r) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
			      const char *method, const char *version, const char *upload_data,
			      size_t *upload_data_size, void **con_cls)
{
	static const char not_found[] = "404 not found: try /metrics\n";
	static const char not_allowed[] = "405 method not allowed: GET or HEAD\n";
	struct server *srv = cls;
	char *page;
	size_t len;

	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
			      (void *)not_allowed, sizeof(not_allowed) - 1, MHD_RESPMEM_PERSISTENT,
			      "GET, HEAD");
	/* A GET with a body: wait for its end (MHD calls again), then answer. */
	if (*upload_data_size) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (!strcmp(url, "/"))
		return answer(conn, MHD_HTTP_OK, "text/html; charset=utf-8", (void *)index_page,
			      sizeof(index_page) - 1, MHD_RESPMEM_PERSISTENT, NULL);
	if (strcmp(url, "/metrics"))
		return answer(conn, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8",
			      (void *)not_found, sizeof(not_found) - 1, MHD_RESPMEM_PERSISTENT,
			      NULL);
	if (scrape(srv->scraper, srv->timeout_s, &page, &len) < 0)
		return MHD_NO; /* out of memory: MHD closes the connection */
	return answer(conn, MHD_HTTP_OK, PROM_TEXT_CONTENT_TYPE, page, len, MHD_RESPMEM_MUST_FREE,
		      NULL);
}

/* ---- listening ---------------------------------------------------------- */

/* Binds and listens on ADDR:PORT (IPv4, or [IPv6]:PORT). Returns the
 * socket, or a negative errno after printing why. */
static int listen_on(const char *spec)
{
	struct sockaddr_storage ss = {0};
	socklen_t sl;
	char host[64], shown[80];
	const char *colon = strrchr(spec, ':');
	char *end;
	unsigned long port;
	int fd, one = 1;
	size_t hl;

	if (!colon || colon == spec)
		goto bad;
	hl = (size_t)(colon - spec);
	if (spec[0] == '[') {
		if (hl < 3 || spec[hl - 1] != ']')
			goto bad;
		spec++;
		hl -= 2;
	}
	if (hl >= sizeof(host))
		goto bad;
	memcpy(host, spec, hl);
	host[hl] = 0;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port > 65535)
		goto bad;
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		((struct sockaddr_in *)&ss)->sin_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
		sl = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
		sl = sizeof(struct sockaddr_in6);
	} else {
		goto bad;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto fail;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 64) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		int err = errno;

		close(fd);
		errno = err;
		goto fail;
	}
	if (ss.ss_family == AF_INET)
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	else
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	snprintf(shown, sizeof(shown), ss.ss_family == AF_INET6 ? "[%s]:%lu" : "%s:%lu", host,
		 port);
	/* The address bound, for whoever started us with port 0. */
	printf("%s\n", shown);
	fflush(stdout);
	fprintf(stderr, "<6>kvpalace-exporter: listening on http://%s/metrics\n", shown);
	return fd;
fail:
	fprintf(stderr, "<3>kvpalace-exporter: --listen %s: %s\n", spec, strerror(errno));
	return -errno;
bad:
	fprintf(stderr,
		"<3>kvpalace-exporter: --listen %s: want ADDR:PORT (127.0.0.1:9746, "
		"[::1]:9746)\n",
		spec);
	return -EINVAL;
}

/* The socket systemd passed: one stream socket. Returns it, -ENOENT when
 * none was passed, or another negative errno after printing why. */
static int listen_fd_passed(void)
{
	int n = sd_listen_fds(1);

	if (n == 0)
		return -ENOENT;
	if (n < 0 || n != 1 || sd_is_socket(SD_LISTEN_FDS_START, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
		fprintf(stderr,
			"<3>kvpalace-exporter: want one listening stream socket from "
			"systemd, got %d descriptors\n",
			n);
		return -EINVAL;
	}
	fprintf(stderr, "<6>kvpalace-exporter: serving on the socket systemd passed\n");
	return SD_LISTEN_FDS_START;
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvpalace-exporter [OPTION]...\n"
		"Serves kvpalaced's metrics for Prometheus at http://ADDR:PORT/metrics.\n"
		"\n"
		"  -l, --listen ADDR:PORT   where to listen without socket activation\n"
		"                           (default " DEFAULT_LISTEN "; port 0 picks one and\n"
		"                           prints the address on stdout)\n"
		"  -s, --admin-socket PATH  kvpalaced's admin socket (default\n"
		"                           $KVPALACE_ADMIN_SOCKET, else the library's default)\n"
		"  -t, --timeout SECONDS    longest wait for the daemon per scrape (default 5)\n"
		"  -c, --max-connections N  HTTP connections served at once (default 64)\n"
		"  -p, --per-pool           a sample per pool, labelled with its uid and model\n"
		"                           (default: summed over pools; see the man page)\n"
		"  -h, --help               this text\n"
		"  -V, --version            the version\n"
		"\n"
		"Under systemd, kvpalace-exporter.socket passes the listening socket.\n"
		"See kvpalace-exporter(8).\n");
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi) {
		fprintf(stderr, "kvpalace-exporter: %s %s: want %d..%d\n", opt, s, lo, hi);
		return -EINVAL;
	}
	*ret = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"admin-socket", required_argument, NULL, 's'},
		{"timeout", required_argument, NULL, 't'},
		{"max-connections", required_argument, NULL, 'c'},
		{"per-pool", no_argument, NULL, 'p'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{0},
	};
	const char *listen_spec = NULL, *admin = getenv("KVPALACE_ADMIN_SOCKET");
	char admin_default[108];
	int timeout_s = 5, max_conn = 64, fd, opt, sig;
	struct scraper s = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
	struct server srv = {.scraper = &s};
	struct MHD_Daemon *d;
	pthread_t thread;
	sigset_t mask;

	while ((opt = getopt_long(argc, argv, "l:s:t:c:phV", opts, NULL)) != -1) {
		switch (opt) {
		case 'l':
			listen_spec = optarg;
			break;
		case 's':
			admin = optarg;
			break;
		case 't':
			if (parse_int("--timeout", optarg, 1, 3600, &timeout_s) < 0)
				return 2;
			break;
		case 'c':
			if (parse_int("--max-connections", optarg, 1, 1024, &max_conn) < 0)
				return 2;
			break;
		case 'p':
			exporter_source.per_pool = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("kvpalace-exporter %s\n", KVP_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (!admin || !*admin) {
		if (kvp_default_admin_socket_path(admin_default, sizeof(admin_default)) >=
		    (int)sizeof(admin_default)) {
			fprintf(stderr,
				"<3>kvpalace-exporter: default admin socket path too long\n");
			return 1;
		}
		admin = admin_default;
	}

	fd = listen_spec ? -ENOENT : listen_fd_passed();
	if (fd == -ENOENT)
		fd = listen_on(listen_spec ? listen_spec : DEFAULT_LISTEN);
	if (fd < 0)
		return 1;

	/* SIGTERM and SIGINT for sigwait below, blocked in every thread;
	 * SIGPIPE ignored (a scraper hanging up mid-reply). */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	s.admin = admin;
	if (pthread_create(&thread, NULL, scraper_main, &s) != 0) {
		fprintf(stderr, "<3>kvpalace-exporter: cannot start the scrape thread\n");
		return 1;
	}
	srv.timeout_s = timeout_s;
	d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
				     MHD_USE_POLL | MHD_USE_ERROR_LOG,
			     0, NULL, NULL, handle, &srv, MHD_OPTION_LISTEN_SOCKET, fd,
			     MHD_OPTION_CONNECTION_LIMIT, (unsigned int)max_conn,
			     /* An idle or slow client loses its connection soon
			      * after the longest a scrape may wait for the daemon. */
			     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)(timeout_s + 2),
			     MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "<3>kvpalace-exporter: cannot start the HTTP server\n");
		return 1;
	}
	fprintf(stderr, "<6>kvpalace-exporter %s: reading %s\n", KVP_VERSION, admin);

	while (sigwait(&mask, &sig) != 0)
		;
	MHD_stop_daemon(d);
	pthread_mutex_lock(&s.lock);
	s.stop = 1;
	pthread_cond_broadcast(&s.cond);
	/* A scrape stuck on a daemon that never answers: leave it, exit. */
	if (s.busy) {
		pthread_mutex_unlock(&s.lock);
		return 0;
	}
	pthread_mutex_unlock(&s.lock);
	pthread_join(thread, NULL);
	free(s.page);
	return 0;
}
