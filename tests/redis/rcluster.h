/* tests/redis/rcluster.h — a real Redis Cluster for a test program, through
 * cluster.sh: free loopback ports, a temporary directory, stopped at exit
 * and on a fatal signal (and by cluster.sh's watcher should the test be
 * killed outright).
 */
#ifndef KVP_RCLUSTER_H
#define KVP_RCLUSTER_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#define RCLUSTER_NODES 6

struct rcluster {
	char dir[256];
	int base; /* nodes on base..base+5 */
};

/* Starts the cluster (the script from $KVP_REDIS_CLUSTER). Returns 0,
 * 77 when redis-server is missing (skip), or -1. */
int rcluster_start(struct rcluster *rc);
void rcluster_stop(struct rcluster *rc);
/* rcluster_start for a test's setup: exits 77 (skip) when redis-server is
 * missing; 0 or -1. */
int rcluster_start_or_skip(struct rcluster *rc);
/* A daemon's --remote-tier value for rc (two seed nodes) into buf. */
void rcluster_tier_arg(const struct rcluster *rc, char *buf, size_t n);
/* cluster.sh VERB DIR [ARG]: its exit status. */
int rcluster_script(struct rcluster *rc, const char *verb, int arg);

/* A blocking connection to one node (1 s timeout); NULL on failure. */
redisContext *rcluster_connect(int port);
/* The port of the master serving key's slot now (asks CLUSTER SLOTS of a
 * live node), or -1. */
int rcluster_owner(struct rcluster *rc, const char *key);
/* The node id of port (CLUSTER MYID) into id (41 bytes); 0 or -1. */
int rcluster_id(int port, char id[41]);
/* The ports of the masters that serve slots, into ports[3]; their count. */
int rcluster_masters(struct rcluster *rc, int ports[3]);

/* The page keys (kvp:SCOPE:POOL:CHAIN) the masters hold: fills keys[0..max)
 * and returns how many there are (also past max), or -1 when a master did
 * not answer. */
#define RCLUSTER_KEY_MAX 128
int rcluster_keys(struct rcluster *rc, char (*keys)[RCLUSTER_KEY_MAX], int max);
/* FLUSHALL on every master. Returns 0 or -1. */
int rcluster_flush(struct rcluster *rc);
/* Waits (up to 10 s) until every replica has every write its master
 * took (its offset reached the master's). Returns 0 or -1. */
int rcluster_wait_replicas(struct rcluster *rc);
/* Moves key's slot from master port from to master port to: IMPORTING and
 * MIGRATING, then MIGRATE of key when migrate is set; with final (which
 * implies migrate), the slot assigned to to on every master. A slot
 * already migrating between the same two masters is fine. Returns 0, or
 * -1 after printing the node's error. */
int rcluster_move_slot(struct rcluster *rc, const char *key, int from, int to, int migrate,
		       int final);

#endif
