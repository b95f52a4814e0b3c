// Sparse-MLA decode kernels for the DeepSeek V4 cache layout with QK^T on e4m3 tensor cores,
// q as 2 e4m3 terms (qk_mode FP8X2). One file per table so that they compile in parallel.
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV4QkFp8x2 = SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8;

extern const ConfigEntry kConfigsV4QkFp8x2[] = {
    make_fp8qk_entry<kV4QkFp8x2, 32, 32, 2, kBigSmem>(),
    make_fp8qk_entry<kV4QkFp8x2, 16, 64, 2, kBigSmem>(),
    make_fp8qk_entry<kV4QkFp8x2, 32, 32, 2, kSmallSmem>(),
    make_fp8qk_entry<kV4QkFp8x2, 16, 64, 2, kSmallSmem>(),
};
extern const int kNumConfigsV4QkFp8x2 = sizeof(kConfigsV4QkFp8x2) / sizeof(kConfigsV4QkFp8x2[0]);

}  // namespace sparkseal::sparse_mla
