// AVX2 helpers shared by the CPU kernels; PAGED_CORE_AVX2 says whether they exist
// (built with -mavx2 -mfma), else the kernels use their scalar loops. The avx512 builds
// also get 16-lane twins of exp and silu.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>
#define PAGED_CORE_AVX2 1

namespace paged_core_cpu {

// 8 lanes of float32 or bfloat16 (its uint16_t bits) -> float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// exp's constants (Cephes-style: exp(x) = 2^n * p(r), r = x - n ln 2): the clamp below
// which exp is 0, log2(e), ln 2 in two parts, and p's coefficients, highest first.
constexpr float kExpLowest = -87.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                               4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

// exp(x) for x <= 0; relative error ~2e-7, exp(-inf) -> 0.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExpLowest);
  const __m256 is_tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), x);
  __m256 y = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpPoly[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(is_tiny, y);
}

// silu(x) = x * sigmoid(x), with exp only of -|x| (no overflow): sigmoid = 1/(1+t) for
// x >= 0 and t/(1+t) for x < 0, t = exp(-|x|).
inline __m256 silu8(__m256 x) {
  const __m256 abs_x = _mm256_andnot_ps(_mm256_set1_ps(-0.f), x);
  const __m256 t = exp8(_mm256_sub_ps(_mm256_setzero_ps(), abs_x));
  const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), t));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sigmoid = _mm256_blendv_ps(inv, _mm256_mul_ps(t, inv), negative);
  return _mm256_mul_ps(x, sigmoid);
}

#if defined(__AVX512F__)
// The same with 16 lanes (the avx512 builds): lane for lane the bits of exp8 / silu8.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(kExpLowest);
  const __mmask16 is_tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), x);
  __m512 y = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpPoly[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~is_tiny), y);
}

inline __m512 silu16(__m512 x) {
  const __m512 abs_x = _mm512_abs_ps(x);
  const __m512 t = exp16(_mm512_sub_ps(_mm512_setzero_ps(), abs_x));
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), t));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 sigmoid = _mm512_mask_mov_ps(inv, negative, _mm512_mul_ps(t, inv));
  return _mm512_mul_ps(x, sigmoid);
}
#endif

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_AVX2 0
#endif
