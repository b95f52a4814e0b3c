// Sparse-MLA decode kernels for the DeepSeek V3.2 bf16 cache layout (576 bf16 per token).
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV32Bf16 = SPARKSEAL_SPARSE_MLA_LAYOUT_V32_BF16;

extern const ConfigEntry kConfigsV32Bf16[] = {
    make_entry<kV32Bf16, 64, 32, 2, kBigSmem>(),
    make_entry<kV32Bf16, 32, 32, 4, kBigSmem>(),
    make_entry<kV32Bf16, 16, 32, 4, kBigSmem>(),
    make_entry<kV32Bf16, 16, 32, 4, kSmallSmem>(),
};
extern const int kNumConfigsV32Bf16 = sizeof(kConfigsV32Bf16) / sizeof(kConfigsV32Bf16[0]);

}  // namespace sparkseal::sparse_mla
