// Paged attention for CPU: every sequence of a packed step (decodes, prefills,
// prefill chunks after a cached prefix) in one call, straight from the paged cache.
//
// Cache layout per layer: [num_kv_heads, num_blocks, block_size, row],
// K and V separate, contiguous; row = head_dim in the query dtype, or, for a quantized
// cache (int8, fp8 e4m3 / e5m2: kv_quant.h), head_dim one-byte codes and a float32 scale,
// each block's visible rows dequantized to float32 once per task (such caches never take
// the bf16 tiles). Queries are packed: sequence s owns query rows
// query_start_loc[s] .. query_start_loc[s+1]-1, its last new tokens, at
// positions seq_lens[s] - q_len .. seq_lens[s] - 1. Query i at position p sees
// keys k <= p (and, with a window w > 0, k > p - w).
//
// Work is split into tasks of (sequence, kv head, tile of up to TILE queries),
// longest first, handed out dynamically to OpenMP threads. A task walks the key
// blocks its tile can see; inside a block every query row (TILE x G query heads
// of the kv head) scores only its own visible key range (no masks; with a soft cap c the
// scaled scores s become c * tanh(s / c), Gemma 2's), keeps an online softmax in float32 and accumulates p * v in float32. bfloat16 inputs
// are widened on load; the output has the input dtype. Rows past
// query_start_loc[num_seqs] (padding) are not written.
//
// bfloat16 caches (head_dim % 32 == 0) take attention_tiles_bf16.h's tiles (of up to
// kBf16TileQueries queries; on AMX tiles kAmxTileQueries or kAmxWiderTileQueries for long
// prompts), and their one-query units (decodes) attention_decode_bf16.h's loop where it beats them
// (decode_rows_fit), with or without amx_tiles; with amx_tiles the decode loop takes its
// scores from AMX tiles where they fit (attention_decode_amx.h) and the other units run on
// AMX tiles (attention_prompt_amx.h). That needs the avx512_bf16 build on a CPU and OS
// granting AMX tiles (else an error); float32 and quantized-cache calls compute as they do
// without it.
//
// Registered as torch.ops.paged_core_cpu_<level>.paged_attention (no pybind needed).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "attention_decode_bf16.h"
#include "attention_prompt_amx.h"
#include "attention_tiles_bf16.h"
#include "bf16_dot_linear.h"
#include "cpu_common.h"
#include "cpu_simd.h"
#include "kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include <strings.h>

namespace {

using paged_core_cpu::cache_row;
using paged_core_cpu::Fp8E4M3;
using paged_core_cpu::Fp8E5M2;
using paged_core_cpu::kQuantizedCache;
using paged_core_cpu::Row;
using paged_core_cpu::dequantize_rows;
#if PAGED_CORE_AVX2
using paged_core_cpu::exp8;
using paged_core_cpu::load8;
#endif

#if PAGED_CORE_AVX2
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// scores[j] = q . k[j] for j < cnt (key rows of D elements at k, ld apart); D % 8 == 0.
template <typename T>
inline void qk_avx2(const float* q, const T* k, int cnt, int D, int64_t ld, float* scores) {
  int j = 0;
  for (; j + 4 <= cnt; j += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const T* k0 = k + j * ld;
    for (int d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k0 + ld + d), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k0 + 2 * ld + d), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k0 + 3 * ld + d), a3);
    }
    // Reduce the four accumulators into four scores.
    __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
    __m256 h = _mm256_hadd_ps(h01, h23);  // lanes: [s0 s1 s2 s3 | s0' s1' s2' s3']
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(scores + j, r);
  }
  for (; j < cnt; ++j) {
    __m256 a = _mm256_setzero_ps();
    const T* kr = k + j * ld;
    for (int d = 0; d < D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr + d), a);
    scores[j] = hsum8(a);
  }
}

// acc[0:D] += sum_j p[j] * v[j] (rows ld apart); D % 8 == 0; accumulators held in registers
// 64 lanes at a time.
template <typename T>
inline void pv_avx2(const float* p, const T* v, int cnt, int D, int64_t ld, float* acc) {
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + d0 + 8 * c);
    for (int j = 0; j < cnt; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const T* vr = v + j * ld + d0;
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(pj, load8(vr + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + d0 + 8 * c, a[c]);
  }
  for (; d0 < D; d0 += 8) {
    __m256 a = _mm256_loadu_ps(acc + d0);
    for (int j = 0; j < cnt; ++j)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(v + j * ld + d0), a);
    _mm256_storeu_ps(acc + d0, a);
  }
}
#endif  // PAGED_CORE_AVX2

// scores[j] = q . k[j] for j < cnt (key rows of D elements at k, ld apart).
template <typename T>
inline void score_keys(const float* q, const T* k, int cnt, int D, int64_t ld, float* scores,
                       float* rowbuf) {
#if PAGED_CORE_AVX2
  if (D % 8 == 0) {
    qk_avx2(q, k, cnt, D, ld, scores);
    return;
  }
#endif
  for (int j = 0; j < cnt; ++j) {
    const float* kr = Row<T>::load(k + j * ld, rowbuf, D);
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < D; ++d) dot += q[d] * kr[d];
    scores[j] = dot;
  }
}

// scores[j] = exp(scores[j] - m) for j < cnt; returns their sum.
inline float exp_shifted(float* scores, int cnt, float m) {
  float total = 0.f;
  int j0 = 0;
#if PAGED_CORE_AVX2
  const __m256 mv = _mm256_set1_ps(m);
  for (; j0 + 8 <= cnt; j0 += 8)
    _mm256_storeu_ps(scores + j0, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j0), mv)));
  for (int j = 0; j < j0; ++j) total += scores[j];
#endif
  for (int j = j0; j < cnt; ++j) {
    scores[j] = std::exp(scores[j] - m);
    total += scores[j];
  }
  return total;
}

// acc[0:D] += sum_j p[j] * v[j] for j < cnt (value rows of D elements at v, ld apart).
template <typename T>
inline void accumulate_values(const float* p, const T* v, int cnt, int D, int64_t ld, float* acc,
                              float* rowbuf) {
#if PAGED_CORE_AVX2
  if (D % 8 == 0) {
    pv_avx2(p, v, cnt, D, ld, acc);
    return;
  }
#endif
  for (int j = 0; j < cnt; ++j) {
    const float* vr = Row<T>::load(v + j * ld, rowbuf, D);
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] += p[j] * vr[d];
  }
}

constexpr int64_t TILE = 16;  // queries of one sequence per task
// Queries per task on the bfloat16 tiles (attention_tiles_bf16.h): a unit transposes its keys
// and interleaves its values once for all its rows, so larger prompt tiles share that work
// among more rows (rows past a query's position skip whole segments; a row's sums do not
// depend on the rows beside it). 32 against 16: prefill 1.05-1.08x the GFLOP/s for 1-4
// prompts of 128-2048 tokens (SmolLM2's shape, both builds interleaved in one process, AMD
// EPYC Zen 5, avx512_bf16).
constexpr int64_t kBf16TileQueries = 32;
// On AMX tiles (attention_prompt_amx.h), whose units also lay each segment's values out once
// for all their rows, sequences of at least kAmxWideFrom new tokens take tiles of
// kAmxTileQueries: 64 against 32, a 2048-token prompt 1.07x the speed in SmolLM2's shape and
// 1.25x in a Llama-8B-like one (8 KV heads x 4, head_dim 128), 512 tokens 1.1x / 1.03x, but
// 128 tokens 0.93x (each build alternately in its own process, Intel(R) Xeon(R) Processor,
// amx_bf16, 2 threads). From kAmxWiderFrom new tokens, tiles of kAmxWiderTileQueries where
// a unit's float32 outputs O^T (queries x G x head_dim) take at most kAmxWiderOutputBytes:
// 128 against 64 queries, SmolLM2's shape (96 KiB), 1 prompt of 512 / 2048 tokens 1.12-1.14x /
// 1.04-1.07x, 4 of 256 1.09x, but 1 of 256 / 384 0.88x / 0.90x (3 tiles for 2 threads); the
// Llama-8B-like shape (256 KiB) 0.8-0.9x (same machine and method, 2026-12-04).
constexpr int64_t kAmxTileQueries = 64;
constexpr int64_t kAmxWideFrom = 256;
constexpr int64_t kAmxWiderTileQueries = 128;
constexpr int64_t kAmxWiderFrom = 512;
constexpr int64_t kAmxWiderOutputBytes = 96 * 1024;

struct Task {
  int64_t seq, first_query, num_queries, cost;
};

// Queries per task by a sequence's new tokens: `narrow`, `wide` from wide_from, `wider` from
// wider_from (wide_from <= wider_from).
struct TileQueries {
  int64_t narrow, wide, wide_from, wider, wider_from;

  int64_t for_new_tokens(int64_t q_len) const {
    return q_len >= wider_from ? wider : q_len >= wide_from ? wide : narrow;
  }
};

// Tasks of every sequence (tiles as `tiles` says), longest (most keys to read) first, so the
// dynamic schedule does not end with one long task on one thread.
std::vector<Task> make_tasks(const int32_t* seq_lens, const int32_t* qsl, int64_t num_seqs,
                             int64_t window, const TileQueries& tiles) {
  std::vector<Task> tasks;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    const int64_t tile = tiles.for_new_tokens(q_len);
    for (int64_t q0 = 0; q0 < q_len; q0 += tile) {
      const int64_t nq = std::min<int64_t>(tile, q_len - q0);
      const int64_t last = seq_lens[s] - q_len + q0 + nq;  // keys of the tile's last query
      const int64_t keys = window > 0 ? std::min<int64_t>(last, window + nq) : last;
      tasks.push_back({s, q0, nq, keys * nq});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

// Blocks between the one attention_kernel computes and the one it starts into L2 meanwhile.
// A block's K and V rows are two runs at random places (2 KiB each at head_dim 64 in
// bfloat16). Each query row of the block's work starts its share of both runs' lines
// (BlockAhead), where the kernel had fetched the next block's lines into L1 in one burst at
// the block's start. On the AMD EPYC Zen 4 (family 25 model 17; 16-48 sequences of 320-1024
// keys, cold KV, interleaved in one process, 2026-12-04) decode at the avx2 level read, for
// SmolLM2's shape, 8.1-9.2 -> 13.4-14.6 GB/s with scattered blocks and 14.5-18.9 -> 18.3-22.1
// with consecutive ones, for Llama-8B-like 8.9-9.5 -> 14.1-15.1 and 11.5-12.5 -> 17.8-20.0; a
// float32 cache at the avx512_bf16 level 9.5 -> 19.8 (scattered) and 19.7 -> 23.1, bfloat16 at
// the avx512 level 5.9 -> 12.1; prefill through it moved 68.5 -> 70.4 and 74.9 -> 75.5
// GFLOP/s (4 x 512 and 1 x 2048 tokens, avx2). 3 and 4 blocks ahead read 0.93-1.01x of 2.
constexpr int64_t kL2AheadBlocks = 2;

// The K and V runs of the block kL2AheadBlocks ahead (null: none), started into L2 in shares:
// share r of `parts` is lines [lines * r / parts, lines * (r + 1) / parts) of each run.
struct BlockAhead {
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t lines = 0;

  void start_share(int64_t r, int64_t parts) const {
    if (k == nullptr) return;
    for (int64_t l = lines * r / parts; l < lines * (r + 1) / parts; ++l) {
      __builtin_prefetch(k + 64 * l, 0, 2);  // read, into L2 (prefetcht1 on x86)
      __builtin_prefetch(v + 64 * l, 0, 2);
    }
  }
};

// KD > 0: head_dim known at compile time (full unrolling); KD == 0: runtime head_dim.
// T: query and output elements; C: cache elements (T, or quantized: kv_quant.h).
template <typename T, typename C, int KD>
void attention_kernel(const T* __restrict q_ptr, int64_t q_t_stride, int64_t q_h_stride,
                      const C* __restrict k_ptr, const C* __restrict v_ptr,
                      const int32_t* __restrict block_tables, int64_t bt_stride,
                      const int32_t* __restrict seq_lens, const int32_t* __restrict qsl,
                      T* __restrict out_ptr, const std::vector<Task>& tasks,
                      int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, int64_t group,
                      int64_t head_dim_rt, float scale, int64_t window, float soft_cap,
                      int* error_flag) {
  const int D = KD > 0 ? KD : static_cast<int>(head_dim_rt);
  const int G = static_cast<int>(group);
  const int bs = static_cast<int>(block_size);
  const int64_t ld = cache_row<C>(D);  // cache row stride
  const int64_t head_stride = num_blocks * block_size * ld;  // cache stride of one kv head
  const int64_t block_stride = block_size * ld;
  const int64_t num_heads = num_kv_heads * G;
  const int64_t num_work = static_cast<int64_t>(tasks.size()) * num_kv_heads;
  const int nthreads = std::max(1, at::get_num_threads());
  const int max_rows = static_cast<int>(TILE) * G;

#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> qf(static_cast<size_t>(max_rows) * D);
    std::vector<float> acc(static_cast<size_t>(max_rows) * D);
    const int bs_pad = (bs + 7) / 8 * 8;
    std::vector<float> scores(bs_pad);
    std::vector<float> mx(max_rows), sum(max_rows);
    std::vector<float> rowbuf(D);
    // A quantized block's visible K and V rows, dequantized once per task (not per query row).
    std::vector<float> k_rows(kQuantizedCache<C> ? static_cast<size_t>(bs) * D : 0);
    std::vector<float> v_rows(k_rows.size());

#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < num_work; ++w) {
      const Task& task = tasks[w / num_kv_heads];
      const int64_t h = w % num_kv_heads;
      const int64_t s = task.seq;
      const int64_t n = seq_lens[s];
      const int64_t q_len = qsl[s + 1] - qsl[s];
      const int64_t pos0 = n - q_len + task.first_query;  // position of the tile's first query
      const int nq = static_cast<int>(task.num_queries);
      const int rows = nq * G;
      // Query rows r = i * G + g: token qsl[s] + first_query + i, head h * G + g; pre-scaled.
      for (int i = 0; i < nq; ++i) {
        const int64_t token = qsl[s] + task.first_query + i;
        for (int g = 0; g < G; ++g) {
          const int r = i * G + g;
          const T* qrow = q_ptr + token * q_t_stride + (h * G + g) * q_h_stride;
          const float* src = Row<T>::load(qrow, rowbuf.data(), D);
          float* dst = qf.data() + static_cast<size_t>(r) * D;
#pragma omp simd
          for (int d = 0; d < D; ++d) dst[d] = src[d] * scale;
          mx[r] = -std::numeric_limits<float>::infinity();
          sum[r] = 0.f;
        }
      }
      std::fill(acc.begin(), acc.begin() + static_cast<size_t>(rows) * D, 0.f);

      const int32_t* table = block_tables + s * bt_stride;
      const C* k_head = k_ptr + h * head_stride;
      const C* v_head = v_ptr + h * head_stride;
      const int64_t first_key = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
      const int64_t last_key = pos0 + nq - 1;
      bool bad = false;
      for (int64_t b = first_key / block_size; b * block_size <= last_key; ++b) {
        const int64_t phys = table[b];
        if (phys < 0 || phys >= num_blocks) { bad = true; break; }
        const int64_t block_start = b * block_size;
        const C* kb = k_head + phys * block_stride;
        const C* vb = v_head + phys * block_stride;
        BlockAhead ahead;  // a share of its lines beside each query row's work below
        if ((b + kL2AheadBlocks) * block_size <= last_key) {
          const int64_t far = table[b + kL2AheadBlocks];
          if (far >= 0 && far < num_blocks)
            ahead = {reinterpret_cast<const char*>(k_head + far * block_stride),
                     reinterpret_cast<const char*>(v_head + far * block_stride),
                     block_stride * static_cast<int64_t>(sizeof(C)) / 64};
        }
        const int64_t shares = static_cast<int64_t>(nq) * G;
        if constexpr (kQuantizedCache<C>) {  // rows past the tile's last key hold no token yet
          const int r0 = static_cast<int>(std::max<int64_t>(0, first_key - block_start));
          const int r1 =
              static_cast<int>(std::min<int64_t>(block_size, last_key + 1 - block_start));
          dequantize_rows(kb, r0, r1, D, k_rows.data());
          dequantize_rows(vb, r0, r1, D, v_rows.data());
        }
        for (int i = 0; i < nq; ++i) {
          // Query i (position pos0 + i) sees keys [lo, hi) of this block.
          const int64_t p = pos0 + i;
          const int64_t lo_key = window > 0 ? std::max<int64_t>(block_start, p - window + 1) : block_start;
          const int64_t hi_key = std::min<int64_t>(block_start + block_size, p + 1);
          if (hi_key <= lo_key) {  // nothing to compute: the shares go out all the same
            for (int g = 0; g < G; ++g) ahead.start_share(i * G + g, shares);
            continue;
          }
          const int lo = static_cast<int>(lo_key - block_start);
          const int cnt = static_cast<int>(hi_key - lo_key);
          for (int g = 0; g < G; ++g) {
            const int r = i * G + g;
            ahead.start_share(r, shares);
            const float* qr = qf.data() + static_cast<size_t>(r) * D;
            float* ar = acc.data() + static_cast<size_t>(r) * D;
            if constexpr (kQuantizedCache<C>)
              score_keys<float>(qr, k_rows.data() + lo * D, cnt, D, D, scores.data(),
                                rowbuf.data());
            else
              score_keys<C>(qr, kb + lo * ld, cnt, D, ld, scores.data(), rowbuf.data());
            if (soft_cap > 0.f)
              for (int j = 0; j < cnt; ++j) scores[j] = soft_cap * std::tanh(scores[j] / soft_cap);
            // Online softmax update.
            float bm = scores[0];
            for (int j = 1; j < cnt; ++j) bm = std::max(bm, scores[j]);
            const float m_new = std::max(mx[r], bm);
            if (m_new > mx[r]) {
              const float alpha = std::exp(mx[r] - m_new);  // 0 on the first block
              sum[r] *= alpha;
#pragma omp simd
              for (int d = 0; d < D; ++d) ar[d] *= alpha;
              mx[r] = m_new;
            }
            sum[r] += exp_shifted(scores.data(), cnt, m_new);
            if constexpr (kQuantizedCache<C>)
              accumulate_values<float>(scores.data(), v_rows.data() + lo * D, cnt, D, D, ar,
                                       rowbuf.data());
            else
              accumulate_values<C>(scores.data(), vb + lo * ld, cnt, D, ld, ar, rowbuf.data());
          }
        }
      }
      if (bad) {
        __atomic_store_n(error_flag, 2, __ATOMIC_RELAXED);
        continue;
      }
      for (int i = 0; i < nq; ++i) {
        const int64_t token = qsl[s] + task.first_query + i;
        for (int g = 0; g < G; ++g) {
          const int r = i * G + g;
          Row<T>::store(out_ptr + (token * num_heads + h * G + g) * D,
                        acc.data() + static_cast<size_t>(r) * D, 1.f / sum[r], D);
        }
      }
    }
  }
}

#if PAGED_CORE_BF16_TILES
using paged_core_cpu::Bf16Problem;
using paged_core_cpu::Bf16Unit;

// A bf16 unit of work: a task's tile on one KV head over all or part of its keys.
struct Bf16Job {
  Bf16Unit unit;
  int64_t cost;  // keys x queries
  int64_t slot;  // < 0: writes the output; else where its partial result starts (floats)
  int64_t split;  // its Bf16Split (slot >= 0)
};

// A tile whose keys were split into parts, jobs writing partial results `stride` floats
// apart from `first` (in key order); the job that finishes its last part combines them.
struct Bf16Split {
  Bf16Unit tile;
  size_t first, stride;
  int parts;
  int pending;  // parts not finished yet
};

// Keys of one part of a split one-query tile: parts end at multiples of this absolute
// position.
constexpr int64_t kPartKeys = 256;
static_assert(kPartKeys % paged_core_cpu::kSplitAlign == 0, "parts start on segment boundaries");

// Where a tile of nq queries cuts its keys: at multiples of kPartKeys, or, with
// scale_by_queries, of nq * kPartKeys (the same keys per unit of work as a one-query part).
// Cutting prompt tiles every 256 keys cost them a partial result saved and combined per part:
// a 2048-token prompt's attention ran at 449 GFLOP/s cut every 256 keys and 538 cut by its
// queries, four such prompts 283 against 543 (SmolLM2's shape, bfloat16, both builds
// interleaved in one process, AMD EPYC Zen 5, avx512_bf16); a step of many query tiles has
// work for every thread without cuts.
inline int64_t part_keys(int nq, bool scale_by_queries) {
  return scale_by_queries ? kPartKeys * nq : kPartKeys;
}

// The jobs of every task on every KV head, longest first. A tile whose keys cross a multiple
// of part_keys (long contexts) is split there into parts, so a few long sequences still give
// every thread work. Where a tile is cut depends on its own positions and query count only,
// never on the rest of the step or the thread count: a tile's result is the same whatever it
// is batched with. Batch-invariant mode (scale_by_queries off) needs more: a query's bits the
// same alone as inside a prompt chunk, so every tile cuts at the same positions.
std::vector<Bf16Job> make_bf16_jobs(const std::vector<Task>& tasks, const int32_t* seq_lens,
                                    const int32_t* qsl, int64_t num_kv_heads, int64_t window,
                                    int G, int D, bool scale_by_queries,
                                    std::vector<Bf16Split>& splits, size_t& partial_floats) {
  std::vector<Bf16Job> jobs;
  partial_floats = 0;
  for (const Task& t : tasks) {
    const int64_t s = t.seq;
    const int64_t pos0 = seq_lens[s] - (qsl[s + 1] - qsl[s]) + t.first_query;
    const int64_t key_hi = pos0 + t.num_queries;
    const int64_t key_lo = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
    const int64_t cut = part_keys(static_cast<int>(t.num_queries), scale_by_queries);
    const int64_t first_part = key_lo / cut;
    const int64_t parts = (key_hi - 1) / cut - first_part + 1;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const Bf16Unit tile{s, h, qsl[s] + t.first_query, pos0, key_lo, key_hi,
                          static_cast<int>(t.num_queries)};
      if (parts < 2) {
        jobs.push_back({tile, t.cost, -1, -1});
        continue;
      }
      const int64_t split = static_cast<int64_t>(splits.size());
      const size_t stride = paged_core_cpu::partial_floats(tile.nq * G, D);
      splits.push_back({tile, partial_floats, stride, static_cast<int>(parts), static_cast<int>(parts)});
      for (int64_t j = 0; j < parts; ++j) {
        Bf16Unit part = tile;
        part.key_lo = std::max(key_lo, (first_part + j) * cut);
        part.key_hi = std::min(key_hi, (first_part + j + 1) * cut);
        jobs.push_back({part, (part.key_hi - part.key_lo) * t.num_queries,
                        static_cast<int64_t>(partial_floats), split});
        partial_floats += stride;
      }
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Bf16Job& a, const Bf16Job& b) { return a.cost > b.cost; });
  return jobs;
}

// What one thread of the bf16 tile kernel would take for the tasks, in microseconds,
// roughly: K and V bytes at ~15 GB/s (scattered blocks) plus 4 * D flops per key and query
// row at ~250 GFLOP/s (one core).
double single_thread_us(const std::vector<Task>& tasks, int64_t num_kv_heads, int G, int D) {
  double bytes = 0, flops = 0;
  for (const Task& t : tasks) {
    bytes += static_cast<double>(t.cost) / t.num_queries * D * 4 * num_kv_heads;
    flops += static_cast<double>(t.cost) * G * D * 4 * num_kv_heads;
  }
  return bytes / 15e3 + flops / 250e3;
}

// Steps estimated below wake_worth_us() run on the calling thread alone: waking the others
// costs tens of microseconds where they sleep between parallel regions (OMP_WAIT_POLICY=PASSIVE
// with no GOMP_SPINCOUNT: torch loaded before paged_core, see paged_core/cpu/openmp_spin.py),
// a microsecond or two where they spin (libgomp's default, or the spin count paged_core sets).
// Spinning, a one-sequence decode of ~160 keys took 0.41 ms a step on two threads against
// 0.53-0.56 on one (30 SmolLM2 layers in W4A16; Intel(R) Xeon(R) Processor, amx_bf16).
constexpr double kSleepingWakeUs = 20;
constexpr double kSpinningWakeUs = 2;

// libgomp's rule, read once: its threads sleep between regions only under a passive wait
// policy without a spin count.
double wake_worth_us() {
  static const double us = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const bool passive = policy != nullptr && strcasecmp(policy, "passive") == 0;
    return passive && std::getenv("GOMP_SPINCOUNT") == nullptr ? kSleepingWakeUs : kSpinningWakeUs;
  }();
  return us;
}

#if PAGED_CORE_AMX_ATTENTION
// A thread's AMX tile configuration in bf16_tile_kernel (none without amx): prompt units'
// (16 rows of 64 bytes each) or decode scores' (attention_decode_amx.h), loaded when a unit
// needs the one not loaded; the tiles are handed back when the thread's jobs end.
class AmxTileUse {
 public:
  enum Kind { kNone, kPrompt, kDecode };
  explicit AmxTileUse(bool amx) : amx_(amx) {}
  ~AmxTileUse() {
    if (loaded_ != kNone) paged_core_cpu::release_amx_tiles();
  }
  void load(Kind kind) {
    if (!amx_ || kind == loaded_) return;
    if (kind == kPrompt)
      paged_core_cpu::configure_amx_tiles(paged_core_cpu::kAllTiles16Rows);
    else
      paged_core_cpu::configure_amx_tiles(paged_core_cpu::kDecodeTileRows,
                                          paged_core_cpu::kDecodeTileBytes);
    loaded_ = kind;
  }

 private:
  bool amx_;
  Kind loaded_ = kNone;
};
#endif

// What each thread of one bf16_tile_kernel call allocates: buffers for `rows` query rows
// (the call's widest job, in whole blocks of 16), and AMX prompt buffers only where a job
// takes them. Sized for the widest tile any call may have (kAmxTileQueries * G rows, ~200
// KiB a thread, zeroed), a decode call spent more time allocating and zeroing them than
// attending: one sequence of 16 keys in SmolLM2's shape took 9.7-9.9 us a call (from Python),
// 5.5-5.7 us with buffers for its own rows; 160 keys 13.5 against 9.8-9.9 us (Intel(R)
// Xeon(R) Processor, amx_bf16).
struct CallBuffers {
  int rows;
  bool amx_prompts;
};

CallBuffers call_buffers(const std::vector<Bf16Job>& jobs, int G, bool decode, bool amx) {
  constexpr int kBlockRows = 16;
  int widest = 0;
  bool prompts = false;
  for (const Bf16Job& job : jobs) {
    widest = std::max(widest, job.unit.nq * G);
    prompts = prompts || !(job.unit.nq == 1 && decode);
  }
  return {(widest + kBlockRows - 1) / kBlockRows * kBlockRows, amx && prompts};
}

// attention_kernel's tasks for bfloat16 with tiles (attention_tiles_bf16.h); needs
// head_dim % 32 == 0. Every unit's rows take vdpbf16ps, or with amx AMX tiles
// (attention_prompt_amx.h): one path for the whole call, so a query's bits never depend on
// the tile it shares. Threads take jobs in order; each claims its next job when it starts
// one, so the next job's first keys are prefetched while this one ends.
void bf16_tile_kernel(const Bf16Problem& pb, const std::vector<Task>& tasks,
                      const int32_t* seq_lens, const int32_t* qsl, int64_t num_kv_heads,
                      bool amx, bool decode_loop, int* error_flag) {
  const int nthreads = single_thread_us(tasks, num_kv_heads, pb.G, pb.D) < wake_worth_us()
                           ? 1 : std::max(1, at::get_num_threads());
  std::vector<Bf16Split> splits;
  size_t partial_floats = 0;
  const std::vector<Bf16Job> jobs = make_bf16_jobs(tasks, seq_lens, qsl, num_kv_heads, pb.window,
                                                   pb.G, pb.D, decode_loop, splits, partial_floats);
  // One-query units take the decode loop (attention_decode_bf16.h), with amx too (a decode's
  // G query rows would fill G of a tile's 16 rows: 30 SmolLM2 layers, 11 decodes of 250
  // tokens, 5.1 against 6.4 ms on the tiles, 2-core Xeon with AMX; with amx its scores come
  // from AMX tiles: 30 SmolLM2 layers of 11 / 46 decodes of 250 tokens and 46 of 500, 6.03 /
  // 20.76 / 43.42 against 6.28 / 21.60 / 45.91 ms from vdpbf16ps, interleaved in one process,
  // Intel(R) Xeon(R) Processor, best ISA amx_bf16), and prompt tiles cut
  // their keys by their query count (part_keys), unless the caller wants every query on the
  // tiles cut alike (batch-invariant mode: a prompt's last token comes alone in one schedule
  // and inside a chunk in another, and must give the same bits).
  const bool decode = decode_loop && paged_core_cpu::decode_rows_fit(pb.G, pb.D, pb.block_size);
  const CallBuffers sizes = call_buffers(jobs, pb.G, decode, amx);
  // Every slot is written before it is read: no need to zero the buffer.
  const std::unique_ptr<float[]> partials(partial_floats ? new float[partial_floats] : nullptr);
  const int64_t num_jobs = static_cast<int64_t>(jobs.size());
  struct alignas(64) Counter { int64_t value = 0; } next_job;  // a cache line of its own
#pragma omp parallel num_threads(nthreads)
  {
    paged_core_cpu::Bf16TileBuffers buffers(sizes.rows, pb.D);
#if PAGED_CORE_AMX_ATTENTION
    AmxTileUse tiles(amx);
    std::optional<paged_core_cpu::AmxPromptBuffers> prompt_buffers;
    if (sizes.amx_prompts) prompt_buffers.emplace(sizes.rows, pb.D);
#endif
    int64_t j = __atomic_fetch_add(&next_job.value, 1, __ATOMIC_RELAXED);
    while (j < num_jobs) {
      const int64_t after = __atomic_fetch_add(&next_job.value, 1, __ATOMIC_RELAXED);
      const Bf16Job& job = jobs[j];
      const Bf16Unit* next = after < num_jobs ? &jobs[after].unit : nullptr;
      bool ok;
      if (job.unit.nq == 1 && decode) {
#if PAGED_CORE_AMX_ATTENTION
        tiles.load(AmxTileUse::kDecode);
#endif
        ok = paged_core_cpu::decode_unit_dispatch(pb, job.unit, next, buffers, amx);
      }
#if PAGED_CORE_AMX_ATTENTION
      else if (amx) {
        tiles.load(AmxTileUse::kPrompt);
        ok = paged_core_cpu::amx_unit_run(pb, job.unit, next, buffers, *prompt_buffers);
      }
#endif
      else
        ok = paged_core_cpu::bf16_unit_run(pb, job.unit, next, buffers);
      if (!ok) {
        __atomic_store_n(error_flag, 2, __ATOMIC_RELAXED);
      } else if (job.slot < 0) {
        paged_core_cpu::bf16_unit_store(pb, job.unit, buffers);
      } else {
        paged_core_cpu::bf16_unit_save(job.unit, buffers, pb.G, partials.get() + job.slot);
        Bf16Split& split = splits[job.split];
        // The last part to finish sees every part's slot (acquire pairs with the others' release).
        if (__atomic_sub_fetch(&split.pending, 1, __ATOMIC_ACQ_REL) == 0)
          paged_core_cpu::bf16_combine(pb, split.tile, partials.get() + split.first, split.parts,
                                       split.stride);
      }
      j = after;
    }
  }
}
#endif  // PAGED_CORE_BF16_TILES

template <typename T, typename C>
void dispatch_dim(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                  const at::Tensor& query_start_loc, at::Tensor& out, const std::vector<Task>& tasks,
                  int64_t group, double scale, int64_t window, float soft_cap, int* error_flag) {
  const T* q = reinterpret_cast<const T*>(query.const_data_ptr());
  const C* k = reinterpret_cast<const C*>(k_cache.const_data_ptr());
  const C* v = reinterpret_cast<const C*>(v_cache.const_data_ptr());
  T* o = reinterpret_cast<T*>(out.mutable_data_ptr());
  const int64_t D = query.size(2);
#define PAGED_ATTENTION_CALL(KD)                                                               \
  attention_kernel<T, C, KD>(q, query.stride(0), query.stride(1), k, v,                        \
                          block_tables.const_data_ptr<int32_t>(), block_tables.stride(0),      \
                          seq_lens.const_data_ptr<int32_t>(),                                  \
                          query_start_loc.const_data_ptr<int32_t>(), o, tasks, k_cache.size(0), \
                          k_cache.size(1), k_cache.size(2), group, D, static_cast<float>(scale), \
                          window, soft_cap, error_flag)
  switch (D) {
    case 64: PAGED_ATTENTION_CALL(64); break;
    case 128: PAGED_ATTENTION_CALL(128); break;
    default: PAGED_ATTENTION_CALL(0); break;
  }
#undef PAGED_ATTENTION_CALL
}

// dispatch_dim for a quantized cache (kv_quant.h), by its dtype.
template <typename T>
void dispatch_quantized(const at::Tensor& query, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                        at::Tensor& out, const std::vector<Task>& tasks, int64_t group,
                        double scale, int64_t window, float soft_cap, int* error_flag) {
  switch (k_cache.scalar_type()) {
#define PAGED_ATTENTION_QUANTIZED(DTYPE, C)                                                     \
  case DTYPE:                                                                                  \
    dispatch_dim<T, C>(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,  \
                       tasks, group, scale, window, soft_cap, error_flag);                     \
    break;
    PAGED_ATTENTION_QUANTIZED(at::kChar, int8_t)
    PAGED_ATTENTION_QUANTIZED(at::kFloat8_e4m3fn, Fp8E4M3)
    PAGED_ATTENTION_QUANTIZED(at::kFloat8_e5m2, Fp8E5M2)
#undef PAGED_ATTENTION_QUANTIZED
    default: TORCH_CHECK(false, "unsupported KV cache dtype ", k_cache.scalar_type());
  }
}

bool is_quantized_cache(at::ScalarType t) {
  return t == at::kChar || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

// t as int32 with contiguous rows, as the kernel reads it: t itself where it already is (the
// engine's metadata), else a converted copy. Done here, not in the Python wrapper, whose
// per-tensor checks had cost 2.1 us a call (AMD EPYC family 25 model 17).
at::Tensor int32_rows(const at::Tensor& t) {
  return t.scalar_type() == at::kInt && t.dim() > 0 && t.stride(-1) == 1
             ? t : t.to(at::kInt).contiguous();
}

void paged_attention(const at::Tensor& query_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables_in, const at::Tensor& seq_lens_in,
                     const at::Tensor& query_start_loc_in, double scale, int64_t sliding_window,
                     double logits_soft_cap, at::Tensor& out, bool amx_tiles, bool decode_loop,
                     bool kv_first_line) {
  const at::Tensor query = query_in.dim() == 3 && query_in.stride(2) != 1 ? query_in.contiguous()
                                                                          : query_in;
  const at::Tensor block_tables = int32_rows(block_tables_in);
  const at::Tensor seq_lens = int32_rows(seq_lens_in);
  const at::Tensor query_start_loc = int32_rows(query_start_loc_in);
#if PAGED_CORE_AMX_ATTENTION
  const bool amx_granted = paged_core_cpu::bf16_amx_ready();
#else
  const bool amx_granted = false;
#endif
  TORCH_CHECK(!amx_tiles || amx_granted,
              "amx_tiles: this build has no AMX attention, or the CPU or OS grants no AMX tiles");
  TORCH_CHECK(query.dim() == 3, "query must be [num_tokens, num_heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4,
              "caches must be [num_kv_heads, num_blocks, block_size, head_dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache shapes differ");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu() &&
                  block_tables.device().is_cpu() && seq_lens.device().is_cpu() &&
                  query_start_loc.device().is_cpu() && out.device().is_cpu(),
              "paged_attention here is a CPU kernel: every tensor must be on the CPU");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "paged_attention supports float32 and bfloat16, got ", dtype);
  const auto cache_dtype = k_cache.scalar_type();
  const bool quantized = is_quantized_cache(cache_dtype);
  TORCH_CHECK((cache_dtype == dtype || quantized) && v_cache.scalar_type() == cache_dtype &&
                  out.scalar_type() == dtype,
              "query and out must share a dtype; the caches that one, or int8 / float8 "
              "(quantized rows), both alike");
  const int64_t num_tokens = query.size(0), Hq = query.size(1), D = query.size(2);
  const int64_t Hk = k_cache.size(0), S = seq_lens.size(0);
  TORCH_CHECK(k_cache.size(3) == (quantized ? D + 4 : D),
              "cache rows must be head_dim (quantized: head_dim + 4 scale bytes) long");
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0, "num query heads must be a multiple of num kv heads");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == query.sizes(), "out must be contiguous, like query");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == S,
              "block_tables must be [num_seqs, max_blocks]");
  TORCH_CHECK(seq_lens.dim() == 1, "seq_lens must be [num_seqs]");
  TORCH_CHECK(query_start_loc.dim() == 1 && query_start_loc.size(0) == S + 1,
              "query_start_loc must be [num_seqs + 1]");
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* qsl = query_start_loc.const_data_ptr<int32_t>();
  const int64_t max_keys = block_tables.size(1) * k_cache.size(2);
  TORCH_CHECK(qsl[0] == 0 && qsl[S] <= num_tokens,
              "query_start_loc must start at 0 and end within the query rows");
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s];
    TORCH_CHECK(q_len >= 0 && q_len <= sl[s], "sequence ", s, " has ", q_len,
                " new tokens but a context of ", sl[s], " (query_start_loc must be "
                "non-decreasing and seq_lens >= new tokens)");
    TORCH_CHECK(sl[s] <= max_keys, "seq_len ", sl[s], " of sequence ", s,
                " exceeds block_tables.size(1) * block_size = ", max_keys);
  }
  if (S == 0 || Hq == 0 || D == 0) return;
  const bool bf16_tiles = !quantized && dtype != at::kFloat && PAGED_CORE_BF16_TILES && D % 32 == 0;
  const int64_t narrow_tile = bf16_tiles ? kBf16TileQueries : TILE;
  TileQueries tiles{narrow_tile, narrow_tile, kAmxWideFrom, narrow_tile, kAmxWiderFrom};
  if (bf16_tiles && amx_tiles) {
    tiles.wide = kAmxTileQueries;
    const bool wider_fits = kAmxWiderTileQueries * Hq / Hk * D * 4 <= kAmxWiderOutputBytes;
    tiles.wider = wider_fits ? kAmxWiderTileQueries : kAmxTileQueries;
  }
  const std::vector<Task> tasks = make_tasks(sl, qsl, S, sliding_window, tiles);
  int error_flag = 0;
  if (quantized && dtype == at::kFloat) {
    dispatch_quantized<float>(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                              out, tasks, Hq / Hk, scale, sliding_window,
                              static_cast<float>(logits_soft_cap), &error_flag);
  } else if (quantized) {
    dispatch_quantized<uint16_t>(query, k_cache, v_cache, block_tables, seq_lens,
                                 query_start_loc, out, tasks, Hq / Hk, scale, sliding_window,
                                 static_cast<float>(logits_soft_cap), &error_flag);
  } else if (dtype == at::kFloat) {
    dispatch_dim<float, float>(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                               out, tasks, Hq / Hk, scale, sliding_window,
                               static_cast<float>(logits_soft_cap), &error_flag);
  } else if (bf16_tiles) {
#if PAGED_CORE_BF16_TILES
    const Bf16Problem pb{reinterpret_cast<const uint16_t*>(query.const_data_ptr()),
                         query.stride(0), query.stride(1),
                         reinterpret_cast<const uint16_t*>(k_cache.const_data_ptr()),
                         reinterpret_cast<const uint16_t*>(v_cache.const_data_ptr()),
                         block_tables.const_data_ptr<int32_t>(), block_tables.stride(0),
                         k_cache.size(1), k_cache.size(2), static_cast<int>(Hq / Hk),
                         static_cast<int>(D), static_cast<float>(scale), sliding_window,
                         static_cast<float>(logits_soft_cap),
                         reinterpret_cast<uint16_t*>(out.mutable_data_ptr()), Hq, kv_first_line};
    bf16_tile_kernel(pb, tasks, sl, qsl, Hk, amx_tiles, decode_loop, &error_flag);
#endif
  } else {
    dispatch_dim<uint16_t, uint16_t>(query, k_cache, v_cache, block_tables, seq_lens,
                                     query_start_loc, out, tasks, Hq / Hk, scale, sliding_window,
                                     static_cast<float>(logits_soft_cap), &error_flag);
  }
  TORCH_CHECK(error_flag != 2, "paged_attention: a block table entry is outside [0, num_blocks)");
}

}  // namespace

PAGED_CORE_LIBRARY(m) {
  m.def(
      "paged_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor query_start_loc, float scale, int sliding_window, "
      "float logits_soft_cap, "
      "Tensor(a!) out, bool amx_tiles=False, bool decode_loop=True, bool kv_first_line=False) -> ()");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(paged_attention));
}
