// The vector width of bf16_dot_linear.cpp's row tiles, one per build (DotLanes). A tile of
// MT rows and NB blocks of kLanes outputs keeps its MT x NB float32 sums in registers
// (max_rows(NB) rows at most); pair_step adds one pair-row k (the products of k and k + 1)
// to all of them, and the stores add the bias and round to bfloat16
// (bf16_linear_epilogue.h). A tile holds kGroupBlocks blocks of each of its G groups (whole
// groups) in calls of up to kWholeGroupRows rows, else part_blocks(G) (a part of each).
//  - avx512_bf16: 16 lanes, one vdpbf16ps per (row, block) (it rounds its pair sum its own way);
//  - avx512: 16 lanes, two float32 FMAs per (row, block): the k product, then the k + 1 one;
//  - avx2: 8 lanes, the same two FMAs in the same order, so the same bits as avx512's.
// Every lane sums its pairs in one fixed order (k ascending), whatever the tile's rows.
#pragma once

#include "bf16_dot_linear.h"

#if PAGED_CORE_BF16_DOT
#include <immintrin.h>

#include <cstdint>

#include "bf16_linear_epilogue.h"
#include "cpu_common.h"

namespace paged_core_cpu {

#if PAGED_CORE_BF16_DOT_ZMM

struct DotLanes {
  using F = __m512;
  static constexpr int kLanes = 16, kGroupBlocks = 2;
  // Whole groups always: 12 rows of one group's 2 blocks (24 sums + 2 weights + 1 broadcast
  // of 32 registers), 6 of two groups; calls of up to kTwoGroupRows rows take two a tile.
  static constexpr int part_blocks(int) { return kGroupBlocks; }
  static constexpr int64_t kWholeGroupRows = 0, kTwoGroupRows = 4;
  static constexpr int max_rows(int blocks) { return blocks <= 2 ? 12 : 6; }

  // A tile's rows of x: row m's pair k (two bfloat16) at pairs[m * ld + k].
  struct Rows {
    const int32_t* pairs;
    int64_t ld;
  };
  static constexpr int64_t kScratchRows = 0;  // rows(...) reads x where it is
  static Rows rows(const uint16_t* x, int64_t ldx, int64_t, int64_t, float*) {
    return {reinterpret_cast<const int32_t*>(x), ldx / 2};
  }

  static F zero() { return _mm512_setzero_ps(); }

  // acc[m][b] += row m's pair k times the 16 pairs of block b (at block(b)).
  template <int MT, int NB, typename Block>
  static void pair_step(F (&acc)[MT][NB], const Rows& x, int64_t k, const Block& block) {
    __m512i weights[NB];
    for (int b = 0; b < NB; ++b) weights[b] = _mm512_loadu_si512(block(b));
#if defined(__AVX512BF16__)
    for (int m = 0; m < MT; ++m) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(x.pairs[m * x.ld + k]));
      for (int b = 0; b < NB; ++b)
        acc[m][b] = _mm512_dpbf16_ps(acc[m][b], xv, reinterpret_cast<__m512bh>(weights[b]));
    }
#else
    __m512 low[NB], high[NB];  // the weights of k and of k + 1, as float32
    for (int b = 0; b < NB; ++b) {
      low[b] = low_halves(weights[b]);
      high[b] = high_halves(weights[b]);
    }
    for (int m = 0; m < MT; ++m) {
      const __m512i xv = _mm512_set1_epi32(x.pairs[m * x.ld + k]);
      const __m512 x_low = low_halves(xv), x_high = high_halves(xv);
      for (int b = 0; b < NB; ++b)
        acc[m][b] = _mm512_fmadd_ps(high[b], x_high, _mm512_fmadd_ps(low[b], x_low, acc[m][b]));
    }
#endif
  }

  // bias[n .. n + 16) as float32 (lanes from N on 0); zeros without a bias.
  static F bias(const uint16_t* bias, int64_t n, int64_t N) { return bias_block(bias, n, column_mask(n, N)); }
  // y[0 .. min(16, N - n)) = bfloat16(sums + bias).
  static void store(uint16_t* y, int64_t n, int64_t N, F sums, F bias) {
    store_bf16(y, column_mask(n, N), sums, bias);
  }
  // y[0 .. 16) = silu_and_mul's bits of 16 gate and up outputs (silu_mul_bits).
  static void store_silu_mul(uint16_t* y, F gate, F up, F gate_bias, F up_bias) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), silu_mul_bits(gate, up, gate_bias, up_bias));
  }

 private:
  // The float32 values of the first (k) and second (k + 1) bfloat16 of each 32-bit pair:
  // a bfloat16 is the top half of a float32, so a shift or a mask widens it exactly.
  static __m512 low_halves(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
  static __m512 high_halves(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

#else  // the avx2 build

struct DotLanes {
  using F = __m256;
  static constexpr int kLanes = 8, kGroupBlocks = 4;
  // 16 registers. Decode-sized calls (up to 4 rows) take whole groups, which stream the
  // weights: one row of two groups (8 sums, a block's two widened weights, the row's
  // pair), or 2 rows of one (8 sums, 2 pairs, 2 weights). Larger calls take tiles of two
  // blocks (half a group, or a quarter of each of two groups) 6 rows tall: 12 sums, two
  // widened weights, one broadcast of x (ymm FMAs take 4 cycles: 2 a cycle need 8 chains).
  static constexpr int part_blocks(int groups) { return 2 / groups; }
  static constexpr int64_t kWholeGroupRows = 4, kTwoGroupRows = 1;
  static constexpr int max_rows(int blocks) { return blocks <= 2 ? 6 : 8 / blocks; }

  // A tile's rows of x widened to float32 (a broadcast is then a load alone): row m's value
  // k at wide[m * ld + k].
  struct Rows {
    const float* wide;
    int64_t ld;
  };
  static constexpr int64_t kScratchRows = 6;  // the tallest tile's rows
  // rows [0, count) of x (ldx apart, 2 K2 values each) widened into scratch (count x 2 K2).
  static Rows rows(const uint16_t* x, int64_t ldx, int64_t count, int64_t K2, float* scratch) {
    const int64_t K = 2 * K2;
    for (int64_t m = 0; m < count; ++m) {
      const uint16_t* row = x + m * ldx;
      float* wide = scratch + m * K;
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) _mm256_storeu_ps(wide + k, load8(row + k));
      for (; k < K; ++k) wide[k] = bf16_bits_to_float(row[k]);
    }
    return {scratch, K};
  }

  static F zero() { return _mm256_setzero_ps(); }

  // acc[m][b] += row m's pair k times the 8 pairs of block b (at block(b)): each sum gets
  // the k product, then the k + 1 one. Whole groups (NB > 2) go block by block, the rows'
  // pairs held; tiles of two blocks take every k product, then every k + 1 product, so that
  // 12 sums, two weights and one broadcast fit. Every loop unrolls whole (the sums stay in
  // registers: GCC's own limits left some loops rolled, the sums in memory).
  template <int MT, int NB, typename Block>
  static void pair_step(F (&acc)[MT][NB], const Rows& x, int64_t k, const Block& block) {
    const auto weights = [&](int b) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block(b)));
    };
    if constexpr (NB > 2) {
      F x_low[MT], x_high[MT];
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) {
        x_low[m] = _mm256_broadcast_ss(x.wide + m * x.ld + 2 * k);
        x_high[m] = _mm256_broadcast_ss(x.wide + m * x.ld + 2 * k + 1);
      }
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) {
        const __m256i pairs = weights(b);
        const F low = low_halves(pairs), high = high_halves(pairs);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m)
          acc[m][b] = _mm256_fmadd_ps(high, x_high[m], _mm256_fmadd_ps(low, x_low[m], acc[m][b]));
      }
    } else {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {  // k, then k + 1
        F w[NB];
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) w[b] = half == 0 ? low_halves(weights(b)) : high_halves_by_shifts(weights(b));
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const F xv = _mm256_broadcast_ss(x.wide + m * x.ld + 2 * k + half);
#pragma GCC unroll 8
          for (int b = 0; b < NB; ++b) acc[m][b] = _mm256_fmadd_ps(w[b], xv, acc[m][b]);
        }
      }
    }
  }

  static F bias(const uint16_t* bias, int64_t n, int64_t N) { return bias_block8(bias, n, N); }
  static void store(uint16_t* y, int64_t n, int64_t N, F sums, F bias) {
    store_bf16_8(y, N - n, sums, bias);
  }
  static void store_silu_mul(uint16_t* y, F gate, F up, F gate_bias, F up_bias) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y), silu_mul_bits8(gate, up, gate_bias, up_bias));
  }

 private:
  // The float32 values of the first (k) and second (k + 1) bfloat16 of each pair: k's
  // bfloat16 shifted up; k + 1's with k's bits cleared by a mask, or (where no register is
  // left for the mask: the two-block tiles) shifted down and back up.
  static F low_halves(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
  static F high_halves(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static F high_halves_by_shifts(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(pairs, 16), 16));
  }
};
static_assert(DotLanes::kScratchRows >= DotLanes::max_rows(2),
              "the scratch holds the rows of the tallest tile");

#endif  // PAGED_CORE_BF16_DOT_ZMM

}  // namespace paged_core_cpu

#endif  // PAGED_CORE_BF16_DOT
