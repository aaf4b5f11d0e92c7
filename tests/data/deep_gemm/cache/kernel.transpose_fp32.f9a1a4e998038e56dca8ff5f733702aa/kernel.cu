// Includes' hash value: 8b9aec98a1074229f0adecaecc750e82

#include <deep_gemm/impls/smxx_layout.cuh>

using namespace deep_gemm;

static void __instantiate_kernel() {
    auto ptr = reinterpret_cast<void*>(&transpose_fp32<
        512, 64, 16
    >);
};
