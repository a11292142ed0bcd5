"""The checks ``SamplingParams`` and ``BeamSearchParams`` share: each raises ``ValueError``
naming the field (``name``) and the value it got, before anything reaches the engine.

Invariant: ``bool`` is never accepted where a number is asked for (``True`` is an
``int`` to Python, never to a user).
"""
from __future__ import annotations

import math
from typing import Any


def as_list(name: str, value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list, got {value!r}")
    return list(value)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None,
              note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        extra = f" ({note})" if note else ""
        raise ValueError(f"{name} must be {bounds}{extra}, got {value}")


def check_number(name: str, value: Any, allowed: str, ok: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number {allowed}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {allowed}, got {value}")
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value}")
