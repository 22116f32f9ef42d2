/* examples/tinylm/kvtable.h — the page table of one sequence for tinylm:
 * pages borrowed from kvpalace (a session's reserved pages, a lease's
 * pinned pages) and private pages of this process, side by side.
 *
 * Restoring a cached prefix maps the leased pages as they are; a partial
 * last page (a lease may end inside a page) is read-only and half full, so
 * its tokens are copied into a private page with kref_gather_tokens and the
 * sequence goes on there. Single-threaded; the table owns its private pages
 * and its arrays, never the borrowed pages.
 */
#ifndef KVP_TINYLM_KVTABLE_H
#define KVP_TINYLM_KVTABLE_H

#include "tinylm.h"

struct kvtable {
	struct tinylm_kv kv; /* what tinylm_step reads and writes */
	void **owned;	     /* [cap]: private pages to free, NULL when borrowed */
	uint64_t cap;
	size_t page_bytes;
};

void kvtable_init(struct kvtable *t, const struct shm_layout *l);
/* Frees private pages and the arrays; borrowed pages are left alone. */
void kvtable_free(struct kvtable *t);

/* Puts page at index i, growing the table to at least i + 1 entries;
 * owned pages are freed by the table. Errors: -ENOMEM. */
int kvtable_set(struct kvtable *t, uint64_t i, void *page, int owned);

/* Makes sure the page holding position pos exists, adding a zeroed
 * private page when it does not. Errors: -ENOMEM. */
int kvtable_ensure(struct kvtable *t, uint64_t pos);

/* Maps positions [0, m) cached in src (src[i] is the read-only page of
 * positions [i * block_tokens, ...)): full pages are borrowed, the tokens
 * of a partial last page are copied into a private page. The table must be
 * empty. Returns the number of tokens copied (0 .. block_tokens - 1), or
 * -EINVAL / -ENOMEM. */
int kvtable_restore(struct kvtable *t, const void *const *src, uint64_t m);

#endif
