"""``Int4Weight`` and ``Int4Linear``: group-wise affine 4-bit weights, computed in place.

A weight ``[out, in]`` is stored as 4-bit levels ``q`` in ``0..15`` with one float scale and
one float offset per group of ``group_size`` consecutive input features of a row:

    w[o, i] = scale[o, g] * (q[o, i] - 8) + zero[o, g],   g = i // group_size

Symmetric formats (GGUF Q4_0, compressed-tensors' symmetric W4A16) have ``zero = 0``; GGUF
Q4_1's ``d * q + m`` is ``scale = d, zero = m + 8 d``; a zero point ``z`` (``s * (q - z)``)
is ``zero = (8 - z) * s``. Scales and offsets stay float32 whatever the model's dtype (the
column layout keeps each as float16 where that is exact: ``narrowed_factors``).

``Int4Linear`` keeps two levels per byte, in the C++ kernel's order: in each group, byte
``j`` holds feature ``j`` in its low nibble and feature ``j + group_size / 2`` in its high
nibble (``pack_nibbles``; half a byte per weight, nothing else kept of ``q``), or the column
layout (``quantized_linear``'s module doc), or at the ``avx2`` and ``avx512`` levels column
groups of 32 outputs for float32 FMAs (``int4_columns``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .quantized_linear import QuantizedLinear, column_groups

# Rows from which the 4-bit column groups' many-rows path (each column group widened to
# bfloat16 once, then bf16_dot_linear's tiles) beats their float32 FMA kernel, by level. 30
# SmolLM2 layers x 4 projections, groups of 64, AMD EPYC family 25 model 17 capped to each level,
# 2 threads, one process alternating (2026-12-06, 17:14-17:17 UTC), kernel / many-rows path /
# bfloat16 weights: avx2 1 row 5.8 / 17.6 / 9.8 ms, 8 rows 16.6 / 28.7 / 18.7, 16 rows 26.8 /
# 33.4 / 24.9, 32 rows 51.8 / 54.2 / 43.2, 40 rows 70.0 / 60.9 / 52.9; avx512 1 row 5.2 / 16.6 /
# 8.5, 8 rows 13.3 / 21.8 / 11.1, 16 rows 24.6 / 30.5 / 19.6, 24 rows 37.7 / 38.0 / 27.3, 28
# rows 42.3 / 41.6 / 31.4. (Before these column groups, the row layout's kernel took avx2 8.5 /
# 19.8 / 36.7 ms at 1 / 8 / 16 rows.) From about 12 rows either path stays 0.8-0.9x bfloat16's
# speed there: bfloat16 weights widen in two instructions a block, 4-bit levels in three.
# Tried there and not kept (16:49-16:54 UTC): each column group widened to float32 once for
# all its row tiles (avx512, 16 rows: 25.3 ms against 23.2); tiles of one block and twice the
# rows (avx512, 16 rows: 24.9 against 23.2; avx2, 8 rows: 18.1 against 14.9).
COLUMNS_DENSE_ROWS = {"avx2": 40, "avx512": 28}


def kernel_takes(group_size: int, width: int) -> bool:
    """Whether the C++ kernels take groups of ``group_size`` over ``width`` input features
    (whole groups of a multiple of 16: the AVX2 loop widens 8 bytes of levels at a time)."""
    return group_size % 16 == 0 and width % group_size == 0


@dataclass
class Int4Weight:
    q: torch.Tensor  # [out, in] uint8 levels 0..15
    scales: torch.Tensor  # [out, in / group_size] float32
    zeros: torch.Tensor  # [out, in / group_size] float32
    group_size: int
    activations_int8: bool = False  # W4A8: inputs quantized per token at run time

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def rows(self, index) -> "Int4Weight":
        return Int4Weight(self.q[index], self.scales[index], self.zeros[index], self.group_size,
                          self.activations_int8)

    def columns(self, start: int, stop: int) -> "Int4Weight":
        """Input features ``start:stop`` (whole groups)."""
        g = self.group_size
        groups = slice(start // g, stop // g)
        return Int4Weight(self.q[:, start:stop], self.scales[:, groups], self.zeros[:, groups], g,
                          self.activations_int8)

    @staticmethod
    def cat(parts: list["Int4Weight"]) -> "Int4Weight":
        """The rows of ``parts`` stacked (a fused projection: q, k, v or gate, up)."""
        return Int4Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.zeros for p in parts]), parts[0].group_size,
                          parts[0].activations_int8)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these levels stand for."""
        out, width = self.q.shape
        groups = (self.q.float() - 8).view(out, width // self.group_size, self.group_size)
        return (groups * self.scales[..., None] + self.zeros[..., None]).view(out, width)


def pack_nibbles(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[out, in]`` levels → ``[out, in / 2]`` bytes in the kernel's order (module doc)."""
    out, width = q.shape
    halves = q.view(out, width // group_size, 2, group_size // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(out, width // 2).contiguous()


def int4_columns(q: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` levels (``0..15``, N a multiple of 32) in column groups of 32 outputs, two
    to a byte: ``[N / 32, K, 16]``, byte ``j`` of feature ``k`` of group ``c`` holding output
    ``32 c + j``'s level in its low nibble and ``32 c + 16 + j``'s in its high one
    (``quantized_fma_columns.cpp``'s 4-bit layout)."""
    groups = column_groups(q)
    return (groups[..., :16] | (groups[..., 16:] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor, group_size: int) -> torch.Tensor:
    """The inverse of ``pack_nibbles``."""
    out, half = packed.shape
    groups = packed.view(out, -1, group_size // 2)
    return torch.stack([groups & 15, groups >> 4], dim=2).reshape(out, half * 2)


class Int4Linear(QuantizedLinear):
    """``y = x @ W.T (+ bias)`` for an ``Int4Weight`` ``W`` (inference only, CPU)."""

    bits = 4

    def __init__(self, weight: Int4Weight, has_bias: bool, dtype: torch.dtype,
                 dense_dtype: torch.dtype | None = None) -> None:
        super().__init__(*weight.shape, has_bias, dtype, dense_dtype)
        if not kernel_takes(weight.group_size, self.in_features):
            raise ValueError(f"int4 weights need groups of a multiple of 16 features dividing "
                             f"the input features ({self.in_features}), got {weight.group_size}")
        self.group_size = weight.group_size
        scales, zeros = weight.scales.float().contiguous(), weight.zeros.float().contiguous()
        offsets = (zeros - 8 * scales).contiguous()
        self.levels, self.scales, self.offsets, self.zeros = self._stored_layout(
            weight.q.to(torch.uint8), scales, offsets, zeros)

    def _stored_layout(self, q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                       zeros: torch.Tensor) -> list:
        """``[levels, scales, offsets, zeros]`` as this linear's kernels take them: the column
        layout where it keeps one (``_column_layout``), the float32 FMA column groups
        (``_fma_columns_layout``), else the row layout."""
        packed = self._column_layout(q, [scales, offsets, zeros])
        if packed is None and self._keeps_fma_columns():
            packed = self._fma_columns_layout(int4_columns(q), [scales, offsets, zeros],
                                              COLUMNS_DENSE_ROWS[self.level])
        return packed if packed is not None else self._row_levels(q, scales, offsets, zeros)

    def _row_levels(self, q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                    zeros: torch.Tensor) -> list:
        """The row layout's ``[levels, scales, offsets, zeros]`` (``pack_nibbles``)."""
        self._row_layout()
        return [pack_nibbles(q, self.group_size), scales, offsets, zeros]

    def quantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernels.int4_gemm(rows, self.levels, self.scales, self.offsets, self.group_size)

    def row_layout_weight(self) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.int4_dequantize(self.levels, self.scales, self.zeros,
                                                self.group_size)
        return Int4Weight(unpack_nibbles(self.levels, self.group_size), self.scales, self.zeros,
                          self.group_size).dequantize()
