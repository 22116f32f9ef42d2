/* daemon/server/faults.h — I/O fault injection for tests ($KVPALACED_FAULTS).
 *
 * A test hook, inert unless the environment variable KVPALACED_FAULTS is
 * set when the daemon starts (kvpalaced(8), TESTING). It names faults to
 * inject at two places:
 *  - the completion layer of the disk tier: aio.h's inject hook, called
 *    before every step of a spill read or write on both backends
 *    (io_uring and threads), so the fault travels the same path as a
 *    kernel result would;
 *  - the checkpoint file's system calls: ckpt.h's ckpt_inject, called
 *    before each read, write and fsync ckpt.c makes (on worker threads).
 *
 *   KVPALACED_FAULTS = rule [";" rule]...
 *   rule  = layer ":" op ":" fault [":" when]
 *   layer = "aio" | "ckpt"
 *   op    = "read" | "write" | "fsync" | "dirsync" | "any"
 *           (dirsync: ckpt's fsync of a directory: after a rename or
 *           unlink in it, after creating a directory in it, and of the
 *           checkpoint directories at start)
 *   fault = "EIO" | "ENOSPC" | "ECANCELED" | "EDQUOT" | "EFBIG" | "EINTR" |
 *           "EAGAIN" | "short"
 *   when  = "every=N" (the Nth, 2Nth, ... call the rule matches; the
 *           default is every=1) | "once" (its first call) | "nth=N" (its
 *           Nth call only) | "after=N" (every call after its first N)
 *
 * An errno fault fails the call without doing any I/O, as if the kernel
 * had returned it. "short" lets the call move at most half of what it
 * asked for (whole 4096-byte blocks on an O_DIRECT file, where a step of
 * one block is left whole), so the caller must continue the transfer.
 * Every rule counts the calls it matches on its own; the first rule that
 * fires decides. A bad specification stops the daemon at start.
 *
 * Threading: faults_init and faults_fini on the loop thread before and
 * after the worker threads run; the hooks on any thread (atomic counters).
 */
#ifndef KVPD_FAULTS_H
#define KVPD_FAULTS_H

#include "aio.h"

#define FAULTS_ENV "KVPALACED_FAULTS"

/* Reads $KVPALACED_FAULTS; when set, installs the hooks (the aio one on a
 * when a is not NULL) and logs what is armed. Returns 0 (also when unset)
 * or -EINVAL with the reason logged. */
int faults_init(struct aio *a);

/* Logs how often each rule fired and removes the hooks. */
void faults_fini(struct aio *a);

#endif
