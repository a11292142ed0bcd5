"""What one core step carries from phase to phase (``EngineCore``): the scheduled sequences as
the runner reads them (``step_inputs``, for ``pack``), what ``plan_sampling`` laid out before
the forward (``StepPlan``), and a step between ``launch_step`` and ``finish_step``
(``LaunchedStep``). Records only: the core applies them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.group_decision import GroupDecision, SequenceGroup
from ..core.kv_cache_manager import KVCacheManager
from ..core.scheduler import SchedulerOutput
from ..core.sequence import Sequence
from ..executor.packed_batch import StepInput
from ..sample.sampling_plan import SamplerOutput, SamplingPlan


def step_inputs(sched: SchedulerOutput, kv: KVCacheManager,
                lora_slot: Callable[[int | None], int]) -> list[StepInput]:
    """Every scheduled sequence as the runner reads it (``pack_batch``'s input), in order."""
    return [StepInput(_known_tokens(item.seq), item.seq.num_computed_tokens, item.num_new_tokens,
                      kv.block_ids(item.seq), needs_logits=_is_sampled(item),
                      num_spec_tokens=len(item.seq.spec_token_ids),
                      rotated_long=item.seq.rotated_long, lora_slot=lora_slot(item.seq.lora_id))
            for item in sched.scheduled]


@dataclass
class StepPlan:
    """What ``plan_sampling`` laid out for one step: the sampling plan the executor runs, the
    decisions the core applies after the forward, and the requests that failed deciding
    (by request id)."""

    sampling: SamplingPlan = field(default_factory=SamplingPlan)
    decisions: list[GroupDecision] = field(default_factory=list)
    failed: dict[str, tuple[SequenceGroup, Exception]] = field(default_factory=dict)


@dataclass
class LaunchedStep:
    """A step between ``launch_step`` and ``finish_step``: what was scheduled and planned,
    the executor's output (its token ids possibly still on the device), and when it began
    (``time.perf_counter``)."""

    sched: SchedulerOutput
    plan: StepPlan
    output: SamplerOutput
    started: float


def _known_tokens(seq: Sequence) -> list[int]:
    """The sequence's tokens then its drafts; without drafts its own list, uncopied (packing
    only reads it)."""
    return seq.token_ids + seq.spec_token_ids if seq.spec_token_ids else seq.token_ids


def _is_sampled(item) -> bool:
    """Whether this step computes the last known token of the sequence (so it samples the next;
    with draft tokens, also one token after each draft)."""
    return item.seq.num_computed_tokens + item.num_new_tokens >= item.seq.num_tokens
