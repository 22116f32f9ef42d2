/* tests/fuzz/fuzz_request.c — fuzz target: one received datagram through
 * the daemon's request path.
 *
 * Byte 0 of the input picks the connection and what happens around the
 * datagram (FUZZ_REQ_* in fuzz.h); the rest is the datagram, handled as
 * daemon/server/conn.c handles a received one: frame_next over at most
 * FRAME_MAX_BATCH frames, each unpacked with the server's byte-budgeted
 * arena and dispatched (dispatch runs validate_request first) against an
 * in-process daemon: the struct cache of a struct server configured with a
 * 4 MiB host tier of 1 MiB pools, no disk tier and no worker threads
 * (cache->worker is NULL, so checkpoint requests must answer an error).
 * A datagram the daemon would disconnect for (over the cap, a bad frame,
 * an undecodable request, too many frames) ends the connection the same
 * way: its leases are released and its reservations rolled back.
 *
 * Aborts (a finding) when cache_check fails after a request or a
 * disconnect, when a reply lacks a required field, exceeds the message cap
 * or does not decode, or when dispatch parks or hands off work it cannot.
 * Replies go nowhere; a passed fd is closed.
 *
 * The daemon state outlives an input, so later inputs act on the pools,
 * sessions and leases of earlier ones (ids are small and start at 1 in a
 * fresh state); it is rebuilt every FUZZ_RESET_EVERY inputs to bound
 * memory, and before an input with FUZZ_REQ_FRESH (every seed has it, so
 * each corpus file replays alone). FUZZ_REQUEST_VERBOSE=1 prints each
 * reply's status, operation and reason to stderr.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "config.h"
#include "dispatch.h"
#include "frame.h"
#include "fuzz.h"
#include "lease.h"
#include "log.h"
#include "peer.h"
#include "server.h"
#include "session.h"

#define FUZZ_RESET_EVERY 1000u

enum { CONN_A, CONN_B, CONN_ADMIN, N_CONNS };

/* Hermetic: no configuration file, no directory is ever touched (no disk
 * tier, no checkpoint directory); small limits keep memory bounded. The
 * same arguments serve ConfigReload, so a reload changes nothing. */
static char *fuzz_argv[] = {
	"kvpalaced",
	"--config=/dev/null",
	"--host-tier-size=4M",
	"--host-pool-size=1M",
	"--disk-pool-size=0",
	"--max-pools-per-tenant=4",
	"--max-sessions-per-pool=64",
	"--max-leases-per-client=64",
	"--max-session-tokens=65536",
	"--log-level=crit",
	"--state-dir=/nonexistent/kvpalace-fuzz/state",
	"--cache-dir=/nonexistent/kvpalace-fuzz/cache",
	NULL,
};

static struct {
	int ready;
	int verbose;
	unsigned long inputs;
	struct config cfg;
	struct server srv;
	struct peer peers[N_CONNS];
	void *arena_buf;
	struct frame_arena check_arena; /* decodes replies */
	void *check_buf;
} st;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz_request: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

static void check_cache(const char *after)
{
	if (cache_check(&st.srv.cache) < 0)
		die("cache_check failed after %s", after);
}

/* What the server does for the service layer (service/peer.h): no
 * request may be answered later, since the cache has no workers. */
static void fuzz_ticket_start(struct peer *p, struct ticket *t, uint64_t id)
{
	(void)p;
	(void)t;
	die("request %llu was handed to a worker, and the cache has none", (unsigned long long)id);
}

static void fuzz_deliver(struct ticket *t, struct reply *r)
{
	(void)t;
	(void)r;
	die("a ticket was delivered, and none was started");
}

static int fuzz_reload(struct peer *p, const char *who, struct confview_reload *ret, char *err,
		       size_t errlen)
{
	(void)p;
	return server_reload_config(&st.srv, who, ret, err, errlen);
}

static const struct peer_ops fuzz_ops = {
	.ticket_start = fuzz_ticket_start,
	.deliver = fuzz_deliver,
	.reload_config = fuzz_reload,
};

/* A new client in slot i, as conn_start makes one. */
static void conn_open(int i)
{
	uid_t uid = i == CONN_ADMIN ? 0 : i == CONN_B ? FUZZ_REQ_UID_B : FUZZ_REQ_UID_A;

	peer_init(&st.peers[i], &fuzz_ops, uid, uid, getpid(), i == CONN_ADMIN);
}

/* What conn_close does to the daemon's state (release_client_state):
 * the service layer told (event subscriptions, an eviction run under
 * way), leases released, reservations rolled back, sessions closed unless
 * persistent. */
static void conn_drop(int i)
{
	struct cache *cache = &st.srv.cache;
	struct peer *c = &st.peers[i];
	struct session_left left = {0};
	struct list *it, *tmp;

	dispatch_peer_gone(c);
	list_for_each_safe (it, tmp, &c->leases)
		lease_release(cache, list_entry(it, struct lease, owner_link));
	c->n_leases = 0;
	list_for_each_safe (it, tmp, &c->writing.sessions)
		session_rollback(cache, list_entry(it, struct session, writer_link));
	if (c->writing.reserved_pages)
		die("%u reserved pages left after a disconnect", c->writing.reserved_pages);
	session_owner_release(cache, &c->sessions, &left);
	check_cache("a disconnect");
}

static void state_new(void)
{
	cache_init(&st.srv.cache, &st.cfg);
	st.srv.cache.ctr.connections = N_CONNS;
	for (int i = 0; i < N_CONNS; i++)
		conn_open(i);
}

static void state_free(void)
{
	for (int i = 0; i < N_CONNS; i++)
		conn_drop(i);
	cache_fini(&st.srv.cache);
}

static void teardown(void)
{
	if (!st.ready)
		return;
	state_free();
	free(st.arena_buf);
	free(st.check_buf);
	st.ready = 0;
}

static void setup(void)
{
	int argc = (int)(sizeof(fuzz_argv) / sizeof(fuzz_argv[0])) - 1;
	enum config_action act;
	char err[256];
	size_t arena;

	config_defaults(&st.cfg);
	if (config_parse_args(&st.cfg, argc, fuzz_argv, &act, err, sizeof(err)) < 0)
		die("configuration: %s", err);
	log_set_level(st.cfg.log_level);
	st.srv.cfg = &st.cfg;
	st.srv.argc = argc;
	st.srv.argv = fuzz_argv;
	list_init(&st.srv.conns);
	arena = frame_arena_bytes(st.cfg.max_message_bytes);
	st.arena_buf = malloc(arena);
	st.check_buf = malloc(arena);
	if (!st.arena_buf || !st.check_buf)
		die("out of memory");
	frame_arena_init(&st.srv.arena, st.arena_buf, arena);
	frame_arena_init(&st.check_arena, st.check_buf, arena);
	st.verbose = getenv("FUZZ_REQUEST_VERBOSE") && *getenv("FUZZ_REQUEST_VERBOSE") == '1';
	state_new();
	st.ready = 1;
	atexit(teardown);
}

/* What the client would receive: every required field set, within the
 * cap, and decodable. */
static void check_reply(const struct reply *r, const Kvpalace__V1__Request *req)
{
	size_t n;
	unsigned char *buf;

	if (!protobuf_c_message_check(&r->resp.base))
		die("reply to op %d lacks a required field", (int)req->op_case);
	n = frame_packed_bytes(&r->resp.base);
	if (n > st.cfg.max_message_bytes)
		die("reply to op %d is %zu bytes, over the %u-byte cap", (int)req->op_case, n,
		    st.cfg.max_message_bytes);
	buf = malloc(n);
	if (!buf)
		die("out of memory");
	frame_pack_sized(&r->resp.base, n, buf);
	if (frame_header_check(buf, n, st.cfg.max_message_bytes) != (int)(n - FRAME_HEADER_BYTES))
		die("reply to op %d: bad frame header", (int)req->op_case);
	frame_arena_reset(&st.check_arena);
	if (!frame_unpack_response(&st.check_arena, buf + FRAME_HEADER_BYTES,
				   n - FRAME_HEADER_BYTES))
		die("reply to op %d does not decode", (int)req->op_case);
	free(buf);
	if (st.verbose)
		fprintf(stderr, "  request %llu op %d -> status %d op %d%s%s\n",
			(unsigned long long)req->id, (int)req->op_case, (int)r->resp.status,
			(int)r->resp.op_case, r->resp.error ? ": " : "",
			r->resp.error ? r->resp.error : "");
}

/* run_frame of daemon/server/conn.c. Returns 0, or -1 when the daemon would
 * close the connection. */
static int run_frame(struct peer *c, const uint8_t *payload, size_t len)
{
	struct cache *cache = &st.srv.cache;
	Kvpalace__V1__Request *req;
	struct reply r;
	int ret;

	frame_arena_reset(&st.srv.arena);
	req = frame_unpack_request(&st.srv.arena, payload, len);
	if (!req) {
		if (st.verbose)
			fprintf(stderr, "  undecodable request: disconnect\n");
		return -1;
	}
	ret = dispatch(cache, c, req, 0, &r);
	if (ret == -EAGAIN) {
		/* Waits for disk I/O; without a disk tier nothing should.
		 * The daemon retries, in the end with no_park set. */
		reply_fini(&r);
		check_cache("a parked request");
		ret = dispatch(cache, c, req, 1, &r);
		if (ret == -EAGAIN)
			die("op %d parked with no_park set", (int)req->op_case);
	}
	if (ret == -EINPROGRESS)
		die("op %d was handed to a worker, and the cache has none", (int)req->op_case);
	cache->ctr.requests++;
	if (r.resp.status != KVPALACE__V1__STATUS__STATUS_OK)
		cache->ctr.errors++;
	check_reply(&r, req);
	if (r.pass_fd >= 0)
		close(r.pass_fd);
	reply_fini(&r);
	check_cache("a request");
	return 0;
}

/* handle_message of daemon/server/conn.c for n bytes in buf. Returns 0, or -1
 * when the daemon would close the connection. */
static int handle_datagram(struct peer *c, const uint8_t *buf, size_t n)
{
	uint32_t max_bytes = st.cfg.max_message_bytes;
	unsigned int frames = 0;
	const uint8_t *payload;
	size_t off = 0, len;
	int ret;

	if (n == 0 || n > max_bytes)
		return -1; /* end of stream, or truncated by the receive */
	while ((ret = frame_next(buf, n, &off, max_bytes, &payload, &len)) > 0) {
		if (++frames > FRAME_MAX_BATCH)
			return -1;
		if (run_frame(c, payload, len) < 0)
			return -1;
	}
	return ret < 0 ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned int flags;
	int i;

	if (!st.ready)
		setup();
	if (size < 1)
		return 0;
	flags = data[0];
	if ((flags & FUZZ_REQ_FRESH) || ++st.inputs % FUZZ_RESET_EVERY == 0) {
		state_free();
		state_new();
	}
	i = flags & FUZZ_REQ_ADMIN ? CONN_ADMIN : flags & FUZZ_REQ_TENANT_B ? CONN_B : CONN_A;
	if (handle_datagram(&st.peers[i], data + 1, size - 1) < 0 || (flags & FUZZ_REQ_CLOSE)) {
		conn_drop(i);
		conn_open(i); /* the client connects again */
	}
	return 0;
}
