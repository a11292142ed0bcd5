"""Greedy parity with transformers for tiny random Llama, Mistral (sliding window), Qwen2
(qkv bias, tied embeddings), Qwen3 (q/k norm) and Phi-3 (fused qkv / gate-up checkpoint
weights, sliding window; and rotary over half of each head, as Phi-4-mini), mixing prefill
and decode in one batch, on every CPU path this host can run (``cpu_isa`` fixture: each C++
kernel build)."""
import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model

ARCHITECTURES = ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "phi3-partial-rotary"]


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_tiny_model_matches_transformers(model_type, tokenizer, tmp_path, cpu_isa):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [passage_token_ids(tokenizer, n, offset=13 * i) for i, n in enumerate([3, 20, 41, 90])]
    expected = [hf_greedy(reference, p, 40) for p in prompts]

    llm = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64)
    assert llm.engine.core.executor.runner.model.ops.cpu_isa == cpu_isa
    # Stagger arrivals so later prompts prefill while earlier ones decode.
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.stats()["kv_blocks_used"] == 0


def test_longrope_switches_to_its_long_factors_where_transformers_does(tmp_path, tokenizer):
    """Phi-3.5's LongRoPE, switching at ``original_max_position_embeddings`` = 64: transformers
    rotates with the long factors in a forward reaching past 64, and its ``generate`` computes
    every key again once a sequence grows past it. Prompts under the switch that decode across
    it and a prompt past it from its first chunk on all match transformers token for token,
    through chunked prefill and a prefix cache that keeps short- and long-rotated blocks of the
    same tokens apart: the long prompt finds the 48 tokens it shares with a short one in the
    blocks that one computed again past the switch, a repeat of the short one finds its
    short-rotated blocks. The long factors matter: without them the tokens change."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("phi3-longrope", str(tmp_path / "phi3-longrope"), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    shared = passage_token_ids(tokenizer, 48, offset=7)
    prompts = [passage_token_ids(tokenizer, 20, offset=3), shared + passage_token_ids(
        tokenizer, 8, offset=90), shared + passage_token_ids(tokenizer, 40, offset=120)]
    expected = [hf_greedy(reference, p, 60) for p in prompts]
    rope = reference.config.rope_parameters
    reference.config.rope_parameters = {**rope, "long_factor": rope["short_factor"]}
    short_only = AutoModelForCausalLM.from_pretrained(folder, config=reference.config,
                                                      dtype=torch.float32).eval()
    assert [hf_greedy(short_only, p, 60) for p in prompts] != expected

    llm = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    hits = []
    for index in (1, 2, 1, 0):  # the short one, the long one sharing its start, the short again
        (out,) = llm.generate([prompts[index]], params, use_tqdm=False)
        assert out.outputs[0].token_ids == expected[index], index
        hits.append(out.num_cached_tokens)
    assert hits[:3] == [0, 48, 48]
    assert llm.stats()["kv_blocks_used"] == 0


def test_triton_backend_matches_torch_backend_in_interpreter(tokenizer, tmp_path):
    """The engine's greedy output is the same through the Triton kernels (interpreter) and torch."""
    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=5 * i) for i, n in enumerate([4, 21, 37])]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=folder, dtype="float32", num_kv_blocks=32, attention_backend=backend,
                  max_num_batched_tokens=32)
        assert llm.engine.attention_backend == backend
        results[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert results["triton"] == results["torch"]


def test_backend_is_chosen_by_device():
    import torch as _torch
    from paged_core.attention import select_backend
    assert select_backend("auto", _torch.device("cpu")).name == "torch"
    assert select_backend("auto", _torch.device("cuda")).name == "triton"
