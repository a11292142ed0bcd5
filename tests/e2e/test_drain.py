"""Overload and SIGTERM through every adapter, one server start each (a tiny random model,
one running slot, one waiting slot): with a long request running and another waiting, a third is
refused at once (429, or a Triton error response); then SIGTERM drains: both requests in
flight complete, a new one is refused (no connection, or an error status), readiness turns
false, and the process exits 0."""
from __future__ import annotations

import json
import re
import shutil
import signal
import threading
import time

import httpx
import pytest

from ..serving.conftest import tiny_folder  # noqa: F401  (fixture)
from .conftest import free_port, python_cmd, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]
MAX_TOKENS = 4000  # the most a request may ask for (the model's context is 4096)
RUNNING_S = 8  # how long each of the two long requests should run on this machine
PROMPT = "Tell me a long story"


@pytest.fixture(scope="module")
def long_tiny_folder(tiny_folder, tmp_path_factory):  # noqa: F811
    """The tiny model with a 4096-token context (its rotary tables follow the config), so one
    request runs long enough for the others to queue behind it however fast the CPU is."""
    folder = tmp_path_factory.mktemp("long") / "llama"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


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


def body(adapter: str, stream: bool, max_tokens: int) -> dict:
    params = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    if adapter == "triton":
        return {"text_input": PROMPT, "stream": stream, "sampling_parameters": json.dumps(params)}
    return {"prompt": PROMPT, "stream": stream, **params}


def stream_in_background(url: str, payload: dict, started: threading.Event, events: list):
    """Read an SSE stream into ``events`` (JSON or "[DONE]"); set ``started`` at the first."""
    def read() -> None:
        try:
            with httpx.stream("POST", url, json=payload, timeout=300) as r:
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


def wait_for_one_waiting(metrics_url: str, timeout_s: float = 60.0) -> None:
    """Until the engine's ``num_requests_waiting`` gauge reads 1."""
    deadline = time.monotonic() + timeout_s
    pattern = re.compile(r"^paged_core_num_requests_waiting(\{[^}]*\})? 1(\.0)?$", re.M)
    while not pattern.search(httpx.get(metrics_url, timeout=5).text):
        assert time.monotonic() < deadline, "the second request never waited"
        time.sleep(0.05)


def tokens_for(seconds: float, url: str, adapter: str) -> int:
    """How many tokens a request generates in about ``seconds`` here (timed on the server with
    a 200-token request first; at most ``MAX_TOKENS``), so that the long requests outlast the
    next two arriving and still end well within the drain, however fast the CPU is."""
    start = time.monotonic()
    r = httpx.post(url, json=body(adapter, False, 200), timeout=300)
    assert r.status_code == 200, r.text
    return min(MAX_TOKENS, max(200, int(200 * seconds / (time.monotonic() - start))))


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
        adapter, request, log_dir, long_tiny_folder):
    if adapter == "triton":
        pytest.importorskip("pytriton")
    port = free_port(span=3)
    cmd, ready, stream_path, plain_path = launch(adapter, port)
    url = f"http://127.0.0.1:{port}"
    env = {"PAGED_CORE_MODEL": long_tiny_folder, "PAGED_CORE_MAX_MODEL_LEN": "4096",
           "PAGED_CORE_DRAIN_TIMEOUT": "120", "PAGED_CORE_MAX_NUM_SEQS": "1",
           "PAGED_CORE_MAX_WAITING_REQUESTS": "1"}
    with running_server(request, adapter, cmd, url + ready, log_dir, extra_env=env) as server:
        long_tokens = tokens_for(RUNNING_S, url + plain_path, adapter)
        # a long request runs; once it streams (no longer waiting: max_waiting_requests=1
        # would refuse a second one before that), a second long one waits behind it
        started, events, waiting = threading.Event(), [], []
        reader = stream_in_background(url + stream_path, body(adapter, True, long_tokens),
                                      started, events)
        assert started.wait(60) and events[0] == 200, events
        queued = threading.Thread(target=lambda: waiting.append(
            httpx.post(url + plain_path, json=body(adapter, False, long_tokens), timeout=300)),
            daemon=True)
        queued.start()
        wait_for_one_waiting(f"http://127.0.0.1:{port + 2}/metrics" if adapter == "triton"
                             else url + "/metrics")
        start = time.monotonic()
        overloaded = httpx.post(url + plain_path, json=body(adapter, False, 2), timeout=30)
        # OpenAI routes: 429; Triton's HTTP generate endpoint answers any error response 400
        assert overloaded.status_code == (400 if adapter == "triton" else 429), overloaded.text
        assert "overloaded" in overloaded.text
        assert time.monotonic() - start < 5
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not refused(url + ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused(url + ready), "readiness still 200 after SIGTERM"
        assert refused(url + plain_path, body(adapter, False, 2))
        reader.join(150)
        queued.join(150)
        assert server.proc.wait(timeout=150) == 0, server.log_tail()
    assert waiting and waiting[0].status_code == 200, waiting
    chunks = [e for e in events[1:] if isinstance(e, dict)]
    assert events[-1] == "[DONE]" or adapter == "triton", events[-3:]
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    if adapter == "triton":
        assert sum(bool(c["text_output"]) for c in chunks) >= long_tokens // 4
    else:
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
