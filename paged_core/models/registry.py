"""The model families paged-core serves, keyed by the checkpoint's ``model_type``.

Each family lives in its own file (``llama.py``, ``gemma.py``, ``mixtral.py``,
``qwen_moe.py``, ``olmoe.py``) and describes itself with a ``ModelFamily`` (``family.py``): the
``model_type`` values and ``architectures`` it covers, how to read its ``DecoderSpec`` off
a config, the model class, and what it supports. Adding a family is adding a file and one entry to
``FAMILIES``. An unknown ``model_type`` is refused with the table of what is supported
(``supported_table``, the same table the README shows).
"""
from __future__ import annotations

from . import gemma, llama, mixtral, olmoe, qwen_moe
from .family import ModelFamily
from .spec import DecoderSpec

FAMILIES: tuple[ModelFamily, ...] = (llama.FAMILY, gemma.FAMILY, mixtral.FAMILY, qwen_moe.FAMILY,
                                     olmoe.FAMILY)


def family_for(hf_config) -> ModelFamily:
    """The family serving ``hf_config``; ``ValueError`` listing every supported one if none."""
    model_type = getattr(hf_config, "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise ValueError(f"model_type {model_type!r} is not supported; supported architectures:\n"
                     f"{supported_table()}")


def model_spec(hf_config) -> DecoderSpec:
    """``hf_config`` read by its family (``ValueError`` if unsupported)."""
    return family_for(hf_config).read_spec(hf_config)


def supported_table() -> str:
    """The supported architectures as a Markdown table (the README's)."""
    rows = [("family", "model_type", "architectures", "tensor parallel", "sliding window", "GGUF"),
            ("---",) * 6]
    rows += [(f.name, ", ".join(f.model_types), ", ".join(f.architectures), f.tensor_parallel,
              f.sliding_window, f.gguf) for f in FAMILIES]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)
