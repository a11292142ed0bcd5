// W4A8's product (quantization/w4a8_linear.py) on AMX-INT8 tiles, for calls of many rows (a
// prefill chunk, a large batch): w4a8_rows' sums (quantized_w4a8.cpp) with the multiply-adds on
// the tiles instead of vpdpbusd, and the same bits.
//
// w4a8_pack's quad t of a column group holds, in byte 4j + i, output j's level of feature
// 4t + i in the low nibble and output 16 + j's in the high one: masked, 16 quads (64 features,
// one tile step) are two B tiles as tdpbsud reads them (16 rows of 16 outputs x 4 levels, the
// low nibbles outputs 0-15, the high ones 16-31), one and, one shift and two 64-byte stores a
// quad. A column group's steps are unpacked once per call into the thread's buffer (18-48 KB
// for SmolLM2's 576-1536 features), then every block of rows runs over them: the A tiles are
// the rows' int8 levels (token_levels', the vpdpbusd kernel's own), so tdpbsud (signed rows
// times unsigned levels) adds each group's exact int32 sums S. A symmetric weight's levels are
// unpacked minus 8 (-8..7) for tdpbssd (signed times signed), whose sums are S - 8 R, R the
// group's sum of row levels: the integer the vpdpbusd kernel's sums start from, without
// reading R. Then add_group (w4a8_layout.h) in order of g and the row's scale last: every
// output the vpdpbusd kernel's bits, whatever the rows beside it.
//
// Tiles (configure_row_block_tiles of a block of up to 32 rows): C 0, 1 (rows 0-15 x outputs
// 0-15, 16-31), C 2, 3 (rows 16-31), A 4, 5 (rows 0-15, 16-31), B 6, 7 (outputs 0-15, 16-31).
// The last block of a call of more than 32 rows that does not fill one reads a copy of its
// rows padded with zero rows, so a thread configures its tiles once a call. Each block of rows
// runs over all the groups of a column group, the block's float32 totals (32 x 32) in L1; each
// group's sums join them one group later (two buffers), while the next group's tiles multiply.
// Tried and not kept (the 120 SmolLM2 projections at 512 rows, Intel(R) Xeon(R) Processor,
// amx_bf16, 2026-12-07 00:4x UTC): the totals of every row of the call in L2, each group's
// tiles over every block, 145 against 112 ms; every group's sums of a block stored first and
// the totals of 16 rows kept in registers over the groups, 112 against 97. Each group of 64
// features leaves the tiles as 32 x 32 int32 sums to scale in float32, so at many rows this
// kernel stays behind the bfloat16 weights' AMX-BF16 linear (512 rows: ~1.16x its time).
//
// Built into the avx512_bf16 level's extension; runs only where amx_int8_ready() and the
// groups are whole tile steps (a multiple of 64 features).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "bf16_dot_linear.h"
#include "int8_outputs.h"
#include "quantized_linear.h"
#include "w4a8_layout.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

using namespace paged_core_cpu::w4a8;

constexpr int64_t kStepQuads = 16;     // quads (64 features) of a tile step
constexpr int64_t kTileBytes = 1024;   // a B tile: 16 quads x 16 outputs x 4 levels
constexpr int64_t kBlockRows = 32;     // rows of a block: two A tiles
constexpr int64_t kTileRows = 16;

#if defined(PAGED_CORE_AMX_BUILT)
// One call's operands as the tiles read them.
struct TileCall {
  QuantizedRows x;
  const int8_t* padded_tail;  // the last block's rows, zero rows past M (where M > 32 is no
                              // multiple of 32)
  int64_t M;
  const uint8_t* levels;      // w4a8_pack's [C, K / 4, 64]
  Factors factors;            // w4a8_pack's [C, groups, F, 32]
  int64_t factor_kinds;       // F: 1 (symmetric: scales alone) or 2 (scales, offsets)
  int64_t N;
  paged_core_cpu::ScaledRowsOut out;

  // Rows [m0, m0 + 32) of the levels as the A tiles read them (K bytes apart).
  const int8_t* block(int64_t m0) const {
    return m0 + kBlockRows <= M || M <= kBlockRows ? x.levels + m0 * x.K : padded_tail;
  }
};

// Group g's steps of column group `column` (quads of 64 bytes) as B tiles: per step the low
// nibbles' tile, then the high nibbles'; the levels as they are (0..15, for tdpbsud) or, for a
// symmetric weight, minus 8 (-8..7, signed bytes for tdpbssd: its sums are then S - 8 R).
template <bool kSymmetric>
__attribute__((target("avx512f,avx512bw")))
void unpack_group(const uint8_t* column, int64_t g, int64_t quads_per_group, uint8_t* tiles) {
  const __m512i low = _mm512_set1_epi8(0x0F), mid = _mm512_set1_epi8(kMidLevel);
  for (int64_t q = 0; q < quads_per_group; ++q) {
    const __m512i packed = _mm512_loadu_si512(column + (g * quads_per_group + q) * kQuadBytes);
    __m512i first = _mm512_and_si512(packed, low);
    __m512i second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    if constexpr (kSymmetric) {
      first = _mm512_sub_epi8(first, mid);
      second = _mm512_sub_epi8(second, mid);
    }
    uint8_t* step = tiles + q / kStepQuads * 2 * kTileBytes + q % kStepQuads * kQuadBytes;
    _mm512_storeu_si512(step, first);
    _mm512_storeu_si512(step + kTileBytes, second);
  }
}

// A block's exact int32 sums of one group: [row][half][output].
using BlockSums = int32_t[kBlockRows][2][16];

// Rows [m0, m0 + rows) times group g's unpacked steps: their exact sums into `sums` (a
// symmetric weight's: S - 8 R, its levels unpacked minus 8).
template <bool kSymmetric>
__attribute__((target("amx-tile,amx-int8")))
void block_sums(const TileCall& call, const uint8_t* tiles, int64_t g, int64_t m0, int64_t rows,
                BlockSums& sums) {
  const int64_t K = call.x.K, steps = call.x.quads_per_group / kStepQuads;
  const bool lower = rows > kTileRows;
  const int8_t* upper_rows = call.block(m0) + g * call.x.quads_per_group * 4;
  const int8_t* lower_rows = upper_rows + kTileRows * K;
  paged_core_cpu::zero_row_block_sums(lower);
// C tile c += A tile a (rows) times B tile b (levels): signed levels (a symmetric weight's,
// unpacked minus 8) or unsigned ones. The tile numbers must be literals.
#define PAGED_CORE_W4A8_DOT(c, a, b) \
  do {                               \
    if constexpr (kSymmetric)        \
      _tile_dpbssd(c, a, b);         \
    else                             \
      _tile_dpbsud(c, a, b);         \
  } while (0)
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, tiles + s * 2 * kTileBytes, 64);
    _tile_loadd(7, tiles + s * 2 * kTileBytes + kTileBytes, 64);
    _tile_loadd(4, upper_rows + s * 64, K);
    PAGED_CORE_W4A8_DOT(0, 4, 6);
    PAGED_CORE_W4A8_DOT(1, 4, 7);
    if (lower) {
      _tile_loadd(5, lower_rows + s * 64, K);
      PAGED_CORE_W4A8_DOT(2, 5, 6);
      PAGED_CORE_W4A8_DOT(3, 5, 7);
    }
  }
#undef PAGED_CORE_W4A8_DOT
  constexpr int64_t kRowBytes = sizeof(sums[0]);
  _tile_stored(0, &sums[0][0][0], kRowBytes);
  _tile_stored(1, &sums[0][1][0], kRowBytes);
  if (lower) {
    _tile_stored(2, &sums[kTileRows][0][0], kRowBytes);
    _tile_stored(3, &sums[kTileRows][1][0], kRowBytes);
  }
}

// A block's sums of group g (block_sums') joined to its rows' totals ([row][32], add_group;
// group 0 starts them).
template <bool kSymmetric>
__attribute__((target("avx512f")))
void add_block(const TileCall& call, const Factors& factors, int64_t g, int64_t m0,
               int64_t rows, const BlockSums& sums, float* totals) {
  const int64_t group_factors = call.factor_kinds * kOutputs;
  const int64_t live = std::min(rows, call.M - m0);  // the padded tail's zero rows are not kept
  for (int h = 0; h < 2; ++h) {
    const __m512 scale = factors.load(g * group_factors + 16 * h);
    const __m512 offset = kSymmetric ? _mm512_setzero_ps()
                                     : factors.load(g * group_factors + kOutputs + 16 * h);
    for (int64_t r = 0; r < live; ++r) {
      // the group's sum of row levels (an integer): only the offsets' term reads it
      const float group_sum = kSymmetric ? 0.f : call.x.group_sums[(m0 + r) * call.x.groups + g];
      float* total = totals + r * kOutputs + 16 * h;
      const __m512 before = g == 0 ? _mm512_setzero_ps() : _mm512_load_ps(total);
      _mm512_store_ps(total, add_group<kSymmetric>(before, scale, offset,
                                                   _mm512_load_si512(sums[r][h]), group_sum));
    }
  }
}

// Column groups [c0, c1) of the call on this thread's tiles: each column group's levels
// unpacked once, then every block of rows over all its groups, the block's totals (4 KB) in L1.
// Each block's sums are joined to the totals one group later (two buffers), so their loads do
// not wait on the tile stores just issued; each row's groups still join in order of g.
template <bool kSymmetric>
__attribute__((target("avx512f")))
void columns_on_tiles(const TileCall& call, int64_t c0, int64_t c1) {
  const int64_t M = call.M, groups = call.x.groups, quads = call.x.K / 4;
  const int64_t rows = std::min(M, kBlockRows);  // every block's: the tail is padded
  const int64_t group_bytes = call.x.quads_per_group / kStepQuads * 2 * kTileBytes;
  std::vector<uint8_t> tiles(groups * group_bytes);
  alignas(64) float totals[kBlockRows * kOutputs];
  alignas(64) BlockSums sums[2];
  paged_core_cpu::configure_row_block_tiles(rows);
  for (int64_t c = c0; c < c1; ++c) {
    const uint8_t* column = call.levels + c * quads * kQuadBytes;
    const Factors factors = call.factors.at(c * groups * call.factor_kinds * kOutputs);
    for (int64_t g = 0; g < groups; ++g)
      unpack_group<kSymmetric>(column, g, call.x.quads_per_group, tiles.data() + g * group_bytes);
    const int64_t live = std::min(kOutputs, call.N - c * kOutputs);
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
      for (int64_t g = 0; g < groups; ++g) {
        block_sums<kSymmetric>(call, tiles.data() + g * group_bytes, g, m0, rows, sums[g & 1]);
        if (g > 0)
          add_block<kSymmetric>(call, factors, g - 1, m0, rows, sums[(g - 1) & 1], totals);
      }
      add_block<kSymmetric>(call, factors, groups - 1, m0, rows, sums[(groups - 1) & 1], totals);
      for (int h = 0; h < 2; ++h) {
        const int64_t lanes = std::clamp<int64_t>(live - 16 * h, 0, 16);
        const auto mask = static_cast<__mmask16>((1u << lanes) - 1);
        for (int64_t r = 0; r < std::min(rows, M - m0); ++r)
          call.out.store(m0 + r, c * kOutputs + 16 * h, mask,
                         _mm512_mul_ps(_mm512_load_ps(totals + r * kOutputs + 16 * h),
                                       _mm512_set1_ps(call.x.scales[m0 + r])));
      }
    }
  }
  paged_core_cpu::release_amx_tiles();
}
#endif

}  // namespace

namespace paged_core_cpu {

void w4a8_tiles(const TokenLevels& rows, const at::Tensor& levels, const at::Tensor& factors,
                int64_t group_size, int64_t out_features, const at::Tensor& y) {
  TORCH_CHECK(amx_int8_ready() && group_size % 64 == 0,
              "w4a8_tiles needs AMX-INT8 tiles and groups of a multiple of 64 features");
#if defined(PAGED_CORE_AMX_BUILT)
  const int64_t M = rows.levels.size(0), K = rows.levels.size(1);
  at::Tensor tail;  // the last block's rows padded to a whole block, where a call has several
  if (M > kBlockRows && M % kBlockRows != 0) {
    tail = at::zeros({kBlockRows, K}, rows.levels.options());
    const int64_t last = M / kBlockRows * kBlockRows;
    std::memcpy(tail.data_ptr<int8_t>(), rows.levels.data_ptr<int8_t>() + last * K,
                (M - last) * K);
  }
  const TileCall call{{rows.levels.data_ptr<int8_t>(), rows.scales.data_ptr<float>(),
                       rows.group_sums.data_ptr<float>(), K, K / group_size, group_size / 4},
                      tail.defined() ? tail.data_ptr<int8_t>() : nullptr,
                      M,
                      levels.data_ptr<uint8_t>(),
                      {factors.data_ptr(), factors.scalar_type() == at::kHalf},
                      factors.size(2),
                      out_features,
                      rows_out_of(y)};
  const bool symmetric = factors.size(2) == 1;
  at::parallel_for(0, levels.size(0), 1, [&](int64_t c0, int64_t c1) {
    (symmetric ? columns_on_tiles<true> : columns_on_tiles<false>)(call, c0, c1);
  });
#endif
}

}  // namespace paged_core_cpu

#endif  // __AVX512BF16__
