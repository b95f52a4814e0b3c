// DSpark / DFlash draft-input preparation (see include/sparkseal/dspark.h for the contract).
//
// One launch does two jobs, split over a 1-D grid:
//   blocks [0, num_reqs * chunks)           one request row each `chunks` blocks: its context rows
//                                           (positions, slots) and its query rows (ids, positions,
//                                           slots, sample buffers), strided over the row's span;
//   blocks [num_reqs * chunks, grid size)   the padding of every per-request buffer past num_reqs.
// No two threads write the same element, so the result does not depend on block order.
//
// Nothing here sits in an anonymous namespace or is `static`: nvcc names such entities after a
// hash of the build path, which would make the library's bytes depend on where it was built.

#include <cuda_runtime.h>

#include <cstdint>

#include "sparkseal/dspark.h"

namespace sparkseal::dspark {

constexpr int kThreads = 256;
// Caps on the grid: the loops are strided, so any grid covers every row.
constexpr int64_t kMaxChunksPerRequest = 4096;
constexpr int64_t kMaxPadBlocks = 64;
constexpr int64_t kMaxGridBlocks = 0x7fffffff;

__device__ __forceinline__ int64_t slot_or_pad(int64_t block_id, int64_t pos, int64_t block_size) {
  // The null block 0 is never written: its rows get PAD_SLOT_ID.
  return block_id != 0 ? block_id * block_size + pos % block_size
                       : static_cast<int64_t>(SPARKSEAL_DSPARK_PAD_SLOT_ID);
}

__device__ __forceinline__ int64_t block_entry(const sparkseal_dspark_prepare_args& a, int64_t req,
                                               int64_t pos) {
  // Positions past the table's last column read the last column (as vLLM's kernel does).
  int64_t column = pos / a.block_size;
  if (column > a.block_table_stride - 1) column = a.block_table_stride - 1;
  return static_cast<int64_t>(a.block_table[req * a.block_table_stride + column]);
}

__device__ void prepare_request(const sparkseal_dspark_prepare_args& a, int64_t req, int64_t chunk,
                                int64_t chunks) {
  const int64_t nq = a.num_query_per_req;
  const int64_t req_state = a.idx_mapping[req];
  const int64_t ctx_start = a.target_query_start_loc[req];
  const int64_t ctx_end = a.target_query_start_loc[req + 1];
  const int64_t num_ctx = ctx_end - ctx_start;
  const int64_t valid_ctx_end = ctx_end - a.num_rejected[req];
  const int64_t num_valid_ctx = valid_ctx_end - ctx_start;
  const int64_t last_valid_pos = a.target_positions[valid_ctx_end - 1];
  const int64_t query_base = req * nq;

  const int64_t stride = chunks * kThreads;
  for (int64_t j = chunk * kThreads + threadIdx.x; j < num_ctx + nq; j += stride) {
    if (j < num_ctx) {
      // Context row: rejected rows keep position 0 and a PAD slot.
      int64_t pos = 0;
      int64_t slot = SPARKSEAL_DSPARK_PAD_SLOT_ID;
      if (j < num_valid_ctx) {
        pos = a.target_positions[ctx_start + j];
        slot = slot_or_pad(block_entry(a, req, pos), pos, a.block_size);
      }
      a.context_positions[ctx_start + j] = pos;
      a.context_slot_mapping[ctx_start + j] = slot;
      continue;
    }
    // Query row: offset 0 is the anchor (bonus token), the rest are mask tokens.
    const int64_t off = j - num_ctx;
    const int64_t query_pos = last_valid_pos + 1 + off;
    const int64_t query_idx = query_base + off;
    int32_t input_id = static_cast<int32_t>(a.parallel_drafting_token_id);
    if (off == 0) {
      input_id = a.num_sampled[req] > 0 ? static_cast<int32_t>(a.last_sampled[req_state])
                                        : a.next_prefill_tokens[req_state];
    }
    a.input_ids[query_idx] = input_id;
    a.positions[query_idx] = query_pos < a.max_model_len - 1 ? query_pos : a.max_model_len - 1;
    a.query_slot_mapping[query_idx] = slot_or_pad(block_entry(a, req, query_pos), query_pos, a.block_size);

    // DSpark samples at every query row and predicts the next position; DFlash samples at the
    // mask rows only, each at its own position.
    const int64_t sample_off = a.sample_from_anchor ? 0 : 1;
    if (off >= sample_off) {
      const int64_t sample_idx = req * a.num_speculative_steps + (off - sample_off);
      a.sample_indices[sample_idx] = query_idx;
      a.sample_pos[sample_idx] = a.sample_from_anchor ? query_pos + 1 : query_pos;
      a.sample_idx_mapping[sample_idx] = static_cast<int32_t>(req_state);
    }
    if (off == 0) {
      a.query_start_loc[req] = static_cast<int32_t>(query_base);
      // Absolute length the draft attention reads: accepted context plus the query block.
      a.seq_lens[req] = static_cast<int32_t>(last_valid_pos + 1 + nq);
    }
  }
}

__device__ void pad_tail(const sparkseal_dspark_prepare_args& a, int64_t first, int64_t step) {
  const int64_t num_query_tokens = a.num_reqs * a.num_query_per_req;
  for (int64_t i = a.num_reqs + first; i <= a.max_num_reqs; i += step) {
    a.query_start_loc[i] = static_cast<int32_t>(num_query_tokens);
    if (i < a.max_num_reqs) a.seq_lens[i] = 0;
  }
  // Padded sample rows read query row 0 (always valid) and map to request -1 (ignored).
  const int64_t sample_end = a.max_num_reqs * a.num_speculative_steps;
  for (int64_t i = a.num_reqs * a.num_speculative_steps + first; i < sample_end; i += step) {
    a.sample_indices[i] = 0;
    a.sample_pos[i] = 0;
    a.sample_idx_mapping[i] = -1;
  }
  for (int64_t i = num_query_tokens + first; i < a.max_num_tokens; i += step) {
    a.query_slot_mapping[i] = SPARKSEAL_DSPARK_PAD_SLOT_ID;
  }
}

__global__ void __launch_bounds__(kThreads)
    dspark_prepare_inputs_kernel(const sparkseal_dspark_prepare_args a, int64_t chunks) {
  const int64_t block = blockIdx.x;
  const int64_t request_blocks = a.num_reqs * chunks;
  if (block < request_blocks) {
    prepare_request(a, block / chunks, block % chunks, chunks);
  } else {
    const int64_t pad_block = block - request_blocks;
    const int64_t pad_blocks = gridDim.x - request_blocks;
    pad_tail(a, pad_block * kThreads + threadIdx.x, pad_blocks * kThreads);
  }
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

bool has_null_pointer(const sparkseal_dspark_prepare_args& a) {
  const void* pointers[] = {
      a.input_ids,        a.positions,              a.query_start_loc, a.seq_lens,
      a.query_slot_mapping, a.context_positions,    a.context_slot_mapping,
      a.sample_indices,   a.sample_pos,             a.sample_idx_mapping,
      a.target_positions, a.target_query_start_loc, a.idx_mapping,     a.last_sampled,
      a.next_prefill_tokens, a.num_sampled,         a.num_rejected,    a.block_table,
  };
  for (const void* p : pointers) {
    if (p == nullptr) return true;
  }
  return false;
}

bool scalars_in_range(const sparkseal_dspark_prepare_args& a) {
  constexpr int64_t kInt32Max = 0x7fffffff;
  const int64_t sample_rows = a.sample_from_anchor ? 0 : 1;
  return a.block_table_stride >= 1 && a.block_size >= 1 && a.max_model_len >= 1 &&
         a.num_speculative_steps >= 1 && a.num_speculative_steps <= kInt32Max &&
         a.num_query_per_req == a.num_speculative_steps + sample_rows && a.max_num_reqs >= 1 &&
         a.max_num_reqs <= kInt32Max && a.num_reqs >= 1 && a.num_reqs <= a.max_num_reqs &&
         a.max_num_tokens <= kInt32Max && a.num_reqs * a.num_query_per_req <= a.max_num_tokens &&
         a.max_query_len >= 0 && a.max_query_len <= kInt32Max && a.device >= 0;
}

int prepare_inputs(const sparkseal_dspark_prepare_args* args, void* stream) {
  if (args == nullptr) return SPARKSEAL_DSPARK_ERR_NULL_ARGS;
  const sparkseal_dspark_prepare_args& a = *args;
  if (has_null_pointer(a)) return SPARKSEAL_DSPARK_ERR_NULL_POINTER;
  if (!scalars_in_range(a)) return SPARKSEAL_DSPARK_ERR_BAD_SCALAR;

  const int64_t chunks_wanted = cdiv(a.max_query_len + a.num_query_per_req, kThreads);
  const int64_t chunks =
      clamp(chunks_wanted, 1, clamp((kMaxGridBlocks - kMaxPadBlocks) / a.num_reqs, 1, kMaxChunksPerRequest));
  int64_t pad_len = a.max_num_tokens - a.num_reqs * a.num_query_per_req;
  const int64_t pad_reqs = (a.max_num_reqs + 1 - a.num_reqs) * a.num_speculative_steps;
  if (pad_reqs > pad_len) pad_len = pad_reqs;
  const int64_t pad_blocks = clamp(cdiv(pad_len, kThreads), 1, kMaxPadBlocks);
  const int64_t grid = a.num_reqs * chunks + pad_blocks;

  cudaError_t err = cudaSetDevice(a.device);
  if (err != cudaSuccess) return static_cast<int>(err);
  dspark_prepare_inputs_kernel<<<static_cast<unsigned int>(grid), kThreads, 0,
                                 static_cast<cudaStream_t>(stream)>>>(a, chunks);
  return static_cast<int>(cudaGetLastError());
}

const char* error_string(int code) {
  switch (code) {
    case SPARKSEAL_DSPARK_OK:
      return "success";
    case SPARKSEAL_DSPARK_ERR_NULL_ARGS:
      return "sparkseal_dspark_prepare_inputs: args is NULL";
    case SPARKSEAL_DSPARK_ERR_NULL_POINTER:
      return "sparkseal_dspark_prepare_inputs: a buffer pointer is NULL";
    case SPARKSEAL_DSPARK_ERR_BAD_SCALAR:
      return "sparkseal_dspark_prepare_inputs: a size or scalar is out of range (see dspark.h)";
    default:
      return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code))
                      : "sparkseal_dspark_prepare_inputs: unknown error code";
  }
}

}  // namespace sparkseal::dspark

extern "C" int sparkseal_dspark_abi_version(void) { return SPARKSEAL_DSPARK_ABI_VERSION; }

extern "C" int sparkseal_dspark_prepare_inputs(const sparkseal_dspark_prepare_args* args, void* stream) {
  return sparkseal::dspark::prepare_inputs(args, stream);
}

extern "C" const char* sparkseal_dspark_error_string(int code) {
  return sparkseal::dspark::error_string(code);
}
