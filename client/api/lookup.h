/* client/api/lookup.h — a Lookup batch as a state machine of requests,
 * for kvp_lookup_batch (lookup.c: one round trip after another) and
 * kvp_lookup_submit (async.c: each reply reaped sends the next piece).
 * Private to api/.
 */
#ifndef KVPC_LOOKUP_H
#define KVPC_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"
#include "keys.h"
#include "kvpalace.pb-c.h"

/* Queries a Lookup may carry (the daemon's VALIDATE_LOOKUP_MAX_QUERIES). */
#define LOOKUP_MAX_QUERIES 64u
/* Wire bytes of a request besides its queries, and of a query besides
 * its tokens and salt: tags, lengths, the pool id, a 16-byte chain. */
#define LOOKUP_REQUEST_OVERHEAD 64u
#define LOOKUP_QUERY_OVERHEAD	40u

struct lookup_query_state {
	size_t pos;    /* tokens looked up: whole pages */
	size_t end;    /* whole pages of the query's tokens */
	int done;      /* stopped at a missing page, or all sent */
	int has_chain; /* continue from chain, not from the salt */
	unsigned char chain[16];
	size_t sent; /* tokens of the piece in flight */
};

struct lookup_state {
	kvp_pool *p;
	const struct kvp_lookup_query *qs; /* [n], the caller's */
	struct kvp_lookup_result *out;	   /* [n], the caller's */
	size_t n;
	size_t pending; /* queries not done */
	/* The request in flight: k queries, which[j] the index of the j-th. */
	Kvpalace__V1__LookupRequest lr;
	Kvpalace__V1__LookupQuery wq[LOOKUP_MAX_QUERIES];
	Kvpalace__V1__LookupQuery *wptr[LOOKUP_MAX_QUERIES];
	size_t which[LOOKUP_MAX_QUERIES];
	size_t k;
	unsigned char *le;     /* big-endian hosts: the tokens of a request */
	struct keys_wire wire; /* the request's key spans */
	struct lookup_query_state q[];
};

/* Checks the arguments of a batch (kvp_lookup_batch's errors) and that
 * the client is usable. Returns 0 or a negative errno. */
int lookup_check(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
		 struct kvp_lookup_result *out);

/* A batch's state, out zeroed; NULL when out of memory. */
struct lookup_state *lookup_start(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				  struct kvp_lookup_result *out);
void lookup_state_free(struct lookup_state *st);

/* The next request, of the pending queries' next pieces, into *req (valid
 * while st is, until the next lookup_build). st->pending must be > 0.
 * Returns 0 or -EMSGSIZE (not a page fits one request). */
int lookup_build(struct lookup_state *st, Kvpalace__V1__Request *req);

/* Applies the OK reply to the request lookup_build made. Returns 0 or
 * -EPROTO (the client broken). */
int lookup_apply(struct lookup_state *st, const Kvpalace__V1__Response *resp);

#endif
