/* daemon/service/dispatch.c — one request in, one reply out (see dispatch.h).
 *
 * Every id a client presents is looked up in its own tenant's scope: an id
 * of another tenant is "not found". Each handler returns a negative errno
 * and sets a reason on failure; dispatch() turns that into the reply's
 * Status.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin.h"
#include "ckptop.h"
#include "compact.h"
#include "dispatch.h"
#include "evsub.h"
#include "frame.h"
#include "gpu.h"
#include "le.h"
#include "lease.h"
#include "match.h"
#include "polop.h"
#include "pool.h"
#include "prefix_index.h"
#include "session.h"
#include "stats.h"
#include "status.h"
#include "tier.h"
#include "validate.h"

#define KVPD_VERSION_STRING "kvpalaced " KVP_VERSION

static uint32_t pages_for(const struct pool *p, uint64_t n_tokens)
{
	return (uint32_t)((n_tokens + p->layout.block_tokens - 1) / p->layout.block_tokens);
}

/* The tier a request asking for tier `want` (when has_want; host
 * otherwise) is served from in pool p: the GPU when p has a device arena,
 * the host when it asked for the host or allowed falling back to it
 * (or_host). Returns the tier, or -EOPNOTSUPP with the reason in *why:
 * the GPU was asked for and there is none to give. */
/* The chain root of p under a request's salt and extra key (either may
 * be absent; validate_request bounded both). */
static XXH128_hash_t chain_root(const struct pool *p, int has_salt, ProtobufCBinaryData salt,
				int has_extra, ProtobufCBinaryData extra)
{
	if (!has_salt && !has_extra)
		return p->root;
	return prefix_index_root_keyed(p->model_id, &p->layout, has_salt ? salt.data : NULL,
				       has_salt ? salt.len : 0, has_extra ? extra.data : NULL,
				       has_extra ? extra.len : 0);
}

/* A request's key spans (validate_key_spans checked them: at most
 * PREFIX_INDEX_MAX_SPANS) as the index folds them. */
static uint32_t wire_spans(Kvpalace__V1__KeySpan *const *in, size_t n, struct pindex_span *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (struct pindex_span){
			.first_token = in[i]->first_token,
			.n_tokens = in[i]->n_tokens,
			.key = prefix_index_key_digest(in[i]->key.data, in[i]->key.len),
		};
	return (uint32_t)n;
}

static int serve_tier(const struct cache *cache, const struct pool *p, int has_want,
		      Kvpalace__V1__Tier want, int or_host, const char **why)
{
	if (!has_want || want == KVPALACE__V1__TIER__TIER_HOST)
		return KVPALACE__V1__TIER__TIER_HOST;
	if (p->dev.on)
		return KVPALACE__V1__TIER__TIER_GPU;
	if (or_host)
		return KVPALACE__V1__TIER__TIER_HOST;
	*why = gpu_available(cache->gpu) ? "the GPU tier was asked for and this pool has no device "
					   "arena (gpu-pool-size is 0 or too small)"
					 : gpu_status(cache->gpu);
	return -EOPNOTSUPP;
}

static int do_hello(struct cache *cache, struct peer *c, const Kvpalace__V1__HelloRequest *in,
		    struct reply *r, const char **why)
{
	Kvpalace__V1__HelloResponse *out = &r->u.hello;

	if (in->protocol_version != 1) {
		*why = "this daemon speaks protocol version 1";
		return -EPROTONOSUPPORT;
	}
	kvpalace__v1__hello_response__init(out);
	out->protocol_version = 1;
	out->server_version = KVPD_VERSION_STRING;
	out->max_message_bytes = cache->cfg->max_message_bytes;
	out->max_tokens_per_request = config_max_tokens_per_request(cache->cfg);
	out->admin = c->admin;
	out->uid = (uint32_t)c->uid;
	out->has_gpu = 1;
	out->gpu = gpu_available(cache->gpu);
	out->has_match_continues = 1;
	out->match_continues = 1;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_HELLO;
	r->resp.hello = out;
	return 0;
}

static int do_open_pool(struct cache *cache, struct peer *c,
			const Kvpalace__V1__OpenPoolRequest *in, struct reply *r, const char **why)
{
	Kvpalace__V1__OpenPoolResponse *out = &r->u.open_pool;
	struct shm_layout layout;
	struct pool *p;
	int ret;

	ret = validate_layout(in->layout, &layout);
	if (ret < 0)
		return ret; /* validate_request checked it already */
	ret = pool_open(cache, c->uid, in->model_id, &layout, &p);
	if (ret < 0) {
		*why = ret == -EDQUOT	? "too many pools for this user"
		       : ret == -ENOSPC ? "no room for another pool arena in the host tier"
		       : ret == -EMFILE ? "the daemon has no file descriptors left for another pool"
					: "cannot create the pool";
		return ret == -EMFILE ? -EDQUOT : ret;
	}
	r->pass_fd = fcntl(p->arena_fd, F_DUPFD_CLOEXEC, 3);
	if (r->pass_fd < 0) {
		*why = "cannot duplicate the arena descriptor";
		return -EMFILE;
	}
	kvpalace__v1__open_pool_response__init(out);
	out->pool_id = p->id;
	out->page_bytes = p->page_bytes;
	out->n_pages = p->pa.n_pages;
	out->arena_bytes = p->arena_bytes;
	out->arena_offset = 0;
	if (p->dev.on) {
		out->has_device_arena = out->has_device_arena_bytes = out->has_device_n_pages = 1;
		out->device_arena = 1;
		out->device_arena_bytes = p->dev.arena.bytes;
		out->device_n_pages = p->dev.n_pages;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_OPEN_POOL;
	r->resp.open_pool = out;
	return 0;
}

static int do_open_device_arena(struct cache *cache, struct peer *c,
				const Kvpalace__V1__OpenDeviceArenaRequest *in, struct reply *r,
				const char **why)
{
	Kvpalace__V1__OpenDeviceArenaResponse *out = &r->u.open_device_arena;
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	int ret;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	ret = serve_tier(cache, p, 1, KVPALACE__V1__TIER__TIER_GPU, 0, why);
	if (ret < 0)
		return ret;
	kvpalace__v1__open_device_arena_response__init(out);
	out->pool_id = p->id;
	out->arena_bytes = p->dev.arena.bytes;
	out->page_bytes = p->page_bytes;
	out->n_pages = p->dev.n_pages;
	out->handle_type = (Kvpalace__V1__DeviceHandle)gpu_handle_type(cache->gpu);
	out->has_device_uuid = 1;
	out->device_uuid.data = (uint8_t *)gpu_uuid(cache->gpu);
	out->device_uuid.len = GPU_UUID_BYTES;
	if (out->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_POSIX_FD ||
	    out->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_HOST_EMULATED) {
		r->pass_fd = fcntl(p->dev.arena.fd, F_DUPFD_CLOEXEC, 3);
		if (r->pass_fd < 0) {
			*why = "cannot duplicate the device arena descriptor";
			return -EMFILE;
		}
	} else {
		out->has_ipc_handle = 1;
		out->ipc_handle.data = p->dev.arena.ipc;
		out->ipc_handle.len = GPU_IPC_BYTES;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_OPEN_DEVICE_ARENA;
	r->resp.open_device_arena = out;
	return 0;
}

static int do_lease_device(struct cache *cache, struct peer *c,
			   const Kvpalace__V1__LeaseDeviceRequest *in, struct reply *r,
			   struct tier_park *pk, const char **why)
{
	uint64_t fit = reply_fit(cache->cfg->max_message_bytes, 256, 5);
	struct lease *l = lease_get(cache, in->lease_id, c);
	Kvpalace__V1__LeaseDeviceResponse *out;
	struct gpu_lease_slots got;
	uint64_t first_page;
	int ret;

	if (!l) {
		*why = "no such lease";
		return -ENOENT;
	}
	first_page = in->has_first_page ? in->first_page : 0;
	ret = gpu_lease_device(cache, l, first_page, pk, &got, why);
	if (ret < 0)
		return ret;
	out = &r->u.lease_device;
	kvpalace__v1__lease_device_response__init(out);
	out->lease_id = l->id;
	out->first_page = first_page;
	out->device_slots = got.n_slots ? (uint32_t *)got.slots : NULL;
	out->n_device_slots = got.n_slots > fit ? fit : got.n_slots;
	out->copied_pages = got.copied;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_LEASE_DEVICE;
	r->resp.lease_device = out;
	return 0;
}

/* Whether another open connection owns s. Only the owner truncates,
 * closes or adopts a session: a truncate or close under its feet would
 * free pages it still reads through the page table it holds, for another
 * session to take (appends and commits of the tenant's other connections
 * go on under the writer rule: they only add pages). A session nobody
 * owns (persistent, its connection gone) any connection of its tenant may
 * truncate, close or adopt. */
static int owned_elsewhere(const struct session *s, const struct peer *c)
{
	return s->owner && s->owner != &c->sessions;
}

#define OWNED_ELSEWHERE_WHY "another connection owns this session"

/* CreateSession with a session_id: this connection takes over an
 * existing session of its tenant in pool p (a persistent one a dead
 * client left, one an admin restored, or its own to change whether it is
 * persistent). */
static int adopt_session(struct cache *cache, struct peer *c, struct pool *p,
			 const Kvpalace__V1__CreateSessionRequest *in, struct reply *r,
			 const char **why)
{
	struct session *s = session_get(cache, in->session_id, c->uid, 0);

	if (!s || s->pool != p) {
		*why = "no such session in this pool";
		return -ENOENT;
	}
	if (owned_elsewhere(s, c)) {
		/* Sharing between processes goes through the prefix index
		 * (a lease, a fork of it), never through a session in use. */
		*why = OWNED_ELSEWHERE_WHY;
		return -EBUSY;
	}
	if (s->writer && s->writer != c) {
		*why = "another client holds uncommitted tokens of this session";
		return -EBUSY;
	}
	session_own(cache, s, &c->sessions, in->has_persistent ? in->persistent : s->persistent);
	kvpalace__v1__create_session_response__init(&r->u.create_session);
	r->u.create_session.session_id = s->id;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_CREATE_SESSION;
	r->resp.create_session = &r->u.create_session;
	return 0;
}

static int do_create_session(struct cache *cache, struct peer *c,
			     const Kvpalace__V1__CreateSessionRequest *in, struct reply *r,
			     const char **why)
{
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	struct session *s;
	int ret;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	if (in->has_session_id)
		return adopt_session(cache, c, p, in, r, why);
	ret = session_create(
		cache, p,
		chain_root(p, in->has_cache_salt, in->cache_salt, in->has_extra_key, in->extra_key),
		&s);
	if (ret < 0) {
		*why = ret == -EDQUOT ? "too many sessions in this pool" : "cannot create session";
		return ret;
	}
	/* Closed with this connection unless the client keeps it. */
	session_own(cache, s, &c->sessions, in->has_persistent && in->persistent);
	kvpalace__v1__create_session_response__init(&r->u.create_session);
	r->u.create_session.session_id = s->id;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_CREATE_SESSION;
	r->resp.create_session = &r->u.create_session;
	return 0;
}

static int do_close_session(struct cache *cache, struct peer *c,
			    const Kvpalace__V1__CloseSessionRequest *in, struct reply *r,
			    const char **why)
{
	struct session *s = session_get(cache, in->session_id, c->uid, 0);

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	if (owned_elsewhere(s, c)) {
		*why = OWNED_ELSEWHERE_WHY;
		return -EBUSY;
	}
	if (s->writer && s->writer != c) {
		*why = "another client is writing this session";
		return -EBUSY;
	}
	session_close(cache, s);
	kvpalace__v1__close_session_response__init(&r->u.close_session);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_CLOSE_SESSION;
	r->resp.close_session = &r->u.close_session;
	return 0;
}

/* Gives s back the spans it had before an append that failed: the
 * truncate that undid the append cut a span running into its tokens. */
static void undo_spans(struct session *s, uint32_t n, uint64_t last_len)
{
	s->spans.n = n < s->spans.n ? n : s->spans.n;
	if (n && s->spans.n == n)
		s->spans.v[n - 1].n_tokens = last_len;
}

static int do_append(struct cache *cache, struct peer *c, const Kvpalace__V1__AppendRequest *in,
		     struct reply *r, struct tier_park *pk, const char **why)
{
	Kvpalace__V1__AppendResponse *out = &r->u.append;
	struct session *s = session_get(cache, in->session_id, c->uid, 0);
	struct pindex_span spans[PREFIX_INDEX_MAX_SPANS];
	struct session_tag tag;
	uint64_t first, before, last_len = 0, bt_start;
	uint32_t first_page, n_spans, spans_before;
	int tier, ret;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	/* Key spans are checked before anything is reserved and added once
	 * the append can no longer fail: a parked request is run again. */
	n_spans = wire_spans(in->key_spans, in->n_key_spans, spans);
	bt_start = s->n_tokens / s->pool->layout.block_tokens * s->pool->layout.block_tokens;
	ret = session_check_spans(&s->spans, spans, n_spans, bt_start, s->n_tokens + in->n_tokens,
				  why);
	if (ret < 0)
		return ret;
	if (n_spans && s->spans.n + n_spans > SESSION_MAX_SPANS) {
		*why = "a session holds at most 65536 key spans";
		return -EDQUOT;
	}
	spans_before = s->spans.n;
	if (spans_before)
		last_len = s->spans.v[spans_before - 1].n_tokens;
	ret = polop_tag(in->has_role, in->role, in->has_turn, in->turn, in->has_permanent,
			in->permanent, in->has_summary && in->summary, &tag, why);
	if (ret < 0)
		return ret;
	ret = compact_check_summary(s, s->n_tokens, in->n_tokens, tag.flags, why);
	if (ret < 0)
		return ret;
	tier = serve_tier(cache, s->pool, in->has_tier, in->tier, in->or_host, why);
	if (tier < 0)
		return tier;
	before = s->n_tokens;
	ret = session_append(cache, s, c, &c->writing, in->tokens, in->n_tokens, &tag, pk, &first);
	if (ret == -EDQUOT && s->n_tokens + in->n_tokens <= cache->cfg->max_session_tokens) {
		*why = "this client would hold more reserved (uncommitted) pages than "
		       "max-reserved-pages-per-client (commit first), or this user's "
		       "sessions more token slots than max-tenant-tokens";
		return ret;
	}
	if (ret < 0) {
		*why = ret == -EBUSY	? "another client holds uncommitted tokens of this session"
		       : ret == -EDQUOT ? "session would exceed max_session_tokens"
		       : ret == -ENOSPC ? "host tier full: no free pages in this pool"
					: "cannot reserve";
		return ret;
	}
	if (tier == KVPALACE__V1__TIER__TIER_GPU) {
		ret = gpu_session_append(cache, s, first, in->n_tokens, why);
		if (ret < 0 && in->or_host) {
			tier = KVPALACE__V1__TIER__TIER_HOST; /* host slots will do */
		} else if (ret < 0) {
			int copied;

			/* Undo the host reservation: the append fails whole. */
			(void)session_truncate(cache, s, c, before, pk, &copied);
			undo_spans(s, spans_before, last_len);
			return ret;
		}
	}
	ret = prefix_index_spans_add(&s->spans, spans, n_spans, SESSION_MAX_SPANS);
	if (ret < 0) {
		int copied;

		(void)session_truncate(cache, s, c, before, pk, &copied);
		undo_spans(s, spans_before, last_len);
		*why = "out of memory";
		return ret;
	}
	cache_count(cache, s->pool->uid, appended_tokens, in->n_tokens);
	first_page = (uint32_t)(first / s->pool->layout.block_tokens);
	kvpalace__v1__append_response__init(out);
	out->first_token = first;
	out->first_page = first_page;
	out->page_slots = s->pages + first_page;
	out->n_page_slots = pages_for(s->pool, s->n_tokens) - first_page;
	out->has_tier = 1;
	out->tier = (Kvpalace__V1__Tier)tier;
	if (tier == KVPALACE__V1__TIER__TIER_GPU) {
		out->device_slots = s->dev->pages + first_page; /* the append made it */
		out->n_device_slots = out->n_page_slots;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_APPEND;
	r->resp.append = out;
	return 0;
}

static int do_commit(struct cache *cache, struct peer *c, uint64_t req_id,
		     const Kvpalace__V1__CommitRequest *in, struct reply *r, struct tier_park *pk,
		     const char **why)
{
	Kvpalace__V1__CommitResponse *out = &r->u.commit;
	struct session *s = session_get(cache, in->session_id, c->uid, 0);
	uint32_t first, full;
	int ret;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	/* Tokens appended on the GPU come back to their host pages first
	 * (the commit parks until they have; session_commit refuses what
	 * is not this writer's to commit, so only then). */
	if (s->writer == c && in->n_tokens <= s->n_tokens - s->n_committed) {
		ret = gpu_session_sync(cache, s, in->n_tokens, pk, why);
		if (ret < 0)
			return ret;
	}
	/* Nothing changed yet: the commit may wait for the worker that
	 * would compact after it. */
	if (s->writer == c) {
		ret = polop_commit_wait(cache, c, s, in->n_tokens, pk, why);
		if (ret < 0)
			return ret;
	}
	ret = session_commit(cache, s, c, in->n_tokens, &first);
	if (ret < 0) {
		*why = ret == -EBUSY   ? "another client holds this session's reservation"
		       : ret == -E2BIG ? "commit fills more pages than one reply can list: "
					 "commit in smaller steps"
				       : "commit of more tokens than this client reserved";
		return ret == -E2BIG ? -EINVAL : ret;
	}
	cache_count(cache, s->pool->uid, committed_tokens, in->n_tokens);
	pool_warm(cache, s->pool); /* for the next writer, this one is done */
	kvpalace__v1__commit_response__init(out);
	ret = polop_compact_after_commit(cache, c, req_id, s);
	if (ret == -EINPROGRESS)
		return ret;
	if (ret) {
		/* The whole table changed: the client reads it again. */
		out->committed_tokens = s->n_committed;
		out->has_compacted = 1;
		out->compacted = 1;
		r->resp.op_case = KVPALACE__V1__RESPONSE__OP_COMMIT;
		r->resp.commit = out;
		return 0;
	}
	out->committed_tokens = s->n_committed;
	full = (uint32_t)(s->n_committed / s->pool->layout.block_tokens);
	if (full > first) {
		/* The pages this commit filled, with their slots after dedup. */
		out->has_first_page = 1;
		out->first_page = first;
		out->page_slots = s->pages + first;
		out->n_page_slots = full - first;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_COMMIT;
	r->resp.commit = out;
	return 0;
}

/* Slots of a page table that fit in one reply beside a few small fields
 * (a packed slot takes at most 5 bytes). */
static uint64_t slots_that_fit(const struct cache *cache)
{
	return reply_fit(cache->cfg->max_message_bytes, 256, 5);
}

/* Answers a Fork (or a ForkLease when lease) whose work returned ret and,
 * on success, made session f: the reply carries the start of its page
 * table, so a small fork takes one round trip. */
static int fork_done(const struct cache *cache, int ret, const struct session *f, int lease,
		     struct reply *r, const char **why)
{
	if (ret < 0) {
		*why = ret == -ERANGE	? "fork past the tokens the source holds"
		       : ret == -EDQUOT ? "too many sessions in this pool, or this user's sessions "
					  "hold max-tenant-tokens token slots"
		       : ret == -ENOSPC ? "host tier full: no page for the copy of the last page"
					: "cannot fork";
		return ret;
	}
	kvpalace__v1__fork_response__init(&r->u.fork);
	r->u.fork.session_id = f->id;
	r->u.fork.n_tokens = f->n_tokens;
	r->u.fork.page_slots = f->pages;
	r->u.fork.n_page_slots = f->n_pages;
	if (r->u.fork.n_page_slots > slots_that_fit(cache))
		r->u.fork.n_page_slots = slots_that_fit(cache);
	if (lease) {
		r->resp.op_case = KVPALACE__V1__RESPONSE__OP_FORK_LEASE;
		r->resp.fork_lease = &r->u.fork;
	} else {
		r->resp.op_case = KVPALACE__V1__RESPONSE__OP_FORK;
		r->resp.fork = &r->u.fork;
	}
	return 0;
}

static int do_fork(struct cache *cache, struct peer *c, const Kvpalace__V1__ForkRequest *in,
		   struct reply *r, struct tier_park *pk, const char **why)
{
	struct session *s = session_get(cache, in->session_id, c->uid, 0);
	struct session *f = NULL;
	int ret;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	ret = session_fork(cache, s, in->n_tokens, pk, &f);
	if (ret == 0)
		session_own(cache, f, &c->sessions, 0); /* the forker's, not the source's */
	return fork_done(cache, ret, f, 0, r, why);
}

static int do_fork_lease(struct cache *cache, struct peer *c,
			 const Kvpalace__V1__ForkLeaseRequest *in, struct reply *r,
			 struct tier_park *pk, const char **why)
{
	struct lease *l = lease_get(cache, in->lease_id, c);
	struct session *f = NULL;
	int ret;

	if (!l) {
		*why = "no such lease";
		return -ENOENT;
	}
	ret = session_fork_lease(cache, l, in->n_tokens, pk, &f);
	if (ret == 0)
		session_own(cache, f, &c->sessions, 0);
	return fork_done(cache, ret, f, 1, r, why);
}

static int do_truncate(struct cache *cache, struct peer *c, const Kvpalace__V1__TruncateRequest *in,
		       struct reply *r, struct tier_park *pk, const char **why)
{
	Kvpalace__V1__TruncateResponse *out = &r->u.truncate;
	struct session *s = session_get(cache, in->session_id, c->uid, 0);
	int copied, ret;

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	if (owned_elsewhere(s, c)) {
		*why = OWNED_ELSEWHERE_WHY;
		return -EBUSY;
	}
	ret = session_truncate(cache, s, c, in->n_tokens, pk, &copied);
	if (ret < 0) {
		*why = ret == -EBUSY	? "another client holds uncommitted tokens of this session"
		       : ret == -ERANGE ? "truncate past the session's tokens"
		       : ret == -ENOSPC ? "host tier full: no page for the copy of the last page"
					: "cannot truncate";
		return ret;
	}
	kvpalace__v1__truncate_response__init(out);
	out->n_tokens = s->n_tokens;
	out->committed_tokens = s->n_committed;
	if (copied) {
		out->has_first_page = 1;
		out->first_page = s->n_pages - 1;
		out->page_slots = s->pages + s->n_pages - 1;
		out->n_page_slots = 1;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_TRUNCATE;
	r->resp.truncate = out;
	return 0;
}

static int do_session_pages(struct cache *cache, struct peer *c,
			    const Kvpalace__V1__SessionPagesRequest *in, struct reply *r,
			    const char **why)
{
	Kvpalace__V1__SessionPagesResponse *out = &r->u.session_pages;
	struct session *s = session_get(cache, in->session_id, c->uid, 0);
	uint64_t fit = slots_that_fit(cache);

	if (!s) {
		*why = "no such session";
		return -ENOENT;
	}
	if (in->first_page > s->n_pages) {
		*why = "first page past the session's pages";
		return -ERANGE;
	}
	kvpalace__v1__session_pages_response__init(out);
	out->first_page = in->first_page;
	/* An empty session may have no table: NULL + 0 is undefined. */
	out->page_slots = s->n_pages > in->first_page ? s->pages + in->first_page : NULL;
	out->n_page_slots = s->n_pages - in->first_page;
	if (out->n_page_slots > fit)
		out->n_page_slots = fit;
	out->n_tokens = s->n_tokens;
	out->committed_tokens = s->n_committed;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_SESSION_PAGES;
	r->resp.session_pages = out;
	return 0;
}

/* Whether c may pin n more pages under read leases: 0, or -EDQUOT with
 * *why. Checked before a walk, so one request may pass the limits by the
 * pages it matches (at most max-tokens-per-request): its connection's
 * max-leased-pages-per-client, and its user's share of the host tier,
 * whatever the number of its connections and pools (pinned pages are what
 * no fair share can take back, tier.c). */
static int lease_limits(struct cache *cache, const struct peer *c, uint64_t n, const char **why)
{
	if (c->n_leased_pages + n > cache->cfg->max_leased_pages) {
		*why = "this client's leases pin max-leased-pages-per-client pages: release some "
		       "first";
		return -EDQUOT;
	}
	if (!tier_lease_room(cache, c->uid)) {
		*why = "this user's read leases pin its share of the host tier: release some first";
		return -EDQUOT;
	}
	return 0;
}

/* The request's tokens as host uint32s in *ret_tokens: tokens, or
 * tokens_le read in place when the host is little-endian and the bytes
 * 4-aligned (the frame arena aligns them, which is not relied on), else
 * converted into a copy hung off r. On a big-endian host that copy also
 * has room, after the tokens, for the reply's slots in little-endian
 * form (*ret_slots_le; at most one page per bt tokens plus the page the
 * carried tokens complete): taken before anything is pinned, so that
 * nothing fails once the walk is done. validate_request checked the
 * length. Returns 0 or -ENOMEM. */
static int match_tokens(const Kvpalace__V1__MatchPrefixRequest *in, uint32_t bt, struct reply *r,
			const uint32_t **ret_tokens, size_t *ret_n, unsigned char **ret_slots_le)
{
	size_t n = validate_match_tokens(in), room = LE_NATIVE ? 0 : n / bt + 2;
	uint32_t *copy;

	*ret_n = n;
	*ret_slots_le = NULL;
	if (!in->has_tokens_le) {
		*ret_tokens = in->tokens;
		return 0;
	}
	if (LE_NATIVE && ((uintptr_t)in->tokens_le.data & 3) == 0) {
		*ret_tokens = n ? (const uint32_t *)(const void *)in->tokens_le.data : NULL;
		return 0;
	}
	copy = malloc((n + room) * sizeof(uint32_t) + 1);
	if (!copy)
		return -ENOMEM;
	le_get32_array(copy, in->tokens_le.data, n);
	r->heap = copy;
	*ret_tokens = copy;
	if (!LE_NATIVE)
		*ret_slots_le = (unsigned char *)(copy + n);
	return 0;
}

/* Puts the n slots of a match reply in page_slots_le: in place from the
 * lease's table on a little-endian host, else converted into room, which
 * match_tokens sized. */
static void match_slots_le(Kvpalace__V1__MatchPrefixResponse *out, unsigned char *room,
			   const uint32_t *slots, size_t n)
{
	out->has_page_slots_le = 1;
	out->page_slots_le.len = n * 4;
	if (LE_NATIVE || !n) {
		out->page_slots_le.data = (uint8_t *)(uintptr_t)slots;
		return;
	}
	le_put32_array(room, slots, n);
	out->page_slots_le.data = room;
}

/* The pages a new lease makes room for at once: the whole prompt's when
 * the first chunk declares its length (validated against
 * max-session-tokens), but no more than the client may still pin
 * (max-leased-pages-per-client, which one request may pass by its own
 * pages): a declared length reserves nothing it could not use. The room
 * the client's other leases hold counts as pinned here, not only their
 * pinned pages: else every one-page match declaring a long prompt would
 * reserve max-leased-pages of tables anew (4096 leases a connection).
 * The walk over them is only for a prompt longer than this chunk. */
static uint64_t match_reserve_pages(const struct cache *cache, const struct peer *c,
				    const struct pool *p,
				    const Kvpalace__V1__MatchPrefixRequest *in, size_t n_tokens)
{
	uint64_t bt = p->layout.block_tokens;
	uint64_t want = (in->has_prompt_tokens ? in->prompt_tokens : n_tokens) / bt;
	uint64_t room = n_tokens / bt, held = c->n_leased_pages;

	if (want <= room)
		return want;
	for (const struct list *it = c->leases.next; it != &c->leases; it = it->next) {
		const struct lease *l = list_entry(it, struct lease, owner_link);

		held += l->cap_pages > l->n_pages ? l->cap_pages - l->n_pages : 0;
	}
	if (held < cache->cfg->max_leased_pages)
		room += cache->cfg->max_leased_pages - held;
	return want < room ? want : room;
}

/* Lookup: for each query, how much the pool's index holds (match_lookup),
 * changing nothing. One allocation holds the results and the tokens of
 * whichever query needs converting (tokens_le unaligned, or a big-endian
 * host); validate_request bounded both. */
static int do_lookup(struct cache *cache, struct peer *c, const Kvpalace__V1__LookupRequest *in,
		     struct reply *r, const char **why)
{
	Kvpalace__V1__LookupResponse *out = &r->u.lookup;
	const struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	size_t n = in->n_queries, most = 0;
	Kvpalace__V1__LookupResult *res, **ptrs;
	unsigned char *chains;
	uint32_t *copy;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	for (size_t i = 0; i < n; i++)
		if (in->queries[i]->tokens_le.len / 4 > most)
			most = in->queries[i]->tokens_le.len / 4;
	res = malloc(n * (sizeof(*res) + sizeof(*ptrs) + 16) + most * sizeof(uint32_t) + 1);
	if (!res) {
		*why = "out of memory";
		return -ENOMEM;
	}
	r->heap = res;
	ptrs = (Kvpalace__V1__LookupResult **)(res + n);
	copy = (uint32_t *)(ptrs + n);
	chains = (unsigned char *)(copy + most);
	for (size_t i = 0; i < n; i++) {
		const Kvpalace__V1__LookupQuery *q = in->queries[i];
		size_t n_tokens = q->tokens_le.len / 4;
		const uint32_t *tokens = copy;
		struct match_lookup_result lr;
		struct pindex_span spans[PREFIX_INDEX_MAX_SPANS];
		uint32_t n_spans = wire_spans(q->key_spans, q->n_key_spans, spans);
		XXH128_hash_t root;

		if (q->has_chain)
			root = (XXH128_hash_t){.low64 = le_get64(q->chain.data),
					       .high64 = le_get64(q->chain.data + 8)};
		else
			root = chain_root(p, q->has_cache_salt, q->cache_salt, q->has_extra_key,
					  q->extra_key);
		if (LE_NATIVE && ((uintptr_t)q->tokens_le.data & 3) == 0)
			tokens = (const uint32_t *)(const void *)q->tokens_le.data;
		else
			le_get32_array(copy, q->tokens_le.data, n_tokens);
		match_lookup(p, root, n_tokens ? tokens : NULL, n_tokens,
			     q->has_first_token ? q->first_token : 0, spans, n_spans, &lr);
		kvpalace__v1__lookup_result__init(&res[i]);
		res[i].matched_tokens = lr.matched_tokens;
		res[i].host_tokens = lr.host_tokens;
		res[i].complete = lr.complete;
		if (!lr.complete) {
			le_put64(chains + 16 * i, lr.chain.low64);
			le_put64(chains + 16 * i + 8, lr.chain.high64);
			res[i].has_chain = 1;
			res[i].chain.data = chains + 16 * i;
			res[i].chain.len = 16;
		}
		ptrs[i] = &res[i];
	}
	kvpalace__v1__lookup_response__init(out);
	out->n_results = n;
	out->results = ptrs;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_LOOKUP;
	r->resp.lookup = out;
	return 0;
}

/* One chunk of a match: the first when lease_id is 0, else a later one
 * extending that lease (named by the request or continued, see
 * match_prefix). */
static int do_match_prefix(struct cache *cache, struct peer *c,
			   const Kvpalace__V1__MatchPrefixRequest *in, uint64_t lease_id,
			   struct reply *r, struct tier_park *pk, const char **why)
{
	Kvpalace__V1__MatchPrefixResponse *out = &r->u.match_prefix;
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	struct match_result mr;
	struct lease *l = NULL;
	struct pindex_span spans[PREFIX_INDEX_MAX_SPANS];
	uint32_t n_spans = wire_spans(in->key_spans, in->n_key_spans, spans), spans_before;
	uint64_t before = 0, queried_before = 0, queried;
	uint32_t pages_before = 0;
	const uint32_t *tokens;
	unsigned char *slots_le;
	size_t n_tokens;
	int tier, ret;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	if (match_tokens(in, p->layout.block_tokens, r, &tokens, &n_tokens, &slots_le) < 0) {
		*why = "out of memory";
		return -ENOMEM;
	}
	/* Before anything is pinned: a GPU match without a GPU is refused
	 * whole unless the host will do. */
	tier = serve_tier(cache, p, in->has_tier, in->tier, in->or_host, why);
	if (tier < 0)
		return tier;
	if (lease_id) {
		/* A later chunk of a long token list. */
		l = lease_get(cache, lease_id, c);
		if (!l || l->pool != p) {
			*why = "no such lease in this pool";
			return -ENOENT;
		}
		ret = l->complete ? 0 : lease_limits(cache, c, 1, why);
		if (ret < 0)
			return ret;
		/* The chunk's spans join the lease's before its walk (a
		 * parked or failed request leaves them as they were). */
		spans_before = l->spans.n;
		ret = l->complete ? 0
				  : session_check_spans(&l->spans, spans, n_spans, l->n_tokens,
							l->n_tokens + l->n_carry + n_tokens, why);
		if (ret < 0)
			return ret;
		if (!l->complete &&
		    prefix_index_spans_add(&l->spans, spans, n_spans, SESSION_MAX_SPANS) < 0) {
			*why = "too many key spans in this match, or out of memory";
			return -ENOMEM;
		}
		if (!pk->no_park && !l->complete &&
		    match_prefetch(cache, p, l->chain, l->carry, l->n_carry, tokens, n_tokens,
				   l->n_tokens, l->spans.v, l->spans.n, pk)) {
			l->spans.n = spans_before;
			pk->park_on = p; /* pages are coming from disk */
			return -EAGAIN;
		}
		before = l->n_tokens;
		pages_before = l->n_pages;
		queried_before = l->queried_tokens;
		ret = match_extend(cache, l, tokens, n_tokens, &mr);
		if (ret < 0)
			l->spans.n = spans_before;
	} else {
		XXH128_hash_t root = chain_root(p, in->has_cache_salt, in->cache_salt,
						in->has_extra_key, in->extra_key);
		struct pindex_spans none = {0};

		ret = session_check_spans(&none, spans, n_spans, 0, n_tokens, why);
		if (ret < 0)
			return ret;
		if (c->n_leases >= cache->cfg->max_leases_per_conn) {
			*why = "too many leases held by this client";
			return -EDQUOT;
		}
		ret = lease_limits(cache, c, 1, why);
		if (ret < 0)
			return ret;
		if (!pk->no_park && match_prefetch(cache, p, root, NULL, 0, tokens, n_tokens, 0,
						   spans, n_spans, pk)) {
			pk->park_on = p; /* pages are coming from disk */
			return -EAGAIN;
		}
		ret = match_start(cache, p, root, c, &c->leases, tokens, n_tokens, spans, n_spans,
				  match_reserve_pages(cache, c, p, in, n_tokens), &l, &mr);
		if (ret == 1)
			c->n_leases++;
		if (ret == 0)
			cache_count(cache, p->uid, match_misses, 1); /* no page at all: no lease */
	}
	if (ret >= 0 && l && !l->counted && (l->n_tokens || l->complete)) {
		/* A match counts once, when its first page is found or when
		 * it is known to have found none. */
		l->counted = 1;
		cache_count(cache, l->pool->uid, match_hits, l->n_tokens > 0);
		cache_count(cache, l->pool->uid, match_misses, l->n_tokens == 0);
	}
	if (ret < 0) {
		*why = "cannot pin the matched pages";
		return ret;
	}
	/* The tokens asked and the whole pages they fill, what the hit ratios
	 * divide by: the whole prompt when the first chunk says how long it is
	 * (a client sends no more chunks once a match stopped), counted over
	 * the chunks of one match so a chunk boundary inside a page loses
	 * none. Never less than the chunks brought, so no claim makes the
	 * ratio pass 100 %, and a total that only grows. */
	if (l) {
		if (!lease_id)
			l->declared_tokens = in->has_prompt_tokens ? in->prompt_tokens : 0;
		l->received_tokens += n_tokens;
		queried = l->declared_tokens > l->received_tokens ? l->declared_tokens
								  : l->received_tokens;
		if (queried < l->queried_tokens)
			queried = l->queried_tokens;
		l->queried_tokens = queried;
	} else {
		queried = in->has_prompt_tokens && in->prompt_tokens > n_tokens ? in->prompt_tokens
										: n_tokens;
	}
	cache_count(cache, p->uid, queried_tokens, queried - queried_before);
	cache_count(cache, p->uid, queried_pages,
		    queried / p->layout.block_tokens - queried_before / p->layout.block_tokens);
	if (l) {
		c->n_leased_pages += l->n_pages - pages_before;
		cache_count(cache, p->uid, matched_pages, l->n_pages - pages_before);
	}
	kvpalace__v1__match_prefix_response__init(out);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX;
	r->resp.match_prefix = out;
	out->has_tier = 1;
	out->tier = (Kvpalace__V1__Tier)tier;
	if (!l) {
		out->complete = 1; /* a miss: no lease */
		return 0;
	}
	cache_count(cache, l->pool->uid, matched_tokens, l->n_tokens - before);
	out->lease_id = l->id;
	out->matched_tokens = l->n_tokens;
	out->first_page = mr.first_page;
	out->complete = l->complete;
	if (in->has_tokens_le) {
		match_slots_le(out, slots_le, mr.slots, mr.n_slots);
		return 0;
	}
	out->page_slots = (uint32_t *)mr.slots;
	out->n_page_slots = mr.n_slots;
	return 0;
}

/* A later chunk sent with continues, after a first chunk that matched
 * nothing: a miss as well. The tokens the first chunk declared are
 * counted already; more than it declared are counted now, as chunks
 * without a declared length are. */
static int match_continued_miss(struct cache *cache, struct peer *c,
				const Kvpalace__V1__MatchPrefixRequest *in, struct reply *r,
				const char **why)
{
	Kvpalace__V1__MatchPrefixResponse *out = &r->u.match_prefix;
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	uint64_t n = validate_match_tokens(in), extra;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	extra = n > c->match_prev_left ? n - c->match_prev_left : 0;
	c->match_prev_left -= n - extra;
	cache_count(cache, p->uid, queried_tokens, extra);
	cache_count(cache, p->uid, queried_pages, extra / p->layout.block_tokens);
	kvpalace__v1__match_prefix_response__init(out);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX;
	r->resp.match_prefix = out;
	out->has_tier = 1;
	out->tier = KVPALACE__V1__TIER__TIER_HOST;
	out->complete = 1;
	return 0;
}

/* MatchPrefix: a first chunk, or a later one naming its lease or saying
 * it continues the connection's last first chunk, whose outcome the peer
 * remembers for that (a parked first chunk has none yet: its later
 * chunks wait behind it). */
static int match_prefix(struct cache *cache, struct peer *c,
			const Kvpalace__V1__MatchPrefixRequest *in, struct reply *r,
			struct tier_park *pk, const char **why)
{
	int ret;

	if (in->has_lease_id)
		return do_match_prefix(cache, c, in, in->lease_id, r, pk, why);
	if (in->continues) {
		switch (c->match_prev) {
		case MATCH_PREV_LEASE:
			ret = do_match_prefix(cache, c, in, c->match_prev_lease, r, pk, why);
			if (ret == -ENOENT)
				*why = "the lease of the MatchPrefix this chunk continues is gone";
			return ret;
		case MATCH_PREV_MISS:
			return match_continued_miss(cache, c, in, r, why);
		default:
			*why = "no MatchPrefix to continue: none sent before, or it failed";
			return -EINVAL;
		}
	}
	ret = do_match_prefix(cache, c, in, 0, r, pk, why);
	if (ret == -EAGAIN)
		return ret;
	c->match_prev = MATCH_PREV_NONE;
	if (ret < 0)
		return ret;
	if (r->u.match_prefix.lease_id) {
		c->match_prev = MATCH_PREV_LEASE;
		c->match_prev_lease = r->u.match_prefix.lease_id;
	} else {
		uint64_t n = validate_match_tokens(in);

		c->match_prev = MATCH_PREV_MISS;
		c->match_prev_left =
			in->has_prompt_tokens && in->prompt_tokens > n ? in->prompt_tokens - n : 0;
	}
	return ret;
}

static int do_prefetch(struct cache *cache, struct peer *c, const Kvpalace__V1__PrefetchRequest *in,
		       struct reply *r, struct tier_park *pk, const char **why)
{
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	struct pindex_span spans[PREFIX_INDEX_MAX_SPANS];
	uint32_t n_spans = wire_spans(in->key_spans, in->n_key_spans, spans);
	XXH128_hash_t root;
	int tier;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	/* Pages come to the host tier; a GPU prefetch leaves the device copy
	 * to the LeaseDevice after the match (it needs a lease to hold it). */
	tier = serve_tier(cache, p, in->has_tier, in->tier, in->or_host, why);
	if (tier < 0)
		return tier;
	root = chain_root(p, in->has_cache_salt, in->cache_salt, in->has_extra_key, in->extra_key);
	kvpalace__v1__prefetch_response__init(&r->u.prefetch);
	r->u.prefetch.pages_coming = match_prefetch(cache, p, root, NULL, 0, in->tokens,
						    in->n_tokens, 0, spans, n_spans, pk);
	r->u.prefetch.has_tier = 1;
	r->u.prefetch.tier = KVPALACE__V1__TIER__TIER_HOST;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_PREFETCH;
	r->resp.prefetch = &r->u.prefetch;
	return 0;
}

static int do_release(struct cache *cache, struct peer *c, const Kvpalace__V1__ReleaseRequest *in,
		      struct reply *r, const char **why)
{
	struct lease *l = lease_get(cache, in->lease_id, c);

	if (!l) {
		*why = "no such lease";
		return -ENOENT;
	}
	c->n_leased_pages -= l->n_pages;
	lease_release(cache, l);
	c->n_leases--;
	kvpalace__v1__release_response__init(&r->u.release);
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_RELEASE;
	r->resp.release = &r->u.release;
	return 0;
}

/* AdoptLease: a new lease of c's pinning the pages another lease of the
 * same user holds (proto: AdoptLeaseRequest). The source may belong to
 * any connection of the user, c's own included; its pages so far are
 * taken, none of its unfinished match state, so the new lease is
 * complete. Nothing is counted as a hit or a query again. */
static int do_adopt_lease(struct cache *cache, struct peer *c,
			  const Kvpalace__V1__AdoptLeaseRequest *in, struct reply *r,
			  const char **why)
{
	Kvpalace__V1__AdoptLeaseResponse *out = &r->u.adopt_lease;
	struct pool *p = pool_get(cache, in->pool_id, c->uid, 0);
	const struct lease *src = idmap_get(&cache->leases, in->lease_id);
	uint32_t bt, n;
	uint64_t now, fit = slots_that_fit(cache);
	struct lease *l = NULL;
	int ret;

	if (!p) {
		*why = "no such pool";
		return -ENOENT;
	}
	/* pool_get checked the user: a lease of p is the caller's user's. */
	if (!src || src->pool != p) {
		*why = "no such lease in this pool";
		return -ENOENT;
	}
	n = src->n_pages;
	if (c->n_leases >= cache->cfg->max_leases_per_conn) {
		*why = "too many leases held by this client";
		return -EDQUOT;
	}
	ret = lease_limits(cache, c, n, why);
	if (ret < 0)
		return ret;
	bt = p->layout.block_tokens;
	ret = lease_create(cache, p, c, &c->leases, &l);
	if (ret == 0)
		ret = lease_reserve(l, n);
	/* The key spans of the pages taken: a session forked from the new
	 * lease hashes its later pages with them. */
	if (ret == 0)
		ret = prefix_index_spans_copy(&l->spans, src->spans.v, src->spans.n,
					      (uint64_t)n * bt);
	if (ret < 0) {
		lease_release(cache, l);
		*why = "out of memory";
		return ret;
	}
	now = prefix_index_now_ns();
	for (uint32_t i = 0; i < n; i++) {
		/* Cannot fail: the tables have room for n pages. */
		ret = lease_add_page(l, src->pages[i], src->hashes[i],
				     src->tokens + (uint64_t)i * bt, now);
		kvp_assert(ret == 0);
	}
	l->root = src->root;
	l->chain = src->chain;
	l->n_tokens = (uint64_t)n * bt;
	l->complete = 1;
	l->counted = 1;
	l->purged = src->purged;
	c->n_leases++;
	c->n_leased_pages += n;

	kvpalace__v1__adopt_lease_response__init(out);
	out->lease_id = l->id;
	out->matched_tokens = l->n_tokens;
	out->page_slots = n ? l->pages : NULL;
	out->n_page_slots = n < fit ? n : fit;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_ADOPT_LEASE;
	r->resp.adopt_lease = out;
	return 0;
}

/* LeasePages: the slots of one of c's leases from first_page on. */
static int do_lease_pages(struct cache *cache, struct peer *c,
			  const Kvpalace__V1__LeasePagesRequest *in, struct reply *r,
			  const char **why)
{
	Kvpalace__V1__LeasePagesResponse *out = &r->u.lease_pages;
	struct lease *l = lease_get(cache, in->lease_id, c);
	uint64_t fit = slots_that_fit(cache);

	if (!l) {
		*why = "no such lease";
		return -ENOENT;
	}
	if (in->first_page > l->n_pages) {
		*why = "first page past the lease's pages";
		return -ERANGE;
	}
	kvpalace__v1__lease_pages_response__init(out);
	out->first_page = in->first_page;
	out->page_slots = l->n_pages > in->first_page ? l->pages + in->first_page : NULL;
	out->n_page_slots = l->n_pages - in->first_page;
	if (out->n_page_slots > fit)
		out->n_page_slots = fit;
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_LEASE_PAGES;
	r->resp.lease_pages = out;
	return 0;
}

static int do_list_sessions(struct cache *cache, struct peer *c,
			    const Kvpalace__V1__ListSessionsRequest *in, struct reply *r,
			    const char **why)
{
	/* A page is bounded whatever the client asks: the reply's length and
	 * the loop's time with it. */
	uint32_t limit = !in->has_limit || in->limit > STATS_LIST_MAX ? STATS_LIST_MAX : in->limit;
	int ret;

	kvpalace__v1__list_sessions_response__init(&r->u.list_sessions);
	ret = stats_list_sessions(cache, c->uid, c->admin, in->has_pool_id ? in->pool_id : 0,
				  in->has_after_id ? in->after_id : 0, limit,
				  cache->cfg->max_message_bytes, &r->u.list_sessions, &r->heap);
	if (ret < 0) {
		*why = "cannot list sessions";
		return ret;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_LIST_SESSIONS;
	r->resp.list_sessions = &r->u.list_sessions;
	return 0;
}

static int do_stats(struct cache *cache, struct peer *c, struct reply *r, const char **why)
{
	int ret;

	kvpalace__v1__stats_response__init(&r->u.stats);
	ret = stats_fill(cache, c->uid, c->admin, cache->cfg->max_message_bytes, &r->u.stats,
			 &r->heap);
	if (ret < 0) {
		*why = "cannot gather statistics";
		return ret;
	}
	r->resp.op_case = KVPALACE__V1__RESPONSE__OP_STATS;
	r->resp.stats = &r->u.stats;
	return 0;
}

static int run(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req,
	       struct reply *r, struct tier_park *pk, const char **why)
{
	struct validate_limits lim = {
		.max_tokens_per_request = config_max_tokens_per_request(cache->cfg),
		.max_prompt_tokens = cache->cfg->max_session_tokens,
	};
	int ret = validate_request(req, &lim, why);

	if (ret < 0)
		return ret;
	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_CHECKPOINT:
		return ckptop_checkpoint(cache, c, req->id, req->checkpoint, why);
	case KVPALACE__V1__REQUEST__OP_RESTORE:
		return ckptop_restore(cache, c, req->id, req->restore, why);
	case KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS:
		return ckptop_list(cache, c, req->id, req->list_checkpoints, why);
	case KVPALACE__V1__REQUEST__OP_DELETE_CHECKPOINT:
		return ckptop_remove(cache, c, req->id, req->delete_checkpoint, why);
	case KVPALACE__V1__REQUEST__OP_WARMUP:
		if (!c->admin) {
			*why = "an admin operation: only the admin socket serves it";
			return -EPERM;
		}
		return ckptop_warmup(cache, c, req->id, req->warmup, why);
	default:
		break;
	}
	if (polop_is_policy_op(req->op_case) && !c->admin)
		return polop_run(cache, c, req, r, pk, why);
	if (admin_is_admin_op(req->op_case)) {
		if (!c->admin) {
			*why = "an admin operation: only the admin socket serves it";
			return -EPERM;
		}
		return admin_run(cache, c, req, r, pk, why);
	}
	if (c->admin && req->op_case != KVPALACE__V1__REQUEST__OP_HELLO &&
	    req->op_case != KVPALACE__V1__REQUEST__OP_STATS &&
	    req->op_case != KVPALACE__V1__REQUEST__OP_LIST_SESSIONS &&
	    req->op_case != KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS) {
		*why = "the admin socket serves admin operations only";
		return -EPERM;
	}
	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_HELLO:
		return do_hello(cache, c, req->hello, r, why);
	case KVPALACE__V1__REQUEST__OP_OPEN_POOL:
		return do_open_pool(cache, c, req->open_pool, r, why);
	case KVPALACE__V1__REQUEST__OP_CREATE_SESSION:
		return do_create_session(cache, c, req->create_session, r, why);
	case KVPALACE__V1__REQUEST__OP_CLOSE_SESSION:
		return do_close_session(cache, c, req->close_session, r, why);
	case KVPALACE__V1__REQUEST__OP_APPEND:
		return do_append(cache, c, req->append, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_COMMIT:
		return do_commit(cache, c, req->id, req->commit, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_MATCH_PREFIX:
		return match_prefix(cache, c, req->match_prefix, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_LOOKUP:
		return do_lookup(cache, c, req->lookup, r, why);
	case KVPALACE__V1__REQUEST__OP_RELEASE:
		return do_release(cache, c, req->release, r, why);
	case KVPALACE__V1__REQUEST__OP_ADOPT_LEASE:
		return do_adopt_lease(cache, c, req->adopt_lease, r, why);
	case KVPALACE__V1__REQUEST__OP_LEASE_PAGES:
		return do_lease_pages(cache, c, req->lease_pages, r, why);
	case KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS:
		return evsub_subscribe(cache, c, req->subscribe_events, r, why);
	case KVPALACE__V1__REQUEST__OP_PREFETCH:
		return do_prefetch(cache, c, req->prefetch, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_STATS:
		return do_stats(cache, c, r, why);
	case KVPALACE__V1__REQUEST__OP_FORK:
		return do_fork(cache, c, req->fork, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_FORK_LEASE:
		return do_fork_lease(cache, c, req->fork_lease, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_TRUNCATE:
		return do_truncate(cache, c, req->truncate, r, pk, why);
	case KVPALACE__V1__REQUEST__OP_SESSION_PAGES:
		return do_session_pages(cache, c, req->session_pages, r, why);
	case KVPALACE__V1__REQUEST__OP_LIST_SESSIONS:
		return do_list_sessions(cache, c, req->list_sessions, r, why);
	case KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA:
		return do_open_device_arena(cache, c, req->open_device_arena, r, why);
	case KVPALACE__V1__REQUEST__OP_LEASE_DEVICE:
		return do_lease_device(cache, c, req->lease_device, r, pk, why);
	default:
		*why = "unknown operation";
		return -EPROTO;
	}
}

int dispatch(struct cache *cache, struct peer *c, const Kvpalace__V1__Request *req, int no_park,
	     struct reply *r)
{
	/* This request's own: whether it may wait, and on which pool. */
	struct tier_park pk = {.no_park = no_park};
	const char *why = "failed";
	int ret;

	memset(r, 0, sizeof(*r));
	kvpalace__v1__response__init(&r->resp);
	r->pass_fd = -1;
	r->resp.id = req->id;
	/* Its latency runs from its first dispatch, through its parks (it
	 * is the next request its peer dispatches) and its ticket, to its
	 * reply. */
	c->cache = cache;
	c->timing.op = stats_op_index(req->op_case);
	if (c->parked_ns && c->parked_id == req->id)
		c->timing.start_ns = c->parked_ns;
	else
		c->timing.start_ns = c->turn_ns ? c->turn_ns : clock_now_ns();
	c->parked_ns = 0;
	c->turn_ns = 0; /* until this one is answered */
	ret = run(cache, c, req, r, &pk, &why);
	if (ret == -EINPROGRESS)
		return ret; /* a worker does it; the reply comes through a ticket */
	if (ret == -EAGAIN && pk.park_on) {
		/* Nothing changed: the request runs again once the pool's
		 * disk I/O made progress. */
		r->park = pk.park_on;
		if (r->pass_fd >= 0)
			close(r->pass_fd);
		r->pass_fd = -1;
		c->parked_ns = c->timing.start_ns;
		c->parked_id = req->id;
		return -EAGAIN;
	}
	if (ret < 0) {
		/* A failed handler may have set a partial op: send none. */
		r->resp.op_case = KVPALACE__V1__RESPONSE__OP__NOT_SET;
		r->resp.status = status_from_errno(ret);
		r->resp.error = (char *)why;
		if (r->pass_fd >= 0)
			close(r->pass_fd);
		r->pass_fd = -1;
	}
	/* The caller queues the reply now. */
	c->turn_ns = clock_now_ns();
	if (c->timing.op >= 0)
		cache_latency_add(cache, c->uid, (unsigned int)c->timing.op,
				  c->turn_ns - c->timing.start_ns);
	return 0;
}

void dispatch_peer_gone(struct peer *c)
{
	if (c->cache)
		evsub_gone(c->cache, c);
	admin_peer_gone(c);
}
