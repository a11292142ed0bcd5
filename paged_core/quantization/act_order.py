"""Act-order weights: quantization groups that gather input features out of order.

GPTQ with ``desc_act`` quantizes the input features in order of decreasing activation and
records each feature's group in ``g_idx``: a group's features are scattered over the input.
Sorting the features by group (``group_order``) makes every group contiguous, so the weight
with its columns in that order is an ordinary ``Int4Weight`` / ``Int8Weight``; the linear
then reads its input in the same order:

    y = x[..., order] @ W_sorted.T,   W[:, order] = W_sorted

``ActOrderWeight`` carries the sorted weight and ``order``; ``ActOrderLinear`` applies it
(``projections.quantized_linear`` builds one). Output rows can be cut and stacked (the
fused q/k/v or gate/up of one input share ``order`` when quantized from one Hessian; parts
whose orders differ run as separate linears), but input features cannot: a row-parallel
cut takes contiguous *original* features, which cross the sorted groups, so act-order
row-parallel projections are refused under tensor parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .int4_linear import Int4Weight
from .int8_linear import Int8Weight


def group_order(module: str, g_idx: torch.Tensor | None, width: int,
                group_size: int) -> torch.Tensor | None:
    """The input features sorted by group (``None`` if already in order): after sorting,
    feature ``j`` must fall in group ``j // group_size``, else ``ValueError``."""
    if g_idx is None:
        return None
    expected = torch.arange(width) // group_size
    g_idx = g_idx.to(torch.int64).flatten()
    if g_idx.numel() != width:
        raise ValueError(f"{module}: g_idx has {g_idx.numel()} entries for {width} input "
                         f"features")
    if torch.equal(g_idx, expected):
        return None
    order = torch.sort(g_idx, stable=True).indices
    if not torch.equal(g_idx[order], expected):
        raise ValueError(f"{module}: g_idx does not split the input features into groups of "
                         f"{group_size}")
    return order


@dataclass
class ActOrderWeight:
    weight: Int4Weight | Int8Weight  # columns in ``order``: groups contiguous
    order: torch.Tensor  # [in] int64: column j is input feature order[j]
    module: str  # for messages

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape

    @property
    def group_size(self) -> int:
        return self.weight.group_size

    @property
    def kind(self) -> tuple:
        """What parts must share to be stacked into one linear."""
        return type(self.weight), self.order.numpy().tobytes()

    def rows(self, index) -> "ActOrderWeight":
        return ActOrderWeight(self.weight.rows(index), self.order, self.module)

    def columns(self, start: int, stop: int) -> "ActOrderWeight":
        raise ValueError(f"{self.module}: an act-order (desc_act) weight cannot be cut by input "
                         f"features for tensor parallelism (its groups gather features from "
                         f"the whole input); serve it with tensor_parallel_size=1, or use a "
                         f"checkpoint quantized without desc_act (or with static_groups)")

    @staticmethod
    def cat(parts: list["ActOrderWeight"]) -> "ActOrderWeight":
        """Rows stacked; ``parts`` share one ``order`` (``quantized_linear`` checks ``kind``)."""
        inner = type(parts[0].weight).cat([p.weight for p in parts])
        return ActOrderWeight(inner, parts[0].order, parts[0].module)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight in the input's own feature order."""
        sorted_weight = self.weight.dequantize()
        weight = torch.empty_like(sorted_weight)
        weight[:, self.order] = sorted_weight
        return weight


class ActOrderLinear(nn.Module):
    """``y = x[..., order] @ W_sorted.T (+ bias)``: ``inner`` (bias-free) computes the product."""

    def __init__(self, inner: nn.Module, order: torch.Tensor, has_bias: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.order = order
        self.out_features, self.in_features = inner.out_features, inner.in_features
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype),
                                 requires_grad=False) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x.index_select(-1, self.order))
        return y if self.bias is None else y + self.bias
