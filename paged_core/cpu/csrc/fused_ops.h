// The fused elementwise ops of fused_ops.cpp (see there for what each computes and how it
// rounds), callable from the other C++ kernels of the same build.
#pragma once

#include <ATen/core/Tensor.h>

namespace paged_core_cpu {

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out);
void add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                  at::Tensor& out);
void rotary_embedding(at::Tensor& q, at::Tensor& k, const at::Tensor& positions,
                      const at::Tensor& cos, const at::Tensor& sin);
void silu_and_mul(const at::Tensor& gate_up, at::Tensor& out);

}  // namespace paged_core_cpu
