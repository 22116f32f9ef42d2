/* daemon/base/idseq.c — id-ordered sequence with lazy removal (see
 * idseq.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "idseq.h"
#include "log.h"

/* Holes are squeezed out once there are more of them than this and than
 * live entries: a small sequence never bothers. */
#define IDSEQ_MIN_DEAD 16u

void idseq_fini(struct idseq *q)
{
	free(q->v);
	memset(q, 0, sizeof(*q));
}

size_t idseq_after(const struct idseq *q, uint64_t after_id)
{
	size_t lo = 0, hi = q->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (q->v[mid].id <= after_id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void squeeze(struct idseq *q)
{
	size_t k = 0;

	for (size_t i = 0; i < q->n; i++)
		if (q->v[i].ptr)
			q->v[k++] = q->v[i];
	q->n = k;
	q->dead = 0;
}

int idseq_add(struct idseq *q, uint64_t id, void *ptr)
{
	size_t at;

	kvp_assert(id != 0 && ptr);
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 16;
		struct idseq_entry *v;

		/* Holes first: they may make room without growing. */
		if (q->dead) {
			squeeze(q);
			return idseq_add(q, id, ptr);
		}
		v = realloc(q->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		q->v = v;
		q->cap = cap;
	}
	at = q->n && q->v[q->n - 1].id > id ? idseq_after(q, id) : q->n;
	kvp_assert(at == 0 || q->v[at - 1].id != id);
	memmove(&q->v[at + 1], &q->v[at], (q->n - at) * sizeof(*q->v));
	q->v[at] = (struct idseq_entry){.id = id, .ptr = ptr};
	q->n++;
	return 0;
}

void idseq_del(struct idseq *q, uint64_t id)
{
	size_t i = idseq_after(q, id - 1);

	kvp_assert(i < q->n && q->v[i].id == id && q->v[i].ptr);
	q->v[i].ptr = NULL;
	q->dead++;
	if (q->dead > IDSEQ_MIN_DEAD && q->dead > q->n - q->dead)
		squeeze(q);
}
