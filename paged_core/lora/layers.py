"""``LoRALinear``: a base projection plus, for each row, the product of its adapter.

One wrapped projection holds, per module it serves (``q_proj`` of the fused ``qkv_proj``,
...), stacked weights of the ``max_loras`` slots: ``a`` ``[slots, max_rank, in]`` and ``b``
``[slots, out, max_rank]`` in this rank's shard, of which slot ``s`` uses the first
``rank[s]`` ranks. A step's ``LoRABatch`` groups its token rows by slot; for each group
the wrapper runs two GEMMs over the group's rows (Punica's segment idea: the adapters of
one batch cost one pair of small GEMMs each, on top of the one base GEMM), scaled by the
adapter's ``scaling``, and adds the result to the module's output columns:

    y[rows, cols] += scaling * (x[rows] @ a[s, :r].T) @ b[s, :, :r].T

Under tensor parallelism a column-parallel module's ``b`` holds this rank's output rows
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
    """Module ``name``'s output columns ``[start, start + size)`` of the wrapped projection
    (whole projection: ``start`` 0, ``size`` its width)."""

    name: str
    start: int
    size: int


class LoRALinear(nn.Module):
    """``base`` (any projection module) with LoRA products added (see the module docstring).
    ``row_parallel``: the base is a row-parallel projection of a group larger than one."""

    def __init__(self, base: nn.Module, parts: list[ModulePart], in_features: int,
                 batch: LoRABatch, num_slots: int, max_rank: int, tp: TensorParallelGroup,
                 row_parallel: bool, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.parts = {p.name: p for p in parts}
        self.in_features = in_features
        self.batch = batch
        self.num_slots, self.max_rank = num_slots, max_rank
        self.tp, self.row_parallel = tp, row_parallel
        self.dtype, self.device = dtype, device
        self.weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # allocated on use
        # per slot: module name -> (rank, scaling) of the adapter it holds
        self.active: list[dict[str, tuple[int, float]]] = [{} for _ in range(num_slots)]

    def set_slot(self, slot: int, name: str, a: torch.Tensor | None, b: torch.Tensor | None,
                 scaling: float = 0.0) -> None:
        """Put module ``name``'s shard ``a`` ``[r, in]``, ``b`` ``[out, r]`` in ``slot``
        (``a`` None: the slot's adapter leaves that module alone)."""
        if a is None:
            self.active[slot].pop(name, None)
            return
        if name not in self.weights:
            shapes = ((self.num_slots, self.max_rank, self.in_features),
                      (self.num_slots, self.parts[name].size, self.max_rank))
            self.weights[name] = tuple(torch.zeros(shape, dtype=self.dtype, device=self.device)
                                       for shape in shapes)
        stack_a, stack_b = self.weights[name]
        rank = a.shape[0]
        stack_a[slot, :rank].copy_(a)
        stack_b[slot, :, :rank].copy_(b)
        self.active[slot][name] = (rank, scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        for slot, rows in self.batch.segments:
            modules = self.active[slot]
            if not modules:
                continue
            xs = x if rows is None else x.index_select(0, rows)
            for name, (rank, scaling) in modules.items():
                stack_a, stack_b = self.weights[name]
                shrunk = xs @ stack_a[slot, :rank].T
                if self.row_parallel:
                    self.tp.all_reduce(shrunk)
                delta = (shrunk @ stack_b[slot, :, :rank].T) * scaling
                part = self.parts[name]
                columns = y[:, part.start:part.start + part.size]
                if rows is None:
                    columns += delta
                else:
                    columns.index_add_(0, rows, delta.to(y.dtype))
        return y

