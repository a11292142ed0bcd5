"""Prometheus metrics of one served engine.

Engine gauges and counters (KV usage, cached blocks, prefix-cache queries and
hits, running/waiting, preemptions, generated tokens, rejected requests,
speculative decoding's draft / accepted tokens and mean acceptance length) are
the rows of the engine metrics table (``paged_core/serving/engine_metrics.py``, shared
with the Triton adapter), read from ``engine.stats()`` at scrape time, so they
can never drift from the engine; latency histograms (time to first token,
inter-token latency) and the requests and generated tokens per served model or LoRA
adapter are observed by the OpenAI layer as it streams;
``process_*`` metrics (RSS, CPU) describe the process that holds the engine.
Each ``ServingMetrics`` owns its registry, so several apps in one process never
collide.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from paged_core.serving.engine_metrics import reported

PREFIX = "paged_core"
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.5, 5.0, 10.0, 20.0, 60.0)


class _EngineStatsCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        if stats is None:  # engine not built yet
            return
        for metric, value in reported(stats):
            yield _FAMILIES[metric.kind](metric.name, metric.help, value=value)


class ServingMetrics:
    """Registry + histograms for one engine; ``render()`` gives the exposition text."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStatsCollector(stats))
        ProcessCollector(registry=self.registry)  # RSS, CPU, open files of the serving process
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Time from request arrival to its first generated token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between consecutive generated tokens of a request",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.model_requests = Counter(f"{PREFIX}_model_requests",
                                      "Completed requests per served model or LoRA adapter",
                                      ["model"], registry=self.registry)
        self.model_tokens = Counter(f"{PREFIX}_model_generation_tokens",
                                    "Generated tokens per served model or LoRA adapter",
                                    ["model"], registry=self.registry)

    def count_model_usage(self, model: str, completion_tokens: int) -> None:
        """One completed request of ``model`` (the base model or an adapter's name)."""
        self.model_requests.labels(model=model).inc()
        self.model_tokens.labels(model=model).inc(completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def tracker(self) -> "LatencyTracker":
        return LatencyTracker(self)


class LatencyTracker:
    """Observes TTFT once and inter-token latency per new token of one request."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self._metrics = metrics
        self._start = time.monotonic()
        self._last: float | None = None

    def on_tokens(self, num_new_tokens: int) -> None:
        if num_new_tokens <= 0:
            return
        now = time.monotonic()
        if self._last is None:
            self._metrics.ttft.observe(now - self._start)
        else:
            per_token = (now - self._last) / num_new_tokens
            for _ in range(num_new_tokens):
                self._metrics.itl.observe(per_token)
        self._last = now
