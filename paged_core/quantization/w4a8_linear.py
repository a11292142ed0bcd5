"""``W4A8Linear``: 4-bit group-wise weights times int8 activations quantized per token at run
time.

compressed-tensors' W4A8 scheme (``preset_name_to_scheme("W4A8")``): weights int4 in groups
(symmetric; with zero points where the recipe made them asymmetric), activations int8
symmetric per token (row), scale ``absmax / 127``, levels rounded half to even. With
``Int4Weight``'s formula ``w = scale * (q - 8) + zero = scale * q + offset``:

    y[t, o] = x_scale[t] * sum_g (scale[o, g] * sum_{i in g} xq[t, i] q[o, i]
                                  + offset[o, g] * sum_{i in g} xq[t, i])

``PAGED_CORE_CPU_W4A8`` (``selected_w4a8_kernel``) picks how:

- ``vnni``: paged-core's kernel (``cpu/csrc/quantized_w4a8.cpp``): the levels repacked at load
  in column groups of 32 outputs (each group's scales and offsets, or for a symmetric weight,
  whose offsets are all -8 scale, its scales alone; float16 where that holds them exactly,
  ``narrowed_factors``: the same values in half the bytes), every call's exact int32 sums per
  group on ``vpdpbusd`` (a symmetric weight's already minus 8 times the group's sum of row
  levels, so one multiply-add a group), the rows quantized in the same call
  (``token_levels``); the AVX-512 builds on CPUs with AVX512-VNNI (``int8_vnni_ready``);
- ``amx``: the same layout and bits on AMX-INT8 tiles (``cpu/csrc/quantized_w4a8_tiles.cpp``:
  each group's 16 quads of 64 bytes masked into two B tiles, tdpbsud's exact sums); CPUs with
  AMX-INT8 whose OS grants the tiles (``amx_int8_ready``), groups of a multiple of 64 features;
- ``float32``: ``Int4Linear``'s row layout and kernels, the activation levels as float32
  numbers, then the token's scale.

``auto`` (the default): ``vnni`` where it runs, its calls of ``AMX_FROM_ROWS`` rows or more on
``amx`` where that runs, the groups fit and the bfloat16 linears take AMX tiles
(``PAGED_CORE_CPU_LINEAR``); else ``float32``. Without the C++ kernels the float32 path runs
in torch (the dequantized weight).

Against 16-bit activations (``Int4Linear``), decode takes half the instructions per
multiply-add (64 int8 products per ``vpdpbusd`` against 32 bf16 ones per ``vdpbf16ps``) and
no widening of the levels to bf16: SmolLM2's 120 projections in groups of 64, levels cold,
2 threads, one process alternating (AMD EPYC family 25 model 17, Zen 4, avx512_bf16 with
avx512_vnni, 2026-12-05 09:46 UTC): 8 rows 3.99 ms against 6.40 for the W4A16 column kernel,
1 row 2.48 against 3.38; a decode step of 8 sequences of the embedded model 8.16 ms against
W4A16's 9.69 and bfloat16's 11.76 (three engines in one process, alternated).
"""
from __future__ import annotations

import torch

from .int4_linear import Int4Linear
from .quantized_linear import narrowed_factors
from .w8a8_linear import int8_tiles_ready, named_int8_kernel, per_token_levels

W4A8_SETTING = "PAGED_CORE_CPU_W4A8"
W4A8_KERNELS = ("vnni", "amx", "float32")
# auto with AMX-INT8 tiles: calls of at least this many rows take them (w4a8_tiles), fewer
# vpdpbusd. SmolLM2's 120 projections, groups of 64, symmetric, one process alternating, medians
# of 9 (Intel(R) Xeon(R) Processor, amx_bf16 with amx_int8, 2 threads, 2026-12-07 00:57 UTC,
# /tmp/s106/w4rows.py): vpdpbusd / tiles / bfloat16 weights on AMX-BF16 6.9 / 9.6 / 14.0 ms at
# 1 row, 8.2 / 11.2 / 15.6 at 8, 11.5 / 12.4 / 15.5 at 16, 14.3 / 13.9 / 16.6 at 24, 17.0 /
# 15.4 / 16.6 at 32, 27.8 / 20.7 / 23.5 at 64, 47.5 / 32.5 / 31.3 at 128, 174 / 95 / 76 at 512
AMX_FROM_ROWS = 24


def selected_w4a8_kernel(kernels, group_size: int = 64,
                         amx_selected: bool = False) -> tuple[str, int]:
    """The kernel (``W4A8_KERNELS``) that W4A8 linears of ``group_size`` built now with the C++
    ``kernels`` (the selected level's ops, None where they do not build) take, and from how
    many rows they run on AMX-INT8 tiles (0: never): ``PAGED_CORE_CPU_W4A8`` if set (``amx``
    takes every call), else ``auto``'s choice (module doc; ``amx_selected``: the bfloat16
    linears take AMX tiles). Raises ``ValueError`` as ``named_int8_kernel`` does, and for
    ``amx`` where the tiles cannot run or the groups are no whole tile steps."""
    vnni_ready = kernels is not None and bool(kernels.int8_vnni_ready())
    amx_ready = int8_tiles_ready(kernels, vnni_ready)
    raw = named_int8_kernel(W4A8_SETTING, "W4A8", W4A8_KERNELS, vnni_ready)
    if raw == "amx" and not (amx_ready and group_size % 64 == 0):
        why = (f"groups of a multiple of 64 features, got {group_size}" if amx_ready else
               "paged-core's avx512_bf16 kernels on a CPU whose OS grants AMX-INT8 tiles")
        raise ValueError(f"{W4A8_SETTING}=amx needs {why}; choose auto, vnni or float32")
    if raw == "auto":
        if not vnni_ready:
            return "float32", 0
        tiles = amx_ready and amx_selected and group_size % 64 == 0
        return "vnni", AMX_FROM_ROWS if tiles else 0
    return raw, 1 if raw == "amx" else 0


class W4A8Linear(Int4Linear):
    """``y = x @ W.T (+ bias)`` for an ``Int4Weight`` ``W`` whose inputs are quantized per
    token (inference only, CPU). ``w4a8_outputs > 0``: the levels and ``scales`` (each group's
    scales and offsets, or scales alone for a symmetric weight) are ``w4a8_pack``'s; else
    ``Int4Linear``'s row layout."""

    # from how many rows the sums are integer: 1 (every call, vnni) or 0 (never, float32); the
    # C++ decoder stack's flag for "quantize the rows first"
    int8_sums_from_rows = 0
    w4a8_outputs = 0

    def _stored_layout(self, q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                       zeros: torch.Tensor) -> list:
        self.kernel, self.amx_min_rows = selected_w4a8_kernel(self.kernels, self.group_size,
                                                              self._amx_selected())
        if self.kernel == "float32":  # the row layout: its float32 kernels take any level's rows
            return self._row_levels(q, scales, offsets, zeros)
        self.int8_sums_from_rows, self.w4a8_outputs = 1, self.out_features
        levels, factors = self.kernels.w4a8_pack(q.contiguous(), scales, offsets, self.group_size)
        return [levels, narrowed_factors(factors), None, None]  # float16 where exact

    def product(self, rows: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The activation scale multiplies the sums last; float32, or, where ``out_dtype`` is
        bfloat16 on the vnni kernel, rounded to it as the kernel stores (the bits ``.to``
        gives)."""
        if self.w4a8_outputs:
            out = out_dtype if out_dtype == torch.bfloat16 else None
            return self.kernels.w4a8_product(rows, self.levels, self.scales,
                                             self.group_size, self.w4a8_outputs, out,
                                             self.amx_min_rows)
        levels, scale = per_token_levels(rows)
        return super().product(levels).float() * scale
