"""The OpenAI routes over a scripted ``EngineClient`` (no model: milliseconds per test):
engine refusals and failures map to their status codes, and request options reach the engine."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from paged_core import (AsyncEngine, EngineClient, EngineDeadError, EngineOverloadedError,
                        RequestTimeoutError)
from paged_core.openai import build_openai_app
from paged_core.outputs import CompletionOutput, RequestOutput


class FakeEngine:
    """Streams ``script`` (texts, then an optional exception) for every request."""

    model_name = "fake"
    max_model_len = 128
    tokenizer = None
    tool_call_parser = None
    lora_requests: list = []
    allow_runtime_lora_updating = False

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.is_running, self.errored = True, False
        self.calls: list[dict] = []
        self.aborted: list[str] = []

    def stats(self) -> dict[str, float]:
        return {"kv_blocks_used": 0, "num_running": 0, "num_waiting": 0}

    def apply_chat_template(self, messages: list[dict], tools: list | None = None) -> list[int]:
        return [1, 2, 3]

    async def generate(self, prompt, sampling_params=None, request_id=None, *, priority=0,
                       timeout=None, tenant=None):
        self.calls.append({"prompt": prompt, "priority": priority, "timeout": timeout,
                           "tenant": tenant})
        text = ""
        for i, item in enumerate(self.script):
            if isinstance(item, BaseException):
                raise item
            text += item
            last = i == len(self.script) - 1
            comp = CompletionOutput(0, text, list(range(i + 1)), delta_text=item,
                                    delta_token_ids=[i], finish_reason="length" if last else None)
            yield RequestOutput(request_id, None, [1], [comp], last)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def load_lora_adapter(self, lora_name: str, lora_path: str):
        raise AssertionError("runtime LoRA updating is off")

    async def unload_lora_adapter(self, lora_name: str) -> bool:
        raise AssertionError("runtime LoRA updating is off")


async def post(engine: FakeEngine, path: str, body: dict) -> httpx.Response:
    app = build_openai_app(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as client:
        return await client.post(path, json=body)


def sse(response: httpx.Response) -> list:
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_async_engine_and_the_fake_are_engine_clients():
    members = [name for name in vars(EngineClient) if not name.startswith("_")]
    assert "generate" in members and "is_running" in members
    assert all(hasattr(AsyncEngine, name) for name in members)
    assert isinstance(FakeEngine([]), EngineClient)


async def test_options_reach_the_engine():
    engine = FakeEngine(["a", "b"])
    response = await post(engine, "/v1/completions", {"prompt": "x", "priority": -2,
                                                      "timeout": 1.5, "user": "alice"})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "ab"
    assert engine.calls == [{"prompt": "x", "priority": -2, "timeout": 1.5, "tenant": "alice"}]


@pytest.mark.parametrize("error, status, code", [
    (EngineOverloadedError("queue full", retry_after=2.4), 429, "engine_overloaded"),
    (RequestTimeoutError("r", "too slow"), 408, "request_timeout"),
    (EngineDeadError("the server is shutting down"), 503, None),
])
async def test_refusals_map_to_their_status(error, status, code):
    response = await post(FakeEngine([error]), "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"] == str(error)
    if status == 429:
        assert response.headers["retry-after"] == "2"


async def test_a_stream_cut_by_a_drain_ends_with_an_error_event_then_done():
    engine = FakeEngine(["a", "b", EngineDeadError("aborted after drain_timeout=1 s")])
    events = sse(await post(engine, "/v1/completions", {"prompt": "x", "stream": True}))
    assert [e["choices"][0]["text"] for e in events[:2]] == ["a", "b"]
    assert events[2]["error"]["type"] == "service_unavailable"
    assert "drain_timeout" in events[2]["error"]["message"] and events[3] == "[DONE]"


async def test_health_follows_is_running():
    engine = FakeEngine([])
    app = build_openai_app(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as client:
        assert (await client.get("/health")).status_code == 200
        engine.is_running = False
        assert (await client.get("/health")).status_code == 503
