"""A tensor-parallel worker that dies: every open stream ends with ``EngineDeadError``
within seconds, readiness turns false, no process is left, and a new engine starts."""
import asyncio
import os
import signal
import time

import psutil
import pytest

from paged_core import AsyncEngine, EngineConfig, SamplingParams
from paged_core.exceptions import EngineDeadError

from ..reference import passage_token_ids
from ..tiny_models import build_tiny_model

pytestmark = pytest.mark.extended

LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_killing_a_worker_mid_generation(tokenizer, tmp_path):
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    config = EngineConfig(model=folder, dtype="float32", num_kv_blocks=128, tensor_parallel_size=2)
    engine = AsyncEngine(config)
    pids = engine.engine.core.executor.worker_pids
    prompts = [passage_token_ids(tokenizer, n, offset=n) for n in (5, 12, 20)]
    started = [asyncio.Event() for _ in prompts]

    async def consume(i: int):
        try:
            async for _ in engine.generate({"prompt_token_ids": prompts[i]}, LONG):
                started[i].set()
        except EngineDeadError as exc:
            return time.monotonic(), exc
        return time.monotonic(), None

    tasks = [asyncio.create_task(consume(i)) for i in range(len(prompts))]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
    killed_at = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for ended_at, error in results:
        assert isinstance(error, EngineDeadError), "a stream ended without an error"
        assert error.__cause__ is not None
        assert ended_at - killed_at < 10
    assert not engine.is_running and engine.errored
    await engine.shutdown()
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert all(_gone(pid) for pid in pids), "a worker process outlived the engine"

    fresh = AsyncEngine(config)
    try:
        outputs = [out async for out in fresh.generate(
            {"prompt_token_ids": prompts[0]}, SamplingParams(temperature=0, max_tokens=8))]
        assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) >= 1
    finally:
        await fresh.shutdown()


async def test_a_worker_dying_while_idle_turns_the_engine_unready(tokenizer, tmp_path):
    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)
    engine = AsyncEngine(EngineConfig(model=folder, dtype="float32", num_kv_blocks=32,
                                      tensor_parallel_size=2))
    try:
        assert engine.is_running
        os.kill(engine.engine.core.executor.worker_pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while engine.is_running and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not engine.is_running and engine.errored
    finally:
        await engine.shutdown()
