/*
 * Sparse-MLA decode: plain C ABI.
 *
 * Attention of each decode token over its own top-k selected slots of a paged
 * latent cache with one shared KV head (MQA), as in vLLM v0.25.1's sparse-MLA
 * backends (vllm/v1/attention/backends/mla/flashmla_sparse.py and
 * vllm/models/deepseek_v4/nvidia/flashmla.py). For token t and head h:
 *
 *   s_j   = softmax_scale * dot(q[t, h, :], K[j, :])      for every valid j
 *   out   = sum_j exp(s_j) V[j, :] / (sum_j exp(s_j) + exp(attn_sink[h]))
 *   lse   = log(sum_j exp(s_j))                           (natural log, sink excluded)
 *
 * where j runs over the valid entries of the token's index row(s) and K / V are
 * the dequantised cache rows (K = the whole q-wide row, V = its first 512
 * values). The attn_sink term is present only when attn_sink is not NULL.
 * With a second cache (DeepSeek V4: the sliding-window cache next to the
 * compressed cache) both index sets enter the same softmax.
 *
 * Valid entries. Entry i of token t's row in cache c is valid when
 *   i < topk_length[t] (when topk_length is given), and
 *   0 <= index < num_pages * page_size.
 * Every other entry (-1 in particular, and out-of-range indices, which are
 * never dereferenced) is skipped.
 *
 * Empty rows. A token with no valid entry in any cache gets out = 0 and
 * lse = SPARKSEAL_SPARSE_MLA_EMPTY_LSE, a finite stand-in for log(0) = -inf:
 * exp(EMPTY_LSE - x) is 0 in float32 for every x above -1e29, so merging such
 * a row with other partial results gives it weight 0 without producing NaN.
 *
 * Cache records (byte order as written by vLLM v0.25.1; slot = page * page_size
 * + offset, page base = data + page * page_stride_bytes):
 *
 *   SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8 (DeepSeek V4, q width 512 = 448 NoPE + 64 RoPE,
 *   584 bytes per token; csrc/libtorch_stable/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu):
 *     a page holds all tokens' data first, then all tokens' scales:
 *       page base + offset * 576        : 448 float8_e4m3fn NoPE values, then 64 bf16 RoPE values
 *       page base + page_size * 576 + offset * 8 : 7 ue8m0 scales (one per 64 NoPE values,
 *                                          scale = 2^(byte - 127)), then 1 pad byte
 *     K = V = [448 dequantised NoPE, 64 RoPE] (512 values).
 *
 *   SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8 (DeepSeek V3.2 "fp8_ds_mla", q width 576 = 512 NoPE +
 *   64 RoPE, 656 bytes per token, token records contiguous within a page;
 *   csrc/libtorch_stable/cache_kernels.cu, concat_and_cache_ds_mla_kernel):
 *       page base + offset * 656 + 0    : 512 float8_e4m3fn NoPE values
 *                                 + 512  : 4 float32 scales (one per 128 NoPE values)
 *                                 + 528  : 64 bf16 RoPE values
 *     K = [512 dequantised NoPE, 64 RoPE]; V = the 512 NoPE values.
 *
 *   SPARKSEAL_SPARSE_MLA_LAYOUT_V32_BF16 (DeepSeek V3.2 bf16 cache, q width 576):
 *       page base + offset * 1152       : 512 bf16 NoPE values, then 64 bf16 RoPE values
 *     K = all 576 values; V = the first 512.
 *
 * QK^T paths (sparkseal_sparse_mla_params.qk_mode), for the fp8 layouts:
 *   BF16  : dequantised NoPE values are rounded to bf16 before the tensor-core products (bf16 q).
 *   FP8   : q's NoPE part is quantised to e4m3 per (token, head) with a float32 scale
 *           (amax / 448) and multiplied on e4m3 tensor cores straight from the cache's fp8 values;
 *           each group's fp32 partial sum is then scaled by the cache's scale of that group (V4:
 *           ue8m0 per 64 values, V3.2: float32 per 128). The RoPE part stays bf16.
 *   FP8X2 : as FP8 with q's NoPE part held as two e4m3 terms (the value and its rounding residual,
 *           same scale), which keeps the bf16 path's accuracy at twice FP8's tensor-core work.
 * In every path P V runs on bf16 tensor cores with P (the softmax weights) in bf16. The fp8 paths
 * read V's fp8 values without a dequantised copy: each key's scale is folded into its bf16 P
 * weights (P * scale * 2^56 for V3.2; P * 2^(byte - 71) for V4) and the products are taken back
 * by 2^64 in float32, so V4 scale bytes above 198 (scales above 2^71) and V3.2 scales at or above
 * 2^72 overflow there. AUTO is the path the library measured fastest (BF16, on an H200 with
 * GB10's shared-memory cap: kernels_sm121/csrc/sparse_mla.cu); the bf16 layout always runs BF16.
 *
 * Alignment: q, the cache data and every page stride are 16-byte aligned; q's
 * rows (q_stride_head, q_stride_token) are multiples of 8 elements; out is
 * 8-byte aligned with strides that are multiples of 4 elements (the FP8 and
 * FP8X2 paths store 4 bf16 values at a time).
 *
 * Work split. Each CTA handles one token, a group of heads and a contiguous
 * range of 64-key (or 32-key) tiles. When tokens x head groups cannot fill the
 * GPU, the top-k range is split over CTAs; the partial results go to
 * `workspace` (float32) and a second kernel merges them by their lse. The
 * split count depends only on the shapes and the device (never on the data),
 * so results are deterministic and the calls can be captured in a CUDA graph.
 * The call only enqueues kernels on `stream`; it never synchronizes or
 * allocates. No gathered copy of the cache is staged in global memory.
 */
#ifndef SPARKSEAL_SPARSE_MLA_H_
#define SPARKSEAL_SPARSE_MLA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct below or a signature changes. */
#define SPARKSEAL_SPARSE_MLA_ABI_VERSION 2

/* Cache layouts (sparkseal_sparse_mla_params.layout). */
#define SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8 0
#define SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8 1
#define SPARKSEAL_SPARSE_MLA_LAYOUT_V32_BF16 2

/* QK^T paths (sparkseal_sparse_mla_params.qk_mode; see the top of this file). */
#define SPARKSEAL_SPARSE_MLA_QK_AUTO 0
#define SPARKSEAL_SPARSE_MLA_QK_BF16 1
#define SPARKSEAL_SPARSE_MLA_QK_FP8 2
#define SPARKSEAL_SPARSE_MLA_QK_FP8X2 3

/* Output width (V) of every layout, and the lse of a row with no valid entry. */
#define SPARKSEAL_SPARSE_MLA_V_DIM 512
#define SPARKSEAL_SPARSE_MLA_EMPTY_LSE (-1.0e30f)

/* Return codes. Positive values are cudaError_t codes from a CUDA call. */
#define SPARKSEAL_SPARSE_MLA_OK 0
#define SPARKSEAL_SPARSE_MLA_ERR_NULL_ARGS (-1)   /* params or an output pointer argument is NULL */
#define SPARKSEAL_SPARSE_MLA_ERR_INVALID (-2)     /* a size, stride, pointer or scalar is out of range */
#define SPARKSEAL_SPARSE_MLA_ERR_UNSUPPORTED (-3) /* no kernel configuration fits this device */
#define SPARKSEAL_SPARSE_MLA_ERR_WORKSPACE (-4)   /* workspace missing or smaller than planned */

/* One paged cache and the token rows that index it. */
typedef struct sparkseal_sparse_mla_cache {
  const void *data;            /* page 0; 16-byte aligned */
  int64_t page_stride_bytes;   /* bytes between pages; multiple of 16, >= page_size * record bytes */
  int64_t num_pages;           /* >= 1; bounds the valid slot range */
  const int32_t *indices;      /* [num_tokens][indices_stride] global slot ids, -1 = skip */
  int64_t indices_stride;      /* elements between two tokens' rows; >= topk */
  const int32_t *topk_length;  /* [num_tokens] valid prefix length of each row, or NULL (= topk) */
  int32_t page_size;           /* tokens per page; >= 1 (vLLM's sparse-MLA backends use 64) */
  int32_t topk;                /* entries per row; a positive multiple of 64 */
} sparkseal_sparse_mla_cache;

typedef struct sparkseal_sparse_mla_params {
  int32_t layout;     /* SPARKSEAL_SPARSE_MLA_LAYOUT_* */
  int32_t num_tokens; /* >= 0; 0 enqueues nothing */
  int32_t num_heads;  /* 16, 32, 64 or 128 */
  int32_t num_caches; /* 1, or 2 with caches[1] as the second cache (same layout) */
  const void *q;      /* bf16 [num_tokens][num_heads][q width], last dimension contiguous */
  int64_t q_stride_token; /* elements */
  int64_t q_stride_head;  /* elements */
  sparkseal_sparse_mla_cache caches[2];
  const float *attn_sink; /* [num_heads] float32 sink logits, or NULL */
  void *out;              /* bf16 [num_tokens][num_heads][512], last dimension contiguous */
  int64_t out_stride_token; /* elements */
  int64_t out_stride_head;  /* elements */
  float *lse;               /* float32 [num_tokens][num_heads], heads contiguous */
  int64_t lse_stride_token; /* elements */
  void *workspace;          /* device memory of >= the planned workspace_bytes (may be NULL if 0) */
  size_t workspace_bytes;
  float softmax_scale;
  int32_t num_splits;     /* top-k splits per (token, head group); 0 = chosen from the device */
  int32_t max_smem_bytes; /* 0 = the device's per-block limit; otherwise a lower cap used to pick the
                             kernel configuration (lets a large GPU run the small-memory ones) */
  int32_t qk_mode;        /* SPARKSEAL_SPARSE_MLA_QK_*: 0 = the layout's default path */
} sparkseal_sparse_mla_params;

/* What sparkseal_sparse_mla_decode will launch for given params. */
typedef struct sparkseal_sparse_mla_plan {
  size_t workspace_bytes; /* device memory the call needs in params.workspace */
  int32_t heads_per_cta;
  int32_t keys_per_tile;
  int32_t threads_per_cta;
  int32_t smem_bytes;     /* dynamic shared memory per CTA */
  int32_t num_splits;
  int32_t num_ctas;       /* CTAs of the main kernel */
  int32_t ctas_per_sm;
  int32_t num_sms;
  int32_t qk_mode;        /* the QK^T path it runs: SPARKSEAL_SPARSE_MLA_QK_BF16, _FP8 or _FP8X2 */
} sparkseal_sparse_mla_plan;

/* SPARKSEAL_SPARSE_MLA_ABI_VERSION of the compiled library. */
int sparkseal_sparse_mla_abi_version(void);

/* sizeof(sparkseal_sparse_mla_params) and sizeof(sparkseal_sparse_mla_plan), for bindings to check
 * their mirror of the structs. */
size_t sparkseal_sparse_mla_params_size(void);
size_t sparkseal_sparse_mla_plan_size(void);

/* Validate the sizes and scalars of `params` (pointers other than q/out/lse are not needed) and
 * fill `plan` for the current CUDA device. Returns SPARKSEAL_SPARSE_MLA_OK or an error code. */
int sparkseal_sparse_mla_plan_decode(const sparkseal_sparse_mla_params *params,
                                     sparkseal_sparse_mla_plan *plan);

/* Validate `params` and enqueue the decode on `stream` (a cudaStream_t; NULL is the legacy
 * default stream) on the current CUDA device. Returns SPARKSEAL_SPARSE_MLA_OK or an error code;
 * on error nothing was enqueued unless the code is a positive cudaError_t. */
int sparkseal_sparse_mla_decode(const sparkseal_sparse_mla_params *params, void *stream);

/* Text of the last error raised by a call above on this thread ("" after a success). */
const char *sparkseal_sparse_mla_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SPARKSEAL_SPARSE_MLA_H_ */
