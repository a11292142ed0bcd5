"""Batch-invariant linears: a token's output never depends on what else is in the batch.

A GEMM library picks its algorithm (blocking, K-splitting across threads, a GEMV
path for one row) from the matrix shapes, so the same row multiplied as part of
1, 7 or 300 rows can come out different in the last bits; in bfloat16 such a
difference flips a greedy token now and then. vLLM's batch-invariant mode
fixes the kernels' tile sizes; here every projection multiplies its rows in
tiles of exactly ``TILE_ROWS`` rows (the last one zero-padded), so the library
always sees one shape per layer and each output row depends only on its input
row. The other per-token ops are batch-invariant by construction: the fused
norms, rotary and activation loop over rows; the C++ paged attention reduces
each query over its own keys, block by block in position order, whatever the
rest of the step holds (``paged_core/cpu/csrc/paged_attention.cpp``).

``TILE_ROWS`` trades decode for prefill: a step with fewer rows pays for a
whole tile, a long prompt runs as several tile-sized products (each layer's
weight stays in cache between them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TILE_ROWS = 16


class RowTiledLinear(nn.Module):
    """``inner`` (a row-wise product ``[rows, in] -> [rows, out]``) applied to fixed tiles of
    ``tile_rows`` rows: the result for a row is the same bits whatever the other rows are."""

    def __init__(self, inner: nn.Module, tile_rows: int = TILE_ROWS) -> None:
        super().__init__()
        self.inner = inner
        self.tile_rows = tile_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padded = -(-rows // self.tile_rows) * self.tile_rows
        if padded != rows:
            x = torch.cat([x, x.new_zeros(padded - rows, *x.shape[1:])])
        tiles = [self.inner(tile) for tile in x.split(self.tile_rows)]
        out = tiles[0] if len(tiles) == 1 else torch.cat(tiles)  # a decode step: one tile
        return out[:rows]


class WeightProduct(nn.Module):
    """``x @ weight.T`` of a weight owned elsewhere (a tied embedding, a row-parallel layer's
    local shard, which adds its bias after the all-reduce), so ``RowTiledLinear`` can wrap it."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def make_batch_invariant(model: nn.Module, tile_rows: int = TILE_ROWS) -> None:
    """Wrap every projection of ``model`` (after ``pack_for_cpu``, if any) in a
    ``RowTiledLinear``, the LM head included; a row-parallel layer of a tensor-parallel group
    tiles its local product and keeps its all-reduce."""
    from .cpu_linear import PACKED_LINEARS
    from .parallel_layers import RowParallelLinear

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RowParallelLinear) and child.tp.size > 1:
                child.matmul = RowTiledLinear(child.matmul or WeightProduct(child.weight),
                                              tile_rows)
            elif isinstance(child, (nn.Linear, *PACKED_LINEARS)):
                setattr(module, name, RowTiledLinear(child, tile_rows))
    if model.lm_head is None:  # tied to the embedding and not packed
        model.lm_head = RowTiledLinear(WeightProduct(model.embed_tokens.weight), tile_rows)
