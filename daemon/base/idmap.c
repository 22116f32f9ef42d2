/* daemon/base/idmap.c — id → pointer hash map (see idmap.h). */
#include <errno.h>
#include <stdlib.h>

#include "idmap.h"
#include "log.h"

static size_t slot_of(uint64_t id, size_t cap)
{
	/* Fibonacci hashing spreads sequential ids across the table. */
	return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

void idmap_fini(struct idmap *m)
{
	free(m->slots);
	m->slots = NULL;
	m->cap = m->n = 0;
}

void *idmap_get(const struct idmap *m, uint64_t id)
{
	if (!m->cap || !id)
		return NULL;
	for (size_t i = slot_of(id, m->cap);; i = (i + 1) & (m->cap - 1)) {
		if (m->slots[i].id == id)
			return m->slots[i].ptr;
		if (!m->slots[i].id)
			return NULL;
	}
}

void idmap_prefetch(const struct idmap *m, uint64_t id)
{
	if (m->cap)
		__builtin_prefetch(&m->slots[slot_of(id, m->cap)]);
}

/* Moves every id into s, a zeroed table of cap slots (a power of two,
 * above n), which m owns from then on. */
static void move_into(struct idmap *m, struct idmap_entry *s, size_t cap)
{
	for (size_t i = 0; i < m->cap; i++) {
		size_t j;

		if (!m->slots[i].id)
			continue;
		for (j = slot_of(m->slots[i].id, cap); s[j].id; j = (j + 1) & (cap - 1))
			;
		s[j] = m->slots[i];
	}
	free(m->slots);
	m->slots = s;
	m->cap = cap;
}

static int rehash(struct idmap *m, size_t cap)
{
	struct idmap_entry *s = calloc(cap, sizeof(*s));

	if (!s)
		return -ENOMEM;
	move_into(m, s, cap);
	return 0;
}

static size_t cap_for(size_t n, size_t cap)
{
	cap = cap ? cap : 64;
	while ((n + 1) * 4 > cap * 3)
		cap *= 2;
	return cap;
}

struct idmap_entry *idmap_table_new(size_t n, size_t *ret_cap)
{
	size_t cap = cap_for(n, 0);
	struct idmap_entry *s = calloc(cap, sizeof(*s));

	if (!s)
		return NULL;
	/* calloc's fresh pages are zero but not there yet: fault them in. */
	for (size_t i = 0; i < cap; i += 4096 / sizeof(*s))
		((volatile struct idmap_entry *)s)[i].id = 0;
	*ret_cap = cap;
	return s;
}

int idmap_adopt(struct idmap *m, struct idmap_entry *slots, size_t cap)
{
	if (cap <= m->cap || (m->n + 1) * 4 > cap * 3)
		return -ENOSPC;
	move_into(m, slots, cap);
	return 0;
}

static int grow(struct idmap *m)
{
	return rehash(m, m->cap ? m->cap * 2 : 64);
}

int idmap_reserve(struct idmap *m, size_t n)
{
	size_t cap = cap_for(n, m->cap);

	/* One table of the final size: a doubling each would copy the ids
	 * at every step. */
	return cap == m->cap ? 0 : rehash(m, cap);
}

int idmap_put(struct idmap *m, uint64_t id, void *ptr)
{
	size_t i;

	kvp_assert(id != 0);
	if ((m->n + 1) * 4 > m->cap * 3) {
		int ret = grow(m);

		if (ret < 0)
			return ret;
	}
	for (i = slot_of(id, m->cap); m->slots[i].id; i = (i + 1) & (m->cap - 1))
		kvp_assert(m->slots[i].id != id);
	m->slots[i].id = id;
	m->slots[i].ptr = ptr;
	m->n++;
	return 0;
}

void *idmap_del(struct idmap *m, uint64_t id)
{
	size_t i, j;
	void *ptr;

	if (!m->cap || !id)
		return NULL;
	for (i = slot_of(id, m->cap); m->slots[i].id != id; i = (i + 1) & (m->cap - 1))
		if (!m->slots[i].id)
			return NULL;
	ptr = m->slots[i].ptr;
	/* Backward-shift deletion keeps probe chains intact without tombstones. */
	for (j = (i + 1) & (m->cap - 1); m->slots[j].id; j = (j + 1) & (m->cap - 1)) {
		size_t home = slot_of(m->slots[j].id, m->cap);

		/* Move j back into the hole at i unless its home lies in (i, j]. */
		if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	m->slots[i].id = 0;
	m->slots[i].ptr = NULL;
	m->n--;
	return ptr;
}
