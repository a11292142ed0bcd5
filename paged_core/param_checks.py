"""The checks ``SamplingParams`` and ``BeamSearchParams`` share: each raises
``ParamValidationError`` whose ``param`` is the field (``name``), its message naming the
field and the value it got, before anything reaches the engine.

Invariant: ``bool`` is never accepted where a number is asked for (``True`` is an
``int`` to Python, never to a user).
"""
from __future__ import annotations

import math
from typing import Any

from .exceptions import ParamValidationError


def as_list(name: str, value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ParamValidationError(f"{name} must be a list, got {value!r}", name)
    return list(value)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None,
              note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamValidationError(f"{name} must be an integer, got {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        extra = f" ({note})" if note else ""
        raise ParamValidationError(f"{name} must be {bounds}{extra}, got {value}", name)


def check_number(name: str, value: Any, allowed: str, ok: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParamValidationError(f"{name} must be a number {allowed}, got {value!r}", name)
    if not math.isfinite(value):
        raise ParamValidationError(f"{name} must be a finite number {allowed}, got {value}", name)
    if not ok:
        raise ParamValidationError(f"{name} must be {allowed}, got {value}", name)


def lone_surrogate_message(name: str, text: str) -> str | None:
    """Why ``text`` (the value of ``name``) is not valid Unicode, or ``None`` if it is.

    Python strings may hold lone surrogates (JSON's ``"\\ud800"`` without its pair); they
    cannot be encoded as UTF-8, so neither tokenizers nor hashes can take them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{name} is not valid Unicode: it holds a lone surrogate {text[exc.start]!r} at "
                f"character {exc.start}; send a complete surrogate pair or plain UTF-8 text")
    return None


def check_utf8(name: str, text: str) -> None:
    message = lone_surrogate_message(name, text)
    if message is not None:
        raise ParamValidationError(message, name)


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ParamValidationError(f"{name} must be true or false, got {value!r}", name)


MAX_ID_DIGITS = 18  # a token id's decimal string is never longer (vocabularies are far smaller)


def as_token_biases(name: str, value: Any) -> dict[int, float] | None:
    """``{token id: bias}`` from a mapping whose keys are token ids: integers, or their
    decimal strings (JSON object keys, as OpenAI's ``logit_bias`` sends them); ``None`` for
    ``None`` or an empty mapping. Each bias must be a finite number; token ids are checked
    against the vocabulary later (``SamplingParams.verify_for_model``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParamValidationError(f"{name} must be a mapping of token ids to biases, got "
                                   f"{value!r}", name)
    biases: dict[int, float] = {}
    for key, bias in value.items():
        digits = key.strip() if isinstance(key, str) else ""
        if digits.isascii() and digits.isdigit() and len(digits) <= MAX_ID_DIGITS:
            key = int(digits)
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise ParamValidationError(f"{name} keys must be token ids (integers >= 0, or "
                                       f"their decimal strings), got {key!r}", name)
        check_number(name, bias, "(the bias of token " + str(key) + ")", True)
        biases[key] = float(bias)
    return biases or None
