"""Prepacked oneDNN linear layers for half-precision models on CPU.

``F.linear`` lets oneDNN reorder the weight into its blocked layout on every
call; packing each weight once at load time is faster and, on CPUs with native
bfloat16 dot products (AVX512-BF16 or AMX), gives bit-identical bfloat16
results, measured 1.2x (prefill-sized batches) to 1.8x (decode-sized batches)
faster on a 2-core AVX512-BF16 machine.

CPUs without them (AVX2 only) have no fast half-precision GEMM: there torch's
bfloat16 ``F.linear`` ran 3-6x slower than float32 at 16-256 rows. So a half
precision model computes each product in float32, rounding the output back to the
model's dtype, as a native kernel does after its float32 accumulation (only the
summation order differs): a float16 model through a float32 packed copy of each weight
(exact: every float16 value is a float32; twice the projection weights' memory), a
bfloat16 one through ``Bf16DotLinear`` (below). The KV cache and activations stay in the
model's dtype.

float32 models keep plain ``F.linear``: the packed kernel sums in another order,
and float32 is the reference dtype that must match transformers token for token.
Which kind a model gets is ``paged_core.cpu.isa.packed_linear_dtype`` (forced by
``PAGED_CORE_CPU_ISA``); ``packed_linear`` builds it. A bfloat16 model on a CPU with
AVX512-BF16 gets ``bf16_dot_linear.Bf16DotLinear`` instead of a bfloat16 ``PackedLinear``
(see there why) unless ``PAGED_CORE_CPU_LINEAR`` (``cpu_isa.selected_bf16_linear``) says
``onednn``. At the ``avx2`` and ``avx512`` levels (no AVX512-BF16) a bfloat16 weight that
would compute in float32 takes ``Bf16DotLinear`` too, whose float32 FMAs over the bfloat16
pairs are such a float32 product without the float32 copy (``PAGED_CORE_CPU_LINEAR=onednn``
keeps the float32-packed oneDNN linear there).
"""
from __future__ import annotations

import torch
from torch import nn

from .bf16_dot_linear import Bf16DotLinear


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` kept in oneDNN's packed layout in ``compute_dtype``
    (inference only); the output has the input's dtype.

    ``packed_weight`` (mkldnn layout) and ``bias`` are in ``compute_dtype``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.compute_dtype = compute_dtype or weight.dtype
        weight = weight.detach().to(self.compute_dtype)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if bias is None else bias.detach().to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.compute_dtype), self.packed_weight, self.bias,
                                               "none", [], "")
        return y.to(x.dtype)


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype,
                  cpu_isa: str | None = None) -> PackedLinear | Bf16DotLinear:
    """The fastest prepacked linear computing ``x @ weight.T + bias`` in ``compute_dtype`` at
    CPU level ``cpu_isa`` (default: the selected one): ``Bf16DotLinear`` where
    ``bf16_dot_level`` names a level and the weight fits, else ``PackedLinear``."""
    level = bf16_dot_level(weight.dtype, compute_dtype, cpu_isa)
    if level is not None and Bf16DotLinear.fits(weight):
        amx_min_rows = bf16_amx_min_rows() if level == "avx512_bf16" else 0
        return Bf16DotLinear(weight, bias, amx_min_rows, level)
    return PackedLinear(weight, bias, compute_dtype)


def bf16_dot_level(weight_dtype: torch.dtype, compute_dtype: torch.dtype,
                   cpu_isa: str | None = None) -> str | None:
    """The level whose ``Bf16DotLinear`` multiplies ``weight_dtype`` weights computing in
    ``compute_dtype`` at CPU level ``cpu_isa`` (default: the selected one), or ``None``:
    ``avx512_bf16`` for bfloat16 compute (the kernels built: a CPU with AVX512-BF16); the
    ``avx2`` or ``avx512`` level itself for bfloat16 weights computing in float32 there (its
    kernels built). Either way only while ``PAGED_CORE_CPU_LINEAR`` selects ``bf16_dot`` or
    ``amx`` (``selected_bf16_linear``)."""
    from ..cpu.extension import cpu_extension_available
    from ..cpu.isa import selected_bf16_linear, selected_cpu_isa

    if weight_dtype != torch.bfloat16:
        return None
    if compute_dtype == torch.bfloat16:
        level = "avx512_bf16"
    elif compute_dtype == torch.float32 and (cpu_isa or selected_cpu_isa()) in ("avx2", "avx512"):
        level = cpu_isa or selected_cpu_isa()
    else:
        return None  # the setting is not read where it chooses nothing
    if selected_bf16_linear() not in ("bf16_dot", "amx"):
        return None
    return level if cpu_extension_available(level) else None


def bf16_amx_min_rows() -> int:
    """``Bf16DotLinear``'s ``amx_min_rows`` under the selected kernel: ``AMX_MIN_ROWS`` for
    ``amx``, 0 (never AMX) for ``bf16_dot``. Where the OS refuses this process the AMX tile
    state (Linux before 5.16), ``auto`` keeps ``vdpbf16ps`` for every call (0) and an explicit
    ``amx`` raises ``RuntimeError`` (``cpu.extension.amx_granted``)."""
    from ..cpu.extension import amx_granted
    from ..cpu.isa import LINEAR_SETTING

    return AMX_MIN_ROWS if amx_granted(LINEAR_SETTING) else 0


def pack_linear_layers(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Replace every ``nn.Linear`` inside ``model`` by a ``packed_linear`` (in place); a
    row-parallel layer of a tensor-parallel group keeps its all-reduce and packs its product."""
    from .parallel_layers import RowParallelLinear

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RowParallelLinear) and child.tp.size > 1:
                child.matmul = packed_linear(child.weight, None, compute_dtype)
            elif isinstance(child, nn.Linear):
                setattr(module, name, packed_linear(child.weight, child.bias, compute_dtype))


# Calls of this many rows or more take AMX tiles under ``amx``: every call, since a call's
# last row block configures its tiles for its own rows (bf16_amx_linear.cpp). On a 2-core Xeon
# with AMX (30 layers of SmolLM2's projections, distinct weights, one process alternating)
# AMX took 10.6-12.2 ms at 1 row against vdpbf16ps' 12.2-14.5, 9.5-10.2 against 13.8-15.2 at
# 4-6 rows and 12.4 against 18.8 at 8. (Tiles of 32 rows, padded, had lost to vdpbf16ps
# below 8 rows.) With every call on AMX, a row's bits never depend on the call's size.
AMX_MIN_ROWS = 1

# Every prepacked kind ``packed_linear`` builds.
PACKED_LINEARS = (PackedLinear, Bf16DotLinear)
