// LineBuffer<T>: a std::vector whose storage starts on a 64-byte cache line and whose
// elements are left uninitialised when it is sized (trivial T only), for the per-thread
// scratch buffers of the kernels: every 512-bit load and store of a row that starts on a
// line stays within that line (malloc promises 16 bytes), and no call spends time zeroing
// buffers whose every element is written before it is read. The bfloat16 tiles' buffers
// (Bf16TileBuffers) as LineBuffers: a 128-token SmolLM2-shaped prompt's attention
// 85.8-86.0 against 87.2-88.0 us, four such prompts 329-332 against 335-337 us (2 threads,
// base and change in alternating processes, AMD EPYC family 25 model 17, avx512_bf16). The
// AMX prompt buffers stay std::vectors: no CPU at hand to time them on.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

namespace paged_core_cpu {

constexpr std::size_t kCacheLine = 64;

template <typename T>
struct LineAllocator {
  static_assert(std::is_trivial_v<T>, "LineBuffer holds trivial elements only");
  using value_type = T;

  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{kCacheLine}); }
  // Sizing constructs no value: the elements keep whatever the memory held.
  template <typename U>
  void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }

  template <typename U>
  bool operator==(const LineAllocator<U>&) const noexcept { return true; }
};

template <typename T>
using LineBuffer = std::vector<T, LineAllocator<T>>;

}  // namespace paged_core_cpu
