/* tests/unit/core_fixture.h — one cache, one pool, no daemon, for the unit
 * tests of the core (sessions, leases, matching) and the host tier's
 * watermarks.
 *
 * What the service layer would do for a request is done here directly: a
 * struct cache built with cache_init over a configuration from
 * config_defaults (no disk tier, no GPU tier, no io_uring, no worker), one
 * pool of a small layout (block_tokens CORE_BT, one 4 KiB page a slot)
 * opened with pool_open, and writers and lease owners that are plain
 * addresses, as a connection is for the daemon. Token lists are made from
 * a base so that two lists share a prefix exactly when their bases and
 * lengths say so. Every helper asserts (cmocka) that what it called
 * succeeded and that cache_check agrees afterwards. Single-threaded.
 */
#ifndef KVP_TESTS_CORE_FIXTURE_H
#define KVP_TESTS_CORE_FIXTURE_H

#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "config.h"
#include "lease.h"
#include "list.h"
#include "pool.h"
#include "session.h"
#include "tier.h"

/* Tokens per page of the fixture's pool. */
#define CORE_BT	 4u
#define CORE_UID 1000

/* A client as the core sees one: an identity (its address), the account
 * of what it holds reserved, and the lists of its leases and sessions. */
struct core_client {
	struct session_writer writing;
	struct session_owner sessions;
	struct list leases;
};

struct core_fixture {
	struct config cfg;
	struct cache c;
	struct pool *p;
	struct core_client a, b;
	/* The wait the tests' calls hand down, as dispatch makes one: they
	 * may park (no_park 0), though without a disk tier none does. */
	struct tier_park pk;
};

/* Builds the cache and opens a pool of n_pages pages for CORE_UID with
 * the given watermarks (fractions of its pages). */
void core_fixture_init(struct core_fixture *f, uint32_t n_pages, double high, double low);
/* Closes every lease and session left and frees the cache (leaks show
 * under ASan). */
void core_fixture_fini(struct core_fixture *f);

/* cmocka setup and teardown: a fixture made with core_fixture_init in
 * *state (-1 when out of memory), and freed after core_fixture_fini. */
int core_fixture_setup(void **state, uint32_t n_pages, double high, double low);
int core_fixture_teardown(void **state);

/* ids[i] = base + i for i < n. */
void core_tokens(uint32_t *ids, uint32_t n, uint32_t base);

/* A new session of the pool on the pool's own root, owned by cl. */
struct session *core_session(struct core_fixture *f, struct core_client *cl);
/* Appends ids[0..n) to s as cl (untagged) and returns the first position
 * appended; commits the next n reserved tokens of s as cl. */
uint64_t core_append(struct core_fixture *f, struct core_client *cl, struct session *s,
		     const uint32_t *ids, uint32_t n);
void core_commit(struct core_fixture *f, struct core_client *cl, struct session *s, uint32_t n);
/* Appends tokens base.. base+n-1 as cl and commits them; returns the
 * first position appended. */
uint64_t core_append_commit(struct core_fixture *f, struct core_client *cl, struct session *s,
			    uint32_t base, uint32_t n);
/* A session holding tokens base.. base+n-1 committed, then closed: its
 * full pages stay in the index, held by it alone. */
void core_cached_chain(struct core_fixture *f, uint32_t base, uint32_t n);

/* The first byte of page slot `slot` in the pool's arena, and filling a
 * slot with one byte value (what a client writing K/V does). */
uint8_t core_slot_byte(const struct core_fixture *f, uint32_t slot);
void core_fill_slot(struct core_fixture *f, uint32_t slot, uint8_t v);
/* Whether every byte of the slot is v. */
int core_slot_all(const struct core_fixture *f, uint32_t slot, uint8_t v);

/* The chain hash of page i (0-based) of the tokens base.. from the
 * pool's root. */
XXH128_hash_t core_page_hash(const struct core_fixture *f, uint32_t base, uint32_t i);
/* Whether page i of the chain of tokens base.. is indexed with a host
 * copy. */
int core_indexed(const struct core_fixture *f, uint32_t base, uint32_t i);

/* Tokens of the chain base.. a match of n tokens from the pool's root
 * finds. The lease is released again, which makes the matched pages the
 * most recently used. */
uint64_t core_match_tokens(struct core_fixture *f, uint32_t base, uint32_t n);

/* cache_check(c) == 0, with the caller's line on failure. */
#define core_check(f) assert_int_equal(cache_check(&(f)->c), 0)

#endif
