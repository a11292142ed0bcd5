"""Continuous batching: which sequences run this step, and how many tokens each (no torch).

Each step packs running sequences first (decodes and unfinished prefill
chunks, oldest first), then admits waiting ones in ``WaitingQueue`` order
(FCFS, or vLLM's ``priority`` policy; tenants take turns with fairness on),
all under ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences. A
prefill that does not fit the remaining budget is chunked. A decode with draft
tokens (speculative decoding, ``seq.spec_token_ids``) asks for ``1 + len(drafts)``
tokens; drafts past the budget, or all of them when their blocks do not fit,
are dropped before anything is preempted. When the cache is full a running
sequence is preempted by recompute (its blocks are freed and it goes back to
the front of its queue): the newest one under FCFS, the newest of the lowest
priority (largest value) under ``priority``. The oldest sequence of the
highest priority is never the victim while another runs, so it always makes
progress and, the cache being large enough for any one sequence, every request
finishes (under ``priority``, once higher-priority traffic lets it).

Decode stalls are bounded by two limits (vLLM's names) that apply only to steps
carrying at least one decode (a step with no decode in flight takes the whole
budget, as no inter-token latency is at stake): ``long_prefill_token_threshold``
caps the prompt tokens one sequence computes in one step, and
``max_num_partial_prefills`` caps how many sequences compute prompt tokens in
one step (0 disables either). So such a step carries at most
``threshold * max_num_partial_prefills`` prefill tokens besides its decodes.
``schedule(StepBudget(...))`` adds what a latency target allows (the engine
derives it with ``step_cost.latency_budget``): ``prompt_tokens`` caps the
prompt tokens beside the decodes of a step (never below one, so waiting
prompts keep being admitted), and ``max_running`` caps how many sequences run
at once, so that their decodes together fit the target; a burst then waits
for its first token instead of slowing every stream (a step with no decode in
flight, whose prompt tokens are not limited, admits no more than that either,
so the wave it starts fits the target too). Short prompts are the exception:
while fewer than ``MIN_RUNNING_UNDER_LATENCY_TARGET`` sequences run, a new
prompt that fits in one block (the whole prompt: a long one whose prefix is
cached is cheap to start but streams like any other) starts, and starts whole,
outside both limits: it costs a step about what one decode does, and on an
overloaded machine many slow streams of short chat turns beat a few fast ones
while everyone else waits. A long prompt starts only under the cap (one sequence at
least runs, so the queue always drains).

With LoRA on, a waiting sequence starts only once its adapter holds a device slot
(``lora_slots``); until one frees, it and those behind it wait.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .kv_cache_manager import KVCacheManager
from .lora_slots import LoRASlotTable
from .sequence import Sequence, SequenceStatus
from .waiting_queue import WaitingQueue

MIN_RUNNING_UNDER_LATENCY_TARGET = 16


@dataclass(frozen=True)
class StepBudget:
    """What a latency target allows one step (``None``: no limit; see the module docstring)."""
    prompt_tokens: int | None = None  # prompt tokens beside the step's decodes
    max_running: int | None = None  # sequences whose decodes together fit the target


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
                 max_num_batched_tokens: int, long_prefill_token_threshold: int = 0,
                 max_num_partial_prefills: int = 0, policy: str = "fcfs",
                 tenant_fairness: bool = False, lora_slots: LoRASlotTable | None = None) -> None:
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.max_num_partial_prefills = max_num_partial_prefills
        self.policy = policy
        self.waiting = WaitingQueue(policy, tenant_fairness)
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.lora_slots = lora_slots  # None: LoRA off (every sequence runs the base model)

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

    def schedule(self, step_budget: StepBudget | None = None) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        step_budget = step_budget or StepBudget()
        limits = (_PrefillLimits(self, step_budget.prompt_tokens)
                  if self.num_decodes_in_flight else None)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            pending = seq.num_tokens - seq.num_computed_tokens
            num_new = min(pending + len(seq.spec_token_ids), budget)
            if num_new == 0:  # a beam waiting for its siblings (beam_request.py): nothing to run
                i += 1
                continue
            if limits is not None and pending > 1:  # a prefill chunk (drafts follow decodes only)
                num_new = limits.take(num_new)
                if num_new == 0:
                    i += 1
                    continue
            while not self.kv.allocate_slots(seq, num_new):
                if seq.spec_token_ids:  # drafts are the first thing to give up
                    seq.spec_token_ids = []
                    num_new = min(pending, budget)
                    continue
                victim = self._victim()
                if self.running.index(victim) < i:  # scheduled earlier in this step
                    i -= 1
                    budget += self._preempt(victim, out)
                else:
                    self._preempt(victim, out)
                if victim is seq:
                    break  # running[i] is now the next sequence
            else:
                del seq.spec_token_ids[max(num_new - pending, 0):]  # drafts past the budget
                out.scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                i += 1
        if not out.preempted:
            self._admit_waiting(out, budget, limits, step_budget)
        out.block_copies = self.kv.take_pending_copies()
        return out

    @property
    def num_decodes_in_flight(self) -> int:
        return sum(seq.num_tokens - seq.num_computed_tokens == 1 for seq in self.running)

    def _max_running(self, step_budget: StepBudget, short: bool) -> int:
        """How many may run once this one starts: the latency cap (at least one), raised to
        the floor for a short prompt (see the module docstring)."""
        if step_budget.max_running is None:
            return self.max_num_seqs
        floor = MIN_RUNNING_UNDER_LATENCY_TARGET if short else 1
        return min(self.max_num_seqs, max(step_budget.max_running, floor))

    def _admit_waiting(self, out: SchedulerOutput, budget: int,
                       limits: "_PrefillLimits | None", step_budget: StepBudget) -> None:
        while self.waiting and budget > 0:
            seq = self.waiting.peek()
            cached = self.kv.find_cached_prefix(seq)
            num_cached_tokens = len(cached) * self.kv.block_size
            uncomputed = seq.num_tokens - seq.num_computed_tokens
            short = uncomputed <= self.kv.block_size  # in full: a cached prefix does not count
            prompt_left = uncomputed - num_cached_tokens
            if len(self.running) >= self._max_running(step_budget, short):
                break
            if not self._lora_resident(seq):
                break
            num_new = min(prompt_left, budget)
            if limits is not None:
                untimed = short and len(self.running) < MIN_RUNNING_UNDER_LATENCY_TARGET
                num_new = limits.take(num_new, timed=not untimed)
            if num_new == 0 or not self.kv.allocate_slots(seq, num_new, cached):
                break
            self.kv.record_prefix_lookup(seq.num_tokens, num_cached_tokens)
            seq.num_computed_tokens += num_cached_tokens
            seq.num_cached_tokens = num_cached_tokens
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new

    def _lora_resident(self, seq: Sequence) -> bool:
        """Whether ``seq``'s LoRA adapter has (or now takes) a slot (``lora_slots``)."""
        if self.lora_slots is None:
            return True
        return self.lora_slots.admit(seq.lora_id, lambda: {s.lora_id for s in self.running})

    def _victim(self) -> Sequence:
        """The running sequence to preempt: the newest (FCFS), or the newest of the lowest
        priority (``policy="priority"``, vLLM's rule; ``seq_id`` grows with arrival)."""
        if self.policy != "priority":
            return self.running[-1]
        return max(self.running, key=lambda s: (s.request.priority, s.seq_id))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Free a running sequence's blocks; it recomputes everything when readmitted.

        Returns the tokens it had been given in this step (0 if not scheduled yet)."""
        given = sum(s.num_new_tokens for s in out.scheduled if s.seq is seq)
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]
        return given


class _PrefillLimits:
    """The prefill allowance left in a step that carries decodes (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, prompt_tokens: int | None) -> None:
        self.threshold = scheduler.long_prefill_token_threshold
        self.prefills_left = scheduler.max_num_partial_prefills or None
        self.tokens_left = (None if prompt_tokens is None else
                            max(1, prompt_tokens))

    def take(self, num_new: int, timed: bool = True) -> int:
        """How many of a sequence's ``num_new`` tokens it may compute: a decode (one token)
        always all; a prefill chunk at most ``threshold`` and what is left of the step's
        prefill tokens, and 0 once the prefill count or tokens are used up. ``timed=False``
        (a short prompt while few sequences run) leaves the latency budget's tokens out."""
        if num_new <= 1:
            return num_new
        if timed and self.tokens_left == 0:
            return 0
        if self.prefills_left is not None:
            if self.prefills_left == 0:
                return 0
            self.prefills_left -= 1
        if self.threshold:
            num_new = min(num_new, self.threshold)
        if timed and self.tokens_left is not None:
            num_new = min(num_new, self.tokens_left)
            self.tokens_left -= num_new
        return num_new
