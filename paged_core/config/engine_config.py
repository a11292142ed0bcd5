"""``EngineConfig``: every setting of an engine under its flat name, made of typed parts.

Each part owns its settings, their defaults and their checks: ``ModelConfig``,
``CacheConfig``, ``SchedulerConfig``, ``ParallelConfig``, ``ServingConfig``, ``LoRAConfig``, plus
``speculative_config`` (a ``SpeculativeConfig``). ``EngineConfig`` inherits every part, so
users keep one flat set of names (``EngineConfig(max_num_seqs=8)``, ``LLM(max_num_seqs=8)``,
``PAGED_CORE_MAX_NUM_SEQS=8``, ``--max-num-seqs 8``), and a component that needs one part
takes it by that type (an ``EngineConfig`` is a ``SchedulerConfig``). Every bad setting
fails at construction with a ``ValueError`` that names it and says what to change.
"""
from __future__ import annotations

import os
import typing
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..kv_events.config import KVEventsConfig
from ..spec_decode.config import SpeculativeConfig
from .cache_config import CacheConfig
from .lora_config import LoRAConfig
from .model_config import ModelConfig
from .parallel_config import ParallelConfig
from .scheduler_config import SchedulerConfig
from .serving_config import ServingConfig
from .setting_values import parse_setting

_PARTS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, ServingConfig, LoRAConfig)


# Bases listed last part first: a dataclass takes its bases' fields from the last base on,
# so the fields run in _PARTS order (``model`` first).
@dataclass
class EngineConfig(LoRAConfig, ServingConfig, ParallelConfig, SchedulerConfig, CacheConfig,
                   ModelConfig):
    """Everything needed to build an engine: the fields of every part (see each part's
    docstring) and ``speculative_config``, which turns on speculative decoding with vLLM's
    dict (``{"method": "ngram", "num_speculative_tokens": 4, ...}`` or ``{"model":
    draft_folder, "num_speculative_tokens": 4}``; also as JSON text), validated into a
    ``SpeculativeConfig``; and ``kv_events_config``, which publishes the prefix cache's
    events for KV-aware routers with vLLM's dict and wire format (``{"enable_kv_cache_events":
    true, "publisher": "zmq", "endpoint": "tcp://*:5557", ...}``; ``KVEventsConfig``)."""

    speculative_config: dict | None = None
    kv_events_config: dict | None = None

    def __post_init__(self) -> None:
        for part in _PARTS:
            part.__post_init__(self)
        self.speculative_config = SpeculativeConfig.from_value(self.speculative_config)
        self.kv_events_config = KVEventsConfig.from_value(self.kv_events_config)
        if (self.lora_modules or self.allow_runtime_lora_updating) and not self.enable_lora:
            raise ValueError("lora_modules and allow_runtime_lora_updating need enable_lora=True")
        if self.speculative_config and self.speculative_config.method == "draft_model" \
                and self.tensor_parallel_size > 1:
            raise ValueError("speculative_config with a draft model needs tensor_parallel_size=1; "
                             "use method 'ngram' with tensor parallelism")
        if self.schedule_ahead and (self.speculative_config or self.tensor_parallel_size > 1
                                    or self.async_scheduling is False):
            raise ValueError("schedule_ahead needs async_scheduling, tensor_parallel_size=1 and "
                             "no speculative_config")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "EngineConfig":
        """Read ``PAGED_CORE_<FIELD>`` variables (e.g. ``PAGED_CORE_BLOCK_SIZE=32``).

        Keyword ``overrides`` win over the environment.
        """
        environ = os.environ if environ is None else environ
        types = field_types()
        values: dict[str, Any] = {}
        for name, hint in types.items():
            raw = environ.get(f"PAGED_CORE_{name.upper()}")
            if raw is not None and raw != "":
                values[name] = parse_setting(name, hint, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> "EngineConfig":
        """Build from string values (config files, CLI), converting each by its field type."""
        types = field_types()
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; allowed: {sorted(types)}")
        return cls(**{k: parse_setting(k, types[k], v) for k, v in values.items() if v != ""})


def field_types() -> dict[str, Any]:
    """Each ``EngineConfig`` field's resolved type, in field order."""
    hints = typing.get_type_hints(EngineConfig)
    return {f.name: hints[f.name] for f in fields(EngineConfig)}
