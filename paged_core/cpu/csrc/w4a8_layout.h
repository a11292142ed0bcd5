// What both W4A8 kernels share (quantized_w4a8.cpp on vpdpbusd, quantized_w4a8_tiles.cpp on
// AMX-INT8 tiles), so that they give the same bits: w4a8_pack's layout, the quantized rows and
// the factors as a call reads them, and how a group's exact integer sums join a row's float32
// totals (add_group: in order of g, one multiply-add, or two where the weight has offsets).
// The layout itself is described in quantized_w4a8.cpp.
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace paged_core_cpu::w4a8 {

constexpr int64_t kOutputs = 32;    // outputs of a column group
constexpr int64_t kQuadBytes = 64;  // a quad (4 features) of a column group's levels
constexpr int32_t kMidLevel = 8;    // a symmetric weight's offsets are -kMidLevel scale

// What a W4A8 kernel reads of one call's rows: their levels [M, K] (token_levels) and float32
// scales [M] and group sums [M, K / G] (integers).
struct QuantizedRows {
  const int8_t* levels;
  const float* scales;
  const float* group_sums;
  int64_t K, groups, quads_per_group;
};

#if defined(__AVX512F__)
// Per-group factors as stored: float32, or float16 (half the bytes a decode step reads).
struct Factors {
  const void* data;
  bool half;

  // The element i places further on.
  Factors at(int64_t i) const {
    return {half ? static_cast<const void*>(static_cast<const uint16_t*>(data) + i)
                 : static_cast<const void*>(static_cast<const float*>(data) + i),
            half};
  }
  // Elements [i, i + 16) as float32.
  __attribute__((target("avx512f")))
  __m512 load(int64_t i) const {
    if (half)
      return _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(data) + i)));
    return _mm512_loadu_ps(static_cast<const float*>(data) + i);
  }
};

// A row's float32 totals of 16 outputs after group g: total + scale * sums (+ offset *
// group_sum where the weight is not symmetric; a symmetric weight's sums already hold the
// -kMidLevel * group_sum its offsets stand for).
template <bool kSymmetric>
__attribute__((always_inline, target("avx512f")))
inline __m512 add_group(__m512 total, __m512 scale, __m512 offset, __m512i sums, float group_sum) {
  total = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), total);
  if constexpr (!kSymmetric) total = _mm512_fmadd_ps(offset, _mm512_set1_ps(group_sum), total);
  return total;
}
#endif

}  // namespace paged_core_cpu::w4a8
