"""The bfloat16 linear of CPUs with AVX2 or AVX-512: ``paged_core/cpu/csrc/bf16_dot_linear.cpp``.

A bfloat16 model at the ``avx512_bf16`` level (``paged_core.cpu.isa``) computes its
projections and LM head with ``vdpbf16ps`` over weights packed once at load time, in
place of oneDNN's packed linear (``cpu_linear.PackedLinear``): on the 2-core
AVX512-BF16 EPYC it streamed the weights of decode-sized batches (1-64 rows) 1.3-1.6x
faster and matched oneDNN at prefill sizes. Each row is summed in one fixed order
whatever the batch, so a row's result never depends on the rows beside it.

At the ``avx512`` level (AVX-512 without BF16: Skylake to Ice Lake servers) the same
kernel takes each pair of bfloat16 products as two float32 FMAs (``level="avx512"``), and at
the ``avx2`` level (Haswell on, Zen 1 to 3) the same FMAs on 8-lane registers (``level="avx2"``,
the avx512 level's very bits): the weights stay bfloat16, half the bytes of the float32 copy
oneDNN multiplies there.

On CPUs with AMX-BF16 (``PAGED_CORE_CPU_LINEAR=amx``, the default there) calls of
``AMX_MIN_ROWS`` rows or more (``cpu_linear``: every call) run on AMX tiles
(``bf16_amx_linear.cpp``), which read the same packed weight, with one copy of the weights:
prefill-sized products at AMX's rate, decode-sized ones on tiles of their own rows.
"""
from __future__ import annotations

import torch
from torch import nn

# The CPU levels (paged_core.cpu.isa) whose builds hold the kernel: vdpbf16ps, or float32 FMAs.
BF16_DOT_LEVELS = ("avx2", "avx512", "avx512_bf16")


class Bf16DotLinear(nn.Module):
    """``y = x @ W.T + b`` for bfloat16 ``x`` with ``W`` packed by ``pack_bf16_dot_weight``
    (inference only; the weight's in_features must be even).

    ``packed_weight`` is ``[ceil(out / 32), in / 2, 32, 2]`` bfloat16; ``bias`` is bfloat16.
    Calls of at least ``amx_min_rows`` rows (0: none) run on AMX tiles over the same packed
    weight where the CPU has AMX-BF16 and in_features is a multiple of 32; a row's bits then
    differ in the last places from a ``vdpbf16ps`` call's, and depend on nothing else."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 amx_min_rows: int = 0, level: str = "avx512_bf16") -> None:
        super().__init__()
        from ..cpu.extension import cpu_ops

        if level not in BF16_DOT_LEVELS:
            raise ValueError(f"Bf16DotLinear runs at the {' or '.join(BF16_DOT_LEVELS)} level, "
                             f"not {level}")
        if amx_min_rows and level != "avx512_bf16":
            raise ValueError("AMX tiles need the avx512_bf16 level")
        self.level = level  # whose build multiplies (cpu.extension.cpu_ops)
        # What the products are computed in (``isa.packed_linear_dtype``): bfloat16 pairs on
        # vdpbf16ps, or float32 FMAs of the bfloat16 values at avx2 and avx512.
        self.compute_dtype = torch.bfloat16 if level == "avx512_bf16" else torch.float32
        self._ops = cpu_ops(level)
        self.amx_min_rows = amx_min_rows
        self.out_features, self.in_features = weight.shape
        self.packed_weight = self._ops.pack_bf16_dot_weight(weight.detach().to(torch.bfloat16))
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """True if ``weight`` (``[out, in]``) can be packed: an even number of in_features."""
        return weight.dim() == 2 and weight.shape[1] % 2 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._ops.bf16_dot_linear(x, self.packed_weight, self.out_features, self.bias,
                                         self.amx_min_rows)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of this projection's product ``[gate | up]`` (a gate_up
        projection: out_features ``2 * I``), ``[..., I]``: bit for bit the same level's
        ``FusedCpuOps.silu_and_mul`` of ``self(x)``, computed in the product's epilogue
        (``bf16_dot_silu_and_mul``), so the ``[..., 2 * I]`` product never reaches memory."""
        return self._ops.bf16_dot_silu_and_mul(x, self.packed_weight, self.out_features, self.bias,
                                               self.amx_min_rows)
