"""Layers whose weights are split across a tensor-parallel group (see ``sharding``).

Column-parallel projections need no layer of their own: each rank holds an
``nn.Linear`` with its slice of output features and computes its slice of
heads or channels, no communication. These two do communicate:

- ``RowParallelLinear``: input features split; each rank's product is a partial
  sum, all-reduced once, then the (replicated) bias is added once;
- ``VocabParallelEmbedding``: vocabulary rows split; each rank looks up the ids
  it holds (zeros for the others) and the rows are all-reduced.

With a group of size 1 both compute exactly what ``nn.Linear``/``nn.Embedding`` do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..executor.group import TensorParallelGroup


class RowParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool,
                 tp: TensorParallelGroup) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp
        self.matmul: nn.Module | None = None  # a prepacked local product (``cpu_linear``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        y = F.linear(x, self.weight) if self.matmul is None else self.matmul(x)
        self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``vocab_start .. vocab_start + num_embeddings`` of the vocabulary on this rank."""

    def __init__(self, num_embeddings: int, embedding_dim: int, vocab_start: int,
                 tp: TensorParallelGroup) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.vocab_start = vocab_start
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(input_ids)
        local = input_ids - self.vocab_start
        elsewhere = (local < 0) | (local >= self.num_embeddings)
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        rows.masked_fill_(elsewhere[:, None], 0)
        return self.tp.all_reduce(rows)
