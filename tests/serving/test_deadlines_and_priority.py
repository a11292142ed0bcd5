"""End to end through the OpenAI routes: per-request deadlines (``timeout``, the server's
``request_timeout``), vLLM's ``priority`` and per-tenant (``user``) fairness, for sampling
and beam search (``use_beam_search``) requests alike."""
from __future__ import annotations

import asyncio
import gc
import json
import time

import pytest

from paged_core import (LLM, AsyncEngine, BeamSearchParams, EngineConfig, RequestTimeoutError,
                        SamplingParams)
from paged_core.serving.deadlines import Deadlines, check_timeout
from paged_core.openai import build_openai_app

from .conftest import asgi_client

LONG = {"prompt": "Tell me a very long story", "max_tokens": 480, "ignore_eos": True,
        "temperature": 0}


class Named:  # weakly referable, like a Request
    def __init__(self, name: str) -> None:
        self.name = name


def test_deadlines_yield_live_expired_requests_in_order():
    deadlines, now = Deadlines(), time.monotonic()
    late, early, future, gone = (Named(n) for n in ("late", "early", "future", "gone"))
    deadlines.add(late, now - 1, 2.0)
    deadlines.add(gone, now - 3, 1.0)
    deadlines.add(early, now - 2, 1.5)
    deadlines.add(future, now + 60, 60.0)
    del gone
    gc.collect()  # a finished request is not kept alive by its deadline
    assert [(r.name, t) for r, t in deadlines.expired()] == [("early", 1.5), ("late", 2.0)]
    assert list(deadlines.expired()) == []
    assert check_timeout(None) is None and check_timeout(2) == 2.0
    for bad in (0, -1, float("inf"), float("nan"), True, "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            check_timeout(bad)


@pytest.fixture(scope="module")
def engine(tiny_folder):
    eng = AsyncEngine(EngineConfig(model=tiny_folder, dtype="float32", num_kv_blocks=256,
                                   max_num_seqs=1, scheduling_policy="priority",
                                   tenant_fairness=True))
    yield eng
    eng.shutdown_sync()


@pytest.fixture
async def client(engine):
    async with asgi_client(build_openai_app(engine)) as c:
        yield c


def assert_idle(engine):
    stats = engine.stats()
    assert (stats["kv_blocks_used"], stats["num_running"], stats["num_waiting"],
            stats["num_requests"]) == (0, 0, 0, 0)


async def test_a_request_past_its_timeout_is_aborted_with_a_clear_error(client, engine):
    response = await client.post("/v1/completions", json={**LONG, "timeout": 0.2})
    assert response.status_code == 408
    error = response.json()["error"]
    assert error["param"] == "timeout" and error["code"] == "request_timeout"
    assert "did not finish within its timeout of 0.2 s and was aborted" in error["message"]
    assert_idle(engine)


async def test_a_streamed_request_past_its_timeout_ends_with_an_error_event(client, engine):
    async with client.stream("POST", "/v1/completions",
                             json={**LONG, "timeout": 0.2, "stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert any(json.loads(e).get("choices") for e in events[:-2])  # tokens came before
    assert_idle(engine)


async def test_the_engine_reports_the_aborted_output_and_the_server_default_applies(
        engine, monkeypatch):
    monkeypatch.setattr(engine.config, "request_timeout", 0.2)
    params = SamplingParams(max_tokens=480, ignore_eos=True, temperature=0)
    with pytest.raises(RequestTimeoutError) as info:
        async for _ in engine.generate("Tell me a very long story", params, request_id="late"):
            pass
    output = info.value.output
    assert info.value.request_id == "late" and output.finished
    assert output.outputs[0].finish_reason == "abort" and 0 < len(output.outputs[0].token_ids) < 480
    # a request's own timeout wins over the server's default
    outs = [o async for o in engine.generate("Hi", SamplingParams(max_tokens=4, ignore_eos=True),
                                             timeout=60)]
    assert outs[-1].outputs[0].finish_reason == "length"
    assert_idle(engine)


@pytest.mark.parametrize("extra, param", [({"timeout": -1}, "timeout"), ({"timeout": "5"}, "timeout"),
                                          ({"priority": 2**40}, "priority"),
                                          ({"priority": "high"}, "priority")])
async def test_bad_timeout_or_priority_is_a_400_naming_it(client, extra, param):
    response = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def finish_order(client, engine, bodies: list[dict]) -> list[int]:
    """Start a long request, queue ``bodies`` in order behind it (one running slot), and
    return the indices of ``bodies`` in the order they finish."""
    order: list[int] = []

    async def post(i: int, body: dict) -> None:
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        order.append(i)

    blocker = asyncio.ensure_future(client.post("/v1/completions", json={**LONG, "max_tokens": 200}))
    while engine.stats()["num_running"] < 1:
        await asyncio.sleep(0.005)
    tasks = []
    for i, body in enumerate(bodies):
        tasks.append(asyncio.ensure_future(post(i, body)))
        while engine.stats()["num_waiting"] < i + 1:  # queued in this order
            await asyncio.sleep(0.005)
    await asyncio.gather(blocker, *tasks)
    assert blocker.result().status_code == 200
    return order


async def test_lower_priority_value_runs_first(client, engine):
    short = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
    bodies = [{**short, "priority": 5}, {**short, "priority": 5}, {**short, "priority": -1},
              {**short}]
    assert await finish_order(client, engine, bodies) == [2, 3, 0, 1]
    assert_idle(engine)


async def test_one_users_burst_does_not_starve_another_user(client, engine):
    short = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
    bodies = [{**short, "user": "bulk"} for _ in range(4)] + [{**short, "user": "alice"}]
    assert await finish_order(client, engine, bodies) == [0, 4, 1, 2, 3]
    assert_idle(engine)


BEAMS = {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True, "use_beam_search": True, "n": 2}


async def test_beam_search_requests_follow_priority_and_tenant_turns(client, engine):
    bodies = [{**BEAMS, "priority": 5, "user": "bulk"}, {**BEAMS, "user": "bulk"},
              {**BEAMS, "user": "bulk"}, {**BEAMS, "priority": -1, "user": "bulk"},
              {**BEAMS, "user": "alice"}]
    assert await finish_order(client, engine, bodies) == [3, 1, 4, 2, 0]
    assert_idle(engine)


async def test_a_served_beam_search_under_priority_and_fairness_gives_the_fcfs_beams(
        client, engine, tiny_folder):
    response = await client.post("/v1/completions", json={**BEAMS, "priority": 3, "user": "bob"})
    assert response.status_code == 200, response.text
    fcfs = LLM(model=tiny_folder, dtype="float32", num_kv_blocks=256)
    (expected,) = fcfs.beam_search(["Hi"], BeamSearchParams(beam_width=2, max_tokens=3,
                                                            ignore_eos=True))
    assert [c["text"] for c in response.json()["choices"]] == [s.text for s in expected.sequences]
    assert_idle(engine)
