// Weight-only 4- and 8-bit linears of many bfloat16 rows at the avx2 and avx512 levels
// (row_layout_dense): the row layout's levels (quantized_linear.cpp) widened one column group
// of 32 outputs at a time into bf16_dot_linear's packed layout, each weight the bfloat16 of
// int4_dequantize's / int8_dequantize's float32 value, right before bf16_dot_rows's row tiles
// read that group from L1/L2. The whole weight is never written out, in any width.
//
// What it replaces there: every call of 24 rows or more dequantized the whole weight to
// float32 (4 bytes a weight, written then read) and multiplied it with oneDNN's float32 GEMM,
// ~0.25 ms a projection per step on a 2-core AVX2 EPYC, so that a long-tailed mix ran W4A16
// at 0.74-0.80x bfloat16 there. The avx512_bf16 level keeps the column layout instead
// (quantized_column_linear.cpp's column_dense, the same idea on levels already in column
// groups).
//
// Widening: 4 outputs x 8 features at a time, each output's 8 weights dequantized in float32
// lanes exactly as the dequantize ops compute them (no contraction: the build has
// -ffp-contract=off), rounded to bfloat16 (to nearest even), and the 4 x 4 pairs transposed
// into the packed layout's pair rows; the last outputs of a column group that N cuts (those
// past N: zeros) go value by value. Groups of features are a multiple of 16, as the row
// kernels need them. A 4-bit group's weights can take only 16 values per output: those are
// computed and rounded once per (output, group) into two 16-byte tables, and each level is
// looked up (vpshufb), the same bits for about a third of the instructions. That halved the
// widening's cost (30 SmolLM2 layers x 4 projections, 4-bit groups of 64, against computing
// every value; before / after processes alternated three times, AMD EPYC family 25 model 17
// capped to the level, 2 threads, 2026-12-06: avx2 16 rows 36.8-38.7 / 30.9-33.2 ms, 64 rows
// 86.9-104.0 / 83.4-89.0, bfloat16 weights 22.6-24.2 and 73.7-79.8; avx512 16 rows
// 36.4-37.9 / 27.9-32.9, 64 rows 83.5-85.5 / 74.7-81.4, bfloat16 weights 19.6-20.7 and
// 65.0-69.0).
//
// Fetching: while a thread's row tiles read one widened group, they fetch the levels of the
// thread's next group into L2, a share of its lines per full row tile (GroupWeights::source, as
// bf16_dot_rows fetches packed weights ahead; a last group of fewer than 32 outputs is fetched
// as if whole: prefetches past the levels never fault). Without it, each group's widening
// waited on its levels' misses, four outputs' short rows at a time: 30 SmolLM2 layers x 4
// projections, one process switching per call between the two (AMD EPYC family 25 model 17
// capped to the level, 2 threads, 2026-12-06), avx2: 8-bit (one scale per channel) 12 / 16 / 32
// / 64 rows 30.2 / 33.2 / 54.6 / 89.9 ms against 37.6 / 39.9 / 59.9 / 107.9, 4-bit (groups of
// 64) 25.3 / 30.3 / 50.8 / 86.1 against 27.9 / 31.7 / 52.4 / 90.7 (bfloat16 weights 19.2 / 24.7
// / 46.4 / 83.4); avx512: 8-bit 16 / 32 / 64 rows 31.0 / 49.5 / 82.4 against 39.5 / 56.7 /
// 89.8, 4-bit 27.3 / 46.5 / 77.0 against 29.3 / 47.3 / 78.6 (bfloat16 22.6 / 38.1 / 69.5).
//
// Built where bf16_dot_linear is (PAGED_CORE_BF16_DOT: the avx2, avx512 and avx512_bf16
// builds).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "bf16_dot_linear.h"
#include "cpu_common.h"
#include "cpu_simd.h"
#include "quantized_linear.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

namespace {

constexpr int64_t kGroup = 32;  // outputs per packed column group
constexpr int64_t kOutputs = 4; // outputs widened together (a 4 x 4 transposition of pairs)
constexpr int64_t kFeatures = 8;

// The row layout's levels of W [N, K] (see quantized_linear.cpp), G features a group.
struct RowLevels {
  const uint8_t* levels;  // 4-bit: uint8 [N, K / 2]; 8-bit: int8 [N, K]
  const float* scales;    // [N, K / G]
  const float* zeros;     // [N, K / G] (4-bit; 8-bit where W has them), else null
  int64_t N, K, G;
  bool four_bit;

  bool int4() const { return four_bit; }
  int64_t groups() const { return K / G; }
  float zero_at(int64_t n, int64_t g) const { return zeros != nullptr ? zeros[n * groups() + g] : 0.f; }

  // W[n, k] in float32, as int4_dequantize / int8_dequantize give it.
  float weight(int64_t n, int64_t k) const {
    const int64_t g = k / G, j = k - g * G;
    const float scale = scales[n * groups() + g];
    if (!int4()) {
      const float w = static_cast<float>(reinterpret_cast<const int8_t*>(levels)[n * K + k]) * scale;
      return zeros != nullptr ? w + zero_at(n, g) : w;
    }
    const uint8_t byte = levels[n * (K / 2) + g * G / 2 + (j < G / 2 ? j : j - G / 2)];
    const float level = static_cast<float>(j < G / 2 ? byte & 15 : byte >> 4);
    return (level - 8.f) * scale + zeros[n * groups() + g];
  }

  // Column group c of W in bf16_dot_linear's packed layout: out[p * 64 + 2 j + e] =
  // bfloat16(W[32 c + j, 2 p + e]), 0 for outputs from N on.
  void widen_group(int64_t c, uint16_t* out) const {
    for (int64_t j0 = 0; j0 < kGroup; j0 += kOutputs) {
      const int64_t n0 = c * kGroup + j0;
      if (n0 + kOutputs <= N) {
        if (int4()) widen_outputs<true>(n0, out + 2 * j0);
        else widen_outputs<false>(n0, out + 2 * j0);
        continue;
      }
      for (int64_t j = j0; j < j0 + kOutputs; ++j)
        for (int64_t k = 0; k < K; ++k)
          out[k / 2 * 2 * kGroup + 2 * j + k % 2] =
              c * kGroup + j < N ? paged_core_cpu::float_to_bf16_bits(weight(c * kGroup + j, k)) : 0;
    }
  }

 private:
  // Outputs [n0, n0 + 4), every feature, as bfloat16 pairs: pair row p's 4 pairs (16 bytes)
  // at dst + p * 64. Group by group (its scales and zeros held), 8 features at a time: each
  // output's 8 weights in float32 lanes, the same values as weight() (G % 16 == 0: the 8 lie
  // in one half of the group's nibbles), rounded, then the 4 x 4 pairs transposed.
  template <bool kInt4>
  void widen_outputs(int64_t n0, uint16_t* dst) const {
    const int64_t row_bytes = kInt4 ? K / 2 : K, group_bytes = kInt4 ? G / 2 : G;
    for (int64_t g = 0; g < groups(); ++g) {
      __m256 scale[kOutputs], zero[kOutputs];
      const uint8_t* bytes[kOutputs];
      for (int i = 0; i < kOutputs; ++i) {
        scale[i] = _mm256_set1_ps(scales[(n0 + i) * groups() + g]);
        zero[i] = _mm256_set1_ps(zero_at(n0 + i, g));
        bytes[i] = levels + (n0 + i) * row_bytes + g * group_bytes;
      }
      NibbleTable table[kOutputs];  // 4-bit: each output's 16 weights of the group, rounded
      if constexpr (kInt4)
        for (int i = 0; i < kOutputs; ++i) table[i] = nibble_table(scale[i], zero[i]);
      for (int64_t j = 0; j < G; j += kFeatures) {
        __m128i pairs[kOutputs];  // output i's 4 pairs (j + 2 p, j + 2 p + 1)
        for (int i = 0; i < kOutputs; ++i)
          if constexpr (kInt4) pairs[i] = looked_up_eight(bytes[i], j, table[i]);
          else pairs[i] = paged_core_cpu::bf16_bits8_rne(eight_weights(bytes[i], j, scale[i], zero[i]));
        const __m128i p01_low = _mm_unpacklo_epi32(pairs[0], pairs[1]);   // p0, p1 of outputs 0, 1
        const __m128i p23_low = _mm_unpackhi_epi32(pairs[0], pairs[1]);   // p2, p3 of outputs 0, 1
        const __m128i p01_high = _mm_unpacklo_epi32(pairs[2], pairs[3]);  // ... of outputs 2, 3
        const __m128i p23_high = _mm_unpackhi_epi32(pairs[2], pairs[3]);
        const __m128i rows[4] = {_mm_unpacklo_epi64(p01_low, p01_high), _mm_unpackhi_epi64(p01_low, p01_high),
                                 _mm_unpacklo_epi64(p23_low, p23_high), _mm_unpackhi_epi64(p23_low, p23_high)};
        uint16_t* pair_row = dst + (g * G + j) / 2 * 2 * kGroup;
        for (int p = 0; p < 4; ++p)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(pair_row + p * 2 * kGroup), rows[p]);
      }
    }
  }

  // The bfloat16 bits of the 16 values one output's 4-bit group can hold, (level - 8) * scale
  // + zero rounded to nearest even for level 0 .. 15, as two byte tables for vpshufb.
  struct NibbleTable {
    __m128i low, high;  // the low and the high byte of each value, by level
  };
  static NibbleTable nibble_table(__m256 scale, __m256 zero) {
    const __m256 centred_low = _mm256_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f);
    const __m256 centred_high = _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
    const __m128i first = paged_core_cpu::bf16_bits8_rne(_mm256_add_ps(_mm256_mul_ps(centred_low, scale), zero));
    const __m128i last = paged_core_cpu::bf16_bits8_rne(_mm256_add_ps(_mm256_mul_ps(centred_high, scale), zero));
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i a = _mm_shuffle_epi8(first, split), b = _mm_shuffle_epi8(last, split);  // lows | highs
    return {_mm_unpacklo_epi64(a, b), _mm_unpackhi_epi64(a, b)};
  }

  // Features [j, j + 8) of a 4-bit group (its bytes at `bytes`) as bfloat16 bits, looked up in
  // the output's table: the bits of weight() rounded, in ~5 instructions where computing and
  // rounding each value took ~14 (the levels of the group's first half in the low nibbles).
  __m128i looked_up_eight(const uint8_t* bytes, int64_t j, const NibbleTable& table) const {
    const bool high = j >= G / 2;
    const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + (high ? j - G / 2 : j)));
    const __m128i level = _mm_and_si128(high ? _mm_srli_epi16(eight, 4) : eight, _mm_set1_epi8(15));
    return _mm_unpacklo_epi8(_mm_shuffle_epi8(table.low, level), _mm_shuffle_epi8(table.high, level));
  }

  // Features [j, j + 8) of an 8-bit group (its bytes at `bytes`) in float32: level * scale
  // (+ zero where W has zeros).
  __m256 eight_weights(const uint8_t* bytes, int64_t j, __m256 scale, __m256 zero) const {
    const auto* eight = reinterpret_cast<const __m128i*>(bytes + j);
    const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(eight))), scale);
    return zeros != nullptr ? _mm256_add_ps(w, zero) : w;
  }
};

}  // namespace

namespace paged_core_cpu {

at::Tensor row_layout_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                            const std::optional<at::Tensor>& zeros, int64_t group_size) {
  if (levels.dim() == 3) return fma_columns_dense(x, levels, scales, zeros, group_size);
  const bool int4 = levels.scalar_type() == at::kByte;
  TORCH_CHECK((int4 || levels.scalar_type() == at::kChar) && levels.dim() == 2 && levels.is_contiguous(),
              "levels must be the row layout's uint8 [N, K / 2] (4-bit) or int8 [N, K] (8-bit)");
  TORCH_CHECK(zeros.has_value() || !int4, "4-bit levels need zeros");
  const int64_t N = levels.size(0), K = int4 ? levels.size(1) * 2 : levels.size(1);
  TORCH_CHECK(group_size > 0 && group_size % 16 == 0 && K % group_size == 0,
              "group_size must be a multiple of 16 dividing the input features");
  for (const at::Tensor* t : {&scales, zeros ? &*zeros : nullptr}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() &&
                    t->sizes() == at::IntArrayRef({N, K / group_size}),
                "scales and zeros must be float32 [N, K / group_size]");
  }
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.device().is_cpu(), "x must be [M, K] on CPU");
  const at::Tensor rows = x.to(at::kBFloat16).contiguous();
  at::Tensor y = at::empty({rows.size(0), N}, rows.options());
  const RowLevels w{static_cast<const uint8_t*>(levels.const_data_ptr()), scales.const_data_ptr<float>(),
                    zeros ? zeros->const_data_ptr<float>() : nullptr, N, K, group_size, int4};
  // Column group c's levels: rows [32 c, 32 c + 32) of levels, one run of bytes.
  const GroupWeights weights{nullptr, [&w](int64_t g0, int64_t g1, uint16_t* out) {
                               for (int64_t c = g0; c < g1; ++c) w.widen_group(c, out + (c - g0) * w.K * kGroup);
                             },
                             static_cast<const char*>(levels.const_data_ptr()), kGroup * levels.size(1)};
  bf16_dot_rows(static_cast<const uint16_t*>(rows.const_data_ptr()), K, rows.size(0), weights, K / 2,
                (N + kGroup - 1) / kGroup, nullptr, static_cast<uint16_t*>(y.mutable_data_ptr()), N);
  return y;
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("row_layout_dense(Tensor x, Tensor levels, Tensor scales, Tensor? zeros, int group_size) -> Tensor");
  m.impl("row_layout_dense", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::row_layout_dense));
}

#endif  // PAGED_CORE_BF16_DOT
