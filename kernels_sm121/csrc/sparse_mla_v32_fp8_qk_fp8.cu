// Sparse-MLA decode kernels for the DeepSeek V3.2 fp8_ds_mla cache layout with QK^T on e4m3 tensor cores,
// q as 1 e4m3 term (qk_mode FP8). One file per table so that they compile in parallel.
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV32Fp8QkFp8 = SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8;

extern const ConfigEntry kConfigsV32Fp8QkFp8[] = {
    make_fp8qk_entry<kV32Fp8QkFp8, 32, 32, 1, kBigSmem>(),
    make_fp8qk_entry<kV32Fp8QkFp8, 16, 64, 1, kBigSmem>(),
    make_fp8qk_entry<kV32Fp8QkFp8, 32, 32, 1, kSmallSmem>(),
    make_fp8qk_entry<kV32Fp8QkFp8, 16, 64, 1, kSmallSmem>(),
};
extern const int kNumConfigsV32Fp8QkFp8 = sizeof(kConfigsV32Fp8QkFp8) / sizeof(kConfigsV32Fp8QkFp8[0]);

}  // namespace sparkseal::sparse_mla
