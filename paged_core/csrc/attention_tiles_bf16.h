// bfloat16 paged attention with AVX512-BF16 dot products (vdpbf16ps), for builds with
// -mavx512bf16 (the avx512_bf16 level); PAGED_CORE_BF16_TILES says whether it exists.
//
// The same task split, visibility rules and output as attention_kernel in
// paged_attention.cpp; what differs is how a task computes. It walks its keys in
// chunks of 16 consecutive positions (any block size: each key row is found through
// the block table) and, per chunk:
//   - transposes the chunk's keys once into Kt[D/2][16] (pairs of dims as 32-bit words),
//     so a query row's 16 scores are D/2 vdpbf16ps with the query's pair broadcast: no
//     horizontal sums, and every query row of the task (up to 16 tokens x G heads of the
//     KV head) reuses the transposed keys, read once from the cache;
//   - interleaves the values by key pairs into Vp[8][D], so p . V is 8 vdpbf16ps per 16
//     dims with the probabilities' pair broadcast.
// Scores and the online softmax are float32; probabilities are rounded to bfloat16 for
// p . V (like flash-attention kernels), and the softmax denominator sums those rounded
// values, so numerator and denominator agree. Keys a query may not see are masked to
// -inf (probability 0), and the values of positions past the context are zeros, so
// nothing outside the sequence (NaN in unowned slots) reaches the output.
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

#include "cpu_common.h"
#include "cpu_simd.h"

namespace paged_core_cpu {

constexpr int kChunk = 16;  // keys per chunk: one float32 score per lane

// exp(x) for x <= 0 on 16 lanes (exp8 on each half); exp(-inf) -> 0.
inline __m512 exp16(__m512 x) {
  const __m256 lo = exp8(_mm512_castps512_ps256(x));
  const __m256 hi = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                             _mm256_castps_pd(hi), 1));
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

// One thread's buffers for bf16 tile tasks of up to max_rows query rows and head_dim D.
struct Bf16TileBuffers {
  int D;
  std::vector<uint32_t> q;    // [rows][D/2] query rows as bf16 pairs
  std::vector<float> acc;     // [rows][D] un-normalised outputs
  std::vector<float> mx, sum; // [rows] running max and denominator
  std::vector<uint32_t> kt;   // [D/2][16] the chunk's keys, transposed
  std::vector<uint32_t> vp;   // [8][D] the chunk's values, key pairs interleaved per dim

  Bf16TileBuffers(int max_rows, int head_dim)
      : D(head_dim), q(static_cast<size_t>(max_rows) * head_dim / 2),
        acc(static_cast<size_t>(max_rows) * head_dim), mx(max_rows), sum(max_rows),
        kt(static_cast<size_t>(head_dim / 2) * kChunk), vp(static_cast<size_t>(kChunk / 2) * head_dim) {}
};

// Kt from the chunk's key rows (nullptr: a position past the context, read as zeros).
inline void transpose_keys(const uint16_t* const rows[kChunk], int D, uint32_t* kt) {
  for (int c0 = 0; c0 < D / 2; c0 += 16) {  // 16 pair-columns (32 dims) at a time
    __m512i r[16];
    for (int j = 0; j < kChunk; ++j)
      r[j] = rows[j] ? _mm512_loadu_si512(rows[j] + 2 * c0) : _mm512_setzero_si512();
    transpose16x16(r);
    for (int c = 0; c < 16; ++c) _mm512_storeu_si512(kt + (c0 + c) * kChunk, r[c]);
  }
}

// Vp[i][d] = v[2i][d] | v[2i+1][d] << 16 from the chunk's value rows (nullptr: zeros).
inline void interleave_values(const uint16_t* const rows[kChunk], int D, uint32_t* vp) {
  alignas(64) static const uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                               37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                               11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(kLo);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int i = 0; i < kChunk / 2; ++i) {
    const uint16_t* a = rows[2 * i];
    const uint16_t* b = rows[2 * i + 1];
    for (int d = 0; d < D; d += 32) {
      const __m512i va = a ? _mm512_loadu_si512(a + d) : _mm512_setzero_si512();
      const __m512i vb = b ? _mm512_loadu_si512(b + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + i * D + d, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_storeu_si512(vp + i * D + d + 16, _mm512_permutex2var_epi16(va, hi, vb));
    }
  }
}

// Scores of R query rows (bf16 pairs q[r]) against the chunk, times scale: 16 lanes per row.
// The rows share every load of Kt; two chains per row keep the dot-product units busy.
template <int R>
inline void chunk_scores(const uint32_t* const* q, const uint32_t* kt, int D, float scale,
                         __m512* s) {
  __m512 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  for (int c = 0; c < D / 2; c += 2)  // D % 32 == 0
    for (int u = 0; u < 2; ++u) {
      const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + (c + u) * kChunk);
      for (int r = 0; r < R; ++r)
        a[r][u] = _mm512_dpbf16_ps(a[r][u], k, (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r][c + u])));
    }
  for (int r = 0; r < R; ++r) s[r] = _mm512_mul_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_set1_ps(scale));
}

// acc[r][0:D] += p_r . V for R rows' bf16 probability pairs pp[r][8]; the rows share every
// load of Vp.
template <int R>
inline void accumulate_chunk(const uint32_t (*pp)[kChunk / 2], const uint32_t* vp, int D,
                             float* const* acc) {
  for (int d0 = 0; d0 < D; d0 += 32) {
    __m512 a[R][2];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 2; ++c) a[r][c] = _mm512_loadu_ps(acc[r] + d0 + 16 * c);
    for (int i = 0; i < kChunk / 2; ++i) {
      const __m512bh v0 = (__m512bh)_mm512_loadu_si512(vp + i * D + d0);
      const __m512bh v1 = (__m512bh)_mm512_loadu_si512(vp + i * D + d0 + 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[r][i]));
        a[r][0] = _mm512_dpbf16_ps(a[r][0], v0, p);
        a[r][1] = _mm512_dpbf16_ps(a[r][1], v1, p);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 2; ++c) _mm512_storeu_ps(acc[r] + d0 + 16 * c, a[r][c]);
  }
}

// Online-softmax update of row r with this chunk's masked scores s (rescales its output
// when the running max grows); writes the chunk's bf16 probability pairs to pp.
inline void softmax_step(__m512 s, int r, Bf16TileBuffers& w, uint32_t* pp) {
  float* acc = w.acc.data() + static_cast<size_t>(r) * w.D;
  const float m_new = std::max(w.mx[r], _mm512_reduce_max_ps(s));
  if (m_new > w.mx[r]) {
    const float alpha = std::exp(w.mx[r] - m_new);  // 0 on the first chunk
    w.sum[r] *= alpha;
    const __m512 va = _mm512_set1_ps(alpha);
    for (int d = 0; d < w.D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(va, _mm512_loadu_ps(acc + d)));
    w.mx[r] = m_new;
  }
  const __m256i pb = (__m256i)_mm512_cvtneps_pbh(exp16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
  const __m512 rounded = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16));
  w.sum[r] += _mm512_reduce_add_ps(rounded);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp), pb);
}

// The chunk for R rows (ids rows[], visibility masks[]): scores, softmax, p . V.
template <int R>
inline void rows_step(const int* rows, const __mmask16* masks, Bf16TileBuffers& w, float scale) {
  const uint32_t* q[R];
  float* acc[R];
  for (int r = 0; r < R; ++r) {
    q[r] = w.q.data() + static_cast<size_t>(rows[r]) * w.D / 2;
    acc[r] = w.acc.data() + static_cast<size_t>(rows[r]) * w.D;
  }
  __m512 s[R];
  chunk_scores<R>(q, w.kt.data(), w.D, scale, s);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  uint32_t pp[R][kChunk / 2];
  for (int r = 0; r < R; ++r) softmax_step(_mm512_mask_mov_ps(neg_inf, masks[r], s[r]), rows[r], w, pp[r]);
  accumulate_chunk<R>(pp, w.vp.data(), w.D, acc);
}

constexpr int kRowBlock = 4;  // query rows that share each load of the chunk

// One task: query rows r = i * G + g (token first_token + i at position pos0 + i, head
// h * G + g) of one sequence over its visible keys. Returns false on a block table entry
// outside [0, num_blocks).
inline bool bf16_tile_task(const uint16_t* q_ptr, int64_t q_t_stride, int64_t q_h_stride,
                           const uint16_t* k_head, const uint16_t* v_head, const int32_t* table,
                           int64_t num_blocks, int64_t block_size, int64_t h, int G,
                           int64_t first_token, int nq, int64_t pos0, float scale,
                           int64_t window, uint16_t* out_ptr, int64_t num_heads,
                           Bf16TileBuffers& w) {
  const int D = w.D;
  const int rows = nq * G;
  for (int i = 0; i < nq; ++i)
    for (int g = 0; g < G; ++g) {
      const int r = i * G + g;
      const uint16_t* src = q_ptr + (first_token + i) * q_t_stride + (h * G + g) * q_h_stride;
      std::copy(src, src + D, reinterpret_cast<uint16_t*>(w.q.data() + static_cast<size_t>(r) * D / 2));
      w.mx[r] = -std::numeric_limits<float>::infinity();
      w.sum[r] = 0.f;
    }
  std::fill(w.acc.begin(), w.acc.begin() + static_cast<size_t>(rows) * D, 0.f);

  const int64_t first_key = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
  const int64_t last_key = pos0 + nq - 1;
  const int64_t row_stride = D;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Row pointers of a chunk's keys and values (nullptr past the context); false on a block
  // table entry outside [0, num_blocks).
  auto chunk_rows = [&](int64_t c0, const uint16_t** krows, const uint16_t** vrows) {
    int j = 0;
    while (j < kChunk && c0 + j <= last_key) {  // one run of keys per block
      const int64_t key = c0 + j;
      const int64_t b = key / block_size, off = key - b * block_size;
      const int64_t phys = table[b];
      if (phys < 0 || phys >= num_blocks) return false;
      const int64_t run = std::min<int64_t>({kChunk - j, block_size - off, last_key - key + 1});
      const uint16_t* kb = k_head + (phys * block_size + off) * row_stride;
      const uint16_t* vb = v_head + (phys * block_size + off) * row_stride;
      for (int64_t t = 0; t < run; ++t, ++j) {
        krows[j] = kb + t * row_stride;
        vrows[j] = vb + t * row_stride;
      }
    }
    for (; j < kChunk; ++j) krows[j] = vrows[j] = nullptr;
    return true;
  };
  const uint16_t* krows[kChunk];
  const uint16_t* vrows[kChunk];
  const uint16_t* next_k[kChunk];
  const uint16_t* next_v[kChunk];
  int64_t c0 = first_key / kChunk * kChunk;
  if (!chunk_rows(c0, next_k, next_v)) return false;
  for (; c0 <= last_key; c0 += kChunk) {
    std::copy(next_k, next_k + kChunk, krows);
    std::copy(next_v, next_v + kChunk, vrows);
    // Blocks are scattered: fetch the next chunk's rows while this one is computed.
    if (c0 + kChunk <= last_key) {
      if (!chunk_rows(c0 + kChunk, next_k, next_v)) return false;
      for (int j = 0; j < kChunk && next_k[j]; ++j)
        for (int64_t byte = 0; byte < D * 2; byte += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(next_k[j]) + byte, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(next_v[j]) + byte, _MM_HINT_T0);
        }
    }
    transpose_keys(krows, D, w.kt.data());
    interleave_values(vrows, D, w.vp.data());
    int active = 0;  // rows that see a key of this chunk, in blocks of kRowBlock
    int rows[kRowBlock];
    __mmask16 masks[kRowBlock];
    auto flush = [&] {
      switch (active) {
        case 1: rows_step<1>(rows, masks, w, scale); break;
        case 2: rows_step<2>(rows, masks, w, scale); break;
        case 3: rows_step<3>(rows, masks, w, scale); break;
        case 4: rows_step<4>(rows, masks, w, scale); break;
        default: break;
      }
      active = 0;
    };
    for (int i = 0; i < nq; ++i) {
      // Query i (position p) sees keys [lo, hi) of the chunk.
      const int64_t p = pos0 + i;
      const int64_t lo = std::max<int64_t>(c0, window > 0 ? p - window + 1 : 0) - c0;
      const int64_t hi = std::min<int64_t>(c0 + kChunk, p + 1) - c0;
      if (hi <= lo) continue;
      const __mmask16 visible = _mm512_cmp_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(lo)), _MM_CMPINT_NLT) &
                                _mm512_cmp_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(hi)), _MM_CMPINT_LT);
      for (int g = 0; g < G; ++g) {
        rows[active] = i * G + g;
        masks[active] = visible;
        if (++active == kRowBlock) flush();
      }
    }
    flush();
  }
  for (int i = 0; i < nq; ++i)
    for (int g = 0; g < G; ++g) {
      const int r = i * G + g;
      Row<uint16_t>::store(out_ptr + ((first_token + i) * num_heads + h * G + g) * D,
                           w.acc.data() + static_cast<size_t>(r) * D, 1.f / w.sum[r], D);
    }
  return true;
}

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_BF16_TILES 0
#endif
