// Sparse-MLA decode with QK^T on e4m3 tensor cores (contract: include/sparkseal/sparse_mla.h,
// qk_mode FP8 and FP8X2), for the two fp8 cache layouts.
//
// Why: the bf16 kernel (sparse_mla_kernel.cuh) dequantises every staged record into a bf16 K tile
// in shared memory and reads that tile once per row group for S and again for P V; under GB10's
// 99 KB those writes and reads, the tile's 33 KB and the barrier around it were most of a tile's
// time. Here nothing is dequantised into shared memory:
//   - S = Q K^T: mma.sync m16n8k32 e4m3 x e4m3 -> f32 reads the staged fp8 values with ldmatrix
//     (b16 rows of 16 bytes give exactly the k32 B fragment), q's NoPE part quantised to e4m3 in
//     registers (per token and head, scale amax / 448; NQ = 2 adds the rounding residual as a
//     second e4m3 term of the same scale, for bf16-level accuracy). Each scale group's (V4: 64,
//     V3.2: 128 values) fp32 partial sum is multiplied by the key's scale of that group. The RoPE
//     part stays on bf16 mma (the staged bf16 values, q's bf16 values);
//   - O += P V on bf16 mma: ldmatrix.trans on the staged fp8 rows (pairs of bytes taken as b16)
//     yields, per thread, the e4m3 bytes of two keys x two adjacent columns; byte permutes turn
//     them into the bf16 B fragments of an "even columns" and an "odd columns" n-tile (values
//     scaled by 2^-120, exactly). The key's scale goes into P instead (bf16 A fragments times
//     2^(byte - 71) for V4, exact; times scale * 2^56 for V3.2), and the fp32 accumulators of
//     those columns hold O * 2^-64 until the end.
// Work split of the 8 warps: for S, warp w takes m16 tile w / kCQ of the CTA's heads and keys
// [(w % kCQ) * kNKW, +kNKW) of the tile; for P V, warp w takes all the CTA's heads and output
// columns [64 w, 64 w + 64), which for V4 is exactly scale group w (warp 7: the bf16 RoPE
// columns), so every V value is converted once per CTA.
// Online softmax as in the bf16 kernel (log2 domain); both roles keep their own copies of the
// running row maxima, updated from the same shared partial maxima, so they agree bit for bit.
//
// Per architecture:
//   - sm_120 / sm_121 (GB10): the block-scaled form mma.sync ... kind::mxf8f6f4.block_scale
//     .scale_vec::1X ... ue8m0 (SPARKSEAL_MXF8_BLOCK_SCALE), which issues at twice the rate of the
//     plain e4m3 form for the same product (as reported for sm_120). For V4 the key's ue8m0 byte of
//     each k32 block is the B operand's block scale, so one accumulator runs over all scale groups
//     with no float32 rescaling; q's scale stays a float32 applied to S (its block scale is the
//     identity byte 127). Compiled for sm_121a; it has not run on a GB10 yet (the GPU tests check
//     it there).
//   - sm_89: the plain e4m3 form.
//   - sm_90 (the H200 test machine): mma.sync on e4m3 is no tensor-core instruction there; ptxas
//     turns each m16n8k32 into conversions of both operands to f16 and two f16 m16n8k16,
//     re-converting q every tile. With two e4m3 terms (FP8X2) the products run as that f16 form
//     directly instead: the terms are summed once into f16 registers (exact: e4m3 values and their
//     two-term sums fit f16's 11 bits) and only K's bytes are converted, the k order of each k32
//     chunk permuted identically in q and K. With one term the emulated form stays (q's e4m3
//     fragments take half the registers; as f16 they spilled).
// Nothing here sits in an anonymous namespace or is `static` (see sparse_mla_kernel.cuh).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "sparse_mla_kernel.cuh"

// mma.sync m16n8k32 e4m3 runs on the tensor cores of sm_89 and sm_120 / sm_121 (QMMA); sm_90
// emulates it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
#define SPARKSEAL_E4M3_MMA_NATIVE 1
#else
#define SPARKSEAL_E4M3_MMA_NATIVE 0
#endif
// The block-scaled MXFP8 form: sm_120a / sm_121a (arch-specific features).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200 && __CUDA_ARCH__ < 1300 && \
    (defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL))
#define SPARKSEAL_MXF8_BLOCK_SCALE 1
#else
#define SPARKSEAL_MXF8_BLOCK_SCALE 0
#endif

namespace sparkseal::sparse_mla {

// D = A * B + D, m16n8k32, e4m3 inputs, fp32 accumulators (sm_89 and later).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B * 2^(byte kByteB of scale_b - 127) + D, m16n8k32 e4m3, fp32 accumulators: column n's
// B block scale is byte kByteB of scale_b in lane 4 n (thread-id 0 of each quad); A's is the
// identity. Without the block-scaled form, scale_b must be the identity and is not read.
template <int kByteB>
__device__ __forceinline__ void mma_e4m3_scaled(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                [[maybe_unused]] uint32_t scale_b) {
#if SPARKSEAL_MXF8_BLOCK_SCALE
  asm("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {%12, 0};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0x7f7f7f7fu), "r"(scale_b),
        "n"(kByteB));
#else
  mma_e4m3(d, a, b0, b1);
#endif
}

// mma_e4m3_scaled with the block-scale byte chosen by `byte` (a constant once the caller's loop is
// unrolled).
__device__ __forceinline__ void mma_e4m3_key_scaled(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                    uint32_t scale_b, int byte) {
  switch (byte) {
    case 0:
      mma_e4m3_scaled<0>(d, a, b0, b1, scale_b);
      break;
    case 1:
      mma_e4m3_scaled<1>(d, a, b0, b1, scale_b);
      break;
    case 2:
      mma_e4m3_scaled<2>(d, a, b0, b1, scale_b);
      break;
    default:
      mma_e4m3_scaled<3>(d, a, b0, b1, scale_b);
      break;
  }
}

// D = A * B + D, m16n8k16, f16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 bytes 0, 1 (lo) and 2, 3 (hi) of `w` -> f16x2 each, exactly.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t &lo, uint32_t &hi) {
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
  hi = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
}

// Four floats -> four e4m3 bytes (x0 in the lowest byte), round to nearest, saturating.
__device__ __forceinline__ uint32_t f32x4_to_e4m3x4(float x0, float x1, float x2, float x3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// Four e4m3 bytes -> their float values.
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float (&x)[4]) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&hi));
  x[0] = a.x;
  x[1] = a.y;
  x[2] = b.x;
  x[3] = b.y;
}

// 8-byte global load through the non-coherent path, at `p` + `dep` bytes: `dep` is an opaque zero
// that carries a dependency on earlier work, so that the loads of q's fragments are issued a
// chunk at a time instead of all ahead of their use (which held 112 registers at once).
__device__ __forceinline__ uint2 ldg_u2_after(const void *p, uint32_t dep) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(v.x), "=r"(v.y)
               : "l"(static_cast<const uint8_t *>(p) + dep));
  return v;
}

// An opaque 0 that depends on `x`.
__device__ __forceinline__ uint32_t zero_after(uint32_t x) {
  uint32_t z;
  asm volatile("and.b32 %0, %1, 0;\n" : "=r"(z) : "r"(x));
  return z;
}

// Bytes (b_lo, b_hi) of `t` laid out as [0, b_lo, 0, b_hi] -> bf16x2 of (e4m3(b_lo), e4m3(b_hi))
// times 2^-120, exactly (see e4m3x4_to_scaled_bf16).
__device__ __forceinline__ uint32_t spread_e4m3_to_scaled_bf16(uint32_t t) {
  return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 4);
}

template <int L, int ROWS, int NT, int NQ, int BUDGET>
struct Fp8Config {
  using T = LayoutTraits<L>;
  static constexpr bool kV4 = L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8;
  static constexpr int kRows = ROWS;
  static constexpr int kNT = NT;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRG = ROWS / 16;          // m16 tiles of heads
  static constexpr int kCQ = kWarps / kRG;       // S warps per m16 tile
  static constexpr int kNKW = NT / kCQ;          // S keys per warp
  static constexpr int kNTS = kNKW / 8;          // S n-tiles per warp
  static constexpr int kNopeKC = T::kNope / 32;  // k32 chunks of the NoPE product (14 or 16)
  static constexpr int kGroupCols = kV4 ? 64 : 128;
  static constexpr int kGroupKC = kGroupCols / 32;
  static constexpr int kGroups = T::kNope / kGroupCols;  // 7 or 4
  static constexpr int kScaleOff = kV4 ? T::kDataBytes : T::kNope;  // scales in the staging row
  static constexpr int kDVW = kDV / kWarps;      // P V output columns per warp: 64
  static constexpr int kPStride = NT + 8;        // elements; 16 bytes of padding for ldmatrix
  static constexpr int kPBytes = ROWS * kPStride * 2;
  static constexpr int kRedBytes = 2 * kCQ * ROWS * 4;  // partial row maxima and row sums
  // q's 64 bf16 RoPE values per head, read with ldmatrix for each n-tile (in registers they were
  // the 16 that made the two-term kernels spill).
  static constexpr int kQRStride = 64 + 8;  // elements
  static constexpr int kQRBytes = ROWS * kQRStride * 2;
  static constexpr int kFixed = kPBytes + kQRBytes + kRedBytes;
  // Copy of a tile: kTPK threads per key, lane % kKPW picking the key (see Config).
  static constexpr int kTPK = kThreads / NT;
  static constexpr int kKPW = 32 / kTPK;
  static constexpr int kRawBytes = NT * T::kRawStride;
  static constexpr int kStageValidBytes = ((NT + 15) / 16) * 16;
  // As many staging buffers as fit the budget (1 KiB kept back for the runtime), at most 4.
  static constexpr int kAvail = (BUDGET - 1024 - kFixed) / (kRawBytes + kStageValidBytes);
  static constexpr int kStages = kAvail > 4 ? 4 : kAvail;
  static constexpr int kSmem = kFixed + kStages * (kRawBytes + kStageValidBytes);

  static_assert(T::kFp8, "the e4m3 QK^T path reads fp8 records");
  static_assert(ROWS == 16 || ROWS == 32, "16 or 32 heads per CTA");
  static_assert(NQ == 1 || NQ == 2, "one or two e4m3 terms of q");
  static_assert(kNKW % 8 == 0, "each S warp needs whole 8-key n-tiles");
  static_assert(NT % 16 == 0, "P V runs over k16 chunks of keys");
  static_assert(kGroupKC % 2 == 0, "B fragments are loaded two k32 chunks at a time");
  static_assert(kV4 ? kGroups == kWarps - 1 : kGroups * 2 == kWarps, "P V warps align with scale groups");
  static_assert(kTPK * NT == kThreads && (kTPK == 4 || kTPK == 8), "4 or 8 threads per key");
  static_assert(kRawBytes % 16 == 0 && kPBytes % 16 == 0 && kQRBytes % 16 == 0, "16-byte aligned regions");
  static_assert(kStages >= 2, "configuration does not fit its shared-memory budget");
  static_assert(kSmem <= BUDGET - 1024, "configuration does not fit its shared-memory budget");
};

template <int L, int ROWS, int NT, int NQ, int BUDGET>
__global__ void __launch_bounds__(256, 1) sparse_mla_decode_fp8qk_kernel(const KernelArgs args) {
  using Cfg = Fp8Config<L, ROWS, NT, NQ, BUDGET>;
  using LT = LayoutTraits<L>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kStride = LT::kRawStride;
  constexpr int kRG = Cfg::kRG;
  constexpr int kCQ = Cfg::kCQ;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t *raw_base = smem;
  uint8_t *stage_valid_base = smem + kStages * Cfg::kRawBytes;
  __nv_bfloat16 *p_s = reinterpret_cast<__nv_bfloat16 *>(stage_valid_base + kStages * Cfg::kStageValidBytes);
  __nv_bfloat16 *qr_s = reinterpret_cast<__nv_bfloat16 *>(reinterpret_cast<uint8_t *>(p_s) + Cfg::kPBytes);
  float *red_max = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(qr_s) + Cfg::kQRBytes);
  float *red_sum = red_max + kCQ * ROWS;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int qrg = warp / kCQ;  // S role: m16 tile of heads
  const int qc = warp % kCQ;   // S role: key block

  const BlockPos pos(args, ROWS);
  const int split = pos.split, token = pos.token, head0 = pos.head0;

  // This CTA's tiles and where each comes from (as in the bf16 kernel).
  const TileCursor<NT> tiles(args, token, split);
  const int num_tiles = tiles.num_tiles();
  auto load_slot = [&](int i, int key) -> int { return tiles.load_slot(i, key); };
  auto locate = [&](int i, int key, int slot) -> int2 { return tiles.locate(i, key, slot); };

  constexpr int kTPK = Cfg::kTPK;
  const int ckey = warp * Cfg::kKPW + lane % Cfg::kKPW;
  const int csub = lane / Cfg::kKPW;

  auto issue_tile = [&](int i, int stage, int2 loc) {
    tiles.template issue_record<L, kTPK>(i, loc, raw_base + stage * Cfg::kRawBytes,
                                         stage_valid_base + stage * Cfg::kStageValidBytes, ckey, csub);
  };

  // ---- Prologue: q's RoPE values and the first kStages - 1 tiles in flight, then q's NoPE
  // fragments ----
  for (int item = tid; item < ROWS * 8; item += Cfg::kThreads) {  // 8 x 16 bytes per head
    const int r = item >> 3;
    cp_async_16(smem_addr(qr_s + r * Cfg::kQRStride + (item & 7) * 8),
                args.q + static_cast<int64_t>(token) * args.q_stride_token +
                    static_cast<int64_t>(head0 + r) * args.q_stride_head + LT::kNope + (item & 7) * 8,
                true);
  }
  {
    int slots[kStages - 1];
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) slots[st] = st < num_tiles ? load_slot(st, ckey) : -1;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < num_tiles) issue_tile(st, st, locate(st, ckey, slots[st]));
      cp_async_commit();
    }
  }
  int pf_slot = kStages - 1 < num_tiles ? load_slot(kStages - 1, ckey) : -1;

  // q's NoPE fragments for this warp's S rows (heads head0 + qrg*16 + g and + 8), as e4m3 straight
  // from global memory (m16n8k32 A layout: register j holds row g + 8 (j & 1), columns
  // 4 t4 .. 4 t4 + 3 + 16 (j >> 1) of the k32 chunk).
  // kF16Q: f16 A fragments of the two k16 halves of each k32 chunk instead (see the top of this
  // file): half v takes register j's 4 values (row g + 8 (j & 1), columns 4 t4 .. 4 t4 + 3 + 16 v)
  // as k 2 t4, 2 t4 + 1 (a[j & 1]) and 2 t4 + 8, 2 t4 + 9 (a[2 + (j & 1)]), matching the f16 B
  // fragments made from K's bytes below.
  constexpr bool kF16Q = !SPARKSEAL_E4M3_MMA_NATIVE && NQ == 2;
  // V4 with the block-scaled form: the keys' ue8m0 bytes scale the products inside the MMA.
  constexpr bool kKeyScaleInMma = SPARKSEAL_MXF8_BLOCK_SCALE && Cfg::kV4;
  [[maybe_unused]] uint32_t qa[kF16Q ? 1 : NQ][kF16Q ? 1 : Cfg::kNopeKC][4];
  [[maybe_unused]] uint32_t qh[kF16Q ? Cfg::kNopeKC : 1][2][4];
  float q_scale[2];
  {
    const __nv_bfloat16 *q_row[2];
    q_row[0] = args.q + static_cast<int64_t>(token) * args.q_stride_token +
               static_cast<int64_t>(head0 + qrg * 16 + g) * args.q_stride_head;
    q_row[1] = q_row[0] + 8 * args.q_stride_head;
    float amax[2] = {0.f, 0.f};
#pragma unroll 2
    for (int kc = 0; kc < Cfg::kNopeKC; ++kc) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(q_row[j & 1] + kc * 32 + (j >> 1) * 16 + 4 * t4));
        const float2 x01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.x));
        const float2 x23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.y));
        amax[j & 1] = fmaxf(amax[j & 1], fmaxf(fmaxf(fabsf(x01.x), fabsf(x01.y)), fmaxf(fabsf(x23.x), fabsf(x23.y))));
      }
    }
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
      q_scale[h] = amax[h] * (1.f / 448.f);
      inv[h] = amax[h] > 0.f ? 448.f / amax[h] : 0.f;
    }
    uint32_t dep = 0;
#pragma unroll
    for (int kc = 0; kc < Cfg::kNopeKC; ++kc) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint2 v = ldg_u2_after(q_row[j & 1] + kc * 32 + (j >> 1) * 16 + 4 * t4, dep);
        const float2 x01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.x));
        const float2 x23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v.y));
        const float s = inv[j & 1];
        const float x[4] = {x01.x * s, x01.y * s, x23.x * s, x23.y * s};
        const uint32_t hi = f32x4_to_e4m3x4(x[0], x[1], x[2], x[3]);
        float h[4];
        e4m3x4_to_f32(hi, h);
        [[maybe_unused]] uint32_t lo = 0;
        if constexpr (NQ == 2) lo = f32x4_to_e4m3x4(x[0] - h[0], x[1] - h[1], x[2] - h[2], x[3] - h[3]);
        if constexpr (!kF16Q) {
          qa[0][kc][j] = hi;
          if constexpr (NQ == 2) qa[1][kc][j] = lo;
        } else {
          float l[4];
          e4m3x4_to_f32(lo, l);
#pragma unroll
          for (int e = 0; e < 4; ++e) h[e] += l[e];  // exact in float32, and in f16 below
          const __half2 h01 = __floats2half2_rn(h[0], h[1]);
          const __half2 h23 = __floats2half2_rn(h[2], h[3]);
          qh[kc][j >> 1][j & 1] = *reinterpret_cast<const uint32_t *>(&h01);
          qh[kc][j >> 1][2 + (j & 1)] = *reinterpret_cast<const uint32_t *>(&h23);
        }
      }
      if constexpr (kF16Q) {
        dep = zero_after(qh[kc][1][3]);
      } else {
        dep = zero_after(qa[NQ - 1][kc][3]);
      }
    }
  }

  // ---- Per-thread state ----
  float o_acc[kRG][8][4];
#pragma unroll
  for (int mt = 0; mt < kRG; ++mt)
#pragma unroll
    for (int n = 0; n < 8; ++n) o_acc[mt][n][0] = o_acc[mt][n][1] = o_acc[mt][n][2] = o_acc[mt][n][3] = 0.f;
  float m_q[2] = {kNegInf, kNegInf};  // S role: running maxima of rows qrg*16 + g (+ 8)
  float l_q[2] = {0.f, 0.f};          // S role: this thread's share of their sums
  float m_pv[kRG][2];                 // P V role: running maxima of rows mt*16 + g (+ 8)
#pragma unroll
  for (int mt = 0; mt < kRG; ++mt) m_pv[mt][0] = m_pv[mt][1] = kNegInf;

  const int row_q = qrg * 16 + g;
  const int key_w0 = qc * Cfg::kNKW;
  const int col_w0 = warp * Cfg::kDVW;
  // V4: warp 7's output columns are the 64 bf16 RoPE values; every other warp's are fp8 values.
  const bool pv_rope = Cfg::kV4 && warp == Cfg::kWarps - 1;
  const int pv_group = Cfg::kV4 ? warp : warp >> 1;
  const uint32_t p_base = smem_addr(p_s + (lane & 15) * Cfg::kPStride + (lane >> 4) * 8);
  const uint32_t qr_base = smem_addr(qr_s + (qrg * 16 + (lane & 15)) * Cfg::kQRStride + (lane >> 4) * 8);
  // ldmatrix(.trans) row of this lane in a 16-key block: keys (lane & 7) + 8 ((lane >> 3) & 1).
  const int v_key = (lane & 7) + ((lane >> 3) & 1) * 8;

  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; every warp is done with tile it - 1 and its P
    {
      const int next = it + kStages - 1;
      if (next < num_tiles) issue_tile(next, next % kStages, locate(next, ckey, pf_slot));
      cp_async_commit();
      if (next + 1 < num_tiles) pf_slot = load_slot(next + 1, ckey);
    }
    const uint8_t *raw = raw_base + stage * Cfg::kRawBytes;
    const uint8_t *valid = stage_valid_base + stage * Cfg::kStageValidBytes;

    // ---- S role: S = Q K^T for rows qrg*16 .. +15 x keys key_w0 .. + kNKW ----
    float s[Cfg::kNTS][4];
#pragma unroll
    for (int n = 0; n < Cfg::kNTS; ++n) {
      const int kb = key_w0 + n * 8;
      const uint8_t *lrow = raw + (kb + (lane & 7)) * kStride + (lane >> 3) * 16;  // ldmatrix row
      const uint8_t *srow = raw + (kb + 2 * t4) * kStride + Cfg::kScaleOff;         // key 2 t4's scales
      float nope[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (kKeyScaleInMma) {
        // Key kb + g's seven ue8m0 bytes: the block scales of its k32 blocks (lane 4 g supplies
        // them for column g).
        const uint2 kscale = *reinterpret_cast<const uint2 *>(raw + (kb + g) * kStride + Cfg::kScaleOff);
#pragma unroll
        for (int gi = 0; gi < Cfg::kGroups; ++gi) {
          const uint32_t sc = gi < 4 ? kscale.x : kscale.y;
#pragma unroll
          for (int kp = 0; kp < Cfg::kGroupKC / 2; ++kp) {
            const int kc = gi * Cfg::kGroupKC + 2 * kp;
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(lrow + kc * 32));
#pragma unroll
            for (int qi = 0; qi < NQ; ++qi) {
              mma_e4m3_key_scaled(nope, qa[qi][kc], b[0], b[1], sc, gi & 3);
              mma_e4m3_key_scaled(nope, qa[qi][kc + 1], b[2], b[3], sc, gi & 3);
            }
          }
        }
      } else {
#pragma unroll
        for (int gi = 0; gi < Cfg::kGroups; ++gi) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int kp = 0; kp < Cfg::kGroupKC / 2; ++kp) {
            const int kc = gi * Cfg::kGroupKC + 2 * kp;
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(lrow + kc * 32));
            if constexpr (kF16Q) {
#pragma unroll
              for (int c = 0; c < 2; ++c) {
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                  uint32_t lo, hi;
                  e4m3x4_to_f16x2(b[2 * c + v], lo, hi);
                  mma_f16(acc, qh[kc + c][v], lo, hi);
                }
              }
            } else {
#pragma unroll
              for (int qi = 0; qi < NQ; ++qi) {
                mma_e4m3_scaled<0>(acc, qa[qi][kc], b[0], b[1], 0x7f7f7f7fu);
                mma_e4m3_scaled<0>(acc, qa[qi][kc + 1], b[2], b[3], 0x7f7f7f7fu);
              }
            }
          }
          // The group's scale of keys 2 t4 and 2 t4 + 1, read where it is used (fewer live registers).
          float ks[2];
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if constexpr (Cfg::kV4) {
              ks[k] = ue8m0_to_float(srow[k * kStride + gi]);
            } else {
              ks[k] = *reinterpret_cast<const float *>(srow + k * kStride + 4 * gi);
            }
          }
          nope[0] += acc[0] * ks[0];
          nope[1] += acc[1] * ks[1];
          nope[2] += acc[2] * ks[0];
          nope[3] += acc[3] * ks[1];
        }
      }
      float rope[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int rp = 0; rp < 2; ++rp) {
        uint32_t b[4];
        uint32_t a0[4], a1[4];
        ldmatrix_x4(b, smem_addr(lrow + LT::kRopeSrc + rp * 64));
        ldmatrix_x4(a0, qr_base + rp * 64);
        ldmatrix_x4(a1, qr_base + rp * 64 + 32);
        mma_bf16(rope, a0, b[0], b[1]);
        mma_bf16(rope, a1, b[2], b[3]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = kb + 2 * t4 + (j & 1);
        s[n][j] = valid[key] ? (nope[j] * q_scale[j >> 1] + rope[j]) * args.scale_log2 : kNegInf;
      }
    }

    // ---- Row maxima over the S warps of the m16 tile ----
    {
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int n = 0; n < Cfg::kNTS; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) mx[j >> 1] = fmaxf(mx[j >> 1], s[n][j]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      }
      if (t4 == 0) {
        red_max[qc * ROWS + row_q] = mx[0];
        red_max[qc * ROWS + row_q + 8] = mx[1];
      }
    }
    named_barrier(1 + qrg, kCQ * 32);

    // ---- S role: P = exp2(S - m) to shared memory, row sums ----
    {
      float m_use[2], alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m_new = m_q[h];
#pragma unroll
        for (int c = 0; c < kCQ; ++c) m_new = fmaxf(m_new, red_max[c * ROWS + row_q + 8 * h]);
        m_use[h] = m_new == kNegInf ? 0.f : m_new;
        alpha[h] = fast_exp2(m_q[h] - m_use[h]);
        m_q[h] = m_new;
      }
      float psum[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < Cfg::kNTS; ++n) {
        const float p0 = fast_exp2(s[n][0] - m_use[0]);
        const float p1 = fast_exp2(s[n][1] - m_use[0]);
        const float p2 = fast_exp2(s[n][2] - m_use[1]);
        const float p3 = fast_exp2(s[n][3] - m_use[1]);
        psum[0] += p0 + p1;
        psum[1] += p2 + p3;
        const int key = key_w0 + n * 8 + 2 * t4;
        *reinterpret_cast<uint32_t *>(p_s + row_q * Cfg::kPStride + key) = pack_bf16x2(p0, p1);
        *reinterpret_cast<uint32_t *>(p_s + (row_q + 8) * Cfg::kPStride + key) = pack_bf16x2(p2, p3);
      }
      l_q[0] = l_q[0] * alpha[0] + psum[0];
      l_q[1] = l_q[1] * alpha[1] + psum[1];
    }
    __syncthreads();  // P and every row's partial maxima of this tile are in shared memory

    // ---- P V role: rescale O where a row maximum moved, then O += P V ----
    {
      bool moved = false;
      float alpha[kRG][2];
#pragma unroll
      for (int mt = 0; mt < kRG; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mt * 16 + g + 8 * h;
          float m_new = m_pv[mt][h];
#pragma unroll
          for (int c = 0; c < kCQ; ++c) m_new = fmaxf(m_new, red_max[c * ROWS + row]);
          const float m_use = m_new == kNegInf ? 0.f : m_new;
          alpha[mt][h] = fast_exp2(m_pv[mt][h] - m_use);
          m_pv[mt][h] = m_new;
          moved |= alpha[mt][h] != 1.f;
        }
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < kRG; ++mt) {
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            o_acc[mt][n][0] *= alpha[mt][0];
            o_acc[mt][n][1] *= alpha[mt][0];
            o_acc[mt][n][2] *= alpha[mt][1];
            o_acc[mt][n][3] *= alpha[mt][1];
          }
        }
      }
    }
    if (pv_rope) {
      // bf16 values: ldmatrix.trans rows keys v_key, columns 448 + 8 (lane >> 4) (+ 16 np).
      const uint32_t v_base = smem_addr(raw + v_key * kStride + LT::kRopeSrc + (lane >> 4) * 16);
#pragma unroll 1
      for (int kc = 0; kc < NT / 16; ++kc) {
        uint32_t a[kRG][4];
#pragma unroll
        for (int mt = 0; mt < kRG; ++mt) ldmatrix_x4(a[mt], p_base + (mt * 16 * Cfg::kPStride + kc * 16) * 2);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_base + kc * 16 * kStride + np * 32);
#pragma unroll
          for (int mt = 0; mt < kRG; ++mt) {
            mma_bf16(o_acc[mt][2 * np], a[mt], b[0], b[1]);
            mma_bf16(o_acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    } else {
      // e4m3 values: ldmatrix.trans of 16 keys x 32 bytes gives this thread, per 8 x 16-byte
      // matrix, keys 2 t4 and 2 t4 + 1 of columns 2 g and 2 g + 1; n-tile 4 blk + 2 h + 0 takes the
      // even columns of the blk-th 32 and its h-th 16, + 1 the odd ones.
      const uint32_t v_base = smem_addr(raw + v_key * kStride + col_w0 + (lane >> 4) * 16);
      // Not unrolled: the chunks index nothing held in registers, and unrolled, their loads were
      // all hoisted ahead (register spills with 32 heads x 64 keys).
#pragma unroll 1
      for (int kc = 0; kc < NT / 16; ++kc) {
        // The scale of each of this thread's four keys of the chunk (A fragment columns 2 t4,
        // 2 t4 + 1, 2 t4 + 8, 2 t4 + 9), as a bf16 multiplier of P.
        uint32_t mul[2];
        {
          const uint8_t *k0 = raw + (kc * 16 + 2 * t4) * kStride + Cfg::kScaleOff;
          if constexpr (Cfg::kV4) {
            uint32_t e[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) e[k] = k0[((k >> 1) * 8 + (k & 1)) * kStride + pv_group];
            // bf16 bits of 2^(e - 71): exponent field e + 56.
            mul[0] = ((e[0] + 56u) << 7) | ((e[1] + 56u) << 23);
            mul[1] = ((e[2] + 56u) << 7) | ((e[3] + 56u) << 23);
          } else {
            float f[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              f[k] = *reinterpret_cast<const float *>(k0 + ((k >> 1) * 8 + (k & 1)) * kStride + 4 * pv_group);
            }
            mul[0] = pack_bf16x2(f[0] * 0x1p56f, f[1] * 0x1p56f);
            mul[1] = pack_bf16x2(f[2] * 0x1p56f, f[3] * 0x1p56f);
          }
        }
        uint32_t a[kRG][4];
#pragma unroll
        for (int mt = 0; mt < kRG; ++mt) {
          ldmatrix_x4(a[mt], p_base + (mt * 16 * Cfg::kPStride + kc * 16) * 2);
          a[mt][0] = bf16x2_mul(a[mt][0], mul[0]);
          a[mt][1] = bf16x2_mul(a[mt][1], mul[0]);
          a[mt][2] = bf16x2_mul(a[mt][2], mul[1]);
          a[mt][3] = bf16x2_mul(a[mt][3], mul[1]);
        }
#pragma unroll
        for (int blk = 0; blk < 2; ++blk) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, v_base + kc * 16 * kStride + blk * 32);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t even0 = spread_e4m3_to_scaled_bf16(__byte_perm(r[2 * h], 0u, 0x2404));
            const uint32_t even1 = spread_e4m3_to_scaled_bf16(__byte_perm(r[2 * h + 1], 0u, 0x2404));
            const uint32_t odd0 = spread_e4m3_to_scaled_bf16(__byte_perm(r[2 * h], 0u, 0x3414));
            const uint32_t odd1 = spread_e4m3_to_scaled_bf16(__byte_perm(r[2 * h + 1], 0u, 0x3414));
#pragma unroll
            for (int mt = 0; mt < kRG; ++mt) {
              mma_bf16(o_acc[mt][4 * blk + 2 * h], a[mt], even0, even1);
              mma_bf16(o_acc[mt][4 * blk + 2 * h + 1], a[mt], odd0, odd1);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- Row sums over the quad and the S warps of each m16 tile ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_q[h] += __shfl_xor_sync(0xffffffffu, l_q[h], 1);
    l_q[h] += __shfl_xor_sync(0xffffffffu, l_q[h], 2);
  }
  if (t4 == 0) {
    red_sum[qc * ROWS + row_q] = l_q[0];
    red_sum[qc * ROWS + row_q + 8] = l_q[1];
  }
  __syncthreads();
  float l_tot[kRG][2];
#pragma unroll
  for (int mt = 0; mt < kRG; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = 0.f;
#pragma unroll
      for (int c = 0; c < kCQ; ++c) l += red_sum[c * ROWS + mt * 16 + g + 8 * h];
      l_tot[mt][h] = l;
    }
  }
  // The fp8 columns' accumulators hold O * 2^-64 (the scale folded into P).
  const float o_fix = pv_rope ? 1.f : 0x1p64f;

  // Column of o_acc[mt][n][j] (j < 2: row g, else g + 8), and whether j + 1 is the next column.
  // fp8 columns: n = 4 blk + 2 h + odd -> col_w0 + 32 blk + 16 h + 4 t4 + 2 (j & 1) + odd;
  // RoPE columns: the m16n8 layout, col_w0 + 8 n + 2 t4 + (j & 1).
  const bool single = args.num_splits == 1;
#pragma unroll
  for (int mt = 0; mt < kRG; ++mt) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = head0 + mt * 16 + g + 8 * h;
      float denom = l_tot[mt][h];
      if (single && args.sink != nullptr) {
        const float m_use = m_pv[mt][h] == kNegInf ? 0.f : m_pv[mt][h];
        denom += fast_exp2(args.sink[head] * kLog2e - m_use);
      }
      inv[h] = (denom > 0.f ? 1.f / denom : 0.f) * o_fix;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + g + 8 * h;
      const float v = inv[h];
      if (single) {
        __nv_bfloat16 *out = args.out + static_cast<int64_t>(token) * args.out_stride_token +
                             static_cast<int64_t>(head0 + row) * args.out_stride_head;
        if (pv_rope) {
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            *reinterpret_cast<uint32_t *>(out + col_w0 + n * 8 + 2 * t4) =
                pack_bf16x2(o_acc[mt][n][2 * h] * v, o_acc[mt][n][2 * h + 1] * v);
          }
        } else {
#pragma unroll
          for (int q4 = 0; q4 < 4; ++q4) {  // q4 = 2 blk + hh
            const float *e = o_acc[mt][2 * q4];
            const float *o = o_acc[mt][2 * q4 + 1];
            *reinterpret_cast<uint2 *>(out + col_w0 + 16 * q4 + 4 * t4) =
                make_uint2(pack_bf16x2(e[2 * h] * v, o[2 * h] * v), pack_bf16x2(e[2 * h + 1] * v, o[2 * h + 1] * v));
          }
        }
      } else {
        const int64_t row_base = (static_cast<int64_t>(split) * args.num_tokens + token) * args.num_heads + head0;
        float *ws = args.ws_o + (row_base + row) * kDV;
        if (pv_rope) {
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            *reinterpret_cast<float2 *>(ws + col_w0 + n * 8 + 2 * t4) =
                make_float2(o_acc[mt][n][2 * h] * v, o_acc[mt][n][2 * h + 1] * v);
          }
        } else {
#pragma unroll
          for (int q4 = 0; q4 < 4; ++q4) {
            const float *e = o_acc[mt][2 * q4];
            const float *o = o_acc[mt][2 * q4 + 1];
            *reinterpret_cast<float4 *>(ws + col_w0 + 16 * q4 + 4 * t4) =
                make_float4(e[2 * h] * v, o[2 * h] * v, e[2 * h + 1] * v, o[2 * h + 1] * v);
          }
        }
      }
    }
  }
  if (warp == 0 && t4 == 0) {
#pragma unroll
    for (int mt = 0; mt < kRG; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mt * 16 + g + 8 * h;
        const float l = l_tot[mt][h];
        if (single) {
          args.lse[static_cast<int64_t>(token) * args.lse_stride_token + head0 + row] =
              l > 0.f ? (m_pv[mt][h] + __log2f(l)) * kLn2 : SPARKSEAL_SPARSE_MLA_EMPTY_LSE;
        } else {
          const int64_t row_base = (static_cast<int64_t>(split) * args.num_tokens + token) * args.num_heads + head0;
          args.ws_lse[row_base + row] = l > 0.f ? (m_pv[mt][h] + __log2f(l)) * kLn2 : kNegInf;
        }
      }
    }
  }
}

}  // namespace sparkseal::sparse_mla
