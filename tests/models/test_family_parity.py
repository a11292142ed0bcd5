"""Greedy parity with transformers in float32 for the families beyond Llama (Gemma 2 / 3,
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) through chunked prefill, the prefix cache and
preemption: five prompts sharing a 48-token prefix, 50 to 90 tokens long (past the tiny
configs' sliding windows of 24), in 16 blocks of 16."""
import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import GEMMA, MOE, build_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def shared_prefix_prompts(tokenizer) -> list[list[int]]:
    """Five prompts sharing a 48-token prefix (three cached blocks), 50 to 90 tokens long."""
    shared = passage_token_ids(tokenizer, 48)
    return [shared + passage_token_ids(tokenizer, n, offset=60 + 11 * i)
            for i, n in enumerate([2, 17, 30, 42, 9])]


@pytest.mark.parametrize("model_type", GEMMA + MOE)
def test_greedy_matches_transformers_through_chunks_prefix_cache_and_preemption(
        model_type, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = shared_prefix_prompts(tokenizer)
    expected = [hf_greedy(reference, p, GREEDY.max_tokens) for p in prompts]
    # 5 sequences of up to 122 tokens (8 blocks each) in 16 blocks: some are preempted.
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=16, max_num_batched_tokens=32)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert stats["kv_blocks_used"] == 0
