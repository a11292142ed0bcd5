"""Triton request tensors -> (prompt, stream, ``SamplingParams``); pure, testable without Triton.

Inputs (``config.pbtxt``): ``text_input`` (TYPE_STRING, one element),
``stream`` (TYPE_BOOL, optional, default false), ``sampling_parameters``
(TYPE_STRING holding a JSON object of ``SamplingParams`` fields, optional;
``structured_outputs`` is an object of ``StructuredOutputsParams`` fields, e.g.
``{"structured_outputs": {"json": {...schema...}}}``; ``lora_name``, as in Triton's
vllm_backend, names the LoRA adapter to run under).
Every bad input raises ``ValueError`` naming the input and what to change.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from paged_core.sampling_params import SamplingParams


def _scalar(array: np.ndarray | None, name: str) -> Any:
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"{name} must hold exactly one element, got {flat.size}")
    value = flat[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def parse_request(text_input: np.ndarray | None, stream: np.ndarray | None,
                  sampling_parameters: np.ndarray | None
                  ) -> tuple[str, bool, SamplingParams, str | None]:
    """Decode one request's tensors (``None`` for an absent optional input): the prompt,
    whether to stream, its ``SamplingParams`` and its ``lora_name`` (``None``: the base)."""
    prompt = _scalar(text_input, "text_input")
    if prompt is None:
        raise ValueError("text_input is required")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("text_input must be a non-empty string")
    want_stream = bool(_scalar(stream, "stream")) if stream is not None else False
    raw = _scalar(sampling_parameters, "sampling_parameters")
    values: dict[str, Any] = {}
    if raw:
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"sampling_parameters must be a JSON object: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("sampling_parameters must be a JSON object of SamplingParams fields")
    lora_name = values.pop("lora_name", None)
    if lora_name is not None and (not isinstance(lora_name, str) or not lora_name):
        raise ValueError(f"lora_name must be a non-empty string, got {lora_name!r}")
    return prompt, want_stream, SamplingParams.from_dict(values), lora_name
