// Shared by the CPU kernels: bfloat16 <-> float32 and whole-row loads/stores.
// bfloat16 tensors are handled as their uint16_t bits; float32 as float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// The op namespace of this build: paged_core/cpu_extension.py passes
// -DPAGED_CORE_OPS=paged_core_cpu_<level>, one namespace per ISA level, so several
// levels' builds can live in one process. (Two macro levels: the name is expanded
// before TORCH_LIBRARY pastes it.)
#ifndef PAGED_CORE_OPS
#error "build with -DPAGED_CORE_OPS=<op namespace> (see paged_core/cpu_extension.py)"
#endif
#define PAGED_CORE_LIBRARY_IN(ns, m) TORCH_LIBRARY(ns, m)
#define PAGED_CORE_LIBRARY_FRAGMENT_IN(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define PAGED_CORE_LIBRARY(m) PAGED_CORE_LIBRARY_IN(PAGED_CORE_OPS, m)
#define PAGED_CORE_LIBRARY_FRAGMENT(m) PAGED_CORE_LIBRARY_FRAGMENT_IN(PAGED_CORE_OPS, m)

namespace paged_core_cpu {

inline float bf16_bits_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even, as torch (c10::BFloat16) does; NaN stays a quiet NaN.
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return std::isnan(f) ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// Elements of type T <-> float32.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static inline float load(float v) { return v; }
  static inline float store(float v) { return v; }
  // The value a float32 result takes in this dtype (torch rounds each op's result).
  static inline float round(float v) { return v; }
};

template <>
struct Elem<uint16_t> {
  static inline float load(uint16_t v) { return bf16_bits_to_float(v); }
  static inline uint16_t store(float v) { return float_to_bf16_bits(v); }
  static inline float round(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }
};

// Row of D elements -> float32 (float rows are used in place), and float32 * inv -> row.
template <typename T>
struct Row {
  static inline const float* load(const T* src, float* buf, int d) {
#pragma omp simd
    for (int i = 0; i < d; ++i) buf[i] = Elem<T>::load(src[i]);
    return buf;
  }
  static inline void store(T* dst, const float* src, float inv, int d) {
#pragma omp simd
    for (int i = 0; i < d; ++i) dst[i] = Elem<T>::store(src[i] * inv);
  }
};

template <>
inline const float* Row<float>::load(const float* src, float* /*buf*/, int /*d*/) {
  return src;
}

}  // namespace paged_core_cpu
