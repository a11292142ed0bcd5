"""``Request``: one user request, its ``n`` samples, their text and their stop conditions.

A request starts with one sequence (the prompt). When that prompt is fully
computed and the request wants ``n > 1`` samples, it forks into ``n`` sequences
sharing the prompt's blocks (``plan_sampling`` decides, the engine applies the
``GroupDecision``). Each sample keeps its own
detokenizer, seeded generator, log-probabilities and streaming cursor.
Invariant: text already handed out is never taken back; while stop strings
may still match, the last ``max(len(stop)) - 1`` characters are held back.
With ``structured_outputs`` each sample holds a grammar matcher that has
accepted exactly its output tokens (forked with it); the sample finishes with
"stop" when the grammar ends.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from .core.group_decision import GroupDecision
from .core.sequence import Sequence
from .frontend.detokenizer import IncrementalDetokenizer
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sample.sampler import SamplingRow, TokenLogprobs
from .sampling_params import SamplingParams
from .scheduling_fields import SchedulingFields
from .structured_outputs import SequenceGrammar

_seq_ids = itertools.count()


@dataclass
class Sample:
    """The per-sample state of a request (sequence ``index`` in ``0..n-1``)."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    emitted_chars: int = 0
    emitted_tokens: int = 0
    emitted_logprobs: int = 0
    grammar: SequenceGrammar | None = None


@dataclass
class Request(SchedulingFields):
    """A sampling request; ``priority`` and ``tenant`` (keyword-only) come from
    ``SchedulingFields``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_total_tokens: int  # context limit: min(max_model_len, KV cache capacity)
    tokenizer: object
    compiled_grammar: object | None = None  # xgrammar CompiledGrammar of structured_outputs
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.monotonic()))
    samples: list[Sample] = field(default_factory=list)
    num_cached_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        grammar = (SequenceGrammar.start(self.compiled_grammar)
                   if self.compiled_grammar is not None else None)
        self.samples.append(self._new_sample(list(self.prompt_token_ids), 0, grammar))
        self._holdback = 0
        if self.params.stop and not self.params.include_stop_str_in_output:
            self._holdback = max(len(s) for s in self.params.stop) - 1

    @property
    def sequences(self) -> list[Sequence]:
        return [s.seq for s in self.samples]

    @property
    def is_finished(self) -> bool:
        return all(s.seq.is_finished for s in self.samples)

    def plan_sampling(self, seq: Sequence) -> GroupDecision:
        """``seq`` samples its next token from its row; right after the prompt, the other
        ``n - 1`` samples fork from it and sample from the same row."""
        if len(self.samples) == self.params.n:
            return GroupDecision(to_sample=[seq])
        children = self._fork()
        return GroupDecision(forks=[(seq, child) for child in children], to_sample=[seq, *children])

    def _fork(self) -> list[Sequence]:
        """Create samples ``1..n-1`` as copies of sample 0's token list (blocks shared by the
        engine, applying the decision)."""
        parent = self.samples[0].seq
        grammar = self.samples[0].grammar
        new = [self._new_sample(list(parent.token_ids), index, grammar and grammar.fork())
               for index in range(1, self.params.n)]
        self.samples.extend(new)  # all or nothing: a failure above leaves the request as it was
        return [sample.seq for sample in new]

    def sample_of(self, seq: Sequence) -> Sample:
        return self.samples[seq.sample_index]

    def may_draft(self, seq: Sequence) -> bool:
        """Whether speculative decoding may draft for ``seq``: not under a grammar (its token
        mask is known for its current state only)."""
        return self.sample_of(seq).grammar is None

    def sampling_row(self, seq: Sequence, num_drafts: int = 0) -> SamplingRow:
        """The row that samples ``seq``'s next token, as if its first ``num_drafts`` draft
        tokens (speculative decoding) had been appended."""
        sample = self.sample_of(seq)
        output = seq.output_token_ids + seq.spec_token_ids[:num_drafts]
        blocked: list[int] = []
        # a grammar decides alone where EOS may come (min_tokens cannot outlast its end)
        if len(output) < self.params.min_tokens and sample.grammar is None:
            blocked = sorted(set(self.params.stop_token_ids) | self.eos_token_ids)
        return SamplingRow(self.params, sample.generator, self.prompt_token_ids, output, blocked,
                           sample.grammar)

    def append_token(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> bool:
        """Append a sampled token to ``seq``; returns True if that finished the sequence."""
        sample = self.sample_of(seq)
        seq.token_ids.append(token)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time.monotonic()
        if logprobs is not None:
            self._record_logprobs(sample, token, logprobs)
        p = self.params
        done = None
        grammar_ended = sample.grammar is not None and sample.grammar.accept(token)
        if seq.num_output_tokens >= p.min_tokens:
            if token in self.eos_token_ids and not p.ignore_eos:
                done = ("stop", None)
            elif token in p.stop_token_ids:
                done = ("stop", token)
        if done is None and grammar_ended:
            done = ("stop", None)
        old_len = len(sample.text)
        sample.text += sample.detokenizer.step(seq.token_ids, final=done is not None)
        if done is None and p.stop and seq.num_output_tokens >= p.min_tokens:
            done = self._find_stop_string(sample, old_len)
        if done is None and ((p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens)
                             or seq.num_tokens >= self.max_total_tokens):
            done = ("length", None)
        if done is None:
            return False
        seq.finish_reason, seq.stop_reason = done
        return True

    def abort(self, reason: str = "abort") -> None:
        """Give every unfinished sample ``finish_reason`` ``reason`` ("abort", or "error")."""
        for sample in self.samples:
            if sample.seq.finish_reason is None:
                sample.seq.finish_reason = reason

    def make_output(self) -> RequestOutput:
        """Snapshot with deltas since the previous snapshot; advances the streaming cursors."""
        completions = [self._completion(i, s) for i, s in enumerate(self.samples)]
        finished = all(s.seq.finish_reason is not None for s in self.samples) and \
            len(self.samples) == self.params.n
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             finished, self.metrics, self.num_cached_tokens)

    def _completion(self, index: int, sample: Sample) -> CompletionOutput:
        seq = sample.seq
        finished = seq.finish_reason is not None
        visible = len(sample.text) if finished else max(len(sample.text) - self._holdback, 0)
        visible = max(visible, sample.emitted_chars)
        out_ids = seq.output_token_ids
        delta_lp = None
        if sample.logprobs is not None:
            delta_lp = sample.logprobs[sample.emitted_logprobs:]
            sample.emitted_logprobs = len(sample.logprobs)
        out = CompletionOutput(
            index=index, text=sample.text[:visible], token_ids=list(out_ids),
            cumulative_logprob=sample.cumulative_logprob, logprobs=sample.logprobs,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            delta_text=sample.text[sample.emitted_chars:visible],
            delta_token_ids=out_ids[sample.emitted_tokens:], delta_logprobs=delta_lp)
        sample.emitted_chars = visible
        sample.emitted_tokens = len(out_ids)
        return out

    def _new_sample(self, token_ids: list[int], index: int,
                    grammar: SequenceGrammar | None) -> Sample:
        seq = Sequence(next(_seq_ids), self, token_ids, len(self.prompt_token_ids), index)
        seed = self.params.sample_seed(index)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        detok = IncrementalDetokenizer(self.tokenizer, self.prompt_token_ids,
                                       self.params.skip_special_tokens)
        return Sample(seq, detok, generator,
                      logprobs=[] if self.params.logprobs is not None else None, grammar=grammar)

    def _find_stop_string(self, sample: Sample, old_len: int) -> tuple[str, str] | None:
        longest = max(len(s) for s in self.params.stop)
        window_start = max(old_len - longest + 1, 0)
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            pos = sample.text.find(stop, window_start)
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, stop)
        if best is None:
            return None
        pos, stop = best
        end = pos + len(stop) if self.params.include_stop_str_in_output else pos
        sample.text = sample.text[:end]
        return ("stop", stop)

    def _record_logprobs(self, sample: Sample, token: int, lp: TokenLogprobs) -> None:
        decode = self.tokenizer.decode
        entry = {token: Logprob(lp.token_logprob, lp.token_rank, decode([token]))}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            if tid not in entry:
                entry[tid] = Logprob(value, rank, decode([tid]))
        sample.logprobs.append(entry)
        sample.cumulative_logprob = (sample.cumulative_logprob or 0.0) + lp.token_logprob
