/* daemon/service/purge.h — forgetting cached pages for good: Purge, and what the
 * admin's drops and disk evictions forget.
 *
 * An admin who learns that a client poisoned a cache (a bad engine build,
 * a leaked salt) removes exactly that: the prefix-index pages of a pool,
 * a tenant, a model, one cache salt's chains, or those not used since a
 * time — with every page continuing them, since a child names its
 * parent's tokens too. Forgetting takes an entry out of the index at once
 * (no match finds it), drops its host reference (a session or lease that
 * holds the page keeps it until it ends, but is marked so that nothing it
 * computes on the page enters the index), forgets its cached device copy,
 * and invalidates its spill-file page header (daemon/store/spill.h,
 * spill_forget) so no restart finds it. The header writes and their
 * fdatasync run on a worker thread; the request is answered through a
 * ticket once they are durable, and the extents are only then handed out
 * again. A pool with such work in flight counts it (pool.n_forgets) and
 * cannot be dropped meanwhile.
 *
 * Which salt a page was committed under is known from its entry's chain
 * root (pindex_entry.root, recorded in the page header of a first page);
 * pages found in a spill file written before roots were recorded count as
 * matching every salt: any doubt is a purge. Event-loop thread only, but
 * for the worker job, which touches only its own copy of what to write.
 */
#ifndef KVPD_PURGE_H
#define KVPD_PURGE_H

#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "reply.h"
#include "session.h"

/* What a request forgot that must be made durable before it is answered:
 * extents of spill files (taken from entries that are gone, not freed)
 * and a directory whose entries changed (a removed spill file). */
struct forget;

/* A new, empty batch, or NULL when out of memory. */
struct forget *forget_new(void);
/* Adds extent of p's spill file. Returns 0, or -ENOMEM (the extent then
 * stays in use, never handed out again in this run; logged). */
int forget_extent(struct forget *f, struct pool *p, uint32_t extent);
/* Asks for dir to be fsynced too. Returns 0 or -ENAMETOOLONG. */
int forget_dir(struct forget *f, const char *dir);
/* True when f holds something to make durable. */
int forget_pending(const struct forget *f);

/* Ends the request that filled f (f is consumed). Without anything to
 * make durable it returns 0 and the caller sends r as usual. Otherwise
 * r's contents move into a worker job (r is left empty), which
 * invalidates the headers, syncs, frees the extents and then sends the
 * reply through a ticket for request req_id of conn: returns
 * -EINPROGRESS. Should the writes or the sync fail, the reply becomes
 * -EIO with the reason (the extents stay out of use until a restart). A
 * cache without worker threads does the work here, blocking. */
int forget_finish(struct forget *f, struct cache *c, struct peer *conn, uint64_t req_id,
		  struct reply *r);

/* Moves the reply in src to dst (src is left empty), repointing the
 * response at dst's storage: for a reply sent later (admin operations'
 * replies only). */
void forget_move_reply(struct reply *dst, struct reply *src);

/* What a forget took away. */
struct purge_counts {
	uint64_t pages;	       /* index entries forgotten */
	uint64_t host_pages;   /* with a host copy */
	uint64_t disk_pages;   /* with a disk copy */
	uint64_t device_pages; /* cached device copies */
	uint64_t held_pages;   /* host copies a session or lease still holds */
	uint32_t pools;	       /* pools that lost entries */
	uint32_t sessions_marked;
};

struct tier_park;
/* Forgets (into f) the index pages of s's prefix that no other session,
 * lease or job holds, with everything that continues them; *ret_kept gets
 * its index pages another holder shares. With dry_run nothing changes.
 * Returns the pages forgotten, or -EBUSY when one of them waits for disk
 * I/O (pk->park_on says on which pool), or -ENOMEM. */
int purge_session(struct cache *c, struct session *s, struct forget *f, int dry_run,
		  struct tier_park *pk, uint32_t *ret_kept, struct purge_counts *counts);

/* Answers Purge (validated) into r; may return -EINPROGRESS (answered
 * later) or -EAGAIN with pk->park_on set (nothing changed: run it again
 * once that pool's disk I/O is done; never when pk->no_park). Errors:
 * -ENOENT no such pool, -EBUSY disk I/O that could not be waited for,
 * -ENOMEM. */
int purge_run(struct cache *c, struct peer *conn, uint64_t req_id,
	      const Kvpalace__V1__PurgeRequest *in, struct reply *r, struct tier_park *pk,
	      const char **why);

#endif
