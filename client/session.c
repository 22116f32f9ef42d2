/* client/session.c — creating sessions, reserving slots (Append), writing
 * K/V in place and publishing it (Commit).
 *
 * A token list longer than one request allows is sent as several Append
 * requests, one after the other: Append carries no expected position, so a
 * pipelined chunk that the daemon accepted after refusing the one before it
 * would reserve tokens at the wrong place. Each reply is checked against
 * what we know (its first token must be our reserved length, its slots
 * must cover exactly the new tokens and exist in the arena) before it
 * extends the page table, which is grown before the request is sent so an
 * accepted reservation is never lost to a failed allocation.
 * Not thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdlib.h>

#include "rpc.h"
#include "session.h"

void session_free(struct kvp_session *s)
{
	list_del(&s->link);
	free(s->slots);
	free(s);
}

KVP_PUBLIC int kvp_session_create(kvp_pool *p, kvp_session **ret_session)
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
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	cs.pool_id = p->id;
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
	session_free(s);
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

KVP_PUBLIC int kvp_append(kvp_session *s, const uint32_t *tokens, size_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest ap = KVPALACE__V1__APPEND_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	size_t done = 0;
	int ret;

	if (!s || (!tokens && n))
		return -EINVAL;
	c = s->pool->client;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	if (!n)
		return 0;
	if (n > UINT64_MAX - s->n_tokens)
		return conn_error(c, -EDQUOT, "too many tokens");
	if (pool_table_reserve(&s->slots, &s->cap, pool_pages_for(s->pool, s->n_tokens + n)) < 0)
		return -ENOMEM;
	ap.session_id = s->id;
	req.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	while (done < n) {
		size_t len = n - done < c->chunk_tokens ? n - done : c->chunk_tokens;

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
		done += len;
	}
	return 0;
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

KVP_PUBLIC int kvp_commit(kvp_session *s, uint64_t n)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CommitRequest cm = KVPALACE__V1__COMMIT_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	struct kvp_client *c;
	uint64_t now;
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
	if (!n)
		return 0;
	cm.session_id = s->id;
	cm.n_tokens = n;
	req.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	req.commit = &cm;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_COMMIT, &resp, NULL);
	if (ret < 0)
		return ret;
	now = resp->commit->committed_tokens;
	if (now < s->committed + n || now > s->n_tokens)
		return conn_break(
			c, -EPROTO,
			"kvpalaced reports %llu committed tokens after committing %llu of %llu",
			(unsigned long long)now, (unsigned long long)(s->committed + n),
			(unsigned long long)s->n_tokens);
	s->committed = now;
	return 0;
}
