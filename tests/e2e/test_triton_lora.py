"""Triton Inference Server with two LoRA adapters: a request's ``lora_name`` (in
``sampling_parameters``, as Triton's vllm_backend takes it) runs it under that adapter, with
the offline ``LLM``'s text; an unknown name is refused with a message naming it."""
from __future__ import annotations

import json
import signal

import httpx
import pytest

from .conftest import free_port, python_cmd, running_server
from .test_lora_server import SETTINGS, model, offline, prompt  # noqa: F401 - shared fixtures

pytest.importorskip("tritonclient.grpc")
# a second tritonserver (~2 min here): `make test-all`, not CI's `make test`
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]


@pytest.fixture(scope="module")
def triton(request, model, log_dir):  # noqa: F811 - the imported fixture
    base, adapters = model
    port = free_port(span=3)
    env = {f"PAGED_CORE_{k.upper()}": v for k, v in SETTINGS.items()}
    env.update(PAGED_CORE_MODEL=base,
               PAGED_CORE_LORA_MODULES=f"sql={adapters['sql']} math={adapters['math']}")
    cmd = python_cmd("-m", "paged_core.adapters.triton_server", "--host", "127.0.0.1",
                     "--port", str(port))
    with running_server(request, "triton-lora", cmd, f"http://127.0.0.1:{port}/v2/health/ready",
                        log_dir, signal.SIGINT, extra_env=env):
        yield f"http://127.0.0.1:{port}"


def generate(url: str, text: str, params: dict) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/paged_llm/generate", timeout=120,
                      json={"text_input": text, "sampling_parameters": json.dumps(params)})


def test_lora_name_picks_the_adapter(triton, prompt, offline):  # noqa: F811
    greedy = {"max_tokens": 10, "temperature": 0}
    texts = {name: generate(triton, prompt, {**greedy, "lora_name": name}).json()["text_output"]
             for name in ("sql", "math")}
    texts["base"] = generate(triton, prompt, greedy).json()["text_output"]
    assert texts == {k: offline[k] for k in ("sql", "math", "base")}
    refused = generate(triton, prompt, {**greedy, "lora_name": "nope"})
    assert refused.status_code == 400 and "lora_name 'nope' is not served" in refused.text
