// Weight-only 8- and 4-bit linears in float32 FMAs straight from the levels, for the CPUs
// without native bfloat16 dot products (the avx2 and avx512 levels' bfloat16 linears:
// quantization/int8_linear.py, int4_linear.py).
//
// Layout (column_groups in quantized_linear.py): W [N, K] = levels q with float32 scales s
// (and zeros z, or offsets) per group of G input features of each output, N a multiple of 32,
// in column groups of 32 outputs:
//   8-bit (column_groups of the levels): [N / 32, K, 32] int8: levels[c, k, j] = q[32 c + j, k];
//   4-bit (int4_columns): [N / 32, K, 16] uint8: byte j of levels[c, k] holds q[32 c + j, k]
//     in its low nibble and q[32 c + 16 + j, k] in its high one (levels 0..15);
//   scales, zeros, offsets [N / 32, K / G, 32] float32, the same order.
// So one 8-byte load holds feature k of 8 outputs (8-bit; of 16, 4-bit): a sign extension (a
// zero extension and a mask or shift) and a conversion make their float32 levels, multiplied
// with a broadcast of each row's x[m, k] into 8 sums at once (Int8Format, Int4Format).
// No horizontal sums, no widened copy of the weight; each row's x is read as float32 from a
// per-call copy laid out [K][rows of a tile].
//
// Sums: every output n of row m is summed over k ascending, in its own lane, from zero:
//   8-bit, one scale per output and no zeros: y[m, n] = s[n] * sum_k q[n, k] x[m, k];
//   8-bit otherwise: y[m, n] = sum_k W[n, k] x[m, k], W[n, k] = q s (+ z) as int8_dequantize
//   computes it (the product rounded, then the zero added: -ffp-contract=off);
//   4-bit (W = q s + o, offsets o = z - 8 s as the row layout's int4_gemm takes them): group
//   by group, y = s[n, g] * sum_{k in g} q[n, k] x[m, k] + (o[n, g] * xs[m, g] + y), xs the
//   row's sum of x over the group (two FMAs per output and group: no work a weight beyond
//   its widening and its FMAs);
// each product added by one FMA. So a row's bits depend on nothing but that row: not on the
// batch, the tile it falls in, or the threads.
//
// Tiles (TileLanes): in 8-lane registers (avx2), up to 2 rows take a whole column group (4
// blocks of 8 outputs, 4 x rows sums) per pass over its levels, more rows go in tiles of at
// most 6 rows (4-bit: 5, kTileRowsOf; the M rows split into tiles of equal size) times 2
// blocks, 12 sums in the 16 vector registers beside the 2 widened blocks and a broadcast, each
// pass widening its 16 outputs' levels again from L1/L2; in 16-lane ones (avx512: 32
// registers) every tile is a whole column group (2 blocks) of up to 12 rows.
// Threads take column groups; while a thread's first pass over a group runs, it fetches the
// next group's levels into L2.
//
// Many rows (fma_columns_dense, which row_layout_dense hands these levels): each column group
// widened once to the bfloat16 of its dequantized weight, straight into bf16_dot_linear's
// packed layout (features k and k + 1 of 8 outputs interleaved by two unpacks, no
// transposition), then that group's row tiles: row_layout_dense's bits for the same weight.
//
// Against the row layout's kernels of the avx2 level (quantized_linear.cpp's row kernel, one
// output's levels widened and shared by up to 10 rows with a horizontal sum per output and
// row; row_layout_dense from 16 rows), 30 SmolLM2 layers x 4 projections, bfloat16 rows, AMD
// EPYC family 25 model 17 capped to avx2, 2 threads, one process alternating (2026-12-06,
// 10:47-10:51 UTC): one scale per output, 1 / 2 / 4 / 8 / 12 / 16 / 32 / 48 / 64 rows 6.4 /
// 6.8 / 9.1 / 14.2 / 17.9 / 22.6 / 39.8 / 54.4 / 73.9 ms against 9.3 / 9.2 / 11.9 / 18.7 /
// 25.9 / 32.6 / 51.2 / 66.5 / 84.1 (bfloat16 weights 9.2 / 8.8 / 9.8 / 16.8 / 18.4 / 23.6 /
// 42.5 / 61.8 / 75.4); groups of 32, 8 / 16 / 32 rows 16.1 / 25.6 / 46.9 against 19.6 / 32.6 /
// 51.6. The same capped to avx512 (its row kernels and bf16_dot tiles 16 lanes wide; 11:54 UTC),
// one scale per output, 1 / 2 / 4 / 8 / 12 / 16 / 24 / 32 rows 9.4 / 10.7 / 13.0 / 14.4 / 20.5
// / 23.5 / 31.4 / 40.0 ms against 10.2 / 12.2 / 16.5 / 17.8 / 29.2 / 31.4 / 39.4 / 45.2
// (bfloat16 weights 10.7 / 10.8 / 11.4 / 13.0 / 17.8 / 20.5 / 28.9 / 36.3); in 8-lane
// registers there the tiles took 22.1 / 26.7 / 36.2 ms at 12 / 16 / 24 rows (11:47 UTC).
// Where the many-rows path takes over: int8_linear.py's COLUMNS_DENSE_ROWS.
//
// 4-bit levels take the same tiles (5 rows at most in 8-lane registers) and many-rows path:
// int4_linear.py's COLUMNS_DENSE_ROWS says how they fared.
//
// Built where bf16_dot_linear is (PAGED_CORE_BF16_DOT: AVX2 and FMA).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "bf16_dot_linear.h"
#include "cpu_simd.h"
#include "quantized_lanes.h"
#include "quantized_linear.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

namespace {

constexpr int64_t kColumns = 32;  // outputs per column group
constexpr int kLanes = 8;         // outputs per block of the widening: a ymm

// The tiles' registers (quantized_lanes.h): a block of outputs is one register of float32 sums.
#if PAGED_CORE_BF16_DOT_ZMM
// 16 lanes and 32 registers: every tile is a whole column group (2 blocks) of up to 12 rows,
// 24 sums.
struct TileLanes : paged_core_cpu::Avx512Lanes {
  static constexpr int kTileRows = 12, kFewRows = 0;
};
#else
// 8 lanes and 16 registers: tiles of up to 6 rows times 2 blocks (12 sums), or of up to 2 rows
// times the group's 4 blocks.
struct TileLanes : paged_core_cpu::Avx2Lanes {
  static constexpr int kTileRows = 6, kFewRows = 2;
};
#endif
using V = TileLanes;
constexpr int kBlocks = kColumns / V::kLanes;  // a column group's blocks

// 8-bit levels: byte j of a feature's 32 is output j's level.
struct Int8Format {
  static constexpr int64_t kFeatureBytes = kColumns;
  static constexpr float kCenter = 0.f;
  // The float32 levels of block b (outputs b L::kLanes on) of a feature's bytes.
  template <typename L>
  static typename L::F block(const uint8_t* feature, int b) {
    return L::to_float(L::signed_bytes(feature + b * L::kLanes));
  }
  static float level(const uint8_t* feature, int64_t j) {
    return static_cast<int8_t>(feature[j]);
  }
};

// 4-bit levels: byte j of a feature's 16 holds output j's level in its low nibble, output
// j + 16's in its high one; a level v stands for v - 8 (kCenter; exact in float32).
struct Int4Format {
  static constexpr int64_t kFeatureBytes = kColumns / 2;
  static constexpr float kCenter = 8.f;
  template <typename L>
  static typename L::F block(const uint8_t* feature, int b) {
    const int first = b * L::kLanes;  // the block's first output
    const typename L::I bytes = L::unsigned_bytes(feature + first % 16);
    return first < 16 ? L::low_nibbles(bytes) : L::high_nibbles(bytes);
  }
  static float level(const uint8_t* feature, int64_t j) {
    return static_cast<float>(j < 16 ? feature[j] & 15 : feature[j - 16] >> 4);
  }
};

// The values levels stand for (a level minus the format's kCenter): block b of a feature's
// bytes in L's registers, and output j's alone.
template <typename Format, typename L>
typename L::F centered_block(const uint8_t* feature, int b) {
  const typename L::F q = Format::template block<L>(feature, b);
  if constexpr (Format::kCenter != 0.f) return L::add(q, L::set1(-Format::kCenter));
  return q;
}
template <typename Format>
float centered_level(const uint8_t* feature, int64_t j) {
  return Format::level(feature, j) - Format::kCenter;
}

// The columns layout of one weight; x as tiles of rows ([K][rows] float32 each).
struct Columns {
  const uint8_t* levels;  // [C, K, Format::kFeatureBytes]
  const float* scales;    // [C, groups, 32]
  const float* zeros;     // [C, groups, 32] or null: the zeros, or the offsets (Factors)
  int64_t K, G, N;        // N = 32 * the column groups
};

struct Tile {
  const float* x;  // [K][rows_apart]: feature k of the tile's rows, rows_apart floats apart
  int64_t rows_apart, m0;
  float* y;             // [M, N] float32
  const float* x_sums;  // [M, groups]: each row's sum of x over each group (kGroupEnd), or null
};

// How a tile takes the factors (8-bit: scales, any zeros; 4-bit: scales and offsets): one
// scale per output, applied to the sums (kAtEnd); each group's scales (and zeros) applied to
// the levels as they are widened (kScales, kScalesZeros); or each group's sums of the levels
// times x taken into y at the group's end, y = s * sums + (offset * x's sum over the group +
// y) (kGroupEnd).
enum class Factors { kAtEnd, kScales, kScalesZeros, kGroupEnd };

// The most rows of a tile of 2 blocks past V::kFewRows rows: in 16 registers a tile taking each
// group's factors at its end (kGroupEnd) keeps one row fewer, so that its sums, the group's
// scales, offsets and x's sums fit beside one another (30 SmolLM2 layers x 4 projections of
// 16 rows, 4-bit, AMD EPYC family 25 model 17 capped to avx2, 2026-12-06: 6-row tiles took
// 25.5 ms in one build and 39.1 in the next after an unrelated edit, spills most likely;
// 5-row tiles 26.8, bfloat16 weights 22.9-24.9).
template <Factors F>
constexpr int kTileRowsOf = F == Factors::kGroupEnd && V::kLanes == 8 ? V::kTileRows - 1 : V::kTileRows;

// y of the tile's rows and blocks [first, first + NB) of column group c after group g, whose
// sums of the levels times x are acc (kGroupEnd).
template <int MT, int NB>
void take_group(const Columns& w, int64_t c, int first, int64_t g, const Tile& tile,
                const V::F (&acc)[MT][NB]) {
  const int64_t groups = w.K / w.G, factors = (c * groups + g) * kColumns + first * V::kLanes;
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const V::F s = V::load(w.scales + factors + b * V::kLanes);
    const V::F offset = V::load(w.zeros + factors + b * V::kLanes);
    const int64_t n = c * kColumns + (first + b) * V::kLanes;
#pragma GCC unroll 12
    for (int m = 0; m < MT; ++m) {
      float* out = tile.y + (tile.m0 + m) * w.N + n;
      const V::F x_sum = V::broadcast(tile.x_sums + (tile.m0 + m) * groups + g);
      const V::F before = g == 0 ? V::zero() : V::load(out);
      V::store(out, V::fmadd(acc[m][b], s, V::fmadd(x_sum, offset, before)));
    }
  }
}

// Rows [tile.m0, tile.m0 + MT) times blocks [first, first + NB) of column group c, whose
// levels (in Format) are `levels`; fetches `next` (a group's levels, or null) into L2
// meanwhile, a line every 64 bytes of features.
template <typename Format, int MT, int NB, Factors F>
void column_tile(const Columns& w, int64_t c, const uint8_t* levels, int first, const Tile& tile,
                 const uint8_t* next) {
  constexpr int64_t kBytes = Format::kFeatureBytes;
  constexpr int64_t kFeaturesPerLine = std::max<int64_t>(1, 64 / kBytes);
  V::F acc[MT][NB];
#pragma GCC unroll 12
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) acc[m][b] = V::zero();
  const int64_t groups = w.K / w.G, factor0 = c * groups * kColumns + first * V::kLanes;
  for (int64_t g = 0; g < groups; ++g) {
    const float* scales = w.scales + factor0 + g * kColumns;
    const float* zeros = F == Factors::kScalesZeros ? w.zeros + factor0 + g * kColumns : nullptr;
    for (int64_t k = g * w.G; k < (g + 1) * w.G; ++k) {
      if (next != nullptr && k % kFeaturesPerLine == 0)
        _mm_prefetch(reinterpret_cast<const char*>(next + k * kBytes), _MM_HINT_T1);
      V::F q[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        q[b] = Format::template block<V>(levels + k * kBytes, first + b);
        if constexpr (F == Factors::kScales || F == Factors::kScalesZeros)
          q[b] = V::mul(q[b], V::load(scales + b * V::kLanes));
        if constexpr (F == Factors::kScalesZeros) q[b] = V::add(q[b], V::load(zeros + b * V::kLanes));
      }
#pragma GCC unroll 12
      for (int m = 0; m < MT; ++m) {
        const V::F xv = V::broadcast(tile.x + k * tile.rows_apart + m);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) acc[m][b] = V::fmadd(q[b], xv, acc[m][b]);
      }
    }
    if constexpr (F == Factors::kGroupEnd) {
      take_group<MT, NB>(w, c, first, g, tile, acc);
#pragma GCC unroll 12
      for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) acc[m][b] = V::zero();
    }
  }
  if constexpr (F == Factors::kGroupEnd) return;
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const int64_t n = c * kColumns + (first + b) * V::kLanes;
    const V::F s = F == Factors::kAtEnd ? V::load(w.scales + factor0 + b * V::kLanes) : V::zero();
#pragma GCC unroll 12
    for (int m = 0; m < MT; ++m)
      V::store(tile.y + (tile.m0 + m) * w.N + n, F == Factors::kAtEnd ? V::mul(acc[m][b], s) : acc[m][b]);
  }
}

// column_tile of `rows` rows (MT counting up to the tile's most).
template <typename Format, int MOST, int NB, Factors F, int MT = 1>
void any_column_tile(int rows, const Columns& w, int64_t c, const uint8_t* levels, int first,
                     const Tile& tile, const uint8_t* next) {
  if (rows == MT) return column_tile<Format, MT, NB, F>(w, c, levels, first, tile, next);
  if constexpr (MT < MOST)
    return any_column_tile<Format, MOST, NB, F, MT + 1>(rows, w, c, levels, first, tile, next);
}

// Every tile of column groups [c0, c1), rows in tiles of tile_rows (x: [tiles][K][tile_rows]).
template <typename Format, Factors F>
void column_groups(const Columns& w, const float* xt, const float* x_sums, int64_t M,
                   int64_t tile_rows, float* y, int64_t c0, int64_t c1) {
  const int64_t tiles = (M + tile_rows - 1) / tile_rows;
  const int blocks = M <= V::kFewRows ? kBlocks : 2;
  for (int64_t c = c0; c < c1; ++c) {
    const uint8_t* levels = w.levels + c * w.K * Format::kFeatureBytes;
    const uint8_t* next = c + 1 < c1 ? levels + w.K * Format::kFeatureBytes : nullptr;
    for (int64_t t = 0; t < tiles; ++t) {
      const int rows = static_cast<int>(std::min(tile_rows, M - t * tile_rows));
      const Tile tile{xt + t * w.K * tile_rows, tile_rows, t * tile_rows, y, x_sums};
      for (int first = 0; first < kBlocks; first += blocks) {
        const uint8_t* fetch = t == 0 && first == 0 ? next : nullptr;
        if (V::kFewRows > 0 && blocks == kBlocks)
          any_column_tile<Format, V::kFewRows, kBlocks, F>(rows, w, c, levels, first, tile, fetch);
        else
          any_column_tile<Format, kTileRowsOf<F>, 2, F>(rows, w, c, levels, first, tile, fetch);
      }
    }
  }
}

// Column group c of W in bf16_dot_linear's packed layout, out[p * 64 + 2 j + e] = bfloat16 of
// W[32 c + j, 2 p + e] = q s (+ z) (int8_dequantize's / int4_dequantize's float32 value, q the
// centered level, rounded to nearest even): the bits row_layout_dense widens the row layout's
// levels to, with no transposition here (features k and k + 1 of 8 outputs: two loads, their
// pairs interleaved by two unpacks).
template <typename Format>
void widen_column_group(const Columns& w, int64_t c, uint16_t* out) {
  using L = paged_core_cpu::Avx2Lanes;
  constexpr int64_t kBytes = Format::kFeatureBytes;
  const int64_t groups = w.K / w.G;
  const uint8_t* levels = w.levels + c * w.K * kBytes;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t factors = (c * groups + g) * kColumns;
    for (int b = 0; b < kColumns / kLanes; ++b) {
      const __m256 s = _mm256_loadu_ps(w.scales + factors + b * kLanes);
      const __m256 z = w.zeros != nullptr ? _mm256_loadu_ps(w.zeros + factors + b * kLanes) : _mm256_setzero_ps();
      for (int64_t k = g * w.G; k < (g + 1) * w.G; k += 2) {
        __m256 even = _mm256_mul_ps(centered_block<Format, L>(levels + k * kBytes, b), s);
        __m256 odd = _mm256_mul_ps(centered_block<Format, L>(levels + (k + 1) * kBytes, b), s);
        if (w.zeros != nullptr) even = _mm256_add_ps(even, z), odd = _mm256_add_ps(odd, z);
        const __m128i e = paged_core_cpu::bf16_bits8_rne(even), o = paged_core_cpu::bf16_bits8_rne(odd);
        auto* pairs = reinterpret_cast<__m128i*>(out + k / 2 * 2 * kColumns + 2 * b * kLanes);
        _mm_storeu_si128(pairs, _mm_unpacklo_epi16(e, o));
        _mm_storeu_si128(pairs + 1, _mm_unpackhi_epi16(e, o));
      }
    }
  }
}

// Calls f(Format{}) with the format of levels' dtype: int8 (8-bit) or uint8 (4-bit).
template <typename Fn>
decltype(auto) with_format(const at::Tensor& levels, Fn&& f) {
  if (levels.scalar_type() == at::kByte) return f(Int4Format{});
  return f(Int8Format{});
}

// Checks levels and the per-group factors (scales, then the zeros or offsets: `added`)
// against the layout; returns K.
int64_t check_columns(const at::Tensor& levels, const at::Tensor& scales,
                      const std::optional<at::Tensor>& added, int64_t group_size) {
  const bool int4 = levels.scalar_type() == at::kByte;
  TORCH_CHECK((int4 || levels.scalar_type() == at::kChar) && levels.dim() == 3 &&
                  levels.is_contiguous() && levels.size(2) == (int4 ? kColumns / 2 : kColumns),
              "levels must be column groups [N / 32, K, 32] of int8 or int4_columns' [N / 32, K, "
              "16] uint8");
  TORCH_CHECK(added.has_value() || !int4, "4-bit levels need their offsets (zeros)");
  const int64_t K = levels.size(1);
  TORCH_CHECK(group_size > 0 && K % group_size == 0, "group_size must divide the input features");
  for (const at::Tensor* t : {&scales, added ? &*added : nullptr})
    TORCH_CHECK(t == nullptr || (t->scalar_type() == at::kFloat && t->is_contiguous() &&
                                 t->sizes() == at::IntArrayRef({levels.size(0), K / group_size, kColumns})),
                "scales, zeros and offsets must be column groups [N / 32, K / group_size, 32] of "
                "float32");
  return K;
}

Columns columns_of(const at::Tensor& levels, const at::Tensor& scales,
                   const std::optional<at::Tensor>& added, int64_t K, int64_t group_size) {
  return Columns{static_cast<const uint8_t*>(levels.const_data_ptr()), scales.const_data_ptr<float>(),
                 added ? added->const_data_ptr<float>() : nullptr, K, group_size,
                 levels.size(0) * kColumns};
}

}  // namespace

namespace paged_core_cpu {

at::Tensor fma_columns_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                            const std::optional<at::Tensor>& offsets, int64_t group_size) {
  const int64_t K = check_columns(levels, scales, offsets, group_size);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() && x.size(1) == K,
              "x must be float32 [M, K] of K = the levels' features");
  const int64_t M = x.size(0), C = levels.size(0), groups = K / group_size;
  const Columns w = columns_of(levels, scales, offsets, K, group_size);
  at::Tensor y = at::empty({M, w.N}, x.options());
  if (M == 0 || w.N == 0) return y;
  const bool int4 = levels.scalar_type() == at::kByte;  // 4-bit: Factors::kGroupEnd
  const int most = M <= V::kFewRows ? static_cast<int>(M)
                   : int4         ? kTileRowsOf<Factors::kGroupEnd>
                                  : kTileRowsOf<Factors::kScales>;
  const int64_t tiles = (M + most - 1) / most, tile_rows = (M + tiles - 1) / tiles;
  // x by tiles: [tiles][K][tile_rows] (a last tile's rows past M are never read; one row is
  // already so laid out); on threads only from 64K values: below that, waking them
  // (OMP_WAIT_POLICY=PASSIVE) cost more than it saved (30 SmolLM2 layers x 4 projections, 16
  // rows, 2 threads, AMD EPYC family 25 model 17 capped to avx2, 2026-12-06: 28.1 ms on
  // threads against 23.3 for the same tiles without)
  const float* xp = x.const_data_ptr<float>();
  at::Tensor xt = M == 1 ? x : at::empty({tiles, K, tile_rows}, x.options());
  const float* xtp = xt.const_data_ptr<float>();
  if (M > 1) {
    float* dst = xt.data_ptr<float>();
    at::parallel_for(0, M, std::max<int64_t>(1, (int64_t{1} << 16) / K), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = 0; k < K; ++k)
          dst[(m / tile_rows) * K * tile_rows + m % tile_rows + k * tile_rows] = xp[m * K + k];
    });
  }
  float* yp = y.data_ptr<float>();
  if (int4) {  // the offsets, at each group's end
    const std::vector<float> x_sums = group_sums_of(xp, M, K, group_size);
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      column_groups<Int4Format, Factors::kGroupEnd>(w, xtp, x_sums.data(), M, tile_rows, yp, c0, c1);
    });
    return y;
  }
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    if (offsets)  // 8-bit offsets are the zeros
      column_groups<Int8Format, Factors::kScalesZeros>(w, xtp, nullptr, M, tile_rows, yp, c0, c1);
    else if (groups > 1)
      column_groups<Int8Format, Factors::kScales>(w, xtp, nullptr, M, tile_rows, yp, c0, c1);
    else
      column_groups<Int8Format, Factors::kAtEnd>(w, xtp, nullptr, M, tile_rows, yp, c0, c1);
  });
  return y;
}

at::Tensor fma_columns_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                             const std::optional<at::Tensor>& zeros, int64_t group_size) {
  const int64_t K = check_columns(levels, scales, zeros, group_size);
  TORCH_CHECK(K % 2 == 0 && group_size % 2 == 0, "fma_columns_dense: an even group_size");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, K] of K = the levels' features");
  const at::Tensor rows = x.to(at::kBFloat16).contiguous();
  const Columns w = columns_of(levels, scales, zeros, K, group_size);
  at::Tensor y = at::empty({rows.size(0), w.N}, rows.options());
  with_format(levels, [&](auto format) {
    using Format = decltype(format);
    const GroupWeights weights{nullptr, [&w](int64_t c0, int64_t c1, uint16_t* out) {
                                 for (int64_t c = c0; c < c1; ++c)
                                   widen_column_group<Format>(w, c, out + (c - c0) * w.K * kColumns);
                               },
                               static_cast<const char*>(levels.const_data_ptr()),
                               K * Format::kFeatureBytes};
    bf16_dot_rows(static_cast<const uint16_t*>(rows.const_data_ptr()), K, rows.size(0), weights,
                  K / 2, levels.size(0), nullptr, static_cast<uint16_t*>(y.mutable_data_ptr()), w.N);
  });
  return y;
}

at::Tensor fma_columns_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& zeros, int64_t group_size) {
  const int64_t K = check_columns(levels, scales, zeros, group_size);
  const Columns w = columns_of(levels, scales, zeros, K, group_size);
  const int64_t C = levels.size(0), groups = K / group_size;
  at::Tensor out = at::empty({w.N, K}, scales.options());
  float* wp = out.data_ptr<float>();
  with_format(levels, [&](auto format) {
    using Format = decltype(format);
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < kColumns; ++j) {
            const int64_t factor = (c * groups + k / group_size) * kColumns + j;
            float v = centered_level<Format>(w.levels + (c * K + k) * Format::kFeatureBytes, j) *
                      w.scales[factor];
            if (w.zeros != nullptr) v += w.zeros[factor];
            wp[(c * kColumns + j) * K + k] = v;
          }
    });
  });
  return out;
}

}  // namespace paged_core_cpu

#endif  // PAGED_CORE_BF16_DOT
