"""Resolve a model reference to a Hugging Face folder and load its config, weights and tokenizer.

Accepted references: ``None`` (the embedded SmolLM2-135M-Instruct), a folder
with ``config.json`` + ``*.safetensors``, or a ``.gguf`` file (converted once
through transformers and cached as safetensors).
"""
from __future__ import annotations

import glob
import os

import torch

from ..config.setting_values import env_flag
from ..cpu.huge_pages import move_weights_to_huge_pages
from ..cpu.isa import packed_linear_dtype
from ..quantization.checkpoint_format import folder_format
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
               batch_invariant: bool = False, gguf_file: str | None = None) -> LlamaForCausalLM:
    """Build the model without random init, then copy the checkpoint's weights in.

    ``batch_invariant`` tiles every projection so that a token's output does not depend on
    the rest of the batch (``models.batch_invariant``). On the CPU the loaded weights are
    copied onto 2 MiB pages (``cpu.huge_pages.move_weights_to_huge_pages``) unless
    ``PAGED_CORE_WEIGHTS_ON_HUGE_PAGES=false``. Quantized projections stay quantized
    (``quantization.projections``; CPU only): those of a folder whose config has a
    ``quantization_config``, or those of ``gguf_file`` (the GGUF file ``folder`` was converted
    from), whose dense copies in ``folder`` are then skipped.

    Under tensor parallelism each rank reads only its slices from the safetensors
    files (``ShardPlan.slice_of``): no rank ever holds the whole model (quantized modules
    are read whole, then cut).
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
    compute_dtype = packed_linear_dtype(device, dtype)
    checkpoint = folder_format(hf_config)
    quantized_modules = checkpoint.quantized_modules(_tensor_names(files)) if checkpoint else set()
    tensors = _read_shard(files, model.shard, read_whole=quantized_modules)
    if checkpoint is not None or gguf_file is not None:
        _use_quantized_weights(model, tensors, checkpoint, quantized_modules, gguf_file,
                               dtype, compute_dtype, device)
    with torch.no_grad():
        model.load_hf_state_dict(tensors)
    model = model.eval().requires_grad_(False)
    if compute_dtype is not None:
        model.pack_for_cpu(compute_dtype)
    if batch_invariant:
        make_batch_invariant(model)
    # Before use_ops: the C++ decoder stack keeps the weights it is given.
    if device.type == "cpu" and env_flag("weights_on_huge_pages", default=True):
        move_weights_to_huge_pages(model)
    model.use_ops(select_ops(device, dtype))
    return model


def _use_quantized_weights(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor],
                           checkpoint, quantized_modules: set[str], gguf_file: str | None,
                           dtype: torch.dtype, dense_dtype: torch.dtype | None,
                           device: torch.device) -> None:
    """Swap the projections with stored quantized weights (taking their tensors out of
    ``tensors``); a GGUF file's dense copies of them are dropped from ``tensors``."""
    from ..quantization.projections import use_quantized_projections

    if device.type != "cpu":
        raise ValueError(f"quantized weights run on the CPU only, not on {device.type}")
    if checkpoint is not None:
        weights = {module: checkpoint.decode(module, {
            part: tensors.pop(f"{module}.{part}") for part in checkpoint.tensor_parts()
            if f"{module}.{part}" in tensors}) for module in sorted(quantized_modules)}
    else:
        from ..quantization.gguf_weights import gguf_weights
        weights = gguf_weights(gguf_file, model.spec.num_heads, model.spec.num_kv_heads)
    used = use_quantized_projections(model, weights, dtype, dense_dtype)
    if checkpoint is None:
        from ..quantization.gguf_weights import log_served
        log_served(gguf_file, used)
    if checkpoint is not None and used != set(weights):
        raise ValueError(f"{checkpoint.name}: quantized weights of "
                         f"{sorted(set(weights) - used)[:3]} cannot be served quantized "
                         f"(every part of a fused q/k/v or gate/up projection must be, and "
                         f"experts are served dense)")
    for module in used:
        tensors.pop(f"{module}.weight", None)


def _tensor_names(files: list[str]) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            names.update(f.keys())
    return names


def _read_shard(files: list[str], shard: ShardPlan,
                read_whole: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor, or only this rank's slice of it, read from disk; the tensors
    of the modules in ``read_whole`` whole (their biases sliced)."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                part = f.get_slice(name)
                # a quantized module's bias is a dense weight, sliced like any other
                whole = name.rsplit(".", 1)[0] in read_whole and not name.endswith(".bias")
                index = None if whole else shard.slice_of(name, tuple(part.get_shape()))
                tensors[name] = f.get_tensor(name) if index is None else part[index]
    return tensors
