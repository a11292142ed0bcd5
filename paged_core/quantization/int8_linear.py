"""``Int8Weight`` and ``Int8Linear``: symmetric 8-bit weights with a float scale per group.

A weight ``[out, in]`` is stored as signed levels ``q`` in ``-128..127`` and one scale per
group of ``group_size`` consecutive input features of a row:

    w[o, i] = scale[o, g] * q[o, i],   g = i // group_size

``group_size == in`` is one scale per output channel (compressed-tensors' W8A16 ``channel``
strategy); GGUF Q8_0 has groups of 32, Q6_K groups of 16. Every 8-bit layout served here is
symmetric. ``activations_int8`` marks W8A8 weights, whose inputs are quantized too (``W8A8Linear``).
``Int8Linear`` keeps the levels as they are, or the column layout (``quantized_linear``'s
module doc).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .int4_linear import kernel_takes
from .quantized_linear import INT8_TILE_ROWS, QuantizedLinear, int8_tile_kernel


@dataclass
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out, in / group_size] float32
    group_size: int
    activations_int8: bool = False  # W8A8: inputs quantized per token at run time

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these levels stand for."""
        out, width = self.q.shape
        groups = self.q.float().view(out, width // self.group_size, self.group_size)
        return (groups * self.scales[..., None]).view(out, width)

    def rows(self, index) -> "Int8Weight":
        return Int8Weight(self.q[index], self.scales[index], self.group_size,
                          self.activations_int8)

    def columns(self, start: int, stop: int) -> "Int8Weight":
        """Input features ``start:stop`` (whole groups)."""
        g = self.group_size
        return Int8Weight(self.q[:, start:stop], self.scales[:, start // g:stop // g], g,
                          self.activations_int8)

    @staticmethod
    def cat(parts: list["Int8Weight"]) -> "Int8Weight":
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          parts[0].group_size, parts[0].activations_int8)


class Int8Linear(QuantizedLinear):
    """``y = x @ W.T (+ bias)`` for an ``Int8Weight`` ``W`` (inference only, CPU)."""

    bits = 8

    def __init__(self, weight: Int8Weight, has_bias: bool, dtype: torch.dtype,
                 dense_dtype: torch.dtype | None = None) -> None:
        super().__init__(*weight.shape, has_bias, dtype, dense_dtype)
        if not kernel_takes(weight.group_size, self.in_features):
            raise ValueError(f"int8 weights need groups of a multiple of 16 features dividing "
                             f"the input features ({self.in_features}), got {weight.group_size}")
        self.group_size = weight.group_size
        q, scales = weight.q.to(torch.int8).contiguous(), weight.scales.float().contiguous()
        # W8A8's inputs are float32 levels: those keep the row layout's float32 kernels
        packed = None if weight.activations_int8 else self._column_layout(q, [scales])
        self.levels, self.scales = packed if packed is not None else (q, scales)
        if packed is None and not weight.activations_int8:  # W8A8 sums its levels exactly
            self._row_layout()
        if packed is not None and int8_tile_kernel(self.kernels, self.group_size,
                                                   amx_selected=self.amx_min_rows > 0):
            self.int8_tile_rows = INT8_TILE_ROWS

    def quantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernels.int8_gemm(rows, self.levels, self.scales, self.group_size)

    def row_layout_weight(self) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.int8_dequantize(self.levels, self.scales, self.group_size)
        return Int8Weight(self.levels, self.scales, self.group_size).dequantize()
