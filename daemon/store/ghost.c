/* daemon/store/ghost.c — a fixed-size FIFO of evicted pages' use counts
 * (ghost.h), an open-addressed table (linear probing, deletion by
 * backward shift) beside a ring of keys that says which to forget next.
 * Event-loop thread only.
 */
#include <errno.h>
#include <stdlib.h>

#include "ghost.h"

int ghost_init(struct ghost *g, uint32_t n)
{
	uint32_t size = 2;

	*g = (struct ghost){0};
	if (!n)
		return 0;
	if (n > (1u << 28))
		return -EINVAL;
	while (size < 2 * n)
		size *= 2;
	g->tab = calloc(size, sizeof(*g->tab));
	g->ring = calloc(n, sizeof(*g->ring));
	if (!g->tab || !g->ring) {
		ghost_fini(g);
		return -ENOMEM;
	}
	g->n = n;
	g->mask = size - 1;
	return 0;
}

void ghost_fini(struct ghost *g)
{
	free(g->tab);
	free(g->ring);
	*g = (struct ghost){0};
}

static uint32_t home(const struct ghost *g, uint64_t key)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & g->mask;
}

static uint32_t find(const struct ghost *g, uint64_t key)
{
	uint32_t i = home(g, key);

	while (g->tab[i].key && g->tab[i].key != key)
		i = (i + 1) & g->mask;
	return i;
}

/* Empties slot i, shifting later entries of its probe run back. */
static void remove_at(struct ghost *g, uint32_t i)
{
	uint32_t j = i;

	g->tab[i].key = 0;
	g->used--;
	for (;;) {
		uint32_t h;

		j = (j + 1) & g->mask;
		if (!g->tab[j].key)
			return;
		h = home(g, g->tab[j].key);
		/* Move j to i if i lies cyclically in [h, j). */
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
			g->tab[i] = g->tab[j];
			g->tab[j].key = 0;
			i = j;
		}
	}
}

void ghost_put(struct ghost *g, uint64_t key, uint8_t count, uint32_t epoch)
{
	uint64_t old;
	uint32_t i;

	if (!g->n)
		return;
	key |= 1;
	i = find(g, key);
	if (g->tab[i].key) { /* already there: forget it, remember anew */
		g->ring[g->tab[i].ring] = 0;
		remove_at(g, i);
	}
	old = g->ring[g->ring_pos];
	if (old) {
		uint32_t j = find(g, old);

		if (g->tab[j].key == old && g->tab[j].ring == g->ring_pos)
			remove_at(g, j);
	}
	i = find(g, key);
	g->tab[i] = (struct ghost_slot){
		.key = key, .epoch = epoch, .count = count, .ring = g->ring_pos};
	g->used++;
	g->ring[g->ring_pos] = key;
	g->ring_pos = (g->ring_pos + 1) % g->n;
}

int ghost_take(struct ghost *g, uint64_t key, uint8_t *ret_count, uint32_t *ret_epoch)
{
	uint32_t i;

	if (!g->n)
		return 0;
	key |= 1;
	i = find(g, key);
	if (!g->tab[i].key)
		return 0;
	*ret_count = g->tab[i].count;
	*ret_epoch = g->tab[i].epoch;
	g->ring[g->tab[i].ring] = 0;
	remove_at(g, i);
	return 1;
}
