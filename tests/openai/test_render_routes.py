"""vLLM's render routes: the tokens a request would run with, equal to what generation uses
(the prompt tokens a completion reports; the chat template's rendering), and errors that
name the field."""
from __future__ import annotations

from paged_core import SamplingParams

from .conftest import MODEL

PROMPT = "The capital of France is"


async def test_completion_render_gives_the_prompt_tokens_generation_uses(client, engine):
    final = None
    async for out in engine.generate(PROMPT, SamplingParams(max_tokens=1)):
        final = out
    r = await client.post("/v1/completions/render", json={
        "model": MODEL, "prompt": [PROMPT, PROMPT + " Paris"], "max_tokens": 5,
        "temperature": 0.5})
    assert r.status_code == 200
    first, second = r.json()
    assert first["token_ids"] == final.prompt_token_ids
    assert second["token_ids"][:len(first["token_ids"])] == first["token_ids"]
    ids = await client.post("/v1/completions/render", json={"model": MODEL, "prompt": [5, 6, 7]})
    assert [one["token_ids"] for one in ids.json()] == [[5, 6, 7]]
    assert first["model"] == MODEL and first["stream"] is False
    assert first["request_id"].startswith("cmpl-") and first["request_id"].endswith("-0")
    assert first["sampling_params"]["max_tokens"] == 5
    assert first["sampling_params"]["temperature"] == 0.5


async def test_render_gives_the_tokens_truncate_prompt_tokens_keeps(client):
    """What the engine keeps is what it caches, and what a KV-aware router must match."""
    render = {"model": MODEL, "prompt": PROMPT}
    full = (await client.post("/v1/completions/render", json=render)).json()[0]
    cut = (await client.post("/v1/completions/render",
                             json={**render, "truncate_prompt_tokens": 3})).json()[0]
    assert cut["token_ids"] == full["token_ids"][-3:]
    assert cut["sampling_params"]["truncate_prompt_tokens"] == 3
    too_many = await client.post("/v1/completions/render",
                                 json={**render, "truncate_prompt_tokens": 10**6})
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "truncate_prompt_tokens"


async def test_chat_render_gives_the_templated_tokens(client, engine):
    messages = [{"role": "user", "content": "Name a color."}]
    r = await client.post("/v1/chat/completions/render", json={"model": MODEL,
                                                              "messages": messages})
    assert r.status_code == 200
    assert r.json()["token_ids"] == engine.apply_chat_template(messages)
    chat = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == len(r.json()["token_ids"])


async def test_render_refuses_what_generation_refuses(client):
    bad_model = await client.post("/v1/completions/render", json={"model": "nope", "prompt": "x"})
    assert bad_model.status_code == 404 and bad_model.json()["error"]["param"] == "model"
    empty = await client.post("/v1/completions/render", json={"model": MODEL, "prompt": ""})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "prompt"
    beams = await client.post("/v1/completions/render", json={
        "model": MODEL, "prompt": "x", "use_beam_search": True, "n": 2})
    assert beams.status_code == 400 and beams.json()["error"]["param"] == "use_beam_search"
    negative = await client.post("/v1/completions/render", json={"model": MODEL,
                                                                "prompt": [3, -1]})
    assert negative.status_code == 400 and negative.json()["error"]["param"] == "prompt"
