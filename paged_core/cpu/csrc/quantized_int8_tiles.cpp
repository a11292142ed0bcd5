// The 8-bit column layout's product (quantized_column_linear.cpp) for a few bfloat16 rows on
// AMX-INT8 tiles: the levels go to the tiles as they are, int8, never widened to bfloat16.
//
// Widening int8 levels to bfloat16 costs more than reading them: on a 2-core Xeon with AMX one
// core widened and summed 64 levels in 4.7-5.0 ns (13-14 GB/s of levels, in L1 or L2), while
// tdpbssd took 64 levels in 1.2-1.4 ns from L2 (a microbenchmark; Intel(R) Xeon(R) Processor,
// amx_bf16).
//
// So the rows come to the levels instead. Each row of x is cut into three 8-bit digits of one
// fixed-point number per value: x[k] ~ n[k] * unit, unit = 2^(E - 21) for the row's largest
// magnitude in [2^E, 2^(E+1)), n[k] = round(x[k] / unit), |n| <= 255 * 2^14, and
// n = d2 * 65536 + d1 * 256 + d0 with balanced digits (each in -128..127). Every value of the
// row within a factor 2^14 of the largest is exact (bfloat16 holds 8 significant bits);
// smaller ones are rounded to a multiple of unit, at most 2^-22 of the largest off: about the
// float32 rounding of the sums themselves. The three digit rows of up to 5 rows of x are
// stacked in one A tile (rows d * stack + m), so one tdpbssd per 64 k (a tile step) and 16
// outputs adds every digit's exact int32 products into one C tile; at a group's end (or every
// 65536 k of one scale per channel, within int32) each row's three sums are joined in float32
// (d2 sum * 65536 + d1 sum * 256 + d0 sum), times the group's scale, and added to the row's
// float32 total in group order; then times the row's unit. A row's sums depend on its values
// alone, whatever the rows beside it (they differ from the widening kernels' in the last
// bits). More rows go in passes of up to 5, each column group running every pass while its
// levels are in L1/L2.
//
// The B tiles need each output's four k of a step beside each other; the column layout holds
// k pairs (byte 2j + e of pair p: output j, k = 2p + e), so each step's levels are restaged
// into two B tiles (one vpermt2w per 64 levels) on the stack right before its products. Tile
// registers are not renamed: a load into a tile that a product still reads waits for it (the
// three digits' A tiles loaded one after another into one register ran 5x slower), so a step
// loads into the A and B tiles the step before did not use.
//
// Built into the avx512_bf16 level's extension; the op exists only there and runs only where
// amx_int8_ready() (the CPU has AMX-INT8 and the OS granted the tile state). Column groups are
// claimed by the threads as they go (claimed_ranges.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "amx_tiles.h"
#include "bf16_dot_linear.h"
#include "claimed_ranges.h"
#include "cpu_common.h"
#include "quantized_column_layout.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

using namespace paged_core_cpu::column_layout;

constexpr int64_t kStep = 64;        // k per tile step
constexpr int64_t kPassRows = 5;     // rows of x per pass: their 3 digits stacked in 15 tile rows
constexpr int64_t kMaxSpan = 65536;  // k per int32 sum: 65536 * 128 * 128 <= 2^31
constexpr int kDigits = 3;
constexpr int kUnitBits = 21;        // unit = 2^(E - 21): |n| <= 255 * 2^14 < 2^22

// Rows [0, M) of x (bfloat16, K apart; M <= stack) as one A tile's rows per k: row d stack + m
// of digits ([3 stack][K]) is digit d of row m, balanced (each in -128..127, n = d2 * 65536 +
// d1 * 256 + d0); unit[m] the row's unit (see the file comment; 0 for a row of zeros, NaN for
// a row holding a NaN or an infinity, which then comes out NaN, as a float product would).
// The tile rows past M (a short last pass) get zero digits.
void cut_rows(const uint16_t* x, int64_t M, int64_t stack, int64_t K, int8_t* digits, float* unit) {
  for (int d = 0; d < kDigits; ++d)
    std::fill_n(digits + (d * stack + M) * K, (stack - M) * K, int8_t{0});
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* row = x + m * K;
    __m512i top = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 32)
      top = _mm512_max_epu16(top, _mm512_and_si512(_mm512_loadu_si512(row + k), _mm512_set1_epi16(0x7FFF)));
    const uint16_t largest = static_cast<uint16_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(
        _mm512_and_si512(top, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(top, 16))));
    const int exponent_bits = largest >> 7;
    int8_t* d0 = digits + m * K;
    int8_t* d1 = d0 + stack * K;
    int8_t* d2 = d1 + stack * K;
    if (largest == 0 || exponent_bits == 0xFF) {  // zeros, or a NaN or infinity
      for (int8_t* d : {d0, d1, d2}) std::fill_n(d, K, 0);
      unit[m] = largest == 0 ? 0.f : std::nanf("");
      continue;
    }
    // E = exponent_bits - 127 (subnormals: the exponent -126 covers them)
    const int e = std::max(exponent_bits, 1) - 127;
    unit[m] = std::ldexp(1.f, e - kUnitBits);
    // x / unit = x * 2^(21 - E), in two exact steps where 2^(21 - E) is past float's range
    const int second = std::max(0, kUnitBits - e - 126);
    const __m512 first_step = _mm512_set1_ps(std::ldexp(1.f, kUnitBits - e - second));
    const __m512 second_step = _mm512_set1_ps(std::ldexp(1.f, second));
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k))), 16));
      __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(v, first_step), second_step));
      for (int8_t* d : {d0, d1}) {  // the low byte as a signed digit, then the rest
        const __m128i digit = _mm512_cvtepi32_epi8(n);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + k), digit);
        n = _mm512_srai_epi32(_mm512_sub_epi32(n, _mm512_cvtepi8_epi32(digit)), 8);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d2 + k), _mm512_cvtepi32_epi8(n));
    }
  }
}

// One tile step of a column group's levels (32 pairs of 64 bytes from `pairs`) as its two B
// tiles: b[h] (outputs 16h .. 16h + 15), row r byte 4n + i = the level of output 16h + n at
// k = 4r + i of the step.
void stage_step(const uint8_t* pairs, int8_t (*b)[16 * 64]) {
  alignas(64) static const int16_t kHalves[2][32] = {
      {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
      {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
  const __m512i lo = _mm512_load_si512(kHalves[0]), hi = _mm512_load_si512(kHalves[1]);
  for (int64_t r = 0; r < 16; ++r) {  // pairs 2r, 2r + 1: k 4r .. 4r + 3
    const __m512i first = _mm512_loadu_si512(pairs + 2 * r * 64);
    const __m512i second = _mm512_loadu_si512(pairs + (2 * r + 1) * 64);
    _mm512_storeu_si512(b[0] + r * 64, _mm512_permutex2var_epi16(first, lo, second));
    _mm512_storeu_si512(b[1] + r * 64, _mm512_permutex2var_epi16(first, hi, second));
  }
}

#if defined(PAGED_CORE_AMX_BUILT)
// Tiles: 0, 1 C (half h: the stacked digit rows' int32 sums, 3 M x 16); 2, 3 A (the stacked
// digits of an even / odd step, 3 M x 64 k); 4, 5 and 6, 7 B (halves 0, 1 of an even / odd
// step). Tile registers are not renamed: a load into a tile waits for the products still
// reading it, so each step loads into the tiles the step before did not use.
void configure_digit_tiles(int64_t rows) {
  const auto r = static_cast<uint8_t>(kDigits * rows);
  const uint8_t tile_rows[8] = {r, r, r, r, 16, 16, 16, 16};
  paged_core_cpu::configure_amx_tiles(tile_rows);
}

// The stacked digits of this pass (3 x stack rows, K apart; its first `rows` rows real) times
// one column group: for each span of k (a group, or kMaxSpan of one), step by step, the step's levels staged into B tiles and
// multiplied into both halves' C tiles; at the span's end each row's three sums joined
// (d2 * 65536 + d1 * 256 + d0, in float32) and scaled into total[rows][32] in span order.
__attribute__((target("amx-tile,amx-int8"))) void column_pass(
    const int8_t* digits, int64_t K, int64_t stack, int64_t rows, const ColumnGroup& col,
    int64_t group_size, float (*total)[kColumns]) {
  constexpr int64_t kStepBytes = kStep / 2 * Int8Levels::kPairBytes;
  alignas(64) int8_t b[2][2][16 * 64];  // [step parity][half]
  alignas(64) int32_t sums[2][kDigits * kPassRows][16];
  const int64_t span = std::min(group_size, kMaxSpan);
  for (int64_t r = 0; r < rows; ++r) std::fill_n(total[r], kColumns, 0.f);
  for (int64_t k0 = 0; k0 < K; k0 += span) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t k = k0; k < k0 + span; k += 2 * kStep) {
      stage_step(col.levels + k / kStep * kStepBytes, b[0]);
      _tile_loadd(2, digits + k, K);
      _tile_loadd(4, b[0][0], 64);
      _tile_loadd(5, b[0][1], 64);
      _tile_dpbssd(0, 2, 4);
      _tile_dpbssd(1, 2, 5);
      if (k + kStep == k0 + span) break;  // an odd number of steps
      stage_step(col.levels + (k / kStep + 1) * kStepBytes, b[1]);
      _tile_loadd(3, digits + k + kStep, K);
      _tile_loadd(6, b[1][0], 64);
      _tile_loadd(7, b[1][1], 64);
      _tile_dpbssd(0, 3, 6);
      _tile_dpbssd(1, 3, 7);
    }
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    const int64_t scales = (k0 / group_size) * kColumns;
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < 2; ++h) {
        const auto digit_sum = [&](int d) {
          return _mm512_cvtepi32_ps(_mm512_load_si512(sums[h][d * stack + r]));
        };
        __m512 joined = _mm512_fmadd_ps(digit_sum(2), _mm512_set1_ps(256.f), digit_sum(1));
        joined = _mm512_fmadd_ps(joined, _mm512_set1_ps(256.f), digit_sum(0));
        _mm512_storeu_ps(total[r] + 16 * h, _mm512_fmadd_ps(joined, col.scales.load16(scales + 16 * h),
                                                            _mm512_loadu_ps(total[r] + 16 * h)));
      }
  }
}

// Rows [0, M), cut into passes of `stack` rows (int8_tile_gemm: digits pass after pass, units
// row by row), times the column groups this thread claims (claimed_ranges.h); each column
// group runs every pass while its levels are in L1/L2, so the levels are read from memory once
// per call.
void int8_tile_groups(const int8_t* digits, const float* unit, int64_t M, int64_t stack, int64_t K,
                      const ColumnGroups& w, int64_t N, const RowsOut& y,
                      paged_core_cpu::ClaimedRanges& claims, int t) {
  const int64_t passes = (M + stack - 1) / stack, pass_bytes = kDigits * stack * K;
  alignas(64) float total[kPassRows][kColumns];
  configure_digit_tiles(stack);
  for (int64_t c = claims.take(t); c >= 0; c = claims.take(t)) {
    const __mmask16 lo = lanes_below(N - c * kColumns), hi = lanes_below(N - c * kColumns - 16);
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t m = p * stack, rows = std::min(stack, M - m);
      column_pass(digits + p * pass_bytes, K, stack, rows, w.column<Int8Levels>(c, K),
                  w.group_size, total);
      for (int64_t r = 0; r < rows; ++r) {
        const __m512 row_unit = _mm512_set1_ps(unit[m + r]);
        y.store(m + r, c * kColumns, lo, _mm512_mul_ps(_mm512_loadu_ps(total[r]), row_unit));
        y.store(m + r, c * kColumns + 16, hi, _mm512_mul_ps(_mm512_loadu_ps(total[r] + 16), row_unit));
      }
    }
  }
  paged_core_cpu::release_amx_tiles();
}
#else
void int8_tile_groups(const int8_t*, const float*, int64_t, int64_t, int64_t, const ColumnGroups&,
                      int64_t, const RowsOut&, paged_core_cpu::ClaimedRanges&, int) {
  TORCH_CHECK(false, "this build has no AMX tiles");
}
#endif

}  // namespace

namespace paged_core_cpu {

at::Tensor int8_tile_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                          int64_t group_size, int64_t out_features,
                          std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(amx_int8_ready(), "int8_tile_gemm needs AMX-INT8 tiles (amx_int8_ready())");
  TORCH_CHECK(levels.scalar_type() == at::kChar && levels.dim() == 3 && levels.is_contiguous() &&
                  levels.size(2) == Int8Levels::kPairBytes &&
                  levels.size(0) == (out_features + kColumns - 1) / kColumns,
              "levels must be column_pack's [ceil(N / 32), K / 2, 64] int8");
  const int64_t K = levels.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % kStep == 0 && K % group_size == 0 &&
                  (group_size <= kMaxSpan || group_size % kMaxSpan == 0),
              "group_size must be a multiple of 64 dividing the input features (and at most "
              "65536 or a multiple of it)");
  TORCH_CHECK((scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf) &&
                  scales.is_contiguous() &&
                  scales.sizes() == at::IntArrayRef({levels.size(0), K / group_size, kColumns}),
              "scales must be column_pack's [ceil(N / 32), K / group_size, 32] float32 or float16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == K && x.is_contiguous(),
              "x must be contiguous bfloat16 [M, ", K, "]");
  const at::ScalarType dtype = out_dtype.value_or(at::kFloat);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "out_dtype must be float32 or bfloat16");
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, out_features}, x.options().dtype(dtype));
  if (M == 0 || out_features == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  const ColumnGroups w{static_cast<const uint8_t*>(levels.const_data_ptr()),
                       factors_of(scales), {}, group_size};
  const bool rounded = dtype == at::kBFloat16;
  const RowsOut out{rounded ? nullptr : y.data_ptr<float>(),
                    rounded ? static_cast<uint16_t*>(y.data_ptr()) : nullptr, out_features};
  // The rows in passes of up to kPassRows rows, all of one size (the last padded with zero
  // digits), cut once for every thread.
  const int64_t passes = (M + kPassRows - 1) / kPassRows, stack = (M + passes - 1) / passes;
  // Every byte is written by cut_rows: no zeroing of the whole buffer on the decode path.
  const std::unique_ptr<int8_t[]> digits(new int8_t[passes * kDigits * stack * K]);
  std::vector<float> unit(passes * stack);
  for (int64_t p = 0; p < passes; ++p)
    cut_rows(xp + p * stack * K, std::min(stack, M - p * stack), stack, K,
             digits.get() + p * kDigits * stack * K, unit.data() + p * stack);
  paged_core_cpu::run_claiming(levels.size(0), [&](paged_core_cpu::ClaimedRanges& claims, int t) {
    int8_tile_groups(digits.get(), unit.data(), M, stack, K, w, out_features, out, claims, t);
  });
  return y;
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("int8_tile_gemm(Tensor x, Tensor levels, Tensor scales, int group_size, "
        "int out_features, ScalarType? out_dtype=None) -> Tensor");
  m.def("amx_int8_ready() -> bool", &paged_core_cpu::amx_int8_ready);
  m.impl("int8_tile_gemm", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::int8_tile_gemm));
}

#endif  // __AVX512BF16__
