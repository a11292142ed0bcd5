// LoRA products of a step whose rows run different adapters (Punica's shrink / expand,
// one call per projection for every adapter in the step):
//
//   lora_shrink: u[t, :w] = a[s, :w] . x[t]          (u float32 [T, W], zero elsewhere)
//   lora_expand: y[t] = dtype(y[t] + sum_k u[t, k] b_t[s, k])   for k < w
//   lora_apply:  both, u kept per job (a projection that needs no all-reduce between them)
//
// with s = token_slots[t] the row's adapter slot (-1: none, the row is left alone) and
// w = widths[s] the columns its adapter uses (0: none). Tables are contiguous, float32 or
// bfloat16 (LoRALinear's table dtype: the model's; widened to float32 as they are loaded, so
// a bfloat16 table costs half the memory traffic and the same arithmetic): a [S, W, in]
// (lora/layers.py's LoRALinear.a), b_t [S, W, out] (its b_t, B transposed so a row's expand
// is a sum of contiguous output rows). x and y are float32 or bfloat16 rows (contiguous last
// dim); only the first T rows are read or written (the step's padding rows past token_slots
// stay as they are). Products sum in float32; each y element is rounded once. lora_apply
// gives the bits of lora_shrink then lora_expand.
//
// A fused projection's b_t is block-diagonal (LoRALinear stacks its parts, e.g. q, k and v):
// part_starts (P + 1 output column boundaries) says so, and expand multiplies only part p's
// columns [part_starts[p], part_starts[p + 1]) by its rows k in [p w/P, (p + 1) w/P), the
// rest of b_t being zero (one part: the whole table).
//
// A slot with few rows in the step (decodes under many adapters) runs in this file's row
// kernels. A job is a group of one slot's rows (a share of them when threads split it), taken
// kRowsPerBlock at a time in registers against each piece of the slot's tables in turn, so
// every piece is read once per group while it serves all the group's rows; one job needs no
// other (lora_apply: its shrink then its expand). A call deals its jobs out between threads,
// by their multiply-adds, only when it is big enough to pay for waking them.
// A slot with kGemmRows rows or more (a prompt's chunk, a batch under one adapter) runs as
// one ATen GEMM pair over its gathered rows instead, whose blocked GEMM is several times
// faster there.
// Registered as torch.ops.paged_core_cpu_<level>.lora_shrink / lora_expand / lora_apply;
// decoder_stack.cpp calls the same functions (lora_products.h), so both paths give the same bits.
#include "lora_products.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "cpu_common.h"
#include "cpu_simd.h"

namespace {

using paged_core_cpu::Elem;

constexpr int kRowsPerBlock = 4;  // rows whose sums sit in registers together
constexpr int64_t kColumnsPerBlock = 512;  // expand: output columns of b_t taken at a time
// Below this many multiply-adds (~50 us on one AVX2 core) a call stays on one thread: waking
// a sleeping one (OMP_WAIT_POLICY=PASSIVE) costs ~20 us, measured on a 2-core AVX2 EPYC.
constexpr int64_t kMinParallelMacs = 1 << 20;
constexpr size_t kGemmRows = 32;  // a slot with this many rows runs as ATen GEMMs

// A slot's rows in the step (fewer than kGemmRows), for the row kernels.
struct SlotRows {
  int64_t slot;
  std::vector<int64_t> rows;
};

// A slot's rows gathered for ATen GEMMs.
struct GemmSlot {
  int64_t slot;
  at::Tensor rows;  // int64 row indices
};

// How a call runs: slots with few rows in the row kernels, slots with many as GEMMs (rows
// with no adapter, and slots with no adapter, in neither).
struct Plan {
  std::vector<SlotRows> slots;
  std::vector<GemmSlot> gemms;
};

Plan make_plan(const at::Tensor& token_slots, const std::vector<int64_t>& widths) {
  const int64_t* slots = token_slots.const_data_ptr<int64_t>();
  const int64_t num_slots = static_cast<int64_t>(widths.size());
  std::vector<std::vector<int64_t>> by_slot(num_slots);
  for (int64_t t = 0; t < token_slots.size(0); ++t) {
    const int64_t s = slots[t];
    TORCH_CHECK(s >= -1 && s < num_slots, "token_slots[", t, "] = ", s, " is not -1 or a slot < ",
                num_slots);
    if (s >= 0 && widths[s] > 0) by_slot[s].push_back(t);
  }
  Plan plan;
  for (int64_t s = 0; s < num_slots; ++s) {
    std::vector<int64_t>& rows = by_slot[s];
    if (rows.size() >= kGemmRows) {
      const int64_t n = static_cast<int64_t>(rows.size());
      plan.gemms.push_back({s, at::from_blob(rows.data(), {n}, at::kLong).clone()});
      continue;
    }
    if (!rows.empty()) plan.slots.push_back({s, std::move(rows)});
  }
  return plan;
}

void check_tables(const at::Tensor& table, const std::vector<int64_t>& widths, const char* name) {
  TORCH_CHECK(table.dim() == 3 && table.is_contiguous() &&
                  (table.scalar_type() == at::kFloat || table.scalar_type() == at::kBFloat16),
              name, " must be a contiguous float32 or bfloat16 [slots, width, features] table");
  TORCH_CHECK(static_cast<int64_t>(widths.size()) == table.size(0), "one width per slot of ",
              name);
  for (int64_t w : widths)
    TORCH_CHECK(w >= 0 && w <= table.size(1), "a width of ", w, " does not fit ", name, "'s ",
                table.size(1), " columns");
}

void check_rows(const at::Tensor& x, int64_t rows, int64_t features, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= rows && x.size(1) == features && x.stride(1) == 1,
              name, " must be [rows >= ", rows, ", ", features, "] with a contiguous last dim");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16");
}

#if PAGED_CORE_AVX2
inline __m256 load8_elems(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_elems(const uint16_t* p) { return paged_core_cpu::load8(p); }
inline void store8_elems(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// 8 float32 -> bfloat16 bits, rounded as float_to_bf16_bits rounds (nearest even, NaN quiet).
inline void store8_elems(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), paged_core_cpu::bf16_bits8_rne(v));
}
#endif

// out[j * R + r] = dot(a[j * lda + 0:n], x[r][0:n]) for J table rows (float32 or bfloat16
// TA) and R rows of x (float32): every 8 lanes loaded serve J * R products.
template <int J, int R, typename TA>
inline void dots(const TA* a, int64_t lda, const float* const* x, int64_t n, float* out) {
  int64_t i = 0;
  for (int q = 0; q < J * R; ++q) out[q] = 0.f;
#if PAGED_CORE_AVX2
  __m256 acc[J][R];
  for (int j = 0; j < J; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 av[J];
    for (int j = 0; j < J; ++j) av[j] = load8_elems(a + j * lda + i);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x[r] + i);
      for (int j = 0; j < J; ++j) acc[j][r] = _mm256_fmadd_ps(av[j], xv, acc[j][r]);
    }
  }
  for (int j = 0; j < J; ++j)
    for (int r = 0; r < R; ++r) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[j][r]), _mm256_extractf128_ps(acc[j][r], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      out[j * R + r] = _mm_cvtss_f32(s);
    }
#endif
  for (; i < n; ++i)
    for (int j = 0; j < J; ++j)
      for (int r = 0; r < R; ++r) out[j * R + r] += Elem<TA>::load(a[j * lda + i]) * x[r][i];
}

// y[r][0:n] = T(y[r][0:n] + sum_k u[r][k] * b[k * ld + 0:n]) for k < w, for R rows (b's
// elements TB: float32 or bfloat16).
template <int R, typename T, typename TB>
inline void add_combination(const TB* b, int64_t ld, const float* const* u, int64_t w,
                            int64_t n, T* const* y) {
  int64_t o = 0;
#if PAGED_CORE_AVX2
  for (; o + 16 <= n; o += 16) {  // two column vectors: each broadcast of u serves both
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w; ++k) {
      const __m256 b0 = load8_elems(b + k * ld + o), b1 = load8_elems(b + k * ld + o + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 uk = _mm256_set1_ps(u[r][k]);
        lo[r] = _mm256_fmadd_ps(uk, b0, lo[r]);
        hi[r] = _mm256_fmadd_ps(uk, b1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      store8_elems(y[r] + o, _mm256_add_ps(load8_elems(y[r] + o), lo[r]));
      store8_elems(y[r] + o + 8, _mm256_add_ps(load8_elems(y[r] + o + 8), hi[r]));
    }
  }
  for (; o + 8 <= n; o += 8) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w; ++k) {
      const __m256 bv = load8_elems(b + k * ld + o);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(u[r][k]), bv, acc[r]);
    }
    for (int r = 0; r < R; ++r)
      store8_elems(y[r] + o, _mm256_add_ps(load8_elems(y[r] + o), acc[r]));
  }
#endif
  for (; o < n; ++o)
    for (int r = 0; r < R; ++r) {
      float sum = 0.f;
      for (int64_t k = 0; k < w; ++k) sum += u[r][k] * Elem<TB>::load(b[k * ld + o]);
      y[r][o] = Elem<T>::store(Elem<T>::load(y[r][o]) + sum);
    }
}

// f<R>(args...) for a block's row count R (1 .. kRowsPerBlock), with registers for R rows.
template <template <int> class F, typename... Args>
inline void for_rows(int rows, Args&&... args) {
  static_assert(kRowsPerBlock == 4, "one case per row count");
  switch (rows) {
    case 1: return F<1>::run(args...);
    case 2: return F<2>::run(args...);
    case 3: return F<3>::run(args...);
    default: return F<4>::run(args...);
  }
}

template <int J, typename TA>
struct Dots {
  template <int R>
  struct Rows {
    static void run(const TA* a, int64_t lda, const float* const* x, int64_t n, float* out) {
      dots<J, R, TA>(a, lda, x, n, out);
    }
  };
};

template <typename T, typename TB>
struct AddCombination {
  template <int R>
  struct Rows {
    static void run(const TB* b, int64_t ld, const float* const* u, int64_t w, int64_t n,
                    T* const* y) {
      add_combination<R, T, TB>(b, ld, u, w, n, y);
    }
  };
};

// Whether a tensor holds bfloat16 (as uint16_t bits) rather than float32.
inline bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

// f(T{}, TT{}) with T the rows' element type and TT the tables' (float, or uint16_t for
// bfloat16 bits).
template <typename F>
void with_types(bool rows_bf16, bool tables_bf16, F&& f) {
  if (rows_bf16 && tables_bf16) return f(uint16_t{}, uint16_t{});
  if (rows_bf16) return f(uint16_t{}, float{});
  if (tables_bf16) return f(float{}, uint16_t{});
  return f(float{}, float{});
}

// A job of the row kernels: `count` rows of one slot, shrunk and expanded by one thread.
struct RowGroup {
  int64_t slot;
  const int64_t* rows;
  int64_t count;
};

// The plan's row-kernel slots as jobs, and which thread runs which.
struct RowJobs {
  std::vector<RowGroup> groups;
  std::vector<std::vector<size_t>> by_thread;  // one list: all on the calling thread
};

// Jobs of at most ceil(rows / threads) of one slot's rows (at least kRowsPerBlock), each
// slot's rows cut into groups of about equal size: every group reads its slot's whole
// tables, so a slot is cut only as far as the threads need. The groups are dealt out largest
// first, each to the least loaded thread (a prompt's chunk beside decodes makes slots of very
// unequal size). Threads are woken only when the call's multiply-adds (macs_per_row_column
// per row and table column) pay for it.
RowJobs row_jobs(const std::vector<SlotRows>& slots, const std::vector<int64_t>& widths,
                 int64_t macs_per_row_column) {
  int64_t total_rows = 0, total_macs = 0;
  for (const SlotRows& s : slots) {
    total_rows += static_cast<int64_t>(s.rows.size());
    total_macs += static_cast<int64_t>(s.rows.size()) * widths[s.slot] * macs_per_row_column;
  }
  const int64_t threads = total_macs < kMinParallelMacs ? 1 : at::get_num_threads();
  const int64_t max_rows = std::max<int64_t>(kRowsPerBlock, (total_rows + threads - 1) / threads);
  RowJobs jobs;
  std::vector<int64_t> cost;
  for (const SlotRows& s : slots) {
    const int64_t rows = static_cast<int64_t>(s.rows.size());
    const int64_t pieces = (rows + max_rows - 1) / max_rows;
    const int64_t per_group = (rows + pieces - 1) / pieces;
    for (int64_t r = 0; r < rows; r += per_group) {
      jobs.groups.push_back({s.slot, s.rows.data() + r, std::min(per_group, rows - r)});
      cost.push_back(jobs.groups.back().count * widths[s.slot]);
    }
  }
  std::vector<size_t> order(jobs.groups.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t i, size_t j) { return cost[i] > cost[j]; });
  jobs.by_thread.assign(std::max<size_t>(1, std::min<size_t>(threads, order.size())), {});
  std::vector<int64_t> load(jobs.by_thread.size(), 0);
  for (size_t g : order) {
    const size_t t = std::min_element(load.begin(), load.end()) - load.begin();
    jobs.by_thread[t].push_back(g);
    load[t] += cost[g];
  }
  return jobs;
}

// job(group) for every group, each on its thread.
template <typename Job>
void run_jobs(const RowJobs& jobs, const Job& job) {
  if (jobs.by_thread.size() == 1) {
    for (size_t g : jobs.by_thread[0]) job(jobs.groups[g]);
    return;
  }
  const int64_t threads = static_cast<int64_t>(jobs.by_thread.size());
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (size_t g : jobs.by_thread[t]) job(jobs.groups[g]);
  });
}

// ug[r * w + k] = a[k] . x[rows[r]] for the group's rows r and the slot's first w table rows
// (a: the slot's [W, in] table).
template <typename T, typename TA>
void shrink_group(const T* x, int64_t ldx, const TA* a, int64_t in, int64_t w,
                  const RowGroup& group, float* ug) {
  std::vector<float> widened(group.count * in);  // the group's rows as float32
  for (int64_t r = 0; r < group.count; ++r) {
    const T* src = x + group.rows[r] * ldx;
    for (int64_t j = 0; j < in; ++j) widened[r * in + j] = Elem<T>::load(src[j]);
  }
  const float* rows[kRowsPerBlock];
  float out[2 * kRowsPerBlock];
  for (int64_t k = 0; k < w; k += 2) {  // two table rows, kept in L1 while they serve every row
    const int pair = static_cast<int>(std::min<int64_t>(2, w - k));
    for (int64_t r0 = 0; r0 < group.count; r0 += kRowsPerBlock) {
      const int block = static_cast<int>(std::min<int64_t>(kRowsPerBlock, group.count - r0));
      for (int r = 0; r < block; ++r) rows[r] = widened.data() + (r0 + r) * in;
      if (pair == 2) {
        for_rows<Dots<2, TA>::template Rows>(block, a + k * in, in, rows, in, out);
      } else {
        for_rows<Dots<1, TA>::template Rows>(block, a + k * in, in, rows, in, out);
      }
      for (int j = 0; j < pair; ++j)
        for (int r = 0; r < block; ++r) ug[(r0 + r) * w + k + j] = out[j * block + r];
    }
  }
}

// y[rows[r]] = T(y[rows[r]] + ug[r] . b_t) for the group's rows r, each part's output columns
// multiplied by its own w / P table rows (b_t: the slot's [W, out] table, block-diagonal).
template <typename T, typename TB>
void expand_group(T* y, int64_t ldy, const TB* b_t, int64_t out, int64_t w,
                  const std::vector<int64_t>& part_starts, const RowGroup& group,
                  const float* ug) {
  const int64_t parts = static_cast<int64_t>(part_starts.size()) - 1, rank = w / parts;
  const float* u_rows[kRowsPerBlock];
  T* y_rows[kRowsPerBlock];
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t c = part_starts[p]; c < part_starts[p + 1]; c += kColumnsPerBlock) {
      const int64_t size = std::min(kColumnsPerBlock, part_starts[p + 1] - c);
      const TB* b = b_t + p * rank * out + c;  // stays in L2 while it serves every row
      for (int64_t r0 = 0; r0 < group.count; r0 += kRowsPerBlock) {
        const int block = static_cast<int>(std::min<int64_t>(kRowsPerBlock, group.count - r0));
        for (int r = 0; r < block; ++r) {
          u_rows[r] = ug + (r0 + r) * w + p * rank;
          y_rows[r] = y + group.rows[r0 + r] * ldy + c;
        }
        for_rows<AddCombination<T, TB>::template Rows>(block, b, out, u_rows, rank, size, y_rows);
      }
    }
  }
}

// A GEMM slot's u rows: float32 [n, w] (ATen's blocked GEMM).
at::Tensor gemm_shrink(const at::Tensor& x, const at::Tensor& a, int64_t w, const GemmSlot& g) {
  const at::Tensor rows = x.index_select(0, g.rows).to(at::kFloat);
  return at::mm(rows, a[g.slot].narrow(0, 0, w).to(at::kFloat).t());
}

// y[g.rows] = dtype(y[g.rows] + us . b_t[g.slot]) part by part (us: contiguous float32 [n, w]);
// each y element rounded once.
void gemm_expand(at::Tensor& y, const at::Tensor& us, const at::Tensor& b_t,
                 const std::vector<int64_t>& part_starts, const GemmSlot& g) {
  const int64_t parts = static_cast<int64_t>(part_starts.size()) - 1, rank = us.size(1) / parts;
  at::Tensor sum = y.index_select(0, g.rows).to(at::kFloat);
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t c0 = part_starts[p], n = part_starts[p + 1] - c0;
    const at::Tensor block = b_t[g.slot].narrow(0, p * rank, rank).narrow(1, c0, n);
    sum.narrow(1, c0, n).add_(at::mm(us.narrow(1, p * rank, rank), block.to(at::kFloat)));
  }
  y.index_copy_(0, g.rows, sum.to(y.scalar_type()));
}

void check_token_slots(const at::Tensor& token_slots) {
  TORCH_CHECK(token_slots.dim() == 1 && token_slots.scalar_type() == at::kLong &&
                  token_slots.is_contiguous(),
              "token_slots must be a contiguous int64 [rows] tensor");
}

void check_expand_tables(const at::Tensor& b_t, const std::vector<int64_t>& widths,
                         const std::vector<int64_t>& part_starts) {
  check_tables(b_t, widths, "b_t");
  const int64_t parts = static_cast<int64_t>(part_starts.size()) - 1;
  TORCH_CHECK(parts >= 1 && part_starts.front() == 0 && part_starts.back() == b_t.size(2) &&
                  std::is_sorted(part_starts.begin(), part_starts.end()),
              "part_starts must rise from 0 to b_t's ", b_t.size(2), " output columns");
  for (int64_t w : widths)
    TORCH_CHECK(w % parts == 0, "a width of ", w, " is not a multiple of the ", parts, " parts");
}

// An expand's multiply-adds per row and table column, on average over the parts: each of a
// part's w / P table rows meets that part's columns, out / P of them per part on average.
int64_t expand_macs_per_table_column(const at::Tensor& b_t,
                                     const std::vector<int64_t>& part_starts) {
  return b_t.size(2) / (static_cast<int64_t>(part_starts.size()) - 1);
}

}  // namespace

namespace paged_core_cpu {

at::Tensor lora_shrink(const at::Tensor& x, const at::Tensor& a, const std::vector<int64_t>& widths,
                       const at::Tensor& token_slots) {
  check_token_slots(token_slots);
  check_tables(a, widths, "a");
  check_rows(x, token_slots.size(0), a.size(2), "x");
  const int64_t W = a.size(1), in = a.size(2);
  at::Tensor u = at::zeros({token_slots.size(0), W}, a.options().dtype(at::kFloat));
  const Plan plan = make_plan(token_slots, widths);
  const RowJobs jobs = row_jobs(plan.slots, widths, in);
  float* up = u.mutable_data_ptr<float>();
  with_types(is_bf16(x), is_bf16(a), [&](auto row_type, auto table_type) {
    using T = decltype(row_type);
    using TA = decltype(table_type);
    const T* xp = reinterpret_cast<const T*>(x.const_data_ptr());
    const TA* ap = reinterpret_cast<const TA*>(a.const_data_ptr());
    run_jobs(jobs, [&](const RowGroup& g) {
      const int64_t w = widths[g.slot];
      std::vector<float> ug(g.count * w);
      shrink_group(xp, x.stride(0), ap + g.slot * W * in, in, w, g, ug.data());
      for (int64_t r = 0; r < g.count; ++r)
        std::copy_n(ug.data() + r * w, w, up + g.rows[r] * W);
    });
  });
  for (const GemmSlot& g : plan.gemms)
    u.narrow(1, 0, widths[g.slot]).index_copy_(0, g.rows, gemm_shrink(x, a, widths[g.slot], g));
  return u;
}

void lora_expand(at::Tensor& y, const at::Tensor& u, const at::Tensor& b_t,
                 const std::vector<int64_t>& widths, const std::vector<int64_t>& part_starts,
                 const at::Tensor& token_slots) {
  check_token_slots(token_slots);
  check_expand_tables(b_t, widths, part_starts);
  TORCH_CHECK(u.dim() == 2 && u.scalar_type() == at::kFloat && u.is_contiguous() &&
                  u.size(0) == token_slots.size(0) && u.size(1) == b_t.size(1),
              "u must be lora_shrink's contiguous float32 [rows, width]");
  check_rows(y, token_slots.size(0), b_t.size(2), "y");
  const int64_t W = b_t.size(1), out = b_t.size(2);
  const Plan plan = make_plan(token_slots, widths);
  const RowJobs jobs =
      row_jobs(plan.slots, widths, expand_macs_per_table_column(b_t, part_starts));
  const float* up = u.const_data_ptr<float>();
  with_types(is_bf16(y), is_bf16(b_t), [&](auto row_type, auto table_type) {
    using T = decltype(row_type);
    using TB = decltype(table_type);
    T* yp = reinterpret_cast<T*>(y.mutable_data_ptr());
    const TB* bp = reinterpret_cast<const TB*>(b_t.const_data_ptr());
    run_jobs(jobs, [&](const RowGroup& g) {
      const int64_t w = widths[g.slot];
      std::vector<float> ug(g.count * w);
      for (int64_t r = 0; r < g.count; ++r) std::copy_n(up + g.rows[r] * W, w, ug.data() + r * w);
      expand_group(yp, y.stride(0), bp + g.slot * W * out, out, w, part_starts, g, ug.data());
    });
  });
  for (const GemmSlot& g : plan.gemms) {
    const at::Tensor us = u.index_select(0, g.rows).narrow(1, 0, widths[g.slot]).contiguous();
    gemm_expand(y, us, b_t, part_starts, g);
  }
}

void lora_apply(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b_t,
                const std::vector<int64_t>& widths, const std::vector<int64_t>& part_starts,
                const at::Tensor& token_slots) {
  check_token_slots(token_slots);
  check_tables(a, widths, "a");
  check_expand_tables(b_t, widths, part_starts);
  TORCH_CHECK(a.size(0) == b_t.size(0) && a.size(1) == b_t.size(1) &&
                  a.scalar_type() == b_t.scalar_type(),
              "a and b_t must be tables of the same slots, width and dtype");
  check_rows(x, token_slots.size(0), a.size(2), "x");
  check_rows(y, token_slots.size(0), b_t.size(2), "y");
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "x and y must have one dtype");
  const int64_t W = a.size(1), in = a.size(2), out = b_t.size(2);
  const Plan plan = make_plan(token_slots, widths);
  const RowJobs jobs =
      row_jobs(plan.slots, widths, in + expand_macs_per_table_column(b_t, part_starts));
  with_types(is_bf16(x), is_bf16(a), [&](auto row_type, auto table_type) {
    using T = decltype(row_type);
    using TT = decltype(table_type);
    const T* xp = reinterpret_cast<const T*>(x.const_data_ptr());
    T* yp = reinterpret_cast<T*>(y.mutable_data_ptr());
    const TT* ap = reinterpret_cast<const TT*>(a.const_data_ptr());
    const TT* bp = reinterpret_cast<const TT*>(b_t.const_data_ptr());
    run_jobs(jobs, [&](const RowGroup& g) {
      const int64_t w = widths[g.slot];
      std::vector<float> ug(g.count * w);
      shrink_group(xp, x.stride(0), ap + g.slot * W * in, in, w, g, ug.data());
      expand_group(yp, y.stride(0), bp + g.slot * W * out, out, w, part_starts, g, ug.data());
    });
  });
  for (const GemmSlot& g : plan.gemms)
    gemm_expand(y, gemm_shrink(x, a, widths[g.slot], g), b_t, part_starts, g);
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  m.def("lora_shrink(Tensor x, Tensor a, int[] widths, Tensor token_slots) -> Tensor");
  m.def("lora_expand(Tensor(a!) y, Tensor u, Tensor b_t, int[] widths, int[] part_starts, "
        "Tensor token_slots) -> ()");
  m.def("lora_apply(Tensor(a!) y, Tensor x, Tensor a, Tensor b_t, int[] widths, "
        "int[] part_starts, Tensor token_slots) -> ()");
  m.impl("lora_shrink", c10::DispatchKey::CPU,
         [](const at::Tensor& x, const at::Tensor& a, c10::IntArrayRef widths,
            const at::Tensor& token_slots) {
           return paged_core_cpu::lora_shrink(x, a, widths.vec(), token_slots);
         });
  m.impl("lora_expand", c10::DispatchKey::CPU,
         [](at::Tensor& y, const at::Tensor& u, const at::Tensor& b_t, c10::IntArrayRef widths,
            c10::IntArrayRef part_starts, const at::Tensor& token_slots) {
           paged_core_cpu::lora_expand(y, u, b_t, widths.vec(), part_starts.vec(), token_slots);
         });
  m.impl("lora_apply", c10::DispatchKey::CPU,
         [](at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b_t,
            c10::IntArrayRef widths, c10::IntArrayRef part_starts, const at::Tensor& token_slots) {
           paged_core_cpu::lora_apply(y, x, a, b_t, widths.vec(), part_starts.vec(), token_slots);
         });
}
