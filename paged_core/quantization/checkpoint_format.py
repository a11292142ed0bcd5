"""Which stored quantization a checkpoint uses, and the reader that decodes it.

``quantization`` is vLLM's name for it. A Hugging Face folder states its own in
``config.json``'s ``quantization_config.quant_method``; a ``.gguf`` file's projections are
read by their GGUF tensor types (``gguf_weights``). Each folder reader offers:

- ``quantized_modules(names)``: the modules among the checkpoint's tensor names that hold
  quantized weights (read whole by every rank, cut after decoding);
- ``tensor_parts()``: the tensor suffixes such a module may hold;
- ``decode(module, tensors)``: an ``Int4Weight`` / ``Int8Weight`` from those tensors.
"""
from __future__ import annotations

import importlib
import json
import os

# quant_method -> (module, class) of its reader, imported when a checkpoint needs it
FOLDER_FORMATS = {
    "compressed-tensors": ("compressed_tensors_format", "CompressedTensorsFormat"),
    "gptq": ("gptq_format", "GptqFormat"),
    "awq": ("awq_format", "AwqFormat"),
}
QUANTIZATIONS = ("gguf", *FOLDER_FORMATS)


def stored_quantization(model: str | None) -> str | None:
    """The quantization ``model`` is stored in: ``"gguf"`` for a ``.gguf`` file, a folder's
    ``quant_method``, else ``None`` (the embedded model is served dense unless asked)."""
    if model is None:
        return None
    if model.endswith(".gguf"):
        return "gguf"
    config_path = os.path.join(model, "config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path) as f:
        config = json.load(f).get("quantization_config")
    if config is None:
        return None
    method = config.get("quant_method")
    if method not in FOLDER_FORMATS:
        raise ValueError(f"model {model!r} is stored with quant_method {method!r}, which is not "
                         f"served (served: {', '.join(FOLDER_FORMATS)}, and GGUF files)")
    return method


def folder_format(hf_config):
    """The reader of ``hf_config``'s ``quantization_config``, or ``None`` if it has none."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    config = config if isinstance(config, dict) else config.to_dict()
    module, name = FOLDER_FORMATS[config["quant_method"]]
    reader = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return reader(config)
