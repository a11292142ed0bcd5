"""How busy other processes kept the machine while a timed scenario ran (``bench serve``).

``wait_until_quiet`` makes a scenario *start* on a quiet machine; a job that starts while
it runs (a build, another benchmark) went unseen. On the 2-core Intel(R) Xeon(R) Processor
(amx_bf16), 2026-12-07, a burst of 100 through the LitServe adapter that overlapped
microbenchmarks in other processes (2-thread memory fills and linear layers) for about four
minutes had a TTFT p50 of 18.4 s, against 1.4-2.1 s for the same scenario alone (the
engine's OpenMP team of two waits at every parallel region for a core the other job holds),
and its result file looked like any other.

``ForeignLoad`` reads the machine's busy clock ticks (``/proc/stat``, ``cpu_times``) and
the ticks of this process and every descendant (``/proc/<pid>/stat``: utime + stime, and
cutime + cstime, so a child reaped in between still counts) when a scenario starts and when
it ends. The machine's busy ticks beyond the benchmark's own process tree (the servers it
started and their workers included), over all cores' ticks, are the others' share: a
scenario is ``quiet`` when that share stayed under the same threshold the start waits for.
Where ``/proc`` cannot be read (not Linux) the share is None and ``quiet`` None: unknown.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from ..cpu.proc_ticks import (PPID_FIELD, PROC, PROC_STAT, UTIME_FIELD, cpu_times, others_share,
                              stat_fields)

UNKNOWN = {"foreign_busy": None, "quiet": None}  # where the share cannot be measured
# utime stime cutime cstime (fields 14-17 of proc(5)) among a process's stat fields
_TICKS = slice(UTIME_FIELD, UTIME_FIELD + 4)


def process_tree_ticks(root: int, proc: str = PROC, exclude: frozenset[int] = frozenset()
                       ) -> int | None:
    """Clock ticks used so far by process ``root`` and all its descendants (their own and
    their reaped children's), leaving out the processes in ``exclude`` and theirs, or None
    if ``root``'s entry cannot be read."""
    children: dict[int, list[int]] = defaultdict(list)
    ticks: dict[int, int] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        fields = stat_fields(os.path.join(proc, entry, "stat"))
        if fields is None or len(fields) < _TICKS.stop:
            continue
        pid = int(entry)
        children[int(fields[PPID_FIELD])].append(pid)
        ticks[pid] = sum(int(v) for v in fields[_TICKS])
    if root not in ticks:
        return None
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid in exclude:
            continue
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total


@dataclass(frozen=True)
class Sample:
    """The machine's (busy, total) ticks and the benchmark tree's ticks at one moment."""

    machine: tuple[int, int] | None
    tree: int | None


class ForeignLoad:
    """Other processes' share of the cores between ``ForeignLoad()`` and ``stop()``; the
    tree's processes in ``others`` (busy loops it started as load: ``busy_cores``) count as
    other processes. A process that exits in between should not be one of ``others``: its
    ticks reach its parent's reaped-children count, which ``stop`` then counts as the tree's."""

    def __init__(self, root: int | None = None, proc: str = PROC, stat: str = PROC_STAT,
                 others: frozenset[int] = frozenset()) -> None:
        self.root = os.getpid() if root is None else root
        self.proc, self.stat, self.others = proc, stat, others
        self.start = self.sample()

    def sample(self) -> Sample:
        return Sample(cpu_times(self.stat),
                      process_tree_ticks(self.root, self.proc, self.others))

    def stop(self, max_busy: float) -> dict[str, float | bool | None]:
        """``foreign_busy``: the share of all cores' ticks that processes outside the tree
        kept busy since the start (None: unknown); ``quiet``: whether it stayed under
        ``max_busy``."""
        end = self.sample()
        if None in (self.start.machine, self.start.tree, end.machine, end.tree):
            return dict(UNKNOWN)
        share = others_share(self.start.machine, end.machine, end.tree - self.start.tree)
        return {"foreign_busy": round(share, 4), "quiet": share < max_busy}
