"""Admission control: a full waiting queue answers 429 at once; the admitted requests all
succeed with the same greedy output as an unloaded run; the offline ``LLM`` never refuses."""
from __future__ import annotations

import asyncio
import time

import pytest

from paged_core import AsyncEngine, EngineConfig, EngineOverloadedError, SamplingParams
from paged_core.serving.admission import AdmissionGate
from paged_core.openai import build_openai_app

from .conftest import asgi_client

PROMPTS = [f"Request number {i} asks about topic {i * 7 % 13}" for i in range(16)]
MAX_WAITING = 64
ARRIVAL_GAP_S = 0.003


def body(i: int) -> dict:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_folder):
    eng = AsyncEngine(EngineConfig(model=tiny_folder, dtype="float32", num_kv_blocks=512,
                                   max_num_seqs=4, max_waiting_requests=MAX_WAITING))
    yield eng
    eng.shutdown_sync()


def test_gate_counts_slots_and_refuses_beyond_the_limit():
    gate = AdmissionGate(2, retry_after=3)
    gate.admit()
    gate.admit()
    with pytest.raises(EngineOverloadedError, match="max_waiting_requests=2") as info:
        gate.admit()
    assert info.value.retry_after == 3 and gate.num_rejected == 1 and gate.num_waiting == 2
    gate.release()
    gate.admit()  # a released slot is free again
    assert gate.num_waiting == 2
    unlimited = AdmissionGate(None)
    for _ in range(1000):
        unlimited.admit()


def test_max_waiting_requests_comes_from_the_environment():
    config = EngineConfig.from_env({"PAGED_CORE_MAX_WAITING_REQUESTS": "64"})
    assert config.max_waiting_requests == 64
    with pytest.raises(ValueError, match="max_waiting_requests"):
        EngineConfig(max_waiting_requests=0)


async def test_flood_of_1000_gets_fast_429s_and_exact_outputs_for_the_admitted(engine):
    """1,000 requests arrive in a burst (one every ~3 ms: the rate at which this 2-core machine
    parses requests: all at the same instant, any Python server answers the last one after
    seconds, refused or not) against 4 running and 64 waiting slots."""
    async with asgi_client(build_openai_app(engine)) as client:
        alone = [(await client.post("/v1/completions", json=body(i))).json()["choices"][0]["text"]
                 for i in range(len(PROMPTS))]

        async def timed(i: int):
            start = time.perf_counter()
            response = await client.post("/v1/completions", json=body(i))
            return i, response, time.perf_counter() - start

        tasks, t0 = [], time.perf_counter()
        for i in range(1000):
            tasks.append(asyncio.ensure_future(timed(i)))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * ARRIVAL_GAP_S - time.perf_counter()))
        results = await asyncio.gather(*tasks)
    rejected = [(r, dt) for _, r, dt in results if r.status_code == 429]
    cli = sorted(dt for _, dt in rejected)
    print("%d rejected, 429 latency ms: p50 %.1f p99 %.1f max %.1f" % (
        len(cli), cli[len(cli)//2]*1e3, cli[len(cli)*99//100]*1e3, cli[-1]*1e3))
    admitted = [(i, r) for i, r, _ in results if r.status_code == 200]
    assert len(rejected) + len(admitted) == 1000
    assert MAX_WAITING <= len(admitted) < 1000 and rejected
    # Quiet machine: p50 2-15 ms, p99 ~35 ms (see the report). A loaded shared 2-core
    # machine stalls any request now and then, so the bound here is looser than 100 ms each;
    # what must hold anyway: a refusal never waits for generation, unlike the admitted ones.
    served = sorted(dt for _, r, dt in results if r.status_code == 200)
    assert cli[len(cli) // 2] < 0.1 and cli[len(cli) * 99 // 100] < 0.3, cli[-10:]
    assert cli[len(cli) * 99 // 100] < served[len(served) // 2], (cli[-5:], served[:5])
    response = rejected[0][0]
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "engine_overloaded"
    assert "max_waiting_requests=64" in error["message"]
    assert [r.json()["choices"][0]["text"] for _, r in admitted] == \
        [alone[i % len(PROMPTS)] for i, _ in admitted]
    stats = engine.stats()
    assert stats["num_rejected"] == len(rejected)
    assert stats["kv_blocks_used"] == 0 and stats["num_waiting"] == 0 and stats["num_running"] == 0


async def test_refused_and_abandoned_requests_give_their_slot_back(engine):
    for _ in range(MAX_WAITING + 6):  # invalid: refused while tokenizing, after admission
        with pytest.raises(ValueError, match="prompt"):
            await anext(engine.generate({"prompt_token_ids": [10**9]}, SamplingParams()))
    rejected_before = engine.stats()["num_rejected"]
    for _ in range(MAX_WAITING + 6):  # the consumer leaves while it waits for its first token
        stream = engine.generate(PROMPTS[0], SamplingParams(max_tokens=2))
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await stream.aclose()
    outs = [o async for o in engine.generate(PROMPTS[0], SamplingParams(max_tokens=2))]
    assert outs[-1].finished and engine.stats()["num_rejected"] == rejected_before


def test_offline_llm_ignores_the_waiting_limit(tiny_folder):
    from paged_core import LLM

    llm = LLM(model=tiny_folder, dtype="float32", num_kv_blocks=256, max_waiting_requests=1)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [2] * len(PROMPTS)
