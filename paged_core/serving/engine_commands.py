"""What callers ask of ``AsyncEngine``'s step loop: typed commands, applied between steps.

Callers on any thread append commands (under the engine's lock); only the
step-loop thread applies them, so engine state has one writer. Commands are
frozen: once handed over, the caller keeps no way to change them.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from ..requests.engine_io import EngineRequest


@dataclass(frozen=True)
class AddRequest:
    """Admit ``request`` (already validated and tokenized, its grammar compiled).
    ``timeout`` is the number of seconds its ``deadline`` came from (for the
    ``RequestTimeoutError``)."""

    request: EngineRequest
    timeout: float | None


@dataclass(frozen=True)
class AbortRequest:
    """Finish ``request_id`` at once, freeing its blocks (a no-op if it is not running)."""

    request_id: str


@dataclass(frozen=True)
class RemoveLora:
    """Forget LoRA adapter ``lora_id`` unless a request uses it; ``done`` gets the answer."""

    lora_id: int
    done: concurrent.futures.Future


EngineCommand = AddRequest | AbortRequest | RemoveLora
