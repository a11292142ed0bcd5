// The LoRA products of lora_products.cpp (see there for what each computes), callable from
// the other C++ kernels of the same build.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace paged_core_cpu {

at::Tensor lora_shrink(const at::Tensor& x, const at::Tensor& a, const std::vector<int64_t>& widths,
                       const at::Tensor& token_slots);
void lora_expand(at::Tensor& y, const at::Tensor& u, const at::Tensor& b_t,
                 const std::vector<int64_t>& widths, const std::vector<int64_t>& part_starts,
                 const at::Tensor& token_slots);
void lora_apply(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b_t,
                const std::vector<int64_t>& widths, const std::vector<int64_t>& part_starts,
                const at::Tensor& token_slots);

}  // namespace paged_core_cpu
