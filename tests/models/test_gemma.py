"""Gemma 2 and Gemma 3 (text), whose float32 parity is in ``test_family_parity``: the
features that parity leans on change transformers' output (so matching it covers them):
Gemma 2's attention soft cap, Gemma 3's RoPE per layer type; Gemma 2's final soft cap,
which keeps the argmax, shapes the logprobs."""
import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import hf_greedy
from ..tiny_models import build_tiny_model
from .test_family_parity import shared_prefix_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def _reference(folder: str, prompts, **config_changes) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **config_changes)
    return [hf_greedy(model.eval(), p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize("model_type,change", [
    ("gemma2", {"attn_logit_softcapping": None}),
    ("gemma3_text", {"rope_parameters": {  # the global layers' RoPE as the local ones'
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}})])
def test_each_gemma_feature_changes_the_tokens(model_type, change, tokenizer, tmp_path):
    """Without the attention soft cap or Gemma 3's own global RoPE, transformers' tokens
    differ from the ones paged-core matches in ``test_family_parity``."""
    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    prompts = shared_prefix_prompts(tokenizer)[:3]
    assert _reference(folder, prompts) != _reference(folder, prompts, **change)


def test_final_logit_soft_cap_shapes_the_logprobs(tokenizer, tmp_path):
    """Gemma 2's final soft cap keeps the argmax (tanh is monotonic) but not the logprobs:
    paged-core's are transformers' capped ones, not the uncapped ones."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("gemma2", str(tmp_path / "gemma2"), tokenizer)
    prompt = shared_prefix_prompts(tokenizer)[1]
    ids = torch.tensor([prompt])
    expected = {}
    for name, change in (("capped", {}), ("uncapped", {"final_logit_softcapping": None})):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **change)
        with torch.no_grad():
            expected[name] = torch.log_softmax(model(ids).logits[0, -1].double(), dim=-1)
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=16)
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    (step,) = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].logprobs
    for token, logprob in step.items():
        assert logprob.logprob == pytest.approx(float(expected["capped"][token]), abs=1e-4)
        assert abs(logprob.logprob - float(expected["uncapped"][token])) > 1e-2
