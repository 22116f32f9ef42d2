/* kernels/cudart_static.c — the CUDA runtime linked in (cudart.h), for the
 * client library: libkvpalace links libcudart_static.a, which has no
 * DT_NEEDED of its own, so the library loads where no CUDA is installed
 * and its GPU calls fail cleanly there (no driver). The table holds the
 * linked functions; there is nothing to load and nothing can fail.
 */
#include <stddef.h>

#include "cudart.h"

static const struct cudart rt = {
#define CUDART_LINKED(f) .f = cuda##f,
	CUDART_FUNCS(CUDART_LINKED)
#undef CUDART_LINKED
		.version = CUDART_VERSION,
};

int cudart_open(const char *name, const struct cudart **ret, const char **why)
{
	(void)name;
	(void)why;
	*ret = &rt;
	return 0;
}
