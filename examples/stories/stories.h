/* examples/stories/stories.h — stories260K, a small trained Llama-architecture
 * model (models/stories260K/, its README gives the file format), whose KV
 * cache lives in kvpalace pages.
 *
 * The loader reads a llama2.c "legacy" (version 0) checkpoint: a header of
 * seven little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; a negative vocab_size means a separate classifier
 * follows the RoPE tables, a positive one that the classifier is the token
 * embedding), then f32 tensors. Everything in the file is untrusted: sizes
 * are bounded, the heads must divide the dimension, and the file's length
 * must be exactly what the header says.
 *
 * The forward pass is the standard Llama one: RMSNorm (eps 1e-5), RoPE on q
 * and k from the file's tables (adjacent pairs), grouped-query attention
 * through kref_attn_decode over the page table (8 query heads over 4 KV
 * heads for stories260K), SwiGLU FFN, residuals, final RMSNorm, classifier.
 * One step computes one token. Unlike tinylm, a step takes the token's
 * position and the page-table slot its K/V goes to separately: after a
 * compaction the kept tokens sit in slots 0..k-1 while keeping their
 * original positions (K is stored already rotated), and the sequence goes
 * on at slot k with its true position. The summation order is fixed (no
 * -ffast-math), so the same bytes in the pages give bit-identical logits in
 * every process.
 *
 * A struct stories holds the weights and scratch buffers: one thread at a
 * time per model.
 */
#ifndef KVP_STORIES_H
#define KVP_STORIES_H

#include <stdint.h>

#include "kernels.h"

#define STORIES_BOS 1u

struct stories_config {
	uint32_t dim;
	uint32_t hidden_dim;
	uint32_t n_layers;
	uint32_t n_heads;
	uint32_t n_kv_heads;
	uint32_t vocab;
	uint32_t seq_len;
	uint32_t head_dim; /* dim / n_heads */
	int shared_classifier;
};

/* A page table: page i holds slots [i * block_tokens, (i + 1) *
 * block_tokens) in the layout of shm/layout.h. The caller owns the pages
 * and the array. */
struct stories_kv {
	struct shm_layout layout;
	void **pages;
	uint64_t n_pages;
};

struct stories;

/* Loads the checkpoint at path. Errors: -ENOENT/-EACCES/... from open(2),
 * -EBADMSG a header with impossible sizes or a file whose length is not
 * what the header says, -ENOMEM. */
int stories_load(const char *path, struct stories **ret_model);
/* Accepts NULL. */
void stories_free(struct stories *m);

/* Valid while m lives. */
const struct stories_config *stories_config(const struct stories *m);

/* The KV layout of this model for a dtype, quant_group (0 for unquantized
 * dtypes) and page size. */
void stories_layout(const struct stories *m, uint32_t dtype, uint32_t quant_group,
		    uint32_t block_tokens, struct shm_layout *ret_layout);

/* One step: runs token at position pos, writes its K/V into slot of kv
 * (a writable page must hold it; slots below it must hold the K/V of the
 * tokens this one attends to, already rotated to their own positions),
 * attends over slots [0, slot] and, when logits is not NULL, writes the
 * next-token logits [vocab]. When mass is not NULL, mass[t] for t <= slot
 * gains the attention weight slot t received, summed over layers and
 * query heads (an H2O score). Errors: -EINVAL token >= vocab, pos >=
 * seq_len, a layout that is not this model's, or slot beyond the table. */
int stories_step(struct stories *m, const struct stories_kv *kv, uint64_t slot, uint32_t pos,
		 uint32_t token, float *logits, float *mass);

/* The index of the largest logit (the first on ties). */
uint32_t stories_argmax(const struct stories *m, const float *logits);

/* A token drawn from softmax(logits) (temperature 1) with *rng, a
 * splitmix64 state: the same state gives the same token everywhere. */
uint32_t stories_sample(const struct stories *m, const float *logits, uint64_t *rng);

/* -log p(token) under softmax(logits), in nats (computed in double). */
double stories_nll(const struct stories *m, const float *logits, uint32_t token);

#endif
