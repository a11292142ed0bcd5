"""``lora_modules`` (vLLM's ``--lora-modules``): the adapters a server starts with.

Text of ``name=path`` entries separated by spaces or commas (``"sql=/a/sql math=/a/math"``),
or a JSON list of ``{"name": ..., "path": ...}`` objects. Adapters get ids 1, 2, ... in order.
"""
from __future__ import annotations

import json


def parse_lora_modules(text: str) -> list[tuple[str, str]]:
    """``[(name, path), ...]``; raises ``ValueError`` naming ``lora_modules``."""
    text = text.strip()
    if text.startswith("["):
        try:
            entries = [(e["name"], e["path"]) for e in json.loads(text)]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"lora_modules: a JSON list of {{\"name\": ..., \"path\": ...}} "
                             f"objects was expected ({exc})") from None
    else:
        entries = []
        for item in text.replace(",", " ").split():
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"lora_modules: {item!r} is not name=path")
            entries.append((name, path))
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"lora_modules: names must be unique, got {names}")
    return entries
