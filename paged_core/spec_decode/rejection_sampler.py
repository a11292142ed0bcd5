"""Verification of draft tokens against the target model (vLLM's ``RejectionSampler``).

A sequence with drafts ``d_1..d_k`` gets target logits at ``k + 1`` positions
(the pending token and each draft). Row ``j`` is sampled exactly as
non-speculative decoding would sample after ``d_1..d_j``: its ``SamplingRow``
sees those drafts as output tokens (penalties, ``min_tokens`` blocking) and
uses the request's generator. Then ``t_j`` (the token drawn from row ``j``)
accepts ``d_{j+1}`` iff ``t_j == d_{j+1}``; the output is ``t_0..t_a`` where
``a`` is the number of accepted drafts (the last one is the bonus or the
correction token).

Why this is rejection sampling: both proposers draft deterministically (the
n-gram lookup, the draft model's argmax), so the draft distribution ``q`` is
one-hot on ``d``. The standard rule accepts ``d`` with probability
``min(1, p(d) / q(d)) = p(d)`` and otherwise draws from ``(p - q)+``
renormalised, which is ``p`` without ``d``; the emitted token is then ``d``
with probability ``p(d)`` and any other ``x`` with probability ``p(x)``: a
draw ``t ~ p`` with "accept iff ``t == d``" has exactly that law. Greedy rows
draw the argmax, so greedy output equals non-speculative greedy output.
"""
from __future__ import annotations

from ..sample.sampler import SamplingRow


def verify_rows(request, seq) -> list[SamplingRow]:
    """One sampling row per verified position of ``seq`` (``1 + len(seq.spec_token_ids)``)."""
    return [request.sampling_row(seq, num_drafts=j) for j in range(len(seq.spec_token_ids) + 1)]


def num_accepted(draft_token_ids: list[int], sampled_token_ids: list[int]) -> int:
    """Length of the longest prefix of the drafts equal to the target's sampled tokens."""
    accepted = 0
    for draft, sampled in zip(draft_token_ids, sampled_token_ids):
        if draft != sampled:
            break
        accepted += 1
    return accepted
