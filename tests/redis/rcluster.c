/* tests/redis/rcluster.c — see rcluster.h. */
#include "rcluster.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
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
