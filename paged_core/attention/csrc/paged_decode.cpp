// Fused paged-attention decode for CPU (one query token per sequence).
//
// Cache layout per layer: [num_kv_heads, num_blocks, block_size, head_dim],
// K and V separate, contiguous. For every (sequence, kv head) pair one OpenMP
// task walks the sequence's blocks, scores the G query heads of that kv head
// against each key, keeps an online (block-wise) softmax in float32 and
// accumulates p * v into a float32 [G, D] accumulator. bfloat16 inputs are
// widened to float32 on load; the output has the input dtype.
//
// Registered as torch.ops.paged_core_cpu.paged_decode (no pybind needed).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PAGED_DECODE_AVX2 1
#else
#define PAGED_DECODE_AVX2 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float bf16_bits_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Row of D elements -> float32. For float inputs returns the source pointer.
template <typename T>
struct Row;

template <>
struct Row<float> {
  static inline const float* load(const float* src, float* /*buf*/, int /*d*/) { return src; }
  static inline void store(float* dst, const float* src, float inv, int d) {
#pragma omp simd
    for (int i = 0; i < d; ++i) dst[i] = src[i] * inv;
  }
};

template <>
struct Row<uint16_t> {
  static inline const float* load(const uint16_t* src, float* buf, int d) {
#pragma omp simd
    for (int i = 0; i < d; ++i) buf[i] = bf16_bits_to_float(src[i]);
    return buf;
  }
  static inline void store(uint16_t* dst, const float* src, float inv, int d) {
    for (int i = 0; i < d; ++i) {
      c10::BFloat16 b(src[i] * inv);  // round to nearest even
      dst[i] = b.x;
    }
  }
};

#if PAGED_DECODE_AVX2
// 8 lanes of T -> float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (Cephes-style: 2^n * p(r)); relative error ~2e-7, exp(-inf) -> 0.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 is_tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(is_tiny, y);
}

// scores[j] = q . k[j] for j < cnt (keys rows of D floats/bf16 at k, stride D); D % 8 == 0.
template <typename T>
inline void qk_avx2(const float* q, const T* k, int cnt, int D, float* scores) {
  int j = 0;
  for (; j + 4 <= cnt; j += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const T* k0 = k + static_cast<int64_t>(j) * D;
    for (int d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k0 + D + d), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k0 + 2 * D + d), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k0 + 3 * D + d), a3);
    }
    // Reduce the four accumulators into four scores.
    __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
    __m256 h = _mm256_hadd_ps(h01, h23);  // lanes: [s0 s1 s2 s3 | s0' s1' s2' s3']
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(scores + j, r);
  }
  for (; j < cnt; ++j) {
    __m256 a = _mm256_setzero_ps();
    const T* kr = k + static_cast<int64_t>(j) * D;
    for (int d = 0; d < D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr + d), a);
    scores[j] = hsum8(a);
  }
}

// acc[0:D] += sum_j p[j] * v[j]; D % 8 == 0; accumulators held in registers 64 lanes at a time.
template <typename T>
inline void pv_avx2(const float* p, const T* v, int cnt, int D, float* acc) {
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + d0 + 8 * c);
    for (int j = 0; j < cnt; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const T* vr = v + static_cast<int64_t>(j) * D + d0;
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(pj, load8(vr + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + d0 + 8 * c, a[c]);
  }
  for (; d0 < D; d0 += 8) {
    __m256 a = _mm256_loadu_ps(acc + d0);
    for (int j = 0; j < cnt; ++j)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(v + static_cast<int64_t>(j) * D + d0), a);
    _mm256_storeu_ps(acc + d0, a);
  }
}
#endif  // PAGED_DECODE_AVX2

// KD > 0: head_dim known at compile time (full unrolling); KD == 0: runtime head_dim.
template <typename T, int KD>
void decode_kernel(const T* __restrict q_ptr, int64_t q_s_stride, int64_t q_h_stride,
                   const T* __restrict k_ptr, const T* __restrict v_ptr,
                   const int32_t* __restrict block_tables, int64_t bt_stride, int64_t max_blocks,
                   const int32_t* __restrict seq_lens, T* __restrict out_ptr,
                   int64_t num_seqs, int64_t num_kv_heads, int64_t num_blocks, int64_t block_size,
                   int64_t group, int64_t head_dim_rt, float scale, int64_t window,
                   int* error_flag) {
  const int D = KD > 0 ? KD : static_cast<int>(head_dim_rt);
  const int G = static_cast<int>(group);
  const int bs = static_cast<int>(block_size);
  const int64_t head_stride = num_blocks * block_size * D;  // cache stride of one kv head
  const int64_t block_stride = block_size * D;
  const int64_t num_heads = num_kv_heads * G;
  const int nthreads = std::max(1, at::get_num_threads());

#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> qf(static_cast<size_t>(G) * D);
    std::vector<float> acc(static_cast<size_t>(G) * D);
    const int bs_pad = (bs + 7) / 8 * 8;
    std::vector<float> scores(static_cast<size_t>(G) * bs_pad);
    std::vector<float> mx(G), sum(G);
    std::vector<float> rowbuf(D);

#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t s = 0; s < num_seqs; ++s) {
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int64_t n = seq_lens[s];
        T* o_base = out_ptr + (s * num_heads + h * G) * D;
        if (n <= 0) {
          for (int64_t i = 0; i < static_cast<int64_t>(G) * D; ++i) o_base[i] = T(0);
          continue;
        }
        if (n > max_blocks * block_size) {
          __atomic_store_n(error_flag, 1, __ATOMIC_RELAXED);
          continue;
        }
        const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        // Query heads h*G .. h*G+G-1, pre-scaled, as float32.
        for (int g = 0; g < G; ++g) {
          const T* qrow = q_ptr + s * q_s_stride + (h * G + g) * q_h_stride;
          const float* qf_src = Row<T>::load(qrow, rowbuf.data(), D);
          float* dst = qf.data() + static_cast<size_t>(g) * D;
#pragma omp simd
          for (int i = 0; i < D; ++i) dst[i] = qf_src[i] * scale;
          mx[g] = -std::numeric_limits<float>::infinity();
          sum[g] = 0.f;
        }
        std::fill(acc.begin(), acc.end(), 0.f);

        const int32_t* table = block_tables + s * bt_stride;
        const T* k_head = k_ptr + h * head_stride;
        const T* v_head = v_ptr + h * head_stride;
        bool bad = false;
        for (int64_t b = first / block_size; b * block_size < n; ++b) {
          const int64_t phys = table[b];
          if (phys < 0 || phys >= num_blocks) { bad = true; break; }
          const int lo = static_cast<int>(std::max<int64_t>(first - b * block_size, 0));
          const int hi = static_cast<int>(std::min<int64_t>(n - b * block_size, block_size));
          const int cnt = hi - lo;
          const T* kb = k_head + phys * block_stride;
          const T* vb = v_head + phys * block_stride;
#if PAGED_DECODE_AVX2
          // Blocks are scattered: prefetch the next one's K and V while this one is computed.
          if ((b + 1) * block_size < n) {
            const int64_t nphys = table[b + 1];
            if (nphys >= 0 && nphys < num_blocks) {
              const char* nk = reinterpret_cast<const char*>(k_head + nphys * block_stride);
              const char* nv = reinterpret_cast<const char*>(v_head + nphys * block_stride);
              const int64_t bytes = block_stride * static_cast<int64_t>(sizeof(T));
              for (int64_t off = 0; off < bytes; off += 64) {
                _mm_prefetch(nk + off, _MM_HINT_T0);
                _mm_prefetch(nv + off, _MM_HINT_T0);
              }
            }
          }
#endif
          // Scores [G, cnt].
#if PAGED_DECODE_AVX2
          if (D % 8 == 0) {
            for (int g = 0; g < G; ++g)
              qk_avx2(qf.data() + static_cast<size_t>(g) * D, kb + static_cast<int64_t>(lo) * D, cnt, D,
                      scores.data() + static_cast<size_t>(g) * bs_pad);
          } else
#endif
          for (int j = 0; j < cnt; ++j) {
            const float* kr = Row<T>::load(kb + static_cast<int64_t>(lo + j) * D, rowbuf.data(), D);
            for (int g = 0; g < G; ++g) {
              const float* qg = qf.data() + static_cast<size_t>(g) * D;
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int i = 0; i < D; ++i) dot += qg[i] * kr[i];
              scores[static_cast<size_t>(g) * bs_pad + j] = dot;
            }
          }
          // Online softmax update, block-wise.
          for (int g = 0; g < G; ++g) {
            float* sg = scores.data() + static_cast<size_t>(g) * bs_pad;
            float bm = sg[0];
            for (int j = 1; j < cnt; ++j) bm = std::max(bm, sg[j]);
            const float m_new = std::max(mx[g], bm);
            if (m_new > mx[g]) {
              const float alpha = std::exp(mx[g] - m_new);  // 0 on the first block
              sum[g] *= alpha;
              float* ag = acc.data() + static_cast<size_t>(g) * D;
#pragma omp simd
              for (int i = 0; i < D; ++i) ag[i] *= alpha;
              mx[g] = m_new;
            }
            float bsum = 0.f;
            int j0 = 0;
#if PAGED_DECODE_AVX2
            const __m256 mv = _mm256_set1_ps(m_new);
            for (; j0 + 8 <= cnt; j0 += 8)
              _mm256_storeu_ps(sg + j0, exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j0), mv)));
            for (int j = 0; j < j0; ++j) bsum += sg[j];
#endif
            for (int j = j0; j < cnt; ++j) {
              const float p = std::exp(sg[j] - m_new);
              sg[j] = p;
              bsum += p;
            }
            sum[g] += bsum;
          }
          // acc[g] += p[g, j] * v[j].
#if PAGED_DECODE_AVX2
          if (D % 8 == 0) {
            for (int g = 0; g < G; ++g)
              pv_avx2(scores.data() + static_cast<size_t>(g) * bs_pad, vb + static_cast<int64_t>(lo) * D,
                      cnt, D, acc.data() + static_cast<size_t>(g) * D);
          } else
#endif
          for (int j = 0; j < cnt; ++j) {
            const float* vr = Row<T>::load(vb + static_cast<int64_t>(lo + j) * D, rowbuf.data(), D);
            for (int g = 0; g < G; ++g) {
              const float p = scores[static_cast<size_t>(g) * bs_pad + j];
              float* ag = acc.data() + static_cast<size_t>(g) * D;
#pragma omp simd
              for (int i = 0; i < D; ++i) ag[i] += p * vr[i];
            }
          }
        }
        if (bad) {
          __atomic_store_n(error_flag, 2, __ATOMIC_RELAXED);
          continue;
        }
        for (int g = 0; g < G; ++g) {
          Row<T>::store(o_base + static_cast<int64_t>(g) * D, acc.data() + static_cast<size_t>(g) * D,
                        1.f / sum[g], D);
        }
      }
    }
  }
}

template <typename T>
void dispatch_dim(int64_t D, const at::Tensor& query, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, at::Tensor& out, int64_t group, double scale,
                  int64_t window, int* error_flag) {
  const T* q = reinterpret_cast<const T*>(query.const_data_ptr());
  const T* k = reinterpret_cast<const T*>(k_cache.const_data_ptr());
  const T* v = reinterpret_cast<const T*>(v_cache.const_data_ptr());
  T* o = reinterpret_cast<T*>(out.mutable_data_ptr());
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int64_t S = query.size(0), Hk = k_cache.size(0), NB = k_cache.size(1),
                bs = k_cache.size(2);
#define PAGED_DECODE_CALL(KD)                                                                  \
  decode_kernel<T, KD>(q, query.stride(0), query.stride(1), k, v, bt, block_tables.stride(0), \
                       block_tables.size(1), sl, o, S, Hk, NB, bs, group, D,                  \
                       static_cast<float>(scale), window, error_flag)
  switch (D) {
    case 64: PAGED_DECODE_CALL(64); break;
    case 128: PAGED_DECODE_CALL(128); break;
    default: PAGED_DECODE_CALL(0); break;
  }
#undef PAGED_DECODE_CALL
}

void paged_decode(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                  int64_t sliding_window, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3, "query must be [S, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4, "caches must be [Hk, NB, bs, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache shapes differ");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "paged_decode is a CPU kernel");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "paged_decode supports float32 and bfloat16, got ", dtype);
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype &&
                  out.scalar_type() == dtype,
              "query, caches and out must share a dtype");
  const int64_t S = query.size(0), Hq = query.size(1), D = query.size(2);
  const int64_t Hk = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == D, "head_dim of query and cache differ");
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0, "num query heads must be a multiple of num kv heads");
  TORCH_CHECK(query.stride(2) == 1, "query's last dim must be contiguous");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == query.sizes(), "out must be contiguous, like query");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == S &&
                  block_tables.scalar_type() == at::kInt && block_tables.stride(1) == 1,
              "block_tables must be int32 [S, max_blocks] with contiguous rows");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == S && seq_lens.scalar_type() == at::kInt &&
                  seq_lens.is_contiguous(),
              "seq_lens must be contiguous int32 [S]");
  if (S == 0 || Hq == 0 || D == 0) return;
  int error_flag = 0;
  if (dtype == at::kFloat) {
    dispatch_dim<float>(D, query, k_cache, v_cache, block_tables, seq_lens, out, Hq / Hk, scale,
                        sliding_window, &error_flag);
  } else {
    dispatch_dim<uint16_t>(D, query, k_cache, v_cache, block_tables, seq_lens, out, Hq / Hk, scale,
                           sliding_window, &error_flag);
  }
  TORCH_CHECK(error_flag != 1, "paged_decode: a seq_len exceeds block_tables.size(1) * block_size");
  TORCH_CHECK(error_flag != 2, "paged_decode: a block table entry is outside [0, num_blocks)");
}

}  // namespace

TORCH_LIBRARY(paged_core_cpu, m) {
  m.def(
      "paged_decode(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, float scale, int sliding_window, Tensor(a!) out) -> ()");
  m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(paged_decode));
}
