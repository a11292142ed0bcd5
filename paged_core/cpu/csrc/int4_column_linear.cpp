// Weight-only 4-bit linears for bfloat16 activations on CPUs with AVX512-BF16 (vdpbf16ps):
// y = x W^T, float32 sums, for the few rows of a decode step.
//
// W [N, K] is 4-bit levels q (0..15) with a float32 scale s, offset o = zero - 8 s and
// zero per group of G input features of each output (quantization/int4_linear.py):
//   W[n, k] = s * q + o  (products),  (q - 8) * s + zero  (int4_column_dequantize).
// int4_column_pack lays it out like bf16_dot_linear's weight, in column groups of 32 outputs:
//   levels [ceil(N / 32), K / 2, 32] bytes: byte 2j + e of (group c, pair p) holds, in its low
//     nibble, q[32 c + j][2 p + e] and, in its high nibble, q[32 c + 16 + j][2 p + e];
//   scales, offsets, zeros [ceil(N / 32), K / G, 32] (outputs past N: zero levels and scales).
// So one 32-byte load holds a k pair of 32 outputs. Widening it to bfloat16 is exact and takes
// a zero-extension, a mask, a shift and two table lookups (vpermw: level -> its bfloat16);
// each row then adds x's pair times them with one vdpbf16ps per 16 outputs. A group's sums of
// x . q are exact products added in float32; then y += s * sums + o * sum(x over the group).
// Rows are taken up to 4 at a time (their 24 sums and the widened levels stay in registers);
// more rows widen the levels again, from L1.
//
// Many rows (a prefill chunk) take int4_column_dense instead: the weight widened once per call,
// straight into bf16_dot_linear's packed layout (the same column groups: one pass, no
// transposition), each value bfloat16((q - 8) * s + zero), then bf16_dot_linear (AMX tiles
// from amx_min_rows rows).
//
// Against quantized_linear.cpp's row kernels (float32 x, levels widened to float32, one
// horizontal sum per output) this reads each byte of levels once for every row in flight
// with no horizontal sums: the way decode steps stay bound by the bytes of weight.
//
// Built into every level's extension; the ops exist only in the avx512_bf16 build.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bf16_dot_linear.h"
#include "cpu_common.h"
#include "quantized_linear.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

constexpr int64_t kColumns = 32;  // outputs per column group
constexpr int kRowTile = 4;       // rows per pass over a column group
constexpr int kChains = 2;        // sums per row and 16 outputs: even and odd pairs

void check_column_layout(const at::Tensor& levels, const at::Tensor& scales, int64_t group_size,
                         int64_t N) {
  TORCH_CHECK(levels.scalar_type() == at::kByte && levels.dim() == 3 && levels.is_contiguous() &&
                  levels.size(2) == kColumns && levels.size(0) == (N + kColumns - 1) / kColumns,
              "levels must be int4_column_pack's [ceil(N / 32), K / 2, 32] uint8");
  const int64_t K = levels.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % 2 == 0 && K % group_size == 0,
              "group_size must be even and divide the input features");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.sizes() == at::IntArrayRef({levels.size(0), K / group_size, kColumns}),
              "scales must be int4_column_pack's [ceil(N / 32), K / group_size, 32] float32");
}

// The bfloat16 bits of 0, 1, ..., 15 (and zeros): vpermw's table.
__m512i level_table() {
  alignas(64) uint16_t table[32] = {};
  for (int i = 0; i < 16; ++i) table[i] = paged_core_cpu::float_to_bf16_bits(static_cast<float>(i));
  return _mm512_load_si512(table);
}

// Column group c (its levels w: K2 pairs x 32 bytes; its scales / offsets s, o: groups x 32)
// for rows [0, R) of x (bfloat16 pairs, ldx pairs apart; their group sums xsum, `groups`
// apart): y[m * ldy + 32 c ..] = float32 products (masked past N).
// Pair p of column group w, widened: its 16 low-nibble outputs' bfloat16 pairs (lo) and its
// 16 high-nibble outputs' (hi).
inline void widen_pair(const uint8_t* w, int64_t p, __m512i table, __m512bh& lo, __m512bh& hi) {
  const __m512i bytes =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * kColumns)));
  lo = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, _mm512_set1_epi16(0x0F)), table);
  hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
}

// Column group c (its levels w: K2 pairs x 32 bytes; its scales / offsets s, o: groups x 32)
// for rows [0, R) of x (bfloat16 pairs, ldx pairs apart; their group sums xsum, `groups`
// apart): y[m * ldy + 32 c ..] = float32 products (masked past N). kChains sums per row and
// 16 outputs (pairs taken kChains at a time) keep few rows from waiting on vdpbf16ps'
// latency; whatever R, a row's sums run in one order, so its bits do not depend on the
// rows beside it.
template <int R>
void column_rows(const int32_t* x, int64_t ldx, const float* xsum, const uint8_t* w,
                 const float* s, const float* o, int64_t groups, int64_t pairs_per_group,
                 __m512i table, float* y, int64_t ldy, __mmask16 mask_lo, __mmask16 mask_hi) {
  constexpr int U = kChains;
  __m512 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[U][R][2];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm512_setzero_ps();
    const int64_t end = (g + 1) * pairs_per_group;
    int64_t p = g * pairs_per_group;
    for (; p + U <= end; p += U)
      for (int u = 0; u < U; ++u) {
        __m512bh lo, hi;
        widen_pair(w, p + u, table, lo, hi);
        for (int r = 0; r < R; ++r) {
          const __m512bh xp = (__m512bh)_mm512_set1_epi32(x[r * ldx + p + u]);
          acc[u][r][0] = _mm512_dpbf16_ps(acc[u][r][0], lo, xp);
          acc[u][r][1] = _mm512_dpbf16_ps(acc[u][r][1], hi, xp);
        }
      }
    for (; p < end; ++p) {  // pairs_per_group % U of them (none for whole groups of 16)
      __m512bh lo, hi;
      widen_pair(w, p, table, lo, hi);
      for (int r = 0; r < R; ++r) {
        const __m512bh xp = (__m512bh)_mm512_set1_epi32(x[r * ldx + p]);
        acc[0][r][0] = _mm512_dpbf16_ps(acc[0][r][0], lo, xp);
        acc[0][r][1] = _mm512_dpbf16_ps(acc[0][r][1], hi, xp);
      }
    }
    const float* sg = s + g * kColumns;
    const float* og = o + g * kColumns;
    const __m512 s0 = _mm512_loadu_ps(sg), s1 = _mm512_loadu_ps(sg + 16);
    const __m512 o0 = _mm512_loadu_ps(og), o1 = _mm512_loadu_ps(og + 16);
    for (int r = 0; r < R; ++r) {
      __m512 sums[2] = {acc[0][r][0], acc[0][r][1]};
      for (int u = 1; u < U; ++u)
        for (int h = 0; h < 2; ++h) sums[h] = _mm512_add_ps(sums[h], acc[u][r][h]);
      const __m512 sum = _mm512_set1_ps(xsum[r * groups + g]);
      total[r][0] = _mm512_fmadd_ps(o0, sum, _mm512_fmadd_ps(sums[0], s0, total[r][0]));
      total[r][1] = _mm512_fmadd_ps(o1, sum, _mm512_fmadd_ps(sums[1], s1, total[r][1]));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, mask_lo, total[r][0]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, mask_hi, total[r][1]);
  }
}

using ColumnRows = void (*)(const int32_t*, int64_t, const float*, const uint8_t*, const float*,
                            const float*, int64_t, int64_t, __m512i, float*, int64_t, __mmask16,
                            __mmask16);
constexpr ColumnRows kColumnRows[kRowTile] = {column_rows<1>, column_rows<2>, column_rows<3>,
                                              column_rows<4>};

inline __mmask16 lanes_below(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

}  // namespace

namespace paged_core_cpu {

std::vector<at::Tensor> int4_column_pack(const at::Tensor& q, const at::Tensor& scales,
                                         const at::Tensor& offsets, const at::Tensor& zeros) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2, "q must be uint8 [N, K] levels");
  const int64_t N = q.size(0), K = q.size(1), groups = scales.size(1);
  TORCH_CHECK(K % 2 == 0 && groups > 0 && K % groups == 0 && (K / groups) % 2 == 0,
              "K must be whole groups of an even number of features");
  for (const at::Tensor* t : {&scales, &offsets, &zeros})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->sizes() == scales.sizes() &&
                    scales.dim() == 2 && scales.size(0) == N,
                "scales, offsets and zeros must be float32 [N, groups]");
  const int64_t C = (N + kColumns - 1) / kColumns, K2 = K / 2;
  at::Tensor levels = at::zeros({C, K2, kColumns}, q.options());
  const at::Tensor qc = q.contiguous();
  const uint8_t* src = qc.data_ptr<uint8_t>();
  uint8_t* dst = levels.data_ptr<uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = n / kColumns, j = n % kColumns % 16, shift = n % kColumns < 16 ? 0 : 4;
    for (int64_t k = 0; k < K; ++k)
      dst[(c * K2 + k / 2) * kColumns + 2 * j + k % 2] |=
          static_cast<uint8_t>((src[n * K + k] & 15) << shift);
  }
  std::vector<at::Tensor> packed{levels};
  for (const at::Tensor* t : {&scales, &offsets, &zeros}) {
    at::Tensor blocked = at::zeros({C * kColumns, groups}, t->options());
    blocked.narrow(0, 0, N).copy_(*t);
    packed.push_back(blocked.view({C, kColumns, groups}).transpose(1, 2).contiguous());
  }
  return packed;
}

at::Tensor int4_column_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                            const at::Tensor& offsets, int64_t group_size, int64_t out_features) {
  check_column_layout(levels, scales, group_size, out_features);
  TORCH_CHECK(offsets.sizes() == scales.sizes() && offsets.scalar_type() == at::kFloat &&
                  offsets.is_contiguous(),
              "offsets must be laid out like scales");
  const int64_t K = levels.size(1) * 2, N = out_features, C = levels.size(0);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == K && x.is_contiguous(),
              "x must be contiguous bfloat16 [M, ", K, "]");
  const int64_t M = x.size(0), groups = K / group_size;
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return y;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  std::vector<float> xsum(M * groups);  // each row's sum over each group, for the offsets
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.f;
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k)
        sum += bf16_bits_to_float(xp[m * K + k]);
      xsum[m * groups + g] = sum;
    }
  const auto* x_pairs = reinterpret_cast<const int32_t*>(xp);
  const uint8_t* lp = levels.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* op = offsets.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const __m512i table = level_table();
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const __mmask16 lo = lanes_below(N - c * kColumns), hi = lanes_below(N - c * kColumns - 16);
      for (int64_t m = 0; m < M; m += kRowTile) {
        const int rows = static_cast<int>(std::min<int64_t>(kRowTile, M - m));
        kColumnRows[rows - 1](x_pairs + m * (K / 2), K / 2, xsum.data() + m * groups,
                              lp + c * (K / 2) * kColumns, sp + c * groups * kColumns,
                              op + c * groups * kColumns, groups, group_size / 2, table,
                              yp + m * N + c * kColumns, N, lo, hi);
      }
    }
  });
  return y;
}

at::Tensor int4_column_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                                  const at::Tensor& zeros, int64_t group_size, int64_t out_features) {
  check_column_layout(levels, scales, group_size, out_features);
  const int64_t K = levels.size(1) * 2, K2 = K / 2, N = out_features, groups = K / group_size;
  at::Tensor w = at::empty({N, K}, scales.options());
  const uint8_t* lp = levels.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = zeros.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t c = n / kColumns, j = n % kColumns % 16, shift = n % kColumns < 16 ? 0 : 4;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t at = (c * groups + k / group_size) * kColumns + n % kColumns;
        const int level = (lp[(c * K2 + k / 2) * kColumns + 2 * j + k % 2] >> shift) & 15;
        wp[n * K + k] = (static_cast<float>(level) - 8.f) * sp[at] + zp[at];
      }
    }
  });
  return w;
}

at::Tensor int4_column_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                             const at::Tensor& zeros, int64_t group_size, int64_t out_features,
                             int64_t amx_min_rows) {
  check_column_layout(levels, scales, group_size, out_features);
  TORCH_CHECK(zeros.sizes() == scales.sizes() && zeros.scalar_type() == at::kFloat &&
                  zeros.is_contiguous(),
              "zeros must be laid out like scales");
  const int64_t C = levels.size(0), K2 = levels.size(1), groups = scales.size(1);
  const int64_t pairs_per_group = group_size / 2;
  // bf16_dot_linear's [C, K2, 32, 2]: pair p of outputs 32 c + j is 32 bits at (c, p, j).
  at::Tensor packed = at::empty({C, K2, kColumns, 2}, scales.options().dtype(at::kBFloat16));
  const uint8_t* lp = levels.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = zeros.data_ptr<float>();
  auto* out = reinterpret_cast<uint16_t*>(packed.data_ptr());
  // Lane l of a 16-float block holds output l / 2 of its 8 (pairs e = l % 2).
  alignas(64) static const int32_t kPairLanes[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  const __m512i pair_lanes = _mm512_load_si512(kPairLanes);
  const __m512 eight = _mm512_set1_ps(8.f);
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t g = 0; g < groups; ++g) {
        // Scales and zeros of the group's outputs 8b .. 8b + 7, each twice (both of a pair).
        __m512 s[4], z[4];
        for (int b = 0; b < 4; ++b) {
          const float* at = sp + (c * groups + g) * kColumns + 8 * b;
          const float* zt = zp + (c * groups + g) * kColumns + 8 * b;
          s[b] = _mm512_permutexvar_ps(pair_lanes, _mm512_castps256_ps512(_mm256_loadu_ps(at)));
          z[b] = _mm512_permutexvar_ps(pair_lanes, _mm512_castps256_ps512(_mm256_loadu_ps(zt)));
        }
        for (int64_t p = g * pairs_per_group; p < (g + 1) * pairs_per_group; ++p) {
          const __m512i bytes = _mm512_cvtepu8_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lp + (c * K2 + p) * kColumns)));
          // words 2j + e: low nibbles are outputs j, high nibbles outputs 16 + j
          const __m512i halves[2] = {_mm512_and_si512(bytes, _mm512_set1_epi16(0x0F)),
                                     _mm512_srli_epi16(bytes, 4)};
          uint16_t* dst = out + (c * K2 + p) * kColumns * 2;
          for (int h = 0; h < 2; ++h)
            for (int q = 0; q < 2; ++q) {  // outputs 16 h + 8 q .. + 7
              const __m256i words = q == 0 ? _mm512_castsi512_si256(halves[h])
                                           : _mm512_extracti64x4_epi64(halves[h], 1);
              const __m512 level = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(words));
              const int b = 2 * h + q;
              // (q - 8) * s + zero, rounded twice like the float32 dequantization, then to bf16
              const __m512 w = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(level, eight), s[b]), z[b]);
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * b),
                                  reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(w)));
            }
        }
      }
  });
  return bf16_dot_linear(x.to(at::kBFloat16).contiguous(), packed, out_features, std::nullopt,
                         amx_min_rows);
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("int4_column_pack(Tensor q, Tensor scales, Tensor offsets, Tensor zeros) -> Tensor[]");
  m.def("int4_column_gemm(Tensor x, Tensor levels, Tensor scales, Tensor offsets, int group_size, "
        "int out_features) -> Tensor");
  m.def("int4_column_dense(Tensor x, Tensor levels, Tensor scales, Tensor zeros, int group_size, "
        "int out_features, int amx_min_rows) -> Tensor");
  m.impl("int4_column_dense", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::int4_column_dense));
  m.def("int4_column_dequantize(Tensor levels, Tensor scales, Tensor zeros, int group_size, "
        "int out_features) -> Tensor");
  m.impl("int4_column_pack", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::int4_column_pack));
  m.impl("int4_column_gemm", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::int4_column_gemm));
  m.impl("int4_column_dequantize", c10::DispatchKey::CPU,
         TORCH_FN(paged_core_cpu::int4_column_dequantize));
}

#endif  // __AVX512BF16__
