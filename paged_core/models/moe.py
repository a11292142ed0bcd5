"""``SparseMoeBlock``: a mixture-of-experts MLP, computed grouped by expert.

Each token's router logits (``gate``, ``[num_experts, hidden]``) go through a float32
softmax; its ``top_k`` experts are the most probable (``torch.topk``), their
probabilities optionally renormalised to sum to 1 (``MoeSpec.norm_top_k``) and cast to
the model's dtype unless the family keeps them float32 (Mixtral). The output is
``sum_k p_k * expert_k(x)`` (plus, for Qwen2-MoE, ``sigmoid(shared_expert_gate(x)) *
shared_expert(x)``), as Hugging Face's ``*SparseMoeBlock`` computes it.

Grouped: the step's (token, expert) pairs are sorted by expert once; each expert that
any token chose runs one gate/up and one down GEMM over exactly its tokens' rows, so a
step costs what its active experts cost, never every expert for every token. Outputs are
added into the result expert by expert in increasing expert order, the order
transformers adds them in.

Weights: ``experts.gate_up_proj`` ``[num_experts, 2 * width, hidden]`` (``[gate | up]``
per expert) and ``experts.down_proj`` ``[num_experts, hidden, width]``, transformers'
layout; ``load_expert_weight`` also takes the per-expert tensors older checkpoints
store. Under tensor parallelism each rank holds every expert's slice of ``width``
channels (vLLM's fused-MoE split): the block's output is a partial sum, all-reduced
once (the shared expert's ``down_proj`` all-reduces its own).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..executor.group import TensorParallelGroup
from .elementwise import TORCH_OPS
from .mlp import GatedMLP
from .row_tiles import row_tiled
from .spec import DecoderSpec

# Per-expert weight names of older checkpoints (Mixtral's w1 / w3 / w2) -> the part they are
_EXPERT_PARTS = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
                  "down_proj": "down", "w2": "down"}


class Experts(nn.Module):
    """Every expert's gate/up and down weights, this rank's ``width`` channels of each."""

    def __init__(self, num_experts: int, hidden_size: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * width, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, width))


class SparseMoeBlock(nn.Module):
    def __init__(self, spec: DecoderSpec, width: int, shared_width: int,
                 tp: TensorParallelGroup) -> None:
        super().__init__()
        moe = spec.moe
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.norm_top_k, self.float32_weights = moe.norm_top_k, moe.float32_weights
        self.gate = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, spec.hidden_size, width)
        self.shared_expert = (GatedMLP(spec.hidden_size, shared_width, False, tp)
                              if shared_width else None)
        self.shared_expert_gate = nn.Linear(spec.hidden_size, 1, bias=False) if shared_width else None
        self.tp = tp
        self.ops = TORCH_OPS
        self.tile_rows = 0  # > 0: batch-invariant mode, expert GEMMs in fixed row tiles

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights, experts)``, both ``[tokens, top_k]``: each token's chosen experts."""
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.float32_weights else weights.to(logits.dtype)), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        out = torch.zeros_like(x)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        rows = x[tokens]  # every (token, expert) pair's input, grouped by expert
        pair_weights = weights.flatten()[order, None]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            part = slice(start, start + count)
            y = self._expert(expert, rows[part]) * pair_weights[part]
            out.index_add_(0, tokens[part], y.to(out.dtype))
            start += count
        if self.tp.size > 1:
            self.tp.all_reduce(out)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def _expert(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.experts.gate_up_proj[expert], self.experts.down_proj[expert]
        return self._linear(self.ops.silu_and_mul(self._linear(x, gate_up)), down)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not self.tile_rows:
            return F.linear(x, weight)
        return row_tiled(lambda tile: F.linear(tile, weight), x, self.tile_rows)

    def load_expert_weight(self, name: str, tensor: torch.Tensor, channels: slice) -> str:
        """Copy checkpoint tensor ``name`` in (relative to this block's ``experts``: the stacked
        ``gate_up_proj`` / ``down_proj``, or one expert's ``<e>.gate_proj.weight`` ... of older
        checkpoints); returns the parameter it went to. ``channels``: this rank's range of each
        expert's width; every tensor arrives cut to it (``ShardPlan.slice_of``) but the stacked
        ``gate_up_proj``, read whole, whose gate and up halves are cut here."""
        experts = self.experts
        if name == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            experts.gate_up_proj.data.copy_(torch.cat([gate[:, channels], up[:, channels]], 1))
            return name
        if name == "down_proj":
            experts.down_proj.data.copy_(tensor)
            return name
        index, part = name.split(".")[:2]
        e, width, kind = int(index), experts.width, _EXPERT_PARTS[part]
        if kind == "down":
            experts.down_proj.data[e].copy_(tensor)
            return "down_proj"
        rows = slice(0, width) if kind == "gate" else slice(width, 2 * width)
        experts.gate_up_proj.data[e, rows].copy_(tensor)
        return "gate_up_proj"
