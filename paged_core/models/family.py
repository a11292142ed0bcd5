"""``ModelFamily``: how one model family describes itself to the registry (``registry.py``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .spec import DecoderSpec


@dataclass(frozen=True)
class ModelFamily:
    """One family: the checkpoints it loads and what it supports."""

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]  # config.architectures values, for the table
    read_spec: Callable[[object], DecoderSpec]  # hf_config -> spec (raises on what it cannot serve)
    model_class: type  # (spec, tp) -> the model
    tensor_parallel: str  # "yes", or what limits it
    sliding_window: str
    gguf: str
