"""``Int4Weight`` and ``Int4Linear``: group-wise affine 4-bit weights, computed in place.

A weight ``[out, in]`` is stored as 4-bit levels ``q`` in ``0..15`` with one float scale and
one float offset per group of ``group_size`` consecutive input features of a row:

    w[o, i] = scale[o, g] * (q[o, i] - 8) + zero[o, g],   g = i // group_size

which is ATen's int4 layout (``_weight_int4pack_mm_for_cpu``): ``Int4Linear`` packs ``q``
once and the kernel widens the levels per call, never the whole weight. Symmetric formats
(GGUF Q4_0) have ``zero = 0``; GGUF Q4_1's ``d * q + m`` is ``scale = d, zero = m + 8 d``.
With a float32 model the scales stay float32 and the product equals the dequantized weight's
up to summation order; a half-precision model rounds scales and offsets to its dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

GROUP_SIZES = (32, 64, 128, 256)  # what ATen's int4 kernel takes


@dataclass
class Int4Weight:
    q: torch.Tensor  # [out, in] uint8 levels 0..15
    scales: torch.Tensor  # [out, in / group_size] float32
    zeros: torch.Tensor  # [out, in / group_size] float32
    group_size: int

    @staticmethod
    def cat(parts: list["Int4Weight"]) -> "Int4Weight":
        """The rows of ``parts`` stacked (a fused projection: q, k, v or gate, up)."""
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("fused projections must share one group size")
        return Int4Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.zeros for p in parts]), parts[0].group_size)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these levels stand for."""
        out, width = self.q.shape
        groups = (self.q.float() - 8).view(out, width // self.group_size, self.group_size)
        return (groups * self.scales[..., None] + self.zeros[..., None]).view(out, width)


class Int4Linear(nn.Module):
    """``y = x @ W.T + b`` for an ``Int4Weight`` ``W`` (inference only, CPU); the output has
    the input's dtype, which must be the ``dtype`` it was built for."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        out_features, in_features = weight.q.shape
        if weight.group_size not in GROUP_SIZES or in_features % weight.group_size:
            raise ValueError(f"int4 weights need a group size in {GROUP_SIZES} dividing the "
                             f"input features ({in_features}), got {weight.group_size}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size = weight.group_size
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            weight.q.to(torch.int32), 1)
        self.scales_and_zeros = torch.stack([weight.scales, weight.zeros], dim=-1) \
            .transpose(0, 1).contiguous().to(dtype)  # [groups, out, 2]
        self.bias = None if bias is None else bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size,
                                                       self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)
