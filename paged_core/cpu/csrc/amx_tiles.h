// AMX tile state for the kernels of the avx512_bf16 build that use AMX tiles (AMX-BF16:
// bf16_amx_linear.cpp, quantized_column_amx.cpp; AMX-INT8: quantized_int8_tiles.cpp,
// quantized_vnni_tiles.cpp, quantized_w4a8_tiles.cpp). Call them only where bf16_amx_ready()
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
// The same with tile t's rows bytes[t] bytes wide (<= 64) instead of 64.
void configure_amx_tiles(const uint8_t (&rows)[8], const uint8_t (&bytes)[8]);
// Every tile 16 rows of 64 bytes (attention_prompt_amx.h's tiles, quantized_column_amx.cpp's
// TripleTiles).
constexpr uint8_t kAllTiles16Rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
// Hands the tile state back (tiles zeroed, the configuration cleared).
void release_amx_tiles();
// configure_amx_tiles for a block of rows (<= 32) of a GEMM: tiles 0, 1 C of rows 0-15
// (outputs 0-15, 16-31), 2, 3 C of rows 16-31, 4, 5 A of rows 0-15, 16-31 (each only as
// many rows as the block has there; none past 16 rows for 2, 3, 5), 6, 7 B of 16 k pairs.
void configure_row_block_tiles(int64_t rows);
// Zeroes the C tiles of such a block: 0, 1 and, past 16 rows (lower), 2, 3.
void zero_row_block_sums(bool lower);

}  // namespace paged_core_cpu
#endif  // __AVX512BF16__
