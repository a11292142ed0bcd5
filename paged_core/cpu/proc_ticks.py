"""CPU time as Linux's ``/proc`` counts it: the machine's, one process's, and how long a
process's threads waited for a core.

Readers return None (or skip what vanished) where ``/proc`` cannot be read, so callers on
other systems, or racing a process that just ended, degrade to "unknown" instead of failing.
"""
from __future__ import annotations

import os

PROC = "/proc"
PROC_STAT = "/proc/stat"
# idle and iowait: their places among the "cpu" line's user nice system idle iowait ...
IDLE_FIELDS = (3, 4)
# Fields of /proc/<pid>/stat after "(comm)", counted from the state (index 0): ppid, utime,
# stime (fields 4, 14 and 15 of proc(5)).
PPID_FIELD, UTIME_FIELD, STIME_FIELD = 1, 11, 12


def cpu_times(path: str = PROC_STAT) -> tuple[int, int] | None:
    """(busy, total) clock ticks of every core since boot, or None if unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user .. steal (guest time is inside user)
    idle = sum(ticks[i] for i in IDLE_FIELDS)
    return sum(ticks) - idle, sum(ticks)


def others_share(before: tuple[int, int], after: tuple[int, int], own_ticks: int) -> float:
    """The share of all cores' ticks between two ``cpu_times`` readings that went to processes
    other than those whose ``own_ticks`` (spent meanwhile) are given; 0 for no time between."""
    total = after[1] - before[1]
    busy = after[0] - before[0]
    return max(0.0, (busy - own_ticks) / total) if total > 0 else 0.0


def stat_fields(path: str) -> list[str] | None:
    """A process's stat fields after its name (which may hold spaces and parentheses), or
    None if it cannot be read (the process ended)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def process_ticks(stat_path: str = os.path.join(PROC, "self", "stat")) -> int | None:
    """Clock ticks (user + system) that one process's threads have used so far."""
    fields = stat_fields(stat_path)
    if fields is None or len(fields) <= STIME_FIELD:
        return None
    return int(fields[UTIME_FIELD]) + int(fields[STIME_FIELD])


def threads_run_delay_s(task_dir: str = os.path.join(PROC, "self", "task")) -> float | None:
    """Seconds that a process's live threads have spent runnable but waiting for a core (each
    thread's ``schedstat`` run delay, summed), or None where the kernel does not keep it."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    total_ns, seen = 0, False
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "schedstat"), encoding="ascii") as f:
                total_ns += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # the thread ended, or no schedstat
            continue
        seen = True
    return total_ns / 1e9 if seen else None
