/* shm/layout.h — the page layout ABI shared by daemon, client library,
 * kernels and checkpoint files.
 *
 * A page holds block_tokens tokens of every layer. In the KV format (format
 * 0) it holds K and V per KV head:
 *
 *   data[layer][k=0|v=1][kv_head][token][head_dim]      element type `dtype`
 *   scales[layer][k|v][kv_head][token][head_dim/group]  f16, quantized types only
 *
 * In the latent format (MLA: one vector per token and layer, no K and V)
 * it holds one plane per layer, n_kv_heads being 1:
 *
 *   data[layer][token][head_dim]
 *   scales[layer][token][head_dim/group]                f16, quantized types only
 *
 * Both are data[layer][plane][kv_head][token][head_dim] with 2 planes or 1
 * (shm_layout_planes). The engine-owned fp8 types (e4m3-raw, e5m2-raw)
 * are one byte per element whose scale the engine keeps per layer and
 * plane: their pages hold, after the data, scales[layer][plane] as
 * little-endian f32 (shm_raw_scale_offset), written by the client like the
 * data. kvpalace never converts those bytes.
 *
 * The whole is padded to a multiple of SHM_PAGE_ALIGN (4096) bytes so
 * O_DIRECT can move it. int4 packs two elements per byte, the lower index in
 * the low nibble. Pure arithmetic: no allocation, no logging, thread-safe.
 */
#ifndef KVP_SHM_LAYOUT_H
#define KVP_SHM_LAYOUT_H

#include <stdint.h>

#define SHM_PAGE_ALIGN 4096u

/* Limits on a layout; client-supplied layouts outside them are refused. */
#define SHM_MAX_LAYERS	     1024u
#define SHM_MAX_KV_HEADS     1024u
#define SHM_MAX_HEAD_DIM     1024u
#define SHM_MAX_BLOCK_TOKENS 4096u
#define SHM_MAX_PAGE_BYTES   (256ull << 20)

/* Element types; the values equal the protocol's DType enum. */
enum shm_dtype {
	SHM_DTYPE_F16 = 1,
	SHM_DTYPE_BF16 = 2,
	SHM_DTYPE_F32 = 3,
	SHM_DTYPE_INT8 = 4,
	SHM_DTYPE_FP8_E4M3 = 5,
	SHM_DTYPE_INT4 = 6,
	SHM_DTYPE_E4M3_RAW = 7, /* engine's fp8: 1 byte, f32 scale per layer and plane */
	SHM_DTYPE_E5M2_RAW = 8,
};

/* Page formats; the values equal the protocol's Layout.format. */
enum shm_format {
	SHM_FORMAT_KV = 0,     /* K and V per KV head */
	SHM_FORMAT_LATENT = 1, /* one plane per layer (MLA latents), n_kv_heads 1 */
};

struct shm_layout {
	uint32_t n_layers;
	uint32_t n_kv_heads; /* KV heads (GQA/MQA), not query heads */
	uint32_t head_dim;
	uint32_t block_tokens; /* tokens per page */
	uint32_t dtype;	       /* enum shm_dtype */
	uint32_t quant_group;  /* elements per scale; 0 for f16/bf16/f32 and raw fp8 */
	uint32_t format;       /* enum shm_format */
};
_Static_assert(sizeof(struct shm_layout) == 28, "shm_layout is part of the ABI");

/* Bits per element of dtype, 0 for an unknown dtype. */
uint32_t shm_dtype_bits(uint32_t dtype);
/* True for int8, fp8-e4m3 and int4, which carry per-group f16 scales. */
int shm_dtype_quantized(uint32_t dtype);
/* True for e4m3-raw and e5m2-raw: engine-scaled fp8, never converted. */
int shm_dtype_raw(uint32_t dtype);
/* Name such as "f16", or "?" for an unknown dtype. */
const char *shm_dtype_name(uint32_t dtype);
/* "kv", "latent", or "?" for an unknown format. */
const char *shm_format_name(uint32_t format);
/* Planes per layer: 2 (K and V) in the KV format, 1 in the latent format. */
uint32_t shm_layout_planes(const struct shm_layout *l);
/* True when the numeric kernels (conversion, attention, gather) handle
 * pages of l: the KV format and a dtype that is not raw fp8. Every other
 * layout is only ever copied bytewise. */
int shm_layout_numeric(const struct shm_layout *l);

/* Returns 0 when the layout is usable, else -EINVAL: a zero or over-limit
 * dimension, an unknown dtype, a quantized dtype whose quant_group does not
 * divide head_dim (or a non-zero quant_group for unquantized and raw types),
 * an odd head_dim for int4, an unknown format, a latent layout whose
 * n_kv_heads is not 1, or a page over SHM_MAX_PAGE_BYTES. Every other function
 * here assumes a checked layout. */
int shm_layout_check(const struct shm_layout *l);
/* Why shm_layout_check refuses l, as a static English sentence, or NULL
 * when it accepts it. */
const char *shm_layout_why(const struct shm_layout *l);

/* The layout pages of l take when stored quantized as dtype (int8, fp8,
 * int4: mixed precision on disk): per-token groups of 32 channels, or of
 * the whole head when 32 does not divide head_dim. Returns 0, or -EINVAL
 * when l is already quantized, raw fp8 (its bytes are the engine's, under
 * the engine's scales: never converted), latent (the numeric kernels
 * address K/V pages only, shm_layout_numeric; latent pages keep their
 * dtype on disk and in checkpoints), dtype is not a quantized type, the result
 * is not a valid layout, or its pages would not be smaller. */
int shm_layout_quantized(const struct shm_layout *l, uint32_t dtype, struct shm_layout *ret);

/* Bytes of the data part, of the scales part (f16 group scales of the
 * quantized types, f32 per-plane scales of the raw types, else 0), and of
 * the padded page. */
uint64_t shm_page_data_bytes(const struct shm_layout *l);
uint64_t shm_page_scale_bytes(const struct shm_layout *l);
uint64_t shm_page_bytes(const struct shm_layout *l);

/* Byte offset, inside a page, of element 0 of (layer, kv, head, token):
 * head_dim consecutive elements follow. kv is 0 for K, 1 for V; always 0
 * (the plane) in the latent format. */
uint64_t shm_kv_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
		       uint32_t token);
/* Bytes of one token's head_dim elements (a row addressed by shm_kv_offset). */
uint64_t shm_row_bytes(const struct shm_layout *l);
/* Byte offset of the first f16 scale of (layer, kv, head, token); quantized
 * dtypes only. head_dim / quant_group scales follow. */
uint64_t shm_scale_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
			  uint32_t token);
/* Byte offset of the f32 scale of (layer, kv) of a raw fp8 layout: the
 * data's end + (layer * planes + kv) * 4. Raw dtypes only. */
uint64_t shm_raw_scale_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv);

#endif
