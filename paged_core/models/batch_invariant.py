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

from torch import nn

from .moe import SparseMoeBlock
from .row_tiles import TILE_ROWS, RowTiledLinear, WeightProduct


def make_batch_invariant(model: nn.Module, tile_rows: int = TILE_ROWS) -> None:
    """Wrap every projection of ``model`` (after ``pack_for_cpu``, if any) in a
    ``RowTiledLinear``, the LM head included; a row-parallel layer of a tensor-parallel group
    tiles its local product and keeps its all-reduce; mixture-of-experts blocks run their
    expert GEMMs in the same row tiles."""
    from .cpu_linear import PACKED_LINEARS
    from .parallel_layers import RowParallelLinear

    for module in list(model.modules()):
        if isinstance(module, SparseMoeBlock):
            module.tile_rows = tile_rows
        for name, child in list(module.named_children()):
            if isinstance(child, RowParallelLinear) and child.tp.size > 1:
                child.matmul = RowTiledLinear(child.matmul or WeightProduct(child.weight),
                                              tile_rows)
            elif isinstance(child, (nn.Linear, *PACKED_LINEARS)):
                setattr(module, name, RowTiledLinear(child, tile_rows))
    if model.lm_head is None:  # tied to the embedding and not packed
        model.lm_head = RowTiledLinear(WeightProduct(model.embed_tokens.weight), tile_rows)
