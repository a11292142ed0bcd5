"""Triton Inference Server (bundled ``tritonserver``, Python backend) started the documented way:
``python -m paged_core.adapters.triton_server --host 127.0.0.1 --port P``."""
from __future__ import annotations

import dataclasses
import json
import queue
import re
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from paged_core.core.engine_stats import KvEventStats
from paged_core.serving.engine_metrics import ENGINE_METRICS
from paged_core.spec_decode.metrics import SpecDecodingStats

from .conftest import MAX_TOKENS, PROMPTS, free_port, python_cmd, running_server

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL = "paged_llm"
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0}


class Triton:
    def __init__(self, port: int) -> None:
        self.http = f"http://127.0.0.1:{port}"
        self.grpc = f"127.0.0.1:{port + 1}"
        self.metrics_url = f"http://127.0.0.1:{port + 2}/metrics"

    def metric(self, name: str) -> float:
        text = httpx.get(self.metrics_url, timeout=10).text
        match = re.search(rf'^{name}{{model="{MODEL}"}} (\S+)$', text, re.M)
        assert match, f"{name} missing from Triton metrics"
        return float(match.group(1))

    def generate(self, text: str, params: dict, model: str = MODEL) -> httpx.Response:
        return httpx.post(f"{self.http}/v2/models/{model}/generate", timeout=120,
                          json={"text_input": text, "sampling_parameters": json.dumps(params)})


@pytest.fixture(scope="module")
def triton(request, log_dir):
    port = free_port(span=3)
    cmd = python_cmd("-m", "paged_core.adapters.triton_server", "--host", "127.0.0.1",
                     "--port", str(port))
    # Triton waits up to the drain timeout (--exit-timeout-secs) for requests it still counts
    # in flight when stopped: 20 s by default, the module's teardown on a busy 2-core host
    with running_server(request, "triton", cmd, f"http://127.0.0.1:{port}/v2/health/ready",
                        log_dir, signal.SIGINT, {"PAGED_CORE_DRAIN_TIMEOUT": "2"}):
        yield Triton(port)


def _inputs(text: str, stream: bool, params: dict) -> list:
    grpc = tritonclient_grpc
    values = [("text_input", "BYTES", np.array([text.encode()], dtype=np.object_)),
              ("stream", "BOOL", np.array([stream])),
              ("sampling_parameters", "BYTES", np.array([json.dumps(params).encode()],
                                                        dtype=np.object_))]
    out = []
    for name, dtype, array in values:
        tensor = grpc.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


class GrpcStream:
    """One tritonclient gRPC stream; responses land in a queue as (request_id, text, final, t)."""

    def __init__(self, url: str) -> None:
        self.client = tritonclient_grpc.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.responses.put(("?", error, True, time.monotonic()))
            return
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        texts = result.as_numpy("text_output")
        text = texts[0].decode() if texts is not None and len(texts) else ""
        self.responses.put((response.id, text, final, time.monotonic()))

    def send(self, request_id: str, text: str, params: dict, stream: bool = True) -> None:
        self.client.async_stream_infer(MODEL, _inputs(text, stream, params),
                                       request_id=request_id, enable_empty_final_response=True)

    def collect(self, count: int, timeout_s: float = 120) -> dict[str, list]:
        """Responses per request id until ``count`` requests have their final response."""
        per_id: dict[str, list] = {}
        finals = 0
        while finals < count:
            request_id, text, final, t = self.responses.get(timeout=timeout_s)
            assert not isinstance(text, Exception), text
            per_id.setdefault(request_id, []).append((text, t))
            finals += final
        return per_id

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_greedy_http_generate_matches_offline_llm(triton, reference_texts):
    for prompt in PROMPTS:
        r = triton.generate(prompt, GREEDY)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"] == reference_texts[prompt]


def test_http_generate_stream_concatenates_to_the_full_text(triton, reference_texts):
    body = {"text_input": PROMPTS[0], "stream": True, "sampling_parameters": json.dumps(GREEDY)}
    with httpx.stream("POST", f"{triton.http}/v2/models/{MODEL}/generate_stream", json=body,
                      timeout=120) as r:
        assert r.status_code == 200
        parts = [json.loads(line[len("data: "):])["text_output"]
                 for line in r.iter_lines() if line.startswith("data: ")]
    assert len([p for p in parts if p]) >= 3
    assert "".join(parts) == reference_texts[PROMPTS[0]]


def test_grpc_streaming_concatenates_to_the_full_text(triton, reference_texts):
    stream = GrpcStream(triton.grpc)
    try:
        stream.send("one", PROMPTS[1], GREEDY)
        parts = [text for text, _ in stream.collect(1)["one"]]
    finally:
        stream.close()
    assert len([p for p in parts if p]) >= 3
    assert "".join(parts) == reference_texts[PROMPTS[1]]


def test_16_grpc_streams_overlap_in_one_engine(triton):
    """Sixteen streams sent back to back all run at once: each is long enough
    (64 tokens, half a second even alone) that the first cannot finish before
    the sixteenth arrives, however slowly the gRPC sends reach the model."""
    stream = GrpcStream(triton.grpc)
    peak, done = 0.0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, triton.metric("paged_core_num_requests_running"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(16):
            stream.send(f"r{i}", f"{PROMPTS[i % 3]} ({i})",
                        {"max_tokens": 64, "temperature": 0.8, "seed": i, "ignore_eos": True})
        per_id = stream.collect(16)
    finally:
        done.set()
        watcher.join()
        stream.close()
    spans = [(min(t for _, t in r), max(t for _, t in r)) for r in per_id.values()]
    assert len(spans) == 16
    assert max(first for first, _ in spans) < min(last for _, last in spans), spans
    assert peak >= 12, f"only {peak} requests ran at once in the engine"


def test_grpc_stream_cancellation_aborts_and_frees_blocks(triton):
    stream = GrpcStream(triton.grpc)
    try:
        stream.send("long", PROMPTS[2], {"max_tokens": 400, "ignore_eos": True})
        for _ in range(3):
            stream.responses.get(timeout=60)
        time.sleep(0.3)  # let the metrics (published every 0.25 s) see it running
        assert triton.metric("paged_core_num_requests_running") >= 1
    finally:
        cancelled = time.monotonic()
        stream.close(cancel=True)
    while not (triton.metric("paged_core_num_requests_running") == 0
               and triton.metric("paged_core_kv_blocks_used") == 0):
        assert time.monotonic() - cancelled < 1.0, "cancelled request still holds the engine"
        time.sleep(0.02)


def test_metrics_are_the_rows_of_the_engine_metrics_table(triton):
    """The OpenAI layer's engine metrics, from the same table: every row but speculative
    decoding's (reported only by an engine with a ``speculative_config``), with its help."""
    assert triton.generate("hi", {"max_tokens": 2}).status_code == 200
    time.sleep(0.3)  # the metrics are published every 0.25 s
    text = httpx.get(triton.metrics_url, timeout=10).text
    optional = set(SpecDecodingStats(0).snapshot()) | {  # not asked for by this server
        f.name for f in dataclasses.fields(KvEventStats)}
    for metric in ENGINE_METRICS:
        if metric.stat in optional:
            assert metric.name not in text
        else:
            assert f"# HELP {metric.name} {metric.help}" in text
            assert triton.metric(metric.name) >= 0
    assert triton.metric("paged_core_kv_blocks_total") == 512  # PAGED_CORE_NUM_KV_BLOCKS
    assert triton.metric("paged_core_generation_tokens") >= 2
    assert triton.metric("paged_core_num_requests_rejected") == 0


@pytest.mark.parametrize("params,fragment", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"no_such_field": 1}, "unknown sampling parameter"),
    ('{"max_tokens": ', "JSON"),
], ids=["negative-max-tokens", "negative-temperature", "unknown-field", "malformed-json"])
def test_bad_sampling_parameters_are_4xx_and_the_server_keeps_serving(triton, params, fragment):
    raw = params if isinstance(params, str) else json.dumps(params)
    r = httpx.post(f"{triton.http}/v2/models/{MODEL}/generate", timeout=60,
                   json={"text_input": "hi", "sampling_parameters": raw})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]
    assert triton.generate("hi", {"max_tokens": 2}).status_code == 200


def test_overlong_prompt_and_unknown_model_are_4xx(triton):
    r = triton.generate("hello " * 1500, {"max_tokens": 2})
    assert r.status_code == 400 and "too long" in r.json()["error"]
    r = triton.generate("hi", {"max_tokens": 2}, model="no_such_model")
    assert 400 <= r.status_code < 500 and "no_such_model" in r.json()["error"]
    assert triton.generate("hi", {"max_tokens": 2}).status_code == 200
