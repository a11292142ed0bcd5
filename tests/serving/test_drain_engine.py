"""``AsyncEngine.drain``: new requests refused at once, open ones finish within the drain
timeout, the rest end with ``EngineDeadError`` saying why; the loop stops, nothing leaks."""
from __future__ import annotations

import asyncio

import pytest

from paged_core import AsyncEngine, EngineConfig, EngineDeadError, SamplingParams


def engine_of(tiny_folder) -> AsyncEngine:
    return AsyncEngine(EngineConfig(model=tiny_folder, dtype="float32", num_kv_blocks=128))


async def first_output_then_rest(engine, params):
    gen = engine.generate("Tell me a long story", params)
    first = await gen.__anext__()
    return first, gen


async def collect(gen):
    return [out async for out in gen]


async def test_drain_lets_open_requests_finish_and_refuses_new_ones(tiny_folder):
    engine = engine_of(tiny_folder)
    _, gen = await first_output_then_rest(engine, SamplingParams(max_tokens=40, ignore_eos=True))
    drained = asyncio.ensure_future(asyncio.to_thread(engine.drain, 30))
    while engine.is_running:
        await asyncio.sleep(0.001)
    with pytest.raises(EngineDeadError, match="shutting down"):
        await anext(engine.generate("new", SamplingParams(max_tokens=1)))
    rest = await collect(gen)
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "length"
    assert len(rest[-1].outputs[0].token_ids) == 40
    assert await drained is True and not engine.errored


async def test_drain_timeout_aborts_what_is_left_with_an_error(tiny_folder):
    engine = engine_of(tiny_folder)
    _, gen = await first_output_then_rest(engine, SamplingParams(max_tokens=400, ignore_eos=True))
    assert await asyncio.to_thread(engine.drain, 0.05) is False
    with pytest.raises(EngineDeadError, match="drain_timeout=0.05 s"):
        await collect(gen)
    assert engine.stats()["kv_blocks_used"] == 0 and engine.stats()["num_requests"] == 0
