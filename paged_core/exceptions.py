"""The engine's two failure kinds, as a server needs to tell them apart.

- ``RequestFailedError``: handling *one* request's output raised (detokenizer,
  stop strings, log-probabilities, ...). That request is finished, its blocks
  are freed, and the engine goes on serving every other request.
- ``EngineDeadError``: the step loop stopped (shutdown, or a failure of the
  forward pass / sampler, which leaves the whole step in doubt). No request can
  be served any more; ``__cause__`` holds the original exception, if any.

Both carry the original exception as ``__cause__``.
"""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The step loop stopped (shutdown or an internal error); no request can be served."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine; the engine and the other requests go on."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id
