/* daemon/core/gpu.h — the device tier (T0): one GPU, a device arena per pool,
 * device copies of leased pages, and the migrations between host and GPU.
 *
 * The device is behind a table of operations (gpu_dev.h): CUDA
 * (gpu_cuda.c, only in a build with CUDA: KVP_HAVE_CUDA) or, for tests,
 * one emulated in host memory (gpu_emu.c). At start gpu_init opens it and
 * decides once whether there is a device tier; any CUDA error means
 * "host and disk tiers only", said once in the log and in every Stats
 * reply (gpu_status) with the reason. With a device, each new pool gets a
 * device arena of gpu-pool-size bytes allocated with the CUDA VMM API and
 * exported as a POSIX fd (kernels/vmm.h), or a legacy CUDA IPC handle on
 * devices without fd handles, and its host arena is pinned with
 * cudaHostRegister in chunks so copies run at PCIe speed.
 *
 * Two directions. Host→GPU: device pages are copies of host pages,
 * content-addressed by the prefix index's chain hash: LeaseDevice gives a
 * read lease device slots holding
 * its pages (copied host→device on the daemon's own stream, or found in
 * the device cache when another lease brought them already). A lease's
 * device slots come back with the lease, so with its connection. A slot
 * nobody leases stays cached for the next lease of the same page until
 * the arena passes gpu-high-watermark; then cached slots go, least
 * recently leased first, down to gpu-low-watermark (the page's bytes stay
 * in the host or disk tier, which never gave them up). Each slot keeps the
 * XXH3-64 the disk tier took of the page, when it has one: the checksum
 * travels with the page. A cached copy is found by the whole 128-bit
 * chain hash, which names the content, so it is never a wrong page.
 *
 * GPU→host: tokens appended on the GPU tier are written by the client
 * into device slots of their session's pages and copied back, row by row,
 * before the Commit that publishes them (gpu_session_sync).
 *
 * Completions never block the loop: after a job's copies the daemon
 * enqueues cudaLaunchHostFunc on its stream (the device's launch_done);
 * that callback (on a CUDA thread) puts the job on a list and writes an
 * eventfd that the loop reads through its ring, as daemon/io/worker.c
 * does. The stream runs in order, so a job's callback runs after every
 * copy enqueued before it, its own and earlier jobs' alike.
 *
 * Event-loop thread only, except the CUDA callback, which touches only
 * the mutex-protected finished list and the eventfd.
 */
#ifndef KVPD_GPU_H
#define KVPD_GPU_H

#include <stdint.h>
#include <xxhash.h>

#include "gpu_dev.h"
#include "idmap.h"
#include "list.h"
#include "pagealloc.h"

struct cache;
struct config;
struct lease;
struct loop;
struct pool;
struct session;

#define GPU_NONE UINT32_MAX /* no device slot */

struct gpu; /* the daemon's device: private to gpu.c */

/* The device arena of one pool and the bookkeeping of its slots. A pool
 * without one has on == 0 and nothing else set. */
struct gpu_pool {
	int on;
	struct gpu_dev_arena arena; /* the device's allocation (dev/gpu_dev.h) */
	uint32_t n_pages;	    /* slots of the pool's page_bytes */
	struct pagealloc pa;	    /* refs: the cache, each lease, each copy in flight */
	XXH128_hash_t *hash;	    /* [n_pages] the page a slot holds */
	uint64_t *sum;		    /* [n_pages] XXH3-64 of its bytes */
	uint64_t *used_ns;	    /* [n_pages] last leased */
	uint8_t *copying;	    /* [n_pages] a copy into the slot is in flight */
	struct idmap cache;	    /* hash.low64 | 1 → slot + 1 */
	uint32_t n_jobs;	    /* jobs with copies in flight */
	struct list jobs;	    /* their links (gpu.c) */
	uint64_t copied;	    /* host→device copies completed */
	uint64_t dropped;	    /* cached slots dropped above the watermark */
	uint64_t copy_errors;	    /* copies CUDA failed */
	uint64_t copied_back;	    /* device→host page copies of GPU appends */
};

/* Probes CUDA once and, with a device, sets up the stream and the eventfd
 * read on l's ring. Never fails for lack of a GPU: *ret_gpu is always set
 * (gpu_available says whether there is a device tier) and the outcome is
 * logged once. Returns 0 or -ENOMEM. */
int gpu_init(struct gpu **ret_gpu, const struct config *cfg, struct loop *l);
/* Waits for copies in flight, frees everything. NULL is accepted. Call
 * after the loop stopped and every pool is gone. */
void gpu_fini(struct gpu *g);

/* 1 when the daemon has a device tier. NULL is accepted (0). */
int gpu_available(const struct gpu *g);
/* One line for Stats and the log: the device and its handle type, or
 * "no GPU: host and disk tiers only (reason)". */
const char *gpu_status(const struct gpu *g);
/* Device identity and sharing, valid when gpu_available. */
enum gpu_handle gpu_handle_type(const struct gpu *g);
const unsigned char *gpu_uuid(const struct gpu *g);
/* 1 while copies are in flight (the daemon lets them finish at stop). */
int gpu_busy(const struct gpu *g);

/* Gives pool p a device arena when the daemon has a GPU and gpu-pool-size
 * fits at least one page, and pins its host arena. A failure leaves p
 * without one (logged): the pool works from the host tier. */
void gpu_pool_open(struct cache *c, struct pool *p);
/* Frees p's device arena; no copy may be in flight (gpu_pool_busy). */
void gpu_pool_close(struct cache *c, struct pool *p);
int gpu_pool_busy(const struct pool *p);

/* The device slots a LeaseDevice answers with: of the lease's pages from
 * first_page on, and how many of them were copied for it since its last
 * answer. slots points into the lease. */
struct gpu_lease_slots {
	const uint32_t *slots;
	uint32_t n_slots;
	uint32_t copied;
};

struct tier_park;

/* LeaseDevice for lease l: gives every page of l without one a device
 * slot (cached or copied). Returns 0 with the slots from first_page on in
 * *out once no copy l waits for is in flight (its own, or another
 * lease's of a cached slot it took: then a fence job waits behind them);
 * -EAGAIN while they are, with pk->park_on set: like a disk read, the
 * request waits on the pool and runs again when they are done, however
 * long (pk->no_park does not apply: copies end). Errors: -EOPNOTSUPP no
 * device arena, -ERANGE first_page past the lease, -ENOSPC no free
 * device slot, -ENOMEM, -EIO a copy could not be started or failed
 * (answered once; the lease keeps only the slots it had before the call
 * whose copies failed); *why says so. */
int gpu_lease_device(struct cache *c, struct lease *l, uint64_t first_page, struct tier_park *pk,
		     struct gpu_lease_slots *out, const char **why);
/* Gives back the device slots of l (lease_release calls it). */
void gpu_lease_release(struct lease *l);

/* ---- GPU appends: pages written on the device, copied back at commit.
 * Tokens appended on the GPU tier are written by the client into device
 * slots of their pages; before a Commit publishes them, their rows are
 * copied device→host (cudaMemcpy2DAsync: only those tokens' rows, so host
 * and GPU appends mix in one page), completion through the eventfd as
 * for LeaseDevice. */

/* Gives each page of s that tokens [from, from + n) (just appended) touch a
 * device slot, and records the range. Returns 0, -ENOSPC (no free device
 * slot; nothing of this call is left) or -ENOMEM. */
int gpu_session_append(struct cache *c, struct session *s, uint64_t from, uint64_t n,
		       const char **why);
/* Before committing n more tokens of s: 0 when none of them waits for a
 * copy back; -EAGAIN with pk->park_on set when copies were started or are
 * in flight (the Commit parks and runs again once they are done); -EBUSY
 * when it may not wait any longer (pk->no_park); -EIO when a copy back
 * failed. */
int gpu_session_sync(struct cache *c, struct session *s, uint64_t n, struct tier_park *pk,
		     const char **why);
/* After s lost tokens or pages (rollback, truncate): forgets the ranges
 * past its tokens and gives back the device slots of pages it no longer
 * has. */
void gpu_session_trim(struct session *s);
/* Gives back everything of s (session_close). */
void gpu_session_free(struct session *s);

/* Admin eviction from the GPU tier: device copies only the device cache
 * holds (no lease, no copy in flight), least recently leased first; their
 * pages stay in the host or disk tier. gpu_evictable counts them (O(n));
 * gpu_evict drops up to max_pages of them and at most *budget bytes,
 * returns how many and takes their bytes off *budget. */
uint32_t gpu_evictable(const struct pool *p);
uint32_t gpu_evict(struct pool *p, uint32_t max_pages, uint64_t *budget);

/* An admin purged the page of chain hash h (daemon/service/purge.c): the device
 * cache forgets its copy, so no later lease of a page with that hash is
 * given it (leases holding it keep it until they end). Returns 1 when a
 * cached copy was forgotten, else 0. */
int gpu_pool_forget(struct pool *p, XXH128_hash_t h);

/* Adds the host-slot references of p's copies in flight to refs[]. */
int gpu_check(const struct pool *p, uint32_t *refs);

#endif
