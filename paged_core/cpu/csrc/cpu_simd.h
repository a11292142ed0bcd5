// AVX2 helpers shared by the CPU kernels; PAGED_CORE_AVX2 says whether they exist
// (built with -mavx2 -mfma), else the kernels use their scalar loops. exp and silu are
// written once over the lane width (Lanes8; Lanes16 in the avx512 builds).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>
#define PAGED_CORE_AVX2 1

namespace paged_core_cpu {

// 8 bfloat16 (their uint16_t bits) -> float32.
inline __m256 widen_bf16x8(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// 8 lanes of float32 or bfloat16 (its uint16_t bits) -> float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// exp's constants (Cephes-style: exp(x) = 2^n * p(r), r = x - n ln 2): the clamp below
// which exp is 0, log2(e), ln 2 in two parts, and p's coefficients, highest first.
constexpr float kExpLowest = -87.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                               4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

// One register of float32 lanes, for the algorithms below written once for every width:
// 8 lanes (AVX2) and, in the avx512 builds, 16. Same op per lane: the same bits. + - * /
// are the vector types' own operators (GCC and clang vector extensions); what has no
// operator is here.
struct Lanes8 {
  using F = __m256;
  using Mask = __m256;  // all ones where true
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Mask less(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static F select(Mask m, F if_true, F if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  // y * 2^n for whole-number n.
  static F times_pow2(F y, F n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return y * _mm256_castsi256_ps(e);
  }
};

#if defined(__AVX512F__)
struct Lanes16 {
  using F = __m512;
  using Mask = __mmask16;
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F abs(F a) { return _mm512_abs_ps(a); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Mask less(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static F select(Mask m, F if_true, F if_false) { return _mm512_mask_mov_ps(if_false, m, if_true); }
  static F times_pow2(F y, F n) {
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return y * _mm512_castsi512_ps(e);
  }
};
#endif

// exp(x) for x <= 0; relative error ~2e-7, exp(-inf) -> 0.
template <typename V>
inline typename V::F exp_lanes(typename V::F x) {
  const auto lowest = V::set1(kExpLowest);
  const auto is_tiny = V::less(x, lowest);
  x = V::max(x, lowest);
  const auto n = V::round(x * V::set1(kLog2e));
  x = V::fnmadd(n, V::set1(kLn2High), x);
  x = V::fnmadd(n, V::set1(kLn2Low), x);
  auto y = V::set1(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) y = V::fmadd(y, x, V::set1(kExpPoly[i]));
  y = V::fmadd(y, x * x, x + V::set1(1.f));
  return V::select(is_tiny, V::set1(0.f), V::times_pow2(y, n));
}

// silu(x) = x * sigmoid(x), with exp only of -|x| (no overflow): sigmoid = 1/(1+t) for
// x >= 0 and t/(1+t) for x < 0, t = exp(-|x|).
template <typename V>
inline typename V::F silu_lanes(typename V::F x) {
  const auto zero = V::set1(0.f), one = V::set1(1.f);
  const auto t = exp_lanes<V>(zero - V::abs(x));
  const auto inv = one / (one + t);
  return x * V::select(V::less(x, zero), t * inv, inv);
}

inline __m256 exp8(__m256 x) { return exp_lanes<Lanes8>(x); }
inline __m256 silu8(__m256 x) { return silu_lanes<Lanes8>(x); }

// 8 float32 lanes -> their bfloat16 bits, rounded as cpu_common.h's float_to_bf16_bits
// rounds (torch's rounding: to nearest even; NaN -> 0x7FC0).
inline __m128i bf16_bits8_rne(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i half = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF));  // ties to even
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, half), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  // Every lane is below 2^16: packing with unsigned saturation keeps it, in lane order.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#if defined(__AVX512F__)
// 16 lanes of float32 or bfloat16 -> float32 (the avx512 builds).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512 silu16(__m512 x) { return silu_lanes<Lanes16>(x); }

// 16 float32 lanes -> their bfloat16 bits, rounded as cpu_common.h's float_to_bf16_bits
// rounds (torch's rounding: to nearest even; NaN -> 0x7FC0).
inline __m256i bf16_bits16_rne(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i half = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));  // ties to even
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, half), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}
#endif

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_AVX2 0
#endif
