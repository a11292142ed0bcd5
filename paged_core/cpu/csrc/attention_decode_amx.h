// The raw scores of attention_decode_bf16.h's decode loop on AMX tiles (CPUs with AMX-BF16),
// for units of up to kAmxDecodeRows query rows and head_dim 64 or 128 (amx_decode_fits).
//
// A chunk's 16 key rows are an A tile straight from the cache, no copy: 16 rows of 32 dims
// (64 bytes), D * 2 bytes apart, one tile per 32 dims. The unit's query rows, their dim pairs
// transposed once per unit ([D / 2 pairs][4 rows] of 32-bit pairs, rows past the unit's
// zeros), are the B tiles, loaded once and kept for the whole unit. One C tile, [16 keys][4
// rows] float32, takes the chunk's raw scores; each row's 16 are picked out of it (three
// permutes) for the loop's online softmax, which then runs exactly as with vdpbf16ps scores.
// That replaces the vdpbf16ps path's 2 x D / 32 dot products per row and key and their
// horizontal sums (about half of a chunk's instructions at SmolLM2's shape) by D / 32 tile
// products per chunk.
//
// Each score is one row's dot product with one key, summed in tdpbf16ps' fixed order whatever
// the other rows and keys hold, so a decode's result does not depend on the rest of the step
// (batch invariance). tdpbf16ps and the vdpbf16ps loop are not specified to sum alike (the
// decode outputs of both came out bit-equal in every test on an Intel Xeon with AMX, but
// nothing relies on that): a call takes one of them for all its decodes.
#pragma once

#include "amx_tiles.h"
#include "attention_tiles_bf16.h"

#if PAGED_CORE_BF16_TILES && defined(PAGED_CORE_AMX_BUILT)
#define PAGED_CORE_AMX_DECODE 1

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace paged_core_cpu {

constexpr int kAmxDecodeRows = 4;  // query rows a unit may have: the C tile's columns

// Tile 0: C, [16 keys][4 rows] float32; 1, 2: A, 16 keys x 32 dims; 3-6: B, 16 dim pairs x 4
// rows (3, 4 for head_dim 64).
constexpr uint8_t kDecodeTileRows[8] = {16, 16, 16, 16, 16, 16, 16, 0};
constexpr uint8_t kDecodeTileBytes[8] = {16, 64, 64, 16, 16, 16, 16, 0};

constexpr bool amx_decode_fits(int G, int D) { return G <= kAmxDecodeRows && (D == 64 || D == 128); }

// The unit's query rows q[0..R) (D bf16 each) into the B tiles, through qt ([D / 2][4] pairs).
template <int R, int D>
__attribute__((target("amx-tile,amx-bf16"))) void amx_decode_load_queries(
    const uint16_t* const (&q)[R], uint32_t* qt) {
  for (int p = 0; p < D / 2; ++p)
    for (int r = 0; r < kAmxDecodeRows; ++r) {
      uint32_t pair = 0;
      if (r < R) std::memcpy(&pair, q[r] + 2 * p, sizeof(pair));
      qt[p * kAmxDecodeRows + r] = pair;
    }
  constexpr int kTileWords = 16 * kAmxDecodeRows;  // 16 dim pairs of every row
  _tile_loadd(3, qt, 16);
  _tile_loadd(4, qt + kTileWords, 16);
  if constexpr (D == 128) {
    _tile_loadd(5, qt + 2 * kTileWords, 16);
    _tile_loadd(6, qt + 3 * kTileWords, 16);
  }
}

// The raw scores of the 16 key rows at keys (D apart) against the loaded query rows, into
// scores [16 keys][4 rows].
template <int D>
__attribute__((target("amx-tile,amx-bf16"))) void amx_decode_chunk(const uint16_t* keys,
                                                                   float* scores) {
  _tile_zero(0);
  _tile_loadd(1, keys, D * 2);
  _tile_dpbf16ps(0, 1, 3);
  _tile_loadd(2, keys + 32, D * 2);
  _tile_dpbf16ps(0, 2, 4);
  if constexpr (D == 128) {
    _tile_loadd(1, keys + 64, D * 2);
    _tile_dpbf16ps(0, 1, 5);
    _tile_loadd(2, keys + 96, D * 2);
    _tile_dpbf16ps(0, 2, 6);
  }
  _tile_stored(0, scores, 4 * kAmxDecodeRows);
}

// Row r's 16 scores (key j in lane j) out of amx_decode_chunk's [16][4].
inline __m512 amx_decode_row(const float* scores, int r) {
  alignas(64) static const int32_t kKeys[16] = {0, 4, 8, 12, 16, 20, 24, 28,
                                                0, 4, 8, 12, 16, 20, 24, 28};
  const __m512i index = _mm512_add_epi32(_mm512_load_si512(kKeys), _mm512_set1_epi32(r));
  const __m512 first = _mm512_permutex2var_ps(_mm512_load_ps(scores), index,
                                              _mm512_load_ps(scores + 16));  // keys 0-7
  const __m512 second = _mm512_permutex2var_ps(_mm512_load_ps(scores + 32), index,
                                               _mm512_load_ps(scores + 48));  // keys 8-15
  return _mm512_shuffle_f32x4(first, second, 0x44);
}

}  // namespace paged_core_cpu

#endif
