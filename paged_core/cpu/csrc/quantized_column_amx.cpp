// The column layout's product (quantized_column_linear.cpp) on AMX tiles, for calls of a few
// to a few dozen rows (a decode step of several sequences): the same sums as the vdpbf16ps
// kernel, exact products of x and the widened levels added in float32 per group, then
// y += s * sums (+ (o - bias s) * the group's sum of x).
//
// Per 32 k (one tdpbf16ps step; a group holds group_size / 32 of them) the 16 k pairs of the
// column group's 32 outputs are widened to bfloat16 (column_layout's widen: exact, 128 + q for
// 4 bits) into two B tiles on the stack, and every pass of up to 32 rows (two A tiles of its
// own rows, read straight from x) multiplies them into four float32 C tiles; where the levels
// say so (8 bits, whose widening costs most) a last pass of 33-48 rows takes three 16-row
// tiles into six C tiles instead (TripleTiles), widening once where two passes would
// widen twice. At a group's end the C tiles are stored and scaled into the rows' float32
// totals. So the levels are widened once per pass instead of once per 4 rows, and the
// multiply-adds run on the tiles.
//
// Measured (30 SmolLM2 layers x 4 projections, distinct weights, 2 threads, one process
// alternating; 2-core Xeon with AMX): 8 rows 4-bit 12.6 ms against the vdpbf16ps kernel's
// 22.7 and the bfloat16 weights' AMX 17.3; 16 rows 17.2 / 41.9 / 17.4 ms.
//
// Rows go out as the vdpbf16ps kernel's do (RowsOut): float32, or bfloat16 rounded as they are
// stored where the caller asks for it. (Stored as float32 and rounded by torch afterwards,
// a decode step of the embedded model in W4A16 took 1.04-1.13x as long at 8 and 16 sequences,
// W8A16 1.04x at 8: one process alternating both, same tokens; Intel(R) Xeon(R) Processor,
// amx_bf16, 2 threads.)
//
// A row's sums depend on it alone (each tile row is its own sum), but tdpbf16ps sums a k pair
// differently from vdpbf16ps: a row's last bits depend on whether its call took the tiles.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_tiles.h"
#include "quantized_column_layout.h"

#if defined(__AVX512BF16__)

namespace paged_core_cpu::column_layout {

#if defined(PAGED_CORE_AMX_BUILT)
namespace {

constexpr int64_t kPairRows = 32;    // rows of a pass on two A tiles of their own rows
constexpr int64_t kTripleRows = 48;  // rows of a pass on three 16-row tiles, one A register
constexpr int64_t kTileRows = 16;

using WidenedPairs = uint16_t[2][16 * 32];  // 16 k pairs of outputs 0-15 and 16-31: B tiles

// The 16 k pairs from p0 of col's 32 outputs, widened (L::widen) into the B tiles b[0]
// (outputs 0-15) and b[1] (16-31); `next` (levels null: none) is fetched meanwhile (into L2:
// kNextLevelsHint), a line of its levels beside each line of col's widened. (Fetched a whole
// group at the group's start, the levels of an 8-bit weight with one scale per channel came as
// bursts of up to 768 lines that the fill buffers could not hold: half of the kernel's time
// sat on the widening's first load, and a decode step of 8 sequences took 20.7 ms against 15.3
// line by line; 16 sequences 22.7 against 19.3; 4-bit, groups of 128, 14.5 against 13.4 at 8
// and 18.8 against 17.1 at 16. Same tokens, one process alternating both; Intel(R) Xeon(R)
// Processor, amx_bf16.)
template <typename L>
inline void widen_step(const ColumnGroup& col, const ColumnGroup& next, int64_t p0,
                       WidenedPairs& b) {
  for (int i = 0; i < 16; ++i) {
    const int64_t at = (p0 + i) * L::kPairBytes;  // this pair's levels, and next's
    if (next.levels != nullptr && starts_line<L>(p0 + i))
      _mm_prefetch(reinterpret_cast<const char*>(next.levels + at), kNextLevelsHint);
    __m512bh lo, hi;
    L::widen(col.levels + at, lo, hi);
    _mm512_store_si512(b[0] + i * 32, reinterpret_cast<__m512i>(lo));
    _mm512_store_si512(b[1] + i * 32, reinterpret_cast<__m512i>(hi));
  }
}

constexpr int64_t kSumsBytes = kColumns * sizeof(float);  // a row of sums

// A pass of up to 32 rows (x's rows, K apart) on tiles of its own rows, configured by
// configure_row_block_tiles(rows): C 0, 1 (rows 0-15 x outputs 0-15, 16-31), C 2, 3 (rows
// 16-31), A 4, 5 (rows 0-15, 16-31: only as many rows as the pass has there), B 6, 7.
struct PairTiles {
  const uint16_t* x;
  const uint16_t* x_lower;  // rows 16..
  int64_t x_stride;         // bytes
  bool lower;               // rows past 16

  PairTiles(const uint16_t* x, int64_t K, int64_t rows)
      : x(x), x_lower(x + kTileRows * K), x_stride(K * static_cast<int64_t>(sizeof(uint16_t))),
        lower(rows > kTileRows) {}

  __attribute__((target("amx-tile,amx-bf16"))) void zero() const {
    _tile_zero(0);
    _tile_zero(1);
    if (lower) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  // The rows' k pairs [p0, p0 + 16) times b into the C tiles.
  __attribute__((target("amx-tile,amx-bf16"))) void step(int64_t p0, const WidenedPairs& b) const {
    _tile_loadd(4, x + 2 * p0, x_stride);
    _tile_loadd(6, b[0], 64);
    _tile_loadd(7, b[1], 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (lower) {
      _tile_loadd(5, x_lower + 2 * p0, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  __attribute__((target("amx-tile,amx-bf16"))) void store(float (*sums)[kColumns]) const {
    _tile_stored(0, &sums[0][0], kSumsBytes);
    _tile_stored(1, &sums[0][16], kSumsBytes);
    if (lower) {
      _tile_stored(2, &sums[16][0], kSumsBytes);
      _tile_stored(3, &sums[16][16], kSumsBytes);
    }
  }
};

// A pass of 33-48 rows on three row tiles of 16 rows sharing each widening, where two passes
// would widen it twice; every tile configured 16 rows (kAllTiles16Rows): C 0-5 (row tile
// t's outputs 0-15, 16-31 in 2t, 2t + 1), A 6 (loaded for each row tile in turn), B 7 (each half loaded
// as the order in step needs it: four loads for six products). The third row tile reads
// rows 32.. from x3 (K apart: x's own, or a zero-padded copy where the pass has fewer than
// 48 rows), so no tile reads past x; its padding rows are never stored.
struct TripleTiles {
  const uint16_t* x;
  const uint16_t* x2;  // rows 16-31
  const uint16_t* x3;  // rows 32..
  int64_t x_stride;    // bytes

  TripleTiles(const uint16_t* x, const uint16_t* x3, int64_t K)
      : x(x), x2(x + kTileRows * K), x3(x3), x_stride(K * static_cast<int64_t>(sizeof(uint16_t))) {}

  __attribute__((target("amx-tile,amx-bf16"))) void zero() const {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
  }
  __attribute__((target("amx-tile,amx-bf16"))) void step(int64_t p0, const WidenedPairs& b) const {
    _tile_loadd(6, x + 2 * p0, x_stride);  // rows 0-15
    _tile_loadd(7, b[0], 64);
    _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(7, b[1], 64);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(6, x2 + 2 * p0, x_stride);  // rows 16-31: b[1] first
    _tile_dpbf16ps(3, 6, 7);
    _tile_loadd(7, b[0], 64);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(6, x3 + 2 * p0, x_stride);
    _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(7, b[1], 64);
    _tile_dpbf16ps(5, 6, 7);
  }
  __attribute__((target("amx-tile,amx-bf16"))) void store(float (*sums)[kColumns]) const {
    _tile_stored(0, &sums[0][0], kSumsBytes);
    _tile_stored(1, &sums[0][16], kSumsBytes);
    _tile_stored(2, &sums[16][0], kSumsBytes);
    _tile_stored(3, &sums[16][16], kSumsBytes);
    _tile_stored(4, &sums[32][0], kSumsBytes);
    _tile_stored(5, &sums[32][16], kSumsBytes);
  }
};

// Rows [0, rows) of a pass (their group sums xsum, `groups` apart) on `tiles` (PairTiles or
// TripleTiles) times column group `col`: row m's 32 outputs to y's row m (masked past N).
// Per group: the C tiles zeroed, every 16 k pairs widened (widen_step, `next` fetched
// meanwhile) and multiplied, the sums stored and scaled into the rows' float32 totals,
// total += s * sums (+ (o - bias s) * the group's sum of x). Each step's levels are widened
// one step ahead, into the other of two buffers: a tile load of levels stored just before
// waits for those stores to reach L1, so the widening of step s + 1 runs while step s's
// tiles load and multiply (the same sums; 30 SmolLM2 layers x 4 projections, 4-bit, one
// process alternating, Intel(R) Xeon(R) Processor, amx_bf16: 2-8 rows 0.87-0.93x the time at
// groups of 32 and 64, alike at 16-24 rows).
template <typename L, typename Tiles>
__attribute__((target("amx-tile,amx-bf16"))) void column_pass(
    const Tiles& tiles, int64_t rows, const float* xsum, const ColumnGroup& col, int64_t groups,
    int64_t group_size, const RowsOut& y, __mmask16 mask_lo, __mmask16 mask_hi,
    const ColumnGroup& next) {
  alignas(64) WidenedPairs b[2];                   // step s's levels in b[s % 2]
  alignas(64) float sums[kTripleRows][kColumns];  // a group's, every row
  alignas(64) float total[kTripleRows][kColumns];
  for (int64_t r = 0; r < rows; ++r) std::fill_n(total[r], kColumns, 0.f);
  const int64_t steps_per_group = group_size / 32, steps = groups * steps_per_group;
  widen_step<L>(col, next, 0, b[0]);
  for (int64_t g = 0; g < groups; ++g) {
    if (next.levels != nullptr) fetch_factors(next, g);
    tiles.zero();
    for (int64_t s = g * steps_per_group; s < (g + 1) * steps_per_group; ++s) {
      if (s + 1 < steps) widen_step<L>(col, next, 16 * (s + 1), b[(s + 1) % 2]);
      tiles.step(16 * s, b[s % 2]);
    }
    tiles.store(sums);
    const GroupFactors<L> factors(col, g);
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < 2; ++h)
        _mm512_store_ps(&total[r][16 * h],
                        factors.add(h, _mm512_load_ps(&sums[r][16 * h]),
                                    L::kOffsets ? xsum[r * groups + g] : 0.f,
                                    _mm512_load_ps(&total[r][16 * h])));
  }
  for (int64_t r = 0; r < rows; ++r) {
    y.store(r, 0, mask_lo, _mm512_load_ps(&total[r][0]));
    y.store(r, 16, mask_hi, _mm512_load_ps(&total[r][16]));
  }
}

}  // namespace

template <typename L>
void amx_column_groups(const uint16_t* x, int64_t M, int64_t K, const float* xsum,
                       const ColumnGroups& w, int64_t c0, int64_t c1, int64_t N,
                       const RowsOut& y) {
  const int64_t groups = K / w.group_size;
  thread_local std::vector<uint16_t> padded;  // a short third row tile, zero-padded to 16 rows
  for (int64_t m = 0; m < M;) {
    // the last 33-48 rows in one pass on three row tiles where L says so; else passes of up
    // to 32 rows on tiles of their own rows
    const int64_t left = M - m;
    const int64_t rows =
        L::kTriplePass && left > kPairRows && left <= kTripleRows ? left : std::min(kPairRows, left);
    const uint16_t* x3 = nullptr;  // a triple pass's third row tile
    if (rows > kPairRows) {
      configure_amx_tiles(kAllTiles16Rows);
      x3 = x + (m + 2 * kTileRows) * K;
      if (rows < kTripleRows) {
        padded.assign(kTileRows * K, 0);
        std::copy_n(x3, (rows - 2 * kTileRows) * K, padded.data());
        x3 = padded.data();
      }
    } else {
      configure_row_block_tiles(rows);
    }
    for (int64_t c = c0; c < c1; ++c) {
      const ColumnGroup next = m == 0 && c + 1 < c1 ? w.column<L>(c + 1, K) : ColumnGroup{};
      const RowsOut out = y.at(m, c * kColumns);
      const __mmask16 lo = lanes_below(N - c * kColumns), hi = lanes_below(N - c * kColumns - 16);
      if (rows > kPairRows)
        column_pass<L>(TripleTiles(x + m * K, x3, K), rows, xsum + m * groups, w.column<L>(c, K),
                       groups, w.group_size, out, lo, hi, next);
      else
        column_pass<L>(PairTiles(x + m * K, K, rows), rows, xsum + m * groups, w.column<L>(c, K),
                       groups, w.group_size, out, lo, hi, next);
    }
    m += rows;
  }
  release_amx_tiles();
}
#else
template <typename L>
void amx_column_groups(const uint16_t*, int64_t, int64_t, const float*, const ColumnGroups&,
                       int64_t, int64_t, int64_t, const RowsOut&) {
  TORCH_CHECK(false, "this build has no AMX tiles");
}
#endif

// Every kind of levels' kernel, for quantized_column_linear.cpp.
#define PAGED_CORE_AMX_COLUMN_GROUPS(L)                                                       \
  template void amx_column_groups<L>(const uint16_t*, int64_t, int64_t, const float*,         \
                                     const ColumnGroups&, int64_t, int64_t, int64_t,          \
                                     const RowsOut&);
PAGED_CORE_AMX_COLUMN_GROUPS(Int4Levels)
PAGED_CORE_AMX_COLUMN_GROUPS(Int7Levels)
PAGED_CORE_AMX_COLUMN_GROUPS(Iq4Levels)
PAGED_CORE_AMX_COLUMN_GROUPS(Int5Levels<16>)
PAGED_CORE_AMX_COLUMN_GROUPS(Int5Levels<0>)
PAGED_CORE_AMX_COLUMN_GROUPS(Int8Levels)
PAGED_CORE_AMX_COLUMN_GROUPS(Int8ZeroLevels)
#undef PAGED_CORE_AMX_COLUMN_GROUPS

}  // namespace paged_core_cpu::column_layout

#endif  // __AVX512BF16__
