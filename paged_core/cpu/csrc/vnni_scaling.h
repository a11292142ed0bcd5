// How W8A8's integer kernels (vnni_columns in quantized_linear.cpp, vnni_tiles in
// quantized_vnni_tiles.cpp) turn a group of 16 outputs' biased int32 sums into outputs: the
// exact sum (minus 128 times the output's sum of levels), as float32, times the channel's
// scale, then the row's, each product rounded as at::mul would. One place, so both kernels
// give the same bits (VnniGroupOut: AVX-512 builds only).
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
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

#if defined(__AVX512F__)
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

  // A row's biased sums of the group, scaled by `token` (the row's scale), into row_out [N].
  void store(__m512i biased, float token, float* row_out) const {
    const __m512 sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(biased, bias));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(sums, channel), _mm512_set1_ps(token));
    _mm512_mask_storeu_ps(row_out + n0, live, y);
  }
};
#endif  // __AVX512F__

}  // namespace paged_core_cpu
