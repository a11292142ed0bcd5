"""``W8A8Linear``: int8 weights times int8 activations quantized per token at run time.

compressed-tensors' W8A8-INT8 scheme: weights symmetric per output channel, activations
symmetric per token (row), scale ``absmax / 127``, levels rounded half to even:

    y[t, o] = x_scale[t] * w_scale[o] * sum_i xq[t, i] * wq[o, i]

Each call quantizes its rows in one C++ pass (``w8a8_product``, which the C++ decoder stack
calls too), then takes the sums one of four ways, ``PAGED_CORE_CPU_W8A8``
(``selected_w8a8_kernel``):

- ``vnni``: paged-core's int8 kernel (``vnni_columns`` in ``cpu/csrc/quantized_linear.cpp``):
  the levels repacked at load in groups of 16 outputs, every call's exact int32 sums by
  ``vpdpbusd``; the AVX-512 builds on CPUs with AVX512-VNNI (``int8_vnni_ready``);
- ``amx``: the same layout and sums on AMX-INT8 tiles (``vnni_tiles``,
  ``cpu/csrc/quantized_vnni_tiles.cpp``: each 64 k of a group of 16 outputs is one B tile as
  stored, tdpbusd instead of vpdpbusd), the same bits as ``vnni``; CPUs with AMX-INT8 whose OS
  grants the tiles (``amx_int8_ready``);
- ``onednn``: the stored levels ``[out, in]`` and ATen's int8 GEMM (``torch._int_mm``,
  oneDNN), exact int32 sums, on any CPU (5x slower per decode step than the bf16 model on an
  AVX2 EPYC without VNNI);
- ``float32``: the stored levels through ``Int8Linear``'s float32 kernels, the activation
  levels as float32 numbers (from ``dense_rows`` rows the dequantized weight in the dense
  dtype), then the token's scale.

``auto`` (the default): ``vnni`` where it runs, its calls of ``AMX_FROM_ROWS`` rows or more
on ``amx`` where that runs and the bfloat16 linears take AMX tiles (``PAGED_CORE_CPU_LINEAR``);
else, on CPUs with int8 dot products (``avx_vnni``, ``amx_int8``), ``onednn`` from
``ONEDNN_FROM_ROWS`` rows and ``float32`` below; else ``float32``. Integer sums are multiplied
by the channel's scale, then the token's, in float32, so ``vnni``, ``amx`` and ``onednn`` give
the same bits whatever the rows, a token alone or in a batch; the float32 kernels scale each
lane's partial sum before adding them, so they differ in the last bits. A row of zeros gets
scale 1 (levels 0).

The 120 projections of 30 SmolLM2 layers, cold weights, one process alternating, AMD EPYC
Zen 4 (family 25 model 17, avx512_vnni), 2 threads: ``vnni`` 3.9 / 4.1 / 4.8 / 5.5 / 8.3 /
13.4 ms at 1 / 2 / 4 / 8 / 16 / 32 rows, ``onednn`` 5.7 / 7.9 / 8.4 / 9.5 / 13.5 / 17.1,
bfloat16 weights on ``vdpbf16ps`` 7.2 / 7.6 / 7.3 / 8.5 / 11.2 / 17.2 (the ``float32``
kernels, another run: 4.4 at 1 row, 8.5 at 4, 16.3 at 8, 141 at 64); 4 layers at 64 / 128 /
512 rows: ``vnni`` 2.8 / 5.5 / 22.8 ms, ``onednn`` 2.7 / 4.8 / 17.4, bfloat16 4.2 / 8.2 / 32.7.
The same 120 projections on a Xeon with AMX (Intel(R) Xeon(R) Processor, family 6 model 167,
amx_bf16 and amx_int8, 2 threads, 2026-12-06 22:15-22:30 UTC, ``/tmp/s105/w8rows.py``, medians
of 9): ``vnni`` / ``amx`` / bfloat16 weights on AMX-BF16 tiles 9.4 / 8.8 / 16.4 ms at 2 rows,
10.1 / 9.5 / 16.5 at 8, 12.2 / 9.8 / 16.3 at 16, 20.6 / 14.4 / 20.6 at 32, 35.0 / 21.1 / 26.1
at 64, 212 / 84 / 99 at 512 (at 1 row, 15 each: 8.3-8.4 / 9.1-9.2 / 14.2-14.6). One
576 x 3072 product of 512 rows: 2.91 against 0.73 ms (1.24 int8 TMAC/s with the float32 rows
written out).
"""
from __future__ import annotations

import os

import torch

from .int8_linear import Int8Linear, Int8Weight

W8A8_SETTING = "PAGED_CORE_CPU_W8A8"
W8A8_KERNELS = ("vnni", "amx", "onednn", "float32")
# auto with AMX-INT8 tiles: calls of at least this many rows take them (vnni_tiles), fewer
# the vpdpbusd kernel. Both read the same levels; at 1 row vpdpbusd was ~10% faster, at 2-6
# rows they ran alike, from 8 the tiles led (see the module doc for the timings)
AMX_FROM_ROWS = 8
# auto without the vnni kernel: calls of at least this many rows take oneDNN's int8 GEMM where
# the CPU has int8 dot products (from 5-6 rows it beat the float32 kernels on the Zen 4 above)
ONEDNN_FROM_ROWS = 6
# torch.cpu.get_capabilities() flags of int8 dot product instructions
_INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def named_int8_kernel(setting: str, scheme: str, kernels: tuple[str, ...],
                      vnni_ready: bool) -> str:
    """The kernel the environment variable ``setting`` names for ``scheme``'s linears (W8A8,
    W4A8): ``auto`` where unset, else one of ``kernels``. Raises ``ValueError`` naming the
    setting for a value it does not know, or for ``vnni`` where that kernel cannot run
    (``vnni_ready`` false)."""
    raw = os.environ.get(setting, "").strip().lower() or "auto"
    if raw != "auto" and raw not in kernels:
        raise ValueError(f"{setting}={raw!r} is not a {scheme} kernel; choose auto or one of "
                         f"{', '.join(kernels)}")
    if raw == "vnni" and not vnni_ready:
        others = [k for k in ("auto", *kernels) if k != "vnni"]
        raise ValueError(f"{setting}=vnni needs paged-core's AVX-512 kernels on a CPU with "
                         f"AVX512-VNNI; choose {', '.join(others[:-1])} or {others[-1]}")
    return raw


def int8_tiles_ready(kernels, vnni_ready: bool) -> bool:
    """Whether the int8 kernels' sums can run on AMX-INT8 tiles: the vpdpbusd kernels run
    (``vnni_ready``) and the C++ ``kernels`` are the ``avx512_bf16`` level's (the only one with
    the op) on a CPU whose OS grants the tiles."""
    ready = getattr(kernels, "amx_int8_ready", None)
    return vnni_ready and ready is not None and bool(ready())


def selected_w8a8_kernel(kernels, amx_selected: bool = False) -> tuple[str, int, int]:
    """The kernel (``W8A8_KERNELS``) that W8A8 linears built now with the C++ ``kernels`` (the
    selected level's ops, None where they do not build) take, from how many rows their sums are
    integer (0: never) and from how many rows they run on AMX-INT8 tiles (0: never):
    ``PAGED_CORE_CPU_W8A8`` if set (then ``vnni``, ``amx`` and ``onednn`` take every call),
    else ``auto``'s choice (module doc; ``amx_selected``: the bfloat16 linears take AMX tiles).
    Raises ``ValueError`` as ``named_int8_kernel`` does, and for ``amx`` where the tiles
    cannot run."""
    vnni_ready = kernels is not None and bool(kernels.int8_vnni_ready())
    amx_ready = int8_tiles_ready(kernels, vnni_ready)
    raw = named_int8_kernel(W8A8_SETTING, "W8A8", W8A8_KERNELS, vnni_ready)
    if raw == "amx" and not amx_ready:
        raise ValueError(f"{W8A8_SETTING}=amx needs paged-core's avx512_bf16 kernels on a CPU "
                         f"whose OS grants AMX-INT8 tiles; choose auto, vnni, onednn or float32")
    if raw == "auto":
        if vnni_ready:
            return "vnni", 1, AMX_FROM_ROWS if amx_ready and amx_selected else 0
        caps = torch.cpu.get_capabilities()
        int8_dot = any(caps.get(flag) is True for flag in _INT8_DOT_FLAGS)
        return ("onednn", ONEDNN_FROM_ROWS, 0) if int8_dot else ("float32", 0, 0)
    return raw, 0 if raw == "float32" else 1, 1 if raw == "amx" else 0


def per_token_levels(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``rows`` ``[M, K]`` as int8 levels held in float32 and its scale ``[M, 1]``:
    symmetric per token, ``absmax / 127`` (1 for a row of zeros), levels rounded half to even
    within -128..127; the bits of the C++ ``token_levels``."""
    rows = rows.float()
    scale = rows.abs().amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(rows / scale).clamp_(-128, 127), scale


class W8A8Linear(Int8Linear):
    def __init__(self, weight: Int8Weight, has_bias: bool, dtype: torch.dtype,
                 dense_dtype: torch.dtype | None = None) -> None:
        if weight.group_size != weight.q.shape[1]:
            raise ValueError("W8A8 weights need one scale per output channel, got groups of "
                             f"{weight.group_size}")
        super().__init__(weight, has_bias, dtype, dense_dtype)
        # int8_sums_from_rows: from how many rows the sums are integer (0: never);
        # amx_min_rows: from how many rows on AMX-INT8 tiles (0: never)
        self.kernel, self.int8_sums_from_rows, self.amx_min_rows = selected_w8a8_kernel(
            self.kernels, self._amx_selected())
        self.channel_scales = self.scales.reshape(-1)  # [out] float32, the same storage
        self.vnni_sums = None  # vnni, amx: 128 * each output's sum of levels (w8a8_vnni_pack)
        if self.kernel in ("vnni", "amx"):  # the levels in their layout only
            self.levels, self.vnni_sums = self.kernels.w8a8_vnni_pack(self.levels)

    def product(self, rows: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """float32, the activation scale multiplying the sums last; where ``out_dtype`` is
        bfloat16 the vnni layout's kernels round each output as they store it (the float32
        result's ``.to(torch.bfloat16)``, without writing it out first). The C++
        ``w8a8_product`` where the kernels build, else the same formula in torch ops."""
        if self.kernels is not None:
            rounded = torch.bfloat16 if out_dtype == torch.bfloat16 else None
            return self.kernels.w8a8_product(rows, self.levels, self.channel_scales,
                                             self.vnni_sums, self.int8_sums_from_rows,
                                             self.dense_rows, self.dense_dtype, self.amx_min_rows,
                                             rounded)
        levels, scale = per_token_levels(rows)
        if 0 < self.int8_sums_from_rows <= rows.shape[0]:
            sums = torch._int_mm(levels.to(torch.int8), self.levels.t())
            return (sums * self.channel_scales).mul_(scale)
        return super().product(levels).float() * scale
