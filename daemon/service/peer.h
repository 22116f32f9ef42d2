/* daemon/service/peer.h — the client a request came from, as the service
 * layer sees it.
 *
 * Handlers need to know who asks (uid, gid and pid from SO_PEERCRED,
 * whether on the admin socket) and what the asker holds (its leases, the
 * sessions it writes in and owns: for its limits, and for what goes when
 * it goes), and need a few things only the server layer above can do:
 * answer a request later, once work off the event loop is done (a
 * ticket), and reload the configuration. The server embeds a struct peer
 * in each connection and hands down what it does as a table of
 * operations; nothing in this layer knows what a connection is.
 * Event-loop thread only.
 */
#ifndef KVPD_PEER_H
#define KVPD_PEER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "confview.h"
#include "list.h"
#include "session.h"

/* How long a request waits for disk I/O before it takes a miss (or a drop
 * of cached pages) instead: long past any disk's normal answer, so only a
 * stuck one ends a wait (the server's conn_park_tick wakes waits that nothing else
 * does). */
#define PEER_MAX_PARK_NS (10ull * 1000000000ull)

struct cache;
struct kv_ring;
struct peer;
struct reply;

/* A request's latency so far: when it arrived and its type (the
 * service's numbering, stats_op_index), so that its reply, however late,
 * is counted under its type (cache_latency_add). */
struct peer_timing {
	uint64_t start_ns; /* clock_now_ns() when it was first dispatched */
	int op;		   /* its type, or -1: not counted */
};

/* A request answered later, when work off the event loop (a worker job)
 * is done. Its peer forgets it if it goes first (peer becomes NULL): the
 * work still finishes, its answer goes nowhere. */
struct ticket {
	struct peer *peer;
	uint64_t id;		   /* the request's id */
	uint64_t batch;		   /* the datagram it came in (the server's) */
	struct peer_timing timing; /* copied from the peer's at ticket_start */
};

/* What the server layer does for the service layer. */
struct peer_ops {
	/* Starts t for p's request being handled, whose id is id; the
	 * handler then returns -EINPROGRESS and p's next requests wait. */
	void (*ticket_start)(struct peer *p, struct ticket *t, uint64_t id);
	/* Sends the reply of t's request (t->peer is set) and lets its
	 * peer's next requests run. Takes r's fd. */
	void (*deliver)(struct ticket *t, struct reply *r);
	/* Re-reads and applies the configuration (server_reload_config),
	 * naming who asked in the log. */
	int (*reload_config)(struct peer *p, const char *who, struct confview_reload *ret,
			     char *err, size_t errlen);
};

/* One eviction as kvpalacectl runs it: many short Evict requests in a
 * row, each asking for what the ones before left. admin.c sums them and
 * logs one line when the run ends (the last request's reply tells the
 * client to stop, another request comes, or the connection goes). */
struct evict_run {
	int active;
	uint32_t tier; /* Kvpalace__V1__Tier */
	int discard;
	uint64_t pool_id;     /* 0: every pool */
	uint64_t asked_bytes; /* UINT64_MAX: no limit */
	uint64_t pages, bytes, demoted, dropped;
	uint32_t requests;
	uint32_t n_pools, cap_pools;
	uint64_t *pool_ids; /* [n_pools] the distinct pools pages left */
	uint64_t start_ns;
};

struct peer {
	const struct peer_ops *ops;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	int admin; /* came in on the admin socket */

	struct list leases; /* struct lease.owner_link */
	uint32_t n_leases;
	uint64_t n_leased_pages;       /* pages those leases pin, together */
	struct session_writer writing; /* sessions with its uncommitted tokens */
	struct session_owner sessions; /* sessions it owns: closed with it unless persistent */

	/* The last first chunk of a MatchPrefix (no lease_id, no continues):
	 * what its later chunks sent with continues extend. */
	enum { MATCH_PREV_NONE, MATCH_PREV_LEASE, MATCH_PREV_MISS } match_prev;
	uint64_t match_prev_lease; /* MATCH_PREV_LEASE: its lease id */
	uint64_t match_prev_left;  /* MATCH_PREV_MISS: prompt tokens declared, not yet sent */

	/* KV events (evsub.c): subscribed, to one pool (0: every pool it
	 * may see), the ring it reads (the admin's of every event, else its
	 * tenant's) and the next event it is to get. */
	int ev_sub;
	uint64_t ev_pool;
	struct kv_ring *ev_ring;
	uint64_t ev_next;  /* the ring's number (seq, or useq) to look at next */
	uint64_t ev_vnext; /* not admin: the useq (pseq with ev_pool) it is to see next */

	/* Set by dispatch(): the cache its requests run on, and the request
	 * being dispatched (its arrival kept while it is parked: a parked
	 * request is the next its peer dispatches; parked_id says which). */
	struct cache *cache;
	struct peer_timing timing;
	uint64_t parked_ns; /* arrival of the parked request parked_id, or 0 */
	uint64_t parked_id;
	/* When the request before was answered, while the server runs this
	 * peer's requests back to back (one receive turn); 0 outside one.
	 * The next starts then: one clock read per request instead of two
	 * (55 ns each on a kvm-clock VM, ~5 % of a pipelined MatchPrefix).
	 * The server sets it to 0 when a turn starts. */
	uint64_t turn_ns;
	struct evict_run evict_run; /* admin connections: the eviction under way */
};

/* An empty peer of these credentials, served through ops. */
void peer_init(struct peer *p, const struct peer_ops *ops, uid_t uid, gid_t gid, pid_t pid,
	       int admin);

/* Starts a ticket for p's request id (see peer_ops.ticket_start). */
static inline void ticket_start(struct peer *p, struct ticket *t, uint64_t id)
{
	p->ops->ticket_start(p, t, id);
	t->timing = p->timing;
}

/* Answers t's request with r when its peer is still there, counting its
 * latency from its arrival; else closes r's fd. Takes r's fd either way. */
void ticket_deliver(struct ticket *t, struct reply *r);

#endif
