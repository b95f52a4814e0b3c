// Sparse-MLA decode: the C ABI (include/sparkseal/sparse_mla.h), argument checks, the choice of
// kernel configuration and top-k split, and the split-combine kernel.
//
// Nothing here sits in an anonymous namespace or is `static`: nvcc names such entities after a
// hash of the build path, which would make the library's bytes depend on where it was built.

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "sparkseal/sparse_mla.h"
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

// ---------------------------------------------------------------------------------------------
// Split combine: `groups` warps per (token, head), kCombineWarps / groups pairs per CTA. Lane l
// of a pair's warp j holds columns l*4 + i*128 (i = 0..3) of splits j, j + groups, ... One warp
// per pair suits many pairs; with few pairs (batch 1) and 16-64 splits, one warp's dependent
// rounds of reads were the combine's whole time, and 2 or 4 warps read a pair's splits at once.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kCombineWarps * 32)
    sparse_mla_combine_kernel(const KernelArgs args, int groups) {
  __shared__ float4 part_acc[kCombineWarps][4][32];
  __shared__ float part_wsum[kCombineWarps];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = warp % groups;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * (kCombineWarps / groups) + warp / groups;
  const int64_t plane = static_cast<int64_t>(args.num_tokens) * args.num_heads;
  const bool active = pair < plane;  // inactive warps still meet the barrier below

  float mx = kNegInf;
  if (active) {
    for (int s = 0; s < args.num_splits; ++s) mx = fmaxf(mx, args.ws_lse[s * plane + pair]);
  }

  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.f;
  float wsum = 0.f;
  if (mx != kNegInf) {
    // kUnroll of this warp's splits per step, their loads all issued before the first is used.
    // A split with weight 0 (an empty one: its partial O is 0) adds exact zeros.
    constexpr int kUnroll = 8;
    for (int s0 = group; s0 < args.num_splits; s0 += kUnroll * groups) {
      float w[kUnroll];
      float4 v[kUnroll][4];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int s = s0 + u * groups;
        const bool in = s < args.num_splits;
        w[u] = in ? __expf(args.ws_lse[s * plane + pair] - mx) : 0.f;
        const float *src = args.ws_o + ((in ? s : 0) * plane + pair) * kDV + lane * 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[u][i] = *reinterpret_cast<const float4 *>(src + i * 128);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        wsum += w[u];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[4 * i + 0] += w[u] * v[u][i].x;
          acc[4 * i + 1] += w[u] * v[u][i].y;
          acc[4 * i + 2] += w[u] * v[u][i].z;
          acc[4 * i + 3] += w[u] * v[u][i].w;
        }
      }
    }
  }
  if (groups > 1) {  // uniform over the CTA
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      part_acc[warp][i][lane] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    }
    if (lane == 0) part_wsum[warp] = wsum;
    __syncthreads();
    if (group != 0) return;
    for (int j = 1; j < groups; ++j) {
      wsum += part_wsum[warp + j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 a = part_acc[warp + j][i][lane];
        acc[4 * i + 0] += a.x;
        acc[4 * i + 1] += a.y;
        acc[4 * i + 2] += a.z;
        acc[4 * i + 3] += a.w;
      }
    }
  }
  if (!active) return;
  const int token = static_cast<int>(pair / args.num_heads);
  const int head = static_cast<int>(pair - static_cast<int64_t>(token) * args.num_heads);
  float denom = wsum;
  if (args.sink != nullptr && mx != kNegInf) denom += __expf(args.sink[head] - mx);
  const float inv = denom > 0.f ? 1.f / denom : 0.f;

  __nv_bfloat16 *out = args.out + static_cast<int64_t>(token) * args.out_stride_token +
                       static_cast<int64_t>(head) * args.out_stride_head + lane * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t *dst = reinterpret_cast<uint32_t *>(out + i * 128);
    dst[0] = pack_bf16x2(acc[4 * i + 0] * inv, acc[4 * i + 1] * inv);
    dst[1] = pack_bf16x2(acc[4 * i + 2] * inv, acc[4 * i + 3] * inv);
  }
  if (lane == 0) {
    args.lse[static_cast<int64_t>(token) * args.lse_stride_token + head] =
        wsum > 0.f ? mx + __logf(wsum) : SPARKSEAL_SPARSE_MLA_EMPTY_LSE;
  }
}

// Warps per (token, head) in the combine: the most of 4, 2, 1 that still gives each warp at
// least one full step (kUnroll) of splits and keeps the grid within kCombineWarpsPerSm warps per
// SM (measured on an H200: 4 warps per pair at batch 8 and 2-8 splits were slower than 1).
int combine_groups(int64_t pairs, int splits, int num_sms) {
  constexpr int kUnroll = 8;
  constexpr int64_t kCombineWarpsPerSm = 8;
  for (int g = kCombineWarps; g > 1; g /= 2) {
    if (splits >= g * kUnroll && pairs * g <= static_cast<int64_t>(num_sms) * kCombineWarpsPerSm) return g;
  }
  return 1;
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------
thread_local char g_last_error[1024] = "";

int fail(int code, const char *fmt, ...) {
  char body[896];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  snprintf(g_last_error, sizeof(g_last_error), "kernels_sm121/csrc/sparse_mla.cu: %s", body);
  return code;
}

int fail_cuda(cudaError_t err, const char *what) {
  return fail(static_cast<int>(err), "%s failed: %s (%s)", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

// ---------------------------------------------------------------------------------------------
// Argument checks
// ---------------------------------------------------------------------------------------------
// The QK^T path that qk_mode AUTO runs on the fp8 layouts: BF16, the fastest measured on an H200
// with GB10's shared-memory cap (bench/results/sparse_mla.md). There mma.sync on e4m3 is emulated
// (f16 conversions + f16 mma); the e4m3 paths are for GB10's e4m3 tensor cores and stay opt-in
// until they are measured on one.
constexpr int kDefaultFp8Qk = SPARKSEAL_SPARSE_MLA_QK_BF16;
// qk_mode values: AUTO, BF16, FP8, FP8X2 (the tables below are indexed by them).
constexpr int kNumQkModes = SPARKSEAL_SPARSE_MLA_QK_FP8X2 + 1;

struct LayoutInfo {
  int q_dim;
  int record_bytes;
  const char *name;
  int default_qk;
  // Configuration tables indexed by qk_mode (BF16, FP8, FP8X2; null where the layout has none).
  const ConfigEntry *configs[kNumQkModes];
  int num_configs[kNumQkModes];
};

bool layout_info(int layout, LayoutInfo *info) {
  switch (layout) {
    case SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8:
      *info = {512, 584, "V4_FP8", kDefaultFp8Qk,
               {nullptr, kConfigsV4, kConfigsV4QkFp8, kConfigsV4QkFp8x2},
               {0, kNumConfigsV4, kNumConfigsV4QkFp8, kNumConfigsV4QkFp8x2}};
      return true;
    case SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8:
      *info = {576, 656, "V32_FP8", kDefaultFp8Qk,
               {nullptr, kConfigsV32Fp8, kConfigsV32Fp8QkFp8, kConfigsV32Fp8QkFp8x2},
               {0, kNumConfigsV32Fp8, kNumConfigsV32Fp8QkFp8, kNumConfigsV32Fp8QkFp8x2}};
      return true;
    case SPARKSEAL_SPARSE_MLA_LAYOUT_V32_BF16:
      *info = {576, 1152, "V32_BF16", SPARKSEAL_SPARSE_MLA_QK_BF16,
               {nullptr, kConfigsV32Bf16, nullptr, nullptr},
               {0, kNumConfigsV32Bf16, 0, 0}};
      return true;
    default:
      return false;
  }
}

// qk_mode as run: AUTO resolved to the layout's default.
int resolved_qk(const sparkseal_sparse_mla_params *p, const LayoutInfo &info) {
  return p->qk_mode == SPARKSEAL_SPARSE_MLA_QK_AUTO ? info.default_qk : p->qk_mode;
}

bool aligned(const void *p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

// Checks sizes, strides and scalars; pointers only when `check_pointers`.
int check_params(const sparkseal_sparse_mla_params *p, bool check_pointers, LayoutInfo *info) {
  if (p == nullptr) return fail(SPARKSEAL_SPARSE_MLA_ERR_NULL_ARGS, "params: expected a pointer, got NULL");
  if (!layout_info(p->layout, info)) {
    return fail(SPARKSEAL_SPARSE_MLA_ERR_INVALID, "params.layout: expected 0 (V4_FP8), 1 (V32_FP8) or 2 "
                "(V32_BF16), got %d", p->layout);
  }
  const int kInvalid = SPARKSEAL_SPARSE_MLA_ERR_INVALID;
  if (p->num_tokens < 0) return fail(kInvalid, "params.num_tokens: expected >= 0, got %d", p->num_tokens);
  const int h = p->num_heads;
  if (h != 16 && h != 32 && h != 64 && h != 128) {
    return fail(kInvalid, "params.num_heads: expected 16, 32, 64 or 128, got %d", h);
  }
  if (p->num_caches != 1 && p->num_caches != 2) {
    return fail(kInvalid, "params.num_caches: expected 1 or 2, got %d", p->num_caches);
  }
  if (p->qk_mode < SPARKSEAL_SPARSE_MLA_QK_AUTO || p->qk_mode > SPARKSEAL_SPARSE_MLA_QK_FP8X2) {
    return fail(kInvalid, "params.qk_mode: expected 0 (AUTO), 1 (BF16), 2 (FP8) or 3 (FP8X2), got %d",
                p->qk_mode);
  }
  if (info->configs[resolved_qk(p, *info)] == nullptr) {
    return fail(kInvalid, "params.qk_mode: expected 0 (AUTO) or 1 (BF16) for layout %s (no fp8 records), got %d",
                info->name, p->qk_mode);
  }
  if (p->num_splits < 0) return fail(kInvalid, "params.num_splits: expected >= 0, got %d", p->num_splits);
  if (p->max_smem_bytes < 0) {
    return fail(kInvalid, "params.max_smem_bytes: expected >= 0, got %d", p->max_smem_bytes);
  }
  if (!std::isfinite(p->softmax_scale)) {
    return fail(kInvalid, "params.softmax_scale: expected a finite value, got %g",
                static_cast<double>(p->softmax_scale));
  }
  if (p->q_stride_head < info->q_dim || p->q_stride_head % 8 != 0) {
    return fail(kInvalid, "params.q_stride_head: expected a multiple of 8 >= %d (layout %s), got %lld",
                info->q_dim, info->name, static_cast<long long>(p->q_stride_head));
  }
  if (p->q_stride_token < p->q_stride_head * h || p->q_stride_token % 8 != 0) {
    return fail(kInvalid, "params.q_stride_token: expected a multiple of 8 >= %lld, got %lld",
                static_cast<long long>(p->q_stride_head * h), static_cast<long long>(p->q_stride_token));
  }
  // The FP8 and FP8X2 paths store 4 bf16 values (8 bytes) at a time: rows start 8-byte aligned.
  if (p->out_stride_head < kDV || p->out_stride_head % 4 != 0) {
    return fail(kInvalid, "params.out_stride_head: expected a multiple of 4 >= %d, got %lld", kDV,
                static_cast<long long>(p->out_stride_head));
  }
  if (p->out_stride_token < p->out_stride_head * h || p->out_stride_token % 4 != 0) {
    return fail(kInvalid, "params.out_stride_token: expected a multiple of 4 >= %lld, got %lld",
                static_cast<long long>(p->out_stride_head * h), static_cast<long long>(p->out_stride_token));
  }
  if (p->lse_stride_token < h) {
    return fail(kInvalid, "params.lse_stride_token: expected >= %d, got %lld", h,
                static_cast<long long>(p->lse_stride_token));
  }
  for (int c = 0; c < p->num_caches; ++c) {
    const sparkseal_sparse_mla_cache &k = p->caches[c];
    if (k.page_size < 1) return fail(kInvalid, "params.caches[%d].page_size: expected >= 1, got %d", c, k.page_size);
    if (k.num_pages < 1) {
      return fail(kInvalid, "params.caches[%d].num_pages: expected >= 1, got %lld", c,
                  static_cast<long long>(k.num_pages));
    }
    if (k.num_pages * k.page_size > INT32_MAX) {
      return fail(kInvalid, "params.caches[%d]: expected num_pages * page_size <= %d (int32 slot ids), got %lld",
                  c, INT32_MAX, static_cast<long long>(k.num_pages * k.page_size));
    }
    const int64_t min_stride = static_cast<int64_t>(k.page_size) * info->record_bytes;
    if (k.page_stride_bytes < min_stride || k.page_stride_bytes % 16 != 0) {
      return fail(kInvalid, "params.caches[%d].page_stride_bytes: expected a multiple of 16 >= %lld "
                  "(page_size %d x %d-byte records, layout %s), got %lld", c,
                  static_cast<long long>(min_stride), k.page_size, info->record_bytes, info->name,
                  static_cast<long long>(k.page_stride_bytes));
    }
    if (k.topk < 64 || k.topk % 64 != 0) {
      return fail(kInvalid, "params.caches[%d].topk: expected a positive multiple of 64, got %d", c, k.topk);
    }
    if (k.indices_stride < k.topk) {
      return fail(kInvalid, "params.caches[%d].indices_stride: expected >= topk %d, got %lld", c, k.topk,
                  static_cast<long long>(k.indices_stride));
    }
    if (check_pointers) {
      if (k.data == nullptr || !aligned(k.data, 16)) {
        return fail(kInvalid, "params.caches[%d].data: expected a 16-byte aligned pointer, got %p", c, k.data);
      }
      if (k.indices == nullptr || !aligned(k.indices, 4)) {
        return fail(kInvalid, "params.caches[%d].indices: expected a 4-byte aligned pointer, got %p", c,
                    static_cast<const void *>(k.indices));
      }
    }
  }
  if (check_pointers) {
    if (p->q == nullptr || !aligned(p->q, 16)) {
      return fail(kInvalid, "params.q: expected a 16-byte aligned pointer, got %p", p->q);
    }
    if (p->out == nullptr || !aligned(p->out, 8)) {
      return fail(kInvalid, "params.out: expected an 8-byte aligned pointer, got %p", p->out);
    }
    if (p->lse == nullptr || !aligned(p->lse, 4)) {
      return fail(kInvalid, "params.lse: expected a 4-byte aligned pointer, got %p",
                  static_cast<const void *>(p->lse));
    }
  }
  return SPARKSEAL_SPARSE_MLA_OK;
}

// ---------------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------------
constexpr int kMaxDevices = 64;
constexpr int kMaxEntries = 16;
// Per (layout, qk_mode), device and configuration: 0 = shared-memory attribute not set yet, else
// CTAs per SM + 1.
std::atomic<int> g_occupancy[3 * kNumQkModes][kMaxDevices][kMaxEntries];

struct Plan {
  const ConfigEntry *entry;
  int qk_mode;
  int num_sms;
  int ctas_per_sm;
  int num_splits;
  int tiles_per_split;
  int64_t grid;
  size_t ws_o_bytes;
  size_t workspace_bytes;
};

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int make_plan(const sparkseal_sparse_mla_params *p, const LayoutInfo &info, Plan *plan) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return fail_cuda(err, "cudaGetDevice");
  int num_sms = 0, optin = 0;
  err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return fail_cuda(err, "cudaDeviceGetAttribute(MultiProcessorCount)");
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return fail_cuda(err, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  const int limit = (p->max_smem_bytes > 0 && p->max_smem_bytes < optin) ? p->max_smem_bytes : optin;
  const int qk = resolved_qk(p, info);
  const ConfigEntry *configs = info.configs[qk];
  const int num_configs = info.num_configs[qk];

  int chosen = -1;
  for (int i = 0; i < num_configs; ++i) {
    const ConfigEntry &e = configs[i];
    if (e.rows <= p->num_heads && p->num_heads % e.rows == 0 && e.smem_bytes <= limit) {
      chosen = i;
      break;
    }
  }
  if (chosen < 0) {
    return fail(SPARKSEAL_SPARSE_MLA_ERR_UNSUPPORTED, "no kernel configuration of layout %s for %d heads fits "
                "%d bytes of shared memory per block (device %d allows %d)", info.name, p->num_heads, limit,
                dev, optin);
  }
  // 16-head CTAs: once the tokens alone fill a quarter of the GPU, the 32-key, 128-thread
  // configuration that follows in the table runs two CTAs per SM and beats the 64-key one
  // (measured on an H200: 197 against 253 us at 256 tokens x 2048 keys); with fewer tokens it
  // needs twice the splits, and the 64-key one keeps the lower latency.
  if (chosen + 1 < num_configs) {
    const ConfigEntry &cur = configs[chosen];
    const ConfigEntry &next = configs[chosen + 1];
    const int64_t tokens_x_groups = static_cast<int64_t>(p->num_tokens) * (p->num_heads / cur.rows);
    if (cur.rows == 16 && next.rows == 16 && next.keys_per_tile < cur.keys_per_tile &&
        next.smem_bytes <= limit && tokens_x_groups * 4 >= num_sms) {
      chosen += 1;
    }
  }
  // An entry with min_tiles_per_cta (the warp-specialised kernel: its producers need a few tiles to
  // get ahead) gives way to the next one of the same shape when its CTAs would get fewer tiles.
  const ConfigEntry *ep = nullptr;
  int ctas_per_sm = 0, splits = 1, tps = 0, n_tiles = 0;
  int64_t base = 0;
  for (;;) {
    const ConfigEntry &e = configs[chosen];
    ctas_per_sm = 0;
    std::atomic<int> *occ = (dev < kMaxDevices && chosen < kMaxEntries)
                                ? &g_occupancy[p->layout * kNumQkModes + qk][dev][chosen]
                                : nullptr;
    const int cached = occ != nullptr ? occ->load(std::memory_order_relaxed) : 0;
    if (cached > 0) {
      ctas_per_sm = cached - 1;
    } else {
      err = cudaFuncSetAttribute(e.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem_bytes);
      if (err != cudaSuccess) return fail_cuda(err, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, e.kernel, e.threads, e.smem_bytes);
      if (err != cudaSuccess) return fail_cuda(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      if (occ != nullptr) occ->store(ctas_per_sm + 1, std::memory_order_relaxed);
    }
    if (ctas_per_sm < 1) {
      return fail(SPARKSEAL_SPARSE_MLA_ERR_UNSUPPORTED, "kernel configuration %d heads x %d keys (%d threads, %d "
                  "bytes of shared memory) cannot run on device %d", e.rows, e.keys_per_tile, e.threads,
                  e.smem_bytes, dev);
    }

    n_tiles = 0;
    for (int c = 0; c < p->num_caches; ++c) n_tiles += p->caches[c].topk / e.keys_per_tile;
    base = static_cast<int64_t>(p->num_tokens) * (p->num_heads / e.rows);
    const int64_t slots = static_cast<int64_t>(num_sms) * ctas_per_sm;

    splits = 1;
    if (p->num_splits > 0) {
      splits = p->num_splits < n_tiles ? p->num_splits : n_tiles;
    } else if (base > 0) {
      // Cost in tile-times: waves x (tiles per CTA + 1 for the prologue), and with several splits
      // 1 for the combine's launch plus 1 / kSplitsPerTile per split (its float32 partial O
      // written and read back; measured on an H200 at batch 1 with 16 to 64 splits, one tile of
      // 32 keys costs about as much as 16 to 20 splits). Costs are kept in 1 / kSplitsPerTile units.
      constexpr int64_t kSplitsPerTile = 16;
      int64_t best_cost = INT64_MAX;
      for (int s = 1; s <= n_tiles; ++s) {
        const int tps = (n_tiles + s - 1) / s;
        const int s_eff = (n_tiles + tps - 1) / tps;
        if (s_eff != s) continue;
        const int64_t waves = (base * s + slots - 1) / slots;
        const int64_t cost = kSplitsPerTile * (waves * (tps + 1) + (s > 1 ? 1 : 0)) + (s > 1 ? s : 0);
        if (cost < best_cost) {
          best_cost = cost;
          splits = s;
        }
      }
    }
    tps = (n_tiles + splits - 1) / splits;
    if (tps < e.min_tiles_per_cta && chosen + 1 < num_configs) {
      const ConfigEntry &next = configs[chosen + 1];
      if (next.rows == e.rows && next.keys_per_tile == e.keys_per_tile && next.smem_bytes <= limit) {
        chosen += 1;
        continue;
      }
    }
    ep = &e;
    break;
  }
  const ConfigEntry &e = *ep;
  splits = (n_tiles + tps - 1) / tps;

  plan->entry = &e;
  plan->qk_mode = qk;
  plan->num_sms = num_sms;
  plan->ctas_per_sm = ctas_per_sm;
  plan->num_splits = splits;
  plan->tiles_per_split = tps;
  plan->grid = base * splits;
  if (plan->grid > INT32_MAX) {
    return fail(SPARKSEAL_SPARSE_MLA_ERR_INVALID, "grid of %lld CTAs exceeds %d: too many tokens (%d)",
                static_cast<long long>(plan->grid), INT32_MAX, p->num_tokens);
  }
  const size_t rows = static_cast<size_t>(p->num_tokens) * p->num_heads * splits;
  plan->ws_o_bytes = splits > 1 ? align_up(rows * kDV * sizeof(float), 256) : 0;
  plan->workspace_bytes = splits > 1 ? plan->ws_o_bytes + rows * sizeof(float) : 0;
  return SPARKSEAL_SPARSE_MLA_OK;
}

}  // namespace sparkseal::sparse_mla

using namespace sparkseal::sparse_mla;

extern "C" {

int sparkseal_sparse_mla_abi_version(void) { return SPARKSEAL_SPARSE_MLA_ABI_VERSION; }

size_t sparkseal_sparse_mla_params_size(void) { return sizeof(sparkseal_sparse_mla_params); }

size_t sparkseal_sparse_mla_plan_size(void) { return sizeof(sparkseal_sparse_mla_plan); }

const char *sparkseal_sparse_mla_last_error(void) { return g_last_error; }

int sparkseal_sparse_mla_plan_decode(const sparkseal_sparse_mla_params *params, sparkseal_sparse_mla_plan *plan) {
  g_last_error[0] = '\0';
  if (plan == nullptr) return fail(SPARKSEAL_SPARSE_MLA_ERR_NULL_ARGS, "plan: expected a pointer, got NULL");
  LayoutInfo info;
  int rc = check_params(params, false, &info);
  if (rc != SPARKSEAL_SPARSE_MLA_OK) return rc;
  Plan pl;
  rc = make_plan(params, info, &pl);
  if (rc != SPARKSEAL_SPARSE_MLA_OK) return rc;
  plan->workspace_bytes = pl.workspace_bytes;
  plan->heads_per_cta = pl.entry->rows;
  plan->keys_per_tile = pl.entry->keys_per_tile;
  plan->threads_per_cta = pl.entry->threads;
  plan->smem_bytes = pl.entry->smem_bytes;
  plan->num_splits = pl.num_splits;
  plan->num_ctas = static_cast<int32_t>(pl.grid);
  plan->ctas_per_sm = pl.ctas_per_sm;
  plan->num_sms = pl.num_sms;
  plan->qk_mode = pl.qk_mode;
  return SPARKSEAL_SPARSE_MLA_OK;
}

int sparkseal_sparse_mla_decode(const sparkseal_sparse_mla_params *p, void *stream) {
  g_last_error[0] = '\0';
  LayoutInfo info;
  int rc = check_params(p, true, &info);
  if (rc != SPARKSEAL_SPARSE_MLA_OK) return rc;
  if (p->num_tokens == 0) return SPARKSEAL_SPARSE_MLA_OK;
  Plan pl;
  rc = make_plan(p, info, &pl);
  if (rc != SPARKSEAL_SPARSE_MLA_OK) return rc;
  if (pl.workspace_bytes > 0 &&
      (p->workspace == nullptr || p->workspace_bytes < pl.workspace_bytes || !aligned(p->workspace, 256))) {
    return fail(SPARKSEAL_SPARSE_MLA_ERR_WORKSPACE, "params.workspace: expected a 256-byte aligned buffer of >= "
                "%zu bytes (%d splits), got %p with %zu bytes", pl.workspace_bytes, pl.num_splits, p->workspace,
                p->workspace_bytes);
  }

  KernelArgs a{};
  a.q = static_cast<const __nv_bfloat16 *>(p->q);
  a.q_stride_token = p->q_stride_token;
  a.q_stride_head = p->q_stride_head;
  for (int c = 0; c < 2; ++c) {
    CacheArgs &k = a.cache[c];
    if (c < p->num_caches) {
      const sparkseal_sparse_mla_cache &s = p->caches[c];
      k.data = static_cast<const uint8_t *>(s.data);
      k.page_stride = s.page_stride_bytes;
      k.num_slots = s.num_pages * s.page_size;
      k.indices = s.indices;
      k.indices_stride = s.indices_stride;
      k.lengths = s.topk_length;
      k.page_size = s.page_size;
      k.topk = s.topk;
      k.num_tiles = s.topk / pl.entry->keys_per_tile;
    }
  }
  a.num_caches = p->num_caches;
  a.num_tokens = p->num_tokens;
  a.num_heads = p->num_heads;
  a.head_groups = p->num_heads / pl.entry->rows;
  a.num_splits = pl.num_splits;
  a.tiles_per_split = pl.tiles_per_split;
  a.scale_log2 = p->softmax_scale * kLog2e;
  a.sink = p->attn_sink;
  a.out = static_cast<__nv_bfloat16 *>(p->out);
  a.out_stride_token = p->out_stride_token;
  a.out_stride_head = p->out_stride_head;
  a.lse = p->lse;
  a.lse_stride_token = p->lse_stride_token;
  if (pl.num_splits > 1) {
    a.ws_o = static_cast<float *>(p->workspace);
    a.ws_lse = reinterpret_cast<float *>(static_cast<uint8_t *>(p->workspace) + pl.ws_o_bytes);
  }

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = pl.entry->launch(a, static_cast<int>(pl.grid), s);
  if (err != cudaSuccess) return fail_cuda(err, "sparse_mla_decode_kernel launch");
  if (pl.num_splits > 1) {
    const int64_t pairs = static_cast<int64_t>(p->num_tokens) * p->num_heads;
    const int groups = combine_groups(pairs, pl.num_splits, pl.num_sms);
    const int64_t blocks = (pairs * groups + kCombineWarps - 1) / kCombineWarps;
    sparse_mla_combine_kernel<<<static_cast<unsigned>(blocks), kCombineWarps * 32, 0, s>>>(a, groups);
    err = cudaGetLastError();
    if (err != cudaSuccess) return fail_cuda(err, "sparse_mla_combine_kernel launch");
  }
  return SPARKSEAL_SPARSE_MLA_OK;
}

}  // extern "C"
