// y = x W^T + b for bfloat16 x and W on CPUs with AVX512-BF16 (vdpbf16ps), every row
// summed in the same order whatever the batch.
//
// W [N, K] is packed once (pack_bf16_dot_weight) into column groups of 32 outputs:
//   packed[g, k / 2, c, k % 2] = W[32 g + c, k]     ([ceil(N / 32), K / 2, 32, 2], zero padded)
// so one 64-byte load holds the pairs (k, k + 1) of 16 outputs: exactly vdpbf16ps's operand.
// Each group is one contiguous stream of 32 K * 2 bytes.
//
// bf16_dot_linear walks the groups (split between threads) and, for each, every tile of up
// to 12 rows: per pair of k, one or two weight loads, one broadcast of x per row, and a
// vdpbf16ps per (row, 16 outputs), accumulating in float32; then + bias, rounded to
// bfloat16 (nearest even). A group's weights come from memory during its first row tile
// and from L1/L2 for the others; the thread's next group is prefetched meanwhile, its
// pair-rows dealt out evenly over the full row tiles of this group (tile t of T touches the
// pair-rows k = t mod T) rather than all during the first tile, where they came in a burst
// against the core's outstanding-miss limit (30 SmolLM2 layers, one process alternating, AMD
// EPYC Zen 5, best ISA avx512_bf16: 48-128 rows 2-8% faster, 27.8 -> 25.8 ms at 128 rows;
// 8-32 rows within 3%).
//
// Why not oneDNN (cpu_linear.PackedLinear): at decode-sized batches (1-64 rows) oneDNN's
// call costs and its K-split blocking left it at 10-30 GB/s on the 2-core AVX512-BF16 EPYC;
// this loop streams the weights at 1.3-1.6x its speed there, and matches it at prefill
// sizes (~1000 GFLOP/s at 2048 rows). It also makes every row's sum order independent of
// the other rows (a row alone or in any batch gives the same bits).
//
// Built into every level's extension; the ops exist only in the avx512_bf16 build.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "bf16_dot_linear.h"
#include "bf16_linear_epilogue.h"
#include "cpu_common.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

constexpr int64_t kGroup = 32;     // outputs per packed column group (two zmm of float32)
constexpr int64_t kRowTile = 12;   // rows per tile: 12 x 2 accumulators + 2 weights + 1 broadcast
constexpr int64_t kRowBlock = 256; // rows whose x stays in L2 while every group passes by

// The share of the thread's next groups that one row tile prefetches: the pair-rows k with
// k % stride == phase of the groups starting at start (nullptr: none).
struct NextGroups {
  const char* start;
  int64_t phase, stride;
};

// Rows [0, MT) of x times G consecutive groups starting at w (G groups are K2 * 64 elements
// apart); writes columns [n0, min(n0 + 32 G, N)) of y, touching its share of `next` meanwhile.
template <int MT, int G>
inline void row_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K2,
                     const uint16_t* bias, uint16_t* y, int64_t ldy, int64_t n0, int64_t N,
                     const NextGroups& next) {
  constexpr int NB = 2 * G;  // 16-output blocks
  __m512 acc[MT][NB];
  for (int m = 0; m < MT; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const auto* x_pairs = reinterpret_cast<const int32_t*>(x);
  const int64_t ldx_pairs = ldx / 2;
  int64_t next_k = next.start != nullptr ? next.phase : K2;  // the next pair-row to touch
  for (int64_t k = 0; k < K2; ++k) {
    if (k == next_k) {
      next_k += next.stride;
      for (int g = 0; g < G; ++g) {
        const char* line = next.start + (g * K2 + k) * kGroup * 2 * sizeof(uint16_t);
        _mm_prefetch(line, _MM_HINT_T0);
        _mm_prefetch(line + 64, _MM_HINT_T0);
      }
    }
    __m512bh weights[NB];
    for (int g = 0; g < G; ++g) {
      const uint16_t* pair = w + (g * K2 + k) * kGroup * 2;
      weights[2 * g] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(pair));
      weights[2 * g + 1] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(pair + 32));
    }
    for (int m = 0; m < MT; ++m) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(x_pairs[m * ldx_pairs + k]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], xv, weights[b]);
    }
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t n = n0 + 16 * b;
    if (n >= N) break;
    const __mmask16 mask = paged_core_cpu::column_mask(n, N);
    const __m512 bias_f32 = paged_core_cpu::bias_block(bias, n, mask);
    for (int m = 0; m < MT; ++m) paged_core_cpu::store_bf16(y + m * ldy + n, mask, acc[m][b], bias_f32);
  }
}

template <int G>
void any_row_tile(int64_t rows, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K2,
                  const uint16_t* bias, uint16_t* y, int64_t ldy, int64_t n0, int64_t N,
                  const NextGroups& next) {
  switch (rows) {
#define PAGED_CORE_ROW_TILE(MT) \
  case MT: return row_tile<MT, G>(x, ldx, w, K2, bias, y, ldy, n0, N, next);
    PAGED_CORE_ROW_TILE(1) PAGED_CORE_ROW_TILE(2) PAGED_CORE_ROW_TILE(3) PAGED_CORE_ROW_TILE(4)
    PAGED_CORE_ROW_TILE(5) PAGED_CORE_ROW_TILE(6) PAGED_CORE_ROW_TILE(7) PAGED_CORE_ROW_TILE(8)
    PAGED_CORE_ROW_TILE(9) PAGED_CORE_ROW_TILE(10) PAGED_CORE_ROW_TILE(11) PAGED_CORE_ROW_TILE(12)
#undef PAGED_CORE_ROW_TILE
    default: TORCH_CHECK(false, "row tiles hold 1 to ", kRowTile, " rows");
  }
}

}  // namespace

namespace paged_core_cpu {

at::Tensor pack_bf16_dot_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.device().is_cpu(),
              "weight must be a bfloat16 CPU matrix [out_features, in_features]");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % 2 == 0, "in_features must be even (pairs of k), got ", K);
  const at::Tensor src = weight.contiguous();
  at::Tensor packed = at::zeros({(N + kGroup - 1) / kGroup, K / 2, kGroup, 2}, weight.options());
  const auto* s = static_cast<const uint16_t*>(src.const_data_ptr());
  auto* d = static_cast<uint16_t*>(packed.mutable_data_ptr());
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int64_t k = 0; k < K; ++k)
        d[((n / kGroup) * (K / 2) + k / 2) * kGroup * 2 + (n % kGroup) * 2 + k % 2] = s[n * K + k];
  });
  return packed;
}

void bf16_dot_rows(const uint16_t* xp, int64_t ldx, int64_t M, const GroupWeights& weights,
                   int64_t K2, int64_t groups, const uint16_t* bp, uint16_t* yp, int64_t N) {
  const bool widened = weights.packed == nullptr;
  // A few rows: two groups at a time (more loads in flight per k). More: one, and the
  // next one prefetched, in shares, by this one's row tiles (packed weights only).
  const int64_t G = M <= 4 && !widened ? 2 : 1;
  const int64_t units = (groups + G - 1) / G;
  for (int64_t m_begin = 0; m_begin < M; m_begin += kRowBlock) {
    const int64_t m_end = std::min(M, m_begin + kRowBlock);
    at::parallel_for(0, units, 1, [&](int64_t u_begin, int64_t u_end) {
      // One widened group (left uninitialised: widen writes all of it before it is read).
      const std::unique_ptr<uint16_t[]> group(widened ? new uint16_t[K2 * kGroup * 2] : nullptr);
      for (int64_t u = u_begin; u < u_end; ++u) {
        const int64_t g = u * G, n0 = g * kGroup;
        const uint16_t* w = widened ? group.get() : weights.packed + g * K2 * kGroup * 2;
        if (widened) weights.widen(g, g + 1, group.get());
        const char* next = !widened && G == 1 && u + 1 < u_end
                               ? reinterpret_cast<const char*>(w + K2 * kGroup * 2) : nullptr;
        // Shares go to the full tiles (a short last tile would take its share in a burst).
        const int64_t sharing = std::max<int64_t>((m_end - m_begin) / kRowTile, 1);
        for (int64_t m = m_begin; m < m_end; m += kRowTile) {
          const int64_t rows = std::min(kRowTile, m_end - m);
          const int64_t tile = (m - m_begin) / kRowTile;
          const NextGroups share{tile < sharing ? next : nullptr, tile, sharing};
          if (G == 2 && g + 1 < groups)
            any_row_tile<2>(rows, xp + m * ldx, ldx, w, K2, bp, yp + m * N, N, n0, N, share);
          else
            any_row_tile<1>(rows, xp + m * ldx, ldx, w, K2, bp, yp + m * N, N, n0, N, share);
        }
      }
    });
  }
}

at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                           const std::optional<at::Tensor>& bias, int64_t amx_min_rows) {
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kGroup && packed.size(3) == 2 &&
                  packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "packed must come from pack_bf16_dot_weight");
  const int64_t K2 = packed.size(1), K = 2 * K2, groups = packed.size(0);
  TORCH_CHECK(out_features > (groups - 1) * kGroup && out_features <= groups * kGroup,
              "out_features ", out_features, " does not fit the packed weight's ", groups, " groups");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && x.size(-1) == K,
              "x must be bfloat16 on CPU with in_features = ", K, " columns");
  const at::Tensor rows_of_x = x.reshape({-1, K});
  const at::Tensor x2 = rows_of_x.stride(1) == 1 && rows_of_x.stride(0) % 2 == 0
                            ? rows_of_x : rows_of_x.contiguous();
  at::Tensor bias_bf16;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == out_features, "bias must have out_features = ", out_features, " values");
    bias_bf16 = bias->to(at::kBFloat16).contiguous();
  }
  const int64_t M = x2.size(0), N = out_features, ldx = x2.stride(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty({M, N}, x.options());
  const auto* xp = static_cast<const uint16_t*>(x2.const_data_ptr());
  const auto* wp = static_cast<const uint16_t*>(packed.const_data_ptr());
  const auto* bp = bias_bf16.defined() ? static_cast<const uint16_t*>(bias_bf16.const_data_ptr()) : nullptr;
  auto* yp = static_cast<uint16_t*>(y.mutable_data_ptr());
  if (amx_min_rows > 0 && M >= amx_min_rows && K2 % 16 == 0 && bf16_amx_ready()) {
    at::parallel_for(0, groups, 1, [&](int64_t g_begin, int64_t g_end) {
      bf16_amx_groups(xp, ldx, M, GroupWeights{wp, {}}, K2, g_begin, g_end, bp, yp, N, N);
    });
    return y.view(out_shape);
  }
  bf16_dot_rows(xp, ldx, M, GroupWeights{wp, {}}, K2, groups, bp, yp, N);
  return y.view(out_shape);
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("pack_bf16_dot_weight(Tensor weight) -> Tensor");
  m.def("bf16_dot_linear(Tensor x, Tensor packed, int out_features, Tensor? bias, "
        "int amx_min_rows=0) -> Tensor");
  m.impl("pack_bf16_dot_weight", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::pack_bf16_dot_weight));
  m.impl("bf16_dot_linear", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::bf16_dot_linear));
  m.def("bf16_amx_ready() -> bool", &paged_core_cpu::bf16_amx_ready);
}

#endif  // __AVX512BF16__
