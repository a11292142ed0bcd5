// The rows of a bfloat16 attention segment on AMX tiles (CPUs with AMX-BF16: Sapphire
// Rapids and later), in place of attention_tiles_bf16.h's vdpbf16ps rows (bf16_unit_run
// takes either; PAGED_CORE_AMX_ATTENTION says whether this one exists).
//
// The segment's keys and values are the ones attention_tiles_bf16.h already laid out for
// vdpbf16ps, and they are AMX operands as they are:
//   - Kt, a chunk's [D/2 pairs][16 keys] of 32-bit pairs, is a B tile per 16 pairs (32
//     dims): a block of 16 query rows (an A tile of 32 dims each) times it gives the 16 x 16
//     raw scores of the chunk, float32, in one C tile;
//   - Vp, [key pairs][D] of 32-bit pairs, is a B tile per 16 key pairs and 16 dims: the
//     rows' bfloat16 probabilities of 32 keys (an A tile) times it add p . V to 16 dims of
//     the rows' outputs (a C tile loaded from and stored back to the float32 outputs).
// Between the two, each real row takes the very online-softmax step of the vdpbf16ps path
// (softmax_step: same maxima, probabilities and denominators from the same scores), and
// its output is scaled by alpha before the tiles add p . V. Rows are taken 16 at a time;
// the rows of the last block past the unit's rows compute on stale, finite buffer rows
// whose probabilities are zeroed, and nothing reads their results.
//
// Each C element is one row's dot product summed in a fixed order whatever the other rows
// hold, so a query's result depends only on its own keys (batch invariance), as with
// vdpbf16ps; tdpbf16ps rounds differently from vdpbf16ps, so the two paths' last bits
// differ, and a call takes one path for all of its units.
#pragma once

#include "amx_tiles.h"
#include "attention_tiles_bf16.h"

#if PAGED_CORE_BF16_TILES && defined(PAGED_CORE_AMX_BUILT)
#define PAGED_CORE_AMX_ATTENTION 1

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace paged_core_cpu {

constexpr int kAmxRows = 16;                    // query rows per tile block
constexpr int kSegKeys = kMaxSegChunks * kChunk;  // keys of a segment, at most
constexpr int kScoreStride = kSegKeys * 4;      // bytes between rows of the score buffer

// Raw scores of 16 query rows (bf16 pairs q, D / 2 apart) against N chunks of Kt, into
// scores [16][kSegKeys] float32: C tile n holds chunk n.
template <int N>
__attribute__((target("amx-tile,amx-bf16"))) void amx_scores(const uint32_t* q, int D,
                                                             const uint32_t* kt, float* scores) {
  const int half = D / 2;
  _tile_zero(0);
  if constexpr (N > 1) _tile_zero(1);
  if constexpr (N > 2) _tile_zero(2);
  if constexpr (N > 3) _tile_zero(3);
  for (int c = 0; c < half; c += 16) {  // 16 pairs (32 dims) a step
    _tile_loadd(4, q + c, D * 2);
    _tile_loadd(5, kt + c * kChunk, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (N > 1) {
      _tile_loadd(6, kt + (half + c) * kChunk, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (N > 2) {
      _tile_loadd(7, kt + (2 * half + c) * kChunk, 64);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (N > 3) {
      _tile_loadd(5, kt + (3 * half + c) * kChunk, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, scores, kScoreStride);
  if constexpr (N > 1) _tile_stored(1, scores + kChunk, kScoreStride);
  if constexpr (N > 2) _tile_stored(2, scores + 2 * kChunk, kScoreStride);
  if constexpr (N > 3) _tile_stored(3, scores + 3 * kChunk, kScoreStride);
}

// acc[16 rows][d0 .. d0 + 16 * COLS) += probs (bf16 pairs, kSegKeys / 2 a row) . Vp over
// `steps` steps of 32 keys; acc rows are D floats apart.
template <int COLS>
__attribute__((target("amx-tile,amx-bf16"))) void amx_values(const uint32_t* probs,
                                                             const uint32_t* vp, int D, int d0,
                                                             int steps, float* acc) {
  const int acc_stride = D * 4;
  float* a = acc + d0;
  const uint32_t* v = vp + d0;
  _tile_loadd(0, a, acc_stride);
  if constexpr (COLS > 1) _tile_loadd(1, a + 16, acc_stride);
  if constexpr (COLS > 2) _tile_loadd(2, a + 32, acc_stride);
  if constexpr (COLS > 3) _tile_loadd(3, a + 48, acc_stride);
  for (int step = 0; step < steps; ++step) {
    const uint32_t* vs = v + static_cast<size_t>(step) * 16 * D;
    _tile_loadd(4, probs + step * 16, kSegKeys * 2);
    _tile_loadd(5, vs, D * 4);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (COLS > 1) {
      _tile_loadd(6, vs + 16, D * 4);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (COLS > 2) {
      _tile_loadd(7, vs + 32, D * 4);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (COLS > 3) {
      _tile_loadd(5, vs + 48, D * 4);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, a, acc_stride);
  if constexpr (COLS > 1) _tile_stored(1, a + 16, acc_stride);
  if constexpr (COLS > 2) _tile_stored(2, a + 32, acc_stride);
  if constexpr (COLS > 3) _tile_stored(3, a + 48, acc_stride);
}

// Rows r0 .. r0 + 15 of a unit (the first `real` of them real; visible: theirs) over the
// segment's N chunks: raw scores on tiles, each real row's softmax step and rescale, then
// p . V on tiles into the rows' outputs.
template <int N>
void amx_block_step(int r0, int real, const uint64_t* visible, int D, Bf16TileBuffers& w,
                    const ScoreMap& map) {
  float* scores = w.tile_scores.data();
  amx_scores<N>(w.q.data() + static_cast<size_t>(r0) * D / 2, D, w.kt.data(), scores);
  for (int j = 0; j < kAmxRows; ++j) {
    uint32_t* pp = w.probs.data() + static_cast<size_t>(r0 + j) * kSegKeys / 2;
    if (j >= real) {  // a stale row: no probability reaches its (unread) output
      std::memset(pp, 0, kSegKeys * 2);
      continue;
    }
    __m512 s[N];
    for (int n = 0; n < N; ++n) s[n] = _mm512_loadu_ps(scores + j * kSegKeys + n * kChunk);
    const float alpha = softmax_step<N>(s, visible[j], map, r0 + j, w, pp);
    if (alpha != 1.f) {
      float* acc = w.acc.data() + static_cast<size_t>(r0 + j) * D;
      const __m512 al = _mm512_set1_ps(alpha);
      for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_mul_ps(al, _mm512_loadu_ps(acc + d)));
    }
  }
  const uint32_t* probs = w.probs.data() + static_cast<size_t>(r0) * kSegKeys / 2;
  float* acc = w.acc.data() + static_cast<size_t>(r0) * D;
  const int steps = (N + 1) / 2;
  for (int d0 = 0; d0 < D; d0 += 64) {
    switch (std::min(4, (D - d0) / 16)) {
      case 2: amx_values<2>(probs, w.vp.data(), D, d0, steps, acc); break;
      case 4: amx_values<4>(probs, w.vp.data(), D, d0, steps, acc); break;
      default: break;  // D % 32 == 0: 2 or 4 column tiles
    }
  }
}

// The segment of n chunks (Kt and Vp in w) for the rows of a unit on AMX tiles; visible[r]:
// the keys of the segment row r sees (bit j: the segment's key j). Expects
// configure_amx_tiles with every tile 16 rows of 64 bytes.
inline void amx_segment_rows(int rows, int n, const uint64_t* visible, Bf16TileBuffers& w,
                             const ScoreMap& map) {
  const int D = w.D;
  if (n % 2 == 1)  // the last step's 16 key pairs: pairs past the segment's are zeros
    std::memset(w.vp.data() + static_cast<size_t>(n) * kChunk / 2 * D, 0,
                static_cast<size_t>(kChunk) / 2 * D * 4);
  for (int r0 = 0; r0 < rows; r0 += kAmxRows) {
    const int real = std::min(kAmxRows, rows - r0);
    switch (n) {
      case 1: amx_block_step<1>(r0, real, visible + r0, D, w, map); break;
      case 2: amx_block_step<2>(r0, real, visible + r0, D, w, map); break;
      case 3: amx_block_step<3>(r0, real, visible + r0, D, w, map); break;
      default: amx_block_step<4>(r0, real, visible + r0, D, w, map); break;
    }
  }
}

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_AMX_ATTENTION 0
#endif
