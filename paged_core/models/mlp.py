"""``GatedMLP``: ``down(act(gate(x)) * up(x))``, the MLP of every family (and an MoE model's
dense layers and shared expert). ``gate`` and ``up`` are one fused column-parallel
projection (``gate_up_proj``, ``[gate | up]``); ``down_proj`` is row-parallel (one
all-reduce under tensor parallelism)."""
from __future__ import annotations

import torch
from torch import nn

from ..executor.group import TensorParallelGroup
from ..quantization.quantized_linear import QuantizedLinear
from .bf16_dot_linear import Bf16DotLinear
from .elementwise import TORCH_OPS
from .parallel_layers import RowParallelLinear


class GatedMLP(nn.Module):
    """SiLU-gated MLP of this rank's ``width`` channels (``ops.silu_and_mul``; in the
    product's epilogue where ``gate_up_proj`` is a ``Bf16DotLinear``, or a quantized linear
    on its dense path (``QuantizedLinear.dense_silu_and_mul``), and the ops are its level's
    fused C++ ops: the same bits, without the ``[T, 2 * width]`` product)."""

    def __init__(self, hidden_size: int, width: int, bias: bool, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * width, bias=bias)
        self.down_proj = RowParallelLinear(width, hidden_size, bias, tp)
        self.ops = TORCH_OPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj
        level = getattr(self.ops, "cpu_isa", None)  # the fused C++ ops' level, if any
        same_level = level is not None and level == getattr(gate_up, "level", None)
        if type(gate_up) is Bf16DotLinear and same_level:
            return self.down_proj(gate_up.silu_and_mul(x))
        if isinstance(gate_up, QuantizedLinear) and same_level:
            fused = gate_up.dense_silu_and_mul(x)
            if fused is not None:
                return self.down_proj(fused)
        return self.down_proj(self.ops.silu_and_mul(gate_up(x)))
