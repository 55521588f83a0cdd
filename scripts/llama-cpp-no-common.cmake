# Included by llama.cpp's top CMakeLists.txt right after its project("llama.cpp") call:
# .cargo/config.toml sets CMAKE_PROJECT_llama.cpp_INCLUDE to this file, and llama-cpp-sys-2's
# build script passes every CMAKE_* variable of its environment on to CMake.
#
# llama-cpp-2 depends on llama-cpp-sys-2 with its default features, so llama-cpp-sys-2's `common`
# feature is always on and its build script asks CMake for llama.cpp's `common` library (argument
# parsing, chat parsing, downloads, cpp-httplib). abserve uses none of it: llama-cpp-2's own
# `common` feature is off, so nothing links against it. Without it the llama.cpp part of the CPU
# release build took 148 s instead of 456 s on 2 cores (measured 2026-12-03). A normal variable
# set here shadows the cache entry the build script defines (policy CMP0077: option() leaves an
# existing normal variable alone).
set(LLAMA_BUILD_COMMON OFF)

# No floating-point contraction in llama.cpp's C and C++ code: the compiler may not fuse a
# multiply and an add that the source writes separately into one FMA instruction (the kernels'
# explicit FMA intrinsics are unaffected). GCC contracts by default (-ffp-contract=fast) and
# whether it does at a given line depends on its version: llama.cpp's prebuilt server (the
# xllamacpp wheel, GCC 10.2.1) leaves a multiply-add of the CPU flash-attention path unfused
# where GCC 12 fuses it, and greedy answers parted on 13 of 32 prompts. Built without
# contraction, the same sources give that server's logits bit for bit (docs/benchmarks.md,
# "Same answers as llama.cpp's server").
if (CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-ffp-contract=off>")
endif()

# llama.cpp at -O3 whatever Cargo's profile says. llama-cpp-sys-2 builds it as RelWithDebInfo
# (-O2 -g) when the Rust profile has debug info (this workspace's release profile keeps line
# tables for profiling) and as Release (-O3) without; at -O2 GCC 12 does not vectorize or unroll
# what the kernels leave to it, and abserve ran 0.79x as fast on the A/B benchmarks (measured
# 2026-12-06, docs/benchmarks.md). The debug build type stays as it is.
foreach(lang C CXX)
    set(CMAKE_${lang}_FLAGS_RELWITHDEBINFO "-O3 -g -DNDEBUG")
endforeach()
