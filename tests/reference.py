"""Helpers for correctness tests: greedy reference generation with transformers, and prompts."""
from __future__ import annotations

import torch

from paged_core.bench.quality_text import quality_text

# The text that ``paged-core bench quality`` scores, shipped with the package
PASSAGE = quality_text() + " "


def passage_token_ids(tokenizer, num_tokens: int, offset: int = 0) -> list[int]:
    """``num_tokens`` real-text token ids, starting ``offset`` tokens into a repeated passage."""
    ids = tokenizer.encode(PASSAGE * 8)
    return ids[offset:offset + num_tokens]


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by ``transformers.generate`` of one unpadded prompt.

    EOS does not stop it (like ``ignore_eos=True``) and is not suppressed either.
    """
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), eos_token_id=[],
                         max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@torch.no_grad()
def hf_greedy_top_logprobs(model, prompt_ids: list[int], max_new_tokens: int,
                           k: int) -> tuple[list[int], list[set[int]]]:
    """Greedy tokens of ``transformers.generate`` and, per step, the ids of its ``k`` most
    likely tokens (EOS neither stops nor is suppressed, like ``hf_greedy``)."""
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), eos_token_id=[],
                         max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                         output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    tops = [set(scores[0].float().topk(k).indices.tolist()) for scores in out.scores]
    return tokens, tops


def assert_greedy_close(ours: list[int], our_tops: list[set[int]], theirs: list[int],
                        their_tops: list[set[int]]) -> None:
    """The tolerance rule for reduced-precision greedy parity (vLLM's ``check_logprobs_close``).

    Outputs must be equal up to the first step where they differ; at that step
    each side's token must be among the other side's top-k tokens (a near-tie
    that reduced precision may break either way). After it the texts are
    different prompts and are not compared.
    """
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for step, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            assert a in their_tops[step] and b in our_tops[step], (
                f"step {step}: ours {a} is not a near-tie of theirs {b} "
                f"(their top-k {sorted(their_tops[step])}, ours {sorted(our_tops[step])})")
            return


def assert_close_with_cached_prefix(llm, prompts, expected, max_tokens: int, top_k: int) -> None:
    """``llm``'s greedy output for ``prompts`` under the near-tie rule against ``expected``
    (``(tokens, top-k sets)`` per prompt), twice: the second pass reads the prompts' shared
    prefix from the cache (asserted)."""
    from paged_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=top_k)
    for _ in range(2):
        for out, (tokens, tops) in zip(llm.generate(prompts, params, use_tqdm=False), expected):
            completion = out.outputs[0]
            assert_greedy_close(completion.token_ids, engine_top_logprobs(completion), tokens, tops)
    assert llm.stats()["prefix_cache_hits"] > 0


def engine_top_logprobs(completion) -> list[set[int]]:
    """Per generated token, the ids of the engine's top tokens (``SamplingParams.logprobs=k``)."""
    return [set(step) for step in completion.logprobs]


@torch.no_grad()
def hf_beams(model, prompt, k, max_new_tokens, eos, exact_length=True, **kwargs):
    """transformers' ``k`` returned beams (prompt + generated), best first, cut after EOS."""
    ids = torch.tensor([prompt])
    lengths = {"min_new_tokens": max_new_tokens} if exact_length else {}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=k,
                         num_return_sequences=k, do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=sorted(eos), pad_token_id=0, **lengths, **kwargs)
    beams = []
    for row in out.tolist():
        generated = row[len(prompt):]
        ends = [i for i, t in enumerate(generated) if t in eos]
        beams.append(prompt + (generated[:ends[0] + 1] if ends else generated))
    return beams
