"""``TritonMetrics``: Triton custom metrics of one model instance, from the engine metrics
table (``paged_core/serving/engine_metrics.py``, which the OpenAI layer exports too).

One ``MetricFamily`` (kind, name and help from the table) with one metric labelled
``model`` per row that the engine's ``stats()`` reports when the model loads: the
rows the OpenAI layer would export for that engine. ``MetricFamily`` is passed in
(``pb_utils.MetricFamily``, which exists only inside Triton's Python stub), so the
families can be checked without a ``tritonserver``.

Invariant after ``update(stats)``: a gauge holds its stat; a counter, which Triton
only lets grow, has been incremented by its stat's growth since the previous update,
so it holds the stat too.
"""
from __future__ import annotations

from typing import Any, Mapping

from paged_core.serving.engine_metrics import reported


class TritonMetrics:
    def __init__(self, metric_family: Any, model_name: str, stats: Mapping[str, float]) -> None:
        kinds = {"gauge": metric_family.GAUGE, "counter": metric_family.COUNTER}
        self.families = []  # registered while this object lives (the model drops it in finalize)
        self._metrics = []
        self._last: dict[str, float] = {}
        for metric, _ in reported(stats):
            family = metric_family(name=metric.name, description=metric.help,
                                   kind=kinds[metric.kind])
            self.families.append(family)
            self._metrics.append((metric, family.Metric(labels={"model": model_name})))

    def update(self, stats: Mapping[str, float]) -> None:
        for metric, triton_metric in self._metrics:
            value = metric.read(stats)
            if value is None:
                continue
            if metric.kind == "gauge":
                triton_metric.set(value)
                continue
            delta = value - self._last.get(metric.name, 0.0)
            if delta > 0:
                triton_metric.increment(delta)
            self._last[metric.name] = value
