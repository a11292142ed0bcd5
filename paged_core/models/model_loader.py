"""Resolve a model reference to a Hugging Face folder and load its config, weights and tokenizer.

Accepted references: ``None`` (the embedded SmolLM2-135M-Instruct), a folder
with ``config.json`` + ``*.safetensors``, or a ``.gguf`` file (converted once
through transformers and cached as safetensors).
"""
from __future__ import annotations

import glob
import os

import torch

from ..cpu.isa import packed_linear_dtype
from .embedded_model import converted_folder_for, embedded_model_folder
from .batch_invariant import make_batch_invariant
from .elementwise import select_ops
from .llama import LlamaForCausalLM
from .registry import family_for
from .sharding import ShardPlan
from ..executor.group import SINGLE, TensorParallelGroup


def resolve_model_folder(model: str | None) -> str:
    if model is None:
        return embedded_model_folder()
    if os.path.isfile(model) and model.endswith(".gguf"):
        return converted_folder_for(model)
    if os.path.isdir(model) and os.path.exists(os.path.join(model, "config.json")):
        return model
    raise ValueError(
        f"model {model!r} is neither a Hugging Face folder with config.json nor a .gguf file")


def load_hf_config(folder: str):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(folder)


def load_tokenizer(folder: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder)


def load_model(folder: str, hf_config, max_positions: int, dtype: torch.dtype,
               device: torch.device, tp: TensorParallelGroup = SINGLE,
               batch_invariant: bool = False, int4_gguf: str | None = None) -> LlamaForCausalLM:
    """Build the model without random init, then copy the checkpoint's weights in.

    ``batch_invariant`` tiles every projection so that a token's output does not depend on
    the rest of the batch (``models.batch_invariant``). ``int4_gguf`` (a GGUF file, the one
    ``folder`` was converted from) keeps its 4-bit projections 4-bit
    (``quantization.int4_projections``; CPU only).

    Under tensor parallelism each rank reads only its slices from the safetensors
    files (``ShardPlan.slice_of``): no rank ever holds the whole model.
    """
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    family = family_for(hf_config)
    spec = family.read_spec(hf_config)
    with torch.device("meta"):
        model = family.model_class(spec, tp)
    model = model.to(dtype).to_empty(device=device)  # no fp32 copy: meta tensors are free to cast
    model.attach_rotary(hf_config, max_positions, dtype, device)
    tensors = _read_shard(files, model.shard)
    with torch.no_grad():
        model.load_hf_state_dict(tensors)
    model = model.eval().requires_grad_(False)
    if int4_gguf is not None:
        _use_gguf_int4(model, int4_gguf, hf_config, dtype, device)
    compute_dtype = packed_linear_dtype(device, dtype)
    if compute_dtype is not None:
        model.pack_for_cpu(compute_dtype)
    if batch_invariant:
        make_batch_invariant(model)
    model.use_ops(select_ops(device, dtype))
    return model


def _use_gguf_int4(model: LlamaForCausalLM, path: str, hf_config, dtype: torch.dtype,
                   device: torch.device) -> None:
    from ..quantization.gguf_int4 import gguf_int4_weights
    from ..quantization.int4_projections import use_int4_projections

    if device.type != "cpu":
        raise ValueError(f"quantization='gguf' runs on the CPU only, not on {device.type}")
    spec = model.spec
    weights = gguf_int4_weights(path, spec.num_heads, spec.num_kv_heads)
    if not use_int4_projections(model, weights, dtype):
        raise ValueError(f"quantization='gguf': {os.path.basename(path)} has no Q4_0 / Q4_1 "
                         f"projections to serve 4-bit")


def _read_shard(files: list[str], shard: ShardPlan) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor, or only this rank's slice of it, read from disk."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                part = f.get_slice(name)
                index = shard.slice_of(name, tuple(part.get_shape()))
                tensors[name] = f.get_tensor(name) if index is None else part[index]
    return tensors
