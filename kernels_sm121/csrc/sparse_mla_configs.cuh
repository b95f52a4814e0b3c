// Sparse-MLA decode: the table of compiled kernel configurations (one table per cache layout,
// defined in sparse_mla_<layout>.cu) and the templates that fill it.
#pragma once

#include <cuda_runtime.h>

#include "sparse_mla_fp8qk.cuh"
#include "sparse_mla_kernel.cuh"
#include "sparse_mla_ws.cuh"

namespace sparkseal::sparse_mla {

using LaunchFn = cudaError_t (*)(const KernelArgs &args, int grid, cudaStream_t stream);

struct ConfigEntry {
  int rows;           // heads per CTA
  int keys_per_tile;  // NT
  int threads;
  int smem_bytes;
  const void *kernel;  // for cudaFuncSetAttribute / occupancy queries
  LaunchFn launch;
  int min_tiles_per_cta;  // fewer tiles per CTA: the planner takes the next entry of the same shape
};

template <int L, int ROWS, int NT, int C, int BUDGET>
cudaError_t launch_decode(const KernelArgs &args, int grid, cudaStream_t stream) {
  using Cfg = Config<L, ROWS, NT, C, BUDGET>;
  sparse_mla_decode_kernel<L, ROWS, NT, C, BUDGET><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int L, int ROWS, int NT, int C, int BUDGET>
ConfigEntry make_entry() {
  using Cfg = Config<L, ROWS, NT, C, BUDGET>;
  return ConfigEntry{ROWS, NT, Cfg::kThreads, Cfg::kSmem,
                     reinterpret_cast<const void *>(&sparse_mla_decode_kernel<L, ROWS, NT, C, BUDGET>),
                     &launch_decode<L, ROWS, NT, C, BUDGET>, 0};
}

// The warp-specialised bf16 kernel (sparse_mla_ws.cuh): 32 keys per tile.
template <int L, int ROWS, int BUDGET>
cudaError_t launch_decode_ws(const KernelArgs &args, int grid, cudaStream_t stream) {
  using Cfg = WsConfig<L, ROWS, BUDGET>;
  sparse_mla_decode_ws_kernel<L, ROWS, BUDGET><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int L, int ROWS, int BUDGET>
ConfigEntry make_ws_entry() {
  using Cfg = WsConfig<L, ROWS, BUDGET>;
  return ConfigEntry{ROWS, Cfg::kNT, Cfg::kThreads, Cfg::kSmem,
                     reinterpret_cast<const void *>(&sparse_mla_decode_ws_kernel<L, ROWS, BUDGET>),
                     &launch_decode_ws<L, ROWS, BUDGET>, Cfg::kMinTilesPerCta};
}

// The e4m3 QK^T kernel (sparse_mla_fp8qk.cuh); NQ = 1 (qk_mode FP8) or 2 (FP8X2).
template <int L, int ROWS, int NT, int NQ, int BUDGET>
cudaError_t launch_decode_fp8qk(const KernelArgs &args, int grid, cudaStream_t stream) {
  using Cfg = Fp8Config<L, ROWS, NT, NQ, BUDGET>;
  sparse_mla_decode_fp8qk_kernel<L, ROWS, NT, NQ, BUDGET><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int L, int ROWS, int NT, int NQ, int BUDGET>
ConfigEntry make_fp8qk_entry() {
  using Cfg = Fp8Config<L, ROWS, NT, NQ, BUDGET>;
  return ConfigEntry{ROWS, NT, Cfg::kThreads, Cfg::kSmem,
                     reinterpret_cast<const void *>(&sparse_mla_decode_fp8qk_kernel<L, ROWS, NT, NQ, BUDGET>),
                     &launch_decode_fp8qk<L, ROWS, NT, NQ, BUDGET>, 0};
}

// Tables in order of preference: more heads per CTA first (fewer re-reads of each token's rows),
// then the large-shared-memory configurations before the small ones.
extern const ConfigEntry kConfigsV4[];
extern const int kNumConfigsV4;
extern const ConfigEntry kConfigsV32Fp8[];
extern const int kNumConfigsV32Fp8;
extern const ConfigEntry kConfigsV32Bf16[];
extern const int kNumConfigsV32Bf16;
// The e4m3 QK^T tables of the two fp8 layouts: one e4m3 term of q (FP8) or two (FP8X2).
extern const ConfigEntry kConfigsV4QkFp8[];
extern const int kNumConfigsV4QkFp8;
extern const ConfigEntry kConfigsV4QkFp8x2[];
extern const int kNumConfigsV4QkFp8x2;
extern const ConfigEntry kConfigsV32Fp8QkFp8[];
extern const int kNumConfigsV32Fp8QkFp8;
extern const ConfigEntry kConfigsV32Fp8QkFp8x2[];
extern const int kNumConfigsV32Fp8QkFp8x2;

}  // namespace sparkseal::sparse_mla
