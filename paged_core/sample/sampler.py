"""``Sampler``: picks one token per logits row under each row's ``SamplingParams``.

Order of operations per row (vLLM's): the grammar bitmask of constrained rows
(one batched pass, ``structured_outputs``); every token but ``allowed_token_ids``
masked; block EOS/stop tokens until ``min_tokens`` and the tokens that would complete a
``bad_words`` spelling; ``logit_bias`` added;
repetition / presence / frequency penalties; log-probabilities (if asked) of
the penalised distribution; then greedy argmax, or temperature, top-k, top-p,
min-p and a draw.

Truncated rows (top-k or top-p) work on a few candidates, never on a sort of
the whole vocabulary: ``topk`` gives each row's ``top_k`` best tokens, or, for
top-p alone, the best ``_TOP_P_CANDIDATES`` with their full-vocabulary
probabilities (a row whose nucleus is larger than that falls back to all
tokens). A draw is one uniform number per row through the inverse CDF of the
kept probabilities; a seeded request takes it from its own ``torch.Generator``
(on the CPU), so its tokens do not depend on the batch or the device.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..cpu.extension import cpu_extension_available, cpu_ops
from ..sampling_params import SamplingParams
from ..structured_outputs import GrammarBitmask, SequenceGrammar
from .pending_tokens import PendingTokens

_TOP_P_CANDIDATES = 1024  # top-p without top-k: the nucleus is looked for among these first


@dataclass
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # listed only for penalties or bad words (empty otherwise)
    # tokens the row may not take: EOS / stop ids while fewer than min_tokens were generated,
    # the last token of each bad_words spelling its output would complete
    blocked_token_ids: list[int]
    grammar: SequenceGrammar | None = None  # the sequence's structured-output state


@dataclass
class TokenLogprobs:
    token_logprob: float
    token_rank: int  # 1 = most likely
    top: list[tuple[int, float]]  # the ``logprobs`` most likely (token id, logprob)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, as ``logits.argmax(dim=-1)`` (the first maximal value; the first NaN
    if any): float32 or bfloat16 CPU logits through the C++ kernel (``csrc/greedy_tokens.cpp``,
    ~9x torch's CPU argmax over a 49k vocabulary) where it is built, else torch."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16):
        kernel = _cpu_greedy_kernel()
        if kernel is not None:
            return kernel(logits)
    return logits.argmax(dim=-1)


@functools.cache
def _cpu_greedy_kernel() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The C++ op, looked up once per process (not on every step): every CPU level's build
    gives the same exact result, so the level selected at the first greedy CPU step serves
    them all; None where the kernels do not build."""
    return cpu_ops().greedy_tokens if cpu_extension_available() else None


class Sampler:
    def __init__(self, default_generator: torch.Generator | None = None) -> None:
        self.default_generator = default_generator
        self.grammar_bitmask = GrammarBitmask()

    def __call__(self, logits: torch.Tensor,
                 rows: list[SamplingRow]) -> tuple[list[int], list[TokenLogprobs | None]]:
        """One token per row of ``logits`` (and its log-probabilities where asked), on the
        host."""
        tokens, logprobs = self.launch(logits, rows)
        return (tokens.tolist() if isinstance(tokens, PendingTokens) else tokens), logprobs

    @torch.inference_mode()
    def launch(self, logits: torch.Tensor, rows: list[SamplingRow]
               ) -> tuple[list[int] | PendingTokens, list[TokenLogprobs | None]]:
        """As ``__call__``, but the token ids may still be on their way from the device
        (``PendingTokens``): only log-probabilities need them on the host at once.

        ``logits`` come in the LM head's dtype. A step of plain greedy rows (no penalties,
        blocked tokens, grammar or log-probabilities) takes their argmax as they are, which is
        their float32 copy's argmax; any other step samples them as float32 (penalties and masks
        written in place)."""
        if all(_plain_greedy(row) for row in rows):
            return PendingTokens(greedy_tokens(logits)), [None] * len(rows)
        logits = logits.float()
        self.grammar_bitmask(logits, [row.grammar for row in rows])
        for r, row in enumerate(rows):
            if row.params.allowed_token_ids is not None:
                _keep_only(logits[r], row.params.allowed_token_ids)
            if row.blocked_token_ids:
                logits[r, row.blocked_token_ids] = float("-inf")
            if row.params.logit_bias:
                _add_biases(logits[r], row.params.logit_bias)
            if row.params.has_penalties:
                _apply_penalties(logits[r], row)
        logprobs = self._logprobs(logits, rows)

        tokens = greedy_tokens(logits)
        random_rows = [r for r, row in enumerate(rows) if not row.params.greedy]
        if random_rows:
            index = torch.tensor(random_rows, device=logits.device)
            uniforms = self._uniforms([rows[r] for r in random_rows]).to(logits.device)
            tokens[index] = _draw(logits[index], [rows[r].params for r in random_rows], uniforms)
        if logprobs is None:
            return PendingTokens(tokens), [None] * len(rows)
        token_list = tokens.tolist()
        return token_list, [_token_logprobs(lp, t, row) if lp is not None else None
                            for lp, t, row in zip(logprobs, token_list, rows)]

    def _uniforms(self, rows: list[SamplingRow]) -> torch.Tensor:
        """One uniform number in [0, 1) per row: a seeded row's from its own generator."""
        out = torch.rand(len(rows), generator=self.default_generator)
        for i, row in enumerate(rows):
            if row.generator is not None:
                out[i] = torch.rand(1, generator=row.generator)[0]
        return out

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


def _plain_greedy(row: SamplingRow) -> bool:
    """True if ``row`` takes its logits' argmax as they are: greedy, with nothing that changes
    the logits first (penalties, blocked tokens, a grammar, allowed tokens, biases) and no
    log-probabilities."""
    p = row.params
    return (p.greedy and not p.has_penalties and not row.blocked_token_ids and row.grammar is None
            and p.logprobs is None and p.allowed_token_ids is None and not p.logit_bias)


def _keep_only(logits: torch.Tensor, token_ids: list[int]) -> None:
    """Every logit of the row but those of ``token_ids`` to -inf, in place."""
    index = torch.tensor(token_ids, dtype=torch.long, device=logits.device)
    kept = logits[index]
    logits.fill_(float("-inf"))
    logits[index] = kept


def _add_biases(logits: torch.Tensor, biases: dict[int, float]) -> None:
    """Each listed token's logit plus its bias, in place (the keys are distinct)."""
    index = torch.tensor(list(biases), dtype=torch.long, device=logits.device)
    logits[index] += torch.tensor(list(biases.values()), dtype=logits.dtype, device=logits.device)


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


def _draw(logits: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """Sample one token per row after temperature, top-k, top-p and min-p."""
    temps = torch.tensor([p.temperature for p in params], device=logits.device, dtype=logits.dtype)
    logits = logits / temps[:, None]
    tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
    truncated = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1]
    whole = sorted(set(range(len(params))) - set(truncated))
    if whole:
        index = torch.tensor(whole, device=logits.device)
        probs = _apply_min_p(torch.softmax(logits[index], dim=-1), [params[i] for i in whole])
        tokens[index] = _inverse_cdf(probs, uniforms[index])
    if truncated:
        index = torch.tensor(truncated, device=logits.device)
        tokens[index] = _draw_truncated(logits[index], [params[i] for i in truncated],
                                        uniforms[index])
    return tokens


def _draw_truncated(logits: torch.Tensor, params: list[SamplingParams],
                    uniforms: torch.Tensor) -> torch.Tensor:
    """Rows with top-k and/or top-p: candidates in descending order, then the kept ones' CDF."""
    vocab = logits.shape[1]
    top_ks = torch.tensor([p.top_k for p in params], device=logits.device)
    wanted = max(p.top_k if p.top_k > 0 else _TOP_P_CANDIDATES for p in params)
    probs, ids = _candidate_probs(logits, top_ks, min(wanted, vocab))
    top_ps = torch.tensor([p.top_p for p in params], device=logits.device, dtype=probs.dtype)
    # A top-p-only row whose candidates hold less mass than top_p needs more of them.
    short = (top_ks == 0) & (probs.sum(dim=-1) < top_ps) if probs.shape[1] < vocab else None
    if short is not None and bool(short.any()):
        probs_all, ids_all = _candidate_probs(logits[short], top_ks[short], vocab)
        probs = torch.nn.functional.pad(probs, (0, vocab - probs.shape[1]))
        ids = torch.nn.functional.pad(ids, (0, vocab - ids.shape[1]))
        probs[short], ids[short] = probs_all, ids_all
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each candidate
    drop = before >= top_ps[:, None]
    drop[:, 0] = False  # the most likely token always stays
    probs = _apply_min_p(probs.masked_fill(drop, 0.0), params)
    return ids.gather(1, _inverse_cdf(probs, uniforms)[:, None])[:, 0]


def _candidate_probs(logits: torch.Tensor, top_ks: torch.Tensor,
                     count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` most likely tokens of each row, in descending order, with their
    probabilities: renormalised over the row's ``top_k`` best (0 past them) when it has a
    top-k, else the full-vocabulary probabilities."""
    values, ids = logits.topk(count, dim=-1)
    has_k = top_ks > 0
    past_k = torch.arange(count, device=logits.device)[None, :] >= top_ks[:, None]
    values = values.masked_fill(past_k & has_k[:, None], float("-inf"))
    normaliser = values.logsumexp(dim=-1)
    if not bool(has_k.all()):  # top-p-only rows: full-vocabulary probabilities
        normaliser[~has_k] = logits[~has_k].logsumexp(dim=-1)
    return (values - normaliser[:, None]).exp(), ids


def _apply_min_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero tokens below ``min_p`` times the row's most likely token's probability."""
    min_ps = torch.tensor([p.min_p for p in params], device=probs.device, dtype=probs.dtype)
    if not bool((min_ps > 0).any()):
        return probs
    threshold = min_ps[:, None] * probs.max(dim=-1, keepdim=True).values
    return probs.masked_fill(probs < threshold, 0.0)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index ``i`` with ``cdf[i-1] <= u * total < cdf[i]``: always a token with probability > 0."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[1] - 1)


def _token_logprobs(lp: torch.Tensor, token: int, row: SamplingRow) -> TokenLogprobs:
    k = row.params.logprobs or 0
    token_lp = lp[token]
    rank = int((lp > token_lp).sum().item()) + 1
    top: list[tuple[int, float]] = []
    if k:
        values, ids = lp.topk(k)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(float(token_lp), rank, top)
