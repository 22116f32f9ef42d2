/* kernels/vmm.c — shareable device memory through the CUDA driver's
 * virtual-memory-management API, looked up at run time (see vmm.h).
 *
 * The sequence is the one the CUDA programming guide gives for sharing an
 * allocation between processes: cuMemCreate with the POSIX fd handle type
 * requested, cuMemExportToShareableHandle in the exporter,
 * cuMemImportFromShareableHandle in the importer, then in each process
 * cuMemAddressReserve, cuMemMap and cuMemSetAccess (mapping alone grants
 * no access). Sizes are rounded up to the allocation granularity. Devices
 * without POSIX fd handles (some virtualized or older drivers) fall back
 * to cudaMalloc and a legacy cudaIpcMemHandle_t, which travels as bytes.
 *
 * The driver's entry points come from cudaGetDriverEntryPointByVersion
 * for the ABI of CUDA 12.0 (stable since), so a newer driver serves them
 * with the signatures of cudaTypedefs.h's _v10020 typedefs used here.
 *
 * The runtime itself is reached through cudart.h's table (rt), set once
 * by the probe: loaded at run time in the daemon, linked statically in the
 * client library. A runtime that cannot be loaded is "no device", with
 * the loader's reason. Every function below runs after the probe: each
 * starts with it, or takes a map that a probed call made.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cudart.h"
#include "vmm.h"

#define VMM_DRIVER_ABI 12000

static struct {
	PFN_cuDeviceGet_v2000 DeviceGet;
	PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
	PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
	PFN_cuMemCreate_v10020 MemCreate;
	PFN_cuMemRelease_v10020 MemRelease;
	PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
	PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
	PFN_cuMemAddressReserve_v10020 MemAddressReserve;
	PFN_cuMemAddressFree_v10020 MemAddressFree;
	PFN_cuMemMap_v10020 MemMap;
	PFN_cuMemUnmap_v10020 MemUnmap;
	PFN_cuMemSetAccess_v10020 MemSetAccess;
	int n_devices; /* > 0, or a negative errno */
	const char *why;
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static const struct cudart *rt; /* set by drv_load before drv.n_devices > 0 */

static int lookup(const char *name, void **fn)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;

	if (rt->GetDriverEntryPointByVersion(name, fn, VMM_DRIVER_ABI, cudaEnableDefault, &q) !=
		    cudaSuccess ||
	    q != cudaDriverEntryPointSuccess || !*fn) {
		rt->GetLastError();
		return -1;
	}
	return 0;
}

static void drv_load(void)
{
	static char why[96];
	cudaError_t e;
	int n = 0;

	/* The daemon loads the runtime first, with its choice of library:
	 * NULL here gets that outcome (or the default, or the static one). */
	if (cudart_open(NULL, &rt, &drv.why) < 0) {
		drv.n_devices = -ENODEV;
		return;
	}
	/* Without a driver this returns cudaErrorInsufficientDriver (35),
	 * without a device cudaErrorNoDevice (100): both mean no GPU. */
	e = rt->GetDeviceCount(&n);
	if (e != cudaSuccess || n < 1) {
		rt->GetLastError();
		drv.n_devices = -ENODEV;
		if (e != cudaSuccess)
			snprintf(why, sizeof(why), "cudaGetDeviceCount: %s (%d)",
				 rt->GetErrorName(e), (int)e);
		else
			snprintf(why, sizeof(why), "no CUDA device");
		drv.why = why;
		return;
	}
	if (lookup("cuDeviceGet", (void **)&drv.DeviceGet) ||
	    lookup("cuDeviceGetAttribute", (void **)&drv.DeviceGetAttribute) ||
	    lookup("cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity) ||
	    lookup("cuMemCreate", (void **)&drv.MemCreate) ||
	    lookup("cuMemRelease", (void **)&drv.MemRelease) ||
	    lookup("cuMemExportToShareableHandle", (void **)&drv.MemExportToShareableHandle) ||
	    lookup("cuMemImportFromShareableHandle", (void **)&drv.MemImportFromShareableHandle) ||
	    lookup("cuMemAddressReserve", (void **)&drv.MemAddressReserve) ||
	    lookup("cuMemAddressFree", (void **)&drv.MemAddressFree) ||
	    lookup("cuMemMap", (void **)&drv.MemMap) ||
	    lookup("cuMemUnmap", (void **)&drv.MemUnmap) ||
	    lookup("cuMemSetAccess", (void **)&drv.MemSetAccess)) {
		drv.n_devices = -ENODEV;
		drv.why = "the CUDA driver lacks the virtual memory management entry points";
		return;
	}
	drv.n_devices = n;
	drv.why = NULL;
}

int vmm_probe(const char **why)
{
	pthread_once(&drv_once, drv_load);
	if (drv.n_devices < 0 && why)
		*why = drv.why;
	return drv.n_devices;
}

static int cu_err(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	default:
		return -EIO;
	}
}

static int rt_err(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	rt->GetLastError();
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* Makes device current and its primary context live: the driver's VMM
 * calls work on the current context of the thread. */
static int use_device(int device)
{
	int ret = vmm_probe(NULL);

	if (ret < 0)
		return ret;
	if (device < 0 || device >= ret)
		return -ENODEV;
	ret = rt_err(rt->SetDevice(device));
	if (ret == 0)
		ret = rt_err(rt->Free(NULL));
	return ret;
}

int vmm_describe(int device, char *name, size_t n, unsigned char *uuid, enum vmm_kind *ret_kind)
{
	struct cudaDeviceProp prop;
	CUdevice dev;
	int vmm = 0, fd = 0;
	int ret = use_device(device);

	if (ret < 0)
		return ret;
	ret = rt_err(rt->GetDeviceProperties(&prop, device));
	if (ret < 0)
		return ret;
	if (name && n) {
		strncpy(name, prop.name, n - 1);
		name[n - 1] = '\0';
	}
	if (uuid)
		memcpy(uuid, prop.uuid.bytes, VMM_UUID_BYTES);
	ret = cu_err(drv.DeviceGet(&dev, device));
	if (ret == 0)
		ret = cu_err(drv.DeviceGetAttribute(
			&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
	if (ret == 0)
		ret = cu_err(drv.DeviceGetAttribute(
			&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
	if (ret < 0)
		return ret;
	*ret_kind = vmm && fd ? VMM_POSIX_FD : VMM_LEGACY_IPC;
	return 0;
}

int vmm_find_device(const unsigned char *uuid)
{
	int n = vmm_probe(NULL);

	for (int d = 0; d < n; d++) {
		struct cudaDeviceProp prop;

		if (rt->GetDeviceProperties(&prop, d) != cudaSuccess) {
			rt->GetLastError();
			continue;
		}
		if (!memcmp(prop.uuid.bytes, uuid, VMM_UUID_BYTES))
			return d;
	}
	return -ENODEV;
}

static void fill_prop(CUmemAllocationProp *prop, int device)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
}

/* Reserves an address range for m->bytes, maps m->handle there and
 * grants this device read-write access. */
static int map_handle(struct vmm_map *m)
{
	CUmemAccessDesc access;
	CUdeviceptr va = 0;
	int ret;

	ret = cu_err(drv.MemAddressReserve(&va, m->bytes, 0, 0, 0));
	if (ret < 0)
		return ret;
	ret = cu_err(drv.MemMap(va, m->bytes, 0, (CUmemGenericAllocationHandle)m->handle, 0));
	if (ret < 0) {
		drv.MemAddressFree(va, m->bytes);
		return ret;
	}
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = m->device;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ret = cu_err(drv.MemSetAccess(va, m->bytes, &access, 1));
	if (ret < 0) {
		drv.MemUnmap(va, m->bytes);
		drv.MemAddressFree(va, m->bytes);
		return ret;
	}
	m->d_base = (uint64_t)va;
	return 0;
}

static int granular(int device, uint64_t bytes, uint64_t *ret_bytes)
{
	CUmemAllocationProp prop;
	size_t g = 0;
	int ret;

	fill_prop(&prop, device);
	ret = cu_err(drv.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	if (ret < 0)
		return ret;
	if (!g || bytes > UINT64_MAX - g)
		return -EINVAL;
	*ret_bytes = (bytes + g - 1) / g * g;
	return 0;
}

int vmm_create(int device, uint64_t bytes, enum vmm_kind kind, struct vmm_map *m)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h;
	void *p = NULL;
	int ret = use_device(device);

	if (ret < 0)
		return ret;
	if (!bytes)
		return -EINVAL;
	memset(m, 0, sizeof(*m));
	m->device = device;
	m->kind = kind;
	if (kind == VMM_LEGACY_IPC) {
		ret = rt_err(rt->Malloc(&p, bytes));
		if (ret < 0)
			return ret;
		m->d_base = (uint64_t)(uintptr_t)p;
		m->bytes = bytes;
		return 0;
	}
	ret = granular(device, bytes, &m->bytes);
	if (ret < 0)
		return ret;
	fill_prop(&prop, device);
	ret = cu_err(drv.MemCreate(&h, m->bytes, &prop, 0));
	if (ret < 0)
		return ret;
	m->handle = (uint64_t)h;
	ret = map_handle(m);
	if (ret < 0) {
		drv.MemRelease(h);
		memset(m, 0, sizeof(*m));
	}
	return ret;
}

int vmm_export_fd(const struct vmm_map *m, int *ret_fd)
{
	int fd = -1;
	int ret;

	if (m->kind != VMM_POSIX_FD)
		return -EOPNOTSUPP;
	ret = cu_err(drv.MemExportToShareableHandle(&fd, (CUmemGenericAllocationHandle)m->handle,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (ret < 0)
		return ret;
	*ret_fd = fd;
	return 0;
}

int vmm_export_ipc(const struct vmm_map *m, unsigned char *ipc)
{
	cudaIpcMemHandle_t h;
	int ret;

	if (m->kind != VMM_LEGACY_IPC)
		return -EOPNOTSUPP;
	ret = rt_err(rt->IpcGetMemHandle(&h, (void *)(uintptr_t)m->d_base));
	if (ret < 0)
		return ret;
	_Static_assert(sizeof(h) == VMM_IPC_BYTES, "cudaIpcMemHandle_t is 64 bytes");
	memcpy(ipc, &h, VMM_IPC_BYTES);
	return 0;
}

int vmm_import_fd(int device, int fd, uint64_t bytes, struct vmm_map *m)
{
	CUmemGenericAllocationHandle h;
	uint64_t want;
	int ret = use_device(device);

	if (ret < 0)
		return ret;
	ret = granular(device, bytes, &want);
	if (ret < 0)
		return ret;
	if (want != bytes)
		return -EINVAL; /* the exporter rounded the same way */
	memset(m, 0, sizeof(*m));
	m->kind = VMM_POSIX_FD;
	m->device = device;
	m->bytes = bytes;
	m->imported = 1;
	ret = cu_err(drv.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	if (ret < 0)
		return ret;
	m->handle = (uint64_t)h;
	ret = map_handle(m);
	if (ret < 0) {
		drv.MemRelease(h);
		memset(m, 0, sizeof(*m));
	}
	return ret;
}

int vmm_import_ipc(int device, const unsigned char *ipc, uint64_t bytes, struct vmm_map *m)
{
	cudaIpcMemHandle_t h;
	void *p = NULL;
	int ret = use_device(device);

	if (ret < 0)
		return ret;
	memcpy(&h, ipc, VMM_IPC_BYTES);
	ret = rt_err(rt->IpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
	if (ret < 0)
		return ret;
	memset(m, 0, sizeof(*m));
	m->kind = VMM_LEGACY_IPC;
	m->device = device;
	m->d_base = (uint64_t)(uintptr_t)p;
	m->bytes = bytes;
	m->imported = 1;
	return 0;
}

void vmm_destroy(struct vmm_map *m)
{
	if (!m || m->kind == VMM_NONE)
		return;
	if (m->kind == VMM_LEGACY_IPC) {
		if (m->imported)
			rt->IpcCloseMemHandle((void *)(uintptr_t)m->d_base);
		else
			rt->Free((void *)(uintptr_t)m->d_base);
		rt->GetLastError();
	} else {
		/* Unmap, free the range, then drop our reference to the
		 * allocation: the memory goes when the last process did. */
		drv.MemUnmap((CUdeviceptr)m->d_base, m->bytes);
		drv.MemAddressFree((CUdeviceptr)m->d_base, m->bytes);
		drv.MemRelease((CUmemGenericAllocationHandle)m->handle);
	}
	memset(m, 0, sizeof(*m));
}
