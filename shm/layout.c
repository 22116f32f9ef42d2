/* shm/layout.c — page layout arithmetic (see layout.h). */
#include <errno.h>
#include <stddef.h>

#include "layout.h"

uint32_t shm_dtype_bits(uint32_t dtype)
{
	switch (dtype) {
	case SHM_DTYPE_F16:
	case SHM_DTYPE_BF16:
		return 16;
	case SHM_DTYPE_F32:
		return 32;
	case SHM_DTYPE_INT8:
	case SHM_DTYPE_FP8_E4M3:
	case SHM_DTYPE_E4M3_RAW:
	case SHM_DTYPE_E5M2_RAW:
		return 8;
	case SHM_DTYPE_INT4:
		return 4;
	default:
		return 0;
	}
}

int shm_dtype_quantized(uint32_t dtype)
{
	return dtype == SHM_DTYPE_INT8 || dtype == SHM_DTYPE_FP8_E4M3 || dtype == SHM_DTYPE_INT4;
}

int shm_dtype_raw(uint32_t dtype)
{
	return dtype == SHM_DTYPE_E4M3_RAW || dtype == SHM_DTYPE_E5M2_RAW;
}

const char *shm_dtype_name(uint32_t dtype)
{
	static const char *const names[] = {"?",	"f16",	"bf16",	    "f32",     "int8",
					    "fp8-e4m3", "int4", "e4m3-raw", "e5m2-raw"};

	return dtype < sizeof(names) / sizeof(names[0]) ? names[dtype] : "?";
}

const char *shm_format_name(uint32_t format)
{
	return format == SHM_FORMAT_KV ? "kv" : format == SHM_FORMAT_LATENT ? "latent" : "?";
}

uint32_t shm_layout_planes(const struct shm_layout *l)
{
	return l->format == SHM_FORMAT_LATENT ? 1 : 2;
}

int shm_layout_numeric(const struct shm_layout *l)
{
	return l->format == SHM_FORMAT_KV && !shm_dtype_raw(l->dtype);
}

static uint64_t elems(const struct shm_layout *l)
{
	return (uint64_t)l->n_layers * shm_layout_planes(l) * l->n_kv_heads * l->block_tokens *
	       l->head_dim;
}

uint64_t shm_page_data_bytes(const struct shm_layout *l)
{
	return elems(l) * shm_dtype_bits(l->dtype) / 8;
}

uint64_t shm_page_scale_bytes(const struct shm_layout *l)
{
	if (shm_dtype_raw(l->dtype))
		return (uint64_t)l->n_layers * shm_layout_planes(l) * 4;
	if (!shm_dtype_quantized(l->dtype))
		return 0;
	return elems(l) / l->quant_group * 2;
}

uint64_t shm_page_bytes(const struct shm_layout *l)
{
	uint64_t n = shm_page_data_bytes(l) + shm_page_scale_bytes(l);

	return (n + SHM_PAGE_ALIGN - 1) / SHM_PAGE_ALIGN * SHM_PAGE_ALIGN;
}

int shm_layout_quantized(const struct shm_layout *l, uint32_t dtype, struct shm_layout *ret)
{
	struct shm_layout q = *l;

	if (!shm_layout_numeric(l) || shm_dtype_quantized(l->dtype) || !shm_dtype_quantized(dtype))
		return -EINVAL;
	q.dtype = dtype;
	q.quant_group = q.head_dim % 32 == 0 ? 32 : q.head_dim;
	if (shm_layout_check(&q) < 0 || shm_page_bytes(&q) >= shm_page_bytes(l))
		return -EINVAL;
	*ret = q;
	return 0;
}

const char *shm_layout_why(const struct shm_layout *l)
{
	if (!l->n_layers || l->n_layers > SHM_MAX_LAYERS)
		return "n_layers must be 1..1024";
	if (!l->n_kv_heads || l->n_kv_heads > SHM_MAX_KV_HEADS)
		return "n_kv_heads must be 1..1024";
	if (!l->head_dim || l->head_dim > SHM_MAX_HEAD_DIM)
		return "head_dim must be 1..1024";
	if (!l->block_tokens || l->block_tokens > SHM_MAX_BLOCK_TOKENS)
		return "block_tokens must be 1..4096";
	if (!shm_dtype_bits(l->dtype))
		return "unknown dtype";
	if (shm_dtype_quantized(l->dtype)) {
		if (!l->quant_group || l->head_dim % l->quant_group)
			return "a quantized dtype needs a quant_group that divides head_dim";
	} else if (l->quant_group) {
		return shm_dtype_raw(l->dtype)
			       ? "a raw fp8 dtype (scaled by the engine) takes no quant_group"
			       : "quant_group is for the quantized dtypes only";
	}
	if (l->dtype == SHM_DTYPE_INT4 && l->head_dim % 2)
		return "int4 needs an even head_dim";
	if (l->format != SHM_FORMAT_KV && l->format != SHM_FORMAT_LATENT)
		return "unknown page format";
	if (l->format == SHM_FORMAT_LATENT && l->n_kv_heads != 1)
		return "a latent layout has n_kv_heads 1 (head_dim is the latent width)";
	/* Limits above keep elems() below 2^53, so this cannot overflow. */
	if (shm_page_bytes(l) > SHM_MAX_PAGE_BYTES)
		return "pages of this layout are over 256 MiB";
	return NULL;
}

int shm_layout_check(const struct shm_layout *l)
{
	return shm_layout_why(l) ? -EINVAL : 0;
}

static uint64_t row_index(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
			  uint32_t token)
{
	return (((uint64_t)layer * shm_layout_planes(l) + kv) * l->n_kv_heads + head) *
		       l->block_tokens +
	       token;
}

uint64_t shm_row_bytes(const struct shm_layout *l)
{
	return (uint64_t)l->head_dim * shm_dtype_bits(l->dtype) / 8;
}

uint64_t shm_kv_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
		       uint32_t token)
{
	return row_index(l, layer, kv, head, token) * shm_row_bytes(l);
}

uint64_t shm_scale_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv, uint32_t head,
			  uint32_t token)
{
	return shm_page_data_bytes(l) +
	       row_index(l, layer, kv, head, token) * (l->head_dim / l->quant_group) * 2;
}

uint64_t shm_raw_scale_offset(const struct shm_layout *l, uint32_t layer, uint32_t kv)
{
	return shm_page_data_bytes(l) + ((uint64_t)layer * shm_layout_planes(l) + kv) * 4;
}
