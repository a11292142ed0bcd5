// token_levels (quantized_linear.h): rows quantized to int8 per row, as W8A8 and W4A8 take
// them. Each row: amax = max |x|, scale = amax / 127 (1 where amax is 0), level =
// min(127, max(-128, rint(x / scale))) in float32, a division, not a multiplication by 1 /
// scale, so the levels are the bits of the torch formula (w8a8_linear.per_token_levels). The
// AVX-512 builds take 16 elements a step (the same float32 operations, rounding half to even
// as rint does in the default rounding mode); the others one at a time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "cpu_common.h"
#include "quantized_linear.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

using paged_core_cpu::Elem;

// Where one call's rows go: levels (rows of `width` bytes, xor `bias`), scales [M], and the
// group sums [M, K / group_size] where group_size > 0.
struct LevelsOut {
  uint8_t* levels;
  int64_t width;
  uint8_t bias;
  float* scales;
  float* group_sums;
  int64_t group_size;
};

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512 load16(const float* p, __mmask16 live) { return _mm512_maskz_loadu_ps(live, p); }

inline __m512 load16(const uint16_t* p, __mmask16 live) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p)), 16));
}

template <typename T>
void quantize_row(const T* row, int64_t K, int64_t m, const LevelsOut& out) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 live = static_cast<__mmask16>(K - k >= 16 ? 0xFFFF : (1u << (K - k)) - 1);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(row + k, live)));
  }
  float scale = _mm512_reduce_max_ps(amax) / 127.f;
  if (scale == 0.f) scale = 1.f;
  out.scales[m] = scale;
  const __m512 divisor = _mm512_set1_ps(scale), low = _mm512_set1_ps(-128.f),
               high = _mm512_set1_ps(127.f);
  const __m128i bias = _mm_set1_epi8(static_cast<char>(out.bias));
  uint8_t* levels = out.levels + m * out.width;
  __m512i group = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 live = static_cast<__mmask16>(K - k >= 16 ? 0xFFFF : (1u << (K - k)) - 1);
    const __m512 rounded = _mm512_roundscale_ps(_mm512_div_ps(load16(row + k, live), divisor),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i level = _mm512_cvtps_epi32(_mm512_min_ps(high, _mm512_max_ps(low, rounded)));
    _mm_mask_storeu_epi8(levels + k, live, _mm_xor_si128(_mm512_cvtepi32_epi8(level), bias));
    if (out.group_size > 0) {  // a multiple of 16: whole steps
      group = _mm512_add_epi32(group, level);
      if ((k + 16) % out.group_size == 0) {
        out.group_sums[m * (K / out.group_size) + k / out.group_size] =
            static_cast<float>(_mm512_reduce_add_epi32(group));
        group = _mm512_setzero_si512();
      }
    }
  }
}
#else
template <typename T>
void quantize_row(const T* row, int64_t K, int64_t m, const LevelsOut& out) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(Elem<T>::load(row[k])));
  float scale = amax / 127.f;
  if (scale == 0.f) scale = 1.f;
  out.scales[m] = scale;
  uint8_t* levels = out.levels + m * out.width;
  int32_t group = 0;
  for (int64_t k = 0; k < K; ++k) {
    const float level = std::min(127.f, std::max(-128.f, std::rint(Elem<T>::load(row[k]) / scale)));
    levels[k] = static_cast<uint8_t>(static_cast<int8_t>(level)) ^ out.bias;
    if (out.group_size > 0) {
      group += static_cast<int32_t>(level);
      if ((k + 1) % out.group_size == 0) {
        out.group_sums[m * (K / out.group_size) + k / out.group_size] = static_cast<float>(group);
        group = 0;
      }
    }
  }
}
#endif

template <typename T>
void quantize_rows(const T* xp, int64_t M, int64_t K, const LevelsOut& out) {
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K)),
                   [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      quantize_row(xp + m * K, K, m, out);
      std::fill(out.levels + m * out.width + K, out.levels + (m + 1) * out.width, out.bias);
    }
  });
}

}  // namespace

namespace paged_core_cpu {

TokenLevels token_levels(const at::Tensor& input, int64_t biased_width, int64_t group_size) {
  // bfloat16 rows are read as they are, any other dtype as float32
  const at::Tensor x =
      (input.scalar_type() == at::kBFloat16 ? input : input.to(at::kFloat)).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(group_size == 0 || (group_size % 16 == 0 && K % group_size == 0),
              "token_levels: groups of a multiple of 16 features dividing K = ", K);
  const int64_t width = biased_width > 0 ? biased_width : K;
  const at::ScalarType level_type = biased_width > 0 ? at::kByte : at::kChar;
  TokenLevels rows{at::empty({M, width}, x.options().dtype(level_type)),
                   at::empty({M, 1}, x.options().dtype(at::kFloat)), at::Tensor()};
  if (group_size > 0) rows.group_sums = at::empty({M, K / group_size}, rows.scales.options());
  const LevelsOut out{static_cast<uint8_t*>(rows.levels.data_ptr()), width,
                      static_cast<uint8_t>(biased_width > 0 ? 0x80 : 0),
                      rows.scales.data_ptr<float>(),
                      group_size > 0 ? rows.group_sums.data_ptr<float>() : nullptr, group_size};
  if (x.scalar_type() == at::kBFloat16)
    quantize_rows(static_cast<const uint16_t*>(x.data_ptr()), M, K, out);
  else
    quantize_rows(x.data_ptr<float>(), M, K, out);
  return rows;
}

}  // namespace paged_core_cpu
