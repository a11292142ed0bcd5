"""Per-request deadlines, kept by ``AsyncEngine``'s step loop (engine thread only).

A request's ``timeout`` (or ``EngineConfig.request_timeout``) counts from its
arrival; the loop calls ``expired()`` between steps and aborts what it yields.
Entries hold a weak reference, so a request that finished is never kept alive
by its deadline; it is skipped when its time comes.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
import weakref
from typing import Any, Iterator

from ..exceptions import ParamValidationError


def check_timeout(timeout: Any) -> float | None:
    """``timeout`` as seconds if it is ``None`` or a positive finite number, else ``ParamValidationError``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ParamValidationError(
            f"timeout must be a positive number of seconds, got {timeout!r}", "timeout")
    return float(timeout)


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, weakref.ref, float]] = []
        self._order = itertools.count()

    def add(self, request: Any, deadline: float, timeout: float) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), weakref.ref(request), timeout))

    def expired(self) -> Iterator[tuple[Any, float]]:
        """``(request, timeout)`` of each request whose deadline passed and that still lives."""
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, _, ref, timeout = heapq.heappop(self._heap)
            request = ref()
            if request is not None:
                yield request, timeout
