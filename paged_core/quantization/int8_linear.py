"""``Int8Weight`` and ``Int8Linear``: 8-bit weights with a float scale (and zero) per group.

A weight ``[out, in]`` is stored as signed levels ``q`` in ``-128..127`` and one scale per
group of ``group_size`` consecutive input features of a row, and optionally one zero:

    w[o, i] = scale[o, g] * q[o, i] (+ zero[o, g]),   g = i // group_size

``group_size == in`` is one scale per output channel (compressed-tensors' W8A16 ``channel``
strategy); GGUF Q8_0 and Q5_0 have groups of 32, Q6_K groups of 16 (all symmetric); GGUF
Q5_1 and Q5_K have zeros (their minimums), levels ``0..31``. ``activations_int8`` marks W8A8
weights, whose inputs are quantized too (``W8A8Linear``; symmetric only).

``Int8Linear`` keeps the levels as they are (the row layout), in column groups of 32 outputs
for float32 FMAs at the ``avx2`` and ``avx512`` levels (``column_groups``), or the column layout
(``quantized_linear``'s module doc), packed as narrow as they allow (``column_packing``):
levels within ``-16..15`` or ``0..31`` (GGUF Q5_0, Q5_1, Q5_K) in 5 bits, 0.625 bytes a
weight; within ``-64..63`` (Q6_K) biased in a byte, ``q + 64``, which widens to bfloat16 with
a zero extension and an or, where full-range levels take two conversions through float32;
symmetric levels that are all llama.cpp's IQ4_NL values (``IQ4_NL_VALUES``: GGUF IQ4_NL and
IQ4_XS) as their 4-bit indices, half a byte a weight, widened by a table lookup. Either
layout takes the zeros (as the kernels' offsets).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .int4_linear import kernel_takes
from .quantized_linear import INT8_TILE_ROWS, QuantizedLinear, column_groups, int8_tile_kernel


@dataclass
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out, in / group_size] float32
    group_size: int
    activations_int8: bool = False  # W8A8: inputs quantized per token at run time
    zeros: torch.Tensor | None = None  # [out, in / group_size] float32, added per group

    def __post_init__(self) -> None:
        if self.zeros is not None and self.activations_int8:
            raise ValueError("W8A8 weights are symmetric: zeros cannot be given")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these levels stand for."""
        out, width = self.q.shape
        groups = self.q.float().view(out, width // self.group_size, self.group_size)
        w = groups * self.scales[..., None]
        return (w if self.zeros is None else w + self.zeros[..., None]).view(out, width)

    def rows(self, index) -> "Int8Weight":
        return Int8Weight(self.q[index], self.scales[index], self.group_size,
                          self.activations_int8, _part(self.zeros, index))

    def columns(self, start: int, stop: int) -> "Int8Weight":
        """Input features ``start:stop`` (whole groups)."""
        g = self.group_size
        groups = (slice(None), slice(start // g, stop // g))
        return Int8Weight(self.q[:, start:stop], self.scales[groups], g,
                          self.activations_int8, _part(self.zeros, groups))

    @staticmethod
    def cat(parts: list["Int8Weight"]) -> "Int8Weight":
        """The rows of ``parts`` stacked (a fused projection); zeros where any part has them
        (0 for the parts without)."""
        zeros = None
        if any(p.zeros is not None for p in parts):
            zeros = torch.cat([p.zeros if p.zeros is not None else torch.zeros_like(p.scales)
                               for p in parts])
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          parts[0].group_size, parts[0].activations_int8, zeros)


def _part(zeros: torch.Tensor | None, index) -> torch.Tensor | None:
    return None if zeros is None else zeros[index]


# llama.cpp's IQ4_NL table (its kvalues): an IQ4_NL or IQ4_XS weight is d * IQ4_NL_VALUES[i].
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def all_iq4_nl_values(q: torch.Tensor) -> bool:
    """Whether every level is one of ``IQ4_NL_VALUES`` (the column layout's 4-bit indices)."""
    return bool(torch.isin(q, torch.tensor(IQ4_NL_VALUES, dtype=q.dtype)).all())


def column_packing(q: torch.Tensor, zeros: torch.Tensor | None) -> str:
    """``column_pack``'s packing of 8-bit levels: ``"int5"`` within ``-16..15`` or ``0..31``,
    ``"int7"`` within ``-64..63``, ``"iq4"`` all IQ4_NL values without zeros, else ``""``."""
    low, high = (int(q.min()), int(q.max())) if q.numel() else (0, 0)
    if (low >= -16 and high <= 15) or (low >= 0 and high <= 31):
        return "int5"
    if low >= -64 and high <= 63:
        return "int7"
    return "iq4" if zeros is None and all_iq4_nl_values(q) else ""


# Rows from which the 8-bit column groups' many-rows path (each column group widened to bfloat16
# once, then bf16_dot_linear's tiles: row_layout_dense's bits) beats its kernel, which widens
# the levels again for every tile of rows (and, with group scales or zeros, scales them there),
# by level and scales (one per output, or per group). 30 SmolLM2 layers x 4 projections, AMD
# EPYC family 25 model 17 capped to each level, 2 threads, one process alternating (2026-12-06),
# kernel against many-rows path: avx2 (10:51-10:53 UTC), one scale per output 48 rows 54.4 /
# 64.3 ms, 64 rows 73.9 / 84.1, 96 rows 125.2 / 119.5, 512 rows 580.8-637.3 / 603.9-604.0;
# groups of 32, 32 rows 46.9 / 48.9, 48 rows 67.6 / 65.0, 256 rows 381.5 / 302.8; avx512
# (11:54-11:55 UTC, the kernel in 16-lane registers), one scale per output 40 rows 52.2 / 55.9,
# 48 rows 57.5-71.9 / 58.0-67.9 (two runs), 56 rows 70.9 / 73.9, 64 rows 77.3-80.5 / 74.4-75.8;
# groups of 32, 24 rows 37.3 / 40.8, 32 rows 54.4 / 49.3.
COLUMNS_DENSE_ROWS = {("avx2", "channel"): 64, ("avx2", "group"): 40,
                      ("avx512", "channel"): 48, ("avx512", "group"): 28}


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
        zeros = None if weight.zeros is None else weight.zeros.float().contiguous()
        # W8A8's inputs are float32 levels: those keep the row layout's float32 kernels
        factors = [scales] + ([] if zeros is None else [zeros])
        packed = None
        if self._keeps_column_layout() and not weight.activations_int8:
            packing = column_packing(q, zeros)
            # under a byte a level beats the AMX-INT8 tiles' byte in a decode step
            tiles = zeros is None and packing in ("", "int7") and int8_tile_kernel(
                self.kernels, self.group_size, amx_selected=self._amx_selected())
            packed = self._column_layout(q, factors, "" if tiles else packing)
            self.int8_tile_rows = INT8_TILE_ROWS if tiles else 0
        if packed is None and self._keeps_fma_columns() and not weight.activations_int8:
            scheme = "channel" if self.group_size == self.in_features and zeros is None else "group"
            packed = self._fma_columns_layout(column_groups(q), factors,
                                              COLUMNS_DENSE_ROWS[self.level, scheme])
        self.levels, *factors = packed if packed is not None else [q, *factors]
        self.scales = factors[0]
        # 8-bit offsets are the zeros in every layout (y takes zero * sum(x) per group)
        self.offsets = self.zeros = factors[1] if len(factors) > 1 else None
        if packed is None and not weight.activations_int8:  # W8A8 sums its levels exactly
            self._row_layout()

    def quantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernels.int8_gemm(rows, self.levels, self.scales, self.offsets,
                                      self.group_size)

    def row_layout_weight(self) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.int8_dequantize(self.levels, self.scales, self.zeros,
                                                self.group_size)
        return Int8Weight(self.levels, self.scales, self.group_size, zeros=self.zeros).dequantize()
