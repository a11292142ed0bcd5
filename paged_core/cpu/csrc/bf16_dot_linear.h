// The AVX512-BF16 linear of bf16_dot_linear.cpp (see there for the packed layout and the
// sum order), callable from the other C++ kernels of the avx512_bf16 build.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace paged_core_cpu {

#if defined(__AVX512BF16__)
// weight [N, K] bfloat16 (K even) -> its packed form [ceil(N / 32), K / 2, 32, 2].
at::Tensor pack_bf16_dot_weight(const at::Tensor& weight);
// x [..., K] bfloat16 -> x W^T + bias [..., out_features] bfloat16.
at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                           const std::optional<at::Tensor>& bias);
#endif

}  // namespace paged_core_cpu
