"""The families beyond Llama through the engine's other features, float32, on a tiny random
Gemma 2 (soft caps, sliding and global layers) and Qwen2-MoE (routed and shared experts):

- beam search: transformers' ``generate(num_beams=3)``, token for token;
- ``n = 3`` seeded samples forked from one prompt: sample ``i`` of seed ``s`` is the lone
  sample of seed ``s + i`` (the documented seed rule), so forks carry their own state;
- n-gram speculative decoding: the same greedy tokens as plain decoding, drafts accepted;
- structured outputs: a choice constraint holds;
- batch-invariant mode: the same tokens and log-probabilities alone and in a batch.
"""
import pytest
import torch

from paged_core import LLM, BeamSearchParams, SamplingParams

from ..reference import hf_beams, passage_token_ids
from ..tiny_models import build_tiny_model

FAMILIES = ["gemma2", "qwen2_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tokenizer, tmp_path_factory):
    """(folder, transformers reference, a float32 engine) of one family's tiny model."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(request.param, str(tmp_path_factory.mktemp(request.param)
                                                 / request.param), tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, reference, LLM(model=folder, dtype="float32", num_kv_blocks=96)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [passage_token_ids(tokenizer, n, offset=17 * i) for i, n in enumerate([6, 30, 45])]


def test_beam_search_matches_transformers(family, prompts):
    _, reference, llm = family
    eos = llm.engine.input_processor.eos_token_ids
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    assert [[s.tokens for s in o.sequences] for o in outs] == [
        hf_beams(reference, p, 3, 6, eos) for p in prompts]


def test_forked_samples_follow_the_seed_rule(family, prompts):
    _, _, llm = family
    params = dict(temperature=1.0, top_p=0.9, max_tokens=12, ignore_eos=True)
    (forked,) = llm.generate([prompts[1]], SamplingParams(n=3, seed=5, **params), use_tqdm=False)
    alone = [llm.generate([prompts[1]], SamplingParams(seed=5 + i, **params),
                          use_tqdm=False)[0].outputs[0].token_ids for i in range(3)]
    assert [c.token_ids for c in forked.outputs] == alone
    assert len({tuple(t) for t in alone}) > 1  # the samples differ


def proposes(context: list[int], output: list[int]) -> bool:
    """Whether a 1-gram lookup finds a draft while ``output`` decodes after ``context``: some
    output token (the last one aside) occurred before it."""
    return any(tok in context + output[:i] for i, tok in enumerate(output[:-1]))


def test_ngram_speculation_keeps_greedy_tokens(family, tokenizer):
    folder, _, llm = family
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = passage_token_ids(tokenizer, 20) * 3  # n-grams to find
    plain = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    if not proposes(prompt, plain):  # a random model may not echo the text: feed it its own
        prompt = prompt + plain
        plain = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert proposes(prompt, plain), "no prompt gives the n-gram proposer anything to draft"
    spec = LLM(model=folder, dtype="float32", num_kv_blocks=96, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1})
    assert spec.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids == plain
    assert spec.stats()["spec_decode_num_draft_tokens"] > 0


def test_structured_outputs_hold(family, prompts):
    _, _, llm = family
    params = SamplingParams(temperature=0, max_tokens=8,
                            structured_outputs={"choice": ["sliding", "global", "expert"]})
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(o.outputs[0].text in ("sliding", "global", "expert") for o in outs)


def test_batch_invariant_mode_gives_the_same_tokens_alone_and_batched(family, prompts):
    folder, _, _ = family
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=96, batch_invariant=True)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    alone = llm.generate([prompts[2]], params, use_tqdm=False)[0].outputs[0]
    batched = llm.generate(prompts, params, use_tqdm=False)[2].outputs[0]
    assert batched.token_ids == alone.token_ids
    assert [{t: lp.logprob for t, lp in step.items()} for step in batched.logprobs] == [
        {t: lp.logprob for t, lp in step.items()} for step in alone.logprobs]
