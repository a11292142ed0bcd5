// y = x W^T + b for bfloat16 x and W on CPUs with AVX2 or AVX-512 (vdpbf16ps with
// AVX512-BF16), every row summed in the same order whatever the batch.
//
// W [N, K] is packed once (pack_bf16_dot_weight) into column groups of 32 outputs:
//   packed[g, k / 2, c, k % 2] = W[32 g + c, k]     ([ceil(N / 32), K / 2, 32, 2], zero padded)
// so one 64-byte load holds the pairs (k, k + 1) of 16 outputs: exactly vdpbf16ps's operand.
// Each group is one contiguous stream of 32 K * 2 bytes.
//
// bf16_dot_linear walks the groups (claimed by threads as they go: claimed_ranges.h) and, for
// each, every tile of up to 12 rows (bf16_dot_lanes.h: 6 in the avx2 build): per pair of
// k, the group's weight loads, one broadcast of x per row, and a vdpbf16ps per (row, 16
// outputs), accumulating in float32; then + bias, rounded to bfloat16 (nearest even). A
// group's weights come from memory during its first row tile and from L1/L2 for the others; the thread's next group is prefetched meanwhile, its
// pair-rows dealt out evenly over the full row tiles of this group (tile t of T touches the
// pair-rows k = t mod T) rather than all during the first tile, where they came in a burst
// against the core's outstanding-miss limit (30 SmolLM2 layers, one process alternating, AMD
// EPYC Zen 5, best ISA avx512_bf16: 48-128 rows 2-8% faster, 27.8 -> 25.8 ms at 128 rows; 8-32
// rows within 3%).
//
// bf16_dot_silu_and_mul multiplies gate_up's packed weight ([gate | up], I outputs each) in
// units of two groups, gate group u beside up group u + I / 32, six rows a tile (24
// accumulators), and stores silu(gate) * up of each tile's sums (SiluMulStore) with the very
// roundings of the linear and then silu_and_mul: the [M, 2 I] product never reaches memory
// (SmolLM2's gate_up of 2048 rows 7.82 against 8.50 ms for the two ops, 16 rows 0.066
// against 0.079 ms, weights in cache; AMD EPYC Zen 5, avx512_bf16).
//
// Why not oneDNN (cpu_linear.PackedLinear): at decode-sized batches (1-64 rows) oneDNN's
// call costs and its K-split blocking left it at 10-30 GB/s on the 2-core AVX512-BF16 EPYC;
// this loop streams the weights at 1.3-1.6x its speed there, and matches it at prefill
// sizes (~1000 GFLOP/s at 2048 rows). It also makes every row's sum order independent of
// the other rows (a row alone or in any batch gives the same bits).
//
// Without AVX512-BF16 (the avx512 level: AVX-512F, BW and VL, e.g. Skylake to Ice Lake
// servers) each vdpbf16ps becomes two float32 FMAs over the pair's halves (a bfloat16 is the
// top half of a float32: a shift or a mask widens it, exactly), so the weights stay
// bfloat16, half the bytes of the float32 copy oneDNN would multiply there, read at the same
// streaming rate: decode steps of 1-4 SmolLM2 sequences took 10.1-13.6 ms at that level
// against 36.5-41.4 ms on oneDNN's float32 copy, a 379-token prefill step 500 against 509 ms
// (bench steps, AMD EPYC Zen 4 forced to the avx512 level).
// Each output lane still sums its pairs in one fixed order (k ascending, k before k + 1), so
// a row's bits depend on nothing else either; they differ from the avx512_bf16 level's in
// the last places (vdpbf16ps rounds its pair sum its own way). The AMX paths need the
// avx512_bf16 build.
//
// The avx2 build (AVX2 and FMA: Haswell on, Zen 1 on) runs the same two FMAs per pair on
// 8-lane registers, the bits of the avx512 level, in tiles that fit 16 registers
// (bf16_dot_lanes.h): decode-sized calls over whole groups, larger ones over parts of
// them, which matched oneDNN's float32 GEMM at prefill sizes; a bfloat16 model there no
// longer multiplies oneDNN's float32 copy of its weights (decode steps of 1-4 SmolLM2
// sequences 13.9-22.2 against 34.4-37.3 ms, bench steps, AMD EPYC Zen 4 forced to avx2).
//
// Compiled in the avx2, avx512 and avx512_bf16 builds (PAGED_CORE_BF16_DOT).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "bf16_dot_lanes.h"
#include "bf16_dot_linear.h"
#include "claimed_ranges.h"
#include "cpu_common.h"
#include "cpu_simd.h"
#include "fused_ops.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

namespace {

using paged_core_cpu::DotLanes;

constexpr int64_t kGroup = 32;     // outputs per packed column group
static_assert(DotLanes::kGroupBlocks * DotLanes::kLanes == kGroup, "a group is whole blocks");
constexpr int64_t kRowBlock = 256; // rows whose x stays in L2 while every group passes by

// The share of the thread's next unit's groups that one row tile prefetches: the pair-rows
// k with k % stride == phase of the groups starting at start, group_bytes apart, row_bytes a
// pair-row (128 for packed weights: 32 outputs x 2 bfloat16; less for a widened unit's source
// bytes) (start nullptr: none).
struct NextGroups {
  const char* start;
  int64_t phase, stride, row_bytes, group_bytes;
};

// What the units of work multiply: unit u's G column groups start unit_step * u elements into
// the packed weight, group_step elements apart; units from single_from on have their first
// group only (an odd group count); unit u's first output column is u * unit_columns.
// prefetch: each unit's row tiles touch the thread's next unit, in shares.
struct UnitLayout {
  int64_t count, G, group_step, unit_step, single_from, unit_columns;
  bool prefetch;
};

// A plain linear's store: block b of a tile of P blocks a group holds columns
// n0 + kGroup (b / P) + kLanes (b % P) of y [M, N] (N apart); + bias, rounded to bfloat16.
struct LinearStore {
  const uint16_t* bias;  // [N] or null
  uint16_t* y;
  int64_t N;

  // Its loops unrolled whole, as the stores' below: a loop left rolled indexes the sums,
  // which kept them in memory through the tile's k loop (avx2 prefill at half speed).
  template <int P, int MT, int NB>
  void put(DotLanes::F (&acc)[MT][NB], int64_t m0, int64_t n0) const {
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const int64_t n = n0 + kGroup * (b / P) + DotLanes::kLanes * (b % P);
      if (n >= N) continue;
      const DotLanes::F bias_f32 = DotLanes::bias(bias, n, N);
#pragma GCC unroll 12
      for (int m = 0; m < MT; ++m) DotLanes::store(y + (m0 + m) * N + n, n, N, acc[m][b], bias_f32);
    }
  }
};

// SiLU-and-mul's store (gate_up = [gate | up], I outputs each, I % 32 == 0): blocks
// [0, P) of a tile hold gate columns n0 + kLanes b, blocks [P, 2 P) the up columns of
// the same outputs; y [M, I] gets silu_and_mul's bits (fused_ops.cpp) of the linear's
// bfloat16 outputs: g, u = bf16(sum + bias), y = bf16(bf16(silu(g)) * u) (NaN as 0x7FC0).
struct SiluMulStore {
  const uint16_t* bias;  // [2 I] or null
  uint16_t* y;
  int64_t I;

  template <int P, int MT, int NB>
  void put(DotLanes::F (&acc)[MT][NB], int64_t m0, int64_t n0) const {
    if constexpr (NB != 2 * P) {  // unit_rows's one-group tiles, which these units never take
      TORCH_CHECK(false, "SiLU-and-mul tiles hold a gate part and its up part");
    } else {
#pragma GCC unroll 8
      for (int b = 0; b < P; ++b) {
        const int64_t n = n0 + DotLanes::kLanes * b;
        const DotLanes::F gate_bias = DotLanes::bias(bias, n, 2 * I);
        const DotLanes::F up_bias = DotLanes::bias(bias, I + n, 2 * I);
#pragma GCC unroll 12
        for (int m = 0; m < MT; ++m)
          DotLanes::store_silu_mul(y + (m0 + m) * I + n, acc[m][b], acc[m][P + b], gate_bias, up_bias);
      }
    }
  }
};

// Rows [m0, m0 + MT) of x (x's tile rows) times blocks [first, first + P) of G groups
// starting at w (group_step elements apart), handed to store.put<P>(sums, m0, n0), touching
// its share of `next` meanwhile (next's groups are group_step apart too), into L2: a unit
// ahead is more than L1 holds beside the unit being read. Into L2 against into L1 (SmolLM2 in
// bfloat16, one process switching between the two, AMD EPYC family 25 model 17, avx512_bf16,
// 2 threads, 2026-12-05): decode steps of 16 sequences 15.99 against 18.13 ms, of 8 10.25 /
// 10.68 against 11.07 / 11.05 (two runs), of 4 8.23 against 8.29, of one 9.02 against 9.02;
// a step of four ~500-token prompts 1145 against 1149 ms.
template <int MT, int G, int P, typename Store>
inline void row_tile(const DotLanes::Rows& x, const uint16_t* w, int64_t group_step, int first,
                     int64_t K2, const NextGroups& next, const Store& store, int64_t m0, int64_t n0) {
  constexpr int NB = G * P;
  DotLanes::F acc[MT][NB];
  for (int m = 0; m < MT; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = DotLanes::zero();
  int64_t next_k = next.start != nullptr ? next.phase : K2;  // the next pair-row to touch
  for (int64_t k = 0; k < K2; ++k) {
    if (k == next_k) {
      next_k += next.stride;
      for (int g = 0; g < G; ++g) {
        const char* line = next.start + g * next.group_bytes + k * next.row_bytes;
        _mm_prefetch(line, _MM_HINT_T1);
        if (next.row_bytes > 64) _mm_prefetch(line + 64, _MM_HINT_T1);
      }
    }
    const uint16_t* pair_row = w + k * kGroup * 2 + first * 2 * DotLanes::kLanes;
    const auto block = [&](int b) {  // block b's kLanes pairs: group b / P
      return pair_row + b / P * group_step + b % P * 2 * DotLanes::kLanes;
    };
    DotLanes::pair_step<MT, NB>(acc, x, k, block);
  }
  store.template put<P>(acc, m0, n0);
}

// row_tile of `rows` rows (MT counting up to the rows a tile of G x P blocks holds).
template <int G, int P, int MT = 1, typename Store>
void any_row_tile(int64_t rows, const DotLanes::Rows& x, const uint16_t* w, int64_t group_step,
                  int first, int64_t K2, const NextGroups& next, const Store& store, int64_t m0,
                  int64_t n0) {
  if (rows == MT) return row_tile<MT, G, P>(x, w, group_step, first, K2, next, store, m0, n0);
  if constexpr (MT < DotLanes::max_rows(G * P))
    return any_row_tile<G, P, MT + 1>(rows, x, w, group_step, first, K2, next, store, m0, n0);
  TORCH_CHECK(false, "row tiles of ", G * P, " blocks hold 1 to ", DotLanes::max_rows(G * P), " rows");
}

// Every part of a tile's groups (P of their blocks at a time), on the same rows of x: the
// first part touches the tile's share of `next`.
template <int G, int P, typename Store>
void row_tile_parts(int64_t rows, const DotLanes::Rows& x, const uint16_t* w, int64_t group_step,
                    int64_t K2, const NextGroups& next, const Store& store, int64_t m0, int64_t n0) {
  for (int first = 0; first < DotLanes::kGroupBlocks; first += P) {
    const NextGroups share = first == 0 ? next : NextGroups{nullptr, 0, 1, 0, 0};
    any_row_tile<G, P>(rows, x, w, group_step, first, K2, share, store, m0,
                       n0 + first * DotLanes::kLanes);
  }
}

// Rows [0, M) of x times every unit of `units`, each row tile's sums handed to store. The
// work is (row block, unit) pairs, row blocks in turn, claimed by the threads one at a time
// (ClaimedRanges: each thread its own run of pairs first, then what others have left): a
// unit's bits do not depend on the thread that runs it, and a thread the OS delays leaves
// the rest of its run to the others instead of holding up the op's end. A thread claims its
// next pair as it starts one and prefetches that pair's weights in shares over this one's
// full row tiles: packed weights, or the bytes a widened unit's widening reads
// (GroupWeights::source). Widened weights (packed null) are widened a unit at a time into a
// buffer of the thread's (its groups one after the other), right before that unit's row
// tiles. Calls of more than kWholeGroupRows rows run tiles of parts of the
// groups.
template <typename Store>
void unit_rows(const uint16_t* xp, int64_t ldx, int64_t M, const paged_core_cpu::GroupWeights& weights,
               int64_t K2, const UnitLayout& units, const Store& store) {
  const bool widened = weights.packed == nullptr;
  const int64_t group_elems = K2 * kGroup * 2;
  // A widened unit's groups lie group_elems apart in the buffer, the packed ones group_step.
  const int64_t group_step = widened ? group_elems : units.group_step;
  const bool whole = M <= DotLanes::kWholeGroupRows;
  const int64_t tile_rows = DotLanes::max_rows(
      units.G * (whole ? DotLanes::kGroupBlocks : DotLanes::part_blocks(units.G)));
  const int64_t pairs = (M + kRowBlock - 1) / kRowBlock * units.count;
  paged_core_cpu::run_claiming(pairs, [&](paged_core_cpu::ClaimedRanges& claims, int t) {
    // One widened unit (left uninitialised: widen writes all of it before it is read).
    const std::unique_ptr<uint16_t[]> group(widened ? new uint16_t[units.G * group_elems] : nullptr);
    // The tile's rows of x, where DotLanes widens them (DotLanes::rows writes them all).
    const std::unique_ptr<float[]> x_scratch(
        DotLanes::kScratchRows > 0 ? new float[DotLanes::kScratchRows * 2 * K2] : nullptr);
    int64_t i = claims.take(t);
    while (i >= 0) {
      const int64_t after = claims.take(t);
      const int64_t u = i % units.count, m_begin = i / units.count * kRowBlock;
      const int64_t m_end = std::min(M, m_begin + kRowBlock);
      const uint16_t* w = widened ? group.get() : weights.packed + u * units.unit_step;
      const bool pair = units.G == 2 && u < units.single_from;
      if (widened)  // plain loops: never throw
        for (int part = 0; part < (pair ? 2 : 1); ++part) {
          const int64_t g = (u * units.unit_step + part * units.group_step) / group_elems;
          weights.widen(g, g + 1, group.get() + part * group_elems);
        }
      // The thread's next unit, touched in shares by this one's full row tiles: its packed
      // weights, or the bytes its widening will read (GroupWeights::source).
      NextGroups next{nullptr, 0, 1, static_cast<int64_t>(kGroup * 2 * sizeof(uint16_t)),
                      static_cast<int64_t>(units.group_step * sizeof(uint16_t))};
      if (units.prefetch && after >= 0) {
        const int64_t unit = after % units.count;
        if (!widened) {
          next.start = reinterpret_cast<const char*>(weights.packed + unit * units.unit_step);
        } else if (weights.source != nullptr) {
          next.group_bytes = weights.source_group_bytes;
          next.row_bytes = weights.source_group_bytes / K2;
          next.start = weights.source + unit * units.unit_step / group_elems * weights.source_group_bytes;
        }
      }
      // Shares go to the full tiles (a short last tile would take its share in a burst).
      const int64_t sharing = std::max<int64_t>((m_end - m_begin) / tile_rows, 1);
      for (int64_t m = m_begin; m < m_end; m += tile_rows) {
        const int64_t rows = std::min(tile_rows, m_end - m);
        const int64_t tile = (m - m_begin) / tile_rows;
        const NextGroups share{tile < sharing ? next.start : nullptr, tile, sharing, next.row_bytes,
                               next.group_bytes};
        const int64_t n0 = u * units.unit_columns;
        const DotLanes::Rows x = DotLanes::rows(xp + m * ldx, ldx, rows, K2, x_scratch.get());
        constexpr int kWhole = DotLanes::kGroupBlocks;
        if (pair && whole)
          row_tile_parts<2, kWhole>(rows, x, w, group_step, K2, share, store, m, n0);
        else if (pair)
          row_tile_parts<2, DotLanes::part_blocks(2)>(rows, x, w, group_step, K2, share, store, m, n0);
        else if (whole)
          row_tile_parts<1, kWhole>(rows, x, w, group_step, K2, share, store, m, n0);
        else
          row_tile_parts<1, DotLanes::part_blocks(1)>(rows, x, w, group_step, K2, share, store, m, n0);
      }
      i = after;
    }
  });
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
  // A few rows: two groups at a time (more loads in flight per k). More: one, and the
  // next one prefetched, in shares, by this one's row tiles (packed weights only).
  const int64_t G = M <= DotLanes::kTwoGroupRows && weights.packed != nullptr ? 2 : 1;
  const int64_t group_elems = K2 * kGroup * 2;
  const UnitLayout units{(groups + G - 1) / G, G, group_elems, G * group_elems, groups / G,
                         G * kGroup, G == 1};
  unit_rows(xp, ldx, M, weights, K2, units, LinearStore{bp, yp, N});
}

namespace {

// A checked call of the packed weight on x: x's rows as a matrix (ldx apart), the bias as
// bfloat16 (or undefined), and the result's shape but for its last dimension.
struct PackedCall {
  at::Tensor x2, bias_bf16;
  int64_t M, ldx, K2, groups;
  std::vector<int64_t> out_shape;

  PackedCall(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
             const std::optional<at::Tensor>& bias)
      : out_shape(x.sizes().begin(), x.sizes().end()) {
    TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kGroup && packed.size(3) == 2 &&
                    packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
                "packed must come from pack_bf16_dot_weight");
    K2 = packed.size(1);
    groups = packed.size(0);
    const int64_t K = 2 * K2;
    TORCH_CHECK(out_features > (groups - 1) * kGroup && out_features <= groups * kGroup,
                "out_features ", out_features, " does not fit the packed weight's ", groups, " groups");
    TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && x.size(-1) == K,
                "x must be bfloat16 on CPU with in_features = ", K, " columns");
    const at::Tensor rows_of_x = x.reshape({-1, K});
    x2 = rows_of_x.stride(1) == 1 && rows_of_x.stride(0) % 2 == 0 ? rows_of_x : rows_of_x.contiguous();
    if (bias.has_value()) {
      TORCH_CHECK(bias->numel() == out_features, "bias must have out_features = ", out_features, " values");
      bias_bf16 = bias->to(at::kBFloat16).contiguous();
    }
    M = x2.size(0);
    ldx = x2.stride(0);
  }

  const uint16_t* x_data() const { return static_cast<const uint16_t*>(x2.const_data_ptr()); }
  const uint16_t* bias_data() const {
    return bias_bf16.defined() ? static_cast<const uint16_t*>(bias_bf16.const_data_ptr()) : nullptr;
  }
#if defined(__AVX512BF16__)
  bool takes_amx(int64_t amx_min_rows) const { return bf16_amx_takes(M, K2, amx_min_rows); }
#endif
  // An uninitialised [M, columns] result and its shape (x's, last dimension columns).
  at::Tensor output(int64_t columns) {
    out_shape.back() = columns;
    return at::empty({M, columns}, x2.options());
  }
};

}  // namespace

at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                           const std::optional<at::Tensor>& bias, int64_t amx_min_rows) {
  PackedCall call(x, packed, out_features, bias);
  const int64_t M = call.M, N = out_features, K2 = call.K2, ldx = call.ldx;
  at::Tensor y = call.output(N);
  const auto* xp = call.x_data();
  const auto* wp = static_cast<const uint16_t*>(packed.const_data_ptr());
  const auto* bp = call.bias_data();
  auto* yp = static_cast<uint16_t*>(y.mutable_data_ptr());
#if defined(__AVX512BF16__)
  if (call.takes_amx(amx_min_rows)) {
    at::parallel_for(0, call.groups, 1, [&](int64_t g_begin, int64_t g_end) {
      bf16_amx_groups(xp, ldx, M, GroupWeights{wp, {}}, K2, g_begin, g_end, bp, yp, N, N);
    });
    return y.view(call.out_shape);
  }
#else
  (void)amx_min_rows;  // AMX needs the avx512_bf16 build
#endif
  bf16_dot_rows(xp, ldx, M, GroupWeights{wp, {}}, K2, call.groups, bp, yp, N);
  return y.view(call.out_shape);
}

void bf16_silu_and_mul_groups(const uint16_t* x, int64_t ldx, int64_t M, const GroupWeights& w,
                              int64_t K2, int64_t I, const uint16_t* bias, uint16_t* y, bool amx) {
  TORCH_CHECK(I % kGroup == 0, "gate_up's I = ", I, " outputs each must be whole column groups");
  // Unit u: gate group u and up group u + I / 32.
  const int64_t group_elems = K2 * kGroup * 2, units = I / kGroup;
#if defined(__AVX512BF16__)
  if (amx) {
    at::parallel_for(0, units, 1, [&](int64_t u_begin, int64_t u_end) {
      bf16_amx_silu_and_mul(x, ldx, M, w, K2, I, u_begin, u_end, bias, y);
    });
    return;
  }
#else
  TORCH_CHECK(!amx, "AMX tiles need the avx512_bf16 build");
#endif
  const UnitLayout layout{units, 2, units * group_elems, group_elems, units, kGroup,
                          w.packed != nullptr && M >= 2 * DotLanes::max_rows(2 * DotLanes::part_blocks(2))};
  unit_rows(x, ldx, M, w, K2, layout, SiluMulStore{bias, y, I});
}

at::Tensor bf16_dot_silu_and_mul(const at::Tensor& x, const at::Tensor& packed,
                                 int64_t out_features, const std::optional<at::Tensor>& bias,
                                 int64_t amx_min_rows) {
  TORCH_CHECK(out_features % 2 == 0, "gate_up's out_features must be even, got ", out_features);
  const int64_t I = out_features / 2;
  PackedCall call(x, packed, out_features, bias);
  if (I % kGroup != 0) {  // the two ops one after the other: the same bits
    const at::Tensor gate_up = bf16_dot_linear(x, packed, out_features, bias, amx_min_rows);
    at::Tensor activated = call.output(I);
    silu_and_mul(gate_up.reshape({-1, out_features}), activated);
    return activated.view(call.out_shape);
  }
  at::Tensor y = call.output(I);
#if defined(__AVX512BF16__)
  const bool amx = call.takes_amx(amx_min_rows);
#else
  const bool amx = false;  // AMX needs the avx512_bf16 build
  (void)amx_min_rows;
#endif
  bf16_silu_and_mul_groups(call.x_data(), call.ldx, call.M,
                           GroupWeights{static_cast<const uint16_t*>(packed.const_data_ptr()), {}},
                           call.K2, I, call.bias_data(), static_cast<uint16_t*>(y.mutable_data_ptr()),
                           amx);
  return y.view(call.out_shape);
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("pack_bf16_dot_weight(Tensor weight) -> Tensor");
  m.def("bf16_dot_linear(Tensor x, Tensor packed, int out_features, Tensor? bias, "
        "int amx_min_rows=0) -> Tensor");
  m.impl("pack_bf16_dot_weight", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::pack_bf16_dot_weight));
  m.impl("bf16_dot_linear", c10::DispatchKey::CPU, TORCH_FN(paged_core_cpu::bf16_dot_linear));
  m.def("bf16_dot_silu_and_mul(Tensor x, Tensor packed, int out_features, Tensor? bias, "
        "int amx_min_rows=0) -> Tensor");
  m.impl("bf16_dot_silu_and_mul", c10::DispatchKey::CPU,
         TORCH_FN(paged_core_cpu::bf16_dot_silu_and_mul));
#if defined(__AVX512BF16__)
  m.def("bf16_amx_ready() -> bool", &paged_core_cpu::bf16_amx_ready);
#endif
}

#endif  // PAGED_CORE_BF16_DOT
