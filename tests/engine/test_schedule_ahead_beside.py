"""``schedule_ahead`` beside what it does not see itself, now that it is on by default for one
CUDA device: the adapters of mixed LoRA requests, MoE layers, and a served stream whose
client leaves while a step is in flight. Each against the synchronous engine token for
token (on the CPU: the same tensor path the GPU runs), every block back."""
from __future__ import annotations

import asyncio

import pytest

from paged_core import LLM, AsyncEngine, EngineConfig, LoRARequest, SamplingParams

from ..lora.adapters import make_adapter
from ..tiny_models import build_tiny_model
from .test_async_scheduling import PROMPTS
from .test_schedule_ahead import AHEAD, both_ways, count_ahead_launches

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def tokens(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def greedy_run(settings: dict, **generate_options):
    """``run(extra settings)`` for ``both_ways``: the greedy tokens of PROMPTS and the steps
    launched ahead, every block back."""
    def run(more: dict) -> tuple[list[list[int]], int]:
        llm = LLM(**settings, **more)
        counts = count_ahead_launches(llm)
        got = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, **generate_options))
        assert llm.stats()["kv_blocks_used"] == 0
        llm.shutdown()
        return got, counts["ahead"]
    return run


def test_mixed_lora_requests_go_ahead_under_their_own_adapters(tokenizer, tmp_path):
    base = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    adapters = [LoRARequest(f"a{i}", i, make_adapter(base, str(tmp_path / f"a{i}"), 8, seed=i))
                for i in (1, 2)]
    requests = [None, adapters[0], adapters[1], adapters[0]]  # base rows beside adapted ones
    results = both_ways(greedy_run(
        dict(model=base, dtype="float32", num_kv_blocks=64, enable_lora=True, max_loras=2,
             max_lora_rank=8), lora_request=requests))
    (sync, sync_ahead), (ahead, ahead_launches) = results["sync"], results["ahead"]
    assert ahead == sync
    assert len({tuple(t) for t in sync[1:3]}) == 2  # the adapters do differ
    assert sync_ahead == 0 and ahead_launches >= GREEDY.max_tokens - 2


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe"])
def test_moe_layers_go_ahead(model_type, tokenizer, tmp_path):
    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    results = both_ways(greedy_run(dict(model=folder, dtype="float32", num_kv_blocks=64)))
    (sync, sync_ahead), (ahead, ahead_launches) = results["sync"], results["ahead"]
    assert ahead == sync
    assert sync_ahead == 0 and ahead_launches > 0


async def test_a_stream_left_while_its_step_is_in_flight_gives_its_blocks_back(tokenizer,
                                                                               tmp_path):
    """A client that stops reading after a few tokens (a disconnect: the generator is
    closed) while the engine has the next step launched; the others stream on and equal the
    synchronous engine, and every block comes back."""
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    sync = LLM(model=folder, dtype="float32", num_kv_blocks=64)
    expected = tokens(sync.generate(PROMPTS, GREEDY, use_tqdm=False))
    sync.shutdown()
    served = AsyncEngine(EngineConfig(model=folder, dtype="float32", num_kv_blocks=64, **AHEAD))

    async def stream(prompt: str, leave_after: int | None):
        stream = served.generate(prompt, GREEDY)
        async for out in stream:
            if leave_after is not None and len(out.outputs[0].token_ids) >= leave_after:
                await stream.aclose()  # what a disconnect does to the route's generator
                return None
        return out.outputs[0].token_ids

    try:
        got = await asyncio.gather(*(stream(p, 3 if i == 1 else None)
                                     for i, p in enumerate(PROMPTS)))
        assert got[1] is None
        assert [g for i, g in enumerate(got) if i != 1] == \
            [e for i, e in enumerate(expected) if i != 1]
        for _ in range(100):  # the abort lands with the step after the one in flight
            if served.stats()["kv_blocks_used"] == 0:
                break
            await asyncio.sleep(0.01)
        assert served.stats()["kv_blocks_used"] == 0
    finally:
        served.shutdown_sync()
