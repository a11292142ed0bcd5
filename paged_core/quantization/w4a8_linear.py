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
- ``float32``: ``Int4Linear``'s row layout and kernels, the activation levels as float32
  numbers, then the token's scale.

``auto`` (the default): ``vnni`` where it runs, else ``float32``. Without the C++ kernels the
float32 path runs in torch (the dequantized weight).

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
from .w8a8_linear import named_int8_kernel, per_token_levels

W4A8_SETTING = "PAGED_CORE_CPU_W4A8"
W4A8_KERNELS = ("vnni", "float32")


def selected_w4a8_kernel(kernels) -> str:
    """The kernel (``W4A8_KERNELS``) that W4A8 linears built now with the C++ ``kernels`` (the
    selected level's ops, None where they do not build) take: ``PAGED_CORE_CPU_W4A8`` if set,
    else ``auto``'s choice (module doc). Raises ``ValueError`` as ``named_int8_kernel`` does."""
    vnni_ready = kernels is not None and bool(kernels.int8_vnni_ready())
    raw = named_int8_kernel(W4A8_SETTING, "W4A8", W4A8_KERNELS, vnni_ready)
    if raw == "auto":
        return "vnni" if vnni_ready else "float32"
    return raw


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
        self.kernel = selected_w4a8_kernel(self.kernels)
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
                                             self.group_size, self.w4a8_outputs, out)
        levels, scale = per_token_levels(rows)
        return super().product(levels).float() * scale
