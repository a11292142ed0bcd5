// Fused elementwise ops of the Llama family for CPU, each one pass over its rows
// instead of the 4-10 tensor ops (and temporaries) of the plain-torch version.
// They round exactly where torch rounds a bfloat16 op's result, so they match the
// plain-torch ops up to the last bit of the float32 sum of squares in RMSNorm.
//
// - rms_norm(x, weight, eps, out):            out = weight * T(x * rsqrt(mean(x^2) + eps))
// - add_rms_norm(residual, x, weight, eps, out): residual = T(residual + x); out = rms_norm(residual)
// - rotary_embedding(q, k, positions, cos, sin): in place, rotate-half convention,
//   x = T(T(x * cos) + T(rotate_half(x) * sin)) with cos/sin rows picked by position, over
//   the first rotary_dim (the tables' width) dims of each head, the rest left as they are.
// - silu_and_mul(gate_up, out): out = T(T(silu(gate)) * up), gate_up = [gate | up] per row
//   (silu's float32 value may differ from torch's in the last bit: another exp).
//
// T is the tensor dtype (float32 or bfloat16); arithmetic is in float32.
// Registered in torch.ops.paged_core_cpu_<level> (the library paged_attention.cpp defines).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_common.h"
#include "cpu_simd.h"
#include "fused_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using paged_core_cpu::Elem;

// Waking a second thread costs tens of microseconds (more with OMP_WAIT_POLICY=PASSIVE),
// as much as ~100k elements of these ops: smaller jobs stay on the calling thread.
constexpr int64_t kMinElementsPerTask = int64_t{1} << 17;

inline int64_t row_grain(int64_t elements_per_row) {
  return std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, elements_per_row));
}

// One row: optional residual update, then the normalised, weighted row. (Separate simple
// loops: gcc vectorizes each of them, not a fused add + round + reduce loop.)
template <typename T>
inline void norm_row(const T* x, T* residual, const T* weight, T* out, int64_t H, float eps) {
  if (residual != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < H; ++i)
      residual[i] = Elem<T>::store(Elem<T>::load(residual[i]) + Elem<T>::load(x[i]));
    x = residual;
  }
  float sum_sq = 0.f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < H; ++i) {
    const float v = Elem<T>::load(x[i]);
    sum_sq += v * v;
  }
  const float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) {
    const float normed = Elem<T>::round(Elem<T>::load(x[i]) * inv);
    out[i] = Elem<T>::store(Elem<T>::load(weight[i]) * normed);
  }
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), name,
              " must be a contiguous CPU [rows, hidden] tensor");
}

template <typename T>
void norm_rows(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight, double eps,
               at::Tensor& out) {
  const int64_t rows = x.size(0), H = x.size(1);
  const T* xp = reinterpret_cast<const T*>(x.const_data_ptr());
  T* rp = residual ? reinterpret_cast<T*>(residual->mutable_data_ptr()) : nullptr;
  const T* wp = reinterpret_cast<const T*>(weight.const_data_ptr());
  T* op = reinterpret_cast<T*>(out.mutable_data_ptr());
  at::parallel_for(0, rows, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      norm_row<T>(xp + r * H, rp ? rp + r * H : nullptr, wp, op + r * H, H, static_cast<float>(eps));
  });
}

void rms_norm_impl(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight, double eps,
                   at::Tensor& out) {
  check_rows(x, "x");
  check_rows(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "weight must be a contiguous [hidden] tensor");
  if (residual) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes(), "residual must have x's shape");
  }
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "fused rms_norm supports float32 and bfloat16, got ", dtype);
  TORCH_CHECK(weight.scalar_type() == dtype && out.scalar_type() == dtype &&
                  (!residual || residual->scalar_type() == dtype),
              "all tensors must share x's dtype");
  if (dtype == at::kFloat) {
    norm_rows<float>(x, residual, weight, eps, out);
  } else {
    norm_rows<uint16_t>(x, residual, weight, eps, out);
  }
}


// x[d] <- T(T(x[d] * c[d]) + T(rot[d] * s[d])), rot = (-x[h:], x[:h]); row copied first.
template <typename T>
inline void rotate_row(T* x, const T* c, const T* s, int64_t D, float* buf) {
  const int64_t half = D / 2;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) buf[d] = Elem<T>::load(x[d]);
#pragma omp simd
  for (int64_t d = 0; d < half; ++d) {
    const float a = Elem<T>::round(buf[d] * Elem<T>::load(c[d]));
    const float b = Elem<T>::round(-buf[d + half] * Elem<T>::load(s[d]));
    x[d] = Elem<T>::store(a + b);
  }
#pragma omp simd
  for (int64_t d = half; d < D; ++d) {
    const float a = Elem<T>::round(buf[d] * Elem<T>::load(c[d]));
    const float b = Elem<T>::round(buf[d - half] * Elem<T>::load(s[d]));
    x[d] = Elem<T>::store(a + b);
  }
}

// The first R dims of every head of x (tables of R columns; R <= head_dim: partial rotary
// leaves the rest as they are).
template <typename T>
void rotate_tensor(at::Tensor& x, const int64_t* pos, const T* cos, const T* sin, int64_t R) {
  const int64_t tokens = x.size(0), heads = x.size(1);
  const int64_t t_stride = x.stride(0), h_stride = x.stride(1);
  T* base = reinterpret_cast<T*>(x.mutable_data_ptr());
  at::parallel_for(0, tokens, row_grain(heads * R), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(R);
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + pos[t] * R;
      const T* s = sin + pos[t] * R;
      for (int64_t h = 0; h < heads; ++h) rotate_row<T>(base + t * t_stride + h * h_stride, c, s, R, buf.data());
    }
  });
}

template <typename T>
inline void silu_mul_row(const T* gate, const T* up, T* out, int64_t I, float* buf) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= I; i += 16)
    _mm512_storeu_ps(buf + i, paged_core_cpu::silu16(paged_core_cpu::load16(gate + i)));
#endif
#if PAGED_CORE_AVX2
  for (; i + 8 <= I; i += 8) _mm256_storeu_ps(buf + i, paged_core_cpu::silu8(paged_core_cpu::load8(gate + i)));
#endif
  for (; i < I; ++i) {
    const float g = Elem<T>::load(gate[i]);
    buf[i] = g / (1.f + std::exp(-g));
  }
#pragma omp simd
  for (int64_t j = 0; j < I; ++j) out[j] = Elem<T>::store(Elem<T>::round(buf[j]) * Elem<T>::load(up[j]));
}

template <typename T>
void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t rows = out.size(0), I = out.size(1);
  const T* in = reinterpret_cast<const T*>(gate_up.const_data_ptr());
  T* o = reinterpret_cast<T*>(out.mutable_data_ptr());
  at::parallel_for(0, rows, row_grain(2 * I), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(I);
    for (int64_t r = begin; r < end; ++r)
      silu_mul_row<T>(in + r * 2 * I, in + r * 2 * I + I, o + r * I, I, buf.data());
  });
}

}  // namespace

namespace paged_core_cpu {

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  rms_norm_impl(x, nullptr, weight, eps, out);
}

void add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                  at::Tensor& out) {
  rms_norm_impl(x, &residual, weight, eps, out);
}

void rotary_embedding(at::Tensor& q, at::Tensor& k, const at::Tensor& positions,
                      const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "q and k must be [tokens, heads, head_dim] with the same tokens and head_dim");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "q and k need a contiguous last dim");
  const int64_t D = q.size(2), R = cos.size(-1);  // R < D: partial rotary
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && R % 2 == 0 && R <= D &&
                  cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin must be contiguous [max_positions, rotary_dim] tables, rotary_dim even "
              "and at most head_dim");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == q.size(0) &&
                  positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "positions must be contiguous int64 [tokens]");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "fused rotary_embedding supports float32 and bfloat16, got ", dtype);
  TORCH_CHECK(k.scalar_type() == dtype && cos.scalar_type() == dtype && sin.scalar_type() == dtype,
              "q, k, cos and sin must share a dtype");
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < positions.size(0); ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " is outside the ",
                cos.size(0), "-row rotary tables");
  if (dtype == at::kFloat) {
    for (at::Tensor* x : {&q, &k})
      rotate_tensor<float>(*x, pos, cos.const_data_ptr<float>(), sin.const_data_ptr<float>(), R);
  } else {
    const auto* c = reinterpret_cast<const uint16_t*>(cos.const_data_ptr());
    const auto* s = reinterpret_cast<const uint16_t*>(sin.const_data_ptr());
    for (at::Tensor* x : {&q, &k}) rotate_tensor<uint16_t>(*x, pos, c, s, R);
  }
}

void silu_and_mul(const at::Tensor& gate_up, at::Tensor& out) {
  check_rows(gate_up, "gate_up");
  check_rows(out, "out");
  TORCH_CHECK(gate_up.size(0) == out.size(0) && gate_up.size(1) == 2 * out.size(1),
              "gate_up must be [rows, 2 * n] for out [rows, n]");
  const auto dtype = gate_up.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "fused silu_and_mul supports float32 and bfloat16, got ", dtype);
  TORCH_CHECK(out.scalar_type() == dtype, "out must share gate_up's dtype");
  if (dtype == at::kFloat) {
    silu_mul_rows<float>(gate_up, out);
  } else {
    silu_mul_rows<uint16_t>(gate_up, out);
  }
}

}  // namespace paged_core_cpu

PAGED_CORE_LIBRARY_FRAGMENT(m) {
  using namespace paged_core_cpu;
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor weight, float eps, Tensor(b!) out) -> ()");
  m.def("rotary_embedding(Tensor(a!) q, Tensor(b!) k, Tensor positions, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor gate_up, Tensor(a!) out) -> ()");
  m.impl("rms_norm", c10::DispatchKey::CPU, TORCH_FN(rms_norm));
  m.impl("silu_and_mul", c10::DispatchKey::CPU, TORCH_FN(silu_and_mul));
  m.impl("add_rms_norm", c10::DispatchKey::CPU, TORCH_FN(add_rms_norm));
  m.impl("rotary_embedding", c10::DispatchKey::CPU, TORCH_FN(rotary_embedding));
}
