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
 * piece ends before the span that would pass that). The batch is a state machine
 * (lookup.h) that async.c drives too, one reaped reply at a time.
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
#include "lookup.h"
#include "rpc.h"

/* The salt field of query q: its own (lookup_check bounded it), or the
 * pool handle's. */
static void query_salt(kvp_pool *p, const struct kvp_lookup_query *q, protobuf_c_boolean *has,
		       ProtobufCBinaryData *field)
{
	if (!q->salt) {
		pool_salt_field(p, has, field);
		return;
	}
	*has = q->salt_len != 0;
	field->data = (uint8_t *)(uintptr_t)q->salt;
	field->len = q->salt_len;
}

int lookup_check(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
		 struct kvp_lookup_result *out)
{
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
		if (queries[i].salt && queries[i].salt_len > POOL_SALT_MAX_BYTES)
			return conn_error(c, -EINVAL, "a cache salt has at most %u bytes",
					  POOL_SALT_MAX_BYTES);
		if (keys_check_extra(queries[i].extra_key, queries[i].extra_key_len) < 0)
			return conn_error(c, -EINVAL,
					  "lookup query %zu: an extra key has 1..64 bytes", i);
		if (keys_check(queries[i].spans, queries[i].n_spans, &why) < 0)
			return conn_error(c, -EINVAL, "lookup query %zu: %s", i, why);
	}
	return 0;
}

struct lookup_state *lookup_start(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				  struct kvp_lookup_result *out)
{
	struct lookup_state *st = calloc(1, sizeof(*st) + (n ? n : 1) * sizeof(st->q[0]));

	if (!st)
		return NULL;
	if (!LE_NATIVE) {
		st->le = malloc((size_t)p->client->chunk_tokens * 4);
		if (!st->le) {
			free(st);
			return NULL;
		}
	}
	st->p = p;
	st->qs = queries;
	st->out = out;
	st->n = n;
	if (n)
		memset(out, 0, n * sizeof(*out));
	for (size_t i = 0; i < n; i++) {
		st->q[i].end = queries[i].n_tokens - queries[i].n_tokens % p->layout.block_tokens;
		st->q[i].done = st->q[i].end == 0;
		st->pending += !st->q[i].done;
	}
	return st;
}

void lookup_state_free(struct lookup_state *st)
{
	if (!st)
		return;
	free(st->le);
	free(st);
}

int lookup_build(struct lookup_state *st, Kvpalace__V1__Request *req)
{
	kvp_pool *p = st->p;
	struct kvp_client *c = p->client;
	size_t bt = p->layout.block_tokens, tokens_left = c->chunk_tokens;
	size_t bytes_left = c->max_message_bytes - FRAME_HEADER_BYTES - LOOKUP_REQUEST_OVERHEAD;
	size_t le_at = 0;

	st->k = 0;
	st->wire.n = 0;
	for (size_t i = 0; i < st->n && st->k < LOOKUP_MAX_QUERIES; i++) {
		Kvpalace__V1__LookupQuery *q = &st->wq[st->k];
		struct lookup_query_state *qs = &st->q[i];
		size_t len = qs->end - qs->pos, cost;

		if (qs->done)
			continue;
		kvpalace__v1__lookup_query__init(q);
		if (!qs->has_chain) {
			query_salt(p, &st->qs[i], &q->has_cache_salt, &q->cache_salt);
		} else {
			q->has_chain = 1;
			q->chain.data = qs->chain;
			q->chain.len = sizeof(qs->chain);
		}
		if (!qs->has_chain && st->qs[i].extra_key_len) {
			q->has_extra_key = 1;
			q->extra_key.data = (uint8_t *)(uintptr_t)st->qs[i].extra_key;
			q->extra_key.len = st->qs[i].extra_key_len;
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
		if (len && st->qs[i].n_spans) {
			/* The spans overlapping the piece, within the
			 * request's 256 and its bytes. */
			const struct kvp_key_span *sp = st->qs[i].spans;
			size_t lo = keys_first_ending_after(sp, st->qs[i].n_spans, qs->pos);
			size_t hi = keys_first_at(sp, st->qs[i].n_spans, qs->pos + len);
			size_t room = keys_max_count(c->max_message_bytes) - st->wire.n;
			size_t span_bytes = 0;

			if (hi - lo > room) {
				hi = lo + room;
				len = sp[hi].first_token > qs->pos
					      ? (size_t)(sp[hi].first_token - qs->pos)
					      : 0;
				len -= len % bt;
			}
			for (size_t j = lo; j < hi; j++)
				span_bytes += 32 + sp[j].key_len;
			if (len && cost + span_bytes + len * 4 > bytes_left) {
				len = 0; /* next request */
			} else if (len) {
				q->has_first_token = 1;
				q->first_token = qs->pos;
				q->key_spans = st->wire.p + st->wire.n;
				keys_wire_add(&st->wire, sp, lo, hi);
				q->n_key_spans = hi - lo;
				cost += span_bytes;
			}
		}
		if (!len)
			break; /* not a page more fits: next request */
		q->has_tokens_le = 1;
		q->tokens_le.len = len * 4;
		if (LE_NATIVE) {
			q->tokens_le.data = (uint8_t *)(uintptr_t)(st->qs[i].tokens + qs->pos);
		} else {
			le_put32_array(st->le + le_at, st->qs[i].tokens + qs->pos, len);
			q->tokens_le.data = st->le + le_at;
			le_at += len * 4;
		}
		qs->sent = len;
		tokens_left -= len;
		bytes_left -= cost + len * 4;
		st->wptr[st->k] = q;
		st->which[st->k++] = i;
	}
	if (!st->k)
		return conn_error(c, -EMSGSIZE,
				  "a page of %zu tokens (and its key spans) does not fit one "
				  "request to this daemon",
				  bt);
	kvpalace__v1__lookup_request__init(&st->lr);
	st->lr.pool_id = p->id;
	st->lr.n_queries = st->k;
	st->lr.queries = st->wptr;
	kvpalace__v1__request__init(req);
	req->op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	req->lookup = &st->lr;
	return 0;
}

int lookup_apply(struct lookup_state *st, const Kvpalace__V1__Response *resp)
{
	struct kvp_client *c = st->p->client;
	size_t bt = st->p->layout.block_tokens;

	if (resp->lookup->n_results != st->k)
		return conn_break(c, -EPROTO, "kvpalaced answered %zu lookups of %zu",
				  resp->lookup->n_results, st->k);
	for (size_t j = 0; j < st->k; j++) {
		const Kvpalace__V1__LookupResult *res = resp->lookup->results[j];
		struct lookup_query_state *s = &st->q[st->which[j]];
		struct kvp_lookup_result *o = &st->out[st->which[j]];

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
		st->pending -= s->done;
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
	Kvpalace__V1__Request req;
	Kvpalace__V1__Response *resp;
	struct lookup_state *st;
	int ret = lookup_check(p, queries, n, out);

	if (ret < 0)
		return ret;
	st = lookup_start(p, queries, n, out);
	if (!st)
		return conn_error(p->client, -ENOMEM, "out of memory");
	while (st->pending) {
		ret = lookup_build(st, &req);
		if (ret == 0)
			ret = rpc_call(p->client, &req, KVPALACE__V1__RESPONSE__OP_LOOKUP, &resp,
				       NULL);
		if (ret == 0)
			ret = lookup_apply(st, resp);
		if (ret < 0)
			break;
	}
	lookup_state_free(st);
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
