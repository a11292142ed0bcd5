"""``ScheduleAhead``: ``EngineCore``'s part of ``schedule_ahead`` (vLLM's async scheduler).

A step may be launched while the step before it is still in flight. Each sequence sampled
in a launched step that may go on before its token reaches the host
(``SequenceGroup.may_schedule_ahead``) holds a placeholder for it (``core.sequence``), so
the scheduler gives it its next decode row at once; that row's input is the previous step's
sampled token, taken on the device (``AheadTokens``). ``finish_step`` then puts the token in
its place (``Request.append_token``); a sample it finishes drops the placeholder after it,
and the step in flight computes that sample's row for nothing.

Invariant: ``source`` is the output of the step launched last; a placeholder's
``placeholder_row`` indexes that step's sampled tokens.
"""
from __future__ import annotations

from ..core.scheduler import SchedulerOutput
from ..core.sequence import PLACEHOLDER
from ..executor.ahead_tokens import AheadTokens
from ..executor.packed_batch import PackedBatch
from ..sample.sampling_plan import SamplerOutput
from .step_records import StepPlan


class ScheduleAhead:
    def __init__(self) -> None:
        self.source: SamplerOutput | None = None

    def hold_places(self, plan: StepPlan, output: SamplerOutput) -> None:
        """After a step's launch: each sequence it samples that may go on before its token
        arrives holds a placeholder for it and notes its row in ``output``'s tokens; not the
        samples of a request that forks this step (they start together, once the forks are
        applied)."""
        forking = {parent.request.request_id for decision in plan.decisions
                   for parent, _ in decision.forks}
        for row, seq in enumerate(plan.sampling.targets):  # no drafts: one token per target
            if seq.request.request_id in forking or not seq.request.may_schedule_ahead(seq):
                continue
            seq.token_ids.append(PLACEHOLDER)
            seq.num_placeholders += 1
            seq.placeholder_row = row
        self.source = output

    def tokens_for(self, sched: SchedulerOutput, packed: PackedBatch) -> AheadTokens | None:
        """The rows of a step being packed whose token is a placeholder (the sequence
        computes its oldest one), each to be the token its sequence sampled in the step
        launched before: written into ``packed`` if the host already has those tokens, else
        returned for the runner to take on the device."""
        rows, sources = [], []
        for index, item in enumerate(sched.scheduled):
            seq = item.seq
            if seq.num_placeholders and seq.num_computed_tokens == seq.num_known_tokens:
                rows.append(int(packed.query_start_loc[index]))
                sources.append(seq.placeholder_row)
        if not rows:
            return None
        tokens = self.source.token_ids
        if isinstance(tokens, list):  # already on the host (log-probabilities need them)
            packed.input_ids[rows] = [tokens[source] for source in sources]
            return None
        return AheadTokens(rows, sources, tokens.tensor)
