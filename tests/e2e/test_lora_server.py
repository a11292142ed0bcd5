"""A LitServe server started the documented way with two LoRA adapters (``PAGED_CORE_ENABLE_LORA``,
``PAGED_CORE_LORA_MODULES``) and runtime updating on, driven by the ``openai`` client: the base
model and each adapter answer differently, each as the offline ``LLM`` does under the same
adapter; ``/v1/models`` lists them; an adapter loaded at run time serves at once and is gone
after it is unloaded."""
from __future__ import annotations

import signal

import httpx
import openai
import pytest

from paged_core import LLM, LoRARequest, SamplingParams

from ..lora.adapters import make_adapter
from ..reference import passage_token_ids
from ..tiny_models import build_tiny_model
from .conftest import free_port, python_cmd, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SETTINGS = {"dtype": "float32", "num_kv_blocks": "64", "enable_lora": "1", "max_loras": "2",
            "max_lora_rank": "8", "max_model_len": "512"}


@pytest.fixture(scope="module")
def model(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    base = build_tiny_model("llama", str(root / "base"), tokenizer)
    adapters = {name: make_adapter(base, str(root / name), rank, seed=rank)
                for name, rank in (("sql", 4), ("math", 8), ("late", 8))}
    return base, adapters


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.decode(passage_token_ids(tokenizer, 12, offset=4))


@pytest.fixture(scope="module")
def offline(model, prompt):
    """The offline engine's greedy text for the base model and each adapter."""
    base, adapters = model
    llm = LLM(model=base, dtype="float32", num_kv_blocks=64, enable_lora=True, max_loras=2,
              max_lora_rank=8, max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=10)
    texts = {"base": llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].text}
    for i, (name, path) in enumerate(adapters.items()):
        out = llm.generate(prompt, params, use_tqdm=False,
                           lora_request=LoRARequest(name, i + 1, path))
        texts[name] = out[0].outputs[0].text
    return texts


@pytest.fixture(scope="module")
def server(request, model, log_dir):
    base, adapters = model
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {f"PAGED_CORE_{k.upper()}": v for k, v in SETTINGS.items()}
    env.update(PAGED_CORE_MODEL=base, PAGED_CORE_ALLOW_RUNTIME_LORA_UPDATING="1",
               PAGED_CORE_LORA_MODULES=f"sql={adapters['sql']} math={adapters['math']}")
    cmd = python_cmd("-m", "paged_core.adapters.litserve", "--host", "127.0.0.1", "--port",
                     str(port))
    with running_server(request, "litserve-lora", cmd, url + "/health", log_dir, signal.SIGINT,
                        extra_env=env):
        yield url


def complete(client: openai.OpenAI, model: str, prompt: str) -> str:
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0)
    assert reply.model == model
    return reply.choices[0].text


def test_adapters_and_base_answer_as_offline(server, model, prompt, offline):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    cards = {m.id: m for m in client.models.list().data}
    base_name = next(iter(cards))
    assert set(cards) == {base_name, "sql", "math"}
    assert cards["sql"].root == model[1]["sql"] and cards["sql"].parent == base_name
    texts = {name: complete(client, name, prompt) for name in (base_name, "sql", "math")}
    assert texts == {base_name: offline["base"], "sql": offline["sql"], "math": offline["math"]}
    assert len(set(texts.values())) == 3
    chat = client.chat.completions.create(model="math", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.model == "math" and chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        complete(client, "nope", prompt)
    metrics = httpx.get(f"{server}/metrics", timeout=10).text
    assert 'paged_core_model_requests_total{model="sql"} 1.0' in metrics


def test_load_and_unload_at_run_time(server, model, prompt, offline):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    path = model[1]["late"]
    loaded = httpx.post(f"{server}/v1/load_lora_adapter",
                        json={"lora_name": "late", "lora_path": path}, timeout=60)
    assert loaded.status_code == 200 and "added successfully" in loaded.text
    again = httpx.post(f"{server}/v1/load_lora_adapter",
                       json={"lora_name": "late", "lora_path": path}, timeout=60)
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    assert complete(client, "late", prompt) == offline["late"]
    gone = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=60)
    assert gone.status_code == 200 and "removed successfully" in gone.text
    assert "late" not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        complete(client, "late", prompt)
    bad = httpx.post(f"{server}/v1/load_lora_adapter",
                     json={"lora_name": "broken", "lora_path": "/nonexistent"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
