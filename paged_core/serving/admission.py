"""Admission control: a bounded number of requests may wait for their first token.

``AdmissionGate.admit()`` is called when a request arrives, before it is
tokenized, and either takes a slot or raises ``EngineOverloadedError`` at once
(nothing queued, nothing to clean up). The slot is given back (``release``)
when the request's first output arrives (it was scheduled and prefilled), or
when its stream ends without one (failure, abort, disconnect).

Invariant: ``num_waiting`` == admitted requests still waiting for their first
output; it never exceeds ``limit`` (``None``: unlimited). Thread-safe: requests
may arrive from several event loops (Triton's stub thread, an adapter's loop).
"""
from __future__ import annotations

import threading

from ..exceptions import EngineOverloadedError


class AdmissionGate:
    def __init__(self, limit: int | None, retry_after: float = 1.0) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.num_waiting = 0
        self.num_rejected = 0
        self._lock = threading.Lock()

    def admit(self) -> None:
        """Take a waiting slot, or raise ``EngineOverloadedError`` if all are taken."""
        with self._lock:
            if self.limit is not None and self.num_waiting >= self.limit:
                self.num_rejected += 1
                raise EngineOverloadedError(
                    f"the server is overloaded: {self.num_waiting} requests already wait to be "
                    f"scheduled (max_waiting_requests={self.limit}); retry after "
                    f"{self.retry_after:g} s", retry_after=self.retry_after)
            self.num_waiting += 1

    def release(self) -> None:
        """Give back the slot taken by ``admit`` (exactly once per admitted request)."""
        with self._lock:
            self.num_waiting -= 1
