"""The engine's two failure kinds, as a server needs to tell them apart.

- ``RequestFailedError``: handling *one* request's output raised (detokenizer,
  stop strings, log-probabilities, ...). That request is finished, its blocks
  are freed, and the engine goes on serving every other request.
- ``EngineDeadError``: the step loop stopped (shutdown, or a failure of the
  forward pass / sampler, which leaves the whole step in doubt). No request can
  be served any more; ``__cause__`` holds the original exception, if any.

Both carry the original exception as ``__cause__``.

Before either, a request is validated: ``ParamValidationError`` (a ``ValueError``)
names the field it refuses in ``param``, so a server's 400 names it without reading
the message.

Two refusals of a healthy engine, raised before or instead of any output:

- ``EngineOverloadedError``: too many requests already wait for their first
  token (``max_waiting_requests``); nothing was queued, retry later (HTTP 429).
- ``RequestTimeoutError``: the request outlived its deadline (``timeout``);
  it was aborted (``finish_reason`` "abort") and its blocks freed.
"""
from __future__ import annotations


class ParamValidationError(ValueError):
    """A request value was refused; ``param`` is its field (vLLM's and OpenAI's name for
    it, e.g. ``"max_tokens"``), or ``None`` when the prompt itself is at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineDeadError(RuntimeError):
    """The step loop stopped (shutdown or an internal error); no request can be served."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine; the engine and the other requests go on."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; the request was not queued. Retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(RuntimeError):
    """A request outlived its deadline and was aborted; ``output`` is its last snapshot
    (``finish_reason`` "abort"), or ``None`` if it never reached the engine."""

    def __init__(self, request_id: str, message: str, output=None) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.output = output
