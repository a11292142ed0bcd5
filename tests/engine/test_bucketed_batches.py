"""Batches padded to bucketed token counts (the prepacked-oneDNN path) keep greedy outputs."""
import pytest

from paged_core import LLM, SamplingParams
from paged_core.executor.packed_batch import bucketed_num_tokens

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model


def test_buckets_are_few_and_tight():
    sizes = [bucketed_num_tokens(n) for n in range(1, 2049)]
    assert all(b >= n for n, b in zip(range(1, 2049), sizes))
    assert sizes == sorted(sizes)
    assert all(bucketed_num_tokens(b) == b for b in sizes)  # a bucket is its own bucket
    assert len(set(sizes)) == 83
    assert sizes[:8] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert max(b - n for n, b in zip(range(1, 257), sizes)) <= 7
    assert max((b - n) / n for n, b in zip(range(257, 2049), sizes[256:])) < 0.0625


@pytest.mark.parametrize("model_type", ["llama", "mistral"])  # mistral: sliding window
def test_padded_steps_match_transformers(model_type, tokenizer, tmp_path):
    """fp32 engine forced to pad every step; mixed prefill + decode steps."""
    from transformers import AutoModelForCausalLM
    import torch

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=11 * i) for i, n in enumerate([3, 19, 42, 7, 70])]
    expected = [hf_greedy(reference, p, 30) for p in prompts]

    llm = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=45)
    model = llm.engine.core.executor.runner.model
    model.prefers_bucketed_batches = True
    step_sizes = []
    forward = model.forward

    def recording_forward(input_ids, positions, kv_caches, meta, backend):
        step_sizes.append((input_ids.shape[0], meta.num_scheduled_tokens))
        return forward(input_ids, positions, kv_caches, meta, backend)

    model.forward = recording_forward
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert all(padded == bucketed_num_tokens(real) for padded, real in step_sizes)
    assert any(padded > real for padded, real in step_sizes)
    assert llm.stats()["kv_blocks_used"] == 0
