"""``Sampler``: picks one token per logits row under each row's ``SamplingParams``.

Order of operations per row: block EOS/stop tokens until ``min_tokens``;
repetition / presence / frequency penalties; log-probabilities (if asked) of
the penalised distribution; then greedy argmax, or temperature, top-k, top-p,
min-p and a draw. Draws use the exponential-race trick (``argmax(p / E)``,
``E ~ Exp(1)``) with noise from the row's own ``torch.Generator`` when the
request has a ``seed``: a seeded row's result does not depend on which other
rows share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    blocked_token_ids: list[int]  # EOS / stop ids while fewer than min_tokens were generated


@dataclass
class TokenLogprobs:
    token_logprob: float
    token_rank: int  # 1 = most likely
    top: list[tuple[int, float]]  # the ``logprobs`` most likely (token id, logprob)


class Sampler:
    def __init__(self, default_generator: torch.Generator | None = None) -> None:
        self.default_generator = default_generator

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor,
                 rows: list[SamplingRow]) -> tuple[list[int], list[TokenLogprobs | None]]:
        logits = logits.float()
        for r, row in enumerate(rows):
            if row.blocked_token_ids:
                logits[r, row.blocked_token_ids] = float("-inf")
            if row.params.has_penalties:
                _apply_penalties(logits[r], row)
        logprobs = self._logprobs(logits, rows)

        tokens = logits.argmax(dim=-1)
        random_rows = [r for r, row in enumerate(rows) if not row.params.greedy]
        if random_rows:
            index = torch.tensor(random_rows, device=logits.device)
            probs = _filtered_probs(logits[index], [rows[r].params for r in random_rows])
            noise = torch.empty_like(probs).exponential_(generator=self.default_generator)
            for i, r in enumerate(random_rows):
                generator = rows[r].generator
                if generator is not None:  # a seeded request: CPU noise, the same on any device
                    noise[i] = torch.empty(probs.shape[1]).exponential_(generator=generator)
            tokens[index] = (probs / noise).argmax(dim=-1)
        token_list = tokens.tolist()
        if logprobs is not None:
            return token_list, [_token_logprobs(lp, t, row) if lp is not None else None
                                for lp, t, row in zip(logprobs, token_list, rows)]
        return token_list, [None] * len(rows)

    @staticmethod
    def _logprobs(logits: torch.Tensor, rows: list[SamplingRow]) -> list[torch.Tensor | None] | None:
        wanted = [r for r, row in enumerate(rows) if row.params.logprobs is not None]
        if not wanted:
            return None
        out: list[torch.Tensor | None] = [None] * len(rows)
        lps = torch.log_softmax(logits[wanted], dim=-1)
        for i, r in enumerate(wanted):
            out[r] = lps[i]
        return out


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> None:
    """Penalise in place: repetition over prompt + output, presence/frequency over output."""
    p = row.params
    device = logits.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_token_ids) | set(row.output_token_ids)),
                            dtype=torch.long, device=device)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty,
                                       vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
        counts = torch.bincount(torch.tensor(row.output_token_ids, device=device),
                                minlength=logits.shape[0]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Softmax after temperature, then zero what top-k, top-p and min-p exclude."""
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
    logits = logits / temps[:, None]
    top_ks = [p.top_k for p in params]
    if any(top_ks):
        k = torch.tensor([t if t > 0 else logits.shape[1] for t in top_ks], device=device)
        k = k.clamp(max=logits.shape[1])
        sorted_desc = logits.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    top_ps = torch.tensor([p.top_p for p in params], device=device, dtype=probs.dtype)
    if bool((top_ps < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        drop_sorted = before >= top_ps[:, None]
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    min_ps = torch.tensor([p.min_p for p in params], device=device, dtype=probs.dtype)
    if bool((min_ps > 0).any()):
        threshold = min_ps[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _token_logprobs(lp: torch.Tensor, token: int, row: SamplingRow) -> TokenLogprobs:
    k = row.params.logprobs or 0
    token_lp = lp[token]
    rank = int((lp > token_lp).sum().item()) + 1
    top: list[tuple[int, float]] = []
    if k:
        values, ids = lp.topk(k)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(float(token_lp), rank, top)
