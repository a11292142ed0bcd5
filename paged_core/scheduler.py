"""Continuous batching: which sequences run this step, and how many tokens each (no torch).

Each step packs running sequences first (decodes and unfinished prefill
chunks, oldest first), then admits waiting ones FCFS, all under
``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences. A prefill
that does not fit the remaining budget is chunked. When the cache is full the
newest running sequence is preempted by recompute (its blocks are freed and it
goes back to the front of the queue); the oldest one always makes progress, so
every request finishes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import KVCacheManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, from seq.num_computed_tokens on


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) copy-on-write
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def describe(self, max_request_ids: int = 32) -> str:
        """One line for a crash log: sizes and request ids, never token ids or text."""
        ids = list(dict.fromkeys(s.seq.request.request_id for s in self.scheduled))
        shown = ", ".join(ids[:max_request_ids])
        if len(ids) > max_request_ids:
            shown += f", ... ({len(ids) - max_request_ids} more)"
        return (f"{len(self.scheduled)} sequences of {len(ids)} requests, {self.num_tokens} "
                f"tokens, {len(self.block_copies)} block copies, {len(self.preempted)} "
                f"preempted; request ids: {shown}")


class Scheduler:
    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int,
                 max_num_batched_tokens: int) -> None:
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Admit a sequence that already holds its blocks (a fork of a running one)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence wherever it is and free its blocks."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.kv.free(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new == 0:  # a beam waiting for its siblings (beam_request.py): nothing to run
                i += 1
                continue
            while not self.kv.allocate_slots(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                scheduled_ids.add(seq.seq_id)
                budget -= num_new
                i += 1
                continue
            break  # the sequence preempted itself: nothing newer is left to run
        if not out.preempted:
            self._admit_waiting(out, budget)
        out.block_copies = self.kv.take_pending_copies()
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cached = self.kv.find_cached_prefix(seq)
            num_cached_tokens = len(cached) * self.kv.block_size
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_cached_tokens, budget)
            if not self.kv.allocate_slots(seq, num_new, cached):
                break
            self.kv.record_prefix_lookup(seq.num_tokens, num_cached_tokens)
            seq.num_computed_tokens += num_cached_tokens
            seq.num_cached_tokens = num_cached_tokens
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free a running sequence's blocks; it recomputes everything when readmitted."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]
