"""Reading a PEFT LoRA adapter folder and checking it against the base model.

PEFT saves ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``, ...) and ``adapter_model.safetensors`` with, per adapted linear,
``base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``; the adapted layer computes ``W x + scaling * B (A x)``
with ``scaling = lora_alpha / r`` (rsLoRA: ``lora_alpha / sqrt(r)``; ``rank_pattern`` gives
some modules their own ``r``, read here from the tensors' shapes).

Served: the attention and MLP projections of the decoder layers (``q/k/v/o_proj``,
``gate/up/down_proj`` and the fused ``qkv_proj`` / ``gate_up_proj`` of Phi-3 checkpoints) of
dense layers. Refused, naming what to change: DoRA, trained biases, ``modules_to_save``,
``alpha_pattern``, other modules (embeddings, LM head, experts), shapes that do not match
the base model, ranks over ``max_lora_rank``.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

from ..exceptions import ParamValidationError
from ..models.spec import DecoderSpec
from .request import LoRARequest

# module name -> (sublayer, input width, output width), widths from the model's spec
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "gate_up_proj", "down_proj")
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class LoRAModule:
    """One adapted projection: ``a`` ``[r, in]``, ``b`` ``[out, r]`` (float32, CPU)."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter's modules keyed by ``(layer index, module name)``."""

    request: LoRARequest
    modules: dict[tuple[int, str], LoRAModule]

    @property
    def rank(self) -> int:
        return max(m.rank for m in self.modules.values())


def module_shapes(spec: DecoderSpec) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of every servable module of ``spec`` (whole, not sharded)."""
    q, kv, hidden = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.hidden_size
    width = spec.intermediate_size
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "qkv_proj": (hidden, q + 2 * kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, width), "up_proj": (hidden, width),
            "gate_up_proj": (hidden, 2 * width), "down_proj": (width, hidden)}


def _refuse(request: LoRARequest, why: str) -> ParamValidationError:
    return ParamValidationError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): "
                                f"{why}", "lora_request")


def read_adapter_config(request: LoRARequest) -> dict:
    path = os.path.join(request.lora_path, "adapter_config.json")
    if not os.path.exists(path):
        raise _refuse(request, "no adapter_config.json: give a folder saved by PEFT's "
                               "save_pretrained")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("peft_type", "LORA") != "LORA":
        raise _refuse(request, f"peft_type {config.get('peft_type')!r} is not LORA")
    for key, allowed in (("use_dora", False), ("bias", "none")):
        if config.get(key, allowed) not in (allowed, None):
            raise _refuse(request, f"{key}={config[key]!r} is not supported (only {allowed!r})")
    for key in ("modules_to_save", "alpha_pattern"):
        if config.get(key):
            raise _refuse(request, f"{key} is not supported: {config[key]!r}")
    return config


def load_adapter(request: LoRARequest, spec: DecoderSpec, max_lora_rank: int) -> LoRAAdapter:
    """The adapter's modules, checked against ``spec`` (see the module docstring)."""
    from safetensors.torch import load_file

    config = read_adapter_config(request)
    weights_path = os.path.join(request.lora_path, "adapter_model.safetensors")
    if not os.path.exists(weights_path):
        raise _refuse(request, "no adapter_model.safetensors (PEFT's safe_serialization)")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(weights_path).items():
        match = _KEY.match(name)
        if match is None:
            raise _refuse(request, f"weight {name!r} adapts a module that cannot be served "
                                   f"(only {ATTENTION_MODULES + MLP_MODULES} of the layers)")
        layer, sublayer, module, which = int(match[1]), match[2], match[3], match[4]
        expected = ATTENTION_MODULES if sublayer == "self_attn" else MLP_MODULES
        if module not in expected or layer >= spec.num_layers or spec.is_sparse(layer):
            raise _refuse(request, f"weight {name!r} adapts a module this model lacks")
        pairs.setdefault((layer, module), {})[which] = tensor.float()
    if not pairs:
        raise _refuse(request, "adapter_model.safetensors holds no LoRA weights")
    shapes, alpha = module_shapes(spec), float(config.get("lora_alpha", 8))
    modules = {}
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise _refuse(request, f"layer {layer} {module} lacks lora_A or lora_B")
        a, b = pair["A"], pair["B"]
        rank, (width_in, width_out) = a.shape[0], shapes[module]
        if tuple(a.shape) != (rank, width_in) or tuple(b.shape) != (width_out, rank):
            raise _refuse(request, f"layer {layer} {module}: lora_A {list(a.shape)} / lora_B "
                                   f"{list(b.shape)} do not fit the base model's "
                                   f"{width_out}x{width_in} weight")
        if rank > max_lora_rank:
            raise _refuse(request, f"rank {rank} exceeds max_lora_rank={max_lora_rank}; "
                                   f"raise max_lora_rank")
        scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        modules[(layer, module)] = LoRAModule(a.contiguous(), b.contiguous(), scaling)
    return LoRAAdapter(request, modules)
