"""The engine's metrics: one declarative table that every exporter reads (no prometheus).

Each ``EngineMetric`` is one Prometheus family: its exposition name, its kind
(``gauge``: the current value; ``counter``: a running total that never decreases),
its help text and the ``stats()`` key its value is read from (``LLMEngine.stats``;
``num_rejected`` comes from ``AsyncEngine.stats``). Two exporters serve the table:

- the OpenAI layer (``openai/metrics.py``): prometheus-client families built at
  scrape time (a counter's sample gets prometheus' ``_total`` suffix);
- the Triton model (``adapters/triton_server/metrics.py``): ``pb_utils.MetricFamily``
  custom metrics, refreshed from ``stats()`` by the model's watcher.

Invariant: for the same ``stats()`` both export exactly the rows whose key it
reports (``reported``), with this name, kind and help; so they cannot drift, and a
new metric is one new row here. An engine reports the speculative-decoding keys
only with a ``speculative_config``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Mapping


@dataclass(frozen=True)
class EngineMetric:
    name: str  # the family's exposition name
    kind: Literal["gauge", "counter"]
    help: str
    stat: str  # its key in ``stats()``

    def read(self, stats: Mapping[str, float]) -> float | None:
        """Its value in ``stats``, or ``None`` when this engine does not report it."""
        return float(stats[self.stat]) if self.stat in stats else None


ENGINE_METRICS: tuple[EngineMetric, ...] = (
    EngineMetric("paged_core_kv_cache_usage_ratio", "gauge",
                 "Fraction of KV-cache blocks in use (0..1)", "kv_usage"),
    EngineMetric("paged_core_kv_blocks_total", "gauge", "KV-cache blocks in the pool",
                 "kv_blocks_total"),
    EngineMetric("paged_core_kv_blocks_used", "gauge", "KV-cache blocks held by requests",
                 "kv_blocks_used"),
    EngineMetric("paged_core_kv_blocks_cached", "gauge",
                 "Free KV-cache blocks still holding reusable prefixes", "kv_blocks_cached"),
    EngineMetric("paged_core_num_requests_running", "gauge", "Requests being generated",
                 "num_running"),
    EngineMetric("paged_core_num_requests_waiting", "gauge", "Requests waiting to be scheduled",
                 "num_waiting"),
    EngineMetric("paged_core_prefix_cache_queries", "counter",
                 "Prompt blocks looked up in the prefix cache", "prefix_cache_queries"),
    EngineMetric("paged_core_prefix_cache_hits", "counter",
                 "Prompt blocks found in the prefix cache", "prefix_cache_hits"),
    EngineMetric("paged_core_num_preemptions", "counter",
                 "Requests preempted (recomputed later)", "num_preemptions"),
    EngineMetric("paged_core_generation_tokens", "counter", "Tokens generated",
                 "generated_tokens"),
    EngineMetric("paged_core_num_requests_rejected", "counter",
                 "Requests refused because the waiting queue was full", "num_rejected"),
    EngineMetric("paged_core_spec_decode_num_drafts", "counter",
                 "Verify steps of sequences with drafts", "spec_decode_num_drafts"),
    EngineMetric("paged_core_spec_decode_num_draft_tokens", "counter",
                 "Draft tokens proposed and verified", "spec_decode_num_draft_tokens"),
    EngineMetric("paged_core_spec_decode_num_accepted_tokens", "counter",
                 "Draft tokens accepted", "spec_decode_num_accepted_tokens"),
    EngineMetric("paged_core_spec_decode_mean_acceptance_length", "gauge",
                 "Tokens per verify step with drafts (1 + accepted / drafts)",
                 "spec_decode_mean_acceptance_length"),
    EngineMetric("paged_core_kv_events_published", "counter",
                 "KV-cache events published for routers", "kv_events_published"),
    EngineMetric("paged_core_kv_event_batches_dropped", "counter",
                 "KV-event batches dropped because the publisher's queue was full",
                 "kv_event_batches_dropped"),
)


def reported(stats: Mapping[str, float]) -> Iterator[tuple[EngineMetric, float]]:
    """``(metric, value)`` of every row whose key ``stats`` holds, in table order."""
    for metric in ENGINE_METRICS:
        value = metric.read(stats)
        if value is not None:
            yield metric, value
