/* kernels/cudart_dl.c — the CUDA runtime loaded at run time (cudart.h), for
 * the daemon: dlopen at the first cudart_open, every function looked up
 * with dlsym, so kvpalaced has no DT_NEEDED on a CUDA library and starts
 * on hosts without one.
 *
 * The default name is the soname of the major version the build compiled
 * against, libcudart.so.<CUDART_MAJOR>, searched as the dynamic linker
 * would have searched it for a linked binary (LD_LIBRARY_PATH, ld.so.cache,
 * the default directories). The versionless libcudart.so is not tried: it
 * is the toolkit's development symlink (present only where the soname is
 * too) and may name another major version, whose structures
 * (cudaDeviceProp) and behaviour differ from the headers this was built
 * with. For the same reason a library that loads but reports another
 * major version through cudaRuntimeGetVersion is refused.
 *
 * RTLD_LOCAL keeps the runtime's symbols out of the global scope (nothing
 * else in the process should bind to them), RTLD_NOW resolves it whole at
 * load. The handle is never closed (cudart.h says why), not even that of
 * a library refused for a missing function or its version, which may be a
 * runtime all the same. A mutex makes the first load the only one.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cudart.h"

#define CUDART_STR_(x) #x
#define CUDART_STR(x)  CUDART_STR_(x) /* x macro-expanded first: the header's aliases */

static const struct {
	size_t off;
	const char *sym;
} funcs[] = {
#define CUDART_SYM(f) {offsetof(struct cudart, f), CUDART_STR(cuda##f)},
	CUDART_FUNCS(CUDART_SYM)
#undef CUDART_SYM
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int tried;
static int result; /* 0 or -ENODEV, once tried */
static struct cudart rt;
static char why_buf[320];

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why_buf, sizeof(why_buf), fmt, ap);
	va_end(ap);
	result = -ENODEV;
}

static void load(const char *name)
{
	char soname[32];
	void *h;
	int v = 0;

	if (!name) {
		snprintf(soname, sizeof(soname), "libcudart.so.%d", CUDART_MAJOR);
		name = soname;
	}
	dlerror();
	h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		/* glibc's text names the file: "libcudart.so.13: cannot open
		 * shared object file: No such file or directory". */
		const char *e = dlerror();

		if (e)
			fail("no CUDA runtime: %s", e);
		else
			fail("no CUDA runtime: %s: cannot load", name);
		return;
	}
	for (size_t i = 0; i < sizeof(funcs) / sizeof(funcs[0]); i++) {
		void *fn;

		dlerror();
		fn = dlsym(h, funcs[i].sym);
		if (!fn) {
			fail("no CUDA runtime: %s lacks %s", name, funcs[i].sym);
			return;
		}
		memcpy((char *)&rt + funcs[i].off, &fn, sizeof(fn));
	}
	if (rt.RuntimeGetVersion(&v) != cudaSuccess) {
		fail("no CUDA runtime: %s: cudaRuntimeGetVersion failed", name);
		return;
	}
	if (v / 1000 != CUDART_MAJOR) {
		fail("no CUDA runtime: %s is CUDA %d.%d, built for CUDA %d", name, v / 1000,
		     v % 1000 / 10, CUDART_MAJOR);
		return;
	}
	rt.version = v;
	result = 0;
}

int cudart_open(const char *name, const struct cudart **ret, const char **why)
{
	pthread_mutex_lock(&mu);
	if (!tried) {
		tried = 1;
		load(name);
	}
	pthread_mutex_unlock(&mu);
	if (result < 0) {
		if (why)
			*why = why_buf;
		return result;
	}
	*ret = &rt;
	return 0;
}
