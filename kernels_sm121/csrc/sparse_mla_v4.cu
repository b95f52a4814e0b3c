// Sparse-MLA decode kernels for the DeepSeek V4 cache layout (584-byte fp8 records).
#include "sparse_mla_configs.cuh"

namespace sparkseal::sparse_mla {

constexpr int kV4 = SPARKSEAL_SPARSE_MLA_LAYOUT_V4_FP8;

// Under 99 KB, 32 heads: the warp-specialised kernel; the single-role one after it serves a device
// whose limit is a few KB lower.
extern const ConfigEntry kConfigsV4[] = {
    make_entry<kV4, 64, 64, 2, kBigSmem>(),   make_entry<kV4, 32, 64, 4, kBigSmem>(),
    make_ws_entry<kV4, 32, kSmallSmem>(),     make_entry<kV4, 32, 32, 4, kSmallSmem>(),
    make_entry<kV4, 16, 64, 8, kBigSmem>(),   make_entry<kV4, 16, 32, 4, kSmallSmem>(),
};
extern const int kNumConfigsV4 = sizeof(kConfigsV4) / sizeof(kConfigsV4[0]);

}  // namespace sparkseal::sparse_mla
