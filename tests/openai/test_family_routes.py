"""The OpenAI routes (what the BentoML and LitServe adapters serve) over the families beyond
Llama: a tiny random Gemma 2 and Qwen2-MoE behind the app, in-process, float32; a greedy
completion of token ids, plain and streamed, equals transformers' ``generate()``."""
from __future__ import annotations

import httpx
import pytest
import torch

from paged_core import AsyncEngine, EngineConfig
from paged_core.openai import build_openai_app

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model
from .test_routes import sse_events

MAX_TOKENS = 12


@pytest.mark.parametrize("model_type", ["gemma2", "qwen2_moe"])
async def test_greedy_completion_of_the_family_matches_transformers(model_type, tokenizer,
                                                                    tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = passage_token_ids(tokenizer, 30)  # past Gemma 2's sliding window of 24
    expected = hf_greedy(reference, prompt, MAX_TOKENS)
    engine = AsyncEngine(EngineConfig(model=folder, dtype="float32", num_kv_blocks=64))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_openai_app(engine)),
                                     base_url="http://test", timeout=120) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True}
            plain = (await client.post("/v1/completions", json=body)).json()
            streamed = sse_events((await client.post("/v1/completions",
                                                     json={**body, "stream": True})).text)
    finally:
        await engine.shutdown()
    assert plain["choices"][0]["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert plain["usage"]["completion_tokens"] == MAX_TOKENS
    assert "".join(e["choices"][0]["text"] for e in streamed) == plain["choices"][0]["text"]
