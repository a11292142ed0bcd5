"""One engine metrics table (``paged_core/serving/engine_metrics.py``) behind both exporters: the
OpenAI layer's Prometheus text and the custom metrics the Triton model registers (checked
with a stand-in for ``pb_utils.MetricFamily``, so no ``tritonserver`` is needed) hold the
same metrics, with the same kind, help and value, for a real engine's ``stats()``."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from paged_core import AsyncEngine, EngineConfig, SamplingParams
from paged_core.adapters.triton_server.metrics import TritonMetrics
from paged_core.serving.engine_metrics import ENGINE_METRICS
from paged_core.openai.metrics import ServingMetrics

from ..tiny_models import build_tiny_model

# drafts from one-token matches: the tiny random model's greedy output repeats a few tokens
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
         "prompt_lookup_min": 1}
MAX_TOKENS = 48


class FakeTritonMetric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value

    def increment(self, value: float) -> None:
        assert value >= 0, "Triton counters only grow"
        self.value += value


class FakeMetricFamily:
    """``pb_utils.MetricFamily``'s constructor, kinds and ``Metric(labels=...)``."""

    GAUGE, COUNTER = "GAUGE", "COUNTER"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeTritonMetric] = []

    def Metric(self, labels: dict[str, str]) -> FakeTritonMetric:  # noqa: N802 (Triton's name)
        metric = FakeTritonMetric(labels)
        self.metrics.append(metric)
        return metric


def openai_exported(stats: dict) -> dict[str, tuple[str, str, float]]:
    """``{name: (kind, help, value)}`` of the engine metrics in the OpenAI layer's text (not
    its latency histograms, nor their ``_created`` timestamps, nor ``process_*``, nor its
    per-model request counters, which the OpenAI layer counts itself)."""
    text = ServingMetrics(lambda: stats).render().decode()
    return {f.name: (f.type, f.documentation, f.samples[0].value)
            for f in text_string_to_metric_families(text)
            if f.name.startswith("paged_core_") and f.type in ("gauge", "counter")
            and not f.name.endswith("_created") and not f.name.startswith("paged_core_model_")}


def triton_exported(triton: TritonMetrics) -> dict[str, tuple[str, str, float]]:
    out = {}
    for family in triton.families:
        (metric,) = family.metrics
        assert metric.labels == {"model": "paged_llm"}
        out[family.name] = (family.kind.lower(), family.description, metric.value)
    return out


@pytest.fixture(scope="module")
def engine_stats(tokenizer, tmp_path_factory):
    """``stats()`` of an ``AsyncEngine`` with speculative decoding and KV events, before and
    after it served a request (so the counters, drafts and events included, have grown)."""
    scratch = tmp_path_factory.mktemp("metrics")
    folder = build_tiny_model("llama", str(scratch / "llama"), tokenizer)
    engine = AsyncEngine(EngineConfig(
        model=folder, dtype="float32", num_kv_blocks=64, speculative_config=NGRAM,
        kv_events_config={"enable_kv_cache_events": True, "endpoint": f"ipc://{scratch}/kv"}))

    async def serve() -> None:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        async for _ in engine.generate("a b c a b c a b c a b c", params):
            pass
    try:
        before = engine.stats()
        asyncio.run(serve())
        return before, engine.stats()
    finally:
        engine.shutdown_sync()


def test_the_table_has_every_metric_once():
    names = [m.name for m in ENGINE_METRICS]
    assert len(set(names)) == len(names) and len({m.stat for m in ENGINE_METRICS}) == len(names)
    assert {"paged_core_kv_blocks_total", "paged_core_num_requests_rejected",
            "paged_core_spec_decode_num_drafts", "paged_core_spec_decode_num_draft_tokens",
            "paged_core_spec_decode_num_accepted_tokens",
            "paged_core_spec_decode_mean_acceptance_length"} <= set(names)


def test_both_exporters_expose_every_metric_of_an_engine_alike(engine_stats):
    before, after = engine_stats
    assert {m.stat for m in ENGINE_METRICS} <= set(after)  # this engine reports every row
    assert after["spec_decode_num_draft_tokens"] > 0 and after["generated_tokens"] == MAX_TOKENS
    triton = TritonMetrics(FakeMetricFamily, "paged_llm", before)
    triton.update(before)
    triton.update(after)  # counters grow by the difference, gauges are set
    openai = openai_exported(after)
    assert set(openai) == {m.name for m in ENGINE_METRICS}
    assert triton_exported(triton) == openai
    assert openai["paged_core_generation_tokens"] == ("counter", "Tokens generated", MAX_TOKENS)


def test_both_exporters_leave_out_what_an_engine_does_not_report(engine_stats):
    _, after = engine_stats
    plain = {k: v for k, v in after.items()
             if not k.startswith(("spec_decode_", "kv_event")) and k != "num_rejected"}
    triton = TritonMetrics(FakeMetricFamily, "paged_llm", plain)
    triton.update(plain)
    openai = openai_exported(plain)
    assert triton_exported(triton) == openai
    assert set(openai) == {m.name for m in ENGINE_METRICS if m.stat in plain}
    assert not any("spec_decode" in name or "rejected" in name or "kv_event" in name
                   for name in openai)
