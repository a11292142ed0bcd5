// Weight-only 4- and 8-bit linears for bfloat16 activations on CPUs with AVX512-BF16
// (vdpbf16ps), with the weight in column groups of 32 outputs like bf16_dot_linear's.
//
// W [N, K] is levels q with float32 scales s per group of G input features of each output
// (quantization/int4_linear.py, int8_linear.py):
//   4-bit: q in 0..15, offset o = zero - 8 s and zero per group too;
//          W = s * q + o (products), (q - 8) * s + zero (column_dequantize);
//   8-bit: q in -128..127, W = s * q (+ zero: the offsets are the zeros, Int8ZeroLevels);
//   7-bit (8-bit levels within -64..63: Int7Levels): u = q + 64 in 0..127, W = s q + zero
//          = (u - 64) * s + zero, the offsets being the zeros themselves (both absent for a
//          symmetric weight);
//   IQ4 (8-bit levels that are all llama.cpp's IQ4_NL values: Iq4Levels): i, the value's
//          index in that table of 16, W = s kValues[i] (+ zero, dense only);
//   5-bit (8-bit levels within -16..15, or 0..31: Int5Levels<16>, <0>): u = q + 16 (q) in
//          0..31, W = s q + zero, the offsets being the zeros, as for 7 bits.
// column_pack lays the levels out in column groups of 32 outputs, one k pair at a time:
//   4-bit: uint8 [ceil(N / 32), K / 2, 32]: byte 2j + e of (group c, pair p) holds, in its low
//          nibble, q[32 c + j][2 p + e] and, in its high nibble, q[32 c + 16 + j][2 p + e];
//   8-bit: int8 [ceil(N / 32), K / 2, 64]: byte 2j + e holds q[32 c + j][2 p + e] (j < 32);
//   7-bit: uint8 [ceil(N / 32), K / 2, 64], the 8-bit order, byte 2j + e holding u;
//   IQ4: int8 [ceil(N / 32), K / 2, 32], the 4-bit order, the nibbles holding i;
//   5-bit: uint8 (q within -16..15) or int8 (0..31) [ceil(N / 32), K / 2, 40], the 4-bit
//          order holding u's low nibbles, then bit 2j + e of bytes 32-35 (36-39) bit 4 of
//          u for output j (16 + j);
//   scales (offsets, zeros) [ceil(N / 32), K / G, 32] float32 (outputs past N: zeros), each
//   float16 instead where it holds every value exactly (Factors in quantized_column_layout.h).
// So one load holds a k pair of 32 outputs. Widening it to bfloat16 is exact (4-bit: 128 + q,
// whose bfloat16 bits are 0x4300 | q, by a mask or a shift and an or per 16 outputs, no
// shuffle; 7-bit: 128 + u the same way, by an or; 5-bit: as 4-bit, then bit 4 by a masked
// add; IQ4: the value by a vpermw table lookup; 8-bit: to float32, then bfloat16); each row
// then adds x's pair times them with one vdpbf16ps per 16 outputs. A group's sums of x . (q +
// bias) are exact products added in float32; then y += s * sums (+ (o - bias' s) * the
// group's sum of x: BiasedLevels in quantized_column_layout.h). Rows are taken up to 4 at a
// time (their sums and the widened levels stay in registers; more rows widen the levels
// again, from L1; full-range 8-bit levels, up to 8 at a time in two passes of 16 outputs:
// widens_by_halves); a row's sums run in one order whatever the rows beside it. While a thread's
// first row tile runs a column group, the next group's levels and scales are fetched into L1
// (30 SmolLM2 layers, one row, one process alternating: int4 8.1 -> 6.3 ms, int8 12.2 -> 9.0
// ms on a 2-core Xeon with AMX).
//
// On a CPU with AMX tiles column_gemm takes them from amx_min_rows rows (the same sums:
// quantized_column_amx.cpp). The widening and the per-group sums are quantized_column_layout.h.
//
// More rows (from 12 or 40: QuantizedLinear's thresholds) take column_dense instead: the
// weight widened straight into bf16_dot_linear's packed layout (the same column groups: one
// pass, no transposition), each value bfloat16 of the float32 dequantization, then
// multiplied: on AMX tiles (from amx_min_rows rows) a chunk of column groups at a time,
// widened into L2 just before its tiles read it, else one column group at a time, widened
// into L1/L2 just before bf16_dot_linear's row tiles read it (bf16_dot_rows), the next
// group's levels fetched meanwhile; the whole bfloat16 weight is never written out. The
// levels are widened once per column group there, not once per 4 rows. A gate_up's dense
// call can go straight into SiLU-and-mul (column_dense_silu_and_mul: each unit's gate and up
// groups widened together, bf16_silu_and_mul_groups' epilogue), so its [M, 2 I] product
// never reaches memory: 30 SmolLM2 gate_up layers, one process alternating, 4-bit groups of
// 64 / 8-bit one scale per channel, 128 rows 1.37x / 1.42x the speed of the product then
// silu_and_mul, 512 rows 1.25x / 1.25x, 2048 rows 1.14x / 1.17x (Intel(R) Xeon(R) Processor,
// amx_bf16, 2 threads).
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
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "bf16_dot_linear.h"
#include "claimed_ranges.h"
#include "cpu_common.h"
#include "fused_ops.h"
#include "quantized_column_layout.h"
#include "quantized_linear.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

using namespace paged_core_cpu::column_layout;

constexpr int kBothHalvesRows = 4;  // rows per pass over a column group's 32 outputs
constexpr int kRowTile = 8;         // rows per pass by halves (16 outputs), where L takes them
constexpr int kChains = 2;          // sums per row and 16 outputs: even and odd pairs

// The kind of column_pack's levels: uint8 pairs of 32 bytes (4-bit), 40 (5-bit, -16..15) or 64
// (7-bit); int8 pairs of 64 (8-bit), 40 (5-bit, 0..31) or 32 (IQ4's 4-bit indices).
enum class Kind { kInt4, kInt5Signed, kInt7, kInt8, kInt5Unsigned, kIq4 };

Kind kind_of(const at::Tensor& levels) {
  const int64_t pair_bytes = levels.dim() == 3 ? levels.size(2) : 0;
  if (levels.scalar_type() == at::kChar)
    return pair_bytes == Int8Levels::kPairBytes ? Kind::kInt8
           : pair_bytes == Int5Levels<0>::kPairBytes ? Kind::kInt5Unsigned : Kind::kIq4;
  return pair_bytes == Int7Levels::kPairBytes ? Kind::kInt7
         : pair_bytes == Int5Levels<16>::kPairBytes ? Kind::kInt5Signed : Kind::kInt4;
}
bool is_int4(const at::Tensor& levels) { return kind_of(levels) == Kind::kInt4; }

int64_t pair_bytes_of(Kind kind) {
  switch (kind) {
    case Kind::kInt4: case Kind::kIq4: return Int4Levels::kPairBytes;
    case Kind::kInt5Signed: case Kind::kInt5Unsigned: return Int5Levels<0>::kPairBytes;
    default: return Int8Levels::kPairBytes;
  }
}

// Calls f(L{}) with the Levels type of levels' kind (8-bit: whether they have zeros).
template <typename F>
decltype(auto) with_levels(const at::Tensor& levels, bool zeros, F&& f) {
  switch (kind_of(levels)) {
    case Kind::kInt4: return f(Int4Levels{});
    case Kind::kInt7: return f(Int7Levels{});
    case Kind::kIq4: return f(Iq4Levels{});
    case Kind::kInt5Signed: return f(Int5Levels<16>{});
    case Kind::kInt5Unsigned: return f(Int5Levels<0>{});
    default: return zeros ? f(Int8ZeroLevels{}) : f(Int8Levels{});
  }
}

// Checks levels and a per-group tensor against column_pack's layout; returns K.
int64_t check_layout(const at::Tensor& levels, const at::Tensor& per_group, int64_t group_size,
                     int64_t N, const char* name) {
  const int64_t pair_bytes = pair_bytes_of(kind_of(levels));
  TORCH_CHECK((levels.scalar_type() == at::kByte || levels.scalar_type() == at::kChar) &&
                  levels.dim() == 3 && levels.is_contiguous() && levels.size(2) == pair_bytes &&
                  levels.size(0) == (N + kColumns - 1) / kColumns,
              "levels must be column_pack's [ceil(N / 32), K / 2, 32] uint8 (4-bit) or int8 "
              "(IQ4), [ceil(N / 32), K / 2, 40] uint8 or int8 (5-bit), or [ceil(N / 32), "
              "K / 2, 64] int8 (8-bit) or uint8 (7-bit)");
  const int64_t K = levels.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % 2 == 0 && K % group_size == 0,
              "group_size must be even and divide the input features");
  TORCH_CHECK((per_group.scalar_type() == at::kFloat || per_group.scalar_type() == at::kHalf) &&
                  per_group.is_contiguous() &&
                  per_group.sizes() == at::IntArrayRef({levels.size(0), K / group_size, kColumns}),
              name, " must be column_pack's [ceil(N / 32), K / group_size, 32] float32 or float16");
  return K;
}

// Checks scales and the optional offsets or zeros (`name`) against levels: 4-bit levels need
// them, 7- and 8-bit ones have them where the weight has zeros; returns K.
int64_t check_factors(const at::Tensor& levels, const at::Tensor& scales,
                      const std::optional<at::Tensor>& extra, const char* name,
                      int64_t group_size, int64_t N) {
  const int64_t K = check_layout(levels, scales, group_size, N, "scales");
  TORCH_CHECK(extra.has_value() || !is_int4(levels), "4-bit levels need ", name);
  if (extra) check_layout(levels, *extra, group_size, N, name);
  return K;
}

// Column group `col` for rows [0, R) of x (bfloat16 pairs, ldx pairs apart; their group sums
// xsum, `groups` apart): row m of y = the products (masked past N); `next` (levels null: none)
// is fetched meanwhile (into L2: kNextLevelsHint), a line of its levels beside each line of
// col's read (fetched a group at a time, in bursts of up to 768 lines for one scale per
// channel, the same products took 10-28% longer at 1-8 rows: 30 SmolLM2 layers x 4
// projections, AMD EPYC Zen 5). kChains sums per row and 16 outputs (pairs taken kChains at a
// time) keep few rows from waiting on vdpbf16ps' latency.
//
// One row (a one-sequence decode step) of 4-bit levels is bound by arithmetic and bytes
// about equally on AMD EPYC family 25 model 17 (Zen 4, avx512_bf16, 2 cores, 2026-12-04): a
// pair of 32 outputs took 1.40 ns a core with its levels in L2 (the slope between SmolLM2's
// o_proj and gate_up, one thread), so 2 cores compute ~46 GB/s of levels, as fast as that
// VM's memory reads them (33-61 GB/s by the hour); the 30 layers' 66 MB of Q4_1 levels took
// 2.4-2.9 ms in a decode step, both costs added more than overlapped. Tried there and not
// kept: widening a whole 64-byte line by in-lane unpacks with 0x43 bytes against x doubled up
// per line (11 vector instructions a line instead of 16, the same bits): 1.25 ns a pair in
// L2, but the decode stack 2.61 against 2.41 ms (the doubled x, 24 KB for 1536 inputs,
// shares L1 with the streamed levels); the same unpacks with x spread by one vpermd a line:
// 1.33 ns a pair, the stack 2.61-2.88 against 2.64-3.00 ms (three runs, within their noise);
// two column groups side by side (eight independent sums): no faster in L2, the stack 3.71
// against 2.90 ms; fetching levels 4-8 KB ahead in each thread's stream, into L1 or L2,
// instead of a column group ahead: 2.68-2.81 against 2.73 ms (medians of 5, alternated in
// one process).
//
// Outputs 16 h .. 16 h + 15 for the halves h in [H0, H1) only (both by default).
template <typename L, int R, int H0 = 0, int H1 = 2>
void column_rows(const int32_t* x, int64_t ldx, const float* xsum, const ColumnGroup& col,
                 int64_t groups, int64_t pairs_per_group, const RowsOut& y, __mmask16 mask_lo,
                 __mmask16 mask_hi, const ColumnGroup& next) {
  constexpr int U = kChains, NH = H1 - H0;  // halves [H0, H1): outputs 16 h .. 16 h + 15
  __m512 total[R][NH];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NH; ++h) total[r][h] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[U][R][NH];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < NH; ++h) acc[u][r][h] = _mm512_setzero_ps();
    if (next.levels != nullptr) fetch_factors(next, g);
    const int64_t end = (g + 1) * pairs_per_group;
    for (int64_t p = g * pairs_per_group; p < end; p += U)
      for (int u = 0; u < U && p + u < end; ++u) {
        if (next.levels != nullptr && starts_line<L>(p + u))
          _mm_prefetch(reinterpret_cast<const char*>(next.levels + (p + u) * L::kPairBytes),
                       kNextLevelsHint);
        __m512bh half[2];  // a half outside [H0, H1) is never read: the compiler drops it
        L::widen(col.levels + (p + u) * L::kPairBytes, half[0], half[1]);
        for (int r = 0; r < R; ++r) {
          const __m512bh xp = (__m512bh)_mm512_set1_epi32(x[r * ldx + p + u]);
          for (int h = 0; h < NH; ++h)
            acc[u][r][h] = _mm512_dpbf16_ps(acc[u][r][h], half[H0 + h], xp);
        }
      }
    const GroupFactors<L> factors(col, g);
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < NH; ++h) {
        __m512 sums = acc[0][r][h];
        for (int u = 1; u < U; ++u) sums = _mm512_add_ps(sums, acc[u][r][h]);
        const float xs = L::kOffsets ? xsum[r * groups + g] : 0.f;
        total[r][h] = factors.add(H0 + h, sums, xs, total[r][h]);
      }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NH; ++h)
      y.store(r, 16 * (H0 + h), H0 + h == 0 ? mask_lo : mask_hi, total[r][h]);
}

// Rows [0, R) of a column group, 4 < R <= 8, in two passes of one half (16 outputs) each: the
// levels are widened once per half for all R rows (the sums of each row and output run as in
// column_rows over both halves: the same bits), where passes of up to 4 rows over both halves
// widen them again for every 4 rows.
template <typename L, int R>
void column_rows_by_half(const int32_t* x, int64_t ldx, const float* xsum, const ColumnGroup& col,
                         int64_t groups, int64_t pairs_per_group, const RowsOut& y,
                         __mmask16 mask_lo, __mmask16 mask_hi, const ColumnGroup& next) {
  column_rows<L, R, 0, 1>(x, ldx, xsum, col, groups, pairs_per_group, y, mask_lo, mask_hi, next);
  column_rows<L, R, 1, 2>(x, ldx, xsum, col, groups, pairs_per_group, y, mask_lo, mask_hi,
                          ColumnGroup{});
}

// Whether rows past kBothHalvesRows take column_rows_by_half (up to kRowTile at a time), for
// levels whose widening costs more than the sums they feed: full-range 8-bit levels (two
// conversions through float32). 30 SmolLM2 layers x 4 projections, one scale per channel,
// one process alternating (AMD EPYC family 25 model 17, avx512_bf16, 2 threads): 5 rows 6.21
// against 7.97 ms in passes of 4 rows, 6 rows 6.49 / 8.28, 8 rows 7.51 / 9.09, 11 rows 10.34 /
// 12.01 (bfloat16 weights 6.12 / 6.67 / 7.23 / 8.15). 4-bit levels, widened in 3-4
// instructions a pair, ran 2-7% slower by halves (8 rows 7.39 against 6.93), so they keep
// passes of 4, as do the other kinds (groups of 32, same machine, 8 / 6 rows by halves against
// passes of 4: IQ4 7.68 / 6.58 against 7.44 / 6.55 ms, 7-bit 7.99 / 7.04 against 7.74 / 6.79;
// 5-bit 8.42 / 7.28 against 8.57 / 7.63, too little to take).
template <typename L>
constexpr bool widens_by_halves = std::is_base_of_v<Int8Levels, L>;

// A tile of rows of one column group (column_rows, column_rows_by_half).
using Rows = void (*)(const int32_t*, int64_t, const float*, const ColumnGroup&, int64_t, int64_t,
                      const RowsOut&, __mmask16, __mmask16, const ColumnGroup&);

// column_rows_by_half<L, R> where L takes rows by halves, else null (those tiles never run:
// not compiled for the kinds that keep passes of kBothHalvesRows).
template <typename L, int R>
constexpr Rows rows_by_half() {
  if constexpr (widens_by_halves<L>)
    return column_rows_by_half<L, R>;
  else
    return nullptr;
}

// Whether column_gemm_of takes AMX tiles for M rows (amx_min_rows 0: never): where the CPU
// has them and whole tile steps fit a group (group_size % 32 == 0).
bool takes_amx(int64_t M, int64_t amx_min_rows, int64_t group_size) {
  return amx_min_rows > 0 && M >= amx_min_rows && group_size % 32 == 0 &&
         paged_core_cpu::bf16_amx_ready();
}

// x [M, K] times W into y [M, N] (ld N): on AMX tiles where takes_amx.
template <typename L>
void column_gemm_of(const uint16_t* xp, int64_t M, int64_t K, const ColumnGroups& w, int64_t C,
                    int64_t N, int64_t amx_min_rows, const RowsOut& y) {
  const int64_t group_size = w.group_size, groups = K / group_size;
  std::vector<float> xsum;  // each row's sum over each group, for the offsets
  if (L::kOffsets) {
    xsum.resize(M * groups);
    group_sums(xp, M, K, group_size, xsum.data());
  }
  if (takes_amx(M, amx_min_rows, group_size)) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      amx_column_groups<L>(xp, M, K, xsum.data(), w, c0, c1, N, y);
    });
    return;
  }
  static constexpr Rows kRows[kRowTile] = {
      column_rows<L, 1>, column_rows<L, 2>, column_rows<L, 3>, column_rows<L, 4>,
      rows_by_half<L, 5>(), rows_by_half<L, 6>(), rows_by_half<L, 7>(), rows_by_half<L, 8>()};
  constexpr int tile = widens_by_halves<L> ? kRowTile : kBothHalvesRows;
  const auto* x_pairs = reinterpret_cast<const int32_t*>(xp);
  // Column groups claimed as threads go (claimed_ranges.h), the next one's levels and
  // factors fetched during this one's first row tile.
  paged_core_cpu::run_claiming(C, [&](paged_core_cpu::ClaimedRanges& claims, int t) {
    for (int64_t c = claims.take(t), after; c >= 0; c = after) {
      after = claims.take(t);
      const __mmask16 lo = lanes_below(N - c * kColumns), hi = lanes_below(N - c * kColumns - 16);
      const ColumnGroup col = w.column<L>(c, K);
      const ColumnGroup next = after >= 0 ? w.column<L>(after, K) : ColumnGroup{};
      for (int64_t m = 0; m < M; m += tile) {
        const int rows = static_cast<int>(std::min<int64_t>(tile, M - m));
        kRows[rows - 1](x_pairs + m * (K / 2), K / 2, xsum.data() + m * groups, col, groups,
                        group_size / 2, y.at(m, c * kColumns), lo, hi,
                        m == 0 ? next : ColumnGroup{});
      }
    }
  });
}

// Column groups [c0, c1) of W (C groups in all) in bf16_dot_linear's packed layout (K2 * 64
// values a group), each value bfloat16 of its float32 weight (L::widen_weights), into out.
// While a group is widened, the levels of the group after it are fetched (kNextLevelsHint),
// so that they arrive while this group's rows are multiplied: without that fetch the widening
// waited on memory and the dense path ran 1.2-1.3x the bfloat16 weight's time at 40-48 rows,
// with it 0.96-1.12x at 16-128 rows (30 SmolLM2 layers x 4 projections, AMD EPYC Zen 5).
template <typename L>
void widen_groups(const uint8_t* lp, const Factors& scales, const Factors& zeros, int64_t group_size,
                  int64_t K2, int64_t C, int64_t c0, int64_t c1, uint16_t* out) {
  const int64_t groups = K2 * 2 / group_size;
  for (int64_t c = c0; c < c1; ++c) {
    const uint8_t* next = c + 1 < C ? lp + (c + 1) * K2 * L::kPairBytes : nullptr;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = (c * groups + g) * kColumns;
      const typename L::DenseGroup group(scales, zeros, at);
      for (int64_t p = g * group_size / 2; p < (g + 1) * group_size / 2; ++p) {
        if (next != nullptr && starts_line<L>(p))
          _mm_prefetch(reinterpret_cast<const char*>(next + p * L::kPairBytes), kNextLevelsHint);
        L::widen_weights(lp + (c * K2 + p) * L::kPairBytes, group,
                         out + ((c - c0) * K2 + p) * kColumns * 2);
      }
    }
  }
}

// The weights of the dense path: W widened to bfloat16 (widen_groups) in bf16_dot_linear's
// layout, on AMX tiles from amx_min_rows rows, else on vdpbf16ps (bf16_dot_rows); either way
// a column group or a chunk of them at a time into a thread's buffer in L1/L2 right before
// its rows read it, never whole. (Widening the whole weight first, then bf16_dot_linear, had
// left 24-128 rows 1.2-3.0x slower than the bfloat16 weight itself; one group at a time with
// the next group's levels fetched meanwhile, 0.96-1.12x: 30 SmolLM2 layers x 4 projections,
// AMD EPYC Zen 5, avx512_bf16.)
template <typename L>
paged_core_cpu::GroupWeights widened_weights(const at::Tensor& levels, const Factors& scales,
                                             const Factors& zeros, int64_t group_size) {
  const int64_t C = levels.size(0), K2 = levels.size(1);
  const auto* lp = static_cast<const uint8_t*>(levels.const_data_ptr());
  return {nullptr, [=](int64_t c0, int64_t c1, uint16_t* out) {
            widen_groups<L>(lp, scales, zeros, group_size, K2, C, c0, c1, out);
          }};
}

// A checked dense call: x's rows as contiguous bfloat16 [M, K], the levels' widened weights,
// and whether the call takes AMX tiles.
struct DenseCall {
  at::Tensor rows;
  paged_core_cpu::GroupWeights widened;
  int64_t M, K2;
  bool amx;

  DenseCall(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
            const std::optional<at::Tensor>& zeros, int64_t group_size, int64_t out_features,
            int64_t amx_min_rows)
      : rows(x.to(at::kBFloat16).contiguous()), K2(levels.size(1)) {
    check_factors(levels, scales, zeros, "zeros", group_size, out_features);
    TORCH_CHECK(rows.dim() == 2 && rows.size(1) == K2 * 2, "x must be [M, K]");
    widened = with_levels(levels, zeros.has_value(), [&](auto l) {
      return widened_weights<decltype(l)>(levels, factors_of(scales), factors_of(zeros), group_size);
    });
    M = rows.size(0);
    amx = paged_core_cpu::bf16_amx_takes(M, K2, amx_min_rows);
  }

  const uint16_t* x() const { return static_cast<const uint16_t*>(rows.const_data_ptr()); }
};

template <typename L>
at::Tensor dequantize_of(const at::Tensor& levels, const Factors& scales, const Factors& zeros,
                         int64_t group_size, int64_t N, const at::TensorOptions& options) {
  const int64_t K2 = levels.size(1), K = 2 * K2, groups = K / group_size;
  at::Tensor w = at::empty({N, K}, options);
  const auto* lp = static_cast<const uint8_t*>(levels.const_data_ptr());
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t c = n / kColumns, j = n % kColumns;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t at = (c * groups + k / group_size) * kColumns + j;
        const int level = L::level(lp + (c * K2 + k / 2) * L::kPairBytes, j, k % 2);
        wp[n * K + k] = L::weight(level, scales.value(at), zeros.present() ? zeros.value(at) : 0.f);
      }
    }
  });
  return w;
}

template <typename L>
at::Tensor pack_levels(const at::Tensor& q) {
  const int64_t N = q.size(0), K = q.size(1), C = (N + kColumns - 1) / kColumns;
  at::Tensor levels = at::zeros({C, K / 2, L::kPairBytes}, q.options());
  const at::Tensor qc = q.contiguous();
  const auto* src = static_cast<const uint8_t*>(qc.const_data_ptr());
  auto* dst = static_cast<uint8_t*>(levels.data_ptr());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int level = L::level_of(src[n * K + k]);
      L::put(dst + (n / kColumns * (K / 2) + k / 2) * L::kPairBytes, n % kColumns, k % 2, level);
    }
  return levels;
}

// Whether every int8 level of q is one of Iq4Levels::kValues.
bool all_iq4_values(const at::Tensor& q) {
  bool is_value[256] = {};
  for (int8_t v : Iq4Levels::kValues) is_value[static_cast<uint8_t>(v)] = true;
  const at::Tensor qc = q.contiguous();
  const auto* src = static_cast<const uint8_t*>(qc.const_data_ptr());
  for (int64_t i = 0; i < qc.numel(); ++i)
    if (!is_value[src[i]]) return false;
  return true;
}

}  // namespace

namespace paged_core_cpu {

std::vector<at::Tensor> column_pack(const at::Tensor& q, const std::vector<at::Tensor>& per_group,
                                    c10::string_view packing) {
  TORCH_CHECK((q.scalar_type() == at::kByte || q.scalar_type() == at::kChar) && q.dim() == 2 &&
                  q.size(1) % 2 == 0,
              "q must be [N, K] levels, K even: uint8 (4-bit, 0..15) or int8 (8-bit)");
  TORCH_CHECK(packing.empty() || q.scalar_type() == at::kChar,
              "packing '", std::string(packing), "' is for int8 levels");
  const int lowest = q.numel() > 0 ? q.min().item<int>() : 0;
  const int highest = q.numel() > 0 ? q.max().item<int>() : 0;
  const bool int5_signed = lowest >= -16 && highest <= 15;
  TORCH_CHECK(packing != "int5" || int5_signed || (lowest >= 0 && highest <= 31),
              "int5 packs int8 levels within -16..15 or 0..31");
  TORCH_CHECK(packing != "int7" || (lowest >= -64 && highest <= 63),
              "int7 packs int8 levels within -64..63");
  TORCH_CHECK(packing != "iq4" || (all_iq4_values(q) && per_group.size() == 1),
              "iq4 packs int8 levels that are all IQ4_NL values (-127, -104, ..., 113), with "
              "scales only (no zeros)");
  TORCH_CHECK(packing.empty() || packing == "int5" || packing == "int7" || packing == "iq4",
              "packing must be '', 'int5', 'int7' or 'iq4', got '", std::string(packing), "'");
  TORCH_CHECK(!per_group.empty(), "give the scales (then, for 4 bits, offsets and zeros)");
  const int64_t N = q.size(0), K = q.size(1), groups = per_group[0].size(-1);
  TORCH_CHECK(groups > 0 && K % groups == 0 && (K / groups) % 2 == 0,
              "K must be whole groups of an even number of features");
  std::vector<at::Tensor> packed{
      q.scalar_type() == at::kByte ? pack_levels<Int4Levels>(q)
      : packing == "int7"          ? pack_levels<Int7Levels>(q).view(at::kByte)
      : packing == "iq4"           ? pack_levels<Iq4Levels>(q)
      : packing != "int5"          ? pack_levels<Int8Levels>(q)
      : int5_signed                ? pack_levels<Int5Levels<16>>(q).view(at::kByte)
                                   : pack_levels<Int5Levels<0>>(q)};
  const int64_t C = packed[0].size(0);
  for (const at::Tensor& t : per_group) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.size(0) == N && t.size(1) == groups,
                "scales, offsets and zeros must be float32 [N, groups]");
    at::Tensor blocked = at::zeros({C * kColumns, groups}, t.options());
    blocked.narrow(0, 0, N).copy_(t);
    packed.push_back(blocked.view({C, kColumns, groups}).transpose(1, 2).contiguous());
  }
  return packed;
}

at::Tensor column_gemm(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                       const std::optional<at::Tensor>& offsets, int64_t group_size,
                       int64_t out_features, int64_t amx_min_rows,
                       std::optional<at::ScalarType> out_dtype) {
  const int64_t K = check_factors(levels, scales, offsets, "offsets", group_size, out_features);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == K && x.is_contiguous(),
              "x must be contiguous bfloat16 [M, ", K, "]");
  const at::ScalarType dtype = out_dtype.value_or(at::kFloat);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "out_dtype must be float32 or bfloat16");
  const int64_t M = x.size(0);
  const bool rounded = dtype == at::kBFloat16;  // each sum as it is stored (RowsOut)
  at::Tensor y = at::empty({M, out_features}, x.options().dtype(dtype));
  if (M == 0 || out_features == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  const ColumnGroups w{static_cast<const uint8_t*>(levels.const_data_ptr()), factors_of(scales),
                       factors_of(offsets), group_size};
  const RowsOut out{rounded ? nullptr : y.data_ptr<float>(),
                    rounded ? static_cast<uint16_t*>(y.data_ptr()) : nullptr, out_features};
  with_levels(levels, offsets.has_value(), [&](auto l) {
    column_gemm_of<decltype(l)>(xp, M, K, w, levels.size(0), out_features, amx_min_rows, out);
  });
  return y;
}

at::Tensor column_dense(const at::Tensor& x, const at::Tensor& levels, const at::Tensor& scales,
                        const std::optional<at::Tensor>& zeros, int64_t group_size,
                        int64_t out_features, int64_t amx_min_rows) {
  const DenseCall call(x, levels, scales, zeros, group_size, out_features, amx_min_rows);
  const int64_t N = out_features, C = levels.size(0), K2 = call.K2;
  at::Tensor y = at::empty({call.M, N}, call.rows.options());
  auto* yp = static_cast<uint16_t*>(y.data_ptr());
  if (call.amx) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      bf16_amx_groups(call.x(), 2 * K2, call.M, call.widened, K2, c0, c1, nullptr, yp, N, N);
    });
  } else {
    bf16_dot_rows(call.x(), 2 * K2, call.M, call.widened, K2, C, nullptr, yp, N);
  }
  return y;
}

at::Tensor column_dense_silu_and_mul(const at::Tensor& x, const at::Tensor& levels,
                                     const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                                     int64_t group_size, int64_t out_features, int64_t amx_min_rows) {
  TORCH_CHECK(out_features % 2 == 0, "gate_up's out_features must be even, got ", out_features);
  const int64_t I = out_features / 2;
  if (I % kColumns != 0) {  // the two ops one after the other: the same bits
    const at::Tensor gate_up = column_dense(x, levels, scales, zeros, group_size, out_features,
                                            amx_min_rows);
    at::Tensor activated = at::empty({gate_up.size(0), I}, gate_up.options());
    silu_and_mul(gate_up, activated);
    return activated;
  }
  const DenseCall call(x, levels, scales, zeros, group_size, out_features, amx_min_rows);
  at::Tensor y = at::empty({call.M, I}, call.rows.options());
  bf16_silu_and_mul_groups(call.x(), 2 * call.K2, call.M, call.widened, call.K2, I, nullptr,
                           static_cast<uint16_t*>(y.data_ptr()), call.amx);
  return y;
}

at::Tensor column_dequantize(const at::Tensor& levels, const at::Tensor& scales,
                             const std::optional<at::Tensor>& zeros, int64_t group_size,
                             int64_t out_features) {
  check_factors(levels, scales, zeros, "zeros", group_size, out_features);
  return with_levels(levels, zeros.has_value(), [&](auto l) {
    return dequantize_of<decltype(l)>(levels, factors_of(scales), factors_of(zeros), group_size,
                                      out_features, scales.options().dtype(at::kFloat));
  });
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("column_pack(Tensor q, Tensor[] per_group, str packing='') -> Tensor[]");
  m.def("column_gemm(Tensor x, Tensor levels, Tensor scales, Tensor? offsets, int group_size, "
        "int out_features, int amx_min_rows=0, ScalarType? out_dtype=None) -> Tensor");
  m.def("column_dense(Tensor x, Tensor levels, Tensor scales, Tensor? zeros, int group_size, "
        "int out_features, int amx_min_rows) -> Tensor");
  m.def("column_dense_silu_and_mul(Tensor x, Tensor levels, Tensor scales, Tensor? zeros, "
        "int group_size, int out_features, int amx_min_rows) -> Tensor");
  m.def("column_dequantize(Tensor levels, Tensor scales, Tensor? zeros, int group_size, "
        "int out_features) -> Tensor");
  m.impl("column_pack", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::column_pack));
  m.impl("column_gemm", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::column_gemm));
  m.impl("column_dense", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::column_dense));
  m.impl("column_dense_silu_and_mul", c10::DispatchKey::CPU,
         TORCH_FN(paged_core_cpu::column_dense_silu_and_mul));
  m.impl("column_dequantize", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::column_dequantize));
}

#endif  // __AVX512BF16__
