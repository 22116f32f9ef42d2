/* client/api/session.h — what the session calls of api/ share with the
 * other api/ files: reloading a compacted session's page table, building
 * the handle of a session the daemon made or handed over, and taking a
 * session over (struct kvp_session is handle/handle.h's).
 *
 * Layer: api (client/README.md). Not thread-safe.
 */
#ifndef KVPC_SESSION_H
#define KVPC_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"

/* After a compaction of s in the daemon: s now holds n_tokens tokens, all
 * committed, in new pages; reads the whole page table again. Returns 0 or
 * a negative errno (-EPROTO breaks the client). */
int session_reload(struct kvp_session *s, uint64_t n_tokens);

/* Builds the handle s (zeroed, or holding only a page table from
 * handle_table_reserve) of a session the daemon has just made in pool p,
 * holding n_tokens tokens, all committed: a fork's or a restored
 * checkpoint's. slots[0..n_slots) is the start of its page table from
 * the daemon's reply; the rest is read with SessionPages. A table that
 * cannot be the session's (more pages than the arena, a slot outside it)
 * breaks the client (-EPROTO); when anything else fails (-ENOMEM, a
 * refused SessionPages) the session is closed in the daemon. what ("fork",
 * "restore") names the reply in error messages; close_on_fail 0 leaves
 * the session in the daemon when building the handle fails (one adopted,
 * not made for us). Returns 0 with s on p's list, or a negative errno
 * with s's table freed (the caller frees s). */
int session_adopt(struct kvp_pool *p, struct kvp_session *s, uint64_t id, uint64_t n_tokens,
		  const uint32_t *slots, size_t n_slots, const char *what, int close_on_fail);

/* Has this connection take over session id of pool pool_id (CreateSession
 * with session_id) and, when has_persistent, makes it persistent or not.
 * Returns 0 or a negative errno (-EOPNOTSUPP: a daemon that cannot). */
int session_own_call(struct kvp_client *c, uint64_t pool_id, uint64_t id, int has_persistent,
		     int persistent);

#endif
