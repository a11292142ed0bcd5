"""AsyncEngine posts a step's outputs to each consumer event loop in one call: streams spread
over two event loops (two threads) at once each get every token, once, in order, with one
wake-up of their loop per step, not one per stream; and a loop that closes while its streams
run loses only those streams: their requests are aborted and their blocks freed, the other
loop's finish."""
import asyncio
import threading
import time

import pytest

from paged_core import AsyncEngine, EngineConfig, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
STREAMS_PER_LOOP = 6


@pytest.fixture(scope="module")
def engine():
    eng = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=256, max_num_seqs=32,
                                   itl_target_ms=0))
    yield eng
    eng.shutdown_sync()


def _prompt(tag: str, i: int) -> str:
    return f"Loop {tag}, story {i}: once upon a time"


class CountingLoop:
    """An event loop on a thread of its own that counts its ``call_soon_threadsafe`` calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.calls = 0
        inner = self.loop.call_soon_threadsafe

        def counted(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        self.loop.call_soon_threadsafe = counted
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _tokens(engine: AsyncEngine, prompt: str) -> list[int]:
    """The stream's token deltas joined, checked against its final output: every token
    arrived, once, in order."""
    tokens: list[int] = []
    async for out in engine.generate(prompt, PARAMS):
        tokens.extend(out.outputs[0].delta_token_ids)
    assert out.finished and tokens == out.outputs[0].token_ids
    assert len(tokens) == PARAMS.max_tokens
    return tokens


async def _streams(engine: AsyncEngine, tag: str) -> list[list[int]]:
    return list(await asyncio.gather(*(_tokens(engine, _prompt(tag, i))
                                       for i in range(STREAMS_PER_LOOP))))


def test_two_loops_get_every_token_with_one_wakeup_per_step(engine):
    a, b = CountingLoop(), CountingLoop()
    try:
        fa = asyncio.run_coroutine_threadsafe(_streams(engine, "a"), a.loop)
        fb = asyncio.run_coroutine_threadsafe(_streams(engine, "b"), b.loop)
        assert len(fa.result(120)) == len(fb.result(120)) == STREAMS_PER_LOOP
    finally:
        a.close()
        b.close()
    outputs_per_loop = STREAMS_PER_LOOP * PARAMS.max_tokens
    for loop in (a, b):
        # one post per step that had outputs for the loop's streams (10 tokens: ~10 steps,
        # plus the first steps' admissions), never one per output as a post per stream makes
        assert 0 < loop.calls <= outputs_per_loop // 2, loop.calls
    assert engine.stats()["kv_blocks_used"] == 0


def test_closed_loop_loses_only_its_streams(engine):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    doomed, survivor = CountingLoop(), CountingLoop()
    started = threading.Event()

    async def hang(i: int) -> None:
        async for _ in engine.generate(_prompt("doomed", i), long):
            started.set()
            await asyncio.sleep(3600)  # never reads again: its loop closes under it

    for i in range(3):
        asyncio.run_coroutine_threadsafe(hang(i), doomed.loop)
    assert started.wait(60)
    # stop the loop with its streams' tasks still pending (as a dying server thread would)
    doomed.loop.call_soon_threadsafe(doomed.loop.stop)
    doomed.thread.join(10)
    doomed.loop.close()
    try:
        finished = survivor.run(_streams(engine, "survivor"))
    finally:
        survivor.close()
    assert all(len(tokens) == PARAMS.max_tokens for tokens in finished)
    deadline = time.monotonic() + 10
    while engine.stats()["num_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["num_requests"] == 0
    assert engine.stats()["kv_blocks_used"] == 0
