/* daemon/core/session.h — sessions: one sequence's tokens and page table.
 *
 * A session holds the token ids it has reserved, how many of them are
 * committed, the page slots holding their KV (page i holds positions
 * i*block_tokens onwards) and the hash chain of its full committed pages.
 * Writing is two-phase: session_append reserves slots (the client writes
 * K/V into them in place), session_commit publishes them; each page a
 * commit fills enters the pool's prefix index, or is replaced by the
 * indexed copy of the same content (dedup). Only one connection at a
 * time, the writer, may hold uncommitted tokens; they are rolled back when
 * it disconnects.
 *
 * Pages may be shared (index, forks, leases); a session only ever writes
 * positions at or after its committed length, and those live in pages
 * nobody else holds: full pages are never written again, fork copies the
 * partial last page, truncate copies a shared new last page. Token ids
 * and metadata are shared with forks the same way, in chunks copied when
 * written (tokvec.h): a fork costs its page table, not its tokens.
 *
 * Lifetime: a session has an owner — the connection that made it (or
 * adopted it), which keeps a struct session_owner as it keeps its leases —
 * or none. When the owner goes (session_owner_release) its sessions are
 * closed unless persistent; persistent ones then belong to nobody and sit
 * in cache.unowned until a connection adopts them, someone closes them,
 * or they go unused for session-idle-timeout (session_expire_idle, from
 * the server's timer). Their committed full pages stay in the prefix index
 * in every case: sharing between processes goes through the index, not
 * through a session. A session made inside the daemon (a warm-up's) owned
 * by nobody and not persistent lives until it is closed. This file never
 * calls the connection layer: the owner is only a list it links into.
 * Event-loop thread only.
 */
#ifndef KVPD_SESSION_H
#define KVPD_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <xxhash.h>

#include "cache.h"
#include "list.h"
#include "policy.h"
#include "pool.h"
#include "tokvec.h"

/* What one writer (a connection) holds: the sessions where it has
 * uncommitted tokens and, over all of them, the pages those hold reserved
 * (session_reserved_pages), kept up to date by every operation that changes
 * a reservation — its own, and a rollback by anyone (an admin's drop) —
 * so the per-client limit costs O(1) to check. */
struct session_writer {
	struct list sessions; /* struct session.writer_link */
	uint32_t reserved_pages;
};

static inline void session_writer_init(struct session_writer *w)
{
	list_init(&w->sessions);
	w->reserved_pages = 0;
}

/* The sessions one owner (a connection) holds, linked through
 * struct session.owner_link. */
struct session_owner {
	struct list sessions;
	uint32_t n_sessions;
};

static inline void session_owner_init(struct session_owner *o)
{
	list_init(&o->sessions);
	o->n_sessions = 0;
}

/* Tokens [from, to) appended on the GPU tier and not yet copied back to
 * their host pages (daemon/core/gpu.c). */
struct session_dev_range {
	uint64_t from, to;
};

/* A session's GPU appends (daemon/core/gpu.c). */
struct session_dev {
	uint32_t *pages;		  /* [cap] device slot of page i, GPU_NONE for none */
	struct session_dev_range *ranges; /* in token order */
	uint32_t cap;
	uint32_t n_ranges;
	uint32_t cap_ranges;
	int copying; /* a copy back of some of them is in flight */
	int error;   /* a copy back failed: commits fail */
};

struct session {
	uint64_t id;
	struct pool *pool;
	XXH128_hash_t root; /* chain root: pool identity + salt + extra key */
	/* Key spans of its tokens (absolute positions), folded into the
	 * hashes of the pages they overlap; cut with the tokens. */
	struct pindex_spans spans;
	/* Token ids and their position, tags and score (n_tokens used),
	 * shared copy-on-write with forks. */
	struct tokvec tok;
	uint64_t n_tokens; /* reserved, committed or not */
	uint64_t n_committed;
	/* Page slots (n_pages used) and chain hashes, charged with the
	 * tokens to the tenant's max-tenant-tokens. */
	uint32_t *pages; /* [cap_pages] page slots, n_pages used; after hashes, one allocation */
	XXH128_hash_t *hashes; /* [cap_pages] chain hash of each full committed page */
	uint32_t n_pages;
	uint32_t cap_pages;
	uint32_t n_hashes;
	uint32_t reserved_counted; /* reserved pages counted in account */
	uint64_t last_use_ns;
	const void *writer;		/* the connection holding uncommitted tokens, or NULL */
	struct session_writer *account; /* the writer's, while writer is set */
	struct list pool_link;		/* pool.sessions */
	struct list writer_link;	/* the writer's list of sessions it reserved in */
	struct session_owner *owner;	/* the owning connection's list, or NULL */
	struct list owner_link;		/* in owner, or in cache.unowned (persistent) */
	/* Context-cache policy (daemon/core/compact.h). A compacted session holds
	 * kept tokens whose meta[].pos are their original positions, in
	 * private pages that never enter the prefix index (n_hashes is 0). */
	const struct policy *pol; /* &(a struct session_policy).pol; kind POLICY_NONE: exact */
	uint32_t cur_turn;	  /* the turn of appended tokens without a tag */
	uint8_t persistent;	  /* outlives its owner (session_own) */
	uint8_t compacted;
	/* Pages that never enter the prefix index: compacted, or restored
	 * from pages stored quantized (lossy: no one else should match
	 * them as if exact). */
	uint8_t unindexed;
	uint64_t dropped_tokens; /* by compaction, since creation */
	/* GPU appends (daemon/core/gpu.c), made on the first; NULL for a
	 * host-only session, which so does not carry them. */
	struct session_dev *dev;
};

/* A policy sessions share: the configured default (cache.default_pol, one
 * for all sessions made under the same configuration) until a client sets
 * its own; forks share their source's. 64 bytes a session not spent. */
struct session_policy {
	uint32_t refs; /* sessions using it, and the cache for its default */
	struct policy pol;
};

/* Drops a reference (NULL accepted); the last frees it. */
void session_policy_unref(struct session_policy *sp);

/* Tags of appended tokens (role, turn, flags of struct token_meta). */
struct session_tag {
	uint8_t role;
	uint8_t flags;
	uint8_t has_turn;
	uint32_t turn;
};

/* Creates an empty session in p whose chain starts at root. Returns 0,
 * -EDQUOT (pool's session limit) or -ENOMEM. */
int session_create(struct cache *c, struct pool *p, XXH128_hash_t root,
		   struct session **ret_session);

/* Gives s the policy pol (validated by the caller), a copy of its own.
 * Returns 0 or -ENOMEM (s keeps its policy). */
int session_set_policy(struct session *s, const struct policy *pol);

/* Rolls back uncommitted tokens, drops the page references and frees the
 * session. Pages pinned by leases or listed in the index stay. */
void session_close(struct cache *c, struct session *s);

/* The session with this id in a pool of uid (any when admin), or NULL.
 * A client's lookup (not admin) counts as a use: the idle clock of a
 * persistent session restarts. */
struct session *session_get(struct cache *c, uint64_t id, uid_t uid, int admin);

/* Gives s to owner o (NULL: nobody) and sets whether it is persistent. A
 * persistent session nobody owns is listed in c->unowned, where
 * session_expire_idle finds it. */
void session_own(struct cache *c, struct session *s, struct session_owner *o, int persistent);

/* What an owner left behind when it went (session_owner_release). */
struct session_left {
	uint32_t closed;     /* sessions closed with it */
	uint64_t tokens;     /* tokens they held */
	uint64_t pages;	     /* pages they held (shared ones included) */
	uint64_t freed;	     /* pages that went back to the free lists */
	uint32_t persistent; /* persistent sessions kept, now owned by nobody */
};

/* The owner o is going away: closes its sessions that are not persistent
 * (counted as sessions_closed_with_conn) and gives the persistent ones to
 * nobody; adds what it did to *ret. O(its sessions). */
void session_owner_release(struct cache *c, struct session_owner *o, struct session_left *ret);

/* Closes the persistent sessions nobody owns that nobody is writing and
 * that were last used timeout_ns or more before now_ns, logging each
 * (counted as sessions_expired). Returns how many. O(unowned sessions). */
uint32_t session_expire_idle(struct cache *c, uint64_t now_ns, uint64_t timeout_ns);

struct tier_park;
/* Reserves slots for n tokens after the last reserved one on behalf of
 * writer, whose account is w; evicts cold indexed pages when the pool is
 * above its high watermark. Returns 0 with the first new position in
 * *ret_first_token, -EBUSY when another writer holds uncommitted tokens,
 * -EDQUOT past max_session_tokens, when the writer would hold more than
 * max_reserved_pages pages reserved or when the tenant's sessions would
 * hold more than max-tenant-tokens slots (each checked before anything is
 * evicted), -EAGAIN with pk->park_on set when room comes once disk writes
 * finish (never when pk->no_park: tier_make_room; nothing changed),
 * -ENOSPC when every page is held or pinned (nothing is reserved then),
 * -ENOMEM. */
int session_append(struct cache *c, struct session *s, const void *writer, struct session_writer *w,
		   const uint32_t *tokens, size_t n, const struct session_tag *tag,
		   struct tier_park *pk, uint64_t *ret_first_token);

/* The original position the next appended token gets: one past the last
 * token's (its index in an exact session). */
uint64_t session_next_pos(const struct session *s);

/* Makes the metadata of tokens [from, to) (below n_tokens) the session's
 * own to write (a fork shares its parent's until then: tokvec.h). Returns
 * 0, -EDQUOT past max-tenant-tokens or -ENOMEM; nothing changed then. */
int session_own_meta(struct cache *c, struct session *s, uint64_t from, uint64_t to);

/* Publishes the next n reserved tokens and indexes the pages they fill.
 * Returns 0 and the index of the first page it filled (pages from there to
 * n_committed / block_tokens may have new slots), -EBUSY when writer is not
 * the session's writer, -ERANGE when n exceeds the uncommitted tokens,
 * -E2BIG when it would fill more pages than one reply can list
 * (config_max_tokens_per_request). */
int session_commit(struct cache *c, struct session *s, const void *writer, uint64_t n,
		   uint32_t *ret_first_filled);

/* Drops the uncommitted tail and the pages only it used; ends the writer's
 * hold. */
void session_rollback(struct cache *c, struct session *s);

/* Keeps the first n tokens (n <= n_tokens), for writer or when nobody
 * writes. Returns 0 and sets *ret_copied (1 when the new last page was
 * shared and was copied to a fresh slot), -EBUSY, -ERANGE, -ENOSPC, or
 * -EAGAIN with pk->park_on set when the copy's page comes once disk
 * writes finish (never when pk->no_park). */
int session_truncate(struct cache *c, struct session *s, const void *writer, uint64_t n,
		     struct tier_park *pk, int *ret_copied);

/* A new session sharing the first n committed tokens of s. Returns 0,
 * -ERANGE (n > committed), -EDQUOT, -ENOSPC (no page for the partial
 * copy), -EAGAIN with pk->park_on set as session_truncate, -ENOMEM. */
int session_fork(struct cache *c, struct session *s, uint64_t n, struct tier_park *pk,
		 struct session **ret_session);

struct lease;
/* A new session holding the first n tokens of lease l's match (its pages
 * shared the same way, the lease's salt). Returns as session_fork, -ERANGE
 * when n exceeds the lease's tokens. */
int session_fork_lease(struct cache *c, const struct lease *l, uint64_t n, struct tier_park *pk,
		       struct session **ret_session);

/* A new session of p, chain root root, holding the n committed tokens
 * tokens[0..n) whose pages are the held slots[0..ceil(n/block_tokens)),
 * one reference each, which the session takes over (a restored
 * checkpoint), with per-token metadata meta[0..n) (NULL: positions 0..n,
 * untagged). Its full pages enter the index, or are replaced by the
 * indexed copy of the same content: *ret_shared counts those; unless a
 * position differs from its index (a compacted session) or lossy (pages
 * that were stored quantized): then its pages stay private. Returns 0,
 * -EDQUOT (session limits) or -ENOMEM; on failure the slots are still the
 * caller's. */
int session_restore(struct cache *c, struct pool *p, XXH128_hash_t root, const uint32_t *tokens,
		    const struct token_meta *meta, uint64_t n, const uint32_t *slots, int lossy,
		    const struct pindex_span *spans, uint32_t n_spans, struct session **ret_session,
		    uint32_t *ret_shared);

/* Most key spans a session holds. */
#define SESSION_MAX_SPANS 65536u

/* Whether the key spans add[0..n) (sorted, disjoint: validate_key_spans)
 * may join a sequence's spans so far, have, with tokens up to position to
 * (exclusive) received and its whole pages before done hashed: each must
 * start at or after the end of have's last span and at or after done
 * (for an append, the first token of the page its first token lands on),
 * and before to. Returns 0 or -EINVAL with a static reason in *why.
 * Callers add them (prefix_index_spans_add, at most SESSION_MAX_SPANS)
 * once the request can no longer fail or park. */
int session_check_spans(const struct pindex_spans *have, const struct pindex_span *add, uint32_t n,
			uint64_t done, uint64_t to, const char **why);

/* Pages holding only uncommitted positions. */
uint32_t session_reserved_pages(const struct session *s);
/* Pages of p's sessions holding only uncommitted positions, counted
 * session by session: what p->reserved_pages must equal (cache_check).
 * O(sessions). */
uint32_t session_pool_reserved_pages(const struct pool *p);
/* Pages of s that someone else (index, lease, another session) holds too. */
uint32_t session_shared_pages(const struct session *s);

#endif
