"""Time several ways of doing one thing in rounds, so that a drifting load hits them all alike.

``time_interleaved`` warms every call up, then takes ``reps`` rounds; each round times
every call once, starting one further along each round (no call always runs first or
right after the same neighbour). A sample is the mean of as many back-to-back calls as
fill ``min_sample_s`` (judged from one warm call), so microsecond calls rise above timer
and scheduling noise; calls that take longer are timed one at a time.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable


def time_interleaved(calls: dict[str, Callable[[], object]], reps: int,
                     min_sample_s: float) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls``: ``reps`` samples each, in the order taken."""
    repeats = {}
    for name, fn in calls.items():
        fn()  # first call: kernel loads, oneDNN primitive builds, page faults
        start = time.perf_counter()
        fn()
        repeats[name] = max(1, math.ceil(min_sample_s / (time.perf_counter() - start)))
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = calls[name], repeats[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def median_us(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e6
