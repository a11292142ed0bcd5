"""Beam search results (vLLM's ``BeamSearchSequence`` / ``BeamSearchOutput``) and scoring.

A finished hypothesis is ranked by ``cum_logprob / num_generated ** length_penalty``
where ``num_generated`` counts the generated tokens, EOS included: the length
transformers' beam search uses (vLLM divides by the whole length, prompt
included; transformers' ``generate`` is this project's oracle).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..outputs import Logprob, RequestOutput

TokenRecord = tuple[int, float, int]  # (token id, log-probability, rank: 1 = most likely)


@dataclass
class RankedBeam:
    """One completion of a search's result, as the core reports it."""

    token_ids: list[int]  # prompt + generated
    cum_logprob: float
    records: list[TokenRecord]
    finish_reason: str


@dataclass
class BeamSearchSequence:
    """One returned beam: ``tokens`` are prompt + generated (as in vLLM); ``text`` is the
    generated text; ``logprobs`` has one ``{token_id: Logprob}`` per generated token."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (EOS), "length" (max_tokens) or "abort"
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The ``beam_width`` best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(cum_logprob: float, num_generated: int, length_penalty: float) -> float:
    """Length-penalised score, computed in float32 exactly as transformers does."""
    value = torch.tensor(cum_logprob, dtype=torch.float32) / (num_generated ** length_penalty)
    return float(value)


def beam_search_output(out: RequestOutput) -> BeamSearchOutput:
    """A finished beam search request's ``RequestOutput`` as vLLM's ``BeamSearchOutput``;
    raises the request's ``RequestFailedError`` if it failed inside the engine."""
    if out.error is not None:
        raise out.error
    return BeamSearchOutput([
        BeamSearchSequence(tokens=list(out.prompt_token_ids) + list(c.token_ids),
                           logprobs=c.logprobs or [], cum_logprob=c.cumulative_logprob or 0.0,
                           text=c.text, finish_reason=c.finish_reason, stop_reason=c.stop_reason)
        for c in out.outputs])
