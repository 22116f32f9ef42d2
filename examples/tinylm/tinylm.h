/* examples/tinylm/tinylm.h — a tiny decoder-only transformer whose KV cache
 * lives in kvpalace pages.
 *
 * Llama-shaped: byte-level tokens (vocabulary 256), RMSNorm, grouped-query
 * attention with rotary position embeddings, a SwiGLU feed-forward block,
 * tied input/output embeddings. The weights are pseudo-random from a seed,
 * so every process builds the same model without a weight file (the text it
 * writes is gibberish; the numbers are what matter). Each step computes one
 * token: it writes the token's K and V into the page table (in the pages'
 * dtype, quantized when they are), then attends over every cached position
 * through kref_attn_decode, reading K and V back from the pages. A process
 * that restores positions from kvpalace and one that recomputes them run
 * the same code on the same bytes, so their logits are bit-identical.
 *
 * A struct tinylm holds the weights and scratch buffers: one thread at a
 * time per model.
 */
#ifndef KVP_TINYLM_H
#define KVP_TINYLM_H

#include <stdint.h>

#include "kernels.h"

#define TINYLM_VOCAB 256u

struct tinylm_config {
	uint32_t n_layers;
	uint32_t d_model;
	uint32_t n_heads;    /* query heads */
	uint32_t n_kv_heads; /* divides n_heads */
	uint32_t head_dim;   /* even (RoPE rotates pairs) */
	uint32_t d_ff;
	float rope_base;
	uint64_t seed;
};

/* The default model: 4 layers, d_model 128, 4 query heads sharing 2 KV
 * heads of 32 dimensions, feed-forward 256, RoPE base 10000. */
void tinylm_default_config(struct tinylm_config *cfg, uint64_t seed);

/* A page table: page i holds positions [i * block_tokens, (i + 1) *
 * block_tokens) in the layout of shm/layout.h. The caller owns the pages
 * and the array. */
struct tinylm_kv {
	struct shm_layout layout;
	void **pages;
	uint64_t n_pages;
};

struct tinylm;

/* Builds the model's weights from cfg. Errors: -EINVAL a bad config
 * (zero or inconsistent sizes), -ENOMEM. */
int tinylm_new(const struct tinylm_config *cfg, struct tinylm **ret_model);
/* Accepts NULL. */
void tinylm_free(struct tinylm *m);

/* The KV layout of this model for a dtype, quant_group (0 for unquantized
 * dtypes) and page size. */
void tinylm_layout(const struct tinylm *m, uint32_t dtype, uint32_t quant_group,
		   uint32_t block_tokens, struct shm_layout *ret_layout);

/* One step: runs token at position pos, writing its K/V into kv (position
 * pos must lie in a writable page of the table; positions below it must
 * hold this sequence's K/V), and, when logits is not NULL, the next-token
 * logits [TINYLM_VOCAB]. Errors: -EINVAL token >= 256, a layout that is
 * not this model's, or pos beyond the page table. */
int tinylm_step(struct tinylm *m, const struct tinylm_kv *kv, uint64_t pos, uint32_t token,
		float *logits);

/* The index of the largest logit (the first on ties). */
uint32_t tinylm_argmax(const float *logits);

/* FNV-1a 64 over the bytes of the logits: a short fingerprint to print. */
uint64_t tinylm_logits_hash(const float *logits);

#endif
