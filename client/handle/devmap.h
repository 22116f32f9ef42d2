/* client/handle/devmap.h — a pool's device arena in this process.
 *
 * Layer: handle (client/README.md). Not thread-safe.
 */
#ifndef KVPC_DEVMAP_H
#define KVPC_DEVMAP_H

#include "handle.h"
#include "kvpalace.pb-c.h"

/* Maps the device arena that an OpenDeviceArena reply r (checked against
 * p by the caller) and its fd (-1 when none came; the caller keeps and
 * closes it) describe, setting p->dev_base. Returns 0, -EPROTO a handle
 * that cannot be the arena, -ENODEV this process does not see the
 * daemon's device, -EOPNOTSUPP a real device in a build without CUDA, or
 * another negative errno. */
int devmap_import(struct kvp_pool *p, const Kvpalace__V1__OpenDeviceArenaResponse *r, int fd);

/* Unmaps the pool's device arena, if mapped. */
void devmap_unmap(struct kvp_pool *p);

#endif
