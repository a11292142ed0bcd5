"""Batch-invariant mode: a request's greedy tokens and logprobs are the same bits alone and
under load (``EngineConfig.batch_invariant``, ``paged_core.models.batch_invariant``)."""
from __future__ import annotations

import pytest
import torch

from paged_core import LLM, SamplingParams
from paged_core.config import EngineConfig
from paged_core.models.row_tiles import RowTiledLinear, WeightProduct
from paged_core.models.cpu_linear import PackedLinear

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Once upon a time in a land far away there lived a king who " * 4,
           "List three colours:", "Explain photosynthesis to a child in simple words."]


def _products() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    weight = torch.randn(384, 192)
    return {"float32 F.linear": WeightProduct(weight),
            "bfloat16 packed": PackedLinear(weight.bfloat16(), None, torch.float32)}


@pytest.mark.parametrize("name", list(_products()))
def test_a_tiled_row_is_the_same_bits_in_any_batch(name):
    product = RowTiledLinear(_products()[name], tile_rows=16)
    dtype = torch.bfloat16 if "bfloat16" in name else torch.float32
    row = torch.randn(1, 192).to(dtype)
    alone = product(row)
    for rows, position in [(3, 1), (16, 15), (17, 16), (50, 20), (257, 100)]:
        batch = torch.randn(rows, 192).to(dtype)
        batch[position] = row[0]
        out = product(batch)
        assert out.shape == (rows, 384) and out.dtype == dtype
        assert torch.equal(out[position], alone[0]), (rows, position)


def _generate_alone_and_together(llm: LLM, prompts: list[str], max_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0] for p in prompts]
    # Under load: the same requests, plus sampled ones of other lengths, all in flight at once.
    noise = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens + 3 * i)
             for i in range(len(prompts))]
    together = llm.generate(prompts + prompts[::-1], [params] * len(prompts) + noise,
                            use_tqdm=False)
    return alone, [o.outputs[0] for o in together[:len(prompts)]]


def _logprob_bits(output) -> list[list[tuple[int, float]]]:
    return [sorted((t, lp.logprob) for t, lp in step.items()) for step in output.logprobs]


def test_embedded_model_in_bfloat16_gives_identical_tokens_and_logprobs_under_load():
    llm = LLM(dtype="bfloat16", batch_invariant=True, max_num_batched_tokens=40,
              enable_prefix_caching=False)
    alone, together = _generate_alone_and_together(llm, PROMPTS[:4], max_tokens=12)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert _logprob_bits(a) == _logprob_bits(b)


def test_embedded_model_in_float32_gives_transformers_tokens_with_weights_on_huge_pages(
        monkeypatch, hf_embedded, tokenizer):
    """The correctness oracle holds in batch-invariant mode too, with the weights moved onto
    huge pages as users get them by default: its tied float32 LM head (a ``WeightProduct`` of
    the embedding's own Parameter) read garbage after the move, invariant but wrong."""
    monkeypatch.setenv("PAGED_CORE_WEIGHTS_ON_HUGE_PAGES", "true")
    llm = LLM(dtype="float32", batch_invariant=True, kv_cache_memory="64MiB")
    prompts = [passage_token_ids(tokenizer, n, offset=5 * n) for n in (6, 40)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(hf_embedded, p, 12)
                                                         for p in prompts]


def test_float32_tiny_model_with_prefix_cache_and_chunked_prefill(tokenizer, tmp_path):
    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)
    llm = LLM(model=folder, dtype="float32", batch_invariant=True, max_num_batched_tokens=24,
              num_kv_blocks=64)
    alone, together = _generate_alone_and_together(llm, PROMPTS, max_tokens=20)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert _logprob_bits(a) == _logprob_bits(b)


def test_the_environment_variable_turns_it_on_and_bad_values_name_it(monkeypatch):
    assert EngineConfig().batch_invariant is False
    monkeypatch.setenv("PAGED_CORE_BATCH_INVARIANT", "1")
    assert EngineConfig().batch_invariant is True
    assert EngineConfig(batch_invariant=False).batch_invariant is False
    monkeypatch.setenv("PAGED_CORE_BATCH_INVARIANT", "maybe")
    with pytest.raises(ValueError, match="PAGED_CORE_BATCH_INVARIANT"):
        EngineConfig()
    monkeypatch.delenv("PAGED_CORE_BATCH_INVARIANT")
    with pytest.raises(ValueError, match="batch_invariant must be true or false"):
        EngineConfig(batch_invariant="yes")


def test_float16_is_refused_with_what_to_change(tokenizer, tmp_path):
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    with pytest.raises(ValueError, match="batch_invariant=True needs .*float32 or bfloat16"):
        LLM(model=folder, dtype="float16", batch_invariant=True, num_kv_blocks=8)
