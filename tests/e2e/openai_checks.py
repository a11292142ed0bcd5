"""Checks any OpenAI-compatible paged-core server must pass (BentoML, LitServe).

Each check takes a ``Served`` (base URL + where its engine metrics live) and
uses real clients (``openai``, ``httpx``).
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import httpx
import openai
import pytest

from .conftest import CHAT, MAX_TOKENS, PROMPTS

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Served:
    name: str
    base_url: str
    metrics_path: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused",
                                  max_retries=0, timeout=120)

    def engine_metrics(self) -> dict[str, float]:
        text = httpx.get(self.base_url + self.metrics_path, timeout=10).text
        return {k: float(v) for k, v in re.findall(r"^(paged_core_\w+) (\S+)$", text, re.M)}


def greedy(served: Served, reference_texts: dict[str, str]) -> None:
    client = served.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    for prompt in PROMPTS:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                        temperature=0)
        assert out.choices[0].text == reference_texts[prompt], prompt
        assert out.usage.completion_tokens == MAX_TOKENS or out.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS,
                                          temperature=0)
    assert chat.choices[0].message.content == reference_texts["<chat>"]


def streaming(served: Served, reference_texts: dict[str, str]) -> None:
    client = served.client()
    prompt = PROMPTS[0]
    chunks = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True)
        if c.choices]
    assert len([c for c in chunks if c]) >= 3
    assert "".join(chunks) == reference_texts[prompt]
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}) if c.choices]
    assert len([d for d in deltas if d]) >= 3
    assert "".join(deltas) == reference_texts["<chat>"]


# Tokens per stream of the concurrency check: long enough that a stream admitted first cannot
# finish before the last of the n requests reaches the engine. With 32, on a 2-core Intel Xeon
# with AMX under a parallel test run, two streams decoded alone at ~8 ms a token finished
# before the other 14 requests' HTTP handling was through (0.57 s later).
CONCURRENT_STREAM_TOKENS = 96


async def _concurrent(served: Served, n: int) -> tuple[list[tuple[float, float]], float]:
    client = served.async_client()
    peak = 0.0
    done = asyncio.Event()

    async def one(i: int) -> tuple[float, float]:
        stream = await client.completions.create(
            model=MODEL, prompt=f"{PROMPTS[i % len(PROMPTS)]} ({i})",
            max_tokens=CONCURRENT_STREAM_TOKENS,
            temperature=0.8, seed=i, extra_body={"ignore_eos": True}, stream=True)
        times = [time.monotonic() async for c in stream if c.choices and c.choices[0].text]
        assert len(times) >= 2
        return times[0], times[-1]

    async def watch() -> None:
        nonlocal peak
        async with httpx.AsyncClient(timeout=10) as http:
            while not done.is_set():
                text = (await http.get(served.base_url + served.metrics_path)).text
                running = re.search(r"^paged_core_num_requests_running (\S+)$", text, re.M)
                peak = max(peak, float(running.group(1)))
                await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        spans = await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        done.set()
        await watcher
        await client.close()
    return spans, peak


def concurrency(served: Served, n: int = 16) -> None:
    spans, peak = asyncio.run(_concurrent(served, n))
    # every stream produced its first token before any stream produced its last:
    assert max(first for first, _ in spans) < min(last for _, last in spans), spans
    assert peak >= n * 3 / 4, f"only {peak} requests ran at once in the engine"


def _wait_until_idle(served: Served, since: float, limit_s: float = 1.0) -> None:
    while True:
        after = served.engine_metrics()
        if after["paged_core_num_requests_running"] == 0 and after["paged_core_kv_blocks_used"] == 0:
            return
        assert time.monotonic() - since < limit_s, f"request not aborted within {limit_s} s: {after}"
        time.sleep(0.02)


def disconnect(served: Served) -> None:
    """A streaming client that goes away mid-stream: the request is aborted within 1 s."""
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{served.base_url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = 0
            for line in response.iter_lines():
                events += line.startswith("data: ")
                if events == 3:  # still connected: leaving this loop closes the connection
                    during = served.engine_metrics()
                    break
            left = time.monotonic()
    assert during["paged_core_num_requests_running"] == 1, during
    assert during["paged_core_kv_blocks_used"] >= 1, during
    _wait_until_idle(served, left)


def disconnect_non_streaming(served: Served) -> None:
    """A client that times out waiting for a full completion: the request is aborted too."""
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 400, "ignore_eos": True}
    with httpx.Client(timeout=1.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post(f"{served.base_url}/v1/completions", json=body)  # gives up, disconnects
    _wait_until_idle(served, time.monotonic())


BAD_REQUESTS = [
    # (path, json body or raw bytes, status, param, message fragment)
    ("/v1/completions", {"model": "no-such-model", "prompt": "hi"}, 404, "model", "no-such-model"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": -1}, 400, "max_tokens",
     "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature",
     "temperature"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "temperature": -1}, 400,
     "temperature", "temperature"),
    ("/v1/completions", b'{"model": "x", "prompt": ', 400, None, "JSON"),
    ("/v1/completions", {"model": MODEL, "prompt": "hello " * 1500}, 400, "prompt", "too long"),
    ("/v1/completions", {"model": MODEL, "prompt": "hello " * 1500, "stream": True}, 400,
     "prompt", "too long"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                                                           "content": "hello " * 1500}]},
     400, "messages", "too long"),
]


def bad_input(served: Served, path: str, body: object, status: int, param: str | None,
              fragment: str) -> None:
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        if isinstance(body, bytes):
            r = http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = http.post(path, json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert fragment in error["message"]
        assert error["param"] == param
        assert set(error) == {"message", "type", "param", "code"}
        ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
