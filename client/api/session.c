/* client/api/session.c — creating sessions, reserving slots (Append), writing
 * K/V in place, publishing it (Commit), forking and truncating sessions.
 *
 * A token list longer than one request allows is sent as several Append
 * requests, one after the other: Append carries no expected position, so a
 * pipelined chunk that the daemon accepted after refusing the one before it
 * would reserve tokens at the wrong place. Each reply is checked against
 * what we know (its first token must be our reserved length, its slots
 * must cover exactly the new tokens and exist in the arena) before it
 * extends the page table, which is grown before the request is sent so an
 * accepted reservation is never lost to a failed allocation.
 *
 * The page table is the daemon's, mirrored: every reply that moves a page
 * is applied here. Commit may replace the pages it filled by identical
 * indexed copies (dedup) and says which slots they have now; Truncate may
 * copy a shared last page and gives its new slot; a fork's table is read
 * with SessionPages, as many slots per reply as fit in one message, and so
 * is a restored checkpoint's (session_adopt serves both). A reply that
 * does not fit what we asked for breaks the client (-EPROTO):
 * a wrong slot would hand out pointers into someone else's page.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api, the top of libkvpalace (client/README.md): uses handle/
 * (the session handle and its page table), rpc/ and base/, and gpu.c of
 * its own folder.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "keys.h"
#include "rpc.h"
#include "session.h"

/* CreateSession of a new session under o's options. */
static int create(kvp_pool *p, const struct kvp_session_opts *o, kvp_session **ret_session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	struct kvp_session *s;
	int ret;

	if (!p || !ret_session)
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (o->salt && o->salt_len > POOL_SALT_MAX_BYTES)
		return conn_error(c, -EINVAL, "a cache salt has at most 64 bytes");
	if (keys_check_extra(o->extra_key, o->extra_key_len) < 0)
		return conn_error(c, -EINVAL, "an extra key has 1..64 bytes");
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	cs.pool_id = p->id;
	if (o->salt) {
		cs.has_cache_salt = o->salt_len != 0;
		cs.cache_salt.data = (uint8_t *)(uintptr_t)o->salt;
		cs.cache_salt.len = o->salt_len;
	} else {
		pool_salt_field(p, &cs.has_cache_salt, &cs.cache_salt);
	}
	cs.has_extra_key = o->extra_key_len != 0;
	cs.extra_key.data = (uint8_t *)(uintptr_t)o->extra_key;
	cs.extra_key.len = o->extra_key_len;
	cs.has_persistent = cs.persistent = !!o->persistent;
	req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	req.create_session = &cs;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_CREATE_SESSION, &resp, NULL);
	if (ret < 0) {
		free(s);
		return ret;
	}
	s->pool = p;
	s->id = resp->create_session->session_id;
	list_add_tail(&p->sessions, &s->link);
	*ret_session = s;
	return 0;
}

/* The size of struct kvp_session_opts as first published (size 0). */
#define SESSION_OPTS_V1 sizeof(struct kvp_session_opts)

KVP_PUBLIC int kvp_session_create(kvp_pool *p, kvp_session **ret_session)
{
	struct kvp_session_opts o = {0};

	return create(p, &o, ret_session);
}

KVP_PUBLIC int kvp_session_create_persistent(kvp_pool *p, kvp_session **ret_session)
{
	struct kvp_session_opts o = {.persistent = 1};

	return create(p, &o, ret_session);
}

KVP_PUBLIC int kvp_session_create_opts(kvp_pool *p, const struct kvp_session_opts *opts,
				       kvp_session **ret_session)
{
	struct kvp_session_opts o;

	keys_opts_copy(&o, sizeof(o), opts, SESSION_OPTS_V1);
	return create(p, &o, ret_session);
}

KVP_PUBLIC int kvp_session_close(kvp_session *s)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CloseSessionRequest cs = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	int ret;

	if (!s)
		return 0;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret == 0) {
		cs.session_id = s->id;
		req.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
		req.close_session = &cs;
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_CLOSE_SESSION, &resp, NULL);
	}
	handle_session_free(s);
	return ret;
}

KVP_PUBLIC uint64_t kvp_session_id(const kvp_session *s)
{
	return s ? s->id : 0;
}

KVP_PUBLIC uint64_t kvp_session_tokens(const kvp_session *s)
{
	return s ? s->n_tokens : 0;
}

KVP_PUBLIC uint64_t kvp_session_committed(const kvp_session *s)
{
	return s ? s->committed : 0;
}

/* Checks an Append reply for n tokens and enters its slots in the page
 * table (already big enough). Returns 0 or -EPROTO. */
static int session_apply(struct kvp_session *s, const Kvpalace__V1__AppendResponse *r, uint64_t n)
{
	const struct kvp_pool *p = s->pool;
	uint64_t known = pool_pages_for(p, s->n_tokens);
	uint64_t pages = pool_pages_for(p, s->n_tokens + n);

	if (r->first_token != s->n_tokens)
		return -EPROTO;
	/* The slots start at a page we know (usually the partial tail page or
	 * the next one) and end exactly at the last page of the new tokens. */
	if (r->first_page > known || r->first_page > r->first_token / p->layout.block_tokens ||
	    r->n_page_slots != pages - r->first_page)
		return -EPROTO;
	for (size_t i = 0; i < r->n_page_slots; i++)
		if (r->page_slots[i] >= p->n_pages)
			return -EPROTO;
	for (size_t i = 0; i < r->n_page_slots; i++)
		s->slots[r->first_page + i] = r->page_slots[i];
	s->n_tokens += n;
	return 0;
}

/* Records the device slots an Append reply gave (or that its new pages
 * have none). Returns 0 or -EPROTO / -ENOMEM. */
static int session_apply_dev(struct kvp_session *s, const Kvpalace__V1__AppendResponse *r,
			     uint64_t known_pages)
{
	const struct kvp_pool *p = s->pool;
	uint64_t pages = pool_pages_for(p, s->n_tokens);
	int gpu = r->has_tier && r->tier == KVPALACE__V1__TIER__TIER_GPU;

	if (!gpu && !s->dev_slots)
		return r->n_device_slots ? -EPROTO : 0;
	if (gpu && (r->n_device_slots != r->n_page_slots || !p->dev_base))
		return -EPROTO;
	if (handle_table_reserve(&s->dev_slots, &s->dev_cap, pages) < 0)
		return -ENOMEM;
	for (uint64_t i = known_pages; i < pages; i++)
		s->dev_slots[i] = SESSION_NO_DEV;
	for (size_t i = 0; gpu && i < r->n_device_slots; i++) {
		if (r->device_slots[i] >= p->dev_n_pages)
			return -EPROTO;
		s->dev_slots[r->first_page + i] = r->device_slots[i];
	}
	return 0;
}

/* Tags for appended tokens (kvp_append_tagged). */
struct append_tag {
	uint32_t role, turn;
	unsigned int flags;
};

static int append_chunks(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t tier,
			 unsigned int flags, const struct append_tag *tag,
			 const struct kvp_key_span *spans, size_t n_spans, struct keys_wire *w);

/* Append on a tier (flags: KVP_TIER_OR_HOST), with tags when tag, and
 * key spans spans[0..n_spans). */
static int append(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t tier,
		  unsigned int flags, const struct append_tag *tag,
		  const struct kvp_key_span *spans, size_t n_spans)
{
	struct keys_wire *w = NULL;
	struct kvp_client *c;
	const char *why;
	int ret;

	if (!s || (!tokens && n) || (flags & ~(KVP_TIER_OR_HOST | KVP_APPEND_NO_PREFAULT)) ||
	    (tier != KVP_TIER_GPU && tier != KVP_TIER_HOST))
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (keys_check(spans, n_spans, &why) < 0)
		return conn_error(c, -EINVAL, "%s", why);
	if (!n)
		return 0;
	if (n_spans && !(w = malloc(sizeof(*w))))
		return conn_error(c, -ENOMEM, "out of memory");
	ret = append_chunks(s, tokens, n, tier, flags, tag, spans, n_spans, w);
	free(w);
	return ret;
}

/* append's requests, each with the spans starting before its end (w: room
 * for their wire form, NULL without spans). */
static int append_chunks(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t tier,
			 unsigned int flags, const struct append_tag *tag,
			 const struct kvp_key_span *spans, size_t n_spans, struct keys_wire *w)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest ap = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c = s->pool->client;
	size_t done = 0, next_span = 0;
	int ret;

	if (n > UINT64_MAX - s->n_tokens)
		return conn_error(c, -EDQUOT, "too many tokens");
	if (handle_table_reserve(&s->slots, &s->cap, pool_pages_for(s->pool, s->n_tokens + n)) < 0)
		return -ENOMEM;
	if (tier == KVP_TIER_GPU && s->pool->dev_arena && !s->pool->dev_base) {
		/* Device slots are of use only once the arena is mapped here. */
		ret = kvp_pool_gpu_open(s->pool);
		if (ret < 0 && (c->dead || !(flags & KVP_TIER_OR_HOST)))
			return ret;
		if (ret < 0)
			tier = KVP_TIER_HOST;
		conn_clear_error(c);
	}
	ap.session_id = s->id;
	if (tag) {
		if (tag->role >= KVP_N_ROLES ||
		    (tag->flags & ~(KVP_TAG_PERMANENT | KVP_TAG_SUMMARY)))
			return conn_error(c, -EINVAL, "unknown role or tag flag");
		ap.has_role = ap.has_turn = ap.has_permanent = 1;
		ap.role = (Kvpalace__V1__Role)tag->role;
		ap.turn = tag->turn;
		ap.permanent = (tag->flags & (KVP_TAG_PERMANENT | KVP_TAG_SUMMARY)) != 0;
		ap.has_summary = ap.summary = (tag->flags & KVP_TAG_SUMMARY) != 0;
	}
	ap.has_tier = tier == KVP_TIER_GPU;
	ap.tier = KVPALACE__V1__TIER__TIER_GPU;
	ap.has_or_host = ap.has_tier && (flags & KVP_TIER_OR_HOST);
	ap.or_host = ap.has_or_host;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	while (done < n) {
		size_t len = n - done < c->chunk_tokens ? n - done : c->chunk_tokens;
		uint64_t known = pool_pages_for(s->pool, s->n_tokens);
		size_t end_span = next_span, span_bytes = 0;

		if (n_spans) {
			/* The spans starting in the request, as many as one
			 * request holds: it ends before the first that does
			 * not fit, and makes room for their bytes. */
			end_span = keys_take(spans, n_spans, next_span, s->n_tokens + len,
					     c->max_message_bytes, &span_bytes);
			if (end_span < n_spans && spans[end_span].first_token < s->n_tokens + len) {
				if (spans[end_span].first_token <= s->n_tokens)
					return conn_error(c, -EMSGSIZE,
							  "more key spans start before the "
							  "appended tokens than one request "
							  "holds");
				len = (size_t)(spans[end_span].first_token - s->n_tokens);
			}
			if (len > c->chunk_tokens - (span_bytes + 4) / 5)
				len = c->chunk_tokens - (span_bytes + 4) / 5;
			while (end_span > next_span &&
			       spans[end_span - 1].first_token >= s->n_tokens + len)
				end_span--;
		}
		if (w) {
			keys_wire_set(w, spans, next_span, end_span);
			ap.key_spans = w->p;
			ap.n_key_spans = w->n;
		}
		ap.tokens = (uint32_t *)tokens + done;
		ap.n_tokens = len;
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_APPEND, &resp, NULL);
		if (ret < 0)
			return ret;
		if (session_apply(s, resp->append, len) < 0)
			return conn_break(
				c, -EPROTO,
				"kvpalaced answered Append with slots that do not fit "
				"(first token %llu, first page %llu, %zu slots for %zu tokens "
				"after %llu)",
				(unsigned long long)resp->append->first_token,
				(unsigned long long)resp->append->first_page,
				resp->append->n_page_slots, len, (unsigned long long)s->n_tokens);
		ret = session_apply_dev(s, resp->append, known);
		if (ret == -ENOMEM)
			return conn_error(c, ret, "out of memory");
		if (ret < 0)
			return conn_break(c, ret,
					  "kvpalaced answered Append with device slots "
					  "that do not fit");
		/* The caller writes host pages next: prefault them now, in
		 * one call per run, not a fault per 4 KiB (device pages are
		 * written on the device). */
		if (!(flags & KVP_APPEND_NO_PREFAULT) &&
		    !(resp->append->has_tier && resp->append->tier == KVPALACE__V1__TIER__TIER_GPU))
			handle_populate(s->pool, s->slots + resp->append->first_page,
					resp->append->n_page_slots, 1);
		done += len;
		next_span = end_span;
	}
	return 0;
}

KVP_PUBLIC int kvp_append_tier(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t tier,
			       unsigned int flags)
{
	return append(s, tokens, n, tier, flags, NULL, NULL, 0);
}

KVP_PUBLIC int kvp_append(kvp_session *s, const uint32_t *tokens, size_t n)
{
	return append(s, tokens, n, KVP_TIER_HOST, 0, NULL, NULL, 0);
}

KVP_PUBLIC int kvp_append_opts(kvp_session *s, const uint32_t *tokens, size_t n,
			       const struct kvp_append_opts *opts)
{
	struct kvp_append_opts o;

	keys_opts_copy(&o, sizeof(o), opts, sizeof(o));
	return append(s, tokens, n, o.tier ? o.tier : KVP_TIER_HOST, o.flags, NULL, o.spans,
		      o.n_spans);
}

KVP_PUBLIC int kvp_append_tagged(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t role,
				 uint32_t turn, unsigned int flags)
{
	struct append_tag tag = {role, turn, flags};

	return append(s, tokens, n, KVP_TIER_HOST, 0, &tag, NULL, 0);
}

KVP_PUBLIC void *kvp_session_kv(kvp_session *s, uint64_t pos, uint32_t layer, uint32_t kv,
				uint32_t kv_head)
{
	const struct kvp_pool *p;

	if (!s || pos >= s->n_tokens)
		return NULL;
	p = s->pool;
	/* After a lost connection the daemon has freed our uncommitted slots
	 * and may lend them to someone else: hand out no more pointers. */
	if (p->client->dead || pool_check_index(p, layer, kv, kv_head) < 0)
		return NULL;
	return pool_kv(p, s->slots[pos / p->layout.block_tokens], pos, layer, kv, kv_head);
}

/* Checks the pages a Commit reply says it filled: exactly pages
 * [old / bt, now / bt) of the session, in the arena. Returns 0 or -EPROTO. */
static int session_check_commit(const struct kvp_session *s, const Kvpalace__V1__CommitResponse *r,
				uint64_t now)
{
	const struct kvp_pool *p = s->pool;
	uint64_t first = s->committed / p->layout.block_tokens;
	uint64_t filled = now / p->layout.block_tokens - first;

	if (r->n_page_slots != filled)
		return -EPROTO;
	if ((filled || r->has_first_page) && (!r->has_first_page || r->first_page != first))
		return -EPROTO;
	for (size_t i = 0; i < r->n_page_slots; i++)
		if (r->page_slots[i] >= p->n_pages)
			return -EPROTO;
	return 0;
}

/* Commits the next n tokens (filling at most c->reply_pages pages) in one
 * request and applies the reply. Returns 0, 1 when the daemon compacted
 * the session after the commit (its policy's auto_compact), or a negative
 * errno. */
static int session_commit_one(struct kvp_session *s, uint64_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CommitRequest cm = KVPALACE__V1__COMMIT_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__CommitResponse *r;
	struct kvp_client *c = s->pool->client;
	uint64_t now;
	int ret;

	cm.session_id = s->id;
	cm.n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = &cm;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_COMMIT, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->commit;
	now = r->committed_tokens;
	if (r->has_compacted && r->compacted) {
		/* Only a commit of everything reserved compacts, to fewer. */
		if (s->committed + n != s->n_tokens || now > s->n_tokens || r->n_page_slots)
			return conn_break(c, -EPROTO,
					  "kvpalaced compacted a session to %llu of %llu tokens "
					  "after a commit that left %llu uncommitted",
					  (unsigned long long)now, (unsigned long long)s->n_tokens,
					  (unsigned long long)(s->n_tokens - s->committed - n));
		ret = session_reload(s, now);
		return ret < 0 ? ret : 1;
	}
	if (now < s->committed + n || now > s->n_tokens)
		return conn_break(
			c, -EPROTO,
			"kvpalaced reports %llu committed tokens after committing %llu of %llu",
			(unsigned long long)now, (unsigned long long)(s->committed + n),
			(unsigned long long)s->n_tokens);
	if (session_check_commit(s, r, now) < 0)
		return conn_break(c, -EPROTO,
				  "kvpalaced answered a commit of tokens %llu..%llu with %zu page "
				  "slots from page %llu%s",
				  (unsigned long long)s->committed, (unsigned long long)now,
				  r->n_page_slots, (unsigned long long)r->first_page,
				  r->has_first_page ? "" : " (none given)");
	/* Dedup may have moved a filled page to an indexed copy. */
	for (size_t i = 0; i < r->n_page_slots; i++)
		s->slots[r->first_page + i] = r->page_slots[i];
	s->committed = now;
	return 0;
}

KVP_PUBLIC int kvp_commit(kvp_session *s, uint64_t n)
{
	struct kvp_client *c;
	uint64_t bt;
	uint64_t target;
	int ret;

	if (!s)
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (n > s->n_tokens - s->committed)
		return conn_error(
			c, -ERANGE,
			"commit of %llu tokens, but only %llu are reserved and uncommitted",
			(unsigned long long)n, (unsigned long long)(s->n_tokens - s->committed));
	/* The reply lists the slot of every page the commit fills: split a
	 * commit that fills more than one reply can list. */
	bt = s->pool->layout.block_tokens;
	target = s->committed + n;
	while (s->committed < target) {
		uint64_t end = (s->committed / bt + c->reply_pages) * bt;

		if (end > target)
			end = target;
		ret = session_commit_one(s, end - s->committed);
		if (ret < 0)
			return ret;
		if (ret == 1)
			break; /* compacted: what was reserved is all committed */
	}
	return 0;
}

/* Sends CloseSession for id, keeping the client's current error text (the
 * error being reported is the one that made us give the session back). */
static void session_send_close(struct kvp_client *c, uint64_t id)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CloseSessionRequest cs = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	int code = c->err_code;
	char msg[CONN_ERR_MSG_BYTES];

	if (c->dead)
		return;
	memcpy(msg, c->err_msg, sizeof(msg));
	cs.session_id = id;
	req.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
	req.close_session = &cs;
	rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_CLOSE_SESSION, &resp, NULL);
	c->err_code = code;
	memcpy(c->err_msg, msg, sizeof(msg));
}

int session_own_call(struct kvp_client *c, uint64_t pool_id, uint64_t id, int has_persistent,
		     int persistent)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest cs = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	int ret;

	cs.pool_id = pool_id;
	cs.has_session_id = 1;
	cs.session_id = id;
	cs.has_persistent = !!has_persistent;
	cs.persistent = !!persistent;
	req.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	req.create_session = &cs;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_CREATE_SESSION, &resp, NULL);
	if (ret < 0)
		return ret;
	if (resp->create_session->session_id != id) {
		/* A daemon that predates adoption ignored session_id and made
		 * a new session: give it back. */
		uint64_t made = resp->create_session->session_id;

		ret = conn_error(c, -EOPNOTSUPP,
				 "this kvpalaced cannot adopt sessions or make them persistent");
		session_send_close(c, made);
		return ret;
	}
	return 0;
}

KVP_PUBLIC int kvp_session_set_persistent(kvp_session *s, int persistent)
{
	struct kvp_client *c;
	int ret;

	if (!s)
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	return session_own_call(c, s->pool->id, s->id, 1, persistent);
}

/* Reads the page table of the session s (which must hold s->n_tokens
 * tokens, all committed) with SessionPages requests into s->slots (big
 * enough). Returns 0 or a negative errno. */
static int session_fetch_pages(struct kvp_session *s, uint64_t have)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SessionPagesRequest sp = KVPALACE__V1__SESSION_PAGES_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__SessionPagesResponse *r;
	struct kvp_client *c = s->pool->client;
	uint64_t want = pool_pages_for(s->pool, s->n_tokens);
	int ret;

	sp.session_id = s->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_SESSION_PAGES;
	req.session_pages = &sp;
	while (have < want) {
		sp.first_page = have;
		ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_SESSION_PAGES, &resp, NULL);
		if (ret < 0)
			return ret;
		r = resp->session_pages;
		/* Each reply must make progress and stay inside the table. */
		ret = r->first_page == have && r->n_page_slots && r->n_page_slots <= want - have &&
		      r->n_tokens == s->n_tokens && r->committed_tokens == s->committed;
		for (size_t i = 0; ret && i < r->n_page_slots; i++)
			ret = r->page_slots[i] < s->pool->n_pages;
		if (!ret)
			return conn_break(c, -EPROTO,
					  "kvpalaced answered SessionPages from page %llu of %llu "
					  "with %zu slots from page %llu (%llu tokens, %llu "
					  "committed; expected %llu)",
					  (unsigned long long)have, (unsigned long long)want,
					  r->n_page_slots, (unsigned long long)r->first_page,
					  (unsigned long long)r->n_tokens,
					  (unsigned long long)r->committed_tokens,
					  (unsigned long long)s->n_tokens);
		memcpy(s->slots + have, r->page_slots, r->n_page_slots * sizeof(uint32_t));
		have += r->n_page_slots;
	}
	return 0;
}

int session_reload(struct kvp_session *s, uint64_t n_tokens)
{
	/* The table only shrinks: it has room. Device slots belonged to the
	 * old pages; the daemon gave them back. */
	s->n_tokens = s->committed = n_tokens;
	s->compacted = 1;
	free(s->dev_slots);
	s->dev_slots = NULL;
	s->dev_cap = 0;
	return session_fetch_pages(s, 0);
}

int session_adopt(struct kvp_pool *p, struct kvp_session *s, uint64_t id, uint64_t n_tokens,
		  const uint32_t *slots, size_t n_slots, const char *what, int close_on_fail)
{
	struct kvp_client *c = p->client;
	uint64_t pages = pool_pages_for(p, n_tokens);
	int ret;

	s->pool = p;
	s->id = id;
	list_init(&s->link);
	/* A session's pages are distinct slots of the arena: a longer table
	 * is a lie, and a hostile length must not size our allocation. */
	if (pages > p->n_pages || n_slots > pages) {
		ret = conn_break(c, -EPROTO,
				 "kvpalaced's %s of %llu tokens lists %zu pages (the arena has "
				 "%u)",
				 what, (unsigned long long)n_tokens, n_slots, p->n_pages);
		goto fail;
	}
	for (size_t i = 0; i < n_slots; i++) {
		if (slots[i] >= p->n_pages) {
			ret = conn_break(c, -EPROTO, "kvpalaced's %s lists a slot out of the arena",
					 what);
			goto fail;
		}
	}
	if (handle_table_reserve(&s->slots, &s->cap, pages) < 0) {
		ret = conn_error(c, -ENOMEM, "no memory for the page table of a %s", what);
		if (close_on_fail)
			session_send_close(c, id);
		goto fail;
	}
	if (n_slots)
		memcpy(s->slots, slots, n_slots * sizeof(uint32_t));
	s->n_tokens = n_tokens;
	s->committed = n_tokens;
	/* The reply starts the page table; SessionPages brings the rest. */
	ret = session_fetch_pages(s, n_slots);
	if (ret < 0) {
		/* The session exists in the daemon: give it back (one just
		 * made for us; an adopted one is not ours to end). */
		if (close_on_fail)
			session_send_close(c, id);
		goto fail;
	}
	list_add_tail(&p->sessions, &s->link);
	return 0;
fail:
	free(s->slots);
	s->slots = NULL;
	s->cap = 0;
	return ret;
}

KVP_PUBLIC int kvp_session_adopt(kvp_pool *p, uint64_t session_id, kvp_session **ret_session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SessionPagesRequest sp = KVPALACE__V1__SESSION_PAGES_REQUEST__INIT;
	const Kvpalace__V1__SessionPagesResponse *r;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	struct kvp_session *s;
	int ret;

	if (!p || !ret_session || !session_id)
		return -EINVAL;
	c = p->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	/* A second handle of one session would keep a second page table
	 * that the first one's calls do not update. */
	for (struct list *it = p->sessions.next; it != &p->sessions; it = it->next)
		if (list_entry(it, struct kvp_session, link)->id == session_id)
			return conn_error(c, -EEXIST, "this pool handle holds session %llu already",
					  (unsigned long long)session_id);
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	ret = session_own_call(c, p->id, session_id, 0, 0);
	if (ret < 0)
		goto fail;
	/* Its length and the start of its table. */
	sp.session_id = session_id;
	sp.first_page = 0;
	req.op_case = KVPALACE__V1__REQUEST__OP_SESSION_PAGES;
	req.session_pages = &sp;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_SESSION_PAGES, &resp, NULL);
	if (ret < 0)
		goto fail;
	r = resp->session_pages;
	if (r->first_page != 0 || r->committed_tokens > r->n_tokens) {
		ret = conn_break(c, -EPROTO,
				 "kvpalaced answered SessionPages from page 0 with page %llu, "
				 "%llu tokens of which %llu committed",
				 (unsigned long long)r->first_page, (unsigned long long)r->n_tokens,
				 (unsigned long long)r->committed_tokens);
		goto fail;
	}
	if (r->committed_tokens != r->n_tokens) {
		/* The daemon refuses to give it while another client writes;
		 * one that started since cannot be followed from here. */
		ret = conn_error(c, -EBUSY,
				 "another client holds uncommitted tokens of session %llu",
				 (unsigned long long)session_id);
		goto fail;
	}
	ret = session_adopt(p, s, session_id, r->n_tokens, r->page_slots, r->n_page_slots,
			    "adopted session", 0);
	if (ret < 0)
		goto fail;
	*ret_session = s;
	return 0;
fail:
	free(s);
	return ret;
}

/* Sends a Fork or ForkLease request (req, answered by resp_case) of
 * n_tokens in pool p and builds the new session's handle. */
static int fork_common(struct kvp_pool *p, Kvpalace__V1__Request *req, int resp_case,
		       uint64_t n_tokens, kvp_session **ret_session)
{
	struct kvp_client *c = p->client;
	const Kvpalace__V1__ForkResponse *fr;
	Kvpalace__V1__Response *resp;
	struct kvp_session *f;
	int ret;

	/* Everything that can fail here fails before the daemon forks. */
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	if (handle_table_reserve(&f->slots, &f->cap, pool_pages_for(p, n_tokens)) < 0) {
		free(f);
		return -ENOMEM;
	}
	ret = rpc_call(c, req, resp_case, &resp, NULL);
	if (ret < 0)
		goto fail;
	fr = resp_case == KVPALACE__V1__RESPONSE__OP_FORK ? resp->fork : resp->fork_lease;
	if (fr->n_tokens != n_tokens) {
		ret = conn_break(c, -EPROTO, "kvpalaced forked %llu tokens when asked for %llu",
				 (unsigned long long)fr->n_tokens, (unsigned long long)n_tokens);
		goto fail;
	}
	ret = session_adopt(p, f, fr->session_id, n_tokens, fr->page_slots, fr->n_page_slots,
			    "fork", 1);
	if (ret < 0) {
		free(f);
		return ret;
	}
	*ret_session = f;
	return 0;
fail:
	free(f->slots);
	free(f);
	return ret;
}

KVP_PUBLIC int kvp_session_fork(kvp_session *s, uint64_t n_tokens, kvp_session **ret_session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ForkRequest fk = KVPALACE__V1__FORK_REQUEST__INIT;
	struct kvp_client *c;
	int ret;

	if (!s || !ret_session)
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (n_tokens > s->committed)
		return conn_error(c, -ERANGE, "fork at token %llu, but only %llu are committed",
				  (unsigned long long)n_tokens, (unsigned long long)s->committed);
	fk.session_id = s->id;
	fk.n_tokens = n_tokens;
	req.op_case = KVPALACE__V1__REQUEST__OP_FORK;
	req.fork = &fk;
	ret = fork_common(s->pool, &req, KVPALACE__V1__RESPONSE__OP_FORK, n_tokens, ret_session);
	if (ret == 0)
		(*ret_session)->compacted = s->compacted;
	return ret;
}

KVP_PUBLIC int kvp_lease_fork(kvp_lease *l, uint64_t n_tokens, kvp_session **ret_session)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ForkLeaseRequest fk = KVPALACE__V1__FORK_LEASE_REQUEST__INIT;
	struct kvp_client *c;
	int ret;

	if (!l || !ret_session)
		return -EINVAL;
	c = l->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (!l->id)
		return conn_error(c, -ENOENT, "a miss holds no lease to fork");
	if (n_tokens > l->n_tokens)
		return conn_error(c, -ERANGE, "fork at token %llu, but the lease holds %llu",
				  (unsigned long long)n_tokens, (unsigned long long)l->n_tokens);
	fk.lease_id = l->id;
	fk.n_tokens = n_tokens;
	req.op_case = KVPALACE__V1__REQUEST__OP_FORK_LEASE;
	req.fork_lease = &fk;
	return fork_common(l->pool, &req, KVPALACE__V1__RESPONSE__OP_FORK_LEASE, n_tokens,
			   ret_session);
}

/* Checks a Truncate reply to n tokens: the lengths we asked for and, when
 * a slot comes, the new last page, in the arena. Returns 0 or -EPROTO. */
static int session_check_truncate(const struct kvp_session *s,
				  const Kvpalace__V1__TruncateResponse *r, uint64_t n)
{
	const struct kvp_pool *p = s->pool;
	uint64_t pages = pool_pages_for(p, n);

	if (r->n_tokens != n || r->committed_tokens != (s->committed < n ? s->committed : n))
		return -EPROTO;
	if (!r->n_page_slots)
		return 0;
	if (r->n_page_slots != 1 || !pages || !r->has_first_page || r->first_page != pages - 1 ||
	    r->page_slots[0] >= p->n_pages)
		return -EPROTO;
	return 0;
}

KVP_PUBLIC int kvp_truncate(kvp_session *s, uint64_t n_tokens)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__TruncateRequest tr = KVPALACE__V1__TRUNCATE_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__TruncateResponse *r;
	struct kvp_client *c;
	int ret;

	if (!s)
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (n_tokens > s->n_tokens)
		return conn_error(c, -ERANGE, "truncate to %llu tokens, but the session has %llu",
				  (unsigned long long)n_tokens, (unsigned long long)s->n_tokens);
	tr.session_id = s->id;
	tr.n_tokens = n_tokens;
	req.op_case = KVPALACE__V1__REQUEST__OP_TRUNCATE;
	req.truncate = &tr;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_TRUNCATE, &resp, NULL);
	if (ret < 0)
		return ret;
	r = resp->truncate;
	if (session_check_truncate(s, r, n_tokens) < 0)
		return conn_break(c, -EPROTO,
				  "kvpalaced answered a truncate to %llu tokens (%llu committed) "
				  "with %llu tokens, %llu committed and %zu slots from page %llu",
				  (unsigned long long)n_tokens, (unsigned long long)s->committed,
				  (unsigned long long)r->n_tokens,
				  (unsigned long long)r->committed_tokens, r->n_page_slots,
				  (unsigned long long)r->first_page);
	/* The table keeps its capacity; entries past pages_for(n) are unused. */
	if (r->n_page_slots)
		s->slots[r->first_page] = r->page_slots[0];
	s->n_tokens = r->n_tokens;
	s->committed = r->committed_tokens;
	/* The daemon gave back the device slots of the pages that went. */
	for (size_t i = pool_pages_for(s->pool, s->n_tokens); i < s->dev_cap; i++)
		s->dev_slots[i] = SESSION_NO_DEV;
	return 0;
}
