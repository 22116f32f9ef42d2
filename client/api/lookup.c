/* client/api/lookup.c — kvp_lookup and kvp_lookup_batch: how much of
 * each prompt a pool holds, asked without changing anything in the
 * daemon (the Lookup request).
 *
 * A batch goes in as few requests as the daemon's limits allow: each
 * request carries pieces of as many queries as fit its token count
 * (max_tokens_per_request), its byte cap and 64 queries. A query longer
 * than what is left of a request is looked up in whole-page pieces: the
 * daemon keeps no state between requests, so each reply gives the hash
 * chain a query's next piece continues from. A query whose walk stopped
 * (a page missing) sends nothing more; the tokens of a partial last page
 * are never sent (they cannot match). A piece carries the key spans that
 * overlap it, in the query's absolute positions, with first_token saying
 * where the piece starts; a request carries at most 256 spans in all (a
 * piece ends before the span that would pass that).
 *
 * Layer: api (client/README.md), over rpc/ and handle/.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "handle.h"
#include "keys.h"
#include "le.h"
#include "rpc.h"

/* Queries a Lookup may carry (the daemon's VALIDATE_LOOKUP_MAX_QUERIES). */
#define LOOKUP_MAX_QUERIES 64u
/* Wire bytes of a request besides its queries, and of a query besides
 * its tokens and salt: tags, lengths, the pool id, a 16-byte chain. */
#define LOOKUP_REQUEST_OVERHEAD 64u
#define LOOKUP_QUERY_OVERHEAD	40u

struct lookup_state {
	size_t pos;    /* tokens looked up: whole pages */
	size_t end;    /* whole pages of the query's tokens */
	int done;      /* stopped at a missing page, or all sent */
	int has_chain; /* continue from chain, not from the salt */
	unsigned char chain[16];
	size_t sent; /* tokens of the piece in flight */
};

/* The salt field of query q: its own, or the pool handle's. */
static int query_salt(kvp_pool *p, const struct kvp_lookup_query *q, protobuf_c_boolean *has,
		      ProtobufCBinaryData *field)
{
	if (!q->salt) {
		pool_salt_field(p, has, field);
		return 0;
	}
	if (q->salt_len > POOL_SALT_MAX_BYTES)
		return -EINVAL;
	*has = q->salt_len != 0;
	field->data = (uint8_t *)(uintptr_t)q->salt;
	field->len = q->salt_len;
	return 0;
}

/* One Lookup request with the next pieces of the pending queries, and its
 * reply applied to st and out. Returns 0, or a negative errno. */
static int lookup_round(kvp_pool *p, const struct kvp_lookup_query *qs, size_t n,
			struct lookup_state *st, struct kvp_lookup_result *out,
			Kvpalace__V1__LookupQuery *wq, Kvpalace__V1__LookupQuery **wptr,
			size_t *which, unsigned char *le, struct keys_wire *w)
{
	struct kvp_client *c = p->client;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LookupRequest lr = KVPALACE__V1__LOOKUP_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	size_t bt = p->layout.block_tokens, tokens_left = c->chunk_tokens;
	size_t bytes_left = c->max_message_bytes - FRAME_HEADER_BYTES - LOOKUP_REQUEST_OVERHEAD;
	size_t k = 0, le_at = 0;
	int ret;

	w->n = 0;
	for (size_t i = 0; i < n && k < LOOKUP_MAX_QUERIES; i++) {
		Kvpalace__V1__LookupQuery *q = &wq[k];
		size_t len = st[i].end - st[i].pos, cost;

		if (st[i].done)
			continue;
		kvpalace__v1__lookup_query__init(q);
		if (!st[i].has_chain) {
			ret = query_salt(p, &qs[i], &q->has_cache_salt, &q->cache_salt);
			if (ret < 0)
				return conn_error(c, ret, "a cache salt has at most %u bytes",
						  POOL_SALT_MAX_BYTES);
		} else {
			q->has_chain = 1;
			q->chain.data = st[i].chain;
			q->chain.len = sizeof(st[i].chain);
		}
		if (!st[i].has_chain && qs[i].extra_key_len) {
			q->has_extra_key = 1;
			q->extra_key.data = (uint8_t *)(uintptr_t)qs[i].extra_key;
			q->extra_key.len = qs[i].extra_key_len;
		}
		cost = LOOKUP_QUERY_OVERHEAD + (q->has_cache_salt ? q->cache_salt.len : 0) +
		       (q->has_extra_key ? q->extra_key.len + 4 : 0);
		if (cost >= bytes_left)
			break;
		if (len > tokens_left)
			len = tokens_left;
		if (len * 4 > bytes_left - cost)
			len = (bytes_left - cost) / 4;
		len -= len % bt;
		if (len && qs[i].n_spans) {
			/* The spans overlapping the piece, within the
			 * request's 256 and its bytes. */
			const struct kvp_key_span *sp = qs[i].spans;
			size_t lo = keys_first_ending_after(sp, qs[i].n_spans, st[i].pos);
			size_t hi = keys_first_at(sp, qs[i].n_spans, st[i].pos + len);
			size_t room = keys_max_count(c->max_message_bytes) - w->n, span_bytes = 0;

			if (hi - lo > room) {
				hi = lo + room;
				len = sp[hi].first_token > st[i].pos
					      ? (size_t)(sp[hi].first_token - st[i].pos)
					      : 0;
				len -= len % bt;
			}
			for (size_t j = lo; j < hi; j++)
				span_bytes += 32 + sp[j].key_len;
			if (len && cost + span_bytes + len * 4 > bytes_left) {
				len = 0; /* next request */
			} else if (len) {
				q->has_first_token = 1;
				q->first_token = st[i].pos;
				q->key_spans = w->p + w->n;
				keys_wire_add(w, sp, lo, hi);
				q->n_key_spans = hi - lo;
				cost += span_bytes;
			}
		}
		if (!len)
			break; /* not a page more fits: next request */
		q->has_tokens_le = 1;
		q->tokens_le.len = len * 4;
		if (LE_NATIVE) {
			q->tokens_le.data = (uint8_t *)(uintptr_t)(qs[i].tokens + st[i].pos);
		} else {
			le_put32_array(le + le_at, qs[i].tokens + st[i].pos, len);
			q->tokens_le.data = le + le_at;
			le_at += len * 4;
		}
		st[i].sent = len;
		tokens_left -= len;
		bytes_left -= cost + len * 4;
		wptr[k] = q;
		which[k++] = i;
	}
	if (!k)
		return conn_error(c, -EMSGSIZE,
				  "a page of %zu tokens (and its key spans) does not fit one "
				  "request to this daemon",
				  bt);
	lr.pool_id = p->id;
	lr.n_queries = k;
	lr.queries = wptr;
	req.op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lr;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_LOOKUP, &resp, NULL);
	if (ret < 0)
		return ret;
	if (resp->lookup->n_results != k)
		return conn_break(c, -EPROTO, "kvpalaced answered %zu lookups of %zu",
				  resp->lookup->n_results, k);
	for (size_t j = 0; j < k; j++) {
		const Kvpalace__V1__LookupResult *res = resp->lookup->results[j];
		struct lookup_state *s = &st[which[j]];
		struct kvp_lookup_result *o = &out[which[j]];

		if (res->matched_tokens > s->sent || res->host_tokens > res->matched_tokens ||
		    res->matched_tokens % bt ||
		    (!res->complete && (res->matched_tokens != s->sent || !res->has_chain ||
					res->chain.len != sizeof(s->chain))))
			return conn_break(c, -EPROTO, "kvpalaced sent an inconsistent lookup");
		/* Host pages count while every page before them was in host. */
		if (o->host_tokens == o->matched_tokens)
			o->host_tokens += res->host_tokens;
		o->matched_tokens += res->matched_tokens;
		s->pos += res->matched_tokens;
		s->done = res->complete || s->pos == s->end;
		if (!s->done) {
			memcpy(s->chain, res->chain.data, sizeof(s->chain));
			s->has_chain = 1;
		}
	}
	return 0;
}

KVP_PUBLIC int kvp_lookup_batch(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				struct kvp_lookup_result *out)
{
	struct lookup_state *st = NULL;
	Kvpalace__V1__LookupQuery *wq = NULL;
	Kvpalace__V1__LookupQuery **wptr = NULL;
	size_t *which = NULL, pending;
	struct keys_wire *w = NULL;
	unsigned char *le = NULL;
	struct kvp_client *c;
	int ret;

	if (!p || (n && (!queries || !out)))
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < n; i++) {
		const char *why;

		if (!queries[i].tokens && queries[i].n_tokens)
			return conn_error(c, -EINVAL, "lookup query %zu has no tokens", i);
		if (keys_check_extra(queries[i].extra_key, queries[i].extra_key_len) < 0)
			return conn_error(c, -EINVAL,
					  "lookup query %zu: an extra key has 1..64 bytes", i);
		if (keys_check(queries[i].spans, queries[i].n_spans, &why) < 0)
			return conn_error(c, -EINVAL, "lookup query %zu: %s", i, why);
	}
	memset(out, 0, n * sizeof(*out));
	st = calloc(n ? n : 1, sizeof(*st));
	wq = calloc(LOOKUP_MAX_QUERIES, sizeof(*wq));
	wptr = calloc(LOOKUP_MAX_QUERIES, sizeof(*wptr));
	which = calloc(LOOKUP_MAX_QUERIES, sizeof(*which));
	w = malloc(sizeof(*w));
	if (!LE_NATIVE)
		le = malloc((size_t)c->chunk_tokens * 4);
	if (!st || !wq || !wptr || !which || !w || (!LE_NATIVE && !le)) {
		ret = conn_error(c, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		st[i].end = queries[i].n_tokens - queries[i].n_tokens % p->layout.block_tokens;
		st[i].done = st[i].end == 0;
	}
	for (;;) {
		pending = 0;
		for (size_t i = 0; i < n; i++)
			pending += !st[i].done;
		if (!pending)
			break;
		ret = lookup_round(p, queries, n, st, out, wq, wptr, which, le, w);
		if (ret < 0)
			break;
	}
out:
	free(w);
	free(le);
	free(which);
	free(wptr);
	free(wq);
	free(st);
	return ret;
}

KVP_PUBLIC int kvp_lookup(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t *ret_tokens)
{
	struct kvp_lookup_query q = {.tokens = tokens, .n_tokens = n};
	struct kvp_lookup_result r;
	int ret;

	if (!ret_tokens)
		return -EINVAL;
	ret = kvp_lookup_batch(p, &q, 1, &r);
	*ret_tokens = ret < 0 ? 0 : r.matched_tokens;
	return ret;
}
