// A minimal, correct producer/consumer handover of shared memory through named barriers, with the
// barrier discipline of the warp-specialised sparse-MLA kernel (kernels_sm121/csrc/sparse_mla_ws.cuh):
//   - the consumer warps come first (threads 0 .. kConsumerThreads - 1), the producer warps after them;
//   - two buffers; FULL[b] = 3 + b and EMPTY[b] = 5 + b, each counted over every thread of the CTA;
//   - buffer 1 first carries the consumers' own input ("Q"): they cp.async it in, meet on their own
//     barrier (7, consumer threads only), read it, then `bar.arrive EMPTY[1]`;
//   - the producers write buffer b with tile t, then `bar.arrive FULL[b]`; before writing tile t >= 1
//     they `bar.sync EMPTY[b]`;
//   - the consumers `bar.sync FULL[b]`, read buffer b (values written by other threads), then
//     `bar.arrive EMPTY[b]` while a later tile (t + 2) will reuse it;
//   - the same inline PTX as the kernel: "bar.sync %0, %1;", "bar.arrive %0, %1;" (register operands,
//     "memory" clobber) and "cp.async.cg.shared.global [%0], [%1], 16, %2;".
// In PTX's memory model a bar.arrive synchronises with the bar.sync that completes the same barrier, so
// the handover is race-free; main() checks every consumer's result against the host's.
//
//   named_barrier_handover arrive [LAUNCHES]   the handover above
//   named_barrier_handover sync [LAUNCHES]     a control: the same data flow with bar.sync on both sides
//                                              (Q's EMPTY[1], then FULL[b] and EMPTY[b] per tile, in the
//                                              same order for both roles)
// LAUNCHES (default 1, at most 1024): the kernel is launched that many times, each launch's results checked.
// racecheck sees only the interleavings that happen, so one launch may show it no hazard; more launches
// give it more chances in one process.
//
// Exit status 0 and one "ok" line when every consumer got the value it should in every launch; 1 otherwise.
// tests/gpu/test_sparse_mla_sanitizers.py builds it with nvcc and runs it under compute-sanitizer racecheck.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

constexpr int kConsumerThreads = 64;  // warps 0-1
constexpr int kProducerThreads = 64;  // warps 2-3
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kTileElems = 256;
constexpr int kTiles = 4;  // both buffers reused once: FULL and EMPTY of each met twice
constexpr int kBlocks = 2;
constexpr int kBarFull = 3;      // + b, as WsConfig::kBarFull
constexpr int kBarEmpty = 5;     // + b, as WsConfig::kBarEmpty
constexpr int kBarConsumer = 7;  // as WsConfig::kBarConsumer
constexpr int kQReads = 4;       // reads of Q per consumer thread

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__host__ __device__ inline uint32_t q_value(int block, int i) {
  return static_cast<uint32_t>(block) * 7919u + static_cast<uint32_t>(i) * 13u + 1u;
}

// The Q element consumer thread `c` reads on its `k`-th read: in another consumer's 16-byte chunk.
__host__ __device__ inline int q_index(int c, int k) { return (4 * c + 17 * k + 5) % kTileElems; }

__host__ __device__ inline uint32_t tile_value(int block, int tile, int i) {
  return static_cast<uint32_t>(block) * 100003u + static_cast<uint32_t>(tile) * 1009u + static_cast<uint32_t>(i);
}

// The element consumer thread `c` reads on its `k`-th read of tile `t`: written by another thread.
__host__ __device__ inline int read_index(int c, int k, int t) {
  return ((c + k * kConsumerThreads) * 7 + t) % kTileElems;
}

template <bool kArrive>
__global__ void __launch_bounds__(kThreads) named_barrier_handover_kernel(const uint32_t *q, uint32_t *out) {
  __shared__ __align__(16) uint32_t tiles[2][kTileElems];
  const int tid = threadIdx.x;
  if (tid >= kConsumerThreads) {
    // ---- Producers ----
    const int p = tid - kConsumerThreads;
    if (!kArrive) named_barrier(kBarEmpty + 1, kThreads);  // buffer 1: the consumers are done with Q
    for (int t = 0; t < kTiles; ++t) {
      const int b = t & 1;
      // Buffer b: free once the consumers are done with tile t - 2 (for t = 1: with Q).
      if (kArrive && t >= 1) named_barrier(kBarEmpty + b, kThreads);
      for (int i = p; i < kTileElems; i += kProducerThreads) tiles[b][i] = tile_value(blockIdx.x, t, i);
      if (kArrive) {
        named_barrier_arrive(kBarFull + b, kThreads);  // buffer b holds tile t
      } else {
        named_barrier(kBarFull + b, kThreads);
        named_barrier(kBarEmpty + b, kThreads);
      }
    }
    return;
  }
  // ---- Consumers ----
  uint32_t acc = 0;
  {
    // Q through buffer 1: one 16-byte chunk per consumer thread.
    static_assert(kTileElems * 4 == kConsumerThreads * 16, "one chunk of Q per consumer thread");
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&tiles[1][4 * tid]));
    cp_async_16(dst, q + blockIdx.x * kTileElems + 4 * tid, true);
    cp_async_commit();
    cp_async_wait_all();
    named_barrier(kBarConsumer, kConsumerThreads);
    for (int k = 0; k < kQReads; ++k) acc = acc * 31u + tiles[1][q_index(tid, k)];
    if (kArrive) {
      if (kTiles >= 2) named_barrier_arrive(kBarEmpty + 1, kThreads);
    } else {
      named_barrier(kBarEmpty + 1, kThreads);
    }
  }
  for (int t = 0; t < kTiles; ++t) {
    const int b = t & 1;
    named_barrier(kBarFull + b, kThreads);  // buffer b holds tile t
    for (int k = 0; k < kTileElems / kConsumerThreads; ++k) {
      acc = acc * 31u + tiles[b][read_index(tid, k, t)];
    }
    if (kArrive) {
      if (t + 2 < kTiles) named_barrier_arrive(kBarEmpty + b, kThreads);  // buffer b is free for tile t + 2
    } else {
      named_barrier(kBarEmpty + b, kThreads);
    }
  }
  out[blockIdx.x * kConsumerThreads + tid] = acc;
}

int main(int argc, char **argv) {
  const bool arrive = argc >= 2 && std::strcmp(argv[1], "arrive") == 0;
  const int launches = argc == 3 ? std::atoi(argv[2]) : 1;
  if (argc < 2 || argc > 3 || (!arrive && std::strcmp(argv[1], "sync") != 0) || launches < 1 || launches > 1024) {
    std::fprintf(stderr, "usage: %s arrive|sync [LAUNCHES: 1..1024]\n", argv[0]);
    return 2;
  }
  constexpr int kOut = kBlocks * kConsumerThreads;
  std::vector<uint32_t> q_host(kBlocks * kTileElems);
  for (int block = 0; block < kBlocks; ++block) {
    for (int i = 0; i < kTileElems; ++i) q_host[block * kTileElems + i] = q_value(block, i);
  }
  uint32_t *q = nullptr;
  uint32_t *out = nullptr;
  cudaError_t err = cudaMalloc(&q, q_host.size() * sizeof(uint32_t));
  if (err == cudaSuccess) err = cudaMalloc(&out, kOut * sizeof(uint32_t));
  if (err == cudaSuccess) {
    err = cudaMemcpy(q, q_host.data(), q_host.size() * sizeof(uint32_t), cudaMemcpyHostToDevice);
  }
  std::vector<uint32_t> expected(kOut);
  for (int block = 0; block < kBlocks; ++block) {
    for (int c = 0; c < kConsumerThreads; ++c) {
      uint32_t acc = 0;
      for (int k = 0; k < kQReads; ++k) acc = acc * 31u + q_value(block, q_index(c, k));
      for (int t = 0; t < kTiles; ++t) {
        for (int k = 0; k < kTileElems / kConsumerThreads; ++k) {
          acc = acc * 31u + tile_value(block, t, read_index(c, k, t));
        }
      }
      expected[block * kConsumerThreads + c] = acc;
    }
  }
  std::vector<uint32_t> got(kOut);
  for (int launch = 0; launch < launches && err == cudaSuccess; ++launch) {
    err = cudaMemset(out, 0, kOut * sizeof(uint32_t));
    if (err == cudaSuccess) {
      if (arrive) {
        named_barrier_handover_kernel<true><<<kBlocks, kThreads>>>(q, out);
      } else {
        named_barrier_handover_kernel<false><<<kBlocks, kThreads>>>(q, out);
      }
      err = cudaGetLastError();
    }
    if (err == cudaSuccess) err = cudaMemcpy(got.data(), out, kOut * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) break;
    int wrong = 0;
    for (int i = 0; i < kOut; ++i) wrong += got[i] != expected[i];
    if (wrong != 0) {
      std::printf("named_barrier_handover %s: launch %d: %d of %d consumer results wrong\n", argv[1], launch, wrong,
                  kOut);
      return 1;
    }
  }
  cudaFree(q);
  cudaFree(out);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "named_barrier_handover %s: CUDA error %s\n", argv[1], cudaGetErrorString(err));
    return 1;
  }
  std::printf("named_barrier_handover %s: ok (%d consumer results, %d launches)\n", argv[1], kOut, launches);
  return 0;
}
