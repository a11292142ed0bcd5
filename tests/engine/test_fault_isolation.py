"""Fault isolation: one request's failure fails that request only; a failed step kills the
engine loudly (log, ``EngineDeadError`` chained to the cause on every stream, 503)."""
from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from paged_core import (AsyncEngine, EngineConfig, EngineDeadError, RequestFailedError,
                        SamplingParams)
from paged_core.openai import build_openai_app

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async-scheduling"])
def engine(request):
    """With ``async_scheduling`` a request failing in the front end is aborted one step late,
    while the core already runs its next step: it must fail alone all the same."""
    eng = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=256,
                                   async_scheduling=request.param))
    yield eng
    eng.shutdown_sync()


def fail_from_call(function, number: int, exc: Exception):
    """``function``, except that its ``number``-th call and every later one raise ``exc``."""
    calls = 0

    def broken(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls >= number:
            raise exc
        return function(*args, **kwargs)
    return broken


def break_request(monkeypatch, engine, request_id: str, where) -> None:
    """Patch the one request ``request_id`` as the engine adds it: ``where(request, text)``,
    ``request`` the core's (``Request``), ``text`` its state in the output processor."""
    add_request = engine.engine.add_request

    def patched(request):
        add_request(request)
        if request.request_id == request_id:
            where(engine.engine.core.requests[request_id],
                  engine.engine.output_processor.texts[request_id])
    monkeypatch.setattr(engine.engine, "add_request", patched)


async def collect(engine, prompt, params, request_id):
    outs = [out async for out in engine.generate(prompt, params, request_id=request_id)]
    return outs[-1]


async def test_a_failing_detokenizer_fails_only_its_request(engine, monkeypatch, caplog):
    expected = [(await collect(engine, p, GREEDY, f"alone-{i}")).outputs[0].token_ids
                for i, p in enumerate(PROMPTS)]
    error = RuntimeError("detokenizer exploded")
    def break_detokenizer(request, text):
        detokenizer = text.samples[0].detokenizer
        monkeypatch.setattr(detokenizer, "step", fail_from_call(detokenizer.step, 3, error))

    break_request(monkeypatch, engine, "bad", break_detokenizer)
    results = await asyncio.gather(
        *(collect(engine, p, GREEDY, f"good-{i}") for i, p in enumerate(PROMPTS)),
        collect(engine, "This request will fail", GREEDY, "bad"), return_exceptions=True)
    *good, bad = results
    assert isinstance(bad, RequestFailedError) and bad.request_id == "bad"
    assert bad.__cause__ is error and "goes on serving other requests" in str(bad)
    assert [out.outputs[0].token_ids for out in good] == expected
    assert "request bad failed" in caplog.text and "detokenizer exploded" in caplog.text
    assert engine.is_running and not engine.errored
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_requests"] == 0
    assert (await collect(engine, PROMPTS[0], GREEDY, "after")).outputs[0].token_ids == expected[0]


async def test_a_failing_second_sample_fails_the_whole_request_and_frees_its_blocks(
        engine, monkeypatch):
    def break_sample_1_append(request, text):
        append_token = request.append_token

        def patched(seq, token):
            if seq.sample_index == 1 and seq.num_output_tokens >= 2:
                raise ValueError("bad stop-string state")
            return append_token(seq, token)
        monkeypatch.setattr(request, "append_token", patched)

    break_request(monkeypatch, engine, "n3", break_sample_1_append)
    params = SamplingParams(n=3, seed=7, max_tokens=12, ignore_eos=True)
    other = asyncio.ensure_future(collect(engine, PROMPTS[1], GREEDY, "other"))
    with pytest.raises(RequestFailedError, match="bad stop-string state"):
        await collect(engine, PROMPTS[0], params, "n3")
    assert len((await other).outputs[0].token_ids) == 10
    assert engine.stats()["kv_blocks_used"] == 0


async def start_three_streams(engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    streams = [engine.generate(p, params, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
    for stream in streams:
        await stream.__anext__()
    return streams


async def errors_within_one_second(streams) -> list[BaseException]:
    async def drain(stream):
        async for _ in stream:
            pass
    return await asyncio.wait_for(
        asyncio.gather(*(drain(s) for s in streams), return_exceptions=True), timeout=1.0)


def break_forward(monkeypatch, engine) -> Exception:
    cause = RuntimeError("CUDA error: an illegal memory access was encountered")
    runner = engine.engine.core.executor.runner
    monkeypatch.setattr(runner, "execute", fail_from_call(runner.execute, 1, cause))
    return cause


async def test_a_failing_forward_pass_kills_the_engine_loudly(monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    engine = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=64))
    app = build_openai_app(engine)
    streams = await start_three_streams(engine)
    cause = break_forward(monkeypatch, engine)
    errors = await errors_within_one_second(streams)
    assert all(isinstance(e, EngineDeadError) and e.__cause__ is cause for e in errors), errors
    assert not engine.is_running and engine.errored
    assert "Traceback" in caplog.text and "illegal memory access" in caplog.text
    summary = next(r.getMessage() for r in caplog.records if "engine step failed" in r.getMessage())
    assert "3 sequences of 3 requests" in summary and all(f"r{i}" in summary for i in range(3))
    assert not any(p in caplog.text for p in PROMPTS)  # never the user's text
    with pytest.raises(EngineDeadError) as later:
        await collect(engine, "Hello", GREEDY, "later")
    assert later.value.__cause__ is cause
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as client:
        assert (await client.get("/health")).status_code == 503
        r = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 503 and "internal error" in r.json()["error"]["message"]
    await engine.shutdown()
    assert not engine._thread.is_alive() and engine.stats()["kv_blocks_used"] == 0


async def test_streams_get_their_error_even_when_clean_up_fails(monkeypatch, caplog):
    engine = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=64))
    streams = await start_three_streams(engine)
    monkeypatch.setattr(engine.engine, "abort_request",
                        fail_from_call(engine.engine.abort_request, 1, RuntimeError("corrupt")))
    break_forward(monkeypatch, engine)
    errors = await errors_within_one_second(streams)
    assert all(isinstance(e, EngineDeadError) for e in errors), errors
    await engine.shutdown()
    assert "could not free the requests of the stopped engine" in caplog.text


def test_offline_llm_returns_the_failed_request_with_its_error(llm_fp32, monkeypatch):
    engine = llm_fp32.engine
    add_request = engine.add_request

    def patched(request):
        add_request(request)
        if request.prompt == "break me":
            text = engine.output_processor.texts[request.request_id]  # LLM asks FINAL_ONLY:
            monkeypatch.setattr(text, "make_output",  # one make_output, when it finished
                                fail_from_call(text.make_output, 1, KeyError("cursor")))
    monkeypatch.setattr(engine, "add_request", patched)
    outs = llm_fp32.generate(["break me", PROMPTS[0]], GREEDY, use_tqdm=False)
    assert isinstance(outs[0].error, RequestFailedError) and outs[0].outputs == []
    assert outs[0].finished and isinstance(outs[0].error.__cause__, KeyError)
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 10
    assert llm_fp32.stats()["kv_blocks_used"] == 0
