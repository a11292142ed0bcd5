"""``LoRALinear``: a base projection plus, for each row, the product of its adapter.

A wrapped projection serves ``parts``: the modules whose outputs it holds side by side
(``q_proj``, ``k_proj``, ``v_proj`` of the fused ``qkv_proj``; one part for ``o_proj``).
Each of the ``max_loras`` slots keeps its adapter's parts stacked so that one pair of GEMMs
covers them all: with ``r`` the adapter's largest rank over this projection,

- ``a[slot, p*r:(p+1)*r]`` is part ``p``'s ``lora_A`` (rows past its own rank are zero);
- ``b[slot, part columns, p*r:(p+1)*r]`` is part ``p``'s ``lora_B`` times its ``scaling``
  (block-diagonal: every other entry is zero),

so ``y[rows] += (x[rows] @ a[slot, :P*r].T) @ b[slot, :, :P*r].T``. A step's ``LoRABatch``
groups its token rows by slot; each group costs one such pair on top of the one base GEMM
(Punica's segment idea), whatever the mix of adapters.

The tables, and so the two products, are in ``table_dtype``: float32 on a CPU (a bf16 GEMM
with an inner size of a LoRA rank takes a slow path there without native bf16 dot products:
~20x float32's time measured on an AVX2 EPYC, more than the base GEMM for rank 8), the
model's dtype on a GPU; the sum is added to the base output in its dtype.

Under tensor parallelism a column-parallel projection's ``b`` holds this rank's output rows
(``a`` whole); a row-parallel one (``o_proj``, ``down_proj``) holds this rank's input
columns of ``a`` and the whole ``b``: the rank's ``x @ a.T`` is a partial sum, all-reduced
before ``b`` (the base output is already reduced), so every rank adds the same product.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..executor.group import TensorParallelGroup


@dataclass
class LoRABatch:
    """This step's token rows per slot: ``(slot, rows)`` with ``rows`` an index tensor on the
    model's device, or ``None`` when the slot's rows are all of the step's rows."""

    segments: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)


@dataclass(frozen=True)
class ModulePart:
    """Module ``name``'s output columns ``[start, start + size)`` of the wrapped projection."""

    name: str
    start: int
    size: int


@dataclass(frozen=True)
class PartWeights:
    """One part's shard for a slot: ``a`` ``[r, in]``, ``b`` ``[size, r]``, ``scaling``."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


class LoRALinear(nn.Module):
    """``base`` (any projection module) with LoRA products added (see the module docstring).
    ``row_parallel``: the base is a row-parallel projection of a group larger than one."""

    def __init__(self, base: nn.Module, parts: list[ModulePart], in_features: int,
                 batch: LoRABatch, num_slots: int, max_rank: int, tp: TensorParallelGroup,
                 row_parallel: bool, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.parts = parts
        self.batch = batch
        self.tp, self.row_parallel = tp, row_parallel
        width = len(parts) * max_rank
        out_features = max(p.start + p.size for p in parts)
        self.a = torch.zeros(num_slots, width, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, out_features, width, dtype=dtype, device=device)
        self.width = [0] * num_slots  # columns of a/b the slot's adapter uses (0: none)

    def set_slot(self, slot: int, weights: dict[str, PartWeights]) -> None:
        """Hold in ``slot`` the given parts' shards (parts not given stay zero)."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        rank = max((w.a.shape[0] for w in weights.values()), default=0)
        for index, part in enumerate(self.parts):
            w = weights.get(part.name)
            if w is None:
                continue
            cols = slice(index * rank, index * rank + w.a.shape[0])
            self.a[slot, cols].copy_(w.a)
            self.b[slot, part.start:part.start + part.size, cols].copy_(w.b * w.scaling)
        self.width[slot] = len(self.parts) * rank if weights else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        for slot, rows in self.batch.segments:
            width = self.width[slot]
            if not width:
                continue
            xs = x if rows is None else x.index_select(0, rows)
            shrunk = xs.to(self.a.dtype) @ self.a[slot, :width].T
            if self.row_parallel:
                self.tp.all_reduce(shrunk)
            delta = shrunk @ self.b[slot, :, :width].T
            if rows is None:
                y.add_(delta)
            else:
                y.index_add_(0, rows, delta.to(y.dtype))
        return y


def table_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype of the LoRA tables and products (see the module docstring)."""
    return torch.float32 if device.type == "cpu" else model_dtype
