"""``LoRALinear``: a base projection plus, for each row, the product of its adapter.

A wrapped projection serves ``parts``: the modules whose outputs it holds side by side
(``q_proj``, ``k_proj``, ``v_proj`` of the fused ``qkv_proj``; one part for ``o_proj``).
Each of the ``max_loras`` slots keeps its adapter's parts stacked so that one pair of GEMMs
covers them all: with ``r`` the adapter's largest rank over this projection,

- ``a[slot, p*r:(p+1)*r]`` is part ``p``'s ``lora_A`` (rows past its own rank are zero);
- ``b_t[slot, p*r:(p+1)*r, part columns]`` is part ``p``'s ``lora_B`` (transposed) times its
  ``scaling`` (block-diagonal: every other entry is zero),

so a row ``t`` of the adapter in ``slot`` gets ``y[t] += (a[slot, :P*r] @ x[t]) @ b_t[slot, :P*r]``.
A step's ``LoRABatch`` gives each row its slot; the two products run for all of the step's
rows and adapters at once (``products``: Punica's shrink and expand) on top of the one base
GEMM, whatever the mix of adapters.

The tables are in the dtype the products ask for (``table_dtype``: the model's, except
float32 for plain torch on a CPU); ``b_t`` is rounded to it after the scaling is folded in; the
products sum in float32 and round once into the base output's dtype.

Under tensor parallelism a column-parallel projection's ``b_t`` holds this rank's output
columns (``a`` whole); a row-parallel one (``o_proj``, ``down_proj``) holds this rank's input
columns of ``a`` and the whole ``b_t``: the rank's shrink is a partial sum, all-reduced
before the expand (the base output is already reduced), so every rank adds the same product.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..executor.group import TensorParallelGroup
from .products import LoRABatch, SlotWidths, TorchLoRAProducts


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
    ``row_parallel``: the base is a row-parallel projection of a group larger than one;
    ``products``: how the LoRA products run (``products.select_products``)."""

    def __init__(self, base: nn.Module, parts: list[ModulePart], in_features: int,
                 batch: LoRABatch, num_slots: int, max_rank: int, tp: TensorParallelGroup,
                 row_parallel: bool, dtype: torch.dtype, device: torch.device,
                 products=None) -> None:
        super().__init__()
        self.base = base
        self.parts = parts
        self.batch = batch
        self.tp, self.row_parallel = tp, row_parallel
        self.products = products or TorchLoRAProducts()
        width = len(parts) * max_rank
        out_features = max(p.start + p.size for p in parts)
        self.part_starts = [p.start for p in parts] + [out_features]  # where b_t's blocks sit
        self.a = torch.zeros(num_slots, width, in_features, dtype=dtype, device=device)
        self.b_t = torch.zeros(num_slots, width, out_features, dtype=dtype, device=device)
        self.widths = SlotWidths(num_slots, device)  # columns each slot's adapter uses

    def set_slot(self, slot: int, weights: dict[str, PartWeights]) -> None:
        """Hold in ``slot`` the given parts' shards (parts not given stay zero)."""
        self.a[slot].zero_()
        self.b_t[slot].zero_()
        rank = max((w.a.shape[0] for w in weights.values()), default=0)
        for index, part in enumerate(self.parts):
            w = weights.get(part.name)
            if w is None:
                continue
            cols = slice(index * rank, index * rank + w.a.shape[0])
            self.a[slot, cols].copy_(w.a)
            self.b_t[slot, cols, part.start:part.start + part.size].copy_((w.b * w.scaling).T)
        self.widths.set(slot, len(self.parts) * rank if weights else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.batch.token_slots is None:  # no row of this step runs an adapter
            return y
        if not self.row_parallel:
            self.products.apply(y, x, self.a, self.b_t, self.widths, self.part_starts, self.batch)
            return y
        shrunk = self.products.shrink(x, self.a, self.widths, self.batch)
        self.tp.all_reduce(shrunk)  # this rank's partial sums, before every rank expands
        self.products.expand(y, shrunk, self.b_t, self.widths, self.part_starts, self.batch)
        return y

