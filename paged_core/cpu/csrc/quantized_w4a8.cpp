// W4A8 (quantization/w4a8_linear.py): 4-bit weight levels with a scale and an offset per group
// of G input features, times rows quantized per row to int8 levels at run time, on vpdpbusd
// (the AVX-512 builds, on CPUs with AVX512-VNNI: int8_vnni_ready), or, from amx_min_rows rows,
// on AMX-INT8 tiles with the same bits (quantized_w4a8_tiles.cpp).
//
// w4a8_pack's layout, column groups of 32 outputs:
//   levels uint8 [C, K / 4, 64]: in column group c, the 64 bytes of quad t (features 4t..4t+3)
//     hold in byte 4j + i the level (0..15) of output 32c + j, feature 4t + i, in the low
//     nibble and of output 32c + 16 + j in the high one: one load and two masks give two
//     registers of 16 outputs x 4 features, each multiplied by a row's 4 levels broadcast;
//   factors float32 [C, K / G, F, 32]: each group's 32 scales, then (F = 2) its 32 offsets, or
//   (F = 1, a symmetric weight: every offset is -8 scale) the scales alone (w4a8_product also
//   takes them as float16, quantization.narrowed_factors' where every value is exact);
//   outputs past N (the last column group's padding) have levels 0 and factors 0.
// A weight is W[n, k] = scale[n, g] * level + offset[n, g] (Int4Linear's offsets: zero - 8
// scale), so with a row's levels r (x ~ row_scale * r, quantized as token_levels does):
//   y[m, n] = row_scale[m] * sum_g (scale[n, g] * S[m, n, g] + offset[n, g] * R[m, g]),
// S the exact int32 sum over the group of level * r, R the group's sum of r (exact in float32
// below 2^24 / 128 features a group). For a symmetric weight that is
//   y[m, n] = row_scale[m] * sum_g scale[n, g] * (S[m, n, g] - 8 R[m, g]),
// whose sums start at -8 R and stay exact in int32: one multiply-add a group and row instead of
// two, and no offsets to read. Each group's sums are added in order of g, in float32.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cpu_common.h"
#include "cpu_simd.h"
#include "int8_outputs.h"
#include "quantized_linear.h"
#include "w4a8_layout.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define PAGED_CORE_W4A8_KERNEL 1
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using namespace paged_core_cpu::w4a8;

#if defined(PAGED_CORE_W4A8_KERNEL)
// Rows of x per pass over a column group; past kRegisterRows of them the float32 totals live in
// L1 instead of registers, so that the loop over a group's quads holds the 2 R int32 sums, the
// levels and little else (GCC spilled the sums otherwise). SmolLM2's 120 projections, groups of
// 64, levels cold, 2 threads, one process alternating (AMD EPYC family 25 model 17, avx512_bf16,
// 2026-12-05): 8 rows 3.90 ms in one pass with the totals in L1, 4.47 in two passes of 4 with
// them in registers (the next column group fetched in the first pass only; by halves in both,
// 4.22), 4.20 in one pass with them in registers; 6 rows 3.45 against 4.03 in passes of 4;
// 4 rows 2.95 in registers against 3.07 in L1. The symmetric sums (one multiply-add a group
// and row) against scale-and-offset ones on the same levels, runtime-switched in one process:
// 8 rows 3.36-3.41 / 4.44-4.48 against 3.74-3.77 / 4.78-4.83 ms with the levels in L2 (two
// speeds of the VM), 1 row within noise (same machine, 2026-12-05 12:05 UTC).
constexpr int kRowBlock = 8;
constexpr int kRegisterRows = 4;

// acc + the dot products of u's unsigned and v's signed bytes, 4 by 4 (vpdpbusd), in inline
// assembly: for the intrinsic GCC kept two copies of the 16 sums of 8 rows and moved them
// back and forth every 4 features (32 register moves and 2 spills a step).
__attribute__((always_inline, target("avx512f,avx512bw,avx512vnni")))
inline __m512i dot_add(__m512i acc, __m512i u, __m512i v) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(v));
  return acc;
}

using paged_core_cpu::ScaledRowsOut;  // where w4a8_rows stores (int8_outputs.h)

// Rows [m0, m0 + R) times column group `levels` / `factors` (scales and offsets, or for
// kSymmetric scales alone): y[m, n0 .. n0 + live) of out. `ahead`: the next column group's
// levels, fetched line by line meanwhile (or null); `spill`: room for R x 32 float32 totals
// (used past kRegisterRows rows).
template <int R, bool kSymmetric>
__attribute__((noinline, target("avx512f,avx512bw,avx512vnni")))
void w4a8_rows(const QuantizedRows& x, int64_t m0, const uint8_t* levels, const Factors& factors,
               const uint8_t* ahead, float* spill, const ScaledRowsOut& out, int64_t n0,
               int64_t live) {
  constexpr bool kInMemory = R > kRegisterRows;
  constexpr int64_t kGroupFactors = (kSymmetric ? 1 : 2) * kOutputs;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 total[kInMemory ? 1 : R][2];
  for (int r = 0; r < (kInMemory ? 0 : R); ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  if constexpr (kInMemory)
    for (int i = 0; i < 2 * R; ++i) _mm512_storeu_ps(spill + 16 * i, _mm512_setzero_ps());
  const int8_t* rows = x.levels + m0 * x.K;
  for (int64_t g = 0; g < x.groups; ++g) {
    __m512i sums[R][2];
    for (int r = 0; r < R; ++r) {
      const float group_sum = x.group_sums[(m0 + r) * x.groups + g];  // an integer
      sums[r][0] = sums[r][1] = kSymmetric
          ? _mm512_set1_epi32(-kMidLevel * static_cast<int32_t>(group_sum))
          : _mm512_setzero_si512();
    }
    for (int64_t t = g * x.quads_per_group; t < (g + 1) * x.quads_per_group; ++t) {
      if (ahead != nullptr)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + t * kQuadBytes), _MM_HINT_T0);
      const __m512i packed = _mm512_loadu_si512(levels + t * kQuadBytes);
      const __m512i first = _mm512_and_si512(packed, low);
      const __m512i second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        __builtin_memcpy(&quad, rows + r * x.K + 4 * t, 4);
        const __m512i row = _mm512_set1_epi32(quad);
        sums[r][0] = dot_add(sums[r][0], first, row);
        sums[r][1] = dot_add(sums[r][1], second, row);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m512 scale = factors.load(g * kGroupFactors + 16 * h);
      const __m512 offset = kSymmetric ? _mm512_setzero_ps()
                                       : factors.load(g * kGroupFactors + kOutputs + 16 * h);
      for (int r = 0; r < R; ++r) {
        __m512 add = kInMemory ? _mm512_loadu_ps(spill + 32 * r + 16 * h) : total[r][h];
        add = add_group<kSymmetric>(add, scale, offset, sums[r][h],
                                    x.group_sums[(m0 + r) * x.groups + g]);
        if constexpr (kInMemory) _mm512_storeu_ps(spill + 32 * r + 16 * h, add);
        else total[r][h] = add;
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t lanes = std::clamp<int64_t>(live - 16 * h, 0, 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
    for (int r = 0; r < R; ++r) {
      __m512 sum;
      if constexpr (kInMemory) sum = _mm512_loadu_ps(spill + 32 * r + 16 * h);
      else sum = total[r][h];
      out.store(m0 + r, n0 + 16 * h, mask, _mm512_mul_ps(sum, _mm512_set1_ps(x.scales[m0 + r])));
    }
  }
}
#endif

}  // namespace

namespace paged_core_cpu {

std::vector<at::Tensor> w4a8_pack(const at::Tensor& q, const at::Tensor& scales,
                                  const at::Tensor& offsets, int64_t group_size) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous(),
              "w4a8_pack: contiguous uint8 levels [N, K]");
  const int64_t N = q.size(0), K = q.size(1);
  TORCH_CHECK(group_size > 0 && group_size % 16 == 0 && K % group_size == 0,
              "w4a8_pack: groups of a multiple of 16 features dividing K = ", K);
  const int64_t groups = K / group_size, columns = (N + kOutputs - 1) / kOutputs;
  TORCH_CHECK(scales.sizes() == offsets.sizes() && scales.size(0) == N &&
                  scales.size(1) == groups,
              "w4a8_pack: scales and offsets [N, K / group_size]");
  const at::Tensor s = scales.to(at::kFloat).contiguous(), o = offsets.to(at::kFloat).contiguous();
  const float *sp = s.data_ptr<float>(), *op = o.data_ptr<float>();
  const bool symmetric = std::equal(op, op + o.numel(), sp, [](float offset, float scale) {
    return offset == -kMidLevel * scale;  // exact in float32
  });
  const int64_t kinds = symmetric ? 1 : 2;  // scales (and offsets)
  at::Tensor levels = at::zeros({columns, K / 4, kQuadBytes}, q.options());
  at::Tensor factors = at::zeros({columns, groups, kinds, kOutputs}, s.options());
  const uint8_t* qp = q.data_ptr<uint8_t>();
  uint8_t* lp = levels.data_ptr<uint8_t>();
  float* fp = factors.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = n / kOutputs, j = n % 16, shift = n % kOutputs < 16 ? 0 : 4;
    uint8_t* column = lp + c * (K / 4) * kQuadBytes;
    for (int64_t k = 0; k < K; ++k) {
      TORCH_CHECK(qp[n * K + k] < 16, "w4a8_pack: levels are 0..15");
      column[k / 4 * kQuadBytes + 4 * j + k % 4] |= static_cast<uint8_t>(qp[n * K + k] << shift);
    }
    for (int64_t g = 0; g < groups; ++g) {
      float* f = fp + (c * groups + g) * kinds * kOutputs + n % kOutputs;
      f[0] = sp[n * groups + g];
      if (!symmetric) f[kOutputs] = op[n * groups + g];
    }
  }
  return {levels, factors};
}

at::Tensor w4a8_product(const at::Tensor& rows, const at::Tensor& levels, const at::Tensor& factors,
                        int64_t group_size, int64_t out_features,
                        std::optional<at::ScalarType> out_dtype, int64_t amx_min_rows) {
  TORCH_CHECK(rows.dim() == 2, "w4a8_product: rows [M, K]");
  const int64_t M = rows.size(0), K = rows.size(1), N = out_features;
  TORCH_CHECK(levels.dim() == 3 && levels.size(1) * 4 == K && levels.size(2) == kQuadBytes &&
                  factors.dim() == 4 && factors.is_contiguous() &&
                  (factors.size(2) == 1 || factors.size(2) == 2) && factors.size(3) == kOutputs &&
                  (factors.scalar_type() == at::kFloat || factors.scalar_type() == at::kHalf) &&
                  factors.size(0) == levels.size(0) &&
                  factors.size(1) * group_size == K && levels.size(0) * kOutputs >= N &&
                  N > levels.size(0) * kOutputs - kOutputs,
              "w4a8_product: rows [M, K] and w4a8_pack's levels and factors (float32 or float16) "
              "of K features, "
              "groups of ", group_size, " and ", N, " outputs");
  TORCH_CHECK(int8_vnni_ready(), "w4a8_product needs an AVX-512 build on a CPU with AVX512-VNNI");
#if !defined(__AVX512BF16__)
  TORCH_CHECK(amx_min_rows == 0, "w4a8_product: AMX-INT8 tiles need the avx512_bf16 build");
#endif
  const bool bf16_out = out_dtype == at::kBFloat16;
  TORCH_CHECK(!out_dtype || *out_dtype == at::kFloat || bf16_out,
              "w4a8_product: out_dtype float32 or bfloat16");
  const at::Tensor y = paged_core_cpu::scaled_rows(M, N, bf16_out);
#if defined(PAGED_CORE_W4A8_KERNEL)
  const TokenLevels quantized = token_levels(rows, 0, group_size);
#if defined(__AVX512BF16__)
  if (amx_min_rows > 0 && M >= amx_min_rows) {  // the same bits on AMX-INT8 tiles
    w4a8_tiles(quantized, levels, factors, group_size, N, y);
    return y;
  }
#endif
  const int64_t groups = K / group_size;
  const QuantizedRows x{quantized.levels.data_ptr<int8_t>(), quantized.scales.data_ptr<float>(),
                        quantized.group_sums.data_ptr<float>(), K, groups, group_size / 4};
  const int64_t columns = levels.size(0), column_bytes = K / 4 * kQuadBytes;
  const uint8_t* lp = levels.data_ptr<uint8_t>();
  const Factors all_factors{factors.data_ptr(), factors.scalar_type() == at::kHalf};
  const bool symmetric = factors.size(2) == 1;
  const ScaledRowsOut out = paged_core_cpu::rows_out_of(y);
  at::parallel_for(0, columns, 1, [&](int64_t c0, int64_t c1) {
    alignas(64) float spill[kRowBlock * kOutputs];
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* column = lp + c * column_bytes;
      const Factors f = all_factors.at(c * groups * factors.size(2) * kOutputs);
      const int64_t live = std::min<int64_t>(kOutputs, N - c * kOutputs);
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        // the next column group's levels come in while the first pass reads this one's
        const uint8_t* ahead = m0 == 0 && c + 1 < c1 ? column + column_bytes : nullptr;
        switch (std::min<int64_t>(kRowBlock, M - m0)) {
#define PAGED_CORE_W4A8_ROWS(R)                                                        \
  case R:                                                                              \
    (symmetric ? w4a8_rows<R, true> : w4a8_rows<R, false>)(x, m0, column, f, ahead, spill, \
                                                           out, c * kOutputs, live);      \
    break;
          PAGED_CORE_W4A8_ROWS(1) PAGED_CORE_W4A8_ROWS(2) PAGED_CORE_W4A8_ROWS(3)
          PAGED_CORE_W4A8_ROWS(4) PAGED_CORE_W4A8_ROWS(5) PAGED_CORE_W4A8_ROWS(6)
          PAGED_CORE_W4A8_ROWS(7) PAGED_CORE_W4A8_ROWS(kRowBlock)
#undef PAGED_CORE_W4A8_ROWS
        }
      }
    }
  });
#endif
  return y;
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  using namespace paged_core_cpu;
  m.def("w4a8_pack(Tensor q, Tensor scales, Tensor offsets, int group_size) -> Tensor[]");
  m.impl("w4a8_pack", c10::DispatchKey::CPU, TORCH_FN(w4a8_pack));
  m.def("w4a8_product(Tensor rows, Tensor levels, Tensor factors, int group_size, "
        "int out_features, ScalarType? out_dtype=None, int amx_min_rows=0) -> Tensor");
  m.impl("w4a8_product", c10::DispatchKey::CPU, TORCH_FN(w4a8_product));
}
