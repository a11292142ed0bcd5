// Elements of a quantized KV cache (paged_core/attention/kv_quant.py): int8_t, Fp8E4M3 and
// Fp8E5M2, one byte each. A cache row is head_dim codes followed by the 4 bytes of its
// float32 scale; the row's values are code * scale. Decoding is exact (every code is a
// float32) and never forms a subnormal float32, so flush-to-zero modes cannot change it;
// encoding (quantize_row) gives the bits of kv_quant.quantize.
#pragma once

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_common.h"
#include "cpu_simd.h"

namespace paged_core_cpu {

// An fp8 code with MBITS mantissa bits and exponent bias BIAS (OCP e4m3fn: 3, 7; e5m2: 2,
// 15): e == 0 is subnormal, m * 2^(1 - BIAS - MBITS); else (2^MBITS + m) * 2^(e - BIAS - MBITS).
// The NaN / inf codes are never written (quantizing clamps to the largest finite value).
template <int MBITS, int BIAS>
struct Fp8 {
  uint8_t bits;
};
using Fp8E4M3 = Fp8<3, 7>;
using Fp8E5M2 = Fp8<2, 15>;

// Cache elements C: quantized (one-byte codes, rows end in a scale) or not (float, bf16).
template <typename C>
constexpr bool kQuantizedCache = sizeof(C) == 1;

// Elements of one cache row of head_dim D.
template <typename C>
constexpr int64_t cache_row(int64_t D) {
  return kQuantizedCache<C> ? D + 4 : D;
}

// The scale of the quantized row at `row` (head_dim D).
template <typename C>
inline float row_scale(const C* row, int D) {
  float s;
  std::memcpy(&s, reinterpret_cast<const char*>(row) + D, sizeof(s));
  return s;
}

template <>
struct Elem<int8_t> {
  static inline float load(int8_t v) { return static_cast<float>(v); }
};

template <int MBITS, int BIAS>
inline float fp8_to_float(uint8_t bits) {
  const int e = (bits & 0x7F) >> MBITS, m = bits & ((1 << MBITS) - 1);
  const float mag = std::ldexp(static_cast<float>(e ? m + (1 << MBITS) : m),
                               (e ? e : 1) - BIAS - MBITS);
  return (bits & 0x80) ? -mag : mag;
}

// Scalar loads go through a table of all 256 codes (built once, on first use).
template <int MBITS, int BIAS>
struct Elem<Fp8<MBITS, BIAS>> {
  static inline float load(Fp8<MBITS, BIAS> v) {
    static const std::array<float, 256> table = [] {
      std::array<float, 256> t{};
      for (int b = 0; b < 256; ++b) t[b] = fp8_to_float<MBITS, BIAS>(static_cast<uint8_t>(b));
      return t;
    }();
    return table[v.bits];
  }
};

// The largest code (kv_quant.max_code): a row's scale maps its absmax to it.
template <typename C>
constexpr float kMaxCode = 127.f;
template <>
constexpr float kMaxCode<Fp8E4M3> = 448.f;
template <>
constexpr float kMaxCode<Fp8E5M2> = 57344.f;

// The code of v, already within [-kMaxCode, kMaxCode]: int8 rounds half to even (torch.round);
// fp8 rounds as torch's float32 -> float8 conversion (c10's own).
inline int8_t encode(float v, int8_t*) { return static_cast<int8_t>(std::nearbyint(v)); }
inline Fp8E4M3 encode(float v, Fp8E4M3*) { return {c10::Float8_e4m3fn(v).x}; }
inline Fp8E5M2 encode(float v, Fp8E5M2*) { return {c10::Float8_e5m2(v).x}; }

// x[0:D] as the cache row at dst (D codes, then the scale), in kv_quant.quantize's float32
// steps: scale = absmax / kMaxCode, code = encode(clamp(x / scale)) (scale 0: all codes 0).
template <typename C>
inline void quantize_row(const float* x, int D, C* dst) {
  float amax = 0.f;
  for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float scale = amax / kMaxCode<C>;
  const float divisor = scale > 0.f ? scale : 1.f;
  for (int d = 0; d < D; ++d) {
    const float v = std::clamp(x[d] / divisor, -kMaxCode<C>, kMaxCode<C>);
    dst[d] = encode(v, static_cast<C*>(nullptr));
  }
  std::memcpy(reinterpret_cast<char*>(dst) + D, &scale, sizeof(scale));
}

#if PAGED_CORE_AVX2
// 8 codes -> float32 (the same values as Elem::load).
inline __m256 load8(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

template <int MBITS, int BIAS>
inline __m256 load8(const Fp8<MBITS, BIAS>* p) {
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i e = _mm256_srli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7F)), MBITS);
  const __m256i m = _mm256_and_si256(x, _mm256_set1_epi32((1 << MBITS) - 1));
  const __m256i normal = _mm256_cmpgt_epi32(e, _mm256_setzero_si256());
  const __m256i mant = _mm256_or_si256(m, _mm256_and_si256(normal, _mm256_set1_epi32(1 << MBITS)));
  // 2^(max(e, 1) - BIAS - MBITS) as float32 bits: always a normal float32.
  const __m256i exp = _mm256_max_epi32(e, _mm256_set1_epi32(1));
  const __m256i pow2 = _mm256_slli_epi32(
      _mm256_add_epi32(exp, _mm256_set1_epi32(127 - BIAS - MBITS)), 23);
  const __m256 mag = _mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_castsi256_ps(pow2));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
  return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}
#endif  // PAGED_CORE_AVX2

// Rows [r0, r1) of a quantized block (rows of D + 4 elements at `rows`) as float32
// code * scale, into out (rows D apart, at the same row indices).
template <typename C>
inline void dequantize_rows(const C* rows, int r0, int r1, int D, float* out) {
  for (int r = r0; r < r1; ++r) {
    const C* row = rows + static_cast<int64_t>(r) * (D + 4);
    const float scale = row_scale(row, D);
    float* o = out + static_cast<int64_t>(r) * D;
    int d = 0;
#if PAGED_CORE_AVX2
    const __m256 sv = _mm256_set1_ps(scale);
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(load8(row + d), sv));
#endif
    for (; d < D; ++d) o[d] = Elem<C>::load(row[d]) * scale;
  }
}

}  // namespace paged_core_cpu
