// Sparse-MLA decode kernels for the DeepSeek V4 cache layout with QK^T on e4m3 tensor cores,
// q as 1 e4m3 term (qk_mode FP8). One file per table so that they compile in parallel.
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV4QkFp8 = SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8;

extern const ConfigEntry kConfigsV4QkFp8[] = {
    make_fp8qk_entry<kV4QkFp8, 32, 32, 1, kBigSmem>(),
    make_fp8qk_entry<kV4QkFp8, 16, 64, 1, kBigSmem>(),
    make_fp8qk_entry<kV4QkFp8, 32, 32, 1, kSmallSmem>(),
    make_fp8qk_entry<kV4QkFp8, 16, 64, 1, kSmallSmem>(),
};
extern const int kNumConfigsV4QkFp8 = sizeof(kConfigsV4QkFp8) / sizeof(kConfigsV4QkFp8[0]);

}  // namespace sparkseal::sparse_mla
