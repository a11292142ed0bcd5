// AMX tile state for the kernels of the avx512_bf16 build that use AMX-BF16 tiles
// (bf16_amx_linear.cpp, quantized_column_amx.cpp). Call them only where bf16_amx_ready()
// (bf16_dot_linear.h) says the CPU and the OS allow tiles.
#pragma once

#include <cstdint>

#if defined(__AVX512BF16__)
// The tile intrinsics: GCC 11 / clang 12 or later, x86-64 Linux (which grants the state).
#if defined(__x86_64__) && defined(__linux__) && \
    (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define PAGED_CORE_AMX_BUILT 1
#endif

namespace paged_core_cpu {

// This thread's tile configuration (palette 1): tile t has rows[t] rows of 64 bytes (0: the
// tile is unused).
void configure_amx_tiles(const uint8_t (&rows)[8]);
// Hands the tile state back (tiles zeroed, the configuration cleared).
void release_amx_tiles();

}  // namespace paged_core_cpu
#endif  // __AVX512BF16__
