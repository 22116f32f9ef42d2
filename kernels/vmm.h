/* kernels/vmm.h — device memory that two processes can share: the CUDA
 * virtual-memory-management (VMM) driver API, reached through
 * cudaGetDriverEntryPointByVersion, with the legacy CUDA IPC handle as a
 * fallback.
 *
 * Why here: the daemon's CUDA device (daemon/dev/gpu_cuda.c) creates and
 * exports one allocation per pool, the client library imports it, and both
 * must agree on every step (granularity, access flags, handle type). Nothing
 * links libcuda: a binary that does fails to load where no driver is
 * installed, so the driver entry points are looked up at run time through
 * the CUDA runtime (cudart), which fails cleanly there instead. The
 * runtime itself comes through cudart.h: the daemon loads it at the probe
 * (a host without it is a host without a device), the client library
 * links it statically. Built only with CUDA (KVP_HAVE_CUDA); callers keep
 * their own no-CUDA branch.
 *
 * Every function returns 0 or a negative errno: -ENODEV no usable driver
 * or device, -EOPNOTSUPP the device cannot do it (no VMM, no POSIX fd
 * handles), -ENOMEM device memory is short, -EIO any other CUDA error.
 * Never logs, never exits. Thread-safe: the entry points are looked up
 * once (pthread_once); the rest is the CUDA runtime's own thread safety.
 */
#ifndef KVP_KERNELS_VMM_H
#define KVP_KERNELS_VMM_H

#include <stddef.h>
#include <stdint.h>

#define VMM_UUID_BYTES 16u
#define VMM_IPC_BYTES  64u /* sizeof(cudaIpcMemHandle_t) */

enum vmm_kind {
	VMM_NONE = 0,
	VMM_POSIX_FD = 1,   /* cuMemCreate + POSIX fd export (the protocol's values) */
	VMM_LEGACY_IPC = 2, /* cudaMalloc + cudaIpcGetMemHandle */
};

/* One device allocation mapped into this process. */
struct vmm_map {
	enum vmm_kind kind;
	int device;	 /* the runtime's ordinal in this process */
	uint64_t handle; /* CUmemGenericAllocationHandle (VMM_POSIX_FD) */
	uint64_t d_base; /* device address of byte 0 of the allocation */
	uint64_t bytes;	 /* the allocation, a multiple of the granularity */
	int imported;	 /* mapped from another process's handle */
};

/* Loads the runtime (cudart_open(NULL): whatever an earlier cudart_open
 * chose), looks up the driver entry points and checks that a device
 * exists. Returns the number of devices (> 0), or -ENODEV with a reason
 * (a static string) in *why. Safe to call often: the lookup happens
 * once. */
int vmm_probe(const char **why);

/* Device `device`'s name (NUL-terminated in name[n]), its UUID
 * (VMM_UUID_BYTES) and the way it can share memory: VMM_POSIX_FD when it
 * supports VMM with POSIX fd handles, else VMM_LEGACY_IPC. Makes device
 * current on the calling thread and creates its primary context. */
int vmm_describe(int device, char *name, size_t n, unsigned char *uuid, enum vmm_kind *ret_kind);

/* The runtime ordinal of the device whose UUID is uuid, or -ENODEV. */
int vmm_find_device(const unsigned char *uuid);

/* Allocates at least `bytes` of device memory of the given kind on
 * device, maps it read-write for this process and fills *m. */
int vmm_create(int device, uint64_t bytes, enum vmm_kind kind, struct vmm_map *m);

/* Exports m's allocation: a new POSIX fd (O_CLOEXEC not guaranteed by
 * CUDA: the caller sets it) for VMM_POSIX_FD, or the IPC handle bytes
 * (VMM_IPC_BYTES) for VMM_LEGACY_IPC. */
int vmm_export_fd(const struct vmm_map *m, int *ret_fd);
int vmm_export_ipc(const struct vmm_map *m, unsigned char *ipc);

/* Maps another process's allocation of `bytes` on device: from a POSIX fd
 * (not consumed: the caller closes it) or from IPC handle bytes. */
int vmm_import_fd(int device, int fd, uint64_t bytes, struct vmm_map *m);
int vmm_import_ipc(int device, const unsigned char *ipc, uint64_t bytes, struct vmm_map *m);

/* Unmaps and releases m (the memory itself goes once every process that
 * mapped it did so). A zeroed map is accepted. */
void vmm_destroy(struct vmm_map *m);

#endif
