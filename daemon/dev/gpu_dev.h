/* daemon/dev/gpu_dev.h — the device under the GPU tier: one table of
 * operations, the way SQLite puts os_unix.c behind its VFS.
 *
 * gpu.c keeps the tier (device slots, the device cache, LeaseDevice, GPU
 * appends, completions through a finished list and an eventfd) and never
 * names a device: it picks a table once at start (gpu_emu_ops with
 * $KVPALACED_EMULATE_GPU=1, else gpu_cuda_ops) and calls through it. A
 * device is: gpu_cuda.c (the only file with CUDA calls and KVP_HAVE_CUDA;
 * its open loads the CUDA runtime, kernels/cudart.h, and a runtime that
 * cannot be loaded is no device; in a build without CUDA its table's open
 * says so and the daemon has no device tier) and gpu_emu.c (host memory plays the device, for tests on
 * machines without a GPU).
 *
 * This folder (dev/) is a layer below the core: a device knows no pool,
 * session or lease. The tier hands it a pool's id and host arena and gets
 * back a struct gpu_dev_arena, which it keeps in the pool's gpu_pool.
 *
 * Calls go down only: a device never calls the tier. A copy's completion
 * goes up through the function the tier hands to launch_done, which a
 * device calls (on a CUDA thread, or at once) when every copy queued
 * before it is done; devices run their copies in order.
 *
 * Like SQLite's szOsFile, the tier allocates a device's state (dev_bytes,
 * zeroed; none when 0, and the ops then get NULL) and the device fills it
 * in open. Event-loop thread only, as the tier.
 */
#ifndef KVPD_GPU_DEV_H
#define KVPD_GPU_DEV_H

#include <stddef.h>
#include <stdint.h>

struct config;

#define GPU_STATUS_BYTES 192u
#define GPU_UUID_BYTES	 16u
#define GPU_IPC_BYTES	 64u

/* How a device arena is shared (the protocol's DeviceHandle values). */
enum gpu_handle {
	GPU_HANDLE_NONE = 0,
	GPU_HANDLE_POSIX_FD = 1,
	GPU_HANDLE_CUDA_IPC = 2,
	GPU_HANDLE_EMULATED = 3, /* tests only: a memfd (KVPALACED_EMULATE_GPU) */
};

/* One pool's device arena, as its device made it. */
struct gpu_dev_arena {
	uint64_t bytes;	 /* the allocation */
	uint64_t d_base; /* the daemon's mapping of its first byte */
	int fd;		 /* exported POSIX fd, or -1 */
	unsigned char ipc[GPU_IPC_BYTES];
	void *map;	/* the device's own: struct vmm_map (gpu_cuda.c) */
	void *host_reg; /* the host arena pinned for it, or NULL */
	uint64_t host_reg_bytes;
};

struct gpu_dev; /* a device's own state: private to its file */

/* What an open device says of itself. */
struct gpu_dev_desc {
	enum gpu_handle handle; /* how its arenas are shared */
	unsigned char uuid[GPU_UUID_BYTES];
	char status[GPU_STATUS_BYTES]; /* the line of gpu_status */
};

/* Called when every copy queued before it is done (or failed). */
typedef void gpu_dev_done_fn(void *arg);

struct gpu_dev_ops {
	size_t dev_bytes; /* the state the tier allocates for it */
	/* Probes and sets the device up in dev, fills *desc and logs the
	 * outcome. 0, or -ENODEV with the reason (a static string) in *why:
	 * then no other operation is called and the table may leave them
	 * NULL. */
	int (*open)(struct gpu_dev *dev, const struct config *cfg, struct gpu_dev_desc *desc,
		    const char **why);
	/* Waits for the copies queued and frees what open set up. */
	void (*close)(struct gpu_dev *dev);
	/* Makes *a an arena of at least want bytes for pool pool_id: bytes,
	 * d_base, the export (fd or ipc), map; and may pin the pool's host
	 * arena, host_bytes at host (host_reg). 0 or a negative errno, with
	 * nothing left (a->fd -1). */
	int (*arena_open)(struct gpu_dev *dev, uint64_t pool_id, void *host, uint64_t host_bytes,
			  uint64_t want, struct gpu_dev_arena *a);
	/* Frees what arena_open set (no copy in flight). */
	void (*arena_close)(struct gpu_dev *dev, struct gpu_dev_arena *a);
	/* Queues a copy of bytes from host memory src to device address dst.
	 * 0 or -EIO (it could not be queued). */
	int (*copy_to_device)(struct gpu_dev *dev, uint64_t dst, const void *src, uint64_t bytes);
	/* Queues a strided copy device → host: height rows of width bytes,
	 * pitch apart, from device address d_page + off to host + off. 0 or
	 * -EIO. */
	int (*copy_rows_to_host)(struct gpu_dev *dev, unsigned char *host, uint64_t d_page,
				 uint64_t off, uint64_t pitch, uint64_t width, uint64_t height);
	/* Queues done(arg) behind every copy queued so far. 0 or -EIO. */
	int (*launch_done)(struct gpu_dev *dev, gpu_dev_done_fn *done, void *arg);
	/* Waits for every copy queued (the error paths, before slots are
	 * reused). */
	void (*sync)(struct gpu_dev *dev);
	/* On the loop thread, once a done ran: -EIO when a copy queued before
	 * it failed after it was queued (CUDA: the stream's sticky error),
	 * else 0. */
	int (*copy_error)(struct gpu_dev *dev);
};

/* The CUDA device (gpu_cuda.c): always a table; without CUDA in the build
 * its open fails with "built without CUDA". */
const struct gpu_dev_ops *gpu_cuda_ops(void);
/* The emulated device (gpu_emu.c): memfd arenas and memcpy, for tests. */
const struct gpu_dev_ops *gpu_emu_ops(void);

#endif
