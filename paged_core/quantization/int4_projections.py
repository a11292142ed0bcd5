"""``use_int4_projections``: swap a loaded model's projections for ``Int4Linear``s.

A fused projection (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up) is swapped only
when every part it fuses is in ``weights``; a projection whose parts are stored otherwise
(a mixed-type file) keeps its dense weight. Mixture-of-experts blocks keep theirs.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.mlp import GatedMLP
from .int4_linear import Int4Linear, Int4Weight

_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "self_attn.o_proj": ("self_attn.o_proj",),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
          "mlp.down_proj": ("mlp.down_proj",)}


def use_int4_projections(model: nn.Module, weights: dict[str, Int4Weight],
                         dtype: torch.dtype) -> int:
    """Swap every projection of ``model.layers`` whose parts ``weights`` holds (Hugging Face
    names); returns how many were swapped."""
    swapped = 0
    for index, layer in enumerate(model.layers):
        for target, parts in _FUSED.items():
            if target.startswith("mlp.") and not isinstance(layer.mlp, GatedMLP):
                continue
            names = [f"model.layers.{index}.{part}.weight" for part in parts]
            if not all(name in weights for name in names):
                continue
            owner_name, attribute = target.split(".")
            owner = getattr(layer, owner_name)
            dense = getattr(owner, attribute)
            weight = Int4Weight.cat([weights[name] for name in names])
            if tuple(weight.q.shape) != tuple(dense.weight.shape):
                raise ValueError(f"layer {index} {target}: 4-bit weight {tuple(weight.q.shape)} "
                                 f"does not match the model's {tuple(dense.weight.shape)}")
            setattr(owner, attribute, Int4Linear(weight, dense.bias, dtype))
            swapped += 1
    return swapped
