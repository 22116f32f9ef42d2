/* daemon/service/ckptop.h — the requests that write and read checkpoint files:
 * Checkpoint, Restore, ListCheckpoints, DeleteCheckpoint and Warmup.
 *
 * Checkpoints live in <state-dir>/checkpoints/<uid>/<name> (daemon/store/ckpt.h
 * is the file format), one directory per tenant so no tenant can read,
 * overwrite or list another's. File work blocks, so it runs on the worker
 * threads; the request is answered through a conn ticket when it is done
 * (the connection's later requests wait behind it, others are served):
 *
 *  - Checkpoint takes a reference on each page of the session's committed
 *    tokens (they can be neither freed nor reused meanwhile; committed
 *    positions are never written again), copies the token ids, and a
 *    worker writes the file durably (temporary, fsync, rename, directory
 *    fsync). The reply comes once the file is durable.
 *  - Restore opens and verifies the file's header and tokens on a worker
 *    (a file whose recorded name or owner is not the one asked for is
 *    refused: a copy never restores as another checkpoint), then on the
 *    loop shares the full pages the prefix index holds in the host tier
 *    and takes host slots for the others only — waiting, parked on the
 *    pool as a match does, while the host tier is full of index pages
 *    being written out — reads and verifies every page on a worker (the
 *    shared ones only checked), then builds the session on the loop. Any
 *    refusal (missing, corrupt, truncated, newer format, another model,
 *    layout, name or owner, no room) frees what was taken: nothing is
 *    half-restored. The session belongs to the asking connection (closed
 *    with it, daemon/core/session.h); one that closed while the restore ran
 *    gets its session closed when it is built; an admin's restore is
 *    persistent and owned by no connection.
 *  - ListCheckpoints reads each file's header (and with verify every
 *    page); DeleteCheckpoint unlinks a file of the caller's own
 *    directory and fsyncs it, answered once the removal is durable.
 *  - Warmup is a Restore into the checkpoint's own pool whose session is
 *    closed at once, so only its full pages stay, in the prefix index. At
 *    start every file of the warm-up directory is loaded this way,
 *    synchronously, before the daemon reports ready.
 * Event-loop thread only (the worker jobs touch only their own copies).
 */
#ifndef KVPD_CKPTOP_H
#define KVPD_CKPTOP_H

#include "cache.h"
#include "kvpalace.pb-c.h"
#include "peer.h"
#include "reply.h"

/* Opens (creating) <state-dir>/checkpoints and removes the temporaries a
 * crash left in it. Returns 0 or -errno (logged; checkpoints then fail
 * with an error, the daemon serves). */
int ckptop_init(struct cache *c);
void ckptop_fini(struct cache *c);

/* Loads every checkpoint in the warm-up directory into the prefix index
 * (blocking: at start, before READY=1). Files that cannot be loaded are
 * logged and skipped. Returns the files loaded. */
int ckptop_warmup_dir(struct cache *c);

/* Adds the page references p's jobs in flight hold to refs[slot].
 * Returns 0 or -EUCLEAN. */
struct pool;
int ckptop_check(const struct pool *p, uint32_t *refs);

/* The handlers: each returns -EINPROGRESS when the request was handed to
 * a worker (the reply follows through a ticket), or a negative errno with
 * a reason in *why. */
int ckptop_checkpoint(struct cache *cache, struct peer *c, uint64_t req_id,
		      const Kvpalace__V1__CheckpointRequest *in, const char **why);
int ckptop_restore(struct cache *cache, struct peer *c, uint64_t req_id,
		   const Kvpalace__V1__RestoreRequest *in, const char **why);
int ckptop_list(struct cache *cache, struct peer *c, uint64_t req_id,
		const Kvpalace__V1__ListCheckpointsRequest *in, const char **why);
int ckptop_warmup(struct cache *cache, struct peer *c, uint64_t req_id,
		  const Kvpalace__V1__WarmupRequest *in, const char **why);
int ckptop_remove(struct cache *cache, struct peer *c, uint64_t req_id,
		  const Kvpalace__V1__DeleteCheckpointRequest *in, const char **why);

#endif
