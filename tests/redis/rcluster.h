/* tests/redis/rcluster.h — a real Redis Cluster for a test program, through
 * cluster.sh: free loopback ports, a temporary directory, stopped at exit
 * and on a fatal signal (and by cluster.sh's watcher should the test be
 * killed outright).
 */
#ifndef KVP_RCLUSTER_H
#define KVP_RCLUSTER_H

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

#endif
