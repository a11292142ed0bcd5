"""Tensor parallelism keeps greedy parity with transformers (fp32, token for token).

Every engine here starts ``tensor_parallel_size - 1`` real worker processes that
meet over gloo on 127.0.0.1; each test shuts its engines down, and checks that
no worker outlives them.
"""
import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model, tiny_config

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def reference_tokens(folder: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [hf_greedy(model, p, max_tokens) for p in prompts]


def generate_and_shut_down(llm: LLM, prompts, params=GREEDY):
    pids = llm.engine.core.executor.worker_pids
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.stats()
    finally:
        llm.shutdown()
    assert not any(_alive(pid) for pid in pids), "a worker outlived shutdown()"
    return outputs, stats


def _alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("model_type,size", [
    ("llama", 2),
    # 4 ranks, 2 KV heads: each KV head replicated on 2 ranks (4 processes on CI's 2 cores)
    pytest.param("llama", 4, marks=pytest.mark.extended),
    ("qwen3", 2),  # q/k norms on sharded heads (qwen2's qkv bias: see the prefix-cache test)
    ("phi3", 2),  # fused qkv / gate-up checkpoint weights, split before each rank's slice
    ("gemma2", 2),  # soft caps, alternating windows, (1 + weight) norms on sharded heads
    ("qwen2_moe", 2),  # every expert's width and the shared expert's split in two
    ("qwen3_moe-stacked", 2)])  # stacked experts (both halves of gate_up cut), a dense layer
def test_tiny_models_match_transformers(model_type, size, tokenizer, tmp_path):
    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate([3, 21, 40, 66])]
    expected = reference_tokens(folder, prompts, GREEDY.max_tokens)
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=48,
              tensor_parallel_size=size)
    outputs, stats = generate_and_shut_down(llm, prompts)
    assert token_ids(outputs) == expected
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_total"] == 64


def test_vocabulary_not_divisible_by_the_group(tokenizer, tmp_path):
    """49155 vocabulary rows over 2 ranks: the second rank's last row is padding."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama", len(tokenizer) + 3)
    torch.manual_seed(5)
    folder = str(tmp_path / "odd-vocab")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompts = [passage_token_ids(tokenizer, n, offset=3 * i) for i, n in enumerate([5, 30])]
    expected = reference_tokens(folder, prompts, GREEDY.max_tokens)
    outputs, _ = generate_and_shut_down(
        LLM(model=folder, dtype="float32", num_kv_blocks=32, tensor_parallel_size=2), prompts)
    assert token_ids(outputs) == expected


def test_prefix_cache_preemption_and_forks_under_tp(tokenizer, tmp_path):
    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=5 * i) for i, n in enumerate([40, 70, 18, 95])]
    prompts += [prompts[3][:64] + p[:6] for p in prompts[:2]]  # 4 blocks shared with prompt 3
    expected = reference_tokens(folder, prompts, GREEDY.max_tokens)

    llm = LLM(model=folder, dtype="float32", num_kv_blocks=24, max_num_batched_tokens=64,
              tensor_parallel_size=2)
    try:
        first = llm.generate(prompts, GREEDY, use_tqdm=False)
        again = llm.generate(prompts, GREEDY, use_tqdm=False)
        forks = llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=24,
                                                         ignore_eos=True, n=3), use_tqdm=False)
        stats = llm.stats()
    finally:
        llm.shutdown()
    assert token_ids(first) == expected and token_ids(again) == expected
    assert any(o.num_cached_tokens > 0 for o in again)
    assert stats["num_preemptions"] > 0  # 6 sequences of up to 120 tokens in 24 blocks of 16
    assert [[c.token_ids for c in o.outputs] for o in forks] == [[e] * 3 for e in expected[:2]]
    assert stats["kv_blocks_used"] == 0


@pytest.mark.extended  # the 135M model on 3 ranks over 2 cores; the tiny models cover TP in CI
def test_embedded_model_on_three_ranks(tokenizer, embedded_folder):
    """SmolLM2-135M: 9 query heads and 3 KV heads, one KV head per rank."""
    prompts = [passage_token_ids(tokenizer, n, offset=11 * i) for i, n in enumerate([4, 37])]
    expected = reference_tokens(embedded_folder, prompts, 12)
    llm = LLM(dtype="float32", num_kv_blocks=32, tensor_parallel_size=3)
    outputs, _ = generate_and_shut_down(
        llm, prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert token_ids(outputs) == expected


def test_indivisible_size_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match=r"allowed sizes: \[1, 3\]"):
        LLM(dtype="float32", num_kv_blocks=8, tensor_parallel_size=2)


def test_one_tensor_parallel_engine_per_process(tokenizer, tmp_path):
    """A second TP engine is refused before it starts any worker; after shutdown one starts."""
    import psutil

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    first = LLM(model=folder, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
    try:
        children = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(RuntimeError, match="another tensor-parallel engine is running"):
            LLM(model=folder, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    finally:
        first.shutdown()
    prompt = [passage_token_ids(tokenizer, 9)]
    outputs, _ = generate_and_shut_down(
        LLM(model=folder, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2), prompt)
    assert token_ids(outputs) == reference_tokens(folder, prompt, GREEDY.max_tokens)
