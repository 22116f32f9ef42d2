/* daemon/core/place.h — tier placement by the hierarchy policy for a
 * session that is closing.
 *
 * Of a closing exact session's first n_hashes full pages (indexed), those
 * holding only tokens outside the budget (LAYER_REST, base/policy.h) go to
 * the cold end of the index's lists, so they leave the host tier first,
 * while pages of the permanent, hot and temporary layers keep their place:
 * an eviction hint, never a loss. Called by session_close (session.h);
 * below it, so it never calls sessions back. Event-loop thread only.
 */
#ifndef KVPD_PLACE_H
#define KVPD_PLACE_H

#include <stdint.h>

#include "cache.h"

struct session;

/* Places s's first n_hashes pages as above. Call after the session
 * dropped its page references. A long session's layers are computed on a
 * worker (one at a time per tenant; others are not placed, counted as
 * unplaced_sessions) and applied when it is done, if the pool is still
 * open; a placement done counts as placed_sessions. */
void place_session(struct cache *c, struct session *s, uint32_t n_hashes);

#endif
