// bfloat16 paged attention with AVX512-BF16 dot products (vdpbf16ps), for builds with
// -mavx512bf16 (the avx512_bf16 level); PAGED_CORE_BF16_TILES says whether it exists.
//
// The same visibility rules and output as attention_kernel in paged_attention.cpp; what
// differs is how a unit of work computes. A unit is a tile of up to 32 queries
// (kBf16TileQueries) of one sequence (every query head of one KV head: rows r = i * G + g)
// over a range of keys [key_lo, key_hi) (the whole visible context, or one part of it when
// a long context is split across threads). It walks the range in segments of up to
// kMaxSegChunks chunks of 16 consecutive positions (any block size: each key row is found
// through the block table) and, per segment:
//   - transposes each chunk's keys once into Kt[D/2][16] (pairs of dims as 32-bit words),
//     so a query row's 16 scores of a chunk are D/2 vdpbf16ps with the query's pair
//     broadcast: no horizontal sums, and every row of the unit reuses the transposed keys,
//     read once from the cache;
//   - interleaves the values by key pairs into Vp[pairs][D], so p . V is one vdpbf16ps per
//     16 dims and key pair with the probabilities' pair broadcast;
//   - for groups of up to kRowBlock rows (sharing every load of Kt and Vp): scores of the
//     whole segment in registers, one online-softmax step per row (the max moved and the
//     row's output rescaled, folded into its load, only where the segment passes the max
//     by kRescaleSlack; one 2^x per score), p . V (vdp_segment_rows).
// walk_segments (the segments, their rows, prefetches and visibility) is shared with the
// AMX prompt path (attention_prompt_amx.h), which lays each segment out its own way.
// The next segment's rows are prefetched while this one is transposed, and the blocks two
// segments ahead are touched so their page walks start early.
// Scores and the online softmax are float32, in log2 units (scores times scale * log2 e, or
// soft-capped first: ScoreMap);
// probabilities are rounded to bfloat16 for p . V (like flash-attention kernels), and the
// softmax denominator sums those rounded values, so numerator and denominator agree. Keys
// a query may not see get probability 0 exactly, and the values of positions at or past
// key_hi are zeros, so nothing outside the range (NaN in unowned slots) reaches the output.
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__) && \
    defined(__AVX2__) && defined(__FMA__)
#define PAGED_CORE_BF16_TILES 1

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_simd.h"
#include "line_buffer.h"

namespace paged_core_cpu {

constexpr int kChunk = 16;        // keys per chunk: one float32 score per lane
constexpr int kMaxSegChunks = 4;  // chunks per segment (one online-softmax step), at most
constexpr int kRowBlock = 4;      // query rows that share each load of Kt and Vp
constexpr int kSplitAlign = kMaxSegChunks * kChunk;  // key-range parts start at multiples

// Chunks per segment for head_dim D: 64 keys for D <= 64, 32 above (Kt and Vp of a
// segment, 2 * 64 * D bytes or less, stay in L1).
inline int segment_chunks(int D) { return D <= 64 ? 4 : 2; }

// 2^x on the lanes of keep (others exactly 0): a degree-3 polynomial on the fraction, exact
// at integers (2^0 = 1), relative error < 1.1e-4 (far below the bfloat16 rounding that
// probabilities get). x's nearest integer comes from adding and taking back 1.5 * 2^23 (two
// adds, which run on either FMA port: 1.03-1.07x the speed of vrndscaleps in AMX prompt
// attention, Intel(R) Xeon(R) Processor, amx_bf16), exact for |x| < 2^22; below -2^22 the
// result is 0 either way.
inline __m512 exp2_probs(__m512 x, __mmask16 keep) {
  const __m512 magic = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(x, magic), magic);
  const __m512 f = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
  __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(0.0550089292f), f, _mm512_set1_ps(0.242210954f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.693282902f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(keep, y, n);
}

// How raw scores (q . k) become the softmax's logits, in log2 units: times scale * log2(e),
// or with a soft cap c (Gemma 2) c * log2(e) * tanh(scale * s / c).
struct ScoreMap {
  float scale_log2;  // scale * log2(e)
  float cap_scale;   // scale / c; 0: no cap
  float cap_log2;    // c * log2(e)
};

inline ScoreMap score_map(float scale, float soft_cap) {
  const float log2e = 1.44269504088896341f;
  return soft_cap > 0.f ? ScoreMap{scale * log2e, scale / soft_cap, soft_cap * log2e}
                        : ScoreMap{scale * log2e, 0.f, 0.f};
}

// The logits of 16 raw scores. tanh(x) = sign(x) (1 - e) / (1 + e), e = 2^(-2|x| log2 e) from
// exp2_probs (relative error < 1.1e-4: far below the bfloat16 rounding probabilities get).
inline __m512 map_scores(__m512 s, const ScoreMap& m) {
  if (m.cap_scale == 0.f) return _mm512_mul_ps(s, _mm512_set1_ps(m.scale_log2));
  const __m512 x = _mm512_mul_ps(s, _mm512_set1_ps(m.cap_scale));
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = exp2_probs(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.8853900817779268f)),
                              0xFFFF);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 signed_t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
  return _mm512_mul_ps(signed_t, _mm512_set1_ps(m.cap_log2));
}

// Transpose a 16 x 16 matrix of 32-bit words held as 16 rows (in place).
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  __m512i out[16];
  for (int k = 0; k < 4; ++k) {
    const __m512i a = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88);
    const __m512i b = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);
    const __m512i c = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88);
    const __m512i d = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
    out[k] = _mm512_shuffle_i32x4(a, c, 0x88);
    out[8 + k] = _mm512_shuffle_i32x4(a, c, 0xDD);
    out[4 + k] = _mm512_shuffle_i32x4(b, d, 0x88);
    out[12 + k] = _mm512_shuffle_i32x4(b, d, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = out[i];
}

// dst[0:D] = bf16(src[d] * inv) for D % 16 == 0, rounded to nearest even by vcvtneps2bf16
// (float_to_bf16_bits' bits in cpu_common.h for every finite normal value; subnormal ones
// flush to zero, and an output is never NaN: every row saw a key). One instruction where
// the emulated rounding took seven: a 128-token prompt's attention 1.03x the speed on one
// thread (SmolLM2's shape, AMD EPYC family 25 model 17, avx512_bf16).
inline void store_row_bf16(uint16_t* dst, const float* src, float inv, int D) {
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int d = 0; d < D; d += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(src + d), vinv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(x));
  }
}

// What every unit of one call shares: the packed query, one KV head's caches at a time,
// the block tables and the output.
struct Bf16Problem {
  const uint16_t* q;
  int64_t q_t_stride, q_h_stride;
  const uint16_t* k;  // [num_kv_heads][num_blocks][block_size][D]
  const uint16_t* v;
  const int32_t* block_tables;
  int64_t bt_stride, num_blocks, block_size;
  int G, D;
  float scale;
  int64_t window;  // 0: none
  float soft_cap;  // > 0: logits soft-capped to soft_cap * tanh(s / soft_cap); 0: none
  uint16_t* out;   // [tokens][num_heads][D]
  int64_t num_heads;  // num_kv_heads * G
  bool kv_first_line;  // the decode loop fetches each K and V run's first line into L2 only
};

// One unit: nq queries (tokens first_token.., positions pos0..) of sequence seq, KV head h,
// over the keys [key_lo, key_hi) they may see (key_hi <= pos0 + nq; key_lo >= 0).
struct Bf16Unit {
  int64_t seq, h, first_token, pos0, key_lo, key_hi;
  int nq;
};

// One thread's buffers for units of up to max_rows query rows and head_dim D.
struct Bf16TileBuffers {
  int D;
  LineBuffer<uint32_t> q;    // [rows][D/2] query rows as bf16 pairs
  LineBuffer<float> acc;     // [rows][D] un-normalised outputs
  LineBuffer<float> mx;      // [rows] running max, log2 units (-inf: no key seen yet)
  LineBuffer<float> sum;     // [rows][16] denominators, 16 partial sums per row
  LineBuffer<uint32_t> kt;   // [chunks][D/2][16] the segment's keys, transposed per chunk
  LineBuffer<uint32_t> vp;   // [pairs][D] the segment's values, key pairs interleaved
  LineBuffer<uint64_t> visible;  // [rows] the keys of the segment each row sees (bit j: key j)

  Bf16TileBuffers(int max_rows, int head_dim)
      : D(head_dim), q(static_cast<size_t>(max_rows) * head_dim / 2),
        acc(static_cast<size_t>(max_rows) * head_dim), mx(max_rows), sum(static_cast<size_t>(max_rows) * 16),
        kt(static_cast<size_t>(kMaxSegChunks) * head_dim / 2 * kChunk),
        vp(static_cast<size_t>(kMaxSegChunks) * kChunk / 2 * head_dim), visible(max_rows) {}

  float row_sum(int r) const { return _mm512_reduce_add_ps(_mm512_loadu_ps(sum.data() + 16 * r)); }
};

// Fetches one cache row (D bf16) ahead of its use into L2; nullptr: nothing. L2 keeps more
// misses in flight than L1's fill buffers: decode of SmolLM2's shape (64 sequences x 2048
// keys) read 6.4 GB/s with non-temporal (L1) prefetches, 11 with T0, 13-15 with T1 on the
// Intel Xeon with AMX (21 GB/s measured); non-temporal had been a little faster than T0 on
// the AMD EPYC Zen 5.
inline void prefetch_row(const uint16_t* row, int D) {
  if (!row) return;
  for (int byte = 0; byte < D * 2; byte += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row) + byte, _MM_HINT_T1);
}

// Kt of one chunk from its key rows (nullptr: past the range, read as zeros). Prefetches
// the rows ahead[0..15] (the next segment's) along the way: spread over the work, not
// in one burst that would stall on the core's outstanding-miss limit.
inline void transpose_keys(const uint16_t* const* rows, int D, uint32_t* kt,
                           const uint16_t* const* ahead) {
  for (int j = 0; j < kChunk; ++j) prefetch_row(ahead[j], D);
  for (int c0 = 0; c0 < D / 2; c0 += 16) {  // 16 pair-columns (32 dims) at a time
    __m512i r[16];
    for (int j = 0; j < kChunk; ++j)
      r[j] = rows[j] ? _mm512_loadu_si512(rows[j] + 2 * c0) : _mm512_setzero_si512();
    transpose16x16(r);
    for (int c = 0; c < 16; ++c) _mm512_storeu_si512(kt + (c0 + c) * kChunk, r[c]);
  }
}

// Two value rows' 32 dims as bfloat16 key pairs (a[d], b[d]) in 32-bit words: dims 0-15 into
// lo, 16-31 into hi (vdpbf16ps's operand for p . V with the probabilities' pair broadcast).
inline void pair_values(__m512i a, __m512i b, __m512i& lo, __m512i& hi) {
  alignas(64) static const uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                               37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                               11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i low_dims = _mm512_load_si512(kLo);
  lo = _mm512_permutex2var_epi16(a, low_dims, b);
  hi = _mm512_permutex2var_epi16(a, _mm512_add_epi16(low_dims, _mm512_set1_epi16(16)), b);
}

// Vp[i][d] = v[2i][d] | v[2i+1][d] << 16 for i < pairs, from value rows (nullptr: zeros).
// Prefetches the rows ahead[0 .. 2 * pairs - 1] along the way.
inline void interleave_values(const uint16_t* const* rows, int pairs, int D, uint32_t* vp,
                              const uint16_t* const* ahead) {
  for (int i = 0; i < pairs; ++i) {
    prefetch_row(ahead[2 * i], D);
    prefetch_row(ahead[2 * i + 1], D);
    const uint16_t* a = rows[2 * i];
    const uint16_t* b = rows[2 * i + 1];
    for (int d = 0; d < D; d += 32) {
      const __m512i va = a ? _mm512_loadu_si512(a + d) : _mm512_setzero_si512();
      const __m512i vb = b ? _mm512_loadu_si512(b + d) : _mm512_setzero_si512();
      __m512i lo, hi;
      pair_values(va, vb, lo, hi);
      _mm512_storeu_si512(vp + i * D + d, lo);
      _mm512_storeu_si512(vp + i * D + d + 16, hi);
    }
  }
}

// Raw scores s[r][n] (16 keys of chunk n) of R query rows (bf16 pairs q[r]) against N
// chunks of Kt. The rows share every load of Kt; U chains per score when R * N alone
// would leave the dot-product units waiting on latency.
template <int R, int N>
inline void segment_scores(const uint32_t* const* q, const uint32_t* kt, int D, __m512 (&s)[R][N]) {
  constexpr int U = R * N <= 4 ? 2 : 1;
  const int half = D / 2;  // pair-columns; a multiple of 16
  __m512 a[U][R][N];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int n = 0; n < N; ++n) a[u][r][n] = _mm512_setzero_ps();
  for (int c = 0; c < half; c += U)
    for (int u = 0; u < U; ++u) {
      __m512bh k[N];
      for (int n = 0; n < N; ++n)
        k[n] = (__m512bh)_mm512_loadu_si512(kt + (n * half + c + u) * kChunk);
      for (int r = 0; r < R; ++r) {
        const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r][c + u]));
        for (int n = 0; n < N; ++n) a[u][r][n] = _mm512_dpbf16_ps(a[u][r][n], k[n], qb);
      }
    }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < N; ++n) {
      s[r][n] = a[0][r][n];
      for (int u = 1; u < U; ++u) s[r][n] = _mm512_add_ps(s[r][n], a[u][r][n]);
    }
}

// How far (log2 units) a segment's largest score may pass a row's running maximum before the
// maximum moves and the row's outputs and denominators are rescaled: until then the row's
// probabilities exp2(s - max) stay <= 2^8, far inside float32 and bfloat16 range, and the
// result is the same softmax (the decode loop's rule too, attention_decode_bf16.h).
constexpr float kRescaleSlack = 8.f;

// Online-softmax step of row r over N chunks of raw scores s, visible keys bits of
// visible (bit 16n + lane): updates the row's max (only where the segment passes it by more
// than kRescaleSlack: most segments after a row's first skip the max's horizontal reduction
// and the rescale, fresh SmolLM2-shaped prompts of 128 / 512 / 2048 tokens 1.02 / 1.04 / 1.07x
// the speed of a max moved every segment, one process alternating both, AMD EPYC family 25
// model 17, avx512_bf16, 2 threads) and denominator, writes the bf16 probability pairs (key
// pairs of the segment) to pp and returns the factor alpha that the row's output must be
// scaled by before this segment's p . V is added. Scores are kept in log2 units (map:
// ScoreMap), so probabilities are powers of two.
template <int N>
inline float softmax_step(__m512 (&s)[N], uint64_t visible, const ScoreMap& map, int r,
                          Bf16TileBuffers& w, uint32_t* pp) {
  const float neg_inf_f = -std::numeric_limits<float>::infinity();
  const __m512 neg_inf = _mm512_set1_ps(neg_inf_f);
  __mmask16 vis[N];
  __m512 m = neg_inf;
  for (int n = 0; n < N; ++n) {
    vis[n] = static_cast<__mmask16>(visible >> (kChunk * n));
    s[n] = _mm512_mask_mov_ps(neg_inf, vis[n], map_scores(s[n], map));
    m = _mm512_max_ps(m, s[n]);
  }
  const float old_f = w.mx[r];
  const __m512 old = _mm512_set1_ps(old_f);
  float* sum = w.sum.data() + 16 * r;
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);  // bf16 1.0
  __m512 mv, alpha, total;
  if (old_f != neg_inf_f &&
      _mm512_cmp_ps_mask(m, _mm512_set1_ps(old_f + kRescaleSlack), _CMP_GT_OQ) == 0) {
    mv = old;  // the max stays: outputs and denominators as they are
    alpha = _mm512_set1_ps(1.f);
    total = _mm512_loadu_ps(sum);
  } else {  // the row's first segment (old = -inf), or one that passes the max by the slack
    m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0x4E));  // every lane: the segment's max
    m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xB1));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0xB1));
    mv = _mm512_max_ps(old, m);  // finite: a key is visible
    // 0 on the row's first segment (old = -inf: the sums are unset before).
    const __mmask16 seen = _mm512_cmp_ps_mask(old, neg_inf, _CMP_NEQ_OQ);
    alpha = exp2_probs(_mm512_sub_ps(old, mv), seen);
    w.mx[r] = _mm512_cvtss_f32(mv);
    total = _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(seen, sum));
  }
  for (int n = 0; n < N; n += 2) {
    const __m512 p0 = exp2_probs(_mm512_sub_ps(s[n], mv), vis[n]);
    const __m512 p1 = n + 1 < N ? exp2_probs(_mm512_sub_ps(s[n + 1], mv), vis[n + 1])
                                : _mm512_setzero_ps();
    const __m512bh pb = _mm512_cvtne2ps_pbh(p1, p0);  // keys 16n .. 16n + 31, as 16 pairs
    total = _mm512_dpbf16_ps(total, pb, ones);
    _mm512_storeu_si512(pp + kChunk / 2 * n, (__m512i)pb);
  }
  _mm512_storeu_ps(sum, total);
  return _mm512_cvtss_f32(alpha);
}

// acc[r][d0 : d0 + 16W] = alpha[r] * acc[r][...] + sum_i pp[r][i] . Vp[i][...] for R rows
// over the segment's key pairs; the rows share every load of Vp. A row whose alpha is 0 (its
// first segment, or earlier keys' weight below float's range) starts from zero without
// reading acc, which is unset before a row's first segment.
template <int R, int W>
inline void values_block(const uint32_t (*pp)[kMaxSegChunks * kChunk / 2], const uint32_t* vp,
                         int pairs, int D, int d0, float* const* acc, const float* alpha) {
  __m512 a[R][W];
  for (int r = 0; r < R; ++r) {
    const __m512 al = _mm512_set1_ps(alpha[r]);
    const __mmask16 keep = alpha[r] != 0.f ? 0xFFFF : 0;
    for (int x = 0; x < W; ++x)
      a[r][x] = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(keep, acc[r] + d0 + 16 * x));
  }
  for (int i = 0; i < pairs; ++i) {
    __m512bh v[W];
    for (int x = 0; x < W; ++x) v[x] = (__m512bh)_mm512_loadu_si512(vp + i * D + d0 + 16 * x);
    for (int r = 0; r < R; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[r][i]));
      for (int x = 0; x < W; ++x) a[r][x] = _mm512_dpbf16_ps(a[r][x], v[x], p);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < W; ++x) _mm512_storeu_ps(acc[r] + d0 + 16 * x, a[r][x]);
}

// The segment (N chunks, transposed in w.kt / w.vp) for R rows (ids rows[], visible keys
// bits visible[]): scores, softmax, p . V.
template <int R, int N>
inline void rows_step(const int* rows, const uint64_t* visible, Bf16TileBuffers& w,
                      const ScoreMap& map) {
  const int D = w.D;
  const uint32_t* q[R];
  float* acc[R];
  for (int r = 0; r < R; ++r) {
    q[r] = w.q.data() + static_cast<size_t>(rows[r]) * D / 2;
    acc[r] = w.acc.data() + static_cast<size_t>(rows[r]) * D;
  }
  __m512 s[R][N];
  segment_scores<R, N>(q, w.kt.data(), D, s);
  alignas(64) uint32_t pp[R][kMaxSegChunks * kChunk / 2];
  float alpha[R];
  for (int r = 0; r < R; ++r) alpha[r] = softmax_step<N>(s[r], visible[r], map, rows[r], w, pp[r]);
  const int pairs = N * kChunk / 2;
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) values_block<R, 4>(pp, w.vp.data(), pairs, D, d0, acc, alpha);
  if (d0 < D) values_block<R, 2>(pp, w.vp.data(), pairs, D, d0, acc, alpha);  // D % 32 == 0
}

template <int R>
inline void rows_step_n(int n, const int* rows, const uint64_t* visible, Bf16TileBuffers& w,
                        const ScoreMap& map) {
  switch (n) {
    case 1: rows_step<R, 1>(rows, visible, w, map); break;
    case 2: rows_step<R, 2>(rows, visible, w, map); break;
    case 3: rows_step<R, 3>(rows, visible, w, map); break;
    default: rows_step<R, 4>(rows, visible, w, map); break;
  }
}

// The segment of n chunks (Kt and Vp in w) for every row of a unit that sees one of its keys
// (visible[r]: bit j, key j of the segment), kRowBlock rows at a time on vdpbf16ps, each
// block over the chunks up to the last key one of its rows sees: the chunks after it would
// add probabilities of exactly 0 (on a prompt's diagonal segment the block's early rows no
// longer pay for the keys only the unit's later rows see): fresh SmolLM2-shaped prompts of
// 128 tokens 175-176 -> 184-186 GFLOP/s (four of them 191-192 -> 203-204), of 256 tokens
// 229-230 -> 237-238 (three processes each way, alternating; AMD EPYC family 25 model 17,
// avx512_bf16, 2 threads).
inline void vdp_segment_rows(int rows, int n, const uint64_t* visible, Bf16TileBuffers& w,
                             const ScoreMap& map) {
  int active = 0;
  int ids[kRowBlock];
  uint64_t bits[kRowBlock];
  uint64_t seen = 0;  // the keys the block's rows see
  auto flush = [&] {
    if (active == 0) return;
    const int chunks = std::min(n, (63 - __builtin_clzll(seen)) / kChunk + 1);
    switch (active) {
      case 1: rows_step_n<1>(chunks, ids, bits, w, map); break;
      case 2: rows_step_n<2>(chunks, ids, bits, w, map); break;
      case 3: rows_step_n<3>(chunks, ids, bits, w, map); break;
      default: rows_step_n<4>(chunks, ids, bits, w, map); break;
    }
    active = 0;
    seen = 0;
  };
  for (int r = 0; r < rows; ++r) {
    if (visible[r] == 0) continue;
    ids[active] = r;
    bits[active] = visible[r];
    seen |= visible[r];
    if (++active == kRowBlock) flush();
  }
  flush();
}

// Pointers to the rows of keys c0 .. c0 + count - 1 in one KV head's K and V caches
// (nullptr at or past key_hi); false on a block table entry outside [0, num_blocks).
inline bool key_rows(const Bf16Problem& pb, const int32_t* table, const uint16_t* k_head,
                     const uint16_t* v_head, int64_t c0, int count, int64_t key_hi,
                     const uint16_t** krows, const uint16_t** vrows) {
  int j = 0;
  while (j < count && c0 + j < key_hi) {  // one run of keys per block
    const int64_t key = c0 + j;
    const int64_t b = key / pb.block_size, off = key - b * pb.block_size;
    const int64_t phys = table[b];
    if (phys < 0 || phys >= pb.num_blocks) return false;
    const int64_t run = std::min<int64_t>({count - j, pb.block_size - off, key_hi - key});
    const uint16_t* kb = k_head + (phys * pb.block_size + off) * pb.D;
    const uint16_t* vb = v_head + (phys * pb.block_size + off) * pb.D;
    for (int64_t t = 0; t < run; ++t, ++j) {
      krows[j] = kb + t * pb.D;
      vrows[j] = vb + t * pb.D;
    }
  }
  for (; j < count; ++j) krows[j] = vrows[j] = nullptr;
  return true;
}

inline int64_t first_segment_start(const Bf16Unit& u) { return u.key_lo / kChunk * kChunk; }

// Prefetches the first line of each K and V block of unit u's segment of seg keys from
// key s, so that its page walks (the cache is far larger than the TLB's reach) overlap the
// work before it; its other lines follow later.
inline void touch_segment(const Bf16Problem& pb, const Bf16Unit& u, int64_t s, int seg) {
  const int64_t head = u.h * pb.num_blocks * pb.block_size * pb.D;
  const int32_t* table = pb.block_tables + u.seq * pb.bt_stride;
  const int64_t end = std::min<int64_t>(s + seg, u.key_hi);
  for (int64_t key = s; key < end; key = (key / pb.block_size + 1) * pb.block_size) {
    const int64_t phys = table[key / pb.block_size];
    if (phys < 0 || phys >= pb.num_blocks) return;  // reported when the segment is read
    const int64_t row = (phys * pb.block_size + key % pb.block_size) * pb.D;
    _mm_prefetch(reinterpret_cast<const char*>(pb.k + head + row), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(pb.v + head + row), _MM_HINT_T1);
  }
}

// Prefetches the rows rows[from .. to) (nullptr: none) into L2.
inline void prefetch_rows(const uint16_t* const* rows, int from, int to, int D) {
  for (int j = from; j < to; ++j) prefetch_row(rows[j], D);
}

// Walks unit u's keys [key_lo, key_hi) segment by segment (segment_chunks(D) chunks each,
// the first starting at first_segment_start(u)): per segment, visible[i * G + g] = the keys
// of the segment query i sees (bit j: the segment's key j), then segment(n, krows, vrows,
// next_k, next_v): the segment's n chunks of key and value rows (nullptr at or past
// key_hi), and the rows this thread reads after them (this unit's next segment, or the first
// of next: nullptr where none), which segment prefetches while it lays the segment out.
// Returns false on a block table entry outside [0, num_blocks).
template <typename Segment>
bool walk_segments(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                   uint64_t* visible, Segment&& segment) {
  const int D = pb.D, G = pb.G;
  const int64_t head_stride = pb.num_blocks * pb.block_size * D;
  const int32_t* table = pb.block_tables + u.seq * pb.bt_stride;
  const uint16_t* k_head = pb.k + u.h * head_stride;
  const uint16_t* v_head = pb.v + u.h * head_stride;
  const int seg = segment_chunks(D) * kChunk;
  constexpr int kMaxSeg = kMaxSegChunks * kChunk;
  const uint16_t* krows[kMaxSeg];
  const uint16_t* vrows[kMaxSeg];
  const uint16_t* next_k[kMaxSeg];  // the rows this thread reads next (prefetched meanwhile)
  const uint16_t* next_v[kMaxSeg];
  int64_t s0 = first_segment_start(u);
  const int64_t end = s0 + (u.key_hi - s0 + seg - 1) / seg * seg;  // past the last segment
  if (!key_rows(pb, table, k_head, v_head, s0, seg, u.key_hi, next_k, next_v)) return false;
  for (; s0 < u.key_hi; s0 += seg) {
    std::copy(next_k, next_k + seg, krows);
    std::copy(next_v, next_v + seg, vrows);
    if (s0 + seg < u.key_hi) {
      if (!key_rows(pb, table, k_head, v_head, s0 + seg, seg, u.key_hi, next_k, next_v)) return false;
    } else if (next) {  // the next unit's first segment
      const int64_t next_head = next->h * head_stride;
      if (!key_rows(pb, pb.block_tables + next->seq * pb.bt_stride, pb.k + next_head,
                    pb.v + next_head, first_segment_start(*next), seg, next->key_hi, next_k, next_v))
        return false;
    } else {
      std::fill(next_k, next_k + seg, nullptr);
      std::fill(next_v, next_v + seg, nullptr);
    }
    // Page walks of the blocks two segments ahead (this unit's or the next's) start now.
    const int64_t ahead = s0 + 2 * seg - end;  // >= 0: that many keys into the next unit
    if (ahead < 0)
      touch_segment(pb, u, s0 + 2 * seg, seg);
    else if (next)
      touch_segment(pb, *next, first_segment_start(*next) + ahead, seg);
    const int n = static_cast<int>(std::min<int64_t>(seg, u.key_hi - s0) + kChunk - 1) / kChunk;
    // what a short last segment's layout does not reach
    prefetch_rows(next_k, n * kChunk, seg, D);
    prefetch_rows(next_v, n * kChunk, seg, D);

    for (int i = 0; i < u.nq; ++i) {
      // Query i (position p) sees keys [lo, hi) of the segment (relative to s0).
      const int64_t p = u.pos0 + i;
      const int64_t first = std::max(u.key_lo, pb.window > 0 ? p - pb.window + 1 : 0);
      const int64_t lo = std::max<int64_t>(first, s0) - s0;
      const int64_t hi = std::min<int64_t>({s0 + seg, u.key_hi, p + 1}) - s0;
      uint64_t bits = 0;  // none where hi <= lo
      if (hi > lo) {
        const uint64_t below_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
        bits = below_hi & ~((uint64_t{1} << lo) - 1);
      }
      std::fill(visible + i * G, visible + (i + 1) * G, bits);
    }
    segment(n, krows, vrows, next_k, next_v);
  }
  return true;
}

// Runs unit u on vdpbf16ps: leaves its rows' un-normalised outputs, maxima and denominators
// in w (rows that see no key of the range keep mx = -inf, zero sums and outputs). next (or
// nullptr): the unit this thread runs after u, whose first keys are prefetched during u's
// last segment. Returns false on a block table entry outside [0, num_blocks).
inline bool bf16_unit_run(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                          Bf16TileBuffers& w) {
  const int D = pb.D, G = pb.G;
  const int rows = u.nq * G;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < u.nq; ++i)
    for (int g = 0; g < G; ++g) {
      const int r = i * G + g;
      const uint16_t* src = pb.q + (u.first_token + i) * pb.q_t_stride + (u.h * G + g) * pb.q_h_stride;
      uint16_t* dst = reinterpret_cast<uint16_t*>(w.q.data() + static_cast<size_t>(r) * D / 2);
      for (int d = 0; d < D; d += 32) _mm512_storeu_si512(dst + d, _mm512_loadu_si512(src + d));
      w.mx[r] = neg_inf;
    }
  // Outputs and denominators start at a row's first segment (alpha 0: values_block).
  const ScoreMap map = score_map(pb.scale, pb.soft_cap);
  const bool ok = walk_segments(pb, u, next, w.visible.data(),
                       [&](int n, const uint16_t* const* krows, const uint16_t* const* vrows,
                           const uint16_t* const* next_k, const uint16_t* const* next_v) {
                         for (int c = 0; c < n; ++c)
                           transpose_keys(krows + c * kChunk, D,
                                          w.kt.data() + static_cast<size_t>(c) * D / 2 * kChunk,
                                          next_k + c * kChunk);
                         interleave_values(vrows, n * kChunk / 2, D, w.vp.data(), next_v);
                         vdp_segment_rows(rows, n, w.visible.data(), w, map);
                       });
  for (int r = 0; r < rows; ++r)
    if (w.mx[r] == neg_inf) {  // saw no key of the range
      std::fill_n(w.sum.begin() + 16 * r, 16, 0.f);
      std::fill_n(w.acc.begin() + static_cast<size_t>(r) * D, D, 0.f);
    }
  return ok;
}

// out rows of unit u = w's outputs / denominators (every row saw a key).
inline void bf16_unit_store(const Bf16Problem& pb, const Bf16Unit& u, const Bf16TileBuffers& w) {
  const int D = pb.D;
  for (int i = 0; i < u.nq; ++i)
    for (int g = 0; g < pb.G; ++g) {
      const int r = i * pb.G + g;
      store_row_bf16(pb.out + ((u.first_token + i) * pb.num_heads + u.h * pb.G + g) * D,
                           w.acc.data() + static_cast<size_t>(r) * D, 1.f / w.row_sum(r), D);
    }
}

// A partial result of a unit over part of its keys, as bf16_unit_save leaves it in a slot
// of partial_floats(rows, D) floats: [rows] maxima, [rows] denominators, [rows][D] outputs.
inline size_t partial_floats(int rows, int D) { return static_cast<size_t>(rows) * (D + 2); }

inline void bf16_unit_save(const Bf16Unit& u, const Bf16TileBuffers& w, int G, float* slot) {
  const int rows = u.nq * G;
  for (int r = 0; r < rows; ++r) {
    slot[r] = w.mx[r];
    slot[rows + r] = w.row_sum(r);
  }
  std::copy(w.acc.begin(), w.acc.begin() + static_cast<size_t>(rows) * w.D, slot + 2 * rows);
}

// out rows of tile u = the log-sum-exp combination of its parts' partial results (parts
// slots, stride floats apart, from first); every row saw a key in some part.
inline void bf16_combine(const Bf16Problem& pb, const Bf16Unit& u, const float* first, int parts,
                         size_t stride) {
  const int D = pb.D, rows = u.nq * pb.G;
  std::vector<float> acc(D);
  for (int r = 0; r < rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < parts; ++j) m = std::max(m, first[j * stride + r]);
    float total = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int j = 0; j < parts; ++j) {
      const float* slot = first + j * stride;
      const float f = std::exp2(slot[r] - m);  // maxima in log2 units; 0 where the row saw no key
      if (f == 0.f) continue;
      total += f * slot[rows + r];
      const float* part_acc = slot + 2 * rows + static_cast<size_t>(r) * D;
      for (int d = 0; d < D; ++d) acc[d] += f * part_acc[d];
    }
    const int i = r / pb.G, g = r % pb.G;
    store_row_bf16(pb.out + ((u.first_token + i) * pb.num_heads + u.h * pb.G + g) * D, acc.data(),
                   1.f / total, D);
  }
}

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_BF16_TILES 0
#endif
