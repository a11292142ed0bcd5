"""Every value is validated before it reaches the engine; what still fails inside it fails one
request only. Real engine, in-process (httpx ASGI transport)."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from .conftest import MODEL
from .test_routes import sse_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]


def error_of(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("path,body,param,fragment", [
    # integers that overflow
    (COMPLETIONS, {"prompt": "x", "seed": 2**64}, "seed", "64-bit integer"),
    (COMPLETIONS, {"prompt": "x", "seed": -2**63 - 1}, "seed", "64-bit integer"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids", "vocabulary"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [2**70]}, "stop_token_ids", "vocabulary"),
    (COMPLETIONS, {"prompt": [1, 2**70]}, "prompt", "prompt_token_ids"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 2**70}, "logprobs", "[0, 20]"),
    (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 2**70}, "top_logprobs", "[0, 20]"),
    (COMPLETIONS, {"prompt": "x", "top_k": 2**70}, "top_k", "vocabulary size"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias", "vocabulary"),
    (CHAT, {"messages": HI, "logit_bias": {"12 tokens": 1}}, "logit_bias", "token ids"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"5": "up"}}, "logit_bias", "valid number"),
    (CHAT, {"messages": HI, "allowed_token_ids": [3, 10**9]}, "allowed_token_ids",
     "vocabulary"),
    (COMPLETIONS, {"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids",
     "at least one token"),
    (CHAT, {"messages": HI, "bad_words": ["fine", " "]}, "bad_words", "non-blank"),
    (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens",
     ">= 1, or -1"),
    (CHAT, {"messages": HI, "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens",
     "max_model_len=512"),
    (COMPLETIONS, {"prompt": "x", "bad_words": ["\ud800"]}, "bad_words", "lone surrogate"),
    (COMPLETIONS, {"prompt": "x", "n": 2**70}, "n", "[1, 128]"),
    # strings the tokenizer rejects
    (COMPLETIONS, {"prompt": "a\ud800b"}, "prompt", "lone surrogate"),
    (COMPLETIONS, {"prompt": ["fine", "\udfff"]}, "prompt", "lone surrogate"),
    (CHAT, {"messages": [{"role": "user", "content": "\ud800"}]}, "messages", "lone surrogate"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages", "lone surrogate"),
    (COMPLETIONS, {"prompt": "x", "cache_salt": "a\udfffb"}, "cache_salt", "lone surrogate"),
    (CHAT, {"messages": HI, "cache_salt": "\ud800"}, "cache_salt", "lone surrogate"),
    # wrong JSON types: no silent coercion
    (COMPLETIONS, {"prompt": "x", "max_tokens": "8"}, "max_tokens", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": True}, "max_tokens", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "n": 2.0}, "n", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream", "valid boolean"),
    (COMPLETIONS, {"prompt": "x", "temperature": "0.5"}, "temperature", "valid number"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": 1}}, "stream_options",
     "valid boolean"),
    (CHAT, {"messages": HI, "logprobs": "true"}, "logprobs", "valid boolean"),
    # OpenAI's limits and absurd sizes
    (COMPLETIONS, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": None, "min_tokens": 10**9}, "min_tokens",
     "max_model_len=512"),
    (CHAT, {"messages": HI, "min_tokens": 10**9}, "min_tokens", "max_model_len=512"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 10**9}, "max_tokens", "max_model_len=512"),
    (CHAT, {"messages": HI, "max_completion_tokens": 600}, "max_completion_tokens",
     "max_model_len=512"),
])
async def test_bad_values_are_a_400_naming_the_field(client, path, body, param, fragment):
    r = await client.post(path, content=json.dumps(body),  # json.dumps keeps lone surrogates
                          headers={"content-type": "application/json"})
    error = error_of(r)
    assert error["param"] == param and fragment in error["message"], error


async def test_non_finite_numbers_are_refused(client):
    r = await client.post(COMPLETIONS, content=b'{"prompt": "x", "temperature": Infinity}',
                          headers={"content-type": "application/json"})
    error = error_of(r)
    assert error["param"] == "temperature" and "finite" in error["message"]


async def test_an_echoed_lone_surrogate_still_gives_a_json_error(client):
    r = await client.post(COMPLETIONS, content=json.dumps({"model": "\ud800", "prompt": "x"}),
                          headers={"content-type": "application/json"})
    assert error_of(r, 404)["param"] == "model"


async def test_seed_at_the_top_of_its_range_with_n_2_wraps_around(client):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 1.0}

    async def texts(**fields):
        r = await client.post(COMPLETIONS, json={**body, **fields})
        assert r.status_code == 200, r.text
        return [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]

    both = await texts(seed=2**64 - 1, n=2)
    # sample i draws from seed + i modulo 2**64: here 2**64 - 1, then 0
    assert both == (await texts(seed=2**64 - 1)) + (await texts(seed=0))
    assert await texts(seed=-1) == await texts(seed=2**64 - 1)  # -1 is 2**64 - 1 to torch


async def test_unknown_fields_are_ignored_with_a_warning_naming_them(client, caplog):
    caplog.set_level(logging.WARNING, logger="paged_core.openai.protocol")
    r = await client.post(COMPLETIONS, json={"prompt": "x", "max_token": 3, "temprature": 0,
                                                   "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    assert "The following fields were present in the request but ignored: " \
           "['max_token', 'temprature']" in caplog.text


async def test_tokenization_runs_off_the_event_loop(client, engine, monkeypatch):
    tokenizer = engine.tokenizer
    encode = tokenizer.encode

    def slow_encode(text, *args, **kwargs):
        if text.startswith("slow"):
            time.sleep(1.5)  # a 5 MB prompt takes seconds to tokenize
        return encode(text, *args, **kwargs)
    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    big = asyncio.ensure_future(client.post(COMPLETIONS, json={"prompt": "slow " * 10,
                                                               "max_tokens": 2}))
    worst, last, answered = 0.0, time.monotonic(), 0
    while not big.done():  # the longest wait between two /health answers
        assert (await client.get("/health")).status_code == 200
        now = time.monotonic()
        worst, last, answered = max(worst, now - last), now, answered + 1
        await asyncio.sleep(0.02)
    assert (await big).status_code == 200
    assert answered >= 10 and worst < 0.5, f"/health waited {worst:.2f} s behind a tokenization"


def break_detokenizer_of(monkeypatch, engine, prompt: str, on_call: int) -> None:
    """Requests for ``prompt`` get a detokenizer that raises from its ``on_call``-th call."""
    add_request = engine.engine.add_request

    def patched(request):
        add_request(request)
        if request.prompt == prompt:
            detokenizer = engine.engine.output_processor.texts[request.request_id].samples[0].detokenizer
            step, calls = detokenizer.step, []

            def broken(*args, **kwargs):
                calls.append(1)
                if len(calls) >= on_call:
                    raise RuntimeError("detokenizer exploded")
                return step(*args, **kwargs)
            monkeypatch.setattr(detokenizer, "step", broken)
    monkeypatch.setattr(engine.engine, "add_request", patched)


async def test_a_request_failing_in_the_engine_is_a_500_and_the_server_keeps_serving(
        client, engine, monkeypatch):
    break_detokenizer_of(monkeypatch, engine, "break me", on_call=3)
    body = {"model": MODEL, "prompt": "break me", "max_tokens": 8, "temperature": 0}
    error = error_of(await client.post(COMPLETIONS, json=body), 500)
    assert error["type"] == "internal_server_error"
    assert "failed inside the engine" in error["message"]
    assert "goes on serving other requests" in error["message"]

    r = await client.post(COMPLETIONS, json={**body, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.text)  # ends with [DONE]
    assert events[0]["choices"][0]["text"] is not None  # tokens came before the failure
    assert events[-1]["error"]["type"] == "internal_server_error"
    assert "goes on serving" in events[-1]["error"]["message"]

    ok = await client.post(COMPLETIONS, json={**body, "prompt": "Hi"})
    assert ok.status_code == 200 and (await client.get("/health")).status_code == 200
    assert engine.stats()["kv_blocks_used"] == 0
