/* daemon/session.h — sessions: one sequence's tokens and page table.
 *
 * A session holds the token ids it has reserved, how many of them are
 * committed, and the page slots holding their KV (page i holds positions
 * i*block_tokens onwards). Writing is two-phase: session_append reserves
 * slots (the client writes K/V into them in place), session_commit
 * publishes them. Only one connection at a time, the writer, may hold
 * uncommitted reservations; they are rolled back when it disconnects.
 * Committed tokens never change and are what MatchPrefix compares. A
 * session outlives the connection that created it, until CloseSession.
 * Event-loop thread only.
 */
#ifndef KVPD_SESSION_H
#define KVPD_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "list.h"
#include "pool.h"

struct session {
	uint64_t id;
	struct pool *pool;
	uint32_t *tokens;  /* [cap_tokens] token ids, n_tokens used */
	uint64_t n_tokens; /* reserved, committed or not */
	uint64_t n_committed;
	uint64_t cap_tokens;
	uint32_t *pages; /* [cap_pages] page slots, n_pages used */
	uint32_t n_pages;
	uint32_t cap_pages;
	const void *writer;	 /* the connection holding uncommitted tokens, or NULL */
	struct list pool_link;	 /* pool.sessions */
	struct list writer_link; /* the writer's list of sessions it reserved in */
};

/* Creates an empty session in p. Returns 0, -EDQUOT (pool's session limit)
 * or -ENOMEM. */
int session_create(struct cache *c, struct pool *p, struct session **ret_session);

/* Rolls back uncommitted tokens, drops the page references and frees the
 * session. Pages pinned by leases stay until those are released. */
void session_close(struct cache *c, struct session *s);

/* The session with this id in a pool of uid (any when admin), or NULL. */
struct session *session_get(struct cache *c, uint64_t id, uid_t uid, int admin);

/* Reserves slots for n tokens after the last reserved one on behalf of
 * writer, whose list of written sessions is writer_list. Returns 0 with
 * the first new position in *ret_first_token, -EBUSY when another writer
 * holds uncommitted tokens, -EDQUOT past max_session_tokens, -ENOSPC when
 * the arena has too few free pages (nothing is reserved then), -ENOMEM. */
int session_append(struct cache *c, struct session *s, const void *writer, struct list *writer_list,
		   const uint32_t *tokens, size_t n, uint64_t *ret_first_token);

/* Publishes the next n reserved tokens. Returns 0, -EBUSY when writer is
 * not the session's writer, -ERANGE when n exceeds the uncommitted tokens. */
int session_commit(struct cache *c, struct session *s, const void *writer, uint64_t n);

/* Drops the uncommitted tail and the pages only it used; ends the writer's
 * hold. */
void session_rollback(struct cache *c, struct session *s);

/* Pages holding only uncommitted positions. */
uint32_t session_reserved_pages(const struct session *s);

/* Length of the common prefix of the session's committed tokens from
 * position `from` and tokens[0..n). */
uint64_t session_common_prefix(const struct session *s, uint64_t from, const uint32_t *tokens,
			       size_t n);

#endif
