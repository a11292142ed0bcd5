"""``EngineConfig`` <-> strings, for the places settings travel as text.

Invariant: ``EngineConfig.from_strings(config_strings(c))`` equals ``c`` (with
paths made absolute), and ``config_env`` is the same mapping as
``PAGED_CORE_*`` variables for ``EngineConfig.from_env()``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import fields

from paged_core.config import EngineConfig

_PATH_FIELDS = ("model", "tokenizer")


def config_strings(config: EngineConfig) -> dict[str, str]:
    """Every set field of ``config`` as a string (``None`` fields are left out)."""
    out = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif dataclasses.is_dataclass(value):  # speculative_config, kv_events_config: JSON
            value = json.dumps({k: v for k, v in dataclasses.asdict(value).items()
                                if v is not None})
        elif f.name in _PATH_FIELDS:
            value = os.path.abspath(value) if os.path.exists(value) else value
        out[f.name] = str(value)
    return out


def config_env(config: EngineConfig) -> dict[str, str]:
    """``PAGED_CORE_<FIELD>`` variables that ``EngineConfig.from_env()`` reads back as ``config``."""
    return {f"PAGED_CORE_{k.upper()}": v for k, v in config_strings(config).items()}
