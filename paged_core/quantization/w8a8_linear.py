"""``W8A8Linear``: int8 weights times int8 activations quantized per token at run time.

compressed-tensors' W8A8-INT8 scheme: weights symmetric per output channel, activations
symmetric per token (row), scale ``absmax / 127``, levels rounded half to even. The product
of the levels runs in integers (``torch._int_mm``, oneDNN's int8 GEMM) and is scaled once:

    y[t, o] = x_scale[t] * w_scale[o] * sum_i xq[t, i] * wq[o, i]

A row of zeros gets scale 1 (levels 0). Many rows or few, the integer GEMM is used: the
activation rounding is part of the format, so there is no dense fallback here.
"""
from __future__ import annotations

import torch
from torch import nn

from .int8_linear import Int8Weight


class W8A8Linear(nn.Module):
    def __init__(self, weight: Int8Weight, has_bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        if weight.group_size != weight.q.shape[1]:
            raise ValueError("W8A8 weights need one scale per output channel, got groups of "
                             f"{weight.group_size}")
        self.out_features, self.in_features = weight.q.shape
        self.q_t = weight.q.T.contiguous()  # [in, out]
        self.w_scale = weight.scales[:, 0].float()
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype),
                                 requires_grad=False) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True) / 127
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        xq = torch.round(rows / scale).clamp_(-128, 127).to(torch.int8)
        y = (torch._int_mm(xq, self.q_t).float() * scale * self.w_scale).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)
