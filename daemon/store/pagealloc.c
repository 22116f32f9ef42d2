/* daemon/store/pagealloc.c — page-slot allocator (see pagealloc.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pagealloc.h"

int pagealloc_init(struct pagealloc *pa, uint32_t n_pages)
{
	pa->n_pages = n_pages;
	pa->n_free = n_pages;
	pa->n_released = n_pages; /* nothing touched yet */
	pa->n_pinned = 0;
	pa->free_stack = calloc(n_pages ? n_pages : 1, sizeof(uint32_t));
	pa->refs = calloc(n_pages ? n_pages : 1, sizeof(uint32_t));
	pa->pins = calloc(n_pages ? n_pages : 1, sizeof(uint32_t));
	if (!pa->free_stack || !pa->refs || !pa->pins) {
		pagealloc_fini(pa);
		return -ENOMEM;
	}
	/* Lowest slot on top so a fresh pool fills its arena from the start. */
	for (uint32_t i = 0; i < n_pages; i++)
		pa->free_stack[i] = n_pages - 1 - i;
	return 0;
}

void pagealloc_fini(struct pagealloc *pa)
{
	free(pa->free_stack);
	free(pa->refs);
	free(pa->pins);
	pa->free_stack = pa->refs = pa->pins = NULL;
	pa->n_free = pa->n_pages = pa->n_pinned = 0;
}

int pagealloc_get(struct pagealloc *pa, uint32_t *ret_slot)
{
	uint32_t slot;

	if (!pa->n_free)
		return -ENOSPC;
	slot = pa->free_stack[--pa->n_free];
	if (pa->n_released > pa->n_free)
		pa->n_released = pa->n_free; /* its memory comes back on first touch */
	kvp_assert(pa->refs[slot] == 0);
	pa->refs[slot] = 1;
	pa->n_gets++;
	*ret_slot = slot;
	return 0;
}

void pagealloc_ref(struct pagealloc *pa, uint32_t slot)
{
	kvp_assert(slot < pa->n_pages && pa->refs[slot] > 0);
	pa->refs[slot]++;
}

uint32_t pagealloc_unref(struct pagealloc *pa, uint32_t slot)
{
	kvp_assert(slot < pa->n_pages && pa->refs[slot] > pa->pins[slot]);
	if (--pa->refs[slot] == 0)
		pa->free_stack[pa->n_free++] = slot;
	return pa->refs[slot];
}

void pagealloc_pin(struct pagealloc *pa, uint32_t slot)
{
	pagealloc_ref(pa, slot);
	if (pa->pins[slot]++ == 0)
		pa->n_pinned++;
}

void pagealloc_unpin(struct pagealloc *pa, uint32_t slot)
{
	kvp_assert(slot < pa->n_pages && pa->pins[slot] > 0);
	if (--pa->pins[slot] == 0)
		pa->n_pinned--;
	pagealloc_unref(pa, slot);
}

static int cmp_slot(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

uint32_t pagealloc_release(const struct pagealloc *pa, uint32_t keep, uint32_t max, uint32_t *slots)
{
	uint32_t n;

	if (pa->n_free <= keep || pa->n_free - keep <= pa->n_released)
		return 0;
	n = pa->n_free - keep - pa->n_released;
	if (n > max)
		n = max;
	for (uint32_t i = 0; i < n; i++)
		slots[i] = pa->free_stack[pa->n_released + i];
	qsort(slots, n, sizeof(*slots), cmp_slot);
	return n;
}

void pagealloc_released(struct pagealloc *pa, uint32_t n)
{
	kvp_assert(pa->n_released + n <= pa->n_free);
	pa->n_released += n;
}

uint32_t pagealloc_cold_top(const struct pagealloc *pa, uint32_t max, uint32_t *slots,
			    uint32_t *ret_pos)
{
	uint32_t n = pa->n_released < max ? pa->n_released : max;

	*ret_pos = pa->n_released - n;
	memcpy(slots, pa->free_stack + *ret_pos, n * sizeof(*slots));
	return n;
}

uint32_t pagealloc_warmed(struct pagealloc *pa, uint32_t pos, uint32_t n, const uint32_t *slots)
{
	uint32_t *at = pa->free_stack + pos, above;

	if (!n || pos > pa->n_released || n > pa->n_released - pos ||
	    memcmp(at, slots, n * sizeof(*slots)))
		return 0;
	/* Slots released since lie above them: those go below, so that the
	 * warm ones are the top of the released part; then the line moves
	 * under them. */
	above = pa->n_released - pos - n;
	memmove(at, at + n, above * sizeof(*at));
	memcpy(at + above, slots, n * sizeof(*slots));
	pa->n_released -= n;
	return n;
}

uint32_t pagealloc_count_pinned(const struct pagealloc *pa)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < pa->n_pages; i++)
		n += pa->pins[i] > 0;
	return n;
}

int pagealloc_check(const struct pagealloc *pa)
{
	uint32_t held = 0, pinned = 0;
	int ret = 0;
	unsigned char *seen;

	if (pa->n_free > pa->n_pages || pa->n_released > pa->n_free)
		return -EUCLEAN;
	seen = calloc(pa->n_pages ? pa->n_pages : 1, 1);
	if (!seen)
		return -ENOMEM;
	for (uint32_t i = 0; i < pa->n_free; i++) {
		uint32_t s = pa->free_stack[i];

		if (s >= pa->n_pages || seen[s] || pa->refs[s]) {
			ret = -EUCLEAN;
			goto out;
		}
		seen[s] = 1;
	}
	for (uint32_t i = 0; i < pa->n_pages; i++) {
		if (pa->pins[i] > pa->refs[i]) {
			ret = -EUCLEAN;
			goto out;
		}
		held += pa->refs[i] > 0;
		pinned += pa->pins[i] > 0;
	}
	if (held + pa->n_free != pa->n_pages || pinned != pa->n_pinned)
		ret = -EUCLEAN;
out:
	free(seen);
	return ret;
}
