"""``StepPacer``: the engine's latency target (``itl_target_ms``) as the scheduler's budget.

With a target it learns each step's cost (``StepCostModel``: sequences, tokens, wall time)
and hands the scheduler a ``StepBudget`` that keeps steps with decodes within the target
(``latency_budget``); without one it learns nothing and every budget is ``None`` (no limit).
A CPU engine with a target first feeds it steps of known shape (``engine.step_calibration``).

A step's cost depends on the OpenMP team that runs it, and a CPU engine's team changes with
the cores other processes leave it (``cpu.adaptive_threads``): half the threads take about
twice as long. So the pacer keeps one cost model per team size, each learnt only from that
team's steps, and budgets each step with the model of the team that will run it: the
executor looks at the free cores before the step is scheduled (``next_team``). (Budgeted
with the team of the step before, the first step after a shrink from 2 threads to 1 took
177-287 ms, over 200 ms in 9 of 10 traced bursts of 100 through the LitServe adapter under
a 150 ms target (125 ms in two); Intel(R) Xeon(R) Processor, amx_bf16, 2026-12-07.) A team the
pacer has not seen yet starts from the calibration steps with their times scaled by the
teams' ratio (calibrated team / new team: a little slow, as a thread less costs less than
its share; measured 1.6-1.9x from 2 threads to 1 on an Intel Xeon with AMX, so such a start
errs on the short side), which that team's own steps then outweigh. Before an engine with a
fixed team, the team is ``None``: one model.

(Seen before this split, in-process, a burst of 30 beside a busy core: the first step ran on
2 threads while the other process held a core, 1627 tokens in 868 ms; the single model then
budgeted 36-72 prompt tokens and 10 running sequences for steps that took 30-55 ms under a
150 ms target, for the rest of the burst. Intel(R) Xeon(R) Processor, amx_bf16, 2026-12-07.)
"""
from __future__ import annotations

from typing import Callable

from .scheduler import StepBudget
from .step_cost import StepCostModel, latency_budget

Step = tuple[int, int, float]  # (sequences, tokens, seconds) of a step that ran


class StepPacer:
    def __init__(self, itl_target_ms: float | None, rows_of: Callable[[int], int]) -> None:
        self.target_s = (itl_target_ms or 0) / 1000
        self.rows_of = rows_of
        self.team: int | None = None  # the OpenMP team of the last step (None: a fixed one)
        self._models: dict[int | None, StepCostModel] = {}  # fed only when there is a target
        self._calibration: list[Step] = []
        self._calibrated_team: int | None = None

    @property
    def cost(self) -> StepCostModel:
        """The cost model of the team that ran the last step."""
        return self._model(self.team)

    def _model(self, team: int | None) -> StepCostModel:
        """``team``'s cost model; a new one starts from the calibration (module doc)."""
        model = self._models.get(team)
        if model is None:
            model = self._models[team] = StepCostModel(rows_of=self.rows_of)
            scale = self._calibrated_team / team if team and self._calibrated_team else 1.0
            for sequences, tokens, seconds in self._calibration:
                model.observe(sequences, tokens, seconds * scale)
        return model

    def calibrate(self, steps: list[Step], team: int | None) -> None:
        """Start from ``steps`` of known shape, timed on ``team`` threads before any request."""
        self._calibration, self._calibrated_team = list(steps), team
        self._models.clear()
        self.team = team

    def budget(self, num_decodes: int, team: int | None) -> StepBudget | None:
        """What keeps the next step, with ``num_decodes`` decodes, within the target when
        ``team`` threads run it (None: a fixed team)."""
        if not self.target_s:
            return None
        return latency_budget(self._model(team), self.target_s, num_decodes)

    def observe(self, num_sequences: int, num_tokens: int, seconds: float,
                team: int | None = None) -> None:
        """A step that ran on ``team`` threads: ``num_sequences`` sequences, ``num_tokens``
        tokens, wall time."""
        if self.target_s:
            self.team = team
            self.cost.observe(num_sequences, num_tokens, seconds)
