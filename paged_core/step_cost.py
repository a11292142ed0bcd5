"""``StepCostModel``: how long a step of ``n`` tokens takes on this machine, learnt online.

The engine reports every step's token count and wall time; the model fits
``seconds = fixed + per_token * tokens`` by least squares over the last
``window`` steps, and answers the inverse question: how many tokens fit in a
step of a given duration. That lets the scheduler bound inter-token latency
with a target in milliseconds (``EngineConfig.itl_target_ms``) rather than a
token count tuned for one machine (this project's machines drift 2x between days).

Invariants: before it has seen steps of at least two different sizes the model
knows nothing and ``tokens_within`` returns ``None`` (no limit); a fit whose
slope is not positive (noise) is ignored in favour of the last good one.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class StepCostModel:
    def __init__(self, window: int = 256) -> None:
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        self.fixed_s: float | None = None
        self.per_token_s: float | None = None

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Record one step and refit."""
        self._steps.append((num_tokens, seconds))
        tokens = np.fromiter((t for t, _ in self._steps), dtype=np.float64)
        if np.ptp(tokens) == 0:
            return
        times = np.fromiter((s for _, s in self._steps), dtype=np.float64)
        per_token, fixed = np.polyfit(tokens, times, 1)
        if per_token > 0:
            self.per_token_s, self.fixed_s = float(per_token), max(0.0, float(fixed))

    def tokens_within(self, seconds: float) -> int | None:
        """The most tokens a step may carry to take at most ``seconds`` (``None``: unknown yet)."""
        if self.per_token_s is None:
            return None
        return max(0, int((seconds - self.fixed_s) / self.per_token_s))
