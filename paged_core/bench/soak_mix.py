"""The request mix of ``bench soak`` and how one request's result is classified.

``make_mix(num, seed)`` draws (seeded) OpenAI requests: completions and chats
of mixed prompt and output lengths, ``n`` of 1 to 3, streaming or not,
priorities, tenants (``user``), short ``timeout`` values, clients that leave
at a random point, and malformed or hostile bodies (which must get a 4xx).

``send(client, request)`` returns an ``Outcome``, one of ``OUTCOMES``:

- ``completed``: 200 with every choice finished ("stop"/"length"), a stream
  ending with ``[DONE]``;
- ``rejected``: 429 (admission control);
- ``timed_out``: 408, or a stream whose error event is ``request_timeout``;
- ``aborted``: the client left before the answer (disconnect);
- ``bad_request``: a malformed request refused with a 4xx, as it must be;
- ``error``: anything else: a 5xx, an error event, a missing ``[DONE]``, a
  malformed request accepted, a valid one refused, or no answer in time (hang).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

OUTCOMES = ("completed", "rejected", "timed_out", "aborted", "bad_request", "error")
WORDS = ("the quick brown fox jumps over a lazy dog while seven small robots paint "
         "bright houses near an old river under clouds of silver light").split()
BAD_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": "x", "temperature": -1}),
    ("/v1/completions", {"prompt": "x", "max_tokens": "8"}),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}),
    ("/v1/completions", {"prompt": "lone \ud800 surrogate"}),
    ("/v1/completions", {"prompt": "x", "model": "no-such-model"}),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}),
    ("/v1/completions", {"prompt": [2**40]}),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
    ("/v1/completions", {"prompt": "x", "n": 0}),
    ("/v1/completions", {"prompt": "x", "priority": "high"}),
    ("/v1/completions", {"prompt": "x", "timeout": -1}),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}),
    ("/v1/completions", {"prompt": "x", "logprobs": 10**9}),
    ("/v1/completions", {"prompt": "x", "min_tokens": 10**9}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]}),
]


@dataclass
class SoakRequest:
    path: str
    body: dict[str, Any]
    disconnect_after: float | None = None  # the client leaves after this many seconds
    malformed: bool = False

    @property
    def num_choices(self) -> int:
        return self.body.get("n", 1)


@dataclass
class Outcome:
    kind: str
    latency: float
    detail: str = ""


def make_mix(num: int, seed: int, bad_share: float = 0.1, disconnect_share: float = 0.3,
             timeout_share: float = 0.1, max_prompt_words: int = 200,
             max_output_tokens: int = 64) -> list[SoakRequest]:
    rng = random.Random(seed)
    mix = []
    for _ in range(num):
        if rng.random() < bad_share:
            path, body = rng.choice(BAD_BODIES)
            mix.append(SoakRequest(path, dict(body), malformed=True))
            continue
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_prompt_words)))
        body: dict[str, Any] = {
            "max_tokens": rng.randint(1, max_output_tokens), "stream": rng.random() < 0.5,
            "n": rng.choices((1, 2, 3), (0.75, 0.15, 0.10))[0],
            "priority": rng.choice((-1, 0, 0, 1, 2)), "user": f"tenant-{rng.randrange(6)}"}
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, seed=rng.randrange(2**64))
        if rng.random() < timeout_share:
            body["timeout"] = round(rng.uniform(0.05, 1.0), 3)
        if rng.random() < 0.15:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
        else:
            path, body["prompt"] = "/v1/completions", text
        leave = rng.uniform(0.0, 1.5) if rng.random() < disconnect_share else None
        mix.append(SoakRequest(path, body, disconnect_after=leave))
    return mix


async def send(client: Any, request: SoakRequest, hang_s: float) -> Outcome:
    """Send ``request`` with ``client`` (an ``httpx.AsyncClient``) and classify the result."""
    start = time.perf_counter()
    work = asyncio.ensure_future(_exchange(client, request))
    try:
        kind, detail = await asyncio.wait_for(asyncio.shield(work), request.disconnect_after
                                              if request.disconnect_after is not None else hang_s)
    except asyncio.TimeoutError:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        if request.disconnect_after is None:
            return Outcome("error", time.perf_counter() - start, f"no answer in {hang_s} s")
        return Outcome("aborted", time.perf_counter() - start)
    except Exception as exc:  # transport failure: the server closed on us, or crashed
        return Outcome("error", time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
    return Outcome(kind, time.perf_counter() - start, detail)


async def _exchange(client: Any, request: SoakRequest) -> tuple[str, str]:
    payload = json.dumps(request.body)  # ASCII: lone surrogates travel as JSON escapes
    async with client.stream("POST", request.path, content=payload,
                             headers={"content-type": "application/json"}) as response:
        raw = await response.aread()
    status = response.status_code
    if request.malformed:
        return ("bad_request", "") if 400 <= status < 500 else ("error", f"malformed -> {status}")
    if status == 429:
        return "rejected", ""
    if status == 408:
        return "timed_out", ""
    if status != 200:
        return "error", f"HTTP {status}: {raw[:200]!r}"
    if request.body.get("stream"):
        return _classify_stream(raw.decode(errors="replace"), request.num_choices)
    choices = json.loads(raw)["choices"]
    if len(choices) != request.num_choices or any(c["finish_reason"] not in ("stop", "length")
                                                 for c in choices):
        return "error", f"choices {[c['finish_reason'] for c in choices]}"
    return "completed", ""


def _classify_stream(text: str, num_choices: int) -> tuple[str, str]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "error", "stream without [DONE]"
    finished = set()
    for data in events[:-1]:
        chunk = json.loads(data)
        if "error" in chunk:
            if chunk["error"].get("code") == "request_timeout":
                return "timed_out", ""
            return "error", f"error event: {chunk['error']['message'][:200]}"
        for choice in chunk.get("choices", []):
            if choice.get("finish_reason") in ("stop", "length"):
                finished.add(choice["index"])
    if len(finished) != num_choices:
        return "error", f"{len(finished)} of {num_choices} choices finished"
    return "completed", ""
