/* daemon/dev/gpu_cuda.c — the CUDA device under the GPU tier (gpu_dev.h).
 *
 * The only file of the daemon with CUDA calls and KVP_HAVE_CUDA. open
 * probes the driver (kernels/vmm.h), takes device 0 and creates the
 * daemon's one stream; each pool's arena is a VMM allocation exported as a
 * POSIX fd, or a legacy CUDA IPC handle on devices without fd handles, and
 * its host arena is pinned with cudaHostRegister so copies run at PCIe
 * speed. Copies are cudaMemcpyAsync / cudaMemcpy2DAsync on the stream and
 * a completion is a cudaLaunchHostFunc behind them, which runs the tier's
 * function on a CUDA thread. Any CUDA error clears the runtime's last
 * error and is -EIO (or, at open, "no GPU" with the reason). Without CUDA
 * in the build the table has only an open, which says so.
 *
 * The runtime is not linked: open loads it (kernels/cudart.h), the library
 * $KVPALACED_CUDART names or libcudart.so.<the build's major version>, so
 * one binary starts on GPU hosts and on hosts without CUDA, where it is a
 * host-and-disk daemon whose status says why. Every call goes through the
 * table open keeps in the device's state.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "gpu_dev.h"
#include "log.h"

#ifdef KVP_HAVE_CUDA
#include "cudart.h"
#include "vmm.h"

/* cudaHostRegister works on ranges; pinning a whole multi-GiB arena in one
 * call holds the driver for long and fails all at once, so it goes in
 * chunks (and a chunk that fails leaves the rest unpinned, which is only
 * slower). */
#define GPU_PIN_CHUNK_BYTES (256ull << 20)

struct gpu_dev {
	const struct cudart *rt;
	int device;
	enum gpu_handle handle;
	cudaStream_t stream;
};

static int cuda_open(struct gpu_dev *g, const struct config *cfg, struct gpu_dev_desc *desc,
		     const char **why)
{
	char name[96];
	enum vmm_kind kind;
	cudaStream_t st;
	const char *lib = secure_getenv("KVPALACED_CUDART");
	int ret;

	/* First, so that vmm's probe gets this library too. */
	if (cudart_open(lib && *lib ? lib : NULL, &g->rt, why) < 0)
		return -ENODEV;
	ret = vmm_probe(why);
	if (ret < 0)
		return -ENODEV;
	g->device = 0;
	ret = vmm_describe(g->device, name, sizeof(name), desc->uuid, &kind);
	if (ret < 0) {
		*why = "the CUDA device cannot be used";
		return -ENODEV;
	}
	if (g->rt->StreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
		g->rt->GetLastError();
		*why = "cannot create a CUDA stream";
		return -ENODEV;
	}
	g->stream = st;
	g->handle = kind == VMM_POSIX_FD ? GPU_HANDLE_POSIX_FD : GPU_HANDLE_CUDA_IPC;
	desc->handle = g->handle;
	snprintf(desc->status, sizeof(desc->status), "%s (device %d), device arenas shared as %s",
		 name, g->device,
		 g->handle == GPU_HANDLE_POSIX_FD
			 ? "POSIX fd (CUDA VMM)"
			 : "legacy CUDA IPC handles (no POSIX fd support)");
	if (cfg->gpu_pool_bytes)
		log_notice("GPU tier: %s; %llu MiB per pool", desc->status,
			   (unsigned long long)(cfg->gpu_pool_bytes >> 20));
	else
		log_notice("GPU tier off (gpu-pool-size 0) on %s", desc->status);
	return 0;
}

static void unpin_host(struct gpu_dev *g, struct gpu_dev_arena *d)
{
	unsigned char *a = d->host_reg;

	for (uint64_t off = 0; a && off < d->host_reg_bytes; off += GPU_PIN_CHUNK_BYTES)
		g->rt->HostUnregister(a + off);
	g->rt->GetLastError();
	d->host_reg = NULL;
	d->host_reg_bytes = 0;
}

static void pin_host(struct gpu_dev *g, struct gpu_dev_arena *d, uint64_t pool_id, void *host,
		     uint64_t host_bytes)
{
	unsigned char *a = host;
	uint64_t off;

	for (off = 0; off < host_bytes; off += GPU_PIN_CHUNK_BYTES) {
		uint64_t n = host_bytes - off;

		if (n > GPU_PIN_CHUNK_BYTES)
			n = GPU_PIN_CHUNK_BYTES;
		if (g->rt->HostRegister(a + off, n, cudaHostRegisterDefault) != cudaSuccess) {
			g->rt->GetLastError();
			log_ctx_warn(LOG_POOL(pool_id),
				     "pool %llu: host arena pinned up to %llu MiB only "
				     "(cudaHostRegister failed; RLIMIT_MEMLOCK?): copies beyond "
				     "go through staging",
				     (unsigned long long)pool_id, (unsigned long long)(off >> 20));
			break;
		}
	}
	d->host_reg = off ? host : NULL;
	d->host_reg_bytes = off;
}

static int cuda_arena_open(struct gpu_dev *g, uint64_t pool_id, void *host, uint64_t host_bytes,
			   uint64_t want, struct gpu_dev_arena *d)
{
	struct vmm_map *m = calloc(1, sizeof(*m));
	int ret;

	if (!m)
		return -ENOMEM;
	ret = vmm_create(g->device, want,
			 g->handle == GPU_HANDLE_POSIX_FD ? VMM_POSIX_FD : VMM_LEGACY_IPC, m);
	if (ret < 0) {
		free(m);
		return ret;
	}
	if (g->handle == GPU_HANDLE_POSIX_FD) {
		ret = vmm_export_fd(m, &d->fd);
		if (ret == 0 && fcntl(d->fd, F_SETFD, FD_CLOEXEC) < 0)
			ret = -errno;
	} else {
		ret = vmm_export_ipc(m, d->ipc);
	}
	if (ret < 0) {
		if (d->fd >= 0)
			close(d->fd);
		d->fd = -1;
		vmm_destroy(m);
		free(m);
		return ret;
	}
	d->map = m;
	d->bytes = m->bytes;
	d->d_base = m->d_base;
	pin_host(g, d, pool_id, host, host_bytes);
	return 0;
}

static void cuda_arena_close(struct gpu_dev *g, struct gpu_dev_arena *d)
{
	unpin_host(g, d);
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	vmm_destroy(d->map);
	free(d->map);
	d->map = NULL;
}

static int cuda_copy(struct gpu_dev *g, uint64_t dst, const void *src, uint64_t bytes)
{
	if (g->rt->MemcpyAsync((void *)(uintptr_t)dst, src, bytes, cudaMemcpyHostToDevice,
			       g->stream) != cudaSuccess) {
		g->rt->GetLastError();
		return -EIO;
	}
	return 0;
}

/* One strided part of a page's rows: rows of `width` bytes at `off` in
 * each of `height` blocks `pitch` apart, device → host. */
static int cuda_rows_back(struct gpu_dev *g, unsigned char *host, uint64_t dev, uint64_t off,
			  uint64_t pitch, uint64_t width, uint64_t height)
{
	if (g->rt->Memcpy2DAsync(host + off, pitch, (const void *)(uintptr_t)(dev + off), pitch,
				 width, height, cudaMemcpyDeviceToHost, g->stream) != cudaSuccess) {
		g->rt->GetLastError();
		return -EIO;
	}
	return 0;
}

static int cuda_launch(struct gpu_dev *g, gpu_dev_done_fn *done, void *arg)
{
	if (g->rt->LaunchHostFunc(g->stream, done, arg) != cudaSuccess) {
		g->rt->GetLastError();
		return -EIO;
	}
	return 0;
}

static void cuda_sync(struct gpu_dev *g)
{
	g->rt->StreamSynchronize(g->stream);
	g->rt->GetLastError();
}

/* A copy that failed after it was queued shows as the stream's (sticky)
 * error. */
static int cuda_copy_error(struct gpu_dev *g)
{
	cudaError_t e = g->rt->StreamQuery(g->stream);

	if (e != cudaSuccess && e != cudaErrorNotReady) {
		g->rt->GetLastError();
		return -EIO;
	}
	return 0;
}

static void cuda_close(struct gpu_dev *g)
{
	/* Copies in flight target arenas: wait for them (their callbacks
	 * then sit on the finished list and are freed with their pools'
	 * jobs by whoever stops the loop; at a clean stop none is left). */
	g->rt->StreamSynchronize(g->stream);
	g->rt->StreamDestroy(g->stream);
	g->rt->GetLastError();
}

static const struct gpu_dev_ops cuda_ops = {
	.dev_bytes = sizeof(struct gpu_dev),
	.open = cuda_open,
	.close = cuda_close,
	.arena_open = cuda_arena_open,
	.arena_close = cuda_arena_close,
	.copy_to_device = cuda_copy,
	.copy_rows_to_host = cuda_rows_back,
	.launch_done = cuda_launch,
	.sync = cuda_sync,
	.copy_error = cuda_copy_error,
};
#else
/* ---- no CUDA in this build -------------------------------------------------- */

static int cuda_open(struct gpu_dev *g, const struct config *cfg, struct gpu_dev_desc *desc,
		     const char **why)
{
	(void)g;
	(void)cfg;
	(void)desc;
	*why = "built without CUDA";
	return -ENODEV;
}

static const struct gpu_dev_ops cuda_ops = {
	.open = cuda_open,
};
#endif

const struct gpu_dev_ops *gpu_cuda_ops(void)
{
	return &cuda_ops;
}
