/* client/api/lease.c — longest-prefix matching (MatchPrefix) and read leases.
 *
 * The daemon matches whole pages through the pool's prefix index, under the
 * cache salt that the first request carries. A token list longer than one
 * request allows is matched in chunks, a bounded window of them in
 * flight: the first names no lease, the following ones say they continue
 * it and go at once, while no reply has said the match is complete (to a
 * daemon whose Hello does not say match_continues, the first goes alone
 * and the following ones carry the lease id of its reply). A chunk
 * boundary may cut a page: the daemon keeps the tokens of that page until
 * the next chunk completes it, so a reply may match fewer tokens than have
 * been sent. Replies may come in any
 * order; each is kept until its turn and applied in chunk order, checked
 * against the replies before it: the match only grows, by whole pages,
 * never past the tokens sent, and each reply gives exactly the slots of
 * the pages it added. Once a reply says the match is complete the client
 * stops sending, and replies to chunks already in flight are collected and
 * ignored: whatever the daemon did with them, the lease handle covers only
 * the pages matched up to that reply. On any error the lease is released
 * before returning. Tokens go as tokens_le and slots come back as
 * page_slots_le, 4 little-endian bytes each: on a little-endian host
 * packing and unpacking them is a copy, where varints cost a few ns a
 * token each way. Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses handle/,
 * rpc/ and base/; gpu.c and pool.c of its own folder call it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keys.h"
#include "le.h"
#include "lease.h"
#include "rpc.h"

/* Chunk requests in flight at most, and their bytes. A send may wait for
 * the daemon to read (the socket is blocking); the daemon reads as long as
 * its replies to us go out, and the replies of LEASE_WINDOW chunks (a few
 * KiB of slots each) fit its socket buffer whether or not we read: no
 * circle of waits. The bytes are bounded below the default socket
 * buffer (212,992 bytes), so that three chunks of a 64 KiB frame are
 * queued behind the one the daemon walks: it never waits for our next
 * send. */
#define LEASE_WINDOW	     8u
#define LEASE_INFLIGHT_BYTES (168u << 10)

/* One chunk request in flight and, once it came, its reply. */
struct match_chunk {
	uint64_t req_id;
	size_t off; /* first token of the chunk */
	size_t len;
	size_t wire_bytes;
	int arrived;
	int err; /* the reply's status as negative errno */
	uint64_t lease_id;
	uint64_t matched;
	uint64_t first_page;
	int complete;
	uint32_t tier; /* where the daemon serves the lease from */
	uint32_t *slots;
	size_t n_slots;
	char msg[CONN_ERR_MSG_BYTES]; /* the daemon's text when err */
};

static int lease_send_release(struct kvp_client *c, uint64_t id)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ReleaseRequest rr = KVPALACE__V1__RELEASE_REQUEST__INIT;
	Kvpalace__V1__Response *resp;

	rr.lease_id = id;
	req.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	req.release = &rr;
	return rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_RELEASE, &resp, NULL);
}

/* Releases lease id, half-built by a call that failed, keeping the
 * error that call reports. */
static void lease_give_back(struct kvp_client *c, uint64_t id)
{
	int code = c->err_code;
	char msg[CONN_ERR_MSG_BYTES];

	if (c->dead)
		return;
	memcpy(msg, c->err_msg, sizeof(msg));
	lease_send_release(c, id);
	c->err_code = code;
	memcpy(c->err_msg, msg, sizeof(msg));
}

/* Checks the reply of the chunk at ch->off (the replies before it have
 * been applied) and extends the lease; last is true for the chunk that
 * holds the last token. Sets *stop when the match cannot go further.
 * Returns 0 or -EPROTO. */
static int lease_apply(struct kvp_lease *l, const struct match_chunk *ch, int last, int *stop)
{
	const struct kvp_pool *p = l->pool;
	uint64_t bt = p->layout.block_tokens;
	uint64_t have = l->n_tokens / bt; /* pages matched so far */

	if (ch->off == 0) {
		if (!ch->lease_id) {
			/* A miss: no lease exists, so nothing can carry the
			 * match on into another chunk. */
			if (ch->matched || ch->n_slots || ch->first_page ||
			    (!ch->complete && !last))
				return -EPROTO;
			l->tier = ch->tier;
			*stop = 1;
			return 0;
		}
		l->id = ch->lease_id;
		l->tier = ch->tier;
	} else if (ch->lease_id != l->id) {
		return -EPROTO;
	}
	/* Whole pages, only growing, never past what was sent, and exactly
	 * the slots of the pages this reply added. */
	if (ch->matched < l->n_tokens || ch->matched > ch->off + ch->len || ch->matched % bt ||
	    ch->first_page != have || ch->n_slots != ch->matched / bt - have)
		return -EPROTO;
	for (size_t i = 0; i < ch->n_slots; i++)
		if (ch->slots[i] >= p->n_pages)
			return -EPROTO;
	if (ch->n_slots)
		memcpy(l->slots + have, ch->slots, ch->n_slots * sizeof(uint32_t));
	l->n_tokens = ch->matched;
	if (ch->complete)
		*stop = 1;
	return 0;
}

/* Records the reply to ch. Returns 0, or a negative errno when the client
 * broke (the reply was malformed). */
static int lease_keep(struct kvp_lease *l, struct match_chunk *ch,
		      const Kvpalace__V1__Response *resp)
{
	struct kvp_client *c = l->pool->client;
	const Kvpalace__V1__MatchPrefixResponse *r;
	size_t n;
	int ret;

	ch->arrived = 1;
	ret = rpc_status(c, resp, KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX);
	if (c->dead)
		return ret;
	if (ret < 0) {
		ch->err = ret;
		memcpy(ch->msg, c->err_msg, sizeof(ch->msg));
		return 0;
	}
	r = resp->match_prefix;
	/* We send tokens_le, so the slots come as page_slots_le, whole
	 * 4-byte slots; a chunk of len tokens spans at most pages_for(len) + 1
	 * pages. */
	n = r->has_page_slots_le ? r->page_slots_le.len / 4 : 0;
	if (r->n_page_slots || (r->has_page_slots_le && r->page_slots_le.len % 4) ||
	    n > pool_pages_for(l->pool, ch->len) + 1)
		return conn_break(
			c, -EPROTO,
			"kvpalaced answered MatchPrefix with %zu slots and %zu bytes of them",
			r->n_page_slots, r->has_page_slots_le ? r->page_slots_le.len : (size_t)0);
	if (n) {
		ch->slots = malloc(n * sizeof(uint32_t));
		if (!ch->slots) {
			ch->err = -ENOMEM;
			snprintf(ch->msg, sizeof(ch->msg), "out of memory");
			return 0;
		}
		if (LE_NATIVE)
			memcpy(ch->slots, r->page_slots_le.data, n * sizeof(uint32_t));
		else
			le_get32_array(ch->slots, r->page_slots_le.data, n);
	}
	ch->n_slots = n;
	ch->lease_id = r->lease_id;
	ch->matched = r->matched_tokens;
	ch->first_page = r->first_page;
	ch->complete = !!r->complete;
	ch->tier = r->has_tier ? (uint32_t)r->tier : KVP_TIER_HOST;
	if (ch->tier != KVP_TIER_HOST && (ch->tier != KVP_TIER_GPU || l->want_tier != KVP_TIER_GPU))
		return conn_break(c, -EPROTO, "kvpalaced answered MatchPrefix from tier %u",
				  ch->tier);
	return 0;
}

/* Runs the chunked match of tokens[0..n) into l (whose page table holds
 * pool_pages_for(n) entries). Returns 0 or a negative errno; on error the
 * lease may exist in the daemon (l->id) and must be released. */
static int lease_match(struct kvp_lease *l, const uint32_t *tokens, size_t n,
		       const struct kvp_match_opts *keys, struct keys_wire *w)
{
	size_t next_span = 0, n_spans = keys ? keys->n_spans : 0;
	struct kvp_client *c = l->pool->client;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest mp = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;
	struct match_chunk win[LEASE_WINDOW];
	uint64_t next_send = 0;	 /* sequence number of the next chunk to send */
	uint64_t next_apply = 0; /* of the oldest chunk in flight */
	size_t sent = 0;	 /* tokens sent */
	size_t inflight_bytes = 0;
	int stop = 0;
	int err = 0;
	char err_msg[CONN_ERR_MSG_BYTES] = "";
	Kvpalace__V1__Response *resp;
	struct match_chunk *got;
	unsigned char *le = NULL; /* a chunk's tokens_le on a big-endian host */
	int ret = 0;
	int fd;

	if (!LE_NATIVE && !(le = malloc(c->chunk_tokens * 4)))
		return conn_error(c, -ENOMEM, "out of memory");
	memset(win, 0, sizeof(win));
	mp.pool_id = l->pool->id;
	/* Host matches say nothing of tiers, as before there were tiers. */
	mp.has_tier = l->want_tier == KVP_TIER_GPU;
	mp.tier = KVPALACE__V1__TIER__TIER_GPU;
	mp.has_or_host = mp.has_tier && l->or_host;
	mp.or_host = l->or_host;
	req.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	req.match_prefix = &mp;
	for (;;) {
		/* Chunk 0 goes alone where the others need the lease id it
		 * returns: a daemon without match_continues (Hello). */
		while (!stop && sent < n && next_send - next_apply < LEASE_WINDOW &&
		       !(next_send > 0 && next_apply == 0 && !c->match_continues)) {
			struct match_chunk *ch = &win[next_send % LEASE_WINDOW];
			size_t len = n - sent < c->chunk_tokens ? n - sent : c->chunk_tokens;
			size_t end_span;
			size_t bytes;
			uint64_t id;

			/* The spans that start in the chunk, at most 256: a
			 * chunk ends before the 257th (a span's first token
			 * is past the one before's, so the chunk is not empty). */
			end_span = next_span;
			if (n_spans) {
				size_t span_bytes;

				end_span = keys_take(keys->spans, n_spans, next_span, sent + len,
						     c->max_message_bytes, &span_bytes);
				if (end_span < n_spans &&
				    keys->spans[end_span].first_token < sent + len)
					len = (size_t)(keys->spans[end_span].first_token - sent);
				if (len > c->chunk_tokens - (span_bytes + 4) / 5)
					len = c->chunk_tokens - (span_bytes + 4) / 5;
				while (end_span > next_span &&
				       keys->spans[end_span - 1].first_token >= sent + len)
					end_span--;
			}
			if (w) {
				keys_wire_set(w, keys->spans, next_span, end_span);
				mp.key_spans = w->p;
				mp.n_key_spans = w->n;
			}

			/* 4 bytes a token as they lie in memory (a copy, not a
			 * varint each), converted on a big-endian host. */
			mp.has_tokens_le = 1;
			mp.tokens_le.len = len * 4;
			if (LE_NATIVE) {
				mp.tokens_le.data = (uint8_t *)(uintptr_t)(tokens + sent);
			} else {
				le_put32_array(le, tokens + sent, len);
				mp.tokens_le.data = le;
			}
			mp.has_lease_id = next_send > 0 && !c->match_continues;
			mp.lease_id = l->id;
			mp.has_continues = next_send > 0 && c->match_continues;
			mp.continues = mp.has_continues;
			/* The salt picks the hash chain; the lease remembers it.
			 * The prompt's length goes first too: the daemon counts
			 * it as asked (Stats) though we stop sending chunks once
			 * the match stops. */
			if (next_send == 0 && keys && keys->salt) {
				mp.has_cache_salt = keys->salt_len != 0;
				mp.cache_salt.data = (uint8_t *)(uintptr_t)keys->salt;
				mp.cache_salt.len = keys->salt_len;
			} else if (next_send == 0) {
				pool_salt_field(l->pool, &mp.has_cache_salt, &mp.cache_salt);
			} else {
				mp.has_cache_salt = 0;
			}
			mp.has_extra_key = next_send == 0 && keys && keys->extra_key_len;
			mp.extra_key.data = keys ? (uint8_t *)(uintptr_t)keys->extra_key : NULL;
			mp.extra_key.len = keys ? keys->extra_key_len : 0;
			mp.has_prompt_tokens = next_send == 0;
			mp.prompt_tokens = n;
			bytes = protobuf_c_message_get_packed_size(&req.base) + FRAME_HEADER_BYTES;
			if (next_send > next_apply && inflight_bytes + bytes > LEASE_INFLIGHT_BYTES)
				break;
			ret = rpc_send(c, &req, &id);
			if (ret < 0 && c->dead)
				goto out;
			if (ret < 0) {
				/* Not sent (too big): end the match with this error. */
				err = ret;
				memcpy(err_msg, c->err_msg, sizeof(err_msg));
				stop = 1;
				break;
			}
			memset(ch, 0, sizeof(*ch));
			ch->req_id = id;
			ch->off = sent;
			ch->len = len;
			ch->wire_bytes = bytes;
			inflight_bytes += bytes;
			sent += len;
			next_span = end_span;
			next_send++;
		}
		if (next_apply == next_send)
			break;

		ret = rpc_recv(c, &resp, &fd);
		if (ret < 0)
			goto out;
		if (fd >= 0)
			close(fd);
		got = NULL;
		for (uint64_t k = next_apply; k < next_send; k++) {
			struct match_chunk *ch = &win[k % LEASE_WINDOW];

			if (ch->req_id == resp->id && !ch->arrived) {
				got = ch;
				break;
			}
		}
		if (!got) {
			ret = rpc_stray(c, resp);
			goto out;
		}
		ret = lease_keep(l, got, resp);
		if (ret < 0)
			goto out;

		while (next_apply < next_send && win[next_apply % LEASE_WINDOW].arrived) {
			struct match_chunk *ch = &win[next_apply % LEASE_WINDOW];

			inflight_bytes -= ch->wire_bytes;
			if (!stop && ch->err) {
				err = ch->err;
				memcpy(err_msg, ch->msg, sizeof(err_msg));
				stop = 1;
			} else if (!stop && lease_apply(l, ch, ch->off + ch->len == n, &stop) < 0) {
				ret = conn_break(
					c, -EPROTO,
					"kvpalaced answered MatchPrefix of tokens %zu..%zu "
					"with lease %llu, %llu matched, first page %llu, "
					"%zu slots",
					ch->off, ch->off + ch->len,
					(unsigned long long)ch->lease_id,
					(unsigned long long)ch->matched,
					(unsigned long long)ch->first_page, ch->n_slots);
				goto out;
			}
			free(ch->slots);
			ch->slots = NULL;
			next_apply++;
		}
	}
	if (err)
		ret = conn_error(c, err, "%s", err_msg);
	else
		conn_clear_error(c); /* errors of ignored chunks are no error */
out:
	for (unsigned int i = 0; i < LEASE_WINDOW; i++)
		free(win[i].slots);
	free(le);
	return ret;
}

static int prefetch(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		    unsigned int flags, const struct kvp_match_opts *keys,
		    uint32_t *ret_pages_coming);

KVP_PUBLIC int kvp_prefetch(kvp_pool *p, const uint32_t *tokens, size_t n,
			    uint32_t *ret_pages_coming)
{
	return kvp_prefetch_tier(p, tokens, n, KVP_TIER_HOST, 0, ret_pages_coming);
}

KVP_PUBLIC int kvp_prefetch_tier(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
				 unsigned int flags, uint32_t *ret_pages_coming)
{
	return prefetch(p, tokens, n, tier, flags, NULL, ret_pages_coming);
}

KVP_PUBLIC int kvp_prefetch_opts(kvp_pool *p, const uint32_t *tokens, size_t n,
				 const struct kvp_match_opts *opts, uint32_t *ret_pages_coming)
{
	struct kvp_match_opts o;
	int ret = keys_match_opts(p, opts, &o);

	if (ret < 0)
		return ret;
	return prefetch(p, tokens, n, o.tier ? o.tier : KVP_TIER_HOST, o.flags, &o,
			ret_pages_coming);
}

static int prefetch(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		    unsigned int flags, const struct kvp_match_opts *keys,
		    uint32_t *ret_pages_coming)
{
	struct keys_wire *w = NULL;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PrefetchRequest pf = KVPALACE__V1__PREFETCH_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	int ret;

	if (!p || (!tokens && n) || (flags & ~KVP_TIER_OR_HOST) ||
	    (tier != KVP_TIER_GPU && tier != KVP_TIER_HOST))
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	pf.pool_id = p->id;
	pf.has_tier = tier == KVP_TIER_GPU;
	pf.tier = KVPALACE__V1__TIER__TIER_GPU;
	pf.has_or_host = pf.has_tier && (flags & KVP_TIER_OR_HOST);
	pf.or_host = pf.has_or_host;
	pf.tokens = (uint32_t *)tokens;
	pf.n_tokens = n < c->chunk_tokens ? n : c->chunk_tokens;
	if (keys && keys->salt) {
		pf.has_cache_salt = keys->salt_len != 0;
		pf.cache_salt.data = (uint8_t *)(uintptr_t)keys->salt;
		pf.cache_salt.len = keys->salt_len;
	} else {
		pool_salt_field(p, &pf.has_cache_salt, &pf.cache_salt);
	}
	if (keys && keys->extra_key_len) {
		pf.has_extra_key = 1;
		pf.extra_key.data = (uint8_t *)(uintptr_t)keys->extra_key;
		pf.extra_key.len = keys->extra_key_len;
	}
	if (keys && keys->n_spans) {
		/* The spans starting in the tokens sent, as many as fit. */
		size_t span_bytes;
		size_t end = keys_take(keys->spans, keys->n_spans, 0, pf.n_tokens,
				       c->max_message_bytes, &span_bytes);

		if (pf.n_tokens > c->chunk_tokens - (span_bytes + 4) / 5)
			pf.n_tokens = c->chunk_tokens - (span_bytes + 4) / 5;
		while (end > 0 && keys->spans[end - 1].first_token >= pf.n_tokens)
			end--;

		if (!(w = malloc(sizeof(*w))))
			return conn_error(c, -ENOMEM, "out of memory");
		keys_wire_set(w, keys->spans, 0, end);
		pf.key_spans = w->p;
		pf.n_key_spans = w->n;
	}
	req.op_case = KVPALACE__V1__REQUEST__OP_PREFETCH;
	req.prefetch = &pf;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_PREFETCH, &resp, NULL);
	free(w);
	if (ret < 0)
		return ret;
	if (ret_pages_coming)
		*ret_pages_coming = resp->prefetch->pages_coming;
	return 0;
}

KVP_PUBLIC int kvp_match_prefix(kvp_pool *p, const uint32_t *tokens, size_t n,
				kvp_lease **ret_lease)
{
	if (!p || !ret_lease)
		return -EINVAL;
	return lease_match_tier(p, tokens, n, KVP_TIER_HOST, 0, NULL, ret_lease);
}

int lease_match_tier(struct kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
		     int or_host, const struct kvp_match_opts *keys, struct kvp_lease **ret_lease)
{
	struct keys_wire *w = NULL;
	struct kvp_client *c;
	struct kvp_lease *l;
	int ret;

	if (!tokens && n)
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->pool = p;
	l->want_tier = tier;
	l->or_host = or_host;
	l->tier = KVP_TIER_HOST;
	list_init(&l->link);
	if (n) {
		ret = handle_table_reserve(&l->slots, &l->cap, pool_pages_for(p, n));
		if (ret < 0)
			goto fail;
		if (keys && keys->n_spans && !(w = malloc(sizeof(*w)))) {
			ret = conn_error(c, -ENOMEM, "out of memory");
			goto fail;
		}
		ret = lease_match(l, tokens, n, keys, w);
		free(w);
		if (ret < 0)
			goto fail;
	}
	handle_lease_populate(l);
	list_add_tail(&p->leases, &l->link);
	*ret_lease = l;
	return 0;
fail:
	if (l->id)
		lease_give_back(c, l->id);
	free(l->slots);
	free(l->dev_slots);
	free(l);
	return ret;
}

KVP_PUBLIC uint64_t kvp_lease_tokens(const kvp_lease *l)
{
	return l ? l->n_tokens : 0;
}

KVP_PUBLIC const void *kvp_lease_kv(const kvp_lease *l, uint64_t pos, uint32_t layer, uint32_t kv,
				    uint32_t kv_head)
{
	const struct kvp_pool *p;

	if (!l || pos >= l->n_tokens)
		return NULL;
	p = l->pool;
	/* A lost connection ended the lease: the pages may be reused. */
	if (p->client->dead || pool_check_index(p, layer, kv, kv_head) < 0)
		return NULL;
	return pool_kv(p, l->slots[pos / p->layout.block_tokens], pos, layer, kv, kv_head);
}

KVP_PUBLIC int kvp_lease_release(kvp_lease *l)
{
	struct kvp_client *c;
	int ret = 0;

	if (!l)
		return 0;
	c = l->pool->client;
	conn_clear_error(c);
	if (l->id) {
		ret = conn_usable(c);
		if (ret == 0)
			ret = lease_send_release(c, l->id);
	}
	handle_lease_free(l);
	return ret;
}

KVP_PUBLIC uint64_t kvp_lease_id(const kvp_lease *l)
{
	return l ? l->id : 0;
}

/* Checks n slots of a reply for pages [first, first + n) of l (whose
 * table has room for them all) and copies them in. Returns 0 or -EPROTO
 * (the client broken). */
static int adopt_slots(struct kvp_lease *l, uint64_t first, const uint32_t *slots, size_t n)
{
	const struct kvp_pool *p = l->pool;
	uint64_t pages = l->n_tokens / p->layout.block_tokens;

	if (first > pages || n > pages - first || (!n && first < pages))
		return conn_break(
			p->client, -EPROTO,
			"kvpalaced sent %zu slots from page %llu of a lease of %llu pages", n,
			(unsigned long long)first, (unsigned long long)pages);
	for (size_t i = 0; i < n; i++)
		if (slots[i] >= p->n_pages)
			return conn_break(p->client, -EPROTO, "kvpalaced sent slot %u of %u",
					  slots[i], p->n_pages);
	memcpy(l->slots + first, slots, n * sizeof(uint32_t));
	return 0;
}

/* The page table of l from page `have` on, by LeasePages requests. */
static int adopt_rest(struct kvp_lease *l, uint64_t have)
{
	struct kvp_client *c = l->pool->client;
	uint64_t pages = l->n_tokens / l->pool->layout.block_tokens;

	while (have < pages) {
		Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
		Kvpalace__V1__LeasePagesRequest lp = KVPALACE__V1__LEASE_PAGES_REQUEST__INIT;
		Kvpalace__V1__Response *resp;
		int ret;

		lp.lease_id = l->id;
		lp.first_page = have;
		req.op_case = KVPALACE__V1__REQUEST__OP_LEASE_PAGES;
		req.lease_pages = &lp;
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_LEASE_PAGES, &resp, NULL);
		if (ret < 0)
			return ret;
		if (resp->lease_pages->first_page != have)
			return conn_break(c, -EPROTO, "kvpalaced answered LeasePages out of order");
		ret = adopt_slots(l, have, resp->lease_pages->page_slots,
				  resp->lease_pages->n_page_slots);
		if (ret < 0)
			return ret;
		have += resp->lease_pages->n_page_slots;
	}
	return 0;
}

KVP_PUBLIC int kvp_lease_adopt(kvp_pool *p, uint64_t lease_id, kvp_lease **ret_lease)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AdoptLeaseRequest ar = KVPALACE__V1__ADOPT_LEASE_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__AdoptLeaseResponse *r;
	struct kvp_client *c;
	struct kvp_lease *l;
	int ret;

	if (!p || !ret_lease || !lease_id)
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	ar.pool_id = p->id;
	ar.lease_id = lease_id;
	req.op_case = KVPALACE__V1__REQUEST__OP_ADOPT_LEASE;
	req.adopt_lease = &ar;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_ADOPT_LEASE, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->adopt_lease;
	if (!r->lease_id || r->matched_tokens % p->layout.block_tokens ||
	    r->matched_tokens / p->layout.block_tokens > p->n_pages)
		return conn_break(c, -EPROTO, "kvpalaced sent an inconsistent AdoptLease reply");
	l = calloc(1, sizeof(*l));
	if (!l) {
		/* The daemon holds the lease: give it back. */
		lease_send_release(c, r->lease_id);
		return conn_error(c, -ENOMEM, "out of memory");
	}
	l->pool = p;
	l->id = r->lease_id;
	l->n_tokens = r->matched_tokens;
	l->want_tier = KVP_TIER_HOST;
	l->tier = KVP_TIER_HOST;
	list_init(&l->link);
	ret = handle_table_reserve(&l->slots, &l->cap, pool_pages_for(p, l->n_tokens));
	if (ret < 0)
		ret = conn_error(c, ret, "out of memory");
	if (ret == 0)
		ret = adopt_slots(l, 0, r->page_slots, r->n_page_slots);
	if (ret == 0)
		ret = adopt_rest(l, r->n_page_slots);
	if (ret < 0) {
		lease_give_back(c, l->id);
		free(l->slots);
		free(l);
		return ret;
	}
	handle_lease_populate(l);
	list_add_tail(&p->leases, &l->link);
	*ret_lease = l;
	return 0;
}
