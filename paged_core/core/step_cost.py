"""``StepCostModel``: how long a step takes on this machine, learnt online.

A step's time has two parts that grow differently: work per *row* (the
linear layers: a prompt token costs what a decode token costs) and work per
*sequence* (attention over its whole context, sampling, detokenizing and
streaming its output). A decode-heavy step is one sequence per token, so a
single per-token slope fitted on a mix of prefill and decode steps
underestimates it. Rows are what the forward computes: a model that pads its
token rows to buckets (``prefers_bucketed_batches``, oneDNN's prepacked
linears) pays for the padding, so the model counts ``rows_of(tokens)``, not
tokens. The engine reports every step's sequence count, token count and wall
time, and the model fits

    seconds = fixed + per_sequence * sequences + per_row * rows_of(tokens)

by least squares over the last ``window`` steps, and keeps the spread of the
steps around that fit (``spread_s``: the 90th percentile of the steps' excess
over it: load from other threads and processes, memory effects). A step that took more
than ``DISTURBED_FACTOR`` times what the other steps predict for it (its leave-one-out
prediction) was disturbed, by another process that held the cores for a moment or a team
changing size, and is left out of the fit and the spread while such steps are at most
``DISTURBED_SHARE`` of the window and ``DISTURBED_MOST``; more of them are the machine's new
pace, which the fit follows (the step that made this rule: ``step_pacer``'s doc). A
prediction under ``DISTURBED_FLOOR_SHARE`` of the window's median step is judged as that
share: the fit misses a short step by a few milliseconds on its own, and such a step, taken
for disturbed, made the disturbed steps look like a new pace. (A LitServe server's first
burst of 100 on 2 cores: its first step, one prompt of 38 tokens, took 154 ms beside the
HTTP intake; two steps later the fit of the calibration and those steps, one calibration
decode of 11 ms predicted at 4 ms taken for disturbed as well, came back to every step,
fixed cost 49 ms and spread 50 ms, and budgeted 452-606 prompt tokens for steps of 100 ms
under a 150 ms target. Intel(R) Xeon(R) Processor, amx_bf16, 2026-12-07.) It answers,
for 9 steps in 10 (the spread comes off the duration asked about), the inverse
questions a latency target asks (``EngineConfig.itl_target_ms``, a target in
milliseconds rather than token counts tuned for one machine; this project's
machines drift 2x between days): how many decodes fit in a step of a given
duration, and how many prompt tokens fit beside a given number of decodes.
Both answers fill the padding they pay for: a step of 9 tokens padded to 16
rows costs what 16 tokens do, so the answer is 16, not 9.
``latency_budget`` turns those answers into the scheduler's ``StepBudget``.

Invariants: before it has seen steps of at least two different row counts
the model knows nothing and both answers are ``None`` (no limit). When the
steps seen cannot tell sequences from rows apart (every step had one
sequence per token, or the same number of sequences), or that fit is not
physical (a negative cost), the sequence term is dropped and one per-row
slope is fitted; a fit whose per-row cost is not positive (noise) is ignored
in favour of the last good one. With the identity ``rows_of`` (a model that
does not pad) rows are tokens.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .blas_threads import single_threaded_blas
from .scheduler import StepBudget

# When decodes alone fill the latency target, prompts still advance by what costs this
# share of it, so a step overshoots the target by at most that much and the queue drains.
PROMPT_PROGRESS_SHARE = 0.1
SPREAD_PERCENTILE = 90  # steps are sized for this share of them to meet the duration asked
# A step this many times slower than the other steps predict was disturbed (another process
# held the cores for a moment) and is left out, while such steps are at most this share of
# the window and this many (each one left out costs a refit: ~0.1 ms for a full window).
DISTURBED_FACTOR = 2.0
DISTURBED_SHARE = 0.1
DISTURBED_MOST = 4
# A prediction under this share of the window's median step is judged as that share: a short
# step's few milliseconds over what the fit predicts for it are the fit's own error, not
# another process (module doc).
DISTURBED_FLOOR_SHARE = 0.25


class StepCostModel:
    def __init__(self, window: int = 256, rows_of: Callable[[int], int] = int) -> None:
        self.rows_of = rows_of  # the rows a forward computes for a step of n tokens
        # the last `window` steps (sequences, rows, seconds), the oldest overwritten first
        self._steps = np.empty((window, 3), dtype=np.float64)
        self._seen = 0  # steps observed so far
        self.fixed_s: float | None = None
        self.per_sequence_s: float = 0.0
        self.per_row_s: float | None = None  # a token's row or a padding row
        self.spread_s: float = 0.0

    def observe(self, num_sequences: int, num_tokens: int, seconds: float) -> None:
        """Record one step and refit, leaving disturbed steps out (``_undisturbed_fit``)."""
        window = len(self._steps)
        self._steps[self._seen % window] = (num_sequences, self.rows_of(num_tokens), seconds)
        self._seen += 1
        with single_threaded_blas():  # numpy's OpenBLAS worker would spin beside the team
            undisturbed = _undisturbed_fit(self._steps[:min(self._seen, window)])
        if undisturbed is None:
            return
        steps, (design, coefficients) = undisturbed
        fixed, per_sequence, per_row = _terms(design, coefficients)
        if per_row > 0:
            self.fixed_s, self.per_sequence_s, self.per_row_s = (max(0.0, fixed), per_sequence,
                                                                 per_row)
            sequences, rows, times = steps[:, 0], steps[:, 1], steps[:, 2]
            excess = times - (self.fixed_s + per_sequence * sequences + per_row * rows)
            self.spread_s = max(0.0, _percentile(excess, SPREAD_PERCENTILE))

    def decodes_within(self, seconds: float) -> int | None:
        """The most decodes (one token each) a step may carry to take at most ``seconds``
        (9 times in 10; ``None``: unknown yet)."""
        if self.per_row_s is None:
            return None
        upper = int((seconds - self.fixed_s - self.spread_s)
                    / (self.per_sequence_s + self.per_row_s))  # as if nothing were padded
        return _most(upper, lambda n: self._seconds(n, n) <= seconds)

    def prompt_tokens_within(self, seconds: float, num_decodes: int) -> int | None:
        """The most prompt tokens of one more sequence that fit beside ``num_decodes`` decodes
        in a step of at most ``seconds`` (9 times in 10; ``None``: unknown yet)."""
        if self.per_row_s is None:
            return None
        room = seconds - self.fixed_s - self.spread_s - self.per_sequence_s * (num_decodes + 1)
        upper = int(room / self.per_row_s) - num_decodes  # as if nothing were padded
        return _most(upper, lambda n: self._seconds(num_decodes + 1, num_decodes + n) <= seconds)

    def _seconds(self, num_sequences: int, num_tokens: int) -> float:
        """The predicted time of a step, with the spread (9 steps in 10 take at most this)."""
        return (self.fixed_s + self.spread_s + self.per_sequence_s * num_sequences
                + self.per_row_s * self.rows_of(num_tokens))


def _most(upper: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[0, upper]`` for which ``fits(n)`` (0 when none), by bisection:
    ``fits`` holds up to some ``n`` and not past it (a step's cost grows with its rows)."""
    low, high = 0, max(0, upper)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _fit(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The least-squares fit of ``steps`` (rows of sequences, rows, seconds) as ``(design,
    coefficients)``: columns 1, sequences, rows, or 1, rows where the steps cannot separate
    the two terms or that fit gives either a negative cost (``None``: all steps had the same
    row count)."""
    sequences, rows, times = steps[:, 0], steps[:, 1], steps[:, 2]
    if np.ptp(rows) == 0:
        return None
    design = np.column_stack([np.ones_like(rows), sequences, rows])
    coefficients, _, rank, _ = np.linalg.lstsq(design, times, rcond=None)
    if rank == 3 and coefficients[1] >= 0 and coefficients[2] > 0:
        return design, coefficients
    design = design[:, [0, 2]]
    return design, np.linalg.lstsq(design, times, rcond=None)[0]


def _percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) by a partial sort: a step's refit
    calls it once, where ``np.percentile``'s own checks took longer than the fit."""
    at = q / 100 * (len(values) - 1)
    below = int(at)
    above = min(below + 1, len(values) - 1)
    ordered = np.partition(values, (below, above))
    return float(ordered[below] + (at - below) * (ordered[above] - ordered[below]))


def _terms(design: np.ndarray, coefficients: np.ndarray) -> tuple[float, float, float]:
    """(fixed, per_sequence, per_row) of a ``_fit``."""
    if design.shape[1] == 3:
        return tuple(float(c) for c in coefficients)
    return float(coefficients[0]), 0.0, float(coefficients[1])


def _undisturbed_fit(steps: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None:
    """``(steps kept, their _fit)``: the disturbed steps left out one at a time, the one
    furthest over its prediction first, while they are at most ``DISTURBED_SHARE`` of the
    window (at least one) and ``DISTURBED_MOST``; more of them are the machine's new pace,
    which the fit of every step follows (``None``: all steps had the same row count)."""
    full = _fit(steps)
    if full is None:
        return None
    kept, fit = steps, full
    for _ in range(min(DISTURBED_MOST, max(1, int(DISTURBED_SHARE * len(steps))))):
        worst = _most_disturbed(kept[:, 2], *fit)
        if worst is None:
            return kept, fit
        rest = np.delete(kept, worst, axis=0)
        refit = _fit(rest)
        if refit is None:
            return steps, full
        kept, fit = rest, refit
    return (kept, fit) if _most_disturbed(kept[:, 2], *fit) is None else (steps, full)


def _most_disturbed(times: np.ndarray, design: np.ndarray,
                    coefficients: np.ndarray) -> int | None:
    """The step furthest (in seconds) over what the fit of the other steps predicts for it
    (its leave-one-out prediction, from the fit's leverages), if it took more than
    ``DISTURBED_FACTOR`` times that, a prediction under ``DISTURBED_FLOOR_SHARE`` of the
    median step counting as that share; a step that alone decides a term of the fit
    (leverage ~1) cannot be judged."""
    # diag(X (X^T X)^-1 X^T); X has full column rank (_fit's fits only)
    leverage = (design * np.linalg.solve(design.T @ design, design.T).T).sum(axis=1)
    residual = times - design @ coefficients
    judged = leverage < 0.99
    others = np.zeros_like(times)
    others[judged] = times[judged] - residual[judged] / (1 - leverage[judged])
    judged_as = np.maximum(others, DISTURBED_FLOOR_SHARE * np.median(times))
    disturbed = judged & (others > 0) & (times > others + (DISTURBED_FACTOR - 1) * judged_as)
    if not disturbed.any():
        return None
    return int(np.argmax(np.where(disturbed, times - others, -np.inf)))


def latency_budget(cost: StepCostModel, target_s: float, num_decodes: int) -> StepBudget:
    """What keeps a step with ``num_decodes`` decodes within ``target_s`` (no limits while the
    model knows nothing): prompt tokens that fit beside the decodes, but at least
    ``PROMPT_PROGRESS_SHARE`` of the target's worth (and the padding rows that brings), and
    the sequences whose decodes fit."""
    prompt_tokens = cost.prompt_tokens_within(target_s, num_decodes)
    if prompt_tokens is not None:
        progress = max(1, int(PROMPT_PROGRESS_SHARE * target_s / cost.per_row_s))
        if prompt_tokens < progress:  # fill the rows the progress pays for anyway
            prompt_tokens = cost.rows_of(num_decodes + progress) - num_decodes
    return StepBudget(prompt_tokens=prompt_tokens, max_running=cost.decodes_within(target_s))
