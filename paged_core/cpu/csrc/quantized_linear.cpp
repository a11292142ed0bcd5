// Weight-only quantized linears for CPU: y = x @ W.T with W kept as 4-bit or 8-bit levels
// and float32 scales (and offsets) per group of G input features, widened 8 at a time in
// registers (16 in the AVX-512 builds, where a group's bytes of levels are a multiple of 16)
// and shared by every row of x in flight (up to 8, 10 in one case: rows_in_flight).
//
// int4: levels uint8 [N, K / 2]. In group g of row n, byte j < G / 2 holds the level of
//   feature g*G + j in its low nibble and of feature g*G + G/2 + j in its high nibble:
//   W[n, k] = (level - 8) * scale[n, g] + zero[n, g]   (quantization.Int4Weight's formula),
//   so row n's product is sum_g scale * dot(x_g, level_g) + (zero - 8 scale) * sum(x_g).
// int8: levels int8 [N, K]; W[n, k] = level * scale[n, g] (+ zero[n, g] where W has zeros:
//   then the offsets are the zeros, y taking zero * sum(x_g) per group as for int4).
// x: float32 [M, K] contiguous; the result is float32 [M, N]. Rows of W are split between
// threads. Sums run in a different order than a dense GEMM's (the usual float rounding).
// int4_dequantize / int8_dequantize: W itself, float32 [N, K] (for many rows at once, where
// one dense GEMM beats these per-row dots).
// w8a8_product: W8A8 (quantization/w8a8_linear.py), the rows quantized to int8 levels per row,
// then integer sums (vnni_columns below, or ATen's int8 GEMM) or these float32 kernels.
// vnni_columns: int8 levels in groups of 16 outputs, [N/16][K/4][16][4] (w8a8_vnni_pack), times
// a block of up to 8 rows: per 4 k, one 64-byte load of the group's levels and per row one
// broadcast of its 4 levels (biased to unsigned bytes, + 128) and one vpdpbusd, no horizontal
// sums; 128 * the row sums of the levels are taken back at the end: exact int32 sums, scaled
// as they are stored.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

#include "cpu_common.h"
#include "int8_outputs.h"
#include "quantized_lanes.h"
#include "quantized_linear.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

using paged_core_cpu::Elem;
using paged_core_cpu::kVnniGroup;

constexpr int64_t kRowsInFlight = 10;  // the most rows of x one pass over the levels takes

// Rows of x that share each widening of a weight row's levels: 8, but 4 for 4-bit levels in
// builds with 16 vector registers (AVX2), where 8 rows' group sums and totals beside the two
// nibble halves spill. W8A16 decode steps of 8 sequences took 22.5 against 25.6 ms at the
// avx2 level and 20.7 against 21.6 ms at the avx512 level, W4A16 23.5 against 24.3 ms at the
// avx512 level but 25.9 against 24.8 at the avx2 level (SmolLM2 in compressed-tensors'
// formats, one process alternating, AMD EPYC family 25 model 17 capped to each level).
// 8-bit levels with one scale per output (one group: no group sums beside the totals) take up
// to kRowsInFlight rows a pass in the AVX2 build, the M rows in passes of equal size (9 rows:
// one pass, not 8 and then 1, which read every level twice for one more row; 12: 6 and 6).
// 30 SmolLM2 layers x 4 projections, one scale per channel, one process switching per call,
// capped to avx2 (AMD EPYC family 25 model 17, 2026-12-06): 9 / 10 / 11 / 12 / 16 / 20 rows
// 20.2 / 23.4 / 24.2 / 25.4 / 39.0 / 46.1 ms against 23.8 / 29.2 / 28.8 / 27.8 / 40.4 / 47.5 in
// passes of at most 8; passes of 12, 14 or 16 rows, whose sums and totals outnumber the 16
// vector registers, ran slower (a step of 12 W8A16 sequences 50.9 against 47.3 ms, the 120
// projections at 16 rows 46.8 against 39.5 ms). Steps of 10 W8A16 sequences in one
// engine switching per generate call, same level: 37.1 against 40.0 ms (1-2% at 11 and 12).
// The AVX-512 builds keep 8: passes of up to 12 or 16 rows were no faster at the avx512 level.
template <bool kInt4>
int64_t rows_in_flight(int64_t M, int64_t groups) {
#if defined(__AVX512F__)
  (void)M, (void)groups;
  return 8;
#else
  if (kInt4 || groups != 1) return kInt4 ? 4 : 8;
  const int64_t passes = std::max<int64_t>(1, (M + kRowsInFlight - 1) / kRowsInFlight);
  return (M + passes - 1) / passes;
#endif
}

// Outputs whose offsets' shares are added side by side in one vector (each output's in its own
// lane, in the order of one output alone: group by group). One after the other, each output's
// chain of dependent adds (a group each: 18 for 576 features in groups of 32) outlasted the
// product before it: one row times 3072 x 576 4-bit levels in groups of 32 took 73 against
// 85 us at the avx2 level and 66 against 78 us at the avx512 level (AMD EPYC family 25 model
// 17 capped to each level).
constexpr int kOutputBlock = 8;

inline int64_t row_grain(int64_t K, int64_t M) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * M));
}

#if defined(__AVX2__)
using paged_core_cpu::Avx2Lanes;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
using paged_core_cpu::Avx512Lanes;
#endif

// row_dots in L's registers; each group's bytes of levels are a multiple of L::kLanes.
template <typename L, bool kInt4, int R>
void row_dots_in(const uint8_t* levels, const float* scales, const float* const* x,
                 int64_t groups, int64_t G, float* out) {
  typename L::F total[kRowsInFlight];
  for (int r = 0; r < R; ++r) total[r] = L::zero();
  for (int64_t g = 0; g < groups; ++g) {
    typename L::F acc[kRowsInFlight];
    for (int r = 0; r < R; ++r) acc[r] = L::zero();
    if (kInt4) {
      const uint8_t* b = levels + g * G / 2;
      for (int64_t j = 0; j < G / 2; j += L::kLanes) {
        const auto v = L::unsigned_bytes(b + j);
        const auto lo = L::low_nibbles(v), hi = L::high_nibbles(v);
        for (int r = 0; r < R; ++r) {
          const float* xr = x[r] + g * G + j;
          acc[r] = L::fmadd(lo, L::load(xr), acc[r]);
          acc[r] = L::fmadd(hi, L::load(xr + G / 2), acc[r]);
        }
      }
    } else {
      const uint8_t* b = levels + g * G;
      for (int64_t j = 0; j < G; j += L::kLanes) {
        const auto w = L::to_float(L::signed_bytes(b + j));
        for (int r = 0; r < R; ++r) acc[r] = L::fmadd(w, L::load(x[r] + g * G + j), acc[r]);
      }
    }
    const auto s = L::set1(scales[g]);
    for (int r = 0; r < R; ++r) total[r] = L::fmadd(s, acc[r], total[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = L::sum(total[r]);
}

// sum_g scale[g] * dot(x_r[g], level[g]) for rows r < R of x (R <= rows_in_flight), one row n
// (R a template argument: the accumulators then stay in registers): in the widest registers
// the build has whose lanes divide a group's bytes of levels, else scalar.
template <bool kInt4, int R>
void row_dots(const uint8_t* levels, const float* scales, const float* const* x,
              int64_t K, int64_t G, float* out) {
  const int64_t groups = K / G;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if ((kInt4 ? G / 2 : G) % Avx512Lanes::kLanes == 0)
    return row_dots_in<Avx512Lanes, kInt4, R>(levels, scales, x, groups, G, out);
#endif
#if defined(__AVX2__)
  if (G % 16 == 0)
    return row_dots_in<Avx2Lanes, kInt4, R>(levels, scales, x, groups, G, out);
#endif
  for (int r = 0; r < R; ++r) {
    float total = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      float acc = 0.f;
      for (int64_t j = 0; j < (kInt4 ? G / 2 : G); ++j) {
        if (kInt4) {
          const uint8_t b = levels[g * G / 2 + j];
          acc += static_cast<float>(b & 15) * x[r][g * G + j] +
                 static_cast<float>(b >> 4) * x[r][g * G + G / 2 + j];
        } else {
          acc += static_cast<float>(reinterpret_cast<const int8_t*>(levels)[g * G + j]) *
                 x[r][g * G + j];
        }
      }
      total += scales[g] * acc;
    }
    out[r] = total;
  }
}

template <bool kInt4>
at::Tensor quantized_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                          const c10::optional<at::Tensor>& offsets, int64_t G) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x: float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = levels.size(0), groups = K / G;
  TORCH_CHECK(K % G == 0 && levels.size(1) == (kInt4 ? K / 2 : K), "levels do not match x");
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* lp = static_cast<const uint8_t*>(levels.data_ptr());
  const float* sp = scales.data_ptr<float>();
  std::vector<float> xsum;  // [M, groups]: sum of each group of x, for the offsets
  const float* op = nullptr;
  if (offsets.has_value()) {
    op = offsets->data_ptr<float>();  // [N, groups]: 4-bit zero - 8 * scale, 8-bit zero
    xsum = paged_core_cpu::group_sums_of(xp, M, K, G);
  }
  float* yp = y.data_ptr<float>();
  const int64_t row_bytes = kInt4 ? K / 2 : K;
  const int64_t pass_rows = rows_in_flight<kInt4>(M, groups);
  at::parallel_for(0, N, row_grain(K, M), [&](int64_t n0, int64_t n1) {
    // the offsets of a block of outputs, transposed: [groups][kOutputBlock]
    std::vector<float> block_offsets(op != nullptr ? groups * kOutputBlock : 0);
    for (int64_t nb = n0; nb < n1; nb += kOutputBlock) {
      const int outputs = static_cast<int>(std::min<int64_t>(kOutputBlock, n1 - nb));
      if (op != nullptr)
        for (int64_t g = 0; g < groups; ++g)
          for (int j = 0; j < kOutputBlock; ++j)
            block_offsets[g * kOutputBlock + j] = j < outputs ? op[(nb + j) * groups + g] : 0.f;
      for (int64_t m0 = 0; m0 < M; m0 += pass_rows) {
        const int R = static_cast<int>(std::min<int64_t>(pass_rows, M - m0));
        const float* rows[kRowsInFlight];
        for (int r = 0; r < R; ++r) rows[r] = xp + (m0 + r) * K;
        float out[kOutputBlock][kRowsInFlight];
        for (int j = 0; j < outputs; ++j) {
          const uint8_t* row = lp + (nb + j) * row_bytes;
          const float* row_scales = sp + (nb + j) * groups;
          switch (R) {
            case 1: row_dots<kInt4, 1>(row, row_scales, rows, K, G, out[j]); break;
            case 2: row_dots<kInt4, 2>(row, row_scales, rows, K, G, out[j]); break;
            case 3: row_dots<kInt4, 3>(row, row_scales, rows, K, G, out[j]); break;
            case 4: row_dots<kInt4, 4>(row, row_scales, rows, K, G, out[j]); break;
            case 5: row_dots<kInt4, 5>(row, row_scales, rows, K, G, out[j]); break;
            case 6: row_dots<kInt4, 6>(row, row_scales, rows, K, G, out[j]); break;
            case 7: row_dots<kInt4, 7>(row, row_scales, rows, K, G, out[j]); break;
            case 8: row_dots<kInt4, 8>(row, row_scales, rows, K, G, out[j]); break;
            case 9: row_dots<kInt4, 9>(row, row_scales, rows, K, G, out[j]); break;
            default: row_dots<kInt4, 10>(row, row_scales, rows, K, G, out[j]); break;
          }
        }
        for (int r = 0; r < R; ++r) {
          float value[kOutputBlock];
          for (int j = 0; j < kOutputBlock; ++j) value[j] = j < outputs ? out[j][r] : 0.f;
          if (op != nullptr)
            for (int64_t g = 0; g < groups; ++g) {
              const float row_sum = xsum[(m0 + r) * groups + g];
              for (int j = 0; j < kOutputBlock; ++j)
                value[j] += block_offsets[g * kOutputBlock + j] * row_sum;
            }
          for (int j = 0; j < outputs; ++j) yp[(m0 + r) * N + nb + j] = value[j];
        }
      }
    }
  });
  return y;
}

template <bool kInt4>
at::Tensor dequantize(const at::Tensor& levels, const at::Tensor& scales,
                      const c10::optional<at::Tensor>& zeros, int64_t G) {
  const int64_t N = levels.size(0), K = kInt4 ? levels.size(1) * 2 : levels.size(1);
  const int64_t groups = K / G;
  at::Tensor w = at::empty({N, K}, scales.options());
  const uint8_t* lp = static_cast<const uint8_t*>(levels.data_ptr());
  const float* sp = scales.data_ptr<float>();
  const float* zp = zeros ? zeros->data_ptr<float>() : nullptr;
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, N, row_grain(K, 1), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = sp[n * groups + g];
        float* out = wp + n * K + g * G;
        if (kInt4) {
          const float zero = zp[n * groups + g];
          const uint8_t* b = lp + n * (K / 2) + g * G / 2;
#pragma omp simd
          for (int64_t j = 0; j < G / 2; ++j) {
            out[j] = (static_cast<float>(b[j] & 15) - 8.f) * scale + zero;
            out[j + G / 2] = (static_cast<float>(b[j] >> 4) - 8.f) * scale + zero;
          }
        } else {
          const int8_t* b = reinterpret_cast<const int8_t*>(lp) + n * K + g * G;
#pragma omp simd
          for (int64_t j = 0; j < G; ++j) out[j] = static_cast<float>(b[j]) * scale;
          if (zp != nullptr)
            for (int64_t j = 0; j < G; ++j) out[j] += zp[n * groups + g];
        }
      }
    }
  });
  return w;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define PAGED_CORE_VNNI_COLUMNS 1
using paged_core_cpu::scaled_rows;
using paged_core_cpu::VnniCall;
using paged_core_cpu::VnniGroupOut;
constexpr int64_t kVnniRows = 8;     // rows of x per pass over a pair of groups
// Bytes of a group's levels between a prefetch (into L2) and its load; past a group's end the
// prefetch reaches the pair the thread takes next (its pairs are one contiguous range): the
// second group's into the next pair's first, the first group's into the next pair's second
// (straight on, it would land on the second group, already being read). 4 KB into L2 against
// 1 KB into L1 (AMD EPYC family 25 model 17, avx512_bf16 with avx512_vnni, 2 threads,
// 2026-12-05, alternating processes): SmolLM2 W8A8 decode steps of 8 sequences 9.14 against
// 10.05 ms, of one 6.52 against 6.72 (medians of 6); an int8 49152 x 576 product of 2 rows read
// cold 0.57 against 0.66 of the bfloat16 product's time (2 KB into L1: 0.71; 8 and 16 KB into
// L2: 0.55, 0.57). The first group's prefetch steered past the second, against straight on (one
// process switching per call, 16 blocks of 48 steps each way, 22:02-22:03 UTC, same machine):
// decode steps of 8 sequences 8.19 against 8.78 ms, of 16 12.42 against 13.36, of one 6.31
// against 6.49.
constexpr int64_t kVnniAhead = 4096;

// Rows [m0, m0 + R) of the call's biased rows times its two groups g, g + 1 of packed levels
// (g alone where g + 1 == groups): their exact int32 sums, as float32 times the channel's
// scale, then the row's (each product rounded, as at::mul would), into the call's out.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_group_pair(const VnniCall& call, int64_t g, int64_t m0) {
  const int64_t quads = call.quads, Kp = call.Kp;
  const bool two = g + 1 < call.groups;
  const int8_t* p0 = call.packed + g * quads * 64;
  const int8_t* p1 = two ? p0 + quads * 64 : p0;
  __m512i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  const int64_t span = quads * 64;  // bytes of one group's levels
  for (int64_t t = 0; t < quads; ++t) {
    const int64_t ahead = t * 64 + kVnniAhead;
    // Past g's end: group g + 3 (g + 1, read beside it, is in flight already).
    const int64_t ahead0 = two && ahead >= span ? ahead + 2 * span : ahead;
    _mm_prefetch(reinterpret_cast<const char*>(p0 + ahead0), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(p1 + ahead), _MM_HINT_T1);
    const __m512i w0 = _mm512_loadu_si512(p0 + t * 64), w1 = _mm512_loadu_si512(p1 + t * 64);
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      __builtin_memcpy(&quad, call.xu + (m0 + r) * Kp + 4 * t, 4);
      const __m512i x = _mm512_set1_epi32(quad);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, w1);
    }
  }
  for (int h = 0; h < (two ? 2 : 1); ++h) {
    const VnniGroupOut group(g + h, call.out.N, call.biased_sums, call.scales.channel);
    for (int r = 0; r < R; ++r)
      group.store(acc[r][h], call.scales.token[m0 + r], call.out, m0 + r);
  }
}

// xu: biased rows [M, Kp]; packed, biased_sums: w8a8_vnni_pack's; channel_scales [N] and
// token_scales [M] float32: the scaled sums [M, N], float32 or (bf16_out) rounded to bfloat16
// as they are stored. Pairs of groups are split between threads; each runs every block of rows
// over its pairs.
at::Tensor vnni_columns(const at::Tensor& xu, const at::Tensor& packed,
                        const at::Tensor& biased_sums, const at::Tensor& channel_scales,
                        const at::Tensor& token_scales, bool bf16_out) {
  const int64_t M = xu.size(0);
  const at::Tensor y = scaled_rows(M, channel_scales.numel(), bf16_out);
  const VnniCall call(xu, packed, biased_sums, channel_scales, token_scales, y);
  at::parallel_for(0, (call.groups + 1) / 2, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t m0 = 0; m0 < M; m0 += kVnniRows) {
        const int64_t g = 2 * i;
        switch (std::min<int64_t>(kVnniRows, M - m0)) {
#define PAGED_CORE_VNNI_ROWS(R) \
  case R: vnni_group_pair<R>(call, g, m0); break;
          PAGED_CORE_VNNI_ROWS(1) PAGED_CORE_VNNI_ROWS(2) PAGED_CORE_VNNI_ROWS(3)
          PAGED_CORE_VNNI_ROWS(4) PAGED_CORE_VNNI_ROWS(5) PAGED_CORE_VNNI_ROWS(6)
          PAGED_CORE_VNNI_ROWS(7)
#undef PAGED_CORE_VNNI_ROWS
          default: vnni_group_pair<kVnniRows>(call, g, m0);
        }
      }
  });
  return y;
}
#endif

}  // namespace

namespace paged_core_cpu {

std::vector<float> group_sums_of(const float* x, int64_t M, int64_t K, int64_t G) {
  const int64_t groups = K / G;
  std::vector<float> sums(M * groups, 0.f);
  // feature i of every group in turn: the groups' sums run side by side, not one long chain of
  // dependent adds (each still adds its features in k order)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < G; ++i)
      for (int64_t g = 0; g < groups; ++g) sums[m * groups + g] += x[m * K + g * G + i];
  return sums;
}

bool int8_vnni_ready() {
#if defined(PAGED_CORE_VNNI_COLUMNS)
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

std::vector<at::Tensor> w8a8_vnni_pack(const at::Tensor& levels) {
  TORCH_CHECK(levels.dim() == 2 && levels.scalar_type() == at::kChar && levels.is_contiguous(),
              "w8a8_vnni_pack: contiguous int8 levels [N, K]");
  const int64_t N = levels.size(0), K = levels.size(1);
  const int64_t groups = (N + kVnniGroup - 1) / kVnniGroup, quads = vnni_quads(K);
  at::Tensor packed = at::zeros({groups, quads, kVnniGroup, 4}, levels.options());
  at::Tensor biased_sums = at::zeros({groups * kVnniGroup}, levels.options().dtype(at::kInt));
  const int8_t* lp = levels.data_ptr<int8_t>();
  int8_t* pp = packed.data_ptr<int8_t>();
  int32_t* bp = biased_sums.data_ptr<int32_t>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      int32_t sum = 0;
      int8_t* group = pp + n / kVnniGroup * quads * kVnniGroup * 4 +
                      n % kVnniGroup * 4;
      for (int64_t k = 0; k < K; ++k) {
        group[k / 4 * kVnniGroup * 4 + k % 4] = lp[n * K + k];
        sum += lp[n * K + k];
      }
      bp[n] = 128 * sum;
    }
  });
  return {packed, biased_sums};
}

at::Tensor w8a8_product(const at::Tensor& rows, const at::Tensor& levels, const at::Tensor& scales,
                        const std::optional<at::Tensor>& vnni_sums, int64_t int8_sums_from_rows,
                        int64_t dense_rows, at::ScalarType dense_dtype, int64_t amx_min_rows,
                        std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(rows.dim() == 2, "w8a8_product: rows [M, K]");
  const int64_t M = rows.size(0), K = rows.size(1), N = scales.numel();
  if (vnni_sums) {  // levels: w8a8_vnni_pack's; every call on vnni_columns or vnni_tiles
    TORCH_CHECK(levels.dim() == 4 && levels.size(1) == vnni_quads(K) &&
                    levels.size(0) * kVnniGroup == vnni_sums->numel() &&
                    N <= vnni_sums->numel() && int8_vnni_ready(),
                "w8a8_product: rows [M, K] and w8a8_vnni_pack's levels of K features, on a "
                "CPU with AVX512-VNNI");
#if defined(PAGED_CORE_VNNI_COLUMNS)
    const TokenLevels biased = token_levels(rows, levels.size(1) * 4);
    const at::Tensor channel_scales = scales.reshape({-1}).contiguous();
    const bool bf16_out = out_dtype == at::kBFloat16;
#if defined(__AVX512BF16__)
    if (amx_min_rows > 0 && M >= amx_min_rows)  // the same bits on AMX-INT8 tiles
      return vnni_tiles(biased.levels, levels, *vnni_sums, channel_scales, biased.scales, bf16_out);
#endif
    return vnni_columns(biased.levels, levels, *vnni_sums, channel_scales, biased.scales,
                        bf16_out);
#endif
  }
  TORCH_CHECK(levels.dim() == 2 && levels.scalar_type() == at::kChar && K == levels.size(1) &&
                  N == levels.size(0),
              "w8a8_product: rows [M, K], int8 levels [N, K] and N channel scales");
  const TokenLevels token = token_levels(rows);  // as bfloat16 or float32
  if (int8_sums_from_rows > 0 && M >= int8_sums_from_rows)  // exact int32 sums
    return at::mul(at::_int_mm(token.levels, levels.t()), scales.reshape({-1})).mul_(token.scales);
  const at::Tensor q = token.levels.to(at::kFloat);
  if (M >= dense_rows) {
    const at::Tensor w = int8_dequantize(levels, scales, std::nullopt, K);
    return at::linear(q.to(dense_dtype), w.to(dense_dtype)).to(at::kFloat).mul_(token.scales);
  }
  return int8_gemm(q, levels, scales, std::nullopt, K).mul_(token.scales);
}

// Whether levels are in column groups for float32 FMAs (column_groups' or int4_columns':
// quantized_fma_columns.cpp) rather than rows: only builds with AVX2 and FMA multiply those.
static bool fma_columns_layout(const at::Tensor& levels) {
  TORCH_CHECK(levels.dim() != 3 || PAGED_CORE_BF16_DOT,
              "levels in column groups need a build with AVX2 and FMA (the avx2 level up)");
  return levels.dim() == 3;
}

at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                     const at::Tensor& offsets, int64_t group_size) {
  if (fma_columns_layout(levels)) {
#if PAGED_CORE_BF16_DOT
    return fma_columns_gemm(x, levels, scales, offsets, group_size);
#endif
  }
  return quantized_gemm<true>(x, levels, scales, offsets, group_size);
}

at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                     const std::optional<at::Tensor>& offsets, int64_t group_size) {
  if (fma_columns_layout(levels)) {
#if PAGED_CORE_BF16_DOT
    return fma_columns_gemm(x, levels, scales, offsets, group_size);
#endif
  }
  return quantized_gemm<false>(x, levels, scales, offsets, group_size);
}

at::Tensor int4_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                           const at::Tensor& zeros, int64_t group_size) {
  if (fma_columns_layout(levels)) {
#if PAGED_CORE_BF16_DOT
    return fma_columns_dequantize(levels, scales, zeros, group_size);
#endif
  }
  return dequantize<true>(levels, scales, zeros, group_size);
}

at::Tensor int8_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                           const std::optional<at::Tensor>& zeros, int64_t group_size) {
  if (fma_columns_layout(levels)) {
#if PAGED_CORE_BF16_DOT
    return fma_columns_dequantize(levels, scales, zeros, group_size);
#endif
  }
  return dequantize<false>(levels, scales, zeros, group_size);
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  using namespace paged_core_cpu;
  m.def("int4_dequantize(Tensor levels, Tensor scales, Tensor zeros, int group_size) -> Tensor");
  m.def("int8_dequantize(Tensor levels, Tensor scales, Tensor? zeros, int group_size) -> Tensor");
  m.impl("int4_dequantize", c10::DispatchKey::CPU, TORCH_FN(int4_dequantize));
  m.impl("int8_dequantize", c10::DispatchKey::CPU, TORCH_FN(int8_dequantize));
  m.def("int4_gemm(Tensor x, Tensor levels, Tensor scales, Tensor offsets, int group_size) -> Tensor");
  m.def("int8_gemm(Tensor x, Tensor levels, Tensor scales, Tensor? offsets, int group_size) -> Tensor");
  m.impl("int4_gemm", c10::DispatchKey::CPU, TORCH_FN(int4_gemm));
  m.impl("int8_gemm", c10::DispatchKey::CPU, TORCH_FN(int8_gemm));
  m.def("w8a8_product(Tensor rows, Tensor levels, Tensor scales, Tensor? vnni_sums, "
        "int int8_sums_from_rows, int dense_rows, ScalarType dense_dtype, int amx_min_rows=0, "
        "ScalarType? out_dtype=None) -> Tensor");
  m.impl("w8a8_product", c10::DispatchKey::CPU, TORCH_FN(w8a8_product));
  m.def("int8_vnni_ready() -> bool", &int8_vnni_ready);
  m.def("w8a8_vnni_pack(Tensor levels) -> Tensor[]");
  m.impl("w8a8_vnni_pack", c10::DispatchKey::CPU, TORCH_FN(w8a8_vnni_pack));
}
