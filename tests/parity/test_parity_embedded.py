"""Greedy output equals transformers generate() token for token (fp32) on the embedded model,
also with prefix caching, forced preemption and forced chunked prefill."""
import pytest

from paged_core import LLM, SamplingParams

from ..reference import hf_greedy, passage_token_ids

PROMPT_LENGTHS = [5, 33, 100, 255, 400]  # 1 to 26 blocks: partial, full and many blocks
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def expected(hf_embedded, prompts):
    return [hf_greedy(hf_embedded, p, NEW_TOKENS) for p in prompts]


def _token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_batch_matches_transformers(llm_fp32, prompts, expected):
    outputs = llm_fp32.generate(prompts, GREEDY, use_tqdm=False)
    assert _token_ids(outputs) == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)


def test_prefix_cache_hits_keep_outputs(llm_fp32, prompts, expected):
    llm_fp32.generate(prompts, GREEDY, use_tqdm=False)  # fills the prefix cache
    before = llm_fp32.stats()
    outputs = llm_fp32.generate(prompts, GREEDY, use_tqdm=False)
    after = llm_fp32.stats()
    assert _token_ids(outputs) == expected
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    assert hits >= sum((n - 1) // 16 * 16 for n in PROMPT_LENGTHS)
    assert any(o.num_cached_tokens > 0 for o in outputs)


def test_shared_prefixes(hf_embedded, tokenizer):
    shared = passage_token_ids(tokenizer, 70)
    prompts = [shared + passage_token_ids(tokenizer, 5 + 3 * i, offset=200 + 11 * i) for i in range(4)]
    expected = [hf_greedy(hf_embedded, p, 24) for p in prompts]
    llm = LLM(dtype="float32", num_kv_blocks=64, enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    first = llm.generate(prompts[:1], params, use_tqdm=False)
    rest = llm.generate(prompts[1:], params, use_tqdm=False)
    assert _token_ids(first + rest) == expected
    stats = llm.stats()
    assert stats["prefix_cache_hits"] >= 3 * 64  # 4 full shared blocks per later request
    assert stats["kv_blocks_used"] == 0

    assert stats["kv_blocks_cached"] > 0
    llm.reset_prefix_cache()
    assert llm.stats()["kv_blocks_cached"] == 0
    again = llm.generate(prompts[:1], params, use_tqdm=False)
    assert _token_ids(again) == expected[:1]
    assert llm.stats()["prefix_cache_hits"] == stats["prefix_cache_hits"]  # nothing left to hit


def test_preemption_keeps_outputs(prompts, expected):
    # 5 sequences of up to 432 tokens (63 blocks in all) cannot all fit into 30 blocks of 16.
    llm = LLM(dtype="float32", num_kv_blocks=30, enable_prefix_caching=False)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    assert _token_ids(outputs) == expected
    assert llm.stats()["kv_blocks_used"] == 0


def test_chunked_prefill_keeps_outputs(prompts, expected):
    llm = LLM(dtype="float32", max_num_batched_tokens=48, kv_cache_memory="128MiB")
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert _token_ids(outputs) == expected
