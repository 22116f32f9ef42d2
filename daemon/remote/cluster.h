/* daemon/remote/cluster.h — one thread's Redis Cluster client: the slot
 * map, one connection per node, pipelined batches of GET and SET.
 *
 * Why synchronous: Debian's libhiredis 0.14 has no cluster support, and
 * its async API has no command timeout (redisAsyncSetTimeout came in 1.0),
 * so through it a hung node would hang its requests forever. The blocking
 * API has both: redisConnectWithTimeout bounds the connect, and
 * redisSetTimeout puts SO_RCVTIMEO/SO_SNDTIMEO on the socket, bounding
 * every read and write. The blocking calls run on a pool of threads of
 * their own (remote.c, over io/worker.c), never on the event loop; each
 * thread owns one struct cluster — its own connections, its own slot map
 * — so no lock is shared between threads, and n threads make n
 * connections per node, which large values need to fill the network.
 *
 * A batch of N keys is grouped by the node that serves each key's slot;
 * every node's commands are written first (a pipeline per node, all nodes
 * in flight together), then each node's replies are read in order.
 * Redirections: MOVED updates that slot, asks for a map refresh and
 * retries the key (at most CLUSTER_MAX_REDIRECTS rounds); ASK sends
 * ASKING then the command to the named node, once. Failures become the
 * key's result, never a retry loop: TRYAGAIN, CLUSTERDOWN, a timeout, a
 * connection error. Two exceptions send a key once more, in the next
 * round: a connection made before this batch that breaks under it (the
 * node restarted, or died and a replica took over its slots, while the
 * connection sat idle) is made again at once; a connection error when the
 * backoff allows a map refresh refreshes the map first, which names the
 * slot's new owner if there is one (a node still down fails the key at
 * once); only that try's failure is the result. A node that timed out
 * or refused is marked down and not tried again before a backoff has
 * passed, and the map is refreshed at most once per backoff, so a dead
 * cluster costs one refused connect per backoff, not one per request.
 *
 * Threading: a struct cluster is used by one thread at a time (any
 * thread). No logging (the caller counts the results).
 */
#ifndef KVPD_CLUSTER_H
#define KVPD_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_MAX_SEEDS     64u
#define CLUSTER_MAX_REDIRECTS 5u

/* A key's result. */
enum cluster_result {
	CLUSTER_HIT,  /* GET: the value; SET: stored */
	CLUSTER_MISS, /* GET: no such key */
	/* Errors: the caller treats each as a miss. */
	CLUSTER_ERR_TIMEOUT,	 /* a read or write or connect ran past the timeout */
	CLUSTER_ERR_CONN,	 /* refused, reset, closed */
	CLUSTER_ERR_DOWN,	 /* the node is in its backoff after a failure */
	CLUSTER_ERR_TRYAGAIN,	 /* -TRYAGAIN (a slot being migrated) */
	CLUSTER_ERR_CLUSTERDOWN, /* -CLUSTERDOWN, or no node serves the slot */
	CLUSTER_ERR_TOOBIG,	 /* a value above max_value_bytes */
	CLUSTER_ERR_REPLY,	 /* a reply of the wrong type, another error */
	CLUSTER_ERR_REDIRECT,	 /* still redirected after CLUSTER_MAX_REDIRECTS */
	CLUSTER_ERR_AUTH,	 /* AUTH refused */
	CLUSTER_RESULT_COUNT,
};

/* The result's name ("hit", "timeout", ...; static storage). */
const char *cluster_result_name(enum cluster_result r);

struct cluster_config {
	/* "host:port" strings, copied by cluster_new. */
	const char *const *seeds;
	unsigned int n_seeds;
	const char *user;     /* NULL: AUTH password alone (requirepass) */
	const char *password; /* NULL: no AUTH */
	uint32_t timeout_ms;  /* connect, and each read and write */
	uint32_t backoff_ms;  /* a down node is not retried before this */
	size_t max_value_bytes;
};

/* One key of a batch. The caller fills key (and val for a SET); the
 * batch fills result and, for a GET hit, val/val_len, pointing into
 * memory the op holds until cluster_op_release. */
struct cluster_op {
	const char *key;
	size_t key_len;
	/* SET: the value is the two pieces one after the other (a header
	 * and a payload without a copy); GET: the value on a hit. */
	const void *val;
	size_t val_len;
	const void *val2;
	size_t val2_len;
	/* GET, optional: where a value of exactly dst_hdr_len + dst_len bytes
	 * goes, read from the socket straight into these two buffers (its
	 * first dst_hdr_len bytes, then the rest); sunk then says so and val
	 * is NULL. A value of another length comes in val as usual. The
	 * buffers' contents are undefined after any other result. */
	void *dst_hdr;
	size_t dst_hdr_len;
	void *dst;
	size_t dst_len;
	int sunk;
	enum cluster_result result;
	unsigned int n_moved, n_asked; /* redirections followed */

	/* Private to cluster.c. */
	void *reply;
	void *own;
	unsigned int slot;
	int node;
	int ask_node; /* -1, or the node an ASK named */
	int asked;
	int retried; /* sent again after a reused connection broke */
	int pending;
	int is_set;
};

struct cluster;

/* A client for the cluster cfg describes; connects to nothing yet.
 * Returns 0 and *ret, or -EINVAL (no seed, a seed not host:port, a
 * zero timeout) or -ENOMEM. */
int cluster_new(const struct cluster_config *cfg, struct cluster **ret);
/* Closes every connection, frees c. NULL is fine. */
void cluster_free(struct cluster *c);

/* Fetches the slot map from the first seed or known node that answers.
 * Blocks up to the timeout per node tried. Returns 0, -EACCES when a node
 * refused the credentials (and none answered with a map), -EBADMSG when
 * every answer was malformed, or -EHOSTUNREACH when no node answered.
 * why (whylen bytes, may be NULL) names the node and the reason on
 * failure. */
int cluster_refresh(struct cluster *c, char *why, size_t whylen);

/* GET (is_set 0) or SET with PX expiry_ms when not 0 (is_set 1) of the n
 * ops, each op's result set. Blocks, bounded by the timeout per node
 * round trip and CLUSTER_MAX_REDIRECTS rounds. Call cluster_op_release
 * on each op after reading its value. */
void cluster_get_batch(struct cluster *c, struct cluster_op *ops, size_t n);
void cluster_set_batch(struct cluster *c, struct cluster_op *ops, size_t n, uint64_t expiry_ms);
void cluster_op_release(struct cluster_op *op);
/* Commands given whole, in RESP (op->val, val_len), each routed by op->key
 * like a GET (MOVED, ASK); a HIT is any answer but an error. For commands
 * whose answer nobody reads (XADD of KV events). */
void cluster_command_batch(struct cluster *c, struct cluster_op *ops, size_t n);

/* Nodes of the map with a slot that are up, and down (in a backoff). */
void cluster_node_states(const struct cluster *c, unsigned int *ret_up, unsigned int *ret_down);

#endif
