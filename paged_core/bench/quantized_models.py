"""compressed-tensors checkpoints of a float folder, made with compressed-tensors' own code
(for ``bench throughput`` / ``bench quality`` and the tests).

``llmcompressor`` (which writes these for users) cannot share this venv (it pins older
transformers and numpy 2); it calls the same library underneath: ``apply_quantization_config``
attaches a preset scheme (``W4A16``, ``W4A16_ASYM``, ``W8A16``, ``W8A8``, ``W4A8``), the scales and zero
points come from ``calculate_qparams`` over each weight's min/max (round to nearest, what
llmcompressor's ``QuantizationModifier`` does without calibration data for weights), and
``ModelCompressor`` packs and saves. Beside each checkpoint a *dequantized twin*: the same
model with every quantized weight replaced by ``fake_quantize`` of it (float32 weights
that equal the stored levels times their scales), the reference where transformers cannot
load the packed form.
"""
from __future__ import annotations

import os
import tempfile

import torch

# The embedded model's weights as each quantized system serves them: its own GGUF file's
# Q4_1 projections, llama.cpp's Q4_K_M, Q5_K_M or IQ4_XS file of it (``llama_cpp_models``:
# built with llama.cpp on first use, minutes), or a compressed-tensors scheme (groups of 64:
# 576 features = 9 groups)
QUANTIZED_KINDS = ("gguf-q4_1", "gguf-q4_k_m", "gguf-q5_k_m", "gguf-iq4_xs", "w4a16", "w8a16",
                   "w8a8", "w4a8")
_SCHEMES = {"w4a16": ("W4A16", 64, None), "w8a16": ("W8A16", None, "channel"),
            "w8a8": ("W8A8", None, None), "w4a8": ("W4A8", 64, None)}


def quantized_engine_args(kind: str) -> dict:
    """``LLM`` arguments serving the embedded model quantized as ``kind``; a compressed-tensors
    checkpoint is written once under ``~/.cache/paged-core/quantized``."""
    from ..models.embedded_model import cache_dir, embedded_model_folder

    if kind == "gguf-q4_1":
        return {"quantization": "gguf"}
    if kind.startswith("gguf-"):  # a file llama.cpp's llama-quantize makes
        from .llama_cpp_models import gguf_path
        return {"model": str(gguf_path(kind.removeprefix("gguf-"))), "quantization": "gguf"}
    scheme, group_size, strategy = _SCHEMES[kind]
    out = os.path.join(cache_dir(), "quantized", kind)
    checkpoint = os.path.join(out, scheme)
    if not os.path.isdir(checkpoint):  # written aside, then renamed: never seen half-written
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            made, _ = compressed_tensors_checkpoint(embedded_model_folder(), scheme, scratch,
                                                    group_size, strategy)
            os.replace(made, checkpoint)
    return {"model": checkpoint}


def compressed_tensors_checkpoint(source: str, scheme_name: str, out: str,
                                  group_size: int | None = None, strategy: str | None = None,
                                  quantize_lm_head: bool = False) -> tuple[str, str]:
    """``(checkpoint, twin)`` folders for ``source`` quantized with preset ``scheme_name``
    (or ``<preset>_ASYM`` where compressed-tensors has no such preset: the preset's weights
    with zero points, e.g. ``W8A16_ASYM``); ``group_size`` / ``strategy`` override the
    preset's weight arguments. The LM head stays
    dense (llmcompressor's usual ``ignore=["lm_head"]``) unless ``quantize_lm_head`` (an
    untied head only: a tied one is the embedding too)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint, twin = os.path.join(out, scheme_name), os.path.join(out, f"{scheme_name}-twin")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    twin_model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    asymmetric = scheme_name not in PRESET_SCHEMES and scheme_name.endswith("_ASYM")
    scheme = preset_name_to_scheme(scheme_name.removesuffix("_ASYM") if asymmetric
                                   else scheme_name, ["Linear"])
    if asymmetric:
        scheme.weights.symmetric = False
    if strategy is not None:
        scheme.weights.strategy = strategy
        scheme.weights.group_size = group_size
    elif group_size is not None:
        scheme.weights.group_size = group_size
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=[] if quantize_lm_head
                                                        else ["lm_head"]))
    twin_weights = dict(twin_model.named_parameters())
    for name, module in model.named_modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        weight = module.weight.data
        if args.strategy == "group":
            grouped = weight.view(weight.shape[0], -1, args.group_size)
            low, high = grouped.amin(-1), grouped.amax(-1)
        else:
            low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
        scale, zero_point = calculate_qparams(low, high, args)
        module.weight_scale.data.copy_(scale)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero_point)
        twin_weights[f"{name}.weight"].data.copy_(
            fake_quantize(weight, scale, zero_point, args))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(checkpoint)
    compressor.update_config(checkpoint)
    twin_model.save_pretrained(twin)
    tokenizer = AutoTokenizer.from_pretrained(source)
    for folder in (checkpoint, twin):
        tokenizer.save_pretrained(folder)
    return checkpoint, twin
