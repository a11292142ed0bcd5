"""Setting values: checks shared by every part of the configuration, and the conversion of a
setting given as text (``PAGED_CORE_*`` variables, CLI flags, Triton's ``config.pbtxt``) to
its field's type.

Conversion is by the field's resolved type (``typing.get_type_hints``), never by the
spelling of its annotation: ``bool`` takes ``1/true/yes/on`` and ``0/false/no/off``, ``int``
and ``float`` their literals, ``str`` the text itself; a union tries its members in order
(``int | str`` is an int when the text is one); any other type (a ``dict`` such as
``speculative_config``) keeps the text, which that setting's own parser reads (JSON).
Every failure is a ``ValueError`` naming the setting and its variable.
"""
from __future__ import annotations

import json
import os
import re
import types
import typing
from typing import Any

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
               "g": 10**9, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
               "tib": 2**40, "t": 10**12, "tb": 10**12}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_size(value: int | str) -> int:
    """Parse a byte size such as ``1073741824``, ``"512MiB"`` or ``"2GB"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {value}")
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"kv_cache_memory must be a byte count like '2GiB', '512MiB' or 1073741824, "
            f"got {value!r}")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"kv_cache_memory must be > 0 bytes, got {value!r}")
    return size


def check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0 disables it), got {value!r}")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean setting ``PAGED_CORE_<NAME>`` from the environment (unset or empty:
    ``default``)."""
    raw = os.environ.get(f"PAGED_CORE_{name.upper()}", "")
    return default if raw == "" else parse_setting(name, bool, raw)


def parse_setting(name: str, hint: Any, raw: str) -> Any:
    """``raw`` converted to the type ``hint`` (see above); raises naming the setting."""
    members = [t for t in _union_members(hint) if t is not type(None)]
    for kind in members:
        if kind not in _PARSERS:
            return raw
        try:
            return _PARSERS[kind](raw)
        except ValueError:
            continue
    expected = " or ".join(_WORDS[t] for t in members)
    raise ValueError(f"setting {name} (PAGED_CORE_{name.upper()}) must be {expected}, "
                     f"got {raw!r}")


def _union_members(hint: Any) -> tuple:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _parse_bool(raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(raw)


_PARSERS = {bool: _parse_bool, int: int, float: float, str: str}
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def dict_setting(name: str, value: Any, allowed: set[str]) -> dict[str, Any] | None:
    """A setting given as a dict (or its JSON text): the dict, ``None`` for ``None`` or ``{}``;
    ``ValueError`` naming ``name`` for text that is not a JSON object, another type, or keys
    outside ``allowed``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} must be a JSON object, got {value!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"{name} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return dict(value) or None
