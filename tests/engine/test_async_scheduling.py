"""``async_scheduling``: the front end works on one step's outputs while the next step runs.

Outputs reach the caller one step later and a stop string ends its sample one step late, so
these tests hold the engine to what users see: the same tokens, text, finish and stop reasons
and log-probabilities as the synchronous engine; no token computed past a stop string is
reported or counted; every block comes back; an abort keeps the tokens still waiting for the
front end; a request counts as running until its final output was returned.
"""
from __future__ import annotations

import asyncio

import pytest

from paged_core import LLM, AsyncEngine, EngineConfig, SamplingParams
from paged_core.config import resolved_async_scheduling
from paged_core.engine.llm_engine import LLMEngine

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "List three colours:"]


def engine_settings(**settings) -> dict:
    return {"dtype": "float32", "num_kv_blocks": 256, "max_num_seqs": 8, **settings}


@pytest.fixture(scope="module")
def sync_llm():
    llm = LLM(**engine_settings())
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def async_llm():
    llm = LLM(**engine_settings(async_scheduling=True))
    yield llm
    llm.shutdown()


def summary(outputs) -> list:
    """What a user reads of each completion, log-probabilities as (token, rank) only."""
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else
              [sorted((t, lp.rank) for t, lp in row.items()) for row in c.logprobs])
             for c in out.outputs] for out in outputs]


def logprob_values(outputs) -> list[float]:
    return [lp.logprob for out in outputs for c in out.outputs for row in (c.logprobs or [])
            for _, lp in sorted(row.items())]


def stop_strings_inside(sync_llm, prompts: list[str], max_tokens: int) -> list[str]:
    """For each prompt, a piece of the middle of its greedy text: a stop string that matches."""
    outs = sync_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                     ignore_eos=True), use_tqdm=False)
    stops = []
    for out in outs:
        text = out.outputs[0].text
        middle = len(text) // 2
        assert len(text) > 12, "the model wrote too little to stop inside"
        stops.append(text[middle:middle + 3])
    return stops


def assert_outputs_equal_the_synchronous_engine(sync_llm, llm) -> None:
    """Stop strings, log-probabilities, seeded ``n > 1`` and ``min_tokens`` through ``llm``
    give what the synchronous engine gives."""
    stops = stop_strings_inside(sync_llm, PROMPTS, 24)
    params = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stops[0]]),
        SamplingParams(temperature=0, max_tokens=24, stop=[stops[1]],
                       include_stop_str_in_output=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=7, n=3, max_tokens=16, stop=[stops[2]]),
        SamplingParams(temperature=0, max_tokens=9, min_tokens=5),
    ]
    expected = sync_llm.generate(PROMPTS, params, use_tqdm=False)
    got = llm.generate(PROMPTS, params, use_tqdm=False)
    assert summary(got) == summary(expected)
    # a sample stopped late rides more steps: other batches, so the last float bits may differ
    assert logprob_values(got) == pytest.approx(logprob_values(expected), abs=1e-4)
    assert logprob_values(expected)
    # the stop strings did end samples early, so the late path was taken
    assert expected[0].outputs[0].finish_reason == "stop"
    assert len(expected[0].outputs[0].token_ids) < 24


def assert_no_token_past_a_stop_string_is_counted(sync_llm, llm) -> None:
    """Through ``llm``, tokens computed past a stop string are neither reported nor counted,
    and every block comes back."""
    stops = stop_strings_inside(sync_llm, PROMPTS, 30)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
              for stop in stops]
    before = llm.engine.generated_tokens
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)
    assert llm.engine.generated_tokens - before == sum(len(o.outputs[0].token_ids) for o in outs)
    assert llm.stats()["kv_blocks_used"] == 0
    assert not llm.engine.has_unfinished_requests()


def test_outputs_equal_the_synchronous_engine(sync_llm, async_llm):
    assert_outputs_equal_the_synchronous_engine(sync_llm, async_llm)


def test_no_token_past_a_stop_string_is_counted_and_every_block_comes_back(sync_llm, async_llm):
    assert_no_token_past_a_stop_string_is_counted(sync_llm, async_llm)


def test_the_setting_is_vllms_flag_on_by_default_for_one_cuda_device_only():
    assert EngineConfig().async_scheduling is None
    assert EngineConfig.from_env({"PAGED_CORE_ASYNC_SCHEDULING": "1"}).async_scheduling is True
    assert EngineConfig.from_env({"PAGED_CORE_ASYNC_SCHEDULING": "0"}).async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling must be true or false"):
        EngineConfig(async_scheduling="sometimes")
    assert resolved_async_scheduling(None, "cuda", 1) is True
    assert resolved_async_scheduling(None, "cuda", 2) is False  # NCCL not yet run on GPUs
    assert resolved_async_scheduling(None, "cpu", 1) is False
    assert resolved_async_scheduling(False, "cuda", 1) is False
    assert resolved_async_scheduling(True, "cpu", 1) is True


def test_a_cpu_engine_left_to_the_default_steps_one_at_a_time(sync_llm):
    assert sync_llm.engine.config.async_scheduling is False
    assert sync_llm.engine.core.executor.runner.non_blocking_inputs is False


def make_engine(**settings) -> LLMEngine:
    return LLMEngine(EngineConfig(**engine_settings(async_scheduling=True, **settings)))


@pytest.fixture(scope="module")
def engine():
    eng = make_engine()
    yield eng
    eng.shutdown()


def add(engine: LLMEngine, request_id: str, max_tokens: int) -> None:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request(engine.make_request(request_id, PROMPTS[0], params))


def test_an_abort_keeps_the_tokens_still_waiting_for_the_front_end(engine, sync_llm):
    add(engine, "a", 20)
    assert engine.step() == []  # the prompt's step: its token waits for the next step
    (first,) = engine.step()  # the first token comes out while the second is computed
    assert len(first.outputs[0].token_ids) == 1 and not first.finished
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    (full,) = sync_llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=20,
                                                            ignore_eos=True), use_tqdm=False)
    assert out.outputs[0].token_ids == full.outputs[0].token_ids[:2]
    assert engine.stats()["kv_blocks_used"] == 0
    assert not engine.has_unfinished_requests()


def test_a_request_counts_until_its_final_output_is_returned(engine):
    add(engine, "b", 1)
    assert engine.step() == []  # the core is done with "b"; its output is one step away
    assert not engine.core.has_unfinished_requests()
    assert engine.has_unfinished_requests() and engine.has_request("b")
    with pytest.raises(ValueError, match="already in use"):
        add(engine, "b", 1)
    assert engine.abort_request("b") is None  # nothing left to abort in the core
    (out,) = engine.step()
    assert out.request_id == "b" and out.finished and len(out.outputs[0].token_ids) == 1
    assert not engine.has_request("b") and not engine.has_unfinished_requests()


async def assert_streams_carry_the_synchronous_engine_text(sync_llm, **settings) -> None:
    """Streams of an ``AsyncEngine`` under ``settings``, all at once, carry the synchronous
    engine's tokens and text, and every block comes back."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = sync_llm.generate(PROMPTS, params, use_tqdm=False)
    served = AsyncEngine(EngineConfig(**engine_settings(**settings)))

    async def stream(prompt: str):
        pieces = []
        async for out in served.generate(prompt, params):
            pieces.append(out.outputs[0].delta_text)
        return "".join(pieces), out

    try:
        for (text, out), want in zip(await asyncio.gather(*map(stream, PROMPTS)), expected):
            assert text == out.outputs[0].text == want.outputs[0].text
            assert out.outputs[0].token_ids == want.outputs[0].token_ids
        assert served.stats()["kv_blocks_used"] == 0
    finally:
        served.shutdown_sync()


async def test_streams_carry_the_synchronous_engine_text(sync_llm):
    await assert_streams_carry_the_synchronous_engine_text(sync_llm, async_scheduling=True)
