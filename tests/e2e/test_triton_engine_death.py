"""A dead engine turns Triton's model readiness false (the bundled ``tritonserver``, started
from ``launcher.server_command`` the way the README's "your own tritonserver" recipe does).

The repository's ``1/model.py`` wraps ``TritonPythonModel``: a prompt containing ``MARKER``
breaks the engine's forward pass for good (``engine.engine.core.executor.runner.execute`` raises), as in
``tests/engine/test_fault_isolation.py``. That request gets an error response at once. In explicit model
control (the launcher's mode) the model then unloads itself: ``/v2/models/paged_llm/ready``
stays non-200, new requests get an error at once, and ``POST /v2/repository/models/paged_llm/load``
builds a fresh engine that serves again. In Triton's default mode the model cannot unload itself:
it logs why, stays ready and answers UNAVAILABLE, and the server keeps running.
"""
from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from paged_core.config import EngineConfig

from .conftest import MAX_TOKENS, PROMPTS, free_port, running_server

pytest.importorskip("pytriton")
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]
MODEL = "paged_llm"
MARKER = "<break the forward pass>"
FAULTY_MODEL_PY = f'''"""paged_llm whose forward pass fails for good once a prompt contains {MARKER!r}."""
from paged_core.adapters.triton_server.python_model import TritonPythonModel as Served


def _broken_execute(*args, **kwargs):
    raise RuntimeError("injected forward-pass failure")


class TritonPythonModel(Served):
    async def _serve(self, sender, prompt, *rest):
        if {MARKER!r} in prompt:
            self.engine.engine.core.executor.runner.execute = _broken_execute
        await super()._serve(sender, prompt, *rest)
'''


@pytest.fixture(params=["explicit", "default"], ids=["explicit-mode", "default-mode"])
def faulty_triton(request, log_dir, tmp_path):
    """(HTTP URL, server, model control mode): the faulty model under the real tritonserver."""
    from paged_core.adapters.triton_server import launcher, write_repository

    repository = write_repository(tmp_path / "models", EngineConfig(
        dtype="float32", max_model_len=1024, num_kv_blocks=512))
    (repository / MODEL / "1" / "model.py").write_text(FAULTY_MODEL_PY)
    port = free_port(span=3)
    cmd = launcher.server_command(repository, launcher.prepare_backends(tmp_path), "127.0.0.1",
                                  port, port + 1, port + 2)
    if request.param == "default":
        cmd = [arg for arg in cmd if arg not in launcher.EXPLICIT_MODE_ARGS]
    env = {key: value for key, value in launcher.server_env().items()
           if key in ("PATH", "LD_LIBRARY_PATH")}
    url = f"http://127.0.0.1:{port}"
    with running_server(request, f"triton-engine-death-{request.param}", cmd,
                        f"{url}/v2/health/ready", log_dir, signal.SIGINT, extra_env=env) as server:
        yield url, server, request.param


def generate(url: str, text: str, timeout_s: float = 30) -> httpx.Response:
    params = {"max_tokens": MAX_TOKENS, "temperature": 0}
    return httpx.post(f"{url}/v2/models/{MODEL}/generate", timeout=timeout_s,
                      json={"text_input": text, "sampling_parameters": json.dumps(params)})


def status(url: str) -> int:
    return httpx.get(url, timeout=5).status_code


def model_state(url: str) -> dict:
    """This model's entry in Triton's repository index (``state``, and ``reason`` if not ready)."""
    index = httpx.post(f"{url}/v2/repository/index", timeout=5).json()
    return next(entry for entry in index if entry["name"] == MODEL)


def wait_for(condition, timeout_s: float, what: str) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what} not within {timeout_s} s"
        time.sleep(0.05)


def test_a_dead_engine_fails_its_request_then_unloads_its_model_until_reloaded(faulty_triton):
    url, server, mode = faulty_triton
    model_ready, server_ready = f"{url}/v2/models/{MODEL}/ready", f"{url}/v2/health/ready"
    assert status(model_ready) == 200 and status(server_ready) == 200
    healthy = generate(url, PROMPTS[0])
    assert healthy.status_code == 200, healthy.text

    start = time.monotonic()
    faulted = generate(url, f"{MARKER} {PROMPTS[1]}")
    assert faulted.status_code >= 400 and "injected forward-pass failure" in faulted.text
    assert time.monotonic() - start < 5

    if mode == "default":  # no self-unload: ready, but every request is refused at once
        wait_for(lambda: "--model-control-mode=explicit" in server.log_tail(100_000), 10,
                 "the error naming --model-control-mode=explicit")
        assert status(model_ready) == 200
        refused = generate(url, PROMPTS[0], timeout_s=10)
        assert refused.status_code >= 400 and "engine stopped" in refused.text, refused.text
    else:
        wait_for(lambda: model_state(url) == {"name": MODEL, "version": "1",
                                               "state": "UNAVAILABLE", "reason": "unloaded"},
                 15, "the model unloading itself")
        assert status(model_ready) != 200
        # Triton's strict readiness exempts unloaded models (InferenceServer::IsReady)
        assert status(server_ready) == 200
        start = time.monotonic()
        refused = generate(url, PROMPTS[0], timeout_s=10)
        assert refused.status_code >= 400 and MODEL in refused.text, refused.text
        assert time.monotonic() - start < 5

        reload = httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=240)
        assert reload.status_code == 200, reload.text
        assert status(model_ready) == 200 and status(server_ready) == 200
        again = generate(url, PROMPTS[0])
        assert again.status_code == 200 and again.json() == healthy.json()

    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=60) == 0, server.log_tail()
    assert "Segfault" not in server.log_tail(1_000_000)
