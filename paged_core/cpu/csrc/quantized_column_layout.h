// The column layout of the weight-only 4- and 8-bit linears for bfloat16 rows (see
// quantized_column_linear.cpp for the layout and the sums): the kinds of levels, how a
// k pair of 32 outputs widens to bfloat16, and the per-group sums of x the offsets take.
// Shared by the vdpbf16ps kernel (quantized_column_linear.cpp) and the AMX one
// (quantized_column_amx.cpp); the avx512_bf16 build only.
#pragma once

#if defined(__AVX512BF16__)
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <optional>

namespace paged_core_cpu::column_layout {

constexpr int64_t kColumns = 32;  // outputs per column group

// A per-group tensor of the column layout (scales, offsets or zeros: [C, groups, 32]) as the
// kernels read it: float32, or float16 where QuantizedLinear found that every value is one
// exactly (GGUF's fp16 scales, most checkpoints' bf16 or fp16 ones): the same values in half
// the bytes, so the same sums, while a decode step reads fewer bytes besides the levels
// (4-bit groups of 32: 0.625 bytes a weight instead of 0.75). data null: absent.
struct Factors {
  const void* data = nullptr;
  bool half = false;

  bool present() const { return data != nullptr; }
  // The values from element `at` on.
  Factors from(int64_t at) const { return {data != nullptr ? address(at) : nullptr, half}; }
  const char* address(int64_t at) const {
    return static_cast<const char*>(data) + at * (half ? 2 : 4);
  }
  // Elements at, .., at + 15 (at + 7) as float32 lanes.
  __m512 load16(int64_t at) const {
    if (half)
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(address(at))));
    return _mm512_loadu_ps(static_cast<const float*>(data) + at);
  }
  __m256 load8(int64_t at) const {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(address(at))));
    return _mm256_loadu_ps(static_cast<const float*>(data) + at);
  }
  float value(int64_t at) const {
    return half ? _cvtsh_ss(static_cast<const uint16_t*>(data)[at]) : static_cast<const float*>(data)[at];
  }
};

// A per-group tensor (float32 or float16, contiguous) as Factors; absent where t is.
inline Factors factors_of(const at::Tensor& t) {
  return {t.const_data_ptr(), t.scalar_type() == at::kHalf};
}
inline Factors factors_of(const std::optional<at::Tensor>& t) {
  return t ? factors_of(*t) : Factors{};
}

// 16 float32 lanes of 8 consecutive outputs, each twice (both k of a pair): from 8 values.
inline __m512 output_pairs(__m256 eight) {
  alignas(64) static const int32_t kPairLanes[16] = {0, 0, 1, 1, 2, 2, 3, 3,
                                                     4, 4, 5, 5, 6, 6, 7, 7};
  return _mm512_permutexvar_ps(_mm512_load_si512(kPairLanes), _mm512_castps256_ps512(eight));
}

// Levels whose widening (L::widen) gives each weight's value v exactly in bfloat16, with W =
// s (v - ValueBias) + zero per group: their dense weights, one fma on v each.
template <typename L, int ValueBias>
struct ExactLevels {
  // One group's factors of its dense weights s v + shift, shift = zero - ValueBias s, per 16
  // outputs (zeros absent: zero = 0).
  struct DenseGroup {
    __m512 s[2], shift[2];
    DenseGroup(const Factors& scales, const Factors& zeros, int64_t at) {
      for (int h = 0; h < 2; ++h) {
        s[h] = scales.load16(at + 16 * h);
        const __m512 zero = zeros.present() ? zeros.load16(at + 16 * h) : _mm512_setzero_ps();
        shift[h] = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(ValueBias)), s[h], zero);
      }
    }
  };
  // A pair's 64 weights, rounded to bfloat16, into dst in bf16_dot_linear's packed layout
  // (output j's two k at 2j, 2j + 1): one fma each on v (L::widen), read as float32 by a
  // shift (each pair's first k) or a mask (its second), the halves interleaved back by vpermw.
  static void widen_weights(const uint8_t* pair, const DenseGroup& group, uint16_t* dst) {
    alignas(64) static const int16_t kInterleave[32] = {
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512bh half[2];  // outputs 0-15, 16-31
    L::widen(pair, half[0], half[1]);
    for (int h = 0; h < 2; ++h) {
      const __m512i bits = (__m512i)half[h];
      const __m512 first = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
      const __m512 second = _mm512_castsi512_ps(
          _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
      const __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(second, group.s[h], group.shift[h]),
                                                   _mm512_fmadd_ps(first, group.s[h], group.shift[h]));
      _mm512_storeu_si512(dst + 32 * h,
                          _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), (__m512i)rounded));
    }
  }
};

// Biased levels (4-bit, and 8-bit ones within -64..63: Int4Levels, Int7Levels): level u is
// stored as a byte's bits, widened to v = 128 + u (bfloat16 bits 0x4300 | u: exact, as
// 128..255 are whole bfloat16 numbers) with no table lookup (vpermw runs on one port; for 4
// bits this took 11-16% off a row's product of 30 layers, in and out of cache). Per group W =
// s (u - kMid) + zero, so y = s * sums + (o - kOffsetBias s) * sum(x) with the offsets o:
// 4-bit zero - 8 s (kOffsetBias 128), 7-bit the zeros themselves (kOffsetBias 192 = 128 +
// kMid; absent: zero = 0, a symmetric weight), whose float16 copy then serves both. L: the
// levels type (its widen).
template <typename L, int Mid>
struct BiasedLevels : ExactLevels<L, 128 + Mid> {
  static constexpr float kLevelBias = 128.f;
  static constexpr float kMid = Mid;

  static float weight(int level, float s, float zero) {
    return (static_cast<float>(level) - kMid) * s + zero;
  }
};

// 4-bit levels (see the file comment): what sets them apart from 8-bit ones.
struct Int4Levels : BiasedLevels<Int4Levels, 8> {
  static constexpr int64_t kPairBytes = 32;
  static constexpr bool kOffsets = true;  // y also takes (o - 128 s) * sum(x)
  static constexpr float kOffsetBias = kLevelBias;
  // The AMX kernel's last 33-48 rows in two passes, each widening the levels again: cheap
  // for 4 bits, where one pass on three row tiles (TripleTiles) took 1.02-1.07x as long
  // at 33-46 rows, 0.88x at 48 (30 SmolLM2 layers x 4 projections, groups of 64, one
  // process alternating both; Intel(R) Xeon(R) Processor, amx_bf16).
  static constexpr bool kTriplePass = false;

  // A pair's bfloat16 pairs of outputs 0..15 (lo) and 16..31 (hi), plus kLevelBias.
  static void widen(const uint8_t* pair, __m512bh& lo, __m512bh& hi) {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair)));
    const __m512i bias = _mm512_set1_epi16(0x4300);  // 128.0 in bfloat16
    constexpr int kAndOr = 0xEA;                      // vpternlog: (a & b) | c
    lo = (__m512bh)_mm512_ternarylogic_epi32(bytes, _mm512_set1_epi16(0x0F), bias, kAndOr);
    hi = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(bytes, 4), bias);
  }
  static int level_of(uint8_t stored) { return stored; }
  static int level(const uint8_t* pair, int64_t j, int64_t e) {
    return j < 16 ? pair[2 * j + e] & 15 : pair[2 * (j - 16) + e] >> 4;
  }
  static void put(uint8_t* pair, int64_t j, int64_t e, int level) {
    pair[2 * (j % 16) + e] |= static_cast<uint8_t>((level & 15) << (j < 16 ? 0 : 4));
  }
};

// 8-bit levels within 32 consecutive values, stored in 5 bits: u = q + Mid in 0..31 (Mid 16:
// q in -16..15, GGUF Q5_0; Mid 0: q in 0..31 with zeros, GGUF Q5_1 and Q5_K). A pair's 40
// bytes: u's low 4 bits in Int4Levels' 32 bytes of nibbles, then bit 4 in a 64-bit plane (bit
// 2j + e of its first word for output j < 16, of its second for output 16 + j); widened to
// 128 + u by Int4Levels' widening and one masked add (an or: bit 4 is clear) per 16 outputs,
// so a weight costs 0.625 bytes where Int7Levels' take 1. W = s q + zero = s (u - Mid) +
// zero: the offsets are the zeros (absent for a symmetric weight), as for Int7Levels.
template <int Mid>
struct Int5Levels : BiasedLevels<Int5Levels<Mid>, Mid> {
  static constexpr int64_t kPairBytes = 40;
  static constexpr bool kOffsets = true;
  static constexpr float kOffsetBias = 128.f + Mid;
  static constexpr bool kTriplePass = Int4Levels::kTriplePass;  // its widening, plus an or

  static void widen(const uint8_t* pair, __m512bh& lo, __m512bh& hi) {
    Int4Levels::widen(pair, lo, hi);
    uint32_t top[2];  // bit 4 of outputs 0-15's words, then 16-31's
    std::memcpy(top, pair + 32, sizeof(top));
    const __m512i bit4 = _mm512_set1_epi16(0x10);  // added where clear: an or
    lo = (__m512bh)_mm512_mask_add_epi16((__m512i)lo, _cvtu32_mask32(top[0]), (__m512i)lo, bit4);
    hi = (__m512bh)_mm512_mask_add_epi16((__m512i)hi, _cvtu32_mask32(top[1]), (__m512i)hi, bit4);
  }
  static int level_of(uint8_t stored) { return static_cast<int8_t>(stored) + Mid; }
  static int level(const uint8_t* pair, int64_t j, int64_t e) {
    const int64_t bit = (j < 16 ? 0 : 32) + 2 * (j % 16) + e;
    return Int4Levels::level(pair, j, e) | ((pair[32 + bit / 8] >> (bit % 8)) & 1) << 4;
  }
  static void put(uint8_t* pair, int64_t j, int64_t e, int level) {
    Int4Levels::put(pair, j, e, level & 15);
    const int64_t bit = (j < 16 ? 0 : 32) + 2 * (j % 16) + e;
    if (level & 16) pair[32 + bit / 8] |= static_cast<uint8_t>(1 << (bit % 8));
  }
};

// 8-bit levels within -64..63 (GGUF Q6_K; 5-bit ones fused with it), stored as u = q + 64 in
// Int8Levels' byte order: widened by a zero extension and an or per 16 outputs, where
// Int8Levels' full range takes two conversions through float32. W = s q + zero: the offsets
// are the zeros, absent for a symmetric weight.
struct Int7Levels : BiasedLevels<Int7Levels, 64> {
  static constexpr int64_t kPairBytes = 64;
  static constexpr bool kOffsets = true;
  static constexpr float kOffsetBias = kLevelBias + kMid;
  // As for Int8Levels, 33-48 rows in one pass on three row tiles (30 SmolLM2 layers x 4
  // projections, groups of 32, levels 0..31 with zeros, Intel(R) Xeon(R) Processor,
  // amx_bf16: 40 rows 10.9 against 12.2 ms in two passes, 48 rows 12.0 against 14.7).
  static constexpr bool kTriplePass = true;

  static void widen(const uint8_t* pair, __m512bh& lo, __m512bh& hi) {
    const __m512i bias = _mm512_set1_epi16(0x4300);
    const auto* halves = reinterpret_cast<const __m256i*>(pair);
    lo = (__m512bh)_mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(halves)), bias);
    hi = (__m512bh)_mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(halves + 1)), bias);
  }
  static int level_of(uint8_t stored) { return static_cast<int8_t>(stored) + 64; }
  static int level(const uint8_t* pair, int64_t j, int64_t e) { return pair[2 * j + e]; }
  static void put(uint8_t* pair, int64_t j, int64_t e, int level) {
    pair[2 * j + e] = static_cast<uint8_t>(level);
  }
};

// 8-bit levels that are llama.cpp's IQ4_NL values (kValues, -127..113: GGUF IQ4_NL and
// IQ4_XS weights), stored as their 4-bit indices in Int4Levels' byte order and widened by a
// table lookup (vpermw) straight to the value in bfloat16 (exact: whole numbers of at most 8
// bits), so a weight costs Int4Levels' half byte instead of Int8Levels' byte and two
// conversions. W = s kValues[i] + zero: no offsets (the zeros, absent for IQ4, only in the
// dense weights).
struct Iq4Levels : ExactLevels<Iq4Levels, 0> {
  static constexpr int64_t kPairBytes = 32;
  static constexpr bool kOffsets = false;
  static constexpr bool kTriplePass = Int4Levels::kTriplePass;  // its widening, plus a vpermw
  static constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

  static void widen(const uint8_t* pair, __m512bh& lo, __m512bh& hi) {
    alignas(64) static const uint16_t kTable[32] = {  // bfloat16 bits of kValues, twice
        0xC2FE, 0xC2D0, 0xC2A6, 0xC282, 0xC244, 0xC20C, 0xC1B0, 0xC120,
        0x3F80, 0x4150, 0x41C8, 0x4218, 0x4254, 0x428A, 0x42B2, 0x42E2,
        0xC2FE, 0xC2D0, 0xC2A6, 0xC282, 0xC244, 0xC20C, 0xC1B0, 0xC120,
        0x3F80, 0x4150, 0x41C8, 0x4218, 0x4254, 0x428A, 0x42B2, 0x42E2};
    const __m512i table = _mm512_load_si512(kTable);
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair)));
    lo = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, _mm512_set1_epi16(0x0F)), table);
    hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
  }
  static float weight(int level, float s, float zero) { return kValues[level] * s + zero; }
  // The index of a stored int8 value (one of kValues: column_pack checks).
  static int level_of(uint8_t stored) {
    const int8_t value = static_cast<int8_t>(stored);
    int i = 0;
    while (i < 15 && kValues[i] != value) ++i;
    return i;
  }
  static int level(const uint8_t* pair, int64_t j, int64_t e) { return Int4Levels::level(pair, j, e); }
  static void put(uint8_t* pair, int64_t j, int64_t e, int level) { Int4Levels::put(pair, j, e, level); }
};

// 8-bit levels (symmetric: W = s q; Int8ZeroLevels takes zeros).
struct Int8Levels {
  static constexpr int64_t kPairBytes = 64;
  static constexpr bool kOffsets = false;
  // The AMX kernel's last 33-48 rows in one pass on three row tiles sharing each widening
  // (TripleTiles): 30 SmolLM2 layers x 4 projections, one scale per channel, 33-48 rows
  // 12.4-14.3 ms against 14.4-16.7 in two passes (one process alternating both; Intel(R)
  // Xeon(R) Processor, amx_bf16).
  static constexpr bool kTriplePass = true;

  static __m512bh half(const uint8_t* p) {
    const auto* v = reinterpret_cast<const __m128i*>(p);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(v)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(v + 1)));
    return _mm512_cvtne2ps_pbh(b, a);  // a: the low 16 words
  }
  static void widen(const uint8_t* pair, __m512bh& lo, __m512bh& hi) {
    lo = half(pair);
    hi = half(pair + 32);
  }
  // One group's factors of its dense weights s q (+ zero): the scales (zeros) of outputs
  // 8b .. 8b + 7, each twice (both k of a pair).
  struct DenseGroup {
    __m512 s[4], zero[4];
    bool zeros;
    DenseGroup(const Factors& scales, const Factors& zeros_, int64_t at) : zeros(zeros_.present()) {
      for (int b = 0; b < 4; ++b) {
        s[b] = output_pairs(scales.load8(at + 8 * b));
        zero[b] = zeros ? output_pairs(zeros_.load8(at + 8 * b)) : _mm512_setzero_ps();
      }
    }
  };
  // A pair's 64 weights, rounded to bfloat16, into dst in bf16_dot_linear's packed layout,
  // through float32 levels, 8 outputs (both k each) at a time: q * s (+ zero), as weight().
  static void widen_weights(const uint8_t* pair, const DenseGroup& group, uint16_t* dst) {
    for (int b = 0; b < 4; ++b) {
      const __m512 levels = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pair + 16 * b))));
      __m512 w = _mm512_mul_ps(levels, group.s[b]);
      if (group.zeros) w = _mm512_add_ps(w, group.zero[b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * b),
                          (__m256i)_mm512_cvtneps_pbh(w));
    }
  }
  static float weight(int level, float s, float zero) { return static_cast<float>(level) * s + zero; }
  static int level_of(uint8_t stored) { return static_cast<int8_t>(stored); }
  static int level(const uint8_t* pair, int64_t j, int64_t e) {
    return static_cast<int8_t>(pair[2 * j + e]);
  }
  static void put(uint8_t* pair, int64_t j, int64_t e, int level) {
    pair[2 * j + e] = static_cast<uint8_t>(static_cast<int8_t>(level));
  }
};

// 8-bit levels over the whole range with zeros (W = s q + zero; GPTQ and compressed-tensors
// asymmetric, or GGUF Q5_1 beside Q8_0 in one fused projection): Int8Levels' widening, the
// zeros as the offsets (y takes zero * sum(x) per group, no bias to take back).
struct Int8ZeroLevels : Int8Levels {
  static constexpr bool kOffsets = true;
  static constexpr float kOffsetBias = 0.f;
};

// Whether pair p's levels start a cache line the pair before did not (prefetch that line).
template <typename L>
constexpr bool starts_line(int64_t p) {
  return (p * L::kPairBytes) % 64 < L::kPairBytes;
}

// The first n of 16 lanes.
inline __mmask16 lanes_below(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Where a product's rows go: float32 (f) or bfloat16 (b: each sum rounded to nearest even,
// as torch rounds float32 to bfloat16), row r at r * ld.
struct RowsOut {
  float* f;
  uint16_t* b;
  int64_t ld;

  RowsOut at(int64_t row, int64_t column) const {
    const int64_t offset = row * ld + column;
    return {f != nullptr ? f + offset : nullptr, b != nullptr ? b + offset : nullptr, ld};
  }
  // 16 sums to row r, outputs [column, column + 16) (masked past N).
  void store(int64_t r, int64_t column, __mmask16 mask, __m512 sums) const {
    if (b != nullptr)
      _mm256_mask_storeu_epi16(b + r * ld + column, mask, (__m256i)_mm512_cvtneps_pbh(sums));
    else
      _mm512_mask_storeu_ps(f + r * ld + column, mask, sums);
  }
};

// A column group's levels (K / 2 pairs) and per-group scales and offsets (groups x 32;
// offsets absent for 8 bits).
struct ColumnGroup {
  const uint8_t* levels = nullptr;
  Factors scales, offsets;
};

// A whole weight in the column layout: levels [C, K / 2, L::kPairBytes], per-group scales
// and offsets [C, K / group_size, 32] (offsets absent for 8 bits).
struct ColumnGroups {
  const uint8_t* levels;
  Factors scales, offsets;
  int64_t group_size;

  // Column group c of a weight of K input features.
  template <typename L>
  ColumnGroup column(int64_t c, int64_t K) const {
    const int64_t at = c * (K / group_size) * kColumns;
    return ColumnGroup{levels + c * (K / 2) * L::kPairBytes, scales.from(at), offsets.from(at)};
  }
};

// Where the kernels fetch the next column group's levels while they read this group's (a line
// of the next beside each line of this one, a group ahead: 9-25 KB for SmolLM2's
// projections): into L2 (T1), where the products ran faster than with the same fetches into
// L1 (T0). 30 SmolLM2 layers x 4 projections, 4-bit groups of 64, weights far beyond the
// last-level cache, T1 against T0: 1 row 3.89-3.92 against 4.04-4.06 ms, 8 rows (AMX tiles)
// 4.21-4.38 against 4.59-4.60; a decode step of the embedded model at 8 sequences, W4A16
// 8.07-9.02 against 8.24-9.31 ms and W8A16 9.68-10.88 against 10.51-11.81 (three alternated
// pairs each; Intel(R) Xeon(R) Processor, amx_bf16). The dense path's widening (64 rows and
// more) takes the same hint: alike within noise there (64 rows 13.64-14.21 against
// 13.46-14.72 ms, 256 rows 33.06-35.00 against 33.88-37.22; same machine).
constexpr auto kNextLevelsHint = _MM_HINT_T1;

// Fetches column group `next`'s scales and offsets of group g into L1 (a line each in
// float16, two in float32).
inline void fetch_factors(const ColumnGroup& next, int64_t g) {
  for (const Factors* t : {&next.scales, &next.offsets})
    if (t->present()) {
      _mm_prefetch(t->address(g * kColumns), _MM_HINT_T0);
      if (!t->half) _mm_prefetch(t->address(g * kColumns + 16), _MM_HINT_T0);
    }
}

// A column group's group g as y takes it: y += s * sums (+ (o - kOffsetBias s) * sum of x),
// for outputs 0-15 (h = 0) and 16-31 (h = 1).
template <typename L>
struct GroupFactors {
  __m512 scale[2], offset[2];

  GroupFactors(const ColumnGroup& col, int64_t g) {
    for (int h = 0; h < 2; ++h) {
      scale[h] = col.scales.load16(g * kColumns + 16 * h);
      if constexpr (L::kOffsets) {  // offsets absent (Int7Levels only): 0
        const __m512 o = col.offsets.present() ? col.offsets.load16(g * kColumns + 16 * h)
                                               : _mm512_setzero_ps();
        offset[h] = _mm512_fnmadd_ps(_mm512_set1_ps(L::kOffsetBias), scale[h], o);
      }
    }
  }
  // total + the group's part of y, from its sums of x . widened levels and its sum of x.
  __m512 add(int h, __m512 sums, float xsum, __m512 total) const {
    total = _mm512_fmadd_ps(sums, scale[h], total);
    if constexpr (L::kOffsets) total = _mm512_fmadd_ps(offset[h], _mm512_set1_ps(xsum), total);
    return total;
  }
};

// quantized_column_amx.cpp: rows [0, M) of x (bfloat16, K apart; their group_sums xsum)
// times column groups [c0, c1) of w on AMX tiles (w.group_size % 32 == 0; only where
// bf16_amx_ready()): row m's outputs [32 c, 32 c + 32) to y (y.ld == N), masked past N.
template <typename L>
void amx_column_groups(const uint16_t* x, int64_t M, int64_t K, const float* xsum,
                       const ColumnGroups& w, int64_t c0, int64_t c1, int64_t N, const RowsOut& y);

// Each row's sums over each group of x's bfloat16 values (the offsets' factor):
// xsum[m * groups + g] = sum of x[m, g G .. (g + 1) G), in one order whatever M.
inline void group_sums(const uint16_t* x, int64_t M, int64_t K, int64_t group_size, float* xsum) {
  const int64_t groups = K / group_size;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      __m512 sum = _mm512_setzero_ps();
      for (int64_t k = g * group_size; k < (g + 1) * group_size; k += 16) {
        const __m256i bits = _mm256_maskz_loadu_epi16(lanes_below((g + 1) * group_size - k), x + m * K + k);
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
      }
      xsum[m * groups + g] = _mm512_reduce_add_ps(sum);
    }
}

}  // namespace paged_core_cpu::column_layout

#endif  // __AVX512BF16__
