/* tests/fuzz/gen_corpus.c — writes the seed corpora of the fuzz targets.
 *
 *   <build>/tests/fuzz/fuzz_gen_corpus tests/fuzz/corpus
 *
 * writes (overwriting files of the same names, leaving others such as
 * crash reproducers alone) corpus/fuzz_request/req-*, corpus/fuzz_conn/
 * conn-*, corpus/fuzz_ckpt/ckpt-* and corpus/fuzz_spill/spill-*: valid
 * inputs of every kind, built
 * with the daemon's own encoders (frame_pack_sized, ckpt_write,
 * spill_hdr_encode), and invalid ones next to them. Deterministic: the
 * same tree writes the same bytes. Input formats: fuzz.h.
 *
 * Requests: each file starts from a fresh daemon state (FUZZ_REQ_FRESH),
 * so ids are predictable: every pool, session and lease takes the next
 * of 1, 2, 3, ... in the order they are created, under the first
 * tenant's tag (id_of). Scenarios are datagrams
 * of many frames; FUZZ_REQUEST_VERBOSE=1 with fuzz_request_replay shows
 * what each request got back.
 *
 * Connections: each file is a script of client actions (fuzz.h) that
 * starts from a fresh daemon, so the same ids hold; FUZZ_CONN_VERBOSE=1
 * with fuzz_conn_replay shows each action and reply.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt.h"
#include "frame.h"
#include "fuzz.h"
#include "le.h"
#include "spill.h"

static const char *root_dir;
static int n_written;

static void fail(const char *what)
{
	fprintf(stderr, "gen_corpus: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Writes corpus/<target>/<name>: head (head_len bytes) then body. */
static void emit(const char *target, const char *name, const void *head, size_t head_len,
		 const void *body, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root_dir, target);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		fail(path);
	snprintf(path, sizeof(path), "%s/%s/%s", root_dir, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(head, 1, head_len, f) != head_len ||
	    (len && fwrite(body, 1, len, f) != len) || fclose(f))
		fail(path);
	n_written++;
}

/* ---- fuzz_request --------------------------------------------------------- */

struct dgram {
	unsigned char buf[FRAME_MAX_MAX_BYTES + 4096];
	size_t len;
	uint64_t next_id;
};

static void dg_reset(struct dgram *d)
{
	d->len = 0;
	d->next_id = 0;
}

/* Appends a frame holding req, numbered in order. */
static void dg_add(struct dgram *d, Kvpalace__V1__Request *req)
{
	size_t n;

	req->id = ++d->next_id;
	n = frame_packed_bytes(&req->base);
	if (d->len + n > sizeof(d->buf)) {
		fprintf(stderr, "gen_corpus: datagram too long\n");
		exit(1);
	}
	frame_pack_sized(&req->base, n, d->buf + d->len);
	d->len += n;
}

/* The id of the n-th object (pool, session, lease) a fresh daemon makes
 * for its first tenant: the tenant's tag (1) above bit 40, then its own
 * counter (cache_new_id in daemon/core/cache.c). 0 stays 0: "not given". */
static uint64_t id_of(uint64_t n)
{
	return n ? 1ull << 40 | n : 0;
}

static void dg_raw(struct dgram *d, const void *bytes, size_t n)
{
	memcpy(d->buf + d->len, bytes, n);
	d->len += n;
}

static void emit_req(const char *name, unsigned int flags, const struct dgram *d)
{
	unsigned char f = (unsigned char)(flags | FUZZ_REQ_FRESH);

	emit("fuzz_request", name, &f, 1, d->buf, d->len);
}

/* 2 layers, 2 KV heads, head_dim 64, 16 tokens per page, f16: 16 KiB
 * pages, 64 in a 1 MiB pool. */
static Kvpalace__V1__Layout layout_f16(void)
{
	Kvpalace__V1__Layout l = KVPALACE__V1__LAYOUT__INIT;

	l.n_layers = 2;
	l.n_kv_heads = 2;
	l.head_dim = 64;
	l.block_tokens = 16;
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	return l;
}

/* 1 layer, 1 KV head, head_dim 8, 4 tokens per page: 4 KiB pages, 256. */
static Kvpalace__V1__Layout layout_tiny(void)
{
	Kvpalace__V1__Layout l = KVPALACE__V1__LAYOUT__INIT;

	l.n_layers = 1;
	l.n_kv_heads = 1;
	l.head_dim = 8;
	l.block_tokens = 4;
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
	return l;
}

static Kvpalace__V1__Layout layout_quant(Kvpalace__V1__DType dtype, uint32_t group)
{
	Kvpalace__V1__Layout l = layout_f16();

	l.dtype = dtype;
	l.has_quant_group = 1;
	l.quant_group = group;
	return l;
}

static uint32_t tok[FRAME_MAX_MAX_BYTES / 4];

static void fill_tokens(uint32_t seed, size_t n)
{
	for (size_t i = 0; i < n; i++)
		tok[i] = (uint32_t)(seed * 7919u + i * 31u) % 50000u;
}

/* One builder per operation. */
static void r_hello(struct dgram *d, uint32_t version)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__HelloRequest m = KVPALACE__V1__HELLO_REQUEST__INIT;

	m.protocol_version = version;
	m.client_name = "fuzz-seed";
	q.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	q.hello = &m;
	dg_add(d, &q);
}

static void r_open_pool(struct dgram *d, const char *model, Kvpalace__V1__Layout l)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenPoolRequest m = KVPALACE__V1__OPEN_POOL_REQUEST__INIT;

	m.model_id = (char *)model;
	m.layout = &l;
	q.op_case = KVPALACE__V1__REQUEST__OP_OPEN_POOL;
	q.open_pool = &m;
	dg_add(d, &q);
}

static void r_create_session(struct dgram *d, uint64_t pool, const char *salt)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest m = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;

	m.pool_id = id_of(pool);
	if (salt) {
		m.has_cache_salt = 1;
		m.cache_salt.data = (uint8_t *)salt;
		m.cache_salt.len = strlen(salt);
	}
	q.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	q.create_session = &m;
	dg_add(d, &q);
}

static void r_close_session(struct dgram *d, uint64_t session)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CloseSessionRequest m = KVPALACE__V1__CLOSE_SESSION_REQUEST__INIT;

	m.session_id = id_of(session);
	q.op_case = KVPALACE__V1__REQUEST__OP_CLOSE_SESSION;
	q.close_session = &m;
	dg_add(d, &q);
}

static void r_append(struct dgram *d, uint64_t session, uint32_t seed, size_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest m = KVPALACE__V1__APPEND_REQUEST__INIT;

	fill_tokens(seed, n);
	m.session_id = id_of(session);
	m.tokens = tok;
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	q.append = &m;
	dg_add(d, &q);
}

static void r_commit(struct dgram *d, uint64_t session, uint64_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CommitRequest m = KVPALACE__V1__COMMIT_REQUEST__INIT;

	m.session_id = id_of(session);
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_COMMIT;
	q.commit = &m;
	dg_add(d, &q);
}

/* lease 0: a first chunk; salt NULL: none. */
static void r_match(struct dgram *d, uint64_t pool, uint32_t seed, size_t n, uint64_t lease,
		    const char *salt)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	m.tokens = tok;
	m.n_tokens = n;
	m.has_lease_id = lease != 0;
	m.lease_id = id_of(lease);
	if (salt) {
		m.has_cache_salt = 1;
		m.cache_salt.data = (uint8_t *)salt;
		m.cache_salt.len = strlen(salt);
	}
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

/* A later chunk of seed's token list, from token `from` on. */
static void r_match_chunk(struct dgram *d, uint64_t pool, uint32_t seed, size_t from, size_t n,
			  uint64_t lease)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	fill_tokens(seed, from + n);
	m.pool_id = id_of(pool);
	m.tokens = tok + from;
	m.n_tokens = n;
	m.has_lease_id = 1;
	m.lease_id = id_of(lease);
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

/* Puts seed's tokens from..from+n in m as tokens_le bytes, for pool. */
static void match_le_set(Kvpalace__V1__MatchPrefixRequest *m, uint64_t pool, uint32_t seed,
			 size_t from, size_t n)
{
	static uint8_t le[4 * 4096];

	fill_tokens(seed, from + n);
	for (size_t i = 0; i < n && i < 4096; i++)
		le_put32(le + 4 * i, tok[from + i]);
	m->pool_id = id_of(pool);
	m->has_tokens_le = 1;
	m->tokens_le.data = le;
	m->tokens_le.len = 4 * n;
}

/* MatchPrefix of seed's tokens from..from+n as tokens_le bytes (as
 * libkvpalace sends them), cut short by `cut` bytes; a later chunk of
 * lease when lease is not 0, with the varint form too when both. */
static void r_match_le(struct dgram *d, uint64_t pool, uint32_t seed, size_t from, size_t n,
		       uint64_t lease, size_t cut, int both)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	match_le_set(&m, pool, seed, from, n);
	m.tokens_le.len = 4 * n - cut;
	if (both) {
		m.tokens = tok + from;
		m.n_tokens = n;
	}
	m.has_lease_id = lease != 0;
	m.lease_id = id_of(lease);
	m.has_prompt_tokens = lease == 0;
	m.prompt_tokens = from + n + 100;
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

/* A later chunk of seed's tokens from..from+n as tokens_le that says it
 * continues the connection's last first chunk, naming lease as well when
 * it is not 0 (refused). */
static void r_match_cont(struct dgram *d, uint64_t pool, uint32_t seed, size_t from, size_t n,
			 uint64_t lease)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	match_le_set(&m, pool, seed, from, n);
	m.has_continues = 1;
	m.continues = 1;
	m.has_lease_id = lease != 0;
	m.lease_id = id_of(lease);
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

static void r_release(struct dgram *d, uint64_t lease)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ReleaseRequest m = KVPALACE__V1__RELEASE_REQUEST__INIT;

	m.lease_id = id_of(lease);
	q.op_case = KVPALACE__V1__REQUEST__OP_RELEASE;
	q.release = &m;
	dg_add(d, &q);
}

/* SubscribeEvents, of pool (a step's id, 0: every pool). */
static void r_subscribe(struct dgram *d, uint64_t pool)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SubscribeEventsRequest m = KVPALACE__V1__SUBSCRIBE_EVENTS_REQUEST__INIT;

	m.has_pool_id = pool != 0;
	m.pool_id = pool ? id_of(pool) : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS;
	q.subscribe_events = &m;
	dg_add(d, &q);
}

static void r_stats(struct dgram *d)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__StatsRequest m = KVPALACE__V1__STATS_REQUEST__INIT;

	q.op_case = KVPALACE__V1__REQUEST__OP_STATS;
	q.stats = &m;
	dg_add(d, &q);
}

static void r_fork(struct dgram *d, uint64_t session, uint64_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ForkRequest m = KVPALACE__V1__FORK_REQUEST__INIT;

	m.session_id = id_of(session);
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_FORK;
	q.fork = &m;
	dg_add(d, &q);
}

static void r_fork_lease(struct dgram *d, uint64_t lease, uint64_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ForkLeaseRequest m = KVPALACE__V1__FORK_LEASE_REQUEST__INIT;

	m.lease_id = id_of(lease);
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_FORK_LEASE;
	q.fork_lease = &m;
	dg_add(d, &q);
}

static void r_truncate(struct dgram *d, uint64_t session, uint64_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__TruncateRequest m = KVPALACE__V1__TRUNCATE_REQUEST__INIT;

	m.session_id = id_of(session);
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_TRUNCATE;
	q.truncate = &m;
	dg_add(d, &q);
}

static void r_session_pages(struct dgram *d, uint64_t session, uint64_t first)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SessionPagesRequest m = KVPALACE__V1__SESSION_PAGES_REQUEST__INIT;

	m.session_id = id_of(session);
	m.first_page = first;
	q.op_case = KVPALACE__V1__REQUEST__OP_SESSION_PAGES;
	q.session_pages = &m;
	dg_add(d, &q);
}

static void r_list_sessions(struct dgram *d, uint64_t pool, uint64_t after)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ListSessionsRequest m = KVPALACE__V1__LIST_SESSIONS_REQUEST__INIT;

	m.has_pool_id = pool != 0;
	m.pool_id = id_of(pool);
	m.has_after_id = after != 0;
	m.after_id = after;
	q.op_case = KVPALACE__V1__REQUEST__OP_LIST_SESSIONS;
	q.list_sessions = &m;
	dg_add(d, &q);
}

static void r_prefetch(struct dgram *d, uint64_t pool, uint32_t seed, size_t n)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PrefetchRequest m = KVPALACE__V1__PREFETCH_REQUEST__INIT;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	m.tokens = tok;
	m.n_tokens = n;
	q.op_case = KVPALACE__V1__REQUEST__OP_PREFETCH;
	q.prefetch = &m;
	dg_add(d, &q);
}

/* Lookup of n queries of seed's first n_tokens tokens as tokens_le: the
 * even ones under salt (when not NULL), the odd ones continuing a made-up
 * chain of chain_len bytes (none when 0). */
static void r_lookup(struct dgram *d, uint64_t pool, uint32_t seed, size_t n, size_t n_tokens,
		     const char *salt, size_t chain_len)
{
	static uint8_t le[4 * 256], chain[32];
	static Kvpalace__V1__LookupQuery qs[80];
	static Kvpalace__V1__LookupQuery *qp[80];
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LookupRequest m = KVPALACE__V1__LOOKUP_REQUEST__INIT;

	fill_tokens(seed, n_tokens);
	for (size_t i = 0; i < n_tokens && i < 256; i++)
		le_put32(le + 4 * i, tok[i]);
	memset(chain, 0x5c, sizeof(chain));
	for (size_t i = 0; i < n && i < 80; i++) {
		kvpalace__v1__lookup_query__init(&qs[i]);
		qs[i].has_tokens_le = 1;
		qs[i].tokens_le.data = le;
		qs[i].tokens_le.len = 4 * (n_tokens - i % (n_tokens + 1));
		if (salt && i % 2 == 0) {
			qs[i].has_cache_salt = 1;
			qs[i].cache_salt.data = (uint8_t *)salt;
			qs[i].cache_salt.len = strlen(salt);
		}
		if (chain_len && i % 2) {
			qs[i].has_chain = 1;
			qs[i].chain.data = chain;
			qs[i].chain.len = chain_len;
		}
		qp[i] = &qs[i];
	}
	m.pool_id = id_of(pool);
	m.n_queries = n < 80 ? n : 80;
	m.queries = qp;
	q.op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	q.lookup = &m;
	dg_add(d, &q);
}

/* AdoptLease of lease in pool, then LeasePages of the new lease (the
 * next id) from first_page. */
static void r_adopt(struct dgram *d, uint64_t pool, uint64_t lease, uint64_t first_page)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AdoptLeaseRequest a = KVPALACE__V1__ADOPT_LEASE_REQUEST__INIT;
	Kvpalace__V1__LeasePagesRequest lp = KVPALACE__V1__LEASE_PAGES_REQUEST__INIT;

	a.pool_id = id_of(pool);
	a.lease_id = id_of(lease);
	q.op_case = KVPALACE__V1__REQUEST__OP_ADOPT_LEASE;
	q.adopt_lease = &a;
	dg_add(d, &q);
	lp.lease_id = id_of(lease + 1);
	lp.first_page = first_page;
	q.op_case = KVPALACE__V1__REQUEST__OP_LEASE_PAGES;
	q.lease_pages = &lp;
	dg_add(d, &q);
}

static void r_set_policy(struct dgram *d, uint64_t session, Kvpalace__V1__Policy kind,
			 uint32_t budget, int auto_compact)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SetPolicyRequest m = KVPALACE__V1__SET_POLICY_REQUEST__INIT;
	Kvpalace__V1__PolicySpec spec = KVPALACE__V1__POLICY_SPEC__INIT;
	Kvpalace__V1__RolePolicy role = KVPALACE__V1__ROLE_POLICY__INIT, *roles[1] = {&role};

	spec.kind = kind;
	spec.has_budget = 1;
	spec.budget = budget;
	spec.has_sinks = spec.has_recent = 1;
	spec.sinks = 2;
	spec.recent = 4;
	spec.has_auto_compact = 1;
	spec.auto_compact = auto_compact;
	role.role = KVPALACE__V1__ROLE__ROLE_USER;
	role.has_limit = 1;
	role.limit = 3;
	spec.roles = roles;
	spec.n_roles = 1;
	m.session_id = id_of(session);
	m.policy = &spec;
	q.op_case = KVPALACE__V1__REQUEST__OP_SET_POLICY;
	q.set_policy = &m;
	dg_add(d, &q);
}

static void r_tag_span(struct dgram *d, uint64_t session, uint64_t first, uint64_t n, int perm)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__TagSpanRequest m = KVPALACE__V1__TAG_SPAN_REQUEST__INIT;

	m.session_id = id_of(session);
	m.first = first;
	m.n = n;
	m.has_role = m.has_turn = m.has_permanent = 1;
	m.role = KVPALACE__V1__ROLE__ROLE_SYSTEM;
	m.turn = 1;
	m.permanent = perm;
	q.op_case = KVPALACE__V1__REQUEST__OP_TAG_SPAN;
	q.tag_span = &m;
	dg_add(d, &q);
}

static void r_report(struct dgram *d, uint64_t session, uint64_t first, size_t n, int query,
		     int topic)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ReportImportanceRequest m = KVPALACE__V1__REPORT_IMPORTANCE_REQUEST__INIT;
	float v[64];

	for (size_t i = 0; i < 64; i++)
		v[i] = (float)(i % 7) * 0.25f;
	m.session_id = id_of(session);
	if (query) {
		m.has_layer = m.has_n_q_heads = 1;
		m.layer = 0;
		m.n_q_heads = 1;
		m.query = v;
		m.n_query = n;
		m.has_topic = topic;
		m.topic = topic;
	} else {
		m.has_first = 1;
		m.first = first;
		m.mass = v;
		m.n_mass = n;
	}
	q.op_case = KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE;
	q.report_importance = &m;
	dg_add(d, &q);
}

static void r_compact(struct dgram *d, uint64_t session)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CompactRequest m = KVPALACE__V1__COMPACT_REQUEST__INIT;

	m.session_id = id_of(session);
	q.op_case = KVPALACE__V1__REQUEST__OP_COMPACT;
	q.compact = &m;
	dg_add(d, &q);
}

static void r_session_meta(struct dgram *d, uint64_t session, uint64_t first)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__SessionMetaRequest m = KVPALACE__V1__SESSION_META_REQUEST__INIT;

	m.session_id = id_of(session);
	m.first = first;
	q.op_case = KVPALACE__V1__REQUEST__OP_SESSION_META;
	q.session_meta = &m;
	dg_add(d, &q);
}

/* The GPU tier's requests (issue 7): tier 0 means "not given". */
static void r_match_tier(struct dgram *d, uint64_t pool, uint32_t seed, size_t n, int tier,
			 int or_host)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	m.tokens = tok;
	m.n_tokens = n;
	m.has_tier = tier != 0;
	m.tier = (Kvpalace__V1__Tier)tier;
	m.has_or_host = or_host >= 0;
	m.or_host = or_host > 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

static void r_append_tier(struct dgram *d, uint64_t session, uint32_t seed, size_t n, int tier,
			  int or_host)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest m = KVPALACE__V1__APPEND_REQUEST__INIT;

	fill_tokens(seed, n);
	m.session_id = id_of(session);
	m.tokens = tok;
	m.n_tokens = n;
	m.has_tier = tier != 0;
	m.tier = (Kvpalace__V1__Tier)tier;
	m.has_or_host = or_host >= 0;
	m.or_host = or_host > 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	q.append = &m;
	dg_add(d, &q);
}

static void r_prefetch_tier(struct dgram *d, uint64_t pool, uint32_t seed, size_t n, int tier,
			    int or_host)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PrefetchRequest m = KVPALACE__V1__PREFETCH_REQUEST__INIT;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	m.tokens = tok;
	m.n_tokens = n;
	m.has_tier = tier != 0;
	m.tier = (Kvpalace__V1__Tier)tier;
	m.has_or_host = or_host >= 0;
	m.or_host = or_host > 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_PREFETCH;
	q.prefetch = &m;
	dg_add(d, &q);
}

static void r_open_device_arena(struct dgram *d, uint64_t pool)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenDeviceArenaRequest m = KVPALACE__V1__OPEN_DEVICE_ARENA_REQUEST__INIT;

	m.pool_id = id_of(pool);
	q.op_case = KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA;
	q.open_device_arena = &m;
	dg_add(d, &q);
}

static void r_lease_device(struct dgram *d, uint64_t lease, int64_t first_page)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LeaseDeviceRequest m = KVPALACE__V1__LEASE_DEVICE_REQUEST__INIT;

	m.lease_id = id_of(lease);
	m.has_first_page = first_page >= 0;
	m.first_page = first_page >= 0 ? (uint64_t)first_page : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_LEASE_DEVICE;
	q.lease_device = &m;
	dg_add(d, &q);
}

static void r_checkpoint(struct dgram *d, uint64_t session, const char *name)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CheckpointRequest m = KVPALACE__V1__CHECKPOINT_REQUEST__INIT;

	m.session_id = id_of(session);
	m.name = (char *)name;
	q.op_case = KVPALACE__V1__REQUEST__OP_CHECKPOINT;
	q.checkpoint = &m;
	dg_add(d, &q);
}

static void r_restore(struct dgram *d, uint64_t pool, const char *name, int uid)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__RestoreRequest m = KVPALACE__V1__RESTORE_REQUEST__INIT;

	m.has_pool_id = pool != 0;
	m.pool_id = id_of(pool);
	m.name = (char *)name;
	m.has_uid = uid >= 0;
	m.uid = uid >= 0 ? (uint32_t)uid : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_RESTORE;
	q.restore = &m;
	dg_add(d, &q);
}

static void r_list_checkpoints(struct dgram *d, int uid)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ListCheckpointsRequest m = KVPALACE__V1__LIST_CHECKPOINTS_REQUEST__INIT;

	m.has_uid = uid >= 0;
	m.uid = uid >= 0 ? (uint32_t)uid : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS;
	q.list_checkpoints = &m;
	dg_add(d, &q);
}

static void r_list_checkpoint(struct dgram *d, const char *name, int verify)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ListCheckpointsRequest m = KVPALACE__V1__LIST_CHECKPOINTS_REQUEST__INIT;

	m.name = (char *)name;
	m.has_verify = 1;
	m.verify = verify != 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS;
	q.list_checkpoints = &m;
	dg_add(d, &q);
}

static void r_delete_checkpoint(struct dgram *d, const char *name, int uid)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DeleteCheckpointRequest m = KVPALACE__V1__DELETE_CHECKPOINT_REQUEST__INIT;

	m.name = (char *)name;
	m.has_uid = uid >= 0;
	m.uid = uid >= 0 ? (uint32_t)uid : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_DELETE_CHECKPOINT;
	q.delete_checkpoint = &m;
	dg_add(d, &q);
}

static void r_warmup(struct dgram *d, const char *name, int uid)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__WarmupRequest m = KVPALACE__V1__WARMUP_REQUEST__INIT;

	m.name = (char *)name;
	m.has_uid = uid >= 0;
	m.uid = uid >= 0 ? (uint32_t)uid : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_WARMUP;
	q.warmup = &m;
	dg_add(d, &q);
}

static void r_show_session(struct dgram *d, uint64_t session, int max_slots)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ShowSessionRequest m = KVPALACE__V1__SHOW_SESSION_REQUEST__INIT;

	m.session_id = id_of(session);
	m.has_max_page_slots = max_slots >= 0;
	m.max_page_slots = max_slots >= 0 ? (uint32_t)max_slots : 0;
	q.op_case = KVPALACE__V1__REQUEST__OP_SHOW_SESSION;
	q.show_session = &m;
	dg_add(d, &q);
}

static void r_drop_session(struct dgram *d, uint64_t session, int force)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DropSessionRequest m = KVPALACE__V1__DROP_SESSION_REQUEST__INIT;

	m.session_id = id_of(session);
	m.has_force = 1;
	m.force = force;
	q.op_case = KVPALACE__V1__REQUEST__OP_DROP_SESSION;
	q.drop_session = &m;
	dg_add(d, &q);
}

static void r_drop_pool(struct dgram *d, uint64_t pool, int force)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__DropPoolRequest m = KVPALACE__V1__DROP_POOL_REQUEST__INIT;

	m.pool_id = id_of(pool);
	m.has_force = 1;
	m.force = force;
	q.op_case = KVPALACE__V1__REQUEST__OP_DROP_POOL;
	q.drop_pool = &m;
	dg_add(d, &q);
}

static void r_evict(struct dgram *d, Kvpalace__V1__Tier tier, uint64_t pool, uint64_t max_bytes,
		    uint32_t max_pages)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__EvictRequest m = KVPALACE__V1__EVICT_REQUEST__INIT;

	m.tier = tier;
	m.has_pool_id = pool != 0;
	m.pool_id = id_of(pool);
	m.has_max_bytes = max_bytes != 0;
	m.max_bytes = max_bytes;
	m.has_max_pages = max_pages != 0;
	m.max_pages = max_pages;
	q.op_case = KVPALACE__V1__REQUEST__OP_EVICT;
	q.evict = &m;
	dg_add(d, &q);
}

static void r_config_show(struct dgram *d)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ConfigShowRequest m = KVPALACE__V1__CONFIG_SHOW_REQUEST__INIT;

	q.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_SHOW;
	q.config_show = &m;
	dg_add(d, &q);
}

static void r_config_reload(struct dgram *d)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__ConfigReloadRequest m = KVPALACE__V1__CONFIG_RELOAD_REQUEST__INIT;

	q.op_case = KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD;
	q.config_reload = &m;
	dg_add(d, &q);
}

/* A frame whose payload is the given bytes, header as the daemon wants it
 * unless magic/version/length say otherwise. */
static void raw_frame(struct dgram *d, uint32_t magic, uint16_t version, uint32_t length,
		      const void *payload, size_t n)
{
	unsigned char h[FRAME_HEADER_BYTES] = {0};

	for (int i = 0; i < 4; i++) {
		h[i] = (unsigned char)(magic >> (8 * i));
		h[8 + i] = (unsigned char)(length >> (8 * i));
	}
	h[4] = (unsigned char)version;
	h[5] = (unsigned char)(version >> 8);
	dg_raw(d, h, sizeof(h));
	dg_raw(d, payload, n);
}

/* Key spans (issue 18): spans[i] = (first[i], 1 + i % 7, key "img<i>"). */
static Kvpalace__V1__KeySpan ks_m[8];
static Kvpalace__V1__KeySpan *ks_p[8];
static char ks_key[8][8];

static Kvpalace__V1__KeySpan **key_spans(const uint64_t *first, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		kvpalace__v1__key_span__init(&ks_m[i]);
		ks_m[i].first_token = first[i];
		ks_m[i].n_tokens = 1 + i % 7 + (i == 0 ? 40 : 0);
		snprintf(ks_key[i], sizeof(ks_key[i]), "img%zu", i);
		ks_m[i].key.data = (uint8_t *)ks_key[i];
		ks_m[i].key.len = strlen(ks_key[i]);
		ks_p[i] = &ks_m[i];
	}
	return ks_p;
}

static void r_create_session_keyed(struct dgram *d, uint64_t pool, const char *extra)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__CreateSessionRequest m = KVPALACE__V1__CREATE_SESSION_REQUEST__INIT;

	m.pool_id = id_of(pool);
	m.has_extra_key = 1;
	m.extra_key.data = (uint8_t *)extra;
	m.extra_key.len = strlen(extra);
	q.op_case = KVPALACE__V1__REQUEST__OP_CREATE_SESSION;
	q.create_session = &m;
	dg_add(d, &q);
}

static void r_append_keyed(struct dgram *d, uint64_t session, uint32_t seed, size_t n,
			   const uint64_t *first, size_t n_spans)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__AppendRequest m = KVPALACE__V1__APPEND_REQUEST__INIT;

	fill_tokens(seed, n);
	m.session_id = id_of(session);
	m.tokens = tok;
	m.n_tokens = n;
	m.key_spans = key_spans(first, n_spans);
	m.n_key_spans = n_spans;
	q.op_case = KVPALACE__V1__REQUEST__OP_APPEND;
	q.append = &m;
	dg_add(d, &q);
}

static void r_match_keyed(struct dgram *d, uint64_t pool, uint32_t seed, size_t n,
			  const char *extra, const uint64_t *first, size_t n_spans)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest m = KVPALACE__V1__MATCH_PREFIX_REQUEST__INIT;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	m.tokens = tok;
	m.n_tokens = n;
	if (extra) {
		m.has_extra_key = 1;
		m.extra_key.data = (uint8_t *)extra;
		m.extra_key.len = strlen(extra);
	}
	m.key_spans = key_spans(first, n_spans);
	m.n_key_spans = n_spans;
	q.op_case = KVPALACE__V1__REQUEST__OP_MATCH_PREFIX;
	q.match_prefix = &m;
	dg_add(d, &q);
}

static void r_lookup_keyed(struct dgram *d, uint64_t pool, uint32_t seed, size_t n,
			   const char *extra, const uint64_t *first, size_t n_spans,
			   uint64_t first_token)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__LookupRequest m = KVPALACE__V1__LOOKUP_REQUEST__INIT;
	Kvpalace__V1__LookupQuery lq = KVPALACE__V1__LOOKUP_QUERY__INIT, *lqp = &lq;

	fill_tokens(seed, n);
	m.pool_id = id_of(pool);
	lq.has_tokens_le = 1;
	lq.tokens_le.data = (uint8_t *)tok; /* little-endian hosts: what the seeds are for */
	lq.tokens_le.len = n * 4;
	if (extra) {
		lq.has_extra_key = 1;
		lq.extra_key.data = (uint8_t *)extra;
		lq.extra_key.len = strlen(extra);
	}
	lq.key_spans = key_spans(first, n_spans);
	lq.n_key_spans = n_spans;
	lq.has_first_token = first_token != 0;
	lq.first_token = first_token;
	m.queries = &lqp;
	m.n_queries = 1;
	q.op_case = KVPALACE__V1__REQUEST__OP_LOOKUP;
	q.lookup = &m;
	dg_add(d, &q);
}

static void gen_key_spans(void)
{
	static const uint64_t good[] = {10, 60, 63, 75};
	static const uint64_t crossing[] = {70};
	static const uint64_t unsorted[] = {30, 20};
	static const uint64_t overlapping[] = {10, 20};
	struct dgram d;

	/* -- keyed sessions, appends with spans crossing the append and
	 * page boundaries, matches and lookups with and without the right
	 * keys, and refusals: unsorted, overlapping, past the tokens, on a
	 * hashed page -- */
	dg_reset(&d);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session_keyed(&d, 1, "lora-1");
	r_append_keyed(&d, 2, 1, 65, good, 3);
	r_append_keyed(&d, 2, 2, 30, good + 3, 1);
	r_commit(&d, 2, 95);
	r_match_keyed(&d, 1, 1, 95, "lora-1", good, 4);
	r_match_keyed(&d, 1, 1, 95, NULL, good, 4);
	r_match_keyed(&d, 1, 1, 95, "lora-1", crossing, 1);
	r_lookup_keyed(&d, 1, 1, 95, "lora-1", good, 4, 0);
	r_lookup_keyed(&d, 1, 1, 64, NULL, good, 4, 32);
	r_append_keyed(&d, 2, 3, 16, unsorted, 2);
	r_append_keyed(&d, 2, 3, 16, overlapping, 2);
	r_append_keyed(&d, 2, 3, 16, good, 1);
	r_match_keyed(&d, 1, 1, 16, "lora-1", unsorted, 2);
	r_stats(&d);
	emit_req("req-key-spans", 0, &d);
}

static void gen_requests(void)
{
	static struct dgram d;
	Kvpalace__V1__Layout l;

	/* -- one operation each, fresh state -- */
	dg_reset(&d);
	r_hello(&d, 1);
	emit_req("req-hello", 0, &d);
	emit_req("req-hello-admin", FUZZ_REQ_ADMIN, &d);
	emit_req("req-hello-then-close", FUZZ_REQ_CLOSE | FUZZ_REQ_TENANT_B, &d);
	dg_reset(&d);
	r_hello(&d, 7);
	emit_req("req-hello-bad-version", 0, &d);
	dg_reset(&d);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	emit_req("req-open-pool", 0, &d);
	dg_reset(&d);
	r_open_pool(&d, "q8", layout_quant(KVPALACE__V1__DTYPE__DTYPE_INT8, 32));
	r_open_pool(&d, "fp8", layout_quant(KVPALACE__V1__DTYPE__DTYPE_FP8_E4M3, 64));
	r_open_pool(&d, "q4", layout_quant(KVPALACE__V1__DTYPE__DTYPE_INT4, 16));
	l = layout_f16();
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_BF16;
	r_open_pool(&d, "bf16", l);
	l.dtype = KVPALACE__V1__DTYPE__DTYPE_F32;
	r_open_pool(&d, "f32", l);
	r_open_pool(&d, "one-too-many", layout_tiny());
	emit_req("req-open-pool-dtypes", 0, &d);
	dg_reset(&d);
	l = layout_f16();
	l.n_layers = 64;
	l.n_kv_heads = 8;
	l.head_dim = 128;
	r_open_pool(&d, "page-larger-than-pool", l);
	l = layout_quant(KVPALACE__V1__DTYPE__DTYPE_INT8, 48);
	r_open_pool(&d, "group-not-dividing", l);
	l = layout_f16();
	l.dtype = (Kvpalace__V1__DType)42;
	r_open_pool(&d, "unknown-dtype", l);
	r_open_pool(&d, "bad\x01model", layout_f16());
	emit_req("req-open-pool-invalid", 0, &d);
	dg_reset(&d);
	r_stats(&d);
	emit_req("req-stats", 0, &d);
	emit_req("req-stats-admin", FUZZ_REQ_ADMIN, &d);
	dg_reset(&d);
	r_list_sessions(&d, 0, 0);
	r_list_sessions(&d, 1, 5);
	emit_req("req-list-sessions", 0, &d);
	emit_req("req-list-sessions-admin", FUZZ_REQ_ADMIN, &d);

	/* -- ids that do not exist -- */
	dg_reset(&d);
	r_create_session(&d, 9, NULL);
	r_close_session(&d, 9);
	r_append(&d, 9, 1, 3);
	r_commit(&d, 9, 3);
	r_match(&d, 9, 1, 3, 0, NULL);
	r_match(&d, 9, 1, 3, 5, NULL);
	r_release(&d, 9);
	r_fork(&d, 9, 1);
	r_fork_lease(&d, 9, 1);
	r_truncate(&d, 9, 0);
	r_session_pages(&d, 9, 0);
	r_prefetch(&d, 9, 1, 3);
	emit_req("req-unknown-ids", 0, &d);

	/* -- Lookup: batches, salts, chains, and what the daemon refuses -- */
	dg_reset(&d);
	r_hello(&d, 1);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 64);
	r_commit(&d, 2, 64);
	r_lookup(&d, 1, 1, 1, 64, NULL, 0);
	r_lookup(&d, 1, 1, 8, 64, "salt", 16);
	r_lookup(&d, 1, 1, 64, 48, NULL, 16);
	r_lookup(&d, 1, 1, 65, 16, NULL, 0); /* one query too many */
	r_lookup(&d, 1, 1, 2, 16, NULL, 15); /* a short chain */
	r_lookup(&d, 1, 2, 3, 200, "salt", 16);
	r_lookup(&d, 7, 1, 1, 16, NULL, 0); /* no such pool */
	r_lookup(&d, 1, 1, 0, 0, NULL, 0);
	emit_req("req-lookup", 0, &d);

	/* -- AdoptLease and LeasePages: pool 1, session 2, lease 3 -- */
	dg_reset(&d);
	r_hello(&d, 1);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 64);
	r_commit(&d, 2, 64);
	r_match(&d, 1, 1, 64, 0, NULL);
	r_adopt(&d, 1, 3, 0);
	r_adopt(&d, 1, 3, 2);
	r_adopt(&d, 1, 3, 9);  /* past its pages */
	r_adopt(&d, 7, 3, 0);  /* no such pool */
	r_adopt(&d, 1, 99, 0); /* no such lease */
	r_release(&d, 3);
	r_adopt(&d, 1, 3, 0); /* released */
	emit_req("req-adopt", 0, &d);

	/* -- a session's life: pool 1, session 2, lease 3, forks 4 and 5 -- */
	dg_reset(&d);
	r_hello(&d, 1);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 40);
	r_commit(&d, 2, 40);
	r_match(&d, 1, 1, 40, 0, NULL);
	r_session_pages(&d, 2, 0);
	r_session_pages(&d, 2, 3);
	r_fork(&d, 2, 20);
	r_fork_lease(&d, 3, 32);
	r_truncate(&d, 2, 24);
	r_append(&d, 2, 2, 10);
	r_truncate(&d, 2, 30);
	r_commit(&d, 2, 6);
	r_release(&d, 3);
	r_release(&d, 3);
	r_prefetch(&d, 1, 1, 40);
	r_list_sessions(&d, 1, 0);
	r_stats(&d);
	r_close_session(&d, 4);
	r_close_session(&d, 4);
	r_checkpoint(&d, 2, "conv-1");
	r_restore(&d, 1, "conv-1", -1);
	r_list_checkpoints(&d, -1);
	r_list_checkpoint(&d, "conv-1", 1);
	r_delete_checkpoint(&d, "conv-1", -1);
	r_delete_checkpoint(&d, "conv-1", 1000);
	emit_req("req-lifecycle", 0, &d);
	emit_req("req-lifecycle-then-close", FUZZ_REQ_CLOSE, &d);

	/* -- policies: pool 1, session 2, fork 3 -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 40);
	r_commit(&d, 2, 40);
	r_tag_span(&d, 2, 0, 8, 1);
	r_tag_span(&d, 2, 30, 20, 0);
	r_report(&d, 2, 0, 40, 0, 0);
	r_report(&d, 2, 0, 8, 1, 0);
	r_report(&d, 2, 0, 8, 1, 1);
	r_compact(&d, 2);
	r_set_policy(&d, 2, KVPALACE__V1__POLICY__POLICY_IMPORTANCE, 16, 1);
	r_compact(&d, 2);
	r_session_meta(&d, 2, 0);
	r_fork(&d, 2, 10);
	r_append(&d, 2, 2, 20);
	r_commit(&d, 2, 20);
	r_set_policy(&d, 3, KVPALACE__V1__POLICY__POLICY_HIERARCHY, 8, 0);
	r_compact(&d, 3);
	r_set_policy(&d, 2, (Kvpalace__V1__Policy)9, 0, 0);
	r_session_meta(&d, 2, 99);
	r_checkpoint(&d, 2, "compacted");
	r_restore(&d, 1, "compacted", -1);
	emit_req("req-policies", 0, &d);

	/* -- bad counts on a live session -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_commit(&d, 2, 1);
	r_append(&d, 2, 3, 10);
	r_commit(&d, 2, 11);
	r_fork(&d, 2, 11);
	r_truncate(&d, 2, 11);
	r_session_pages(&d, 2, 99);
	r_commit(&d, 2, 10);
	r_fork(&d, 2, 10);
	r_fork_lease(&d, 2, 1);
	r_append(&d, 2, 3, 0);
	emit_req("req-bad-counts", 0, &d);

	/* -- a salted session and a match in chunks -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, "tenant-salt");
	r_append(&d, 2, 5, 200);
	r_commit(&d, 2, 200);
	r_match(&d, 1, 5, 70, 0, "tenant-salt");
	r_match_chunk(&d, 1, 5, 70, 70, 3);
	r_match_chunk(&d, 1, 5, 140, 70, 3);
	r_match_chunk(&d, 1, 5, 210, 10, 3);
	r_match(&d, 1, 5, 70, 0, NULL);
	r_match(&d, 1, 5, 70, 0, "another-salt");
	r_fork_lease(&d, 3, 150);
	emit_req("req-salted-chunks", 0, &d);

	/* -- a match as tokens_le bytes, in chunks cut inside pages, and
	 * malformed: a token cut short, both forms at once, none -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 6, 200);
	r_commit(&d, 2, 200);
	r_match_le(&d, 1, 6, 0, 70, 0, 0, 0);
	r_match_le(&d, 1, 6, 70, 70, 3, 0, 0);
	r_match_le(&d, 1, 6, 140, 70, 3, 0, 0);
	r_fork_lease(&d, 3, 150);
	r_match_le(&d, 1, 6, 0, 70, 0, 1, 0);
	r_match_le(&d, 1, 6, 0, 70, 0, 0, 1);
	r_match_le(&d, 1, 6, 0, 0, 0, 0, 0);
	emit_req("req-match-tokens-le", 0, &d);

	/* -- a match whose later chunks continue the first without its lease
	 * id: before any first chunk, in order, with a lease id too, after
	 * the lease's release, after a miss -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 7, 200);
	r_commit(&d, 2, 200);
	r_match_cont(&d, 1, 7, 0, 70, 0);
	r_match_le(&d, 1, 7, 0, 70, 0, 0, 0);
	r_match_cont(&d, 1, 7, 70, 70, 0);
	r_match_cont(&d, 1, 7, 140, 70, 0);
	r_match_cont(&d, 1, 7, 140, 70, 3);
	r_release(&d, 3);
	r_match_cont(&d, 1, 7, 210, 10, 0);
	r_match_le(&d, 1, 8, 0, 70, 0, 0, 0);
	r_match_cont(&d, 1, 8, 70, 70, 0);
	emit_req("req-match-continues", 0, &d);

	/* -- KV events: a subscription to a pool, a second one (refused),
	 * then pages stored and released while subscribed -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_subscribe(&d, 1);
	r_subscribe(&d, 0);
	r_create_session(&d, 1, NULL);
	r_append(&d, 4, 9, 100);
	r_commit(&d, 4, 100);
	r_match_le(&d, 1, 9, 0, 64, 0, 0, 0);
	r_release(&d, 7);
	emit_req("req-subscribe-events", 0, &d);

	/* -- the GPU tier, which the fuzzed daemon does not have: tiers on
	 * Append, MatchPrefix and Prefetch (GPU refused or served from the
	 * host, disk and unknown tiers refused), OpenDeviceArena, LeaseDevice
	 * on a lease, a miss and nothing -- */
	dg_reset(&d);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session(&d, 1, NULL);
	r_append_tier(&d, 2, 1, 40, KVPALACE__V1__TIER__TIER_GPU, -1);
	r_append_tier(&d, 2, 1, 40, KVPALACE__V1__TIER__TIER_GPU, 1);
	r_append_tier(&d, 2, 1, 8, KVPALACE__V1__TIER__TIER_DISK, 1);
	r_append_tier(&d, 2, 1, 8, 77, 0);
	r_commit(&d, 2, 40);
	r_match_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_GPU, 0);
	r_match_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_GPU, 1);
	r_match_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_HOST, -1);
	r_match_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_DISK, 1);
	r_match_tier(&d, 1, 2, 40, 99, -1);
	r_prefetch_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_GPU, -1);
	r_prefetch_tier(&d, 1, 1, 40, KVPALACE__V1__TIER__TIER_GPU, 1);
	r_open_device_arena(&d, 1);
	r_open_device_arena(&d, 9);
	r_lease_device(&d, 3, -1);
	r_lease_device(&d, 3, 1);
	r_lease_device(&d, 3, 1000);
	r_lease_device(&d, 0, -1);
	r_lease_device(&d, 77, 0);
	r_release(&d, 3);
	r_stats(&d);
	emit_req("req-gpu-tier", 0, &d);
	emit_req("req-gpu-tier-then-close", FUZZ_REQ_CLOSE, &d);
	gen_key_spans();

	/* -- the pool fills: eviction, then no space -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 7, 900);
	r_commit(&d, 2, 900);
	r_close_session(&d, 2);
	r_create_session(&d, 1, NULL);
	r_append(&d, 3, 8, 900);
	r_append(&d, 3, 9, 300);
	r_commit(&d, 3, 1000);
	r_stats(&d);
	emit_req("req-pool-full", 0, &d);

	/* -- uncommitted tokens left when the connection closes -- */
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 30);
	r_commit(&d, 2, 12);
	r_append(&d, 2, 1, 5);
	r_match(&d, 1, 1, 30, 0, NULL);
	emit_req("req-close-while-writing", FUZZ_REQ_CLOSE, &d);

	/* -- requests the other socket serves -- */
	dg_reset(&d);
	r_show_session(&d, 1, 16);
	r_drop_session(&d, 1, 1);
	r_drop_pool(&d, 1, 1);
	r_evict(&d, KVPALACE__V1__TIER__TIER_HOST, 0, 0, 0);
	r_config_show(&d);
	r_config_reload(&d);
	r_warmup(&d, "w", -1);
	r_restore(&d, 0, "x", -1);
	r_restore(&d, 1, "x", 5);
	r_list_checkpoints(&d, 5);
	emit_req("req-admin-ops-on-client", 0, &d);
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 1, 1, 4);
	r_match(&d, 1, 1, 4, 0, NULL);
	emit_req("req-client-ops-on-admin", FUZZ_REQ_ADMIN, &d);

	/* -- the admin operations (on a fresh state they find nothing; the
	 * fuzzer runs them after other inputs built pools) -- */
	dg_reset(&d);
	r_show_session(&d, 2, -1);
	r_show_session(&d, 2, 4096);
	r_show_session(&d, 2, 5000);
	r_drop_session(&d, 2, 0);
	r_drop_session(&d, 2, 1);
	r_drop_pool(&d, 1, 0);
	r_drop_pool(&d, 1, 1);
	r_evict(&d, KVPALACE__V1__TIER__TIER_HOST, 0, 0, 0);
	r_evict(&d, KVPALACE__V1__TIER__TIER_HOST, 1, 65536, 3);
	r_evict(&d, KVPALACE__V1__TIER__TIER_GPU, 0, 0, 0);
	r_evict(&d, KVPALACE__V1__TIER__TIER_DISK, 0, 0, 0);
	r_evict(&d, (Kvpalace__V1__Tier)9, 0, 0, 0);
	r_config_show(&d);
	r_config_reload(&d);
	r_warmup(&d, "w", -1);
	r_warmup(&d, "w", 1000);
	r_restore(&d, 0, "x", 1000);
	r_list_checkpoints(&d, -1);
	r_stats(&d);
	r_list_sessions(&d, 0, 0);
	emit_req("req-admin-ops", FUZZ_REQ_ADMIN, &d);
	{
		unsigned char f = FUZZ_REQ_ADMIN; /* no FUZZ_REQ_FRESH: acts on what is there */

		emit("fuzz_request", "req-admin-ops-stateful", &f, 1, d.buf, d.len);
	}
	dg_reset(&d);
	r_checkpoint(&d, 1, "-bad");
	r_checkpoint(&d, 1, "");
	r_restore(&d, 1, "../etc", -1);
	r_warmup(&d, ".hidden", -1);
	r_list_checkpoint(&d, "a/b", 0);
	r_delete_checkpoint(&d, "..", -1);
	emit_req("req-bad-checkpoint-names", FUZZ_REQ_ADMIN, &d);

	/* -- framing and decoding the daemon disconnects for -- */
	{
		/* Request{id=1, hello: a length (127) past the end}. */
		static const unsigned char junk[] = {0x08, 0x01, 0x52, 0x7f, 0xff,
						     0xff, 0xff, 0x0f, 0x01, 0x02};
		/* Request{id=1, append{session_id=1, tokens: a packed run
		 * claiming 2^28 bytes}}. */
		static const unsigned char hostile[] = {0x08, 0x01, 0x72, 0x09, 0x08, 0x01, 0x12,
							0x80, 0x80, 0x80, 0x80, 0x01, 0x05};
		/* Request{id=1}: no operation. */
		static const unsigned char no_op[] = {0x08, 0x01};
		unsigned char big[FRAME_DEFAULT_MAX_BYTES];

		dg_reset(&d);
		emit_req("req-empty", 0, &d);
		dg_raw(&d, "KVP1\x01\x00", 6);
		emit_req("req-short-header", 0, &d);
		dg_reset(&d);
		raw_frame(&d, 0x12345678u, FRAME_VERSION, 2, no_op, 2);
		emit_req("req-bad-magic", 0, &d);
		dg_reset(&d);
		raw_frame(&d, FRAME_MAGIC, 2, 2, no_op, 2);
		emit_req("req-bad-version", 0, &d);
		dg_reset(&d);
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, 200, no_op, 2);
		emit_req("req-length-past-end", 0, &d);
		dg_reset(&d);
		r_hello(&d, 1);
		dg_raw(&d, "KVP1", 4);
		emit_req("req-trailing-bytes", 0, &d);
		dg_reset(&d);
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, sizeof(junk), junk, sizeof(junk));
		emit_req("req-undecodable", 0, &d);
		dg_reset(&d);
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, sizeof(hostile), hostile,
			  sizeof(hostile));
		emit_req("req-hostile-packed-length", 0, &d);
		dg_reset(&d);
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, sizeof(no_op), no_op, sizeof(no_op));
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, 0, NULL, 0);
		emit_req("req-no-op", 0, &d);
		dg_reset(&d);
		for (int i = 0; i < (int)FRAME_MAX_BATCH + 1; i++)
			r_stats(&d);
		emit_req("req-too-many-frames", 0, &d);
		dg_reset(&d);
		memset(big, 0, sizeof(big));
		raw_frame(&d, FRAME_MAGIC, FRAME_VERSION, sizeof(big), big, sizeof(big));
		emit_req("req-over-cap", 0, &d);
		dg_reset(&d);
		r_open_pool(&d, "m", layout_tiny());
		r_create_session(&d, 1, NULL);
		r_append(&d, 2, 1, (FRAME_DEFAULT_MAX_BYTES - FRAME_HEADER_BYTES - 256) / 5 + 1);
		emit_req("req-too-many-tokens", 0, &d);
	}
}

/* Purge: of a pool (0: every pool), cached pages unused since a time. */
static void r_purge(struct dgram *d, uint64_t pool, uint64_t unused_since)
{
	Kvpalace__V1__Request q = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__PurgeRequest m = KVPALACE__V1__PURGE_REQUEST__INIT;

	m.has_pool_id = pool != 0;
	m.pool_id = id_of(pool);
	m.has_unused_since_unix_s = unused_since != 0;
	m.unused_since_unix_s = unused_since;
	q.op_case = KVPALACE__V1__REQUEST__OP_PURGE;
	q.purge = &m;
	dg_add(d, &q);
}

/* ---- fuzz_conn ------------------------------------------------------------ */

/* A sequence of actions (fuzz.h), built one at a time. */
static struct {
	unsigned char buf[1 << 20];
	size_t len;
} sc;

static void sc_byte(unsigned int b)
{
	if (sc.len >= sizeof(sc.buf)) {
		fprintf(stderr, "gen_corpus: script too long\n");
		exit(1);
	}
	sc.buf[sc.len++] = (unsigned char)b;
}

static void sc_reset(unsigned int flags)
{
	sc.len = 0;
	sc_byte(flags | FUZZ_CONN_FRESH);
}

static void sc_op(enum fuzz_conn_op op, unsigned int mod)
{
	sc_byte((unsigned int)op << 4 | mod);
}

static void sc_open(unsigned int k, int admin)
{
	sc_op(FUZZ_CONN_OPEN, k | (admin ? FUZZ_CONN_ADMIN : 0));
}

static void sc_send_fd(unsigned int k, const struct dgram *d, int with_fd)
{
	if (d->len > 0xffff) {
		fprintf(stderr, "gen_corpus: datagram too long for fuzz_conn\n");
		exit(1);
	}
	sc_op(FUZZ_CONN_SEND, k | (with_fd ? FUZZ_CONN_WITH_FD : 0));
	sc_byte(d->len & 0xff);
	sc_byte(d->len >> 8);
	for (size_t i = 0; i < d->len; i++)
		sc_byte(d->buf[i]);
}

static void sc_send(unsigned int k, const struct dgram *d)
{
	sc_send_fd(k, d, 0);
}

static void sc_step(unsigned int n)
{
	sc_op(FUZZ_CONN_STEP, 0);
	sc_byte(n);
}

/* A round trip: the datagram, everything it starts finished, its replies. */
static void sc_rt(unsigned int k, const struct dgram *d)
{
	sc_send(k, d);
	sc_op(FUZZ_CONN_WAIT, 0);
	sc_op(FUZZ_CONN_READ, k);
}

static void emit_conn(const char *name)
{
	emit("fuzz_conn", name, sc.buf, sc.len, NULL, 0);
}

/* Pool 1 (tiny pages), session 2 with seed's 40 tokens committed, as one
 * datagram. */
static void dg_session(struct dgram *d, uint32_t seed)
{
	dg_reset(d);
	r_hello(d, 1);
	r_open_pool(d, "m", layout_tiny());
	r_create_session(d, 1, NULL);
	r_append(d, 2, seed, 40);
	r_commit(d, 2, 40);
}

static void gen_conns(void)
{
	static struct dgram d;

	/* -- one request each way, then the lifecycle of fuzz_request's seed,
	 * worker requests included (checkpoint, restore, list, delete) -- */
	sc_reset(0);
	sc_open(0, 0);
	dg_reset(&d);
	r_hello(&d, 1);
	sc_rt(0, &d);
	emit_conn("conn-hello");

	sc_reset(0);
	sc_open(0, 0);
	dg_reset(&d);
	r_hello(&d, 1);
	r_open_pool(&d, "llama-3-8b", layout_f16());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 40);
	r_commit(&d, 2, 40);
	r_match(&d, 1, 1, 40, 0, NULL);
	r_session_pages(&d, 2, 0);
	r_fork(&d, 2, 20);
	r_fork_lease(&d, 3, 32);
	r_truncate(&d, 2, 24);
	r_release(&d, 3);
	r_prefetch(&d, 1, 1, 40);
	r_list_sessions(&d, 1, 0);
	r_stats(&d);
	sc_rt(0, &d);
	dg_reset(&d);
	r_checkpoint(&d, 2, "conv-1");
	sc_rt(0, &d);
	dg_reset(&d);
	r_list_checkpoints(&d, -1);
	r_list_checkpoint(&d, "conv-1", 1);
	r_restore(&d, 1, "conv-1", -1);
	r_match(&d, 1, 1, 24, 0, NULL);
	r_delete_checkpoint(&d, "conv-1", -1);
	r_list_checkpoints(&d, -1);
	sc_rt(0, &d);
	emit_conn("conn-lifecycle");

	/* -- policies, whose queries and compactions run on the workers -- */
	sc_reset(0);
	sc_open(0, 0);
	dg_reset(&d);
	r_open_pool(&d, "m", layout_tiny());
	r_create_session(&d, 1, NULL);
	r_append(&d, 2, 1, 40);
	r_commit(&d, 2, 40);
	r_tag_span(&d, 2, 0, 8, 1);
	r_report(&d, 2, 0, 40, 0, 0);
	r_report(&d, 2, 0, 8, 1, 0);
	r_report(&d, 2, 0, 8, 1, 1);
	r_set_policy(&d, 2, KVPALACE__V1__POLICY__POLICY_IMPORTANCE, 16, 1);
	r_compact(&d, 2);
	r_session_meta(&d, 2, 0);
	r_fork(&d, 2, 10);
	r_set_policy(&d, 3, KVPALACE__V1__POLICY__POLICY_HIERARCHY, 8, 0);
	r_compact(&d, 3);
	r_checkpoint(&d, 2, "compacted");
	r_restore(&d, 1, "compacted", -1);
	sc_rt(0, &d);
	emit_conn("conn-policies");
	/* the same, closed at once with all of it in flight */
	sc.len -= 1; /* the READ */
	sc.len -= 1; /* the WAIT */
	sc_op(FUZZ_CONN_CLOSE, 0);
	emit_conn("conn-policies-close-in-flight");

	/* -- the disk tier: pool 1 fills, its pages spill; matching them
	 * again parks on spill reads -- */
	for (int threads = 0; threads < 2; threads++) {
		sc_reset(threads ? FUZZ_CONN_THREADS : 0);
		sc_open(0, 0);
		dg_reset(&d);
		r_open_pool(&d, "m", layout_tiny());
		r_create_session(&d, 1, NULL);
		r_append(&d, 2, 7, 900);
		r_commit(&d, 2, 900);
		r_close_session(&d, 2);
		sc_rt(0, &d);
		for (uint32_t i = 0; i < 3; i++) {
			dg_reset(&d);
			r_create_session(&d, 1, NULL);
			r_append(&d, 3 + i, 8 + i, 900);
			r_commit(&d, 3 + i, 900);
			r_close_session(&d, 3 + i);
			r_stats(&d);
			sc_rt(0, &d);
		}
		dg_reset(&d);
		r_match(&d, 1, 7, 400, 0, NULL);
		r_prefetch(&d, 1, 8, 400);
		r_match(&d, 1, 8, 200, 0, NULL);
		r_stats(&d);
		sc_send(0, &d);
		sc_step(4);
		sc_op(FUZZ_CONN_READ, 0);
		sc_op(FUZZ_CONN_WAIT, 0);
		sc_op(FUZZ_CONN_READ, 0);
		/* the admin evicts and purges what is there */
		sc_open(1, 1);
		dg_reset(&d);
		r_stats(&d);
		r_evict(&d, KVPALACE__V1__TIER__TIER_HOST, 1, 0, 50);
		r_evict(&d, KVPALACE__V1__TIER__TIER_DISK, 1, 0, 20);
		r_show_session(&d, 2, 16);
		r_purge(&d, 1, 0);
		r_stats(&d);
		sc_rt(1, &d);
		dg_reset(&d);
		r_match(&d, 1, 9, 400, 0, NULL);
		sc_send(0, &d);
		sc_step(0);
		sc_op(FUZZ_CONN_CLOSE, 0); /* closed while parked on the disk */
		sc_op(FUZZ_CONN_WAIT, 0);
		emit_conn(threads ? "conn-spill-threads" : "conn-spill");
	}

	/* -- the admin socket: every operation, on what a client left -- */
	sc_reset(0);
	sc_open(0, 0);
	dg_session(&d, 3);
	r_checkpoint(&d, 2, "w");
	sc_rt(0, &d);
	sc_open(1, 1);
	dg_reset(&d);
	r_stats(&d);
	r_list_sessions(&d, 0, 0);
	r_show_session(&d, 2, 4096);
	r_config_show(&d);
	r_config_reload(&d);
	r_list_checkpoints(&d, -1);
	r_warmup(&d, "w", 0);
	r_restore(&d, 1, "w", 0);
	r_evict(&d, KVPALACE__V1__TIER__TIER_HOST, 0, 0, 0);
	r_evict(&d, KVPALACE__V1__TIER__TIER_DISK, 0, 0, 0);
	r_purge(&d, 1, 0);
	r_purge(&d, 0, 4000000000ull);
	r_drop_session(&d, 2, 0);
	r_drop_session(&d, 2, 1);
	r_drop_pool(&d, 1, 1);
	r_stats(&d);
	sc_rt(1, &d);
	emit_conn("conn-admin-ops");

	/* -- pipelined worker requests, then the client goes: the
	 * use-after-free of issue 14 (a second job replaced the first's
	 * ticket; the first then answered a freed connection) -- */
	sc_reset(0);
	sc_open(0, 0);
	dg_reset(&d);
	for (int i = 0; i < 6; i++)
		r_list_checkpoints(&d, -1);
	sc_send(0, &d);
	sc_op(FUZZ_CONN_CLOSE, 0);
	emit_conn("conn-pipelined-workers-close");
	sc_reset(0);
	sc_open(0, 0);
	for (int i = 0; i < 3; i++) {
		dg_reset(&d);
		r_list_checkpoints(&d, -1);
		r_list_checkpoints(&d, -1);
		sc_send(0, &d);
	}
	sc_step(2);
	sc_op(FUZZ_CONN_READ, 0);
	sc_op(FUZZ_CONN_WAIT, 0);
	emit_conn("conn-pipelined-workers-read");
	/* a Restore sent again and again, the connection shut, then gone */
	sc_reset(0);
	sc_open(0, 0);
	dg_session(&d, 6);
	r_checkpoint(&d, 2, "r");
	sc_rt(0, &d);
	dg_reset(&d);
	r_restore(&d, 1, "r", -1);
	sc_send(0, &d);
	sc_op(FUZZ_CONN_SEND_AGAIN, 0);
	sc_op(FUZZ_CONN_SEND_AGAIN, 0);
	sc_step(0);
	sc_op(FUZZ_CONN_SHUT_WR, 0);
	emit_conn("conn-restore-again-shut");
	sc_reset(0);
	sc_open(0, 0);
	dg_session(&d, 4);
	sc_rt(0, &d);
	dg_reset(&d);
	r_checkpoint(&d, 2, "a");
	r_checkpoint(&d, 2, "b");
	r_list_checkpoints(&d, -1);
	r_restore(&d, 1, "a", -1);
	r_compact(&d, 2);
	r_report(&d, 2, 0, 8, 1, 0);
	r_stats(&d);
	sc_send(0, &d);
	sc_step(1);
	sc_op(FUZZ_CONN_SHUT_WR, 0);
	sc_step(1);
	sc_op(FUZZ_CONN_CLOSE, 0);
	emit_conn("conn-mixed-workers-close");

	/* -- a client that does not read: replies queue in the daemon, it
	 * stops receiving at max-requests-in-flight -- */
	sc_reset(0);
	sc_open(0, 0);
	dg_reset(&d);
	for (int i = 0; i < 60; i++)
		r_stats(&d);
	for (int i = 0; i < 20; i++) {
		sc_send(0, &d);
		sc_step(2);
	}
	sc_op(FUZZ_CONN_READ, 0);
	sc_step(8);
	sc_op(FUZZ_CONN_READ, 0);
	emit_conn("conn-no-reading");

	/* -- several connections: a fourth client is refused; one ends with
	 * an empty datagram, one sends a descriptor, one a bad frame -- */
	sc_reset(0);
	for (unsigned int k = 0; k < 4; k++)
		sc_open(k, 0);
	dg_session(&d, 5);
	sc_rt(0, &d);
	dg_reset(&d);
	r_match(&d, 1, 5, 40, 0, NULL);
	r_list_sessions(&d, 0, 0);
	sc_rt(1, &d);
	sc_op(FUZZ_CONN_READ, 3);
	sc_send_fd(2, &d, 1);
	sc_op(FUZZ_CONN_SEND_EOF, 1);
	dg_reset(&d);
	dg_raw(&d, "KVP1\x01\x00", 6);
	sc_send(0, &d);
	sc_op(FUZZ_CONN_WAIT, 0);
	for (unsigned int k = 0; k < 4; k++)
		sc_op(FUZZ_CONN_READ, k);
	sc_open(3, 0); /* room again */
	dg_reset(&d);
	r_hello(&d, 1);
	sc_rt(3, &d);
	emit_conn("conn-several");
}

/* ---- fuzz_ckpt ------------------------------------------------------------ */

static int tmp_dir_fd(char *dir, size_t len)
{
	int fd;

	snprintf(dir, len, "/tmp/kvp-gen-corpus-XXXXXX");
	if (!mkdtemp(dir))
		fail("mkdtemp");
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fail(dir);
	return fd;
}

static unsigned char *slurp(int dir_fd, const char *name, size_t *ret_len)
{
	struct stat sb;
	unsigned char *b;
	int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &sb) < 0)
		fail(name);
	b = malloc((size_t)sb.st_size + 1);
	if (!b || read(fd, b, (size_t)sb.st_size) != sb.st_size)
		fail(name);
	close(fd);
	*ret_len = (size_t)sb.st_size;
	return b;
}

/* Writes a checkpoint of n_tokens tokens with layout l through ckpt_write
 * and returns its bytes. Named "c", the name fuzz_ckpt reads it under: the
 * file records its name (format version 3) and is refused under another. */
/* Key spans the next make_ckpt records (then none again). */
static const struct ckpt_span *ckpt_spans;
static uint32_t ckpt_n_spans;

static unsigned char *make_ckpt(int dir_fd, const struct shm_layout *l, uint64_t n_tokens,
				size_t *ret_len)
{
	struct ckpt_meta m = {.spans = ckpt_spans, .n_spans = ckpt_n_spans};
	struct ckpt_token *t = calloc(n_tokens ? n_tokens : 1, sizeof(*t));
	const void **pages;
	unsigned char *data;
	char why[256];

	m.uid = FUZZ_REQ_UID_A;
	snprintf(m.model_id, sizeof(m.model_id), "llama-3-8b");
	m.layout = *l;
	m.page_bytes = shm_page_bytes(l);
	m.root = (XXH128_hash_t){.low64 = 0x1111, .high64 = 0x2222};
	m.n_tokens = n_tokens;
	m.n_pages = (uint32_t)((n_tokens + l->block_tokens - 1) / l->block_tokens);
	m.created_ns = 1700000000000000000ull;
	pages = calloc(m.n_pages ? m.n_pages : 1, sizeof(*pages));
	data = malloc(m.page_bytes * (m.n_pages ? m.n_pages : 1));
	if (!t || !pages || !data)
		fail("calloc");
	for (uint64_t i = 0; i < n_tokens; i++)
		t[i] = (struct ckpt_token){.id = (uint32_t)(i * 17 + 3),
					   .pos = (uint32_t)i,
					   .turn = (uint32_t)(i / 5),
					   .role = (uint16_t)(i % 4),
					   .flags = (uint16_t)(i % 3 == 0)};
	for (uint64_t i = 0; i < m.page_bytes * m.n_pages; i++)
		data[i] = (unsigned char)(i * 131 + 7);
	for (uint32_t i = 0; i < m.n_pages; i++)
		pages[i] = data + (uint64_t)i * m.page_bytes;
	if (ckpt_write(dir_fd, "c", &m, t, pages, NULL, why, sizeof(why)) < 0) {
		fprintf(stderr, "gen_corpus: ckpt_write: %s\n", why);
		exit(1);
	}
	free(t);
	free(pages);
	free(data);
	return slurp(dir_fd, "c", ret_len);
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void emit_ckpt(const char *name, unsigned int flags, const unsigned char *b, size_t n)
{
	unsigned char f = (unsigned char)flags;

	emit("fuzz_ckpt", name, &f, 1, b, n);
}

static void gen_ckpts(void)
{
	const struct shm_layout tiny = FUZZ_SPILL_LAYOUT;
	const struct shm_layout q8 = {.n_layers = 1,
				      .n_kv_heads = 2,
				      .head_dim = 32,
				      .block_tokens = 4,
				      .dtype = SHM_DTYPE_INT8,
				      .quant_group = 16};
	const struct shm_layout q4 = {.n_layers = 1,
				      .n_kv_heads = 1,
				      .head_dim = 64,
				      .block_tokens = 8,
				      .dtype = SHM_DTYPE_INT4,
				      .quant_group = 32};
	char dir[64];
	int dir_fd = tmp_dir_fd(dir, sizeof(dir));
	unsigned char *b;
	size_t n;

	b = make_ckpt(dir_fd, &tiny, 0, &n);
	emit_ckpt("ckpt-empty", 0, b, n);
	free(b);
	b = make_ckpt(dir_fd, &q8, 3, &n);
	emit_ckpt("ckpt-int8-partial-page", 0, b, n);
	free(b);
	b = make_ckpt(dir_fd, &q4, 8, &n);
	emit_ckpt("ckpt-int4-one-page", 0, b, n);
	free(b);

	b = make_ckpt(dir_fd, &tiny, 9, &n);
	emit_ckpt("ckpt-three-pages", 0, b, n);
	emit_ckpt("ckpt-three-pages-repair", FUZZ_CKPT_REPAIR, b, n);
	{
		/* Format 4: key spans after the token records. */
		static const struct ckpt_span sp[] = {{1, 2, {7, 8}}, {4, 5, {9, 10}}};
		unsigned char *k;
		size_t kn;

		ckpt_spans = sp;
		ckpt_n_spans = 2;
		k = make_ckpt(dir_fd, &tiny, 9, &kn);
		ckpt_spans = NULL;
		ckpt_n_spans = 0;
		emit_ckpt("ckpt-key-spans", 0, k, kn);
		emit_ckpt("ckpt-key-spans-repair", FUZZ_CKPT_REPAIR, k, kn);
		free(k);
	}
	/* damage, each on a fresh copy */
	{
		unsigned char *c = malloc(n);

		memcpy(c, b, n);
		c[600] ^= 1; /* a token record */
		emit_ckpt("ckpt-bad-token-sum", 0, c, n);
		memcpy(c, b, n);
		c[513] = 9;	 /* a token's id byte: fine once repaired */
		c[512 + 12] = 7; /* an unknown role */
		emit_ckpt("ckpt-bad-role-repaired", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		c[4096 + 100] ^= 0x40; /* a page */
		emit_ckpt("ckpt-bad-page", 0, c, n);
		memcpy(c, b, n);
		c[n - 1] ^= 1; /* the whole-file hash */
		emit_ckpt("ckpt-bad-trailer", 0, c, n);
		memcpy(c, b, n);
		put32(c + 8, CKPT_FORMAT_VERSION + 1); /* a newer version */
		emit_ckpt("ckpt-newer-version", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		put32(c + 28, 4); /* n_pages disagrees with n_tokens */
		emit_ckpt("ckpt-bad-page-count", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		c[32] = 200; /* n_tokens far past the file */
		put32(c + 28, 50);
		emit_ckpt("ckpt-counts-past-file", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		c[152] = 0x01; /* model id not printable */
		emit_ckpt("ckpt-bad-model", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		c[4000] = 1; /* padding before the pages */
		emit_ckpt("ckpt-dirty-padding", FUZZ_CKPT_REPAIR, c, n);
		emit_ckpt("ckpt-truncated", 0, b, n - 40);
		emit_ckpt("ckpt-header-only", 0, b, 512);
		emit_ckpt("ckpt-short", 0, b, 100);
		memcpy(c, b, n);
		c[0] = 'X';
		emit_ckpt("ckpt-bad-magic", 0, c, n);
		/* The recorded name (version 3, offset 304): another one, an
		 * invalid one; and a version 2 file, which records none. */
		memcpy(c, b, n);
		c[304] = 'd';
		emit_ckpt("ckpt-other-name", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		c[305] = '/';
		emit_ckpt("ckpt-invalid-name", FUZZ_CKPT_REPAIR, c, n);
		memcpy(c, b, n);
		put32(c + 8, 2);
		memset(c + 304, 0, 72);
		emit_ckpt("ckpt-version-2", FUZZ_CKPT_REPAIR, c, n);
		free(c);
	}
	{
		unsigned char *c = malloc(n + 4096);

		memcpy(c, b, n);
		memset(c + n, 0, 4096);
		emit_ckpt("ckpt-trailing-bytes", FUZZ_CKPT_REPAIR, c, n + 4096);
		free(c);
	}
	free(b);
	unlinkat(dir_fd, "c", 0);
	close(dir_fd);
	rmdir(dir);
}

/* ---- fuzz_spill ----------------------------------------------------------- */

struct spill_seed {
	unsigned char ctl[FUZZ_SPILL_CTL];
	unsigned char hdrs[64 * SPILL_PAGE_HDR];
	size_t len;
};

static void ss_init(struct spill_seed *s, uint32_t cap_code, uint32_t first, unsigned int flags)
{
	memset(s, 0, sizeof(*s));
	s->ctl[0] = (unsigned char)cap_code;
	s->ctl[1] = (unsigned char)(cap_code >> 8);
	s->ctl[2] = (unsigned char)first;
	s->ctl[3] = (unsigned char)(first >> 8);
	s->ctl[4] = (unsigned char)flags;
}

/* Appends a valid header for page hash (low half h) with parent p. */
static void ss_add_used(struct spill *sp, struct spill_seed *s, uint64_t h, uint64_t p,
			uint64_t seq, uint32_t flags, uint64_t used)
{
	struct spill_page_hdr ph = {
		.hash = {.low64 = h, .high64 = ~h},
		.parent = {.low64 = p, .high64 = ~p},
		.sum = h * 0x9e3779b97f4a7c15ull,
		.flags = flags,
		.stored_bytes = (uint32_t)sp->page_bytes,
		.used = used,
	};

	sp->seq = seq - 1;
	spill_hdr_encode(sp, &ph, s->hdrs + s->len);
	s->len += SPILL_PAGE_HDR;
}

/* Appends a valid header, its last-use stamp the same as its sequence. */
static void ss_add(struct spill *sp, struct spill_seed *s, uint64_t h, uint64_t p, uint64_t seq,
		   uint32_t flags)
{
	ss_add_used(sp, s, h, p, seq, flags, seq);
}

static void ss_emit(const char *name, const struct spill_seed *s)
{
	emit("fuzz_spill", name, s->ctl, sizeof(s->ctl), s->hdrs, s->len);
}

static void gen_spill(void)
{
	const struct shm_layout l = FUZZ_SPILL_LAYOUT;
	XXH128_hash_t root = {.low64 = FUZZ_SPILL_ROOT_LO, .high64 = FUZZ_SPILL_ROOT_HI};
	static struct spill_seed s;
	struct spill sp;
	char dir[64], why[256], name[96];
	int dir_fd = tmp_dir_fd(dir, sizeof(dir));

	if (spill_open(&sp, dir, FUZZ_SPILL_UID, FUZZ_SPILL_MODEL, &l, root,
		       64 * shm_page_bytes(&l), why, sizeof(why)) < 0) {
		fprintf(stderr, "gen_corpus: spill_open: %s\n", why);
		exit(1);
	}
	/* capacity = 1 + code */
	ss_init(&s, 15, 0, 0);
	ss_add(&sp, &s, 0x100, root.low64, 1, SPILL_PAGE_FIRST);
	ss_emit("spill-one", &s);
	ss_init(&s, 15, 0, 0);
	for (uint64_t i = 0; i < 8; i++)
		ss_add(&sp, &s, 0x200 + i, i ? 0x200 + i - 1 : root.low64, 10 + i,
		       i ? 0 : SPILL_PAGE_FIRST);
	ss_emit("spill-chain", &s);
	s.ctl[4] = FUZZ_SPILL_PICKY;
	ss_emit("spill-chain-picky", &s);
	ss_init(&s, 15, 3, 0);
	ss_add(&sp, &s, 0x300, root.low64, 5, SPILL_PAGE_FIRST);
	ss_add(&sp, &s, 0x300, root.low64, 9, SPILL_PAGE_FIRST); /* newer copy */
	ss_add(&sp, &s, 0x300, root.low64, 2, SPILL_PAGE_FIRST); /* older copy */
	ss_add(&sp, &s, 0x301, 0x300, 3, 0);
	ss_emit("spill-duplicates", &s);
	ss_init(&s, 4999, 4500, 0); /* past the first 4096-header read, after a hole */
	ss_add(&sp, &s, 0x400, root.low64, 1, SPILL_PAGE_FIRST);
	ss_add(&sp, &s, 0x401, 0x400, 2, 0);
	ss_add(&sp, &s, 0x402, 0x401, 3, 0);
	ss_emit("spill-second-chunk", &s);
	ss_init(&s, 4099, 4095, 0); /* across the boundary of two reads */
	ss_add(&sp, &s, 0x500, root.low64, 1, SPILL_PAGE_FIRST);
	ss_add(&sp, &s, 0x501, 0x500, 2, 0);
	ss_emit("spill-read-boundary", &s);
	ss_init(&s, 15, 2, FUZZ_SPILL_TRUNCATE);
	ss_add(&sp, &s, 0x600, root.low64, 1, SPILL_PAGE_FIRST);
	ss_add(&sp, &s, 0x601, 0x600, 2, 0);
	s.len -= SPILL_PAGE_HDR / 2; /* the file ends inside the second */
	ss_emit("spill-truncated", &s);
	ss_init(&s, 0, 0, 0); /* capacity 1 */
	ss_add(&sp, &s, 0x700, root.low64, 1, SPILL_PAGE_FIRST);
	ss_add(&sp, &s, 0x701, 0x700, 2, 0); /* no room: not written */
	ss_emit("spill-capacity-one", &s);
	ss_init(&s, 63, 0, 0); /* every extent in use */
	for (uint64_t i = 0; i < 64; i++)
		ss_add(&sp, &s, 0x800 + i, root.low64, i + 1, SPILL_PAGE_FIRST);
	ss_emit("spill-full", &s);
	ss_init(&s, 15, 0, 0); /* last use in another order than the writes */
	for (uint64_t i = 0; i < 6; i++)
		ss_add_used(&sp, &s, 0xa00 + i, root.low64, 1 + i, SPILL_PAGE_FIRST, 100 - 7 * i);
	ss_emit("spill-stamps", &s);
	ss_init(&s, 15, 0, 0); /* as format 2 wrote them: no stamp */
	ss_add_used(&sp, &s, 0xb00, root.low64, 1, SPILL_PAGE_FIRST, 0);
	ss_add_used(&sp, &s, 0xb01, 0xb00, 2, 0, 0);
	memset(s.hdrs + FUZZ_SPILL_PH_USED, 0, 16);
	memset(s.hdrs + SPILL_PAGE_HDR + FUZZ_SPILL_PH_USED, 0, 16);
	ss_emit("spill-format2", &s);
	ss_init(&s, 15, 0, 0); /* a stamp whose seal fails: the page without it */
	ss_add_used(&sp, &s, 0xc00, root.low64, 1, SPILL_PAGE_FIRST, 55);
	s.hdrs[FUZZ_SPILL_PH_USED] ^= 1;
	ss_emit("spill-bad-seal", &s);
	ss_init(&s, 15, 0, 0);
	ss_add(&sp, &s, 0x900, root.low64, 1, SPILL_PAGE_FIRST);
	s.hdrs[20] ^= 1; /* a flipped bit */
	ss_add(&sp, &s, 0x901, root.low64, 2, SPILL_PAGE_FIRST);
	ss_emit("spill-flipped-bit", &s);
	s.ctl[4] = FUZZ_SPILL_REPAIR; /* the checksum made right again */
	ss_emit("spill-flipped-bit-repaired", &s);
	ss_init(&s, 15, 0, FUZZ_SPILL_REPAIR);
	for (size_t i = 0; i < 4 * SPILL_PAGE_HDR; i++)
		s.hdrs[i] = (unsigned char)(i * 37 + 11);
	memcpy(s.hdrs, "KVPPAGE1", 8);
	s.len = 4 * SPILL_PAGE_HDR;
	ss_emit("spill-garbage-repaired", &s);
	s.ctl[4] = 0;
	ss_emit("spill-garbage", &s);
	{
		/* A header of another pool: right magic, checksum seeded with
		 * another root. */
		struct spill other = sp;

		other.root.low64 ^= 1;
		ss_init(&s, 15, 0, 0);
		other.seq = 0;
		{
			struct spill_page_hdr ph = {.hash = {1, 2}, .parent = {3, 4}, .sum = 5};

			spill_hdr_encode(&other, &ph, s.hdrs);
			s.len = SPILL_PAGE_HDR;
		}
		ss_emit("spill-other-pool", &s);
	}
	spill_file_name(FUZZ_SPILL_UID, root, name, sizeof(name));
	spill_close(&sp);
	unlinkat(dir_fd, name, 0);
	close(dir_fd);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS-DIR (tests/fuzz/corpus)\n", argv[0]);
		return 2;
	}
	root_dir = argv[1];
	if (mkdir(root_dir, 0755) < 0 && errno != EEXIST)
		fail(root_dir);
	gen_requests();
	gen_conns();
	gen_ckpts();
	gen_spill();
	printf("%d corpus files written under %s\n", n_written, root_dir);
	return 0;
}
