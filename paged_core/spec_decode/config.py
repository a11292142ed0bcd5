"""``SpeculativeConfig``: vLLM's ``speculative_config`` dict, validated.

Accepted forms (vLLM's keys)::

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    {"model": "path/to/draft", "num_speculative_tokens": 4}      # method "draft_model"

As in vLLM: ``model`` without ``method`` means ``"draft_model"`` (``"ngram"`` /
``"[ngram]"`` as the model means the n-gram method); when only one of
``prompt_lookup_min``/``prompt_lookup_max`` is given the other takes its value,
when neither is, both are 5. Every bad value raises ``ValueError`` naming the key.
A JSON string (``PAGED_CORE_SPECULATIVE_CONFIG``, ``--speculative-config``) is read too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from ..config.setting_values import dict_setting

METHODS = ("ngram", "draft_model")
_DEFAULT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    @classmethod
    def from_value(cls, value: "SpeculativeConfig | dict | str | None"
                   ) -> "SpeculativeConfig | None":
        """Build from a dict (or its JSON text); ``None`` (or ``{}``) means no speculation."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        value = dict_setting("speculative_config", value, {f.name for f in fields(cls)})
        if value is None:
            return None
        return cls._validated(value)

    @classmethod
    def _validated(cls, v: dict[str, Any]) -> "SpeculativeConfig":
        method, model = v.get("method"), v.get("model")
        if model in ("ngram", "[ngram]"):
            method, model = method or "ngram", None
        if method is None:
            if model is None:
                raise ValueError("speculative_config needs 'method' ('ngram') or 'model' "
                                 "(a draft model folder)")
            method = "draft_model"
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, "
                             f"got {method!r}")
        k = v.get("num_speculative_tokens")
        if k is None:
            raise ValueError("speculative_config['num_speculative_tokens'] is required")
        _positive_int("num_speculative_tokens", k)
        lookup_max, lookup_min = v.get("prompt_lookup_max"), v.get("prompt_lookup_min")
        if method == "ngram":
            if model is not None:
                raise ValueError("speculative_config['model'] is not used by method 'ngram'; "
                                 "remove it or use method 'draft_model'")
            if lookup_max is None and lookup_min is None:
                lookup_max = lookup_min = _DEFAULT_LOOKUP
            lookup_max = lookup_min if lookup_max is None else lookup_max
            lookup_min = lookup_max if lookup_min is None else lookup_min
            _positive_int("prompt_lookup_max", lookup_max)
            _positive_int("prompt_lookup_min", lookup_min)
            if lookup_min > lookup_max:
                raise ValueError(f"speculative_config['prompt_lookup_min'] ({lookup_min}) must be "
                                 f"<= prompt_lookup_max ({lookup_max})")
        else:
            if not isinstance(model, str) or not os.path.isdir(model):
                raise ValueError(f"speculative_config['model'] must be a Hugging Face model "
                                 f"folder (same tokenizer as the target), got {model!r}")
            for key in ("prompt_lookup_max", "prompt_lookup_min"):
                if v.get(key) is not None:
                    raise ValueError(f"speculative_config[{key!r}] is only used by method 'ngram'")
        return cls(method, k, model, lookup_max, lookup_min)


def _positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config[{key!r}] must be a positive integer, got {value!r}")
