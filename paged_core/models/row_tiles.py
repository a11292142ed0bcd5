"""Row-tiled products: a row's result is the same bits whatever rows it is batched with
(the building block of batch-invariant mode, ``batch_invariant.py``)."""
from __future__ import annotations

from collections.abc import Callable

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
        return row_tiled(self.inner, x, self.tile_rows)


def row_tiled(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              tile_rows: int) -> torch.Tensor:
    """``product`` (row-wise, ``[rows, in] -> [rows, out]``) over ``x`` in tiles of exactly
    ``tile_rows`` rows, the last one zero-padded."""
    rows = x.shape[0]
    padded = -(-rows // tile_rows) * tile_rows
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, *x.shape[1:])])
    tiles = [product(tile) for tile in x.split(tile_rows)]
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
