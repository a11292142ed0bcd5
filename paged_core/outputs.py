"""Results handed to users: ``RequestOutput`` holding one ``CompletionOutput`` per sample.

Text and token ids are cumulative; ``delta_text`` / ``delta_token_ids`` hold
only what is new since the previous output of the same request (streaming).
A request that failed inside the engine ends with one output that has
``error`` set, ``finished`` true and no ``outputs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .exceptions import RequestFailedError


@dataclass
class Logprob:
    """Log-probability of one token, with its rank and decoded text."""

    logprob: float
    rank: int
    decoded_token: str


@dataclass
class CompletionOutput:
    """One generated sample of a request (``index`` in ``0..n-1``)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[dict[int, Logprob]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock times (``time.monotonic()``) of a request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """The state of one request after an engine step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: RequestFailedError | None = None  # set on the final output of a failed request
