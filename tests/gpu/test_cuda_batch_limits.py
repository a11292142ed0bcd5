"""On a GPU the unset step limits are vLLM's for the card (``batch_limits``: 1024 sequences
and 16384 tokens on an H100 or H200), and steps wider than the largest CUDA graph (more than
256 decoding sequences, more than 512 tokens) give transformers' tokens."""
import torch

from paged_core import LLM, SamplingParams
from paged_core.config import batch_limits
from paged_core.executor.devices import device_memory

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model

NUM_PROMPTS = 600


def test_defaults_follow_the_card_and_wide_steps_match_transformers(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    llm = LLM(model=folder, device="cuda", dtype="float32", num_kv_blocks=2048)
    config = llm.engine.config
    assert (config.max_num_seqs, config.max_num_batched_tokens) == batch_limits(
        "cuda", *device_memory(torch.device("cuda")), "llm")
    prompts = [passage_token_ids(tokenizer, 5 + i % 7, offset=i) for i in range(NUM_PROMPTS)]
    lengths = [4 + i % 9 for i in range(NUM_PROMPTS)]  # the batch narrows step by step
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths],
        use_tqdm=False)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for i in range(0, NUM_PROMPTS, 37):
        assert outputs[i].outputs[0].token_ids == hf_greedy(reference, prompts[i], lengths[i]), i
    assert llm.stats()["kv_blocks_used"] == 0
    llm.shutdown()
