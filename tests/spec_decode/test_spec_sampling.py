"""Sampled speculative decoding follows the target distribution: the first three tokens of
600 samples (temperature 1, top-k 8) with n-gram drafts have the frequencies that
transformers' probabilities give, within 5 sigma per outcome. The prompt repeats its start
after the model's own greedy continuation of it, so a third of the drafts are accepted.
(Draft-model drafts go through the same verification: both proposers' drafts are one-hot.)"""
import torch

from paged_core import LLM, SamplingParams

from .narrow_models import narrow_prompts

TOP_K = 8
SAMPLES_PER_PROMPT = 30
NUM_PROMPTS = 20
DRAWS = SAMPLES_PER_PROMPT * NUM_PROMPTS


def _top_k_probs(logits: torch.Tensor) -> torch.Tensor:
    values, ids = logits.double().topk(TOP_K, dim=-1)
    probs = torch.zeros_like(logits, dtype=torch.float64)
    return probs.scatter_(-1, ids, torch.softmax(values, dim=-1))


@torch.no_grad()
def _exact_first_tokens(folder: str, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(t1, t2) and P(t3) (as 1-tuples) under the target, by enumerating the top-k branches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    p1 = _top_k_probs(model(torch.tensor([prompt])).logits[0, -1])
    firsts = p1.nonzero()[:, 0].tolist()
    p2 = _top_k_probs(model(torch.tensor([prompt + [t] for t in firsts])).logits[:, -1])
    pairs = [(a, b) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()]
    p3 = _top_k_probs(model(torch.tensor([prompt + list(pair) for pair in pairs])).logits[:, -1])
    joint = {pair: float(p1[pair[0]] * p2[firsts.index(pair[0]), pair[1]]) for pair in pairs}
    third = sum(joint[pair] * p3[i] for i, pair in enumerate(pairs))
    return joint | {(t,): float(third[t]) for t in third.nonzero()[:, 0].tolist()}


def _assert_frequencies(counts: dict, exact: dict) -> None:
    assert set(counts) <= set(exact), "an outcome the target cannot produce was drawn"
    for outcome, p in exact.items():
        sigma = (p * (1 - p) / DRAWS) ** 0.5
        freq = counts.get(outcome, 0) / DRAWS
        assert abs(freq - p) <= 5 * sigma + 1e-9, (outcome, freq, p)


def test_sampled_ngram_speculation_follows_the_target_distribution(target):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
            "prompt_lookup_min": 1}
    llm = LLM(model=target, dtype="float32", num_kv_blocks=2048, max_num_seqs=512,
              max_num_batched_tokens=4096, speculative_config=spec)
    start = narrow_prompts([16], seed=3)[0]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    continuation = llm.generate(start, greedy, use_tqdm=False)[0].outputs[0].token_ids
    start_ids = start["prompt_token_ids"]
    prompt = {"prompt_token_ids": start_ids + continuation + start_ids}
    params = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=3, ignore_eos=True,
                            n=SAMPLES_PER_PROMPT)
    outputs = llm.generate([prompt] * NUM_PROMPTS, params, use_tqdm=False)
    tokens = [c.token_ids for o in outputs for c in o.outputs]
    assert len(tokens) == DRAWS and all(len(t) == 3 for t in tokens)
    counts = {}
    for t in tokens:
        for outcome in ((t[0], t[1]), (t[2],)):
            counts[outcome] = counts.get(outcome, 0) + 1
    _assert_frequencies(counts, _exact_first_tokens(target, prompt["prompt_token_ids"]))
    stats = llm.stats()
    # Both branches of the rejection rule ran many times.
    accepted = stats["spec_decode_num_accepted_tokens"]
    drafted = stats["spec_decode_num_draft_tokens"]
    assert 100 < accepted < drafted - 100
