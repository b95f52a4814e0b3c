// Sparse-MLA decode kernels for the DeepSeek V3.2 fp8_ds_mla cache layout (656-byte records).
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV32Fp8 = SPARKSEAL_SPARSE_MLA_LAYOUT_V32_FP8;

extern const ConfigEntry kConfigsV32Fp8[] = {
    make_entry<kV32Fp8, 64, 64, 2, kBigSmem>(),   make_entry<kV32Fp8, 32, 64, 4, kBigSmem>(),
    make_entry<kV32Fp8, 32, 32, 4, kSmallSmem>(), make_entry<kV32Fp8, 16, 64, 8, kBigSmem>(),
    make_entry<kV32Fp8, 16, 32, 4, kSmallSmem>(),
};
extern const int kNumConfigsV32Fp8 = sizeof(kConfigsV32Fp8) / sizeof(kConfigsV32Fp8[0]);

}  // namespace sparkseal::sparse_mla
