/*
 * DSpark / DFlash draft-input preparation: plain C ABI.
 *
 * Compiled counterpart of vLLM v0.25.1's `_prepare_dflash_inputs_kernel`
 * (vllm/v1/worker/gpu/spec_decode/dflash/speculator.py) as changed by
 * patches/vllm/0001-dspark-graph-replay-safety.patch. From the target batch it
 * writes the draft step's input ids, query positions, query start locations,
 * sequence lengths, query and context slot mappings and the sample index
 * buffers, and pads every per-request buffer out to its maximum size so that a
 * captured CUDA graph replays padded rows as inert:
 *
 *   - context rows past num_ctx - num_rejected (rejected draft tokens) store
 *     position 0 and slot SPARKSEAL_DSPARK_PAD_SLOT_ID;
 *   - context and query rows whose block-table entry is the null block 0 store
 *     slot SPARKSEAL_DSPARK_PAD_SLOT_ID;
 *   - rows past num_reqs get query_start_loc = num_reqs * num_query_per_req,
 *     seq_lens = 0, sample_indices = sample_pos = 0, sample_idx_mapping = -1,
 *     and query slots past num_reqs * num_query_per_req get
 *     SPARKSEAL_DSPARK_PAD_SLOT_ID up to max_num_tokens.
 *
 * Every pointer is a device pointer to a dense buffer of the stated type.
 * The call only enqueues one kernel on `stream` (a cudaStream_t), so it can be
 * captured into a CUDA graph; it never synchronizes or allocates.
 */
#ifndef SPARKSEAL_DSPARK_H_
#define SPARKSEAL_DSPARK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever sparkseal_dspark_prepare_args or a signature changes. */
#define SPARKSEAL_DSPARK_ABI_VERSION 1

/* vLLM's PAD_SLOT_ID: a slot the attention K/V write skips. */
#define SPARKSEAL_DSPARK_PAD_SLOT_ID (-1)

/* Return codes. Positive values are cudaError_t codes from the launch. */
#define SPARKSEAL_DSPARK_OK 0
#define SPARKSEAL_DSPARK_ERR_NULL_ARGS (-1)    /* args is NULL */
#define SPARKSEAL_DSPARK_ERR_NULL_POINTER (-2) /* a buffer pointer is NULL */
#define SPARKSEAL_DSPARK_ERR_BAD_SCALAR (-3)   /* a size or scalar is out of range */

typedef struct sparkseal_dspark_prepare_args {
  /* Outputs (device memory). */
  int32_t *input_ids;            /* [>= num_reqs * num_query_per_req] */
  int64_t *positions;            /* [>= num_reqs * num_query_per_req]: query positions */
  int32_t *query_start_loc;      /* [>= max_num_reqs + 1] */
  int32_t *seq_lens;             /* [>= max_num_reqs] */
  int64_t *query_slot_mapping;   /* [>= max_num_tokens] */
  int64_t *context_positions;    /* [>= number of target tokens] */
  int64_t *context_slot_mapping; /* [>= number of target tokens] */
  int64_t *sample_indices;       /* [>= max_num_reqs * num_speculative_steps] */
  int64_t *sample_pos;           /* [>= max_num_reqs * num_speculative_steps] */
  int32_t *sample_idx_mapping;   /* [>= max_num_reqs * num_speculative_steps] */
  /* Inputs from the target batch (device memory). */
  const int64_t *target_positions;       /* [number of target tokens] */
  const int32_t *target_query_start_loc; /* [>= num_reqs + 1] */
  const int32_t *idx_mapping;            /* [>= num_reqs]: batch row -> request slot */
  const int64_t *last_sampled;           /* [max_num_reqs], by request slot */
  const int32_t *next_prefill_tokens;    /* [max_num_reqs], by request slot */
  const int32_t *num_sampled;            /* [>= num_reqs] */
  const int32_t *num_rejected;           /* [>= num_reqs], each < that row's context length */
  const int32_t *block_table;            /* [>= num_reqs, block_table_stride], by batch row */
  /* Sizes and scalars. */
  int64_t block_table_stride; /* elements per block-table row; >= 1 */
  int64_t num_reqs;           /* 1 <= num_reqs <= max_num_reqs */
  int64_t max_query_len;      /* longest target query of the batch: sets the grid only */
  int64_t parallel_drafting_token_id;
  int64_t block_size;            /* KV-cache block size; >= 1 */
  int64_t num_query_per_req;     /* num_speculative_steps + (sample_from_anchor ? 0 : 1) */
  int64_t num_speculative_steps; /* >= 1 */
  int64_t max_num_reqs;
  int64_t max_num_tokens; /* >= num_reqs * num_query_per_req */
  int64_t max_model_len;  /* >= 1; query positions are clamped to max_model_len - 1 */
  int32_t sample_from_anchor; /* nonzero: DSpark anchor-as-first sampling */
  int32_t device;             /* CUDA device ordinal that owns the buffers and stream */
} sparkseal_dspark_prepare_args;

/* SPARKSEAL_DSPARK_ABI_VERSION of the compiled library. */
int sparkseal_dspark_abi_version(void);

/* Validate `args` and enqueue the preparation kernel on `stream`
 * (a cudaStream_t; NULL is the legacy default stream). Returns
 * SPARKSEAL_DSPARK_OK, a negative SPARKSEAL_DSPARK_ERR_* code, or the positive
 * cudaError_t of a failed launch. */
int sparkseal_dspark_prepare_inputs(const sparkseal_dspark_prepare_args *args, void *stream);

/* Static, human-readable text for a code returned above. */
const char *sparkseal_dspark_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* SPARKSEAL_DSPARK_H_ */
