/* kernels/kernels.h — kvpalace's numeric kernels: a plain C reference
 * (kref_*, kernels/ref/, always built, the truth in tests) and CUDA versions
 * (kcuda_*, kernels/cuda/, built when meson finds nvcc; KVP_HAVE_CUDA is
 * then defined for users of kernels_cuda_dep). Both sides take the same
 * arguments except that CUDA pointers are device pointers (d_ prefix) and
 * CUDA launchers take a stream, enqueue work and return without waiting.
 *
 * Every routine works on pages in the layout of shm/layout.h:
 *   data[layer][k=0|v=1][kv_head][token][head_dim]       element type dtype
 *   scales[layer][k|v][kv_head][token][head_dim/group]    f16 (quantized only)
 * A page table is an array of page base pointers; position p of a sequence
 * lives in page p / block_tokens, token slot p % block_tokens.
 *
 * Quantization groups (decided for kvpalace, see also kernels_num.h):
 * symmetric per-token groups for K and V alike — one f16 scale per
 * quant_group consecutive channels of one token's row, exactly the layout's
 * scales array. KIVI quantizes keys per channel (a scale per channel over a
 * block of tokens) because keys have outlier channels; that would need the
 * whole block of tokens before any of them can be quantized, so a token
 * written at decode time would change the scales (and the bytes) of tokens
 * already committed, which kvpalace shares between processes and hashes
 * into its prefix index as immutable. Per-token groups quantize each token
 * on its own, at append time, with no residual f16 window; outlier key
 * channels are contained by a small group (32 channels is a good default;
 * 16 for int4 keys with strong outliers).
 *
 * Error bounds (asserted element by element by tests/kernels/test_quant.c;
 * s is a group's stored scale, decoded, amax its largest |x|, x̂ the value
 * read back; QMAX is 127 for int8, 7 for int4, 448 for fp8-e4m3):
 *   scale:     s = amax / QMAX rounded *up* to f16 (never below it, at most
 *              one f16 step above: <= 2^-10 amax/QMAX, or 2^-24 when the
 *              scale is subnormal), so no code saturates; clamped to
 *              [2^-24, 65504]; 0 for an all-zero group
 *   int8:      |x - x̂| <= s/2                  (about 0.39 % of amax)
 *   int4:      |x - x̂| <= s/2                  (about 7.2 % of amax)
 *   fp8-e4m3:  |x - x̂| <= 2^-4 |x| + 2^-10 s   (3 mantissa bits)
 * and x̂ is exactly code × s rounded once to the output type (exact in f32;
 * 2^-11 relative in f16, 2^-8 in bf16). Groups whose amax exceeds
 * 65504 × QMAX saturate. Measured RMS error over N(0,1) data, relative to
 * the data's RMS (test_rms_error prints them): group 32 — int8 0.54 %,
 * fp8 2.4 %, int4 9.8 %; group 128 (one scale per row of 128) — int8
 * 0.65 %, fp8 2.6 %, int4 11.8 %. Requantizing quantized data gives the
 * same bytes. Plain f16/bf16/f32 conversions round to nearest even (f32 →
 * f16 overflows to inf as IEEE does; f32 → fp8 saturates at ±448). NaN
 * inputs quantize to code 0 and do not enter amax; infinities saturate.
 *
 * Attention bounds (test_attn.c): kref_attn_decode matches a naive
 * double-precision attention over the same (dequantized) keys and values
 * within 1e-5 max|v| (measured 2.2e-6 for 4096 tokens), weights within
 * 2e-5 of their value + 1e-7 (measured 5.7e-6) and summing to 1 within
 * 1e-5. Attention over quantized pages (group 32) stays within 0.02 max|v|
 * (int8; measured 0.0069), 0.06 (fp8; 0.021) and 0.25 (int4; 0.096) of
 * the same attention over f16 pages, on keys with outlier channels and
 * peaked queries. CUDA results match the reference bit for bit for
 * conversions and gathers (NaN payloads aside), and within 2e-5 max|v| for
 * attention (sums run in another order, with FMA); Q·Kᵀ results are within
 * the worst-case float dot-product bound (dim + 2) 2^-24 |alpha| Σ|q_i k_i|
 * of the exact value, cosines within (2 dim + 8) 2^-24, on both sides.
 *
 * Errors: every function returns 0 or a negative errno: -EINVAL for a
 * layout refused by shm_layout_check, mismatched layouts or out-of-range
 * arguments (nothing is written then); CUDA launchers also return -ENODEV
 * without a usable GPU and -EIO for any other CUDA or cuBLAS error, and
 * never exit. Reference functions are thread-safe (no state); they never
 * allocate except where noted.
 */
#ifndef KVP_KERNELS_H
#define KVP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "layout.h" /* C declarations: inside extern "C" for the .cu files */

/* cudaStream_t is struct CUstream_st *, cublasHandle_t is
 * struct cublasContext *: declared here so C callers need no CUDA header. */
struct CUstream_st;
struct cublasContext;

/* The storage format of a run of rows: dtype (enum shm_dtype) and, for
 * int8/fp8-e4m3/int4, the group size (elements per f16 scale, dividing
 * head_dim); group is 0 for f16/bf16/f32. */
struct kern_fmt {
	uint32_t dtype;
	uint32_t group;
};

/* ---- conversion, quantization, dequantization (ref/convert.c) ---------- */

/* Converts n_rows rows of head_dim elements from src to dst, between any
 * two formats (f16/bf16/f32 ↔ int8/fp8-e4m3/int4, float ↔ float, and
 * requantization): each row is widened to f32 (times its group's scale) and
 * rounded or quantized into the destination, computing fresh scales.
 * src_scales / dst_scales: [n_rows][head_dim / group] f16, NULL for
 * unquantized formats. dst must not overlap src.
 * Errors: -EINVAL unknown dtype, a group that does not fit the format or
 * head_dim (int4 needs an even head_dim), head_dim 0 or above
 * SHM_MAX_HEAD_DIM, a NULL scales pointer for a quantized format. */
int kref_convert_rows(struct kern_fmt dst_fmt, void *dst /* [n_rows][head_dim] */,
		      uint16_t *dst_scales, struct kern_fmt src_fmt,
		      const void *src /* [n_rows][head_dim] */, const uint16_t *src_scales,
		      uint64_t n_rows, uint32_t head_dim);

/* Converts tokens [tok0, tok0 + n_tok) of every (layer, k|v, kv_head) of
 * each of n_pages pages: src_pages[i] (layout sl) → dst_pages[i] (layout
 * dl). The layouts must agree on n_layers, n_kv_heads, head_dim and
 * block_tokens; they may differ in dtype and quant_group. Other tokens of
 * the destination pages are left alone, so a decode step can quantize the
 * one token it just wrote. Errors: -EINVAL bad or mismatched layouts,
 * tok0 + n_tok > block_tokens. */
int kref_convert_pages(const struct shm_layout *dl, void *const *dst_pages /* [n_pages] */,
		       const struct shm_layout *sl, const void *const *src_pages /* [n_pages] */,
		       uint32_t n_pages, uint32_t tok0, uint32_t n_tok);

/* ---- paged attention decode (ref/attn.c) -------------------------------- */

/* Attention of one new token over positions [0, n_tokens) of one layer:
 * for q head h (kv head h / (n_q_heads / n_kv_heads): GQA, and MQA with one
 * kv head), out[h] = Σ_t softmax_t(scale · q[h]·k_t) v_t, with K and V read
 * (and dequantized) from the page table. When weights is not NULL it
 * receives the softmax weights, the attention mass of each cached token
 * (sum over heads for an importance score). Accumulates in f32 with an
 * online softmax (running max): no allocation, any n_tokens.
 * Errors: -EINVAL bad layout, layer out of range, n_tokens 0, n_q_heads 0
 * or not a multiple of n_kv_heads. */
int kref_attn_decode(const struct shm_layout *l, uint32_t layer,
		     const void *const *pages /* [ceil(n_tokens / block_tokens)] */,
		     uint64_t n_tokens, const float *q /* [n_q_heads][head_dim] */,
		     uint32_t n_q_heads, float scale, float *out /* [n_q_heads][head_dim] */,
		     float *weights /* [n_q_heads][n_tokens] or NULL */);

/* ---- gather and compaction (ref/gather.c) ------------------------------- */

/* Compaction: for i < n, copies every layer's K and V (and scales) of
 * source position src_pos[i] (< n_src_tokens) to destination position
 * dst_pos0 + i, bytes unchanged. Positions in both page tables as above;
 * destination pages must not overlap source pages.
 * Errors: -EINVAL bad layout, a source position out of range (checked
 * before anything is written). */
int kref_gather_tokens(const struct shm_layout *l, void *const *dst_pages, uint64_t dst_pos0,
		       const void *const *src_pages, uint64_t n_src_tokens,
		       const uint32_t *src_pos /* [n] */, uint64_t n);

/* Reads the rows of (layer, kv, kv_head) for positions [pos0, pos0 + n)
 * from a page table into a dense f32 matrix (dequantized): the K (or V)
 * of one head ready for kref_score_qk. Errors: -EINVAL bad layout or an
 * index out of range. */
int kref_gather_rows_f32(const struct shm_layout *l, const void *const *pages, uint32_t layer,
			 uint32_t kv, uint32_t kv_head, uint64_t pos0, uint64_t n,
			 float *dst /* [n][head_dim] */);

/* ---- scores (ref/score.c) ------------------------------------------------ */

/* Batched Q·Kᵀ: scores[b][i][j] = alpha Σ_d q[b][i][d] k[b][j][d] for
 * b < batch, i < n_q, j < n_k (all row-major, contiguous). f32
 * accumulation in index order. Errors: -EINVAL a zero dimension. */
int kref_score_qk(const float *q /* [batch][n_q][dim] */, const float *k /* [batch][n_k][dim] */,
		  float *scores /* [batch][n_q][n_k] */, uint32_t batch, uint32_t n_q, uint32_t n_k,
		  uint32_t dim, float alpha);

/* Cosine similarity of span embeddings (topic selection):
 * sim[i][j] = a_i·b_j / (|a_i| |b_j|), 0 when either vector is zero.
 * Errors: -EINVAL a zero dimension. */
int kref_score_cosine(const float *a /* [n_a][dim] */, uint32_t n_a,
		      const float *b /* [n_b][dim] */, uint32_t n_b, uint32_t dim,
		      float *sim /* [n_a][n_b] */);

/* ---- engine cache layouts (ref/adapt.c) ---------------------------------- */

/* An inference engine's paged KV cache, per layer a K and a V tensor
 * addressed with element strides (head_dim elements contiguous): element
 * c of (block b, token t, head h) of layer L's K is at byte
 *   k_layers[L] + ((b * block_stride + t * token_stride + h * head_stride)
 *                  + c) * elem_bytes
 * and of its V at the same offset from v_layers[L], or from k_layers[L] +
 * v_offset elements when v_layers is NULL (K and V in one tensor: vLLM's
 * FlashAttention [2, num_blocks, block_size, H, D], FlashInfer's
 * [num_blocks, 2, ...]). The arrays belong to the caller: host arrays of
 * host pointers for kref_adapt, device arrays of device pointers for
 * kcuda_adapt. client/kvpalace.h's struct kvp_engine_cache is the same
 * description for engines; its constructor fills the strides of the
 * engines' named layouts. */
struct kern_engine {
	void *const *k_layers; /* [n_layers] */
	void *const *v_layers; /* [n_layers] or NULL */
	uint64_t v_offset;     /* elements, when v_layers is NULL */
	uint64_t block_stride; /* elements */
	uint64_t token_stride; /* elements */
	uint64_t head_stride;  /* elements */
	uint32_t n_layers;
	uint32_t num_blocks;
	uint32_t block_size; /* tokens per block: the layout's block_tokens */
	uint32_t n_heads;
	uint32_t head_dim;
	uint32_t elem_bytes; /* 1, 2 or 4: the layout's element size */
};

/* Which layers and heads a copy moves: page layer layer_first + i and head
 * head_first + j <-> engine layer engine_layer_first + i, head
 * engine_head_first + j, for i < n_layers, j < n_heads (a tensor-parallel
 * rank's engine holds a range of the heads a page holds, a pipeline
 * stage a range of its layers). */
struct kern_adapt_range {
	uint32_t layer_first, n_layers;
	uint32_t head_first, n_heads;
	uint32_t engine_layer_first, engine_head_first;
};

enum kern_adapt_dir {
	KERN_ADAPT_TO_ENGINE = 0, /* pages -> engine blocks */
	KERN_ADAPT_TO_PAGES = 1,  /* engine blocks -> pages */
};

/* What kref_adapt and kcuda_adapt check before touching memory, and the
 * range a copy runs over: 0 and *ret_range (r, or every layer and head
 * when r is NULL) when the geometry is consistent. Reads no pointer
 * array. Errors: -EINVAL a layout refused by shm_layout_check, an engine
 * with a zero dimension, elem_bytes or head_dim or block_size that differ
 * from the layout's, strides under which two rows of one tensor overlap,
 * last_page_tokens 0 or above block_tokens (with n_pages > 0), a zero
 * count in r, no range with layouts of different layer or head counts;
 * -EOPNOTSUPP a quantized layout; -ERANGE a range past the layout's or
 * the engine's layers or heads, or an engine tensor whose extent
 * (including v_offset) overflows 63 bits of bytes. */
int kref_adapt_plan(const struct shm_layout *l, size_t n_pages, uint32_t last_page_tokens,
		    const struct kern_engine *e, const struct kern_adapt_range *r,
		    struct kern_adapt_range *ret_range);

/* Copies, for i < n_pages, the rows of kvpalace page pages[i] (layout l)
 * to engine block block_ids[i] (dir KERN_ADAPT_TO_ENGINE) or back
 * (KERN_ADAPT_TO_PAGES): tokens [0, block_size) of every page but the
 * last, [0, last_page_tokens) of the last, layers and heads of r (NULL:
 * all). Bytes unchanged; nothing else of either side is written.
 * Errors: those of kref_adapt_plan; -EINVAL pages, block_ids or a page
 * base NULL (n_pages > 0), a NULL layer base, dir unknown; -ERANGE a
 * block id < 0 or >= num_blocks, a layer base whose tensor wraps the
 * address space.
 * Everything is checked before anything is written. */
int kref_adapt(const struct shm_layout *l, void *const *pages /* [n_pages] */, size_t n_pages,
	       uint32_t last_page_tokens, const struct kern_engine *e,
	       const int32_t *block_ids /* [n_pages] */, const struct kern_adapt_range *r,
	       uint32_t dir);

/* ---- CUDA (kernels/cuda/, only with KVP_HAVE_CUDA) --------------------- */

/* Number of usable CUDA devices (>= 1), or -ENODEV when the runtime reports
 * any error (no driver: cudaErrorInsufficientDriver, no device, ...). */
int kcuda_device_count(void);

/* A cuBLAS handle for kcuda_score_qk. -ENODEV without a GPU, -EIO when
 * cuBLAS fails. kcuda_blas_destroy accepts NULL. */
int kcuda_blas_create(struct cublasContext **ret_blas);
void kcuda_blas_destroy(struct cublasContext *blas);

/* As kref_convert_pages; the page tables themselves live in device memory
 * (arrays of n_pages device pointers). Bit-identical to the reference. */
int kcuda_convert_pages(const struct shm_layout *dl, void *const *d_dst_pages,
			const struct shm_layout *sl, const void *const *d_src_pages,
			uint32_t n_pages, uint32_t tok0, uint32_t n_tok,
			struct CUstream_st *stream);

/* Device workspace kcuda_attn_decode needs for these sizes. */
size_t kcuda_attn_workspace_bytes(const struct shm_layout *l, uint32_t n_q_heads,
				  uint64_t n_tokens);

/* As kref_attn_decode, split over chunks of tokens (flash-decoding) and
 * combined; d_pages is a device array of device page pointers, the
 * workspace holds at least kcuda_attn_workspace_bytes(). Errors as the
 * reference, and -ENOSPC when the workspace is too small. */
int kcuda_attn_decode(const struct shm_layout *l, uint32_t layer, const void *const *d_pages,
		      uint64_t n_tokens, const float *d_q, uint32_t n_q_heads, float scale,
		      float *d_out, float *d_weights, void *d_workspace, size_t workspace_bytes,
		      struct CUstream_st *stream);

/* As kref_gather_tokens; d_src_pos in device memory. The positions are
 * not read on the host: a token whose source position is out of range is
 * skipped on the device (its destination rows are left alone) where the
 * reference refuses the whole call, so check untrusted positions first. */
int kcuda_gather_tokens(const struct shm_layout *l, void *const *d_dst_pages, uint64_t dst_pos0,
			const void *const *d_src_pages, uint64_t n_src_tokens,
			const uint32_t *d_src_pos, uint64_t n, struct CUstream_st *stream);

/* As kref_gather_rows_f32. */
int kcuda_gather_rows_f32(const struct shm_layout *l, const void *const *d_pages, uint32_t layer,
			  uint32_t kv, uint32_t kv_head, uint64_t pos0, uint64_t n, float *d_dst,
			  struct CUstream_st *stream);

/* As kref_score_qk, through cublasSgemmStridedBatched (FP32 math, no TF32)
 * on stream (set on the handle). */
int kcuda_score_qk(struct cublasContext *blas, const float *d_q, const float *d_k, float *d_scores,
		   uint32_t batch, uint32_t n_q, uint32_t n_k, uint32_t dim, float alpha,
		   struct CUstream_st *stream);

/* As kref_score_cosine. */
int kcuda_score_cosine(const float *d_a, uint32_t n_a, const float *d_b, uint32_t n_b, uint32_t dim,
		       float *d_sim, struct CUstream_st *stream);

/* As kref_adapt, one launch for the whole list: d_pages and d_block_ids
 * are device arrays, e's k_layers/v_layers device arrays of device
 * pointers (kvpalace GPU-tier pages, engine tensors, or pinned host
 * memory mapped for the device). The arrays are not read on the host:
 * a page whose block id is out of range or whose base is NULL, and a
 * layer whose base is NULL, are skipped on the device where the
 * reference refuses the call, so check untrusted ids first. Rows move
 * in 16-byte vectors where both sides are 16-byte aligned (else 4, else
 * 1). Errors: those of kref_adapt_plan; -EINVAL d_pages, d_block_ids or
 * e->k_layers NULL (n_pages > 0), dir unknown; -ERANGE more runs than 64
 * bits count; -ENODEV no usable GPU; -EIO any other CUDA error. */
int kcuda_adapt(const struct shm_layout *l, void *const *d_pages /* [n_pages] */, size_t n_pages,
		uint32_t last_page_tokens, const struct kern_engine *e,
		const int32_t *d_block_ids /* [n_pages] */, const struct kern_adapt_range *r,
		uint32_t dir, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
