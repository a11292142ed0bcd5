"""Driving an ``LLMEngine`` step by step, for benchmarks that watch the KV cache as it runs.

``run_until_done`` steps the engine until every submitted request finished,
calling ``on_step(engine)`` after each step (when ``engine.stats()`` reflects
the blocks that step allocated and freed). ``live_sequences`` lists what sits
in the cache right now: the running sequences, each with ``num_computed_tokens``
tokens of K/V (read from the scheduler: ``stats()`` has block counts, not tokens).
"""
from __future__ import annotations

from typing import Any, Callable

from paged_core import EngineConfig, LLMEngine, LoRARequest, RequestOutput, SamplingParams

from .workload import BenchRequest


def make_engine(dtype: str, **engine_args: Any) -> LLMEngine:
    return LLMEngine(EngineConfig(dtype=dtype, **engine_args))


def exact_params(request: BenchRequest, **overrides: Any) -> SamplingParams:
    """Greedy, exactly ``request.output_len`` tokens."""
    values = {"max_tokens": request.output_len, "ignore_eos": True, "temperature": 0, **overrides}
    return SamplingParams(**values)


def submit(engine: LLMEngine, request_id: str, request: BenchRequest,
           params: SamplingParams | None = None, lora_request: LoRARequest | None = None) -> None:
    prompt = {"prompt_token_ids": request.prompt_token_ids}
    engine.add_request(engine.make_request(request_id, prompt, params or exact_params(request),
                                           lora_request=lora_request))


def run_until_done(engine: LLMEngine,
                   on_step: Callable[[LLMEngine], None] | None = None) -> dict[str, RequestOutput]:
    """Step until no request is left; returns the final output of each request by id."""
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        if on_step is not None:
            on_step(engine)
    return finished


def live_sequences(engine: LLMEngine) -> list:
    """Sequences holding K/V in the cache now (running ones)."""
    return list(engine.core.scheduler.running)
