/* client/handle/devmap.c — a pool's device arena in this process:
 * importing it and unmapping it.
 *
 * Layer: handle (client/README.md): local work on a pool handle, no round
 * trip. api/gpu.c asks the daemon for the arena (OpenDeviceArena) and
 * hands the reply's handle here; handle.c unmaps it when the pool handle
 * is freed. The library finds the daemon's device among its own by UUID
 * (the ordinals may differ under CUDA_VISIBLE_DEVICES) and imports the
 * allocation through kernels/vmm.h (cuMemImportFromShareableHandle,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess via the driver entry
 * points). A build without CUDA maps only a daemon's emulated device (a
 * sealed memfd). Not thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "arena.h"
#include "devmap.h"

#ifdef KVP_HAVE_CUDA
#include "vmm.h"
#endif

/* A daemon that plays a GPU in host memory (KVPALACED_EMULATE_GPU, for
 * tests without a GPU) passes its "device arena" as a sealed memfd:
 * device addresses are then addresses of that mapping. */
static int map_emulated(struct kvp_pool *p, const Kvpalace__V1__OpenDeviceArenaResponse *r, int fd)
{
	void *addr;
	int ret;

	if (fd < 0)
		return -EPROTO;
	ret = shm_arena_map(fd, r->arena_bytes, &addr);
	if (ret == -EINVAL || ret == -EBADF)
		return -EPROTO;
	if (ret < 0)
		return ret;
	p->dev_emulated = 1;
	p->dev_arena_bytes = r->arena_bytes; /* what unmap_emulated unmaps */
	p->dev_base = (uint64_t)(uintptr_t)addr;
	return 0;
}

static void unmap_emulated(struct kvp_pool *p)
{
	shm_arena_unmap((void *)(uintptr_t)p->dev_base, p->dev_arena_bytes);
	p->dev_emulated = 0;
	p->dev_base = 0;
}

#ifdef KVP_HAVE_CUDA
int devmap_import(struct kvp_pool *p, const Kvpalace__V1__OpenDeviceArenaResponse *r, int fd)
{
	struct vmm_map *m;
	int dev, ret;

	if (r->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_HOST_EMULATED)
		return map_emulated(p, r, fd);
	if (!r->has_device_uuid || r->device_uuid.len != VMM_UUID_BYTES)
		return -EPROTO;
	dev = vmm_find_device(r->device_uuid.data);
	if (dev < 0)
		return -ENODEV;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	if (r->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_POSIX_FD)
		ret = fd >= 0 ? vmm_import_fd(dev, fd, r->arena_bytes, m) : -EPROTO;
	else if (r->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_CUDA_IPC &&
		 r->has_ipc_handle && r->ipc_handle.len == VMM_IPC_BYTES)
		ret = vmm_import_ipc(dev, r->ipc_handle.data, r->arena_bytes, m);
	else
		ret = -EPROTO;
	if (ret < 0) {
		free(m);
		return ret;
	}
	p->dev_map = m;
	p->dev_base = m->d_base;
	return 0;
}

void devmap_unmap(struct kvp_pool *p)
{
	if (p->dev_emulated)
		unmap_emulated(p);
	if (p->dev_map) {
		vmm_destroy(p->dev_map);
		free(p->dev_map);
		p->dev_map = NULL;
	}
	p->dev_base = 0;
}
#else
int devmap_import(struct kvp_pool *p, const Kvpalace__V1__OpenDeviceArenaResponse *r, int fd)
{
	if (r->handle_type == KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_HOST_EMULATED)
		return map_emulated(p, r, fd);
	return -EOPNOTSUPP; /* a real GPU needs a build with CUDA */
}

void devmap_unmap(struct kvp_pool *p)
{
	if (p->dev_emulated)
		unmap_emulated(p);
	p->dev_base = 0;
}
#endif
