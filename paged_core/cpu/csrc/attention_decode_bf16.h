// bfloat16 decode attention with AVX512-BF16 dot products (vdpbf16ps): the units of a call
// that hold one query (a decode step's, nq == 1), for the shapes decode_rows_fit names. Same
// inputs, visibility rules and partial results as bf16_unit_run (attention_tiles_bf16.h),
// which takes every other unit; what differs is how the keys are read.
//
// The tiles transpose each chunk of keys and interleave the values into per-thread buffers
// that many query rows then share. A decode unit has only G rows (the query heads of one KV
// head), all at the same position, so here nothing loaded is stored again: each 16-key
// chunk (one block's rows, block_size % 16 == 0) is read in place, in address order, its dot
// products with every row reduced to 16 scores in registers (decode_scores); the values' key
// pairs are interleaved in registers and multiplied straight into outputs held in registers
// for the whole unit; every cache line two chunks ahead (into the thread's next unit, at the
// end of this one) is prefetched into L1 beside the load of the matching line here, and the
// K and V lines kDecodeL2Chunks ahead into L2 over each chunk's value pair steps. Decode
// of SmolLM2's shape (64 sequences x 2048 keys, bfloat16) read 22-24 GB/s through the tiles
// and 26-28 GB/s here, interleaved in one process on the 2-core AMD EPYC Zen 5; a bare loop
// of the same reads and arithmetic over random blocks, 33-38 GB/s.
//
// With amx_tiles, units of up to 4 rows (head_dim 64 or 128) take their raw scores from AMX
// tiles instead of decode_scores (attention_decode_amx.h); the rest of the loop is the same.
//
// Scores (log2 units, ScoreMap) and the rounding of probabilities to bfloat16, whose rounded
// values the denominators sum, are the tiles'. So is the lazy online softmax, per chunk here
// (per segment there): a row's running maximum m moves only when a chunk's scores pass it by
// more than kRescaleSlack (2^8 in probability), so most chunks skip rescaling the outputs and
// denominators (for head_dim 128 and 4-8 rows, outputs that live partly in L1);
// probabilities exp2(s - m) stay <= 2^8, far inside float32 and bfloat16 range, and the
// result is the same softmax (1.02-1.06x the GB/s of a maximum moved every chunk; cold KV,
// AMD EPYC Zen 5, avx512_bf16). Each score's sum runs in one fixed order (vdpbf16ps over each
// lane's pairs, then a fixed tree over the 16 lanes), so a decode query's result does not
// depend on the rest of the step.
#pragma once

#include "attention_decode_amx.h"
#include "attention_tiles_bf16.h"

#if PAGED_CORE_BF16_TILES

namespace paged_core_cpu {

// Chunks between a line's prefetch and its load (1 and 2 measured alike; 2 leaves more room
// where memory answers slowly).
constexpr int kDecodePrefetchChunks = 2;

// Chunks between the prefetch of a chunk's K and V lines into L2 and their loads. A chunk's
// K and V rows are two runs (2 KiB at head_dim 64, 4 KiB at 128) at random places, and the L1
// prefetches alone keep too few lines in flight, so each run is started into L2 this early,
// in one of two ways (Bf16Problem::kv_first_line, the caller's choice: paged_core.cpu.kv_prefetch
// picks by CPU vendor):
// - every line of both runs (kv_first_line false), dealt out over the kChunk / 2 value pair
//   steps of the chunk kDecodeL2Chunks before (start_share_in_l2: 4 lines of each run a step
//   at head_dim 64, 8 at 128), not all at that chunk's start. On the AMD EPYC Zen 4 (family
//   25 model 17, avx512_bf16) the one burst of 64-128 prefetches a chunk had read 12.3-14.4
//   GB/s where the shares read 20.3-24.1 (SmolLM2's shape, 16-48 sequences of 320-1024 keys,
//   scattered blocks, cold KV), 15.7-21.2 against 23.8-27.9 with each sequence's blocks one
//   after another, 8.4-13.8 against 11.5-15.7 for one sequence of 512 keys (both interleaved
//   in one process, 2026-12-04); the burst had beaten the first line only by 1.39-1.65x. 3
//   and 5 chunks ahead read 0.88-0.98x and 0.95-1.04x of 4, T0 prefetches 0.63-0.88x;
// - each run's first line only (kv_first_line true), which sets Intel's L2 stream prefetcher
//   on the rest of the run: on the Intel(R) Xeon(R) Processor (family 6 model 167, amx_bf16)
//   1.11-1.28x the every-line burst for SmolLM2's shape and 1.12-1.31x for Llama-8B-like
//   (1-64 sequences of 512-2048 keys, cold KV, vdpbf16ps and AMX scores, interleaved in one
//   process), 1.28-1.39x with 24-96 MiB of KV in its cache (two builds, each in its own
//   process, alternated): every line's software prefetches hold the core's few fill buffers,
//   which the stream prefetcher does not need. (The shares came later, on the Zen 4 alone;
//   they have not met that Xeon.)
// Serving reads a layer's KV cold: the other layers' weights pass through the cache between
// two of its steps.
constexpr int kDecodeL2Chunks = 4;

// Decode units whose 16-key chunks each lie in one block take decode_unit_run where it beats
// the tiles: head_dim 64 with up to 4 rows (query heads per KV head) and head_dim 128 with up
// to 8. Up to 16 zmm of outputs (64 x 4, 128 x 2) stay in registers; head_dim 128's wider
// groups (Llama 3 8B's and Mistral 7B's 4, Qwen2 7B's 7) keep part of theirs in L1, and still
// read 1.07-1.19x the tiles' GB/s; head_dim 64 with 6-8 rows would read 0.89-0.97x (cold KV,
// 1-32 sequences of 512-2048 keys, both builds interleaved in one process, AMD EPYC Zen 5,
// avx512_bf16).
constexpr int kDecodeMaxRows128 = 8;
constexpr bool decode_rows_fit(int G, int D, int64_t block_size) {
  return ((D == 64 && G <= 4) || (D == 128 && G <= kDecodeMaxRows128)) && block_size % kChunk == 0;
}

// The 16 lanes of a, b, c, d summed within each 128-bit lane L: lane L of the result holds
// [a's, b's, c's, d's] sums over lane L's four floats.
inline __m512 lane_sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)));
}

// Raw scores q . k[j] of one row q (D bf16) against the 16 key rows at keys (D apart), key j
// in lane j. Each line of the rows at ahead is prefetched beside its twin's load (prefetch:
// the first row only; the others find the key lines in L1).
template <int D>
inline __m512 decode_scores(const uint16_t* q, const uint16_t* keys, const uint16_t* ahead,
                            bool prefetch) {
  constexpr int W = D / 32;  // zmm per row
  // Each row reloads the keys (L1 hits after the first): kept from one row to the next
  // instead, they were spilled to the stack, stores that wait on the first row's misses.
  asm("" : "+r"(keys));
  __m512 quads[4];
  #pragma GCC unroll 16
  for (int g = 0; g < 4; ++g) {
    __m512 dots[4];
    #pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
      const uint16_t* k = keys + (4 * g + i) * D;
      __m512 a = _mm512_setzero_ps();
      #pragma GCC unroll 16
      for (int w = 0; w < W; ++w) {
        if (prefetch)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + (4 * g + i) * D + 32 * w), _MM_HINT_T0);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(k + 32 * w),
                             (__m512bh)_mm512_loadu_si512(q + 32 * w));
      }
      dots[i] = a;
    }
    quads[g] = lane_sums4(dots[0], dots[1], dots[2], dots[3]);
  }
  // quads[g] lane L: keys 4g .. 4g + 3 over lane L; sum the four lanes, quad g to lane g.
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                   _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

// Every row's raw scores against the 16 key rows at keys: vdpbf16ps dot products, or (kAmx)
// AMX tiles (attention_decode_amx.h; the unit's queries already loaded). Either way each line
// of the rows at ahead is prefetched into L1.
template <int R, int D, bool kAmx>
inline void chunk_scores(const uint16_t* const (&q)[R], const uint16_t* keys,
                         const uint16_t* ahead, __m512 (&raw)[R]) {
#if PAGED_CORE_AMX_DECODE
  if constexpr (kAmx) {
    alignas(64) float scores[kChunk * kAmxDecodeRows];
    #pragma GCC unroll 4
    for (int l = 0; l < kChunk * D * 2 / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(ahead) + 64 * l, _MM_HINT_T0);
    amx_decode_chunk<D>(keys, scores);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) raw[r] = amx_decode_row(scores, r);
    return;
  }
#endif
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) raw[r] = decode_scores<D>(q[r], keys, ahead, r == 0);
}

// Where the K and V rows of one 16-key chunk start (a chunk lies in one block: block_size %
// 16 == 0); zeros past every unit.
struct ChunkRows {
  const uint16_t* k;
  const uint16_t* v;
};

// The first line of a chunk's K run and of its V run (kChunk rows of head_dim D each) started
// into L2 (kDecodeL2Chunks ahead), for the CPU's stream prefetcher to fetch the rest.
inline void start_first_lines_in_l2(const ChunkRows& rows) {
  _mm_prefetch(reinterpret_cast<const char*>(rows.k), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(rows.v), _MM_HINT_T1);
}

// Share `step` (of kChunk / 2, one per value pair step of the chunk that runs meanwhile) of
// every line of a chunk's K and V runs, started into L2: the runs' lines [step * kPerStep,
// (step + 1) * kPerStep) each, so the whole chunk goes out over the pair steps.
template <int D>
inline void start_share_in_l2(const ChunkRows& rows, int step) {
  constexpr int kLines = kChunk * D * 2 / 64, kSteps = kChunk / 2, kPerStep = kLines / kSteps;
  static_assert(kLines % kSteps == 0, "each pair step starts whole lines");
  const char* k = reinterpret_cast<const char*>(rows.k) + 64 * kPerStep * step;
  const char* v = reinterpret_cast<const char*>(rows.v) + 64 * kPerStep * step;
  #pragma GCC unroll 8
  for (int l = 0; l < kPerStep; ++l) {
    _mm_prefetch(k + 64 * l, _MM_HINT_T1);
    _mm_prefetch(v + 64 * l, _MM_HINT_T1);
  }
}

// A thread's decode units as one stream of chunks: unit u's, then next's (nullptr: none).
class ChunkStream {
 public:
  ChunkStream(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next)
      : pb_(pb), u_(u), next_(next), chunks_(chunks_of(u)),
        next_chunks_(next != nullptr ? chunks_of(*next) : 0) {}

  int64_t chunks() const { return chunks_; }

  // Chunk c of the stream (c >= chunks(): the next unit's chunk c - chunks()); false on a
  // block table entry outside [0, num_blocks).
  bool rows(int64_t c, const uint16_t* zeros, ChunkRows& out) const {
    if (c < chunks_) return rows_of(u_, first_segment_start(u_) + c * kChunk, out);
    if (c - chunks_ < next_chunks_)
      return rows_of(*next_, first_segment_start(*next_) + (c - chunks_) * kChunk, out);
    out = {zeros, zeros};
    return true;
  }

 private:
  static int64_t chunks_of(const Bf16Unit& u) {
    return (u.key_hi - first_segment_start(u) + kChunk - 1) / kChunk;
  }
  bool rows_of(const Bf16Unit& u, int64_t key, ChunkRows& out) const {
    const int64_t phys = pb_.block_tables[u.seq * pb_.bt_stride + key / pb_.block_size];
    if (phys < 0 || phys >= pb_.num_blocks) return false;
    const int64_t row = (u.h * pb_.num_blocks + phys) * pb_.block_size + key % pb_.block_size;
    out = {pb_.k + row * pb_.D, pb_.v + row * pb_.D};
    return true;
  }

  const Bf16Problem& pb_;
  const Bf16Unit& u_;
  const Bf16Unit* next_;
  int64_t chunks_, next_chunks_;
};

// Unit u (u.nq == 1, G = R rows; pb.block_size % 16 == 0) into w's outputs, maxima and
// denominators, as bf16_unit_run leaves them; next (or nullptr): the unit this thread runs
// after u, whose first chunks are prefetched during u's last. False on a block table entry
// outside [0, num_blocks).
template <int R, int D, bool kAmx>
bool decode_unit_run(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                     Bf16TileBuffers& w) {
  alignas(64) static const uint16_t kZeroRows[kChunk * 256] = {};  // rows past the range
  static_assert(D <= 256, "kZeroRows holds a chunk of rows");
  constexpr int W = D / 32;
  constexpr int kAhead = kDecodePrefetchChunks;
  const ScoreMap map = score_map(pb.scale, pb.soft_cap);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);  // bf16 1.0

  // Each row's running state: outputs (D floats as D / 16 zmm), 16 partial denominators,
  // and its maximum (log2 units; -inf before the first visible key).
  const uint16_t* q[R];
  __m512 acc[R][D / 16], sum[R];
  float max[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    q[r] = pb.q + u.first_token * pb.q_t_stride + (u.h * R + r) * pb.q_h_stride;
    #pragma GCC unroll 16
    for (int x = 0; x < D / 16; ++x) acc[r][x] = _mm512_setzero_ps();
    sum[r] = _mm512_setzero_ps();
    max[r] = -std::numeric_limits<float>::infinity();
  }
#if PAGED_CORE_AMX_DECODE
  alignas(64) uint32_t query_pairs[kAmx ? D / 2 * kAmxDecodeRows : 1];
  if constexpr (kAmx) amx_decode_load_queries<R, D>(q, query_pairs);
#endif
  // The query at u.pos0 sees keys [first, u.key_hi) of the unit.
  const int64_t first = std::max(u.key_lo, pb.window > 0 ? u.pos0 - pb.window + 1 : int64_t{0});
  const int64_t start = first_segment_start(u);
  const ChunkStream stream(pb, u, next);
  ChunkRows ring[kAhead + 1];  // chunk c at c % (kAhead + 1)
  for (int a = 0; a < kAhead; ++a)
    if (!stream.rows(a, kZeroRows, ring[a])) return false;
  for (int64_t c = 0; c < stream.chunks(); ++c) {
    ChunkRows& ahead = ring[(c + kAhead) % (kAhead + 1)];
    if (!stream.rows(c + kAhead, kZeroRows, ahead)) return false;
    const ChunkRows now = ring[c % (kAhead + 1)];
    ChunkRows far;  // started into L2 by its first lines, or a share a value pair step
    if (!stream.rows(c + kDecodeL2Chunks, kZeroRows, far)) return false;
    const bool shares = !pb.kv_first_line;
    if (!shares) start_first_lines_in_l2(far);
    const int64_t c0 = start + c * kChunk;
    const int vis_lo = static_cast<int>(std::max<int64_t>(first - c0, 0));
    const int vis_hi = static_cast<int>(std::min<int64_t>(u.key_hi - c0, kChunk));
    if (vis_hi <= vis_lo) {  // the window starts past this chunk: every share goes out now
      if (shares)
        for (int i = 0; i < kChunk / 2; ++i) start_share_in_l2<D>(far, i);
      continue;
    }
    const __mmask16 visible = static_cast<__mmask16>(((1u << vis_hi) - 1) & ~((1u << vis_lo) - 1));

    __m512 raw[R];
    chunk_scores<R, D, kAmx>(q, now.k, ahead.k, raw);
    __m512i probs[R];  // each row's 16 probabilities as 8 bf16 pairs (low half)
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      // Keys past vis_hi may hold anything (NaN in unowned slots): masked here, and their
      // values read as zeros below.
      __m512 s = _mm512_mask_mov_ps(neg_inf, visible, map_scores(raw[r], map));
      const float smax = _mm512_reduce_max_ps(s);
      if (smax > max[r] + kRescaleSlack) {  // true at the first visible key (max[r] = -inf)
        const bool first = max[r] == -std::numeric_limits<float>::infinity();
        const __m512 alpha = exp2_probs(_mm512_set1_ps(max[r] - smax), first ? 0 : 0xFFFF);
        max[r] = smax;
        sum[r] = _mm512_mul_ps(alpha, sum[r]);
        #pragma GCC unroll 16
        for (int x = 0; x < D / 16; ++x) acc[r][x] = _mm512_mul_ps(alpha, acc[r][x]);
      }
      const __m512 p = exp2_probs(_mm512_sub_ps(s, _mm512_set1_ps(max[r])), visible);
      const __m512i pb16 = _mm512_zextsi256_si512((__m256i)_mm512_cvtneps_pbh(p));
      sum[r] = _mm512_dpbf16_ps(sum[r], (__m512bh)pb16, ones);
      probs[r] = pb16;
    }
    #pragma GCC unroll 16
    for (int i = 0; i < kChunk / 2; ++i) {  // key pairs (2i, 2i + 1)
      const uint16_t* a = 2 * i < vis_hi ? now.v + 2 * i * D : kZeroRows;
      const uint16_t* b = 2 * i + 1 < vis_hi ? now.v + (2 * i + 1) * D : kZeroRows;
      __m512bh pairs[2 * W];
      #pragma GCC unroll 16
      for (int x = 0; x < W; ++x) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead.v + 2 * i * D + 32 * x), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ahead.v + (2 * i + 1) * D + 32 * x), _MM_HINT_T0);
        __m512i lo, hi;
        pair_values(_mm512_loadu_si512(a + 32 * x), _mm512_loadu_si512(b + 32 * x), lo, hi);
        pairs[2 * x] = (__m512bh)lo;
        pairs[2 * x + 1] = (__m512bh)hi;
      }
      if (shares) start_share_in_l2<D>(far, i);
      const __m512i lane = _mm512_set1_epi32(i);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512bh p = (__m512bh)_mm512_permutexvar_epi32(lane, probs[r]);
        #pragma GCC unroll 16
        for (int x = 0; x < 2 * W; ++x) acc[r][x] = _mm512_dpbf16_ps(acc[r][x], pairs[x], p);
      }
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    w.mx[r] = max[r];
    _mm512_storeu_ps(w.sum.data() + 16 * r, sum[r]);
    #pragma GCC unroll 16
    for (int x = 0; x < D / 16; ++x) _mm512_storeu_ps(w.acc.data() + static_cast<size_t>(r) * D + 16 * x, acc[r][x]);
  }
  return true;
}

// decode_unit_run for G rows and head_dim D, its scores on AMX tiles where amx and they fit
// (amx_decode_fits; the caller has loaded kDecodeTileRows' configuration).
template <int G, int D>
bool decode_unit_on(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                    Bf16TileBuffers& w, bool amx) {
#if PAGED_CORE_AMX_DECODE
  if constexpr (amx_decode_fits(G, D))
    if (amx) return decode_unit_run<G, D, true>(pb, u, next, w);
#endif
  (void)amx;
  return decode_unit_run<G, D, false>(pb, u, next, w);
}

// decode_unit_on for G = pb.G rows and head_dim pb.D (decode_rows_fit(G, D, block_size)).
inline bool decode_unit_dispatch(const Bf16Problem& pb, const Bf16Unit& u, const Bf16Unit* next,
                                 Bf16TileBuffers& w, bool amx) {
  switch (pb.D * 8 + pb.G) {
#define PAGED_CORE_DECODE_CASE(G, D) \
  case D * 8 + G: return decode_unit_on<G, D>(pb, u, next, w, amx);
    PAGED_CORE_DECODE_CASE(1, 64) PAGED_CORE_DECODE_CASE(2, 64) PAGED_CORE_DECODE_CASE(3, 64)
    PAGED_CORE_DECODE_CASE(4, 64) PAGED_CORE_DECODE_CASE(1, 128) PAGED_CORE_DECODE_CASE(2, 128)
    PAGED_CORE_DECODE_CASE(3, 128) PAGED_CORE_DECODE_CASE(4, 128) PAGED_CORE_DECODE_CASE(5, 128)
    PAGED_CORE_DECODE_CASE(6, 128) PAGED_CORE_DECODE_CASE(7, 128)
#undef PAGED_CORE_DECODE_CASE
    default: return decode_unit_on<kDecodeMaxRows128, 128>(pb, u, next, w, amx);
  }
}

}  // namespace paged_core_cpu

#endif  // PAGED_CORE_BF16_TILES
