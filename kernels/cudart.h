/* kernels/cudart.h — the CUDA runtime functions kvpalace's C code calls, as
 * one table of pointers.
 *
 * Why a table: a binary with a DT_NEEDED on libcudart.so does not start
 * where the CUDA runtime is not installed (exit 127, before main). The
 * daemon must run there as a host-and-disk cache, so it loads the runtime
 * when it probes the GPU (cudart_dl.c: dlopen, each function looked up by
 * name) and reports a runtime it cannot load like a missing GPU. The
 * client library links the static runtime instead, which loads anywhere
 * (cudart_static.c: the table holds the linked functions). vmm.c and the
 * daemon's CUDA device call through the table either way; exactly one of
 * the two files is linked into a binary.
 *
 * Each pointer has the type of the function cuda_runtime_api.h declares,
 * and the name looked up is the one the header maps the call to (its
 * per-thread-stream or versioned aliases included), so a call through the
 * table is the call the header would have compiled. Built only with CUDA
 * (KVP_HAVE_CUDA). Never logs.
 */
#ifndef KVP_KERNELS_CUDART_H
#define KVP_KERNELS_CUDART_H

#include <cuda_runtime_api.h>

/* The runtime's major version this code is compiled against: the soname
 * it loads is libcudart.so.<major>. */
#define CUDART_MAJOR (CUDART_VERSION / 1000)

/* Every runtime function called, without its "cuda" prefix. */
#define CUDART_FUNCS(X)                                                                            \
	X(RuntimeGetVersion)                                                                       \
	X(GetDeviceCount)                                                                          \
	X(GetLastError)                                                                            \
	X(GetErrorName)                                                                            \
	X(GetDriverEntryPointByVersion)                                                            \
	X(SetDevice)                                                                               \
	X(GetDeviceProperties)                                                                     \
	X(Malloc)                                                                                  \
	X(Free)                                                                                    \
	X(IpcGetMemHandle)                                                                         \
	X(IpcOpenMemHandle)                                                                        \
	X(IpcCloseMemHandle)                                                                       \
	X(HostRegister)                                                                            \
	X(HostUnregister)                                                                          \
	X(StreamCreateWithFlags)                                                                   \
	X(StreamDestroy)                                                                           \
	X(StreamSynchronize)                                                                       \
	X(StreamQuery)                                                                             \
	X(MemcpyAsync)                                                                             \
	X(Memcpy2DAsync)                                                                           \
	X(LaunchHostFunc)

struct cudart {
#define CUDART_FIELD(f) __typeof__(cuda##f) *f;
	CUDART_FUNCS(CUDART_FIELD)
#undef CUDART_FIELD
	int version; /* cudaRuntimeGetVersion of the runtime in use */
};

/* The runtime's table, loaded at the first call and kept for the life of
 * the process (a runtime is never unloaded: it leaves threads and exit
 * handlers behind). name: the library to load (a file name searched as
 * dlopen(3) does, or a path), NULL for libcudart.so.<CUDART_MAJOR>; only
 * the first call's name counts, later calls get its outcome. The static
 * runtime ignores name. 0 and the table in *ret, or -ENODEV and in *why a
 * reason that starts "no CUDA runtime: " (valid for the life of the
 * process): the library could not be loaded (dlerror's text), lacks a
 * function, or is another major version than the build's. Thread-safe. */
int cudart_open(const char *name, const struct cudart **ret, const char **why);

#endif
