"""Mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; their float32 parity:
``test_family_parity``): experts computed grouped (only the chosen ones, over their own
tokens), each family's routing, bfloat16, stacked and per-expert checkpoints,
batch-invariant mode."""
import pytest
import torch

from paged_core import LLM, SamplingParams
from paged_core.executor.group import SINGLE
from paged_core.models.moe import SparseMoeBlock
from paged_core.models.registry import model_spec

from ..reference import assert_greedy_close, engine_top_logprobs, hf_greedy_top_logprobs
from ..tiny_models import build_tiny_model, tiny_config
from .test_family_parity import shared_prefix_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_bfloat16_is_close_to_transformers_bfloat16(tokenizer, tmp_path):
    """Packed bfloat16 linears (the router included) and bfloat16 experts, under the
    reduced-precision rule (``reference.assert_greedy_close``)."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("qwen2_moe", str(tmp_path / "qwen2_moe"), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    prompts = shared_prefix_prompts(tokenizer)[:3]
    expected = [hf_greedy_top_logprobs(reference, p, 16, 5) for p in prompts]
    llm = LLM(model=folder, dtype="bfloat16", num_kv_blocks=32)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
        completion = out.outputs[0]
        assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)


def test_stacked_expert_checkpoints_load_like_per_expert_ones(tokenizer, tmp_path):
    """transformers keeps experts stacked in memory (``experts.gate_up_proj``); a checkpoint
    saved that way gives the same model as the per-expert one."""
    prompts = shared_prefix_prompts(tokenizer)[:2]
    tokens = {}
    for model_type in ("qwen3_moe", "qwen3_moe-stacked"):
        folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
        llm = LLM(model=folder, dtype="float32", num_kv_blocks=32)
        tokens[model_type] = [o.outputs[0].token_ids
                              for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert tokens["qwen3_moe-stacked"] == tokens["qwen3_moe"]


def _block(model_type: str, tokenizer) -> SparseMoeBlock:
    spec = model_spec(tiny_config(model_type, len(tokenizer)))
    torch.manual_seed(3)
    block = SparseMoeBlock(spec, spec.moe.intermediate_size, spec.moe.shared_expert_size, SINGLE)
    for param in block.parameters():
        param.data.normal_(0, 0.3)
    return block


@pytest.mark.parametrize("model_type", ["qwen2_moe", "mixtral"])
def test_only_the_chosen_experts_run_each_over_its_own_tokens(model_type, tokenizer):
    block = _block(model_type, tokenizer)
    calls = []
    run_expert = block._expert
    block._expert = lambda e, x: (calls.append((e, x.shape[0])), run_expert(e, x))[1]
    x = torch.randn(40, block.gate.in_features)
    weights, chosen = block.route(x)
    out = block(x)
    counts = torch.bincount(chosen.flatten(), minlength=block.num_experts)
    assert calls == [(e, int(n)) for e, n in enumerate(counts) if n > 0]
    assert len(set(counts.tolist())) > 1  # random routers route unevenly
    # every expert for every token, masked to each token's choice: the same sums
    dense = torch.stack([block._expert(e, x) for e in range(block.num_experts)], dim=1)
    picked = dense.gather(1, chosen[:, :, None].expand(-1, -1, x.shape[1]))
    expected = (picked * weights[:, :, None]).sum(dim=1).to(x.dtype)
    if block.shared_expert is not None:
        expected = expected + torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    calls.clear()
    block(x[:1])  # one decoding token: exactly its top_k experts
    assert len(calls) == block.top_k


def test_routing_follows_each_familys_normalisation(tokenizer):
    x = torch.randn(8, 64)
    mixtral, qwen2 = _block("mixtral", tokenizer), _block("qwen2_moe", tokenizer)
    weights, _ = mixtral.route(x)
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(8))  # renormalised top-k
    weights, chosen = qwen2.route(x)
    probs = torch.softmax(qwen2.gate(x), dim=-1)
    torch.testing.assert_close(weights, probs.gather(1, chosen))  # norm_topk_prob=False
    assert (weights.sum(dim=-1) < 1).all()


def test_batch_invariant_mode_gives_the_same_bits_alone_and_under_load(tokenizer, tmp_path):
    folder = build_tiny_model("mixtral", str(tmp_path / "mixtral"), tokenizer)
    llm = LLM(model=folder, dtype="float32", batch_invariant=True, max_num_batched_tokens=24,
              num_kv_blocks=64)
    prompts = shared_prefix_prompts(tokenizer)[:3]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0] for p in prompts]
    noise = [SamplingParams(temperature=1.0, seed=i, max_tokens=9 + 4 * i) for i in range(3)]
    together = llm.generate(prompts + prompts[::-1], [params] * 3 + noise, use_tqdm=False)
    for a, b in zip(alone, together[:3]):
        b = b.outputs[0]
        assert a.token_ids == b.token_ids
        assert [sorted((t, lp.logprob) for t, lp in s.items()) for s in a.logprobs] == \
            [sorted((t, lp.logprob) for t, lp in s.items()) for s in b.logprobs]
