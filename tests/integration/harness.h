/* tests/integration/harness.h — what every integration test needs: a real
 * kvpalaced on sockets in a private temporary directory, child processes,
 * deterministic K/V contents, and a raw protocol client for the tests that
 * must send what the library never would.
 *
 * The daemon binary comes from $KVPALACED (meson passes
 * kvpalaced.full_path()), kvpalacectl from $KVPALACECTL. Each test starts
 * its own daemon in its own directory, so tests may run in parallel. When
 * $KVPALACED_WRAPPER is set (meson test --setup valgrind), its words run
 * the daemon: "valgrind --error-exitcode=1 ..." kvpalaced ....
 *
 * Child processes must not use cmocka's assertions (a failed assertion
 * would longjmp into the copy of the parent's test runner): they use
 * CHILD_CHECK and return non-zero, which the parent asserts on.
 */
#ifndef KVP_TEST_HARNESS_H
#define KVP_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "frame.h"
#include "kvpalace.h"

struct harness {
	char dir[80];	      /* private temporary directory, removed at stop */
	char sock[108];	      /* client socket */
	char admin_sock[108]; /* admin socket */
	pid_t pid;	      /* the daemon, 0 when not running */
};

/* Starts kvpalaced on sockets in a new temporary directory with the
 * options in extra (NULL-terminated, may be NULL) and waits until both
 * sockets accept connections. The directory is world-searchable so a test
 * may connect as another user. Returns 0, or -1 after printing why (no
 * $KVPALACED, the daemon exited, never became ready). */
int harness_start(struct harness *h, const char *const *extra);

/* When set, every daemon this process starts gets --eviction with it
 * before the test's own options: the tests whose assertions spell out
 * LRU's victim order set "lru" at the top of main (the daemon's default
 * is window, whose order differs by design). NULL: the default, or
 * $KVP_TEST_EVICTION when set (to run a suite under another order:
 * KVP_TEST_EVICTION=lfu meson test --suite integration). Likewise
 * $KVP_TEST_DAEMON_ARGS, words split at blanks, goes to every daemon
 * before the test's own options ("--host-prewarm-watermark 0.5").
 * Tests that check the configuration or a default then differ by design
 * (test_ctl's config golden, test_prewarm's run without a mark). */
extern const char *harness_eviction;

/* Stops the daemon with SIGTERM (SIGKILL if it lingers) and removes the
 * directory. Returns 0 when the daemon was still running and exited with
 * status 0, else -1 after printing how it ended: a daemon that crashed
 * during a test fails that test. NULL and a stopped harness return 0. */
int harness_stop(struct harness *h);

/* Ends the daemon with sig (SIGTERM: a clean stop; SIGKILL: a crash) and
 * starts it again in the same directory — same sockets, state and cache
 * directories — with the options in extra. Returns 0, or -1 after printing
 * why (the old daemon did not end, the new one did not start). */
int harness_restart(struct harness *h, int sig, const char *const *extra);
/* Waits until the warm-restart scan of every open pool has listed what
 * its spill file holds (through a purge that forgets nothing). Returns 0
 * or the purge's error. */
int harness_wait_scans(struct harness *h);
/* kvp_pool_open, then waits until the warm-restart scan of every pool has
 * listed what the spill files hold (pools open at once and list their
 * pages while the daemon serves). Returns as kvp_pool_open, or the
 * error of the wait. */
int harness_pool_open(struct harness *h, kvp_client *c, const char *model_id,
		      const struct kvp_layout *layout, kvp_pool **ret);

/* True while the daemon process has not exited. */
int harness_daemon_alive(struct harness *h);

/* cmocka fixtures: start a daemon with default options (or with extra
 * options) into *state; stop it, failing the test when it did not exit
 * cleanly. */
int harness_setup(void **state);
int harness_setup_args(void **state, const char *const *extra);
int harness_teardown(void **state);

/* ---- child processes ---------------------------------------------------- */

#define CHILD_CHECK(cond)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "child %d: %s:%d: check failed: %s\n", (int)getpid(),      \
				__FILE__, __LINE__, #cond);                                        \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* Same, printing two integers that should have been equal. */
#define CHILD_CHECK_EQ(a, b)                                                                       \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		if (a_ != b_) {                                                                    \
			fprintf(stderr, "child %d: %s:%d: %s == %s failed: %lld != %lld\n",        \
				(int)getpid(), __FILE__, __LINE__, #a, #b, a_, b_);                \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* Forks a child that runs fn(arg) and exits with its return value; it is
 * killed if the test process ends first. Returns the child's pid or -1. */
pid_t harness_fork(int (*fn)(void *), void *arg);

/* Waits for a child. Returns its exit status, 128 + signal when a signal
 * killed it, or -1 when it did not end within timeout_s seconds (it is then
 * killed). */
int harness_wait(pid_t pid, int timeout_s);

/* harness_fork + harness_wait with a generous timeout. */
int harness_run_child(int (*fn)(void *), void *arg);

/* Runs argv[0] with argv, extra environment entries env ("NAME=value",
 * NULL-terminated, may be NULL), stdout and stderr captured into out (cap
 * bytes, NUL-terminated). Returns the exit status as harness_wait. */
int harness_run_capture(char *const argv[], char *const env[], char *out, size_t cap);

/* Runs $KVPALACECTL --socket sock with the NULL-terminated arguments that
 * follow, output captured as harness_run_capture. Returns its exit
 * status, or -1 when $KVPALACECTL is unset. */
int harness_ctl(char *out, size_t cap, const char *sock, ...);

/* Opens (read-write) the one spill file in h's cache directory. Returns
 * the descriptor, or -1 when there is not exactly one. */
int harness_spill_open(const struct harness *h);

/* Drops root to uid/gid 65534 (nobody) in a child. Returns 0, or -1 when
 * not root or the switch failed. */
int harness_become_nobody(void);
/* Switches a child (of harness_fork) to uid and gid uid, asking again for
 * the signal that kills it with the test (a change of credentials clears
 * it). Returns 0, or -1 when the switch failed or the test is gone. */
int harness_become(uid_t uid);

/* A field of /proc/<pid>/status in kB (VmRSS, RssAnon, ...), or -1. */
long harness_proc_kb(pid_t pid, const char *field);
/* The q-quantile (0..1) of v[0..n), n > 0, sorting v in place. */
double harness_quantile(double *v, size_t n, double q);

/* ---- deterministic K/V ------------------------------------------------- */

/* The token id at position pos of sequence `seq` (a few sequences that
 * differ everywhere). */
uint32_t harness_token(uint32_t seq, uint64_t pos);
/* Fills a token array with harness_token(seq, from + i). */
void harness_tokens(uint32_t *tokens, size_t n, uint32_t seq, uint64_t from);

/* Writes the head_dim f16 elements of (token id, position, layer, kv,
 * head) with the formula of examples/demo_kv.h, keyed by token and
 * position, so a row at the wrong place, of the wrong token or of another
 * session shows. The tests' layouts are f16. */
void harness_kv_fill(uint16_t *row, uint32_t head_dim, uint32_t token, uint64_t pos, uint32_t layer,
		     uint32_t kv, uint32_t head);
/* Returns 0 when row holds what harness_kv_fill writes, else -1. */
int harness_kv_check(const uint16_t *row, uint32_t head_dim, uint32_t token, uint64_t pos,
		     uint32_t layer, uint32_t kv, uint32_t head);

/* Writes K and V of every layer and head of positions [from, from + n)
 * of session s of pool p (an f16 pool), whose tokens are tokens[0..n).
 * Returns 0, or -1 when the pool is not f16 or the library gave no pointer
 * for one of them. */
int harness_write_session(const kvp_pool *p, kvp_session *s, uint64_t from, const uint32_t *tokens,
			  size_t n);

/* Creates a session in p, appends tokens[0..n), writes their K/V and
 * commits them. Returns 0 and the session in *ret_session, or the first
 * error (-EFAULT when a row had no pointer). */
int harness_commit_session(kvp_pool *p, const uint32_t *tokens, size_t n,
			   kvp_session **ret_session);

/* Checks every row of leased positions [0, n) against tokens[0..n).
 * Returns the number of bad rows (a NULL pointer counts as bad). */
uint64_t harness_check_lease(const kvp_lease *l, const kvp_pool *p, const uint32_t *tokens,
			     uint64_t n);

/* ---- K/V keyed by the token prefix ------------------------------------- */

/* K/V that depends on the whole token prefix, as a real model's does: the
 * row of position pos is a function of (hash of tokens[0..pos], pos, layer,
 * kv, head). Two sessions get the same bytes at pos exactly when their first
 * pos + 1 tokens agree, so a page shared through the prefix index or a fork
 * reads right, and a page of another prefix (a hash chain that forgot its
 * parent, a salt mix-up, a stale slot) reads wrong even when its own tokens
 * agree. The tests' layouts are f16. */

/* The prefix hash after `token`, given the one before it (start with
 * HARNESS_PREFIX_SEED). */
#define HARNESS_PREFIX_SEED 0x6b7670616c616365ull
uint64_t harness_prefix_step(uint64_t ph, uint32_t token);
void harness_pkv_fill(uint16_t *row, uint32_t head_dim, uint64_t ph, uint64_t pos, uint32_t layer,
		      uint32_t kv, uint32_t head);
int harness_pkv_check(const uint16_t *row, uint32_t head_dim, uint64_t ph, uint64_t pos,
		      uint32_t layer, uint32_t kv, uint32_t head);
/* Writes positions [from, to) of session s whose tokens are tokens[0..to).
 * Returns 0, or -1 when the pool is not f16 or a pointer was missing. */
int harness_pkv_write_session(const kvp_pool *p, kvp_session *s, const uint32_t *tokens,
			      uint64_t from, uint64_t to);
/* Rows of positions [from, to) of session s (read through kvp_session_kv)
 * that differ from the prefix formula; a missing pointer counts. */
uint64_t harness_pkv_check_session(const kvp_pool *p, kvp_session *s, const uint32_t *tokens,
				   uint64_t from, uint64_t to);
/* Rows of leased positions [0, n) that differ. */
uint64_t harness_pkv_check_lease(const kvp_lease *l, const kvp_pool *p, const uint32_t *tokens,
				 uint64_t n);
/* The value of an f16 bit pattern (normal, subnormal or zero; the
 * harness's rows are never inf or NaN). */
float harness_f16_to_float(uint16_t x);

/* Rows of positions [0, n) — of lease l, or of session s when l is NULL —
 * that differ from the prefix formula by more than int8 quantization
 * allows (half a scale step, the scale amax/127 of each group of 32
 * channels, plus f16 rounding): what comes back from a page stored as
 * int8 (spill-dtype, a checkpoint written as int8). *ret_inexact gets the
 * rows that are not bit-exact. An f16 pool whose head_dim is a multiple
 * of 32; a missing row counts as bad. */
uint64_t harness_pkv_check_int8(const kvp_pool *p, const kvp_lease *l, kvp_session *s,
				const uint32_t *tokens, uint64_t n, uint64_t *ret_inexact);

/* Creates a session through p, appends tokens[0..n), writes their
 * prefix-keyed K/V and commits them. Returns 0 and the session, or the
 * first error (-EFAULT when a row had no pointer). */
int harness_pkv_commit_session(kvp_pool *p, const uint32_t *tokens, size_t n,
			       kvp_session **ret_session);

/* n rounded down to whole pages of block_tokens: what a match can return. */
static inline uint64_t harness_whole(uint64_t n, uint32_t block_tokens)
{
	return n / block_tokens * block_tokens;
}

/* Stats of one pool, by id, from a kvp_stats reply; NULL when absent. */
const struct kvp_pool_stats *harness_find_pool(const struct kvp_stats *st, uint64_t pool_id);
/* Asks for Stats through c and copies pool pool_id's entry to *ret, and the
 * daemon's open connections to *ret_connections when not NULL. Returns 0,
 * -ENOENT when the pool is not listed, or kvp_stats' error. */
int harness_pool_stats(kvp_client *c, uint64_t pool_id, struct kvp_pool_stats *ret,
		       uint64_t *ret_connections);

/* ---- raw protocol client ----------------------------------------------- */

struct raw {
	int sock;
	unsigned char buf[FRAME_MAX_MAX_BYTES + 64];  /* outgoing */
	unsigned char rbuf[FRAME_MAX_MAX_BYTES + 64]; /* the last datagram received */
	size_t rx_len, rx_off;			      /* its frames not yet returned */
	int batched_ok;	    /* accept several reply frames in one datagram */
	unsigned char *mem; /* unpacking arena */
	size_t mem_bytes;
	struct frame_arena arena;
};

/* Connects a SOCK_SEQPACKET socket to path, with a receive timeout of
 * 10 s so a daemon that never answers fails the test instead of hanging
 * it. Returns 0 or a negative errno. */
int raw_open(struct raw *r, const char *path);
void raw_close(struct raw *r);

/* Sends n bytes as one datagram, with fd as SCM_RIGHTS when >= 0. */
int raw_send_bytes(struct raw *r, const void *buf, size_t n, int fd);
/* Packs and sends req (cap FRAME_MAX_MAX_BYTES, so an oversized request
 * can be sent on purpose). */
int raw_send(struct raw *r, const Kvpalace__V1__Request *req);
/* Packs the n requests back to back into one datagram and sends it. */
int raw_send_batch(struct raw *r, Kvpalace__V1__Request *const *reqs, size_t n);
/* Receives one reply, valid until the next receive. Returns 1 and the
 * reply in *ret (an fd it carried in *ret_fd when not NULL, else closed),
 * 0 when the daemon closed the connection, or a negative errno (-EAGAIN:
 * nothing within the timeout; -EBADMSG: the daemon sent something that is
 * no valid reply). A datagram holding several reply frames is -EBADMSG
 * unless r->batched_ok, when its frames are returned one by one (the fd
 * of the datagram with its first frame). */
int raw_recv(struct raw *r, Kvpalace__V1__Response **ret, int *ret_fd);
/* raw_send then raw_recv; a reply with another id is -EBADMSG. Returns as
 * raw_recv. */
int raw_call(struct raw *r, Kvpalace__V1__Request *req, Kvpalace__V1__Response **ret, int *ret_fd);

/* Shortcuts that fill req with a fresh id and one operation. */
void raw_req_hello(Kvpalace__V1__Request *req, Kvpalace__V1__HelloRequest *op, uint32_t version);
void raw_req_open_pool(Kvpalace__V1__Request *req, Kvpalace__V1__OpenPoolRequest *op,
		       Kvpalace__V1__Layout *lay, const char *model_id,
		       const struct kvp_layout *layout);
void raw_req_create_session(Kvpalace__V1__Request *req, Kvpalace__V1__CreateSessionRequest *op,
			    uint64_t pool_id);
void raw_req_append(Kvpalace__V1__Request *req, Kvpalace__V1__AppendRequest *op,
		    uint64_t session_id, uint32_t *tokens, size_t n);
void raw_req_commit(Kvpalace__V1__Request *req, Kvpalace__V1__CommitRequest *op,
		    uint64_t session_id, uint64_t n);
void raw_req_match(Kvpalace__V1__Request *req, Kvpalace__V1__MatchPrefixRequest *op,
		   uint64_t pool_id, uint32_t *tokens, size_t n);
void raw_req_release(Kvpalace__V1__Request *req, Kvpalace__V1__ReleaseRequest *op,
		     uint64_t lease_id);
void raw_req_close_session(Kvpalace__V1__Request *req, Kvpalace__V1__CloseSessionRequest *op,
			   uint64_t session_id);
void raw_req_stats(Kvpalace__V1__Request *req, Kvpalace__V1__StatsRequest *op);

/* Sends Hello then OpenPool; returns 0 and the pool id (the arena fd is
 * closed), or a negative errno / -EBADMSG. */
int raw_open_pool(struct raw *r, const char *model_id, const struct kvp_layout *layout,
		  uint64_t *ret_pool_id);
/* CreateSession; returns 0 and the id or the negative errno of the reply. */
int raw_create_session(struct raw *r, uint64_t pool_id, uint64_t *ret_session_id);

/* Fork, Truncate, SessionPages and ListSessions requests. */
void raw_req_fork(Kvpalace__V1__Request *req, Kvpalace__V1__ForkRequest *op, uint64_t session_id,
		  uint64_t n);
void raw_req_truncate(Kvpalace__V1__Request *req, Kvpalace__V1__TruncateRequest *op,
		      uint64_t session_id, uint64_t n);
void raw_req_session_pages(Kvpalace__V1__Request *req, Kvpalace__V1__SessionPagesRequest *op,
			   uint64_t session_id, uint64_t first_page);
void raw_req_list_sessions(Kvpalace__V1__Request *req, Kvpalace__V1__ListSessionsRequest *op,
			   uint64_t pool_id);

/* Hello with the current version; returns 0 or a negative errno. */
int raw_hello(struct raw *r);
/* CloseSession; returns 0 or the negative errno of the reply. */
int raw_close_session(struct raw *r, uint64_t session_id);

/* Everything Stats says about one pool, with the daemon-wide figures that
 * matter to the prefix index. Read through the raw protocol so that every
 * field of the reply is seen, whatever the library copies. */
struct harness_pool_info {
	uint32_t n_pages;
	uint32_t free_pages;
	uint32_t reserved_pages;
	uint32_t leased_pages;
	uint32_t n_sessions;
	uint32_t indexed_pages;
	uint32_t evictable_pages;
	uint64_t evictions;
	uint64_t dedup_pages;
	int has_index_fields;	  /* the reply had indexed/evictable/evictions/dedup */
	uint64_t connections;	  /* daemon-wide, open now */
	uint64_t all_evictions;	  /* daemon-wide */
	uint64_t all_dedup_pages; /* daemon-wide */
};

/* Stats through r (after raw_hello) for pool_id. Returns 0, -ENOENT when
 * the pool is not listed, or a negative errno. */
int raw_pool_info(struct raw *r, uint64_t pool_id, struct harness_pool_info *ret);
/* The same on a connection of its own, opened and closed for the call. */
int harness_pool_info(const struct harness *h, uint64_t pool_id, struct harness_pool_info *ret);
/* Waits (up to 20 s) until the daemon reports `want` open connections,
 * asking through r (which counts as one). Returns 0 or -ETIMEDOUT. */
int raw_wait_connections(struct raw *r, uint64_t want);

/* A small f16 layout used by most tests: 2 layers, 2 KV heads, head_dim
 * 32, 16 tokens per page (page 8192 bytes). */
extern const struct kvp_layout harness_layout;

#endif
