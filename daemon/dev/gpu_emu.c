/* daemon/dev/gpu_emu.c — an emulated device under the GPU tier
 * (gpu_dev.h), for tests only.
 *
 * With $KVPALACED_EMULATE_GPU=1 the daemon plays a GPU in host memory: each
 * device arena is a sealed memfd (shm/arena.h) passed as
 * DEVICE_HANDLE_HOST_EMULATED, copies are memcpy, done at once, and a
 * completion is the tier's function called at once, which still travels
 * through the tier's finished list and eventfd. Everything of the tier but
 * the CUDA calls then runs, and is tested, on machines without a GPU. It
 * has no state of its own, and its copies never fail.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "gpu_dev.h"
#include "log.h"

static int emu_open(struct gpu_dev *dev, const struct config *cfg, struct gpu_dev_desc *desc,
		    const char **why)
{
	(void)dev;
	(void)cfg;
	(void)why;
	desc->handle = GPU_HANDLE_EMULATED;
	memset(desc->uuid, 0, sizeof(desc->uuid));
	snprintf(desc->status, sizeof(desc->status),
		 "emulated GPU in host memory (KVPALACED_EMULATE_GPU, tests only), device "
		 "arenas shared as memfd");
	log_warn("GPU tier: %s", desc->status);
	return 0;
}

static void emu_close(struct gpu_dev *dev)
{
	(void)dev; /* every copy was done when it was queued */
}

static int emu_arena_open(struct gpu_dev *dev, uint64_t pool_id, void *host, uint64_t host_bytes,
			  uint64_t want, struct gpu_dev_arena *d)
{
	char name[64];
	void *addr;
	int ret;

	(void)dev;
	(void)host; /* nothing to pin */
	(void)host_bytes;
	want = (want + 4095) / 4096 * 4096;
	snprintf(name, sizeof(name), "kvpalace-emugpu-%llu", (unsigned long long)pool_id);
	ret = shm_arena_create(name, want, &d->fd, NULL);
	if (ret < 0)
		return ret;
	ret = shm_arena_map(d->fd, want, &addr);
	if (ret < 0) {
		close(d->fd);
		d->fd = -1;
		return ret;
	}
	d->bytes = want;
	d->d_base = (uint64_t)(uintptr_t)addr;
	return 0;
}

static void emu_arena_close(struct gpu_dev *dev, struct gpu_dev_arena *d)
{
	(void)dev;
	shm_arena_unmap((void *)(uintptr_t)d->d_base, d->bytes);
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
}

static int emu_copy_to_device(struct gpu_dev *dev, uint64_t dst, const void *src, uint64_t bytes)
{
	(void)dev;
	memcpy((void *)(uintptr_t)dst, src, bytes);
	return 0;
}

static int emu_copy_rows_to_host(struct gpu_dev *dev, unsigned char *host, uint64_t d_page,
				 uint64_t off, uint64_t pitch, uint64_t width, uint64_t height)
{
	(void)dev;
	for (uint64_t r = 0; r < height; r++)
		memcpy(host + off + r * pitch,
		       (const unsigned char *)(uintptr_t)d_page + off + r * pitch, width);
	return 0;
}

static int emu_launch_done(struct gpu_dev *dev, gpu_dev_done_fn *done, void *arg)
{
	(void)dev;
	done(arg); /* the loop sees it on its next turn */
	return 0;
}

static void emu_sync(struct gpu_dev *dev)
{
	(void)dev;
}

static int emu_copy_error(struct gpu_dev *dev)
{
	(void)dev;
	return 0;
}

static const struct gpu_dev_ops emu_ops = {
	.dev_bytes = 0,
	.open = emu_open,
	.close = emu_close,
	.arena_open = emu_arena_open,
	.arena_close = emu_arena_close,
	.copy_to_device = emu_copy_to_device,
	.copy_rows_to_host = emu_copy_rows_to_host,
	.launch_done = emu_launch_done,
	.sync = emu_sync,
	.copy_error = emu_copy_error,
};

const struct gpu_dev_ops *gpu_emu_ops(void)
{
	return &emu_ops;
}
