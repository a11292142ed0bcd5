"""The OpenAI routes against a real engine, in-process (httpx ASGI transport)."""
from __future__ import annotations

import json

import httpx
import pytest

from paged_core import SamplingParams
from paged_core.openai import build_openai_app

from .conftest import MODEL

PROMPT = "The capital of France is"
GREEDY = {"model": MODEL, "max_tokens": 8, "temperature": 0}


def sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_models_and_health(client, engine):
    r = await client.get("/v1/models")
    assert r.json()["data"][0]["id"] == MODEL
    assert r.json()["data"][0]["max_model_len"] == engine.max_model_len
    assert (await client.get("/health")).json() == {"status": "ok", "model": MODEL}


async def test_completion_matches_engine_and_reports_usage(client, engine):
    expected = None
    async for out in engine.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0)):
        expected = out
    r = await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == expected.outputs[0].text
    assert body["usage"] == {"prompt_tokens": len(expected.prompt_token_ids),
                             "completion_tokens": 8, "total_tokens":
                             len(expected.prompt_token_ids) + 8}


async def test_streaming_concatenates_to_the_full_text_with_usage(client):
    full = (await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT})).json()
    r = await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT, "stream": True,
                                                   "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1]["choices"] == [] and events[-1]["usage"] == full["usage"]
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert len(texts) >= 3 and "".join(texts) == full["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_several_prompts_and_n_give_indexed_choices(client):
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": [[504, 3458, 282], [1, 2, 3]], "n": 2, "max_tokens": 3, "seed": 1})
    choices = r.json()["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1, 2, 3]
    assert r.json()["usage"]["completion_tokens"] == 12
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": [PROMPT, PROMPT], "max_tokens": 3, "stream": True})
    assert {e["choices"][0]["index"] for e in sse_events(r.text)} == {0, 1}


async def test_completion_logprobs_format(client):
    r = await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT, "logprobs": 2})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 8
    assert all(len(top) == 2 for top in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == r.json()["choices"][0]["text"]


async def test_chat_non_streaming_streaming_and_logprobs(client):
    body = {**GREEDY, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    full = (await client.post("/v1/chat/completions", json=body)).json()
    assert full["object"] == "chat.completion"
    message = full["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    events = sse_events((await client.post("/v1/chat/completions",
                                           json={**body, "stream": True})).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == \
        message["content"]
    lp = (await client.post("/v1/chat/completions", json={**body, "logprobs": True,
                                                          "top_logprobs": 3})).json()
    content = lp["choices"][0]["logprobs"]["content"]
    assert len(content) == 8 and all(len(c["top_logprobs"]) == 3 for c in content)


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": "high"}, 400, "top_p"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["x", [1, 2]]}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hello " * 600}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hello " * 600, "stream": True}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {}}]}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 600}]},
     400, "messages"),
])
async def test_errors_are_openai_shaped_and_name_the_field(client, path, body, status, param):
    r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]


async def test_logit_bias_and_allowed_token_ids_steer_both_routes_as_the_engine(client, engine):
    """OpenAI's ``logit_bias`` (token ids as JSON keys) and vLLM's ``allowed_token_ids`` and
    ``bad_words`` give the engine's own tokens for the same edits, on completions and chat."""
    async def engine_text(prompt, **edits) -> tuple[str, list[int]]:
        async for out in engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0,
                                                                **edits)):
            final = out
        return final.outputs[0].text, final.outputs[0].token_ids

    plain_text, plain_ids = await engine_text(PROMPT)
    bias = {plain_ids[0]: -100.0, plain_ids[2]: -2.0}
    biased_text, _ = await engine_text(PROMPT, logit_bias=bias)
    r = await client.post("/v1/completions", json={
        **GREEDY, "prompt": PROMPT, "logit_bias": {str(t): b for t, b in bias.items()}})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == biased_text != plain_text

    allowed = sorted(set(plain_ids[1:]) | set(range(1000, 1100)))
    allowed_text, allowed_ids = await engine_text(PROMPT, allowed_token_ids=allowed)
    r = await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT,
                                                   "allowed_token_ids": allowed})
    assert r.json()["choices"][0]["text"] == allowed_text and set(allowed_ids) <= set(allowed)

    words = [plain_text.split()[0]]
    banned_text, _ = await engine_text(PROMPT, bad_words=words)
    r = await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT,
                                                   "bad_words": words})
    assert r.json()["choices"][0]["text"] == banned_text != plain_text

    messages = [{"role": "user", "content": "Name a colour."}]
    plain_chat = (await client.post("/v1/chat/completions", json={
        **GREEDY, "messages": messages})).json()["choices"][0]["message"]["content"]
    banned = engine.tokenizer.encode(plain_chat, add_special_tokens=False)[:1]
    r = await client.post("/v1/chat/completions", json={
        **GREEDY, "messages": messages, "logit_bias": {str(banned[0]): -100}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] != plain_chat


async def test_truncate_prompt_tokens_serves_a_prompt_from_its_end(client):
    long = {**GREEDY, "prompt": "hello " * 600}  # more than the context (512 tokens)
    assert (await client.post("/v1/completions", json=long)).status_code == 400
    r = await client.post("/v1/completions", json={**long, "truncate_prompt_tokens": 100})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 100
    chat = {**GREEDY, "messages": [{"role": "user", "content": "hello " * 600}],
            "truncate_prompt_tokens": -1}  # the context's last 512 tokens leave no room
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 400
    chat["truncate_prompt_tokens"] = 64
    r = await client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 64


async def test_cache_salt_keeps_prefix_hits_within_one_salt(client, engine):
    """vLLM's ``cache_salt``: the same prompt under another salt finds nothing cached; under
    its own salt again it does (completions and chat alike); an empty salt is a 400."""
    prompt = "Once upon a time, in a village between two rivers, there lived a miller " * 3

    async def hits_of(path: str, body: dict) -> int:
        before = engine.stats()["prefix_cache_hits"]
        r = await client.post(path, json={**GREEDY, "max_tokens": 2, **body})
        assert r.status_code == 200, r.text
        return engine.stats()["prefix_cache_hits"] - before

    completion = {"prompt": prompt}
    assert await hits_of("/v1/completions", {**completion, "cache_salt": "salt-1"}) == 0
    assert await hits_of("/v1/completions", {**completion, "cache_salt": "salt-2"}) == 0
    assert await hits_of("/v1/completions", {**completion, "cache_salt": "salt-1"}) > 0
    chat = {"messages": [{"role": "user", "content": prompt}]}
    assert await hits_of("/v1/chat/completions", {**chat, "cache_salt": "salt-3"}) == 0
    assert await hits_of("/v1/chat/completions", {**chat, "cache_salt": "salt-3"}) > 0
    r = await client.post("/v1/completions", json={**completion, "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


async def test_malformed_json_is_400(client):
    r = await client.post("/v1/completions", content=b'{"prompt": ',
                          headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


async def test_metrics_expose_engine_state_and_latencies(client):
    await client.post("/v1/completions", json={**GREEDY, "prompt": PROMPT})
    text = (await client.get("/metrics")).text
    for name in ("paged_core_kv_cache_usage_ratio", "paged_core_kv_blocks_cached",
                 "paged_core_prefix_cache_queries_total", "paged_core_prefix_cache_hits_total",
                 "paged_core_num_requests_running", "paged_core_num_requests_waiting",
                 "paged_core_num_preemptions_total", "paged_core_generation_tokens_total",
                 "paged_core_time_to_first_token_seconds_count",
                 "paged_core_inter_token_latency_seconds_count"):
        assert f"\n{name} " in text, name
    assert "paged_core_time_to_first_token_seconds_count 1.0" in text


async def test_without_an_engine_routes_answer_503():
    app = build_openai_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as c:
        assert (await c.get("/health")).status_code == 503
        r = await c.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["message"]
