"""``Request``: one sampling request in the core: its ``n`` samples' tokens and the stop
conditions that tokens alone decide.

A request starts with one sequence (the prompt). When that prompt is fully
computed and the request wants ``n > 1`` samples, it forks into ``n`` sequences
sharing the prompt's blocks (``plan_sampling`` decides, the engine applies the
``GroupDecision``). Each sample keeps its own seeded generator. With
``structured_outputs`` each sample holds a grammar matcher that has accepted
exactly its output tokens (forked with it); the sample finishes with "stop" when
the grammar ends. Text, stop strings and output deltas are the front end's
(``frontend.request_text``); a stop string found there ends the sample through
``stop_at_string``. The core reports each step's tokens as ``EngineCoreOutput``s
(``core_output``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.group_decision import GroupDecision
from ..core.sequence import Sequence
from ..sample.bad_words import banned_tokens
from ..sample.sampler import SamplingRow
from ..sampling_params import SamplingParams
from ..structured_outputs import SequenceGrammar
from .core_request import CoreRequest, next_seq_id
from .engine_io import EngineCoreOutput, EngineRequest

@dataclass
class Sample:
    """The per-sample state of a request in the core (sequence ``index`` in ``0..n-1``)."""

    seq: Sequence
    generator: torch.Generator | None
    grammar: SequenceGrammar | None = None
    # Its sampling row once that no longer changes from step to step (no penalties, no EOS
    # blocked, no drafts): the same object every step, made once (``Request.sampling_row``).
    steady_row: SamplingRow | None = None


class Request(CoreRequest):
    """A sampling request (``source.params`` is a ``SamplingParams``); ``max_total_tokens``
    is its context limit: ``min(max_model_len, KV cache capacity)``."""

    def __init__(self, source: EngineRequest, max_total_tokens: int) -> None:
        super().__init__(source)
        self.params: SamplingParams = source.params
        self.eos_token_ids = source.eos_token_ids
        self.bad_words = source.bad_words_token_ids
        self.max_total_tokens = max_total_tokens
        grammar = (SequenceGrammar.start(source.compiled_grammar)
                   if source.compiled_grammar is not None else None)
        self.samples: list[Sample] = []
        self.samples.append(self._new_sample(list(self.prompt_token_ids), 0, grammar))

    @property
    def sequences(self) -> list[Sequence]:
        return [s.seq for s in self.samples]

    @property
    def is_finished(self) -> bool:
        return all(s.seq.is_finished for s in self.samples)

    @property
    def is_complete(self) -> bool:
        """Whether every one of the ``n`` samples has its finish reason (its last output)."""
        return (len(self.samples) == self.params.n
                and all(s.seq.finish_reason is not None for s in self.samples))

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
        tokens (speculative decoding) had been appended. Its output tokens are listed only
        where penalties or bad words read them (a copy per step would grow with the output).
        Blocked: EOS and stop ids while ``min_tokens`` is unmet, and the tokens that would
        complete a ``bad_words`` spelling."""
        sample = self.sample_of(seq)
        if sample.steady_row is not None and not num_drafts:
            return sample.steady_row
        drafts = seq.spec_token_ids[:num_drafts]
        num_output = seq.num_output_tokens + len(drafts)
        reads_output = self.params.has_penalties or bool(self.bad_words)
        output = seq.output_token_ids + drafts if reads_output else []
        blocked: list[int] = []
        # a grammar decides alone where EOS may come (min_tokens cannot outlast its end)
        if num_output < self.params.min_tokens and sample.grammar is None:
            blocked = sorted(set(self.params.stop_token_ids) | self.eos_token_ids)
        if self.bad_words:
            banned = banned_tokens(self.bad_words, output)
            blocked = sorted(set(blocked) | set(banned))
        row = SamplingRow(self.params, sample.generator, self.prompt_token_ids, output, blocked,
                          sample.grammar)
        if not (reads_output or blocked or drafts):  # the same from now on
            sample.steady_row = row
        return row

    def append_token(self, seq: Sequence, token: int) -> bool:
        """Append a sampled token to ``seq`` (in place of its oldest placeholder, if it holds
        one: ``schedule_ahead``); returns True if the token finished it: EOS, a stop token or
        the grammar's end ("stop"), ``max_tokens`` or the context ("length"). A finishing
        token drops the placeholders after it."""
        grammar = self.sample_of(seq).grammar
        if seq.num_placeholders:
            position = seq.num_known_tokens
            seq.token_ids[position] = token
            seq.num_placeholders -= 1
        else:
            position = len(seq.token_ids)
            seq.token_ids.append(token)
        self.mark_first_token()
        p = self.params
        done = None
        grammar_ended = grammar is not None and grammar.accept(token)
        num_output = position + 1 - seq.num_prompt_tokens
        if num_output >= p.min_tokens:
            if token in self.eos_token_ids and not p.ignore_eos:
                done = ("stop", None)
            elif token in p.stop_token_ids:
                done = ("stop", token)
        if done is None and grammar_ended:
            done = ("stop", None)
        if done is None and ((p.max_tokens is not None and num_output >= p.max_tokens)
                             or position + 1 >= self.max_total_tokens):
            done = ("length", None)
        if done is None:
            return False
        del seq.token_ids[position + 1:]
        seq.num_placeholders = 0
        seq.finish_reason, seq.stop_reason = done
        return True

    def may_schedule_ahead(self, seq: Sequence) -> bool:
        """Whether ``seq``, which sampled a token in the step just launched, may be scheduled
        again before that token reaches the host (``schedule_ahead``): not when its next
        sampling reads its output (penalties, bad words) or a grammar's state, nor when that
        token is its last by length (nothing would follow it)."""
        p = self.params
        return (not p.has_penalties and not self.bad_words
                and self.sample_of(seq).grammar is None
                and (p.max_tokens is None or seq.num_output_tokens + 1 < p.max_tokens)
                and seq.num_tokens + 1 < self.max_total_tokens)

    def stop_at_string(self, seq: Sequence, num_output_tokens: int, stop: str) -> None:
        """End ``seq`` on ``stop``, found in its text after output token ``num_output_tokens``:
        the tokens appended after that one are dropped."""
        del seq.token_ids[seq.num_prompt_tokens + num_output_tokens:]
        seq.num_placeholders = 0
        seq.finish_reason, seq.stop_reason = "stop", stop

    def final_outputs(self) -> list[EngineCoreOutput]:
        """Every sample's finish reason, once the request ended (an abort, a failure)."""
        return [self.core_output(s.seq.sample_index, finish_reason=s.seq.finish_reason,
                                 stop_reason=s.seq.stop_reason) for s in self.samples]

    def abort(self, reason: str = "abort") -> None:
        """Give every unfinished sample ``finish_reason`` ``reason`` ("abort", or "error")."""
        for sample in self.samples:
            if sample.seq.finish_reason is None:
                sample.seq.finish_reason = reason

    def _new_sample(self, token_ids: list[int], index: int,
                    grammar: SequenceGrammar | None) -> Sample:
        seq = Sequence(next_seq_id(), self, token_ids, len(self.prompt_token_ids), index,
                       self.cache_salt, self.lora_id)
        seed = self.params.sample_seed(index)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return Sample(seq, generator, grammar)
