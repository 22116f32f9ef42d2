/* daemon/service/reply.c — what a reply holds goes with it (reply.h). */
#include <stdlib.h>

#include "reply.h"

void reply_fini(struct reply *r)
{
	free(r->heap);
	r->heap = NULL;
}
