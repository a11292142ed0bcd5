"""Waiting until the machine is quiet before a timed scenario (``bench serve``).

A server that has just answered its readiness probe may still be finishing start-up work:
``vllm serve`` on the 2-core AMD EPYC (avx512_bf16) kept a core busy for a few seconds
after it answered (its KV cache being faulted in), and paged-core's burst of 100 that
started then had a TTFT p50 of 2446 ms, against 1538 ms for the same requests to a fresh
server alone; beside an idle vLLM the same burst (another seed) took 1554 ms against 1503
alone. On a small machine every scenario would otherwise be timed against whatever the
previous one, or another system's start-up, left running.

``wait_until_quiet`` samples the whole machine's CPU time (``/proc/stat``'s first line)
over windows of ``window_s`` and returns once one window was busy less than
``max_busy`` (a fraction of all cores), or ``timeout_s`` passed; it reports what it saw, so
a result file says whether its scenarios started on a quiet machine. Where ``/proc/stat``
cannot be read (not Linux) it returns at once with ``busy`` None.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..cpu.proc_ticks import cpu_times


@dataclass(frozen=True)
class Quiet:
    """What ``wait_until_quiet`` saw: busy fraction of its last window (None: unknown),
    seconds waited, and whether that window was under the threshold."""
    busy: float | None
    waited_s: float
    quiet: bool

    def as_dict(self) -> dict[str, float | bool | None]:
        return asdict(self)


def wait_until_quiet(max_busy: float = 0.1, window_s: float = 1.0, timeout_s: float = 60.0,
                     sample: Callable[[], tuple[int, int] | None] = cpu_times,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> Quiet:
    """Block until a ``window_s`` window of the machine was busy < ``max_busy`` (see above)."""
    start = clock()
    before = sample()
    if before is None:
        return Quiet(None, 0.0, False)
    while True:
        sleep(window_s)
        after = sample()
        if after is None:
            return Quiet(None, clock() - start, False)
        total = after[1] - before[1]
        busy = (after[0] - before[0]) / total if total > 0 else 0.0
        waited = clock() - start
        if busy < max_busy or waited >= timeout_s:
            return Quiet(round(busy, 4), round(waited, 2), busy < max_busy)
        before = after
