/* examples/demo_kv.h — the deterministic conversation of the demo and the
 * K/V its tokens get.
 *
 * kvp-write-conversation writes this K/V, kvp-read-conversation and the
 * integration tests check every byte they read against the same formula,
 * so a page that lands in the wrong slot, a token at the wrong position or
 * a row of the wrong layer or head shows up as a mismatch. The values are
 * finite, normal f16 numbers of magnitude 2^-6..4, like real keys and
 * values; no randomness, no state: every process computes the same bytes.
 * Header only, thread-safe.
 */
#ifndef KVP_DEMO_KV_H
#define KVP_DEMO_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kvpalace.h"

#define DEMO_MODEL_ID	  "tinylm-demo"
#define DEMO_N_LAYERS	  4u
#define DEMO_N_KV_HEADS	  2u
#define DEMO_HEAD_DIM	  64u
#define DEMO_BLOCK_TOKENS 16u

/* Marker tokens that open each turn; other tokens are 100..31999. */
#define DEMO_TOKEN_SYSTEM    1u
#define DEMO_TOKEN_USER	     2u
#define DEMO_TOKEN_ASSISTANT 3u

struct demo_turn {
	const char *role;
	uint32_t marker;
	uint32_t n_tokens;
};

/* The conversation: 1020 tokens in five turns. */
static const struct demo_turn demo_turns[] = {
	{.role = "system", .marker = DEMO_TOKEN_SYSTEM, .n_tokens = 180},
	{.role = "user", .marker = DEMO_TOKEN_USER, .n_tokens = 140},
	{.role = "assistant", .marker = DEMO_TOKEN_ASSISTANT, .n_tokens = 260},
	{.role = "user", .marker = DEMO_TOKEN_USER, .n_tokens = 120},
	{.role = "assistant", .marker = DEMO_TOKEN_ASSISTANT, .n_tokens = 320},
};
#define DEMO_N_TURNS (sizeof(demo_turns) / sizeof(demo_turns[0]))

static inline void demo_layout(struct kvp_layout *l)
{
	l->n_layers = DEMO_N_LAYERS;
	l->n_kv_heads = DEMO_N_KV_HEADS;
	l->head_dim = DEMO_HEAD_DIM;
	l->block_tokens = DEMO_BLOCK_TOKENS;
	l->dtype = KVP_DTYPE_F16;
	l->quant_group = 0;
	l->format = KVP_FORMAT_KV;
}

/* splitmix64's finaliser: a cheap, well-mixed 64-bit hash step. */
static inline uint64_t demo_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Tokens in the whole conversation. */
static inline size_t demo_n_tokens(void)
{
	size_t n = 0;

	for (size_t t = 0; t < DEMO_N_TURNS; t++)
		n += demo_turns[t].n_tokens;
	return n;
}

/* Token id at position pos inside a turn: a marker opens the turn. */
static inline uint32_t demo_token(uint64_t pos, uint32_t index_in_turn, uint32_t marker)
{
	if (index_in_turn == 0)
		return marker;
	return 100u + (uint32_t)(demo_mix(pos ^ 0x746f6b656eull) % 31900u);
}

/* Fills out[0..demo_n_tokens()) with the conversation's token ids. */
static inline void demo_tokens(uint32_t *out)
{
	size_t pos = 0;

	for (size_t t = 0; t < DEMO_N_TURNS; t++)
		for (uint32_t i = 0; i < demo_turns[t].n_tokens; i++, pos++)
			out[pos] = demo_token(pos, i, demo_turns[t].marker);
}

/* The f16 bit pattern of element d of (pos, layer, kv, head). */
static inline uint16_t demo_kv_elem(uint64_t pos, uint32_t layer, uint32_t kv, uint32_t head,
				    uint32_t d)
{
	uint64_t h = demo_mix(pos);

	h = demo_mix(h ^ layer);
	h = demo_mix(h ^ kv);
	h = demo_mix(h ^ head);
	h = demo_mix(h ^ d);
	/* sign, exponent 9..16 (biased), any mantissa: finite and normal. */
	return (uint16_t)((((h >> 15) & 1u) << 15) | ((9u + ((h >> 10) & 7u)) << 10) |
			  (h & 0x3ffu));
}

/* Fills row[0..DEMO_HEAD_DIM) with the elements of (pos, layer, kv, head). */
static inline void demo_kv_row(uint16_t *row, uint64_t pos, uint32_t layer, uint32_t kv,
			       uint32_t head)
{
	for (uint32_t d = 0; d < DEMO_HEAD_DIM; d++)
		row[d] = demo_kv_elem(pos, layer, kv, head, d);
}

#endif
