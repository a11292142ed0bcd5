"""``BeamSearchRequest``: one beam search request inside the engine, a sequence group whose
live beams share KV blocks by reference.

Life of a request (``k = beam_width``)::

    prompt seq ──prefill──► logits ──step──► k beams ──decode──► logits ──step──► ...
                                     │  keep the k best non-EOS continuations: the first
                                     │  one of a parent reuses its sequence, the others
                                     │  fork its block table (copy-on-write of the shared
                                     │  partial block); parents nobody continues are freed
                                     └► EOS candidates among the k best -> hypotheses

Every beam asks for its raw logits row (``plan_sampling``); a step decides forks and frees
(a ``GroupDecision``, returned by ``take_logits`` of the last beam whose logits came in); the
engine applies them to the KV cache manager and the scheduler.

A step is transformers' ``_beam_search`` iteration, token for token: candidates
are the ``max(2, 1 + #eos) * k`` best (beam, token) pairs by cumulative
log-probability (float32); only the best ``k`` of them may finish a hypothesis
(score ``cum / generated_len ** length_penalty``, at most ``k`` kept); at
``max_tokens`` the ``k`` best candidates all finish. The search ends at
``max_tokens``, or earlier per ``early_stopping`` (see ``beam_search_params``).

Invariants: every live beam has the same length; a step runs only when every
live beam's tokens are all computed and its logits are in (a beam that was
preempted recomputes alone while its siblings wait, skipped by the scheduler
since they have nothing to compute), so preemption never changes the result;
when the request ends no beam holds a block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..beam_search.results import RankedBeam, TokenRecord, beam_score
from ..beam_search.params import BeamSearchParams
from ..core.group_decision import GroupDecision
from ..core.sequence import Sequence
from .engine_io import EngineCoreOutput, EngineRequest
from .core_request import CoreRequest, next_seq_id


@dataclass
class Beam:
    seq: Sequence
    cum_logprob: float  # a float32 value: sums are taken in float32, as transformers does
    records: list[TokenRecord]


@dataclass
class Hypothesis(RankedBeam):
    """A finished completion, ranked by its length-penalised ``score``."""

    score: float = 0.0


@dataclass
class _Candidate:
    beam: int  # index into the live beams
    token: int
    cum_logprob: float
    record: TokenRecord


class BeamSearchRequest(CoreRequest):
    def __init__(self, source: EngineRequest) -> None:
        """``source.params`` is a ``BeamSearchParams``; every beam is scheduled with the
        request's ``priority`` and ``tenant``, as the sequences of one ``Request`` are."""
        super().__init__(source)
        self.params: BeamSearchParams = source.params
        self._eos = sorted(source.eos_token_ids)
        self._num_candidates = max(2, 1 + len(self._eos)) * self.params.beam_width
        prompt_seq = Sequence(next_seq_id(), self, list(self.prompt_token_ids),
                              len(self.prompt_token_ids), 0, self.cache_salt,
                              lora_id=self.lora_id)
        self.beams: list[Beam] = [Beam(prompt_seq, 0.0, [])]
        self.hypotheses: list[Hypothesis] = []  # best first, at most beam_width
        self._logits: dict[int, torch.Tensor] = {}  # seq_id -> logits of its next token
        self._abort_reason: str | None = None

    @property
    def sequences(self) -> list[Sequence]:
        """The live beams' sequences (none once the search is over)."""
        return [b.seq for b in self.beams]

    @property
    def is_finished(self) -> bool:
        return not self.beams or self._abort_reason is not None

    def may_draft(self, seq: Sequence) -> bool:
        """Never: a beam step ranks whole continuations, not one token after another."""
        return False

    def may_schedule_ahead(self, seq: Sequence) -> bool:
        """Never: which beams go on is decided from every beam's row after the step."""
        return False

    def plan_sampling(self, seq: Sequence) -> GroupDecision:
        """Every beam's row comes back raw: a step ranks whole continuations itself."""
        return GroupDecision(needs_logits=True)

    def take_logits(self, seq: Sequence, logits: torch.Tensor) -> GroupDecision:
        """Keep the logits of ``seq``'s next token; once every live beam has its own (and all
        its tokens computed), run one step: its decision forks the continued beams, frees
        the dropped ones (every beam when the search ends) and counts the tokens kept."""
        self._logits[seq.seq_id] = logits.clone()
        if not all(b.seq.seq_id in self._logits and b.seq.num_computed_tokens == b.seq.num_tokens
                   for b in self.beams):
            return GroupDecision()
        decision = self._step()
        decision.output_ready = self.is_finished
        return decision

    def _step(self) -> GroupDecision:
        """One beam search step over the stacked logits of the live beams."""
        self.mark_first_token()
        logits = torch.stack([self._logits[b.seq.seq_id] for b in self.beams])
        self._logits.clear()
        candidates = self._candidates(logits)
        num_generated = self.beams[0].seq.num_output_tokens + 1
        last = num_generated >= self.params.max_tokens
        eos = set(self._eos)
        k = self.params.beam_width
        # only the best k candidates may finish; the others are there to keep k beams running
        finishing = [c for c in candidates[:k] if last or c.token in eos]
        for c in finishing:
            self._add_hypothesis(c, num_generated, "stop" if c.token in eos else "length")
        running = [] if last else [c for c in candidates if c.token not in eos][:k]
        if not running or self._search_is_over(running[0].cum_logprob, num_generated):
            ended = GroupDecision(freed=[beam.seq for beam in self.beams], num_tokens=len(finishing))
            self.beams = []
            return ended
        decision = self._continue(running)
        decision.num_tokens = len(finishing) + len(running)
        return decision

    def _candidates(self, logits: torch.Tensor) -> list[_Candidate]:
        """The best (beam, token) pairs by cumulative log-probability, best first."""
        logits = logits.float()
        if self.params.temperature > 0:
            logits = logits / self.params.temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        if self.params.ignore_eos:
            logprobs[:, self._eos] = float("-inf")
        cum = torch.tensor([b.cum_logprob for b in self.beams], dtype=torch.float32,
                           device=logits.device)
        scores = (logprobs + cum[:, None]).view(-1)
        values, index = scores.topk(min(self._num_candidates, scores.numel()))
        vocab = logprobs.shape[1]
        beams, tokens = index // vocab, index % vocab
        token_lps = logprobs[beams, tokens]
        ranks = (logprobs[beams] > token_lps[:, None]).sum(dim=-1) + 1
        return [_Candidate(b, t, v, (t, lp, r)) for b, t, v, lp, r in
                zip(beams.tolist(), tokens.tolist(), values.tolist(), token_lps.tolist(),
                    ranks.tolist()) if v != float("-inf")]

    def _add_hypothesis(self, c: _Candidate, num_generated: int, reason: str) -> None:
        parent = self.beams[c.beam]
        score = beam_score(c.cum_logprob, num_generated, self.params.length_penalty)
        self.hypotheses.append(Hypothesis(parent.seq.token_ids + [c.token], c.cum_logprob,
                                          parent.records + [c.record], reason, score))
        self.hypotheses.sort(key=lambda h: h.score, reverse=True)
        del self.hypotheses[self.params.beam_width:]

    def _search_is_over(self, best_running: float, num_generated: int) -> bool:
        """transformers' stopping rule once ``beam_width`` hypotheses are finished."""
        p = self.params
        if len(self.hypotheses) < p.beam_width:
            return False
        if p.early_stopping is True:
            return True
        length = p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0 \
            else num_generated
        return beam_score(best_running, length, p.length_penalty) <= self.hypotheses[-1].score

    def _continue(self, running: list[_Candidate]) -> GroupDecision:
        """The next live beams: reuse each parent's sequence once, fork it for more, free
        the parents nobody continues."""
        reused: dict[int, int] = {}
        beams: list[Beam] = []
        decision = GroupDecision()
        for c in running:
            parent = self.beams[c.beam]
            if c.beam not in reused:
                reused[c.beam] = c.token
                seq = parent.seq
            else:
                seq = Sequence(next_seq_id(), self, parent.seq.token_ids + [c.token],
                               len(self.prompt_token_ids), 0, self.cache_salt,
                               lora_id=self.lora_id)
                decision.forks.append((parent.seq, seq))
            beams.append(Beam(seq, c.cum_logprob, parent.records + [c.record]))
        for index, beam in enumerate(self.beams):
            if index in reused:
                beam.seq.token_ids.append(reused[index])
            else:
                decision.freed.append(beam.seq)
        self.beams = beams
        return decision

    def abort(self, reason: str = "abort") -> None:
        """End the search; live beams are reported after the hypotheses with ``reason``
        (the engine frees their blocks)."""
        self._abort_reason = reason

    def final_outputs(self) -> list[EngineCoreOutput]:
        """The search's one output, once it ended: its ranked beams (``ranked_beams``)."""
        return [self.core_output(beams=self.ranked_beams(),
                                 finish_reason=self._abort_reason or "stop")]

    def ranked_beams(self) -> list[RankedBeam]:
        """The search's result now, best first, at most ``beam_width``: the hypotheses, then
        (after an abort) the live beams with the abort's reason."""
        ranked: list[RankedBeam] = list(self.hypotheses)
        if self._abort_reason is not None:
            ranked += [RankedBeam(b.seq.token_ids, b.cum_logprob, b.records, self._abort_reason)
                       for b in self.beams]
        return ranked[:self.params.beam_width]
