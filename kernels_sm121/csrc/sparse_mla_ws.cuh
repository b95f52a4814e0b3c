// Sparse-MLA decode, bf16 QK^T, warp-specialised for GB10's 99 KB per block (contract and byte
// layouts: include/sparkseal/sparse_mla.h).
//
// Why: in the single-role kernel (sparse_mla_kernel.cuh) every warp copies, dequantises and
// multiplies in turn, with CTA barriers between the phases; under 99 KB a GB10 runs one CTA of
// 8 warps per SM, so each phase's latency is exposed and the phases add up (measured with
// bench/sparse_mla_stages.py: dequantisation, copies, S and P V took 25, 23, 9 and 14% of a tile
// and their savings added up). Here the two jobs run in different warps at the same time:
//   - two producer warpgroups (8 warps) copy each tile's records with cp.async into a ring of
//     half-tile staging slots (16 keys each; 3 fit beside the rest) and dequantise them into one
//     of two bf16 K tiles. Each producer thread copies and converts the same parts of one key of
//     every half tile, so it waits for its own copies only and producers never wait for each
//     other; the record's ue8m0 scales travel in registers;
//   - the consumer warps ((ROWS / 16) x 4, the single-role kernel's warp grid and the same
//     TileMath code) attend to the other K tile: S = Q K^T, the online softmax, O += P V.
// The two K tiles are handed over with named barriers: FULL[b] (the producers arrive when K tile
// b holds tile t, the consumers wait) and EMPTY[b] (the consumers arrive when they are done with
// it, the producers wait before writing tile t + 2). Q passes through K tile 1 into the
// consumers' registers before the producers first write it. The producers give registers to the
// consumers (setmaxnreg), which hold Q's fragments and the output accumulators.
// Measured on an H200 under the 99 KB cap (bench/results/sparse_mla.md): 3-11% faster than the
// single-role kernel where each CTA gets 16 tiles or more, slower with fewer (kMinTilesPerCta); at
// 16 heads (4 consumer warps) slower, so the 16-head configurations stay single-role.
// Nothing here sits in an anonymous namespace or is `static` (see sparse_mla_kernel.cuh).
#pragma once

#include "sparse_mla_kernel.cuh"

// setmaxnreg: the arch-specific sm_90a and sm_120a / sm_121a targets.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define SPARKSEAL_SETMAXNREG 1
#else
#define SPARKSEAL_SETMAXNREG 0
#endif

namespace sparkseal::sparse_mla {

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if SPARKSEAL_SETMAXNREG
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if SPARKSEAL_SETMAXNREG
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The consumers' geometry is the single-role configuration's of 32 keys and 4 column warps
// (TileMath reads it from the base); the shared-memory layout and the thread count are this one's.
template <int L, int ROWS, int BUDGET>
struct WsConfig : Config<L, ROWS, 32, 4, BUDGET> {
  using Base = Config<L, ROWS, 32, 4, BUDGET>;
  using T = LayoutTraits<L>;
  static constexpr int kConsumerWarps = Base::kWarps;
  static constexpr int kConsumerThreads = Base::kThreads;
  // Two warpgroups (setmaxnreg acts per warpgroup): with one, the copies and conversions of a
  // tile took longer than the consumers' work on it (measured on an H200: 350 against 263 us at
  // batch 64, 128 heads, topk 2048; the single-role kernel took 293).
  static constexpr int kProducerThreads = 256;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // With fewer tiles per CTA the producers have no time to get ahead and the single-role kernel
  // is as fast or faster (measured on an H200 under the 99 KB cap, V4: 0.93-0.99x at 2 to 8
  // tiles, 1.03-1.11x at 16 and more), so the planner takes it instead.
  static constexpr int kMinTilesPerCta = 16;
  static constexpr int kHalf = 16;                        // keys per staging slot
  static constexpr int kPTPK = kProducerThreads / kHalf;  // producer threads per key
  static constexpr int kPKPW = 32 / kPTPK;                // keys per producer warp
  static constexpr int kKValidBytes = 32;                 // one K tile's valid flags
  static constexpr int kSlotBytes = kHalf * T::kRawStride;
  static constexpr int kFixed = 2 * Base::kKBytes + Base::kPBytes + Base::kRedBytes + 2 * kKValidBytes;
  static constexpr int kAvail = (BUDGET - 1024 - kFixed) / kSlotBytes;
  static constexpr int kSlots = kAvail > 4 ? 4 : kAvail;
  static constexpr int kSmem = kFixed + kSlots * kSlotBytes;
  // The CTA starts with kLaunchRegs registers a thread (65536 / kThreads, a multiple of 8); the
  // producers keep 40 and hand the rest to the consumers (32 heads: 256 x 40 + 256 x 216 =
  // 512 x 128).
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 255 : (65536 / kThreads) / 8 * 8;
  static constexpr bool kRegSplit = kThreads > 256;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegsRaw =
      (kLaunchRegs * kThreads - kProducerThreads * kProducerRegs) / kConsumerThreads / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 256 ? 256 : kConsumerRegsRaw;
  // Named barriers: 0 is __syncthreads, 1 .. kRG the consumers' row groups (TileMath).
  static constexpr int kBarFull = 3;      // + b
  static constexpr int kBarEmpty = 5;     // + b
  static constexpr int kBarConsumer = 7;

  static_assert(L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8, "producers hold V4's scale bytes in registers");
  static_assert(Base::kQInRegs, "the consumers hold Q in registers: no shared-memory Q tile");
  static_assert(Base::kRG <= 2, "row-group barriers 1 and 2");
  static_assert(kSlots >= 2, "warp-specialised configuration does not fit its shared-memory budget");
  static_assert(kSmem <= BUDGET - 1024, "warp-specialised configuration does not fit its budget");
};

template <int L, int ROWS, int BUDGET>
__global__ void __launch_bounds__(WsConfig<L, ROWS, BUDGET>::kThreads, 1)
    sparse_mla_decode_ws_kernel(const KernelArgs args) {
  using Cfg = WsConfig<L, ROWS, BUDGET>;
  using LT = LayoutTraits<L>;
  constexpr int NT = Cfg::kNT;
  constexpr int kSlots = Cfg::kSlots;
  constexpr int kHalf = Cfg::kHalf;

  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16 *k_tiles = reinterpret_cast<__nv_bfloat16 *>(smem);  // [2][NT][kKStride]
  __nv_bfloat16 *p_s = reinterpret_cast<__nv_bfloat16 *>(smem + 2 * Cfg::kKBytes);
  float *red_max = reinterpret_cast<float *>(smem + 2 * Cfg::kKBytes + Cfg::kPBytes);
  float *red_sum = red_max + Cfg::kC * ROWS;
  uint8_t *k_valid = smem + 2 * Cfg::kKBytes + Cfg::kPBytes + Cfg::kRedBytes;  // [2][32]
  uint8_t *slot_raw = smem + Cfg::kFixed;                                       // [kSlots][kSlotBytes]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const BlockPos pos(args, ROWS);
  const int split = pos.split, token = pos.token, head0 = pos.head0;

  const TileCursor<NT> tiles(args, token, split);
  const int num_tiles = tiles.num_tiles();

  if (warp >= Cfg::kConsumerWarps) {
    // ---- Producers: records -> staging slots -> bf16 K tiles (TileCursor::issue_parts) ----
    if constexpr (Cfg::kRegSplit) setmaxnreg_dec<Cfg::kProducerRegs>();
    const int ptid = tid - Cfg::kConsumerThreads;
    const int hkey = (ptid >> 5) * Cfg::kPKPW + lane % Cfg::kPKPW;  // key within a half tile
    const int part = lane / Cfg::kPKPW;                               // part of that key's record
    const int n_half = 2 * num_tiles;
    uint8_t *my_row = slot_raw + hkey * LT::kRawStride;  // + slot * kSlotBytes
    // Per slot s, in registers and only ever indexed by constants (the loop below is unrolled by
    // kSlots, so that no value moves between registers and no load is waited for before its
    // use, kSlots half tiles later): the scales and valid flag of the record in flight into s, and
    // the cache slot of the next half tile to be copied into s.
    uint2 scales[kSlots];
    int next_slot[kSlots];
    uint32_t valid_bits = 0;
    auto load_index = [&](int h) { return h < n_half ? tiles.load_slot(h >> 1, (h & 1) * kHalf + hkey) : -1; };
#pragma unroll
    for (int s = 0; s < kSlots; ++s) next_slot[s] = load_index(s);
    auto issue = [&](int h, int s) {  // half tile h into slot s = h % kSlots
      const int2 loc = tiles.locate(h >> 1, (h & 1) * kHalf + hkey, next_slot[s]);
      scales[s] = tiles.template issue_parts<L, Cfg::kPTPK>(h >> 1, loc, my_row + s * Cfg::kSlotBytes, 0, part);
      valid_bits = (valid_bits & ~(1u << s)) | ((loc.x >= 0 ? 1u : 0u) << s);
    };
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      scales[s] = make_uint2(0u, 0u);
      if (s < n_half) issue(s, s);
      cp_async_commit();
      next_slot[s] = load_index(s + kSlots);
    }
    for (int h0 = 0; h0 < n_half; h0 += kSlots) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int h = h0 + s;
        if (h >= n_half) break;
        const int t = h >> 1;
        const int b = t & 1;
        // K tile b: free once the consumers are done with tile t - 2 (for t = 1: with Q).
        if ((h & 1) == 0 && t >= 1) named_barrier(Cfg::kBarEmpty + b, Cfg::kThreads);
        cp_async_wait<kSlots - 1>();  // this thread's copies of half h
        const int key = (h & 1) * kHalf + hkey;
        if (part == 0) k_valid[b * Cfg::kKValidBytes + key] = (valid_bits >> s) & 1u;
        dequant_record_scaled<L, Cfg::kPTPK>(my_row + s * Cfg::kSlotBytes, k_tiles + (b * NT + key) * Cfg::kKStride,
                                             part, scales[s]);
        asm volatile("" ::: "memory");  // the reads above come before the copies below overwrite them
        if (h + kSlots < n_half) issue(h + kSlots, s);
        cp_async_commit();
        next_slot[s] = load_index(h + 2 * kSlots);
        if (h & 1) named_barrier_arrive(Cfg::kBarFull + b, Cfg::kThreads);  // K tile b holds tile t
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---- Consumers ----
  if constexpr (Cfg::kRegSplit) setmaxnreg_inc<Cfg::kConsumerRegs>();
  __nv_bfloat16 *q_s = k_tiles + NT * Cfg::kKStride;  // K tile 1 until tile 1 arrives
  TileMath<Cfg> tm(warp, lane, q_s, p_s);
  {
    const __nv_bfloat16 *q_tok = args.q + static_cast<int64_t>(token) * args.q_stride_token;
    constexpr int kRowChunks = Cfg::kDK / 8;
    for (int item = tid; item < ROWS * kRowChunks; item += Cfg::kConsumerThreads) {
      const int r = item / kRowChunks;
      const int ch = item - r * kRowChunks;
      cp_async_16(smem_addr(q_s + r * Cfg::kQStride + ch * 8),
                  q_tok + static_cast<int64_t>(head0 + r) * args.q_stride_head + ch * 8, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    named_barrier(Cfg::kBarConsumer, Cfg::kConsumerThreads);
    tm.load_q();
    if (num_tiles >= 2) named_barrier_arrive(Cfg::kBarEmpty + 1, Cfg::kThreads);
  }
  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    named_barrier(Cfg::kBarFull + b, Cfg::kThreads);  // K tile b holds tile t; every consumer is past tile t - 1
    tm.attend(k_tiles + b * NT * Cfg::kKStride, k_valid + b * Cfg::kKValidBytes, p_s, red_max, args.scale_log2);
    if (t + 2 < num_tiles) named_barrier_arrive(Cfg::kBarEmpty + b, Cfg::kThreads);
  }
  tm.finish(args, red_sum, head0, token, split);
}

}  // namespace sparkseal::sparse_mla
