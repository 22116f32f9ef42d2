/* daemon/base/idseq.h — objects in increasing id order, for listings
 * paged by "after this id".
 *
 * A sorted array of (id, pointer). The ids of one tenant only ever grow
 * (cache_new_id), so adding a pool's new session appends; a smaller id is
 * still put in its place (O(n), never expected). Removing leaves the entry
 * with a NULL pointer (its id keeps the array sorted for the binary
 * search) and the holes are squeezed out once they outnumber the live
 * entries, so removal is O(log n) amortized and a walk from any id
 * crosses at most as many holes as there are live entries. A listing
 * page is O(log n + page + holes crossed). Event-loop thread only.
 */
#ifndef KVPD_IDSEQ_H
#define KVPD_IDSEQ_H

#include <stddef.h>
#include <stdint.h>

struct idseq_entry {
	uint64_t id;
	void *ptr; /* NULL: removed */
};

struct idseq {
	struct idseq_entry *v; /* [cap], n used, ids strictly increasing */
	size_t n, cap;
	size_t dead; /* entries with ptr NULL */
};

/* A zeroed struct idseq is a valid empty sequence. */
void idseq_fini(struct idseq *q);
/* Adds ptr (not NULL) under id (absent, not 0). Returns 0 or -ENOMEM. */
int idseq_add(struct idseq *q, uint64_t id, void *ptr);
/* Removes id (present). */
void idseq_del(struct idseq *q, uint64_t id);
/* Live entries. */
static inline size_t idseq_count(const struct idseq *q)
{
	return q->n - q->dead;
}
/* The index of the first entry, live or not, whose id exceeds after_id
 * (q->n when none). O(log n). */
size_t idseq_after(const struct idseq *q, uint64_t after_id);
/* The index of the first live entry at or after i (q->n when none). */
static inline size_t idseq_live(const struct idseq *q, size_t i)
{
	while (i < q->n && !q->v[i].ptr)
		i++;
	return i;
}

#endif
