/* shm/layout.h — the page layout ABI shared by daemon, client library,
 * kernels and checkpoint files.
 *
 * A page holds block_tokens tokens of K and V for every layer:
 *
 *   data[layer][k=0|v=1][kv_head][token][head_dim]      element type `dtype`
 *   scales[layer][k|v][kv_head][token][head_dim/group]  f16, quantized types only
 *
 * and the whole is padded to a multiple of SHM_PAGE_ALIGN (4096) bytes so
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
};

struct shm_layout {
	uint32_t n_layers;
	uint32_t n_kv_heads; /* KV heads (GQA/MQA), not query heads */
	uint32_t head_dim;
	uint32_t block_tokens; /* tokens per page */
	uint32_t dtype;	       /* enum shm_dtype */
	uint32_t quant_group;  /* elements per scale; 0 for f16/bf16/f32 */
};
_Static_assert(sizeof(struct shm_layout) == 24, "shm_layout is part of the ABI");

/* Bits per element of dtype, 0 for an unknown dtype. */
uint32_t shm_dtype_bits(uint32_t dtype);
/* True for int8, fp8-e4m3 and int4, which carry per-group f16 scales. */
int shm_dtype_quantized(uint32_t dtype);
/* Name such as "f16", or "?" for an unknown dtype. */
const char *shm_dtype_name(uint32_t dtype);

/* Returns 0 when the layout is usable, else -EINVAL: a zero or over-limit
 * dimension, an unknown dtype, a quantized dtype whose quant_group does not
 * divide head_dim (or a non-zero quant_group for unquantized types), an odd
 * head_dim for int4, or a page over SHM_MAX_PAGE_BYTES. Every other function
 * here assumes a checked layout. */
int shm_layout_check(const struct shm_layout *l);

/* The layout pages of l take when stored quantized as dtype (int8, fp8,
 * int4: mixed precision on disk): per-token groups of 32 channels, or of
 * the whole head when 32 does not divide head_dim. Returns 0, or -EINVAL
 * when l is already quantized, dtype is not a quantized type, the result
 * is not a valid layout, or its pages would not be smaller. */
int shm_layout_quantized(const struct shm_layout *l, uint32_t dtype, struct shm_layout *ret);

/* Bytes of the data part, of the scales part, and of the padded page. */
uint64_t shm_page_data_bytes(const struct shm_layout *l);
uint64_t shm_page_scale_bytes(const struct shm_layout *l);
uint64_t shm_page_bytes(const struct shm_layout *l);

/* Byte offset, inside a page, of element 0 of (layer, kv, head, token):
 * head_dim consecutive elements follow. kv is 0 for K, 1 for V. */
uint64_t shm_kv_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
		       uint32_t token);
/* Bytes of one token's head_dim elements (a row addressed by shm_kv_offset). */
uint64_t shm_row_bytes(const struct shm_layout *l);
/* Byte offset of the first f16 scale of (layer, kv, head, token); quantized
 * dtypes only. head_dim / quant_group scales follow. */
uint64_t shm_scale_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
			  uint32_t token);

#endif
