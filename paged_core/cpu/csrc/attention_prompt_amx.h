// The units of several queries (prompts, chunks) of bfloat16 paged attention on AMX tiles
// (CPUs with AMX-BF16: Sapphire Rapids and later), in place of attention_tiles_bf16.h's
// vdpbf16ps rows; PAGED_CORE_AMX_ATTENTION says whether this path exists.
//
// Key-major: a block of 16 query rows is the 16 lanes of every vector and the 16 columns of
// every tile, so the online softmax runs down columns, one vector per key, with no
// horizontal reductions and no per-row scalar work:
//   - scores S^T = K Q^T: A tiles are 16 keys x 32 dims straight from the cache (a chunk's 16
//     rows are one run of a block; other chunks are copied into a staging buffer first), B
//     tiles the block's queries transposed once per unit (Q^T: [D/2 dim pairs][16 rows]);
//     C tile n holds chunk n's [16 keys][16 rows];
//   - per key, the lanes' probabilities 2^(s c - m), rounded to bfloat16 and paired by key
//     pairs: P^T, [key pairs][16 rows], the B operand of
//   - O^T += V^T P^T: A tiles are the segment's values transposed once per segment and
//     shared by every block (V^T: [D][key pairs]), C tiles the block's float32 outputs
//     O^T [D][16 rows], loaded and stored around each segment.
// Block b + 1's scores are issued before block b's softmax and block b - 1's O^T after it,
// so no tile load waits on vector stores just made. (On the 2-core Xeon with AMX measured,
// tile and vector work did not overlap at all: 8 tdpbf16ps and 400 vector FMAs took longer
// interleaved than one after the other; a block's time is the sum of its parts.) At the
// unit's end O^T is transposed into attention_tiles_bf16.h's rows (acc, sum,
// mx), so storing, saving and combining parts are the vdpbf16ps path's.
//
// Lazy rescaling (as FlashAttention-4 does): a row's running max m moves only when a
// segment's max passes it by more than kLazyRescale (log2 units); until then probabilities
// up to 2^kLazyRescale are taken as they are (float32 and bfloat16 hold them, and numerator
// and denominator share m), so the outputs are rescaled rarely rather than at most segments.
// The denominator sums the rounded probabilities the outputs take, as in the vdpbf16ps path.
//
// Each C element is one row's dot product summed in a fixed order, and every softmax step is
// per lane, so a query's result depends only on its own keys (batch invariance), as with
// vdpbf16ps; the two paths round differently, and a call takes one path for all its units.
#pragma once

#include "amx_tiles.h"
#include "attention_tiles_bf16.h"

#if PAGED_CORE_BF16_TILES && defined(PAGED_CORE_AMX_BUILT)
#define PAGED_CORE_AMX_ATTENTION 1

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace paged_core_cpu {

constexpr int kLanes = 16;                              // query rows of a block
constexpr int kSegKeys = kMaxSegChunks * kChunk;        // keys of a segment, at most
constexpr int kSegPairs = kSegKeys / 2;                 // its key pairs
constexpr int kTileBytes = 64;                          // a tile row
constexpr float kLazyRescale = 8.f;                     // see the file comment

// One thread's buffers for prompt units of up to max_rows query rows (in whole blocks of 16)
// and head dim D (a multiple of 32).
struct AmxPromptBuffers {
  int D;
  std::vector<uint32_t> qt;      // [blocks][D / 2][16] the queries as dim pairs: B tiles
  std::vector<float> ot;         // [blocks][D][16] un-normalised outputs: C tiles
  std::vector<uint8_t> started;  // [blocks] whether the block's ot holds values yet
  std::vector<float> mx;         // [blocks][16] running max, log2 units (-inf: no key yet)
  std::vector<float> sum;        // [blocks][16] denominators
  std::vector<uint16_t> kstage;  // [kSegKeys][D] the keys of chunks that are not one run
  std::vector<uint32_t> vt;      // [D][kSegPairs] the segment's values by key pairs: A tiles
  std::vector<float> scores;     // [2][kSegKeys][16] two blocks' raw scores S^T
  std::vector<uint32_t> probs;   // [2][kSegPairs][16] two blocks' P^T, bfloat16 pairs

  AmxPromptBuffers(int max_rows, int head_dim)
      : D(head_dim), qt(lanes(max_rows) * head_dim / 2), ot(lanes(max_rows) * head_dim),
        started(lanes(max_rows) / kLanes), mx(lanes(max_rows)), sum(lanes(max_rows)),
        kstage(static_cast<size_t>(kSegKeys) * head_dim),
        vt(static_cast<size_t>(head_dim) * kSegPairs), scores(2 * kSegKeys * kLanes),
        probs(2 * kSegPairs * kLanes) {}

  // The lanes of the blocks that hold `rows` rows.
  static size_t lanes(int rows) { return (static_cast<size_t>(rows) + kLanes - 1) / kLanes * kLanes; }
};

// Where a chunk's 16 key rows are read from: an A tile's rows, stride bytes apart.
struct KeyChunk {
  const uint16_t* rows;
  int64_t stride;
};

// Chunk c of a segment's key rows (nullptr past key_hi): straight from the cache where its
// 16 rows are one run, else copied into stage (zeros for nullptr).
inline KeyChunk key_chunk(const uint16_t* const* krows, int D, uint16_t* stage) {
  bool run = krows[0] != nullptr;
  for (int j = 1; j < kChunk && run; ++j) run = krows[j] == krows[0] + static_cast<int64_t>(j) * D;
  if (run) return {krows[0], static_cast<int64_t>(D) * 2};
  for (int j = 0; j < kChunk; ++j) {
    uint16_t* dst = stage + static_cast<size_t>(j) * D;
    if (krows[j])
      std::memcpy(dst, krows[j], static_cast<size_t>(D) * 2);
    else
      std::memset(dst, 0, static_cast<size_t>(D) * 2);
  }
  return {stage, static_cast<int64_t>(D) * 2};
}

// V^T of a segment: vt[d][i] = v[2i][d] | v[2i + 1][d] << 16 for the key pairs of `steps`
// tile steps (16 pairs each; rows nullptr or past the segment's 2 * pairs: zeros), from
// value rows; prefetches ahead_k / ahead_v (the rows read next) along the way.
inline void transpose_values(const uint16_t* const* rows, int pairs, int steps, int D,
                             uint32_t* vt, const uint16_t* const* ahead_k,
                             const uint16_t* const* ahead_v) {
  for (int step = 0; step < steps; ++step)
    for (int d0 = 0; d0 < D; d0 += 32) {
      __m512i lo[16], hi[16];  // pair i's dims d0 .. d0 + 15 and d0 + 16 .. d0 + 31
      for (int i = 0; i < 16; ++i) {
        const int pair = 16 * step + i;
        if (d0 == 0 && pair < pairs) {
          for (int e = 0; e < 2; ++e) {
            prefetch_row(ahead_k[2 * pair + e], D);
            prefetch_row(ahead_v[2 * pair + e], D);
          }
        }
        const uint16_t* a = pair < pairs ? rows[2 * pair] : nullptr;
        const uint16_t* b = pair < pairs ? rows[2 * pair + 1] : nullptr;
        const __m512i va = a ? _mm512_loadu_si512(a + d0) : _mm512_setzero_si512();
        const __m512i vb = b ? _mm512_loadu_si512(b + d0) : _mm512_setzero_si512();
        pair_values(va, vb, lo[i], hi[i]);
      }
      transpose16x16(lo);
      transpose16x16(hi);
      for (int c = 0; c < 16; ++c) {
        _mm512_storeu_si512(vt + static_cast<size_t>(d0 + c) * kSegPairs + 16 * step, lo[c]);
        _mm512_storeu_si512(vt + static_cast<size_t>(d0 + 16 + c) * kSegPairs + 16 * step, hi[c]);
      }
    }
}

// S^T of a block (Q^T qt: [D / 2][16]) against N key chunks, into scores [N * 16][16].
// Tiles: C 0 .. N - 1, A 4 / 5, B 6.
template <int N>
__attribute__((target("amx-tile,amx-bf16"))) void amx_key_scores(const KeyChunk (&keys)[kMaxSegChunks],
                                                                 const uint32_t* qt, int D,
                                                                 float* scores) {
  _tile_zero(0);
  if constexpr (N > 1) _tile_zero(1);
  if constexpr (N > 2) _tile_zero(2);
  if constexpr (N > 3) _tile_zero(3);
  for (int c = 0; c < D / 32; ++c) {  // 16 dim pairs a step
    _tile_loadd(6, qt + c * 16 * kLanes, kTileBytes);
    _tile_loadd(4, keys[0].rows + 32 * c, keys[0].stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (N > 1) {
      _tile_loadd(5, keys[1].rows + 32 * c, keys[1].stride);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (N > 2) {
      _tile_loadd(4, keys[2].rows + 32 * c, keys[2].stride);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (N > 3) {
      _tile_loadd(5, keys[3].rows + 32 * c, keys[3].stride);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  _tile_stored(0, scores, kTileBytes);
  if constexpr (N > 1) _tile_stored(1, scores + 1 * kChunk * kLanes, kTileBytes);
  if constexpr (N > 2) _tile_stored(2, scores + 2 * kChunk * kLanes, kTileBytes);
  if constexpr (N > 3) _tile_stored(3, scores + 3 * kChunk * kLanes, kTileBytes);
}

// O^T [D][16] += V^T P^T over `steps` steps of 16 key pairs (fresh: O^T = V^T P^T, ot's
// contents unread). Tiles: C 0 .. 3, A 4 / 5, B 6.
template <int COLS>
__attribute__((target("amx-tile,amx-bf16"))) void amx_values_pass(const uint32_t* vt,
                                                                  const uint32_t* probs,
                                                                  int steps, float* ot,
                                                                  bool fresh) {
  constexpr int kVtBytes = kSegPairs * 4;
  constexpr int kDims = 16 * kLanes;  // floats of O^T per C tile
  if (fresh) {
    _tile_zero(0);
    if constexpr (COLS > 1) _tile_zero(1);
    if constexpr (COLS > 2) _tile_zero(2);
    if constexpr (COLS > 3) _tile_zero(3);
  } else {
    _tile_loadd(0, ot, kTileBytes);
    if constexpr (COLS > 1) _tile_loadd(1, ot + kDims, kTileBytes);
    if constexpr (COLS > 2) _tile_loadd(2, ot + 2 * kDims, kTileBytes);
    if constexpr (COLS > 3) _tile_loadd(3, ot + 3 * kDims, kTileBytes);
  }
  for (int step = 0; step < steps; ++step) {
    _tile_loadd(6, probs + step * 16 * kLanes, kTileBytes);
    _tile_loadd(4, vt + 16 * step, kVtBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (COLS > 1) {
      _tile_loadd(5, vt + 16 * kSegPairs + 16 * step, kVtBytes);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (COLS > 2) {
      _tile_loadd(4, vt + 32 * kSegPairs + 16 * step, kVtBytes);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (COLS > 3) {
      _tile_loadd(5, vt + 48 * kSegPairs + 16 * step, kVtBytes);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  _tile_stored(0, ot, kTileBytes);
  if constexpr (COLS > 1) _tile_stored(1, ot + kDims, kTileBytes);
  if constexpr (COLS > 2) _tile_stored(2, ot + 2 * kDims, kTileBytes);
  if constexpr (COLS > 3) _tile_stored(3, ot + 3 * kDims, kTileBytes);
}

inline void amx_values(const uint32_t* vt, const uint32_t* probs, int steps, int D, float* ot,
                       bool fresh) {
  for (int d0 = 0; d0 < D; d0 += 64) {
    const uint32_t* v = vt + static_cast<size_t>(d0) * kSegPairs;
    float* o = ot + static_cast<size_t>(d0) * kLanes;
    if (D - d0 >= 64)
      amx_values_pass<4>(v, probs, steps, o, fresh);
    else  // D % 32 == 0
      amx_values_pass<2>(v, probs, steps, o, fresh);
  }
}

// The lanes that see key k of the segment (vis: the lanes' visible bits 0-31, 32-63).
inline __mmask16 key_lanes(const __m512i (&vis)[2], int k) {
  return _mm512_test_epi32_mask(vis[k / 32], _mm512_set1_epi32(static_cast<int>(1u << (k % 32))));
}

// One block's online-softmax step over N chunks of logits s ([N * 16][16]: raw scores times
// c gives log2 units): moves the lanes' max where a key passes it by more than kLazyRescale
// (rescaling their outputs ot [D][16] and sums), writes P^T (bfloat16 pairs, then zero pairs
// up to whole tile steps) to probs and adds the rounded probabilities to the sums. MASKED:
// some lane does not see every key (vis says which do).
template <int N, bool MASKED>
inline void block_softmax(const float* s, float c, const __m512i (&vis)[2], float* mx,
                          float* sum, float* ot, int D, uint32_t* probs) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 top = neg_inf;  // raw scores, then log2 units
  for (int k = 0; k < N * kChunk; ++k) {
    const __m512 sk = _mm512_loadu_ps(s + k * kLanes);
    top = MASKED ? _mm512_mask_max_ps(top, key_lanes(vis, k), top, sk) : _mm512_max_ps(top, sk);
  }
  top = _mm512_mul_ps(top, _mm512_set1_ps(c));
  const __m512 old = _mm512_loadu_ps(mx);
  // Lanes whose max moves (never a lane that saw no key: -inf passes nothing).
  const __mmask16 moves = _mm512_cmp_ps_mask(top, _mm512_add_ps(old, _mm512_set1_ps(kLazyRescale)),
                                             _CMP_GT_OQ);
  const __m512 m = _mm512_mask_mov_ps(old, moves, top);
  __m512 total = _mm512_loadu_ps(sum);
  // Outputs to rescale: lanes that move and had seen keys before (else they are zeros).
  const __mmask16 rescale = moves & _mm512_cmp_ps_mask(old, neg_inf, _CMP_NEQ_OQ);
  if (rescale) {
    const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.f), rescale,
                                            exp2_probs(_mm512_sub_ps(old, m), rescale));
    for (int d = 0; d < D; ++d)
      _mm512_storeu_ps(ot + d * kLanes, _mm512_mul_ps(alpha, _mm512_loadu_ps(ot + d * kLanes)));
    total = _mm512_mul_ps(alpha, total);
  }
  _mm512_storeu_ps(mx, m);
  alignas(64) static const int16_t kPairs[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(kPairs);
  const __m512 vc = _mm512_set1_ps(c);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);  // bf16 1.0
  // 2^(s c - m) may exceed 1 by up to 2^kLazyRescale: exp2_probs is as exact there.
  for (int i = 0; i < N * kChunk / 2; ++i) {
    const int k = 2 * i;
    const __mmask16 keep0 = MASKED ? key_lanes(vis, k) : __mmask16(0xFFFF);
    const __mmask16 keep1 = MASKED ? key_lanes(vis, k + 1) : __mmask16(0xFFFF);
    const __m512 p0 = exp2_probs(_mm512_fmsub_ps(_mm512_loadu_ps(s + k * kLanes), vc, m), keep0);
    const __m512 p1 = exp2_probs(_mm512_fmsub_ps(_mm512_loadu_ps(s + (k + 1) * kLanes), vc, m), keep1);
    // bf16(p0) in words 0-15, bf16(p1) in 16-31, then word pairs (p0, p1) per lane
    const __m512i pb = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    total = _mm512_dpbf16_ps(total, (__m512bh)pb, ones);
    _mm512_storeu_si512(probs + i * kLanes, pb);
  }
  for (int i = N * kChunk / 2; i < (N + 1) / 2 * 16; ++i)  // pairs of an odd chunk count's last step
    _mm512_storeu_si512(probs + i * kLanes, _mm512_setzero_si512());
  _mm512_storeu_ps(sum, total);
}

// f(std::integral_constant<int, n>{}) for n in 1 .. kMaxSegChunks: the chunk count a block's
// scores and softmax are compiled for (their loops unrolled).
template <typename F>
inline void with_chunk_count(int n, F&& f) {
  static_assert(kMaxSegChunks == 4, "one case per chunk count");
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// What a block of 16 rows sees of a segment: its lanes' visible bits, how many leading
// chunks hold a key some lane sees (0: none; chunks past them are skipped, so a causal
// prompt's diagonal segment costs each block only the keys up to its last query), and
// whether every lane sees every key of those chunks.
struct BlockView {
  alignas(64) uint32_t bits[2][kLanes];
  int chunks;
  bool all;
};

inline void view_block(int b, int rows, int n, const uint64_t* visible, BlockView& view) {
  uint64_t any = 0;
  for (int l = 0; l < kLanes; ++l) {
    const int r = b * kLanes + l;
    const uint64_t v = r < rows ? visible[r] : 0;
    view.bits[0][l] = static_cast<uint32_t>(v);
    view.bits[1][l] = static_cast<uint32_t>(v >> 32);
    any |= v;
  }
  const int keys = any == 0 ? 0 : 64 - __builtin_clzll(any);  // past the last key seen
  view.chunks = std::min(n, (keys + kChunk - 1) / kChunk);
  const uint64_t every = view.chunks * kChunk >= 64 ? ~uint64_t{0}
                                                    : (uint64_t{1} << (view.chunks * kChunk)) - 1;
  view.all = true;
  for (int l = 0; l < kLanes && view.all; ++l) {
    const int r = b * kLanes + l;
    view.all = r < rows && (visible[r] & every) == every;
  }
}

// The n chunks of a segment for every block of a unit (rows query rows; visible: theirs),
// each block over the chunks it sees (BlockView): block b + 1's scores, block b's softmax,
// then block b - 1's O^T (a tile load of data vector stores just wrote waits for them to
// reach L1: a block later, they have; O^T after the softmax measured 1.02-1.06x the speed of
// before it).
inline void amx_segment_blocks(int n, int rows, const uint64_t* visible,
                               const KeyChunk (&keys)[kMaxSegChunks], const ScoreMap& map,
                               AmxPromptBuffers& w) {
  const int D = w.D, blocks = (rows + kLanes - 1) / kLanes;
  const size_t scores_floats = static_cast<size_t>(kSegKeys) * kLanes;
  const size_t probs_words = static_cast<size_t>(kSegPairs) * kLanes;
  const bool capped = map.cap_scale != 0.f;
  auto issue_scores = [&](int b, const BlockView& view) {
    if (view.chunks > 0)
      with_chunk_count(view.chunks, [&](auto n) {
        amx_key_scores<n>(keys, w.qt.data() + static_cast<size_t>(b) * D / 2 * kLanes, D,
                          w.scores.data() + b % 2 * scores_floats);
      });
  };
  auto block_values = [&](int b, int chunks) {
    if (chunks > 0) {
      amx_values(w.vt.data(), w.probs.data() + b % 2 * probs_words, (chunks + 1) / 2, D,
                 w.ot.data() + static_cast<size_t>(b) * D * kLanes, !w.started[b]);
      w.started[b] = 1;
    }
  };
  BlockView views[2];
  view_block(0, rows, n, visible, views[0]);
  issue_scores(0, views[0]);
  int prev_chunks = 0;  // block b - 1's
  for (int b = 0; b < blocks; ++b) {
    const BlockView& view = views[b % 2];
    if (b + 1 < blocks) {
      view_block(b + 1, rows, n, visible, views[(b + 1) % 2]);
      issue_scores(b + 1, views[(b + 1) % 2]);
    }
    if (view.chunks > 0) {
      float* s = w.scores.data() + b % 2 * scores_floats;
      const __m512i vis[2] = {_mm512_load_si512(view.bits[0]), _mm512_load_si512(view.bits[1])};
      float c = map.scale_log2;
      if (capped) {  // the soft cap's logits in place, already log2 units
        for (int k = 0; k < view.chunks * kChunk; ++k)
          _mm512_storeu_ps(s + k * kLanes, map_scores(_mm512_loadu_ps(s + k * kLanes), map));
        c = 1.f;
      }
      float* mx = w.mx.data() + b * kLanes;
      float* sum = w.sum.data() + b * kLanes;
      float* ot = w.ot.data() + static_cast<size_t>(b) * D * kLanes;
      uint32_t* probs = w.probs.data() + b % 2 * probs_words;
      with_chunk_count(view.chunks, [&](auto n) {
        if (view.all)
          block_softmax<n, false>(s, c, vis, mx, sum, ot, D, probs);
        else
          block_softmax<n, true>(s, c, vis, mx, sum, ot, D, probs);
      });
    }
    if (b > 0) block_values(b - 1, prev_chunks);
    prev_chunks = view.chunks;
  }
  block_values(blocks - 1, prev_chunks);
}

// Runs unit u on AMX tiles (expects configure_amx_tiles with every tile 16 rows of 64
// bytes); leaves its rows' un-normalised outputs, maxima and denominators in w as
// bf16_unit_run does (rows that see no key: mx = -inf, zero sums and outputs), with the
// blocks' own buffers in a. next: as for bf16_unit_run. Returns false on a block table
// entry outside [0, num_blocks).
inline bool amx_unit_run(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                         Bf16TileBuffers& w, AmxPromptBuffers& a) {
  const int D = pb.D, G = pb.G, rows = u.nq * G, blocks = (rows + kLanes - 1) / kLanes;
  const uint16_t* q_rows[kLanes];  // a block's query rows (row i * G + g: query i, head g)
  for (int b = 0, i = 0, g = 0; b < blocks; ++b) {
    for (int l = 0; l < kLanes; ++l) {
      q_rows[l] = b * kLanes + l < rows
                      ? pb.q + (u.first_token + i) * pb.q_t_stride + (u.h * G + g) * pb.q_h_stride
                      : nullptr;
      if (++g == G) {
        g = 0;
        ++i;
      }
    }
    for (int c0 = 0; c0 < D / 2; c0 += 16) {  // 16 dim pairs of 16 rows, transposed
      __m512i r[16];
      for (int l = 0; l < kLanes; ++l)
        r[l] = q_rows[l] ? _mm512_loadu_si512(q_rows[l] + 2 * c0) : _mm512_setzero_si512();
      transpose16x16(r);
      for (int c = 0; c < 16; ++c)
        _mm512_storeu_si512(a.qt.data() + (static_cast<size_t>(b) * D / 2 + c0 + c) * kLanes, r[c]);
    }
  }
  const size_t lanes = static_cast<size_t>(blocks) * kLanes;
  std::fill_n(a.started.begin(), blocks, 0);
  std::fill_n(a.mx.begin(), lanes, -std::numeric_limits<float>::infinity());
  std::fill_n(a.sum.begin(), lanes, 0.f);
  const ScoreMap map = score_map(pb.scale, pb.soft_cap);
  const bool ok = walk_segments(
      pb, u, next, w.visible.data(),
      [&](int n, const uint16_t* const* krows, const uint16_t* const* vrows,
          const uint16_t* const* next_k, const uint16_t* const* next_v) {
        KeyChunk keys[kMaxSegChunks];
        for (int c = 0; c < n; ++c)
          keys[c] = key_chunk(krows + c * kChunk, D, a.kstage.data() + static_cast<size_t>(c) * kChunk * D);
        transpose_values(vrows, n * kChunk / 2, (n + 1) / 2, D, a.vt.data(), next_k, next_v);
        amx_segment_blocks(n, rows, w.visible.data(), keys, map, a);
      });
  if (!ok) return false;
  // O^T, maxima and sums into the rows of w (a row's sum in its first partial sum)
  for (int b = 0; b < blocks; ++b) {
    const int real = std::min(kLanes, rows - b * kLanes);
    if (!a.started[b])  // no row of the block saw a key: its outputs are zeros
      std::fill_n(a.ot.begin() + static_cast<size_t>(b) * D * kLanes, D * kLanes, 0.f);
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m512i r[16];
      for (int d = 0; d < 16; ++d)
        r[d] = _mm512_loadu_si512(a.ot.data() + (static_cast<size_t>(b) * D + d0 + d) * kLanes);
      transpose16x16(r);
      for (int l = 0; l < real; ++l)
        _mm512_storeu_si512(w.acc.data() + static_cast<size_t>(b * kLanes + l) * D + d0, r[l]);
    }
    for (int l = 0; l < real; ++l) {
      const int row = b * kLanes + l;
      w.mx[row] = a.mx[row];
      std::fill_n(w.sum.begin() + 16 * row, 16, 0.f);
      w.sum[16 * row] = a.sum[row];
    }
  }
  return true;
}

}  // namespace paged_core_cpu

#else
#define PAGED_CORE_AMX_ATTENTION 0
#endif
