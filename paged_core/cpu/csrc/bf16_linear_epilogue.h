// The last step of the bfloat16 linears (bf16_dot_linear.cpp, bf16_amx_linear.cpp): float32
// sums of 16 consecutive output columns, plus the bias, rounded to bfloat16 (nearest even)
// and stored, masked at the last column N; or, for a gate_up projection, SiLU-and-mul of its
// gate and up sums (silu_mul_bits). Builds with AVX512-BF16 round with vcvtneps2bf16; the
// avx512 level's (no BF16) with torch's rounding (cpu_simd.h's bf16_bits16_rne).
#pragma once

#include "bf16_dot_linear.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

#include <cstdint>

#include "cpu_simd.h"

namespace paged_core_cpu {

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

}  // namespace paged_core_cpu

#endif  // PAGED_CORE_BF16_DOT
