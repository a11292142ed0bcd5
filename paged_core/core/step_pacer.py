"""``StepPacer``: the engine's latency target (``itl_target_ms``) as the scheduler's budget.

With a target it learns each step's cost (``StepCostModel``: sequences, tokens, wall time)
and hands the scheduler a ``StepBudget`` that keeps steps with decodes within the target
(``latency_budget``); without one it learns nothing and every budget is ``None`` (no limit).
A CPU engine with a target first feeds it steps of known shape (``engine.step_calibration``).
"""
from __future__ import annotations

from typing import Callable

from .scheduler import StepBudget
from .step_cost import StepCostModel, latency_budget


class StepPacer:
    def __init__(self, itl_target_ms: float | None, rows_of: Callable[[int], int]) -> None:
        self.target_s = (itl_target_ms or 0) / 1000
        self.cost = StepCostModel(rows_of=rows_of)  # fed only when there is a target

    def budget(self, num_decodes: int) -> StepBudget | None:
        """What keeps the next step, with ``num_decodes`` decodes, within the target."""
        if not self.target_s:
            return None
        return latency_budget(self.cost, self.target_s, num_decodes)

    def observe(self, num_sequences: int, num_tokens: int, seconds: float) -> None:
        """A step that ran: ``num_sequences`` sequences, ``num_tokens`` tokens, wall time."""
        if self.target_s:
            self.cost.observe(num_sequences, num_tokens, seconds)
