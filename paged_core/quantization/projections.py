"""``use_quantized_projections``: give a model's projections their stored quantized weights.

Called on a freshly built model, before its dense weights are loaded. ``weights`` maps
Hugging Face module names (``model.layers.3.self_attn.q_proj``) to whole ``Int4Weight`` /
``Int8Weight``s. For each projection of a layer:

- the parts it fuses (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up) are cut to this
  rank's slice (``ShardPlan.slice_of`` on the dense name: rows for column-parallel parts,
  whole groups of input features for row-parallel ones) and stacked into one quantized
  linear; parts of different kinds (a GGUF Q4_K_M's Q6_K ``v_proj`` beside Q4_K ``q_proj``)
  run as one linear each, outputs concatenated;
- a row-parallel projection under tensor parallelism keeps its ``RowParallelLinear`` (the
  all-reduce and the bias) and computes its local product quantized;
- the linear's bias stays a parameter under the dense name, loaded with the rest;
- an act-order weight (``act_order.ActOrderWeight``) runs as an ``ActOrderLinear``, which
  reorders the input features; it cannot be cut row-parallel.

A projection is swapped only when every part it fuses is quantized; its dense weight
parameter is then gone, so the loader neither expects nor accepts a dense copy.
Mixture-of-experts blocks keep dense experts.

A quantized ``lm_head`` (a GGUF file's ``output`` or, tied, ``token_embd`` tensor; a folder
checkpoint whose recipe quantized the LM head) becomes the model's LM head, this rank's
vocabulary rows of it; the embedding stays dense (the loader's dense copy), so lookups read
whole rows. Returns the module names used.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.mlp import GatedMLP
from ..models.parallel_layers import RowParallelLinear
from .act_order import ActOrderLinear, ActOrderWeight
from .int4_linear import Int4Linear, Int4Weight
from .int8_linear import Int8Linear, Int8Weight
from .w4a8_linear import W4A8Linear
from .w8a8_linear import W8A8Linear

QuantizedWeight = Int4Weight | Int8Weight | ActOrderWeight

LM_HEAD = "lm_head"  # the name under which a quantized LM head comes in ``weights``
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "self_attn.o_proj": ("self_attn.o_proj",),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
          "mlp.down_proj": ("mlp.down_proj",)}


def use_quantized_projections(model: nn.Module, weights: dict[str, QuantizedWeight],
                              dtype: torch.dtype, dense_dtype: torch.dtype | None) -> set[str]:
    used: set[str] = set()
    for index, layer in enumerate(model.layers):
        for target, parts in _FUSED.items():
            if target.startswith("mlp.") and not isinstance(layer.mlp, GatedMLP):
                continue
            names = [f"model.layers.{index}.{part}" for part in parts]
            if not all(name in weights for name in names):
                continue
            owner_name, attribute = target.split(".")
            owner = getattr(layer, owner_name)
            dense = getattr(owner, attribute)
            local = [_shard(model.shard, name, weights[name]) for name in names]
            shape = (sum(w.shape[0] for w in local), local[0].shape[1])
            if shape != tuple(dense.weight.shape):
                raise ValueError(f"{names[0]}: quantized weight {shape} does not match the "
                                 f"model's {tuple(dense.weight.shape)}")
            has_bias = dense.bias is not None
            if isinstance(dense, RowParallelLinear) and dense.tp.size > 1:
                dense.matmul = quantized_linear(local, False, dtype, dense_dtype)
                dense.register_parameter("weight", None)
            else:
                setattr(owner, attribute, quantized_linear(local, has_bias, dtype, dense_dtype))
            used.update(names)
    if LM_HEAD in weights:
        model.lm_head = quantized_linear([_vocab_rows(model.shard, weights[LM_HEAD])], False,
                                         dtype, dense_dtype)
        used.add(LM_HEAD)
    return used


def quantized_linear(parts: list[QuantizedWeight], has_bias: bool, dtype: torch.dtype,
                     dense_dtype: torch.dtype | None = None) -> nn.Module:
    """One linear over the rows of ``parts`` stacked."""
    kinds = {(type(p), p.group_size, getattr(p, "activations_int8", False),
              getattr(p, "kind", None)) for p in parts}
    if len(kinds) > 1:
        return ConcatLinear([quantized_linear([p], False, dtype, dense_dtype) for p in parts],
                            has_bias, dtype)
    weight = type(parts[0]).cat(parts) if len(parts) > 1 else parts[0]
    if isinstance(weight, ActOrderWeight):  # reads its input features in the groups' order
        return ActOrderLinear(quantized_linear([weight.weight], False, dtype, dense_dtype),
                              weight.order, has_bias, dtype)
    if isinstance(weight, Int4Weight):
        linear = W4A8Linear if weight.activations_int8 else Int4Linear
        return linear(weight, has_bias, dtype, dense_dtype)
    if weight.activations_int8:
        return W8A8Linear(weight, has_bias, dtype, dense_dtype)
    return Int8Linear(weight, has_bias, dtype, dense_dtype)


class ConcatLinear(nn.Module):
    """Linears over the same input whose outputs are concatenated (then the bias added)."""

    def __init__(self, parts: list[nn.Module], has_bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        width = sum(p.out_features for p in parts)
        self.bias = nn.Parameter(torch.zeros(width, dtype=dtype),
                                 requires_grad=False) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias


def _vocab_rows(shard, weight: QuantizedWeight) -> QuantizedWeight:
    """This rank's ``shard.vocab_size`` rows of a quantized LM head, from ``shard.vocab_start``;
    rows past the vocabulary (the last rank's padding) repeat its last row: their logits are
    cut off (``compute_logits``)."""
    spec = shard.spec
    if weight.shape != (spec.vocab_size, spec.hidden_size):
        raise ValueError(f"lm_head: quantized weight {weight.shape} does not match the model's "
                         f"{(spec.vocab_size, spec.hidden_size)} (vocabulary, hidden size)")
    if shard.size == 1:
        return weight
    rows = torch.arange(shard.vocab_start, shard.vocab_start + shard.vocab_size)
    return weight.rows(rows.clamp(max=spec.vocab_size - 1))


def _shard(shard, name: str, weight: QuantizedWeight) -> QuantizedWeight:
    """This rank's part of module ``name``'s weight (see the module doc)."""
    index = shard.slice_of(f"{name}.weight", weight.shape)
    if index is None:
        return weight
    if len(index) == 1:
        return weight.rows(index[0])
    columns = index[1]
    if columns.start % weight.group_size or columns.stop % weight.group_size:
        raise ValueError(f"{name}: tensor parallelism cuts its input features at "
                         f"{columns.start}:{columns.stop}, inside its groups of "
                         f"{weight.group_size}; use a tensor_parallel_size whose slices hold "
                         f"whole groups")
    return weight.columns(columns.start, columns.stop)
