// W8A8's product (quantization/w8a8_linear.py) on AMX-INT8 tiles, for calls of many rows (a
// prefill chunk, a large batch): vnni_columns' sums (quantized_linear.cpp) with the multiply-adds
// on the tiles instead of vpdpbusd.
//
// w8a8_vnni_pack's layout already is the B tiles': a group of 16 outputs holds, per 4 k (a
// quad), each output's 4 levels side by side ([K/4][16][4] int8), so 16 quads (64 k, one tile
// step) are one contiguous 1 KB B tile, loaded as it is stored: nothing is widened or restaged.
// The A tiles are the biased rows (each level + 128 as an unsigned byte, vnni_columns' own
// rows) read straight from xu, 64 k a step, so tdpbusd (unsigned times signed bytes) adds the
// same exact int32 products as vpdpbusd, and the sum minus 128 times the output's sum of levels
// (biased_sums) is the exact integer sum. Scaled as vnni_columns scales it (int8_outputs.h),
// every row's outputs are the same bits as vnni_columns', whatever the rows beside it.
//
// Tiles (configure_row_block_tiles): a block of up to 32 rows, C 0, 1 (rows 0-15 x groups g,
// g + 1), C 2, 3 (rows 16-31), A 4, 5 (rows 0-15, 16-31), B 6, 7 (groups g, g + 1). Pairs of
// groups are split between the threads; each runs every block of rows over a chunk of its
// pairs while their levels are in L2, so a call reads the levels from memory once.
//
// Built into the avx512_bf16 level's extension; runs only where amx_int8_ready() (the levels'
// quads come in whole tile steps: vnni_quads).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "amx_tiles.h"
#include "bf16_dot_linear.h"
#include "int8_outputs.h"
#include "quantized_linear.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

constexpr int64_t kStepBytes = 64;     // k (bytes of a row) per tile step
constexpr int64_t kTileBytes = 1024;   // a group's levels of one tile step: 16 quads x 16 x 4
constexpr int64_t kBlockRows = 32;     // rows of a block: two A tiles
constexpr int64_t kTileRows = 16;
constexpr int64_t kChunkBytes = 512 * 1024;  // levels of the pairs a chunk holds (in L2)

#if defined(PAGED_CORE_AMX_BUILT)
// Rows [m0, m0 + rows) (rows <= 32; tiles configured for them) of the call's biased rows times
// its groups g and, where there is one, g + 1: the scaled sums into the call's out.
__attribute__((target("amx-tile,amx-int8"))) void block_times_pair(
    const paged_core_cpu::VnniCall& call, int64_t g, int64_t m0, int64_t rows) {
  const int64_t Kp = call.Kp, steps = call.quads * 4 / kStepBytes;
  const bool two = g + 1 < call.groups, lower = rows > kTileRows;
  const int8_t* p0 = call.packed + g * call.quads * 64;
  const int8_t* p1 = p0 + call.quads * 64;  // read only where `two`
  const uint8_t* x_upper = call.xu + m0 * Kp;
  const uint8_t* x_lower = x_upper + kTileRows * Kp;
  paged_core_cpu::zero_row_block_sums(lower);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, p0 + s * kTileBytes, 64);
    if (two) _tile_loadd(7, p1 + s * kTileBytes, 64);
    _tile_loadd(4, x_upper + s * kStepBytes, Kp);
    _tile_dpbusd(0, 4, 6);
    if (two) _tile_dpbusd(1, 4, 7);
    if (lower) {
      _tile_loadd(5, x_lower + s * kStepBytes, Kp);
      _tile_dpbusd(2, 5, 6);
      if (two) _tile_dpbusd(3, 5, 7);
    }
  }
  alignas(64) int32_t sums[kBlockRows][2][16];  // [row][group of the pair][output]
  constexpr int64_t kRowBytes = sizeof(sums[0]);
  _tile_stored(0, &sums[0][0][0], kRowBytes);
  if (two) _tile_stored(1, &sums[0][1][0], kRowBytes);
  if (lower) {
    _tile_stored(2, &sums[kTileRows][0][0], kRowBytes);
    if (two) _tile_stored(3, &sums[kTileRows][1][0], kRowBytes);
  }
  for (int h = 0; h < (two ? 2 : 1); ++h) {
    const paged_core_cpu::VnniGroupOut group(g + h, call.out.N, call.biased_sums,
                                             call.scales.channel);
    for (int64_t r = 0; r < rows; ++r)
      group.store(_mm512_load_si512(sums[r][h]), call.scales.token[m0 + r], call.out, m0 + r);
  }
}

// The pairs of groups [i0, i1) times every block of rows, on this thread's tiles, a chunk of
// pairs at a time: every block of rows runs over the chunk's levels while they sit in L2
// (kChunkBytes), each block's rows read once per chunk, not once per pair.
void pairs_on_tiles(const paged_core_cpu::VnniCall& call, int64_t i0, int64_t i1) {
  const int64_t M = call.M;
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (2 * call.quads * 64));
  int64_t configured = 0;  // the rows the tiles are configured for
  for (int64_t c0 = i0; c0 < i1; c0 += chunk) {
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, M - m0);
      if (rows != configured) {
        paged_core_cpu::configure_row_block_tiles(rows);
        configured = rows;
      }
      for (int64_t i = c0; i < std::min(i1, c0 + chunk); ++i)
        block_times_pair(call, 2 * i, m0, rows);
    }
  }
  if (configured > 0) paged_core_cpu::release_amx_tiles();
}
#endif

}  // namespace

namespace paged_core_cpu {

at::Tensor vnni_tiles(const at::Tensor& xu, const at::Tensor& packed,
                      const at::Tensor& biased_sums, const at::Tensor& channel_scales,
                      const at::Tensor& token_scales, bool bf16_out) {
  const int64_t quads = packed.size(1);
  TORCH_CHECK(amx_int8_ready() && quads * 4 == xu.size(1) && quads % 16 == 0,
              "vnni_tiles needs AMX-INT8 tiles and w8a8_vnni_pack's levels with their rows");
  const at::Tensor y = scaled_rows(xu.size(0), channel_scales.numel(), bf16_out);
#if defined(PAGED_CORE_AMX_BUILT)
  const VnniCall call(xu, packed, biased_sums, channel_scales, token_scales, y);
  at::parallel_for(0, (call.groups + 1) / 2, 1, [&](int64_t i0, int64_t i1) {
    pairs_on_tiles(call, i0, i1);
  });
#endif
  return y;
}

}  // namespace paged_core_cpu

#endif  // __AVX512BF16__
