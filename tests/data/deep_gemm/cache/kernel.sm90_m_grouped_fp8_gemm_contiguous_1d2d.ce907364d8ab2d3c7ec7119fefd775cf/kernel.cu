// Includes' hash value: a8789b787f2748c5599847a6aedb294d

#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>

using namespace deep_gemm;

static void __instantiate_kernel() {
    auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<
        cute::UMMA::Major::K,
        0, 2048, 768,
        128,
        128, 16, 128,
        128, 128, 32,
        12,
        128, 256,
        1, false,
        132, GemmType::MGroupedContiguous,
        cutlass::bfloat16_t,
        epilogue::transform::EpilogueIdentity
    >);
};
