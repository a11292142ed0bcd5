// How the int8 kernels store what they sum. W8A8's (vnni_columns in quantized_linear.cpp,
// vnni_tiles in quantized_vnni_tiles.cpp) turn a group of 16 outputs' biased int32 sums into
// outputs: the exact sum (minus 128 times the output's sum of levels), as float32, times the
// channel's scale, then the row's, each product rounded as at::mul would. One place, so both
// kernels give the same bits. Every int8 kernel (W4A8's too) stores its rows through
// ScaledRowsOut: float32, or bfloat16 rounded as at::Tensor::to rounds (so a bfloat16 result
// is the float32 one's .to(bfloat16), without the float32 rows written and read back).
// ScaledRowsOut and VnniGroupOut: AVX-512 builds only.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

#include "cpu_simd.h"
#endif

namespace paged_core_cpu {

constexpr int64_t kVnniGroup = 16;  // outputs of a group of w8a8_vnni_pack's levels

// Quads (4 k each) of a group of w8a8_vnni_pack's levels for K features: whole AMX tile steps
// of 64 k (16 quads), zeros past K (whose products add nothing: the biased rows hold level 0
// there), so vnni_tiles takes any K.
constexpr int64_t vnni_quads(int64_t K) { return (K + 63) / 64 * 16; }

// The scales of the sums: one per output channel (N), one per row (M).
struct VnniScales {
  const float* channel;
  const float* token;
};

// A kernel's result [M, N]: bfloat16 where bf16_out, else float32.
inline at::Tensor scaled_rows(int64_t M, int64_t N, bool bf16_out) {
  return at::empty({M, N}, at::TensorOptions().dtype(bf16_out ? at::kBFloat16 : at::kFloat));
}

#if defined(__AVX512F__)
// Rows y [M, N] in float32 (f) or as bfloat16 bits (b), rounded as at::Tensor::to rounds.
struct ScaledRowsOut {
  float* f;
  uint16_t* b;
  int64_t N;

  // 16 outputs of row m from output n (those in mask).
  void store(int64_t m, int64_t n, __mmask16 mask, __m512 y) const {
    if (b != nullptr)
      _mm256_mask_storeu_epi16(b + m * N + n, mask, bf16_bits16_rne(y));
    else
      _mm512_mask_storeu_ps(f + m * N + n, mask, y);
  }
};

// Where a kernel stores into y (scaled_rows' tensor).
inline ScaledRowsOut rows_out_of(const at::Tensor& y) {
  const bool bf16 = y.scalar_type() == at::kBFloat16;
  return {bf16 ? nullptr : y.data_ptr<float>(),
          bf16 ? static_cast<uint16_t*>(y.data_ptr()) : nullptr, y.size(1)};
}

// One W8A8 call's operands as its kernels read them (vnni_columns, vnni_tiles): the biased
// rows xu [M, Kp] (uint8), w8a8_vnni_pack's levels [groups][quads][16][4] and biased sums, the
// scales, and where the scaled sums go (y: scaled_rows').
struct VnniCall {
  const uint8_t* xu;
  int64_t M, Kp;
  const int8_t* packed;
  int64_t groups, quads;
  const int32_t* biased_sums;
  VnniScales scales;
  ScaledRowsOut out;

  VnniCall(const at::Tensor& xu_rows, const at::Tensor& levels, const at::Tensor& sums,
           const at::Tensor& channel_scales, const at::Tensor& token_scales, const at::Tensor& y)
      : xu(xu_rows.data_ptr<uint8_t>()),
        M(xu_rows.size(0)),
        Kp(xu_rows.size(1)),
        packed(levels.data_ptr<int8_t>()),
        groups(levels.size(0)),
        quads(levels.size(1)),
        biased_sums(sums.data_ptr<int32_t>()),
        scales{channel_scales.data_ptr<float>(), token_scales.data_ptr<float>()},
        out(rows_out_of(y)) {}
};

// Group g's outputs [16 g, 16 g + 16) (those below N) of any row.
struct VnniGroupOut {
  int64_t n0;
  __m512i bias;     // 128 * each output's sum of levels
  __m512 channel;   // the channel scales (0 past N)
  __mmask16 live;   // the outputs below N

  VnniGroupOut(int64_t g, int64_t N, const int32_t* biased_sums, const float* channel_scales)
      : n0(g * kVnniGroup),
        bias(_mm512_loadu_si512(biased_sums + g * kVnniGroup)),
        channel(_mm512_setzero_ps()),
        live(static_cast<__mmask16>((1u << std::min<int64_t>(kVnniGroup, N - n0)) - 1)) {
    channel = _mm512_maskz_loadu_ps(live, channel_scales + n0);
  }

  // Row m's biased sums of the group, scaled by `token` (the row's scale), into out.
  void store(__m512i biased, float token, const ScaledRowsOut& out, int64_t m) const {
    const __m512 sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(biased, bias));
    out.store(m, n0, live, _mm512_mul_ps(_mm512_mul_ps(sums, channel), _mm512_set1_ps(token)));
  }
};
#endif  // __AVX512F__

}  // namespace paged_core_cpu
