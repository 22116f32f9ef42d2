/* client/api/models.c — the KV layouts of common open models by name
 * (kvp_layout_named, kvp_layout_name): the numbers an engine would
 * otherwise copy from a model's config.json by hand, where one wrong
 * head count gives a pool no other engine of that model shares.
 *
 * Each row is from the model's published Hugging Face config.json:
 * n_layers = num_hidden_layers, n_kv_heads = num_key_value_heads
 * (num_attention_heads where the config has none: no GQA), head_dim =
 * head_dim where the config gives it, else hidden_size /
 * num_attention_heads. The comment on each row gives those fields.
 * Fine-tunes and instruct variants share their base model's KV shape.
 * MLA models (DeepSeek-V2/V3) cache one latent vector per token and layer:
 * their rows give n_kv_heads 1 and head_dim = kv_lora_rank +
 * qk_rope_head_dim, and the latent format (KVP_FORMAT_LATENT).
 *
 * Layer: api (client/README.md); calls nothing.
 */
#include <errno.h>
#include <stddef.h>
#include <strings.h>

#include "kvpalace.h"

struct named_layout {
	const char *name;  /* the name kvp_layout_named takes (any case) */
	const char *hf_id; /* the Hugging Face repository it comes from */
	uint32_t n_layers, n_kv_heads, head_dim;
	uint32_t format; /* enum kvp_format */
};

static const struct named_layout models[] = {
	/* layers 32, heads 32, kv heads 32 (none given), hidden 4096 */
	{"llama-2-7b", "meta-llama/Llama-2-7b-hf", 32, 32, 128},
	/* layers 40, heads 40, kv heads 40, hidden 5120 */
	{"llama-2-13b", "meta-llama/Llama-2-13b-hf", 40, 40, 128},
	/* layers 80, heads 64, kv heads 8, hidden 8192 */
	{"llama-2-70b", "meta-llama/Llama-2-70b-hf", 80, 8, 128},
	/* layers 32, heads 32, kv heads 8, hidden 4096 */
	{"llama-3-8b", "meta-llama/Meta-Llama-3-8B", 32, 8, 128},
	/* layers 80, heads 64, kv heads 8, hidden 8192 */
	{"llama-3-70b", "meta-llama/Meta-Llama-3-70B", 80, 8, 128},
	/* the 3.1 models keep the 3.0 shapes: */
	{"llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 8, 128},
	{"llama-3.1-70b", "meta-llama/Llama-3.1-70B", 80, 8, 128},
	/* layers 126, heads 128, kv heads 8, hidden 16384 */
	{"llama-3.1-405b", "meta-llama/Llama-3.1-405B", 126, 8, 128},
	/* layers 16, heads 32, kv heads 8, hidden 2048, head_dim 64 */
	{"llama-3.2-1b", "meta-llama/Llama-3.2-1B", 16, 8, 64},
	/* layers 28, heads 24, kv heads 8, hidden 3072, head_dim 128 */
	{"llama-3.2-3b", "meta-llama/Llama-3.2-3B", 28, 8, 128},
	/* layers 32, heads 32, kv heads 8, hidden 4096 */
	{"mistral-7b", "mistralai/Mistral-7B-v0.1", 32, 8, 128},
	/* layers 32, heads 32, kv heads 8, hidden 4096 (the experts share
	 * attention: KV as Mistral-7B's) */
	{"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 32, 8, 128},
	/* layers 24, heads 14, kv heads 2, hidden 896 */
	{"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 24, 2, 64},
	/* layers 28, heads 28, kv heads 4, hidden 3584 */
	{"qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 4, 128},
	/* layers 80, heads 64, kv heads 8, hidden 8192 */
	{"qwen2.5-72b", "Qwen/Qwen2.5-72B", 80, 8, 128},
	/* layers 42, heads 16, kv heads 8, head_dim 256 (given; hidden 3584) */
	{"gemma-2-9b", "google/gemma-2-9b", 42, 8, 256},
	/* layers 32, heads 32, kv heads 32, hidden 3072 */
	{"phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", 32, 32, 96},
	/* The TinyStories model of llama2.c's tinyllamas (its header: dim 64,
	 * 5 layers, 8 heads, 4 kv heads): the trained model the tests use. */
	{"stories260k", "karpathy/tinyllamas stories260K", 5, 4, 8},
	/* MLA: layers 27, kv_lora_rank 512, qk_rope_head_dim 64 */
	{"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, 1, 576, KVP_FORMAT_LATENT},
	/* MLA: layers 61, kv_lora_rank 512, qk_rope_head_dim 64 */
	{"deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, 1, 576, KVP_FORMAT_LATENT},
};

#define N_MODELS (sizeof(models) / sizeof(models[0]))

KVP_PUBLIC int kvp_layout_named(const char *name, uint32_t dtype, uint32_t block_tokens,
				struct kvp_layout *out)
{
	size_t i;

	if (!name || !out)
		return -EINVAL;
	for (i = 0; i < N_MODELS; i++) {
		if (strcasecmp(name, models[i].name) && strcasecmp(name, models[i].hf_id))
			continue;
		out->n_layers = models[i].n_layers;
		out->n_kv_heads = models[i].n_kv_heads;
		out->head_dim = models[i].head_dim;
		out->block_tokens = block_tokens;
		out->dtype = dtype;
		out->format = models[i].format;
		/* 32 channels a scale: kernels.h's default for int8/fp8/int4
		 * (every head_dim above is a multiple of 8; 8 for the tiny one). */
		out->quant_group = 0;
		if (dtype == KVP_DTYPE_INT8 || dtype == KVP_DTYPE_FP8_E4M3 ||
		    dtype == KVP_DTYPE_INT4)
			out->quant_group = models[i].head_dim % 32 ? models[i].head_dim : 32;
		return 0;
	}
	return -ENOENT;
}

KVP_PUBLIC const char *kvp_layout_name(size_t i, const char **ret_hf_id)
{
	if (i >= N_MODELS)
		return NULL;
	if (ret_hf_id)
		*ret_hf_id = models[i].hf_id;
	return models[i].name;
}
