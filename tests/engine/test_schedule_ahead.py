"""``schedule_ahead``: each step is scheduled and launched before the previous step's sampled
tokens reach the host; decoding sequences hold placeholders and the runner takes their input
tokens from the previous step's output on the device (on the CPU, the same tensor path).

Held to what users see: the same tokens, text, finish and stop reasons and log-probabilities
as the synchronous engine, for every request kind beside the ones that go ahead (penalties,
grammars and beam searches wait for their tokens); steps really launched ahead; preemption,
chunked prefill and prefix caching unchanged (no placeholder is ever hashed); every block
back after aborts and stops.
"""
from __future__ import annotations

import pytest

from paged_core import LLM, BeamSearchParams, EngineConfig, SamplingParams
from paged_core.config import resolved_schedule_ahead
from paged_core.core.sequence import PLACEHOLDER, Sequence
from paged_core.engine.llm_engine import LLMEngine
from paged_core.requests.engine_io import EngineRequest
from paged_core.requests.sampling_request import Request
from paged_core.structured_outputs.params import StructuredOutputsParams

from .test_async_scheduling import (  # noqa: F401 - sync_llm: a fixture used here
    PROMPTS, assert_no_token_past_a_stop_string_is_counted,
    assert_outputs_equal_the_synchronous_engine, assert_streams_carry_the_synchronous_engine_text,
    engine_settings as settings, summary, sync_llm)

AHEAD = {"async_scheduling": True, "schedule_ahead": True}


@pytest.fixture(scope="module")
def ahead_llm():
    llm = LLM(**settings(**AHEAD))
    yield llm
    llm.shutdown()


def count_ahead_launches(llm: LLM) -> dict:
    """Wrap the executor: counts the steps launched and those whose rows read the previous
    step's tokens on the device."""
    counts = {"steps": 0, "ahead": 0}
    executor = llm.engine.core.executor
    run = executor.execute_model

    def counted(packed, block_copies, plan):
        counts["steps"] += 1
        counts["ahead"] += packed.ahead is not None
        return run(packed, block_copies, plan)

    executor.execute_model = counted
    return counts


def test_outputs_equal_the_synchronous_engine(sync_llm, ahead_llm):
    assert_outputs_equal_the_synchronous_engine(sync_llm, ahead_llm)


def test_no_token_past_a_stop_string_is_counted(sync_llm, ahead_llm):
    assert_no_token_past_a_stop_string_is_counted(sync_llm, ahead_llm)


async def test_a_server_streams_the_synchronous_engine_text(sync_llm):
    await assert_streams_carry_the_synchronous_engine_text(sync_llm, **AHEAD)


@pytest.mark.extended
def test_requests_that_wait_for_their_tokens_run_beside_those_that_go_ahead(sync_llm,
                                                                          ahead_llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    params = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3,
                       frequency_penalty=0.5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30,
                       structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0.7, seed=3, max_tokens=1),
    ]
    assert summary(ahead_llm.generate(PROMPTS, params, use_tqdm=False)) == summary(
        sync_llm.generate(PROMPTS, params, use_tqdm=False))
    beams = BeamSearchParams(beam_width=3, max_tokens=10)
    got = ahead_llm.beam_search([{"prompt": p} for p in PROMPTS[:2]], beams)
    want = sync_llm.beam_search([{"prompt": p} for p in PROMPTS[:2]], beams)
    assert [[s.tokens for s in o.sequences] for o in got] == \
        [[s.tokens for s in o.sequences] for o in want]
    assert ahead_llm.stats()["kv_blocks_used"] == 0


def test_decode_steps_are_launched_before_the_previous_tokens_arrive(sync_llm):
    llm = LLM(**settings(**AHEAD))
    counts = count_ahead_launches(llm)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    (out,) = llm.generate(PROMPTS[:1], params, use_tqdm=False)
    (want,) = sync_llm.generate(PROMPTS[:1], params, use_tqdm=False)
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    # one prefill, then a decode every step (none waits a step for its token), the last
    # token's step knows it is the last and holds no place after it
    assert counts == {"steps": 30, "ahead": 29}
    llm.shutdown()


def both_ways(run) -> dict:
    """``run(extra settings)`` for a synchronous engine and for one that schedules ahead; the
    results by name."""
    return {name: run(more) for name, more in (("sync", {}), ("ahead", AHEAD))}


@pytest.mark.extended
def test_preemption_and_chunked_prefill_are_unchanged():
    prompts = [f"{PROMPTS[i % 4]} and then, number {i}, the story went on" for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def run(more: dict) -> list:
        llm = LLM(**settings(num_kv_blocks=14, max_num_batched_tokens=16, **more))
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        stats = llm.stats()
        assert stats["num_preemptions"] > 0 and stats["kv_blocks_used"] == 0
        llm.shutdown()
        return tokens

    results = both_ways(run)
    assert results["ahead"] == results["sync"]


@pytest.mark.extended
def test_blocks_filled_ahead_are_cached_under_their_real_tokens():
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def run(more: dict) -> tuple:
        llm = LLM(**settings(block_size=16, enable_prefix_caching=True, **more))
        first = llm.generate(PROMPTS[:2], params, use_tqdm=False)
        # each first text as a prompt: its blocks, decoded ahead, come from the cache
        again = [{"prompt_token_ids": list(o.prompt_token_ids) + o.outputs[0].token_ids[:30]}
                 for o in first]
        second = llm.generate(again, params, use_tqdm=False)
        assert llm.stats()["kv_blocks_used"] == 0
        llm.shutdown()
        return ([o.outputs[0].token_ids for o in first + second],
                [o.num_cached_tokens for o in second])

    results = both_ways(run)
    assert results["ahead"] == results["sync"]
    assert min(results["ahead"][1]) >= 32


def test_an_abort_and_a_stop_in_flight_give_every_block_back():
    engine = LLMEngine(EngineConfig(**settings(**AHEAD)))
    for name in ("a", "b"):
        params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
        engine.add_request(engine.make_request(name, PROMPTS[0], params))
    for _ in range(6):
        engine.step()
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["kv_blocks_used"] == 0 and engine.core.requests == {}
    engine.shutdown()


def test_the_setting_needs_async_scheduling_one_rank_and_no_speculation():
    assert EngineConfig().schedule_ahead is None  # resolved by the engine for its device
    assert EngineConfig.from_env({"PAGED_CORE_SCHEDULE_AHEAD": "0"}).schedule_ahead is False
    assert EngineConfig.from_env({"PAGED_CORE_SCHEDULE_AHEAD": "1"}).schedule_ahead is True
    with pytest.raises(ValueError, match="schedule_ahead must be true or false"):
        EngineConfig(schedule_ahead="soon")
    for bad in ({"async_scheduling": False}, {"tensor_parallel_size": 2},
                {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}):
        with pytest.raises(ValueError, match="schedule_ahead needs async_scheduling"):
            EngineConfig(schedule_ahead=True, **bad)
    with pytest.raises(ValueError, match="schedule_ahead needs async_scheduling"):
        LLMEngine(EngineConfig(schedule_ahead=True, device="cpu"))  # off on the CPU


def test_a_token_takes_its_placeholder_and_a_finishing_one_drops_the_next():
    source = EngineRequest("r", (5, 6, 7), SamplingParams(max_tokens=3, ignore_eos=True),
                           frozenset({0}))
    request = Request(source, max_total_tokens=100)
    seq: Sequence = request.sequences[0]
    seq.token_ids += [11, PLACEHOLDER, PLACEHOLDER]  # one known output, two on their way
    seq.num_placeholders = 2
    assert seq.num_known_tokens == 4 and not request.may_schedule_ahead(seq)
    assert request.append_token(seq, 12) is False
    assert seq.token_ids == [5, 6, 7, 11, 12, PLACEHOLDER] and seq.num_placeholders == 1
    assert request.append_token(seq, 13) is True  # the third output: max_tokens
    assert seq.token_ids == [5, 6, 7, 11, 12, 13] and seq.finish_reason == "length"


def test_left_unset_it_follows_one_cuda_device_that_overlaps_its_steps():
    """``None``: on for one CUDA device with ``async_scheduling`` and no speculation (as
    vLLM's async scheduler); off on the CPU even where ``async_scheduling`` is asked for."""
    assert resolved_schedule_ahead(None, "cuda", True, 1, False) is True
    assert resolved_schedule_ahead(None, "cuda", False, 1, False) is False
    assert resolved_schedule_ahead(None, "cuda", True, 2, False) is False
    assert resolved_schedule_ahead(None, "cuda", True, 1, True) is False
    assert resolved_schedule_ahead(None, "cpu", True, 1, False) is False
    assert resolved_schedule_ahead(True, "cpu", True, 1, False) is True
    assert resolved_schedule_ahead(False, "cuda", True, 1, False) is False


def test_an_engine_keeps_the_resolved_setting():
    """The CPU engine resolves ``None`` to off (its steps run one at a time) and keeps an
    explicit ``True`` beside ``async_scheduling``; the core schedules ahead only then."""
    default = LLMEngine(EngineConfig(device="cpu", **settings()))
    ahead = LLMEngine(EngineConfig(device="cpu", **settings(**AHEAD)))
    try:
        assert default.config.schedule_ahead is False and default.core.ahead is None
        assert ahead.config.schedule_ahead is True and ahead.core.ahead is not None
    finally:
        default.shutdown()
        ahead.shutdown()
