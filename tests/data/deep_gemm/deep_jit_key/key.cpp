// DeepJIT's own code (the wheel's deep_jit headers: hash::FNV1a, Parser,
// cuda::CompilerOptions::get_flags, str::join) computing a kernel's cache key as
// Runtime::cache_key composes it (runtime/runtime.hpp). Built by the tests with g++ and the
// two stand-ins under shim/ (GCC 12 has no <format>; exception.hpp needs elfutils).
//
//   key <include dir> <extra signature> <nvcc --version file> <source file> <arch>
//       <with line info 0|1> <nvcc flag>...
// prints get_flags(), one per line, then the key.
#include <fstream>
#include <iostream>
#include <iterator>

#include <deep_jit/backend/cuda/options.hpp>
#include <deep_jit/runtime/config.hpp>
#include <deep_jit/utils/hash.hpp>
#include <deep_jit/utils/parser.hpp>
#include <deep_jit/utils/str.hpp>

static std::string slurp(const char* path) {
    std::ifstream input(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(input), std::istreambuf_iterator<char>()};
}

int main(int argc, char** argv) {
    if (argc < 7)
        return 2;
    deep_jit::cuda::CompilerOptions options{};
    // default_options' values (options.hpp) for what a test does not vary
    options.optimize_level = "3";
    options.fast_math = false;
    options.ptxas_verbose = false;
    options.ptxas_register_usage_level = 10;
    options.check_no_spills = false;
    options.check_no_local_memory = false;
    options.with_line_info = std::string(argv[6]) == "1";
    options.arch = argv[5];
    options.nvcc_flags = std::vector<std::string>(argv + 7, argv + argc);

    // Runtime's constructor, then cache_key
    deep_jit::Parser parser({argv[1]}, {"deep_gemm/"});
    deep_jit::hash::FNV1a hash_base;
    hash_base.update(argv[2]);
    hash_base.update(deep_jit::hash::get_hex_digest(slurp(argv[3])));
    auto hash = hash_base;
    options.update_hash(hash);
    const auto key = hash.update(options.get_post_hook_hash(deep_jit::Config("/library", "DG")))
                         .update(parser.parse_into_hash(slurp(argv[4])))
                         .get_hex_digest();
    std::cout << deep_jit::str::join(options.get_flags(), "\n") << "\n" << key << "\n";
    return 0;
}
