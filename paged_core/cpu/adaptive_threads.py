"""A CPU engine's OpenMP team sized to the cores other processes leave it:
``PAGED_CORE_CPU_ADAPTIVE_THREADS``.

Between the short parallel ops of a step libgomp's workers spin (``openmp_spin``), and every
op ends at a barrier that waits for the whole team. Once another process keeps a core busy,
a team as large as the machine holds a core that is not there: the thread that has work
waits for a time slice while its partner spins on the core it needs. On 2 cores of an Intel
Xeon with AMX (amx_bf16), 2026-12-07, an in-process burst of 30 requests beside a 1-core busy
loop in another process ran at 14.5 then 4.6 output tok/s with a team of 2 threads, against
218-354 tok/s alone; sized by ``AdaptiveThreads`` the team gave a thread up within the first
second and served it at 163-202 tok/s. In a burst of 100 through the LitServe adapter, alone,
it kept both threads (output tok/s 453-461 against 427-466 with the setting off, runs
alternated).

``AdaptiveThreads`` watches two signals over windows of ``WINDOW_S``, read at the start of
a step and, while a server's engine idles, on its loop's idle wake-ups (``update``; no thread
of its own):

- **waiting**: how many of this process's threads, on average, were runnable but had no
  core (their run delay, ``proc_ticks.threads_run_delay_s``). Beside the busy loop it was
  ~0.9; alone, 0.03-0.13 in an in-process burst. At ``SHRINK_WAITING`` or more the team
  gives up one thread, but only while other processes keep more cores busy than the smaller
  team would leave them (by the foreign cores below, it would not take its thread straight
  back): a wait with the others idle comes from this process's own threads, which a smaller
  team does not cure. (A burst of 100 through the LitServe adapter, its HTTP front end and
  output streams in the engine's process: waiting 0.72-1.16 with other processes keeping
  0.04-0.23 cores busy; shrunk on waiting alone, the team ran its next steps at 0.29-0.30 ms
  a row against 0.15-0.16 on 2 threads, and took the thread back at the next look; same
  machine, 2026-12-07.) (Beside a loop busy half of every 10 ms, a team of 2 waited 0.53 and
  served the in-process burst at 157 tok/s, a team of 1 at 186: a case this threshold leaves
  to the user, ``torch.set_num_threads``.)
- **foreign cores**: the cores other processes kept busy (the machine's busy ticks beyond
  this process's). A smaller team no longer waits, so only this one says when the others
  left: the team takes a thread back once the cores left free come to its size plus
  ``GROW_ROOM``. A shrink that the next look undoes (the others' load passed) holds off the
  next one, for longer each time (``update``).

An idle window (this process used under ``IDLE_CORES``) has no waiting to show: there the
team gives a thread up once it lacks ``SHRINK_SHORTFALL`` cores beyond those the others leave
free, so the first step after a quiet spell starts with a team that fits. (An in-process
engine idle beside a busy loop started 3 s before a burst of 30: TTFT p50 601 / 631 ms, the
last 704 / 730, against 1104 / 1091 and 1106 / 1097 when only steps looked, whose first
step, the whole burst's prompts, ran on 2 threads; same machine as above, alternated.)

The team is the thread count the caller set (``torch.get_num_threads()``, read at every
step, so a later ``torch.set_num_threads`` is honoured as the new ceiling) less the threads
given up. It applies only while a step runs (``sized_team``): the caller's own thread count
is restored after each step, so a script's own torch code never sees it. This project's
kernels split their work by rows, columns and key positions, never by thread count: the
embedded model's greedy tokens and logprobs, bf16 and fp32, came out bit-identical with 1
and 2 threads on the machine above; a BLAS that splits its sums by thread count may change
last bits, as a different batch may. Batch-invariant mode keeps the caller's team: it
promises the same bits whatever the load.

``PAGED_CORE_CPU_ADAPTIVE_THREADS=0`` (or ``off``) keeps the caller's team always. Where
``/proc`` cannot be read the team stays as set.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .proc_ticks import cpu_times, others_share, process_ticks, threads_run_delay_s

logger = logging.getLogger(__name__)

SETTING = "PAGED_CORE_CPU_ADAPTIVE_THREADS"
WINDOW_S = 0.5  # seconds of steps between two looks at the signals
SHRINK_WAITING = 0.6  # threads waiting for a core, on average, that cost the team a thread
GROW_ROOM = 0.7  # spare cores (beyond the team's) needed to take a thread back
IDLE_CORES = 0.1  # a window in which this process used less is idle: nothing of it waited
SHRINK_SHORTFALL = 0.7  # cores the team lacks, beyond those others leave, that cost a thread
FIRST_HOLD_S = 2.0  # no new shrink for this long after one the next look undid
LONGEST_HOLD_S = 30.0  # each such shrink doubles the hold, up to this


def adaptive_threads_enabled() -> bool:
    """Whether ``PAGED_CORE_CPU_ADAPTIVE_THREADS`` lets engines size their team (the default);
    raises ``ValueError`` naming the setting for a value that is neither on nor off."""
    raw = os.environ.get(SETTING, "").strip().lower()
    if raw in ("", "1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{SETTING}={raw!r}: use 1 (size the OpenMP team to the free cores, the "
                     "default) or 0 (keep torch's thread count)")


@dataclass(frozen=True)
class Signals:
    """One look at the machine: run delay of this process's threads (seconds), the
    machine's (busy, total) ticks and this process's ticks; a None: unreadable."""

    run_delay_s: float | None
    machine: tuple[int, int] | None
    own_ticks: int | None

    @staticmethod
    def read() -> "Signals":
        return Signals(threads_run_delay_s(), cpu_times(), process_ticks())


class AdaptiveThreads:
    """Sizes this process's OpenMP team for each step to the cores it can have (above)."""

    def __init__(self, cores: int | None = None, read: Callable[[], Signals] = Signals.read,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores or os.cpu_count() or 1
        self.read, self.clock = read, clock
        self.given_up = 0  # threads the team gives up from the caller's count
        self.last = read()
        self.last_at = clock()
        self.just_shrunk = False  # the last look gave a thread up
        self.hold_s = FIRST_HOLD_S  # how long the next undone shrink holds off the next one
        self.no_shrink_until = 0.0

    def team(self, ceiling: int) -> int:
        """The team for a step whose caller set ``ceiling`` threads."""
        return max(1, ceiling - self.given_up)

    @contextlib.contextmanager
    def sized_team(self) -> Iterator[int]:
        """Run the body (one step) with the team sized to the free cores; yields its size."""
        ceiling = torch.get_num_threads()
        self.update(ceiling)
        team = self.team(ceiling)
        if team == ceiling:
            yield team
            return
        torch.set_num_threads(team)
        try:
            yield team
        finally:
            torch.set_num_threads(ceiling)

    def update(self, ceiling: int) -> None:
        """Look at the signals once ``WINDOW_S`` has passed since the last look, and give a
        thread up or take one back (at most one a window, so the team never swings).

        A shrink the next look undoes (the others' load was a moment's) holds off the next
        one for ``hold_s``, doubled each time up to ``LONGEST_HOLD_S``; a shrink that holds
        resets it."""
        now = self.clock()
        elapsed = now - self.last_at
        if elapsed < WINDOW_S:
            return
        current = self.read()
        waiting, use = self._waiting(current, elapsed), self._cores_used(current)
        own, foreign = use if use is not None else (None, None)
        idle = own is not None and own < IDLE_CORES
        self.last, self.last_at = current, now
        team = self.team(ceiling)
        logger.debug("team %d: waiting %s, foreign cores %s, idle %s", team, waiting, foreign,
                     idle)
        shrunk_before, self.just_shrunk = self.just_shrunk, False
        may_shrink = team > 1 and now >= self.no_shrink_until
        if (may_shrink and not idle and waiting is not None and waiting >= SHRINK_WAITING
                and foreign is not None and not self._room_for(team - 1, foreign)):
            self._resize(team, team - 1, ceiling,
                         f"its threads waited for a core {waiting:.2f} of the time while other "
                         f"processes kept {foreign:.2f} of {self.cores} cores busy")
            self.just_shrunk = True
        elif may_shrink and idle and team - (self.cores - foreign) >= SHRINK_SHORTFALL:
            self._resize(team, team - 1, ceiling, f"while it idled, other processes kept "
                         f"{foreign:.2f} of {self.cores} cores busy")
            self.just_shrunk = True
        elif self.given_up and foreign is not None and self._room_for(team, foreign):
            self._resize(team, team + 1, ceiling,
                         f"other processes keep {foreign:.2f} of {self.cores} cores busy")
            if shrunk_before:
                self.no_shrink_until = now + self.hold_s
                self.hold_s = min(2 * self.hold_s, LONGEST_HOLD_S)
        elif shrunk_before:
            self.hold_s = FIRST_HOLD_S

    def _room_for(self, team: int, foreign: float) -> bool:
        """Whether the cores other processes leave free come to ``team + GROW_ROOM`` or more:
        the rule by which a team of ``team`` threads takes a thread back."""
        return self.cores - foreign >= team + GROW_ROOM

    def _resize(self, team: int, new: int, ceiling: int, reason: str) -> None:
        self.given_up = ceiling - new
        logger.info("CPU engine: OpenMP team %d -> %d threads of %d: %s (%s)", team, new,
                    ceiling, reason, SETTING)

    def _waiting(self, current: Signals, elapsed: float) -> float | None:
        """Threads of this process waiting for a core, on average, since the last look."""
        if current.run_delay_s is None or self.last.run_delay_s is None:
            return None
        return max(0.0, current.run_delay_s - self.last.run_delay_s) / elapsed

    def _cores_used(self, current: Signals) -> tuple[float, float] | None:
        """(this process's, other processes') cores kept busy since the last look (None:
        unreadable, or no tick between)."""
        if None in (current.machine, current.own_ticks, self.last.machine, self.last.own_ticks):
            return None
        own_ticks = current.own_ticks - self.last.own_ticks
        total = current.machine[1] - self.last.machine[1]
        if total <= 0:
            return None
        return (own_ticks / total * self.cores,
                others_share(self.last.machine, current.machine, own_ticks) * self.cores)
