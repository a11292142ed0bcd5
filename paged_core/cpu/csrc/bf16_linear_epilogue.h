// The last step of the bfloat16 linears (bf16_dot_linear.cpp, bf16_amx_linear.cpp): float32
// sums of 16 (AVX-512 builds) or 8 (the avx2 build) consecutive output columns, plus the
// bias, rounded to bfloat16 (nearest even) and stored, stopping at the last column N; or,
// for a gate_up projection, SiLU-and-mul of its gate and up sums (silu_mul_bits). Builds with
// AVX512-BF16 round with vcvtneps2bf16; the others with torch's rounding (cpu_simd.h's
// bf16_bits16_rne / bf16_bits8_rne): the same bits.
#pragma once

#include "bf16_dot_linear.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_simd.h"

namespace paged_core_cpu {

#if PAGED_CORE_BF16_DOT_ZMM

// The lanes of the 16 columns from n that exist (n < N).
inline __mmask16 column_mask(int64_t n, int64_t N) {
  return N - n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n)) - 1);
}

// bias[n .. n + 16) as float32 (lanes outside mask 0); zeros without a bias.
inline __m512 bias_block(const uint16_t* bias, int64_t n, __mmask16 mask) {
  if (bias == nullptr) return _mm512_setzero_ps();
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + n));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

// The bfloat16 bits of 16 float32 lanes, rounded to nearest even.
inline __m256i bf16_bits16(__m512 x) {
#if defined(__AVX512BF16__)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
#else
  return bf16_bits16_rne(x);
#endif
}

// y[0 .. 16) (lanes in mask) = bfloat16(sums + bias).
inline void store_bf16(uint16_t* y, __mmask16 mask, __m512 sums, __m512 bias) {
  _mm256_mask_storeu_epi16(y, mask, bf16_bits16(_mm512_add_ps(sums, bias)));
}

// Columns [n, n + 16) of `rows` rows: y[m * ldy + n ..] from c[m * ldc ..]; nothing if n >= N.
inline void store_bf16_rows(const float* c, int64_t ldc, int64_t rows, const uint16_t* bias,
                            uint16_t* y, int64_t ldy, int64_t n, int64_t N) {
  if (n >= N) return;
  const __mmask16 mask = column_mask(n, N);
  const __m512 b = bias_block(bias, n, mask);
  for (int64_t m = 0; m < rows; ++m)
    store_bf16(y + m * ldy + n, mask, _mm512_loadu_ps(c + m * ldc), b);
}

// x rounded to bfloat16 (nearest even), as float32.
inline __m512 round_bf16(__m512 x) {
  const __m256i bits = bf16_bits16(x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// silu_and_mul's bits (fused_ops.cpp) for 16 outputs of a gate_up linear's bfloat16 outputs
// g, u = bf16(sum + bias): bf16(bf16(silu(g)) * u), NaN as 0x7FC0.
inline __m256i silu_mul_bits(__m512 gate_sums, __m512 up_sums, __m512 gate_bias, __m512 up_bias) {
  const __m512 gate = round_bf16(_mm512_add_ps(gate_sums, gate_bias));
  const __m512 up = round_bf16(_mm512_add_ps(up_sums, up_bias));
  const __m512 out = _mm512_mul_ps(round_bf16(silu16(gate)), up);
  const __m256i bits = bf16_bits16(out);
  const __mmask16 nan = _mm512_cmp_ps_mask(out, out, _CMP_UNORD_Q);
  return _mm256_mask_mov_epi16(bits, nan, _mm256_set1_epi16(0x7FC0));
}

#else  // the avx2 build: 8 lanes

// bias[n .. min(n + 8, N)) as float32 (lanes from N on 0); zeros without a bias.
inline __m256 bias_block8(const uint16_t* bias, int64_t n, int64_t N) {
  if (bias == nullptr) return _mm256_setzero_ps();
  uint16_t bits[8] = {};
  std::memcpy(bits, bias + n, std::min<int64_t>(8, N - n) * sizeof(uint16_t));
  return load8(bits);
}

// y[0 .. count) = bfloat16(sums + bias) of the first count (1 to 8) lanes.
inline void store_bf16_8(uint16_t* y, int64_t count, __m256 sums, __m256 bias) {
  const __m128i bits = bf16_bits8_rne(_mm256_add_ps(sums, bias));
  if (count >= 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y), bits);
    return;
  }
  uint16_t lanes[8];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), bits);
  std::memcpy(y, lanes, count * sizeof(uint16_t));
}

// silu_mul_bits (above, 16 lanes) for 8 outputs: bf16(bf16(silu(g)) * u), NaN as 0x7FC0
// (bf16_bits8_rne's NaN).
inline __m128i silu_mul_bits8(__m256 gate_sums, __m256 up_sums, __m256 gate_bias, __m256 up_bias) {
  const auto rounded = [](__m256 v) { return widen_bf16x8(bf16_bits8_rne(v)); };
  const __m256 gate = rounded(_mm256_add_ps(gate_sums, gate_bias));
  const __m256 up = rounded(_mm256_add_ps(up_sums, up_bias));
  return bf16_bits8_rne(_mm256_mul_ps(rounded(silu8(gate)), up));
}

#endif  // PAGED_CORE_BF16_DOT_ZMM

}  // namespace paged_core_cpu

#endif  // PAGED_CORE_BF16_DOT
