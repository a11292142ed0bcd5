"""Streaming clients for ``bench serve``: one request in, one ``RequestRecord`` of timings out.

- ``HTTPClient``: ``POST {url}/completions`` with ``stream=true`` (Server-Sent
  Events) through ``httpx``; every chunk carrying a choice is one token event,
  and the final ``usage`` chunk gives the exact number of output tokens;
- ``InProcessClient``: ``AsyncEngine.generate`` in this process (no HTTP); every
  streamed delta is one token event. Used by ``--in-process``.

Both ask for exactly ``output_len`` tokens (``ignore_eos``) with greedy decoding.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from .workload import BenchRequest


@dataclass
class RequestRecord:
    """Times are seconds since the request was sent."""

    prompt_tokens: int
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    token_times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive token events."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.output_tokens < 2 or self.e2e is None or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


class HTTPClient:
    def __init__(self, url: str, timeout_s: float = 600.0, model: str | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model  # sent as the OpenAI ``model`` field when given (vLLM requires it)
        unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = httpx.AsyncClient(timeout=timeout_s, limits=unlimited)

    async def close(self) -> None:
        await self.http.aclose()

    async def send(self, request: BenchRequest,
                   headers: dict[str, str] | None = None) -> RequestRecord:
        body: dict[str, Any] = {"prompt": request.prompt_token_ids, "max_tokens": request.output_len,
                                "ignore_eos": True, "temperature": 0, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        record = RequestRecord(request.prompt_len)
        start = time.perf_counter()
        try:
            async with self.http.stream("POST", f"{self.url}/completions", json=body,
                                        headers=headers) as response:
                if response.status_code != 200:
                    record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                    return record
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("choices"):
                        record.token_times.append(time.perf_counter() - start)
                    if chunk.get("usage"):
                        record.output_tokens = chunk["usage"]["completion_tokens"]
        except Exception as exc:  # a failed request is a data point, not a crash
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        return _finish(record, start)


class InProcessClient:
    """Drives an ``AsyncEngine`` directly (the engine without any server around it)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    async def close(self) -> None:
        await self.engine.shutdown()

    async def send(self, request: BenchRequest) -> RequestRecord:
        from paged_core import SamplingParams

        params = SamplingParams(max_tokens=request.output_len, ignore_eos=True, temperature=0)
        record = RequestRecord(request.prompt_len)
        start = time.perf_counter()
        try:
            async for out in self.engine.generate({"prompt_token_ids": request.prompt_token_ids}, params):
                completion = out.outputs[0]
                if completion.delta_token_ids:
                    record.token_times.append(time.perf_counter() - start)
                record.output_tokens = len(completion.token_ids)
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        return _finish(record, start)


def _finish(record: RequestRecord, start: float) -> RequestRecord:
    record.e2e = time.perf_counter() - start
    if record.token_times:
        record.ttft = record.token_times[0]
    else:
        record.error = "no tokens streamed"
    return record
