"""``W8A8Linear``: int8 weights times int8 activations quantized per token at run time.

compressed-tensors' W8A8-INT8 scheme: weights symmetric per output channel, activations
symmetric per token (row), scale ``absmax / 127``, levels rounded half to even:

    y[t, o] = x_scale[t] * w_scale[o] * sum_i xq[t, i] * wq[o, i]

The activation levels are integers held in float32, so ``Int8Linear``'s kernels multiply
them by the weight levels exactly while the sums stay under 2^24 (input widths up to ~1000;
wider rows round like any float32 sum). A row of zeros gets scale 1 (levels 0). ATen's
integer GEMM (``torch._int_mm``) would skip the float conversion, but without VNNI
instructions it ran 5x slower per decode step than the bf16 model (AMD EPYC, AVX2).
"""
from __future__ import annotations

import torch

from .int8_linear import Int8Linear, Int8Weight


class W8A8Linear(Int8Linear):
    def __init__(self, weight: Int8Weight, has_bias: bool, dtype: torch.dtype,
                 dense_dtype: torch.dtype | None = None) -> None:
        if weight.group_size != weight.q.shape[1]:
            raise ValueError("W8A8 weights need one scale per output channel, got groups of "
                             f"{weight.group_size}")
        super().__init__(weight, has_bias, dtype, dense_dtype)

    def product(self, rows: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """float32 whatever ``out_dtype``: the activation scale multiplies the sums first."""
        rows = rows.float()
        scale = rows.abs().amax(dim=1, keepdim=True) / 127
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        levels = torch.round(rows / scale).clamp_(-128, 127)
        return super().product(levels).float() * scale
