"""What callers ask of ``AsyncEngine``'s step loop: typed commands, applied between steps.

Callers on any thread append commands (under the engine's lock); only the
step-loop thread applies them, so engine state has one writer. Commands are
frozen: once handed over, the caller keeps no way to change them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..beam_search.request import BeamSearchRequest
from ..request import Request


@dataclass(frozen=True)
class AddRequest:
    """Admit ``request`` (already validated and tokenized, its grammar compiled).
    ``deadline`` is on ``time.monotonic()``'s clock, ``None`` for none; ``timeout``
    is the number of seconds it came from (for the ``RequestTimeoutError``)."""

    request: Request | BeamSearchRequest
    deadline: float | None
    timeout: float | None


@dataclass(frozen=True)
class AbortRequest:
    """Finish ``request_id`` at once, freeing its blocks (a no-op if it is not running)."""

    request_id: str


EngineCommand = AddRequest | AbortRequest
