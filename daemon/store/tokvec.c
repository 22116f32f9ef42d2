/* daemon/store/tokvec.c — chunked copy-on-write token ids and metadata (see
 * tokvec.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tokvec.h"

/* The smallest chunk: a short session costs little (16 tokens, 320
 * bytes; the last chunk doubles from there up to per_chunk). */
#define TOKVEC_MIN_CAP 16u

void tokvec_init(struct tokvec *v, uint32_t block_tokens, uint64_t *account)
{
	uint32_t bt = block_tokens ? block_tokens : 1;

	memset(v, 0, sizeof(*v));
	v->per_chunk = (TOKVEC_CHUNK_TOKENS + bt - 1) / bt * bt;
	v->account = account;
}

static void chunk_free(struct tokvec_chunk *k)
{
	free(k->meta);
	free(k);
}

static void chunk_unref(struct tokvec *v, struct tokvec_chunk *k)
{
	if (--k->refs)
		return;
	*k->account -= k->cap;
	chunk_free(k);
}

void tokvec_fini(struct tokvec *v)
{
	tokvec_cut(v, 0);
	if (v->chunks != &v->one)
		free(v->chunks);
	v->chunks = NULL;
	v->cap_chunks = 0;
}

void tokvec_cut(struct tokvec *v, uint64_t n)
{
	uint32_t keep = (uint32_t)((n + v->per_chunk - 1) / v->per_chunk);

	while (v->n_chunks > keep)
		chunk_unref(v, v->chunks[--v->n_chunks]);
}

/* Room for n chunk pointers. */
static int table_room(struct tokvec *v, uint32_t n)
{
	uint32_t cap = v->cap_chunks ? v->cap_chunks : 1;
	struct tokvec_chunk **t;

	if (n <= v->cap_chunks)
		return 0;
	if (n == 1) {
		v->chunks = &v->one;
		v->cap_chunks = 1;
		return 0;
	}
	while (cap < n)
		cap *= 2;
	t = malloc(cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	if (v->n_chunks)
		memcpy(t, v->chunks, v->n_chunks * sizeof(*t));
	if (v->chunks != &v->one)
		free(v->chunks);
	v->chunks = t;
	v->cap_chunks = cap;
	return 0;
}

/* A private chunk of cap tokens from position start holding the first
 * keep of old (NULL: none), with metadata when old has some or with_meta
 * (the defaults where old had none). */
static struct tokvec_chunk *chunk_new(uint32_t cap, uint64_t start, const struct tokvec_chunk *old,
				      uint32_t keep, int with_meta)
{
	/* The ids in the chunk's own allocation: one malloc, not two. */
	struct tokvec_chunk *k = malloc(sizeof(*k) + (size_t)cap * sizeof(*k->ids));

	if (!k)
		return NULL;
	memset(k, 0, sizeof(*k));
	k->refs = 1;
	k->cap = cap;
	k->ids = (uint32_t *)(k + 1);
	if (with_meta || (old && old->meta))
		k->meta = malloc(cap * sizeof(*k->meta));
	if ((with_meta || (old && old->meta)) && !k->meta) {
		chunk_free(k);
		return NULL;
	}
	if (old && keep)
		memcpy(k->ids, old->ids, keep * sizeof(*k->ids));
	if (k->meta && old && old->meta && keep)
		memcpy(k->meta, old->meta, keep * sizeof(*k->meta));
	else if (k->meta)
		for (uint32_t i = 0; i < cap; i++)
			k->meta[i] = (struct token_meta){.pos = (uint32_t)(start + i)};
	return k;
}

/* The capacity chunk ci needs to hold positions below to: whole chunks
 * but the last, which grows by doubling. */
static uint32_t cap_for(const struct tokvec *v, uint32_t ci, uint64_t to)
{
	uint64_t start = (uint64_t)ci * v->per_chunk, need, cap = TOKVEC_MIN_CAP;

	if (to - start >= v->per_chunk)
		return v->per_chunk;
	need = to - start;
	while (cap < need)
		cap *= 2;
	return cap < v->per_chunk ? (uint32_t)cap : v->per_chunk;
}

/* What chunk ci needs so that v may write positions below to: 0 when v
 * alone holds it and it has room, else the capacity of the chunk to make
 * in its place, with the slots that adds to the account in *ret_charge
 * (a shared chunk's copy costs its whole capacity, a grown one the
 * difference). */
static uint32_t chunk_plan(const struct tokvec *v, uint32_t ci, uint64_t to, int with_meta,
			   uint64_t *ret_charge)
{
	const struct tokvec_chunk *old = ci < v->n_chunks ? v->chunks[ci] : NULL;
	uint32_t cap = cap_for(v, ci, to);

	*ret_charge = 0;
	if (old && old->refs == 1 && old->cap >= cap && (old->meta || !with_meta))
		return 0; /* ours, with room (and metadata when asked) */
	if (old && old->cap > cap)
		cap = old->cap;
	*ret_charge = !old || old->refs > 1 ? cap : cap - old->cap;
	return cap;
}

uint64_t tokvec_charge(const struct tokvec *v, uint64_t from, uint64_t to)
{
	uint64_t charge = 0, more;

	if (from >= to)
		return 0;
	for (uint32_t ci = (uint32_t)(from / v->per_chunk);
	     ci <= (uint32_t)((to - 1) / v->per_chunk); ci++) {
		chunk_plan(v, ci, to, 0, &more);
		charge += more;
	}
	return charge;
}

int tokvec_prepare(struct tokvec *v, uint64_t len, uint64_t from, uint64_t to, uint64_t limit,
		   int with_meta)
{
	uint32_t first, last, n_new;
	struct tokvec_chunk **made;
	uint64_t charge = 0;
	int ret = -ENOMEM;

	if (from >= to)
		return 0;
	first = (uint32_t)(from / v->per_chunk);
	last = (uint32_t)((to - 1) / v->per_chunk);
	n_new = last - first + 1;
	/* Positions are prepared at or below the length, so no chunk below
	 * first is missing. */
	kvp_assert(first <= v->n_chunks);
	/* Everything is allocated before anything changes, so a failure
	 * leaves v as it was. */
	if (table_room(v, last + 1) < 0)
		return -ENOMEM;
	made = calloc(n_new, sizeof(*made));
	if (!made)
		return -ENOMEM;
	for (uint32_t ci = first; ci <= last; ci++) {
		struct tokvec_chunk *old = ci < v->n_chunks ? v->chunks[ci] : NULL;
		uint64_t start = (uint64_t)ci * v->per_chunk, more;
		uint32_t cap = chunk_plan(v, ci, to, with_meta, &more), keep = 0;

		if (!cap)
			continue; /* ours, with room */
		if (old && len > start)
			keep = (uint32_t)(len - start < old->cap ? len - start : old->cap);
		charge += more;
		made[ci - first] = chunk_new(cap, start, old, keep, with_meta);
		if (!made[ci - first])
			goto fail;
	}
	/* A limit lowered by a reload refuses growth, not writes in place. */
	if (charge && *v->account + charge > limit) {
		ret = -EDQUOT;
		goto fail;
	}
	for (uint32_t ci = first; ci <= last; ci++) {
		struct tokvec_chunk *k = made[ci - first];

		if (!k)
			continue;
		if (ci < v->n_chunks)
			chunk_unref(v, v->chunks[ci]);
		k->account = v->account;
		*k->account += k->cap;
		v->chunks[ci] = k;
	}
	if (v->n_chunks < last + 1)
		v->n_chunks = last + 1;
	free(made);
	return 0;
fail:
	for (uint32_t i = 0; i < n_new; i++)
		if (made[i])
			chunk_free(made[i]);
	free(made);
	return ret;
}

int tokvec_share(struct tokvec *dst, const struct tokvec *src, uint64_t n)
{
	uint32_t k = (uint32_t)((n + src->per_chunk - 1) / src->per_chunk);

	kvp_assert(dst->n_chunks == 0 && dst->per_chunk == src->per_chunk && k <= src->n_chunks);
	if (table_room(dst, k) < 0)
		return -ENOMEM;
	for (uint32_t i = 0; i < k; i++) {
		dst->chunks[i] = src->chunks[i];
		dst->chunks[i]->refs++;
	}
	dst->n_chunks = k;
	return 0;
}

void tokvec_get(const struct tokvec *v, uint64_t from, uint64_t n, uint32_t *ids,
		struct token_meta *meta)
{
	uint64_t done = 0;

	while (done < n) {
		uint64_t i = from + done, off = i % v->per_chunk;
		const struct tokvec_chunk *k = v->chunks[i / v->per_chunk];
		uint64_t span = v->per_chunk - off < n - done ? v->per_chunk - off : n - done;

		if (ids)
			memcpy(ids + done, k->ids + off, span * sizeof(*ids));
		if (meta && k->meta)
			memcpy(meta + done, k->meta + off, span * sizeof(*meta));
		else if (meta)
			for (uint64_t j = 0; j < span; j++)
				meta[done + j] = (struct token_meta){.pos = (uint32_t)(i + j)};
		done += span;
	}
}

void tokvec_put(struct tokvec *v, uint64_t from, uint64_t n, const uint32_t *ids,
		const struct token_meta *meta)
{
	uint64_t done = 0;

	while (done < n) {
		uint64_t i = from + done, off = i % v->per_chunk;
		struct tokvec_chunk *k = v->chunks[i / v->per_chunk];
		uint64_t span = v->per_chunk - off < n - done ? v->per_chunk - off : n - done;

		kvp_assert(k->refs == 1 && off + span <= k->cap && (!meta || k->meta));
		memcpy(k->ids + off, ids + done, span * sizeof(*ids));
		if (meta)
			memcpy(k->meta + off, meta + done, span * sizeof(*meta));
		done += span;
	}
}
