/* tests/redis/rcluster.c — see rcluster.h. */
#include "rcluster.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "slots.h"

static struct rcluster *live;
static int registered;

static int port_free(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

int rcluster_script(struct rcluster *rc, const char *verb, int arg)
{
	const char *script = getenv("KVP_REDIS_CLUSTER");
	char cmd[1024];
	int st;

	if (!script)
		return -1;
	if (arg)
		snprintf(cmd, sizeof(cmd), "'%s' %s '%s' %d%s", script, verb, rc->dir, arg,
			 strcmp(verb, "start") ? "" : "");
	else
		snprintf(cmd, sizeof(cmd), "'%s' %s '%s'", script, verb, rc->dir);
	if (!strcmp(verb, "start"))
		snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " %d", (int)getpid());
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int start_once(struct rcluster *rc, unsigned int *seedp);

static void at_exit(void)
{
	if (live)
		rcluster_stop(live);
}

static void on_fatal(int sig)
{
	at_exit();
	signal(sig, SIG_DFL);
	raise(sig);
}

int rcluster_start(struct rcluster *rc)
{
	unsigned int seed = (unsigned int)(getpid() ^ time(NULL));
	int ret;

	if (access("/usr/bin/redis-server", X_OK) && system("command -v redis-server >/dev/null"))
		return 77;
	/* A port found free can be taken before redis-server binds it (the
	 * bus ports reach into the ephemeral range): three attempts. */
	for (int attempt = 0; attempt < 3; attempt++) {
		ret = start_once(rc, &seed);
		if (ret == 0 || ret == 77)
			return ret;
		rcluster_stop(rc);
	}
	return -1;
}

int rcluster_start_or_skip(struct rcluster *rc)
{
	int ret = rcluster_start(rc);

	if (ret == 77)
		exit(77);
	return ret ? -1 : 0;
}

void rcluster_tier_arg(const struct rcluster *rc, char *buf, size_t n)
{
	snprintf(buf, n, "redis://127.0.0.1:%d,127.0.0.1:%d", rc->base, rc->base + 1);
}

static int start_once(struct rcluster *rc, unsigned int *seedp)
{
	int ret;

	snprintf(rc->dir, sizeof(rc->dir), "/tmp/kvp-rcluster-XXXXXX");
	if (!mkdtemp(rc->dir))
		return -1;
	for (int tries = 0; tries < 50; tries++) {
		int ok = 1;

		/* Bus ports (+10000) stay below the ephemeral range (32768). */
		rc->base = 20000 + (int)(rand_r(seedp) % 2700);
		for (int i = 0; i < RCLUSTER_NODES && ok; i++)
			ok = port_free(rc->base + i) && port_free(rc->base + i + 10000);
		if (ok)
			break;
		rc->base = 0;
	}
	if (!rc->base)
		return -1;
	live = rc;
	if (!registered) {
		registered = 1;
		atexit(at_exit);
		signal(SIGABRT, on_fatal);
		signal(SIGSEGV, on_fatal);
		signal(SIGTERM, on_fatal);
		signal(SIGINT, on_fatal);
	}
	ret = rcluster_script(rc, "start", rc->base);
	return ret == 0 ? 0 : ret == 77 ? 77 : -1;
}

void rcluster_stop(struct rcluster *rc)
{
	char cmd[600];

	rcluster_script(rc, "stop", 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rc->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", rc->dir);
	if (live == rc)
		live = NULL;
}

redisContext *rcluster_connect(int port)
{
	struct timeval tv = {.tv_sec = 1};
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);

	if (c && c->err) {
		redisFree(c);
		return NULL;
	}
	if (c)
		redisSetTimeout(c, tv);
	return c;
}

static int table(struct rcluster *rc, struct slots_table *t)
{
	for (int i = 0; i < RCLUSTER_NODES; i++) {
		redisContext *c = rcluster_connect(rc->base + i);
		redisReply *r;
		int ret;

		if (!c)
			continue;
		r = redisCommand(c, "CLUSTER SLOTS");
		ret = r ? slots_parse(r, "127.0.0.1", t) : -1;
		if (r)
			freeReplyObject(r);
		redisFree(c);
		if (ret == 0 && t->n_covered == SLOTS_N)
			return 0;
	}
	return -1;
}

int rcluster_owner(struct rcluster *rc, const char *key)
{
	static struct slots_table t;

	if (table(rc, &t) < 0)
		return -1;
	return t.addr[t.owner[slots_key_slot(key, strlen(key))]].port;
}

int rcluster_masters(struct rcluster *rc, int ports[3])
{
	static struct slots_table t;
	int n = 0;

	if (table(rc, &t) < 0)
		return 0;
	for (unsigned int i = 0; i < t.n_addr && n < 3; i++)
		ports[n++] = t.addr[i].port;
	return n;
}

int rcluster_id(int port, char id[41])
{
	redisContext *c = rcluster_connect(port);
	redisReply *r = c ? redisCommand(c, "CLUSTER MYID") : NULL;
	int ok = r && r->type == REDIS_REPLY_STRING && r->len == 40;

	if (ok)
		memcpy(id, r->str, 41);
	if (r)
		freeReplyObject(r);
	if (c)
		redisFree(c);
	return ok ? 0 : -1;
}

/* A command on a new connection to port; the reply (NULL on failure). */
static redisReply *command(int port, const char *fmt, ...)
{
	redisContext *c = rcluster_connect(port);
	redisReply *r;
	va_list ap;

	if (!c)
		return NULL;
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	redisFree(c);
	return r;
}

/* The command's reply is not an error: 0, else -1 after saying so. */
static int command_ok(int port, const char *what, redisReply *r)
{
	int ok = r && r->type != REDIS_REPLY_ERROR;

	if (!ok)
		fprintf(stderr, "# %d: %s: %s\n", port, what, r ? r->str : "no reply");
	if (r)
		freeReplyObject(r);
	return ok ? 0 : -1;
}

int rcluster_keys(struct rcluster *rc, char (*keys)[RCLUSTER_KEY_MAX], int max)
{
	int m[3], n = rcluster_masters(rc, m), total = 0;

	if (n < 3)
		return -1;
	for (int i = 0; i < n; i++) {
		redisReply *r = command(m[i], "KEYS kvp:*:*:*");

		if (!r || r->type != REDIS_REPLY_ARRAY) {
			if (r)
				freeReplyObject(r);
			return -1;
		}
		for (size_t k = 0; k < r->elements; k++, total++)
			if (total < max)
				snprintf(keys[total], RCLUSTER_KEY_MAX, "%s", r->element[k]->str);
		freeReplyObject(r);
	}
	return total;
}

int rcluster_flush(struct rcluster *rc)
{
	int m[3], n = rcluster_masters(rc, m), ret = n == 3 ? 0 : -1;

	for (int i = 0; i < n; i++)
		ret |= command_ok(m[i], "FLUSHALL", command(m[i], "FLUSHALL"));
	return ret;
}

/* The value of "name:" in an INFO text, or -1. */
static long long info_field(const char *info, const char *name)
{
	const char *at = strstr(info, name);

	return at ? strtoll(at + strlen(name), NULL, 10) : -1;
}

/* Whether every replica of master port acknowledged its whole stream. */
static int replicas_caught_up(int port)
{
	redisReply *r = command(port, "INFO replication");
	int ok = 0;

	if (r && r->type == REDIS_REPLY_STRING) {
		long long want = info_field(r->str, "master_repl_offset:");
		const char *s = strstr(r->str, "slave0:");

		ok = want >= 0 && s;
		for (; ok && s; s = strstr(s + 1, "\nslave")) {
			const char *off = strstr(s, "offset=");

			ok = off && strtoll(off + 7, NULL, 10) >= want;
		}
	}
	if (r)
		freeReplyObject(r);
	return ok;
}

int rcluster_wait_replicas(struct rcluster *rc)
{
	int m[3], n = rcluster_masters(rc, m);

	for (int tries = 0; tries < 200; tries++) {
		int all = n == 3;

		for (int i = 0; i < n && all; i++)
			all = replicas_caught_up(m[i]);
		if (all)
			return 0;
		usleep(50000);
	}
	return -1;
}

int rcluster_move_slot(struct rcluster *rc, const char *key, int from, int to, int migrate,
		       int final)
{
	char idf[41], idt[41], slot[8];
	int m[3], n;

	snprintf(slot, sizeof(slot), "%u", slots_key_slot(key, strlen(key)));
	if (rcluster_id(from, idf) < 0 || rcluster_id(to, idt) < 0)
		return -1;
	if (command_ok(to, "SETSLOT IMPORTING",
		       command(to, "CLUSTER SETSLOT %s IMPORTING %s", slot, idf)) < 0 ||
	    command_ok(from, "SETSLOT MIGRATING",
		       command(from, "CLUSTER SETSLOT %s MIGRATING %s", slot, idt)) < 0)
		return -1;
	if ((migrate || final) &&
	    command_ok(from, "MIGRATE", command(from, "MIGRATE 127.0.0.1 %d %s 0 5000", to, key)) <
		    0)
		return -1;
	if (!final)
		return 0;
	n = rcluster_masters(rc, m);
	if (command_ok(to, "SETSLOT NODE", command(to, "CLUSTER SETSLOT %s NODE %s", slot, idt)) <
		    0 ||
	    command_ok(from, "SETSLOT NODE",
		       command(from, "CLUSTER SETSLOT %s NODE %s", slot, idt)) < 0)
		return -1;
	for (int i = 0; i < n; i++)
		if (m[i] != from && m[i] != to &&
		    command_ok(m[i], "SETSLOT NODE",
			       command(m[i], "CLUSTER SETSLOT %s NODE %s", slot, idt)) < 0)
			return -1;
	return 0;
}
