// Sparse-MLA decode kernels (contract and byte layouts: include/sparkseal/sparse_mla.h).
//
// One CTA = one token x ROWS heads x a contiguous range of KV tiles of NT keys. Per tile:
//   1. cp.async copies the tile's raw cache records (fp8 + scales + bf16 RoPE, or bf16) into a
//      ring of up to 3 shared-memory staging buffers, that many tiles ahead; invalid entries are
//      zero-filled and never read from global memory. kThreads / NT threads own each key: they
//      load its index one iteration before it is needed, compute its (page, offset) in
//      registers and copy fixed 16-byte parts of its record, so the copy loop has no division
//      and waits on no global load;
//   2. the same threads dequantise their key's parts of the oldest staged tile into a bf16 K
//      tile in shared memory (byte permutes turn e4m3 into bf16 scaled by 2^-120, then one
//      bf16x2 multiply by the ue8m0 power of two (V4, exact) or a float32 multiply by the scale
//      (V3.2));
//   3. warp (rg, c) of the (ROWS/16) x C warp grid computes S = Q K^T for its 16 heads and its
//      NT/C keys with mma.sync m16n8k16 (bf16 in, fp32 accumulate); the C warps of a row group
//      exchange row maxima, write P = exp(S - m) as bf16 to shared memory, and each then
//      accumulates O += P V for all NT keys and its 512/C output columns (V = the K tile's first
//      512 columns, read with ldmatrix.trans). Where they fit (Config::kQInRegs), each warp holds
//      its Q fragments in registers for the whole CTA and keeps no Q tile in shared memory.
// Online softmax runs in the log2 domain (scores pre-multiplied by softmax_scale * log2(e)).
// With one split the CTA writes bf16 out and lse; with several it writes float32 partials
// (O / l and lse) to the workspace, merged by sparse_mla_combine_kernel.
//
// Only mma.sync, ldmatrix and cp.async are used (sm_80 and later), so the same code runs on
// SM121 (no wgmma) and on sm_90a; the shared-memory budget selects the tile configuration.
//
// Nothing here sits in an anonymous namespace or is `static`: nvcc names such entities after a
// hash of the build path, which would make the library's bytes depend on where it was built.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sparkseal/sparse_mla.h"

namespace sparkseal::sparse_mla {

constexpr int kDV = SPARKSEAL_SPARSE_MLA_V_DIM;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();
// Per-block shared-memory budgets of the two configuration classes: the sm_90 opt-in limit
// (227 KiB) and the SM120/SM121 one (99 KiB).
constexpr int kBigSmem = 232448;
constexpr int kSmallSmem = 101376;

// ---------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------
template <int L>
struct LayoutTraits;

template <>
struct LayoutTraits<SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8> {
  static constexpr int kDK = 512;          // q / K width
  static constexpr int kNope = 448;        // fp8 values per record
  static constexpr int kRecordBytes = 584;
  static constexpr int kDataBytes = 576;   // per-token part at offset * 576 in the page
  static constexpr int kRawStride = 592;   // staging row: 576 data bytes, 8 scale bytes, 8 pad
  static constexpr int kCopyChunks = 37;   // 36 x 16-byte data chunks + 1 x 8-byte scale chunk
  static constexpr int kFp8Chunks = 28;    // 16-value fp8 chunks to dequantise
  static constexpr int kRopeSrc = 448;     // RoPE byte offset in the staging row
  static constexpr bool kFp8 = true;
};

template <>
struct LayoutTraits<SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8> {
  static constexpr int kDK = 576;
  static constexpr int kNope = 512;
  static constexpr int kRecordBytes = 656;
  static constexpr int kDataBytes = 656;
  static constexpr int kRawStride = 656;
  static constexpr int kCopyChunks = 41;
  static constexpr int kFp8Chunks = 32;
  static constexpr int kRopeSrc = 528;
  static constexpr bool kFp8 = true;
};

template <>
struct LayoutTraits<SPARKSEAL_SPARSE_MLA_LAYOUT_V32_BF16> {
  static constexpr int kDK = 576;
  static constexpr int kNope = 0;
  static constexpr int kRecordBytes = 1152;
  static constexpr int kDataBytes = 1152;
  static constexpr int kRawStride = 1168;  // 16 bytes of padding: 8 rows hit 8 distinct bank groups
  static constexpr int kCopyChunks = 72;
  static constexpr int kFp8Chunks = 0;
  static constexpr int kRopeSrc = 0;
  static constexpr bool kFp8 = false;
};

// ---------------------------------------------------------------------------------------------
// Kernel arguments (passed by value)
// ---------------------------------------------------------------------------------------------
struct CacheArgs {
  const uint8_t *data;
  int64_t page_stride;   // bytes
  int64_t num_slots;     // num_pages * page_size
  const int32_t *indices;
  int64_t indices_stride;
  const int32_t *lengths;  // may be null
  int32_t page_size;
  int32_t topk;
  int32_t num_tiles;     // topk / NT
};

struct KernelArgs {
  const __nv_bfloat16 *q;
  int64_t q_stride_token;
  int64_t q_stride_head;
  CacheArgs cache[2];
  int32_t num_caches;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t head_groups;   // num_heads / ROWS
  int32_t num_splits;
  int32_t tiles_per_split;
  float scale_log2;      // softmax_scale * log2(e)
  const float *sink;     // may be null
  __nv_bfloat16 *out;
  int64_t out_stride_token;
  int64_t out_stride_head;
  float *lse;
  int64_t lse_stride_token;
  float *ws_o;           // [splits][tokens][heads][512]
  float *ws_lse;         // [splits][tokens][heads]
};

// ---------------------------------------------------------------------------------------------
// Configuration: shared-memory layout and sizes
// ---------------------------------------------------------------------------------------------
template <int L, int ROWS, int NT, int C, int BUDGET>
struct Config {
  using T = LayoutTraits<L>;
  static constexpr int kRows = ROWS;
  static constexpr int kNT = NT;
  static constexpr int kC = C;
  static constexpr int kRG = ROWS / 16;
  static constexpr int kWarps = kRG * C;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDK = T::kDK;
  static constexpr int kNKW = NT / C;      // S keys per warp
  static constexpr int kNTS = kNKW / 8;    // S n-tiles per warp
  static constexpr int kDVW = kDV / C;     // output columns per warp
  static constexpr int kNTO = kDVW / 8;    // output n-tiles per warp
  static constexpr int kKC = kDK / 16;     // k16 chunks of the QK^T product
  // Independent S accumulator sets, so that each warp keeps >= 4 mma chains in flight.
  static constexpr int kNAcc = kNTS >= 4 ? 1 : 4 / kNTS;
  // Q fragments stay in registers when they fit beside the output accumulators (kKC * 4 + kNTO * 4
  // of the 255 registers a thread may hold, the rest kept for the S accumulators, addresses and
  // the softmax state). Such configurations keep no Q tile in shared memory: Q passes once
  // through the K tile's space (ROWS <= NT rows of the same stride) before the first tile, the
  // freed bytes go to staging buffers, and the S loop reads only K from shared memory.
  static constexpr int kQFragRegs = kKC * 4;
  // 208 fits V3.2's 576-wide Q (144 registers) beside 64 accumulators with the fp8 loaders of
  // 8 threads per key; the loaders of 4 threads per key or of bf16 records hold more copy state
  // and spill at 208 (ptxas -v).
  static constexpr int kMaxQAccRegs = T::kFp8 && kThreads / NT == 8 ? 208 : 200;
  static constexpr bool kQInRegs = kQFragRegs + kNTO * 4 <= kMaxQAccRegs && ROWS <= NT;
  // Row strides padded by 16 bytes so that ldmatrix row addresses hit distinct bank groups.
  static constexpr int kQStride = kDK + 8;     // elements
  static constexpr int kKStride = kDK + 8;     // elements
  static constexpr int kPStride = NT + 8;      // elements
  static constexpr int kQBytes = kQInRegs ? 0 : ROWS * kQStride * 2;
  static constexpr int kKBytes = NT * kKStride * 2;
  static constexpr int kPBytes = ROWS * kPStride * 2;
  static constexpr int kRedBytes = 2 * C * ROWS * 4;    // row max and row sum exchange
  static constexpr int kValidBytes = NT;                // current tile's key-valid flags
  static constexpr int kRawBytes = NT * T::kRawStride;  // one staging buffer
  static constexpr int kFixed = kQBytes + kKBytes + kPBytes + kRedBytes + ((kValidBytes + 15) / 16) * 16;
  // Copy and dequantisation: kTPK threads per key; a warp's lanes cover kKPW keys, lane % kKPW
  // picking the key, so that 8 consecutive lanes touch 8 different rows (distinct bank groups).
  static constexpr int kTPK = kThreads / NT;
  static constexpr int kKPW = 32 / kTPK;
  static constexpr int kStageValidBytes = ((NT + 15) / 16) * 16;
  // As many staging buffers as fit the budget (1 KiB kept back for the runtime), at most 3.
  static constexpr int kAvail = (BUDGET - 1024 - kFixed) / (kRawBytes + kStageValidBytes);
  static constexpr int kStages = kAvail > 3 ? 3 : kAvail;
  static constexpr int kSmem = kFixed + kStages * (kRawBytes + kStageValidBytes);

  static_assert(ROWS % 16 == 0 && ROWS >= 16, "ROWS must be a multiple of 16");
  static_assert(NT % (8 * C) == 0, "each warp needs whole 8-key n-tiles");
  static_assert(NT % 16 == 0, "PV runs over k16 chunks of keys");
  static_assert(kNTO % 2 == 0, "output n-tiles are loaded in pairs");
  static_assert(kNTS == 1 || kNTS % 2 == 0, "S n-tiles are loaded singly or in pairs");
  static_assert(!kQInRegs || kQStride == kKStride, "Q passes through the K tile's rows");
  static_assert(kStages >= 1, "configuration does not fit its shared-memory budget");
  static_assert(kTPK * NT == kThreads && (kTPK == 4 || kTPK == 8), "4 or 8 threads per key");
  static_assert(kSmem <= BUDGET - 1024, "configuration does not fit its shared-memory budget");
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_8(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 8 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A * B + D, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

// 2^x via the SFU (exact 0 for -inf).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four e4m3 bytes -> two bf16x2 words holding each value times 2^-120, exactly (subnormals too):
// the e4m3 sign goes to bit 15 and its 7 exponent-and-mantissa bits to bits 4..10 of the bf16.
__device__ __forceinline__ void e4m3x4_to_scaled_bf16(uint32_t w, uint32_t &lo, uint32_t &hi) {
  const uint32_t t0 = __byte_perm(w, 0u, 0x1404);  // bytes [0, b0, 0, b1]
  const uint32_t t1 = __byte_perm(w, 0u, 0x3424);  // bytes [0, b2, 0, b3]
  lo = (t0 & 0x80008000u) | ((t0 >> 4) & 0x07f007f0u);
  hi = (t1 & 0x80008000u) | ((t1 >> 4) & 0x07f007f0u);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<uint32_t *>(&r);
}

// 16 e4m3 values times a power of two 2^(e - 127) (V4's ue8m0 scale byte e) -> 16 bf16, exact.
// Valid for e <= 134 (the multiplier 2^(e - 7) must be a finite bf16).
__device__ __forceinline__ void dequant16_pow2(const uint4 v, uint32_t e, uint32_t (&o)[8]) {
  const uint32_t m = (e + 120u) << 7;  // bf16 bits of 2^(e - 7) = 2^120 * 2^(e - 127)
  const uint32_t mul = m | (m << 16);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    e4m3x4_to_scaled_bf16(w[j], lo, hi);
    o[2 * j] = bf16x2_mul(lo, mul);
    o[2 * j + 1] = bf16x2_mul(hi, mul);
  }
}

// 16 e4m3 values times a float32 scale -> 16 bf16 (the float32 product rounded to bf16).
__device__ __forceinline__ void dequant16_f32(const uint4 v, float scale, uint32_t (&o)[8]) {
  constexpr uint32_t kTwo60 = 0x5d805d80u;  // bf16x2 of 2^60: lifts e4m3 * 2^-120 into normal floats
  const float s = scale * 0x1p60f;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    e4m3x4_to_scaled_bf16(w[j], lo, hi);
    lo = bf16x2_mul(lo, kTwo60);
    hi = bf16x2_mul(hi, kTwo60);
    o[2 * j] = pack_bf16x2(__uint_as_float(lo << 16) * s, __uint_as_float(lo & 0xffff0000u) * s);
    o[2 * j + 1] = pack_bf16x2(__uint_as_float(hi << 16) * s, __uint_as_float(hi & 0xffff0000u) * s);
  }
}

// ue8m0 byte -> 2^(byte - 127) (byte 0 gives the subnormal 2^-127).
__device__ __forceinline__ float ue8m0_to_float(uint32_t byte) {
  return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(byte << 23);
}

// Part `csub` (of TPK threads per key) of one staged record `row` -> the key's bf16 K row `krow`:
// the fp8 values dequantised with their group's scale, the bf16 RoPE (or a bf16 record) copied.
// `sc8`: V4's 7 ue8m0 scale bytes of the record (dequant_record reads them from the staging row;
// the warp-specialised producers hold them in registers).
template <int L, int TPK>
__device__ __forceinline__ void dequant_record_scaled(const uint8_t *row, __nv_bfloat16 *krow, int csub,
                                                      [[maybe_unused]] uint2 sc8) {
  using LT = LayoutTraits<L>;
  static_assert(LT::kFp8 || LT::kCopyChunks % TPK == 0, "bf16 rows split evenly");
  if constexpr (LT::kFp8) {
    [[maybe_unused]] float4 sc32;  // V3.2: 4 float32 scales
    if constexpr (L != SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8) sc32 = *reinterpret_cast<const float4 *>(row + LT::kNope);
#pragma unroll
    for (int j = 0; j < (LT::kFp8Chunks + TPK - 1) / TPK; ++j) {
      const int part = j * TPK + csub;
      if (LT::kFp8Chunks % TPK == 0 || part < LT::kFp8Chunks) {
        const uint4 v = *reinterpret_cast<const uint4 *>(row + part * 16);
        uint32_t o[8];
        if constexpr (L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8) {
          const int si = part >> 2;  // one scale per 64 values
          const uint32_t e = __byte_perm(si < 4 ? sc8.x : sc8.y, 0u, 0x4440u | (si & 3));
          if (e <= 134u) {
            dequant16_pow2(v, e, o);
          } else {
            dequant16_f32(v, ue8m0_to_float(e), o);
          }
        } else {
          const int si = part >> 3;  // one scale per 128 values
          const float scale = si == 0 ? sc32.x : si == 1 ? sc32.y : si == 2 ? sc32.z : sc32.w;
          dequant16_f32(v, scale, o);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(krow + part * 16);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
      }
    }
#pragma unroll
    for (int j = 0; j < (8 + TPK - 1) / TPK; ++j) {  // 8 RoPE chunks of 16 bytes
      const int part = j * TPK + csub;
      if (8 % TPK == 0 || part < 8) {
        *reinterpret_cast<uint4 *>(krow + LT::kNope + part * 8) =
            *reinterpret_cast<const uint4 *>(row + LT::kRopeSrc + part * 16);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < LT::kCopyChunks / TPK; ++j) {
      const int part = j * TPK + csub;
      *reinterpret_cast<uint4 *>(krow + part * 8) = *reinterpret_cast<const uint4 *>(row + part * 16);
    }
  }
}

template <int L, int TPK>
__device__ __forceinline__ void dequant_record(const uint8_t *row, __nv_bfloat16 *krow, int csub) {
  uint2 sc8 = make_uint2(0u, 0u);
  if constexpr (L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8) {
    sc8 = *reinterpret_cast<const uint2 *>(row + LayoutTraits<L>::kDataBytes);
  }
  dequant_record_scaled<L, TPK>(row, krow, csub, sc8);
}

// ---------------------------------------------------------------------------------------------
// Tile bookkeeping
// ---------------------------------------------------------------------------------------------
// The CTA's tiles: static split range [j0, j1) of the concatenated tile list (cache 0's tiles,
// then cache 1's), minus the tiles past each row's topk_length.
struct TileRange {
  int a_begin, a_count;  // cache 0 local tiles
  int b_begin, b_count;  // cache 1 local tiles
};

// Valid prefix length of a token's row: topk_length clamped to [0, topk], or topk.
__device__ __forceinline__ int row_length(const CacheArgs &c, int token) {
  int len = c.topk;
  if (c.lengths != nullptr) {
    const int l = c.lengths[token];
    len = l < 0 ? 0 : (l < len ? l : len);
  }
  return len;
}

// Block -> (head group, split, token); the head group varies fastest so that the CTAs reading the
// same token's rows run together and share them through L2. Shared by every decode kernel.
struct BlockPos {
  int split, token, head0;
  __device__ __forceinline__ BlockPos(const KernelArgs &args, int rows) {
    int bid = blockIdx.x;
    const int hg = bid % args.head_groups;
    bid /= args.head_groups;
    split = bid % args.num_splits;
    token = bid / args.num_splits;
    head0 = hg * rows;
  }
};

// One CTA's tiles of one token's rows (split `split` of the concatenated tile list) and where each
// comes from: shared by the bf16 and the e4m3 QK^T kernels.
template <int NT>
struct TileCursor {
  const KernelArgs &args;
  int token;
  TileRange tr;
  int len0, len1;

  __device__ __forceinline__ TileCursor(const KernelArgs &a, int tok, int split) : args(a), token(tok) {
    const int j0 = split * args.tiles_per_split;
    const int total = args.cache[0].num_tiles + (args.num_caches > 1 ? args.cache[1].num_tiles : 0);
    int j1 = j0 + args.tiles_per_split;
    j1 = j1 < total ? j1 : total;
    len0 = row_length(args.cache[0], token);
    len1 = args.num_caches > 1 ? row_length(args.cache[1], token) : 0;
    const int e0 = (len0 + NT - 1) / NT;
    const int a0 = j0, a1 = j1 < e0 ? j1 : e0;
    tr.a_begin = a0;
    tr.a_count = a1 > a0 ? a1 - a0 : 0;
    tr.b_begin = 0;
    tr.b_count = 0;
    if (args.num_caches > 1) {
      const int n0 = args.cache[0].num_tiles;
      const int e1 = (len1 + NT - 1) / NT;
      const int b0 = (j0 > n0 ? j0 : n0) - n0;
      int b1 = j1 - n0;
      b1 = b1 < e1 ? b1 : e1;
      tr.b_begin = b0;
      tr.b_count = b1 > b0 ? b1 - b0 : 0;
    }
  }

  __device__ __forceinline__ int num_tiles() const { return tr.a_count + tr.b_count; }

  // Where tile ordinal `i` comes from: which cache, its first row position, the row's length.
  __device__ __forceinline__ void source(int i, int &which, int &pos0, int &len) const {
    const bool second = i >= tr.a_count;
    which = second ? 1 : 0;
    pos0 = (second ? tr.b_begin + (i - tr.a_count) : tr.a_begin + i) * NT;
    len = second ? len1 : len0;
  }

  // Index of key `key` of tile `i` (a global load; issued one iteration before it is needed).
  __device__ __forceinline__ int load_slot(int i, int key) const {
    int which, pos0, len;
    source(i, which, pos0, len);
    const CacheArgs &c = args.cache[which];
    return __ldg(c.indices + static_cast<int64_t>(token) * c.indices_stride + pos0 + key);
  }

  // (page, offset in page) of key `key` of tile `i`, or page -1 when the entry is not valid.
  __device__ __forceinline__ int2 locate(int i, int key, int slot) const {
    int which, pos0, len;
    source(i, which, pos0, len);
    const CacheArgs &c = args.cache[which];
    if (pos0 + key >= len || slot < 0 || static_cast<int64_t>(slot) >= c.num_slots) return make_int2(-1, 0);
    const int page = slot / c.page_size;
    return make_int2(page, slot - page * c.page_size);
  }

  // Issue part `part` (of TPK threads per key) of the cp.async copies of key `key`'s record of tile `i`
  // into a staging buffer (`raw`: its records, `valid_flags`: its keys' flags), from the key's (page,
  // offset) `loc`; an invalid row is zero-filled and never read.
  template <int L, int TPK>
  __device__ __forceinline__ void issue_record(int i, int2 loc, uint8_t *raw, uint8_t *valid_flags, int key,
                                               int part) const {
    using LT = LayoutTraits<L>;
    int which, pos0, len;
    source(i, which, pos0, len);
    const CacheArgs &c = args.cache[which];
    const bool valid = loc.x >= 0;
    const uint8_t *page_base = c.data + static_cast<int64_t>(valid ? loc.x : 0) * c.page_stride;
    const uint8_t *src = page_base + static_cast<int64_t>(loc.y) * LT::kDataBytes;
    const uint32_t dst = smem_addr(raw + key * LT::kRawStride);
    if (part == 0) valid_flags[key] = valid ? 1 : 0;
    constexpr bool kV4 = L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8;
    constexpr int kData16 = kV4 ? LT::kCopyChunks - 1 : LT::kCopyChunks;  // 16-byte chunks
#pragma unroll
    for (int j = 0; j < (kData16 + TPK - 1) / TPK; ++j) {
      const int chunk = j * TPK + part;
      if (kData16 % TPK == 0 || chunk < kData16) cp_async_16(dst + chunk * 16, src + chunk * 16, valid);
    }
    if constexpr (kV4) {
      if (part == TPK - 1) {  // the record's ue8m0 scales, stored after the page's data
        cp_async_8(dst + LT::kDataBytes,
                   page_base + static_cast<int64_t>(c.page_size) * LT::kDataBytes + loc.y * 8, valid);
      }
    }
  }

  // The warp-specialised producers' copy (V4): part `part` of TPK threads per key copies exactly
  // the 16-byte chunks that dequant_record_scaled converts for that part, so that each producer
  // thread waits for its own copies only; the record's ue8m0 scales come back in a register
  // (0 for an invalid row, which is zero-filled and never read).
  template <int L, int TPK>
  __device__ __forceinline__ uint2 issue_parts(int i, int2 loc, uint8_t *raw, int key, int part) const {
    using LT = LayoutTraits<L>;
    static_assert(L == SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8, "scales in registers: V4's 8 bytes");
    int which, pos0, len;
    source(i, which, pos0, len);
    const CacheArgs &c = args.cache[which];
    const bool valid = loc.x >= 0;
    const uint8_t *page_base = c.data + static_cast<int64_t>(valid ? loc.x : 0) * c.page_stride;
    const uint8_t *src = page_base + static_cast<int64_t>(loc.y) * LT::kDataBytes;
    const uint32_t dst = smem_addr(raw + key * LT::kRawStride);
#pragma unroll
    for (int j = 0; j < (LT::kFp8Chunks + TPK - 1) / TPK; ++j) {
      const int chunk = j * TPK + part;
      if (LT::kFp8Chunks % TPK == 0 || chunk < LT::kFp8Chunks) cp_async_16(dst + chunk * 16, src + chunk * 16, valid);
    }
#pragma unroll
    for (int j = 0; j < (8 + TPK - 1) / TPK; ++j) {  // 8 RoPE chunks of 16 bytes
      const int rope = j * TPK + part;
      if (8 % TPK == 0 || rope < 8) cp_async_16(dst + LT::kRopeSrc + rope * 16, src + LT::kRopeSrc + rope * 16, valid);
    }
    if (!valid) return make_uint2(0u, 0u);
    return __ldg(reinterpret_cast<const uint2 *>(page_base + static_cast<int64_t>(c.page_size) * LT::kDataBytes +
                                                 loc.y * 8));
  }
};

// ---------------------------------------------------------------------------------------------
// One consumer thread of the bf16 QK^T path: warp (rg, cw) of the CTA's (ROWS / 16) x C warp grid
// computes S for its 16 heads and NT / C keys of a tile and O for the same heads and 512 / C
// output columns. Shared by the single-role kernel below and the warp-specialised one
// (sparse_mla_ws.cuh), so that both compute every tile with the same instructions.
// ---------------------------------------------------------------------------------------------
template <class Cfg>
struct TileMath {
  int lane, rg, cw, g, t4;
  int row_lo, row_hi;  // CTA-local head rows held by this thread
  int key_w0;          // first S key of this warp within the tile
  int col_w0;          // first output column of this warp
  int rg_barrier;      // named barrier of this row group (0 is __syncthreads)
  uint32_t q_base, p_base;
  uint32_t q_frag[Cfg::kQInRegs ? Cfg::kKC : 1][4];
  float o_acc[Cfg::kNTO][4];
  float m_run[2];  // rows g and g + 8 of the warp's 16
  float l_run[2];  // this thread's share of the row sums

  __device__ __forceinline__ TileMath(int warp, int lane_, const __nv_bfloat16 *q_s, const __nv_bfloat16 *p_s)
      : lane(lane_), rg(warp / Cfg::kC), cw(warp % Cfg::kC), g(lane_ >> 2), t4(lane_ & 3) {
    row_lo = rg * 16 + g;
    row_hi = row_lo + 8;
    key_w0 = cw * Cfg::kNKW;
    col_w0 = cw * Cfg::kDVW;
    rg_barrier = 1 + rg;
    q_base = smem_addr(q_s + (rg * 16 + (lane & 15)) * Cfg::kQStride + (lane >> 4) * 8);
    p_base = smem_addr(p_s + (rg * 16 + (lane & 15)) * Cfg::kPStride + (lane >> 4) * 8);
#pragma unroll
    for (int n = 0; n < Cfg::kNTO; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;
    m_run[0] = m_run[1] = kNegInf;
    l_run[0] = l_run[1] = 0.f;
  }

  // Q fragments from the shared-memory Q tile into registers (Cfg::kQInRegs).
  __device__ __forceinline__ void load_q() {
#pragma unroll
    for (int kc = 0; kc < Cfg::kKC; ++kc) ldmatrix_x4(q_frag[kc], q_base + kc * 32);
  }

  // One tile: S = Q K^T, the online softmax, O += P V. The K tile `k_s` and its valid flags stay
  // unchanged until every warp has returned; P and the row maxima go through `p_s` and `red_max`.
  __device__ __forceinline__ void attend(const __nv_bfloat16 *k_s, const uint8_t *k_valid, __nv_bfloat16 *p_s,
                                         float *red_max, float scale_log2) {
    // ---- S = Q K^T for this warp's 16 rows x kNKW keys ----
    float s_acc[Cfg::kNAcc][Cfg::kNTS][4];
  #pragma unroll
    for (int a = 0; a < Cfg::kNAcc; ++a)
  #pragma unroll
      for (int n = 0; n < Cfg::kNTS; ++n) s_acc[a][n][0] = s_acc[a][n][1] = s_acc[a][n][2] = s_acc[a][n][3] = 0.f;

    // ldmatrix row addresses of the K tile: x4 covers two 8-key n-tiles x 16 columns.
    const uint32_t k_base_x4 =
        smem_addr(k_s + (key_w0 + ((lane >> 4) << 3) + (lane & 7)) * Cfg::kKStride + ((lane >> 3) & 1) * 8);
    const uint32_t k_base_x2 = smem_addr(k_s + (key_w0 + (lane & 7)) * Cfg::kKStride + ((lane >> 3) & 1) * 8);

  #pragma unroll
    for (int kc = 0; kc < Cfg::kKC; ++kc) {
      uint32_t a_frag[4];
      if constexpr (Cfg::kQInRegs) {
  #pragma unroll
        for (int j = 0; j < 4; ++j) a_frag[j] = q_frag[kc][j];
      } else {
        ldmatrix_x4(a_frag, q_base + kc * 32);
      }
      const int acc = kc % Cfg::kNAcc;
      if constexpr (Cfg::kNTS == 1) {
        uint32_t b[2];
        ldmatrix_x2(b, k_base_x2 + kc * 32);
        mma_bf16(s_acc[acc][0], a_frag, b[0], b[1]);
      } else {
  #pragma unroll
        for (int np = 0; np < Cfg::kNTS / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base_x4 + np * 16 * Cfg::kKStride * 2 + kc * 32);
          mma_bf16(s_acc[acc][2 * np], a_frag, b[0], b[1]);
          mma_bf16(s_acc[acc][2 * np + 1], a_frag, b[2], b[3]);
        }
      }
    }

    // ---- Scale, mask, row maxima ----
    float s[Cfg::kNTS][4];
    float mx[2] = {kNegInf, kNegInf};
  #pragma unroll
    for (int n = 0; n < Cfg::kNTS; ++n) {
  #pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = 0.f;
  #pragma unroll
        for (int a = 0; a < Cfg::kNAcc; ++a) v += s_acc[a][n][j];
        const int key = key_w0 + n * 8 + 2 * t4 + (j & 1);
        v = k_valid[key] ? v * scale_log2 : kNegInf;
        s[n][j] = v;
        mx[j >> 1] = fmaxf(mx[j >> 1], v);
      }
    }
  #pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if (t4 == 0) {
      red_max[cw * Cfg::kRows + row_lo] = mx[0];
      red_max[cw * Cfg::kRows + row_hi] = mx[1];
    }
    named_barrier(rg_barrier, Cfg::kC * 32);

    float alpha[2], m_use[2];
  #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = h ? row_hi : row_lo;
      float m_new = m_run[h];
  #pragma unroll
      for (int c = 0; c < Cfg::kC; ++c) m_new = fmaxf(m_new, red_max[c * Cfg::kRows + row]);
      m_use[h] = m_new == kNegInf ? 0.f : m_new;
      alpha[h] = fast_exp2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
    }

    // ---- P = exp2(S - m), row sums, P to shared memory ----
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
      *reinterpret_cast<uint32_t *>(p_s + row_lo * Cfg::kPStride + key) = pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t *>(p_s + row_hi * Cfg::kPStride + key) = pack_bf16x2(p2, p3);
    }
    l_run[0] = l_run[0] * alpha[0] + psum[0];
    l_run[1] = l_run[1] * alpha[1] + psum[1];
    // Rescale O only when a row maximum of the warp moved (alpha is exactly 1 otherwise).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
  #pragma unroll
      for (int n = 0; n < Cfg::kNTO; ++n) {
        o_acc[n][0] *= alpha[0];
        o_acc[n][1] *= alpha[0];
        o_acc[n][2] *= alpha[1];
        o_acc[n][3] *= alpha[1];
      }
    }
    named_barrier(rg_barrier, Cfg::kC * 32);  // the row group's P tile is complete

    // ---- O += P V over all NT keys, this warp's kDVW columns ----
    // ldmatrix.trans rows: keys kc*16 + (lane & 7) + ((lane >> 3) & 1) * 8, columns + (lane >> 4) * 8.
    const uint32_t v_base =
        smem_addr(k_s + ((lane & 7) + ((lane >> 3) & 1) * 8) * Cfg::kKStride + col_w0 + (lane >> 4) * 8);
  #pragma unroll
    for (int kc = 0; kc < Cfg::kNT / 16; ++kc) {
      uint32_t a_frag[4];
      ldmatrix_x4(a_frag, p_base + kc * 32);
  #pragma unroll
      for (int np = 0; np < Cfg::kNTO / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_base + (kc * 16 * Cfg::kKStride + np * 16) * 2);
        mma_bf16(o_acc[2 * np], a_frag, b[0], b[1]);
        mma_bf16(o_acc[2 * np + 1], a_frag, b[2], b[3]);
      }
    }
  }

  // After the last tile: the row sums, then bf16 out and lse (one split) or the float32 partials.
  __device__ __forceinline__ void finish(const KernelArgs &args, float *red_sum, int head0, int token, int split) {
    // ---- Row sums over the quad and the row group's C warps ----
  #pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
      l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    if (t4 == 0) {
      red_sum[cw * Cfg::kRows + row_lo] = l_run[0];
      red_sum[cw * Cfg::kRows + row_hi] = l_run[1];
    }
    named_barrier(rg_barrier, Cfg::kC * 32);
    float l_tot[2] = {0.f, 0.f};
  #pragma unroll
    for (int c = 0; c < Cfg::kC; ++c) {
      l_tot[0] += red_sum[c * Cfg::kRows + row_lo];
      l_tot[1] += red_sum[c * Cfg::kRows + row_hi];
    }

    if (args.num_splits == 1) {
      float inv[2];
  #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = head0 + (h ? row_hi : row_lo);
        float denom = l_tot[h];
        if (args.sink != nullptr) {
          const float m_use = m_run[h] == kNegInf ? 0.f : m_run[h];
          denom += fast_exp2(args.sink[head] * kLog2e - m_use);
        }
        inv[h] = denom > 0.f ? 1.f / denom : 0.f;
      }
      __nv_bfloat16 *out_tok = args.out + static_cast<int64_t>(token) * args.out_stride_token;
      __nv_bfloat16 *out_lo = out_tok + static_cast<int64_t>(head0 + row_lo) * args.out_stride_head;
      __nv_bfloat16 *out_hi = out_tok + static_cast<int64_t>(head0 + row_hi) * args.out_stride_head;
  #pragma unroll
      for (int n = 0; n < Cfg::kNTO; ++n) {
        const int col = col_w0 + n * 8 + 2 * t4;
        *reinterpret_cast<uint32_t *>(out_lo + col) = pack_bf16x2(o_acc[n][0] * inv[0], o_acc[n][1] * inv[0]);
        *reinterpret_cast<uint32_t *>(out_hi + col) = pack_bf16x2(o_acc[n][2] * inv[1], o_acc[n][3] * inv[1]);
      }
      if (cw == 0 && t4 == 0) {
        float *lse_tok = args.lse + static_cast<int64_t>(token) * args.lse_stride_token + head0;
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          lse_tok[h ? row_hi : row_lo] = l_tot[h] > 0.f ? (m_run[h] + __log2f(l_tot[h])) * kLn2
                                                        : SPARKSEAL_SPARSE_MLA_EMPTY_LSE;
        }
      }
    } else {
      const int64_t row_base =
          (static_cast<int64_t>(split) * args.num_tokens + token) * args.num_heads + head0;
      float inv[2];
  #pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = l_tot[h] > 0.f ? 1.f / l_tot[h] : 0.f;
      float *o_lo = args.ws_o + (row_base + row_lo) * kDV;
      float *o_hi = args.ws_o + (row_base + row_hi) * kDV;
  #pragma unroll
      for (int n = 0; n < Cfg::kNTO; ++n) {
        const int col = col_w0 + n * 8 + 2 * t4;
        *reinterpret_cast<float2 *>(o_lo + col) = make_float2(o_acc[n][0] * inv[0], o_acc[n][1] * inv[0]);
        *reinterpret_cast<float2 *>(o_hi + col) = make_float2(o_acc[n][2] * inv[1], o_acc[n][3] * inv[1]);
      }
      if (cw == 0 && t4 == 0) {
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          args.ws_lse[row_base + (h ? row_hi : row_lo)] =
              l_tot[h] > 0.f ? (m_run[h] + __log2f(l_tot[h])) * kLn2 : kNegInf;
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The main kernel
// ---------------------------------------------------------------------------------------------
template <int L, int ROWS, int NT, int C, int BUDGET>
__global__ void __launch_bounds__(Config<L, ROWS, NT, C, BUDGET>::kThreads, 1)
    sparse_mla_decode_kernel(const KernelArgs args) {
  using Cfg = Config<L, ROWS, NT, C, BUDGET>;
  using LT = LayoutTraits<L>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kDK = Cfg::kDK;
  constexpr int kStages = Cfg::kStages;

  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16 *k_s = reinterpret_cast<__nv_bfloat16 *>(smem + Cfg::kQBytes);
  // Q's shared-memory tile; the K tile's space before the first tile when Q lives in registers.
  __nv_bfloat16 *q_s = Cfg::kQInRegs ? k_s : reinterpret_cast<__nv_bfloat16 *>(smem);
  __nv_bfloat16 *p_s = reinterpret_cast<__nv_bfloat16 *>(smem + Cfg::kQBytes + Cfg::kKBytes);
  float *red_max = reinterpret_cast<float *>(smem + Cfg::kQBytes + Cfg::kKBytes + Cfg::kPBytes);
  float *red_sum = red_max + C * ROWS;
  uint8_t *k_valid = smem + Cfg::kQBytes + Cfg::kKBytes + Cfg::kPBytes + Cfg::kRedBytes;
  uint8_t *raw_base = smem + Cfg::kFixed;
  uint8_t *stage_valid_base = raw_base + kStages * Cfg::kRawBytes;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const BlockPos pos(args, ROWS);
  const int split = pos.split, token = pos.token, head0 = pos.head0;

  // This CTA's tiles and where each comes from.
  const TileCursor<NT> tiles(args, token, split);
  const int num_tiles = tiles.num_tiles();
  auto load_slot = [&](int i, int key) -> int { return tiles.load_slot(i, key); };
  auto locate = [&](int i, int key, int slot) -> int2 { return tiles.locate(i, key, slot); };

  // This thread's key and part in the copy and dequantisation of a tile: kTPK threads per key.
  constexpr int kTPK = Cfg::kTPK;
  const int ckey = warp * Cfg::kKPW + lane % Cfg::kKPW;
  const int csub = lane / Cfg::kKPW;

  // Issue this thread's cp.async copies of its key of tile ordinal `i` into staging buffer
  // `stage`, from the key's (page, offset) `loc` (zero-filling an invalid row, never read).
  auto issue_tile = [&](int i, int stage, int2 loc) {
    tiles.template issue_record<L, kTPK>(i, loc, raw_base + stage * Cfg::kRawBytes,
                                         stage_valid_base + stage * Cfg::kStageValidBytes, ckey, csub);
  };

  // Dequantise this thread's parts of its key of staging buffer `stage` into the bf16 K tile
  // (and copy the tile's valid flags).
  auto dequant_tile = [&](int stage) {
    if (tid < NT) k_valid[tid] = stage_valid_base[stage * Cfg::kStageValidBytes + tid];
    dequant_record<L, kTPK>(raw_base + stage * Cfg::kRawBytes + ckey * LT::kRawStride, k_s + ckey * Cfg::kKStride,
                            csub);
  };

  // ---- Prologue: Q and the first staged tiles (their indices all loaded first) ----
  {
    const __nv_bfloat16 *q_tok = args.q + static_cast<int64_t>(token) * args.q_stride_token;
    constexpr int kRowChunks = kDK / 8;
    for (int item = tid; item < ROWS * kRowChunks; item += kThreads) {
      const int r = item / kRowChunks;
      const int ch = item - r * kRowChunks;
      cp_async_16(smem_addr(q_s + r * Cfg::kQStride + ch * 8),
                  q_tok + static_cast<int64_t>(head0 + r) * args.q_stride_head + ch * 8, true);
    }
  }
  {
    int slots[kStages];
#pragma unroll
    for (int st = 0; st < kStages; ++st) slots[st] = st < num_tiles ? load_slot(st, ckey) : -1;
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      if (st < num_tiles) issue_tile(st, st, locate(st, ckey, slots[st]));
      cp_async_commit();
    }
  }
  // Index of this thread's key of the tile after the staged ones, loaded one iteration ahead.
  int pf_slot = kStages < num_tiles ? load_slot(kStages, ckey) : -1;

  // ---- Per-thread state ----
  TileMath<Cfg> tm(warp, lane, q_s, p_s);

  // Q fragments, kept in registers where they fit (Cfg::kQInRegs): Q arrived in the K tile's
  // space with the first staged tile (the first cp.async group), and leaves it before the first
  // dequantisation overwrites it.
  if constexpr (Cfg::kQInRegs) {
    cp_async_wait<kStages - 1>();
    __syncthreads();
    tm.load_q();
    __syncthreads();
  }

  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    cp_async_wait<kStages - 1>();
    __syncthreads();  // staged tile `it` (and Q) visible to all; previous tile's K and P unused
    dequant_tile(stage);
    const bool refill = it + kStages < num_tiles;
    int2 loc = make_int2(-1, 0);
    if (refill) loc = locate(it + kStages, ckey, pf_slot);
    __syncthreads();  // K tile ready; staging buffer `stage` free
    if (refill) issue_tile(it + kStages, stage, loc);
    cp_async_commit();
    if (it + kStages + 1 < num_tiles) pf_slot = load_slot(it + kStages + 1, ckey);

    tm.attend(k_s, k_valid, p_s, red_max, args.scale_log2);
  }
  cp_async_wait<0>();

  tm.finish(args, red_sum, head0, token, split);
}

// ---------------------------------------------------------------------------------------------
// Split combine: `groups` (1, 2 or 4) warps per (token, head), kCombineWarps warps per CTA
// ---------------------------------------------------------------------------------------------
constexpr int kCombineWarps = 4;
__global__ void __launch_bounds__(kCombineWarps * 32)
    sparse_mla_combine_kernel(const KernelArgs args, int groups);

}  // namespace sparkseal::sparse_mla
