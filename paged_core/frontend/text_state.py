"""``TextState``: what the output processor keeps of every request, whatever its kind: its
prompt, its ``RequestMetrics`` and the prefix-cache hits the core reports, and how to
build its ``RequestOutput``s (``RequestText`` and ``BeamText`` add the samples' text).

Invariant: ``metrics.finished_time`` is set once, by the first finished output.
"""
from __future__ import annotations

import time

from ..requests.engine_io import EngineCoreOutput, EngineRequest
from ..exceptions import RequestFailedError
from ..outputs import CompletionOutput, RequestMetrics, RequestOutput


class TextState:
    def __init__(self, source: EngineRequest) -> None:
        self.request_id = source.request_id
        self.prompt = source.prompt
        self.prompt_token_ids = list(source.prompt_token_ids)
        self.metrics = RequestMetrics(source.arrival_time)
        self.num_cached_tokens = 0
        self.ended = False  # aborted: its next output is its last, whatever it holds

    @property
    def reports_now(self) -> bool:
        """Whether the output processor builds this request's ``RequestOutput`` after a step
        that touched it (``RequestText`` under ``FINAL_ONLY``: only once it finished)."""
        return True

    def observe(self, out: EngineCoreOutput) -> None:
        """Take what the core learned running the request (times, prefix-cache hits)."""
        self.num_cached_tokens = out.num_cached_tokens
        metrics = self.metrics
        if metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = out.first_scheduled_time
        if metrics.first_token_time is None:
            metrics.first_token_time = out.first_token_time

    def request_output(self, completions: list[CompletionOutput], finished: bool) -> RequestOutput:
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             finished, self.metrics, self.num_cached_tokens)

    def failed_output(self, exc: BaseException) -> RequestOutput:
        """The final output of a request that failed inside the engine: finished, no
        completions, ``error`` a ``RequestFailedError`` whose ``__cause__`` is ``exc``."""
        error = RequestFailedError(
            self.request_id, f"request {self.request_id} failed inside the engine "
                             f"({type(exc).__name__}: {exc}); the engine goes on serving other requests")
        error.__cause__ = exc
        out = self.request_output([], True)
        out.error = error
        return out
