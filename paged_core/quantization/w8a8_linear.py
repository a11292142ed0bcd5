"""``W8A8Linear``: int8 weights times int8 activations quantized per token at run time.

compressed-tensors' W8A8-INT8 scheme: weights symmetric per output channel, activations
symmetric per token (row), scale ``absmax / 127``, levels rounded half to even:

    y[t, o] = x_scale[t] * w_scale[o] * sum_i xq[t, i] * wq[o, i]

Both levels stay as stored (``Int8Linear``'s row layout: ``levels`` ``[out, in]`` int8). The
sums are taken one of two ways:

- integer: ATen's int8 GEMM (``torch._int_mm``: oneDNN's VNNI / AMX-INT8 kernels), exact
  int32 sums, then times the channel's scale and the token's in float32;
- float32: the activation levels as float32 numbers through ``Int8Linear``'s kernels (its
  float32 dense product from ``dense_rows`` rows), then times the token's scale.

``PAGED_CORE_CPU_W8A8`` (``int8_sums_from_rows``) picks: ``int8`` (every call integer; any
CPU, slow without VNNI), ``float32`` (never), or ``auto`` (the default): integer from
``INT8_SUMS_FROM_ROWS`` rows on CPUs with int8 dot products (``avx512_vnni``, ``avx_vnni``,
``amx_int8``), float32 below that and on the others. Measured on the AMD EPYC Zen 4 (family
25 model 17, avx512_vnni, 2 threads, one process alternating), the 120 projections of 30
SmolLM2 layers with cold weights: integer against float32 1 row 5.9 / 4.4 ms, 4 rows 9.2-10.2
/ 8.5-8.6, 6 rows 8.9-10.9 / 12.5, 8 rows 9.9 / 16.3, 64 rows 26.6 / 141 ms (the float32
dense product dequantizes each weight per call; bfloat16 weights on ``vdpbf16ps``: 6.1, 8.0,
33.0 ms at 1, 8, 64 rows); on an AVX2 EPYC without VNNI the integer GEMM made decode steps
5x slower than the bf16 model's. The integer sums are exact and scaled once; the float32
kernels scale each lane's partial sum before adding them (their dense product, each weight),
so the two paths differ in the last bits. A row of zeros gets scale 1 (levels 0).
"""
from __future__ import annotations

import os

import torch

from .int8_linear import Int8Linear, Int8Weight

W8A8_SETTING = "PAGED_CORE_CPU_W8A8"
W8A8_KERNELS = ("int8", "float32")
# auto: calls of at least this many rows take the integer GEMM where the CPU has VNNI
INT8_SUMS_FROM_ROWS = 6
# torch.cpu.get_capabilities() flags of int8 dot product instructions
_INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_sums_from_rows() -> int:
    """From how many rows the W8A8 linears built now take integer sums (0: never), as
    ``PAGED_CORE_CPU_W8A8`` says (module doc). Raises ``ValueError`` naming the setting for a
    value it does not know."""
    raw = os.environ.get(W8A8_SETTING, "").strip().lower() or "auto"
    if raw == "auto":
        caps = torch.cpu.get_capabilities()
        return INT8_SUMS_FROM_ROWS if any(caps.get(f) is True for f in _INT8_DOT_FLAGS) else 0
    if raw not in W8A8_KERNELS:
        raise ValueError(f"{W8A8_SETTING}={raw!r} is not a W8A8 kernel; choose auto or one of "
                         f"{', '.join(W8A8_KERNELS)}")
    return 1 if raw == "int8" else 0


class W8A8Linear(Int8Linear):
    def __init__(self, weight: Int8Weight, has_bias: bool, dtype: torch.dtype,
                 dense_dtype: torch.dtype | None = None) -> None:
        if weight.group_size != weight.q.shape[1]:
            raise ValueError("W8A8 weights need one scale per output channel, got groups of "
                             f"{weight.group_size}")
        super().__init__(weight, has_bias, dtype, dense_dtype)
        self.int8_sums_from_rows = int8_sums_from_rows()
        self.channel_scales = self.scales.reshape(-1)  # [out] float32, the same storage

    def product(self, rows: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """float32 whatever ``out_dtype``: the activation scale multiplies the sums last. The C++
        ``w8a8_product`` where the kernels build (the decoder stack calls it too), else the
        same formula in torch ops."""
        if self.kernels is not None:
            return self.kernels.w8a8_product(rows, self.levels, self.channel_scales,
                                             self.int8_sums_from_rows, self.dense_rows,
                                             self.dense_dtype)
        rows = rows.float()
        scale = rows.abs().amax(dim=1, keepdim=True) / 127
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        levels = torch.round(rows / scale).clamp_(-128, 127)
        if 0 < self.int8_sums_from_rows <= rows.shape[0]:
            sums = torch._int_mm(levels.to(torch.int8), self.levels.t())
            return (sums * self.channel_scales).mul_(scale)
        return super().product(levels).float() * scale
