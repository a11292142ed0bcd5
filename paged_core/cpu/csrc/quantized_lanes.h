// The vector registers the weight-only quantized kernels widen levels into: quantized_linear.cpp's
// row kernels (float32 x, one horizontal sum per output) and quantized_fma_columns.cpp's tiles
// (a broadcast of x per row, sums stored as they are). Each extends cpu_simd.h's float32 lanes
// of the same width with the loads, widenings and stores of levels.
#pragma once

#include <cstdint>

#include "cpu_simd.h"

namespace paged_core_cpu {

#if PAGED_CORE_AVX2
// 8 float32 lanes (AVX2) or 16 (AVX-512), each lane one level, widened from kLanes bytes of
// levels at a time.
struct Avx2Lanes : Lanes8 {
  using I = __m256i;
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static I unsigned_bytes(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I signed_bytes(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static F low_nibbles(I v) { return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))); }
  static F high_nibbles(I v) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }
  static F broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static float sum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
#endif

#if PAGED_CORE_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
struct Avx512Lanes : Lanes16 {
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static I unsigned_bytes(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I signed_bytes(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F low_nibbles(I v) { return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))); }
  static F high_nibbles(I v) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }
  static F broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static float sum(F v) { return _mm512_reduce_add_ps(v); }
};
#endif

}  // namespace paged_core_cpu
