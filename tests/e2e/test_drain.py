"""SIGTERM drains every adapter: a request in flight completes, a new one is refused (no
connection, or 503), readiness turns false, and the process exits 0. One server start per
adapter, on a tiny random model (fast steps: the in-flight request takes ~1-2 s)."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from ..serving.conftest import tiny_folder  # noqa: F401  (fixture)
from .conftest import free_port, python_cmd, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MAX_TOKENS = 300
PROMPT = "Tell me a long story"


def launch(adapter: str, port: int) -> tuple[list[str], str, str, str]:
    """(command, readiness path, streaming path, non-streaming path)."""
    if adapter == "bentoml":
        cmd = python_cmd("-m", "bentoml", "serve", "paged_core.adapters.bentoml.service:PagedLLM",
                         "--host", "127.0.0.1", "--port", str(port))
        return cmd, "/readyz", "/v1/completions", "/v1/completions"
    if adapter == "litserve":
        cmd = python_cmd("-m", "paged_core.adapters.litserve", "--host", "127.0.0.1",
                         "--port", str(port))
        return cmd, "/health", "/v1/completions", "/v1/completions"
    cmd = python_cmd("-m", "paged_core.adapters.triton_server", "--host", "127.0.0.1",
                     "--port", str(port))
    return (cmd, "/v2/health/ready", "/v2/models/paged_llm/generate_stream",
            "/v2/models/paged_llm/generate")


def body(adapter: str, stream: bool) -> dict:
    params = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    if adapter == "triton":
        return {"text_input": PROMPT, "stream": stream, "sampling_parameters": json.dumps(params)}
    return {"prompt": PROMPT, "stream": stream, **params}


def stream_in_background(url: str, payload: dict, started: threading.Event, events: list):
    """Read an SSE stream into ``events`` (JSON or "[DONE]"); set ``started`` at the first."""
    def read() -> None:
        try:
            with httpx.stream("POST", url, json=payload, timeout=120) as r:
                events.append(r.status_code)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        events.append(data if data == "[DONE]" else json.loads(data))
                        started.set()
        except httpx.HTTPError as exc:
            events.append(exc)
        finally:
            started.set()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def refused(url: str, payload: dict | None = None) -> bool:
    """True if the server no longer takes this request: no connection, or an error status."""
    try:
        if payload is None:
            return httpx.get(url, timeout=5).status_code != 200
        return httpx.post(url, json=payload, timeout=5).status_code >= 400
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
        return True


@pytest.mark.parametrize("adapter", ["litserve", "bentoml", "triton"])
def test_sigterm_finishes_the_request_in_flight_refuses_new_ones_and_exits_0(
        adapter, request, log_dir, tiny_folder):  # noqa: F811
    if adapter == "triton":
        pytest.importorskip("pytriton")
    port = free_port(span=3)
    cmd, ready, stream_path, plain_path = launch(adapter, port)
    url = f"http://127.0.0.1:{port}"
    env = {"PAGED_CORE_MODEL": tiny_folder, "PAGED_CORE_MAX_MODEL_LEN": "512",
           "PAGED_CORE_DRAIN_TIMEOUT": "15"}
    with running_server(request, adapter, cmd, url + ready, log_dir, extra_env=env) as server:
        started, events = threading.Event(), []
        reader = stream_in_background(url + stream_path, body(adapter, True), started, events)
        assert started.wait(60) and events[0] == 200, events
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not refused(url + ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused(url + ready), "readiness still 200 after SIGTERM"
        assert refused(url + plain_path, body(adapter, False))
        reader.join(60)
        assert server.proc.wait(timeout=60) == 0, server.log_tail()
    chunks = [e for e in events[1:] if isinstance(e, dict)]
    assert events[-1] == "[DONE]" or adapter == "triton", events[-3:]
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    if adapter == "triton":
        assert sum(bool(c["text_output"]) for c in chunks) >= MAX_TOKENS // 4
    else:
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
