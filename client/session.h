/* client/session.h — a session handle: the client's copy of a session's
 * page table.
 *
 * slots[i] is the arena slot of page i of the session (positions
 * i * block_tokens onwards); the table covers every reserved token and
 * grows as Append replies extend it. Commit replies rewrite the entries of
 * the pages they filled (dedup), Truncate shrinks the table and may move
 * the new last page, and a fork's table is read with SessionPages. Not
 * thread-safe.
 */
#ifndef KVPC_SESSION_H
#define KVPC_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "pool.h"

struct kvp_session {
	struct kvp_pool *pool;
	struct list link; /* in pool->sessions */
	uint64_t id;
	uint64_t n_tokens;  /* reserved, committed or not */
	uint64_t committed; /* committed, <= n_tokens */
	uint32_t *slots;    /* [cap] page table; pool_pages_for(n_tokens) entries used */
	size_t cap;
};

/* Frees the handle without telling the daemon. */
void session_free(struct kvp_session *s);

#endif
