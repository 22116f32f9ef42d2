/* daemon/store/tokvec.h — a session's token ids and per-token metadata, shared
 * copy-on-write between a session and its forks.
 *
 * A session keeps about 20 bytes per token besides its pages (the id and
 * struct token_meta). Forks share pages; if each also copied these, 40
 * forks of a 1M-token session would add 820 MiB of daemon heap (issue 14,
 * item 3). So the tokens live in chunks of per_chunk tokens, each with a
 * reference count: a fork takes references on its parent's chunks, and a
 * session copies a chunk only when it writes into one somebody else holds
 * (in practice the partial last chunk when a fork appends, or every chunk
 * when importance scores or compaction rewrite metadata). per_chunk is a
 * multiple of the pool's block_tokens, so a page's tokens never straddle
 * two chunks and can be hashed in place.
 *
 * Memory is charged where it is allocated: every chunk's capacity is added
 * to the making vector's *account (the tenant's max-tenant-tokens count)
 * and taken off that same account when its last holder lets go, whoever
 * that is (forks stay in their parent's pool, so it is the same tenant).
 *
 * The vector does not know its length: callers pass it (the session's
 * n_tokens). Reading position i needs i below what was prepared; writing it
 * needs a tokvec_prepare covering it since the last share or cut.
 * Event-loop thread only.
 */
#ifndef KVPD_TOKVEC_H
#define KVPD_TOKVEC_H

#include <stdint.h>

#include "log.h"
#include "policy.h"

/* Tokens per chunk, rounded up to a multiple of block_tokens. */
#define TOKVEC_CHUNK_TOKENS 4096u

struct tokvec_chunk {
	uint32_t refs;	   /* vectors holding it */
	uint32_t cap;	   /* tokens it has room for, <= per_chunk */
	uint64_t *account; /* charged cap at its making */
	uint32_t *ids;	   /* [cap], in the same allocation, after the chunk */
	/* [cap], or NULL while every token's metadata is the default one
	 * (position = its index, untagged, no score): what an exact session's
	 * tokens have unless tagged or scored, 16 bytes a token not spent.
	 * Made on the first write that needs it (tokvec_prepare's with_meta). */
	struct token_meta *meta;
};

struct tokvec {
	struct tokvec_chunk **chunks; /* [cap_chunks], n_chunks used; &one while cap_chunks is 1 */
	uint32_t n_chunks, cap_chunks;
	uint32_t per_chunk;
	uint64_t *account; /* token slots charged (cache_tenant.meta_tokens) */
	/* The table of a vector of one chunk (up to 4096 tokens: most of
	 * them), which saves an allocation. The vector may not be moved. */
	struct tokvec_chunk *one;
};

/* An empty vector whose chunks hold a multiple of block_tokens tokens,
 * charged to *account. */
void tokvec_init(struct tokvec *v, uint32_t block_tokens, uint64_t *account);
/* Lets go of every chunk (freed when nobody else holds it). */
void tokvec_fini(struct tokvec *v);

/* Makes positions [from, to) writable in a vector holding len valid
 * tokens (to may exceed len: room to append): the chunks covering them
 * exist, have room, and are held by v alone (shared ones are copied, with
 * the valid tokens they hold); with with_meta their metadata too (made,
 * as the defaults, where a chunk had none). Without it, only default
 * metadata may be written there (tokvec_meta_w needs tokvec_has_meta).
 * Returns 0, -EDQUOT when *account would pass limit, or -ENOMEM; either
 * way v's contents are unchanged. The charge is the same either way. */
int tokvec_prepare(struct tokvec *v, uint64_t len, uint64_t from, uint64_t to, uint64_t limit,
		   int with_meta);

/* The slots tokvec_prepare(v, len, from, to, ...) would add to *account
 * now, changing nothing: a caller checks the limit with it before doing
 * what it could not undo (an append evicting pages for room). */
uint64_t tokvec_charge(const struct tokvec *v, uint64_t from, uint64_t to);

/* Makes empty dst hold the first n tokens of src by sharing its chunks.
 * Returns 0 or -ENOMEM (dst still empty). */
int tokvec_share(struct tokvec *dst, const struct tokvec *src, uint64_t n);

/* Keeps only the chunks holding positions below n. */
void tokvec_cut(struct tokvec *v, uint64_t n);

/* Copies positions [from, from + n) out, ids into ids and metadata into
 * meta (either may be NULL). */
void tokvec_get(const struct tokvec *v, uint64_t from, uint64_t n, uint32_t *ids,
		struct token_meta *meta);
/* Copies ids[0..n) and meta[0..n) (NULL: leaves metadata alone) to
 * positions [from, from + n), prepared. */
void tokvec_put(struct tokvec *v, uint64_t from, uint64_t n, const uint32_t *ids,
		const struct token_meta *meta);

static inline uint32_t tokvec_id(const struct tokvec *v, uint64_t i)
{
	return v->chunks[i / v->per_chunk]->ids[i % v->per_chunk];
}

/* Position i's metadata (a copy: a chunk without any holds the default). */
static inline struct token_meta tokvec_meta(const struct tokvec *v, uint64_t i)
{
	const struct tokvec_chunk *k = v->chunks[i / v->per_chunk];

	if (k->meta)
		return k->meta[i % v->per_chunk];
	return (struct token_meta){.pos = (uint32_t)i};
}

/* Whether position i's chunk holds metadata of its own. */
static inline int tokvec_has_meta(const struct tokvec *v, uint64_t i)
{
	return v->chunks[i / v->per_chunk]->meta != NULL;
}

/* Position i's metadata, for writing: i must be prepared with_meta. */
static inline struct token_meta *tokvec_meta_w(struct tokvec *v, uint64_t i)
{
	struct tokvec_chunk *k = v->chunks[i / v->per_chunk];

	kvp_assert(k->meta);
	return &k->meta[i % v->per_chunk];
}

/* The ids from position i to the end of its chunk: a page's tokens are
 * contiguous there (per_chunk is a multiple of block_tokens). */
static inline const uint32_t *tokvec_ids_at(const struct tokvec *v, uint64_t i)
{
	return &v->chunks[i / v->per_chunk]->ids[i % v->per_chunk];
}

#endif
